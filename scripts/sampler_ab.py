"""The sampler bench's A/B table of one device call: scripts/sampler_bench.py's --json files, by side.

    python scripts/sampler_ab.py DIR [--base plain] [--modes top-p,min-p]

h200_report.sh's bench_ab (and part343's .snap0 runs) write sb_<side>_<case>[_<run>].json: side the
build or setting (plain, topp, old, ...), case the logits (s3: --logit-scale 3; bf16: --bf16-logits),
run 1, 2, ... Each file holds {"results": [{"mode", "batch", "us"}, ...]}. This prints, per case,
mode and batch, each side's runs (us a call), their mean and the mean's change against the base
side's, so the percentages in docs/ come from one tool rather than from a scratch script.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections import defaultdict

_NAME = re.compile(r"^sb_(?P<side>[a-z0-9]+)_(?P<case>s[0-9.]+|bf16)(?:_(?P<run>\d+))?$")

# (case, mode, batch) -> side -> {run: us}
Runs = dict[tuple[str, str, int], dict[str, dict[int, float]]]


def parse_name(stem: str) -> tuple[str, str, int] | None:
    """(side, case, run) of a bench file's stem; run 1 when the name has none."""
    m = _NAME.match(stem)
    if m is None:
        return None
    return m["side"], m["case"], int(m["run"] or 1)


def collect(directory: str) -> tuple[Runs, list[str], list[str]]:
    """Every readable sb_*.json under directory: the runs, the sides in first-seen order, and the
    names that could not be read or parsed."""
    runs: Runs = defaultdict(lambda: defaultdict(dict))
    sides: list[str] = []
    skipped = []
    for path in sorted(glob.glob(os.path.join(directory, "sb_*.json"))):
        stem = os.path.basename(path)[:-5]
        parsed = parse_name(stem)
        try:
            with open(path) as f:
                rows = [(str(r["mode"]), int(r["batch"]), float(r["us"])) for r in json.load(f)["results"]]
        except (OSError, ValueError, KeyError, TypeError):
            parsed = None
        if parsed is None:
            skipped.append(stem)
            continue
        side, case, run = parsed
        if side not in sides:
            sides.append(side)
        for mode, batch, us in rows:
            runs[(case, mode, batch)][side][run] = us
    return runs, sides, skipped


def _case_key(case: str) -> tuple[int, float]:
    return (1, 0.0) if case == "bf16" else (0, float(case[1:]))


def table(runs: Runs, sides: list[str], base: str, modes: list[str] | None = None) -> list[str]:
    """The table's lines: per case (scales ascending, then bf16), each mode and batch (in the files'
    order) with every side's runs and mean, and each other side's change against base."""
    order = sorted(sides, key=lambda s: s != base)
    n_runs = max((max(r) for per in runs.values() for r in per.values()), default=1)
    cells = "".join(f"{s + ' ' + str(r):>10s}" for s in order for r in range(1, n_runs + 1))
    lines = []
    for case in sorted({c for c, _, _ in runs}, key=_case_key):
        lines.append(f"== {case}")
        lines.append(f"{'mode':28s}{'B':>5s}{cells}" + "".join(f"{s + '/' + base:>12s}" for s in order if s != base))
        for (c, mode, batch), per in runs.items():
            if c != case or (modes and not any(m in mode for m in modes)):
                continue
            row = f"{mode:28s}{batch:5d}"
            for s in order:
                row += "".join(f"{per[s][r]:10.1f}" if r in per.get(s, {}) else f"{'-':>10s}"
                               for r in range(1, n_runs + 1))
            ref = per.get(base)
            for s in order:
                if s == base:
                    continue
                mine = per.get(s)
                change = (f"{100 * (sum(mine.values()) / len(mine) / (sum(ref.values()) / len(ref)) - 1):+.1f}%"
                          if mine and ref else "-")
                row += f"{change:>12s}"
            lines.append(row)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/sampler_ab.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a device call's result directory (h200_report.sh's $W)")
    p.add_argument("--base", default="plain", help="the side the others are compared with")
    p.add_argument("--modes", default=None, help="comma-separated parts of the mode names to show (all: unset)")
    ns = p.parse_args(argv)
    runs, sides, skipped = collect(ns.dir)
    if not runs:
        print(f"no readable sb_*.json in {ns.dir}")
        return 1
    if ns.base not in sides:
        print(f"--base {ns.base}: no sb_{ns.base}_*.json in {ns.dir}; the sides are {', '.join(sides)}")
        return 1
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()] if ns.modes else None
    print("\n".join(table(runs, sides, ns.base, modes)))
    if skipped:
        print("not read: " + ", ".join(skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
