// sampling.cu: one token per logits row on the device, the twin of minillm/engine/sampler.py.
//
// Greedy (temperature <= 0) is argmax with the first index winning ties, like np.argmax.
// Otherwise the row is filtered and sampled exactly as probs_from_logits + sample_from_probs do,
// in float64 like the NumPy code, with the same splitmix64 counter-based uniform (identical bits):
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
// point) fall on the other side of a boundary (near-ties), or where log(min_p) rounds differently
// from NumPy's at a token's x exactly on min-p's threshold.
//
// Speculative verification rides along (draft[row] = d >= 0): the drafters propose their argmax,
// so q is one-hot and rejection sampling reduces to: accept d with probability p(d) (greedy: d
// is the argmax); else draw from p without d. out[row] is then d or that draw, accepted[row]
// says which; the engine keeps the accepted prefix and the first non-accepted row's token.
//
// The draw (sample_from_tiles): every kept token's weight exp(x - M) in float64 is computed once,
// in one pass that leaves the sums of 64-token tiles in shared memory (tile order = index order);
// the inverse CDF then walks warps, tiles and tokens by those sums, one warp at the end. No
// normaliser pass is needed (u * total is the target), so a temperature-only row costs one float64
// exp a token. The H200 measured the earlier layout (a normaliser pass, divisions, then one thread
// walking its 297-token chunk serially) at 307 us a row and 750 us for 192 rows, 10% of a
// throughput-workload decode step (scripts/sampler_bench.py, docs/BENCHMARKS.md); its 16-way
// bisections took top-k 50 to 837 us a row and top-p 0.9 to 1,299 (now 69, 119 and 322 us a row;
// 131 us for 192 temperature rows, part69). What is left is mostly the passes' loads (the
// argmax's, then the weights'; top-p's three radix passes and tie count): one pass keeping a
// reference max per tile, with more loads in flight, is the next step. Rows whose top-p cut-off falls
// inside a run of tied logits (ties kept in index order), or whose vocabulary is over
// SAMPLE_TILE * SAMPLE_MAX_TILES, still take that serial draw (the end of sample_tokens).
//
// One CTA of SAMPLE_THREADS threads per row, two CTAs an SM (64 registers). One 1,024-thread CTA
// a row (twice the warps, so twice the loads in flight a row) measured a temperature row 67 -> 57 us
// at 1-64 rows but no faster at 192-256 (130 / 139 us either way) and top-p 0.9 25% slower there
// (part91): with the SMs full, the weight pass is bound by the SM's float64 work, not by latency.
#include "common.cuh"
#include "radix.cuh"

#define SAMPLE_THREADS 512
#define SAMPLE_TILE 64  // tokens a tile (two a lane); tile sums live in shared memory
#define SAMPLE_MAX_TILES 4096  // vocabularies up to 262,144 take the tiled draw
#define SAMPLE_GROUP 4  // tiles a warp loads before it computes (memory-level parallelism)
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)

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
// (the serial draw's test) keeps the same tokens as key >= floor. thr <= M, so the max logit's key
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

// e^x for the weights (x <= ~0) in float64, within a few ulp of exp() (~1.3 ulp on 6,000 points
// checked against exp on the CPU) in ~12 float64 operations instead of exp()'s ~25 (the draw takes
// one a token). Measured gain small: a temperature-only row 74 -> 71 us (part62 -> part66), and
// none from dropping rint (part70), so the pass is bound by its loads more than by exp. x = (256 k + j) ln2 / 256 + r with |r| <= ln2 / 512
// (Cody-Waite, ln2 in two parts), e^x = 2^k * 2^(j / 256) * e^r, 2^(j / 256) from a table in shared memory (exp2 by the
// CTA's first 256 threads), e^r by its degree-5 Taylor polynomial (|r|^6 / 720 < 1e-20). Below
// -708 (e^x < 1e-307): 0.
__device__ __forceinline__ double exp_weight(double x, const double* exp2_tab) {
  if (x < -708.0) return 0.0;
  // n = rint(x * 256 / ln 2) without rint or a conversion (both slow on the float64 pipe): adding
  // 1.5 * 2^52 rounds to an integer (to even, as rint), whose low 32 bits are n's two's complement
  const double tn = fma(x, 369.3299304675746, 6755399441055744.0);
  const double n = tn - 6755399441055744.0;
  double r = fma(n, -0.00270760617331689, x);                          // ln2_hi / 256 (exact products)
  r = fma(n, -7.453964567463233e-13, r);                               // ln2_lo / 256
  double p = fma(r, 1.0 / 120.0, 1.0 / 24.0);
  p = fma(p, r, 1.0 / 6.0);
  p = fma(p, r, 0.5);
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  const int ni = __double2loint(tn), j = ni & 255, k = ni >> 8;       // k = floor(n / 256) >= -1022
  return exp2_tab[j] * __longlong_as_double((long long)(k + 1023) << 52) * p;
}

