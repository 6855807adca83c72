// dflash2.cu: the two ops of DFlash2 drafters (minillm/spec/dflash2.py) that are not products,
// twins of NumpyBackend.grouped_causal_conv and NumpyBackend.dflash2_select
// (minillm/backends/numpy_ops.py, "DFlash2 drafters").
//
//  * grouped_causal_conv_*: a causal convolution along each block of block_rows rows whose taps
//    are a shared base kernel plus a per-row, per-channel-group dynamic one. A thread an element,
//    fp32 products and sums rounded one at a time in the twin's order (no FMA), so the result
//    is the twin's bits.
//  * dflash2_topk + dflash2_path: the drafter's greedy path over each block's k logits rows. The
//    top_k candidates of a row do not depend on the path, so dflash2_topk finds every row's at once
//    (a CTA a row); dflash2_path then walks each block's positions in order (a CTA a block), since
//    a position's scores depend on the token chosen before it.
//
// Launched plainly (not a PDL module: cuda_ops.py _PDL_MODULES), so every input was written by a
// kernel that has finished; no allocation, so both run inside the drafter's CUDA graph.
#include "common.cuh"
#include "radix.cuh"  // float_key, for_each_logit, the radix digits

#define TOPK_THREADS 512
#define TOPK_WARPS (TOPK_THREADS / 32)
#define TOPK_MAX 256          // candidates a row (dflash2_path keeps a score each in shared memory)
#define PATH_THREADS 512
#define PATH_WARPS (PATH_THREADS / 32)
#define PATH_MAX_RANK 1024    // pred[prev] * hproj[row] lives in shared memory

namespace {

// ---- grouped_causal_conv ----------------------------------------------------------------------
// out[t, c] = sum over o < ks, o <= t % block_rows, of
//             base[o, c] * x[t - o, c] + dyn[t, (half * ks + o) * G + c / group_size] * x[t - o, c]
// Taps that would reach before the block's first row are skipped: the twin adds their products
// with a zero x, which leaves its (never negative-zero) sum unchanged.
template <typename T>
__device__ __forceinline__ void grouped_causal_conv_impl(const T* x, i64 xs, const T* __restrict__ base,
                                                         const T* dyn, i64 ds, T* out, i64 os, int C,
                                                         int ks, int half, int group_size, int block_rows) {
  const int t = blockIdx.x;  // rows on x (a few hundred), column chunks on y
  const int G = C / group_size;
  const int taps = min(ks, t % block_rows + 1);
  const T* d = dyn + (i64)t * ds + (i64)half * ks * G;  // this half's taps of row t
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
    const int g = c / group_size;
    float acc = 0.f;
    for (int o = 0; o < taps; ++o) {
      const float xv = minillm::to_f(x[(i64)(t - o) * xs + c]);
      // __fmul_rn / __fadd_rn: NumPy rounds the product, then the sum (contracted to an FMA, the
      // result would differ from the twin's in its last bits)
      acc = __fadd_rn(acc, __fmul_rn(minillm::to_f(base[(i64)o * C + c]), xv));
      acc = __fadd_rn(acc, __fmul_rn(minillm::to_f(d[o * G + g]), xv));
    }
    out[(i64)t * os + c] = minillm::from_f<T>(acc);
  }
}

// ---- dflash2_topk ------------------------------------------------------------------------------
// Exclusive prefix sum over the block in thread order (warp_tot: a word a warp).
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned v, unsigned* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) warp_tot[warp] = inc;
  __syncthreads();
  unsigned before = 0;
  for (int w = 0; w < warp; ++w) before += warp_tot[w];
  return before + inc - v;
}

// The bin b (of nb) where the count of bins >= b first reaches need (1 <= need <= the total), and
// the count of the bins above it, into *s_bin / *s_above. Thread j sums the bins nb-1-j*per, ...
// (top down); one block scan places need in exactly one thread's bins (integer counts), which
// walks them.
__device__ __forceinline__ void radix_crossing(const unsigned* hist, int nb, unsigned need, unsigned* warp_tot,
                                               int* s_bin, unsigned* s_above) {
  const int per = (nb + blockDim.x - 1) / blockDim.x;
  const int top = nb - 1 - (int)threadIdx.x * per;
  unsigned own = 0;
  for (int e = 0; e < per && top - e >= 0; ++e) own += hist[top - e];
  unsigned c = block_exclusive_scan(own, warp_tot);
  if (c < need && need <= c + own) {
    for (int e = 0; e < per && top - e >= 0; ++e) {
      const unsigned n = hist[top - e];
      if (c + n >= need) {
        *s_bin = top - e;
        *s_above = c;
        break;
      }
      c += n;
    }
  }
  __syncthreads();
}

