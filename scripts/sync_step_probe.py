"""Where a synchronous batch-1 decode step's host time goes (GPU).

    python scripts/sync_step_probe.py MODEL_DIR [--steps 200] [--cprofile 25]

bench decode's synchronous pass (each step's ids read before the next is scheduled) costs its graph
plus host time; session 59 saw that host time grow from ~0.17 to ~0.35 ms with stage_inputs (part317)
while the async pass got faster. This builds the engine over MODEL_DIR (max_num_seqs 1), prefills
a 512-token prompt, and times --steps synchronous decode steps with the engine's StepProfiler (the
phases, device time from events), then the same steps under cProfile (top functions by own time).
Run it from another tree (cd DIR; PYTHONPATH=.:... python3 OTHER/scripts/sync_step_probe.py) to
compare code.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from minillm.engine.engine import LLMEngine
from minillm.engine.step_profile import StepProfiler, format_summary
from minillm.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cprofile", type=int, default=25, help="functions to print (0: no cProfile pass)")
    ns = ap.parse_args()
    engine = LLMEngine(model=ns.model, device="cuda", max_num_seqs=1, max_model_len=512 + 3 * ns.steps + 64)
    engine.async_scheduling = False
    prompt = np.random.default_rng(0).integers(0, 1000, 512).tolist()
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=3 * ns.steps + 32, ignore_eos=True),
                       request_id="r")
    for _ in range(10):
        engine.step()
    times = []
    for _ in range(ns.steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    print(f"plain: median step {1e3 * float(np.median(times)):.3f} ms")
    profiler = StepProfiler(engine)
    for _ in range(ns.steps):
        engine.step()
    profiler.detach()
    print(format_summary(profiler.summary()))
    if ns.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(ns.steps):
            engine.step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(ns.cprofile)


if __name__ == "__main__":
    main()
