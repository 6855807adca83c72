// decode_layers.cu: every decoder layer of a one-token decode step in one persistent kernel (the
// twin of NumpyBackend.decode_layers, which runs the same layers op by op).
//
// Why: a batch-1 decode step of a small model is a chain of ~230 dependent launches, each a few
// microseconds long whatever its bytes (docs/BENCHMARKS.md section 2: 0.6B's 1.19 GB of weights
// need 0.29 ms at copy bandwidth, its graph took 1.05 ms). Here one CTA per SM walks all layers;
// the stages of a layer are separated by grid-wide barriers instead of kernel boundaries:
//
//   1. residual += hidden (the previous layer's down output), rms_norm, qkv GEMV (+ bias)
//   2. attention: per (KV head, split) item, q/k norm + RoPE of the new token, its K/V row into
//      the paged caches, the split's keys with an online softmax; the last split of a KV head to
//      finish merges the partials (an atomic counter, reset by that CTA)
//   3. o GEMV -> hidden
//   4. residual += hidden, rms_norm, gate_up GEMV with SiLU-and-multiply -> act
//   5. down GEMV -> hidden
//
// Every CTA keeps the whole residual stream in shared memory (each computes the same values), so
// only the GEMV outputs cross CTAs, through L2 (read with ld.global.cg: L1 is not coherent across
// SMs). Weights and cached keys never depend on the step's activations, so each GEMV stage copies
// its first weight chunks into shared memory (cp.async) before the barrier that precedes it, and
// the weight fetch overlaps the barrier. Values are rounded to bf16 wherever the op-by-op path
// stores them (residual, normed rows, qkv, q/k after norm and RoPE, attention output, act), so
// both paths compute the same thing up to fp32 summation order.
//
// Measured on the H200 (docs/BENCHMARKS.md, session 5): 0.98 ms for the 0.6B shape's 28 layers,
// about what the op-by-op CUDA graph spends on them, and 5.3 ms against ~4.4 on the 8B shape (its
// GEMV stages stream 2.2-3.6 TB/s). So the host builds it only with MINILLM_FUSED_DECODE=1.
// scripts/decode_layers_profile.py times each stage and barrier from timestamps the kernel records.
//
// All CTAs must be resident at once (the barrier spins): the host launches one per SM with more
// than half an SM's shared memory, so no two share an SM and none waits for a slot. Per-step
// values (position, slot, context length, block table) come from device buffers, so a captured
// graph replays for any step. Compiled per model with -DDL_D=<head_dim> -DDL_G=<query heads per
// KV head>.
#include "common.cuh"

#ifndef DL_D
#define DL_D 128
#endif
#ifndef DL_G
#define DL_G 2
#endif
#define DL_THREADS 512
#define DL_WARPS (DL_THREADS / 32)
#ifndef DL_PF_MAX
#define DL_PF_MAX 0  // bytes of one weight range a CTA prefetches into L2 per stage (prefetch_rows)
#endif
#define DL_MIN_PART 32        // fewest keys an attention split takes
#define DL_MAX_S 32           // most splits of one KV head (the host sizes the partials for it)
#define DL_RED 2048           // GEMV partial sums a CTA holds (the host checks rows per CTA)
#define DL_U 2                // keys per key group in flight

