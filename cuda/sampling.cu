// sampling.cu: one token per logits row on the device, the twin of minillm/engine/sampler.py.
//
// Greedy (temperature <= 0) is argmax with the first index winning ties, like np.argmax.
// Otherwise the row is filtered and sampled as probs_from_logits + sample_from_probs do (top-k and
// min-p exact, top-p's masses and the draw's weights from float32 weights: "The draw" below), with the same
// splitmix64 counter-based uniform (identical bits):
//   x = logit / T;  top-k keeps x >= (k-th largest x);  min-p keeps x >= M + ln(min_p) (M = max x:
//   p >= min_p * p_max, vLLM's min_p);  p = softmax(x);
//   top-p keeps the smallest prefix of tokens in (p descending, index ascending) order whose
//   mass reaches top_p;  renormalise;  inverse CDF over tokens in index order at u * total.
// Nothing is sorted: since x and p are monotone in the fp32 logit, the k-th largest logit and the
// top-p cut-off are found by radix select over the logits' order-preserving 32-bit keys (digits of
// 12, 12 and 8 bits, integer histograms in shared memory: counts for top-k, each token's weight in
// fixed point for top-p). Top-k and min-p both keep the keys at or above a floor, so they fold
// into one (the larger key): min-p's is the smallest key whose x reaches the threshold, found by a
// binary search over the 2^32 keys (32 float64 divisions, no pass over the row: min_p_key).
// Results can differ from the NumPy sampler only where sums taken in another order (or in fixed
// point, or float32 weights) fall on the other side of a boundary (near-ties), or where log(min_p)
// rounds differently from NumPy's at a token's x exactly on min-p's threshold.
//
// Speculative verification rides along (draft[row] = d >= 0), with q one-hot (n-gram drafts,
// DFlash2's picks, greedy rows; a batch with drafts drawn from a drafter's q goes to
// verify_drawn_drafts instead, which samples its other rows as this kernel does), so rejection
// sampling reduces to: accept d with probability p(d) (greedy: d is the argmax); else
// draw from p without d. out[row] is then d or that draw, accepted[row]
// says which; the engine keeps the accepted prefix and the first non-accepted row's token.
//
// The draw (tile_masses + tile_draw, "the tiled draw" below): every kept token's weight
// exp((l - max l) / T) is computed once, in float32, in one pass that leaves the masses of 512-id
// tiles in shared memory (tile order = index order); the inverse CDF then finds the warp, the tile and
// the token by those masses, recomputing one tile. No normaliser pass is needed (u * total is the
// target). Float32 weights can move a draw only where u * total lies within ~1e-6 relative of a
// boundary. History (scripts/sampler_bench.py, docs/BENCHMARKS.md): a normaliser pass, divisions and one
// thread walking its 297-token chunk took 307 us a row (H200); float64 weights in 64-token tiles, 8
// four-byte loads in flight a lane, 68 us at one row, 92 us for 128 rows (H100, part326), ~55 us of the
// 68 the float64 exp and its two conversions a token (16 a clock an SM); this draw 24 and 51 us (part330).
// At one row one SM does the work (the passes are bound by its instructions): sample_tokens_cl8 / _cl4 /
// _cl2 split a row over a cluster's CTAs (RowSplit, below; by default cl8 up to 15 rows on an H100, -13% to
// -53% at 1-15 rows, part353 and part356; cl4 up to 30, -18% to -42%, part358-359; cl2 up to 64, -1% to -17%
// on filtered rows, part362). Where top-p's cut-off keeps only some of a run of tied logits (the
// first in index order), one more pass ranks the ties a tile (TiedRow, tie_ranks). Each
// thread walking its chunk of the row in float64 did that before, and one such row set a batch's time:
// top-p 0.9 at 128 rows (two of them with a tie at the cut) 630 -> 262 us, and on logits rounded to
// bf16 (a tie at most cut-offs) 375 -> 177 us at one row, 725 -> 271 at 128 (H100, part338). Rows of
// more than DRAW_TILE * DRAW_MAX_TILES ids are refused (cuda_ops.CudaBackend.sample, the runner).
//
// One CTA of SAMPLE_THREADS threads per row, two CTAs an SM (64 registers). One 1,024-thread CTA
// a row (twice the warps, so twice the loads in flight a row) measured a temperature row 67 -> 57 us
// at 1-64 rows but no faster at 192-256 (130 / 139 us either way) and top-p 0.9 25% slower there
// (part91): with the SMs full, the weight pass is bound by the SM's float64 work, not by latency.
// Built with SAMPLE_THREADS=1024, this file's sample_tokens is that wide kernel, which the backend takes
// for batches of at most a row an SM (MINILLM_SAMPLE_WIDE_ROWS) too large for the split: with float32
// weights it measured top-k and top-p rows 20-32% faster at 1-128 rows, temperature ~10% (H100, part346).
#include "common.cuh"
#include "radix.cuh"

#ifndef SAMPLE_THREADS  // 1024: the wide build, for small batches (MINILLM_SAMPLE_WIDE_ROWS, MINILLM_VERIFY_WIDE_ROWS)
#define SAMPLE_THREADS 512
#endif
#define SAMPLE_MAX_TILES 4096  // the radix histograms' doubles (the tiled draw's masses reuse them)
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_ISCRATCH (2 * SAMPLE_WARPS > 32 ? 2 * SAMPLE_WARPS : 32)  // block_argmax's 32, tie_ranks' two a warp
#define LOG2E_F 1.4426950408889634f

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

// The bin b where base + sum(bins >= b) first reaches need, going down from the top bin (the
// largest b with sum(bins >= b) >= need - base... as doubles), and the sum of the bins above it.
// Every thread gets both. Past the end (rounding): the lowest non-empty bin.
template <typename Bins>
__device__ void radix_crossing(int nb, const Bins* bins, double need, double* dscratch, int* s_bin,
                               int* s_first, double* s_above, int& bin, double& above) {
  const int tid = threadIdx.x, NT = blockDim.x;
  const int per = (nb + NT - 1) / NT;  // thread j: bins nb-1-j*per, ... (top down)
  double own = 0.0;
  for (int e = 0; e < per; ++e) {
    const int b = nb - 1 - (tid * per + e);
    if (b >= 0) own += (double)bins[b];
  }
  double total;
  const double excl = block_exclusive_scan(own, dscratch, &total);
  if (tid == 0) {
    *s_bin = -1;
    *s_first = NT;
  }
  __syncthreads();
  const bool holds = own > 0.0 && excl < need && need <= excl + own;
  if (holds) atomicMin(s_first, tid);  // rounding could let two neighbours claim it: the first
  __syncthreads();
  if (holds && tid == *s_first) {  // its bins top down; past them (rounding): its lowest non-empty
    double c = excl, last_c = excl;
    int last = -1;
    for (int e = 0; e < per; ++e) {
      const int b = nb - 1 - (tid * per + e);
      if (b < 0) break;
      const double v = (double)bins[b];
      if (v > 0.0) {
        if (c + v >= need) { last = b; last_c = c; break; }
        last = b;
        last_c = c;
      }
      c += v;
    }
    *s_bin = last;
    *s_above = last_c;
  }
  __syncthreads();
  if (tid == 0 && *s_bin < 0) {  // need beyond the total (rounding): the lowest non-empty bin
    int b = 0;
    while (b < nb - 1 && bins[b] == 0) ++b;
    *s_bin = b;
    *s_above = total - (double)bins[b];
  }
  __syncthreads();
  bin = *s_bin;
  above = *s_above;
  __syncthreads();
}

