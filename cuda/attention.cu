// attention.cu: paged grouped-query attention over ragged query lengths, the twin of
// NumpyBackend.paged_attention (prefill, chunked prefill, decode, verification; causal or not).
//
// One CTA owns `bq` consecutive new queries of one sequence for one KV head, i.e. all
// rows = bq * G query heads that share that KV head, so every K/V row is read from the paged
// cache once per CTA. It walks its keys in tiles of `bk` through shared memory with an online
// softmax. Two launch shapes of the same kernel:
//   * decode / short queries: bq = 1, one CTA per token, and the context split over
//     gridDim.z CTAs (flash-decoding); each split writes an unnormalised partial that
//     attention_combine merges.
//   * long query blocks (prefill): bq = ~64 / G queries per CTA, usually one split.
// Grid sizes depend only on the step's bucket shape (tokens, sequences, block-table width);
// where each CTA works comes from device buffers, so a captured graph replays for any batch.
#include "common.cuh"

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)

namespace {

// 4-byte words one cached K/V row occupies in shared memory: the row plus one pad word, so that
// threads reading the same column of consecutive rows hit different banks.
template <typename T>
__device__ __forceinline__ int kv_row_words(int D) {
  return D * (int)sizeof(T) / 4 + 1;
}

__device__ __forceinline__ float dot_row(const float* q, const unsigned* k, int D, bf16*) {
  float s = 0.f;
  for (int w = 0; w < D / 2; ++w) {
    const unsigned u = k[w];
    const float2 kv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
    const float2 qv = *reinterpret_cast<const float2*>(q + 2 * w);
    s = fmaf(qv.x, kv.x, s);
    s = fmaf(qv.y, kv.y, s);
  }
  return s;
}

__device__ __forceinline__ float dot_row(const float* q, const unsigned* k, int D, float*) {
  float s = 0.f;
  for (int d = 0; d < D; ++d) s = fmaf(q[d], __uint_as_float(k[d]), s);
  return s;
}

template <typename T>
__device__ __forceinline__ float kv_elem(const unsigned* row, int d) {
  return minillm::to_f(reinterpret_cast<const T*>(row)[d]);
}

}  // namespace

