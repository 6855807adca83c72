"""How long a CPU process takes to start: `import minillm`, opening the embedded GGUF, `LLM()` on it.

    python scripts/startup_time.py [TREE ...] [--rounds 3]

Each TREE (a checkout's root, e.g. a `git worktree add /tmp/old REV`; default: this one) is timed in
fresh processes with PYTHONPATH pointing at it, the trees alternated round by round so a busy
machine weighs on each alike; prints each round and the medians, in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

IMPORT = "import time; t = time.perf_counter(); import minillm; print(time.perf_counter() - t)"
LOAD = """
import time
from minillm.models import gguf_loader
from minillm.models.loader import default_model_path
path = default_model_path()
t = time.perf_counter(); gguf_loader.open_gguf(path, str(path)); opened = time.perf_counter() - t
from minillm import LLM
t = time.perf_counter(); LLM(device="cpu", max_model_len=256); print(opened, time.perf_counter() - t)
"""


def run(tree: Path, code: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, check=True)
    return [float(x) for x in out.stdout.split()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    p.add_argument("--rounds", type=int, default=3)
    ns = p.parse_args()
    times: dict[Path, list[list[float]]] = {tree: [] for tree in ns.trees}
    for r in range(ns.rounds):
        for tree in ns.trees:
            row = run(tree, IMPORT) + run(tree, LOAD)
            times[tree].append(row)
            print(f"round {r + 1} {tree}: import {row[0]:.2f}, open GGUF {row[1]:.2f}, LLM() {row[2]:.2f}")
    for tree, rows in times.items():
        med = [statistics.median(col) for col in zip(*rows)]
        print(f"median {tree}: import {med[0]:.2f} s, open GGUF {med[1]:.2f} s, LLM() {med[2]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
