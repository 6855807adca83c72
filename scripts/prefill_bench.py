"""Prefill attention (cuda/prefill_attention.cu) timed on the shapes that matter, in TFLOP/s.

    python scripts/prefill_bench.py [--json F]

Each case runs the kernel inside a CUDA graph of 10 back-to-back calls (CUDA events, median of 10
replays; scripts/decode_splits.py's timing) on a random paged KV pool with random block tables.
FLOPs count the causal products actually needed: 4 * heads * head_dim * sum over queries of the
keys each one sees. The dense bf16 tensor-core peak of the H200 is ~990 TFLOP/s (cuBLAS reached
781 on a 4096^3 GEMM, ../shared/DESIGN.md), so the ratio says how far the kernel is from it.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (label, query heads, KV heads, query lengths, context lengths)
CASES = [
    ("8B heads, 4,096 x 4,096 causal", 32, 8, [4096], [4096]),
    ("8B heads, chunk of 512 at 16,384", 32, 8, [512], [16384]),
    ("0.6B heads, 14 prompts U[100, 1024] (a throughput prefill step)", 16, 8, None, None),
    ("0.6B heads, 2 x 4,096 causal", 16, 8, [4096, 4096], [4096, 4096]),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    from minillm.backends.cuda_ops import CudaBackend
    from minillm.bench.gpu_timing import graph_us
    from minillm.bench.report import write_json

    be = CudaBackend()
    rng = np.random.default_rng(0)
    D, bs = 128, 16

    def i32(x):
        return be.asarray(np.asarray(x, np.int32), dtype=np.int32)

    results = []
    for label, H, KH, q_lens, ctx in CASES:
        if q_lens is None:  # nano-vllm's prompt lengths, whole prompts in one step
            q_lens = rng.integers(100, 1025, 14).tolist()
            ctx = list(q_lens)
        B = len(q_lens)
        nbps = -(-max(ctx) // bs)
        kc = be.asarray(rng.standard_normal((B * nbps, bs, KH, D), dtype=np.float32))
        vc = be.asarray(rng.standard_normal((B * nbps, bs, KH, D), dtype=np.float32))
        bt = i32(rng.permutation(B * nbps).reshape(B, nbps))
        T = sum(q_lens)
        q = be.asarray(rng.standard_normal((T, H, D), dtype=np.float32))
        out = be.empty((T, H, D))
        qs = i32(np.concatenate([[0], np.cumsum(q_lens)]))
        sl = i32(ctx)
        seen = sum(n * (c - n) + n * (n + 1) / 2 for n, c in zip(q_lens, ctx))  # keys seen, all queries
        flops = 4 * H * D * seen
        args = (q, kc, vc, bt, sl, qs, D ** -0.5, out)
        us = graph_us(be, lambda a=args: be.attention(*a, kernel="prefill"), calls=10)
        row = dict(case=label, heads=H, kv_heads=KH, tokens=T, us=us, tflops=flops / us / 1e6)
        results.append(row)
        print(f"{label:64s} {T:6d} tokens {us:10.1f} us {row['tflops']:7.1f} TFLOP/s", flush=True)
        kc = vc = q = out = args = None
    if ns.json:
        write_json(ns.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
