"""Could a batch-1 layer hide its weight streaming behind the hand-offs? A synthetic chain (a GPU diagnostic).

    PYTHONPATH=. python scripts/preload_bench.py [--layers 28] [--json F]

A 0.6B batch-1 decode layer is five dependent kernels (qkv with the norm folded in, attention,
o, gate_up with the norm folded in, down) that stream ~33.5 MB: 8.2 us at 4.1 TB/s, against ~26 us
a layer measured (docs/BENCHMARKS.md, part277: 17.2 us of work and 9.2 of hand-offs). Every
product's weights are known before its input is: only x depends on the previous kernel. So a
product could ask for its whole share of the weights (one TMA bulk copy into shared memory, a
CTA an SM) before its PDL wait, release its own dependents at once so the next product starts
its copy too, and after the wait only read x from L2 and multiply out of shared memory. The
chain's length would then be set by the x hand-offs, not by HBM latency, while the HBM streams
the next kernels' weights underneath.

This times that on a synthetic chain with the layer's bytes (five kernels, 8.4 / 2.0 / 4.2 / 12.6
/ 6.3 MB each, distinct per kernel and layer so nothing is served from L2), one CUDA graph each:
  - stream: the project's way now: wait, then stream the share from HBM with four 16-byte loads
    in flight a thread, release the dependents after the loop (the real grids: 512, 168, 128,
    768, 128 CTAs of 128 threads);
  - pre_late: the share copied into shared memory before the wait; dependents released after
    the loop, as now;
  - pre_early: the same, dependents released right after the copy is issued;
  - stream_nopdl: stream's kernels as plain graph nodes, each launched after the previous one ends
    (griddepcontrol does nothing without the attribute).
--ahead 1,2: each kernel also asks for the weights of the kernel 1 (2) places later, into L2,
before its wait (pre_early_l2_1, _2). With --mb 0,0,0,0,0 the kernels move no weights: what is
left is each hand-off's own cost, with PDL released late, released at once, and without PDL.
Each kernel reads the whole previous vector (4 KB; the folded-norm kernels sum it first, as a
product normalising its x would) and writes its slice of the next, so a wrong order shows: every
way's final vector must equal stream's bit for bit. Median replay of 20 after 3 warm-ups. Every CTA
writes every gridDim-th element, after its share's sums, so the next kernel needs every CTA's stores, as
a product's next kernel needs all its rows (until session 75's part378 the first few CTAs wrote them all:
part377's --tagged figures waited on those CTAs alone).

--groups G (session 75): a layer's first two kernels in one (pre_early_fused). A batch-1 attention needs
only its KV group's rows of the qkv product (the 0.6B's 8 KV heads: 512 of 4,096 rows each), so with
--dep 2,3,1,2,1 (3: each output element waits on the sum of its own group's 1 / G of x only) the fused
kernel's CTAs (G groups of SMs // G; both shares copied before the wait) do the first kernel's work, meet
their group at a counter (__threadfence + atomicAdd, then a spin on ld.acquire.gpu) instead of a kernel
boundary, then do the second kernel's work on their group's slice. What it measures: one PDL hand-off a
layer traded for a 1 / G-of-the-grid barrier. --barrier red: the arrival one red.release.gpu instead of a
fence and an atomicAdd; cluster: each group a thread-block cluster (SMs // G CTAs: 16 for G = 8, a
non-portable size) meeting at the hardware's cluster barrier, no counter.

--tagged (session 75): also the way pre_early_tagged, pre_early's kernels without griddepcontrol.wait: the vector
between two kernels is (value, tag) pairs written by single 8-byte stores, and each kernel polls its input's tags
(NCCL's LL protocol's idea): what it measures is how much of a hand-off is the wait for the whole previous grid
and its memory flush. Needs --dep of 1s and 2s. Measured (part378, session 76, an H100): +9% to +22% a layer
against pre_early, by the sleep between polls; slower.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SRC = r"""
#include "common.cuh"
using namespace minillm;  // common.cuh: block_sum, the mbarrier and bulk-copy helpers