// Min-p's floor: the smallest key whose float l has (double)l / t >= thr (the test the NumPy sampler
// makes on x). Correctly rounded division is monotone, so over the keys of -inf .. +inf that test
// is false then true, and the tokens it keeps are exactly those whose key is at or above the
// floor: a binary search over the keys finds it, exactly, whatever the row. The floor need not be
// a token's key; for a key k >= it, (double)key_float(k) / t >= thr, so x >= key_float(floor) / t
// (the NumPy sampler's test) keeps the same tokens as key >= floor. thr <= M, so the max logit's key
// is always kept; thr = -inf (every logit -inf) keeps all.
__device__ __forceinline__ unsigned min_p_key(double thr, double t) {
  unsigned lo = float_key(minillm::neg_inf()), hi = float_key(-minillm::neg_inf());  // NaNs outside
  while (lo < hi) {  // the test holds at hi (+inf >= thr)
    const unsigned mid = lo + (hi - lo) / 2;
    if ((double)key_float(mid) / t >= thr) hi = mid; else lo = mid + 1;
  }
  return lo;
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

// Exclusive prefix sum over the warp in lane order; every lane gets its own.
__device__ __forceinline__ double warp_exclusive_scan(double v) {
  const int lane = threadIdx.x & 31;
  double inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  const double exc = __shfl_up_sync(0xffffffffu, inc, 1);
  return lane == 0 ? 0.0 : exc;
}

// Which of the warp's lanes holds the crossing: the first lane whose part (c0, its start, and w,
// its weight) has w > 0 and target < c0 + w (searchsorted side="right"), else the last lane with
// w > 0 (rounding past the end), else -1.
__device__ __forceinline__ int warp_crossing(double c0, double w, double target) {
  const unsigned hit = __ballot_sync(0xffffffffu, w > 0.0 && target < c0 + w);
  if (hit) return __ffs(hit) - 1;
  const unsigned pos = __ballot_sync(0xffffffffu, w > 0.0);
  return pos ? 31 - __clz(pos) : -1;
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

// A row's max logit bv and its argmax bi (the first index on ties): every thread gets both. 16-byte
// loads (for_each_logit; 8 scalar loads in flight a thread measured slower on the H200: 13 -> 20 us a
// row, part61; three 16-byte loads in flight slower on an H100: greedy 10.5 -> 11.1 us a call, part329).
// ids [lo, hi) only: a CTA's share of a row split over a cluster (RowSplit).
__device__ __forceinline__ void row_argmax_in(const float* __restrict__ lg, int lo, int hi, float* fscratch,
                                              int* iscratch, float& bv, int& bi) {
  bv = minillm::neg_inf();
  bi = 0x7fffffff;
  for_each_logit_in(lg, lo, hi, [&](int i, float v) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
  });
  block_argmax(bv, bi, fscratch, iscratch);
}

__device__ __forceinline__ void row_argmax(const float* __restrict__ lg, int n, float* fscratch, int* iscratch,
                                           float& bv, int& bi) {
  row_argmax_in(lg, 0, n, fscratch, iscratch, bv, bi);
}

// A kept token's weight exp((l - max l) / T) in float32, as 2^((l - max l) * k2), k2 = log2(e) / T:
// ~1e-6 relative at most where the exponent is ~ -30 (the large weights far closer), so only a draw
// within that of a boundary can differ from the float64 twin's. Float64 weights (a float64 exp and two
// conversions a token, 16 a clock an SM) took ~55 us of a 68 us temperature row (part326). -inf (ids
// past a row's end) weighs 0.
__device__ __forceinline__ float kept_weight(float l, float bv, float k2) { return exp2f((l - bv) * k2); }

// Top-p's radix passes weigh each kept token in fixed point, unit 2^62 / (V's power of two), so the
// sums fit 64 bits and are exact in any order: __float2ull_rn of the float32 weight (kept_weight, as
// the draw's), so its 24 bits of precision carry into the sums. From a float64 exponential instead a top-p
// 0.9 row took 164 -> 132 us at one row, 256 -> 223 at 128 (H100, part335).
__device__ __forceinline__ unsigned long long fixed_weight(float l, float bv, float k2, float unit) {
  return __float2ull_rn(kept_weight(l, bv, k2) * unit);
}

// *bin += v, exact, as two 32-bit shared atomics: the low word's returns its old value, whose wrap
// carries into the high word. A 64-bit shared atomicAdd compiles to a compare-and-swap loop
// (ATOMS.CAST.SPIN.64 in the SASS), which spins where many threads hit one bin: pass 0's few
// dozen occupied bins made a top-p 0.9 row 298 us at one row, 164 with these (H100, part335).
__device__ __forceinline__ void add_mass(unsigned long long* bin, unsigned long long v) {
  unsigned* w = reinterpret_cast<unsigned*>(bin);  // little-endian: w[0] the low word
  const unsigned lo = (unsigned)v, hi = (unsigned)(v >> 32);
  const unsigned carry = atomicAdd(w, lo) > 0xffffffffu - lo ? 1u : 0u;
  if (hi + carry) atomicAdd(w + 1, hi + carry);
}

// ---- the gathered list: when top-k's first pass leaves at most GATHER_CAP tokens at or above its
// crossing bin, those keys are gathered into shared memory in one pass, and top-k's k-th key and then
// top-p's cut-off are found among them there, instead of by two more passes over the row for top-k
// and three for top-p. Top-k 50 101 -> 77 us at one row, top-k 50 + top-p 0.9 182 -> 82 (324 -> 152 at
// 128 rows; H100, part337, against the passes alone). Every result is the radix passes': counts are
// exact, masses are exact 64-bit sums of the same fixed-point weights, and the list's order (atomic
// slots) decides nothing.
#define GATHER_CAP 1024

// SAMPLE_TOPP_GATHER (on; 0 for the passes alone): top-p without top-k, where its first pass's masses
// bound the keys at or above its crossing bin to at most half of GATHER_CAP (gather_may_fit; a peaked
// row: top-p 0.9 keeping tens of tokens), gathers them in one more pass and finds the cut-off among
// them, instead of two more passes: top-p 0.9 -17% to -20% on such rows, min-p + top-p -22% to -25%,
// flat rows +0.4-1% (H100, part344). Gathering inside the second pass and ranking the list in O(n^2)
// instead cost +76% on rows of ~950 such keys (part341, part342).
#ifndef SAMPLE_TOPP_GATHER
#define SAMPLE_TOPP_GATHER 1
#endif

// SAMPLE_FUSED_ARGMAX (on; 0 for a row_argmax pass of its own, for A/B runs): a sampled row with top-k
// finds its max and argmax in top-k's first radix pass, which reads the row anyway, instead of a pass of
// their own before it (row_argmax). The same values: the same comparisons in the same order. H100, 1-128
// rows (part349): top-k rows -6% at 1-64 rows and -19% to -20% at 128; top-p alone +1.4% to +3.0%,
// greedy +0.1% to +2.2% (code layout: those rows run the same passes), the other modes -0.4% to -1.7%.
#ifndef SAMPLE_FUSED_ARGMAX
#define SAMPLE_FUSED_ARGMAX 1
#endif

struct KeyList {  // key_list(): where it lives
  unsigned key[GATHER_CAP];
  unsigned long long wt[GATHER_CAP];  // list_weigh's prefix sums of fixed-point weights
  int n;
  unsigned cut, low;                  // list_cut's answer, and the lowest key with mass (its fallback)
  int ties, low_ties, found;
  unsigned long long above, low_above;
};

// Every token whose key is >= low, into L; past GATHER_CAP the count goes on and the keys are dropped
// (top-k's caller knows there are at most GATHER_CAP; top-p's then drops the list).
__device__ __forceinline__ void gather_keys(const float* __restrict__ lg, int V, unsigned low, KeyList& L) {
  if (threadIdx.x == 0) L.n = 0;
  __syncthreads();
  for_each_logit(lg, V, [&](int, float l) {
    const unsigned key = float_key(l);
    if (key >= low) {
      const int slot = atomicAdd(&L.n, 1);
      if (slot < GATHER_CAP) L.key[slot] = key;
    }
  });
  __syncthreads();
}

// The list's shared memory: past the first 4096 ints of the radix scratch (top-k's first-pass counts).
// Top-p's gather overlays its first pass's masses, which are dead by then (gather_may_fit read them).
__device__ __forceinline__ KeyList* key_list(void* scratch) {
  static_assert(4096 * sizeof(int) + sizeof(KeyList) <= SAMPLE_MAX_TILES * sizeof(double), "the list fits the scratch");
  return reinterpret_cast<KeyList*>(reinterpret_cast<int*>(scratch) + 4096);
}

// Whether top-p's gather is worth a pass: a lower bound on the kept tokens at or above pass 0's crossing
// bin, each bin's mass over the weight of its largest key (no token in it weighs more), against half
// of GATHER_CAP, as the count ran 1.4-2x the bound on N(0, s^2) rows where it was near the cap (NumPy,
// s 2.5-5 at T 0.8). A flat row (N(0, 9) logits at T 1: ~7,000 such keys) then skips a gather that
// would overflow. A heuristic only: a list that overflows anyway is dropped (one pass lost).
__device__ bool gather_may_fit(const unsigned long long* mass, int nb, int bin, int shift, float bv, float k2,
                               float unit, double* dscratch) {
  double own = 0.0;
  for (int b = bin + (int)threadIdx.x; b < nb; b += blockDim.x) {
    if (!mass[b]) continue;
    const unsigned top = ((unsigned)b << shift) | ((1u << shift) - 1u);
    const unsigned long long w = fixed_weight(key_float(top), bv, k2, unit);
    if (w) own += floor((double)mass[b] / (double)w);
  }
  return 2.0 * minillm::block_sum(own, dscratch) <= (double)GATHER_CAP;
}

// Sorts the list's n keys in descending order, in place: a bitonic sort over the next power of two
// (<= GATHER_CAP), padded with key 0, below every logit's key. ~log2(n)^2 / 2 barriers (55 at 1,024 keys).
// Ranking each key against all the others instead cost O(n^2) a block: ~100 us at 950 keys (part342).
__device__ void list_sort(KeyList& L, int n) {
  int P = 1;
  while (P < n) P <<= 1;
  for (int i = n + (int)threadIdx.x; i < P; i += blockDim.x) L.key[i] = 0u;
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < P / 2; t += blockDim.x) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;  // the pair (i, i + stride)
        const unsigned a = L.key[i], b = L.key[j];
        if ((i & size) == 0 ? a < b : a > b) {  // runs alternate; the last (size P) is descending
          L.key[i] = b;
          L.key[j] = a;
        }
      }
      __syncthreads();
    }
  }
}

// The k-th largest key of the list (k <= n, the list holding every key >= its lowest): sorts it.
__device__ unsigned list_kth(KeyList& L, int n, int k) {
  list_sort(L, n);
  return L.key[k - 1];
}

// The sorted list's (list_sort) fixed-point weights, those of keys below floor 0, as inclusive prefix
// sums from the top into L.wt; returns their total (every thread, the same). Each thread sums a
// contiguous run of items, then the runs' sums are scanned (exact: 64-bit integers).
__device__ unsigned long long list_weigh(KeyList& L, int n, unsigned floor, float bv, float k2, float unit,
                                         double* dscratch) {
  const int per = (n + blockDim.x - 1) / blockDim.x, lo = min(n, (int)threadIdx.x * per), hi = min(n, lo + per);
  unsigned long long own = 0;
  for (int i = lo; i < hi; ++i) {
    const unsigned key = L.key[i];
    L.wt[i] = key >= floor ? fixed_weight(key_float(key), bv, k2, unit) : 0ull;
    own += L.wt[i];
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  unsigned long long inc = own;  // the warp's inclusive scan of the runs' sums
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  unsigned long long* wsum = reinterpret_cast<unsigned long long*>(dscratch);  // a warp's sum each
  if (lane == 31) wsum[warp] = inc;
  __syncthreads();
  unsigned long long c = inc - own, tot = 0;
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) c += wsum[w];
    tot += wsum[w];
  }
  for (int i = lo; i < hi; ++i) {
    c += L.wt[i];
    L.wt[i] = c;
  }
  __syncthreads();  // wsum read by all before dscratch is reused, the sums written before they are read
  return tot;
}

// Top-p's cut-off among the sorted list's keys >= floor, the list holding every kept key at or above
// it, weighed (list_weigh: prefix sums, total tot): the key where the mass from the top first reaches
// need (mass above < need <= mass above + its own), the mass above it and its tie count; past the end
// (rounding), the list's lowest key with mass, as radix_crossing's fallback. Each run of ties answers
// through its first item, which finds its last by binary search.
__device__ void list_cut(KeyList& L, int n, unsigned floor, double need, unsigned long long tot, unsigned& cut,
                         double& above, int& ties) {
  if (threadIdx.x == 0) {
    L.found = 0;
    L.low = floor;  // no key with mass (a row of -inf): the floor, no ties
    L.low_above = 0;
    L.low_ties = 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const unsigned ki = L.key[i];
    if (ki < floor || (i > 0 && L.key[i - 1] == ki)) continue;
    int last = i, hi = n - 1;  // the run's last item: keys after i are <= ki
    while (last < hi) {
      const int mid = (last + hi + 1) >> 1;
      if (L.key[mid] == ki) last = mid; else hi = mid - 1;
    }
    const unsigned long long gt = i > 0 ? L.wt[i - 1] : 0ull, in = L.wt[last];
    if ((double)gt < need && need <= (double)in) {
      L.cut = ki;
      L.above = gt;
      L.ties = last - i + 1;
      L.found = 1;
    }
    if (in > gt && in == tot) {  // the lowest key with mass
      L.low = ki;
      L.low_above = gt;
      L.low_ties = last - i + 1;
    }
  }
  __syncthreads();
  const bool found = L.found;
  cut = found ? L.cut : L.low;
  above = (double)(found ? L.above : L.low_above);
  ties = found ? L.ties : L.low_ties;
  __syncthreads();  // the answers read by all before the list is reused
}

// ---- a row split over a cluster (sample_tokens_cl2 / _cl4 / _cl8, verify_drawn_drafts_cl4 / _cl8; small batches)
// One CTA a row leaves a small batch's row on one SM, bound by its instructions (the passes' compares
// and shared atomics): one top-p 0.9 row 94 us, Qwen3's defaults 57 us (H100, part349). sample_tokens_clC gives
// a row the C CTAs of a cluster (PARTS): in every pass before the draw CTA r reads only its share of the
// ids, [lo, hi); each histogram is then summed over the cluster through distributed shared memory
// (sum_bins), so every CTA holds the whole row's and finds the same crossing bin, k-th key and cut-off
// one CTA finds (exact integer sums: the same answers, by the same code); a gathered key list is merged
// the same way (gather_split) and the argmax too (cluster_argmax). The draw then splits the row's tiles
// over the cluster (WarpTiles' parts), as verify_drawn_drafts_pair does. Every DSMEM read is followed
// by a cluster barrier before its CTA's memory is written again, and the kernel ends with one, so no
// CTA leaves while another reads it. PARTS 1: one CTA, none of this (the code compiles as before).
#define SPLIT_BINS 4096  // the largest radix histogram (radix_bins)

