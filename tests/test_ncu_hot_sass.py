"""scripts/ncu_hot_sass.py reads ncu's source-page CSV as ncu writes it (banner and program lines
first) and reports the instructions with the most warp-stall samples and the samples by reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ncu_hot_sass.py"
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_barrier","stall_barrier (Not Issued)","stall_long_sb"')


def load():
    spec = importlib.util.spec_from_file_location("ncu_hot_sass", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hot_instructions_and_reasons(tmp_path, capsys):
    rows = [("0x10", "LDC R1, c[0x0][0x28]", 2, 2, 256, 0, 0, 2),
            ("0x20", "LDS.128 R4, [R4]", 30, 28, 256, 30, 28, 0),
            ("0x30", "HMMA.16816.F32.BF16 R80, R52, R108, R80", 8, 1, 2048, 0, 0, 0),
            ("0x40", "BAR.SYNC 0x0", 60, 60, 512, 60, 60, 0)]
    text = ['==PROF== Connected to process 1', '{"model": "/tmp/m", "batch": 1, "graph_ms": null}',
            '"Kernel Name","paged_prefill_bf16_d128",', HEADER]
    text += [",".join(f'"{v}"' for v in r) for r in rows]
    f = tmp_path / "ncu.csv"
    f.write_text("\n".join(text) + "\n")
    assert load().main([str(f), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "4 instructions, 100 warp-stall samples"
    assert out[1] == "by reason: barrier 90.0%, long_sb 2.0%"  # the Not Issued columns are subsets
    listed = [line.split()[1] for line in out[3:]]
    assert listed == ["0x20", "0x40"]  # the two hottest, in program order
    assert "60.0%" in out[4] and "BAR.SYNC" in out[4]


def test_no_table_is_an_error(tmp_path, capsys):
    f = tmp_path / "empty.csv"
    f.write_text("==PROF== Disconnected\n")
    assert load().main([str(f)]) == 1
    assert "no source-page table" in capsys.readouterr().err