// A sum in an order that does not depend on the CTA's size, so that every way's final vector can be compared
// bit for bit (part297 summed it over the CTA's threads: the 256-thread ways then differed from the 128-thread
// stream by rounding alone): warp 0 adds load(j) for j = lane, lane + 32, ... < cnt, then the xor shuffles;
// broadcast to the CTA.
template <typename Load>
__device__ __forceinline__ float warp_strided_sum(int cnt, Load load) {  // every lane gets the warp's sum
  float s = 0.f;
  for (int j = threadIdx.x & 31; j < cnt; j += 32) s += load(j);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
template <typename Load>
__device__ __forceinline__ float warp0_sum(int cnt, Load load, float* red) {
  if (threadIdx.x < 32) {
    const float s = warp_strided_sum(cnt, load);
    if (threadIdx.x == 0) red[0] = s;
  }
  __syncthreads();
  const float t = red[0];
  __syncthreads();
  return t;
}

// the previous vector's sum
__device__ __forceinline__ float src_sum(const float* src, int n, float* red) {
  return warp0_sum(n, [&](int j) { return __ldcg(src + j); }, red);
}

// the sum of src[lo, lo + cnt) (dep 3's group sums, the same bits in layer_kernel and fused_kernel)
__device__ __forceinline__ float slice_sum(const float* src, int lo, int cnt, float* red) {
  return warp0_sum(cnt, [&](int j) { return __ldcg(src + lo + j); }, red);
}

// this CTA's share of w16 16-byte words: [lo, lo + cnt) of ceil(w16 / gridDim.x) a CTA
__device__ __forceinline__ void cta_share(long long w16, long long* lo, int* cnt) {
  const long long per = (w16 + gridDim.x - 1) / gridDim.x;
  *lo = per * blockIdx.x;
  *cnt = *lo < w16 ? (int)(min(*lo + per, w16) - *lo) : 0;
}

// thread 0: barrier b expects `words` 16-byte words, then the copies of src[0, cnt) into dst (32 KB a copy)
__device__ __forceinline__ void share_barrier(unsigned b, int words) {
  mbar_init(b, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  mbar_expect_tx(b, (unsigned)words * 16u);
}
__device__ __forceinline__ void share_copies(uint4* dst, const uint4* src, int cnt, unsigned b) {
  for (int c = 0; c < cnt; c += 2048) bulk_copy(smem_addr(dst + c), src + c, (unsigned)(min(2048, cnt - c) * 16), b);
}

// the share's (zero) weights times x out of shared memory: +0, but every word is read
__device__ __forceinline__ float share_dot(const uint4* sh, int cnt, float x) {
  float facc = 0.f;
  for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
    const uint4 a = sh[i];
    facc = fmaf(__uint_as_float(a.x), x, facc);
    facc = fmaf(__uint_as_float(a.w), x, facc);
  }
  return facc;
}

__device__ __forceinline__ float chain_term(int me, int j) { return 1e-3f * (float)((me * 31 + j) % 17); }

// pre: 0 stream the share from HBM after the wait; 1 copy it to shared memory before the wait,
// release after the loop; 2 the same, release right after issuing the copy.
// dep: 1 the sums wait on one x element (a product), 2 on the CTA's sum of x (a folded norm), 3 each
// output element on the sum of its own group's n / groups elements of x (an attention's KV group).
extern "C" __global__ void __launch_bounds__(256) layer_kernel(const float* src, float* dst, int n,
                                                               const uint4* w, long long w16, int pre, int dep,
                                                               int me, const uint4* pf, long long pf16,
                                                               int groups) {
  extern __shared__ __align__(128) uint4 share[];
  __shared__ float red[32];
  __shared__ __align__(8) unsigned long long bar;
  long long lo;
  int cnt;
  cta_share(w16, &lo, &cnt);
  const unsigned b = smem_addr(&bar);
  if (pre) {
    if (threadIdx.x == 0) {
      share_barrier(b, cnt);
      share_copies(share, w + lo, cnt, b);
    }
    if (threadIdx.x == 32 && pf16 > 0) {  // a later kernel's weights into L2 (this CTA's slice), --ahead
      long long plo;
      int pcnt;
      cta_share(pf16, &plo, &pcnt);
      for (int c = 0; c < pcnt; c += 2048) prefetch_l2(pf + plo + c, (unsigned)(min(2048, pcnt - c) * 16));
    }
    __syncthreads();
    if (pre == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float s = 0.f, x = 0.f;
  if (dep == 2) {  // the sums wait on all of x
    s = src_sum(src, n, red);
    x = s;
  } else {  // on one element; the sum comes after the loop
    x = __ldcg(src + threadIdx.x % n);
  }
  unsigned acc = 0;
  float facc = 0.f;  // the weights are zero: stays +0
  if (pre) {
    mbar_wait(b, 0);
    facc = share_dot(share, cnt, x);
  } else {
    const long long hi = lo + cnt;
    long long i = lo + threadIdx.x;
    for (; i + 3 * blockDim.x < hi; i += 4 * blockDim.x) {
      const uint4 a = __ldcs(w + i), c = __ldcs(w + i + blockDim.x), d = __ldcs(w + i + 2 * blockDim.x),
                  e = __ldcs(w + i + 3 * blockDim.x);
      facc = fmaf(__uint_as_float(a.x), x, facc);
      facc = fmaf(__uint_as_float(c.y), x, facc);
      facc = fmaf(__uint_as_float(d.z), x, facc);
      facc = fmaf(__uint_as_float(e.w), x, facc);
    }
    for (; i < hi; i += blockDim.x) acc ^= __ldcs(w + i).x;
  }
  if (acc == 0x9e3779b9u) s += 1.f;  // keeps the loads; never taken on the zero weights
  if (dep == 3) {  // every group's sum (a warp each, at once), then each element with its own group's
    const float f = block_sum(facc, red);  // +0: the weights are zero
    if (pre != 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int gn = n / groups;
    for (int g = threadIdx.x >> 5; g < groups; g += blockDim.x >> 5) {  // slice_sum's order, in warp g
      const float t = warp_strided_sum(gn, [&](int j) { return __ldcg(src + g * gn + j); });
      if ((threadIdx.x & 31) == 0) red[g] = t;
    }
    __syncthreads();
    for (int j = blockIdx.x + gridDim.x * threadIdx.x; j < n; j += gridDim.x * blockDim.x)
      dst[j] = __ldcg(src + j) * 0.5f + (red[j / gn] + f) * (0.5f / n) + chain_term(me, j);
    return;
  }
  if (dep != 2) s = src_sum(src, n, red);
  s += block_sum(facc, red);  // +0: the weights are zero
  if (pre != 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int j = blockIdx.x + gridDim.x * threadIdx.x; j < n; j += gridDim.x * blockDim.x)
    dst[j] = __ldcg(src + j) * 0.5f + s * (0.5f / n) + chain_term(me, j);
}

// --groups: layer_kernel(pre 2, dep 2) then layer_kernel(pre 2, dep 3) in one grid of groups x (CTAs a group),
// the second's work on this CTA's group's slice only, after the group's CTAs have all written theirs
// (counters[group]: zeroed before the graph's first kernel). Both shares copied before the wait.
extern "C" __global__ void __launch_bounds__(256) fused_kernel(const float* src, float* mid, float* dst, int n,
                                                               const uint4* wa, long long wa16, const uint4* wb,
                                                               long long wb16, int me, int groups,
                                                               unsigned* counters, int barrier) {
  extern __shared__ __align__(128) uint4 share[];
  __shared__ float red[32];
  __shared__ __align__(8) unsigned long long bar;
  const int per_group = gridDim.x / groups, grp = blockIdx.x / per_group, l = blockIdx.x % per_group;
  long long la, lb;
  int ca, cb;
  cta_share(wa16, &la, &ca);
  cta_share(wb16, &lb, &cb);
  uint4* const share_b = share + (wa16 + gridDim.x - 1) / gridDim.x;  // the second share after the first's largest
  const unsigned b = smem_addr(&bar);
  if (threadIdx.x == 0) {
    share_barrier(b, ca + cb);
    share_copies(share, wa + la, ca, b);
    share_copies(share_b, wb + lb, cb, b);
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // the first kernel's work (dep 2): the sum of all of x, the share's dot, this CTA's part of its group's slice
  float s = src_sum(src, n, red);
  const float x = s;
  mbar_wait(b, 0);
  const float facc = share_dot(share, ca, x);
  s += block_sum(facc, red);
  const int gn = n / groups, g0 = grp * gn;
  for (int j = g0 + l + per_group * threadIdx.x; j < g0 + gn; j += per_group * blockDim.x)
    mid[j] = __ldcg(src + j) * 0.5f + s * (0.5f / n) + chain_term(me, j);
  // the group barrier: every CTA of the group has written its part of the slice. barrier 0: __threadfence +
  // atomicAdd, then a spin on ld.acquire.gpu; 1: one red.release.gpu (no separate fence), the same spin;
  // 2: the group is a cluster (the host launches clusters of per_group CTAs): the hardware's cluster barrier
  if (barrier == 2) {
    cluster_sync();  // release / acquire at cluster scope: the peers' global stores are visible after it
  } else {
    __syncthreads();
    if (threadIdx.x == 0) {
      if (barrier == 1) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counters + grp) : "memory");
      } else {
        __threadfence();
        atomicAdd(counters + grp, 1u);
      }
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counters + grp) : "memory");
      } while (seen < (unsigned)per_group);
    }
    __syncthreads();
  }
  // the second kernel's work (dep 3) on this group's slice
  const float x2 = __ldcg(mid + g0 + threadIdx.x % gn);
  const float facc2 = share_dot(share_b, cb, x2);
  const float f = block_sum(facc2, red);
  const float gs = slice_sum(mid, g0, gn, red) + f;
  for (int j = g0 + l + per_group * threadIdx.x; j < g0 + gn; j += per_group * blockDim.x)
    dst[j] = __ldcg(mid + j) * 0.5f + gs * (0.5f / n) + chain_term(me + 1, j);
}