template <int PARTS>
struct RowSplit {
  int lo, hi;                // this CTA's ids in the passes before the draw
  unsigned rank;             // its rank in the cluster
  unsigned long long* red;   // [SPLIT_BINS / PARTS]: sum_bins' sums of this CTA's share of the bins
  unsigned* stage;           // [GATHER_CAP]: gather_split's keys from this CTA's ids
  int* stage_n;              // and their count
  __device__ RowSplit(int V, unsigned long long* red_ = nullptr, unsigned* stage_ = nullptr, int* stage_n_ = nullptr)
      : red(red_), stage(stage_), stage_n(stage_n_) {
    if constexpr (PARTS == 1) {
      lo = 0;
      hi = V;
      rank = 0;
    } else {
      rank = minillm::cluster_rank();
      const int per = ((V + PARTS - 1) / PARTS + 3) & ~3;  // a multiple of 4: the 16-byte loads stay aligned
      lo = min(V, (int)rank * per);
      hi = min(V, lo + per);
    }
  }
  template <typename F>
  __device__ __forceinline__ void each(const float* __restrict__ lg, F f) const {  // f(i, l) for [lo, hi)
    for_each_logit_in(lg, lo, hi, f);
  }
  __device__ __forceinline__ bool leader() const { return threadIdx.x == 0 && rank == 0; }  // writes the row's answers
};

// A RowSplit of n ids over the one set of split scratch a kernel has (shared arrays declared in a
// function are allocated once, however often it is called): the rows of one launch share it in turn.
template <int PARTS>
__device__ __forceinline__ RowSplit<PARTS> split_of(int n) {
  static_assert(SPLIT_BINS % PARTS == 0 && 256 % PARTS == 0, "sum_bins shares every pass's bins evenly");
  __shared__ unsigned long long s_red[SPLIT_BINS / PARTS];
  __shared__ unsigned s_stage[GATHER_CAP];
  __shared__ int s_stage_n;
  return RowSplit<PARTS>(n, s_red, s_stage, &s_stage_n);
}

template <class T>
__device__ __forceinline__ T ld_cluster_bin(unsigned addr, unsigned rank) {
  if constexpr (sizeof(T) == 8) return (T)minillm::ld_cluster_u64(addr, rank);
  else return (T)minillm::ld_cluster_u32(addr, rank);
}

// Every CTA's bins[0, nb) summed over the cluster, into every CTA's bins: CTA r sums its share of the
// bins (nb / PARTS of them) from every CTA into its red, then each CTA reads every share from its owner.
// Integer sums, so the order does not matter. Every thread of the cluster calls it after its histogram's
// last atomic; the sums are published to the block when it returns. A CTA writes its red again only
// after the next call's first barrier, which the readers of this call's red reach after their reads.
template <int PARTS, class T>
__device__ void sum_bins(T* bins, int nb, const RowSplit<PARTS>& rs) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "int counts or 64-bit masses");
  if constexpr (PARTS > 1) {
    T* red = reinterpret_cast<T*>(rs.red);
    const int per = nb / PARTS;
    minillm::cluster_sync();  // every CTA's histogram done
    for (int j = threadIdx.x; j < per; j += blockDim.x) {
      const unsigned a = minillm::smem_u32(bins + rs.rank * per + j);
      T s = 0;
#pragma unroll
      for (int r = 0; r < PARTS; ++r) s += ld_cluster_bin<T>(a, (unsigned)r);
      red[j] = s;
    }
    minillm::cluster_sync();  // every share summed, and every CTA's bins read
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
      bins[b] = ld_cluster_bin<T>(minillm::smem_u32(red + b % per), (unsigned)(b / per));
    __syncthreads();
  }
}

// The block's argmax (v, idx: block_argmax's, the same in every thread) over the cluster: every thread
// gets the row's, the first index winning ties as in one CTA (the CTAs' ids ascend with their rank).
// Once a launch (its shared word is not written again).
template <int PARTS>
__device__ void cluster_argmax(float& v, int& idx) {
  if constexpr (PARTS > 1) {
    __shared__ unsigned s_arg[2];
    if (threadIdx.x == 0) {
      s_arg[0] = __float_as_uint(v);
      s_arg[1] = (unsigned)idx;
    }
    minillm::cluster_sync();
    v = minillm::neg_inf();
    idx = 0x7fffffff;
    for (int r = 0; r < PARTS; ++r) {
      const float x = __uint_as_float(minillm::ld_cluster_u32(minillm::smem_u32(s_arg), (unsigned)r));
      const int i = (int)minillm::ld_cluster_u32(minillm::smem_u32(s_arg + 1), (unsigned)r);
      if (x > v || (x == v && i < idx)) { v = x; idx = i; }
    }
  }
}

// Two values' maxima over the cluster (verify_drawn_drafts_cl4 / _cl8: p's and q's max logit), every thread the
// same. Once a launch (its shared words are not written again).
template <int PARTS>
__device__ void cluster_max2(float& a, float& b) {
  __shared__ float s_ab[2];
  if (threadIdx.x == 0) {
    s_ab[0] = a;
    s_ab[1] = b;
  }
  minillm::cluster_sync();
  a = b = minillm::neg_inf();
  for (int r = 0; r < PARTS; ++r) {
    a = fmaxf(a, __uint_as_float(minillm::ld_cluster_u32(minillm::smem_u32(s_ab), (unsigned)r)));
    b = fmaxf(b, __uint_as_float(minillm::ld_cluster_u32(minillm::smem_u32(s_ab + 1), (unsigned)r)));
  }
}

// gather_keys over a split row: each CTA gathers its ids' keys >= low into its stage, then every CTA
// copies every stage, in rank order, into its list; L.n gets the cluster's count, and past GATHER_CAP
// no key is copied (gather_keys' callers then drop the list). Every thread of the cluster calls it.
template <int PARTS>
__device__ void gather_split(const float* __restrict__ lg, const RowSplit<PARTS>& rs, unsigned low, KeyList& L) {
  if (threadIdx.x == 0) *rs.stage_n = 0;
  __syncthreads();
  rs.each(lg, [&](int, float l) {
    const unsigned key = float_key(l);
    if (key >= low) {
      const int slot = atomicAdd(rs.stage_n, 1);
      if (slot < GATHER_CAP) rs.stage[slot] = key;
    }
  });
  minillm::cluster_sync();  // every stage filled
  // the counts are read twice (8 DSMEM loads at most): held in an array they cost the wide cl8 build 12 more
  // bytes of spill stores and 60 of spill loads
  int n = 0;
  for (int r = 0; r < PARTS; ++r) n += (int)minillm::ld_cluster_u32(minillm::smem_u32(rs.stage_n), (unsigned)r);
  if (n <= GATHER_CAP) {
    int base = 0;
    for (int r = 0; r < PARTS; ++r) {
      const int c = (int)minillm::ld_cluster_u32(minillm::smem_u32(rs.stage_n), (unsigned)r);
      for (int j = threadIdx.x; j < c; j += blockDim.x)
        L.key[base + j] = minillm::ld_cluster_u32(minillm::smem_u32(rs.stage + j), (unsigned)r);
      base += c;
    }
  }
  if (threadIdx.x == 0) L.n = n;
  minillm::cluster_sync();  // every stage read before it is filled again; the list published
}

template <int PARTS>
__device__ __forceinline__ void gather_row(const float* __restrict__ lg, int V, const RowSplit<PARTS>& rs,
                                           unsigned low, KeyList& L) {
  if constexpr (PARTS == 1) gather_keys(lg, V, low, L); else gather_split(lg, rs, low, L);
}

// A sampled row's filters (temperature t > 0, max logit bv): top-k and min-p as one floor on the
// key, then top-p's cut-off key and how many of its tied tokens it keeps (in index order). Every
// thread of the block calls it and gets the same values. scratch: SAMPLE_MAX_TILES doubles of
// shared memory for the radix histograms.
struct RowFilter {
  unsigned kth_key;       // the top-k / min-p floor (0: none)
  bool use_floor, use_topp, tie_cut;
  unsigned cut_key;       // top-p's cut-off key
  int n_tie;              // its tied tokens kept, the first in index order
  // the tiled draw keeps key >= this (when !tie_cut)
  __device__ unsigned min_key() const { return use_topp ? cut_key : use_floor ? kth_key : 0u; }
};