namespace {

struct LayerPtrs {  // one row of the host's [layers, 9] pointer table
  const bf16* attn_norm;
  const bf16* qkv;
  const bf16* qkv_bias;  // null without attention bias
  const bf16* q_norm;    // null without q/k norm
  const bf16* k_norm;
  const bf16* o;
  const bf16* mlp_norm;
  const bf16* gate_up;
  const bf16* down;
};

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// sync[] layout (u32): the arrival count and the exit count on separate 128-byte lines, then one
// merge counter per KV head.
#define DL_ARRIVE 0
#define DL_EXIT 32
#define DL_HEADS 96

// Grid-wide barrier number k of this launch. The arrival count only grows during a launch, so
// barrier k is complete once it reaches (k + 1) * gridDim.x: one atomic per CTA, then a spin on
// the count (measured on the H200, scripts/decode_layers_profile.py: 0.83 us a barrier, against
// 1.3 us when the last arrival raised a separate flag). grid_done() zeroes it for the next
// launch. prof (null unless profiling) gets each CTA's arrival and release times:
// [barrier][CTA][2] ns.
__device__ __forceinline__ void grid_sync(unsigned* bar, int k, u64* prof) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (prof) prof[((i64)k * gridDim.x + blockIdx.x) * 2] = global_ns();
    const unsigned target = (unsigned)(k + 1) * gridDim.x;
    __threadfence();  // this CTA's writes (ordered before by the barrier above) go first
    atomicAdd(bar + DL_ARRIVE, 1u);
    while (ld_acquire(bar + DL_ARRIVE) < target) {
    }
    if (prof) prof[((i64)k * gridDim.x + blockIdx.x) * 2 + 1] = global_ns();
  }
  __syncthreads();
}

// After a CTA's last barrier: the last CTA to get here knows every CTA has passed every barrier,
// and zeroes the counters for the next launch.
__device__ __forceinline__ void grid_done(unsigned* bar) {
  if (threadIdx.x == 0 && atomicAdd(bar + DL_EXIT, 1u) == gridDim.x - 1) {
    atomicExch(bar + DL_ARRIVE, 0u);
    atomicExch(bar + DL_EXIT, 0u);
  }
}

__device__ __forceinline__ int slice_begin(int n) { return (int)((i64)blockIdx.x * n / gridDim.x); }
__device__ __forceinline__ int slice_end(int n) { return (int)((i64)(blockIdx.x + 1) * n / gridDim.x); }

// Ask L2 for rows [r0, r1) of a row-major [*, K] bf16 matrix (at most DL_PF_MAX bytes), one
// bulk-prefetch instruction (the TMA unit walks the range). Off by default: with one
// prefetch.global.L2 per 128-byte line the 0.6B kernel was 11% slower (the instructions delayed
// the stage they were issued in), and on the 8B shape a stage's 50-200 MB of weights evict what
// was prefetched before it is used.
__device__ __forceinline__ void prefetch_rows(const bf16* w, int r0, int r1, int K) {
#if DL_PF_MAX > 0
  if (r1 <= r0 || threadIdx.x != 0) return;
  i64 bytes = (i64)(r1 - r0) * K * 2;
  if (bytes > DL_PF_MAX) bytes = DL_PF_MAX;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + (i64)r0 * K), "r"((unsigned)(bytes & ~15)));
#endif
}