// The top_k ids of row r of logits (the largest values, ties to the lower id) in ascending id
// order into ids[r, :top_k], their logits into vals[r, :top_k]. One CTA a row:
//  1. Three radix passes over the row find the top_k-th largest key `kth`, and `need`, how many
//     of the keys equal to it make the set (the rest of it, top_k - need, is above it).
//  2. The row is cut into TOPK_WARPS contiguous chunks, a warp each (id order = chunk order, then
//     order within the chunk). A pass counts each chunk's keys above kth and equal to it; a second
//     one places each member at (members above kth with lower ids) + (members equal to kth with
//     lower ids), the latter the tied keys with lower ids, capped at need: ballots keep the order
//     within 32 consecutive ids. A warp stops once its chunk's members are all placed.
// Each pass reads the row (from L2 after the first where the rows fit).
__device__ __forceinline__ void dflash2_topk_impl(const float* logits, i64 stride, int V, int top_k, int* ids,
                                                  i64 ids_stride, float* vals, i64 vals_stride) {
  __shared__ unsigned hist[4096];
  __shared__ unsigned warp_tot[TOPK_WARPS];
  __shared__ unsigned n_above[TOPK_WARPS], n_tied[TOPK_WARPS];
  __shared__ int s_bin;
  __shared__ unsigned s_above;
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* lg = logits + (i64)r * stride;
  int* out_ids = ids + (i64)r * ids_stride;
  float* out_vals = vals + (i64)r * vals_stride;

  unsigned kth = 0, need = top_k;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = radix_shift(pass), nb = radix_bins(pass);
    const unsigned mask = radix_mask(pass);
    for (int b = tid; b < nb; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for_each_logit(lg, V, [&](int, float v) {
      const unsigned key = float_key(v);
      if ((key & mask) == kth) atomicAdd(&hist[(key >> shift) & (nb - 1)], 1u);
    });
    __syncthreads();
    radix_crossing(hist, nb, need, warp_tot, &s_bin, &s_above);
    kth |= (unsigned)s_bin << shift;
    need -= s_above;
    __syncthreads();  // s_bin / s_above read before the next pass's crossing writes them
  }
  const unsigned above_total = top_k - need;

  // chunks of whole 128-id steps (4 loads a lane in flight); a warp past the row has none
  const int chunk = (V + TOPK_WARPS * 128 - 1) / (TOPK_WARPS * 128) * 128;
  const int lo = warp * chunk, hi = min(V, lo + chunk);
  unsigned a = 0, t = 0;
  for (int base = lo; base < hi; base += 128) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = base + 32 * e + lane;
      if (i < hi) {
        const unsigned key = float_key(lg[i]);
        a += key > kth;
        t += key == kth;
      }
    }
  }
  a = __reduce_add_sync(0xffffffffu, a);
  t = __reduce_add_sync(0xffffffffu, t);
  if (lane == 0) {
    n_above[warp] = a;
    n_tied[warp] = t;
  }
  __syncthreads();
  a = t = 0;  // members of lower ids than this warp's next 32: above kth, and tied with it
  for (int w = 0; w < warp; ++w) {
    a += n_above[w];
    t += n_tied[w];
  }
  const unsigned lower_lanes = (1u << lane) - 1u;
  for (int base = lo; base < hi && (a < above_total || t < need); base += 128) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = base + 32 * e + lane;
      v[e] = i < hi ? lg[i] : 0.f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = base + 32 * e + lane;
      const unsigned key = float_key(v[e]);
      const bool is_above = i < hi && key > kth, is_tied = i < hi && key == kth;
      const unsigned ba = __ballot_sync(0xffffffffu, is_above), bt = __ballot_sync(0xffffffffu, is_tied);
      const unsigned ra = a + __popc(ba & lower_lanes), rt = t + __popc(bt & lower_lanes);
      int pos = -1;
      if (is_above) pos = ra + min(rt, need);
      if (is_tied && rt < need) pos = ra + rt;  // the first `need` tied ids make the set
      if (pos >= 0) {
        out_ids[pos] = i;
        out_vals[pos] = v[e];
      }
      a += __popc(ba);
      t += __popc(bt);
    }
  }
}

