// sampling.cu: one token per logits row on the device, the twin of minillm/engine/sampler.py.
//
// Greedy (temperature <= 0) is argmax with the first index winning ties, like np.argmax.
// Otherwise the row is filtered and sampled exactly as probs_from_logits + sample_from_probs do,
// in float64 like the NumPy code, with the same splitmix64 counter-based uniform (identical bits):
//   x = logit / T;  top-k keeps x >= (k-th largest x);  p = softmax(x);
//   top-p keeps the smallest prefix of tokens in (p descending, index ascending) order whose
//   mass reaches top_p;  renormalise;  inverse CDF over tokens in index order at u * total.
// Nothing is sorted: since x and p are monotone in the fp32 logit, the k-th largest logit and the
// top-p cut-off are found by bisection over the logits' order-preserving 32-bit keys, each step a
// block-wide count or mass. Results can differ from the NumPy sampler only where float64 sums
// taken in another order fall on the other side of a boundary (near-ties).
//
// Speculative verification rides along (draft[row] = d >= 0): the drafters propose their argmax,
// so q is one-hot and rejection sampling reduces to: accept d with probability p(d) (greedy: d
// is the argmax); else draw from p without d. out[row] is then d or that draw, accepted[row]
// says which; the engine keeps the accepted prefix and the first non-accepted row's token.
//
// One CTA of SAMPLE_THREADS threads per row.
#include "common.cuh"

#define SAMPLE_THREADS 512
#define NS 15  // thresholds per search pass: the key range shrinks 16x a pass

