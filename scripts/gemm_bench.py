"""cuda/gemm.cu against cuBLAS GemmEx on the products of large-batch decode steps.

    python scripts/gemm_bench.py [--rows 32,64,128,192,256] [--shapes 0.6b|8b|all]
                                 [--variant GW_NO_MMA=1 ...] [--json F]

For the Qwen3-0.6B shape's four products (the throughput workload's decode steps at 17-256
sequences) and the Qwen3-8B shape's (decode at 17-64 sequences; speculative verification, 16 x 9 =
144 rows) each product runs inside a CUDA graph of 20 back-to-back calls (CUDA events, median of
10 replays), once through CudaBackend.matmul with cuda/gemm.cu and once with it switched off
(cuBLAS GemmEx, what the engine used before). Printed per shape and row count: both times, the
weights' read rate and the tensor throughput of the faster, the ratio, and the largest relative
difference between the two products (both bf16 outputs of fp32 sums). Each --variant (compile-time
defines of cuda/gemm.cu, MINILLM_CUDA_DEFINES) is timed in a child process after the default build.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, N, K): out [M, N] = x [M, K] @ w [N, K].T
SHAPES_06B = [("0.6B qkv", 4096, 1024), ("0.6B o", 1024, 2048), ("0.6B gate_up", 6144, 1024),
              ("0.6B down", 1024, 3072)]
SHAPES_8B = [("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 24576, 4096), ("8B down", 4096, 12288)]
ROWS_8B = (32, 64, 144)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="17,32,64,128,192,256", help="rows of x for the 0.6B products")
    p.add_argument("--shapes", default="all", choices=["0.6b", "8b", "all"])
    p.add_argument("--variant", action="append", default=[], help="defines for cuda/gemm.cu, e.g. GW_NO_MMA=1")
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    for v in ns.variant:  # each build in its own process (kernels compile once a process)
        print(f"== variant {v}", flush=True)
        args = [sys.executable, __file__, "--rows", ns.rows, "--shapes", ns.shapes]
        subprocess.run(args, env={**os.environ, "MINILLM_CUDA_DEFINES": v}, check=False)
    if ns.variant:
        print("== default build", flush=True)
    from minillm.backends.cuda_ops import CudaBackend, wide_product_plan
    from minillm.bench.gpu_timing import graph_us
    from minillm.bench.report import write_json

    be = CudaBackend()
    rng = np.random.default_rng(0)
    rows_06b = tuple(int(r) for r in ns.rows.split(","))
    results = []
    print(f"{'product':14s} {'M':>4s} {'plan':>6s} {'cuBLAS us':>9s} {'gemm.cu us':>10s} {'ratio':>6s} "
          f"{'TB/s':>6s} {'TFLOP/s':>8s} {'max rel diff':>12s}", flush=True)
    sets = {"0.6b": [(SHAPES_06B, rows_06b)], "8b": [(SHAPES_8B, ROWS_8B)],
            "all": [(SHAPES_06B, rows_06b), (SHAPES_8B, ROWS_8B)]}[ns.shapes]
    for shapes, rows in sets:
        for label, N, K in shapes:
            w = be.asarray(rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K))
            wbytes = N * K * w.itemsize
            for M in rows:
                x = be.asarray(rng.standard_normal((M, K), dtype=np.float32))
                outs = {}
                us = {}
                for on in (False, True):
                    be.wide_gemm = on
                    out = be.empty((M, N))
                    be.matmul(x, w, out)  # eagerly first: cuda/gemm.cu's module loads on first use
                    us[on] = graph_us(be, lambda x=x, w=w, out=out: be.matmul(x, w, out))
                    outs[on] = np.asarray(be.to_host(out), np.float32)
                be.wide_gemm = True
                ref = outs[False]
                diff = float(np.max(np.abs(outs[True] - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
                best = min(us.values())
                plan = wide_product_plan(M, N, K, be.num_sms)
                tag = f"{plan[0]}x{plan[1]}" if plan else "-"
                print(f"{label:14s} {M:4d} {tag:>6s} {us[False]:9.1f} {us[True]:10.1f} {us[False] / us[True]:6.2f} "
                      f"{wbytes / best / 1e6:6.2f} {2 * M * N * K / best / 1e6:8.1f} {diff:12.2e}", flush=True)
                results.append({"product": label, "M": M, "N": N, "K": K, "plan": plan,
                                "cublas_us": round(us[False], 2), "gemm_us": round(us[True], 2),
                                "max_rel_diff": diff if np.isfinite(diff) else None})
    if ns.json:
        write_json(ns.json, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
