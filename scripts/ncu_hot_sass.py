"""The SASS instructions a kernel's warps stalled on most, from an ncu source-page CSV.

    ncu --section SourceCounters --page source --csv --print-source sass -k regex:NAME -c 1 CMD > F.csv
    python scripts/ncu_hot_sass.py F.csv [--top 40]

ncu's source page has a row per SASS instruction with its warp-stall samples (every sampled cycle
a warp spent at that instruction, issued or not). This prints the instructions with the most
samples, their share of the kernel's samples and their neighbourhood's running total, so a
kernel's time can be read off its hot spots (which load a chain of warps waits on, which barrier)
without the Nsight Compute GUI.
"""

from __future__ import annotations

import argparse
import csv
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ns = ap.parse_args(argv)
    with open(ns.csv, newline="") as f:
        lines = [line for line in f if line.count(",") >= 2]  # ncu's banner lines have no columns
    rows = list(csv.reader(lines))
    if not rows:
        print(f"{ns.csv}: no CSV rows", file=sys.stderr)
        return 1
    header, body = rows[0], rows[1:]
    def col(*words):
        for i, h in enumerate(header):
            if all(w.lower() in h.lower() for w in words):
                return i
        return None
    c_src, c_addr = col("source"), col("address")
    c_all = col("stall", "all")
    c_not = col("stall", "not")
    c_exec = col("instructions executed") or col("executed")
    if c_src is None or c_all is None:
        print("columns:", header, file=sys.stderr)
        return 1

    def num(row, c):
        try:
            return float(row[c].replace(",", "")) if c is not None and c < len(row) else 0.0
        except ValueError:
            return 0.0

    body = [r for r in body if len(r) > c_all]
    total = sum(num(r, c_all) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} warp-stall samples")
    order = sorted(range(len(body)), key=lambda i: -num(body[i], c_all))[: ns.top]
    print(f"{'#':>5} {'address':>8} {'samples':>8} {'share':>6} {'not-iss':>8} {'executed':>9}  sass")
    for i in sorted(order):
        r = body[i]
        addr = r[c_addr] if c_addr is not None else ""
        print(f"{i:5d} {addr:>8} {num(r, c_all):8.0f} {100 * num(r, c_all) / total:5.1f}% {num(r, c_not):8.0f} "
              f"{num(r, c_exec):9.0f}  {r[c_src][:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