namespace {

__device__ __forceinline__ u64 splitmix64(u64 x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// sampler.hash_uniform(seed, position, STREAM_SAMPLE): 24 bits, exact in float32 and float64.
__device__ __forceinline__ double hash_uniform(u64 seed, i64 position, u64 stream) {
  const u64 h = splitmix64(seed ^ splitmix64(((u64)position << 2) | stream));
  return (double)(h >> 40) / 16777216.0;
}

// Order-preserving map float -> uint32 (-0.0 folded onto +0.0, as NumPy compares them equal).
__device__ __forceinline__ unsigned float_key(float f) {
  if (f == 0.f) f = 0.f;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_float(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Exclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ double block_exclusive_scan(double v, double* warp_tot, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  double inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  double exc = __shfl_up_sync(0xffffffffu, inc, 1);
  if (lane == 0) exc = 0.0;
  __syncthreads();
  if (lane == 31) warp_tot[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    double t = lane < nw ? warp_tot[lane] : 0.0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    warp_tot[lane] = t;  // inclusive scan of the warp totals
  }
  __syncthreads();
  const double base = warp > 0 ? warp_tot[warp - 1] : 0.0;
  *total = warp_tot[nw - 1];
  __syncthreads();
  return base + exc;
}

// Sums v[0..NS) over the block in a fixed order; every thread gets the totals back in v.
__device__ void block_sum_n(double (&v)[NS], double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int j = 0; j < NS; ++j) v[j] = minillm::warp_sum(v[j]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < NS; ++j) red[warp * (NS + 1) + j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < NS) {
    double s = 0.0;
    for (int w = 0; w < nw; ++w) s += red[w * (NS + 1) + threadIdx.x];
    red[32 * (NS + 1) + threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NS; ++j) v[j] = red[32 * (NS + 1) + j];
  __syncthreads();
}

// (value, index) argmax over the warp; the first index wins ties.
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (v2 > v || (v2 == v && i2 < idx)) { v = v2; idx = i2; }
  }
}

// (value, index) argmax over the block; the first index wins ties.
__device__ void block_argmax(float& v, int& idx, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  warp_argmax(v, idx);
  __syncthreads();
  if (lane == 0) { sv[warp] = v; si[warp] = idx; }
  __syncthreads();
  v = lane < nw ? sv[lane] : minillm::neg_inf();
  idx = lane < nw ? si[lane] : 0x7fffffff;
  warp_argmax(v, idx);
  __syncthreads();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_tokens(const float* __restrict__ logits, i64 stride, int V,
              const float* __restrict__ temperature, const float* __restrict__ top_p,
              const int* __restrict__ top_k, const void* __restrict__ seeds, int seed_bytes,
              const int* __restrict__ positions, int* __restrict__ out,
              const int* __restrict__ draft, int* __restrict__ accepted, int n_rows) {
  __shared__ double dscratch[32];
  __shared__ double red[32 * (NS + 1) + NS];
  __shared__ float fscratch[32];
  __shared__ int iscratch[32];
  __shared__ int s_found;
  minillm::pdl_entry();
  const int row = blockIdx.x, tid = threadIdx.x, NT = blockDim.x;
  if (row >= n_rows) return;
  const float* lg = logits + (i64)row * stride;

  // ---- argmax (greedy) and the max logit
  float bv = minillm::neg_inf();
  int bi = 0x7fffffff;
  for (int i = tid; i < V; i += NT) {
    const float v = lg[i];
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
  }
  block_argmax(bv, bi, fscratch, iscratch);
  const float temp = temperature[row];
  const int d = draft ? draft[row] : -1;  // a drafted token to verify at this row, or -1
  MINILLM_CHECK(d < V);
  if (!(temp > 0.f)) {
    if (tid == 0) {
      out[row] = bi;
      if (accepted) accepted[row] = d >= 0 && d == bi;
    }
    return;
  }
  const double t = (double)temp;
  const double M = (double)bv / t;  // the max of x survives every filter
  const unsigned kmax = float_key(bv);

  // ---- top-k: the k-th largest key. A 16-way search over the key range: each pass counts the
  // keys at NS thresholds at once, so 8 passes over the row pin a 32-bit key.
  const int k = top_k[row];
  const bool use_topk = k > 0 && k < V;
  unsigned kth_key = 0;
  double kth_x = -__longlong_as_double(0x7ff0000000000000ll);  // -inf: keeps all
  if (use_topk) {
    u64 lo = 0, hi = kmax;  // invariant: count(key >= lo) >= k
    while (lo < hi) {
      const u64 range = hi - lo + 1;
      u64 th[NS];
      double c[NS];
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        th[j] = min(hi, lo + ((u64)(j + 1) * range + NS) / (NS + 1));
        c[j] = 0.0;
      }
      for (int i = tid; i < V; i += NT) {
        const unsigned key = float_key(lg[i]);
#pragma unroll
        for (int j = 0; j < NS; ++j) c[j] += key >= th[j] ? 1.0 : 0.0;
      }
      block_sum_n(c, red);
      int best = -1;  // the largest threshold still holding k keys
#pragma unroll
      for (int j = 0; j < NS; ++j)
        if (c[j] >= (double)k) best = j;
      // (selects with constant indices keep th[] in registers)
      u64 new_lo = lo, new_hi = th[0] - 1;
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        if (j == best) new_lo = th[j];
        if (j == best + 1) new_hi = th[j] - 1;  // th[best + 1] > th[best]: its count is < k
        if (best == NS - 1) new_hi = hi;
      }
      lo = new_lo;
      hi = new_hi;
    }
    kth_key = (unsigned)lo;
    kth_x = (double)key_float(kth_key) / t;
  }

  // ---- softmax normaliser over the top-k survivors
  double S = 0.0;
  for (int i = tid; i < V; i += NT) {
    const double x = (double)lg[i] / t;
    if (x >= kth_x) S += exp(x - M);
  }
  S = minillm::block_sum(S, dscratch);

  // ---- top-p: the cut-off key v_e = min key with mass(key > v_e) < top_p, then its ties.
  // 16-way search again; the mass above the current upper bound is carried, so each pass
  // takes exp() only of the tokens whose key lies inside the remaining window (lo, hi].
  const double tp = (double)top_p[row];
  const bool use_topp = tp < 1.0;
  unsigned cut_key = 0;
  int n_tie = 0;
  double S2 = 1.0;
  if (use_topp) {
    u64 lo = use_topk ? kth_key : 0u, hi = kmax;  // mass(key > kmax) = 0 < top_p
    double above = 0.0;                            // mass(key > hi)
    while (lo < hi) {
      const u64 range = hi - lo + 1;
      u64 th[NS];
      double m[NS];
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        th[j] = lo + (u64)j * range / NS;  // th[0] = lo, all < hi... or = hi for tiny ranges
        m[j] = 0.0;
      }
      for (int i = tid; i < V; i += NT) {
        const float l = lg[i];
        const unsigned key = float_key(l);
        if (key <= lo || key > hi) continue;
        const double x = (double)l / t;
        if (!(x >= kth_x)) continue;
        const double p = exp(x - M) / S;
#pragma unroll
        for (int j = 0; j < NS; ++j) m[j] += key > th[j] ? p : 0.0;
      }
      block_sum_n(m, red);
      int first = -1;  // the smallest threshold whose mass above is under top_p
#pragma unroll
      for (int j = NS - 1; j >= 0; --j)
        if (above + m[j] < tp) first = j;
      if (first < 0) {
        lo = th[NS - 1] + 1;
      } else {
        u64 new_lo = lo, new_hi = hi;
        double add = 0.0;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          if (j == first - 1) new_lo = th[j] + 1;
          if (j == first) { new_hi = th[j]; add = m[j]; }
        }
        above += add;
        lo = new_lo;
        hi = new_hi;
      }
    }
    cut_key = (unsigned)lo;
    double cnt = 0.0;
    for (int i = tid; i < V; i += NT) {
      const float l = lg[i];
      if ((double)l / t >= kth_x && float_key(l) == cut_key) cnt += 1.0;
    }
    cnt = minillm::block_sum(cnt, dscratch);
    // ties at the cut-off come in index order; each adds the same p to the running mass
    const double p_cut = exp((double)key_float(cut_key) / t - M) / S;
    double c = above;
    while (n_tie < (int)cnt && c < tp) { ++n_tie; c += p_cut; }
    S2 = c;  // the kept mass, to renormalise by
  }

  const u64 seed = seed_bytes == 8 ? reinterpret_cast<const u64*>(seeds)[row]
                                   : (u64)(i64)reinterpret_cast<const int*>(seeds)[row];
  const i64 pos = positions[row];

  // ---- speculative verification of a deterministic draft d (q = one-hot): accept with
  // probability p(d); otherwise the token is drawn below from p without d (the residual)
  if (d >= 0) {
    const float ld = lg[d];
    const double xd = (double)ld / t;
    bool keep = xd >= kth_x;
    if (keep && use_topp) {
      const unsigned kd = float_key(ld);
      keep = kd > cut_key;
      if (kd == cut_key) {  // a tie at the cut-off: kept if among the first n_tie in index order
        double before = 0.0;
        for (int i = tid; i < d; i += NT) {
          const float l = lg[i];
          if ((double)l / t >= kth_x && float_key(l) == cut_key) before += 1.0;
        }
        keep = minillm::block_sum(before, dscratch) < (double)n_tie;
      }
    }
    const double pd = keep ? exp(xd - M) / S / S2 : 0.0;
    if (hash_uniform(seed, pos, 1ull) < pd) {  // uniform over the block: every thread returns
      if (tid == 0) {
        out[row] = d;
        if (accepted) accepted[row] = 1;
      }
      return;
    }
  }
  if (tid == 0 && accepted) accepted[row] = 0;  // rejected, or no draft at this row

  // ---- from here each thread owns a contiguous chunk of indices, so index order is kept
  const int chunk = (V + NT - 1) / NT;
  const int i0 = min(V, tid * chunk), i1 = min(V, i0 + chunk);
  double tie_rank = 0.0, dummy;
  if (use_topp) {
    double mine = 0.0;
    for (int i = i0; i < i1; ++i) {
      const float l = lg[i];
      if ((double)l / t >= kth_x && float_key(l) == cut_key) mine += 1.0;
    }
    tie_rank = block_exclusive_scan(mine, dscratch, &dummy);
  }
  // weight of token i after every filter (p, or p renormalised over the top-p set)
  auto weight = [&](int i, double& rank, double S2) -> double {
    const float l = lg[i];
    const double x = (double)l / t;
    if (!(x >= kth_x)) return 0.0;
    if (use_topp) {  // decide before exp(): most tokens fall below the cut
      const unsigned key = float_key(l);
      if (key < cut_key) return 0.0;
      if (key == cut_key) {
        const bool keep = rank < (double)n_tie;
        rank += 1.0;
        if (!keep) return 0.0;
      }
      return exp(x - M) / S / S2;
    }
    return exp(x - M) / S;
  };
  double own = 0.0;
  int last_nz = -1;
  {
    double r = tie_rank;
    for (int i = i0; i < i1; ++i) {
      double w = weight(i, r, S2);  // called for d too: it advances the tie rank
      if (i == d) w = 0.0;
      own += w;
      if (w > 0.0) last_nz = i;
    }
  }
  double total;
  const double excl = block_exclusive_scan(own, dscratch, &total);
  const double u = hash_uniform(seed, pos, d >= 0 ? 2ull : 0ull);  // residual or sample stream
  const double target = u * total;
  if (tid == 0) s_found = 0;
  __syncthreads();
  if (own > 0.0 && excl <= target && target < excl + own) {
    // first index whose cumulative weight exceeds the target (searchsorted side="right")
    double r = tie_rank, c = excl;
    int pick = last_nz;
    for (int i = i0; i < i1; ++i) {
      double w = weight(i, r, S2);
      if (i == d) w = 0.0;
      c += w;
      if (w > 0.0 && c > target) { pick = i; break; }
    }
    out[row] = pick;
    s_found = 1;
  }
  __syncthreads();
  if (!s_found) {
    // target at or past the end (rounding): the last token with mass, like the NumPy clamp
    float v = (float)last_nz;
    int idx = -last_nz;  // block_argmax keeps the max value; any index will do
    block_argmax(v, idx, fscratch, iscratch);
    if (tid == 0) out[row] = v < 0.f ? bi : (int)v;
  }
}
