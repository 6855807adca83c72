"""scripts/sanitize_pieces.py on the CPU: each piece of the load runs offline (minillm.generate on a
tiny model) in its own process under a compute-sanitizer stand-in (the real one needs a GPU), and
the exit status says whether every piece finished with a clean summary. The faults are real where
they can be: a memory limit below what a piece holds kills it; only a reported error is injected,
through the stand-in's summary line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sanitize_pieces.py"
FAKE = """#!/usr/bin/env bash
# compute-sanitizer stand-in: --tool T --error-exitcode N --log-file F CMD...; exits with CMD's status
while [ $# -gt 0 ]; do
  case "$1" in --tool) shift 2;; --error-exitcode) shift 2;; --log-file) log=$2; shift 2;; *) break;; esac
done
"$@"
rc=$?
clean='========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)'
printf '========= COMPUTE-SANITIZER\\n%s\\n' "${FAKE_SUMMARY:-$clean}" > "$log"
echo "MINILLM_INITCHECK=${MINILLM_INITCHECK:-}" >> "$log"
exit $rc
"""


def run(tmp_path, *args: str, summary: str | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "compute-sanitizer").write_text(FAKE)
    (bindir / "compute-sanitizer").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           **({"FAKE_SUMMARY": summary} if summary else {})}
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPT), *args, "--device", "cpu", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=900)
    pieces = out / "pieces.json"
    return r, json.loads(pieces.read_text()) if pieces.exists() else []


def test_every_piece_runs_alone_and_clean_pieces_pass(tiny, drafter, tmp_path):
    """The default pieces with a drafter: eight batched prompts, a ~3,000-token prompt in chunks, DFlash
    with two and with eight; each in its own process, each finished (its JSON output), each summary
    clean, and its peak memory recorded."""
    r, pieces = run(tmp_path, str(tiny), "--drafter", str(drafter), "--k", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p["piece"] for p in pieces] == ["batch8", "long", "dflash", "batch8_dflash", "long_dflash"]
    for p in pieces:
        assert p["ok"] and p["finished"] and p["sanitizer_clean"] and p["rc"] == 0, p
        assert 0 < p["peak_rss_gb"] < 64
    log = (tmp_path / "out" / "batch8.log").read_text()
    assert log.count('"finish_reason": "length"') == 8
    assert '"num_speculative_tokens": 3' in pieces[2]["cmd"] and "--speculative-config" not in pieces[0]["cmd"]


def test_a_reported_hazard_fails_the_run(tiny, tmp_path):
    r, pieces = run(tmp_path, str(tiny), "--pieces", "batch8",
                    summary="========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)")
    assert r.returncode == 1 and "FAILED: ['batch8']" in r.stdout, r.stdout + r.stderr
    assert pieces[0]["finished"] and not pieces[0]["sanitizer_clean"] and not pieces[0]["ok"]


def test_a_piece_past_the_memory_limit_is_killed(tiny, tmp_path):
    """A limit below what a Python process holds: the piece's whole group is killed (no summary is
    written, as when a real sanitizer is killed) and the run fails, saying why."""
    r, pieces = run(tmp_path, str(tiny), "--pieces", "long", "--host-memory-limit-gb", "0.02")
    assert r.returncode == 1, r.stdout + r.stderr
    assert pieces[0]["outcome"] == "killed at the host memory limit (0.02 GB)"
    assert not pieces[0]["finished"] and pieces[0]["sanitizer_summary"] == []
    assert "long: killed at the host memory limit" in r.stdout


def test_each_tool_runs_every_piece(tiny, tmp_path):
    """--tool memcheck,initcheck: every piece under each tool, its own log and record; initcheck's
    process gets MINILLM_INITCHECK=1 (cuBLAS's outputs zeroed first), memcheck's does not."""
    r, pieces = run(tmp_path, str(tiny), "--pieces", "batch8", "--tool", "memcheck,initcheck")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(p["tool"], p["piece"]) for p in pieces] == [("memcheck", "memcheck-batch8"),
                                                        ("initcheck", "initcheck-batch8")]
    assert all(p["ok"] for p in pieces)
    logs = {tool: (tmp_path / "out" / f"sanitizer-{tool}-batch8.log").read_text() for tool in ("memcheck", "initcheck")}
    assert "MINILLM_INITCHECK=1" in logs["initcheck"] and "MINILLM_INITCHECK=\n" in logs["memcheck"]


@pytest.mark.parametrize("args,message", [
    (["--pieces", "batch8,nope"], "unknown piece(s) ['nope']"),
    (["--pieces", "dflash"], "the dflash pieces need --drafter"),
    (["--k", "0"], "--k must be at least 1"),
    (["--host-memory-limit-gb", "-1"], "--host-memory-limit-gb must be positive"),
    (["--tool", "leakcheck"], "--tool: 'leakcheck'"),
    (["--tool", "memcheck,"], "--tool: 'memcheck,'"),
])
def test_bad_arguments_are_refused(tmp_path, args, message):
    r, _ = run(tmp_path, "MODEL", *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_no_cublas_caps_every_step_at_the_own_products_rows():
    """--no-cublas: no piece's step holds more token rows than MINILLM_GEMM=own's kernels take (a
    product past them goes to cuBLAS, whose uninstrumented kernels stop racecheck under
    --kernel-name: part243); without it the pieces keep their own budgets."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import sanitize_pieces as sp

    def budgets(max_rows):
        out = []
        for name in sp.PIECES:
            args = sp.piece_args(name, "drafter", 8, max_rows)
            out.append(int(args[args.index("--max-num-batched-tokens") + 1]))
        return out

    assert max(budgets(None)) == 1024 and 512 in budgets(None)
    assert max(budgets(sp.OWN_GEMM_MAX_ROWS)) == sp.OWN_GEMM_MAX_ROWS == 256
