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
// One row takes gemv1_silu_mul_split by default instead: a CTA's gate rows and up rows on different
// warps, so a warp holds half the sums (fewer registers, more CTAs an SM); see that kernel.
//
// Tried and measured slower on the H200 (scripts/gemv_bench.py, docs/BENCHMARKS.md): fusing the
// preceding rms_norm into this kernel, either summing squares in the main loop (+25-35% on the 8B
// shapes) or staging the normalised rows in shared memory (+1-4 us a call, as much as the
// rms_norm launch it saves); folding both of a layer's norms into one-row products (session 19:
// o and down adding into the residual and writing per-CTA partial sums of squares, qkv and
// gate_up normalising each x chunk as they load it, two launches a layer fewer): batch-1 graphs
// 0.6B +7%, 8B +3% to +13% (part129/part130); holding the first weight chunks in registers
// across the PDL wait (+45% on gate_up: register pressure); and (session 20, part136, c76d122)
// copying each lane's first four chunks a row into shared memory with cp.async before the wait
// instead (16 / 32 KB a CTA): batch-1 graphs 0.6B +0.5%, 8B +0.3%.
#include "common.cuh"

// The many-row kernels (gemv_*) take 1 to GEMV_MAX_M rows (the host sends 2 to 4: above that the
// skinny GEMM or cuBLAS win, cuda_ops.py). Their register count is set by the largest case: with
// 8 row cases gemv_silu_mul_bf16 took 143 registers (3 CTAs an SM) and gemv_bf16 96; with 4, 128
// (4 CTAs an SM) and 80 (ptxas, session 20). Decode steps' graphs on the H200, GEMV_MAX_M 4 against
// 8 (session 21, part145): 0.6B batch 4 (gate_up on gemv_silu_mul) 1.230 -> 1.105 ms (-10%),
// batches 2-3 and 8B batch 2 within 0.5%. With it, 2-row products moved from the skinny GEMM to
// gemv_bf16 (cuda_ops.py's _GEMV_PREFERRED_M, part146).
#ifndef GEMV_MAX_M
#define GEMV_MAX_M 4
#endif
#define GEMV_NR 2
#define GEMV_WARPS 4
// Matrices of at most this many bytes (the gate_up matrix counted whole) are asked into L2 before
// the PDL wait, each warp its own rows (weights never depend on the previous kernel): the CTAs
// placed in the previous kernel's tail start streaming during it. Batch-1 graphs, session 17, one
// machine each: 0.6B (matrices of 4-12.6 MB) 0.934 -> 0.918 ms (part117), 0.916 -> 0.903 (part118,
// this bound); 8B (33.5-201 MB) with every matrix's first 64 MB asked for 4.457 -> 5.125 ms, the
// first 8 MB 4.51 ms (part117: there the requests only add traffic beside loads already
// streaming), so 8B's products are left alone; 40 MB (the 8B o product, 33.5 MB, asked for during
// the attention's tail) +1.5%, 64 MB (and qkv) +3.6% (session 26, part173: the attention's tail
// slowed 2.5 us a layer, more than the o product gained). 0: never. Leaving the 0.6B's narrowing
// products (o, down) out, whose requests overlap the attention's merge and gate_up's end, made its
// batch-1 graph slower, +1.4%, and prefetching gate_up alone +1.2% (session 30, part193).
// Chunks a lane has in flight a row in the one-row loop: GEMV1_U, and GEMV1_DEEP_U in gemv1_deep_bf16.
// Session 31's part195 A/B'd knobs that set them apart for the fused gated product and for every
// plain one: the gated one at 2 (72 registers) 8B +0.6%, 0.6B -0.7%; the plain ones at 8, 8B -0.4%
// (o and down faster, qkv, past one wave, slower: gemv1_deep's routing keeps the gain). 6 / 8 for
// all of them together measured no gain (session 22, part151). The knobs were removed.
#define GEMV1_U 4
#ifndef GEMV1_DEEP_U  // gemv1_deep_bf16's chunks in flight (124 registers at 8: 4 CTAs an SM, ptxas)
#define GEMV1_DEEP_U 8
#endif
#ifndef GEMV_NORM_PRELOAD  // the folded-norm products' first weights into registers before the wait (below)
#define GEMV_NORM_PRELOAD 1
#endif
// CTAs an SM the folded gate_up's registers must allow (__launch_bounds__). With GEMV_NORM_PRELOAD=2, 6
// (80 registers, 56 bytes spilled: one wave for the 0.6B's 768 CTAs) made the 0.6B batch-1 graph 5.3%
// slower, 8B unchanged (session 43, part254). At GEMV_NORM_PRELOAD=1 (74 registers), 8 takes it to 64
// without spills (ptxas, session 49): six of its CTAs then fit beside one of the o product's (108
// registers), where five do now, and the 0.6B timelines have its CTAs' waits returning over 1.8 us (a
// sixth an SM placed only as the o product leaves). Not yet measured (part279)
#ifndef GEMV_GATED_NORM_MIN_BLOCKS
#define GEMV_GATED_NORM_MIN_BLOCKS 1
#endif
// CTAs an SM the folded plain product's registers must allow (gemv1_norm*: the 0.6B's qkv); 0: no bound
// (106-109 registers, 4 CTAs an SM). 5 takes it to 96 registers without spills (ptxas, session 49), so
// that four of its CTAs fit beside one of the down product's (108 registers; three do now, and the 0.6B
// timelines have its CTAs' waits returning over 1.6 us) and one of the attention's (80) beside its four
// before it completes. Not yet measured (part279)
#ifndef GEMV_NORM_MIN_BLOCKS
#define GEMV_NORM_MIN_BLOCKS 0
#endif
#if GEMV_NORM_MIN_BLOCKS
#define GEMV_NORM_BOUNDS __launch_bounds__(32 * GEMV_WARPS, GEMV_NORM_MIN_BLOCKS)
#else
#define GEMV_NORM_BOUNDS __launch_bounds__(32 * GEMV_WARPS)
#endif
#ifndef GEMV_STAGED  // 0: one row takes the unrolled loop too (A/B runs: h200_report.sh part132)
#define GEMV_STAGED 1
#endif
#ifndef MERGE_STAGGER  // gemv1_merge_*: each CTA copies the partials from its own offset
#define MERGE_STAGGER 1
#endif
#ifndef GEMV_PREFETCH_MAX
#define GEMV_PREFETCH_MAX (16 << 20)
#endif