// --tagged: the vector between two kernels as (value, tag) pairs, each written by one 8-byte store, so an
// element is whole or absent (NCCL's LL protocol's idea). The reader polls its elements until their tag is
// the writer's (kernel me writes tag me; the chain's input carries IN_TAG) instead of griddepcontrol.wait:
// no fence, no counter, no wait for the whole previous grid. Three buffers in turn: kernel i + 2 overwrites
// what kernel i read only after kernel i + 1 has read all of kernel i's output, so every CTA of kernel i has
// read its input into shared memory by then. A stale element carries another kernel's tag (buffers start at
// tag 0xffffffff; the previous replay's last writers are other kernels).
// one 8-byte access (single-copy atomic; a .v2.u32 pair would be two): value in the low word, tag in the high
__device__ __forceinline__ uint2 ld_relaxed_b64(const uint2* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return make_uint2((unsigned)v, (unsigned)(v >> 32));
}

// every element of src into xs once its tag is `tag`: each thread polls its (at most 4) elements together
__device__ __forceinline__ void poll_tagged(const uint2* src, int n, unsigned tag, float* xs, int sleep_ns) {
  unsigned need = 0;
  for (int k = 0; k < 4; ++k)
    if (threadIdx.x + k * blockDim.x < n) need |= 1u << k;
  while (need) {
    uint2 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (need >> k & 1u) v[k] = ld_relaxed_b64(src + threadIdx.x + k * blockDim.x);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if ((need >> k & 1u) && v[k].y == tag) {
        xs[threadIdx.x + k * blockDim.x] = __uint_as_float(v[k].x);
        need &= ~(1u << k);
      }
    if (need && sleep_ns > 0) __nanosleep(sleep_ns);
  }
  __syncthreads();
}