// dst[0:n] = src[0:n] as floats (n % 8 == 0), src written by other CTAs (read through L2). Every
// 16-byte load of a thread is issued before any is used: one round trip, not one per element.
__device__ __forceinline__ void load_row(const bf16* src, float* dst, int n) {
  constexpr int V = 4;
  const int chunks = n / 8;
  for (int base = 0; base < chunks; base += V * DL_THREADS) {
    uint4 v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = base + threadIdx.x + k * DL_THREADS;
      if (c < chunks) v[k] = __ldcg(reinterpret_cast<const uint4*>(src) + c);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = base + threadIdx.x + k * DL_THREADS;
      if (c < chunks) {
        float f[8];
        minillm::unpack_bf16x8(v[k], f);
        reinterpret_cast<float4*>(dst)[2 * c] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(dst)[2 * c + 1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
  }
}

#ifndef DL_ATT_PRE
#define DL_ATT_PRE 0  // 1: attention's first K/V loads before the barrier (measured 10% slower on 0.6B)
#endif
// 16-byte weight chunks a lane stages in shared memory before a GEMV stage's barrier (per warp
// DL_PRE_SLOTS * 32 * 16 bytes; the host reserves 16 warps' worth)
#ifndef DL_PRE_SLOTS
#define DL_PRE_SLOTS 4  // 8 measured 14% slower on 0.6B (part25)
#endif

// One warp's share of a GEMV stage: column pair p (columns r0 + 2p, r0 + 2p + 1 of this CTA's
// slice) over 16-byte chunks [c0, c1) of K.
template <int NW>
struct GemvUnit {
  const uint4* w[2][NW];
  int c0, c1;
  __device__ __forceinline__ GemvUnit(const bf16* W, int N, int K, int r0, int rows, int p, int s, int ks) {
    const int chunks = K / 8;
    c0 = (int)((i64)s * chunks / ks);
    c1 = (int)((i64)(s + 1) * chunks / ks);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int n = r0 + min(p * 2 + r, rows - 1);  // a missing second column re-reads the first
#pragma unroll
      for (int h = 0; h < NW; ++h) w[r][h] = reinterpret_cast<const uint4*>(W + ((i64)n + h * N) * K);
    }
  }
  __device__ __forceinline__ void load(int c, uint4 (&v)[2][NW]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int h = 0; h < NW; ++h) v[r][h] = __ldg(w[r][h] + c);
  }
};

template <int NW>
__device__ __forceinline__ void gemv_fma(const uint4 (&v)[2][NW], const float* xs, int c, float (&acc)[2][NW]) {
  const float4 xa = reinterpret_cast<const float4*>(xs)[2 * c];
  const float4 xb = reinterpret_cast<const float4*>(xs)[2 * c + 1];
  const float xf[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int h = 0; h < NW; ++h) {
      float wf[8];
      minillm::unpack_bf16x8(v[r][h], wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r][h] = fmaf(xf[i], wf[i], acc[r][h]);
    }
}

