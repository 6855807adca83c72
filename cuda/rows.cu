// rows.cu: row copies with an optional row index (embed, gather_rows, copy, store_kv), the
// input-id fill of async scheduling (fill_input_ids) and a DFlash drafting step's start set from the
// verification's accept flags (advance_blocks).
//
// Each is a byte copy of whole rows, so one kernel serves every dtype: the host picks the widest
// unit (16, 4 or 2 bytes) that the row length, the strides and the base pointers are aligned to.
#include "common.cuh"

// dst[r] = src[idx ? idx[r] : r] for r < n_rows. Strides and row length in units of U.
template <typename U>
__device__ __forceinline__ void gather_rows_impl(const U* __restrict__ src, i64 src_stride,
                                                 const int* __restrict__ idx, i64 n_src,
                                                 U* __restrict__ dst, i64 dst_stride, int n_rows,
                                                 int row_units) {
  minillm::pdl_entry();
  const int r = blockIdx.x;
  if (r >= n_rows) return;
  i64 s = r;
  if (idx != nullptr) {
    s = idx[r];
    MINILLM_CHECK(s >= 0 && s < n_src);
  }
  const U* a = src + s * src_stride;
  U* b = dst + (i64)r * dst_stride;
  for (int u = threadIdx.x; u < row_units; u += blockDim.x) b[u] = a[u];
}

// Write token t's k and v rows to cache slot slots[t]; a negative slot is a padding row.
template <typename U>
__device__ __forceinline__ void store_kv_impl(const U* __restrict__ k, i64 k_stride,
                                              const U* __restrict__ v, i64 v_stride,
                                              U* __restrict__ kc, U* __restrict__ vc,
                                              const int* __restrict__ slots, int n_tokens,
                                              int row_units, i64 n_slots) {
  minillm::pdl_entry();
  const int t = blockIdx.x;
  if (t >= n_tokens) return;
  const i64 s = slots[t];
  if (s < 0) return;
  MINILLM_CHECK(s < n_slots);
  const U* a = k + (i64)t * k_stride;
  const U* b = v + (i64)t * v_stride;
  U* ka = kc + s * row_units;
  U* vb = vc + s * row_units;
  for (int u = threadIdx.x; u < row_units; u += blockDim.x) {
    ka[u] = a[u];
    vb[u] = b[u];
  }
}

#define MINILLM_ROWS(SUFFIX, U)                                                                 \
  extern "C" __global__ void gather_rows_##SUFFIX(const U* src, i64 src_stride, const int* idx, \
                                                  i64 n_src, U* dst, i64 dst_stride,            \
                                                  int n_rows, int row_units) {                  \
    gather_rows_impl<U>(src, src_stride, idx, n_src, dst, dst_stride, n_rows, row_units);       \
  }                                                                                             \
  extern "C" __global__ void store_kv_##SUFFIX(const U* k, i64 k_stride, const U* v,            \
                                               i64 v_stride, U* kc, U* vc, const int* slots,    \
                                               int n_tokens, int row_units, i64 n_slots) {      \
    store_kv_impl<U>(k, k_stride, v, v_stride, kc, vc, slots, n_tokens, row_units, n_slots);    \
  }

MINILLM_ROWS(u16, uint4)  // 16-byte units
MINILLM_ROWS(u4, unsigned int)
MINILLM_ROWS(u2, unsigned short)

// A step's inputs, read by the device straight from pinned host memory (which the device maps:
// UVA) instead of a copy engine's transfer: around an H100's batch-1 decode graph the packed 33 KB
// upload and the block-table rows cost 13.2 us, the id readback 10 us, and a 64-byte copy 2 us
// (part316, scripts/step_gap_bench.py). The host copies only the part of each array the step uses
// into the blob: a header of STAGE_HEADER_INTS int32, then the runs' rows back to back. Header: [0]
// runs, [1] the fill's run (-1: none), [2] its input-id row, [3] its src_rows row, [4] ids filled,
// [5] prev_tokens' length; then per run (destination offset, stride, rows, row length), all in
// 16-byte units: row j of run k lands at dst + offset + j * stride. The fill is fill_input_ids'
// rule on the staged values: id[i] = prev_tokens[src_rows[i]] for i < ids filled where
// src_rows[i] >= 0. One thread per 16-byte unit. out_n > 0: first out_dst[:out_n] = out_src[:out_n]
// (pinned host memory; the previous step's sampled ids, a readback deferred to this launch: async
// scheduling saves the launch of copy_to_host_i32 between two graphs).
#define STAGE_MAX_RUNS 12
#define STAGE_HEADER_INTS (8 + 4 * STAGE_MAX_RUNS)

