// norm.cu: rms_norm (with the fused residual add) and qk_norm_rope (Qwen3's per-head RMSNorm of
// q and k, then rotate-half RoPE), alone or fused with store_kv; twins of NumpyBackend.rms_norm /
// qk_norm_rope / qk_norm_rope_store_kv.
#include "common.cuh"

// One block per row. With a residual: residual <- x + residual (rounded to storage), and the
// rounded sum is what gets normalised, exactly as the NumPy twin normalises the updated residual.
template <typename T>
__device__ __forceinline__ void rms_norm_impl(const T* x, i64 x_stride, T* residual,
                                              i64 r_stride, const T* __restrict__ w, float eps,
                                              T* out, i64 o_stride, int N, int rows) {
  minillm::pdl_entry();
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  if (row >= rows) return;
  const T* xr = x + (i64)row * x_stride;
  T* rr = residual ? residual + (i64)row * r_stride : nullptr;
  T* orow = out + (i64)row * o_stride;
  float ss = 0.f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    float v;
    if (rr) {
      const T s = minillm::from_f<T>(minillm::to_f(xr[i]) + minillm::to_f(rr[i]));
      rr[i] = s;
      v = minillm::to_f(s);
    } else {
      v = minillm::to_f(xr[i]);
    }
    ss += v * v;
  }
  ss = minillm::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / (float)N + eps);
  // Same thread, same elements as the first pass: in-place (out == x) is safe.
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const float v = minillm::to_f(rr ? rr[i] : xr[i]);
    orow[i] = minillm::from_f<T>(v * rstd * minillm::to_f(w[i]));
  }
}

#define QK_WARPS 4
#define QK_MAX_D 512

// grid (tokens, y); warp w of CTA (t, y) takes heads y * QK_WARPS + w, then every gridDim.y *
// QK_WARPS heads further: q heads first, then k heads, then (only when the caches are given) v
// heads. The backend launches one head a warp (y = ceil(heads / QK_WARPS)) for small steps and
// one CTA a token (y = 1) for large ones: at 8,192 tokens x 32 heads the 65,536 CTAs of the
// first shape took 94 us, ~4x the bytes' time (part86), bound by starting CTAs rather than by
// loads. cos_sin is [max_pos, D] fp32 with cos in the first half of a row and sin in the second.
//
// With caches this is qk_norm_rope_store_kv: every k head is also written, normed and rotated,
// to its cache slot and every v head copied to its slot, so a layer needs no separate store_kv
// launch (a small-batch decode step is bound by its chain of dependent launches, ~2-3 us each).
// k is still updated in place as well, so the result is exactly qk_norm_rope then store_kv. A
// negative slot is a padding row: q and k are rotated, nothing goes to the caches.
template <typename T>
__device__ __forceinline__ void qk_norm_rope_impl(
    T* q, i64 q_tok, i64 q_head, T* k, i64 k_tok, i64 k_head, const T* __restrict__ v, i64 v_tok,
    i64 v_head, const T* __restrict__ q_w, const T* __restrict__ k_w, float eps,
    const int* __restrict__ positions, const float* __restrict__ cos_sin, int max_pos,
    T* __restrict__ k_cache, T* __restrict__ v_cache, const int* __restrict__ slots, i64 n_slots,
    int n_tokens, int H, int KH, int D) {
  minillm::pdl_entry();
  __shared__ float buf[QK_WARPS][QK_MAX_D];
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool store = k_cache != nullptr;
  const int n_heads = H + KH + (store ? KH : 0);
  if (t >= n_tokens) return;
  i64 slot = -1;
  if (store) {
    slot = slots[t];
    MINILLM_CHECK(slot < n_slots);
  }
  const int pos = positions[t];
  MINILLM_CHECK(pos >= 0 && pos < max_pos);
#pragma unroll 1
  for (int head = blockIdx.y * QK_WARPS + warp; head < n_heads; head += gridDim.y * QK_WARPS) {
    if (head >= H + KH) {  // a v head: only a copy into its cache slot
      if (slot >= 0) {
        const int h = head - H - KH;
        const T* src = v + (i64)t * v_tok + (i64)h * v_head;
        T* dst = v_cache + (slot * KH + h) * D;
        for (int i = lane; i < D; i += 32) dst[i] = minillm::load_act(src + i);  // the qkv product's
      }
      continue;
    }
    const bool is_q = head < H;
    T* x = is_q ? q + (i64)t * q_tok + (i64)head * q_head : k + (i64)t * k_tok + (i64)(head - H) * k_head;
    T* cache_row = (!is_q && slot >= 0) ? k_cache + (slot * KH + (head - H)) * D : nullptr;
    const T* w = is_q ? q_w : k_w;
    minillm::warp_qk_norm_rope<T>(x, w, eps, cos_sin + (i64)pos * D, buf[warp], D, lane, [&](int i, T o) {
      x[i] = o;
      if (cache_row) cache_row[i] = o;
    });
    __syncwarp();  // the general path's buf is reused by this warp's next head
  }
}