// fused (SAMPLE_FUSED_ARGMAX, a top-k row; bv comes in unset): the row's max and argmax are found in
// top-k's first pass as row_argmax finds them (fscratch, iscratch: block_argmax's scratch) and left in
// *fused_bv, *fused_bi; otherwise bv is the row's max. rs: the ids this CTA reads (PARTS > 1: a row split
// over a cluster, whose every thread calls it).
template <int PARTS = 1>
__device__ __forceinline__ void filter_row(const float* __restrict__ lg, int V, float bv, float* fused_bv,
                                           int* fused_bi, bool fused, double t, const int* __restrict__ top_k,
                                           const float* __restrict__ min_p, const float* __restrict__ top_p, int row,
                                           RowFilter& f, void* scratch,
                                           double* dscratch, int* s_bin, int* s_first, double* s_above,
                                           float* fscratch, int* iscratch, const RowSplit<PARTS>& rs) {
  const int tid = threadIdx.x, NT = blockDim.x;
#if !SAMPLE_FUSED_ARGMAX
  const double M = (double)bv / t;  // the max of x survives every filter
#endif

  // ---- top-k: the k-th largest key, by radix select (three passes over the row)
  const int k = top_k[row];
  const bool use_topk = k > 0 && k < V;
  unsigned kth_key = 0;
  int* hist = reinterpret_cast<int*>(scratch);
  KeyList* L = key_list(scratch);
  bool gathered = false;  // top-k's list holds every kept token
  if (use_topk) {
    unsigned prefix = 0;
    double need = (double)k;  // rank among the keys that share the prefix
    for (int pass = 0; pass < 3; ++pass) {
      const int nb = radix_bins(pass), shift = radix_shift(pass);
      const unsigned mask = radix_mask(pass);
      for (int b = tid; b < nb; b += NT) hist[b] = 0;
      __syncthreads();
#if SAMPLE_FUSED_ARGMAX
      if (fused && pass == 0) {  // row_argmax's loop and reduction, beside the first histogram
        int bi = 0x7fffffff;
        bv = minillm::neg_inf();
        rs.each(lg, [&](int i, float l) {
          if (l > bv || (l == bv && i < bi)) { bv = l; bi = i; }
          const unsigned key = float_key(l);
          if ((key & mask) == prefix) atomicAdd(hist + ((key >> shift) & (nb - 1)), 1);
        });
        block_argmax(bv, bi, fscratch, iscratch);  // its barriers publish the histogram
        cluster_argmax<PARTS>(bv, bi);
        *fused_bv = bv;
        *fused_bi = bi;
      } else
#endif
      rs.each(lg, [&](int, float l) {
        const unsigned key = float_key(l);
        // ATOMS.POPC.INC: the hardware adds a warp's increments of one bin at once (counts aggregated
        // first by __match_any_sync measured slower: top-k 50 101 -> 230 us at one row, part335)
        if ((key & mask) == prefix) atomicAdd(hist + ((key >> shift) & (nb - 1)), 1);
      });
      __syncthreads();
      sum_bins(hist, nb, rs);
      int bin;
      double above;
      radix_crossing(nb, hist, need, dscratch, s_bin, s_first, s_above, bin, above);
      if (pass == 0) {
        const int n = (int)above + hist[bin];  // the tokens at or above the bin (every thread the same)
        __syncthreads();  // hist[bin] read by all before the next pass zeroes it
        if (n <= GATHER_CAP) {
          gather_row(lg, V, rs, (unsigned)bin << shift, *L);
          prefix = list_kth(*L, n, k);
          gathered = true;
          break;
        }
      }
      prefix |= (unsigned)bin << shift;
      need -= above;
    }
    kth_key = prefix;
  }
#if SAMPLE_FUSED_ARGMAX
  const double M = (double)bv / t;  // the max of x survives every filter
#endif

  // ---- min-p (min_p null or 0: off): keep x >= M + ln(min_p), the keys at or above min_p_key.
  // Like top-k's it is a floor on the key, so the two fold into one: the stricter (larger) wins,
  // and everything below (top-p's radix select over key >= kth_key, the draws' key >= min_key)
  // filters by it alike.
  const float mp = min_p ? min_p[row] : 0.f;
  const bool use_minp = mp > 0.f;
  if (use_minp) {
    kth_key = max(kth_key, min_p_key(M + log((double)mp), t));
  }
  const bool use_floor = use_topk || use_minp;  // kth_key filters the row

  const double tp = (double)top_p[row];
  const bool use_topp = tp < 1.0;

  // ---- top-p: the cut-off key v = min key with mass(key > v) < top_p, then its ties. Radix
  // select again, over each kept token's weight exp(x - M) in fixed point (fixed_weight, add_mass):
  // the bin where the mass from the top first reaches top_p. Only the first pass weighs every token;
  // the last one's bins are single keys, so it also counts the cut-off's ties. With SAMPLE_TOPP_GATHER
  // a row whose first pass leaves few keys at or above its bin gathers them instead (gather_may_fit,
  // gather_keys), and the cut-off is found among them (list_cut) without the other two passes.
  unsigned cut_key = 0;
  int n_tie = 0;
  bool tie_cut = false;  // the cut-off keeps only some of its tied tokens: the draw ranks them (TiedRow)
  if (use_topp) {
    unsigned long long* mass = reinterpret_cast<unsigned long long*>(scratch);
    int* ties = reinterpret_cast<int*>(mass + radix_bins(2));  // the last pass's counts a bin
    const float unit = __int_as_float((127 + 62 - (32 - __clz(V))) << 23), k2 = LOG2E_F / (float)t;
    unsigned prefix = 0;
    double need = 0.0, above = 0.0, total = 0.0;
    int cnt = 0;
    if (gathered) {  // the list holds every kept token, sorted (list_kth)
      const unsigned long long tot = list_weigh(*L, L->n, kth_key, bv, k2, unit, dscratch);
      total = (double)tot;
      list_cut(*L, L->n, kth_key, tp * total, tot, prefix, above, cnt);
    }
    for (int pass = 0; pass < (gathered ? 0 : 3); ++pass) {
      const int nb = radix_bins(pass), shift = radix_shift(pass);
      const unsigned mask = radix_mask(pass);
      for (int b = tid; b < nb; b += NT) mass[b] = 0ull;
      if (pass == 2)
        for (int b = tid; b < nb; b += NT) ties[b] = 0;
      __syncthreads();
      rs.each(lg, [&](int, float l) {
        const unsigned key = float_key(l);
        if ((key & mask) == prefix && key >= kth_key) {
          const int b = (key >> shift) & (nb - 1);
          const unsigned long long v = fixed_weight(l, bv, k2, unit);
          // most of a real row's tail weighs 0 in fixed point. Leaving pass 0's light tokens out of the
          // bins too (SAMPLE_TOPP_LIGHT, part345) made peaked rows 4-9% faster, N(0, 9) rows 3-5.5% slower.
          if (v) add_mass(mass + b, v);
          if (pass == 2) atomicAdd(ties + b, 1);  // the last pass's bins are single keys
        }
      });
      __syncthreads();
      sum_bins(mass, nb, rs);
      if (pass == 2) sum_bins(ties, nb, rs);
      if (pass == 0) {  // the kept mass: every bin of the first pass
        double own = 0.0;
        for (int b = tid; b < nb; b += NT) own += (double)mass[b];
        total = minillm::block_sum(own, dscratch);
        need = tp * total;
      }
      int bin;
      double a;
      radix_crossing(nb, mass, need - above, dscratch, s_bin, s_first, s_above, bin, a);
      prefix |= (unsigned)bin << shift;
      above += a;  // mass of the keys above the prefix found so far
      if (SAMPLE_TOPP_GATHER && pass == 0 && gather_may_fit(mass, nb, bin, shift, bv, k2, unit, dscratch)) {
        gather_row(lg, V, rs, max(prefix, kth_key), *L);  // the kept keys at or above pass 0's bin
        const int n = L->n;  // every thread the same (gather_keys ends with a barrier)
        __syncthreads();  // n read by all before pass 1 zeroes the masses the list overlays (racecheck, part343)
        if (n <= GATHER_CAP) {  // the list holds every kept key at or above the cut-off
          list_sort(*L, n);
          const unsigned long long tot = list_weigh(*L, n, kth_key, bv, k2, unit, dscratch);
          list_cut(*L, n, kth_key, need, tot, prefix, above, cnt);
          break;
        }
      }
      if (pass == 2) cnt = ties[bin];  // the tokens whose key is the cut-off (radix_crossing synced)
    }
    __syncthreads();  // ties[bin] read by all before the scratch is reused (verify_drawn_drafts filters two rows)
    cut_key = prefix;
    // ties at the cut-off come in index order; each adds the same p to the running mass
    const double p_cut = (double)fixed_weight(key_float(cut_key), bv, k2, unit) / total;
    double c = above / total;
    while (n_tie < cnt && c < tp) { ++n_tie; c += p_cut; }
    tie_cut = n_tie < cnt;
  }

  f = RowFilter{kth_key, use_floor, use_topp, tie_cut, cut_key, n_tie};
}


// ---- the tiled draw, shared by sample_tokens and verify_drawn_drafts ------------------------------
// A row is cut into tiles of DRAW_TILE consecutive ids; each warp owns a contiguous run of tiles,
// so a warp's ids come in index order (the order the draw walks and ties at a top-p cut-off are
// ranked in). A warp loads a whole tile before it computes any of it: DRAW_GROUP steps of one
// 16-byte load a lane a row. One pass leaves each tile's mass and each warp's in shared memory; the
// draw then finds the target's warp, its tile (lanes scanning runs of tiles), and recomputes that
// one tile. The weights and a tile's mass are float32 sums (Src::weights); every sum of tiles is
// float64.
// A source of weights (Src): Tile, a tile's loaded logits; Carry, what a warp carries from step to
// step (the tie ranks at a top-p cut-off); load(tt, tile); weights(tile, g, i, carry, r): a lane's 4
// weights of step g (ids i..i+3), moving the carry past the step; carry_at(tt): the carry at the
// start of tile tt, one of this warp's.
#define DRAW_GROUP 4                        // steps a warp loads before it computes them
#define DRAW_STEP 128                       // ids a warp step: 4 a lane
#define DRAW_TILE (DRAW_STEP * DRAW_GROUP)  // 512 ids
#define DRAW_MAX_TILES 2048                 // rows up to 1,048,576 ids take the tiled draw
static_assert(SAMPLE_MAX_TILES >= 2 * DRAW_MAX_TILES, "the tiles' masses and ranks share the histograms' memory");

// ids i..i+3 (i a multiple of 4) of a row of n ids: one 16-byte load where the row is 16-byte aligned
// (vec); ids from n on read -inf (weight 0) and load nothing
__device__ __forceinline__ float4 load_ids4(const float* __restrict__ lg, int i, int n, bool vec) {
  if (vec && i + 3 < n) return *reinterpret_cast<const float4*>(lg + i);
  const float ninf = minillm::neg_inf();
  return make_float4(i < n ? lg[i] : ninf, i + 1 < n ? lg[i + 1] : ninf, i + 2 < n ? lg[i + 2] : ninf,
                     i + 3 < n ? lg[i + 3] : ninf);
}

// A lane's share of tile tt: DRAW_GROUP steps of 4 ids. A whole tile in range of an aligned row loads
// without a branch between its loads, so all of them are in flight before the first is used (with a
// branch a load, each merging its two ways, a q-draft row took 182 us, 171 without: part327, part329).
__device__ __forceinline__ void load_tile(const float* __restrict__ lg, int tt, int n, bool vec,
                                          float4 (&v)[DRAW_GROUP]) {
  const int i0 = tt * DRAW_TILE + 4 * (threadIdx.x & 31);
  if (vec && (tt + 1) * DRAW_TILE <= n) {
#pragma unroll
    for (int g = 0; g < DRAW_GROUP; ++g) v[g] = *reinterpret_cast<const float4*>(lg + i0 + g * DRAW_STEP);
  } else {
#pragma unroll
    for (int g = 0; g < DRAW_GROUP; ++g) v[g] = load_ids4(lg, i0 + g * DRAW_STEP, n, vec);
  }
}

__device__ __forceinline__ bool aligned16(const float* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }

// A row's tiles and the run of them this warp owns. A row split over the `parts` CTAs of a cluster
// (verify_drawn_drafts_pair's passes after the filters) numbers its warps CTA by CTA: this CTA's are
// w0 .. w0 + NW - 1 of nw, and each CTA keeps its own tiles' masses (s_mass) in its shared memory.
struct WarpTiles {
  int n_tiles, tpw, lo, hi, w0, nw;
  __device__ WarpTiles(int V, int part = 0, int parts = 1) {
    const int NW = blockDim.x >> 5;
    w0 = part * NW;
    nw = parts * NW;
    const int warp = w0 + (threadIdx.x >> 5);
    n_tiles = (V + DRAW_TILE - 1) / DRAW_TILE;
    tpw = (n_tiles + nw - 1) / nw;
    lo = min(n_tiles, warp * tpw);
    hi = min(n_tiles, lo + tpw);
  }
  __device__ int first_id(int tt, int g) const { return tt * DRAW_TILE + g * DRAW_STEP + 4 * (threadIdx.x & 31); }
};

// One tile's mass (every lane of the warp gets it), a float32 sum.
template <class Src>
__device__ __forceinline__ double tile_mass(const Src& src, const WarpTiles& wt, int tt, typename Src::Carry& c) {
  typename Src::Tile tile;
  src.load(tt, tile);
  float m = 0.f;
#pragma unroll
  for (int g = 0; g < DRAW_GROUP; ++g) {
    float r[4];
    src.weights(tile, g, wt.first_id(tt, g), c, r);
    m += (r[0] + r[1]) + (r[2] + r[3]);
  }
  return (double)minillm::warp_sum(m);
}

// Each CTA of a row split over PARTS CTAs (WarpTiles) reads the other CTAs' warp masses from their
// s_wmass into its own, so every CTA holds all wt.nw of them. Every thread of the cluster calls it.
__device__ void gather_warp_masses(double* s_wmass, const WarpTiles& wt) {
  const int NW = blockDim.x >> 5, part = wt.w0 / NW;
  minillm::cluster_sync();  // every CTA's written
  for (int w = threadIdx.x; w < wt.nw; w += blockDim.x)
    if (w / NW != part) s_wmass[w] = minillm::ld_cluster_f64(minillm::smem_u32(s_wmass + w), (unsigned)(w / NW));
  minillm::cluster_sync();  // read before any CTA writes its own again or leaves; the copies published
}

