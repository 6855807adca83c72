"""scripts/ab_table.py: graph file names parsed into shape / setting / run, and the A/B table's
means and changes computed from the files' graph_ms."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ab_table.py"
_spec = importlib.util.spec_from_file_location("ab_table", SCRIPT)
ab_table = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("ab_table", ab_table)  # dataclasses look their module up there
_spec.loader.exec_module(ab_table)


@pytest.mark.parametrize("stem,want", [
    ("graph_q06_base_1", ("q06", "base", 1)),
    ("graph_q8_spec_b1_nowreg_2", ("q8_spec_b1", "nowreg", 2)),
    ("graph_q8_b4_flight8_2", ("q8_b4", "flight8", 2)),
    ("graph_q06_final", ("q06", "final", 1)),
    ("graph_q8_pf40_1", ("q8", "pf40", 1)),
])
def test_parse_name(stem, want):
    assert ab_table.parse_name(stem) == want


def write(d: Path, stem: str, ms) -> None:
    (d / f"{stem}.json").write_text(json.dumps({"graph_ms": ms}))


def test_table_means_and_changes(tmp_path, capsys):
    for stem, ms in [("graph_q8_base_1", 4.0), ("graph_q8_base_2", 4.2), ("graph_q8_pf40_1", 3.9),
                     ("graph_q8_pf40_2", 3.9), ("graph_q06_base_1", 1.0), ("graph_q06_x_1", 1.1)]:
        write(tmp_path, stem, ms)
    (tmp_path / "graph_q8_bad_1.json").write_text("{not json")
    write(tmp_path, "graph_q8_none_1", None)
    assert ab_table.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {" ".join(line.split()[:2]): line.split()[2:] for line in out[1:] if not line.startswith("not read")}
    assert rows["q8 base"] == ["4.0000", "4.2000", "4.1000"]
    assert rows["q8 pf40"] == ["3.9000", "3.9000", "3.9000", f"{100 * (3.9 / 4.1 - 1):+.2f}%"]
    assert rows["q06 x"] == ["1.1000", "-", "1.1000", "+10.00%"]
    assert out[-1] == "not read: graph_q8_bad_1, graph_q8_none_1"
    # the base comes first within its shape, shapes in name order
    assert [line.split()[0] + " " + line.split()[1] for line in out[1:-1]] == [
        "q06 base", "q06 x", "q8 base", "q8 pf40"]


def test_other_base_and_empty_dir(tmp_path, capsys):
    write(tmp_path, "graph_q8_wreg_1", 2.0)
    write(tmp_path, "graph_q8_fh_1", 1.0)
    assert ab_table.main([str(tmp_path), "--base", "wreg"]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith("-50.00%")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ab_table.main([str(empty)]) == 1


def test_settings_that_changed_no_kernel_are_marked(tmp_path, capsys):
    """A setting whose graphs launched what the base's did (step_kernels.py's graph_launches) is
    marked: its change is noise. Another record, or none, is not."""
    base = {"gemm_skinny2_bf16": 72, "cublas": 180}
    records = [("graph_q8_spec_b2_base_1", 6.70, base), ("graph_q8_spec_b2_base_2", 6.72, base),
               ("graph_q8_spec_b2_void_1", 6.71, dict(base)),
               ("graph_q8_spec_b2_route_1", 6.60, {"gemm_skinny2_bf16": 72, "gemm_skinny4_bf16": 41, "cublas": 139}),
               ("graph_q8_spec_b2_old_1", 6.69, None)]
    for stem, ms, launches in records:
        data = {"graph_ms": ms} if launches is None else {"graph_ms": ms, "graph_launches": launches}
        (tmp_path / f"{stem}.json").write_text(json.dumps(data))
    assert ab_table.main([str(tmp_path)]) == 0
    out = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert out["void"].endswith("(same launches as base)")
    assert "same launches" not in out["route"] and "same launches" not in out["old"]
    assert "same launches" not in out["base"]
