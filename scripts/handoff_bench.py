"""What a kernel-to-kernel hand-off costs in a CUDA graph, by how the next kernel waits (a GPU diagnostic).

    PYTHONPATH=. python scripts/handoff_bench.py [--layers 28] [--no-weights] [--json F]

A batch-1 decode step is a chain of ~200 dependent kernels, and its timeline (scripts/step_timeline.py)
puts ~1 us of hand-off before each. This times a synthetic chain with the 0.6B step's layer shape
(7 kernels a layer: CTAs 1, 512, 88, 128, 1, 384, 128 of 128 threads; with weights, each streams its
product's bytes after its wait, 8.4 / 2 / 4.2 / 12.6 / 6.3 MB) three ways, one CUDA graph each:
  - plain: stream order, no PDL;
  - pdl: programmatic dependent launch, griddepcontrol.wait at entry and launch_dependents after the
    main loop (the project's kernels, cuda/common.cuh);
  - flag: launched with PDL too, but without griddepcontrol.wait: every CTA, after its stores,
    adds one to its kernel's counter (__threadfence + atomicAdd), and the next kernel's CTAs spin
    on that counter (ld.acquire.gpu) until it holds the previous grid's CTA count. It releases its
    dependents right after that spin. Kernel i zeroes kernel i-2's counter (all of kernel i-1's
    CTAs are past their spin once kernel i is launched).
With --fold, a kernel's last CTA to finish (a counter, __threadfence + atomicAdd) also does a one-CTA
kernel's work on the whole vector it wrote, the way a product could take the RMSNorm after it.
With --dep, a kernel's weight sums wait on one element of the previous vector (1: a product's x)
or on the CTA's sum of all of it (2: a product normalising its own x, the norm folded forward).
Each kernel reads the whole previous vector (4 KB) and writes its slice of the next (half of each
value, half the mean, and a term of its own, so values stay bounded and a stale read shows), so a
wrong order changes the result: every way's final vector is checked against plain's, bit for bit.
(Until session 34's last call the update grew the values until long chains overflowed: the 8B
--dep chain then reported a mismatch for every way, plain included.)
Reports the median replay per kernel and per layer (3 warm-up replays, median of 20).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SRC = r"""
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// every thread gets the CTA's sum (red: 32 floats)
__device__ __forceinline__ float block_sum(float s, float* red) {
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : 0.f;
  for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  __syncthreads();
  return t;
}
// dep: what the weight stream's sums wait on: nothing (0), this thread's element of src (1, as a
// product's FMAs wait on its x chunks), the CTA's sum of all of src (2, as a product that
// normalises its x itself would wait on the sum of squares)
template <int MODE>
__device__ __forceinline__ void step(const float* src, float* dst, int n, unsigned* cnt, int me, int prev,
                                     unsigned need, int reset, const uint4* w, long long w16, int fold,
                                     unsigned* fcnt, int dep) {
  __shared__ float red[32];
  __shared__ bool last;
  if (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (MODE == 2) {
    if (threadIdx.x == 0 && prev >= 0)
      while (ld_acquire(cnt + prev) < need) {}
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) cnt[reset] = 0u;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  float s = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += src[j];
  float x = 0.f;
  if (dep == 2) {
    s = block_sum(s, red);
    x = s;
  } else if (dep == 1) {
    x = src[threadIdx.x % n];
  }
  // this CTA's share of the kernel's weight bytes, 4 loads in flight a thread
  unsigned acc = 0;
  float facc = 0.f;  // the weights are zero: stays +0
  const long long per = (w16 + gridDim.x - 1) / gridDim.x, lo = per * blockIdx.x;
  const long long hi = lo + per < w16 ? lo + per : w16;
  long long i = lo + threadIdx.x;
  for (; i + 3 * blockDim.x < hi; i += 4 * blockDim.x) {
    const uint4 a = __ldg(w + i), b = __ldg(w + i + blockDim.x), c = __ldg(w + i + 2 * blockDim.x),
                d = __ldg(w + i + 3 * blockDim.x);
    if (dep) {
      facc = fmaf(__uint_as_float(a.x), x, facc);
      facc = fmaf(__uint_as_float(b.y), x, facc);
      facc = fmaf(__uint_as_float(c.z), x, facc);
      facc = fmaf(__uint_as_float(d.w), x, facc);
    } else {
      acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
  }
  for (; i < hi; i += blockDim.x) acc ^= __ldg(w + i).x;
  if (acc == 0x9e3779b9u) s += 1.f;  // keeps the loads; never taken on the zero weights
  if (dep != 2) s = block_sum(s, red);
  s += facc;
  if (MODE == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)
    dst[j] = src[j] * 0.5f + s * (0.5f / n) + 1e-3f * (float)((me * 31 + j) % 17);  // bounded, per kernel
  if (fold) {  // the CTA that arrives last does a one-CTA kernel's work on the whole vector
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(fcnt + me, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last) {
      __threadfence();
      float t = 0.f;
      for (int j = threadIdx.x; j < n; j += blockDim.x) t += __ldcg(dst + j);
      t = block_sum(t, red);
      for (int j = threadIdx.x; j < n; j += blockDim.x)
        dst[j] = __ldcg(dst + j) * 0.5f + t * (0.5f / n) + 1e-3f * (float)((me * 7 + j) % 13);
      if (threadIdx.x == 0) fcnt[me] = 0u;
    }
  }
  if (MODE == 2) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(cnt + me, 1u);
    }
  }
}
#define K(MODE)                                                                                      \
  extern "C" __global__ void __launch_bounds__(128) step##MODE(                                      \
      const float* src, float* dst, int n, unsigned* cnt, int me, int prev, unsigned need, int reset, \
      const uint4* w, long long w16, int fold, unsigned* fcnt, int dep) {                            \
    step<MODE>(src, dst, n, cnt, me, prev, need, reset, w, w16, fold, fcnt, dep);                    \
  }
