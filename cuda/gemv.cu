// gemv.cu: out = x @ w.T (+ bias) for a few rows of x (decode steps), bf16 weights, fp32 sums.
// The NumPy twin is NumpyBackend.matmul; the CUDA backend sends M <= GEMV_MAX_M rows here and
// larger products to cuBLAS.
//
// Why: at batch 1-8 a decode step's matmuls are pure weight streaming, and cuBLAS on the small
// matrices of a 0.6B model reached well under half of the copy bandwidth (ncu, docs/BENCHMARKS.md).
// Here each warp owns GEMV_NR output columns at a time and streams their weight rows with 16-byte
// loads, every lane a different 16-byte chunk (a warp reads 512 contiguous bytes per row per
// iteration), NR rows in flight at once; x rows come through L1/L2 at the same offsets. Each
// column's M dot products are reduced across the warp and written by lane 0.
//
// gemv_silu_mul is the MLP's gate_up product fused with its activation (NumPy twin: matmul then
// silu_mul): w is the [2F, K] gate_up matrix, and a warp streams gate rows n and up rows F + n
// together, so it holds both dot products of output column n and writes silu(gate) * up straight
// into the [M, F] activation. That saves the silu_mul launch (a decode step is bound by its chain
// of dependent launches) and the round trip of the [M, 2F] gate_up activation through memory.
//
// Two more fusions remove the decoder layer's rms_norm launches (twin: matmul's norm_w and
// accumulate arguments):
//  * norm_w (prologue): x's rows are RMS-normalised with weight norm_w first. Every warp already
//    reads all of x's row for its columns, so it sums the squares on the way and scales its dot
//    products by the row's 1/rms at the end: sum_k x_k g_k w_k * rstd, no extra pass or barrier.
//    (The unfused path rounds the normalised row to bf16 before the product; this one does not.)
//  * accumulate (epilogue): out += the product, one rounding, which is the residual add after the
//    attention output and down projections. Each element is read and written by one lane only.
#include "common.cuh"

#define GEMV_MAX_M 4  // rows per launch; the host sends more to cuBLAS
#define GEMV_NR 2
#define GEMV_WARPS 4

namespace {

constexpr int GEMV_PREFETCH = 4;  // chunks per lane loaded before waiting on the previous kernel

// The weight rows a warp streams for one 16-byte chunk c: columns n0, n0 + 1 (and, GATED, their
// up rows N + n0, N + n0 + 1); past-the-end columns re-read the last row (their sums are dropped).
template <int R>
__device__ __forceinline__ void load_w(const bf16* __restrict__ w, int n0, int N, int K, int c,
                                       uint4 (&wv)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {  // issue every row's load before using any
    const int col = min(n0 + r % GEMV_NR, N - 1);
    const int n = r < GEMV_NR ? col : N + col;  // rows past GEMV_NR: the up half (GATED)
    wv[r] = __ldg(reinterpret_cast<const uint4*>(w + (i64)n * K) + c);
  }
}

// acc[r][m] += x[m] chunk c . wv[r]; NORM: ss[m] += the chunk's squares, x scaled by norm_w.
template <int M, int R, bool NORM>
__device__ __forceinline__ void fma_chunk(const bf16* __restrict__ x, i64 ldx,
                                          const bf16* __restrict__ norm_w, int c,
                                          const uint4 (&wv)[R], float (&acc)[R][M],
                                          float (&ss)[M]) {
  float gf[8];
  if (NORM) minillm::unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(norm_w) + c), gf);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[8];
    // plain loads, not __ldg: x is written by the kernel just before (see pdl_entry)
    minillm::unpack_bf16x8(reinterpret_cast<const uint4*>(x + (i64)m * ldx)[c], xf);
    if (NORM) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ss[m] = fmaf(xf[i], xf[i], ss[m]);
        xf[i] *= gf[i];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[8];
      minillm::unpack_bf16x8(wv[r], wf);
      float s = acc[r][m];
#pragma unroll
      for (int i = 0; i < 8; ++i) s = fmaf(xf[i], wf[i], s);
      acc[r][m] = s;
    }
  }
}