// Every tile's mass into s_mass, each warp's into s_wmass; returns the row's mass (every thread, the
// same value). Every thread of the block calls it; PARTS > 1: of the cluster (a split row, WarpTiles),
// each CTA's tiles into its own s_mass, every warp's mass into every CTA's s_wmass.
template <class Src, int PARTS = 1>
__device__ double tile_masses(const Src& src, const WarpTiles& wt, double* s_mass, double* s_wmass) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  typename Src::Carry c = wt.lo < wt.hi ? src.carry_at(wt.lo) : typename Src::Carry{};
  double wm = 0.0;
  for (int tt = wt.lo; tt < wt.hi; ++tt) {
    const double tm = tile_mass(src, wt, tt, c);
    if (lane == 0) s_mass[tt] = tm;
    wm += tm;
  }
  __syncthreads();  // the previous readers of s_wmass are done
  if (lane == 0) s_wmass[wt.w0 + warp] = wm;
  __syncthreads();
  if constexpr (PARTS > 1) gather_warp_masses(s_wmass, wt);
  double total = 0.0;  // every thread (of every CTA), the same order
  for (int w = 0; w < wt.nw; ++w) total += s_wmass[w];
  return total;
}

// Tile tt's mass again after src changed (a rejected one-hot draft now weighs 0), and its warp's
// mass, summed in tile_masses' order. Every thread of the block calls it; PARTS > 1: of the cluster (a
// split row, WarpTiles), the CTA holding the tile redoes it and every CTA copies the warps' masses again.
template <class Src, int PARTS = 1>
__device__ double retile(const Src& src, const WarpTiles& wt, int tt, double* s_mass, double* s_wmass) {
  const int warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
  const int owner = tt / wt.tpw;  // numbered over the cluster
  const bool mine = PARTS == 1 || (owner >= wt.w0 && owner < wt.w0 + NW);  // a warp of this CTA
  if ((PARTS == 1 ? warp : wt.w0 + warp) == owner) {  // its own tile: carry_at is this warp's
    typename Src::Carry c = src.carry_at(tt);
    const double tm = tile_mass(src, wt, tt, c);
    if ((threadIdx.x & 31) == 0) s_mass[tt] = tm;
  }
  __syncthreads();
  if (threadIdx.x == 0 && mine) {
    double wm = 0.0;
    for (int t = owner * wt.tpw; t < min(wt.n_tiles, (owner + 1) * wt.tpw); ++t) wm += s_mass[t];
    s_wmass[owner] = wm;
  }
  __syncthreads();
  if constexpr (PARTS > 1) gather_warp_masses(s_wmass, wt);
  double total = 0.0;
  for (int w = 0; w < (PARTS == 1 ? NW : wt.nw); ++w) total += s_wmass[w];
  return total;
}

// The first id with mass whose running mass passes target (searchsorted side="right"; rounding past
// its tile's end: that tile's last id with mass) into *slot, by one warp. target < the row's mass
// (u < 1), which sums s_wmass in this order, so some warp holds it and, but for the lanes' runs
// summing in another order (then: the warp's last tile with mass), some tile: fallback (nothing kept)
// is not reached. Every thread of the block calls it after tile_masses; no barrier after it. A split
// row (WarpTiles): every CTA calls it, the one whose warp holds the target draws.
template <class Src>
__device__ void tile_draw(const Src& src, const WarpTiles& wt, double target, const double* s_mass,
                          const double* s_wmass, int fallback, int* slot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int wsel = -1;  // the warp whose range holds the target (uniform over the block, and the cluster)
  double base = 0.0, c = 0.0;
  for (int w = 0; w < wt.nw; ++w) {
    const double m = s_wmass[w];
    if (wsel < 0 && m > 0.0 && target < c + m) { wsel = w; base = c; }
    c += m;
  }
  if (wsel < 0) {
    if (threadIdx.x == 0 && wt.w0 == 0) *slot = fallback;
    return;
  }
  if (wt.w0 + warp != wsel) return;
  // its tile: lanes sum consecutive runs of the warp's tiles, the crossing lane walks its run
  const int per = (wt.hi - wt.lo + 31) / 32, ra = min(wt.hi, wt.lo + lane * per), rb = min(wt.hi, ra + per);
  double ls = 0.0;
  for (int tt = ra; tt < rb; ++tt) ls += s_mass[tt];
  const double lc0 = base + warp_exclusive_scan(ls);
  const int lsel = warp_crossing(lc0, ls, target);
  int tsel = -1;
  double tc0 = 0.0;
  if (lane == lsel) {
    double cc = lc0, lastc = 0.0;
    int lastt = -1;
    for (int tt = ra; tt < rb; ++tt) {
      const double ts = s_mass[tt];
      if (ts > 0.0) {
        if (target < cc + ts) { tsel = tt; tc0 = cc; break; }
        lastt = tt;
        lastc = cc;
      }
      cc += ts;
    }
    if (tsel < 0) { tsel = lastt; tc0 = lastc; }
  }
  tsel = __shfl_sync(0xffffffffu, tsel, lsel < 0 ? 0 : lsel);
  tc0 = __shfl_sync(0xffffffffu, tc0, lsel < 0 ? 0 : lsel);
  if (tsel < 0) {
    if (lane == 0) *slot = fallback;
    return;
  }
  // that tile again, step by step; else (rounding) its last id with mass
  typename Src::Carry carry = src.carry_at(tsel);
  typename Src::Tile tile;
  src.load(tsel, tile);
  double cb = tc0;
  int pick = -1, last = -1;
#pragma unroll
  for (int g = 0; g < DRAW_GROUP; ++g) {
    const int i = wt.first_id(tsel, g);
    float r[4];
    src.weights(tile, g, i, carry, r);  // every step: the carry moves on
    if (pick >= 0) continue;
    const double mine = (double)((r[0] + r[1]) + (r[2] + r[3]));  // as tile_mass sums them
    double inc = mine;  // inclusive scan over the step's lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, mine > 0.0 && target < cb + inc);
    int lane_pick = -1, lane_last = -1;
    double ce = cb + inc - mine;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ce += r[e];
      if (r[e] > 0.f) {
        if (lane_pick < 0 && target < ce) lane_pick = i + e;
        lane_last = i + e;
      }
    }
    if (lane_pick < 0) lane_pick = lane_last;  // rounding within the lane's ids
    if (hit) pick = __shfl_sync(0xffffffffu, lane_pick, __ffs(hit) - 1);
    last = max(last, __reduce_max_sync(0xffffffffu, lane_last + 1) - 1);
    cb += __shfl_sync(0xffffffffu, inc, 31);
  }
  if (lane == 0) *slot = pick >= 0 ? pick : last;
}

// The float below which a filter's floor key drops a logit (key 0: keeps all): float_key(l) >= key
// exactly when l >= key_float(key) (both fold -0 onto +0), a float compare in the passes.
__device__ __forceinline__ float floor_logit(unsigned key) { return key ? key_float(key) : minillm::neg_inf(); }

// sample_tokens' source: one row's kept tokens (l >= floor) and skip (a rejected one-hot draft)
// weighing 0
struct SampledRow {
  const float* lg;
  int n;
  bool vec;
  float floor, k2, bv;
  int skip;
  struct Tile { float4 v[DRAW_GROUP]; };
  struct Carry {};
  __device__ __forceinline__ float weight(float l) const { return l >= floor ? kept_weight(l, bv, k2) : 0.f; }
  __device__ __forceinline__ void load(int tt, Tile& t) const { load_tile(lg, tt, n, vec, t.v); }
  __device__ __forceinline__ void weights(const Tile& t, int g, int i, Carry&, float r[4]) const {
    const float4 v = t.v[g];
    r[0] = i == skip ? 0.f : weight(v.x);
    r[1] = i + 1 == skip ? 0.f : weight(v.y);
    r[2] = i + 2 == skip ? 0.f : weight(v.z);
    r[3] = i + 3 == skip ? 0.f : weight(v.w);
  }
  __device__ __forceinline__ Carry carry_at(int) const { return {}; }
};

struct KeptRow {  // a filtered row's kept tokens and their weights exp((l - max l) / T)
  const float* lg;
  int n;     // ids from n on weigh 0 (a drafter's smaller vocabulary)
  bool vec;  // 16-byte aligned
  RowFilter f;
  float k2, bv;  // log2(e) / T and the row's max logit
  float floor;   // top-k's / min-p's floor as a logit (floor_logit)
  __device__ __forceinline__ bool tie(float l, bool valid) const {  // a token at top-p's cut-off key
    return f.use_topp && valid && float_key(l) == f.cut_key;
  }
  __device__ __forceinline__ int ties4(float4 v, int i) const {  // ids i..i+3's ties
    return tie(v.x, i < n) + tie(v.y, i + 1 < n) + tie(v.z, i + 2 < n) + tie(v.w, i + 3 < n);
  }
  // a kept token's weight (kept_weight); rank: the tokens tied at the cut-off before it (index
  // order), read for a tie
  __device__ __forceinline__ float weight(float l, int rank) const {
    if (!(l >= floor)) return 0.f;
    if (f.use_topp) {
      const unsigned key = float_key(l);
      if (key < f.cut_key || (key == f.cut_key && rank >= f.n_tie)) return 0.f;
    }
    return kept_weight(l, bv, k2);
  }
  // the weights of one lane's 4 ids from i in one warp step; rank: the warp's ties before the step,
  // moved past it (the same in every lane)
  __device__ __forceinline__ void step(float4 v, int i, int& rank, float w[4]) const {
    const float l[4] = {v.x, v.y, v.z, v.w};
    if (!f.use_topp) {  // uniform over the block
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = weight(l[e], 0);
      return;
    }
    const unsigned below = (1u << (threadIdx.x & 31)) - 1u;
    bool t[4];
    int before = 0, all = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      t[e] = tie(l[e], i + e < n);
      const unsigned b = __ballot_sync(0xffffffffu, t[e]);
      before += __popc(b & below);
      all += __popc(b);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // this lane's ids come after every earlier lane's
      w[e] = weight(l[e], rank + before);
      before += t[e];
    }
    rank += all;
  }
};

// sample_tokens' source where top-p's cut-off keeps only some of its tied tokens (RowFilter::tie_cut):
// KeptRow's weights, the ties ranked in index order from each tile's rank (tie_ranks), and skip (a
// rejected one-hot draft) weighing 0.
struct TiedRow {
  KeptRow P;
  int r0;             // the ties before this warp's range
  const int* s_rank;  // the ties before each tile within its warp
  int skip;
  struct Tile { float4 v[DRAW_GROUP]; };
  struct Carry { int r; };
  __device__ __forceinline__ void load(int tt, Tile& t) const { load_tile(P.lg, tt, P.n, P.vec, t.v); }
  __device__ __forceinline__ void weights(const Tile& t, int g, int i, Carry& c, float r[4]) const {
    P.step(t.v[g], i, c.r, r);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (i + e == skip) r[e] = 0.f;
  }
  __device__ __forceinline__ Carry carry_at(int tt) const { return {r0 + s_rank[tt]}; }
  __device__ __forceinline__ void count_ties(const Tile& t, int g, int i, int n[2]) const {
    n[0] += P.ties4(t.v[g], i);
  }
};

