// prefill_attention.cu: paged attention for prefill and chunked-prefill steps, and for short runs
// of 2-16 queries (speculative verification, DFlash blocks) over contexts of up to a few thousand
// keys, on tensor cores; another twin of NumpyBackend.paged_attention (bf16 storage only; fp32
// storage and odd shapes use attention.cu's tiled kernel, decode steps and longer-context short
// runs decode_attention.cu).
//
// One CTA owns 64 query rows of one sequence and one KV head: bq = 64 / G consecutive queries x
// the G query heads sharing that KV head, so each K/V tile is read from the paged cache once for
// all of them. Four warps, 16 rows each, FlashAttention-2 style: everything a warp computes stays
// in its registers. Per key tile of 64:
//   S = Q K^T        mma.sync m16n8k16 (bf16 in, fp32 sums); Q's fragments are loaded once, K's
//                    come from shared memory through ldmatrix
//   online softmax   per row in fp32 (base 2) on the S fragments: a row lives in the 4 lanes of a
//                    quad, so its max is two shuffles; the row sums stay per lane until the end
//   O = O * alpha + P V   P re-packed to bf16 straight from S's fragments (the m16n8 accumulator
//                    layout of two key blocks is the m16k16 A layout), V through ldmatrix.trans
// K/V tiles are gathered through the block table with cp.async into two shared-memory stages, the
// next tile's copies in flight while the warps compute on the current one. A warp skips the tiles
// its rows cannot see (causal), and keys past a row's limit are masked to -inf.
// Sequences with fewer than min_nq new queries are skipped (decode_attention.cu takes them in the
// same step), except short runs of 2+ queries with at most short_max_ctx keys of context
// (minillm::short_run_on_tensor_cores: speculative verification blocks). Given short_splits > 0
// the launch takes only those short runs, each one's keys split over up to short_splits CTAs
// (one a 128 keys, by its own length: short_run_splits), so a step of one or a few sequences
// still fills the GPU; each split writes an unnormalised partial and the last to finish (an
// atomic counter it resets) merges them, as decode_attention.cu does. Grid: (an upper bound on
// the step's query tiles, or (tile, split) pairs, KH); where each CTA works comes from device
// buffers, like the other attention kernels; CTA i takes the i-th tile from the end.
//
// (The first version kept S, P and O in shared memory between wmma calls: 36 TFLOP/s on a 4,096 x
// 4,096 causal prefill with the 8B heads; this one 133 TFLOP/s, scripts/prefill_bench.py on the
// H200, docs/BENCHMARKS.md session 8.)
#include "common.cuh"

#define PF_THREADS 128
#define PF_ROWS 64  // query rows per CTA (4 warps x 16)
#define PF_BK 64    // keys per tile
// PF_PDL (the CUDA backend builds it so and launches it with PDL in graphs; MINILLM_PDL_PREFILL=0
// does not): wait for the previous kernel (cuda/common.cuh pdl_entry) and release dependents
// after the key loop, as the decode chain's kernels do. A rejected DFlash k = 8 round's graphs,
// 8B shape, 512 keys: 6.644 -> 6.604 ms at c = 1, 9.195 -> 9.103 at c = 16 (part111).
#ifndef PF_PDL
#define PF_PDL 0
#endif

