"""Decode attention (cuda/decode_attention.cu) timed for every split count, against the backend's plan.

    python scripts/decode_splits.py [--variant DEC_U=8 [--variant DEC_U=8,DEC_MIN_BLOCKS=6]] [--json F]

For each case (query heads, KV heads, batch, context lengths) the kernel runs inside a CUDA graph of
20 back-to-back calls for n_splits in 1..32 (as far as the context allows), CUDA events, median of
10 replays. It prints the time and KV bandwidth of each, which split count was fastest, and which
one CudaBackend.decode_plan picks (minillm.backends.cuda_ops.decode_splits) and how far that is
from the fastest: the check of the wave model that chooses splits. Each --variant recompiles the
kernel with those -D defines (DEC_U: keys in flight per key group; DEC_MIN_BLOCKS*: CTAs per SM the
registers must allow; DEC_CPL: 16-byte chunks of a row per lane; DEC_NO_MATH=1: the loads alone)
and times it the same way. --case picks cases by label, --splits the split counts to sweep.
--order also times each variant with the launch order the runner gives a decode step (rows
longest context first, KV heads fastest: `order=` of CudaBackend.attention), as "<variant>+lpt".
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPLITS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
PARTS = (128, 256, 512, 1024)  # fixed keys per split ("p256": every token takes ceil(len / 256))
# (label, query heads, KV heads, batch, context: an int for all, or (lo, hi) drawn uniformly)
CASES = [("0.6B B=1 ctx 512", 16, 8, 1, 512), ("0.6B B=8 ctx 2048", 16, 8, 8, 2048),
         ("0.6B B=64 ctx 1024", 16, 8, 64, 1024), ("0.6B B=192 ctx 1024", 16, 8, 192, 1024),
         ("0.6B B=256 ctx 1024", 16, 8, 256, 1024), ("0.6B B=256 ctx U[100, 2048]", 16, 8, 256, (100, 2048)),
         ("0.6B B=128 ctx U[100, 2048]", 16, 8, 128, (100, 2048)),
         # the same lengths, longest first: does the CTA order of a ragged batch matter?
         ("0.6B B=256 ctx desc U[100, 2048]", 16, 8, 256, (100, 2048, "desc")),
         ("8B B=1 ctx 512", 32, 8, 1, 512), ("8B B=1 ctx 32768", 32, 8, 1, 32768),
         ("8B B=16 ctx 4096", 32, 8, 16, 4096), ("8B B=64 ctx 2048", 32, 8, 64, 2048),
         # where the blocks lie: "pool xN" draws a step's blocks from a pool N times what it reads
         # (the engine's pool is sized for max-num-seqs x max-model-len); "compact" from exactly
         # what it reads; "seq" gives each sequence consecutive blocks (the other cases: random)
         ("0.6B B=256 ctx 1024 pool x4", 16, 8, 256, 1024, "x4"),
         ("0.6B B=256 ctx 1024 pool x8", 16, 8, 256, 1024, "x8"),
         ("0.6B B=256 ctx 1024 seq", 16, 8, 256, 1024, "seq"),
         ("0.6B B=256 ctx U[100, 2048] compact", 16, 8, 256, (100, 2048), "x1"),
         ("0.6B B=256 ctx U[100, 2048] seq", 16, 8, 256, (100, 2048), "seq")]


def block_tables(rng, lens, bs: int, nbps: int, pool: str | None) -> tuple[np.ndarray, int]:
    """Block tables [B, nbps] and the pool's block count. None: a random permutation of B x nbps
    blocks (every row full, whatever its length); "xN": each row's blocks drawn at random from N
    times the blocks the rows read; "seq": row after row, each row's blocks consecutive."""
    B = len(lens)
    if pool is None:
        return rng.permutation(B * nbps).reshape(B, nbps), B * nbps
    need = [-(-int(n) // bs) for n in lens]
    bt = np.zeros((B, nbps), np.int64)
    if pool == "seq":
        starts = np.concatenate([[0], np.cumsum(need)])
        for b, n in enumerate(need):
            bt[b, :n] = np.arange(starts[b], starts[b] + n)
        return bt, int(starts[-1])
    total = int(pool[1:]) * sum(need)
    picked = rng.choice(total, sum(need), replace=False)
    o = 0
    for b, n in enumerate(need):
        bt[b, :n] = picked[o: o + n]
        o += n
    return bt, total


def load_variant(be, defines: list[str]) -> dict:
    """The decode kernels compiled with extra -D defines, by name (to swap into be.k)."""
    import cupy

    from minillm.backends import compile as kc

    code, _ = kc.source_with_hash("decode_attention")
    mod = cupy.RawModule(code=code, options=kc.compile_options(False) + tuple(f"-D{d}" for d in defines))
    mod.compile()
    return {n: mod.get_function(n) for n in be.k if n.startswith("paged_decode_")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", default=[], help="comma-separated -D defines")
    p.add_argument("--json", default=None)
    p.add_argument("--case", action="append", default=[], help="only cases whose label has this text")
    p.add_argument("--splits", default=None, help="comma-separated split counts to time (default: 1..32)")
    p.add_argument("--order", action="store_true", help="also time with the rows longest context first")
    p.add_argument("--plan-only", action="store_true", help="time only the split count the plan picks "
                   "(for ncu: one kernel per case and variant)")
    ns = p.parse_args()
    import cupy

    from minillm.backends.cuda_ops import CudaBackend
    from minillm.bench.gpu_timing import graph_us
    from minillm.bench.report import write_json

    be = CudaBackend()
    variants = {"default": {}}
    for v in ns.variant:
        variants[v] = load_variant(be, v.split(","))
    variants["default"] = {n: k for n, k in be.k.items() if n.startswith("paged_decode_")}
    rng = np.random.default_rng(0)
    D, bs = 128, 16
    sweep = tuple(int(x) for x in ns.splits.split(",")) if ns.splits else SPLITS

    def i32(x):
        return be.asarray(np.asarray(x, np.int32), dtype=np.int32)

    results = []
    print(f"{'case':24s} {'variant':28s} {'slots':>5s} {'plan':>5s} {'best':>5s} {'plan us':>9s} "
          f"{'best us':>9s} {'plan/best':>9s}  us (TB/s) by splits")
    for label, H, KH, B, ctx, *pool in CASES:
        if ns.case and not any(c in label for c in ns.case):
            continue
        if isinstance(ctx, int):
            lens = np.full(B, ctx)
        else:
            # its own generator: the "desc" case sorts the very lengths of the unsorted one
            lens = np.random.default_rng([B, ctx[0], ctx[1]]).integers(ctx[0], ctx[1] + 1, B)
            if ctx[2:] == ("desc",):
                lens = np.sort(lens)[::-1].copy()
        max_ctx = int(lens.max())
        nbps = -(-max_ctx // bs)
        tables, nblocks = block_tables(rng, lens, bs, nbps, pool[0] if pool else None)
        if pool:  # large pools: random bf16 bit patterns in [0.125, 1) made on the device
            kc, vc = (be.empty((nblocks, bs, KH, D)) for _ in range(2))
            for c in (kc, vc):
                c.view(cupy.uint16)[...] = cupy.random.randint(0x3E00, 0x3F80, c.shape, dtype=cupy.int32)
        else:
            kc = be.asarray(rng.standard_normal((nblocks, bs, KH, D), dtype=np.float32))
            vc = be.asarray(rng.standard_normal((nblocks, bs, KH, D), dtype=np.float32))
        bt = i32(tables)
        q = be.asarray(rng.standard_normal((B, H, D), dtype=np.float32))
        out = be.empty((B, H, D))
        sl, qs = i32(lens), i32(np.arange(B + 1))
        kv_bytes = 2 * int(lens.sum()) * KH * D * 2
        args = (q, kc, vc, bt, sl, qs, D ** -0.5, out)
        lpt = i32(np.argsort(-lens, kind="stable"))
        runs = [(v, k, None) for v, k in variants.items()]
        if ns.order:
            runs += [(v + "+lpt", k, lpt) for v, k in variants.items()]
        for vname, kernels, order in runs:
            be.k.update(kernels)
            be._resident.clear()  # occupancy is the variant's
            plan = be.decode_plan(B, H, KH, D, nbps * bs)["n_splits"]
            times = {}
            for s in sorted(set(() if ns.plan_only else sweep) | {plan}):
                if s > -(-nbps * bs // 64) and s != 1:
                    continue
                times[s] = graph_us(be, lambda s=s, a=args, o=order: be.attention(
                    *a, kernel="decode", n_splits=s, order=o))
            for part in PARTS if vname in ("default", "default+lpt") and not ns.plan_only else ():
                if part < nbps * bs:
                    times[f"p{part}"] = graph_us(be, lambda a=args, part=part, o=order: be.attention(
                        *a, kernel="decode", part=part, order=o))
            best = min(times, key=times.get)
            row = dict(case=label, variant=vname, batch=B, heads=H, kv_heads=KH, kv_bytes=kv_bytes, plan=plan,
                       best=best, resident=be._decode_resident(D, H // KH), us_by_splits=times,
                       tbps_by_splits={s: kv_bytes / t / 1e6 for s, t in times.items()})
            best = str(best)
            results.append(row)
            print(f"{label[:24]:24s} {vname[:28]:28s} {row['resident']:5d} {plan:5d} {best:>5s} {times[plan]:9.1f} "
                  f"{min(times.values()):9.1f} {times[plan] / min(times.values()):9.3f}  "
                  + " ".join(f"{s}:{t:.1f}({kv_bytes / t / 1e6:.2f})" for s, t in times.items()), flush=True)
        kc = vc = bt = q = out = args = lpt = None  # free this case's caches before the next
    if ns.json:
        write_json(ns.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