// qk_norm_rope kernels: __launch_bounds__(128, 10) keeps them at 48 registers (10 CTAs an SM, as
// before the head loop; without it ptxas took 69, 7 CTAs an SM, and a decode step's one-head-a-warp
// grid of 192 x 8 CTAs would no longer fit one wave).
#define MINILLM_NORM(SUFFIX, T)                                                                 \
  extern "C" __global__ void rms_norm_##SUFFIX(const T* x, i64 xs, T* res, i64 rs, const T* w,  \
                                               float eps, T* out, i64 os, int N, int rows) {    \
    rms_norm_impl<T>(x, xs, res, rs, w, eps, out, os, N, rows);                                 \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, 10) qk_norm_rope_##SUFFIX(                   \
      T* q, i64 q_tok, i64 q_head, T* k, i64 k_tok, i64 k_head, const T* q_w, const T* k_w,     \
      float eps, const int* positions, const float* cos_sin, int max_pos, int n_tokens, int H,  \
      int KH, int D) {                                                                          \
    qk_norm_rope_impl<T>(q, q_tok, q_head, k, k_tok, k_head, nullptr, 0, 0, q_w, k_w, eps,      \
                         positions, cos_sin, max_pos, nullptr, nullptr, nullptr, 0, n_tokens, H, \
                         KH, D);                                                                \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, 10) qk_norm_rope_store_kv_##SUFFIX(          \
      T* q, i64 q_tok, i64 q_head, T* k, i64 k_tok, i64 k_head, const T* v, i64 v_tok,          \
      i64 v_head, const T* q_w, const T* k_w, float eps, const int* positions,                  \
      const float* cos_sin, int max_pos, T* k_cache, T* v_cache, const int* slots, i64 n_slots, \
      int n_tokens, int H, int KH, int D) {                                                     \
    qk_norm_rope_impl<T>(q, q_tok, q_head, k, k_tok, k_head, v, v_tok, v_head, q_w, k_w, eps,   \
                         positions, cos_sin, max_pos, k_cache, v_cache, slots, n_slots,         \
                         n_tokens, H, KH, D);                                                   \
  }

MINILLM_NORM(bf16, bf16)
MINILLM_NORM(f32, float)