namespace {

// The gated kernels' activation of one column: its gate and up sums rounded to bf16 first, then
// elementwise.cu's silu_mul arithmetic, so a fused product gives what the unfused path (a product
// into the bf16 gate_up, then silu_mul) gives for the same sums. Decode steps and speculative
// verification of the same row take different kernels by row count, and greedy speculation must
// not see them differ by more than the sums' order: on the unrounded sums the GPU engine's
// lossless tests (a 6-row decode on gemm_skinny_silu_mul, 30-row verification on cuBLAS +
// silu_mul) flipped tokens (session 22, part154).
__device__ __forceinline__ float gated_act(float gate, float up) {
  const float g = minillm::to_f(minillm::from_f<bf16>(gate)), u = minillm::to_f(minillm::from_f<bf16>(up));
  return g / (1.0f + expf(-g)) * u;
}

// Before the PDL wait: a small matrix's rows of this warp asked into L2 (GEMV_PREFETCH_MAX).
// gemv_prefetch_rows: rows n0.. of w (N rows) when the whole matrix is at most that many bytes.
__device__ __forceinline__ void gemv_prefetch_rows(const bf16* w, int n0, int N, int K, i64 matrix_bytes) {
  if (matrix_bytes <= (i64)GEMV_PREFETCH_MAX && (threadIdx.x & 31) == 0 && n0 < N)
    minillm::prefetch_l2(w + (i64)n0 * K, (unsigned)(min(GEMV_NR, N - n0) * K * 2));  // contiguous
}
template <bool GATED, int WARPS>
__device__ __forceinline__ void gemv_prefetch(const bf16* w, int N, int K) {
  const int n0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * GEMV_NR;
  const i64 bytes = (i64)N * K * (GATED ? 4 : 2);
  gemv_prefetch_rows(w, n0, N, K, bytes);
  if (GATED) gemv_prefetch_rows(w + (i64)N * K, n0, N, K, bytes);
}

// ---- the RMSNorm before a one-row product, folded into it (NORM > 0) ----------------------------
// A batch-1 layer runs rms_norm_vec (one CTA) between the o / down product and the qkv / gate_up
// product. Folded, every CTA of the consumer computes the norm of the row itself right after its
// PDL wait: h = x + res rounded to bf16 (x: the previous product's output, res: the residual
// stream; CTA 0 writes h to res_out, a buffer other than res, since the other CTAs still read res),
// then h * rsqrt(mean(h^2) + eps) * w rounded to bf16, into shared memory, and the product's loop
// reads x from there. The arithmetic is rms_norm_vec's to the bit: its threads' chunk order and its
// block_sum's reduction tree are replayed on this CTA's 128 threads (NORM = chunks a thread: 1 for
// K <= 1024, rms_norm_vec's 128 threads; 2 / 4 for K <= 2048 / 4096, its 256 threads with 1 / 2
// chunks each, thread t's work done by thread t % 128). A layer saves two launches and their
// hand-offs; each CTA reads the row and residual (2-8 KB, from L2) and sums it once.
// Why: scripts/handoff_bench.py (session 34) timed chains with the batch-1 layer's grids on the
// H200: seven kernels a layer 25.4 us (0.6B) / 106.9 us (8B), five whose products normalise their
// x themselves 19.1 / 101.3. Session 19's fold (the producers writing per-CTA partial sums of
// squares, the consumers summing them) measured slower; this one reads no partials. Measured
// (part206, batch-1 graphs): 0.6B -1.2%, 8B +1.1%, far from the chains' promise: a CTA's first
// weight loads wait for the prologue, and the 8B gate_up's 3,072 CTAs each read a 16 KB row and
// residual. So the host folds rows of at most MINILLM_FOLD_NORMS_MAX_K (1,024) values.
// Session 48 (part277, docs/results/h200_session48_ab.txt) took the block sum out of the prologue: each
// CTA wrote h * w to shared memory and each thread's sum of squares beside it, one barrier, the loop,
// and the outputs scaled by rsqrt(mean(h^2) + eps) at the end (one rounding moved; as close to the
// float64 oracle as the unfolded path in its GPU test). Batch-1 graphs, alternated twice: 0.6B 0.7875 ->
// 0.7992 ms (+1.49%); 8B folded with it 4.2186 -> 4.3621 (+3.40%, against the unfolded default).
// Slower on both, so the prologue's sum is not what costs the fold; removed.
#ifndef NORM_ROW_L2
#define NORM_ROW_L2 1
#endif
struct NormArgs {
  const bf16* res;  // added to x first; the rounded sum is what is normalised (null: x alone)
  const bf16* w;    // the norm's weight [K]
  bf16* res_out;    // CTA 0 writes the rounded sum here (null: nowhere); never res
  float eps;
};

// The norm weight's chunks this thread will scale (they never depend on another kernel: loaded
// before the PDL wait). Chunk k of thread r is rms_norm_vec's chunk c of its thread t, where
// v = k / VC, c = k % VC, t = r + 128 v: index t + c * VT.
template <int NORM>
__device__ __forceinline__ void norm_chunks(const bf16* p, int chunks, uint4 (&out)[NORM]) {
  constexpr int VPR = NORM == 1 ? 1 : 2, VC = NORM / VPR, VT = 128 * VPR;
#pragma unroll
  for (int k = 0; k < NORM; ++k) {
    const int i = threadIdx.x + 128 * (k / VC) + (k % VC) * VT;
    out[k] = i < chunks ? __ldg(reinterpret_cast<const uint4*>(p) + i) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// After the PDL wait: the normalised row into xs (K bf16, 16-byte aligned), as rms_norm_vec
// computes it; ends with a CTA barrier. Every thread of the CTA (128) takes part.
template <int NORM>
__device__ __forceinline__ void norm_row(const bf16* __restrict__ x, const NormArgs& na, int K,
                                         const uint4 (&wv)[NORM], bf16* xs) {
  constexpr int VPR = NORM == 1 ? 1 : 2, VC = NORM / VPR, VT = 128 * VPR;
  __shared__ float scratch[VT / 32];
  const int chunks = K / 8, lane = threadIdx.x & 31;
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const uint4* rr = reinterpret_cast<const uint4*>(na.res);
  uint4 hv[NORM], rv[NORM];
#pragma unroll
  for (int k = 0; k < NORM; ++k) {  // every load issued before any is used
    const int i = threadIdx.x + 128 * (k / VC) + (k % VC) * VT;
#if NORM_ROW_L2
    // load_act (common.cuh): x, a const __restrict__ pointer, was read through the read-only path
    // (ld.global.nc in the PTX), and greedy runs on graphs did not repeat (part246-part248);
    // NORM_ROW_L2=0 keeps that path, for the control run
    hv[k] = i < chunks ? minillm::load_act(xr + i) : make_uint4(0u, 0u, 0u, 0u);
    if (rr) rv[k] = i < chunks ? minillm::load_act(rr + i) : make_uint4(0u, 0u, 0u, 0u);
#else
    hv[k] = i < chunks ? xr[i] : make_uint4(0u, 0u, 0u, 0u);
    if (rr) rv[k] = i < chunks ? rr[i] : make_uint4(0u, 0u, 0u, 0u);
#endif
  }
  float ss[VPR];
#pragma unroll
  for (int v = 0; v < VPR; ++v) {
    ss[v] = 0.f;
#pragma unroll
    for (int c = 0; c < VC; ++c) {
      const int k = v * VC + c, i = threadIdx.x + 128 * v + c * VT;
      if (i < chunks) {
        float h[8];
        minillm::unpack_bf16x8(hv[k], h);
        if (rr) {  // residual <- x + residual, rounded to bf16: that rounded sum is normalised
          float r[8];
          minillm::unpack_bf16x8(rv[k], r);
#pragma unroll
          for (int j = 0; j < 8; ++j) r[j] += h[j];
          hv[k] = minillm::pack_bf16x8(r);
          if (na.res_out && blockIdx.x == 0) reinterpret_cast<uint4*>(na.res_out)[i] = hv[k];
          minillm::unpack_bf16x8(hv[k], h);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) ss[v] += h[j] * h[j];
      }
    }
  }
  // rms_norm_vec's block_sum over VT threads: warp w's sum of thread t's values goes to scratch[t / 32]
#pragma unroll
  for (int v = 0; v < VPR; ++v) {
    const float s = minillm::warp_sum(ss[v]);
    if (lane == 0) scratch[(threadIdx.x >> 5) + 4 * v] = s;
  }
  __syncthreads();
  const float total = minillm::warp_sum(lane < VT / 32 ? scratch[lane] : 0.f);
  const float rstd = rsqrtf(total / (float)K + na.eps);
  uint4* xo = reinterpret_cast<uint4*>(xs);
#pragma unroll
  for (int k = 0; k < NORM; ++k) {
    const int i = threadIdx.x + 128 * (k / VC) + (k % VC) * VT;
    if (i < chunks) {
      float h[8], wf[8], o[8];
      minillm::unpack_bf16x8(hv[k], h);
      minillm::unpack_bf16x8(wv[k], wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = h[j] * rstd * wf[j];
      xo[i] = minillm::pack_bf16x8(o);
    }
  }
  __syncthreads();
}

// GATED: out[m, n] = silu(x[m] . w[n]) * (x[m] . w[N + n]) for n < N (w has 2N rows, no bias).
// WARPS: warps a CTA (GEMV_NR columns each). WAITED: the caller has prefetched and passed the PDL
// wait (gemv1_merge_*, whose x is its own shared memory). U1: chunks a lane has in flight a row in
// the one-row loop (0: GEMV1_U). SPLIT (GATED): the CTA's first half of warps streams the gate rows
// and its second half the matching up rows, GEMV_NR rows a warp as the plain product does; the up
// sums reach the gate warps through shared memory (gemv1_silu_mul_split, gemv_silu_mul_split).
// NORM > 0: x is normalised first, in shared memory (norm_row above; na: its inputs).
template <typename TO, int M, bool GATED, int WARPS = GEMV_WARPS, bool WAITED = false, int U1 = 0,
          bool SPLIT = false, int NORM = 0, bool PRE = false>
__device__ __forceinline__ void gemv_impl(const bf16* __restrict__ x, i64 ldx,
                                          const bf16* __restrict__ w, const bf16* __restrict__ bias,
                                          TO* __restrict__ out, i64 ldo, int N, int K,
                                          const NormArgs& na = NormArgs{}) {
  static_assert(!SPLIT || (GATED && WARPS % 2 == 0), "SPLIT: a gated product, warps in pairs");
  static_assert(NORM == 0 || (M == 1 && WARPS * 32 == 128 && !WAITED), "NORM: one row, 128 threads");
  __shared__ __align__(16) bf16 xs_norm[NORM ? NORM * 1024 : 8];  // K <= NORM * 1024 (the host)
  uint4 norm_w[NORM ? NORM : 1];
  if constexpr (NORM > 0) norm_chunks<NORM>(na.w, K / 8, norm_w);
  constexpr int R = GATED && !SPLIT ? 2 * GEMV_NR : GEMV_NR;  // weight rows a warp streams at once
  constexpr int COL_WARPS = SPLIT ? WARPS / 2 : WARPS;  // warps a CTA whose columns differ
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;  // warp in the CTA
  const bool up_warp = SPLIT && wib >= COL_WARPS;
  const int n0 = (blockIdx.x * COL_WARPS + wib % COL_WARPS) * GEMV_NR;
  const i64 row0 = up_warp ? N : 0;  // SPLIT: the up warps' rows start at N
  const int chunks = K / 8;  // 16-byte chunks per row (the host checks K % 8 == 0)
  auto load_w = [&](int c, uint4* wv) {  // issue every row's load before using any
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int col = min(n0 + r % GEMV_NR, N - 1);
      const i64 n = SPLIT ? row0 + col : r < GEMV_NR ? col : N + col;  // rows past GEMV_NR: the up half
      wv[r] = __ldg(reinterpret_cast<const uint4*>(w + (i64)n * K) + c);
    }
  };
  constexpr int U = U1 ? U1 : GEMV1_U;
  // PRELOAD (the folded-norm products; gemv1_pre_bf16 by PRE): the first U chunks a lane of the weights, issued into
  // registers before the PDL wait (weights never depend on the previous kernel), so that after the
  // wait only x's load and the norm stand between the wait and the first FMA. Without it the weights
  // are asked for only after norm_row's barrier (session 42: with x read after the wait, as it must
  // be, the folded products cost the 0.6B step ~7%; part250).
  // GEMV_NORM_PRELOAD 1: the plain (qkv) product only; 2: the gated (gate_up) one too, whose 106
  // registers (72 without) leave 4 CTAs an SM, fewer than the 0.6B gate_up's 768 CTAs need for one wave.
  constexpr bool PRELOAD = GEMV_STAGED && M == 1 && !WAITED &&
                           (NORM > 0 ? GEMV_NORM_PRELOAD == 2 || (GEMV_NORM_PRELOAD == 1 && !GATED) : PRE && !GATED);
  uint4 wpre[PRELOAD ? U : 1][R];
  if constexpr (PRELOAD) {
#pragma unroll
    for (int u = 0; u < U; ++u) load_w(min(lane + 32 * u, chunks - 1), wpre[u]);
  }
  if constexpr (!WAITED) {
    if constexpr (SPLIT)
      gemv_prefetch_rows(w + row0 * K, n0, N, K, (i64)N * K * 4);
    else
      gemv_prefetch<GATED, WARPS>(w, N, K);
    minillm::pdl_entry();  // before the early return: see cuda/common.cuh
  }
  if constexpr (NORM > 0) norm_row<NORM>(x, na, K, norm_w, xs_norm);  // every thread, before any returns
  // SPLIT keeps every warp to the CTA barrier below: past N they reload row N - 1, unused
  if (!SPLIT && n0 >= N) return;
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

  // x is written by the previous kernel: read only after pdl_entry (cuda/common.cuh), and with a
  // plain load, not __ldg (ld.global.nc asks for data read-only for the kernel's lifetime, which
  // under PDL overlaps the writer's). Before session 19 nvcc read it through the read-only path
  // anyway, for the const __restrict__ pointer. With the staged loop, __ldg measured 0.6B -0.4%,
  // 8B -0.1% (session 20, part136): not worth leaving the contract for.
  auto load_x = [&](int c, int m) {
    if constexpr (NORM > 0) return reinterpret_cast<const uint4*>(xs_norm)[c];
    else return reinterpret_cast<const uint4*>(x + (i64)m * ldx)[c];
  };
  // chunk c's products, in c order; xv: x's chunks if loaded already, else loaded here row by row
  auto fma_chunk = [&](int c, const uint4* wv, const uint4* xv) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      minillm::unpack_bf16x8(xv ? xv[m] : load_x(c, m), xf);
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
  };
  if (GEMV_STAGED && M == 1) {
    // One row: 4 chunks a lane in flight, every load of the group issued into registers before
    // any is used. Written as one unrolled loop (load, then multiply, chunk by chunk), ptxas
    // interleaved the loads with the FMAs, so the first FMA's wait held back the next chunks'
    // loads and about one chunk was in flight (session 19, from the SASS). Chunks past the end
    // reload the last one, unused. The sums keep their order: the results are the same bits.
    // Measured on the H200: batch-1 graphs 0.6B -9.0%, 8B -4.7% against GEMV_STAGED=0 (part132),
    // but that build's x loads had left the read-only path too; the session's whole change
    // (this, gemv1_*, unpack_bf16x8 by value) against its start: 0.6B -1.8%, 8B -2.2% (part135).
    // More chunks in flight gained nothing (session 22, part151, batch-1 graphs): 6 / 8 chunks took
    // 0.6B 0.880-0.884 -> 0.888-0.892 / 0.898-0.906 ms and 8B 4.353-4.358 -> 4.407-4.417 /
    // 4.352-4.355, so 8B's slower qkv / o / down are not short of bytes in flight. Splitting a
    // column's K range over 2-3 warps (to fill the GPU with 0.6B's 128-CTA o and down) did not
    // either: 0.6B 0.885 -> 0.887-0.890 (part152); both were removed.
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
      uint4 wv[U][R], xv[U][M];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = min(c0 + 32 * u, chunks - 1);
        if (PRELOAD && c0 == lane) {
#pragma unroll
          for (int r = 0; r < R; ++r) wv[u][r] = wpre[u][r];
        } else {
          load_w(c, wv[u]);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) xv[u][m] = load_x(c, m);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + 32 * u < chunks) fma_chunk(c0 + 32 * u, wv[u], xv[u]);
    }
  } else {
    // Unrolled so the loads of several chunks are in flight per lane: one chunk's R 16-byte
    // loads were too few to hide HBM latency on the 8B model's matrices (~2.5 of ~4.2 TB/s).
#pragma unroll 4
    for (int c = lane; c < chunks; c += 32) {
      uint4 wv[R];
      load_w(c, wv);
      fma_chunk(c, wv, nullptr);
    }
  }
  minillm::pdl_release();
  if constexpr (SPLIT) {
    __shared__ float up_sums[COL_WARPS][GEMV_NR][M];
#pragma unroll
    for (int r = 0; r < GEMV_NR; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float s = minillm::warp_sum(acc[r][m]);
        if (up_warp && lane == 0) up_sums[wib % COL_WARPS][r][m] = s;
        acc[r][m] = s;
      }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < GEMV_NR; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (!up_warp && lane == 0 && n0 + r < N)
          out[(i64)m * ldo + n0 + r] = minillm::from_f<TO>(gated_act(acc[r][m], up_sums[wib][r][m]));
  } else {
#pragma unroll
    for (int r = 0; r < GEMV_NR; ++r) {
      const int n = n0 + r;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float s = minillm::warp_sum(acc[r][m]);
        const float up = GATED ? minillm::warp_sum(acc[r + GEMV_NR][m]) : 0.f;
        if (lane == 0 && n < N) {
          const float y = GATED ? gated_act(s, up) : s + (bias ? minillm::to_f(bias[n]) : 0.f);
          out[(i64)m * ldo + n] = minillm::from_f<TO>(y);
        }
      }
    }
  }
}

}  // namespace

