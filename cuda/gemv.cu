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
// Tried and measured slower on the H200 (scripts/gemv_bench.py, docs/BENCHMARKS.md): fusing the
// preceding rms_norm into this kernel, either summing squares in the main loop (+25-35% on the 8B
// shapes) or staging the normalised rows in shared memory (+1-4 us a call, as much as the
// rms_norm launch it saves), and holding the first weight chunks in registers across the PDL
// wait (+45% on gate_up: register pressure).
#include "common.cuh"

#define GEMV_MAX_M 8
#define GEMV_NR 2
#define GEMV_WARPS 4

namespace {

// GATED: out[m, n] = silu(x[m] . w[n]) * (x[m] . w[N + n]) for n < N (w has 2N rows, no bias).
template <typename TO, int M, bool GATED>
__device__ __forceinline__ void gemv_impl(const bf16* __restrict__ x, i64 ldx,
                                          const bf16* __restrict__ w, const bf16* __restrict__ bias,
                                          TO* __restrict__ out, i64 ldo, int N, int K) {
  constexpr int R = GATED ? 2 * GEMV_NR : GEMV_NR;  // weight rows a warp streams at once
  minillm::pdl_entry();  // before the early return: see cuda/common.cuh
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  const int n0 = warp * GEMV_NR;
  if (n0 >= N) return;
  const int chunks = K / 8;  // 16-byte chunks per row (the host checks K % 8 == 0)
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  // Unrolled so the loads of several chunks are in flight per lane: one chunk's R 16-byte loads
  // were too few to hide HBM latency on the 8B model's matrices (~2.5 of ~4.2 TB/s).
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {  // issue every row's load before using any
      const int col = min(n0 + r % GEMV_NR, N - 1);
      const int n = r < GEMV_NR ? col : N + col;  // rows past GEMV_NR: the up half (GATED)
      wv[r] = __ldg(reinterpret_cast<const uint4*>(w + (i64)n * K) + c);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      // a plain load, not __ldg (data read-only for the whole kernel): under PDL this kernel may
      // be launched while the one writing x still runs
      minillm::unpack_bf16x8(reinterpret_cast<const uint4*>(x + (i64)m * ldx)[c], xf);
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
#pragma unroll
  for (int r = 0; r < GEMV_NR; ++r) {
    const int n = n0 + r;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float s = minillm::warp_sum(acc[r][m]);
      const float up = GATED ? minillm::warp_sum(acc[r + GEMV_NR][m]) : 0.f;
      if (lane == 0 && n < N) {
        // GATED: silu in fp32 on the unrounded sums (the unfused path rounds gate_up to bf16 first)
        const float y = GATED ? s / (1.0f + expf(-s)) * up
                              : s + (bias ? minillm::to_f(bias[n]) : 0.f);
        out[(i64)m * ldo + n] = minillm::from_f<TO>(y);
      }
    }
  }
}

}  // namespace

// grid (ceil(N / (GEMV_NR * GEMV_WARPS))), block 32 * GEMV_WARPS; M selects the instantiation.
#define MINILLM_GEMV_SWITCH(TO, GATED)                                          \
  switch (M) {                                                                  \
    case 1: gemv_impl<TO, 1, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    case 2: gemv_impl<TO, 2, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    case 3: gemv_impl<TO, 3, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    case 4: gemv_impl<TO, 4, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    case 5: gemv_impl<TO, 5, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    case 6: gemv_impl<TO, 6, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    case 7: gemv_impl<TO, 7, GATED>(x, ldx, w, bias, out, ldo, N, K); break;   \
    default: gemv_impl<TO, 8, GATED>(x, ldx, w, bias, out, ldo, N, K); break;  \
  }

#define MINILLM_GEMV(SUFFIX, TO)                                                                 \
  extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_##SUFFIX(                 \
      const bf16* x, i64 ldx, const bf16* w, const bf16* bias, TO* out, i64 ldo, int M, int N, \
      int K) {                                                                                 \
    MINILLM_GEMV_SWITCH(TO, false)                                                             \
  }

MINILLM_GEMV(bf16, bf16)
MINILLM_GEMV(f32, float)

// out [M, F] = silu(x @ w[:F].T) * (x @ w[F:].T) for the [2F, K] gate_up matrix w; grid
// (ceil(F / (GEMV_NR * GEMV_WARPS))).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv_silu_mul_bf16(const bf16* x, i64 ldx, const bf16* w, bf16* out, i64 ldo, int M, int F,
                       int K) {
  const bf16* bias = nullptr;
  const int N = F;
  MINILLM_GEMV_SWITCH(bf16, true)
}
