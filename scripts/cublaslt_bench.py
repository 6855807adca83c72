"""The engine's cuBLAS products (GemmEx, one heuristic algorithm) against every cuBLASLt candidate.

    python scripts/cublaslt_bench.py [--json F]

For the decode-step products of large batches (the 0.6B model's four matrices at 32-256 rows, the
throughput workload's decode steps; the 8B model's at 16-144 rows, speculative verification) each
runs inside a CUDA graph of 20 back-to-back calls (CUDA events, median of 10 replays), first through
CudaBackend.matmul (cublasGemmEx) and then through each algorithm cublasLtMatmulAlgoGetHeuristic
offers (minillm/backends/cublaslt.py). Each candidate's product is checked against GemmEx's. It
prints GemmEx's time and weight-read bandwidth, the best candidate's, and their ratio: whether
choosing an algorithm per shape at startup would pay (session 8 measured cuBLAS at ~1 TB/s on
these products, 13.5% of a batch-192 decode step). Its answer on the H200 (part59): 0.99-1.10x,
so the engine keeps GemmEx (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, N, K): out [M, N] = x [M, K] @ w [N, K].T
SHAPES_06B = [("0.6B qkv", 4096, 1024), ("0.6B o", 1024, 2048), ("0.6B gate_up", 6144, 1024),
              ("0.6B down", 1024, 3072)]
SHAPES_8B = [("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 24576, 4096), ("8B down", 4096, 12288)]
ROWS_06B = (32, 64, 128, 192, 256)
ROWS_8B = (32, 144)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    from minillm.backends.cublas import cuda_dtype
    from minillm.backends.cublaslt import CublasLt
    from minillm.backends.cuda_ops import CudaBackend
    from minillm.bench.gpu_timing import graph_us
    from minillm.bench.report import write_json

    be = CudaBackend()
    lt = CublasLt(be.stream.ptr, be._blas_ws.data.ptr, be._blas_ws.nbytes)
    t = cuda_dtype(be.dtype)
    rng = np.random.default_rng(0)
    results = []
    print(f"{'product':14s} {'M':>4s} {'GemmEx us':>10s} {'TB/s':>6s} {'best Lt us':>10s} {'TB/s':>6s} "
          f"{'ratio':>6s} {'cands':>5s} {'best':>4s} {'max rel diff':>12s}")
    for shapes, rows in ((SHAPES_06B, ROWS_06B), (SHAPES_8B, ROWS_8B)):
        for label, N, K in shapes:
            w = be.asarray(rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K))
            wbytes = N * K * w.itemsize
            for M in rows:
                x = be.asarray(rng.standard_normal((M, K), dtype=np.float32))
                out, ref = be.empty((M, N)), be.empty((M, N))
                ex_us = graph_us(be, lambda x=x, w=w, out=ref: be.matmul(x, w, out))
                want = np.asarray(be.to_host(ref), np.float32)
                prod = lt.product(M, N, K, t, K, t, K, t, N)
                times, diffs = [], []
                for i in range(len(prod.candidates)):
                    try:
                        us = graph_us(be, lambda i=i, x=x, w=w, out=out, prod=prod: lt.matmul(
                            prod, i, x.data.ptr, w.data.ptr, out.data.ptr))
                    except Exception as e:  # noqa: BLE001 - a candidate that fails is reported, not fatal
                        print(f"  {label} M={M} candidate {i}: {e}")
                        continue
                    got = np.asarray(be.to_host(out), np.float32)
                    diffs.append(float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)))
                    times.append((us, i))
                best_us, best_i = min(times) if times else (float("nan"), -1)
                row = dict(product=label, M=M, N=N, K=K, gemmex_us=ex_us, gemmex_tbps=wbytes / ex_us / 1e6,
                           best_us=best_us if times else None,  # no candidate: null, not NaN
                           best_tbps=wbytes / best_us / 1e6 if times else None, best_index=best_i,
                           candidates=len(prod.candidates),
                           us_by_candidate={i: u for u, i in times},
                           max_rel_diff=max(diffs) if diffs else None)
                results.append(row)
                print(f"{label:14s} {M:4d} {ex_us:10.1f} {row['gemmex_tbps']:6.2f} {best_us:10.1f} "
                      f"{row['best_tbps']:6.2f} {ex_us / best_us:6.2f} {len(prod.candidates):5d} {best_i:4d} "
                      f"{row['max_rel_diff'] or 0:12.2e}", flush=True)
            w = None
    lt.close()
    if ns.json:
        write_json(ns.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