// grid (ceil(N / (GEMV_NR * GEMV_WARPS))), block 32 * GEMV_WARPS; M selects the instantiation
// (M above GEMV_MAX_M is never sent: the host's _GEMV_MAX_M).
template <typename TO, bool GATED>
__device__ __forceinline__ void gemv_rows(const bf16* x, i64 ldx, const bf16* w, const bf16* bias,
                                          TO* out, i64 ldo, int M, int N, int K) {
  switch (M) {
    case 1: gemv_impl<TO, 1, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
    case 2: gemv_impl<TO, 2, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
    case 3: gemv_impl<TO, 3, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
#if GEMV_MAX_M > 4
    case 4: gemv_impl<TO, 4, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
    case 5: gemv_impl<TO, 5, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
    case 6: gemv_impl<TO, 6, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
    case 7: gemv_impl<TO, 7, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
    default: gemv_impl<TO, 8, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
#else
    default: gemv_impl<TO, 4, GATED>(x, ldx, w, bias, out, ldo, N, K); break;
#endif
  }
}

#define MINILLM_GEMV(SUFFIX, TO)                                                                 \
  extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_##SUFFIX(                 \
      const bf16* x, i64 ldx, const bf16* w, const bf16* bias, TO* out, i64 ldo, int M, int N, \
      int K) {                                                                                 \
    gemv_rows<TO, false>(x, ldx, w, bias, out, ldo, M, N, K);                                  \
  }

MINILLM_GEMV(bf16, bf16)
MINILLM_GEMV(f32, float)

// One row (a batch-1 decode step): its own kernels, so the staged loop's registers do not raise
// the many-row cases' and theirs do not lower this one's occupancy.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv1_bf16(const bf16* x, i64 ldx, const bf16* w, const bf16* bias, bf16* out, i64 ldo, int N, int K) {
  gemv_impl<bf16, 1, false>(x, ldx, w, bias, out, ldo, N, K);
}
// gemv1_bf16 with its first weights loaded into registers before the PDL wait (gemv_impl's
// PRELOAD): 108 registers, 4 CTAs an SM, so the host sends it only grids of one such wave
// (cuda_ops.py one_row_product_kernel). Session 42, part252, batch-1 graphs, every gemv1_bf16
// launch on it: 0.6B (o, down: 128 CTAs) -0.9%; 8B (qkv: 768 CTAs) +0.8%.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv1_pre_bf16(const bf16* x, i64 ldx, const bf16* w, const bf16* bias, bf16* out, i64 ldo, int N, int K) {
  gemv_impl<bf16, 1, false, GEMV_WARPS, false, 0, false, 0, true>(x, ldx, w, bias, out, ldo, N, K);
}
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv1_f32(const bf16* x, i64 ldx, const bf16* w, const bf16* bias, float* out, i64 ldo, int N, int K) {
  gemv_impl<float, 1, false>(x, ldx, w, bias, out, ldo, N, K);
}

