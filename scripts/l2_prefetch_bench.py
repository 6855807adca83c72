"""Does an L2 prefetch issued ahead of a GEMV make it faster? (a GPU diagnostic, session 7)

A batch-1 decode step leaves HBM nearly idle between its GEMVs (norms, q/k norm + RoPE, attention
over a short context take ~25 us a layer on the 8B shape). This measures whether that time can
pull the next GEMV's weights into L2 with cp.async.bulk.prefetch.L2, fire-and-forget (in
isolation it can; inside a decode step it made the step slower: docs/BENCHMARKS.md, session 7):

  cold      L2 flushed (a 512 MB fill), a spin kernel of T us, then the GEMV
  hot       the same GEMV, then a 20 us spin, then the timed GEMV (what L2 can give at most;
            matrices over ~40 MB do not fit). The spin keeps the GPU busy while the host queues
            the timed launch; part43 ran without it, and its hot_us values are host launch time
  pf        flush, l2_prefetch of the first FRAC of the matrix by a grid of G CTAs x 32 threads,
            the spin kernel of T us (the latency-bound kernels the prefetch would hide behind),
            then the GEMV

Times are CUDA events around the GEMV alone (and around the prefetch kernel alone), median of
REPS. A 0.6B "layer" case runs the four GEMVs of a layer back to back with 3 us spins between them
(the small kernels), cold and after one prefetch of the whole layer (31 MB) issued before it.

    PYTHONPATH=. python scripts/l2_prefetch_bench.py [--json F]
"""

# ruff: noqa: B023 (every lambda below is called before its loop moves on)
from __future__ import annotations

import argparse
import json

import numpy as np

from minillm.backends import compile as kc

SHAPES = {  # name: (K, N, gated)
    "0.6B qkv": (1024, 4096, False), "0.6B o": (2048, 1024, False),
    "0.6B gate_up": (1024, 3072, True), "0.6B down": (3072, 1024, False),
    "8B qkv": (4096, 6144, False), "8B o": (4096, 4096, False),
    "8B gate_up": (4096, 12288, True), "8B down": (12288, 4096, False),
}
REPS = 15
# cp.async.bulk.prefetch.L2 (sm_90) is fire-and-forget: a thread issues it and moves on, the copy
# engine fills L2 in the background. One SM's copy engine alone is too slow for tens of megabytes,
# so every thread of the grid issues pieces of PF_PIECE bytes, round-robin.
PREFETCH = r"""
typedef long long i64;
#define PF_MAX_RANGES 4
#ifndef PF_PIECE
#define PF_PIECE 16384
#endif

__device__ __forceinline__ void l2_prefetch_bulk(const char* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// grid any, block any: piece i of the concatenated ranges (p0, b0), ..., (p3, b3) goes to global
// thread i mod threads; unused ranges have 0 bytes.
extern "C" __global__ void l2_prefetch(const char* p0, i64 b0, const char* p1, i64 b1,
                                       const char* p2, i64 b2, const char* p3, i64 b3) {
  const char* ptr[PF_MAX_RANGES] = {p0, p1, p2, p3};
  const i64 bytes[PF_MAX_RANGES] = {b0, b1, b2, b3};
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 threads = (i64)gridDim.x * blockDim.x;
  i64 base = 0;  // index of range j's first piece among all pieces
#pragma unroll
  for (int j = 0; j < PF_MAX_RANGES; ++j) {
    const i64 pieces = (bytes[j] + PF_PIECE - 1) / PF_PIECE;
    // this thread's first piece of range j: the smallest i >= base with i % threads == tid
    for (i64 i = base + ((tid - base) % threads + threads) % threads; i < base + pieces; i += threads) {
      const i64 off = (i - base) * PF_PIECE;
      const i64 left = bytes[j] - off;
      l2_prefetch_bulk(ptr[j] + off, (unsigned)(left < PF_PIECE ? left : PF_PIECE));
    }
    base += pieces;
  }
}
"""
SPIN = r"""
extern "C" __global__ void spin(long long ns) {  // one thread waits ns on the global timer
  if (threadIdx.x != 0) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);
}
"""


