// gemm.cu: out = x @ w.T (+ bias) for 17-256 rows of x (the decode steps of large batches),
// bf16 in and out, fp32 sums. The NumPy twin is NumpyBackend.matmul. Opt-in: with MINILLM_GEMM=wide
// the CUDA backend sends such products here when wide_product_plan (minillm/backends/cuda_ops.py)
// finds a launch shape; by default they go to cuBLAS, which the H200 measured faster everywhere
// (0.2-0.9x of cuBLAS's speed here, scripts/gemm_bench.py, part63-65 in docs/BENCHMARKS.md). Its
// variants showed why: the cluster sum's remote loads were latency-bound (10 us at 192 rows with
// 8 splits, with no loads or math at all), every CTA re-reads x from L2 (37.7 MB for the 0.6B
// gate_up at 192 rows against its 12.6 MB of weights), and mma.sync at 8 warps an SM computed at
// ~290 TFLOP/s where cuBLAS's wgmma kernels reach ~380. Kept, tested, for whoever takes it on
// (wgmma, a wider weight tile, vector remote loads).
//
// Why: at 64-256 rows the products of a 0.6B model are 2-12 MB of weights and 0.4-2.4 GFLOP each,
// a few microseconds of work; cuBLAS ran them at 0.7-2.9 TB/s (5.3-6.9 us each at 192 rows,
// scripts/cublaslt_bench.py), its tiles walking the whole K in one CTA and filling less than one
// wave of SMs. Here a CTA takes 64 weight rows (output columns) and one K-slice, for every row of
// x at once, so each weight is read from HBM once; the S CTAs that split one tile's K form a
// thread-block cluster and add their fp32 partial tiles through distributed shared memory, each
// finishing 64 / S of the tile's columns. S is chosen from (N, K) alone, never from M, so a row's
// result does not depend on the batch it sits in (each element sums its K-slices in rank order).
//
// The main loop: 4-8 stages of cp.async (64 weight rows and all x rows, 64 k each; rows padded to
// 144 bytes so ldmatrix hits distinct banks; as many stages as ~180 KB hold, since one CTA an SM
// must keep ~50 KB of weights in flight to stream them: with 3 stages the H200 ran the products
// 2-5x slower than cuBLAS, part63), 8 warps as 2 (weight rows, 32 each) x 4 (x rows,
// 8 * MT each), ldmatrix + mma.sync m16n8k16 with the weights as A and x as B (k contiguous in
// both). The weight tiles of the first stages are requested before the PDL wait: they do not
// depend on the previous kernel.
#include "common.cuh"

#define GW_THREADS 256
#define GW_BN 64            // weight rows (output columns) a CTA
#define GW_BK 64            // k a stage
#define GW_LDS (GW_BK + 8)  // bf16 a shared-memory row
// measurement variants (scripts/gemm_bench.py --variant): the loads alone, the math alone, fewer stages
#ifndef GW_NO_MMA
#define GW_NO_MMA 0
#endif
#ifndef GW_NO_LOADS
#define GW_NO_LOADS 0
#endif
#ifndef GW_MAX_STAGES
#define GW_MAX_STAGES 8
#endif

namespace {

using minillm::cluster_rank;
using minillm::cluster_sync;
using minillm::cp_async_16;
using minillm::ldmatrix_x4;
using minillm::smem_u32;

// A float at shared-memory address addr (this CTA's window) of the cluster's CTA `rank`. Volatile
// (kept in program order after cluster_sync) but no memory clobber, so a run of them is issued
// before the first result is used (with the clobber each waited for the last: part63).
__device__ __forceinline__ float ld_cluster_f32(unsigned addr, unsigned rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(minillm::cluster_map(addr, rank)));
  return v;
}

// Dynamic shared memory of an instance: the stages, reused for the fp32 partial tile.
template <int MT>
struct GwLayout {
  static constexpr int STAGES_BY_MT = MT == 2 ? 8 : MT == 4 ? 6 : MT == 6 ? 5 : 4;  // ~150-185 KB
  static constexpr int STAGES = STAGES_BY_MT < GW_MAX_STAGES ? STAGES_BY_MT : GW_MAX_STAGES;
  static constexpr int MP = 32 * MT;  // x rows held (4 warps x 8 MT); rows >= M are zeros
  static constexpr int W_ELEMS = GW_BN * GW_LDS;
  static constexpr int STAGE = W_ELEMS + MP * GW_LDS;  // bf16
  static constexpr int RLD = MP + 4;                     // floats a partial-tile row
  static constexpr int STAGE_BYTES = STAGES * STAGE * 2;
  static constexpr int RED_BYTES = GW_BN * RLD * 4;
  static constexpr int BYTES = STAGE_BYTES > RED_BYTES ? STAGE_BYTES : RED_BYTES;
};