// The ties at top-p's cut-off, ranked in index order for the draw: s_rank[r * DRAW_MAX_TILES + tt]
// gets the ties of the source's row r (0: p; 1: a drafter's q, or none) before tile tt within its
// warp, base[r] those before this warp's range. Src::count_ties(tile, g, i, n) adds a step's. Every
// thread of the block calls it; its barrier publishes s_rank.
template <class Src>
__device__ void tie_ranks(const Src& src, const WarpTiles& wt, int* s_rank, int* iscratch, int base[2]) {
  static_assert(SAMPLE_WARPS <= 32, "one warp sums the warps' counts");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int c0 = 0, c1 = 0;
  for (int tt = wt.lo; tt < wt.hi; ++tt) {
    if (lane == 0) {
      s_rank[tt] = c0;
      s_rank[DRAW_MAX_TILES + tt] = c1;
    }
    typename Src::Tile tile;
    src.load(tt, tile);
    int n[2] = {0, 0};
#pragma unroll
    for (int g = 0; g < DRAW_GROUP; ++g) src.count_ties(tile, g, wt.first_id(tt, g), n);
    c0 += __reduce_add_sync(0xffffffffu, n[0]);
    c1 += __reduce_add_sync(0xffffffffu, n[1]);
  }
  if (lane == 0) {
    iscratch[warp] = c0;
    iscratch[SAMPLE_WARPS + warp] = c1;
  }
  __syncthreads();
  base[0] = base[1] = 0;
  for (int w = 0; w < warp; ++w) {
    base[0] += iscratch[w];
    base[1] += iscratch[SAMPLE_WARPS + w];
  }
}

// After tie_ranks over a row split by tiles (WarpTiles' parts): the ties in the earlier CTAs' tiles (their
// warps' counts, tie_ranks' in iscratch), added to base; rank: this CTA's. Every thread of the cluster calls it.
template <int PARTS>
__device__ void add_earlier_ties(const int* iscratch, int base[2], unsigned rank) {
  __shared__ __align__(16) int s_ties[4];  // [0], [1] read as one 16-byte load
  if (threadIdx.x == 0) {
    int n0 = 0, n1 = 0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) {
      n0 += iscratch[w];
      n1 += iscratch[SAMPLE_WARPS + w];
    }
    s_ties[0] = n0;
    s_ties[1] = n1;
  }
  minillm::cluster_sync();
#pragma unroll
  for (int r = 0; r < PARTS - 1; ++r) {
    if ((unsigned)r < rank) {
      const uint4 v = minillm::ld_cluster_u4(minillm::smem_u32(s_ties), (unsigned)r);  // s_ties[0], [1]
      base[0] += (int)v.x;
      base[1] += (int)v.y;
    }
  }
  minillm::cluster_sync();  // read before any CTA goes on
}

// How many of a row's ids before d have the key `key` (the whole block counts them).
__device__ int key_count_before(const float* __restrict__ lg, int d, unsigned key, double* dscratch) {
  double n = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) n += float_key(lg[i]) == key ? 1.0 : 0.0;
  return (int)minillm::block_sum(n, dscratch);
}

// sample_tokens' draw from src's weights; a drafted d (q one-hot, weight wd) first: accepted with
// probability p(d) = wd / total, else the token comes from p without d. Every thread of the block
// calls it; PARTS > 1: of the cluster (a split row, WarpTiles), its first CTA writing the answers.
template <int PARTS = 1, class Src>
__device__ void draw_row(Src& src, const WarpTiles& wt, float wd, int d, u64 seed, i64 pos, int bi,
                         double* s_tile, double* s_warp, int* out, int* accepted, int row) {
  auto leader = [&]() { return threadIdx.x == 0 && (PARTS == 1 || wt.w0 == 0); };  // the first CTA's
  double total = tile_masses<Src, PARTS>(src, wt, s_tile, s_warp);
  if (d >= 0) {
    if (hash_uniform(seed, pos, 1ull) < (double)wd / total) {  // uniform over the block (cluster): all return
      if (leader()) {
        out[row] = d;
        if (accepted) accepted[row] = 1;
      }
      return;
    }
    src.skip = d;
    total = retile<Src, PARTS>(src, wt, d / DRAW_TILE, s_tile, s_warp);
  }
  if (leader() && accepted) accepted[row] = 0;  // rejected, or no draft at this row
  tile_draw(src, wt, hash_uniform(seed, pos, d >= 0 ? 2ull : 0ull) * total, s_tile, s_warp, bi, out + row);
}

// One row's shared scratch, declared by each kernel that samples rows (sample_tokens, and
// verify_drawn_drafts for its rows without a drawn draft). Pointers to separate arrays, not one struct
// in shared memory: that one (a base and offsets) compiled sample_tokens with 68 bytes of spill loads
// against 36
struct SampleShared {
  double* dscratch;  // [32]
  double* s_above;
  float* fscratch;  // [32]
  int* iscratch;    // [SAMPLE_ISCRATCH]
  int *s_bin, *s_first;
  double* s_tile;  // [SAMPLE_MAX_TILES]: the radix histograms, then the tiled draw's masses
  double* s_warp;  // [SAMPLE_WARPS]; a row split over a cluster: every CTA's warps
};

// sample_tokens' row: argmax; greedy, or the filters and the draw (with draft[row], a one-hot draft or
// -1, verified on the way). Every thread of the block calls it; PARTS > 1: of the cluster (RowSplit).
template <int PARTS = 1>
__device__ __forceinline__ void sample_row(const float* __restrict__ lg, int V, int row, const int* __restrict__ draft,
                                           const float* __restrict__ temperature, const float* __restrict__ top_p,
                                           const int* __restrict__ top_k, const float* __restrict__ min_p,
                                           const void* __restrict__ seeds, int seed_bytes,
                                           const int* __restrict__ positions, int* __restrict__ out,
                                           int* __restrict__ accepted, const SampleShared& sh,
                                           const RowSplit<PARTS>& rs) {
  // ---- argmax (greedy) and the max logit
#if SAMPLE_FUSED_ARGMAX
  float bv = 0.f;  // set by row_argmax, or by filter_row (fused)
  int bi = 0;
  const float temp = temperature[row];
  const bool fused = temp > 0.f && top_k[row] > 0 && top_k[row] < V;  // found in top-k's first pass
  if (!fused) {
    row_argmax_in(lg, rs.lo, rs.hi, sh.fscratch, sh.iscratch, bv, bi);
    cluster_argmax<PARTS>(bv, bi);
  }
#else
  float bv;
  int bi;
  const bool fused = false;
  row_argmax_in(lg, rs.lo, rs.hi, sh.fscratch, sh.iscratch, bv, bi);
  cluster_argmax<PARTS>(bv, bi);
  const float temp = temperature[row];
#endif
  const int d = draft ? draft[row] : -1;  // a drafted token to verify at this row, or -1
  MINILLM_CHECK(d < V && V <= DRAW_TILE * DRAW_MAX_TILES);
  if (!(temp > 0.f)) {
    if (rs.leader()) {
      out[row] = bi;
      if (accepted) accepted[row] = d >= 0 && d == bi;
    }
    return;
  }
  RowFilter f;
  filter_row(lg, V, bv, &bv, &bi, fused, (double)temp, top_k, min_p, top_p, row, f, sh.s_tile, sh.dscratch,
             sh.s_bin, sh.s_first, sh.s_above, sh.fscratch, sh.iscratch, rs);
  const u64 seed = seed_bytes == 8 ? reinterpret_cast<const u64*>(seeds)[row]
                                   : (u64)(i64)reinterpret_cast<const int*>(seeds)[row];
  const i64 pos = positions[row];
  const WarpTiles wt(V, (int)rs.rank, PARTS);
  const float k2 = LOG2E_F / temp;
  __syncthreads();  // the radix histograms (s_tile) are done with
  if (!f.tie_cut) {  // keep key >= cut-off (top-p, after top-k / min-p) or >= the floor
    SampledRow src{lg, V, aligned16(lg), floor_logit(f.min_key()), k2, bv, -1};
    draw_row<PARTS>(src, wt, d >= 0 ? src.weight(lg[d]) : 0.f, d, seed, pos, bi, sh.s_tile, sh.s_warp, out,
                    accepted, row);
    return;
  }
  // top-p's cut-off keeps the first n_tie of its tied tokens in index order: a pass ranks them a tile.
  // Out of line (__noinline__) sample_tokens compiled without spills (12 bytes stored, 76 loaded here),
  // but top-p rows ran 3-5% slower and temperature rows at most 2% faster (part339): inline.
  int* s_rank = reinterpret_cast<int*>(sh.s_tile + DRAW_MAX_TILES);
  TiedRow src{{lg, V, aligned16(lg), f, k2, bv, floor_logit(f.kth_key)}, 0, s_rank, -1};
  int base[2];
  tie_ranks(src, wt, s_rank, sh.iscratch, base);
  if constexpr (PARTS > 1) add_earlier_ties<PARTS>(sh.iscratch, base, rs.rank);
  src.r0 = base[0];
  float wd = 0.f;
  if (d >= 0) {  // d's weight, a tie ranked by the ties before it (uniform over the block)
    const float ld = lg[d];
    wd = src.P.weight(ld, src.P.tie(ld, true) ? key_count_before(lg, d, f.cut_key, sh.dscratch) : 0);
  }
  draw_row<PARTS>(src, wt, wd, d, seed, pos, bi, sh.s_tile, sh.s_warp, out, accepted, row);
}

}  // namespace

namespace {

// sample_tokens' body: row blockIdx.x / PARTS, on PARTS CTAs (a cluster: RowSplit) or one.
template <int PARTS>
__device__ __forceinline__ void sample_tokens_row(const float* __restrict__ logits, i64 stride, int V,
                                                  const float* __restrict__ temperature, const float* __restrict__ top_p,
                                                  const int* __restrict__ top_k, const float* __restrict__ min_p,
                                                  const void* __restrict__ seeds, int seed_bytes,
                                                  const int* __restrict__ positions, int* __restrict__ out,
                                                  const int* __restrict__ draft, int* __restrict__ accepted,
                                                  int n_rows) {
  __shared__ double dscratch[32];
  __shared__ double s_above;
  __shared__ float fscratch[32];
  __shared__ int iscratch[SAMPLE_ISCRATCH];
  __shared__ int s_bin, s_first;
  __shared__ double s_tile[SAMPLE_MAX_TILES];
  __shared__ double s_warp[PARTS * SAMPLE_WARPS];  // a split row's: every CTA's warps
  const SampleShared sh{dscratch, &s_above, fscratch, iscratch, &s_bin, &s_first, s_tile, s_warp};
  minillm::pdl_entry();
  const int row = blockIdx.x / PARTS;  // the same for the whole cluster
  if (row >= n_rows) return;
  const float* lg = logits + (i64)row * stride;
  if constexpr (PARTS == 1) {
    sample_row(lg, V, row, draft, temperature, top_p, top_k, min_p, seeds, seed_bytes, positions, out, accepted, sh,
               RowSplit<1>(V));
  } else {
    sample_row<PARTS>(lg, V, row, draft, temperature, top_p, top_k, min_p, seeds, seed_bytes, positions, out,
                      accepted, sh, split_of<PARTS>(V));
    minillm::cluster_sync();  // no CTA leaves while another may still read its shared memory
  }
}

}  // namespace