// rms_norm for bf16 rows whose length is a multiple of 8, every pointer and stride 16-byte
// aligned: the same arithmetic as rms_norm_impl, but each thread keeps its C chunks of 8 values
// in registers between the sum of squares and the scaling, and moves them with 16-byte loads and
// stores. A decode step calls rms_norm twice per layer on one short row, where the scalar kernel's
// dependent 2-byte loads made it latency-bound (ncu: ~8.7 us a call for 1024 values).
//
// Where rms_norm_vec releases its dependents (the next product). A norm is one CTA a row, so at
// decode batch sizes its grid is placed at once and an early release cannot take slots it still
// needs (what made early release slow for the GEMVs, common.cuh). From NORM_EARLY_MIN_ROWS rows
// it releases before its wait, so the next kernel's CTAs are placed during the norm; with fewer,
// after the row's loads, as the rest of the chain. Measured on the H200 (session 20, part138;
// release before the wait / right after it / after the loads, batch-k graphs at 512 keys):
// 0.6B batch 4 1.259 -> 1.233 ms (-2.0%), the 8B DFlash round at c = 1 (9-row norms) 6.309 ->
// 6.297 (-0.2%), 8B batch 1 4.414 -> 4.406 (-0.2%), but 0.6B batch 1 0.886 -> 0.979 (+10%; right
// after the wait +12%). Against never releasing early (part139, one machine): 0.6B batch 4 / 8 /
// 16 -2.0 / -1.0 / -0.9%, 8B batch 4 / 8 -0.1 / -0.3%, batch 16 and the c = 16 round within
// their runs' spread. At one row the cause is the one-row GEMVs asking L2 for their weights
// before their wait (gemv.cu): placed early, that traffic goes out while the norm still loads its
// row. With the prefetch off the early release cost nothing, and gained nothing either (session
// 21, part142: 0.6B batch 1 0.882 ms with and without it), so one row keeps the late release.
// The chain stays at most three grids deep: the product releases only after its own main loop.
// Products of 17+ rows are cuBLAS's, plain graph edges, on which the release does nothing.
#ifndef NORM_EARLY_MIN_ROWS
#define NORM_EARLY_MIN_ROWS 2
#endif

namespace {

template <int C>
__device__ __forceinline__ void rms_norm_vec_impl(const bf16* x, i64 xs, bf16* res, i64 rs,
                                                  const bf16* __restrict__ w, float eps, bf16* out,
                                                  i64 os, int N, int rows) {
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const int chunks = N / 8;
  // the weight never depends on another kernel: its loads go out before the PDL wait and the
  // row's, instead of after the block-wide sum (one dependent memory latency less a call; batch-1
  // graphs at 512 keys, one machine, part105: 0.6B 0.987 -> 0.984-0.986 ms, 8B 4.590 -> 4.530)
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  uint4 wv[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    wv[c] = i < chunks ? __ldg(wr + i) : make_uint4(0u, 0u, 0u, 0u);
  }
  const bool early = rows >= NORM_EARLY_MIN_ROWS;
  if (early) minillm::pdl_release();
  minillm::pdl_entry();
  if (row >= rows) return;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (i64)row * xs);
  uint4* rr = res ? reinterpret_cast<uint4*>(res + (i64)row * rs) : nullptr;
  float v[C][8];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i < chunks) {
      minillm::unpack_bf16x8(xr[i], v[c]);
      if (rr) {  // residual <- x + residual, rounded to bf16: that rounded sum is normalised
        float r[8];
        minillm::unpack_bf16x8(rr[i], r);
#pragma unroll
        for (int j = 0; j < 8; ++j) r[j] += v[c][j];
        const uint4 s = minillm::pack_bf16x8(r);
        rr[i] = s;
        minillm::unpack_bf16x8(s, v[c]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[c][j] * v[c][j];
    }
  }
  if (!early) minillm::pdl_release();
  ss = minillm::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / (float)N + eps);
  uint4* orow = reinterpret_cast<uint4*>(out + (i64)row * os);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i < chunks) {
      float wf[8], o[8];
      minillm::unpack_bf16x8(wv[c], wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = v[c][j] * rstd * wf[j];
      orow[i] = minillm::pack_bf16x8(o);
    }
  }
}

}  // namespace

// grid (rows), block: threads * C >= N / 8 (the host picks C in 1, 2, 4).
#define MINILLM_RMS_NORM_VEC(C)                                                                  \
  extern "C" __global__ void rms_norm_vec##C##_bf16(const bf16* x, i64 xs, bf16* res, i64 rs,   \
                                                     const bf16* w, float eps, bf16* out, i64 os, \
                                                     int N, int rows) {                            \
    rms_norm_vec_impl<C>(x, xs, res, rs, w, eps, out, os, N, rows);                              \
  }
MINILLM_RMS_NORM_VEC(1)
MINILLM_RMS_NORM_VEC(2)
MINILLM_RMS_NORM_VEC(4)