// out [M, F] = silu(x @ w[:F].T) * (x @ w[F:].T) for the [2F, K] gate_up matrix w; grid
// (ceil(F / (GEMV_NR * GEMV_WARPS))).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv_silu_mul_bf16(const bf16* x, i64 ldx, const bf16* w, bf16* out, i64 ldo, int M, int F,
                       int K) {
  gemv_rows<bf16, true>(x, ldx, w, nullptr, out, ldo, M, F, K);
}
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv1_silu_mul_bf16(const bf16* x, i64 ldx, const bf16* w, bf16* out, i64 ldo, int F, int K) {
  gemv_impl<bf16, 1, true>(x, ldx, w, nullptr, out, ldo, F, K);
}
// The same product with the gate and up rows on different warps of a CTA (SPLIT above): each warp
// holds GEMV_NR rows' sums, not 2 x GEMV_NR, so it has gemv1_bf16's registers and occupancy (the
// fused kernel's 118 registers allow 4 CTAs an SM; session 30's stream_bench.py streamed the 8B
// gate_up at 4.02 TB/s through it and 4.31 as one plain product, part194). Grid
// (ceil(F / (GEMV_NR * GEMV_WARPS / 2))): twice gemv1_silu_mul_bf16's. The same sums in the same
// order: the same bits. The host's default for one row (MINILLM_GATED_SPLIT_MAX_M >= 1): batch-1
// graphs 8B -1.2%, 0.6B -1.0% against the fused kernel (session 31, part196), though chained alone in
// stream_bench.py it streamed the 8B gate_up no faster (4.07 against 4.14 TB/s).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv1_silu_mul_split_bf16(const bf16* x, i64 ldx, const bf16* w, bf16* out, i64 ldo, int F, int K) {
  gemv_impl<bf16, 1, true, GEMV_WARPS, false, 0, true>(x, ldx, w, nullptr, out, ldo, F, K);
}
// The 2-4-row gated product split the same way (gemv_silu_mul_bf16 holds 2 x GEMV_NR rows' sums of
// every row of x: 128 registers); the host sends it rows up to MINILLM_GATED_SPLIT_MAX_M (default
// 2: batch-2 graphs 0.6B -2.4%, 8B -1.5%, session 32, part199). Grid (ceil(F / (GEMV_NR * GEMV_WARPS / 2))).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv_silu_mul_split_bf16(const bf16* x, i64 ldx, const bf16* w, bf16* out, i64 ldo, int M, int F, int K) {
  switch (M) {
    case 2: gemv_impl<bf16, 2, true, GEMV_WARPS, false, 0, true>(x, ldx, w, nullptr, out, ldo, F, K); break;
    case 3: gemv_impl<bf16, 3, true, GEMV_WARPS, false, 0, true>(x, ldx, w, nullptr, out, ldo, F, K); break;
    default: gemv_impl<bf16, 4, true, GEMV_WARPS, false, 0, true>(x, ldx, w, nullptr, out, ldo, F, K); break;
  }
}
// The one-row qkv / gate_up products with the RMSNorm before them folded in (norm_row above;
// NumPy twins: NumpyBackend.rms_norm_matmul / rms_norm_matmul_silu_mul). NORM: 1, 2 or 4 chunks a
// thread (K <= 1024 / 2048 / 4096). x: the previous product's output row; res / res_out / nw / eps:
// NormArgs. Grids as gemv1_bf16's / gemv1_silu_mul_split_bf16's.
#define MINILLM_GEMV1_NORM(NORM)                                                                     \
  extern "C" __global__ void GEMV_NORM_BOUNDS gemv1_norm##NORM##_bf16(                                \
      const bf16* x, const bf16* res, const bf16* nw, float eps, bf16* res_out, const bf16* w,      \
      const bf16* bias, bf16* out, int N, int K) {                                                  \
    gemv_impl<bf16, 1, false, GEMV_WARPS, false, 0, false, NORM>(x, 0, w, bias, out, 0, N, K,       \
                                                                 NormArgs{res, nw, res_out, eps});  \
  }                                                                                                 \
  extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, GEMV_GATED_NORM_MIN_BLOCKS)                \
      gemv1_silu_mul_split_norm##NORM##_bf16(                                                       \
      const bf16* x, const bf16* res, const bf16* nw, float eps, bf16* res_out, const bf16* w,      \
      bf16* out, int F, int K) {                                                                    \
    gemv_impl<bf16, 1, true, GEMV_WARPS, false, 0, true, NORM>(x, 0, w, nullptr, out, 0, F, K,      \
                                                               NormArgs{res, nw, res_out, eps});    \
  }
MINILLM_GEMV1_NORM(1)
MINILLM_GEMV1_NORM(2)
MINILLM_GEMV1_NORM(4)

// ---- gemv1_stage: a one-row product whose CTAs hold their whole share of the weights in shared memory ----
// A 0.6B batch-1 layer streams ~33.5 MB (8.2 us at 4.1 TB/s) but takes ~24 us: five dependent kernels,
// each waiting for its x before it can start the loads whose HBM latency it then waits on again.
// Weights never depend on the previous kernel. Here each CTA takes rpc consecutive output rows
// (rpc = ceil(N / SMs): one CTA an SM), copies all of their weights into shared memory by TMA bulk
// copies issued before the PDL wait, and releases its dependents right away (GEMV_STAGE_EARLY), so the
// next products become resident and start their own copies while this one still waits. After the wait
// only x's hand-off remains: x (normalised first for NORM, norm_row above) into shared memory, then
// the dot products out of shared memory.
// Measured (H100s, docs/BENCHMARKS.md "Session 55"): scripts/preload_bench.py's synthetic chain with the
// layer's bytes, 33.5 -> 21.4 us a layer (part297). In the 0.6B step (batch-1 graphs alternated twice):
// every fitting product staged +2.7%, as the copies of all four products landed on the decode attention's
// merge (1.3 -> 5.0 us, part298); the release after the loop instead +7%; every product but the o
// product after the attention (the host's default, MINILLM_GEMV1_STAGE=2) -2.4% (part299, part300); the o
// product staged too but copying after its wait, the same (part300, removed).
// Tried and removed (session 58, part311, H200): the staged products also asking later products' weights
// into L2 before their wait (MINILLM_L2_AHEAD; the code is in f6dcbb2): 0.6B batch-1 graph 0.708 ms ->
// 0.712 (qkv asks the o product's), 0.745 (qkv asks o's and gate_up's), 0.730 (down asks the next layer's).
// Tried and removed (session 58, part312 / part313, H100s; the code is in 0f3de2a): one kernel a layer fewer,
// the gate_up and down products as one (gemv1_stage_mlp_*, MINILLM_STAGE_MLP: both shares staged, a grid
// barrier between them): batch-1 graph 0.811 -> 0.887 ms (+9.3%; the next decode attention could not be
// placed until it left, 10 us from qkv to attention against 4.6), and with the down share copied late over
// the gate_up share's place (~104 KB a CTA) 0.810 -> 0.898 (+10.8%: the attention to o 10 us against 6.8).
// The o product (gemv1_pre_bf16) releasing its dependents right after its wait, so the staged gate_up's
// copies start while it streams: +1.7% (GEMV1_PRE_RELEASE_EARLY, part312). The o product staged too, releasing
// its dependents after its loop (MINILLM_GEMV1_STAGE=3, gemv1_stage_late_bf16; the code is in b8bd639):
// 0.809 -> 0.815 ms (+0.7%, part315, H100).
// Tried and removed (session 72, part363 / part364, H100s; the code is in 7078d10): one kernel a layer fewer
// without a grid barrier, the MLP split by its F activations (gemv1_mlp_split_*, MINILLM_MLP_SPLIT): each CTA
// staged its gate_up share, held its down columns in registers from before its wait, and added its share
// of the down sums into a ring row that the next qkv product read (fp32 atomics, or fixed-point int64 for
// order-free bits). Batch-1 graph 0.798 -> 0.884 ms (+10.8%, fp32) / 0.993 (+24.5%, int64); with the adds
// compiled out still +9.7%: the loss is the kernel itself, not its adds. Session 73 (part366 / part367, H100s;
// the code is in 1dda803): with the down weight transposed at load, its shares loaded into registers +4.9%,
// copied into shared memory behind the gate_up share +0.5%. So the [K, F] register loads (16 bytes of each of
// 1,024 rows, 8 rows apart across a warp) were the loss, and at parity one hand-off fewer does not pay.
// Tried and removed (session 57): gemv1_ring_*, the products too large to hold (the 8B's) streamed through
// two shared-memory slots a CTA by a producer warp (MINILLM_GEMV1_RING): the 8B batch-1 graph 5.53 ->
// 9.02 ms (1) / 8.77 ms (2) on an H100. The code is in a1a08df.
// The sums are gemv1's: lane l takes chunks l, l + 32, ... of a row in order, 8 fmaf a chunk, then
// warp_sum; so the same bits as gemv1_bf16 / gemv1_norm{C}_bf16 / gemv1_silu_mul_split_norm{C}_bf16.
// Dynamic shared memory: (GATED ? 2 : 1) x rpc x K bf16 of weights, then K bf16 of x (the host's
// gemv1_stage_plan). GATED: w is [2N, K], gate rows then up rows; out[n] = silu(gate) * up.
#ifndef GEMV_STAGE_EARLY
#define GEMV_STAGE_EARLY 1
#endif
#define GEMV_STAGE_ROWS 4      // rows a warp sums at once (independent FMA chains)
#define GEMV_STAGE_COPY 32768u  // bytes a bulk copy
namespace {
template <bool GATED, int NORM>
__device__ __forceinline__ void gemv1_stage_impl(const bf16* x, const NormArgs& na, const bf16* __restrict__ w,
                                                 const bf16* __restrict__ bias, bf16* __restrict__ out, int N,
                                                 int K, int rpc) {
  extern __shared__ __align__(128) unsigned char stage_smem[];
  __shared__ __align__(8) unsigned long long bar;
  constexpr int HALVES = GATED ? 2 : 1;
  const int lo = blockIdx.x * rpc, rows = max(0, min(N, lo + rpc) - lo);
  const int chunks = K / 8, lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const uint4* ws = reinterpret_cast<const uint4*>(stage_smem);  // [HALVES][rpc][chunks]
  bf16* xs = reinterpret_cast<bf16*>(stage_smem) + (i64)HALVES * rpc * K;
  const unsigned b = minillm::smem_addr(&bar);
  uint4 norm_w[NORM ? NORM : 1];
  if constexpr (NORM > 0) norm_chunks<NORM>(na.w, chunks, norm_w);
  if (threadIdx.x == 0) {
    minillm::mbar_init(b, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const unsigned bytes = (unsigned)rows * (unsigned)K * 2u;
    minillm::mbar_expect_tx(b, bytes * HALVES);
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
      const unsigned char* src = reinterpret_cast<const unsigned char*>(w + ((i64)h * N + lo) * K);
      const unsigned dst = minillm::smem_addr(stage_smem) + (unsigned)h * (unsigned)rpc * (unsigned)K * 2u;
      for (unsigned o = 0; o < bytes; o += GEMV_STAGE_COPY)
        minillm::bulk_copy(dst + o, src + o, min(GEMV_STAGE_COPY, bytes - o), b);
    }
  }
  __syncthreads();  // the barrier initialised before anyone waits on it
#if GEMV_STAGE_EARLY
  minillm::pdl_release();
#endif
  minillm::pdl_entry();
  if constexpr (NORM > 0) {
    norm_row<NORM>(x, na, K, norm_w, xs);  // every thread; ends with a CTA barrier
  } else {
    for (int i = threadIdx.x; i < chunks; i += blockDim.x)
      reinterpret_cast<uint4*>(xs)[i] = minillm::load_act(reinterpret_cast<const uint4*>(x) + i);
    __syncthreads();
  }
  if (rows > 0) {
    minillm::mbar_wait(b, 0);
    const uint4* xv = reinterpret_cast<const uint4*>(xs);
    constexpr int R = GEMV_STAGE_ROWS;
    for (int r0 = wib * R; r0 < rows; r0 += (blockDim.x >> 5) * R) {
      float acc[HALVES][R];
#pragma unroll
      for (int h = 0; h < HALVES; ++h)
#pragma unroll
        for (int j = 0; j < R; ++j) acc[h][j] = 0.f;
      for (int c = lane; c < chunks; c += 32) {
        float xf[8];
        minillm::unpack_bf16x8(xv[c], xf);
#pragma unroll
        for (int h = 0; h < HALVES; ++h)
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const int r = min(r0 + j, rows - 1);  // rows past the share repeat its last, unused
            float wf[8];
            minillm::unpack_bf16x8(ws[((i64)h * rpc + r) * chunks + c], wf);
            float s = acc[h][j];
#pragma unroll
            for (int i = 0; i < 8; ++i) s = fmaf(xf[i], wf[i], s);
            acc[h][j] = s;
          }
      }
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const float s = minillm::warp_sum(acc[0][j]);
        const float up = GATED ? minillm::warp_sum(acc[HALVES - 1][j]) : 0.f;
        const int n = lo + r0 + j;
        if (lane == 0 && r0 + j < rows) {
          const float y = GATED ? gated_act(s, up) : s + (bias ? minillm::to_f(bias[n]) : 0.f);
          out[n] = minillm::from_f<bf16>(y);
        }
      }
    }
  }
