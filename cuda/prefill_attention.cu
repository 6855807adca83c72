// prefill_attention.cu: paged attention for prefill and chunked-prefill steps on tensor cores,
// another twin of NumpyBackend.paged_attention (bf16 storage only; fp32 storage and odd shapes
// use attention.cu's tiled kernel, decode and verification steps decode_attention.cu).
//
// One CTA owns 64 query rows of one sequence and one KV head: bq = 64 / G consecutive queries x
// the G query heads sharing that KV head, so each K/V tile is read from the paged cache once for
// all of them. Four warps, 16 rows each. Per key tile of 64:
//   S = Q K^T        wmma bf16 x bf16 -> fp32 (16x16x16 fragments), into shared memory
//   online softmax   per row in fp32 (base 2); P rounded to bf16 in shared memory
//   O = O * alpha + P V   O lives in shared memory as fp32 (a fragment's element-to-row map is
//                   opaque, so rows are rescaled there, then loaded as the accumulator)
// Only the K/V tile loads need the whole CTA; the rest of the tile is per warp (its own rows).
// Sequences with fewer than min_nq new queries are skipped (decode_attention.cu takes them in
// the same step). Grid: (an upper bound on the step's query tiles, KH); where each CTA works
// comes from device buffers, like the other attention kernels.
#include "common.cuh"
#include <mma.h>

#define PF_THREADS 128
#define PF_ROWS 64  // query rows per CTA (4 warps x 16)
#define PF_BK 64    // keys per tile

namespace {

namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> AccFrag;

// Shared-memory leading dimensions, padded to spread banks (and keep wmma's 32-byte alignment).
template <int D>
struct PfLayout {
  static constexpr int LDQ = D + 8;       // bf16: Q, K and V tiles
  static constexpr int LDS = PF_BK + 4;   // fp32: scores
  static constexpr int LDP = PF_BK + 8;   // bf16: probabilities
  static constexpr int LDO = D + 4;       // fp32: output accumulator
  // dynamic shared memory: 2 * (ROWS * LDQ + 2 * BK * LDQ + ROWS * LDP)
  //                      + 4 * (ROWS * LDS + ROWS * LDO + 3 * ROWS) bytes (cuda_ops.py mirrors it)
};

template <int D>
__device__ __forceinline__ void prefill_attention_impl(
    const bf16* __restrict__ q, i64 q_tok, i64 q_head,
    const bf16* __restrict__ kc, const bf16* __restrict__ vc,  // [num_blocks, bs, KH, D]
    const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start, int B,
    bf16* __restrict__ out, i64 o_tok, i64 o_head,
    int KH, int G, int block_size, int num_blocks, float scale_log2, int causal, int bq,
    int min_nq) {
  typedef PfLayout<D> Ly;
  constexpr int CH = D / 8;  // 16-byte chunks per row
  extern __shared__ __align__(128) unsigned char pf_smem[];
  bf16* Qs = reinterpret_cast<bf16*>(pf_smem);  // [PF_ROWS][LDQ]
  bf16* Ks = Qs + PF_ROWS * Ly::LDQ;             // [PF_BK][LDQ]
  bf16* Vs = Ks + PF_BK * Ly::LDQ;               // [PF_BK][LDQ]
  bf16* Ps = Vs + PF_BK * Ly::LDQ;               // [PF_ROWS][LDP]
  float* Ss = reinterpret_cast<float*>(Ps + PF_ROWS * Ly::LDP);  // [PF_ROWS][LDS]
  float* Os = Ss + PF_ROWS * Ly::LDS;            // [PF_ROWS][LDO]
  float* m_s = Os + PF_ROWS * Ly::LDO;
  float* l_s = m_s + PF_ROWS;
  float* a_s = l_s + PF_ROWS;
  __shared__ int s_b, s_q0;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kh = blockIdx.y;
  if (tid == 0) {  // which sequence and which of its query tiles this CTA owns
    int tile = blockIdx.x, found = -1, first = 0;
    for (int i = 0; i < B; ++i) {
      const int nq_i = query_start[i + 1] - query_start[i];
      const int n = nq_i < min_nq ? 0 : (nq_i + bq - 1) / bq;  // short runs: decode_attention.cu
      if (tile < n) { found = i; first = tile * bq; break; }
      tile -= n;
    }
    s_b = found;
    s_q0 = first;
  }
  __syncthreads();
  const int b = s_b, q0 = s_q0;
  if (b < 0) return;  // the grid is an upper bound on the number of tiles
  const int qs = query_start[b];
  const int nq = query_start[b + 1] - qs;
  const int L = seq_lens[b];
  MINILLM_CHECK(nq >= 1 && L >= 0 && L <= bt_stride * block_size);
  const int q_end = min(q0 + bq, nq);
  const int rows = bq * G;  // row r = query q0 + r / G, head kh * G + r % G

  for (int i = tid; i < PF_ROWS * CH; i += PF_THREADS) {
    const int r = i / CH, c = i - r * CH, j = q0 + r / G;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows && j < q_end)
      v = __ldg(reinterpret_cast<const uint4*>(q + (i64)(qs + j) * q_tok +
                                               (i64)(kh * G + r % G) * q_head) + c);
    *reinterpret_cast<uint4*>(Qs + r * Ly::LDQ + c * 8) = v;
  }
  for (int i = tid; i < PF_ROWS * Ly::LDO; i += PF_THREADS) Os[i] = 0.f;
  for (int r = tid; r < PF_ROWS; r += PF_THREADS) {
    m_s[r] = minillm::neg_inf();
    l_s[r] = 0.f;
  }
  int k_hi = causal ? L - nq + q_end : L;  // keys any row of this CTA may see
  k_hi = max(0, min(k_hi, L));
  const int* bt = block_tables + (i64)b * bt_stride;
  const int r0 = warp * 16;

