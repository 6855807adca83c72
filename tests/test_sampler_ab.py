"""scripts/sampler_ab.py: the sampler bench's file names parsed into side / case / run, and the A/B
table's means and changes computed from the files' figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sampler_ab.py"
_spec = importlib.util.spec_from_file_location("sampler_ab", SCRIPT)
sampler_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sampler_ab)


@pytest.mark.parametrize("stem,want", [
    ("sb_plain_s3_1", ("plain", "s3", 1)),
    ("sb_topp_s3.5_2", ("topp", "s3.5", 2)),
    ("sb_old_bf16", ("old", "bf16", 1)),
    ("sb_plain", None), ("sb_plain_x3_1", None), ("graph_q8_base_1", None),
])
def test_parse_name(stem, want):
    assert sampler_ab.parse_name(stem) == want


def write(d: Path, stem: str, rows) -> None:
    (d / f"{stem}.json").write_text(json.dumps({"results": [{"mode": m, "batch": b, "vocab": 151936, "us": us}
                                                            for m, b, us in rows]}))


def test_table_means_and_changes(tmp_path, capsys):
    write(tmp_path, "sb_plain_s3_1", [("top-p 0.9", 1, 100.0), ("greedy", 1, 10.0)])
    write(tmp_path, "sb_plain_s3_2", [("top-p 0.9", 1, 110.0), ("greedy", 1, 10.0)])
    write(tmp_path, "sb_topp_s3_1", [("top-p 0.9", 1, 84.0), ("greedy", 1, 11.0)])
    write(tmp_path, "sb_topp_s3_2", [("top-p 0.9", 1, 84.0), ("greedy", 1, 11.0)])
    write(tmp_path, "sb_plain_bf16", [("top-p 0.9", 1, 200.0)])
    write(tmp_path, "sb_topp_bf16", [("top-p 0.9", 1, 150.0)])
    write(tmp_path, "sb_plain_s10_1", [("top-p 0.9", 1, 50.0)])  # a scale only one side ran
    (tmp_path / "sb_topp_s5_1.json").write_text("{not json")
    assert sampler_ab.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    cases = [line[3:] for line in lines if line.startswith("== ")]
    assert cases == ["s3", "s10", "bf16"]  # scales ascending as numbers, then bf16
    top_p_s3 = next(line for line in lines if line.startswith("top-p 0.9") and "100.0" in line)
    assert top_p_s3.split()[-1] == "-20.0%"  # 84 against the mean of 100 and 110
    assert next(line for line in lines if line.startswith("greedy")).split()[-1] == "+10.0%"
    assert next(line for line in lines if "200.0" in line).split()[-1] == "-25.0%"
    assert next(line for line in lines if "50.0" in line).split()[-1] == "-"
    assert "not read: sb_topp_s5_1" in out
    assert sampler_ab.main([str(tmp_path), "--modes", "greedy"]) == 0
    assert "top-p" not in capsys.readouterr().out
    assert sampler_ab.main([str(tmp_path), "--base", "topp"]) == 0
    assert "plain/topp" in capsys.readouterr().out
    assert sampler_ab.main([str(tmp_path), "--base", "old"]) == 1
    assert "the sides are plain, topp" in capsys.readouterr().out
    assert sampler_ab.main([str(tmp_path / "none")]) == 1