// src_sum's order over xs (warp 0, lane-strided, then the xor shuffles): the same bits
__device__ __forceinline__ float xs_sum(const float* xs, int n, float* red) {
  return warp0_sum(n, [&](int j) { return xs[j]; }, red);
}

// layer_kernel's pre 2 (share copied before, dependents released at once) with dep 1 / 2, its vectors tagged
extern "C" __global__ void __launch_bounds__(256) tagged_kernel(const uint2* src, uint2* dst, int n, const uint4* w,
                                                                long long w16, int dep, int me, int in_tag,
                                                                int sleep_ns) {
  extern __shared__ __align__(128) uint4 share[];
  __shared__ float red[32];
  __shared__ float xs[1024];
  __shared__ __align__(8) unsigned long long bar;
  long long lo;
  int cnt;
  cta_share(w16, &lo, &cnt);
  const unsigned b = smem_addr(&bar);
  if (threadIdx.x == 0) {
    share_barrier(b, cnt);
    share_copies(share, w + lo, cnt, b);
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  poll_tagged(src, n, (unsigned)in_tag, xs, sleep_ns);  // in place of griddepcontrol.wait
  float s = 0.f, x;
  if (dep == 2) {
    s = xs_sum(xs, n, red);
    x = s;
  } else {
    x = xs[threadIdx.x % n];
  }
  mbar_wait(b, 0);
  const float facc = share_dot(share, cnt, x);
  if (dep != 2) s = xs_sum(xs, n, red);
  s += block_sum(facc, red);
  for (int j = blockIdx.x + gridDim.x * threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    const float v = xs[j] * 0.5f + s * (0.5f / n) + chain_term(me, j);
    const unsigned long long tv = (unsigned long long)(unsigned)me << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(dst + j), "l"(tv) : "memory");
  }
}
"""

LAYER_MB = (8.4, 2.0, 4.2, 12.6, 6.3)  # Qwen3-0.6B at 512 keys: qkv, attention's K/V, o, gate_up, down
LAYER_DEP = (2, 1, 1, 2, 1)  # qkv and gate_up normalise their x themselves (the folded norms)
STREAM_CTAS = (512, 168, 128, 768, 128)  # the real kernels' grids (part256 / part277)
WAYS = (("stream", 0, True), ("pre_late", 1, True), ("pre_early", 2, True), ("stream_nopdl", 0, False))


class ClusterLauncher:
    """cuLaunchKernelEx with PDL and a cluster dimension (--barrier cluster); the kernel allowed a
    non-portable cluster size (16 on Hopper)."""

    def __init__(self, stream_ptr: int, function_ptr: int, size: int):
        import ctypes

        from minillm.backends import pdl

        self.ct, self.pdl, self.size = ctypes, pdl, size
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        status = self.lib.cuFuncSetAttribute(ctypes.c_void_p(function_ptr), 14, 1)  # NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        if status != 0:
            raise RuntimeError(f"cuFuncSetAttribute(non-portable cluster size) failed with CUresult {status}")
        self.lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(pdl._LaunchConfig), ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self.attrs = (pdl._LaunchAttribute * 2)()
        self.attrs[0].id = pdl.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        self.attrs[0].value[0] = 1
        self.attrs[1].id = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: x, y, z
        self.attrs[1].value[0], self.attrs[1].value[1], self.attrs[1].value[2] = size, 1, 1
        self.stream_ptr, self.function_ptr = stream_ptr, function_ptr

    def _config(self, grid: int, threads: int, shared_mem: int, stream_ptr, attrs, n_attrs: int):
        return self.pdl._LaunchConfig(grid, 1, 1, threads, 1, 1, shared_mem, stream_ptr, attrs, n_attrs)

    def launch(self, function_ptr: int, grid, block, args, shared_mem: int = 0) -> None:
        ct = self.ct
        values = [self.pdl.kernel_arg(v) for v in args]
        params = (ct.c_void_p * len(values))(*[ct.cast(ct.pointer(v), ct.c_void_p) for v in values])
        cfg = self._config(grid[0], block[0], shared_mem, ct.c_void_p(self.stream_ptr), self.attrs, 2)
        status = self.lib.cuLaunchKernelEx(ct.byref(cfg), ct.c_void_p(function_ptr), params, None)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernelEx (clusters of {self.size}) failed with CUresult {status}")

    def max_active(self, threads: int, shared_mem: int) -> int:
        """The driver's count of these clusters resident at once (cuOccupancyMaxActiveClusters)."""
        ct = self.ct
        self.lib.cuOccupancyMaxActiveClusters.argtypes = [ct.POINTER(ct.c_int), ct.c_void_p,
                                                          ct.POINTER(self.pdl._LaunchConfig)]
        cfg = self._config(self.size * 8, threads, shared_mem, None, ct.pointer(self.attrs[1]), 1)
        n = ct.c_int(0)
        status = self.lib.cuOccupancyMaxActiveClusters(ct.byref(n), ct.c_void_p(self.function_ptr), ct.byref(cfg))
        return n.value if status == 0 else -status