namespace {

using minillm::cp_async_16;
using minillm::ldmatrix_x4;
using minillm::smem_u32;

// Shared memory, bf16, rows padded by 16 bytes so ldmatrix's 8 row addresses (a 16-byte chunk
// each) fall in different banks: Q [PF_ROWS][LDQ], then 2 stages of K [PF_BK][LDQ] and V [PF_BK][LDQ]
// (cuda_ops.py's _prefill_smem mirrors it).
template <int D>
struct PfLayout {
  static constexpr int LDQ = D + 8;
  static constexpr int STAGE = 2 * PF_BK * LDQ;  // K then V; PF_ROWS * LDQ + 2 * STAGE in all
};

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

#define PF_MAX_SPLITS 8  // most splits of a short run (the host clamps short_splits to it)
#ifndef PF_SHORT_KEYS  // keys a split of a short run aims at (MINILLM_CUDA_DEFINES=PF_SHORT_KEYS=64)
#define PF_SHORT_KEYS 128
#endif

// Keys each split of a short run with L keys of context takes (a multiple of the tile; about L /
// min(max_splits, L / PF_SHORT_KEYS)), and how many splits that makes (none empty). The
// sequence's own length decides, so its rows do not depend on what shares the step.
__device__ __forceinline__ int short_run_part(int L, int max_splits) {
  const int want = max(1, min(max_splits, (L + PF_SHORT_KEYS - 1) / PF_SHORT_KEYS));
  return max(PF_BK, ((L + want - 1) / want + PF_BK - 1) / PF_BK * PF_BK);
}
__device__ __forceinline__ int short_run_splits(int L, int max_splits) {
  const int part = short_run_part(L, max_splits);
  return max(1, (L + part - 1) / part);
}

// The work units sequence i gives this launch (its query tiles, or (tile, split) pairs in a
// short-run launch), and its splits in *ns. The host sizes the grid as an upper bound on their
// sum from its own rule (cuda_ops.py's attention): the two must agree (see MINILLM_SHORT_RUN_MAX_Q).
__device__ __forceinline__ int seq_work_units(const int* query_start, const int* seq_lens, int i, int bq,
                                              int min_nq, int short_max_ctx, int short_splits, int* ns) {
  const int nq_i = query_start[i + 1] - query_start[i];
  const int L_i = seq_lens[i];
  const bool short_run = minillm::short_run_on_tensor_cores(nq_i, L_i, short_max_ctx);
  if (short_splits > 0) {
    *ns = short_run_splits(L_i, short_splits);
    return short_run ? (nq_i + bq - 1) / bq * *ns : 0;
  }
  *ns = 1;  // other short runs: decode_attention.cu
  return nq_i >= min_nq || short_run ? (nq_i + bq - 1) / bq : 0;
}

// Q_IN_STAGE (paged_prefill_short_bf16_d*): Q is staged in the second K/V stage's K half and read
// into registers before that stage is first filled, so a CTA takes two stages of shared memory
// instead of Q + two, and with at most 168 registers (__launch_bounds__(PF_THREADS, 3)) three CTAs
// fit an SM instead of two: a c = 16 round's short runs (16 x 8 KV heads x 3 splits = 384 CTAs)
// then start in one wave of 396 instead of two of 264 (part177's timeline: a CTA lives ~14 us,
// the launch spans ~34).
template <int D, bool Q_IN_STAGE = false>
__device__ __forceinline__ void prefill_attention_impl(
    const bf16* __restrict__ q, i64 q_tok, i64 q_head,
    const bf16* __restrict__ kc, const bf16* __restrict__ vc,  // [num_blocks, bs, KH, D]
    const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start, int B,
    bf16* __restrict__ out, i64 o_tok, i64 o_head,
    int KH, int G, int block_size, int num_blocks, float scale_log2, int causal, int bq,
    int min_nq, int short_max_ctx, int short_splits, float* __restrict__ part_o,
    float* __restrict__ part_ml, int* __restrict__ counters) {
  typedef PfLayout<D> Ly;
  constexpr int CH = D / 8;       // 16-byte chunks per row
  constexpr int KS = D / 16;      // k steps of S = Q K^T
  constexpr int NT = PF_BK / 8;   // 8-key column tiles of S
  constexpr int DT = D / 8;       // 8-dim column tiles of O
  extern __shared__ __align__(128) unsigned char pf_smem[];
  bf16* const smem = reinterpret_cast<bf16*>(pf_smem);
  bf16* KVs = Q_IN_STAGE ? smem : smem + PF_ROWS * Ly::LDQ;  // stage s: K at KVs + s * STAGE, V after it
  bf16* Qs = Q_IN_STAGE ? KVs + Ly::STAGE : smem;             // [PF_ROWS][LDQ]
  __shared__ int s_b, s_q0, s_split, s_nsplit, s_last;
  // Under PF_PDL the wait comes before anything another kernel writes is read and before any
  // return (cuda/common.cuh); with PDL_PREWAIT_INDEX, after the CTA has found its work from the
  // step inputs (query_start, seq_lens, block tables).
  constexpr bool wait_first = PF_PDL && !PDL_PREWAIT_INDEX, wait_late = PF_PDL && PDL_PREWAIT_INDEX;
  if (wait_first) minillm::pdl_entry();

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g8 = lane >> 2, t4 = lane & 3;  // fragment row group and column pair
  const int kh = blockIdx.y;
  if (warp == 0) {  // which sequence and which of its query tiles this CTA owns
    // Tiles are numbered sequence by sequence, and CTAs take them from the last: the hardware
    // starts CTAs in index order, and a causal chunk's last tiles see the most keys, so the
    // longest CTAs start first and the short ones fill the tail (the grid is an upper bound on
    // the tiles: the first CTAs may find none and leave). 32 sequences a round, a lane each (one
    // thread walking the sequences cost ~2 loads a sequence per CTA: mixed steps hold 100-250).
    // A short-run launch (short_splits > 0) numbers (tile, split) pairs instead of tiles.
    int tile = gridDim.x - 1 - blockIdx.x, found = -1, first = 0, split = 0, ns = 1;
    for (int base = 0; base < B; base += 32) {
      const int i = base + lane;
      int n = 0, ns_i = 1;
      if (i < B) n = seq_work_units(query_start, seq_lens, i, bq, min_nq, short_max_ctx, short_splits, &ns_i);
      int inc = n;  // tiles of sequences base..i
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, tile < inc);
      if (hit) {
        const int l = __ffs(hit) - 1;
        const int before = __shfl_sync(0xffffffffu, inc - n, l);
        ns = __shfl_sync(0xffffffffu, ns_i, l);
        found = base + l;
        first = (tile - before) / ns * bq;
        split = (tile - before) % ns;
        break;
      }
      tile -= __shfl_sync(0xffffffffu, inc, 31);
    }
    if (lane == 0) {
      s_b = found;
      s_q0 = first;
      s_split = split;
      s_nsplit = ns;
    }
#if MINILLM_CUDA_DEBUG
    // debug build: the grid must hold every work unit of the step; one that does not would leave
    // rows unwritten and a split's merge counter set (session 36's bug). CTA 0 counts them.
    if (blockIdx.x == 0) {
      int total = 0;
      for (int i = lane; i < B; i += 32) {
        int ns_i;
        total += seq_work_units(query_start, seq_lens, i, bq, min_nq, short_max_ctx, short_splits, &ns_i);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
      MINILLM_CHECK(total <= (int)gridDim.x);
    }
#endif
  }
  __syncthreads();
  const int b = s_b, q0 = s_q0, split = s_split, n_split = s_nsplit;
  if (b < 0) {  // the grid is an upper bound on the number of tiles
    if (wait_late) minillm::pdl_entry();
    return;
  }
  const int qs = query_start[b];
  const int nq = query_start[b + 1] - qs;
  const int L = seq_lens[b];
  MINILLM_CHECK(nq >= 1 && L >= 0 && L <= bt_stride * block_size);
  const int q_end = min(q0 + bq, nq);
  const int rows = bq * G;  // row r = query q0 + r / G, head kh * G + r % G
  int k_hi = causal ? L - nq + q_end : L;  // keys any row of this CTA may see
  k_hi = max(0, min(k_hi, L));
  int k_lo = 0, k_end = k_hi;  // this CTA's keys (a split's: tile-aligned, so no tile is shared)
  if (n_split > 1) {
    const int part = short_run_part(L, short_splits);
    k_lo = min(split * part, k_hi);
    k_end = min(k_hi, k_lo + part);
  }
  const int* bt = block_tables + (i64)b * bt_stride;
  if (wait_late) {  // this CTA's block-table entries into L1 (a warp), then the wait
    if (tid < 32 && k_lo < k_end)
      for (int lb = k_lo / block_size + tid; lb <= (k_end - 1) / block_size; lb += 32)
        minillm::prefetch_l1(bt + lb);
    minillm::pdl_entry();
  }

  // K/V tile k0 into stage st: every thread copies PF_BK * CH / PF_THREADS chunks of each
  auto load_tile = [&](int k0, int st) {
    bf16* Ks = KVs + st * Ly::STAGE;
    bf16* Vs = Ks + PF_BK * Ly::LDQ;
#pragma unroll
    for (int i = tid; i < PF_BK * CH; i += PF_THREADS) {
      const int c = i / CH, part = i - c * CH, key = k0 + c;
      const bf16 *ks = kc, *vs = vc;  // any valid address when nothing is copied
      int n = 0;
      if (key < k_hi) {
        const int lb = key / block_size;
        MINILLM_CHECK(lb < bt_stride);
        const int phys = bt[lb];
        MINILLM_CHECK(phys >= 0 && phys < num_blocks);
        const i64 off = (((i64)phys * block_size + (key - lb * block_size)) * KH + kh) * D + part * 8;
        ks = kc + off;
        vs = vc + off;
        n = 16;
      }
      cp_async_16(smem_u32(Ks + c * Ly::LDQ + part * 8), ks, n);
      cp_async_16(smem_u32(Vs + c * Ly::LDQ + part * 8), vs, n);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  if (k_lo < k_end) load_tile(k_lo, 0);

  for (int i = tid; i < PF_ROWS * CH; i += PF_THREADS) {  // Q rows (zeros past the live ones)
    const int r = i / CH, c = i - r * CH, j = q0 + r / G;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows && j < q_end)
      v = minillm::load_act(reinterpret_cast<const uint4*>(q + (i64)(qs + j) * q_tok +
                                                        (i64)(kh * G + r % G) * q_head) + c);
    *reinterpret_cast<uint4*>(Qs + r * Ly::LDQ + c * 8) = v;
  }
  __syncthreads();

  // this warp's rows: fragment rows g8 and g8 + 8 of 16; their Q as A fragments, loaded once
  const int r0 = warp * 16;
  unsigned qa[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
    ldmatrix_x4(qa[kk], smem_u32(Qs + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Ly::LDQ + kk * 16 +
                                 (lane >> 4) * 8));
  if (Q_IN_STAGE) __syncthreads();  // every warp holds Q before the loop first fills stage 1
  int lim[2];  // keys < lim are visible to fragment row g8 (+ 8); 0 for rows outside the tile
  int warp_lim = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g8 + 8 * h, j = q0 + r / G;
    lim[h] = r < rows && j < q_end ? min(causal ? L - nq + j + 1 : L, k_hi) : 0;
    warp_lim = max(warp_lim, lim[h]);
  }
  warp_lim = max(warp_lim, __shfl_xor_sync(0xffffffffu, warp_lim, 4));
  warp_lim = max(warp_lim, __shfl_xor_sync(0xffffffffu, warp_lim, 8));
  warp_lim = max(warp_lim, __shfl_xor_sync(0xffffffffu, warp_lim, 16));

  float o[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {minillm::neg_inf(), minillm::neg_inf()}, l[2] = {0.f, 0.f};  // l: this lane's part

  int st = 0;
  for (int k0 = k_lo; k0 < k_end; k0 += PF_BK, st ^= 1) {
    if (k0 + PF_BK < k_end) {  // the next tile's copies go out before this one is used
      load_tile(k0 + PF_BK, st ^ 1);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();  // tile k0 is in stage st for every warp
    if (k0 < warp_lim) {  // uniform over the warp: rows that see none of this tile skip it
      const bf16* Ks = KVs + st * Ly::STAGE;
      const bf16* Vs = Ks + PF_BK * Ly::LDQ;

      // S = Q K^T: 16 rows x 64 keys, s[n] = keys n*8 + 2*t4 + {0, 1} of rows g8 and g8 + 8
      float s[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int kk = 0; kk < KS; kk += 2) {  // x4: two k steps of one 8-key tile
          unsigned kb[4];
          ldmatrix_x4(kb, smem_u32(Ks + (n * 8 + (lane & 7)) * Ly::LDQ + kk * 16 + (lane >> 3) * 8));
          minillm::mma_bf16_16816(s[n], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], kb[0], kb[1]);
          minillm::mma_bf16_16816(s[n], qa[kk + 1][0], qa[kk + 1][1], qa[kk + 1][2], qa[kk + 1][3],
                                  kb[2], kb[3]);
        }
      }

      // online softmax over this tile, rows g8 (h = 0) and g8 + 8 (h = 1)
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = minillm::neg_inf();
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = k0 + n * 8 + 2 * t4 + e;
            float v = s[n][2 * h + e] * scale_log2;
            v = key < lim[h] ? v : minillm::neg_inf();
            s[n][2 * h + e] = v;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[h], mx);
        const float m_use = m_new == minillm::neg_inf() ? 0.f : m_new;  // nothing visible yet
        alpha[h] = exp2f(m[h] - m_use);  // 0 while m is -inf (o and l are 0 then anyway)
        m[h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = exp2f(s[n][2 * h + e] - m_use);  // masked keys: exp2(-inf) = 0
            s[n][2 * h + e] = p;
            sum += p;
          }
        l[h] = l[h] * alpha[h] + sum;
      }
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }

      // O += P V: key block kk (16 keys = S tiles 2kk, 2kk + 1) as the A operand
#pragma unroll
      for (int kk = 0; kk < PF_BK / 16; ++kk) {
        const unsigned pa0 = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        const unsigned pa1 = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        const unsigned pa2 = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const unsigned pa3 = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < DT; n += 2) {  // x4.trans: two 8-dim tiles of these 16 keys
          unsigned vb[4];
          ldmatrix_x4_trans(vb, smem_u32(Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * Ly::LDQ +
                                         n * 8 + (lane >> 4) * 8));
          minillm::mma_bf16_16816(o[n], pa0, pa1, pa2, pa3, vb[0], vb[1]);
          minillm::mma_bf16_16816(o[n + 1], pa0, pa1, pa2, pa3, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with stage st before the next iteration refills it
  }
  if (PF_PDL) minillm::pdl_release();

  // the row sums across the quad, then out = O / l for the live rows
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  const int H = KH * G;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g8 + 8 * h, j = q0 + r / G;
    if (r >= rows || j >= q_end) continue;
    if (n_split > 1) {  // this split's unnormalised partial: O, the running max and the sum
      const i64 slot = ((i64)(qs + j) * H + kh * G + r % G) * short_splits + split;
      if (t4 == 0) {
        part_ml[2 * slot] = m[h];
        part_ml[2 * slot + 1] = l[h];
      }
      float2* po = reinterpret_cast<float2*>(part_o + slot * D + 2 * t4);
#pragma unroll
      for (int n = 0; n < DT; ++n) po[n * 4] = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      continue;
    }
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    bf16* orow = out + (i64)(qs + j) * o_tok + (i64)(kh * G + r % G) * o_head;
#pragma unroll
    for (int n = 0; n < DT; ++n)
      *reinterpret_cast<__nv_bfloat162*>(orow + n * 8 + 2 * t4) =
          __floats2bfloat162_rn(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
  if (n_split == 1) return;

  // ---- the last split of this (tile, KV head) to finish merges the partials (fixed order)
  __threadfence();
  __syncthreads();
  int* counter = counters + (i64)(qs + q0) * KH + kh;  // the tile's first row: unique in the step
  if (tid == 0) s_last = atomicAdd(counter, 1) == n_split - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // A thread a row computes the splits' weights 2^(m_s - max) and 1 / sum; then each thread merges
  // 4 dims a step, every split's partial loaded at once (one load chain an element made the merge
  // the kernel's bottleneck, part96). The weights sit in Q's dynamic shared memory (Q's fragments
  // are in registers since the loop began, and its last barrier is behind every warp): static
  // shared memory would leave the K/V stages' opt-in size invalid.
  float (*s_w)[PF_MAX_SPLITS] = reinterpret_cast<float (*)[PF_MAX_SPLITS]>(pf_smem);
  float* s_inv = reinterpret_cast<float*>(pf_smem) + PF_ROWS * PF_MAX_SPLITS;
  const int live = (q_end - q0) * G;  // row r: query q0 + r / G, head kh * G + r % G
  if (tid < live) {
    const i64 p0 = ((i64)(qs + q0 + tid / G) * H + kh * G + tid % G) * short_splits;
    float ms[PF_MAX_SPLITS], M = minillm::neg_inf(), den = 0.f;
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
      ms[s] = s < n_split ? __ldcg(part_ml + 2 * (p0 + s)) : minillm::neg_inf();
      M = fmaxf(M, ms[s]);
    }
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
      const float w = ms[s] == minillm::neg_inf() ? 0.f : exp2f(ms[s] - M);  // keys it cannot see: 0
      s_w[tid][s] = w;
      if (w > 0.f) den = fmaf(w, __ldcg(part_ml + 2 * (p0 + s) + 1), den);
    }
    s_inv[tid] = den > 0.f ? 1.f / den : 0.f;
  }
  __syncthreads();
#pragma unroll 2
  for (int e = tid; e < live * (D / 4); e += PF_THREADS) {
    const int r = e / (D / 4), c4 = e - r * (D / 4), j = q0 + r / G, h = kh * G + r % G;
    const i64 p0 = ((i64)(qs + j) * H + h) * short_splits;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
      const float w = s < n_split ? s_w[r][s] : 0.f;
      if (w > 0.f) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(part_o + (p0 + s) * D) + c4);
        acc.x = fmaf(w, v.x, acc.x);
        acc.y = fmaf(w, v.y, acc.y);
        acc.z = fmaf(w, v.z, acc.z);
        acc.w = fmaf(w, v.w, acc.w);
      }
    }
    const float inv = s_inv[r];
    __nv_bfloat162* orow =
        reinterpret_cast<__nv_bfloat162*>(out + (i64)(qs + j) * o_tok + (i64)h * o_head + 4 * c4);
    orow[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    orow[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
  if (tid == 0) *counter = 0;  // ready for the next step (or graph replay)
}

}  // namespace

