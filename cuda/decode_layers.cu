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
// SMs). Weights never depend on the step's activations, so a producer warp streams each CTA's
// weight rows through a ring of shared-memory slots (TMA bulk copies, mbarriers) ahead of the
// compute warps, across stages and layers. Values are rounded to bf16 wherever the op-by-op path
// stores them (residual, normed rows, qkv, q/k after norm and RoPE, attention output, act), so both
// paths compute the same thing up to fp32 summation order.
//
// Measured on the H200 (docs/BENCHMARKS.md, session 6): the ring alone delivers 4.4-4.6 TB/s, but
// every tile the compute warps work on costs ~1.2-1.4 us whatever the work (FMA units or tensor
// cores, one or four accumulator chains; cause not found), so the 0.6B kernel takes 0.95-0.99 ms
// (about what the op-by-op CUDA graph spends on its layers) and the 8B one 6.1 ms against ~4.4. So
// the host builds it only with MINILLM_FUSED_DECODE=1. scripts/decode_layers_profile.py times each
// stage, barrier and GEMV phase from timestamps the kernel records.
// Profiled again in session 30 (part189, op-by-op graphs 0.840 / 4.299 ms on the same machine): the
// kernel 986 us (0.6B) / 6,227 us (8B); 918 / 4,681 with its GEMV work switched off (DL_NO_GEMV),
// so the chain of barriers, x loads and attention alone costs more than the op-by-op step's
// hand-offs: its five grid barriers take 8 us a layer (0.8-2.3 us each, the ones while the ring
// refills slowest). Per-CTA flags polled by every CTA instead of one counter made them 15 us
// (removed); one slot release a warp (DL_WARP_ARRIVE) took 2.2% / 2.4% off.
//
// All CTAs must be resident at once (the barrier spins): the host launches one per SM with more
// than half an SM's shared memory, so no two share an SM and none waits for a slot. A CTA is 15
// compute warps and the producer warp (16 warps leave 128 registers a thread; 17 would leave 96).
// Per-step values (position, slot, context length, block table) come from device buffers, so a
// captured graph replays for any step. Compiled per model with -DDL_D=<head_dim> -DDL_G=<query
// heads per KV head>.
#include "common.cuh"

#ifndef DL_D
#define DL_D 128
#endif
#ifndef DL_G
#define DL_G 2
#endif
#define DL_THREADS 480  // the compute warps; one more warp produces the weight ring
#define DL_WARPS (DL_THREADS / 32)
#ifndef DL_MIN_PART
#define DL_MIN_PART 32        // fewest keys an attention split takes
#endif
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

// The compute warps' barrier (named barrier 1: the producer warp of the weight ring never joins).
__device__ __forceinline__ void cta_sync() { asm volatile("bar.sync 1, %0;" ::"n"(DL_THREADS) : "memory"); }

// Sum over the compute warps; every one of their threads gets it. scratch: 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = minillm::warp_sum(v);
  cta_sync();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  cta_sync();
  v = minillm::warp_sum(lane < DL_WARPS ? scratch[lane] : 0.f);
  cta_sync();
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
#ifndef DL_WARP_ARRIVE
#define DL_WARP_ARRIVE 0  // 1: a ring slot is released by one arrival a warp (after __syncwarp), not one a thread
#endif

