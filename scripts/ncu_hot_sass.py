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
        rows = list(csv.reader(f))
    # the table starts at its header row (ncu and the profiled program print other lines first)
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address" and "Source" in r), None)
    if start is None:
        print(f"{ns.csv}: no source-page table (a header row starting with Address)", file=sys.stderr)
        return 1
    header, body = rows[start], [r for r in rows[start + 1 :] if len(r) == len(rows[start])]
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

    total = sum(num(r, c_all) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} warp-stall samples")
    reasons = [(h, sum(num(r, i) for r in body)) for i, h in enumerate(header)
               if h.startswith("stall_") and "Not Issued" not in h]
    if reasons:  # the kernel's samples by stall reason, largest first
        print("by reason: " + ", ".join(f"{h[6:]} {100 * v / total:.1f}%" for h, v in
                                         sorted(reasons, key=lambda x: -x[1]) if v > 0))
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
