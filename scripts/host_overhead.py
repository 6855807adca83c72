"""Host (Python) time of an engine decode step, with the model's device work taken out.

    python scripts/host_overhead.py [--batches 1 16 64 256] [--steps 100] [--profile 256]

Builds an LLMEngine on the CPU over the random `tiny` preset, then replaces (in this process only)
the model forward with one that returns a fixed logits buffer and the sampler with one that writes
deterministic tokens, so what a step costs is scheduler, block manager, step-buffer filling and
upload, output bookkeeping and detokenisation: the part that runs on the host while a GPU waits.
Prints the median microseconds per decode step at each batch size (every sequence decoding,
ignore_eos, fixed max_tokens) and a digest of all outputs (token ids and text), which must not
change when the host code is optimised. --profile B runs batch B under cProfile. Also printed:
the part of a step spent rendering outputs (detokenising, stop strings, the outputs themselves),
which LLM.generate overlaps with the next step's device work (LLMEngine.overlap_outputs); the
rest is the host's critical path, when a GPU would idle.

    python scripts/host_overhead.py --dflash 8 [--batches 1 4 16] [--profile 16]

times a rejected DFlash round instead (k drafts a round, a random drafter, every draft rejected):
the target's verification step and the drafter's block step, each forward stubbed the same way
(the drafter's context update too), so what remains is the round's host work: scheduling,
both steps' input fills, verification bookkeeping (acceptance, KV rollback) and the proposal. It
also prints the part of a round from the verification's results reaching the host to the drafting
step's launch returning: the host work a GPU waits for (the rest runs while the drafter drafts).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import statistics
import tempfile
import time

import numpy as np

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.tools.random_model import write_dflash_drafter, write_random_model


def make_engine(model_dir: str, batch: int, max_model_len: int, spec: dict | None = None) -> LLMEngine:
    engine = LLMEngine(model=model_dir, device="cpu", max_num_seqs=batch, max_model_len=max_model_len,
                       speculative_config=spec)

    def stub(model, ws):
        def forward(x, t, r, kv, ws_, **kwargs):  # no device work: a fixed logits buffer
            return ws.logits[:r]
        model.forward = forward

    def sample(logits, temperature, top_p, top_k, seeds, positions, out_tokens, draft_tokens=None,
               out_accepted=None, min_p=None):
        # ids of ordinary tokens, a function of (seed, position) only, so outputs do not depend on batching
        out_tokens[:] = (seeds % 997 + positions.astype(np.uint64) * 31) % 3000 + 10
        if out_accepted is not None:
            out_accepted[:] = 0  # every draft rejected

    stub(engine.model, engine.runner.ws)
    if engine.proposer is not None:  # the DFlash drafter: its forward and its context update
        stub(engine.proposer.model, engine.proposer.runner.ws)
        engine.runner.after_forward = lambda x, num_tokens: None
    engine.backend.sample = sample
    return engine


def run_spec(model_dir: str, drafter_dir: str, k: int, batch: int, prompt_len: int,
             rounds: int) -> tuple[float, float, float]:
    """Median host microseconds of a rejected DFlash round with `batch` sequences decoding, and of
    its part between the verification's results reaching the host and the next launch returning,
    the drafting step's (or, with early drafting, already launched, the next verification's: the
    GPU drafts meanwhile): (round, from the results to that launch, the launch itself, which)."""
    spec = {"method": "dflash", "model": drafter_dir, "num_speculative_tokens": k}
    engine = make_engine(model_dir, batch, prompt_len + rounds + 64, spec)
    rng = np.random.default_rng(batch)
    for i in range(batch):
        engine.add_request(rng.integers(10, 3000, prompt_len).tolist(),
                           SamplingParams(max_tokens=rounds + 16, ignore_eos=True, seed=i), request_id=str(i))
    for _ in range(8):  # prefill and the first rounds
        engine.step()
    collect = engine.runner.collect
    marks: dict[str, float] = {}
    between, launching, which = [], [], []

    def timed_collect(handle):  # shadows the bound method on this instance only
        out = collect(handle)
        marks["results"] = time.perf_counter()
        return out

    def timed(launch, name):
        def timed_launch(*args, **kwargs):
            t = time.perf_counter()
            out = launch(*args, **kwargs)
            if "results" in marks:
                between.append(t - marks.pop("results"))
                launching.append(time.perf_counter() - t)
                which.append(name)
            return out
        return timed_launch

    engine.runner.collect = timed_collect
    engine.runner.launch = timed(engine.runner.launch, "the next verification")
    engine.proposer.runner.launch = timed(engine.proposer.runner.launch, "the drafting step")
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return (*(statistics.median(v) * 1e6 for v in (times, between, launching)),
            max(set(which), key=which.count))


def run(model_dir: str, batch: int, prompt_len: int, steps: int, digest) -> tuple[float, float]:
    """Median host microseconds of `steps` decode steps with `batch` sequences decoding, and the
    median microseconds of it spent rendering outputs."""
    engine = make_engine(model_dir, batch, prompt_len + steps + 8)
    render_times = []
    render = engine._render_unrendered

    def timed_render():
        t = time.perf_counter()
        out = render()
        render_times.append(time.perf_counter() - t)
        return out

    engine._render_unrendered = timed_render
    rng = np.random.default_rng(batch)
    for i in range(batch):
        prompt = rng.integers(10, 3000, prompt_len).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True, seed=i),
                           request_id=str(i))
    started = set()
    while len(started) < batch:  # prefill, until every sequence has sampled its first token
        started.update(o.request_id for o in engine.step())
    times = []
    render_times.clear()
    while engine.has_unfinished():
        t0 = time.perf_counter()
        outs = engine.step()
        times.append(time.perf_counter() - t0)
        for o in outs:  # digested at once: keeping every step's outputs would slow the GC down
            digest.update(f"{o.request_id}:{o.new_token_ids}:{o.new_text!r}:{o.finished}".encode())
            if o.finished:
                digest.update(f"{o.token_ids}:{o.text!r}:{o.finish_reason}".encode())
    return statistics.median(times) * 1e6, statistics.median(render_times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--profile", type=int, default=None, help="run this batch size under cProfile")
    ap.add_argument("--dflash", type=int, default=None, metavar="K",
                    help="time rejected DFlash rounds of K drafts instead of decode steps")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(write_random_model(tmp, "tiny", seed=0, force=True))
        if ns.dflash:
            drafter_dir = str(write_dflash_drafter(f"{tmp}/dflash", model_dir, seed=1, force=True))
            if ns.profile:
                prof = cProfile.Profile()
                prof.enable()
                run_spec(model_dir, drafter_dir, ns.dflash, ns.profile, ns.prompt_len, ns.steps)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(30)
                return
            for b in ns.batches:
                us, between, launching, which = run_spec(model_dir, drafter_dir, ns.dflash, b, ns.prompt_len,
                                                         ns.steps)
                print(f"batch {b:4d}: {us:9.1f} us/round host ({us / b:6.2f} us/seq), DFlash k = {ns.dflash}; "
                      f"from the verification's results to {which} launched "
                      f"{between + launching:7.1f} us (before it {between:6.1f}, the launch {launching:6.1f})",
                      flush=True)
            return
        if ns.profile:
            prof = cProfile.Profile()
            prof.enable()
            run(model_dir, ns.profile, ns.prompt_len, ns.steps, hashlib.sha256())
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        digest = hashlib.sha256()
        for b in ns.batches:
            us, render_us = run(model_dir, b, ns.prompt_len, ns.steps, digest)
            print(f"batch {b:4d}: {us:9.1f} us/step host  ({us / b:6.2f} us/seq); rendering outputs "
                  f"{render_us:8.1f} us, the rest {us - render_us:8.1f} us", flush=True)
        print(f"outputs digest {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