// The draw's weight of a token with logit l: exp(x - M) for x = l / T (as l * (1 / T)) when its
// key survives the top-k / top-p filters (key >= min_key; 0 keeps all), else 0.
__device__ __forceinline__ double tok_weight(float l, unsigned min_key, double inv_t, double M,
                                             const double* exp2_tab) {
  return float_key(l) >= min_key ? exp_weight(fma((double)l, inv_t, -M), exp2_tab) : 0.0;
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

// The draw from the kept tokens' weights (tok_weight), with the draft verification: see the top
// of the file. tile / warp_tot: shared memory of SAMPLE_MAX_TILES / SAMPLE_WARPS doubles. Every
// thread of the block calls it; it ends with warp 0 alone (no barrier after that).
__device__ void sample_from_tiles(const float* __restrict__ lg, int V, unsigned min_key, double inv_t,
                                  double M, int d, u64 seed, i64 pos, int fallback, int* out,
                                  int* accepted, int row, double* tile, double* warp_tot,
                                  const double* exp2_tab) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_tiles = (V + SAMPLE_TILE - 1) / SAMPLE_TILE;
  const int tpw = (n_tiles + SAMPLE_WARPS - 1) / SAMPLE_WARPS;  // warp w: tiles [w * tpw, ...)
  // ---- one pass over the row: each tile's sum (lane l holds tokens 2l, 2l + 1), each warp's total
  {
    const int lo = min(n_tiles, warp * tpw), hi = min(n_tiles, lo + tpw);
    double acc = 0.0;
    for (int t0 = lo; t0 < hi; t0 += SAMPLE_GROUP) {
      float l[SAMPLE_GROUP][2];
#pragma unroll
      for (int g = 0; g < SAMPLE_GROUP; ++g)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = (t0 + g) * SAMPLE_TILE + 2 * lane + e;
          l[g][e] = (t0 + g < hi && i < V) ? lg[i] : minillm::neg_inf();  // -inf weighs 0
        }
      double w[SAMPLE_GROUP];
#pragma unroll
      for (int g = 0; g < SAMPLE_GROUP; ++g)
        w[g] = tok_weight(l[g][0], min_key, inv_t, M, exp2_tab) + tok_weight(l[g][1], min_key, inv_t, M, exp2_tab);
      // transposed reduction of the 4 tiles: halves of the warp swap pairs of sums, then quarters
      // swap single sums, then 8 lanes finish one tile each (lanes 8g..8g+7: tile g); 9 double
      // shuffles instead of 4 x 5 butterflies
      static_assert(SAMPLE_GROUP == 4, "the transposed reduction is written for 4 tiles");
      const bool h16 = lane & 16, h8 = lane & 8;
      const double a0 = (h16 ? w[2] : w[0]) + __shfl_xor_sync(0xffffffffu, h16 ? w[0] : w[2], 16);
      const double a1 = (h16 ? w[3] : w[1]) + __shfl_xor_sync(0xffffffffu, h16 ? w[1] : w[3], 16);
      double r = (h8 ? a1 : a0) + __shfl_xor_sync(0xffffffffu, h8 ? a0 : a1, 8);
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
      const int g_mine = lane >> 3;  // the tile whose sum this lane holds
      if ((lane & 7) == 0 && t0 + g_mine < hi) tile[t0 + g_mine] = r;
#pragma unroll
      for (int g = 0; g < SAMPLE_GROUP; ++g) {
        const double tg = __shfl_sync(0xffffffffu, r, 8 * g);
        if (t0 + g < hi) acc += tg;
      }
    }
    if (lane == 0) warp_tot[warp] = acc;
  }
  __syncthreads();
  auto total_of = [&]() {  // every thread, the same order: the same value
    double c = 0.0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) c += warp_tot[w];
    return c;
  };
  double total = total_of();

  // ---- a draft d (q one-hot): accept with probability p(d); else the residual is p without d
  if (d >= 0) {
    const double wd = tok_weight(lg[d], min_key, inv_t, M, exp2_tab);
    if (hash_uniform(seed, pos, 1ull) < wd / total) {  // uniform over the block: all return
      if (tid == 0) {
        out[row] = d;
        if (accepted) accepted[row] = 1;
      }
      return;
    }
    const int td = d / SAMPLE_TILE, wdi = td / tpw;
    if (warp == 0) {  // d's tile summed again without d, as the pass above did
      double w = 0.0;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = td * SAMPLE_TILE + 2 * lane + e;
        if (i < V && i != d) w += tok_weight(lg[i], min_key, inv_t, M, exp2_tab);
      }
      w = minillm::warp_sum(w);
      if (lane == 0) tile[td] = w;
    }
    __syncthreads();
    if (tid == 0) {  // and its warp's total, in the pass's order
      const int lo = wdi * tpw, hi = min(n_tiles, lo + tpw);
      double acc = 0.0;
      for (int tt = lo; tt < hi; ++tt) acc += tile[tt];
      warp_tot[wdi] = acc;
    }
    __syncthreads();
    total = total_of();
  }
  if (tid == 0 && accepted) accepted[row] = 0;  // rejected, or no draft at this row
  if (warp != 0) return;

  // ---- inverse CDF at u * total, by warp 0: the warp range, the tile, the token
  const double target = hash_uniform(seed, pos, d >= 0 ? 2ull : 0ull) * total;
  const double ww = lane < SAMPLE_WARPS ? warp_tot[lane] : 0.0;
  double c0 = 0.0;  // the warps before this lane's, summed in total_of's order
  for (int w = 0; w < lane && w < SAMPLE_WARPS; ++w) c0 += warp_tot[w];
  const int wsel = warp_crossing(c0, ww, target);
  if (wsel < 0) {  // nothing kept (not reachable: the max logit is always kept)
    if (lane == 0) out[row] = fallback;
    return;
  }
  const double wbase = __shfl_sync(0xffffffffu, c0, wsel);
  const int lo = wsel * tpw, hi = min(n_tiles, lo + tpw);
  const int per = (hi - lo + 31) / 32;  // lanes take consecutive runs of that warp's tiles
  const int a = min(hi, lo + lane * per), b = min(hi, a + per);
  double ls = 0.0;
  for (int tt = a; tt < b; ++tt) ls += tile[tt];
  const double lc0 = wbase + warp_exclusive_scan(ls);
  const int lsel = warp_crossing(lc0, ls, target);
  int tsel = -1;
  double tc0 = 0.0;
  if (lane == lsel) {
    double c = lc0, lastc = 0.0;
    int last = -1;
    for (int tt = a; tt < b; ++tt) {
      const double ts = tile[tt];
      if (ts > 0.0) {
        if (target < c + ts) { tsel = tt; tc0 = c; break; }
        last = tt;
        lastc = c;
      }
      c += ts;
    }
    if (tsel < 0) { tsel = last; tc0 = lastc; }
  }
  tsel = __shfl_sync(0xffffffffu, tsel, lsel < 0 ? 0 : lsel);
  tc0 = __shfl_sync(0xffffffffu, tc0, lsel < 0 ? 0 : lsel);
  if (tsel < 0) {
    if (lane == 0) out[row] = fallback;
    return;
  }
  const int i0 = tsel * SAMPLE_TILE + 2 * lane;
  const double w0 = (i0 < V && i0 != d) ? tok_weight(lg[i0], min_key, inv_t, M, exp2_tab) : 0.0;
  const double w1 = (i0 + 1 < V && i0 + 1 != d) ? tok_weight(lg[i0 + 1], min_key, inv_t, M, exp2_tab) : 0.0;
  const double ec0 = tc0 + warp_exclusive_scan(w0 + w1);
  const int esel = warp_crossing(ec0, w0 + w1, target);
  if (esel < 0 && lane == 0) out[row] = fallback;
  if (lane == esel) {  // its first token unless the target lies past it (or it weighs nothing)
    const bool first = w0 > 0.0 && (target < ec0 + w0 || !(w1 > 0.0));
    out[row] = i0 + (first ? 0 : 1);
  }
}

