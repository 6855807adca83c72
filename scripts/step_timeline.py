"""One decode step's CUDA graph as a timeline of its kernels, from timestamps the kernels record.

    python scripts/step_timeline.py MODEL --batch 1 --ctx 512 [--json F]
    python scripts/step_timeline.py MODEL --spec DRAFTER --k 8 --batch 1   # the verification graph
    python scripts/step_timeline.py --saved docs/results/h200_timeline_q06_b1_*.json   # saved results' layers

The kernels are built with MINILLM_TIMELINE=1 (cuda/common.cuh): thread 0 of every CTA of a PDL
kernel records its grid's launch id (%gridid), grid and block size, SM, and the global timer at
pdl_entry, when the PDL wait returned and at pdl_release. One replay of the step's graph is read
back, its grids ordered by their first CTA's start, and the step split kernel by kernel into

  work      from the kernel's first CTA's wait returning to its last CTA's release (main loops);
  hand-off  from the previous kernel's last release to this kernel's first wait returning: the
            previous kernel's tail after its release (reductions, merges, stores), its completion
            and the memory flush the wait needs.

A kernel may stamp its own phases after the release (cuda/common.cuh timeline_stamp: words 6 and 7).
The decode attention stamps each CTA's arrival at its split counter and the end of the last split's
merge, so its hand-off splits into

  to arrival  from its last release to its last CTA's arrival (partials written, fence, counter);
  merge       from that arrival to the last merge's end (the merging CTA's loads and stores);
  to wait     from the last merge's end to the next kernel's first wait returning (the grid's
              completion and memory flush).

With MINILLM_CUDA_DEFINES=DEC_TL_PHASES=1 the decode attention stamps, instead, each CTA's end of the
q/k norm + RoPE and of its keys (before its release), and its rows get the medians of those phases
(attention_phases).

Kernels are labelled by launch shape (grid x block); a layer repeats its shapes, so the summary
gives each shape's count and medians. Kernels outside the PDL modules record nothing (the gap
they leave shows up as one long hand-off). Recording costs a little: the instrumented graph's
time is printed beside its split, so read the split, not the absolute times.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TL_CAP = 1 << 18  # MINILLM_TL_CAP in cuda/common.cuh


def timeline_buffers(cupy, modules) -> list:
    """(count, records) device views of every loaded module's minillm_tl_n / minillm_tl."""
    out = []
    for mod in modules:
        try:
            n_ptr, rec_ptr = mod.get_global("minillm_tl_n"), mod.get_global("minillm_tl")
        except Exception:  # noqa: BLE001 - a module built without MINILLM_TIMELINE
            continue
        out.append((cupy.ndarray((1,), cupy.uint32, memptr=n_ptr),
                    cupy.ndarray((TL_CAP, 8), cupy.uint64, memptr=rec_ptr)))
    return out


def grids_of(records: np.ndarray, phases: bool = False) -> list[dict]:
    """Per launch (gridid): its shape, CTAs recorded and the first / last times (ns), by start. phases:
    words 6 and 7 are the decode attention's DEC_TL_PHASES stamps (after RoPE, after its keys), not its
    arrival and merge: each grid that has them gets attention_phases' medians."""
    by = defaultdict(list)
    for r in records:
        by[int(r[0])].append(r)
    grids = []
    for gid, rs in by.items():
        a = np.asarray(rs, dtype=np.uint64)  # words 5-7 are 0 where a CTA did not stamp them
        g = {"gridid": gid, "shape": f"{int(a[0, 1] >> 32)}x{int(a[0, 2] >> 32)}", "ctas": len(rs),
             "entry": int(a[:, 3].min()), "wait_first": int(a[:, 4].min()), "wait_last": int(a[:, 4].max()),
             "release_last": int(a[:, 5].max()), "released": int(np.count_nonzero(a[:, 5])),
             "arrive_last": 0 if phases else int(a[:, 6].max()), "merged_last": 0 if phases else int(a[:, 7].max())}
        if phases:
            g.update(attention_phases(a))
        grids.append(g)
    return sorted(grids, key=lambda g: g["entry"])