template <int MT, int S>
__device__ __forceinline__ void gemm_wx_impl(const bf16* __restrict__ x, i64 ldx,
                                             const bf16* __restrict__ w, const bf16* __restrict__ bias,
                                             bf16* __restrict__ out, i64 ldo, int M, int N, int K) {
  typedef GwLayout<MT> Ly;
  static_assert(MT % 2 == 0 && MT >= 2 && MT <= 8, "MT: pairs of 8-row x tiles a warp");
  extern __shared__ __align__(16) unsigned char gw_smem[];
  bf16* sm = reinterpret_cast<bf16*>(gw_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp & 1, wm = warp >> 1;
  const int n0 = blockIdx.x * GW_BN;
  const int rank = S > 1 ? (int)cluster_rank() : 0;
  const int Ks = K / S, k0 = rank * Ks, chunks = Ks / GW_BK;
  MINILLM_CHECK(n0 + GW_BN <= N && K % (S * GW_BK) == 0 && M <= Ly::MP);

  auto load_w = [&](int c, int stage) {
    if (GW_NO_LOADS) return;
    bf16* ws = sm + stage * Ly::STAGE;
    const bf16* src = w + (i64)n0 * K + k0 + c * GW_BK;
    for (int i = tid; i < GW_BN * 8; i += GW_THREADS) {
      const int r = i >> 3, part = i & 7;
      cp_async_16(smem_u32(ws + r * GW_LDS + part * 8), src + (i64)r * K + part * 8, 16);
    }
  };
  auto load_x = [&](int c, int stage) {
    if (GW_NO_LOADS) return;
    bf16* xs = sm + stage * Ly::STAGE + Ly::W_ELEMS;
    const int kc = k0 + c * GW_BK;
    for (int i = tid; i < Ly::MP * 8; i += GW_THREADS) {
      const int r = i >> 3, part = i & 7;
      const bool live = r < M;
      cp_async_16(smem_u32(xs + r * GW_LDS + part * 8), x + (i64)(live ? r : 0) * ldx + kc + part * 8,
                  live ? 16 : 0);
    }
  };
  constexpr int STAGES = Ly::STAGES;
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < chunks) load_w(s, s);
  minillm::pdl_entry();  // x is the previous kernel's output
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < chunks) load_x(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  float acc[2][MT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  for (int c = 0; c < chunks; ++c) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    __syncthreads();  // stage c has landed for every thread; stage c - 1 is free again
    const int nc = c + STAGES - 1;
    if (nc < chunks) {
      load_w(nc, nc % STAGES);
      load_x(nc, nc % STAGES);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    const bf16* ws = sm + (c % STAGES) * Ly::STAGE;
    const bf16* xs = ws + Ly::W_ELEMS;
#pragma unroll
    for (int kk = 0; kk < (GW_NO_MMA ? 0 : GW_BK / 16); ++kk) {
      unsigned a[2][4];  // weight rows 32 wn + 16 i + (0..15), k 16 kk + (0..15)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        ldmatrix_x4(a[i], smem_u32(ws + (32 * wn + 16 * i + (lane & 15)) * GW_LDS + kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int j = 0; j < MT; j += 2) {  // x tiles j, j + 1: b0/b1 of each
        unsigned b[4];
        ldmatrix_x4(b, smem_u32(xs + (8 * MT * wm + 8 * j + (lane >> 4) * 8 + (lane & 7)) * GW_LDS +
                                kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          minillm::mma_bf16_16816(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[0], b[1]);
          minillm::mma_bf16_16816(acc[i][j + 1], a[i][0], a[i][1], a[i][2], a[i][3], b[2], b[3]);
        }
      }
    }
  }

  // ---- the partial tile [64 weight rows][x rows] in shared memory, then the K-slices summed
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();  // every warp is done with the stages
  float* red = reinterpret_cast<float*>(gw_smem);
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < MT; ++j) {  // C: weight rows g, g + 8; x rows 2 t4, 2 t4 + 1
      const int n = 32 * wn + 16 * i + g, m = 8 * MT * wm + 8 * j + 2 * t4;
      *reinterpret_cast<float2*>(red + n * Ly::RLD + m) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(red + (n + 8) * Ly::RLD + m) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
  if (S > 1) cluster_sync(); else __syncthreads();
  constexpr int RPR = GW_BN / S;  // the weight rows (output columns) this CTA finishes
  const unsigned red_addr = smem_u32(red);
  for (int e = tid; e < RPR * M; e += GW_THREADS) {
    const int jn = e % RPR, m = e / RPR;
    const int n = rank * RPR + jn;
    float s = 0.f;
    if (S > 1) {
      float v[S];  // every rank's partial requested before any is added (in rank order)
#pragma unroll
      for (int q = 0; q < S; ++q) v[q] = ld_cluster_f32(red_addr + (unsigned)(n * Ly::RLD + m) * 4u, (unsigned)q);
#pragma unroll
      for (int q = 0; q < S; ++q) s += v[q];
    } else {
      s = red[n * Ly::RLD + m];
    }
    if (bias) s += minillm::to_f(bias[n0 + n]);
    out[(i64)m * ldo + n0 + n] = __float2bfloat16_rn(s);
  }
  if (S > 1) cluster_sync();  // no CTA leaves while another may still read its tile
}

}  // namespace

// gemm_wx_m<MT>_s<S>: grid (N / 64, S), GW_THREADS threads, GwLayout<MT>::BYTES of dynamic shared
// memory; x rows up to 32 * MT; clusters of S CTAs along y (one tile's K-slices).
#define MINILLM_GEMM_WX(MT, S, CLUSTER)                                                           \
  extern "C" __global__ void __launch_bounds__(GW_THREADS) CLUSTER gemm_wx_m##MT##_s##S(          \
      const bf16* x, i64 ldx, const bf16* w, const bf16* bias, bf16* out, i64 ldo, int M, int N,  \
      int K) {                                                                                     \
    gemm_wx_impl<MT, S>(x, ldx, w, bias, out, ldo, M, N, K);                                       \
  }
#define MINILLM_GEMM_WX_S(MT)                             \
  MINILLM_GEMM_WX(MT, 1, )                                \
  MINILLM_GEMM_WX(MT, 2, __cluster_dims__(1, 2, 1))       \
  MINILLM_GEMM_WX(MT, 4, __cluster_dims__(1, 4, 1))       \
  MINILLM_GEMM_WX(MT, 8, __cluster_dims__(1, 8, 1))

MINILLM_GEMM_WX_S(2)
MINILLM_GEMM_WX_S(4)
MINILLM_GEMM_WX_S(6)
MINILLM_GEMM_WX_S(8)
