"""scripts/gguf_parts.py: the cut of the embedded GGUF for two device calls leaves both under the
limit with equal room, refuses when none fits, and the two parts it writes are the file again."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gguf_parts.py"
_spec = importlib.util.spec_from_file_location("gguf_parts", SCRIPT)
gguf_parts = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gguf_parts", gguf_parts)  # dataclasses look their module up there
_spec.loader.exec_module(gguf_parts)

MiB = 1 << 20


@pytest.mark.parametrize("gguf,tree,wheels", [(98_362_432, 7 * MiB, 10 * MiB), (94 * MiB, 12 * MiB, 0),
                                              (94 * MiB, 1 * MiB, 20 * MiB)])
def test_both_calls_fit_with_the_same_room(gguf, tree, wheels):
    plan = gguf_parts.plan_cut(gguf, tree, wheels)
    assert plan.first == tree + plan.cut and plan.second == tree + wheels + gguf - plan.cut
    assert max(plan.first, plan.second) <= gguf_parts.LIMIT
    assert abs(plan.first - plan.second) <= 1  # the room is split evenly
    # session 48's even split: the second call was the one at the limit
    assert plan.second < tree + wheels + gguf - gguf // 2 or wheels == 0


def test_no_cut_is_refused_with_the_sizes():
    with pytest.raises(ValueError, match="no cut fits.*third call"):
        gguf_parts.plan_cut(120 * MiB, 8 * MiB, 10 * MiB)


def test_the_parts_are_the_file_again(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 4099)
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "scripts").mkdir()
    (root / "scripts" / "gguf_parts.py").write_text(SCRIPT.read_text())
    out = subprocess.run([sys.executable, "scripts/gguf_parts.py", "--gguf", str(src)], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    assert "room under the limit" in out
    a, b = (root / ".gguf_a").read_bytes(), (root / ".gguf_b").read_bytes()
    assert a and b and a + b == src.read_bytes()