#if !GEMV_STAGE_EARLY
  minillm::pdl_release();
#endif
}
}  // namespace

// grid ceil(N / rpc), 128 threads, the dynamic shared memory above (cuda_ops.py's gemv1_stage_plan)
extern "C" __global__ void __launch_bounds__(128)
    gemv1_stage_bf16(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int N, int K, int rpc) {
  gemv1_stage_impl<false, 0>(x, NormArgs{}, w, bias, out, N, K, rpc);
}
extern "C" __global__ void __launch_bounds__(128)
    gemv1_stage_silu_mul_bf16(const bf16* x, const bf16* w, bf16* out, int F, int K, int rpc) {
  gemv1_stage_impl<true, 0>(x, NormArgs{}, w, nullptr, out, F, K, rpc);
}
#define MINILLM_GEMV1_STAGE_NORM(NORM)                                                               \
  extern "C" __global__ void __launch_bounds__(128) gemv1_stage_norm##NORM##_bf16(                    \
      const bf16* x, const bf16* res, const bf16* nw, float eps, bf16* res_out, const bf16* w,      \
      const bf16* bias, bf16* out, int N, int K, int rpc) {                                         \
    gemv1_stage_impl<false, NORM>(x, NormArgs{res, nw, res_out, eps}, w, bias, out, N, K, rpc);     \
  }                                                                                                 \
  extern "C" __global__ void __launch_bounds__(128) gemv1_stage_silu_mul_norm##NORM##_bf16(           \
      const bf16* x, const bf16* res, const bf16* nw, float eps, bf16* res_out, const bf16* w,      \
      bf16* out, int F, int K, int rpc) {                                                           \
    gemv1_stage_impl<true, NORM>(x, NormArgs{res, nw, res_out, eps}, w, nullptr, out, F, K, rpc);   \
  }
MINILLM_GEMV1_STAGE_NORM(1)
MINILLM_GEMV1_STAGE_NORM(2)
MINILLM_GEMV1_STAGE_NORM(4)

// gemv1_bf16 with GEMV1_DEEP_U chunks a lane in flight, for long rows whose grid fits one wave at
// its occupancy (the host's rule, cuda_ops.py's one_row_product_kernel): session 31's part195 ran
// every one-row product with 8 and the 8B down streamed 3.96 -> 4.10 TB/s, o 5.71 -> 5.79, but
// qkv (768 CTAs: more than one wave of 4 CTAs an SM) 4.49 -> 4.13.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv1_deep_bf16(const bf16* x, i64 ldx, const bf16* w, const bf16* bias, bf16* out, i64 ldo, int N, int K) {
  gemv_impl<bf16, 1, false, GEMV_WARPS, false, GEMV1_DEEP_U>(x, ldx, w, bias, out, ldo, N, K);
}