class Bench:
    def __init__(self, piece: int):
        import cupy as cp

        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.flush_buf = cp.zeros(512 << 20, dtype=cp.uint8)
        self.spin_k = cp.RawKernel(SPIN, "spin")
        self.gemv = kc.get_kernel("gemv", "gemv_bf16")
        self.gemv_silu = kc.get_kernel("gemv", "gemv_silu_mul_bf16")
        self.pf = cp.RawModule(code=PREFETCH, options=("-arch=sm_90a", "-std=c++17", f"-DPF_PIECE={piece}")
                               ).get_function("l2_prefetch")
        self.x = cp.ones((1, 12288), dtype=cp.uint16)  # bf16 bits: every x fits in it
        self.out = cp.zeros((1, 24576), dtype=cp.uint16)

    def flush(self):
        with self.stream:
            self.flush_buf.fill(1)

    def spin(self, us: float):
        self.spin_k((1,), (32,), (np.int64(us * 1000),), stream=self.stream)

    def run_gemv(self, w, K: int, N: int, gated: bool):
        i64, i32 = np.int64, np.int32
        if gated:
            F = N // 2
            self.gemv_silu(((F + 7) // 8,), (128,), (self.x, i64(K), w, self.out, i64(F), i32(1),
                                                   i32(F), i32(K)), stream=self.stream)
        else:
            self.gemv(((N + 7) // 8,), (128,), (self.x, i64(K), w, np.uint64(0), self.out, i64(N),
                                               i32(1), i32(N), i32(K)), stream=self.stream)

    def prefetch(self, ranges: list[tuple[int, int]], ctas: int):
        args = []
        for j in range(4):
            p, b = ranges[j] if j < len(ranges) else (0, 0)
            args += [np.uint64(p), np.int64(b)]
        self.pf((ctas,), (32,), tuple(args), stream=self.stream)

    def timed(self, fn) -> float:
        cp = self.cp
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(self.stream)
        fn()
        e.record(self.stream)
        e.synchronize()
        return cp.cuda.get_elapsed_time(s, e) * 1e3

    def median(self, before, fn) -> float:
        times = []
        for _ in range(REPS + 2):
            before()
            times.append(self.timed(fn))
        return float(np.median(times[2:]))


def weight(cp, N: int, K: int):
    w = cp.random.randint(0x3C00, 0x3C80, size=(N, K), dtype=cp.uint16)  # bf16 around 0.01
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import cupy as cp

    rows = []
    bench = Bench(piece=16384)
    for name, (K, N, gated) in SHAPES.items():
        w = weight(cp, N, K)
        nbytes = w.nbytes
        def g():
            return bench.run_gemv(w, K, N, gated)
        cold = bench.median(lambda: (bench.flush(), bench.spin(20)), g)
        hot = bench.median(lambda: (g(), bench.spin(20)), g)
        row = {"shape": name, "MB": nbytes / 1e6, "cold_us": cold, "hot_us": hot}
        for ctas in (132, 32):
            for frac in (1.0, 0.5):
                nb = int(nbytes * frac) // 16 * 16
                pf_us = bench.median(bench.flush, lambda: bench.prefetch([(w.data.ptr, nb)], ctas))
                row[f"pf_kernel_us_g{ctas}_f{frac}"] = pf_us
                for T in (0, 3, 10, 25):
                    row[f"pf_us_g{ctas}_f{frac}_T{T}"] = bench.median(
                        lambda: (bench.flush(), bench.prefetch([(w.data.ptr, nb)], ctas), bench.spin(T)), g)
        rows.append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
              flush=True)
        del w

    # a 0.6B layer: the four GEMVs with 3 us spins between them, cold and after one prefetch
    ws = {n: weight(cp, SHAPES[n][1], SHAPES[n][0]) for n in SHAPES if n.startswith("0.6B")}
    total = sum(w.nbytes for w in ws.values())

    def layer():
        for n, w in ws.items():
            K, N, gated = SHAPES[n]
            bench.run_gemv(w, K, N, gated)
            bench.spin(3)

    ranges = [(w.data.ptr, w.nbytes) for w in ws.values()]
    lay = {"shape": "0.6B layer (4 GEMVs + 4 x 3 us spins)", "MB": total / 1e6,
           "cold_us": bench.median(lambda: (bench.flush(), bench.spin(20)), layer),
           "hot_us": bench.median(lambda: (layer(), bench.spin(20)), layer)}
    for T in (0, 10, 25):
        lay[f"pf_us_g132_T{T}"] = bench.median(
            lambda: (bench.flush(), bench.prefetch(ranges, 132), bench.spin(T)), layer)
    rows.append(lay)
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in lay.items()}), flush=True)

    piece = {}
    for pc in (4096, 65536):
        b2 = Bench(piece=pc)
        w = weight(cp, 4096, 4096)
        def g():
            return b2.run_gemv(w, 4096, 4096, False)
        piece[pc] = {T: b2.median(lambda: (b2.flush(), b2.prefetch([(w.data.ptr, w.nbytes)], 132), b2.spin(T)), g)
                     for T in (3, 10)}
        piece[pc]["kernel"] = b2.median(b2.flush, lambda: b2.prefetch([(w.data.ptr, w.nbytes)], 132))
    print("8B o by piece size (us):", json.dumps(piece), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "piece": {str(k): v for k, v in piece.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