// This CTA's slice of out[n] = x . W[n] (+ bias[n]) for n < N, x = xs[0:K] in shared memory;
// GATED: out[n] = silu(x . W[n]) * (x . W[N + n]). A warp computes 2 columns at a time; K is split
// among warps too when the slice has fewer column pairs than warps. Weights never depend on
// activations, so each warp starts copying its first chunks (cp.async into stg), then calls pre()
// (every thread does: the grid barrier before this stage and the load of x), and only then needs
// x: the weights' HBM round trip overlaps the barrier. Partial sums go to red[] and are added in a
// fixed order, so results do not depend on timing.
template <bool GATED, typename Pre>
__device__ void gemv_stage(const bf16* __restrict__ W, const float* xs, int N, int K,
                           const bf16* __restrict__ bias, bf16* out, float* red, uint4* stg, Pre pre) {
  constexpr int NW = GATED ? 2 : 1;  // weight rows per column
  constexpr int PRE = DL_PRE_SLOTS / (2 * NW);  // chunk iterations of a warp's first unit staged before pre()
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = slice_begin(N), rows = slice_end(N) - r0;
  if (rows <= 0) {  // the whole CTA takes this branch
    pre();
    return;
  }
  const int pairs = (rows + 1) / 2;
  // K is split among warps only when a CTA has fewer column pairs than warps (splitting more to
  // fill the warps' rounds made some CTAs of the 8B qkv stage 12 us late: 9267e92, part24)
  const int ks = pairs >= DL_WARPS ? 1 : DL_WARPS / pairs;
  const int units = pairs * ks;
  // a unit's dot products reduced into red[], and its chunks from c on
  auto finish = [&](int u, float (&acc)[2][NW]) {
    const int p = u / ks, s = u % ks;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int h = 0; h < NW; ++h) {
        const float v = minillm::warp_sum(acc[r][h]);
        if (lane == 0 && p * 2 + r < rows) red[(h * rows + p * 2 + r) * ks + s] = v;
      }
  };
  auto rest = [&](const GemvUnit<NW>& unit, int c, float (&acc)[2][NW]) {
#pragma unroll 4
    for (; c < unit.c1; c += 32) {
      uint4 wv[2][NW];
      unit.load(c, wv);
      gemv_fma(wv, xs, c, acc);
    }
  };
  // the first unit: its first chunks are copied to shared memory before pre() (cp.async: no
  // registers held across the barrier; each lane reads back only what it copied). pre() holds
  // __syncthreads, so every thread calls it at this one point, whether it has a unit or not.
  const bool has = warp < units;
  const GemvUnit<NW> unit(W, N, K, r0, rows, min(warp, units - 1) / ks, min(warp, units - 1) % ks, ks);
  uint4* mine = stg + warp * (DL_PRE_SLOTS * 32) + lane;
  if (has) {
#pragma unroll
    for (int q = 0; q < PRE; ++q) {
      const int c = unit.c0 + lane + 32 * q;
      if (c < unit.c1)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < NW; ++h) {
            const unsigned dst = (unsigned)__cvta_generic_to_shared(mine + ((q * 2 + r) * NW + h) * 32);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(unit.w[r][h] + c));
          }
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  pre();
  asm volatile("cp.async.wait_all;" ::: "memory");
  if (has) {
    float acc[2][NW] = {};
#pragma unroll
    for (int q = 0; q < PRE; ++q) {
      const int c = unit.c0 + lane + 32 * q;
      if (c < unit.c1) {
        uint4 v[2][NW];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < NW; ++h) v[r][h] = mine[((q * 2 + r) * NW + h) * 32];
        gemv_fma(v, xs, c, acc);
      }
    }
    rest(unit, unit.c0 + lane + 32 * PRE, acc);
    finish(warp, acc);
  }
  for (int u = warp + DL_WARPS; u < units; u += DL_WARPS) {
    const GemvUnit<NW> unit(W, N, K, r0, rows, u / ks, u % ks, ks);
    float acc[2][NW] = {};
    rest(unit, unit.c0 + lane, acc);
    finish(u, acc);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows; i += DL_THREADS) {
    float a = 0.f, b = 0.f;
    for (int s = 0; s < ks; ++s) {
      a += red[i * ks + s];
      if (GATED) b += red[(rows + i) * ks + s];
    }
    const float y = GATED ? a / (1.0f + expf(-a)) * b : a + (bias ? minillm::to_f(bias[r0 + i]) : 0.f);
    out[r0 + i] = minillm::from_f<bf16>(y);
  }
}

// residual += add (unless null), rounded to bf16; xs = bf16(residual * rstd * w).
__device__ void add_and_norm(float* res, const bf16* add, const bf16* __restrict__ w, float eps, int H,
                             float* xs, float* scratch) {
  if (add) {
    load_row(add, xs, H);
    __syncthreads();
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += DL_THREADS) {
    float v = res[i];
    if (add) v = round_bf16(v + xs[i]);
    res[i] = v;
    ss += v * v;
  }
  ss = minillm::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += DL_THREADS) xs[i] = round_bf16(res[i] * rstd * minillm::to_f(w[i]));
  __syncthreads();
}

// One head of the new token (a warp): optional RMSNorm over the head (rounded), then rotate-half
// RoPE (rounded), written to dst[0:D] in shared memory times `mul`. A lane holds elements
// lane + 32 t; the RoPE partner of t is t +- D / 64, in the same lane.
__device__ __forceinline__ void norm_rope_head(const bf16* src, const bf16* __restrict__ w, float eps,
                                               const float* cs, float mul, float* dst) {
  constexpr int T = DL_D / 32, HALF_T = T / 2;
  const int lane = threadIdx.x & 31;
  float x[T];
  float ss = 0.f;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    x[t] = minillm::to_f(__ldcg(src + lane + 32 * t));
    ss += x[t] * x[t];
  }
  if (w) {
    const float rstd = rsqrtf(minillm::warp_sum(ss) / (float)DL_D + eps);
#pragma unroll
    for (int t = 0; t < T; ++t) x[t] = round_bf16(x[t] * rstd * minillm::to_f(w[lane + 32 * t]));
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const int i = lane + 32 * t, j = t < HALF_T ? i : i - DL_D / 2;
    const float c = cs[j], s = cs[DL_D / 2 + j];
    const float r = t < HALF_T ? x[t] * c - x[t + HALF_T] * s : x[t] * c + x[t - HALF_T] * s;
    dst[i] = round_bf16(r) * mul;
  }
}