  for (int k0 = 0; k0 < k_hi; k0 += PF_BK) {
    __syncthreads();  // every warp is done with the previous K/V tile (and, first time, Q/O init)
    for (int i = tid; i < PF_BK * CH; i += PF_THREADS) {
      const int c = i / CH, part = i - c * CH, key = k0 + c;
      uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
      if (key < k_hi) {
        const int lb = key / block_size;
        MINILLM_CHECK(lb < bt_stride);
        const int phys = bt[lb];
        MINILLM_CHECK(phys >= 0 && phys < num_blocks);
        const i64 off = (((i64)phys * block_size + (key - lb * block_size)) * KH + kh) * D;
        kv = __ldg(reinterpret_cast<const uint4*>(kc + off) + part);
        vv = __ldg(reinterpret_cast<const uint4*>(vc + off) + part);
      }
      *reinterpret_cast<uint4*>(Ks + c * Ly::LDQ + part * 8) = kv;
      *reinterpret_cast<uint4*>(Vs + c * Ly::LDQ + part * 8) = vv;
    }
    __syncthreads();

    // S = Q K^T for this warp's 16 rows (K read as the column-major K^T)
#pragma unroll
    for (int n = 0; n < PF_BK / 16; ++n) {
      AccFrag acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> kt;
        wmma::load_matrix_sync(a, Qs + r0 * Ly::LDQ + kk * 16, Ly::LDQ);
        wmma::load_matrix_sync(kt, Ks + n * 16 * Ly::LDQ + kk * 16, Ly::LDQ);
        wmma::mma_sync(acc, a, kt, acc);
      }
      wmma::store_matrix_sync(Ss + r0 * Ly::LDS + n * 16, acc, Ly::LDS, wmma::mem_row_major);
    }
    __syncwarp();

    // online softmax, one row at a time over the warp (two keys a lane)
    for (int rr = 0; rr < 16; ++rr) {
      const int r = r0 + rr, j = q0 + r / G;
      const bool live = r < rows && j < q_end;
      int lim = causal ? L - nq + j + 1 : L;  // keys < lim are visible to this row
      lim = min(lim, k_hi);
      float s[2], p[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = lane + 32 * h;
        s[h] = live && k0 + c < lim ? Ss[r * Ly::LDS + c] * scale_log2 : minillm::neg_inf();
      }
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, minillm::warp_max(fmaxf(s[0], s[1])));
      const bool none = m_new == minillm::neg_inf();  // nothing visible yet: keep zeros
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        p[h] = none || s[h] == minillm::neg_inf() ? 0.f : exp2f(s[h] - m_new);
        Ps[r * Ly::LDP + lane + 32 * h] = __float2bfloat16_rn(p[h]);
      }
      const float sum = minillm::warp_sum(p[0] + p[1]);
      const float alpha = none ? 1.f : exp2f(m_old - m_new);
      __syncwarp();  // every lane has read m_s[r]
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + sum;
        a_s[r] = alpha;
      }
    }
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const float a = a_s[r0 + rr];
      if (a != 1.f)
        for (int d = lane; d < D; d += 32) Os[(r0 + rr) * Ly::LDO + d] *= a;
    }
    __syncwarp();

    // O += P V for this warp's rows
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      AccFrag acc;
      wmma::load_matrix_sync(acc, Os + r0 * Ly::LDO + n * 16, Ly::LDO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < PF_BK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> v;
        wmma::load_matrix_sync(a, Ps + r0 * Ly::LDP + kk * 16, Ly::LDP);
        wmma::load_matrix_sync(v, Vs + kk * 16 * Ly::LDQ + n * 16, Ly::LDQ);
        wmma::mma_sync(acc, a, v, acc);
      }
      wmma::store_matrix_sync(Os + r0 * Ly::LDO + n * 16, acc, Ly::LDO, wmma::mem_row_major);
    }
  }
  __syncthreads();  // Os/l_s complete (also when the CTA saw no keys)

  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr, j = q0 + r / G;
    if (r >= rows || j >= q_end) continue;
    const float l = l_s[r];
    bf16* o = out + (i64)(qs + j) * o_tok + (i64)(kh * G + r % G) * o_head;
    for (int d = lane; d < D; d += 32)
      o[d] = __float2bfloat16_rn(l > 0.f ? Os[r * Ly::LDO + d] / l : 0.f);
  }
}

}  // namespace

// paged_prefill_bf16_d<D>: grid (query tiles, KH), PF_THREADS threads, PfLayout<D>'s dynamic
// shared memory.
#define MINILLM_PREFILL(D)                                                                     \
  extern "C" __global__ void __launch_bounds__(PF_THREADS) paged_prefill_bf16_d##D(            \
      const bf16* q, i64 q_tok, i64 q_head, const bf16* kc, const bf16* vc,                    \
      const int* block_tables, int bt_stride, const int* seq_lens, const int* query_start,     \
      int B, bf16* out, i64 o_tok, i64 o_head, int KH, int G, int block_size, int num_blocks,  \
      float scale_log2, int causal, int bq, int min_nq) {                                      \
    prefill_attention_impl<D>(q, q_tok, q_head, kc, vc, block_tables, bt_stride, seq_lens,     \
                              query_start, B, out, o_tok, o_head, KH, G, block_size,           \
                              num_blocks, scale_log2, causal, bq, min_nq);                     \
  }

MINILLM_PREFILL(64)
MINILLM_PREFILL(128)