// Grid-wide barrier number k of this launch. The arrival count only grows during a launch, so
// barrier k is complete once it reaches (k + 1) * gridDim.x: one atomic per CTA, then a spin on
// the count (measured on the H200, scripts/decode_layers_profile.py: 0.83 us a barrier, against
// 1.3 us when the last arrival raised a separate flag). grid_done() zeroes it for the next
// launch. prof (null unless profiling) gets each CTA's arrival and release times:
// [barrier][CTA][2] ns.
__device__ __forceinline__ void grid_sync(unsigned* bar, int k, u64* prof) {
  cta_sync();
  if (threadIdx.x == 0) {
    if (prof) prof[((i64)k * gridDim.x + blockIdx.x) * 2] = global_ns();
    const unsigned target = (unsigned)(k + 1) * gridDim.x;
    __threadfence();  // this CTA's writes (ordered before by the barrier above) go first
    atomicAdd(bar + DL_ARRIVE, 1u);
    while (ld_acquire(bar + DL_ARRIVE) < target) {
    }
    if (prof) prof[((i64)k * gridDim.x + blockIdx.x) * 2 + 1] = global_ns();
  }
  cta_sync();
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
// ---- the weight ring ----------------------------------------------------------------------------
// Weights never depend on the step's activations, so a CTA knows, before the step starts, every
// byte of weight it will read and in which order: its rows of the qkv, o, gate_up and down
// matrices, layer after layer. A producer warp streams them into a ring of shared-memory slots
// with TMA bulk copies (cp.async.bulk, one per run of rows, completion counted on the slot's "full"
// mbarrier) and refills a slot once every compute thread has arrived on its "empty" mbarrier,
// across stage and layer boundaries. The copies run while the compute warps wait at grid barriers
// and work on attention, so a GEMV stage mostly finds its weights already in shared memory (the
// profile's "wait" column). (Before: loading each stage's weights when it started left the GEMV
// stages latency-bound at 1.5-1.9 TB/s on the 0.6B shape, and prefetching them into L2 instead
// gained ~5%: docs/BENCHMARKS.md, session 5.)

#define DL_MAX_SLOTS 8

// the TMA / mbarrier helpers: common.cuh
using minillm::bulk_copy;
using minillm::mbar_expect_tx;
using minillm::mbar_init;
using minillm::mbar_wait;
using minillm::smem_addr;

// This CTA's share of one GEMV stage; the same in every layer (all layers have one shape). Its
// weight rows, in the order they pass through the ring ("physical rows" p < P): rows r0 .. r0 +
// rows - 1 of W, and for a gated stage (gate rows [0, N), up rows [N, 2N)) then the same rows of
// the up half. A slot holds rt whole rows (DL_ROW_PAD bytes apart beyond their 2K); a tile is one
// slot's worth.
#ifndef DL_NO_GEMV
#define DL_NO_GEMV 0  // 1 (profiling only, wrong results): consume tiles without computing on them
#endif
// 1: the tiles on tensor cores with the weights as mma's B operand (8 rows x 16 k, rows past the
// tile load zeros instead of re-reading a row), x in every row of A. Session 6's tensor-core try
// put the weights in A (16 rows a mma): tiles of 1-3 rows read 16, and 8B got slower. Not yet run
// on a GPU: tests/test_decode_layers.py's variant test and the profile's --variant DL_MMA_B=1.
#ifndef DL_MMA_B
#define DL_MMA_B 0
#endif
#define DL_ROW_PAD (DL_MMA_B ? 16 : 0)  // B fragments of 8 rows then hit 8 different bank groups
struct StagePlan {
  int N, K, gated;
  int r0, rows, P;
  int rt;     // rows a tile holds
  int ks;     // parts K is split into, so a tile's row pairs x ks fill the warps
  int tiles;  // tiles (slots) the stage takes; 0 when this CTA has no rows
};

__device__ __forceinline__ StagePlan stage_plan(int N, int K, bool gated, int slot_bytes) {
  StagePlan p;
  p.N = N;
  p.K = K;
  p.gated = gated;
  p.r0 = slice_begin(N);
  p.rows = slice_end(N) - p.r0;
  p.P = p.rows * (gated ? 2 : 1);
  p.rt = max(1, min(p.P, slot_bytes / (2 * K + DL_ROW_PAD)));
#if DL_MMA_B  // units of 8 rows x one of ks parts of the K / 16 steps; partial sums capped at DL_RED
  p.ks = max(1, min(min(DL_WARPS / ((p.rt + 7) / 8), K / 16), DL_RED / max(1, p.P)));
#else
  p.ks = max(1, min(DL_WARPS / ((p.rt + 1) / 2), K / 8));
#endif
  p.tiles = (p.P + p.rt - 1) / p.rt;
  return p;
}

struct Ring {
  unsigned slots;        // shared address of slot 0
  unsigned full, empty;  // shared addresses of slot 0's barriers (8 bytes apart): landed, read
  int n, slot_bytes;     // slots, bytes a slot
  int per_layer, total;  // tiles a layer, in the launch
  const StagePlan* plan;  // [4]: qkv, o, gate_up, down (shared memory)
  const bf16* const* w;   // [n_layers][4] the matrices (shared memory)
};

// Tile j (in consumption order over the whole launch) into slot j % n, by the producer thread: TMA
// bulk copies, one per run of rows, counted on the slot's "full" barrier.
__device__ void ring_issue(const Ring& g, int j) {
  const int layer = j / g.per_layer;
  int t = j % g.per_layer, s = 0;
  while (t >= g.plan[s].tiles) t -= g.plan[s++].tiles;
  const StagePlan& p = g.plan[s];
  const int a = t * p.rt, b = min(p.P, a + p.rt);
  const bf16* W = g.w[layer * 4 + s];
  unsigned dst = g.slots + (unsigned)(j % g.n) * g.slot_bytes;
  const unsigned row_bytes = 2u * p.K, bar = g.full + 8u * (j % g.n);
  mbar_expect_tx(bar, (unsigned)(b - a) * row_bytes);
  for (int i = a; i < b;) {  // at most two runs (the gate rows, then the up rows), or one copy a row
    const int end = DL_ROW_PAD ? i + 1 : i < p.rows ? min(b, p.rows) : b;
    const int row = i < p.rows ? p.r0 + i : p.N + p.r0 + (i - p.rows);
    bulk_copy(dst, W + (i64)row * p.K, (unsigned)(end - i) * row_bytes, bar);
    dst += (unsigned)(end - i) * (row_bytes + DL_ROW_PAD);
    i = end;
  }
}

// The producer warp (warp DL_WARPS, lane 0 works): every tile of the launch in order, each once
// its slot's previous tile has been read by all compute warps. A bulk copy's issue stalls while
// the TMA unit is busy with earlier ones (measured: with thread 0 of the compute warps issuing, a
// GEMV tile took ~1.3 us whatever its work), so no compute thread issues copies.
__device__ void ring_produce(const Ring& g) {
  if ((threadIdx.x & 31) != 0) return;
  for (int j = 0; j < g.total; ++j) {
    if (j >= g.n) mbar_wait(g.empty + 8u * (j % g.n), (unsigned)(j / g.n - 1) & 1u);
    ring_issue(g, j);
  }
}

// Thread 0, before the CTA-wide barrier that starts the kernel: the slots' barriers.
__device__ void ring_init(const Ring& g) {
  for (int i = 0; i < g.n; ++i) {
    mbar_init(g.full + 8u * i, 1);  // the producer's arrive (with the bytes it expects)
    // every compute thread (or warp) arrives once it has read the slot
    mbar_init(g.empty + 8u * i, DL_WARP_ARRIVE ? DL_WARPS : DL_THREADS);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

using minillm::lds128;
using minillm::mbar_arrive;

// DL_MMA_B: one tile on tensor cores. A unit is an 8-row block of the tile over one of ks parts of
// its K / 16 steps: mma m16n8k16 with A = x[16 k .. 16 k + 16) in all 16 rows and B = the block's
// rows (lane 4 g + t loads row g's words at 2 t and 2 t + 8 of the step; rows past the tile load
// zeros), so every row of C holds x . W[row n] for the block's 8 rows n: lanes 0-3 write them.
__device__ __forceinline__ unsigned lds32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void mma_tile(unsigned tile, unsigned xsa, int a, int nr, const StagePlan& p, float* red,
                                         int warp, int lane) {
  const unsigned rs = 2u * p.K + DL_ROW_PAD;
  const int steps = p.K / 16, g = lane >> 2, t = lane & 3, units = (nr + 7) / 8 * p.ks;
  for (int u = warp; u < units; u += DL_WARPS) {
    const int mb = u / p.ks, part = u % p.ks;
    const int k0 = part * steps / p.ks, k1 = (part + 1) * steps / p.ks;
    const bool has = mb * 8 + g < nr;
    unsigned wsa = tile + (unsigned)(has ? mb * 8 + g : 0) * rs + 4u * t + 32u * k0;
    unsigned xa = xsa + 4u * t + 32u * k0;
    float c[2][4] = {};  // two accumulators, so consecutive mma's do not wait for each other
    for (int k = k0; k < k1; k += 2, wsa += 64, xa += 64) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
        if (k + q < k1) {
          const unsigned b0 = has ? lds32(wsa + 32u * q) : 0u, b1 = has ? lds32(wsa + 32u * q + 16) : 0u;
          const unsigned x0 = lds32(xa + 32u * q), x1 = lds32(xa + 32u * q + 16);
          minillm::mma_bf16_16816(c[q], x0, x0, x1, x1, b0, b1);
        }
    }
    if (lane < 4) {  // C[0][2 lane], C[0][2 lane + 1]: rows 2 lane and 2 lane + 1 of the block
      const int r = mb * 8 + 2 * lane;
      if (r < nr) red[(a + r) * p.ks + part] = c[0][0] + c[1][0];
      if (r + 1 < nr) red[(a + r + 1) * p.ks + part] = c[0][1] + c[1][1];
    }
  }
}

// Profile phases of a GEMV stage (thread 0's clock, summed over layers in shared memory):
#define DL_PH_PRE 0   // pre(): the barrier and the load of x
#define DL_PH_X 1     // x to bf16
#define DL_PH_WAIT 2  // waiting for tiles to land
#define DL_PH_TILES 3  // the tiles, waits included
#define DL_PH_OUT 4   // the epilogue
#define DL_PHASES 5

// Stage `s` of a layer: out[n] = x . W[n] (+ bias[n]) for this CTA's rows n; gated: out[n] =
// silu(x . W[n]) * (x . W[N + n]). pre() (every compute thread calls it: the grid barrier before
// the stage and the load of x into xs) runs while the ring's copies are in flight. A warp computes a
// pair of rows over one of ks parts of K per unit; x is read from a bf16 copy (its values are bf16
// already), so a lane's 16-byte load of x serves 16 products. Partial sums go to red[] and are
// added in a fixed order, so results do not depend on timing. j: the next tile to consume; clock:
// null, or thread 0's [4][DL_PHASES] phase times. (Tensor cores instead, mma m16n8k16 with x in
// every column, measured slower on the 8B shape, 8.5 ms against 6.1: a tile of 1-3 rows made each
// ldmatrix read 16: commit 50f7bd7 and docs/BENCHMARKS.md, session 6.)
template <typename Pre>
__device__ void gemv_stage(const Ring& g, int s, int& j, float* xs, bf16* xh, const bf16* __restrict__ bias,
                           bf16* out, float* red, u64* clock, Pre pre) {
  const StagePlan p = g.plan[s];
  const bool timed = clock && threadIdx.x == 0;
  u64* ph = clock + s * DL_PHASES;
  u64 t = timed ? global_ns() : 0;
  auto lap = [&](int k) {
    if (timed) {
      const u64 now = global_ns();
      ph[k] += now - t;
      t = now;
    }
  };
  pre();
  lap(DL_PH_PRE);
  if (p.tiles == 0) return;  // the whole CTA: no rows here
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = p.K / 8;
  for (int i = threadIdx.x; i < chunks; i += DL_THREADS) {
    float f[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = xs[8 * i + k];
    reinterpret_cast<uint4*>(xh)[i] = minillm::pack_bf16x8(f);
  }
  cta_sync();
  lap(DL_PH_X);
  const unsigned xsa = smem_addr(xh);
  for (int tt = 0; tt < p.tiles; ++tt, ++j) {
    const u64 w0 = timed ? global_ns() : 0;
    mbar_wait(g.full + 8u * (j % g.n), (unsigned)(j / g.n) & 1u);
    if (timed) ph[DL_PH_WAIT] += global_ns() - w0;
    const unsigned tile = g.slots + (unsigned)(j % g.n) * g.slot_bytes;
    const int a = tt * p.rt, nr = min(p.P, a + p.rt) - a, units = (nr + 1) / 2 * p.ks;
    if (DL_MMA_B && !DL_NO_GEMV) mma_tile(tile, xsa, a, nr, p, red, warp, lane);
    for (int u = warp; u < (DL_NO_GEMV || DL_MMA_B ? 0 : units); u += DL_WARPS) {
      const int pr = u / p.ks, part = u % p.ks;
      const int ra = 2 * pr, rb = min(ra + 1, nr - 1);  // a missing second row re-reads the first
      const int c0 = (int)((i64)part * chunks / p.ks), c1 = (int)((i64)(part + 1) * chunks / p.ks);
      const unsigned wa_sa = tile + 16u * (ra * chunks), wb_sa = tile + 16u * (rb * chunks);
      float acc0 = 0.f, acc1 = 0.f;
#pragma unroll 2
      for (int c = c0 + lane; c < c1; c += 32) {
        float xf[8], wa[8], wb[8];
        minillm::unpack_bf16x8(lds128(xsa + 16u * c), xf);
        minillm::unpack_bf16x8(lds128(wa_sa + 16u * c), wa);
        minillm::unpack_bf16x8(lds128(wb_sa + 16u * c), wb);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          acc0 = fmaf(xf[k], wa[k], acc0);
          acc1 = fmaf(xf[k], wb[k], acc1);
        }
      }
      acc0 = minillm::warp_sum(acc0);
      acc1 = minillm::warp_sum(acc1);
      if (lane == 0) {
        red[(a + ra) * p.ks + part] = acc0;
        if (ra + 1 < nr) red[(a + ra + 1) * p.ks + part] = acc1;
      }
    }
    // every thread arrives: an arrive releases only its own thread's reads (part39's racecheck
    // flagged lane 0 arriving for its warp after a __syncwarp). DL_WARP_ARRIVE: lane 0 arrives
    // after __syncwarp, which orders the warp's reads before it (480 arrivals a tile cost 8B +40%:
    // 6.1 -> 8.5 ms, session 6's part34 -> part41)
    if (DL_WARP_ARRIVE) {
      __syncwarp();
      if (lane == 0) mbar_arrive(g.empty + 8u * (j % g.n));
    } else {
      mbar_arrive(g.empty + 8u * (j % g.n));
    }
  }
  cta_sync();  // red[] complete
  lap(DL_PH_TILES);
  for (int i = threadIdx.x; i < p.rows; i += DL_THREADS) {
    float a = 0.f, b = 0.f;
    for (int k = 0; k < p.ks; ++k) {
      a += red[i * p.ks + k];
      if (p.gated) b += red[(p.rows + i) * p.ks + k];
    }
    const float y = p.gated ? a / (1.0f + expf(-a)) * b : a + (bias ? minillm::to_f(bias[p.r0 + i]) : 0.f);
    out[p.r0 + i] = minillm::from_f<bf16>(y);
  }
  lap(DL_PH_OUT);
}

// residual += add (unless null), rounded to bf16; xs = bf16(residual * rstd * w).
__device__ void add_and_norm(float* res, const bf16* add, const bf16* __restrict__ w, float eps, int H,
                             float* xs, float* scratch) {
  if (add) {
    load_row(add, xs, H);
    cta_sync();
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += DL_THREADS) {
    float v = res[i];
    if (add) v = round_bf16(v + xs[i]);
    res[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += DL_THREADS) xs[i] = round_bf16(res[i] * rstd * minillm::to_f(w[i]));
  cta_sync();
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

// The last split of a KV head to finish merges its S partials ([S][G][D + 2]: sums, then m and l)
// into out[G][D]. The thread of each (g, d) loads its first 16 splits' sums at once while warp g
// loads head g's (m, l) pairs and weighs them (scratch: [G][DL_MAX_S] weights, [G] denominators):
// about one L2 round trip, where a loop over the splits took several. Not inlined: inside attention_stage its
// 16 sums spilled. Session 30 (part189, DL_FAST_MERGE then): the attention stage 0.6B 6.64 -> 5.86 us
// a layer, 8B 11.54 -> 8.42.
__device__ __noinline__ void last_split_merge(const float* ph, int S, bf16* out, float* scratch) {
  constexpr int D = DL_D, G = DL_G, HALF = DL_MAX_S / 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* wts = scratch;
  float* den = scratch + G * DL_MAX_S;
  for (int t0 = 0; t0 < G * D; t0 += DL_THREADS) {  // two rounds when G * D > DL_THREADS (D 64, G 8)
    const int t = t0 + threadIdx.x;
    const bool mine = t < G * D;
    const int g = mine ? t / D : 0, d = t % D;
    float av[HALF];
#pragma unroll
    for (int s = 0; s < HALF; ++s) av[s] = mine && s < S ? __ldcg(ph + (s * G + g) * (D + 2) + d) : 0.f;
    if (t0 == 0 && warp < G) {
      const float* q = ph + (lane * G + warp) * (D + 2) + D;
      const float m = lane < S ? __ldcg(q) : minillm::neg_inf(), l = lane < S ? __ldcg(q + 1) : 0.f;
      const float M = minillm::warp_max(m);
      const float w = m == minillm::neg_inf() ? 0.f : exp2f(m - M);
      wts[warp * DL_MAX_S + lane] = w;
      const float L = minillm::warp_sum(w * l);
      if (lane == 0) den[warp] = L;
    }
    if (t0 == 0) cta_sync();
    if (mine) {
      float A = 0.f;
#pragma unroll
      for (int s = 0; s < HALF; ++s)
        if (s < S) A = fmaf(av[s], wts[g * DL_MAX_S + s], A);
      for (int s = HALF; s < S; ++s) A = fmaf(__ldcg(ph + (s * G + g) * (D + 2) + d), wts[g * DL_MAX_S + s], A);
      const float L = den[g];
      out[g * D + d] = __float2bfloat16_rn(L > 0.f ? A / L : 0.f);
    }
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
    cta_sync();
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
    cta_sync();
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
      cta_sync();
      if (threadIdx.x == 0) s_last = atomicAdd(a.head_cnt + h, 1u) == (unsigned)(S - 1);
      cta_sync();
      if (s_last) {
        __threadfence();
        last_split_merge(a.part + (i64)h * DL_MAX_S * G * (D + 2), S, a.attn + h * G * D, wacc);
        if (threadIdx.x == 0) atomicExch(a.head_cnt + h, 0u);
      }
    }
    cta_sync();  // shared scratch is reused by the next item
  }
}

}  // namespace

// grid (number of SMs), block DL_THREADS + 32 (the compute warps, then the ring's producer warp),
// dynamic shared memory from the host (> half an SM's; the layout below, then the weight ring:
// n_slots x slot_bytes at a 128-byte boundary).
// residual [H] holds the embedded token on entry and the residual stream before the last layer's
// down output on exit; hidden [H] that output (what rms_norm(hidden, residual=residual) expects).
// table: [n_layers, 9] LayerPtrs; k_cache / v_cache: layer 0 of [layers, blocks, block_size, NKV,
// D], layer_stride elements apart. sync: [96 + NKV] zeros on first use, left zero after each run.
// prof: null, or [5 * n_layers - 1][gridDim.x][2] u64 for grid_sync's timestamps (barrier b ends
// stage b % 5 of qkv, attention, o, gate_up, down; the profile script reads them), then
// [gridDim.x][4][DL_PHASES] ns thread 0 spent in the phases of the qkv, o, gate_up and down stages.
extern "C" __global__ void __launch_bounds__(DL_THREADS + 32, 1) decode_layers(
    const u64* __restrict__ table, int n_layers, bf16* residual, bf16* hidden, bf16* qkv, bf16* attn,
    bf16* act, float* part, unsigned* sync, bf16* k_cache, bf16* v_cache, i64 layer_stride,
    int num_blocks, const int* __restrict__ positions, const int* __restrict__ slots,
    const int* __restrict__ block_table, int max_blocks, const int* __restrict__ seq_lens,
    const float* __restrict__ cos_sin, int max_pos, int H, int NQ, int NKV, int F, int block_size,
    float eps, float scale_log2, int xs_len, int n_slots, int slot_bytes, u64* prof) {
  minillm::pdl_entry();
  extern __shared__ float4 dl_smem[];
  __shared__ float scratch[32];
  __shared__ StagePlan plan[4];
  __shared__ u64 ring_bars[2 * DL_MAX_SLOTS];  // full[DL_MAX_SLOTS], empty[DL_MAX_SLOTS]
  const bf16** wts = reinterpret_cast<const bf16**>(dl_smem);  // [n_layers][4] (8-byte aligned)
  float* res = reinterpret_cast<float*>(wts + 4 * n_layers);  // [H]
  float* red = res + ((H + 3) & ~3);                          // [DL_RED]
  float* xs = red + DL_RED;                                   // [max(H, NQ * D, F)] or attention scratch
  bf16* xh = reinterpret_cast<bf16*>(xs + ((xs_len + 3) & ~3));  // [max(H, NQ * D, F)]: x as bf16
  char* ring_mem = reinterpret_cast<char*>(
      ((reinterpret_cast<size_t>(xh + ((xs_len + 7) & ~7)) + 127) & ~(size_t)127));
  const int D = DL_D, QS = NQ * D, KVS = NKV * D;
  const int pos = positions[0], ctx = seq_lens[0];
  const i64 slot = slots[0];
  MINILLM_CHECK(pos >= 0 && pos < max_pos);
  MINILLM_CHECK(slot < (i64)num_blocks * block_size);
  MINILLM_CHECK(ctx <= max_blocks * block_size);
  MINILLM_CHECK(n_slots >= 1 && n_slots <= DL_MAX_SLOTS);
  const LayerPtrs* layers = reinterpret_cast<const LayerPtrs*>(table);
  for (int i = threadIdx.x; i < n_layers; i += DL_THREADS) {
    const LayerPtrs lp = layers[i];
    wts[4 * i] = lp.qkv;
    wts[4 * i + 1] = lp.o;
    wts[4 * i + 2] = lp.gate_up;
    wts[4 * i + 3] = lp.down;
  }
  Ring ring;
  ring.slots = smem_addr(ring_mem);
  ring.full = smem_addr(ring_bars);
  ring.empty = ring.full + 8u * DL_MAX_SLOTS;
  ring.n = n_slots;
  ring.slot_bytes = slot_bytes;
  ring.plan = plan;
  ring.w = wts;
  if (threadIdx.x == 0) {
    plan[0] = stage_plan(QS + 2 * KVS, H, false, slot_bytes);
    plan[1] = stage_plan(H, QS, false, slot_bytes);
    plan[2] = stage_plan(F, H, true, slot_bytes);
    plan[3] = stage_plan(H, F, false, slot_bytes);
    for (int s = 0; s < 4; ++s)
      MINILLM_CHECK(plan[s].P * plan[s].ks <= DL_RED && plan[s].rt * (2 * plan[s].K + DL_ROW_PAD) <= slot_bytes &&
                    (!DL_MMA_B || plan[s].K % 16 == 0));
    ring_init(ring);
  }
  __syncthreads();  // the only barrier of all DL_THREADS + 32 threads
  ring.per_layer = plan[0].tiles + plan[1].tiles + plan[2].tiles + plan[3].tiles;
  ring.total = ring.per_layer * n_layers;
  if (threadIdx.x >= DL_THREADS) {  // the producer warp
    ring_produce(ring);
    return;
  }
  load_row(residual, res, H);
  cta_sync();  // load_row's threads write other elements than add_and_norm's read (racecheck)
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
  int j = 0;  // the next tile of the weight ring
  __shared__ u64 clock_sm[4 * DL_PHASES];
  u64* clock = prof ? clock_sm : nullptr;
  if (prof && threadIdx.x == 0)
    for (int i = 0; i < 4 * DL_PHASES; ++i) clock_sm[i] = 0;
  auto barrier = [&]() { grid_sync(sync, b++, prof); };
  for (int layer = 0; layer < n_layers; ++layer) {
    const LayerPtrs lp = layers[layer];
    // 1. residual (+ the previous down output), attention norm, qkv
    gemv_stage(ring, 0, j, xs, xh, lp.qkv_bias, qkv, red, clock, [&] {
      if (layer > 0) barrier();
      add_and_norm(res, layer > 0 ? hidden : nullptr, lp.attn_norm, eps, H, xs, scratch);
    });
    // 2. attention
    a.q_norm = lp.q_norm;
    a.k_norm = lp.k_norm;
    a.kc = k_cache + layer * layer_stride;
    a.vc = v_cache + layer * layer_stride;
    attention_stage(a, xs, barrier);
    // 3. o projection
    gemv_stage(ring, 1, j, xs, xh, nullptr, hidden, red, clock, [&] {
      barrier();
      load_row(attn, xs, QS);
      cta_sync();
    });
    // 4. residual += o output, MLP norm, gate_up with SiLU-and-multiply
    gemv_stage(ring, 2, j, xs, xh, nullptr, act, red, clock, [&] {
      barrier();
      add_and_norm(res, hidden, lp.mlp_norm, eps, H, xs, scratch);
    });
    // 5. down (complete for the next layer after its first barrier, or when the kernel ends)
    gemv_stage(ring, 3, j, xs, xh, nullptr, hidden, red, clock, [&] {
      barrier();
      load_row(act, xs, F);
      cta_sync();
    });
  }
  if (prof && threadIdx.x == 0)
    for (int i = 0; i < 4 * DL_PHASES; ++i)
      prof[(i64)(5 * n_layers - 1) * gridDim.x * 2 + (i64)blockIdx.x * 4 * DL_PHASES + i] = clock_sm[i];
  if (blockIdx.x == 0)  // every CTA read residual before the first barrier
    for (int i = threadIdx.x; i < H; i += DL_THREADS) residual[i] = __float2bfloat16_rn(res[i]);
  grid_done(sync);
}