def share_bytes(w16: int, ctas: int) -> int:
    """A CTA's share of w16 16-byte words in bytes (the kernels' cta_share)."""
    return (w16 + ctas - 1) // ctas * 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mb", default=",".join(map(str, LAYER_MB)), help="a layer's kernels' weight MB")
    ap.add_argument("--dep", default=",".join(map(str, LAYER_DEP)),
                    help="each kernel's wait: 1 on one x element (a product), 2 on the CTA's sum of x (a folded "
                         "norm), 3 on its group's sum (an attention, --groups); as many as --mb "
                         "(--mb 0,0,0 --dep 2,1,1: the hand-offs of three kernels a layer)")
    ap.add_argument("--groups", type=int, default=0,
                    help="G > 0: also the way pre_early_fused, each layer's first two kernels in one grid of G groups "
                         "(needs --dep 2,3,...: the second waits on its group's 1 / G of x)")
    ap.add_argument("--barrier", choices=("counter", "red", "cluster"), default="counter",
                    help="pre_early_fused's group barrier (see above)")
    ap.add_argument("--tagged", action="store_true", help="also the way pre_early_tagged (see above)")
    ap.add_argument("--poll-sleep", type=int, default=32,
                    help="--tagged: ns a polling thread sleeps between rounds that found an element missing (0: none)")
    ap.add_argument("--pre-ctas", type=int, default=0, help="CTAs of each pre_* kernel (default: one an SM)")
    ap.add_argument("--pre-threads", type=int, default=256)
    ap.add_argument("--stream-ctas", type=int, default=0, help="every stream kernel's grid (default: the real ones)")
    ap.add_argument("--ahead", default="",
                    help="comma-separated distances D: a pre_early_l2_D way per D, each kernel also asking the "
                         "weights of the kernel D places later into L2 before its wait")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import cupy
    from handoff_bench import graph_replay_us  # this directory: scripts/ is on sys.path when run as a script

    from minillm.backends.pdl import PdlLauncher

    cuda_dir = Path(__file__).resolve().parent.parent / "cuda"
    mod = cupy.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90a", f"-I{cuda_dir}"))
    fn = mod.get_function("layer_kernel")
    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    pre_ctas = a.pre_ctas or sms
    layer_mb = [float(m) for m in a.mb.split(",")]
    layer_dep = [int(d) for d in a.dep.split(",")]
    if len(layer_mb) != len(layer_dep) or not set(layer_dep) <= {1, 2, 3}:
        raise SystemExit(f"--mb has {len(layer_mb)} entries: --dep needs as many, each 1, 2 or 3")
    n = 1024
    if (3 in layer_dep or a.groups) and (not 1 <= a.groups <= 32 or n % a.groups or layer_dep[:2] != [2, 3]):
        raise SystemExit(f"--groups {a.groups} with --dep {a.dep}: --groups needs a divisor of {n} up to 32 "
                         "and --dep 2,3,... "
                         "(dep 3 needs --groups)")
    if len(layer_mb) != len(STREAM_CTAS) and a.stream_ctas == 0:
        raise SystemExit("--mb with other than five kernels a layer needs --stream-ctas (stream's grid)")
    w16s = [int(m * 1e6) // 16 for _ in range(a.layers) for m in layer_mb]
    deps = [d for _ in range(a.layers) for d in layer_dep]
    nk = len(w16s)
    offs = np.concatenate([[0], np.cumsum(w16s)]).astype(np.int64)
    w = cupy.zeros(int(offs[-1]) * 16 + 16, dtype=np.uint8)  # distinct bytes per kernel: no L2 reuse
    share_max = max(share_bytes(w16, pre_ctas) for w16 in w16s)
    if share_max > 227 * 1024:
        raise SystemExit(f"a CTA's share is {share_max} bytes, over 227 KB: raise --pre-ctas")
    fn.max_dynamic_shared_size_bytes = share_max
    fused = mod.get_function("fused_kernel")
    fused_ctas = sms // a.groups * a.groups if a.groups else 0  # whole groups of SMs
    if a.groups:
        fused_share = share_bytes(w16s[0], fused_ctas) + share_bytes(w16s[1], fused_ctas)
        if fused_share > 227 * 1024:
            raise SystemExit(f"the fused kernel's CTA holds {fused_share} bytes, over 227 KB")
        fused.max_dynamic_shared_size_bytes = fused_share
    counters = cupy.zeros(max(1, a.layers * a.groups), dtype=np.uint32)  # the fused kernels' group counters
    barrier = ("counter", "red", "cluster").index(a.barrier)
    x0 = cupy.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    bufs = [cupy.empty(n, dtype=np.float32) for _ in range(3)]  # kernel i writes bufs[i % 3]
    tagged = mod.get_function("tagged_kernel")
    if a.tagged:
        if 3 in layer_dep or n > 4 * a.pre_threads:
            raise SystemExit("--tagged takes --dep of 1s and 2s, and at most 4 elements a thread")
        tagged.max_dynamic_shared_size_bytes = share_max
    # the chain's input carries tag 0xfffffffe (-2 as the kernel's int); the buffers start at 0xffffffff
    x0_tagged = cupy.stack([x0.view(np.uint32), cupy.full(n, 0xFFFFFFFE, dtype=np.uint32)], axis=1)
    tbufs = [cupy.full((n, 2), 0xFFFFFFFF, dtype=np.uint32) for _ in range(3)]
    stream = cupy.cuda.Stream(non_blocking=True)
    cluster_launch = None  # --barrier cluster: each group a cluster
    if a.groups and barrier == 2:
        cluster_launch = ClusterLauncher(stream.ptr, fused.kernel.ptr, fused_ctas // a.groups)
    pdl = PdlLauncher(stream.ptr)

    def chain(pre: int, use_pdl: bool, ahead: int = 0, fuse: bool = False, tag: bool = False) -> None:
        if tag:  # pre_early's launches on tagged_kernel
            for i in range(nk):
                src = x0_tagged if i == 0 else tbufs[(i - 1) % 3]
                args = (src, tbufs[i % 3], np.int32(n), w[int(offs[i]) * 16:], np.int64(w16s[i]), np.int32(deps[i]),
                        np.int32(i), np.int32(-2 if i == 0 else i - 1), np.int32(a.poll_sleep))
                pdl.launch(tagged.kernel.ptr, (pre_ctas,), (a.pre_threads,), args,
                           shared_mem=share_bytes(w16s[i], pre_ctas))
            return
        if fuse:
            cupy.cuda.runtime.memsetAsync(counters.data.ptr, 0, counters.nbytes, stream.ptr)
        per_layer = len(layer_mb)
        for i in range(nk):
            src = x0 if i == 0 else bufs[(i - 1) % 3]
            wp = w[int(offs[i]) * 16:]
            if fuse and i % per_layer == 1:
                continue  # done by the fused kernel before it
            if fuse and i % per_layer == 0:
                smem = share_bytes(w16s[i], fused_ctas) + share_bytes(w16s[i + 1], fused_ctas)
                fargs = (src, bufs[i % 3], bufs[(i + 1) % 3], np.int32(n), wp, np.int64(w16s[i]),
                         w[int(offs[i + 1]) * 16:], np.int64(w16s[i + 1]), np.int32(i), np.int32(a.groups),
                         counters[i // per_layer * a.groups:], np.int32(barrier))
                (cluster_launch or pdl).launch(fused.kernel.ptr, (fused_ctas,), (a.pre_threads,), fargs,
                                               shared_mem=smem)
                continue
            j = i + ahead
            pf, pf16 = (w[int(offs[j]) * 16:], w16s[j]) if ahead and j < nk else (w, 0)
            args = (src, bufs[i % 3], np.int32(n), wp, np.int64(w16s[i]), np.int32(pre), np.int32(deps[i]),
                    np.int32(i), pf, np.int64(pf16), np.int32(max(1, a.groups)))
            if pre:
                grid, block, smem = pre_ctas, a.pre_threads, share_bytes(w16s[i], pre_ctas)
            else:
                grid, block, smem = a.stream_ctas or STREAM_CTAS[i % len(STREAM_CTAS)], 128, 0
            if use_pdl:
                pdl.launch(fn.kernel.ptr, (grid,), (block,), args, shared_mem=smem)
            else:
                with stream:
                    fn((grid,), (block,), args, shared_mem=smem)

    rows, ref = [], None
    ways = [(name, pre, use_pdl, 0, False, False) for name, pre, use_pdl in WAYS]
    ways += [(f"pre_early_l2_{d}", 2, True, int(d), False, False) for d in a.ahead.split(",") if d]
    if a.groups:
        ways.append(("pre_early_fused", 2, True, 0, True, False))
    if a.tagged:
        ways.append(("pre_early_tagged", 2, True, 0, False, True))
    for name, pre, use_pdl, ahead, fuse, tag in ways:
        chain(pre, False, 0, fuse, tag)  # load the module outside the capture
        stream.synchronize()
        times = graph_replay_us(stream, lambda pre=pre, use_pdl=use_pdl, ahead=ahead, fuse=fuse, tag=tag:
                                chain(pre, use_pdl, ahead, fuse, tag), a.reps)
        if tag:  # the values, the low words
            out = np.ascontiguousarray(cupy.asnumpy(tbufs[(nk - 1) % 3])[:, 0]).view(np.float32)
        else:
            out = cupy.asnumpy(bufs[(nk - 1) % 3])
        if ref is None:
            ref = out
        us = float(np.median(times))
        layer_bytes = sum(w16s[:len(layer_mb)]) * 16
        row = {"way": name, "graph_us": round(us, 2), "per_layer_us": round(us / a.layers, 2),
               "layer_bytes": layer_bytes, "stream_TBps": round(layer_bytes * a.layers / us / 1e6, 3),
               "same_bits_as_stream": bool(np.array_equal(out, ref)), "kernels": nk, "pdl": use_pdl, "l2_ahead": ahead,
               "ctas": pre_ctas if pre else a.stream_ctas or list(STREAM_CTAS), "fused_ctas": fused_ctas if fuse else 0,
               "barrier": a.barrier if fuse else None,
               "clusters_at_once": cluster_launch.max_active(a.pre_threads, fused_share) if fuse and cluster_launch
               else None,
               "threads": a.pre_threads if pre else 128, "poll_sleep_ns": a.poll_sleep if tag else None,
               "layer_mb": layer_mb, "layer_dep": layer_dep, "spread_us": [round(min(times), 2), round(max(times), 2)]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if not all(r["same_bits_as_stream"] for r in rows):
        raise SystemExit("a way's result differs from stream's: its kernels ran out of order")


if __name__ == "__main__":
    main()
