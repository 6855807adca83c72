"""The A/B table of one device call: every graph_*.json under a directory, grouped into settings.

    python scripts/ab_table.py DIR [--base base]

h200_report.sh's graph stages write graph_<shape>_<setting>[_<run>].json (scripts/step_kernels.py's
--json: graph_ms is the median CUDA-event time of the step's graph replays), e.g.
graph_q8_spec_b1_wreg_2.json: shape q8_spec_b1, setting wreg, run 2. This prints, per shape, each
setting's runs, their mean and the mean's change against the base setting's mean of the same shape,
so the percentages in docs/ are computed by one tool rather than by hand.

Where the files carry step_kernels.py's graph_launches (every kernel the captured graphs launched,
by name), a setting whose record equals its base's is marked "same launches as base": the setting
changed no kernel, so its change is noise (session 28's part182 measured a route that an earlier
gate kept from ever running). Settings inside a kernel (compile-time defines) leave the names as
they are and are not marked.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from dataclasses import dataclass, field

# shape: the model (q06, q8), then optionally _spec and a batch (_b4); the setting is the rest, less
# a trailing run number
_NAME = re.compile(r"^graph_(?P<shape>[a-z0-9]+(?:_spec)?(?:_b\d+)?)_(?P<setting>.+?)(?:_(?P<run>\d+))?$")


@dataclass
class Setting:
    shape: str
    name: str
    runs: dict[int, float] = field(default_factory=dict)
    launches: dict[str, int] | None = None  # the first run's graph_launches, where recorded

    @property
    def mean(self) -> float:
        return sum(self.runs.values()) / len(self.runs)


def parse_name(stem: str) -> tuple[str, str, int] | None:
    """(shape, setting, run) of a graph file's stem; run 1 when the name has none."""
    m = _NAME.match(stem)
    if m is None:
        return None
    return m["shape"], m["setting"], int(m["run"] or 1)


def collect(directory: str) -> tuple[list[Setting], list[str]]:
    """Every readable graph_*.json under directory, grouped by (shape, setting) in file order, and
    the names that could not be read or parsed."""
    settings: dict[tuple[str, str], Setting] = {}
    skipped = []
    for path in sorted(glob.glob(os.path.join(directory, "graph_*.json"))):
        stem = os.path.basename(path)[:-5]
        parsed = parse_name(stem)
        try:
            with open(path) as f:
                data = json.load(f)
            ms = float(data["graph_ms"])
        except (OSError, ValueError, KeyError, TypeError):
            parsed = None
        if parsed is None:
            skipped.append(stem)
            continue
        shape, name, run = parsed
        setting = settings.setdefault((shape, name), Setting(shape, name))
        setting.runs[run] = ms
        if setting.launches is None and isinstance(data.get("graph_launches"), dict):
            setting.launches = data["graph_launches"]
    return list(settings.values()), skipped


def table(settings: list[Setting], base: str) -> list[str]:
    """The table's lines: per shape (in name order) the base setting first, then the others."""
    lines = []
    n_runs = max((max(s.runs) for s in settings), default=1)
    head = f"{'shape / setting':34s}" + "".join(f"{'run ' + str(r):>9s}" for r in range(1, n_runs + 1))
    lines.append(head + f"{'mean':>9s}  vs {base}")
    for shape in sorted({s.shape for s in settings}):
        group = sorted((s for s in settings if s.shape == shape), key=lambda s: (s.name != base, s.name))
        ref_setting = next((s for s in group if s.name == base), None)
        ref = ref_setting.mean if ref_setting else None
        for s in group:
            runs = "".join(f"{s.runs[r]:9.4f}" if r in s.runs else f"{'-':>9s}" for r in range(1, n_runs + 1))
            change = "" if ref is None or s.name == base else f"{100 * (s.mean / ref - 1):+.2f}%"
            if (change and s.launches is not None and ref_setting.launches is not None
                    and s.launches == ref_setting.launches):
                change += f"  (same launches as {base})"
            lines.append(f"{shape + ' ' + s.name:34s}{runs}{s.mean:9.4f}  {change}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/ab_table.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a device call's result directory (h200_report.sh's $W)")
    p.add_argument("--base", default="base", help="the setting the others are compared with")
    ns = p.parse_args(argv)
    settings, skipped = collect(ns.dir)
    if not settings:
        print(f"no readable graph_*.json in {ns.dir}")
        return 1
    print("\n".join(table(settings, ns.base)))
    if skipped:
        print("not read: " + ", ".join(skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