// A row's max logit bv and its argmax bi (the first index on ties): every thread gets both. 16-byte
// loads (for_each_logit; 8 scalar loads in flight a thread measured slower on the H200: 13 -> 20 us a
// row, part61).
__device__ __forceinline__ void row_argmax(const float* __restrict__ lg, int n, float* fscratch, int* iscratch,
                                           float& bv, int& bi) {
  bv = minillm::neg_inf();
  bi = 0x7fffffff;
  for_each_logit(lg, n, [&](int i, float v) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
  });
  block_argmax(bv, bi, fscratch, iscratch);
}

// A sampled row's filters (temperature t > 0, max logit bv): top-k and min-p as one floor on the
// key, then top-p's cut-off key and how many of its tied tokens it keeps (in index order). Every
// thread of the block calls it and gets the same values. scratch: SAMPLE_MAX_TILES doubles of
// shared memory for the radix histograms.
struct RowFilter {
  unsigned kth_key;       // the top-k / min-p floor (0: none)
  double kth_x;           // key_float(kth_key) / t (-inf: none)
  bool use_floor, use_topp, tie_cut;
  unsigned cut_key;       // top-p's cut-off key
  int n_tie;              // its tied tokens kept, the first in index order
  double S2;              // top-p's kept mass (the serial draw renormalises by it)
  // the tiled draw keeps key >= this (when !tie_cut)
  __device__ unsigned min_key() const { return use_topp ? cut_key : use_floor ? kth_key : 0u; }
};

