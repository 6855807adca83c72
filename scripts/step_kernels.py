"""One decode step split into kernels, measured with Nsight Compute (ncu) on the GPU.

    python scripts/step_kernels.py MODEL --batch 1 --ctx 512 [--json F]     # graph time (events)
    ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv --page raw \
        python scripts/step_kernels.py MODEL --batch 1 --ctx 512 --under-ncu > ncu.csv
    python scripts/step_kernels.py --parse ncu.csv [--graph-ms X] [--json F]

    python scripts/step_kernels.py MODEL --prefill --batch 14 --ctx 585     # one prefill step
    python scripts/step_kernels.py MODEL --spec DRAFTER --k 8 --batch 16    # one DFlash round

The first form fills `batch` sequences with `ctx`-token random prompts, decodes a few warm-up steps
and times the decode step's CUDA graph with CUDA events (median of 20 replays). With --under-ncu the
script brackets exactly one decode step with cudaProfilerStart/Stop, so ncu sees that step's kernels
(the graph's nodes, each timed alone: ncu serialises them). --parse groups the CSV by kernel and,
given the graph time, says how much of the step is kernels and how much is the gaps between them.

With --prefill the step measured is instead the first step of `batch` fresh `ctx`-token prompts,
all prefilled at once (the throughput workload's mixed steps are ~8,192 prompt tokens of ~14
sequences): wall and CUDA-event time of the step (median of 5, after 2 warm-up steps; the events
bracket the host's scheduling and input preparation too, during which the device idles: in the
throughput run async scheduling hides that), and under ncu its kernels (eager launches, not a
graph; --parse then takes the step's time as --graph-ms).

With --spec DRAFTER the engine speculates with that DFlash drafter (k drafts a round; a random
drafter is never right, so every round is rejected): the step is one round, the target's
verification graph ((1 + k) rows a sequence) and the drafter's block graph. graph_ms is then the
median round's two graph replays together (target_ms + drafter_ms), and under ncu one engine step
holds both.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def warm_engine(model: str, batch: int, ctx: int, warmup: int = 4, temperature: float = 0.0,
                drafter: str | None = None, k: int = 8):
    """A CUDA engine with `batch` sequences of `ctx`-token random prompts, prefilled, after
    `warmup` decode steps (graphs captured): the state every measurement here starts from."""
    from minillm.args import EngineArgs
    from minillm.engine.engine import LLMEngine
    from minillm.sampling_params import SamplingParams

    spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": k} if drafter else None
    args = EngineArgs(model=model, device="cuda", max_num_seqs=batch, max_model_len=ctx + 64 + 8 * (k + 1),
                      max_num_batched_tokens=max(8192, batch), enable_prefix_caching=False,
                      speculative_config=spec)
    engine = LLMEngine(args)
    rng = np.random.default_rng(0)
    vocab = min(engine.config.vocab_size, engine.tokenizer.vocab_size)
    for i in range(batch):
        engine.add_request(rng.integers(0, vocab, ctx).tolist(),
                           SamplingParams(temperature=temperature, max_tokens=48, ignore_eos=True),
                           request_id=str(i))
    seqs = [engine.requests[str(i)] for i in range(batch)]
    while any(s.num_computed < ctx for s in seqs):
        engine.step()
    for _ in range(warmup):
        engine.step()
    engine.backend.synchronize()
    return engine


def run_step(model: str, batch: int, ctx: int, profiling: bool, warmup: int = 4, replays: int = 20,
             temperature: float = 0.0, drafter: str | None = None, k: int = 8) -> dict:
    import cupy

    from minillm.bench.gpu_timing import record_replays, replay_ms

    engine = warm_engine(model, batch, ctx, warmup, temperature, drafter, k)
    times: list = []
    if profiling:
        cupy.cuda.profiler.start()
        engine.step()
        engine.backend.synchronize()
        cupy.cuda.profiler.stop()
    draft_times: list = []
    if not profiling:  # the graph of this batch bucket, replayed alone between events
        times = record_replays(engine.runner, engine.backend)
        if drafter:
            draft_times = record_replays(engine.proposer.runner, engine.backend)
        for _ in range(replays):
            engine.step()
        engine.runner.replay_timer = None
        if drafter:
            engine.proposer.runner.replay_timer = None
        engine.backend.synchronize()
    graph_ms = float(np.median(replay_ms(engine.backend, times))) if times else None
    out = {"model": model, "batch": batch, "ctx": ctx, "temperature": temperature, "graph_ms": graph_ms,
           # what every captured graph launched (all buckets, target and drafter): scripts/ab_table.py
           # flags a setting whose record equals its base's
           "graph_launches": dict(sorted(engine.backend.captured_launches.items()))}
    if drafter:
        draft_ms = float(np.median(replay_ms(engine.backend, draft_times))) if draft_times else None
        out.update(drafter=drafter, k=k, target_ms=graph_ms, drafter_ms=draft_ms,
                   graph_ms=graph_ms + draft_ms if graph_ms and draft_ms else None)
    return out


def run_prefill(model: str, batch: int, ctx: int, profiling: bool, warmup: int = 2, reps: int = 5,
                temperature: float = 0.0) -> dict:
    import time

    import cupy

    from minillm.args import EngineArgs
    from minillm.engine.engine import LLMEngine
    from minillm.sampling_params import SamplingParams

    args = EngineArgs(model=model, device="cuda", max_num_seqs=batch, max_model_len=ctx + 64,
                      max_num_batched_tokens=batch * ctx, enable_prefix_caching=False)
    engine = LLMEngine(args)
    rng = np.random.default_rng(0)
    vocab = min(engine.config.vocab_size, engine.tokenizer.vocab_size)
    stream = cupy.cuda.get_current_stream()

    def prefill_once(tag: str) -> tuple[float, float]:
        # max_tokens=1: the step that prefills the prompts also finishes them, freeing their blocks
        for i in range(batch):
            engine.add_request(rng.integers(0, vocab, ctx).tolist(),
                               SamplingParams(temperature=temperature, max_tokens=1, ignore_eos=True),
                               request_id=f"{tag}-{i}")
        engine.backend.synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record(stream)
        seqs = [engine.requests[f"{tag}-{i}"] for i in range(batch)]
        engine.step()
        if any(not s.finished and s.num_computed < ctx for s in seqs):  # (finishing resets num_computed)
            raise RuntimeError("the prompts did not fit one step: raise max_num_batched_tokens")
        while engine.has_unfinished():  # collect (async scheduling) and render
            engine.step()
        stop.record(stream)
        engine.backend.synchronize()
        return (time.perf_counter() - t0) * 1e3, cupy.cuda.get_elapsed_time(start, stop)

    for w in range(warmup):
        prefill_once(f"warm{w}")
    if profiling:
        cupy.cuda.profiler.start()
        prefill_once("ncu")
        cupy.cuda.profiler.stop()
        return {"model": model, "prefill": True, "batch": batch, "ctx": ctx}
    walls, events = zip(*(prefill_once(f"rep{r}") for r in range(reps)))
    return {"model": model, "prefill": True, "batch": batch, "ctx": ctx, "tokens": batch * ctx,
            "temperature": temperature, "wall_ms": float(np.median(walls)), "step_ms": float(np.median(events))}


def parse(csv_text: str, graph_ms: float | None) -> dict:
    """ncu --csv --page raw output -> {kernel: {calls, total_us}}, kernels sorted by time."""
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    by = defaultdict(lambda: [0, 0.0])
    for row in rows:
        v = row.get("gpu__time_duration.sum", "")
        try:
            ns = float(v.replace(",", ""))
        except ValueError:
            continue  # the units row
        name = row.get("Kernel Name", "?").split("(")[0]
        by[name][0] += 1
        by[name][1] += ns / 1e3
    kernels = {k: {"calls": c, "total_us": round(t, 2)} for k, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])}
    total_us = sum(v["total_us"] for v in kernels.values())
    out = {"kernels": kernels, "launches": sum(v["calls"] for v in kernels.values()),
           "kernel_sum_us": round(total_us, 1)}
    if graph_ms:
        out["graph_us"] = round(graph_ms * 1e3, 1)
        out["gaps_us"] = round(graph_ms * 1e3 - total_us, 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--parse", default=None, help="an ncu --csv file to summarise")
    p.add_argument("--graph-ms", type=float, default=None)
    p.add_argument("--under-ncu", action="store_true", help="profile one step: give it under ncu")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every sequence (0: greedy; the throughput workload: 0.6)")
    p.add_argument("--prefill", action="store_true",
                   help="measure the step that prefills `batch` fresh prompts of `ctx` tokens instead")
    p.add_argument("--spec", default=None, metavar="DRAFTER",
                   help="speculate with this DFlash drafter: the step is one (rejected) round")
    p.add_argument("--k", type=int, default=8, help="drafts a round with --spec")
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    if ns.parse:
        with open(ns.parse) as f:
            r = parse(f.read(), ns.graph_ms)
        print(f"{'kernel':58s} {'calls':>6s} {'us':>9s} {'share':>6s}")
        for k, v in r["kernels"].items():
            print(f"{k[:58]:58s} {v['calls']:6d} {v['total_us']:9.1f} {100 * v['total_us'] / r['kernel_sum_us']:5.1f}%")
        line = f"{r['launches']} kernels, {r['kernel_sum_us']:.1f} us of kernel time"
        if "graph_us" in r:
            line += f"; the graph takes {r['graph_us']:.1f} us: {r['gaps_us']:.1f} us between kernels"
        print(line)
    else:
        if not ns.model:
            p.error("give a MODEL directory (or --parse F)")
        if ns.prefill:
            r = run_prefill(ns.model, ns.batch, ns.ctx, ns.under_ncu, temperature=ns.temperature)
        else:
            r = run_step(ns.model, ns.batch, ns.ctx, ns.under_ncu, temperature=ns.temperature,
                         drafter=ns.spec, k=ns.k)
        print(json.dumps(r))
    if ns.json:
        from minillm.bench.report import write_json

        write_json(ns.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