struct AttnArgs {
  const bf16* qkv;
  const bf16* q_norm;
  const bf16* k_norm;
  float eps;
  const float* cs;  // this position's cos/sin row
  i64 slot;
  bf16* kc;  // this layer's caches
  bf16* vc;
  const int* block_table;
  int ctx, block_size, NQ, NKV, num_blocks;
  float scale_log2;
  bf16* attn;
  float* part;
  unsigned* head_cnt;
};

// Stage 2: attention of the new token over its context, one (KV head, split) item per CTA. The
// first keys' K/V loads are issued before the new token's q/k are normed and rotated (they do not
// depend on them); the new token's own key is taken from shared memory, not read back.
template <typename Pre>
__device__ void attention_stage(const AttnArgs& a, float* sm, Pre pre) {
  constexpr int D = DL_D, G = DL_G, LPK = D / 8, NG = DL_THREADS / LPK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* qs = sm;                       // [G][D] q, pre-scaled by scale * log2(e)
  float* kn = qs + G * D;               // [D] the new token's k (normed, rotated, rounded)
  float* vn = kn + D;                   // [D] and v
  float* wm = vn + D;                   // [DL_WARPS][G] per-warp max
  float* wl = wm + DL_WARPS * G;        // [DL_WARPS][G] per-warp sum
  float* wacc = wl + DL_WARPS * G;      // [DL_WARPS][G][D]
  __shared__ int s_last;
  const int S = max(1, min(min((a.ctx + DL_MIN_PART - 1) / DL_MIN_PART, DL_MAX_S), (int)gridDim.x / a.NKV));
  const int part_len = (a.ctx + S - 1) / S;
  const int QS = a.NQ * D, KVS = a.NKV * D;
  const int grp = threadIdx.x / LPK, d0 = (threadIdx.x % LPK) * 8;
  uint4 kv[DL_U], vv[DL_U];
  bool ok[DL_U];
  auto load_keys = [&](int h, int j0, int j1, int base) {
#pragma unroll
    for (int u = 0; u < DL_U; ++u) {
      const int j = base + grp + u * NG;
      ok[u] = j < j1;
      const int jc = ok[u] ? j : j0;
      const int blk = a.block_table[jc / a.block_size];
      MINILLM_CHECK(blk >= 0 && blk < a.num_blocks);
      const i64 row = (((i64)blk * a.block_size + jc % a.block_size) * a.NKV + h) * D + d0;
      kv[u] = __ldcg(reinterpret_cast<const uint4*>(a.kc + row));
      vv[u] = __ldcg(reinterpret_cast<const uint4*>(a.vc + row));
    }
  };
  // the cached keys were written by earlier steps, so with DL_ATT_PRE this CTA's first keys load
  // before pre() (the barrier that makes qkv complete); by default they load right after it
  const int items = a.NKV * S;
  if (DL_ATT_PRE && blockIdx.x < items) {
    const int j0 = (blockIdx.x % S) * part_len, j1 = min(a.ctx, j0 + part_len);
    if (j0 < j1) load_keys(blockIdx.x / S, j0, j1, j0);
  }
  pre();
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int h = item / S, sp = item % S;
    const int j0 = sp * part_len, j1 = min(a.ctx, j0 + part_len);
    if ((item != blockIdx.x || !DL_ATT_PRE) && j0 < j1) load_keys(h, j0, j1, j0);
    // the new token: q heads h*G .. h*G + G - 1, its k and v (and, for the split that holds it,
    // its K/V row into the caches)
    const bool owns_new = j1 == a.ctx && a.slot >= 0;
    if (warp < G) {
      norm_rope_head(a.qkv + (h * G + warp) * D, a.q_norm, a.eps, a.cs, a.scale_log2, qs + warp * D);
    } else if (warp == G) {
      norm_rope_head(a.qkv + QS + h * D, a.k_norm, a.eps, a.cs, 1.f, kn);
      __syncwarp();
      if (owns_new)
        for (int i = lane; i < D; i += 32) a.kc[(a.slot * a.NKV + h) * D + i] = __float2bfloat16_rn(kn[i]);
    } else if (warp == G + 1) {
      for (int i = lane; i < D; i += 32) {
        const bf16 v = __ldcg(a.qkv + QS + KVS + h * D + i);
        vn[i] = minillm::to_f(v);
        if (owns_new) a.vc[(a.slot * a.NKV + h) * D + i] = v;
      }
    }
    __syncthreads();
    float qv[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < 8; ++i) qv[g][i] = qs[g * D + d0 + i];
    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = minillm::neg_inf();
      l[g] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }
    for (int base = j0; base < j1; base += NG * DL_U) {  // trip count uniform over the CTA
      if (base != j0) load_keys(h, j0, j1, base);
      float sc[DL_U][G], vf[DL_U][8];
#pragma unroll
      for (int u = 0; u < DL_U; ++u) {
        float kf[8];
        if (ok[u] && base + grp + u * NG == a.ctx - 1) {  // the new token: from shared memory
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            kf[i] = kn[d0 + i];
            vf[u][i] = vn[d0 + i];
          }
        } else if (ok[u]) {
          minillm::unpack_bf16x8(kv[u], kf);
          minillm::unpack_bf16x8(vv[u], vf[u]);
        } else {  // no key: whatever the clamped load read (maybe not yet written) must not leak
#pragma unroll
          for (int i = 0; i < 8; ++i) kf[i] = vf[u][i] = 0.f;
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) s = fmaf(qv[g][i], kf[i], s);
#pragma unroll
          for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          sc[u][g] = ok[u] ? s : minillm::neg_inf();
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < DL_U; ++u) mn = fmaxf(mn, sc[u][g]);
        if (mn == minillm::neg_inf()) continue;  // no key yet for this group
        const float alpha = exp2f(m[g] - mn);    // 0 while m is -inf
        l[g] *= alpha;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