// paged_prefill_bf16_d<D>: grid (query tiles, KH), PF_THREADS threads, PfLayout<D>'s bf16 elements
// (PF_ROWS * LDQ + 2 * STAGE) of dynamic shared memory. paged_prefill_short_bf16_d<D>: the same
// kernel with Q in the second stage (Q_IN_STAGE above), three CTAs an SM, 2 * STAGE elements; the
// host launches it for short runs split over CTAs (short_splits > 0). Same arithmetic in the same
// order: same bits.
// BOUNDS: __launch_bounds__'s arguments, in parentheses (a minimum of one CTA an SM spelled out
// changes the two-CTA kernel's SASS, so it is left out there).
#define MINILLM_PREFILL(NAME, D, BOUNDS, Q_IN_STAGE)                                           \
  extern "C" __global__ void __launch_bounds__ BOUNDS NAME(                                    \
      const bf16* q, i64 q_tok, i64 q_head, const bf16* kc, const bf16* vc,                    \
      const int* block_tables, int bt_stride, const int* seq_lens, const int* query_start,     \
      int B, bf16* out, i64 o_tok, i64 o_head, int KH, int G, int block_size, int num_blocks,  \
      float scale_log2, int causal, int bq, int min_nq, int short_max_ctx, int short_splits,   \
      float* part_o, float* part_ml, int* counters) {                                          \
    prefill_attention_impl<D, Q_IN_STAGE>(q, q_tok, q_head, kc, vc, block_tables, bt_stride,   \
                                          seq_lens, query_start, B, out, o_tok, o_head, KH, G, \
                                          block_size, num_blocks, scale_log2, causal, bq,      \
                                          min_nq, short_max_ctx, short_splits, part_o,         \
                                          part_ml, counters);                                  \
  }

MINILLM_PREFILL(paged_prefill_bf16_d64, 64, (PF_THREADS), false)
MINILLM_PREFILL(paged_prefill_bf16_d128, 128, (PF_THREADS), false)
MINILLM_PREFILL(paged_prefill_short_bf16_d64, 64, (PF_THREADS, 3), true)
MINILLM_PREFILL(paged_prefill_short_bf16_d128, 128, (PF_THREADS, 3), true)
