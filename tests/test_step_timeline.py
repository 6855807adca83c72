"""scripts/step_timeline.py's split of a graph's recorded CTAs (cuda/common.cuh MINILLM_TIMELINE) into
each kernel's work and the hand-offs between kernels, on records written by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "step_timeline.py"


def load():
    spec = importlib.util.spec_from_file_location("step_timeline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mod


def record(gid, grid, cta, block, entry, wait, release, arrived=0, merged=0):
    """One CTA's record as the kernel writes it: [gridid, grid << 32 | CTA, block << 32 | SM, t0, t1, t2,
    and the kernel's own stamps after its release]."""
    return [gid, (grid << 32) | cta, (block << 32) | 3, entry, wait, release, arrived, merged]


def test_work_and_handoffs():
    st = load()
    # grid 7 (3 CTAs of 128): the last release at 1600; grid 9 (2 CTAs of 256) placed at 1550 (a
    # CTA of grid 7 without a release record does not count), its first wait back at 1700
    rows = [record(9, 2, 1, 256, 1560, 1710, 2000), record(7, 3, 0, 128, 1000, 1100, 1500),
            record(7, 3, 1, 128, 1010, 1150, 1600), record(7, 3, 2, 128, 1020, 1120, 0),
            record(9, 2, 0, 256, 1550, 1700, 1900)]
    grids = st.grids_of(np.asarray(rows, dtype=np.uint64))
    assert [g["gridid"] for g in grids] == [7, 9]
    assert grids[0]["shape"] == "3x128" and grids[0]["ctas"] == 3 and grids[0]["released"] == 2
    r = st.split(grids)
    first, second = r["timeline"]
    assert first["work_us"] == pytest.approx(0.5) and first["handoff_us"] is None
    assert (first["released"], second["released"]) == (2, 2)
    assert second["work_us"] == pytest.approx(0.3)
    assert second["handoff_us"] == pytest.approx(0.1)
    assert second["placed_after_release_us"] == pytest.approx(-0.05)
    assert second["wait_spread_us"] == pytest.approx(0.01)
    assert r["span_us"] == pytest.approx(1.0) and r["work_us"] == pytest.approx(0.8)
    assert r["handoff_us"] == pytest.approx(0.1)
    assert r["shapes"]["2x256"]["handoff_us_median"] == pytest.approx(0.1)
    assert r["shapes"]["3x128"]["count"] == 1


def test_a_stamped_tail_splits_the_hand_off():
    """The attention-like grid 7 stamps its CTAs' arrivals and its merging CTA's end: its hand-off into
    grid 9 splits into release -> last arrival -> last merge end -> grid 9's first wait; an unstamped
    grid has no such split."""
    st = load()
    rows = [record(7, 2, 0, 128, 1000, 1100, 1500, arrived=1900),
            record(7, 2, 1, 128, 1010, 1150, 1600, arrived=2100, merged=2600),
            record(9, 1, 0, 256, 1550, 3000, 3200)]
    r = st.split(st.grids_of(np.asarray(rows, dtype=np.uint64)))
    first, second = r["timeline"]
    assert first["to_arrival_us"] == pytest.approx(0.5) and first["merge_us"] == pytest.approx(0.5)
    assert first["to_wait_us"] == pytest.approx(0.4)
    assert second["handoff_us"] == pytest.approx(1.4)  # = 0.5 + 0.5 + 0.4
    assert "merge_us" not in second


def test_attention_phases_from_its_stamps():
    """Under DEC_TL_PHASES words 6 and 7 are each CTA's RoPE and keys ends: the grid gets their medians
    and the last CTA's, and no tail split (those words are not an arrival and a merge)."""
    st = load()
    rows = [record(7, 3, 0, 128, 1000, 1100, 1500, arrived=1200, merged=1400),
            record(7, 3, 1, 128, 1010, 1150, 1700, arrived=1300, merged=1650),
            record(7, 3, 2, 128, 1020, 1120, 0),  # an inactive split: no stamps, not counted
            record(9, 1, 0, 256, 1550, 3000, 3200)]
    r = st.split(st.grids_of(np.asarray(rows, dtype=np.uint64), phases=True))
    first, second = r["timeline"]
    assert first["rope_us"] == pytest.approx(0.125)  # median of 100 and 150 ns
    assert first["keys_us"] == pytest.approx(0.275)  # of 200 and 350
    assert first["to_release_us"] == pytest.approx(0.075)  # of 100 and 50
    assert first["last_rope_us"] == pytest.approx(0.2) and first["last_keys_us"] == pytest.approx(0.55)
    assert "merge_us" not in first and "rope_us" not in second


def test_no_records_is_an_error():
    st = load()
    with pytest.raises(ValueError, match="no CTA records"):
        st.split(st.grids_of(np.zeros((0, 8), dtype=np.uint64)))


def test_layer_positions_find_the_repeating_layer():
    """Two lead-in grids, then five layers of three kernels: the layer is found with its medians."""
    st = load()
    rows = [{"shape": "1x128", "work_us": 0.3, "handoff_us": None},
            {"shape": "1x128", "work_us": 0.4, "handoff_us": 1.0}]
    for layer in range(5):
        rows += [{"shape": "512x128", "work_us": 3.0 + layer, "handoff_us": 1.0},
                 {"shape": "88x128", "work_us": 5.0, "handoff_us": 2.0},
                 {"shape": "128x128", "work_us": 2.0, "handoff_us": 4.0 + layer}]
    found = st.layer_positions(rows)
    assert found["period"] == 3 and found["layers"] == 5
    assert [p["shape"] for p in found["positions"]] == ["512x128", "88x128", "128x128"]
    assert found["positions"][0]["work_us_median"] == pytest.approx(5.0)
    assert found["positions"][2]["handoff_us_median"] == pytest.approx(6.0)
    assert "merge_us_median" not in found["positions"][1]
    for layer in range(5):
        rows[3 + 3 * layer].update(to_arrival_us=1.0, merge_us=2.0 + layer, to_wait_us=0.5)
    stamped = st.layer_positions(rows)["positions"][1]
    assert stamped["merge_us_median"] == pytest.approx(4.0) and stamped["to_wait_us_median"] == pytest.approx(0.5)
    assert st.layer_positions(rows[:4]) is None


def test_layer_positions_carry_where_each_kernel_starts(tmp_path, capsys):
    """Per position of the layer, the medians of placed_after_release_us and wait_spread_us (where its
    first CTA entered after the previous kernel's last release, and over how long its CTAs' waits
    returned); --saved recomputes them from a saved result's timeline rows and prints the table."""
    import json

    st = load()
    rows = []
    for layer in range(4):
        rows += [{"shape": "512x128", "work_us": 3.0, "handoff_us": 1.8, "placed_after_release_us": 0.8 + layer,
                  "wait_spread_us": 1.6},
                 {"shape": "336x128", "work_us": 3.5, "handoff_us": 2.2, "placed_after_release_us": 1.9,
                  "wait_spread_us": 0.6 * layer}]
    pos = st.layer_positions(rows)["positions"]
    assert pos[0]["placed_after_release_us_median"] == pytest.approx(2.3)
    assert pos[1]["wait_spread_us_median"] == pytest.approx(0.9)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"model": "m", "batch": 1, "ctx": 512, "instrumented_graph_ms": 0.8,
                                "timeline": rows}))
    st.print_saved([str(path)])
    out = capsys.readouterr().out
    assert "a layer: 2 kernels" in out
    assert "512x128" in out and "2.30" in out and "0.90" in out