#pragma unroll
        for (int u = 0; u < DL_U; ++u) {
          const float pr = exp2f(sc[u][g] - mn);  // 0 for a missing key
          l[g] += pr;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(pr, vf[u][i], acc[g][i]);
        }
        m[g] = mn;
      }
    }
    // merge the key groups of a warp (lanes LPK apart hold the same dims), then the warps
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
        const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
        const float mn = fmaxf(m[g], mo);
        const float x = mn == minillm::neg_inf() ? 0.f : exp2f(m[g] - mn);
        const float y = mn == minillm::neg_inf() ? 0.f : exp2f(mo - mn);
        l[g] = l[g] * x + lo * y;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * x + __shfl_xor_sync(0xffffffffu, acc[g][i], o) * y;
        m[g] = mn;
      }
    if (lane < LPK) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int i = 0; i < 8; ++i) wacc[(warp * G + g) * D + d0 + i] = acc[g][i];
        if (lane == 0) {
          wm[warp * G + g] = m[g];
          wl[warp * G + g] = l[g];
        }
      }
    }
    __syncthreads();
    float* pp = a.part + (i64)(h * DL_MAX_S + sp) * G * (D + 2);
    for (int t = threadIdx.x; t < G * D; t += DL_THREADS) {
      const int g = t / D, d = t % D;
      float M = minillm::neg_inf();
      for (int w = 0; w < DL_WARPS; ++w) M = fmaxf(M, wm[w * G + g]);
      float L = 0.f, A = 0.f;
      if (M != minillm::neg_inf())
        for (int w = 0; w < DL_WARPS; ++w) {
          const float x = exp2f(wm[w * G + g] - M);
          L += wl[w * G + g] * x;
          A += wacc[(w * G + g) * D + d] * x;
        }
      if (S == 1) {
        a.attn[(h * G + g) * D + d] = __float2bfloat16_rn(L > 0.f ? A / L : 0.f);
      } else {
        pp[g * (D + 2) + d] = A;
        if (d == 0) {
          pp[g * (D + 2) + D] = M;
          pp[g * (D + 2) + D + 1] = L;
        }
      }
    }
    if (S > 1) {  // the last split of this KV head to finish merges all of them
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) s_last = atomicAdd(a.head_cnt + h, 1u) == (unsigned)(S - 1);
      __syncthreads();
      if (s_last) {
        __threadfence();
        const float* ph = a.part + (i64)h * DL_MAX_S * G * (D + 2);
        for (int t = threadIdx.x; t < G * D; t += DL_THREADS) {
          const int g = t / D, d = t % D;
          float M = minillm::neg_inf();
          for (int s = 0; s < S; ++s) M = fmaxf(M, __ldcg(ph + (s * G + g) * (D + 2) + D));
          float L = 0.f, A = 0.f;
          if (M != minillm::neg_inf())
            for (int s = 0; s < S; ++s) {
              const float* q = ph + (s * G + g) * (D + 2);
              const float ms = __ldcg(q + D);
              const float x = ms == minillm::neg_inf() ? 0.f : exp2f(ms - M);
              L += __ldcg(q + D + 1) * x;
              A += __ldcg(q + d) * x;
            }
          a.attn[(h * G + g) * D + d] = __float2bfloat16_rn(L > 0.f ? A / L : 0.f);
        }
        if (threadIdx.x == 0) atomicExch(a.head_cnt + h, 0u);
      }
    }
    __syncthreads();  // shared scratch is reused by the next item
  }
}

}  // namespace