__device__ __forceinline__ void filter_row(const float* __restrict__ lg, int V, float bv, double t,
                                           const int* __restrict__ top_k, const float* __restrict__ min_p,
                                           const float* __restrict__ top_p, int row, RowFilter& f, void* scratch,
                                           double* dscratch, int* s_bin, int* s_first, double* s_above,
                                           const double* exp2_tab) {
  const int tid = threadIdx.x, NT = blockDim.x;
  const double M = (double)bv / t;  // the max of x survives every filter

  // ---- top-k: the k-th largest key, by radix select (three passes over the row)
  const int k = top_k[row];
  const bool use_topk = k > 0 && k < V;
  unsigned kth_key = 0;
  double kth_x = -__longlong_as_double(0x7ff0000000000000ll);  // -inf: keeps all
  int* hist = reinterpret_cast<int*>(scratch);
  if (use_topk) {
    unsigned prefix = 0;
    double need = (double)k;  // rank among the keys that share the prefix
    for (int pass = 0; pass < 3; ++pass) {
      const int nb = radix_bins(pass), shift = radix_shift(pass);
      const unsigned mask = radix_mask(pass);
      for (int b = tid; b < nb; b += NT) hist[b] = 0;
      __syncthreads();
      for_each_logit(lg, V, [&](int, float l) {
        const unsigned key = float_key(l);
        if ((key & mask) == prefix) atomicAdd(hist + ((key >> shift) & (nb - 1)), 1);
      });
      __syncthreads();
      int bin;
      double above;
      radix_crossing(nb, hist, need, dscratch, s_bin, s_first, s_above, bin, above);
      prefix |= (unsigned)bin << shift;
      need -= above;
    }
    kth_key = prefix;
    kth_x = (double)key_float(kth_key) / t;
  }

  // ---- min-p (min_p null or 0: off): keep x >= M + ln(min_p), the keys at or above min_p_key.
  // Like top-k's it is a floor on the key, so the two fold into one: the stricter (larger) wins,
  // and everything below (top-p's radix select over key >= kth_key, the draws' key >= min_key or
  // x >= kth_x) filters by it alike.
  const float mp = min_p ? min_p[row] : 0.f;
  const bool use_minp = mp > 0.f;
  if (use_minp) {
    kth_key = max(kth_key, min_p_key(M + log((double)mp), t));
    kth_x = (double)key_float(kth_key) / t;
  }
  const bool use_floor = use_topk || use_minp;  // kth_key filters the row

  const double tp = (double)top_p[row];
  const bool use_topp = tp < 1.0;
  const double inv_t = 1.0 / t;
  const double Mt = (double)bv * inv_t;  // tok_weight's max

  // ---- top-p: the cut-off key v = min key with mass(key > v) < top_p, then its ties. Radix
  // select again, over each kept token's weight exp(x - M) in fixed point (2^62 / V a unit
  // weight, so the sums fit 64 bits and are exact whatever the order of the atomics): the bin where
  // the mass from the top first reaches top_p. Only the first pass takes exp() of every token.
  unsigned cut_key = 0;
  int n_tie = 0;
  bool tie_cut = false;  // the cut-off keeps only some of its tied tokens: the serial draw
  double S2 = 1.0;
  if (use_topp) {
    unsigned long long* mass = reinterpret_cast<unsigned long long*>(scratch);
    const double unit = ldexp(1.0, 62 - (32 - __clz(V)));
    unsigned prefix = 0;
    double need = 0.0, above = 0.0, total = 0.0;
    for (int pass = 0; pass < 3; ++pass) {
      const int nb = radix_bins(pass), shift = radix_shift(pass);
      const unsigned mask = radix_mask(pass);
      for (int b = tid; b < nb; b += NT) mass[b] = 0ull;
      __syncthreads();
      for_each_logit(lg, V, [&](int, float l) {
        const unsigned key = float_key(l);
        if ((key & mask) == prefix && key >= kth_key) {
          const double w = exp_weight(fma((double)l, inv_t, -Mt), exp2_tab);
          atomicAdd(mass + ((key >> shift) & (nb - 1)), (unsigned long long)(w * unit + 0.5));
        }
      });
      __syncthreads();
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
    }
    cut_key = prefix;
    double cnt = 0.0;
    for_each_logit(lg, V, [&](int, float l) { cnt += float_key(l) == cut_key ? 1.0 : 0.0; });
    cnt = minillm::block_sum(cnt, dscratch);
    // ties at the cut-off come in index order; each adds the same p to the running mass
    const double p_cut =
        (double)(unsigned long long)(exp_weight(fma((double)key_float(cut_key), inv_t, -Mt), exp2_tab) * unit + 0.5) /
        total;
    double c = above / total;
    while (n_tie < (int)cnt && c < tp) { ++n_tie; c += p_cut; }
    S2 = c;  // the kept mass, to renormalise by
    tie_cut = n_tie < (int)cnt;
  }

  f.kth_key = kth_key;
  f.kth_x = kth_x;
  f.use_floor = use_floor;
  f.use_topp = use_topp;
  f.cut_key = cut_key;
  f.n_tie = n_tie;
  f.tie_cut = tie_cut;
  f.S2 = S2;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 2)