// ---- gemv1_merge: a batch-1 decode step's o product, merging the attention's splits itself ------
// out [1, N] = attention row @ w.T (+ bias), K = H * D. Given defer_max, the decode kernel
// (paged_decode_rope_*) leaves a row of at most defer_max active splits unmerged: every split writes
// its unnormalised partial and (m, l) pair and exits, with no fence, no split counter and no last CTA
// reading the others' partials back from L2 while this product waits (that tail was the batch-1
// step's largest hand-off: 4.1 us (0.6B) / 5.6 us (8B) a layer, part165; 2.7 / 4.1 us of it the merge,
// part166). Here, after the PDL wait, the partials are copied into shared memory (cp.async, 16 bytes
// a copy, all in flight while warps weigh the splits), merged as the decode kernel merges
// (common.cuh's split_weights / merge_add / merge_result: the same bits) into the row x, kept in
// shared memory, and gemv1's loop runs over it. CTA 0 writes x to x_out (the attention's output,
// as the unmerged path leaves it). A row of more splits (a long context: every CTA would read them
// all) was merged by the decode kernel as before; then x is read from x_out. Both kernels count
// the splits from the row's length alike (decode_split_part), so they agree on which it was.
// CL > 1: clusters of CL CTAs (grid a multiple of CL); each merges H / CL heads and takes the rest
// of x from its peers' shared memory (distributed shared memory), so the partials are read from
// L2 by CL times fewer CTAs.
// Measured slower, so opt-in (MINILLM_O_MERGE; session 29, H200, batch-1 graphs at 512 keys,
// docs/results/h200_session29_ab.txt): every CTA merging, 0.6B +25-27%, 8B +3.7-4.4%; clusters of 8,
// 0.6B +3.4-6.5%, 8B +1.6-1.8% (part186, part187). The hand-off into the o product fell as meant
// (0.6B 3.6 -> 1.3 us a layer, 8B 4.8 -> 1.4; part172 -> part186), but its work grew more: 0.6B
// 2.3 -> 13.1 us (every CTA) / 5.7 us (clusters), 8B 9.2 -> 20.5 us: 128 CTAs each reading the
// row's 64 KB (0.6B) of partials from L2, or a cluster barrier and DSMEM reads after a smaller
// copy, cost more than the one merging CTA a KV head did. Staggering each CTA's copies and batching the (m, l) loads
// changed nothing (part187). Not tried: the partials multicast to a cluster by TMA
// (cp.async.bulk ... multicast::cluster: one L2 read a cluster).
// Grid >= ceil(N / (GEMV_NR * WARPS)) (the host picks WARPS for one wave), WARPS * 32 threads,
// dynamic shared memory: x (K bf16), weights [H][64], denominators [H] (padded to 4), then room for
// the partials of (heads a CTA merges) x defer_max x D floats.
template <int WARPS, int CL>
__device__ __forceinline__ void gemv1_merge_impl(const float* __restrict__ part_o,
                                                 const float* __restrict__ part_ml,
                                                 const int* __restrict__ seq_lens,
                                                 const int* __restrict__ query_start, int B, int n_splits,
                                                 int min_part, int defer_max, int H, int D,
                                                 const bf16* __restrict__ w, const bf16* __restrict__ bias,
                                                 bf16* __restrict__ out, int N, int K, bf16* __restrict__ x_out) {
  extern __shared__ __align__(16) unsigned char merge_smem[];
  bf16* s_x = reinterpret_cast<bf16*>(merge_smem);        // [K], the row (K % 8 == 0)
  float* s_w = reinterpret_cast<float*>(s_x + K);         // [H][64] split weights
  float* s_den = s_w + H * 64;                            // [H]
  float* s_part = s_den + (H + 3) / 4 * 4;                // this CTA's heads' partials
  constexpr int NT = 32 * WARPS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  gemv_prefetch<false, WARPS>(w, N, K);
  minillm::pdl_entry();
  // row 0's splits (one new token: its keys are its sequence's L), counted as the decode kernel does
  int n_active = 0;  // 0: no sequence owns row 0 (x is zeros)
  if (query_start[B] > 0) {
    const int L = seq_lens[0], part = minillm::decode_split_part(L, n_splits, min_part);
    n_active = n_splits > 1 ? max(1, (L + part - 1) / part) : 1;
  }
  if (n_active > defer_max) {  // merged by the decode kernel, into x_out
    for (int c = tid; c < K / 8; c += NT) reinterpret_cast<uint4*>(s_x)[c] = reinterpret_cast<const uint4*>(x_out)[c];
    __syncthreads();
    gemv_impl<bf16, 1, false, WARPS, true>(s_x, 0, w, bias, out, 0, N, K);
    return;
  }
  MINILLM_CHECK(n_active <= 64 && D % 4 == 0);
  const int rank = CL > 1 ? (int)minillm::cluster_rank() : 0;
  const int hpc = (H + CL - 1) / CL, h0 = min(H, rank * hpc), h1 = min(H, h0 + hpc);  // heads this CTA merges
  const int per_head = n_active * D, q4 = per_head / 4;  // floats of one head's partials, contiguous
  // Every CTA (or every cluster's same rank) reads the same lines: each starts at its own offset
  // (2 KB steps) so they do not all ask the same L2 slice at once (MERGE_STAGGER=0: all at 0).
  const int total = (h1 - h0) * q4;
  const int rot = MERGE_STAGGER && total > 0 ? (int)(((unsigned)blockIdx.x / CL * 128u) % (unsigned)total) : 0;
  for (int j = tid; j < total; j += NT) {
    const int i = j + rot < total ? j + rot : j + rot - total;
    const int hl = i / q4, r = i - hl * q4;
    minillm::cp_async_16(minillm::smem_u32(s_part + hl * per_head + 4 * r),
                         part_o + (i64)(h0 + hl) * n_splits * D + 4 * r, 16);
  }
  asm volatile("cp.async.commit_group;\n" ::);
  // warp per head, while the copies fly; a warp's (m, l) loads for up to 4 heads issued at once
  for (int hb = h0 + warp; hb < h1; hb += 4 * WARPS) {
    minillm::SplitPairs pairs[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int h = hb + u * WARPS;
      if (h < h1)
        pairs[u] = minillm::split_pairs(reinterpret_cast<const float2*>(part_ml) + (i64)h * n_splits, n_active, lane);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int h = hb + u * WARPS;
      if (h < h1) {
        const float den = minillm::split_weights(pairs[u], n_active, lane, s_w + h * 64);
        if (lane == 0) s_den[h] = den;
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  for (int e = h0 * D + tid; e < h1 * D; e += NT) {
    const int h = e / D, d = e - h * D;
    const float* x = s_part + (h - h0) * per_head + d;
    const float* ws = s_w + h * 64;
    float o = 0.f;
    for (int sp = 0; sp < n_active; ++sp) o = minillm::merge_add(o, ws[sp], x[sp * D]);
    s_x[e] = minillm::merge_result<bf16>(o, s_den[h]);
  }
  if constexpr (CL > 1) {
    minillm::cluster_sync();  // every CTA's heads merged
    const int c_per = hpc * D / 8;  // 16-byte chunks of a CTA's heads (D % 8 == 0)
    for (int c = tid; c < K / 8; c += NT) {
      const int owner = c / c_per;
      if (owner != rank) {
        const uint4 v = minillm::ld_cluster_u4(minillm::smem_u32(reinterpret_cast<uint4*>(s_x) + c), owner);
        reinterpret_cast<uint4*>(s_x)[c] = v;
      }
    }
    // no CTA leaves (its shared memory with it) while a peer may still read it
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  }
  __syncthreads();
  if (blockIdx.x == 0 && x_out != nullptr)
    for (int c = tid; c < K / 8; c += NT) reinterpret_cast<uint4*>(x_out)[c] = reinterpret_cast<const uint4*>(s_x)[c];
  gemv_impl<bf16, 1, false, WARPS, true>(s_x, 0, w, bias, out, 0, N, K);
  if constexpr (CL > 1) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

#define MINILLM_GEMV1_MERGE(NAME, WARPS, CL, ATTR)                                                      \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) ATTR NAME(                                 \
      const float* part_o, const float* part_ml, const int* seq_lens, const int* query_start, int B,  \
      int n_splits, int min_part, int defer_max, int H, int D, const bf16* w, const bf16* bias,       \
      bf16* out, int N, int K, bf16* x_out) {                                                         \
    gemv1_merge_impl<WARPS, CL>(part_o, part_ml, seq_lens, query_start, B, n_splits, min_part,        \
                                defer_max, H, D, w, bias, out, N, K, x_out);                          \
  }
MINILLM_GEMV1_MERGE(gemv1_merge_bf16_w4, 4, 1, )
MINILLM_GEMV1_MERGE(gemv1_merge_bf16_w8, 8, 1, )
MINILLM_GEMV1_MERGE(gemv1_merge_bf16_w16, 16, 1, )
MINILLM_GEMV1_MERGE(gemv1_merge_cl8_bf16_w4, 4, 8, __cluster_dims__(8, 1, 1))
MINILLM_GEMV1_MERGE(gemv1_merge_cl8_bf16_w8, 8, 8, __cluster_dims__(8, 1, 1))
MINILLM_GEMV1_MERGE(gemv1_merge_cl8_bf16_w16, 16, 8, __cluster_dims__(8, 1, 1))

// ---- gemm_skinny: 2-16 rows of x on tensor cores ---------------------------------------------
// out = x @ w.T (+ bias) for M in [2, 16], K % 64 == 0 (NumPy twin: NumpyBackend.matmul; the host's
// small_product_kernel routes). From 2 rows on the GEMV above loses ground (each weight chunk is
// multiplied by every row on CUDA cores; at 3-4 rows it is compute-bound), and cuBLAS pads such
// skinny products to a full tile.
// Here one warp computes 16 output columns x 8 rows of x per mma.sync.m16n8k16 (bf16 in, fp32
// sums): A is 16 weight rows (read once, straight from HBM, 16-byte loads), B is x^T.
//
// The k order inside a 64-wide block is permuted so every lane loads whole 16-byte chunks: lane
// (g, t) = (lane / 4, lane % 4) reads k offsets [16t, 16t + 16) of weight rows g and g + 8 and of
// x row g, and feeds the 4 mma steps of the block pairs (4j, 4j + 1) and (4j + 2, 4j + 3) of
// those 16 values. The mma's logical k (2t + {0, 1} and 2t + 8 + {0, 1} in A and B alike) then
// meets the same physical k in both operands, so the dot products are exact permutations of the
// plain ones. The 8 warps of a CTA take interleaved 64-wide k blocks of the same 16 columns and
// are summed through shared memory at the end.
//
// Its unrolled loop issues each k block's loads only after the previous block's MMAs (ptxas's
// schedule; the SASS shows it), so about one block a warp is in flight, as gemv1 had. Software-
// pipelined (the next block's loads before this block's MMAs; session 19, part132, 09bd3fd) it
// took 102 registers instead of 70, 2 CTAs an SM instead of 3: the 8B DFlash round at c = 1 (9-row
// qkv and o) 6.267 -> 6.191 ms, but batch-4 steps slower (0.6B 1.271 -> 1.282 ms, 8B 4.635 ->
// 4.797). Not kept; a kernel of its own for 9-16 rows (two tiles) would keep the first without
// the second (not measured yet). Streaming the weights through a per-warp ring of three
// shared-memory slots with cp.async instead (no registers held in flight, the first two blocks
// issued before the PDL wait; the same bits) was far slower (session 20, part137, c76d122): the
// round 6.32 -> 7.68 ms, batch 4 0.6B 1.26 -> 1.59, 8B 4.81 -> 8.94 (48 KB of shared memory a
// CTA). The likely cause, from its SASS, not tested on the GPU: cp.async.cg compiles to
// LDGSTS.E.BYPASS, so a lane's lo and hi 16-byte copies, the two halves of one 32-byte sector,
// went to L2 as two requests, where this loop's LDG.E.128.CONSTANT serves the hi half from L1.
// A ring to try again: cp.async.ca, or one lane copying a whole sector.
//
// 9-16 rows (two tiles) take kernels of their own, gemm_skinny2_*, with the software-pipelined
// loop (SKINNY2_PIPELINED: 102 registers, gated 106, 2 CTAs an SM; ptxas 13.0). gemm_skinny_*
// keep the two-tile case though the host no longer sends it: without it they took 46 registers
// (gated 64) instead of 70 (88), and batch-4 steps were slower (0.6B +4.6%, 8B +3.2%; session 26,
// part174, H200, against the session's start; the cause was not looked into).
// Measured (part174): the pipelined two-tile kernels took the c = 1 DFlash round (9-row qkv and o)
// -0.7% against the old loop's +0.1%, 16-row steps 0.6B -3.8%, 8B +0.6%; with the 8B gate_up and
// down at 9-16 rows sent here too (cuda_ops.py's _SKINNY_TWO_TILE_MAX_W 32 -> 128 M weights,
// instead of cuBLAS + silu_mul and cuBLAS's split-K down) the round -3.0%.
// Under ncu (session 45, part266: one layer's 9-row products of that round) they stream 2.5 (qkv),
// 3.8 (gate_up) and 3.3 TB/s (down), stalled on their loads, 16 warps an SM (2 CTAs at 102
// registers); the 8B qkv's 384 CTAs are 1.45 waves of that (DRAM 62% busy), hence gemm_skinny2w4_*.
// Measured and dropped there (the round's graph, alternated twice): each 16-byte load asking whole
// sectors (a lane's k values [8t, 8t + 8) and [32 + 8t, 32 + 8t + 8): the L1 hit rate 64 -> 29%, two
// L2 requests a line where there was one) +6.1%, batch-4 steps +2.7%; __launch_bounds__ for 3 CTAs
// an SM (80 registers, spilling) +2.3% with only the plain kernels bounded, +19% with the gated too.
// Tried and removed (session 57): gemm_skinny2_ring_*, the 9-16-row products' weights streamed through 4
// shared-memory slots by a ninth warp's TMA copies (MINILLM_SKINNY2_RING): the c = 1 round 5.94 -> 9.74 ms
// (+64%), 8B batch-16 steps +63% (session 47, part272), and racecheck reported a shared-memory hazard in
// gemm_skinny2_ring_bf16. The code is in a1a08df.
#define SKINNY_WARPS 8
#define SKINNY_KB 64
#ifndef SKINNY2_PIPELINED  // 0: gemm_skinny2_* / gemm_skinny4_* run gemm_skinny_*'s loop (A/B runs)
#define SKINNY2_PIPELINED 1
#endif
// SKINNY2_PREWAIT (session 74): the pipelined kernels (gemm_skinny2_*, gemm_skinny2w4_*, gemm_skinny4_*)
// ask for each warp's first block of weight rows before the PDL wait, x after it; until then they waited
// first. 4 of a lane's loads (16 KB a CTA of 8 warps) land during the wait. On one H100, alternated twice
// (part369-part371; SKINNY2_PREWAIT=0 builds main's earlier SASS byte for byte): the 8B rejected DFlash
// k = 8 round's graphs at c = 1 -1.5% (its 164 products of 9 and 16 rows), 0.6B batch-12 / 16 steps -3.9% /
// -2.6%, 8B batch-12 / 16 -1.7% / -1.4%; rounds at c = 4 / 16 (cuBLAS's rows) unchanged. 0 restores the old
// order, for A/B runs. The unpipelined gemm_skinny_* (2-8 rows) still wait first: the first block's rows
// loaded before the wait and selected in the loop's first pass took them from 70 to 80 registers with
// spills (gated 88 -> 124; ptxas, session 74, not run), and a lambda-refactored loop changed their SASS.
#ifndef SKINNY2_PREWAIT
#define SKINNY2_PREWAIT 1
#endif

namespace {

// One 8-row tile's share of a 64-wide k block: 4 MMAs. A registers: (row g, k pair), (row g + 8,
// k pair), (row g, k pair + 8), (row g + 8, k pair + 8); B: (k pair, x row g), (k pair + 8, x row
// g). a0 / a8: weight rows g / g + 8, lo / hi: the two 16-byte halves of the lane's 16 k values.
// (unused in a SKINNY2_PIPELINED=0 build)
[[maybe_unused]] __device__ __forceinline__ void skinny_mma_block(float* c, uint4 a0_lo, uint4 a0_hi, uint4 a8_lo,
                                                                  uint4 a8_hi, uint4 x_lo, uint4 x_hi) {
  minillm::mma_bf16_16816(c, a0_lo.x, a8_lo.x, a0_lo.y, a8_lo.y, x_lo.x, x_lo.y);
  minillm::mma_bf16_16816(c, a0_lo.z, a8_lo.z, a0_lo.w, a8_lo.w, x_lo.z, x_lo.w);
  minillm::mma_bf16_16816(c, a0_hi.x, a8_hi.x, a0_hi.y, a8_hi.y, x_hi.x, x_hi.y);
  minillm::mma_bf16_16816(c, a0_hi.z, a8_hi.z, a0_hi.w, a8_hi.w, x_hi.z, x_hi.w);
}

// TILES: groups of 8 rows of x (1 for M <= 8, 2 for M <= 16, 4 for M <= 32). GATED: out[m, n] =
// silu(x[m] . w[n]) * (x[m] . w[N + n]) for n < N (w is the [2N, K] gate_up matrix, no bias): each
// warp streams the 16 gate rows and the 16 up rows of its columns and multiplies both by the same x
// fragments.
// PIPE: the software-pipelined loop (below).
template <typename TO, int TILES, bool GATED, bool PIPE = false, int WARPS = SKINNY_WARPS>
__device__ __forceinline__ void gemm_skinny_impl(const bf16* __restrict__ x, i64 ldx,
                                                 const bf16* __restrict__ w,
                                                 const bf16* __restrict__ bias,
                                                 TO* __restrict__ out, i64 ldo, int M, int N, int K) {
  constexpr int NW = GATED ? 2 : 1;  // weight tiles a warp: gate and up, or the product's own
  if constexpr (!(PIPE && SKINNY2_PREWAIT)) minillm::pdl_entry();
  __shared__ float red[WARPS - 1][NW * TILES * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  // rows past N read row N - 1 (valid memory); their sums are never written
  const bf16* w0 = w + (i64)min(n0 + g, N - 1) * K + 16 * t;
  const bf16* w8 = w + (i64)min(n0 + g + 8, N - 1) * K + 16 * t;
  const i64 up = (i64)N * K;  // GATED: the up rows, N rows past the gate rows
  const bf16* xr[TILES];
  bool live[TILES];
#pragma unroll
  for (int i = 0; i < TILES; ++i) {
    live[i] = i * 8 + g < M;
    xr[i] = x + (i64)(live[i] ? i * 8 + g : 0) * ldx + 16 * t;
  }
  float c[TILES][4], cu[GATED ? TILES : 1][4];  // cu: GATED's up sums
#pragma unroll
  for (int i = 0; i < TILES; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
  if constexpr (GATED) {
#pragma unroll
    for (int i = 0; i < TILES; ++i) cu[i][0] = cu[i][1] = cu[i][2] = cu[i][3] = 0.f;
  }

  const int blocks = K / SKINNY_KB;
  if constexpr (PIPE) {
    // Software-pipelined: each k block's loads go out before the previous block's MMAs, so two
    // blocks a warp are in flight (the loop below issues a block's loads only after the previous
    // block's MMAs, which wait for their own loads: about one block in flight, from the SASS,
    // session 19). The warp's last block is loaded once more at the end, unused; the MMAs keep
    // their order, so the sums are the same bits.
    struct Block {  // weight rows g, g + 8 (GATED: and their up rows), each tile's x row g
      uint4 w0_lo, w0_hi, w8_lo, w8_hi, u0_lo, u0_hi, u8_lo, u8_hi, x_lo[TILES], x_hi[TILES];
    };
    auto load_rows = [&](int kb, Block& b) {  // the product's weight rows (GATED: the gate rows)
      const int k = kb * SKINNY_KB;
      b.w0_lo = __ldg(reinterpret_cast<const uint4*>(w0 + k));
      b.w0_hi = __ldg(reinterpret_cast<const uint4*>(w0 + k + 8));
      b.w8_lo = __ldg(reinterpret_cast<const uint4*>(w8 + k));
      b.w8_hi = __ldg(reinterpret_cast<const uint4*>(w8 + k + 8));
    };
    auto load_up = [&](int kb, Block& b) {  // GATED: the up rows
      if constexpr (GATED) {
        const int k = kb * SKINNY_KB;
        b.u0_lo = __ldg(reinterpret_cast<const uint4*>(w0 + up + k));
        b.u0_hi = __ldg(reinterpret_cast<const uint4*>(w0 + up + k + 8));
        b.u8_lo = __ldg(reinterpret_cast<const uint4*>(w8 + up + k));
        b.u8_hi = __ldg(reinterpret_cast<const uint4*>(w8 + up + k + 8));
      }
    };
    auto load_x = [&](int kb, Block& b) {
      const int k = kb * SKINNY_KB;
#pragma unroll
      for (int i = 0; i < TILES; ++i) {
        // Not the read-only path: nvcc made plain loads of x ld.global.nc (load_act). Unconditional:
        // a dead row's xr is row 0 (valid memory) and its sums land in columns of C never written,
        // while a load_act under `if (live[i])` kept a branch a tile in the loop (an asm volatile load
        // is not speculated; BSSY 7 -> 12 in gemm_skinny2_bf16's SASS): the c = 1 DFlash round's graph
        // was 17.0% (L2 loads) / 11.5% (L1) longer than session 40's tree's on one machine, 8.5% / 2.1%
        // without the branch (session 44, part261 / part262)
        b.x_lo[i] = minillm::load_act(reinterpret_cast<const uint4*>(xr[i] + k));
        b.x_hi[i] = minillm::load_act(reinterpret_cast<const uint4*>(xr[i] + k + 8));
      }
    };
    auto load_block = [&](int kb, Block& b) {
      load_rows(kb, b);
      load_up(kb, b);
      load_x(kb, b);
    };
    // SKINNY2_PREWAIT: the warp's first block of weight rows is asked for before the PDL wait
    // (weights never depend on the previous kernel); x, and GATED's up rows, after it. Inside a
    // branch: without one ptxas placed the wait (ACQBULK) above the loads; the up rows before the
    // wait took the gated kernel from 102 to 136 registers (one CTA an SM).
    Block cur;
    if constexpr (SKINNY2_PREWAIT) {
      if (warp < blocks) load_rows(warp, cur);
      minillm::pdl_entry();
    }
    if (warp < blocks) {
      const int last = blocks - 1 - (blocks - 1 - warp) % WARPS;  // this warp's last block
      if constexpr (SKINNY2_PREWAIT) {
        load_up(warp, cur);
        load_x(warp, cur);
      } else {
        load_block(warp, cur);
      }
      for (int kb = warp; kb < blocks; kb += WARPS) {
        Block nxt;
        load_block(min(kb + WARPS, last), nxt);
#pragma unroll
        for (int i = 0; i < TILES; ++i) {
          skinny_mma_block(c[i], cur.w0_lo, cur.w0_hi, cur.w8_lo, cur.w8_hi, cur.x_lo[i], cur.x_hi[i]);
          if constexpr (GATED)
            skinny_mma_block(cu[i], cur.u0_lo, cur.u0_hi, cur.u8_lo, cur.u8_hi, cur.x_lo[i], cur.x_hi[i]);
        }
        cur = nxt;
      }
    }
  } else {
    // The loop as written before session 26, its MMAs spelled out: through skinny_mma_block ptxas
    // scheduled gemm_skinny_* differently (SASS md5), and these kernels were measured as they are.
#pragma unroll 2
    for (int kb = warp; kb < blocks; kb += WARPS) {
      const int k = kb * SKINNY_KB;
      const uint4 w0_lo = __ldg(reinterpret_cast<const uint4*>(w0 + k));
      const uint4 w0_hi = __ldg(reinterpret_cast<const uint4*>(w0 + k + 8));
      const uint4 w8_lo = __ldg(reinterpret_cast<const uint4*>(w8 + k));
      const uint4 w8_hi = __ldg(reinterpret_cast<const uint4*>(w8 + k + 8));
      uint4 u0_lo, u0_hi, u8_lo, u8_hi;  // GATED: the same k range of the up rows
      if constexpr (GATED) {
        u0_lo = __ldg(reinterpret_cast<const uint4*>(w0 + up + k));
        u0_hi = __ldg(reinterpret_cast<const uint4*>(w0 + up + k + 8));
        u8_lo = __ldg(reinterpret_cast<const uint4*>(w8 + up + k));
        u8_hi = __ldg(reinterpret_cast<const uint4*>(w8 + up + k + 8));
      }
#pragma unroll
      for (int i = 0; i < TILES; ++i) {
        uint4 x_lo = make_uint4(0u, 0u, 0u, 0u), x_hi = x_lo;
        if (live[i]) {  // plain loads: under PDL the kernel writing x may still run (common.cuh)
          x_lo = reinterpret_cast<const uint4*>(xr[i] + k)[0];
          x_hi = reinterpret_cast<const uint4*>(xr[i] + k + 8)[0];
        }
        // A registers: (row g, k pair), (row g + 8, k pair), (row g, k pair + 8), (row g + 8, k
        // pair + 8); B: (k pair, x row g), (k pair + 8, x row g). w0/w8: weight rows g / g + 8
        minillm::mma_bf16_16816(c[i], w0_lo.x, w8_lo.x, w0_lo.y, w8_lo.y, x_lo.x, x_lo.y);
        minillm::mma_bf16_16816(c[i], w0_lo.z, w8_lo.z, w0_lo.w, w8_lo.w, x_lo.z, x_lo.w);
        minillm::mma_bf16_16816(c[i], w0_hi.x, w8_hi.x, w0_hi.y, w8_hi.y, x_hi.x, x_hi.y);
        minillm::mma_bf16_16816(c[i], w0_hi.z, w8_hi.z, w0_hi.w, w8_hi.w, x_hi.z, x_hi.w);
        if constexpr (GATED) {
          minillm::mma_bf16_16816(cu[i], u0_lo.x, u8_lo.x, u0_lo.y, u8_lo.y, x_lo.x, x_lo.y);
          minillm::mma_bf16_16816(cu[i], u0_lo.z, u8_lo.z, u0_lo.w, u8_lo.w, x_lo.z, x_lo.w);
          minillm::mma_bf16_16816(cu[i], u0_hi.x, u8_hi.x, u0_hi.y, u8_hi.y, x_hi.x, x_hi.y);
          minillm::mma_bf16_16816(cu[i], u0_hi.z, u8_hi.z, u0_hi.w, u8_hi.w, x_hi.z, x_hi.w);
        }
      }
    }
  }
  minillm::pdl_release();
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < TILES; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        red[warp - 1][i * 4 + e][lane] = c[i][e];
        if constexpr (GATED) red[warp - 1][(TILES + i) * 4 + e][lane] = cu[i][e];
      }
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // C: rows (out columns) g, g + 8; cols (x rows) 2t, 2t + 1
      float s = c[i][e], su = 0.f;
#pragma unroll
      for (int r = 0; r < WARPS - 1; ++r) s += red[r][i * 4 + e][lane];
      if constexpr (GATED) {
        su = cu[i][e];
#pragma unroll
        for (int r = 0; r < WARPS - 1; ++r) su += red[r][(TILES + i) * 4 + e][lane];
      }
      const int m = i * 8 + 2 * t + (e & 1);
      const int n = n0 + g + (e >= 2 ? 8 : 0);
      if (m < M && n < N) {
        const float y = GATED ? gated_act(s, su) : s + (bias ? minillm::to_f(bias[n]) : 0.f);
        out[(i64)m * ldo + n] = minillm::from_f<TO>(y);
      }
    }
}

// TILES 0: gemm_skinny_* (2-16 rows; the host sends them 2-8); 2: gemm_skinny2_* (9-16 rows); 4:
// gemm_skinny4_* (17-32 rows), both pipelined unless SKINNY2_PIPELINED=0.
template <typename TO, bool GATED, int TILES, int WARPS = SKINNY_WARPS>
__device__ __forceinline__ void gemm_skinny_rows(const bf16* x, i64 ldx, const bf16* w, const bf16* bias,
                                                 TO* out, i64 ldo, int M, int N, int K) {
  constexpr bool PIPE = SKINNY2_PIPELINED;
  if constexpr (TILES > 0) gemm_skinny_impl<TO, TILES, GATED, PIPE, WARPS>(x, ldx, w, bias, out, ldo, M, N, K);
  else if (M <= 8) gemm_skinny_impl<TO, 1, GATED>(x, ldx, w, bias, out, ldo, M, N, K);
  else gemm_skinny_impl<TO, 2, GATED>(x, ldx, w, bias, out, ldo, M, N, K);
}

}  // namespace

// The skinny kernels' entry points: a plain product (TO out, bias) or a gated one (bf16 out), on
// THREADS threads, calling the loop given (a template id, so after the other arguments).
#define MINILLM_SKINNY_KERNEL(NAME, TO, THREADS, ...)                                                \
  extern "C" __global__ void __launch_bounds__(THREADS)                                              \
      NAME(const bf16* x, i64 ldx, const bf16* w, const bf16* bias, TO* out, i64 ldo, int M, int N, \
           int K) {                                                                                  \
    __VA_ARGS__(x, ldx, w, bias, out, ldo, M, N, K);                                                 \
  }
#define MINILLM_SKINNY_GATED_KERNEL(NAME, THREADS, ...)                                              \
  extern "C" __global__ void __launch_bounds__(THREADS)                                              \
      NAME(const bf16* x, i64 ldx, const bf16* w, bf16* out, i64 ldo, int M, int F, int K) {        \
    __VA_ARGS__(x, ldx, w, nullptr, out, ldo, M, F, K);                                              \
  }
// grid (ceil(N / 16)), block 32 * SKINNY_WARPS.
#define MINILLM_SKINNY(NAME, TO, TILES) \
  MINILLM_SKINNY_KERNEL(NAME, TO, 32 * SKINNY_WARPS, gemm_skinny_rows<TO, false, TILES>)
#define MINILLM_SKINNY_SILU_MUL(NAME, TILES) \
  MINILLM_SKINNY_GATED_KERNEL(NAME, 32 * SKINNY_WARPS, gemm_skinny_rows<bf16, true, TILES>)

MINILLM_SKINNY(gemm_skinny_bf16, bf16, 0)
MINILLM_SKINNY(gemm_skinny_f32, float, 0)
MINILLM_SKINNY(gemm_skinny2_bf16, bf16, 2)
MINILLM_SKINNY(gemm_skinny2_f32, float, 2)
// 9-16 rows on CTAs of 4 warps (grid ceil(N / 16), block 128; the same kernel, each warp twice the k
// blocks): at 102 registers 4 CTAs an SM fit instead of 2, so a grid of 2-4 CTAs an SM runs in one
// wave where 8 warps a CTA take 1.45 (the 8B qkv's 384 CTAs, DRAM 62% busy under ncu, part266).
// Host: cuda_ops.skinny_product_launch (MINILLM_SKINNY2_W4).
MINILLM_SKINNY_KERNEL(gemm_skinny2w4_bf16, bf16, 128, gemm_skinny_rows<bf16, false, 2, 4>)
MINILLM_SKINNY_KERNEL(gemm_skinny2w4_f32, float, 128, gemm_skinny_rows<float, false, 2, 4>)
// 17-32 rows (four tiles): the host sends 17-20 rows of the large narrowing products (the 8B o and
// down of the c = 2 DFlash round's verification: the round -2.3% with session 28's other change,
// part184a) and, with cuda_ops.py's _SKINNY_MAX_M raised to 32, everything (slower than cuBLAS
// there: the c = 2 round +3.9%, 8B 24-row steps +8.9%; part176).
MINILLM_SKINNY(gemm_skinny4_bf16, bf16, 4)
MINILLM_SKINNY(gemm_skinny4_f32, float, 4)

// out [M, F] = silu(x @ w[:F].T) * (x @ w[F:].T) for 2-16 rows, K % 64 == 0 (NumPy twin: matmul
// then silu_mul; gated_act rounds as it does): gemv_silu_mul's product on the skinny GEMM, so the
// gate_up products the host sends here (3-8 rows, 9-16 of up to 128 M weights: cuda_ops.py's
// gated_product_kernel) skip the silu_mul launch and the [M, 2F] round trip; each x fragment feeds
// twice the weight rows it does in gemm_skinny. Grid (ceil(F / 16)); 9-16 rows: the skinny2 kernel
// (17-32: skinny4, only with _GATED_SKINNY_MAX_M raised: gate_up is never a narrowing product).
MINILLM_SKINNY_SILU_MUL(gemm_skinny_silu_mul_bf16, 0)
MINILLM_SKINNY_SILU_MUL(gemm_skinny2_silu_mul_bf16, 2)
MINILLM_SKINNY_SILU_MUL(gemm_skinny4_silu_mul_bf16, 4)