template <typename T>
__device__ void paged_attention_impl(
    const T* __restrict__ q, i64 q_tok, i64 q_head,
    const T* __restrict__ kc, const T* __restrict__ vc,  // [num_blocks, bs, KH, D]
    const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start, int B, int n_tokens,
    T* __restrict__ out, i64 o_tok, i64 o_head,
    float* __restrict__ part_o, float* __restrict__ part_ml,
    int H, int KH, int D, int block_size, int num_blocks, float scale, int causal, int bq,
    int n_splits, int partition, int bk) {
  extern __shared__ float smem[];
  __shared__ int s_b, s_q0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = H / KH, rows = bq * G;
  const int kh = blockIdx.y, split = blockIdx.z;

  // ---- which sequence b and which of its new queries (q0 ..) this CTA owns
  int b, q0;
  if (bq == 1) {
    const int t = blockIdx.x;
    if (t >= n_tokens || t >= query_start[B]) return;  // rows outside every sequence: untouched
    b = minillm::seq_of_row(query_start, B, t);
    q0 = t - query_start[b];
  } else {
    if (tid == 0) {
      int tile = blockIdx.x, found = -1, first = 0;
      for (int i = 0; i < B; ++i) {
        const int nq = query_start[i + 1] - query_start[i];
        const int n = (nq + bq - 1) / bq;
        if (tile < n) { found = i; first = tile * bq; break; }
        tile -= n;
      }
      s_b = found;
      s_q0 = first;
    }
    __syncthreads();
    b = s_b;
    q0 = s_q0;
    if (b < 0) return;  // the grid is an upper bound on the number of tiles
  }
  const int qs = query_start[b];
  const int nq = query_start[b + 1] - qs;
  const int L = seq_lens[b];
  MINILLM_CHECK(nq >= 0 && L >= 0 && L <= bt_stride * block_size);
  const int q_end = min(q0 + bq, nq);  // queries q0 .. q_end-1 are live rows
  // keys this CTA may need: causal rows see up to their own position L - nq + j
  int k_hi = causal ? L - nq + q_end : L;
  k_hi = max(0, min(k_hi, L));
  int k_lo = 0, k_end = k_hi;
  if (n_splits > 1) {  // partition 0: split this CTA's own keys evenly (in whole tiles), so a
                       // short context in a wide block table still spreads over every split
    const int part = partition > 0 ? partition : ((k_hi + n_splits - 1) / n_splits + bk - 1) / bk * bk;
    k_lo = split * part;
    k_end = min(k_hi, k_lo + part);
  }

  // ---- shared memory carve-up
  const int rw = kv_row_words<T>(D);
  float* Qs = smem;                  // [rows][D], pre-scaled
  float* acc = Qs + rows * D;        // [rows][D]
  float* S = acc + rows * D;         // [rows][bk] scores, then probabilities
  float* m_s = S + rows * bk;        // [rows]
  float* l_s = m_s + rows;           // [rows]
  float* a_s = l_s + rows;           // [rows] rescale factor of the current tile
  unsigned* Ks = reinterpret_cast<unsigned*>(a_s + rows);  // [bk][rw]
  unsigned* Vs = Ks + bk * rw;                             // [bk][rw]

  for (int i = tid; i < rows * D; i += ATT_THREADS) {
    const int r = i / D, d = i - r * D;
    const int j = q0 + r / G, h = kh * G + r % G;
    Qs[i] = j < q_end ? minillm::to_f(q[(i64)(qs + j) * q_tok + (i64)h * q_head + d]) * scale : 0.f;
    acc[i] = 0.f;
  }
  for (int r = tid; r < rows; r += ATT_THREADS) {
    m_s[r] = minillm::neg_inf();
    l_s[r] = 0.f;
  }

  const int chunks_per_row = D * (int)sizeof(T) / 16;  // host guarantees D * sizeof(T) % 16 == 0
  const int* bt = block_tables + (i64)b * bt_stride;
  for (int k0 = k_lo; k0 < k_end; k0 += bk) {
    const int nk = min(bk, k_end - k0);
    __syncthreads();  // the previous tile's readers are done with Ks, Vs and S
    for (int i = tid; i < bk * chunks_per_row; i += ATT_THREADS) {
      const int c = i / chunks_per_row, part = i - c * chunks_per_row;
      uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
      if (c < nk) {
        const int key = k0 + c;
        const int lb = key / block_size;
        MINILLM_CHECK(lb < bt_stride);
        const int phys = bt[lb];
        MINILLM_CHECK(phys >= 0 && phys < num_blocks);
        const i64 off = (((i64)phys * block_size + key % block_size) * KH + kh) * D;
        kv = reinterpret_cast<const uint4*>(kc + off)[part];
        vv = reinterpret_cast<const uint4*>(vc + off)[part];
      }
      unsigned* kd = Ks + c * rw + part * 4;
      unsigned* vd = Vs + c * rw + part * 4;
      kd[0] = kv.x; kd[1] = kv.y; kd[2] = kv.z; kd[3] = kv.w;
      vd[0] = vv.x; vd[1] = vv.y; vd[2] = vv.z; vd[3] = vv.w;
    }
    __syncthreads();
    for (int i = tid; i < rows * bk; i += ATT_THREADS) {
      const int r = i / bk, c = i - r * bk;
      const int j = q0 + r / G;
      const int key = k0 + c;
      const bool live = c < nk && j < q_end && (!causal || key <= L - nq + j);
      S[i] = live ? dot_row(Qs + r * D, Ks + c * rw, D, (T*)nullptr) : minillm::neg_inf();
    }
    __syncthreads();
    for (int r = warp; r < rows; r += ATT_WARPS) {
      float mx = minillm::neg_inf();
      for (int c = lane; c < nk; c += 32) mx = fmaxf(mx, S[r * bk + c]);
      mx = minillm::warp_max(mx);
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int c = lane; c < nk; c += 32) {
        const float s = S[r * bk + c];
        const float p = s == minillm::neg_inf() ? 0.f : expf(s - m_new);
        S[r * bk + c] = p;
        sum += p;
      }
      sum = minillm::warp_sum(sum);
      __syncwarp();  // every lane has read m_s[r] before lane 0 replaces it
      if (lane == 0) {
        const float alpha = m_old == minillm::neg_inf() ? 0.f : expf(m_old - m_new);
        a_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();
    for (int i = tid; i < rows * D; i += ATT_THREADS) {
      const int r = i / D, d = i - r * D;
      float a = acc[i] * a_s[r];
      const float* p = S + r * bk;
      for (int c = 0; c < nk; ++c) a = fmaf(p[c], kv_elem<T>(Vs + c * rw, d), a);
      acc[i] = a;
    }
  }
  __syncthreads();

  // ---- write: the final rows, or this split's unnormalised partial for attention_combine
  for (int i = tid; i < rows * D; i += ATT_THREADS) {
    const int r = i / D, d = i - r * D;
    const int j = q0 + r / G, h = kh * G + r % G;
    if (j >= q_end) continue;
    const int t = qs + j;
    const float l = l_s[r];
    if (n_splits == 1) {
      out[(i64)t * o_tok + (i64)h * o_head + d] = minillm::from_f<T>(l > 0.f ? acc[i] / l : 0.f);
    } else {
      const i64 p = ((i64)t * H + h) * n_splits + split;
      if (l > 0.f) part_o[p * D + d] = acc[i];
      if (d == 0) {
        part_ml[2 * p] = m_s[r];
        part_ml[2 * p + 1] = l;
      }
    }
  }
}

// Merge the n_splits partials of every (token, head). grid (tokens, H), ATT_THREADS threads.
template <typename T>
__device__ void attention_combine_impl(const float* __restrict__ part_o,
                                       const float* __restrict__ part_ml,
                                       const int* __restrict__ query_start, int B, int n_tokens,
                                       T* __restrict__ out, i64 o_tok, i64 o_head, int H, int D,
                                       int n_splits) {
  __shared__ float w[ATT_THREADS];
  __shared__ float denom;
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  if (t >= n_tokens || t >= query_start[B]) return;
  const i64 p0 = ((i64)t * H + h) * n_splits;
  if (tid < 32) {
    float mx = minillm::neg_inf();
    for (int s = tid; s < n_splits; s += 32)
      if (part_ml[2 * (p0 + s) + 1] > 0.f) mx = fmaxf(mx, part_ml[2 * (p0 + s)]);
    mx = minillm::warp_max(mx);
    float sum = 0.f;
    for (int s = tid; s < n_splits; s += 32) {
      const float l = part_ml[2 * (p0 + s) + 1];
      const float ws = l > 0.f ? expf(part_ml[2 * (p0 + s)] - mx) : 0.f;
      w[s] = ws;
      sum += ws * l;
    }
    sum = minillm::warp_sum(sum);
    if (tid == 0) denom = sum;
  }
  __syncthreads();
  for (int d = tid; d < D; d += ATT_THREADS) {
    float o = 0.f;
    for (int s = 0; s < n_splits; ++s)
      if (w[s] > 0.f) o = fmaf(w[s], part_o[(p0 + s) * D + d], o);
    out[(i64)t * o_tok + (i64)h * o_head + d] = minillm::from_f<T>(denom > 0.f ? o / denom : 0.f);
  }
}

#define MINILLM_ATTENTION(SUFFIX, T)                                                            \
  extern "C" __global__ void __launch_bounds__(ATT_THREADS) paged_attention_##SUFFIX(          \
      const T* q, i64 q_tok, i64 q_head, const T* kc, const T* vc, const int* block_tables,     \
      int bt_stride, const int* seq_lens, const int* query_start, int B, int n_tokens, T* out,  \
      i64 o_tok, i64 o_head, float* part_o, float* part_ml, int H, int KH, int D,               \
      int block_size, int num_blocks, float scale, int causal, int bq, int n_splits,            \
      int partition, int bk) {                                                                  \
    paged_attention_impl<T>(q, q_tok, q_head, kc, vc, block_tables, bt_stride, seq_lens,        \
                            query_start, B, n_tokens, out, o_tok, o_head, part_o, part_ml, H,   \
                            KH, D, block_size, num_blocks, scale, causal, bq, n_splits,         \
                            partition, bk);                                                     \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_combine_##SUFFIX(        \
      const float* part_o, const float* part_ml, const int* query_start, int B, int n_tokens,   \
      T* out, i64 o_tok, i64 o_head, int H, int D, int n_splits) {                              \
    attention_combine_impl<T>(part_o, part_ml, query_start, B, n_tokens, out, o_tok, o_head, H, \
                              D, n_splits);                                                     \
  }

MINILLM_ATTENTION(bf16, bf16)
MINILLM_ATTENTION(f32, float)