PHASE_KEYS = ("rope_us", "keys_us", "to_release_us", "last_rope_us", "last_keys_us")


def attention_phases(a: np.ndarray) -> dict:
    """The decode attention's CTAs under DEC_TL_PHASES, us: the medians over its working CTAs of wait ->
    RoPE done (rope), RoPE -> keys done (keys), keys -> release (to release: its key groups' merge in
    shared memory is after the release), and from the grid's first wait to its last CTA's RoPE / keys
    (last rope, last keys). {} for a grid without the stamps."""
    w = a[(a[:, 4] > 0) & (a[:, 5] > 0) & (a[:, 6] > 0) & (a[:, 7] > 0)].astype(np.int64)
    if not len(w):
        return {}
    first = int(a[:, 4][a[:, 4] > 0].min())
    return {"rope_us": float(np.median(w[:, 6] - w[:, 4])) / 1e3, "keys_us": float(np.median(w[:, 7] - w[:, 6])) / 1e3,
            "to_release_us": float(np.median(w[:, 5] - w[:, 7])) / 1e3,
            "last_rope_us": (int(w[:, 6].max()) - first) / 1e3, "last_keys_us": (int(w[:, 7].max()) - first) / 1e3}


def split(grids: list[dict]) -> dict:
    """Each grid's work and hand-off (us), per-shape medians, and the step's totals."""
    if not grids:
        raise ValueError("no CTA records: did the step replay a graph of kernels built with MINILLM_TIMELINE=1?")
    t0 = grids[0]["entry"]
    rows, by_shape = [], defaultdict(lambda: {"work": [], "handoff": [], "placed": []})
    for i, g in enumerate(grids):
        work = (g["release_last"] - g["wait_first"]) / 1e3 if g["release_last"] else None
        prev = grids[i - 1]["release_last"] if i else 0
        handoff = (g["wait_first"] - prev) / 1e3 if prev else None
        placed = (g["entry"] - prev) / 1e3 if prev else None
        rows.append({"shape": g["shape"], "ctas": g["ctas"], "released": g["released"],
                     "start_us": (g["entry"] - t0) / 1e3,
                     "work_us": work, "handoff_us": handoff, "placed_after_release_us": placed,
                     "wait_spread_us": (g["wait_last"] - g["wait_first"]) / 1e3,
                     **tail_phases(g, grids[i + 1] if i + 1 < len(grids) else None),
                     **{k: g[k] for k in PHASE_KEYS if k in g}})
        for key, v in (("work", work), ("handoff", handoff), ("placed", placed)):
            if v is not None:
                by_shape[g["shape"]][key].append(v)
    end = max(g["release_last"] for g in grids)
    shapes = {s: {"count": len(v["work"]) or len(v["handoff"]),
                  **{f"{k}_us_median": round(float(np.median(x)), 2) for k, x in v.items() if x},
                  **{f"{k}_us_total": round(float(np.sum(x)), 1) for k, x in v.items() if x}}
              for s, v in by_shape.items()}
    return {"grids": len(grids), "span_us": round((end - t0) / 1e3, 1),
            "work_us": round(sum(r["work_us"] or 0 for r in rows), 1),
            "handoff_us": round(sum(r["handoff_us"] or 0 for r in rows), 1),
            "shapes": shapes, "layer": layer_positions(rows), "timeline": rows}


TAIL_KEYS = ("to_arrival_us", "merge_us", "to_wait_us")
# where a kernel starts: its first CTA's entry (pdl_entry, after any pre-wait work) after the previous
# kernel's last release, and the spread of its CTAs' waits returning (CTAs placed late widen it)
START_KEYS = ("placed_after_release_us", "wait_spread_us")