// the three kernels' parameters and sample_tokens_row's arguments
#define SAMPLE_TOKENS_PARAMS                                                                                  \
  const float *__restrict__ logits, i64 stride, int V, const float *__restrict__ temperature,                 \
      const float *__restrict__ top_p, const int *__restrict__ top_k, const float *__restrict__ min_p,       \
      const void *__restrict__ seeds, int seed_bytes, const int *__restrict__ positions, int *__restrict__ out, \
      const int *__restrict__ draft, int *__restrict__ accepted, int n_rows
#define SAMPLE_TOKENS_ARGS \
  logits, stride, V, temperature, top_p, top_k, min_p, seeds, seed_bytes, positions, out, draft, accepted, n_rows

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, SAMPLE_THREADS > 512 ? 1 : 2)
sample_tokens(SAMPLE_TOKENS_PARAMS) {
  sample_tokens_row<1>(SAMPLE_TOKENS_ARGS);
}

// The same with a row split over a cluster of 2, 4 or 8 CTAs (grid 2, 4 or 8 n_rows; RowSplit), for small
// batches (CudaBackend.sample: MINILLM_SAMPLE_CLUSTER_ROWS for 8, MINILLM_SAMPLE_CLUSTER4_ROWS for 4,
// MINILLM_SAMPLE_CLUSTER2_ROWS for 2: each tier up to about the clusters the GPU holds at once). Built at 512
// threads only: at 1,024 (64 registers, spills) the split measured slower at every batch (H100, part352).
#if SAMPLE_THREADS == 512
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(SAMPLE_THREADS, 1)
sample_tokens_cl2(SAMPLE_TOKENS_PARAMS) {
  sample_tokens_row<2>(SAMPLE_TOKENS_ARGS);
}

extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(SAMPLE_THREADS, 1)
sample_tokens_cl4(SAMPLE_TOKENS_PARAMS) {
  sample_tokens_row<4>(SAMPLE_TOKENS_ARGS);
}

extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(SAMPLE_THREADS, 1)
sample_tokens_cl8(SAMPLE_TOKENS_PARAMS) {
  sample_tokens_row<8>(SAMPLE_TOKENS_ARGS);
}
#endif

// ---- verify_drawn_drafts: drafts drawn from the drafter's q, verified against that q ------------
// The twin of sampler.sample with draft_rows (DFlash or the draft model drawing drafts at temperature
// > 0). It takes every row of the batch in place of sample_tokens: a row with draft_rows[b] >= 0 (and
// a draft, at temperature > 0) is verified against q here; any other row is sample_tokens' row
// (sample_row: greedy, or drawn, with a one-hot draft verified). One launch: until session 65
// sample_tokens ran first on every row, whose drafted rows this kernel then redid, so a round waited
// for a whole sample_tokens (~24-107 us a row at small batches) for nothing: a call 22-33% shorter
// (part347). p: the target's row under the row's temperature and filters; q: the drafter's row
// q_logits[q_rows[row]] (QV <= V ids, the rest weigh 0) under the same, as the drafter's own
// sample_tokens drew d from it. d is accepted with probability min(1, p(d) / q(d)) (u * q(d) < p(d),
// u on the accept stream); otherwise the token is drawn from max(p - q, 0) (the residual stream), or
// from p where that has no mass (rounding).
//
// The tiled draw's layout (above): one pass for both rows' max; each row's filters (filter_row, only
// where it has one; at small batches p's and q's on two CTAs, verify_drawn_drafts_pair); the ties at
// each top-p cut-off before each tile (only with top-p); both rows' kept mass and d's weights; if d is
// rejected, the residual's tile masses and the draw. A tile of both rows is loaded before any of it is
// computed (eight 16-byte loads in flight a lane). The first layout
// (each warp 32 ids a step, one 4-byte load a row in flight, float64 weights, the draw walking a warp's
// whole range) took 557 us a row at one row, 387 at 8 (temperature; sampler_bench.py, H100, part326).
namespace {

// verify_drawn_drafts' source for the tiled draw: the residual max(p - q, 0), or p (from_p)
struct DraftResidual {
  KeptRow P, Q;
  float inv_zp, inv_zq;
  bool from_p;
  int rp0, rq0;        // the ties before this warp's range
  const int* s_rank;   // [2][DRAW_MAX_TILES]: the ties before each tile within its warp (null: no top-p)
  struct Tile { float4 a[DRAW_GROUP], b[DRAW_GROUP]; };
  struct Carry { int rp, rq; };
  __device__ __forceinline__ void load(int tt, Tile& t) const {
    if (P.vec && Q.vec && (tt + 1) * DRAW_TILE <= Q.n) {  // Q.n <= P.n: eight loads, no branch between
      const int i0 = tt * DRAW_TILE + 4 * (threadIdx.x & 31);
#pragma unroll
      for (int g = 0; g < DRAW_GROUP; ++g) {
        t.a[g] = *reinterpret_cast<const float4*>(P.lg + i0 + g * DRAW_STEP);
        t.b[g] = *reinterpret_cast<const float4*>(Q.lg + i0 + g * DRAW_STEP);
      }
    } else {
      load_tile(P.lg, tt, P.n, P.vec, t.a);
      load_tile(Q.lg, tt, Q.n, Q.vec, t.b);
    }
  }
  __device__ __forceinline__ void weights(const Tile& t, int g, int i, Carry& c, float r[4]) const {
    float wp[4], wq[4];
    P.step(t.a[g], i, c.rp, wp);
    Q.step(t.b[g], i, c.rq, wq);
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = from_p ? wp[e] * inv_zp : fmaxf(wp[e] * inv_zp - wq[e] * inv_zq, 0.f);
  }
  __device__ __forceinline__ Carry carry_at(int tt) const {
    return s_rank ? Carry{rp0 + s_rank[tt], rq0 + s_rank[DRAW_MAX_TILES + tt]} : Carry{rp0, rq0};
  }
  __device__ __forceinline__ void count_ties(const Tile& t, int g, int i, int n[2]) const {
    n[0] += P.ties4(t.a[g], i);
    n[1] += Q.ties4(t.b[g], i);
  }
};

__device__ __forceinline__ float max4(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }

}  // namespace