// grid (number of SMs), block DL_THREADS, dynamic shared memory from the host (> half an SM's).
// residual [H] holds the embedded token on entry and the residual stream before the last layer's
// down output on exit; hidden [H] that output (what rms_norm(hidden, residual=residual) expects).
// table: [n_layers, 9] LayerPtrs; k_cache / v_cache: layer 0 of [layers, blocks, block_size, NKV,
// D], layer_stride elements apart. sync: [96 + NKV] zeros on first use, left zero after each run.
// prof: null, or [5 * n_layers - 1][gridDim.x][2] u64 for grid_sync's timestamps (barrier b ends
// stage b % 5 of qkv, attention, o, gate_up, down; the profile script reads them).
extern "C" __global__ void __launch_bounds__(DL_THREADS, 1) decode_layers(
    const u64* __restrict__ table, int n_layers, bf16* residual, bf16* hidden, bf16* qkv, bf16* attn,
    bf16* act, float* part, unsigned* sync, bf16* k_cache, bf16* v_cache, i64 layer_stride,
    int num_blocks, const int* __restrict__ positions, const int* __restrict__ slots,
    const int* __restrict__ block_table, int max_blocks, const int* __restrict__ seq_lens,
    const float* __restrict__ cos_sin, int max_pos, int H, int NQ, int NKV, int F, int block_size,
    float eps, float scale_log2, int xs_len, u64* prof) {
  minillm::pdl_entry();
  extern __shared__ float4 dl_smem[];
  __shared__ float scratch[32];
  float* res = reinterpret_cast<float*>(dl_smem);  // [H]
  float* red = res + ((H + 3) & ~3);                 // [DL_RED]
  float* xs = red + DL_RED;                          // [max(H, NQ * D, F)] or attention scratch
  uint4* stg = reinterpret_cast<uint4*>(xs + ((xs_len + 3) & ~3));  // [DL_WARPS * DL_PRE_SLOTS * 32]
  const int D = DL_D, QS = NQ * D, KVS = NKV * D;
  const int pos = positions[0], ctx = seq_lens[0];
  const i64 slot = slots[0];
  MINILLM_CHECK(pos >= 0 && pos < max_pos);
  MINILLM_CHECK(slot < (i64)num_blocks * block_size);
  MINILLM_CHECK(ctx <= max_blocks * block_size);
  load_row(residual, res, H);
  __syncthreads();  // load_row's threads write other elements than add_and_norm's read (racecheck)
  const LayerPtrs* layers = reinterpret_cast<const LayerPtrs*>(table);
  AttnArgs a;
  a.eps = eps;
  a.cs = cos_sin + (i64)max(0, min(pos, max_pos - 1)) * D;
  a.slot = slot;
  a.block_table = block_table;
  a.ctx = ctx;
  a.block_size = block_size;
  a.NQ = NQ;
  a.NKV = NKV;
  a.num_blocks = num_blocks;
  a.scale_log2 = scale_log2;
  a.attn = attn;
  a.part = part;
  a.head_cnt = sync + DL_HEADS;
  a.qkv = qkv;
  int b = 0;  // grid barriers passed: 5 a layer, the first layer's first one not needed
  auto barrier = [&]() { grid_sync(sync, b++, prof); };
  for (int layer = 0; layer < n_layers; ++layer) {
    const LayerPtrs lp = layers[layer];
    // 1. residual (+ the previous down output), attention norm, qkv
    prefetch_rows(lp.o, slice_begin(H), slice_end(H), QS);
    gemv_stage<false>(lp.qkv, xs, QS + 2 * KVS, H, lp.qkv_bias, qkv, red, stg, [&] {
      if (layer > 0) barrier();
      add_and_norm(res, layer > 0 ? hidden : nullptr, lp.attn_norm, eps, H, xs, scratch);
    });
    // 2. attention
    prefetch_rows(lp.gate_up, slice_begin(F), slice_end(F), H);
    prefetch_rows(lp.gate_up, F + slice_begin(F), F + slice_end(F), H);
    a.q_norm = lp.q_norm;
    a.k_norm = lp.k_norm;
    a.kc = k_cache + layer * layer_stride;
    a.vc = v_cache + layer * layer_stride;
    attention_stage(a, xs, barrier);
    // 3. o projection
    prefetch_rows(lp.down, slice_begin(H), slice_end(H), F);
    gemv_stage<false>(lp.o, xs, H, QS, nullptr, hidden, red, stg, [&] {
      barrier();
      load_row(attn, xs, QS);
      __syncthreads();
    });
    // 4. residual += o output, MLP norm, gate_up with SiLU-and-multiply
    if (layer + 1 < n_layers) {
      const int n = QS + 2 * KVS;
      prefetch_rows(layers[layer + 1].qkv, slice_begin(n), slice_end(n), H);
    }
    gemv_stage<true>(lp.gate_up, xs, F, H, nullptr, act, red, stg, [&] {
      barrier();
      add_and_norm(res, hidden, lp.mlp_norm, eps, H, xs, scratch);
    });
    // 5. down (complete for the next layer after its first barrier, or when the kernel ends)
    gemv_stage<false>(lp.down, xs, H, F, nullptr, hidden, red, stg, [&] {
      barrier();
      load_row(act, xs, F);
      __syncthreads();
    });
  }
  if (blockIdx.x == 0)  // every CTA read residual before the first barrier
    for (int i = threadIdx.x; i < H; i += DL_THREADS) residual[i] = __float2bfloat16_rn(res[i]);
  grid_done(sync);
}