def tail_phases(g: dict, nxt: dict | None) -> dict:
    """The grid's hand-off split by its own stamps (module docstring), or {} if it stamps none."""
    if not (g["release_last"] and g["arrive_last"] and g["merged_last"]):
        return {}
    return {"to_arrival_us": (g["arrive_last"] - g["release_last"]) / 1e3,
            "merge_us": (g["merged_last"] - g["arrive_last"]) / 1e3,
            "to_wait_us": (nxt["wait_first"] - g["merged_last"]) / 1e3 if nxt else None}


def layer_positions(rows: list[dict], max_period: int = 16) -> dict | None:
    """The step's repeating layer: the shortest period p (2..max_period) whose pattern holds for three
    periods from some first grid and, from there on, for >= 90% of the grids' shapes; per position
    of the layer, its shape and the medians of its work, hand-off, placement and wait spread (and of
    its stamped phases) over the full layers. None if the shapes do not repeat."""
    shapes = [r["shape"] for r in rows]
    n = len(shapes)
    for p in range(2, max_period + 1):
        start = next((i for i in range(n - 3 * p + 1)
                      if shapes[i:i + p] == shapes[i + p:i + 2 * p] == shapes[i + 2 * p:i + 3 * p]), None)
        if start is None or sum(shapes[i] == shapes[i + p] for i in range(start, n - p)) < 0.9 * (n - p - start):
            continue
        layers = [rows[i:i + p] for i in range(start, n - p + 1, p) if [r["shape"] for r in rows[i:i + p]]
                  == shapes[start:start + p]]
        positions = []
        for j in range(p):
            pos = {"shape": shapes[start + j]}
            for key in ("work_us", "handoff_us", *START_KEYS, *TAIL_KEYS, *PHASE_KEYS):
                v = [layer[j][key] for layer in layers if layer[j].get(key) is not None]
                if v or key in ("work_us", "handoff_us"):
                    pos[f"{key}_median"] = round(float(np.median(v)), 2) if v else None
            positions.append(pos)
        return {"period": p, "start": start, "layers": len(layers), "positions": positions}
    return None


def run(model: str, batch: int, ctx: int, replays: int = 10, drafter: str | None = None, k: int = 8) -> dict:
    defines = os.environ.get("MINILLM_CUDA_DEFINES", "")
    os.environ["MINILLM_CUDA_DEFINES"] = ",".join(d for d in (defines, "MINILLM_TIMELINE=1") if d)
    import cupy
    from step_kernels import warm_engine

    from minillm.backends import compile as kc
    from minillm.bench.gpu_timing import record_replays, replay_ms

    engine = warm_engine(model, batch, ctx, drafter=drafter, k=k)
    backend = engine.backend
    bufs = timeline_buffers(cupy, list(kc._modules.values()))
    if not bufs:
        raise SystemExit("no module was built with MINILLM_TIMELINE=1")
    got: list = []

    def read_one(replay) -> None:  # zero every module's count, replay once, read the records
        for n, _ in bufs:
            cupy.cuda.runtime.memsetAsync(n.data.ptr, 0, 4, backend.stream.ptr)
        replay()
        backend.synchronize()
        for n, rec in bufs:
            count = int(n.get()[0])
            got.append((count, rec[: min(count, TL_CAP)].get()))

    engine.runner.replay_timer = read_one
    engine.step()
    times = record_replays(engine.runner, backend)
    for _ in range(replays):
        engine.step()
    engine.runner.replay_timer = None
    backend.synchronize()
    asked = sum(count for count, _ in got)
    records = np.concatenate([r for _, r in got]) if got else np.zeros((0, 8), np.uint64)
    kept = int(records.shape[0])
    out = {"model": model, "batch": batch, "ctx": ctx, "drafter": drafter, "k": k if drafter else None,
           "records": kept, "dropped": asked - kept,
           "instrumented_graph_ms": float(np.median(replay_ms(backend, times)))}
    phases = "DEC_TL_PHASES=1" in os.environ["MINILLM_CUDA_DEFINES"].split(",")
    return {**out, **split(grids_of(records, phases=phases))}


