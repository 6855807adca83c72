"""Does a row's matmul result depend on where it sits in the batch? (GPU; a diagnostic)

    python scripts/batch_invariance.py

Speculative decoding is lossless only up to the numerics of the step shapes: a token computed as
row j of a (1 + k)-row verification block, or in a batch of 16 sequences, must come out bit-equal
to the same token computed elsewhere, or a model with near-tied logits (random weights) takes
another greedy path. This multiplies the same bf16 rows through the CUDA backend's matmul at
their own offset, at other offsets of a 144-row product (16 sequences x 9 verification rows) and
alone in a 9-row product, and prints how many output elements differ bitwise. Then the same rows
at the head of products of other heights (1 to 2,048 rows: the GEMV, gemm_skinny and cuBLAS's
kernels for each height), against the 9-row product: the open question of the c = 16 speculation
curve (docs/BENCHMARKS.md section 6) is whether a verification block's rows change with the height
of the product they land in.
"""

from __future__ import annotations

import numpy as np

from minillm.backends.cuda_ops import CudaBackend


def main() -> None:
    be = CudaBackend()
    rng = np.random.default_rng(0)
    for K, N in [(4096, 12288), (4096, 6144), (12288, 4096), (1024, 4096)]:
        w = be.asarray(rng.standard_normal((N, K), dtype=np.float32) * 0.02)
        x_host = rng.standard_normal((144, K), dtype=np.float32)
        x = be.asarray(x_host)
        out = be.empty((144, N))
        be.matmul(x, w, out)
        base = be.to_host(out).astype(np.float32)
        shifted = np.roll(np.arange(144), 9 * 7 + 3)  # every row at another offset
        out2 = be.empty((144, N))
        be.matmul(be.asarray(x_host[shifted]), w, out2)
        moved = be.to_host(out2).astype(np.float32)
        out3 = be.empty((9, N))
        be.matmul(be.asarray(x_host[:9]), w, out3)
        alone = be.to_host(out3).astype(np.float32)
        d_moved = int((moved != base[shifted]).sum())
        d_alone = int((alone != base[:9]).sum())
        rows_moved = int((moved != base[shifted]).any(axis=1).sum())
        print(f"K={K:>5} N={N:>5}: rows moved within M=144: {d_moved} elements differ "
              f"({rows_moved} of 144 rows); rows 0-8 alone (M=9) vs inside M=144: {d_alone} differ",
              flush=True)
        heights = []
        for M in (1, 2, 4, 8, 9, 16, 24, 144, 512, 2048):
            xm = np.concatenate([x_host[:9], rng.standard_normal((max(0, M - 9), K), dtype=np.float32)])[:M]
            om = be.empty((M, N))
            be.matmul(be.asarray(xm), w, om)
            rows = min(M, 9)
            got = be.to_host(om).astype(np.float32)[:rows]
            heights.append(f"M={M}: {int((got != alone[:rows]).sum())}")
            del om
        print(f"K={K:>5} N={N:>5}: rows at the head of an M-row product vs the 9-row product, elements "
              f"that differ: {', '.join(heights)}", flush=True)
        del w, x, out, out2, out3


if __name__ == "__main__":
    main()