extern "C" __global__ void stage_inputs(const int4* blob, int4* dst, const int* prev_tokens, const int* out_src,
                                        int* out_dst, int out_n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < out_n; i += gridDim.x * blockDim.x) out_dst[i] = out_src[i];
  __shared__ int h[STAGE_HEADER_INTS];
  for (int i = threadIdx.x; i < STAGE_HEADER_INTS; i += blockDim.x) h[i] = reinterpret_cast<const int*>(blob)[i];
  __syncthreads();
  const int runs = h[0];
  MINILLM_CHECK(runs >= 0 && runs <= STAGE_MAX_RUNS);
  const int4* data = blob + STAGE_HEADER_INTS / 4;
  int total = 0;
  for (int k = 0; k < runs; ++k) total += h[8 + 4 * k + 2] * h[8 + 4 * k + 3];
  for (int u = blockIdx.x * blockDim.x + threadIdx.x; u < total; u += gridDim.x * blockDim.x) {
    int k = 0, start = 0;
    while (u >= start + h[8 + 4 * k + 2] * h[8 + 4 * k + 3]) {
      start += h[8 + 4 * k + 2] * h[8 + 4 * k + 3];
      ++k;
    }
    const int* r = h + 8 + 4 * k;
    const int local = u - start, j = local / r[3], w = local - j * r[3];
    int4 v = data[u];
    if (k == h[1] && j == h[2]) {
      const int4 s = data[start + h[3] * r[3] + w];
      int* vv = reinterpret_cast<int*>(&v);
      const int* ss = reinterpret_cast<const int*>(&s);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (4 * w + c < h[4] && ss[c] >= 0) {
          MINILLM_CHECK(ss[c] < h[5]);
          vv[c] = prev_tokens[ss[c]];
        }
      }
    }
    dst[(long long)r[0] + (long long)j * r[1] + w] = v;
  }
}

// A step's sampled ids (or accept flags) written straight into pinned host memory, the readback's
// slot: a kernel's stores instead of a copy engine's transfer (10 us around a decode graph, part316).
// src: the sampler's output, so plain loads.
extern "C" __global__ void copy_to_host_i32(const int* src, int* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

// Async scheduling: step n + 1 is launched before step n's sampled ids reach the host, so a row
// whose input is one of those ids takes it here, on the device, between the upload of step
// n + 1's inputs and its forward: input_ids[r] = prev_tokens[src_rows[r]] where src_rows[r] >= 0
// (prev_tokens: step n's sampler output, which the upload does not overwrite). int32 ids, one
// thread per row.
// prev_tokens and advance_blocks' tokens and accepted: the previous step's sampler output, which a
// kernel writes, so plain loads, not the read-only path a const __restrict__ pointer gets; that path
// is kept for weights and the inputs the host uploads (common.cuh load_act, scripts/pdl_load_lint.py)
extern "C" __global__ void fill_input_ids(int* __restrict__ input_ids,
                                          const int* prev_tokens,
                                          const int* __restrict__ src_rows, int n_rows,
                                          int n_prev) {
  minillm::pdl_entry();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n_rows) return;
  const int s = src_rows[r];
  if (s < 0) return;
  MINILLM_CHECK(s < n_prev);
  input_ids[r] = prev_tokens[s];
}

// Speculative decoding with a DFlash drafter: the drafting step is launched right behind the
// verification step, before the host has read which drafts were accepted, so each block's start
// (its sequence's new last token) is set here, on the device, between the upload of the drafting
// step's inputs (written as if no draft were accepted) and its forward. Block i of n rows: a = the
// leading accept flags in accepted[row[i] .. row[i] + drafts[i]), start = min(base[i] + a,
// limit[i]) (limit: the last start whose block fits the block table; only a sequence that has
// reached its length limit, so ends, would pass it); its first input id is tokens[row[i] + a]
// (the correction or bonus token), row j sits at position start + j in the slot its block table
// gives, seq_lens[i] = start + n, and window rows [first, first + count) sample position p + 1.
// One thread per row of the step's blocks.
extern "C" __global__ void advance_blocks(int* __restrict__ input_ids, int* __restrict__ positions,
                                          int* __restrict__ slot_mapping, int* __restrict__ seq_lens,
                                          int* __restrict__ sample_pos,
                                          const int* __restrict__ block_tables, int bt_stride,
                                          int block_size, const int* tokens,
                                          const int* accepted, int n_src,
                                          const int* __restrict__ row, const int* __restrict__ drafts,
                                          const int* __restrict__ base, const int* __restrict__ limit,
                                          int n_blocks, int n, int first, int count) {
  minillm::pdl_entry();
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= n_blocks * n) return;
  const int i = g / n, j = g % n;
  const int r = row[i], k = drafts[i];
  MINILLM_CHECK(r >= 0 && k >= 0 && r + k < n_src);
  int a = 0;
  while (a < k && accepted[r + a] != 0) ++a;
  const int start = min(base[i] + a, limit[i]);
  const int p = start + j;
  MINILLM_CHECK(p >= 0 && p / block_size < bt_stride);
  positions[g] = p;
  slot_mapping[g] = block_tables[(i64)i * bt_stride + p / block_size] * block_size + p % block_size;
  if (j == 0) {
    input_ids[g] = tokens[r + a];
    seq_lens[i] = start + n;
  }
  if (j >= first && j < first + count) sample_pos[i * count + j - first] = p + 1;
}