def print_layer(layer: dict | None) -> None:
    """layer_positions' table: a line a kernel of the layer."""
    if not layer:
        print("no repeating layer")
        return
    print(f"a layer: {layer['period']} kernels from grid {layer['start']}, {layer['layers']} layers; by position "
          "(shape, medians in us: work, hand-off in, placed after the previous release, wait spread):")
    for j, pos in enumerate(layer["positions"]):
        extra = [k for k in (*TAIL_KEYS, *PHASE_KEYS) if pos.get(k + "_median") is not None]
        tail = ", then: " + ", ".join(f"{k[:-3].replace('_', ' ')} {pos[k + '_median']:.2f}" for k in extra) \
            if extra else ""
        cols = [pos.get(k + "_median") for k in ("work_us", "handoff_us", *START_KEYS)]
        print(f"  {j:2d} {pos['shape']:18s}" + "".join(f" {c or 0:8.2f}" for c in cols) + tail)


def print_saved(paths: list[str]) -> None:
    """The layer table of each saved --json result, its positions computed again from its timeline rows
    (results saved before a median was added to layer_positions get it too)."""
    import json

    for path in paths:
        with open(path) as f:
            r = json.load(f)
        print(f"{path}: {r.get('model')} batch {r.get('batch')} ctx {r.get('ctx')}, instrumented graph "
              f"{r.get('instrumented_graph_ms', float('nan')):.3f} ms")
        print_layer(layer_positions(r["timeline"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="the model to time (not with --saved)")
    p.add_argument("--saved", nargs="+", metavar="JSON", help="print the layer tables of saved --json results")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--spec", default=None, metavar="DRAFTER",
                   help="speculate with this DFlash drafter: the target's verification graph is read")
    p.add_argument("--k", type=int, default=8, help="drafts a round with --spec")
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    if ns.saved:
        if ns.model:
            p.error("give a model or --saved, not both")
        print_saved(ns.saved)
        return 0
    if not ns.model:
        p.error("give a model to time, or --saved JSON... to read saved results")
    r = run(ns.model, ns.batch, ns.ctx, drafter=ns.spec, k=ns.k)
    print(f"{r['grids']} grids recorded ({r['records']} CTA records, {r['dropped']} dropped); instrumented graph "
          f"{r['instrumented_graph_ms']:.3f} ms; recorded span {r['span_us']:.1f} us = work {r['work_us']:.1f} "
          f"+ hand-offs {r['handoff_us']:.1f} (+ the first grid's wait)")
    print(f"{'shape (grid x block)':22s} {'count':>5s} {'work med':>9s} {'hand-off med':>12s} {'placed med':>10s} "
          f"{'work sum':>9s} {'hand-off sum':>12s}")
    for s, v in sorted(r["shapes"].items(), key=lambda kv: -kv[1].get("work_us_total", 0)):
        print(f"{s:22s} {v['count']:5d} {v.get('work_us_median', float('nan')):9.2f} "
              f"{v.get('handoff_us_median', float('nan')):12.2f} {v.get('placed_us_median', float('nan')):10.2f} "
              f"{v.get('work_us_total', 0):9.1f} {v.get('handoff_us_total', 0):12.1f}")
    print_layer(r["layer"])
    print("first 16 grids: shape, CTAs recorded, CTAs that released (the others exited first: e.g. the decode "
          "attention's inactive splits), start, work, hand-off, placed after the previous release (us)")
    for row in r["timeline"][:16]:
        print(f"  {row['shape']:18s} {row['ctas']:5d} {row['released']:5d} {row['start_us']:8.2f} "
              f"{row['work_us'] or 0:7.2f} {row['handoff_us'] or 0:7.2f} {row['placed_after_release_us'] or 0:7.2f}")
    if ns.json:
        from minillm.bench.report import write_json

        write_json(ns.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