K(0)
K(1)
K(2)
"""

def graph_replay_us(stream, record, reps: int, warmup: int = 3) -> list[float]:
    """record()'s launches captured into one CUDA graph on stream, then each of reps replays timed by
    CUDA events after warmup ones (us); scripts/preload_bench.py times its chains the same way."""
    import cupy

    stream.synchronize()
    with stream:
        stream.begin_capture()
        record()
        graph = stream.end_capture()
    graph.upload(stream)
    times = []
    for r in range(warmup + reps):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(stream)
        graph.launch(stream)
        e.record(stream)
        e.synchronize()
        if r >= warmup:
            times.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
    return times


LAYER_CTAS = (1, 512, 88, 128, 1, 384, 128)
LAYER_MB = (0.0, 8.4, 2.0, 4.2, 0.0, 12.6, 6.3)  # Qwen3-0.6B: qkv, attention's KV at 512, o, gate_up, down


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--no-weights", action="store_true", help="kernels stream no weight bytes")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ctas", default=",".join(map(str, LAYER_CTAS)), help="a layer's kernels' CTA counts")
    ap.add_argument("--mb", default=",".join(map(str, LAYER_MB)), help="a layer's kernels' weight MB")
    ap.add_argument("--fold", default=None, help="a layer's kernels whose last CTA does a one-CTA kernel's "
                    "work after them (0/1 each; default none)")
    ap.add_argument("--dep", default=None, help="a layer's kernels' dependence of their weight sums: 0 none, "
                    "1 a src element (a product's x), 2 the CTA's sum of src (a product normalising x itself); "
                    "default 0 each")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import cupy

    from minillm.backends.pdl import PdlLauncher

    mod = cupy.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90a"))
    fns = [mod.get_function(f"step{m}") for m in range(3)]
    stream = cupy.cuda.Stream(non_blocking=True)
    pdl = PdlLauncher(stream.ptr)
    n = 1024
    layer_ctas = [int(c) for c in a.ctas.split(",")]
    layer_mb = [float(m) for m in a.mb.split(",")]
    if len(layer_mb) != len(layer_ctas):
        raise SystemExit("--ctas and --mb need one entry per kernel of a layer")
    layer_fold = [int(f) for f in a.fold.split(",")] if a.fold else [0] * len(layer_ctas)
    if len(layer_fold) != len(layer_ctas):
        raise SystemExit("--fold needs one entry per kernel of a layer")
    layer_dep = [int(d) for d in a.dep.split(",")] if a.dep else [0] * len(layer_ctas)
    if len(layer_dep) != len(layer_ctas) or any(d not in (0, 1, 2) for d in layer_dep):
        raise SystemExit("--dep needs one entry of 0, 1 or 2 per kernel of a layer")
    ctas = [c for _ in range(a.layers) for c in layer_ctas]
    deps = [d for _ in range(a.layers) for d in layer_dep]
    folds = [f for _ in range(a.layers) for f in layer_fold]
    mbs = [0.0 if a.no_weights else m for _ in range(a.layers) for m in layer_mb]
    nk = len(ctas)
    w = cupy.zeros(int(max(mbs) * 1e6) // 16 * 16 + 16, dtype=np.uint8)
    x0 = cupy.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    bufs = [cupy.empty(n, dtype=np.float32) for _ in range(2)]
    cnt = cupy.zeros(nk, dtype=np.uint32)
    fcnt = cupy.zeros(nk, dtype=np.uint32)

    def chain(mode: int) -> None:
        for i in range(nk):
            src = x0 if i == 0 else bufs[(i - 1) % 2]
            args = (src, bufs[i % 2], np.int32(n), cnt, np.int32(i), np.int32(i - 1),
                    np.int32(ctas[i - 1] if i else 0), np.int32((i - 2) % nk), w,
                    np.int64(int(mbs[i] * 1e6) // 16), np.int32(folds[i]), fcnt, np.int32(deps[i]))
            if mode == 0:
                with stream:
                    fns[0]((ctas[i],), (128,), args)
            else:
                pdl.launch(fns[mode].kernel.ptr, (ctas[i],), (128,), args)

    rows, ref = [], None
    for mode, name in enumerate(("plain", "pdl", "flag")):
        chain(0)  # load the module's kernels outside the capture
        times = graph_replay_us(stream, lambda mode=mode: chain(mode), a.reps)
        out = cupy.asnumpy(bufs[(nk - 1) % 2])
        if ref is None:
            ref = out
        same = bool(np.array_equal(out, ref))
        us = float(np.median(times))
        row = {"way": name, "graph_us": round(us, 2), "per_kernel_us": round(us / nk, 3),
               "per_layer_us": round(us / a.layers, 2), "same_bits_as_plain": same,
               "weights": not a.no_weights, "kernels": nk, "layer_ctas": layer_ctas, "layer_mb": layer_mb,
               "layer_fold": layer_fold, "layer_dep": layer_dep}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if not all(r["same_bits_as_plain"] for r in rows):
        raise SystemExit("a way's result differs from plain's: its kernels ran out of order")


if __name__ == "__main__":
    main()