// ---- dflash2_path ------------------------------------------------------------------------------
// Block s of k rows: prev = input_ids[s * block_rows]; for row = s * k + p, p = 0..k-1, score
// each candidate j as vals[row, j] + sum_r pred[prev, r] * hproj[row, r] * succ[ids[row, j], r]
// (pred[prev] * hproj[row] once a row into shared memory, then a warp a candidate), take the best
// (ties to the lower j: candidates ascend by id, so the lower id) into out[row] and make it prev.
template <typename T>
__device__ __forceinline__ void dflash2_path_impl(const float* vals, i64 vals_stride, const int* ids,
                                                  i64 ids_stride, const T* hproj, i64 hs,
                                                  const T* __restrict__ pred, const T* __restrict__ succ,
                                                  int n_vocab, int rank, const int* input_ids,
                                                  int block_rows, int k, int top_k, int* out) {
  __shared__ float pair[PATH_MAX_RANK];
  __shared__ float score[TOPK_MAX];
  __shared__ float warp_val[PATH_WARPS];
  __shared__ int warp_j[PATH_WARPS];
  __shared__ int s_prev;
  const int s = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int prev = input_ids[(i64)s * block_rows];
  for (int p = 0; p < k; ++p) {
    const i64 row = (i64)s * k + p;
    MINILLM_CHECK(prev >= 0 && prev < n_vocab);
    for (int r = tid; r < rank; r += blockDim.x)
      pair[r] = minillm::to_f(pred[(i64)prev * rank + r]) * minillm::to_f(hproj[row * hs + r]);
    __syncthreads();
    for (int j = warp; j < top_k; j += PATH_WARPS) {
      const int c = ids[row * ids_stride + j];
      MINILLM_CHECK(c >= 0 && c < n_vocab);
      const T* sc = succ + (i64)c * rank;
      float dot = 0.f;
#pragma unroll 4
      for (int r = lane; r < rank; r += 32) dot = fmaf(minillm::to_f(sc[r]), pair[r], dot);
      dot = minillm::warp_sum(dot);
      if (lane == 0) score[j] = vals[row * vals_stride + j] + dot;
    }
    __syncthreads();
    // argmax over the block: the larger score, then the lower j
    float bv = tid < top_k ? score[tid] : minillm::neg_inf();
    int bj = tid < top_k ? tid : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oj = __shfl_xor_sync(0xffffffffu, bj, o);
      if (ov > bv || (ov == bv && oj < bj)) {
        bv = ov;
        bj = oj;
      }
    }
    if (lane == 0) {
      warp_val[warp] = bv;
      warp_j[warp] = bj;
    }
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < PATH_WARPS; ++w) {  // warps hold ascending j: a later one wins only if larger
        if (warp_val[w] > bv) {
          bv = warp_val[w];
          bj = warp_j[w];
        }
      }
      s_prev = ids[row * ids_stride + bj];
      out[row] = s_prev;
    }
    __syncthreads();
    prev = s_prev;
  }
}

}  // namespace

extern "C" __global__ void grouped_causal_conv_bf16(const bf16* x, i64 xs, const bf16* base, const bf16* dyn,
                                                    i64 ds, bf16* out, i64 os, int C, int ks, int half,
                                                    int group_size, int block_rows) {
  grouped_causal_conv_impl<bf16>(x, xs, base, dyn, ds, out, os, C, ks, half, group_size, block_rows);
}
extern "C" __global__ void grouped_causal_conv_f32(const float* x, i64 xs, const float* base, const float* dyn,
                                                   i64 ds, float* out, i64 os, int C, int ks, int half,
                                                   int group_size, int block_rows) {
  grouped_causal_conv_impl<float>(x, xs, base, dyn, ds, out, os, C, ks, half, group_size, block_rows);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    dflash2_topk(const float* logits, i64 stride, int V, int top_k, int* ids, i64 ids_stride, float* vals,
                 i64 vals_stride) {
  dflash2_topk_impl(logits, stride, V, top_k, ids, ids_stride, vals, vals_stride);
}

#define MINILLM_DFLASH2_PATH(SUFFIX, T)                                                                    \
  extern "C" __global__ void __launch_bounds__(PATH_THREADS)                                              \
      dflash2_path_##SUFFIX(const float* vals, i64 vals_stride, const int* ids, i64 ids_stride,           \
                            const T* hproj, i64 hs, const T* pred, const T* succ, int n_vocab, int rank,  \
                            const int* input_ids, int block_rows, int k, int top_k, int* out) {           \
    dflash2_path_impl<T>(vals, vals_stride, ids, ids_stride, hproj, hs, pred, succ, n_vocab, rank,        \
                         input_ids, block_rows, k, top_k, out);                                           \
  }
MINILLM_DFLASH2_PATH(bf16, bf16)
MINILLM_DFLASH2_PATH(f32, float)
