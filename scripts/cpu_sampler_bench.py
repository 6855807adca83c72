"""The NumPy sampler (minillm/engine/sampler.py: the CPU backend's, and the device sampler's twin)
timed on the CPU, for one tree or several alternated.

    python scripts/cpu_sampler_bench.py [TREE ...] [--vocab 49152,151936] [--repeats 9] [--engine]

Each TREE (default: this one) is a checkout whose minillm/engine/sampler.py is loaded on its own
(it needs only NumPy). For each vocabulary and mode, probs_from_logits on one row of N(0, 3^2)
logits: the best of --repeats, in ms. With --engine, the embedded SmolLM2 generates 48 tokens for 8
prompts at temperature 0.8, top_p 0.9 through LLM(device="cpu") with each tree's sample() in turn,
twice: the time inside the sampler and the whole generate's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODES = [  # (label, temperature, top_p, top_k, min_p)
    ("temperature 0.7", 0.7, 1.0, -1, 0.0),
    ("top-p 0.9", 0.7, 0.9, -1, 0.0),
    ("top-p 0.9, T 0.3 (peaked)", 0.3, 0.9, -1, 0.0),
    ("top-k 20 + top-p 0.95", 0.6, 0.95, 20, 0.0),
    ("min-p 0.05 + top-p 0.9", 0.8, 0.9, -1, 0.05),
    ("top-p 0.95, T 1.5 (flat)", 1.5, 0.95, -1, 0.0),
]


def load_sampler(tree: str):
    path = os.path.join(tree, "minillm", "engine", "sampler.py")
    spec = importlib.util.spec_from_file_location(f"sampler_{abs(hash(tree))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_ms(f, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def engine_run(samplers: dict) -> None:
    import minillm.backends.numpy_ops as numpy_ops
    from minillm import LLM, SamplingParams

    llm = LLM(device="cpu")
    params = SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.8, top_p=0.9, seed=1)
    prompts = ["Write a story about a robot"] * 8
    real = numpy_ops._sample
    try:
        for _ in range(2):
            for tree, module in samplers.items():
                spent = [0.0]

                def timed(*a, _f=module.sample, _spent=spent, **k):
                    t0 = time.perf_counter()
                    _f(*a, **k)
                    _spent[0] += time.perf_counter() - t0

                numpy_ops._sample = timed
                t0 = time.perf_counter()
                llm.generate(prompts, params)
                total = time.perf_counter() - t0
                print(f"engine {tree}: sampler {spent[0] * 1e3:.0f} ms of generate {total * 1e3:.0f} ms "
                      "(8 prompts x 48 tokens, top_p 0.9)", flush=True)
    finally:
        numpy_ops._sample = real


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs="*", default=[ROOT])
    p.add_argument("--vocab", default="49152,151936")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--engine", action="store_true")
    ns = p.parse_args()
    for tree in ns.trees:
        if not os.path.isfile(os.path.join(tree, "minillm", "engine", "sampler.py")):
            p.error(f"{tree} holds no minillm/engine/sampler.py: give checkouts of this repository")
    if ns.repeats < 1:
        p.error(f"--repeats must be >= 1, got {ns.repeats}")
    samplers = {tree: load_sampler(tree) for tree in ns.trees}
    rng = np.random.default_rng(0)
    for V in [int(v) for v in ns.vocab.split(",")]:
        logits = (3.0 * rng.standard_normal(V)).astype(np.float32)
        for label, t, tp, k, mp in MODES:
            cells = []
            for module in samplers.values():
                row = (logits, t, tp, k, mp)
                ms = best_ms(lambda m=module, a=row: m.probs_from_logits(*a), ns.repeats)
                cells.append(f"{ms:8.2f}")
            print(f"V={V:7d} {label:28s} " + " ".join(cells) + "  ms a row (" + ", ".join(ns.trees) + ")",
                  flush=True)
    if ns.engine:
        engine_run(samplers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