// GATED: out[m, n] = silu(x[m] . w[n]) * (x[m] . w[N + n]) for n < N (w has 2N rows, no bias).
// NORM: x[m] stands for rmsnorm(x[m]) * norm_w. accumulate: out[m, n] += instead of =.
template <typename TO, int M, bool GATED, bool NORM>
__device__ __forceinline__ void gemv_impl(const bf16* __restrict__ x, i64 ldx,
                                          const bf16* __restrict__ w, const bf16* __restrict__ bias,
                                          const bf16* __restrict__ norm_w, float eps,
                                          TO* __restrict__ out, i64 ldo, int N, int K,
                                          int accumulate) {
  constexpr int R = GATED ? 2 * GEMV_NR : GEMV_NR;  // weight rows a warp streams at once
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  const int n0 = min(warp * GEMV_NR, N - 1);  // spare warps of the last CTA compute a copy
  const int chunks = K / 8;  // 16-byte chunks per row (the host checks K % 8 == 0)
  // The weights do not depend on the previous kernel: their first chunks are in flight before
  // the wait (for the 0.6B shapes, K = 1024, that is all of a lane's chunks).
  minillm::pdl_release();
  uint4 pre[GEMV_PREFETCH][R];
#pragma unroll
  for (int p = 0; p < GEMV_PREFETCH; ++p)
    if (lane + 32 * p < chunks) load_w<R>(w, n0, N, K, lane + 32 * p, pre[p]);
  minillm::pdl_wait();

  float acc[R][M];
  float ss[M];  // NORM: this lane's part of each row's sum of squares
#pragma unroll
  for (int m = 0; m < M; ++m) {
    ss[m] = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][m] = 0.f;
  }
#pragma unroll
  for (int p = 0; p < GEMV_PREFETCH; ++p)
    if (lane + 32 * p < chunks) fma_chunk<M, R, NORM>(x, ldx, norm_w, lane + 32 * p, pre[p], acc, ss);
  // Unrolled so the loads of several chunks are in flight per lane: one chunk's R 16-byte loads
  // were too few to hide HBM latency on the 8B model's matrices (~2.5 of ~4.2 TB/s).
#pragma unroll 4
  for (int c = lane + 32 * GEMV_PREFETCH; c < chunks; c += 32) {
    uint4 wv[R];
    load_w<R>(w, n0, N, K, c, wv);
    fma_chunk<M, R, NORM>(x, ldx, norm_w, c, wv, acc, ss);
  }
  float rstd[M];
#pragma unroll
  for (int m = 0; m < M; ++m)
    rstd[m] = NORM ? rsqrtf(minillm::warp_sum(ss[m]) / (float)K + eps) : 1.f;
  if (warp * GEMV_NR >= N) return;  // after the wait: see pdl_entry
#pragma unroll
  for (int r = 0; r < GEMV_NR; ++r) {
    const int n = n0 + r;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float s = minillm::warp_sum(acc[r][m]) * rstd[m];
      const float up = GATED ? minillm::warp_sum(acc[r + GEMV_NR][m]) * rstd[m] : 0.f;
      if (lane == 0 && n < N) {
        // GATED: silu in fp32 on the unrounded sums (the unfused path rounds gate_up to bf16 first)
        float y = GATED ? s / (1.0f + expf(-s)) * up : s + (bias ? minillm::to_f(bias[n]) : 0.f);
        TO* o = out + (i64)m * ldo + n;
        if (accumulate) y += minillm::to_f(*o);
        *o = minillm::from_f<TO>(y);
      }
    }
  }
}

}  // namespace

// grid (ceil(N / (GEMV_NR * GEMV_WARPS))), block 32 * GEMV_WARPS; M and norm_w != null select the
// instantiation.
#define MINILLM_GEMV_CASE(TO, GATED, MM)                                                  \
  case MM:                                                                                \
    if (norm_w)                                                                           \
      gemv_impl<TO, MM, GATED, true>(x, ldx, w, bias, norm_w, eps, out, ldo, N, K, acc);  \
    else                                                                                  \
      gemv_impl<TO, MM, GATED, false>(x, ldx, w, bias, norm_w, eps, out, ldo, N, K, acc); \
    break;
#define MINILLM_GEMV_SWITCH(TO, GATED)                                                   \
  switch (M) {                                                                           \
    MINILLM_GEMV_CASE(TO, GATED, 1)                                                      \
    MINILLM_GEMV_CASE(TO, GATED, 2)                                                      \
    MINILLM_GEMV_CASE(TO, GATED, 3)                                                      \
    default:                                                                             \
    MINILLM_GEMV_CASE(TO, GATED, GEMV_MAX_M)                                             \
  }

#define MINILLM_GEMV(SUFFIX, TO)                                                                 \
  extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_##SUFFIX(                 \
      const bf16* x, i64 ldx, const bf16* w, const bf16* bias, const bf16* norm_w, float eps,   \
      TO* out, i64 ldo, int M, int N, int K, int acc) {                                        \
    MINILLM_GEMV_SWITCH(TO, false)                                                             \
  }

MINILLM_GEMV(bf16, bf16)
MINILLM_GEMV(f32, float)

// out [M, F] = silu(x @ w[:F].T) * (x @ w[F:].T) for the [2F, K] gate_up matrix w; grid
// (ceil(F / (GEMV_NR * GEMV_WARPS))).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv_silu_mul_bf16(const bf16* x, i64 ldx, const bf16* w, const bf16* norm_w, float eps,
                       bf16* out, i64 ldo, int M, int F, int K) {
  const bf16* bias = nullptr;
  const int N = F, acc = 0;
  MINILLM_GEMV_SWITCH(bf16, true)
}