namespace {

// verify_drawn_drafts' row. PARTS 2 (PAIR): the row is a cluster of two CTAs; CTA r finds row r's (p's,
// q's) max and filters and the two swap their answers through distributed shared memory. Then the two
// split every later pass over both rows (the ties' ranks, the kept masses, the residual's) by tiles, half
// each (WarpTiles' parts), swapping their sums the same way, and the CTA whose tiles hold the draw draws:
// -26% to -28% at 1-8 rows and -11% to -20% at 64 against CTA 1 leaving after the filters (H100,
// part350). The rows without a drawn draft CTA 0 alone. PARTS 4 or 8 (SPLIT): a cluster of that many; p's
// max and filters, then q's, each with its ids split over all of them as sample_tokens_clC splits a row
// (RowSplit: the two in turn, since every CTA must pass the same cluster barriers and the filters' passes
// depend on the row), then every later pass split by tiles over the cluster; the rows without a drawn
// draft are sample_tokens_clC's rows. PARTS 1: one CTA does all of it.
template <int PARTS>
__device__ __forceinline__ void verify_row(const float* __restrict__ logits, i64 stride, int V,
                                           const float* __restrict__ q_logits, i64 q_stride, int QV,
                                           const float* __restrict__ temperature, const float* __restrict__ top_p,
                                           const int* __restrict__ top_k, const float* __restrict__ min_p,
                                           const void* __restrict__ seeds, int seed_bytes,
                                           const int* __restrict__ positions, const int* __restrict__ draft,
                                           const int* __restrict__ q_rows, int* __restrict__ out,
                                           int* __restrict__ accepted, int n_rows) {
  constexpr bool PAIR = PARTS == 2, SPLIT = PARTS > 2;
  __shared__ double dscratch[32];
  __shared__ double s_above;
  __shared__ float fscratch[32];
  __shared__ int iscratch[SAMPLE_ISCRATCH];
  __shared__ int s_bin, s_first;
  // the radix histograms; then [0, DRAW_MAX_TILES) each tile's residual mass and, as ints from
  // DRAW_MAX_TILES doubles on, each tile's ties before it within its warp (p's, then q's)
  __shared__ double s_tile[SAMPLE_MAX_TILES];
  __shared__ double s_wd[2];  // d's weights in p and q
  __shared__ double s_wmass[PARTS * SAMPLE_WARPS];  // a cluster's: every CTA's warps
  minillm::pdl_entry();
  const int row = PAIR ? blockIdx.x >> 1 : blockIdx.x / PARTS, tid = threadIdx.x;
  if (row >= n_rows) return;
  const int d = draft[row], qr = q_rows[row];
  const float temp = temperature[row];
  const float* lp = logits + (i64)row * stride;
  if (d < 0 || qr < 0 || !(temp > 0.f)) {  // no draft drawn from q: sample_tokens' row (d one-hot, or none)
    if (PAIR && minillm::cluster_rank() != 0) return;  // the pair's first CTA samples it alone
    const SampleShared sh{dscratch, &s_above, fscratch, iscratch, &s_bin, &s_first, s_tile, s_wmass};
    if constexpr (SPLIT) {
      sample_row<PARTS>(lp, V, row, draft, temperature, top_p, top_k, min_p, seeds, seed_bytes, positions, out,
                        accepted, sh, split_of<PARTS>(V));
      minillm::cluster_sync();  // no CTA leaves while another may still read its shared memory
    } else {
      sample_row(lp, V, row, draft, temperature, top_p, top_k, min_p, seeds, seed_bytes, positions, out, accepted,
                 sh, RowSplit<1>(V));
    }
    return;
  }
  MINILLM_CHECK(d < V && QV <= V && V <= DRAW_TILE * DRAW_MAX_TILES);
  const float* lq = q_logits + (i64)qr * q_stride;
  const double t = (double)temp;
  WarpTiles wt(V);
  const float k2 = LOG2E_F / temp, ninf = minillm::neg_inf();
  DraftResidual R{{lp, V, aligned16(lp), {}, k2, 0.f, ninf}, {lq, QV, aligned16(lq), {}, k2, 0.f, ninf},
                  0.f, 0.f, false, 0, 0, nullptr};
  KeptRow &P = R.P, &Q = R.Q;

  const bool filtered = top_k[row] > 0 || (min_p && min_p[row] > 0.f) || top_p[row] < 1.f;  // uniform
  const unsigned rank = PARTS > 1 ? minillm::cluster_rank() : 0u;
  if constexpr (SPLIT) {
    // ---- p's max and filters, then q's, each row's ids split over the cluster
    const RowSplit<PARTS> sp = split_of<PARTS>(V), sq = split_of<PARTS>(QV);
    float bp, bq;
    int ignored;
    row_argmax_in(lp, sp.lo, sp.hi, fscratch, iscratch, bp, ignored);
    row_argmax_in(lq, sq.lo, sq.hi, fscratch, iscratch, bq, ignored);
    cluster_max2<PARTS>(bp, bq);
    P.bv = bp;
    Q.bv = bq;
    if (filtered) {
      filter_row(lp, V, bp, nullptr, nullptr, false, t, top_k, min_p, top_p, row, P.f, s_tile, dscratch, &s_bin,
                 &s_first, &s_above, fscratch, iscratch, sp);
      filter_row(lq, QV, bq, nullptr, nullptr, false, t, top_k, min_p, top_p, row, Q.f, s_tile, dscratch, &s_bin,
                 &s_first, &s_above, fscratch, iscratch, sq);
      P.floor = P.f.use_floor ? floor_logit(P.f.kth_key) : ninf;
      Q.floor = Q.f.use_floor ? floor_logit(Q.f.kth_key) : ninf;
    } else {
      P.f = Q.f = RowFilter{0u, false, false, false, 0u, 0};
    }
    wt = WarpTiles(V, (int)rank, PARTS);
  } else if constexpr (PAIR) {
    // ---- CTA r: row r's max and filters; each reads the other's from its shared memory
    __shared__ uint4 s_pub[2];  // {kth_key, cut_key, n_tie, max}, {use_floor, use_topp, tie_cut, 0}
    const float* lr = rank ? lq : lp;
    const int nr = rank ? QV : V;
    float b;
    int ignored;
    row_argmax(lr, nr, fscratch, iscratch, b, ignored);
    RowFilter f{0u, false, false, false, 0u, 0};
    if (filtered)
      filter_row(lr, nr, b, nullptr, nullptr, false, t, top_k, min_p, top_p, row, f, s_tile, dscratch, &s_bin,
                 &s_first, &s_above, fscratch, iscratch, RowSplit<1>(nr));
    if (tid == 0) {
      s_pub[0] = make_uint4(f.kth_key, f.cut_key, (unsigned)f.n_tie, __float_as_uint(b));
      s_pub[1] = make_uint4(f.use_floor, f.use_topp, f.tie_cut, 0u);
    }
    minillm::cluster_sync();  // both published
    const uint4 a = minillm::ld_cluster_u4(minillm::smem_u32(&s_pub[0]), rank ^ 1u);
    const uint4 c = minillm::ld_cluster_u4(minillm::smem_u32(&s_pub[1]), rank ^ 1u);
    minillm::cluster_sync();  // read before either CTA goes on
    KeptRow &mine = rank ? Q : P, &other = rank ? P : Q;
    mine.bv = b;
    mine.f = f;
    other.bv = __uint_as_float(a.w);
    other.f = RowFilter{a.x, c.x != 0u, c.y != 0u, c.z != 0u, a.y, (int)a.z};
    if (filtered) {
      P.floor = P.f.use_floor ? floor_logit(P.f.kth_key) : ninf;
      Q.floor = Q.f.use_floor ? floor_logit(Q.f.kth_key) : ninf;
    }
    wt = WarpTiles(V, (int)rank, 2);
  } else {
    // ---- both rows' max
    float bp = minillm::neg_inf(), bq = minillm::neg_inf();
    for (int tt = wt.lo; tt < wt.hi; ++tt) {
      DraftResidual::Tile tile;
      R.load(tt, tile);
#pragma unroll
      for (int g = 0; g < DRAW_GROUP; ++g) {
        bp = fmaxf(bp, max4(tile.a[g]));
        bq = fmaxf(bq, max4(tile.b[g]));
      }
    }
    {
      int ignored = 0;
      block_argmax(bp, ignored, fscratch, iscratch);
      block_argmax(bq, ignored, fscratch, iscratch);
    }
    P.bv = bp;
    Q.bv = bq;
    // ---- the filters (none, the radix selects, or min-p's floor), as sample_tokens filters its rows
    if (filtered) {
      filter_row(lp, V, bp, nullptr, nullptr, false, t, top_k, min_p, top_p, row, P.f, s_tile, dscratch, &s_bin,
                 &s_first, &s_above, fscratch, iscratch, RowSplit<1>(V));
      filter_row(lq, QV, bq, nullptr, nullptr, false, t, top_k, min_p, top_p, row, Q.f, s_tile, dscratch, &s_bin,
                 &s_first, &s_above, fscratch, iscratch, RowSplit<1>(QV));
      P.floor = P.f.use_floor ? floor_logit(P.f.kth_key) : ninf;
      Q.floor = Q.f.use_floor ? floor_logit(Q.f.kth_key) : ninf;
    } else {
      P.f = Q.f = RowFilter{0u, false, false, false, 0u, 0};
    }
  }
  __syncthreads();  // the radix histograms are done with

  // ---- the ties at each top-p cut-off before each tile within its warp, and before each warp
  if (P.f.use_topp || Q.f.use_topp) {
    int* s_rank = reinterpret_cast<int*>(s_tile + DRAW_MAX_TILES);
    int base[2];
    tie_ranks(R, wt, s_rank, iscratch, base);
    if constexpr (PARTS > 1) add_earlier_ties<PARTS>(iscratch, base, rank);  // CTA r's warps after CTA r - 1's
    R.rp0 = base[0];
    R.rq0 = base[1];
    R.s_rank = s_rank;
  }

  // ---- both rows' kept mass (a tile's in float32, the tiles' in float64), and d's weights
  double zp = 0.0, zq = 0.0;
  {
    DraftResidual::Carry c{R.rp0, R.rq0};
    for (int tt = wt.lo; tt < wt.hi; ++tt) {
      DraftResidual::Tile tile;
      R.load(tt, tile);
      float sp = 0.f, sq = 0.f;
#pragma unroll
      for (int g = 0; g < DRAW_GROUP; ++g) {
        const int i = wt.first_id(tt, g);
        float wp[4], wq[4];
        P.step(tile.a[g], i, c.rp, wp);
        Q.step(tile.b[g], i, c.rq, wq);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sp += wp[e];
          sq += wq[e];
          if (i + e == d) {
            s_wd[0] = wp[e];
            s_wd[1] = wq[e];
          }
        }
      }
      zp += sp;
      zq += sq;
    }
  }
  zp = minillm::block_sum(zp, dscratch);  // its barriers publish s_wd
  zq = minillm::block_sum(zq, dscratch);
  double wdp = s_wd[0], wdq = s_wd[1];
  if constexpr (PAIR) {  // each CTA's sums, added in CTA order in both; d's weights from the CTA whose tiles hold d
    __shared__ double s_z[2];
    if (tid == 0) {
      s_z[0] = zp;
      s_z[1] = zq;
    }
    minillm::cluster_sync();
    const unsigned other = rank ^ 1u, owner = (unsigned)((d / DRAW_TILE) / wt.tpw / SAMPLE_WARPS);
    const double op = minillm::ld_cluster_f64(minillm::smem_u32(&s_z[0]), other);
    const double oq = minillm::ld_cluster_f64(minillm::smem_u32(&s_z[1]), other);
    wdp = minillm::ld_cluster_f64(minillm::smem_u32(&s_wd[0]), owner);
    wdq = minillm::ld_cluster_f64(minillm::smem_u32(&s_wd[1]), owner);
    minillm::cluster_sync();  // read before either CTA leaves
    zp = rank ? op + zp : zp + op;
    zq = rank ? oq + zq : zq + oq;
  } else if constexpr (SPLIT) {  // the same over the cluster: every CTA adds the sums in rank order
    __shared__ double s_z[2];
    if (tid == 0) {
      s_z[0] = zp;
      s_z[1] = zq;
    }
    minillm::cluster_sync();
    const unsigned owner = (unsigned)((d / DRAW_TILE) / wt.tpw / SAMPLE_WARPS);
    zp = zq = 0.0;
    for (int r = 0; r < PARTS; ++r) {
      zp += minillm::ld_cluster_f64(minillm::smem_u32(&s_z[0]), (unsigned)r);
      zq += minillm::ld_cluster_f64(minillm::smem_u32(&s_z[1]), (unsigned)r);
    }
    wdp = minillm::ld_cluster_f64(minillm::smem_u32(&s_wd[0]), owner);
    wdq = minillm::ld_cluster_f64(minillm::smem_u32(&s_wd[1]), owner);
    minillm::cluster_sync();  // read before any CTA leaves
  }
  const u64 seed = seed_bytes == 8 ? reinterpret_cast<const u64*>(seeds)[row]
                                   : (u64)(i64)reinterpret_cast<const int*>(seeds)[row];
  const i64 pos = positions[row];
  const double pd = wdp / zp, qd = zq > 0.0 ? wdq / zq : 0.0;
  if (hash_uniform(seed, pos, 1ull) * qd < pd) {  // uniform over the block (the cluster): every thread returns
    if (tid == 0 && rank == 0) {
      out[row] = d;
      accepted[row] = 1;
    }
    return;
  }

  // ---- rejected: the residual max(p - q, 0), or p where it has no mass (rounding), and the draw
  R.inv_zp = (float)(1.0 / zp);
  R.inv_zq = zq > 0.0 ? (float)(1.0 / zq) : 0.f;
  auto masses = [&]() {
    return tile_masses<DraftResidual, PARTS>(R, wt, s_tile, s_wmass);
  };
  double total = masses();
  if (!(total > 0.0)) {  // the same for every thread (of the cluster)
    R.from_p = true;
    total = masses();
  }
  if (tid == 0 && rank == 0) accepted[row] = 0;
  tile_draw(R, wt, hash_uniform(seed, pos, 2ull) * total, s_tile, s_wmass, d, out + row);
}

}  // namespace

// the three kernels' parameters (sample_tokens' plus the drafter's rows) and verify_row's arguments
#define VERIFY_PARAMS                                                                                          \
  const float *__restrict__ logits, i64 stride, int V, const float *__restrict__ q_logits, i64 q_stride, int QV, \
      const float *__restrict__ temperature, const float *__restrict__ top_p, const int *__restrict__ top_k,    \
      const float *__restrict__ min_p, const void *__restrict__ seeds, int seed_bytes,                          \
      const int *__restrict__ positions, const int *__restrict__ draft, const int *__restrict__ q_rows,         \
      int *__restrict__ out, int *__restrict__ accepted, int n_rows
#define VERIFY_ARGS                                                                                          \
  logits, stride, V, q_logits, q_stride, QV, temperature, top_p, top_k, min_p, seeds, seed_bytes, positions, draft, \
      q_rows, out, accepted, n_rows

// grid n_rows, SAMPLE_THREADS threads (512: one CTA an SM, room for 128 registers; the wide build's 1,024
// for small batches, MINILLM_VERIFY_WIDE_ROWS: 64 registers, ~300 bytes of spills)
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1) verify_drawn_drafts(VERIFY_PARAMS) {
  verify_row<1>(VERIFY_ARGS);
}

// the same with two CTAs a row (grid 2 n_rows, clusters of two): p's filters beside q's (verify_row<2>),
// for batches of at most half an SM a row (CudaBackend.sample)
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(SAMPLE_THREADS, 1)
verify_drawn_drafts_pair(VERIFY_PARAMS) {
  verify_row<2>(VERIFY_ARGS);
}

// the same with a row split over a cluster of eight CTAs (grid 8 n_rows; verify_row<8>), for small batches
// (CudaBackend.sample: MINILLM_VERIFY_CLUSTER_ROWS), and over four (verify_row<4>) for the batches past
// those whose clusters of four still run at once (MINILLM_VERIFY_CLUSTER4_ROWS). Built at 512 threads only,
// as sample_tokens_cl4 / _cl8.
#if SAMPLE_THREADS == 512
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(SAMPLE_THREADS, 1)
verify_drawn_drafts_cl8(VERIFY_PARAMS) {
  verify_row<8>(VERIFY_ARGS);
}

extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(SAMPLE_THREADS, 1)
verify_drawn_drafts_cl4(VERIFY_PARAMS) {
  verify_row<4>(VERIFY_ARGS);
}
#endif
