"""The device sampler (cuda/sampling.cu) timed per mode and batch, inside CUDA graphs.

    python scripts/sampler_bench.py [--batches 1,64,192,256] [--vocab 151936] [--json F] [--modes M1,M2]
                                    [--bf16-logits] [--logit-scale 3]

For each batch size and sampling mode (greedy; temperature 0.6 as in the throughput workload;
top-k 50; top-p 0.9; top-k + top-p, and Qwen3's top-k 20 + top-p 0.95; min-p 0.05, alone and with
top-p; temperature with a drafted token on every row, i.e. speculative verification, the draft
one-hot or drawn from a drafter's q, whose verification against q, verify_drawn_drafts, takes the
batch in place of sample_tokens; Qwen3's filters with a q draft) one `CudaBackend.sample` call over
fp32 logits is captured 10 times in a graph and
timed with CUDA events (median of 10 replays, minillm/bench/gpu_timing.py). Logits are N(0, 3^2),
so the tail is not negligible for temperature sampling (--logit-scale 5: a peaked row, top-p 0.9
keeping ~5-70 tokens, as a confident model's); with --bf16-logits they are rounded to
bfloat16 values, as an LM head writing bf16 would leave them, so top-p's cut-off falls inside a run
of tied logits on most rows. Printed: us a call, us a row, and the rate at which the logits were
read once (GB/s): the floor of any sampler is one read of the row.
"""

from __future__ import annotations

import argparse
import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = [  # (label, temperature, top_p, top_k, drafts (False, True: one-hot, "q": drawn from q), min_p)
    ("greedy", 0.0, 1.0, 0, False, 0.0),
    ("temperature 0.6", 0.6, 1.0, 0, False, 0.0),
    ("top-k 50", 0.8, 1.0, 50, False, 0.0),
    ("top-p 0.9", 0.8, 0.9, 0, False, 0.0),
    ("top-k 50 + top-p 0.9", 0.8, 0.9, 50, False, 0.0),
    ("top-k 20 + top-p 0.95", 0.6, 0.95, 20, False, 0.0),  # Qwen3's generation_config
    ("min-p 0.05", 0.8, 1.0, 0, False, 0.05),
    ("min-p 0.05 + top-p 0.9", 0.8, 0.9, 0, False, 0.05),
    ("temperature 0.6 + draft", 0.6, 1.0, 0, True, 0.0),
    ("temperature 0.6 + q draft", 0.6, 1.0, 0, "q", 0.0),
    ("top-p 0.9 + q draft", 0.8, 0.9, 0, "q", 0.0),
    ("top-k 20 + top-p 0.95 + q draft", 0.6, 0.95, 20, "q", 0.0),  # Qwen3's, speculating
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,64,192,256")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--json", default=None)
    p.add_argument("--modes", default=None,
                   help="only these modes, comma-separated, as printed (e.g. \"top-p 0.9,greedy\"): a profiler's run")
    p.add_argument("--logit-scale", type=float, default=3.0, help="the logits' standard deviation")
    p.add_argument("--bf16-logits", action="store_true",
                   help="logits rounded to bfloat16 values: ties at most top-p cut-offs")
    ns = p.parse_args()
    modes = MODES
    if ns.modes is not None:
        want = [m.strip() for m in ns.modes.split(",") if m.strip()]
        unknown = sorted(set(want) - {m[0] for m in MODES})
        if not want or unknown:
            p.error(f"--modes {ns.modes!r}: unknown {unknown or 'none given'}; the modes are "
                    + ", ".join(m[0] for m in MODES))
        modes = [m for m in MODES if m[0] in want]
    from minillm.backends.cuda_ops import CudaBackend
    from minillm.bench.gpu_timing import graph_us
    from minillm.bench.report import write_json

    be = CudaBackend()
    rng = np.random.default_rng(0)
    V = ns.vocab
    results = []
    print(f"{'mode':26s} {'B':>4s} {'us':>9s} {'us/row':>8s} {'GB/s':>7s}")
    for B in [int(b) for b in ns.batches.split(",")]:
        host = (ns.logit_scale * rng.standard_normal((B, V))).astype(np.float32)
        if ns.bf16_logits:
            host = host.astype(ml_dtypes.bfloat16).astype(np.float32)
        logits = be.asarray(host, dtype=np.float32)
        seeds = be.asarray(rng.integers(0, 2**62, B).astype(np.int64), dtype=np.int64)
        pos = be.asarray(rng.integers(0, 100000, B).astype(np.int32), dtype=np.int32)
        out = be.empty((B,), dtype=np.int32)
        acc = be.empty((B,), dtype=np.int32)
        drafts = be.asarray(rng.integers(0, V, B).astype(np.int32), dtype=np.int32)
        q_logits = be.asarray((ns.logit_scale * rng.standard_normal((B, V))).astype(np.float32), dtype=np.float32)
        q_rows = be.asarray(np.arange(B, dtype=np.int32), dtype=np.int32)
        for label, t, tp, k, with_drafts, mp in modes:
            temp = be.asarray(np.full(B, t, np.float32), dtype=np.float32)
            top_p = be.asarray(np.full(B, tp, np.float32), dtype=np.float32)
            top_k = be.asarray(np.full(B, k, np.int32), dtype=np.int32)
            min_p = be.asarray(np.full(B, mp, np.float32), dtype=np.float32) if mp else None
            args = (logits, temp, top_p, top_k, seeds, pos, out) + ((drafts, acc) if with_drafts else (None, None))
            q = {"draft_logits": q_logits, "draft_rows": q_rows} if with_drafts == "q" else {}
            us = graph_us(be, lambda args=args, min_p=min_p, q=q: be.sample(*args, min_p=min_p, **q), calls=10)
            gbs = B * V * 4 / us / 1e3
            print(f"{label:26s} {B:4d} {us:9.1f} {us / B:8.2f} {gbs:7.0f}", flush=True)
            results.append({"mode": label, "batch": B, "vocab": V, "us": round(us, 2)})
    if ns.json:
        write_json(ns.json, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
