"""Products of a few rows timed inside CUDA graphs: cuda/gemv.cu's kernels against cuBLAS.

    PYTHONPATH=. python scripts/skinny_bench.py [--json F]

For each decode-shaped weight of the Qwen3-0.6B and -8B shapes and M rows of x (1: the GEMV;
2-16: the tensor-core skinny GEMM), the backend's own choice and cuBLAS on the same product run as
chains of 20 launches in a graph (CUDA events, median of 10 replays): microseconds per product and
weight bytes per second. Rows both kernels can take (1-4) are also timed through the other one
(`small_product_kernel` in minillm/backends/cuda_ops.py decides from these figures). Speculative
verification at concurrency 1 (k = 8) runs 9 rows, decode buckets 8 and 16 their sizes.
`--rows 17,18,24,32` times the four-tile gemm_skinny4_* (17-32 rows; the default routing sends it
only 17-20 rows of the large narrowing products) for every weight, the routing's row bounds raised
to 32 for "ours": the c = 2 DFlash round verifies 18 rows, its drafter 32.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import ml_dtypes
import numpy as np

from minillm.backends import cuda_ops
from minillm.backends.cuda_ops import CudaBackend
from minillm.bench.gpu_timing import graph_us

SHAPES = {  # name: (K, N)
    "0.6B qkv": (1024, 4096), "0.6B o": (2048, 1024), "0.6B gate_up": (1024, 6144),
    "0.6B down": (3072, 1024), "8B qkv": (4096, 6144), "8B o": (4096, 4096),
    "8B gate_up": (4096, 24576), "8B down": (12288, 4096),
}
ROWS = (1, 2, 3, 4, 5, 8, 9, 16)


# the routing constants that keep every product off the skinny kernels (the narrowing route too)
_NO_SKINNY = {"_SKINNY_MAX_M": 0, "_SKINNY_NARROW_MAX_M": 0}


@contextlib.contextmanager
def routes(**values: int):
    """minillm.backends.cuda_ops's routing constants set to values inside the block, restored after."""
    saved = {k: getattr(cuda_ops, k) for k in values}
    for k, v in values.items():
        setattr(cuda_ops, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(cuda_ops, k, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts (1-32)")
    ap.add_argument("--shapes", default=None, help="comma-separated SHAPES names (default: all)")
    a = ap.parse_args()
    rows_list = [int(r) for r in a.rows.split(",")]
    if not all(1 <= r <= cuda_ops._SKINNY_KERNEL_MAX_M for r in rows_list):
        ap.error(f"--rows: each count must be 1-{cuda_ops._SKINNY_KERNEL_MAX_M}, got {a.rows}")
    shapes = SHAPES if a.shapes is None else {n: SHAPES[n] for n in a.shapes.split(",") if n in SHAPES}
    if a.shapes is not None and len(shapes) != len(a.shapes.split(",")):
        ap.error(f"--shapes: names are {', '.join(SHAPES)}")
    if max(rows_list) > cuda_ops._SKINNY_MAX_M:  # 17-32 rows: the opt-in four-tile kernels for "ours"
        cuda_ops._SKINNY_MAX_M = cuda_ops._GATED_SKINNY_MAX_M = cuda_ops._SKINNY_KERNEL_MAX_M

    be = CudaBackend(dtype=ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)

    rows = []
    print(f"{'weight':14s} {'M':>3s} {'kernel':>8s} {'us':>8s} {'TB/s':>6s} {'cuBLAS us':>10s} {'TB/s':>6s} "
          f"{'ratio':>6s}")
    for name, (K, N) in shapes.items():
        w = be.asarray((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32))
        for M in rows_list:
            x = be.asarray(rng.standard_normal((M, K)).astype(np.float32))
            out = be.empty((M, N))
            def timed(x=x, w=w, out=out) -> float:
                return graph_us(be, lambda: be.matmul(x, w, out))

            ours = timed()
            with routes(_GEMV_MAX_M=0, **_NO_SKINNY):  # every product to cuBLAS
                blas = timed()
            kernel = cuda_ops.small_product_kernel(M, N, K) or "cuBLAS"
            forced = None  # the other cuda/gemv.cu kernel where both could take these rows
            if M <= cuda_ops._GEMV_MAX_M:
                with routes(**({"_GEMV_MAX_M": 0} if kernel == "gemv" else _NO_SKINNY)):
                    forced = timed()
            nbytes = N * K * 2
            rows.append(dict(weight=name, M=M, K=K, N=N, kernel=kernel, us=ours, cublas_us=blas,
                             tbps=nbytes / ours / 1e6, cublas_tbps=nbytes / blas / 1e6, other_kernel_us=forced))
            print(f"{name:14s} {M:3d} {kernel:>8s} {ours:8.2f} {nbytes / ours / 1e6:6.2f} {blas:10.2f} "
                  f"{nbytes / blas / 1e6:6.2f} {blas / ours:6.2f}"
                  + (f"  ({'gemm_skinny' if kernel == 'gemv' else 'gemv'} {forced:.2f} us)"
                     if forced is not None else ""), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
