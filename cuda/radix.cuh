// radix.cuh: a logits row's keys and the radix select over them, shared by cuda/sampling.cu (top-k,
// top-p and min-p floors) and cuda/dflash2.cu (a DFlash2 drafter's top-k candidates).
#pragma once

namespace minillm_radix {

// Order-preserving map float -> uint32 (-0.0 folded onto +0.0, as NumPy compares them equal).
__device__ __forceinline__ unsigned float_key(float f) {
  if (f == 0.f) f = 0.f;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_float(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Radix select over the 32-bit keys, from the top: digits of 12, 12 and 8 bits. Pass p counts
// (or weighs) the keys that share the digits found so far into a shared-memory histogram of its
// digit, then the block finds the bin where a running total from the top bin down first reaches
// `need`. Integer atomics only, so the histograms do not depend on the order of the atomics.
__device__ __forceinline__ int radix_shift(int pass) { return pass == 0 ? 20 : pass == 1 ? 8 : 0; }
__device__ __forceinline__ int radix_bins(int pass) { return pass < 2 ? 4096 : 256; }
__device__ __forceinline__ unsigned radix_mask(int pass) {  // the digits found before pass
  return pass == 0 ? 0u : pass == 1 ? 0xfff00000u : 0xffffff00u;
}

// f(i, logit) for every token i in [lo, hi) of the row (lo a multiple of 4), a 16-byte load (4 tokens)
// a thread an iteration where the row is 16-byte aligned: the radix passes read the whole row each, and
// with one 4-byte load a thread an iteration (the loop also does shared-memory atomics) each pass was
// bound by the loads' latency (top-k 50 with 3 passes: 224 us a row, part66). A range: the CTA's share
// of a row split over a cluster (sampling.cu, RowSplit).
template <typename F>
__device__ __forceinline__ void for_each_logit_in(const float* __restrict__ lg, int lo, int hi, F f) {
  const int tid = threadIdx.x, NT = blockDim.x;
  int done = lo;
  if ((reinterpret_cast<unsigned long long>(lg) & 15ull) == 0) {
    const int n4 = (hi - lo) / 4;
    const float4* lg4 = reinterpret_cast<const float4*>(lg + lo);
    for (int q = tid; q < n4; q += NT) {
      const float4 v = lg4[q];
      const int i = lo + 4 * q;
      f(i, v.x);
      f(i + 1, v.y);
      f(i + 2, v.z);
      f(i + 3, v.w);
    }
    done = lo + 4 * n4;
  }
  for (int i = done + tid; i < hi; i += NT) f(i, lg[i]);
}

// the whole row
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ lg, int V, F f) {
  for_each_logit_in(lg, 0, V, f);
}

}  // namespace minillm_radix
using namespace minillm_radix;