sample_tokens(const float* __restrict__ logits, i64 stride, int V,
              const float* __restrict__ temperature, const float* __restrict__ top_p,
              const int* __restrict__ top_k, const float* __restrict__ min_p,
              const void* __restrict__ seeds, int seed_bytes,
              const int* __restrict__ positions, int* __restrict__ out,
              const int* __restrict__ draft, int* __restrict__ accepted, int n_rows) {
  __shared__ double dscratch[32];
  __shared__ double s_above;
  __shared__ float fscratch[32];
  __shared__ int iscratch[32];
  __shared__ int s_found, s_bin, s_first;
  __shared__ double s_tile[SAMPLE_MAX_TILES];
  __shared__ double s_warp[SAMPLE_WARPS];
  __shared__ double s_exp2[256];  // 2^(j / 256): exp_weight's table (the argmax's barriers publish it)
  if (threadIdx.x < 256) s_exp2[threadIdx.x] = exp2((double)threadIdx.x / 256.0);
  minillm::pdl_entry();
  const int row = blockIdx.x, tid = threadIdx.x, NT = blockDim.x;
  if (row >= n_rows) return;
  const float* lg = logits + (i64)row * stride;

  // ---- argmax (greedy) and the max logit
  float bv;
  int bi;
  row_argmax(lg, V, fscratch, iscratch, bv, bi);
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
  RowFilter f;
  filter_row(lg, V, bv, t, top_k, min_p, top_p, row, f, s_tile, dscratch, &s_bin,
             &s_first, &s_above, s_exp2);
  const bool tiled = V <= SAMPLE_TILE * SAMPLE_MAX_TILES;
  const double kth_x = f.kth_x, S2 = f.S2;
  const bool use_topp = f.use_topp, tie_cut = f.tie_cut;
  const unsigned cut_key = f.cut_key;
  const int n_tie = f.n_tie;
  // ---- softmax normaliser over the top-k / min-p survivors, for the serial draw only
  double S = 0.0;
  if (tie_cut || !tiled) {  // uniform over the block
    for (int i = tid; i < V; i += NT) {
      const double x = (double)lg[i] / t;
      if (x >= kth_x) S += exp(x - M);
    }
    S = minillm::block_sum(S, dscratch);
  }

  const u64 seed = seed_bytes == 8 ? reinterpret_cast<const u64*>(seeds)[row]
                                   : (u64)(i64)reinterpret_cast<const int*>(seeds)[row];
  const i64 pos = positions[row];
  if (tiled && !tie_cut) {  // keep key >= cut-off (top-p, after top-k / min-p) or >= the floor
    const double inv_t = 1.0 / t;
    sample_from_tiles(lg, V, f.min_key(), inv_t, (double)bv * inv_t, d, seed, pos, bi, out, accepted, row, s_tile, s_warp,
                      s_exp2);
    return;
  }

  // ---- the serial draw: each token's weight in index order, ties at a top-p cut-off ranked

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

// ---- verify_drawn_drafts: drafts drawn from the drafter's q, verified against that q ------------
// The twin of sampler.sample's rows with draft_rows[b] >= 0 (a DFlash drafter drawing its drafts at
// temperature > 0). It runs after sample_tokens, which took such rows as one-hot drafts, and
// rewrites out / accepted of exactly those rows. p: the target's row under the row's temperature
// and filters; q: the drafter's row q_logits[q_rows[row]] (QV <= V ids, the rest weigh 0) under the
// same, as the drafter's own sample_tokens drew d from it. d is accepted with probability
// min(1, p(d) / q(d)) (u * q(d) < p(d), u on the accept stream); otherwise the token is drawn from
// max(p - q, 0) (the residual stream), or from p where that has no mass (rounding).
// Each warp owns a range of ids, 32 consecutive ones a step, so ties at a top-p cut-off are ranked in
// index order as the draws rank them: one pass sums both rows' kept weights exp(x - max x), a second
// each warp's residual mass, and the warp whose range holds the target walks it. Measured (sampler_bench.py, H100,
// part324 / part325): 57 us a row at 8 rows (temperature only; sample_tokens: 9), 194 with top-p 0.9,
// whose radix selects run for both rows. Float32 exponentials and no divisions took 20% off the first
// layout (each thread a run of ids); each warp's ids a lane a step (coalesced) changed nothing, so the
// passes are bound by their loads' latency (one step's two loads in flight a warp). Next: load several
// steps before computing them, as sample_from_tiles does. Only rows verifying drawn drafts come here.
namespace {

struct KeptRow {  // a filtered row's kept tokens and their weights exp(x - max x)
  const float* lg;
  int n;  // ids from n on weigh 0 (a drafter's smaller vocabulary)
  RowFilter f;
  double inv_t, Mt;
  __device__ __forceinline__ bool tie(int i) const {  // a token at top-p's cut-off key
    return f.use_topp && i < n && float_key(lg[i]) == f.cut_key;
  }
  // token i's weight; rank: the tokens tied at the cut-off before it (index order), read for such a tie
  __device__ __forceinline__ double weight(int i, int rank) const {
    if (i >= n) return 0.0;
    const float l = lg[i];
    const unsigned key = float_key(l);
    if (f.use_floor && key < f.kth_key) return 0.0;
    if (f.use_topp && (key < f.cut_key || (key == f.cut_key && rank >= f.n_tie))) return 0.0;
    // float32's exp of x - max x (computed in float64): ~1e-7 relative, so only a draw within that
    // of a boundary can differ from the float64 twin's; exp_weight's float64 took 20% more (part325)
    return (double)expf((float)fma((double)l, inv_t, -Mt));
  }
};

}  // namespace

// grid n_rows, SAMPLE_THREADS threads (one CTA an SM: room for 128 registers; ptxas: 74, no spills);
// the arguments are sample_tokens' plus the drafter's rows
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
verify_drawn_drafts(const float* __restrict__ logits, i64 stride, int V, const float* __restrict__ q_logits,
                    i64 q_stride, int QV, const float* __restrict__ temperature, const float* __restrict__ top_p,
                    const int* __restrict__ top_k, const float* __restrict__ min_p, const void* __restrict__ seeds,
                    int seed_bytes, const int* __restrict__ positions, const int* __restrict__ draft,
                    const int* __restrict__ q_rows, int* __restrict__ out, int* __restrict__ accepted, int n_rows) {
  __shared__ double dscratch[32];
  __shared__ double s_above;
  __shared__ float fscratch[32];
  __shared__ int iscratch[32];
  __shared__ int s_bin, s_first;
  __shared__ double s_tile[SAMPLE_MAX_TILES];  // the radix histograms
  __shared__ double s_exp2[256];
  __shared__ double s_wd[2];  // d's weights in p and q
  if (threadIdx.x < 256) s_exp2[threadIdx.x] = exp2((double)threadIdx.x / 256.0);
  minillm::pdl_entry();
  const int row = blockIdx.x, tid = threadIdx.x, NT = blockDim.x;
  if (row >= n_rows) return;
  const int d = draft[row], qr = q_rows[row];
  const float temp = temperature[row];
  if (d < 0 || qr < 0 || !(temp > 0.f)) return;  // sample_tokens' result stands
  MINILLM_CHECK(d < V && QV <= V);
  const float* lp = logits + (i64)row * stride;
  const float* lq = q_logits + (i64)qr * q_stride;
  const double t = (double)temp, inv_t = 1.0 / t;
  float bp, bq;
  int ip, iq;
  row_argmax(lp, V, fscratch, iscratch, bp, ip);
  row_argmax(lq, QV, fscratch, iscratch, bq, iq);
  KeptRow P{lp, V, {}, inv_t, (double)bp * inv_t}, Q{lq, QV, {}, inv_t, (double)bq * inv_t};
  filter_row(lp, V, bp, t, top_k, min_p, top_p, row, P.f, s_tile, dscratch, &s_bin, &s_first, &s_above, s_exp2);
  filter_row(lq, QV, bq, t, top_k, min_p, top_p, row, Q.f, s_tile, dscratch, &s_bin, &s_first, &s_above, s_exp2);

  // warp w owns ids [w * CW, (w + 1) * CW), 32 consecutive ids a step, a lane each (coalesced loads;
  // contiguous runs a thread, part324/part325, made every load a transaction of its own)
  const int lane = tid & 31, warp = tid >> 5, NW = NT >> 5;
  const int CW = (V + NW * 32 - 1) / (NW * 32) * 32, lo = warp * CW;
  const unsigned below = (1u << lane) - 1u;
  // ---- the ties at each row's top-p cut-off before each warp's range (their rank is index order)
  {
    int cp = 0, cq = 0;
    for (int i = lo + lane; i < lo + CW; i += 32) {
      cp += __popc(__ballot_sync(0xffffffffu, P.tie(i)));
      cq += __popc(__ballot_sync(0xffffffffu, Q.tie(i)));
    }
    if (lane == 0) {
      iscratch[warp] = cp;
      iscratch[16 + warp] = cq;
    }
  }
  __syncthreads();
  int rp0 = 0, rq0 = 0;
  for (int w = 0; w < warp; ++w) {
    rp0 += iscratch[w];
    rq0 += iscratch[16 + w];
  }
  // one step's weights: each lane's id with its tie ranks; the carries move past the step
  auto step = [&](int i, int& rp, int& rq, double& wp, double& wq) {
    const unsigned bp = __ballot_sync(0xffffffffu, P.tie(i)), bq = __ballot_sync(0xffffffffu, Q.tie(i));
    wp = P.weight(i, rp + __popc(bp & below));
    wq = Q.weight(i, rq + __popc(bq & below));
    rp += __popc(bp);
    rq += __popc(bq);
  };
  // ---- both rows' kept mass, and d's weights
  double zp = 0.0, zq = 0.0;
  {
    int rp = rp0, rq = rq0;
    for (int i = lo + lane; i < lo + CW; i += 32) {
      double wp, wq;
      step(i, rp, rq, wp, wq);
      zp += wp;
      zq += wq;
      if (i == d) {
        s_wd[0] = wp;
        s_wd[1] = wq;
      }
    }
  }
  __syncthreads();
  zp = minillm::block_sum(zp, dscratch);
  zq = minillm::block_sum(zq, dscratch);
  const u64 seed = seed_bytes == 8 ? reinterpret_cast<const u64*>(seeds)[row]
                                   : (u64)(i64)reinterpret_cast<const int*>(seeds)[row];
  const i64 pos = positions[row];
  const double inv_zp = 1.0 / zp, inv_zq = zq > 0.0 ? 1.0 / zq : 0.0;  // multiplications in the passes
  const double pd = s_wd[0] * inv_zp, qd = s_wd[1] * inv_zq;
  if (hash_uniform(seed, pos, 1ull) * qd < pd) {  // uniform over the block: every thread returns
    if (tid == 0) {
      out[row] = d;
      accepted[row] = 1;
    }
    return;
  }
  // ---- the residual max(p - q, 0), or p where it has no mass: each warp's mass, then the draw
  auto resid = [&](int i, int& rp, int& rq, bool from_p) {
    double wp, wq;
    step(i, rp, rq, wp, wq);
    return from_p ? wp * inv_zp : fmax(wp * inv_zp - wq * inv_zq, 0.0);
  };
  double* s_mass = s_tile;  // [NW] each warp's mass (the radix histograms are done with)
  int* s_last = iscratch;   // [NW] each warp's last id with mass, or -1
  auto warp_mass = [&](bool from_p) {
    int rp = rp0, rq = rq0, last = -1;
    double m = 0.0;
    for (int i = lo + lane; i < lo + CW; i += 32) {
      const double w = resid(i, rp, rq, from_p);
      m += w;
      const unsigned nz = __ballot_sync(0xffffffffu, w > 0.0);
      if (nz) last = i - lane + 31 - __clz(nz);
    }
    m = minillm::warp_sum(m);
    __syncthreads();  // the previous readers of s_mass / s_last are done
    if (lane == 0) {
      s_mass[warp] = m;
      s_last[warp] = last;
    }
    __syncthreads();
    double total = 0.0;  // every thread, the same order
    for (int w = 0; w < NW; ++w) total += s_mass[w];
    return total;
  };
  double total = warp_mass(false);
  const bool from_p = !(total > 0.0);  // the same for every thread
  if (from_p) total = warp_mass(true);
  const double target = hash_uniform(seed, pos, 2ull) * total;
  // the warp whose range holds the target (the last with mass, rounding past the end), then its walk
  int wsel = -1, wlast = -1;
  double base = 0.0, c = 0.0;
  for (int w = 0; w < NW; ++w) {
    const double m = s_mass[w];
    if (m > 0.0) {
      wlast = w;
      if (wsel < 0 && target < c + m) { wsel = w; base = c; }
    }
    c += m;
  }
  if (wsel < 0 && wlast >= 0) {  // rounding: the last id with mass
    if (tid == 0) out[row] = s_last[wlast];
  } else if (wsel < 0) {  // nothing kept (not reachable: each row's max is kept)
    if (tid == 0) out[row] = d;
  } else if (warp == wsel) {
    int rp = rp0, rq = rq0, pick = -1;
    double cb = base;
    const int w_lo = wsel * CW;
    for (int i = w_lo + lane; i < w_lo + CW && pick < 0; i += 32) {
      const double w = resid(i, rp, rq, from_p);
      double inc = w;  // inclusive scan over the step's lanes
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      // searchsorted side="right": the first id with mass whose running mass passes the target
      const unsigned hit = __ballot_sync(0xffffffffu, w > 0.0 && target < cb + inc);
      if (hit) pick = i - lane + __ffs(hit) - 1;
      cb += __shfl_sync(0xffffffffu, inc, 31);
    }
    if (lane == 0) out[row] = pick >= 0 ? pick : s_last[wsel];
  }
  if (tid == 0) accepted[row] = 0;
}
