"""scripts/failure_matrix.py on the CPU: a real server and ladder on a tiny model, and its exit
status, which says whether every rung and every sanitizer run was clean. compute-sanitizer cannot
run without a GPU, so a stand-in on PATH starts the server and, when it stops, writes the summary
line a real one writes: the only faked part, and the fault (a reported error) injected through it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "failure_matrix.py"
FAKE = """#!/usr/bin/env bash
# compute-sanitizer stand-in: --tool T --error-exitcode N --log-file F CMD...
while [ $# -gt 0 ]; do
  case "$1" in --tool) shift 2;; --error-exitcode) shift 2;; --log-file) log=$2; shift 2;; *) break;; esac
done
"$@" &
[ -n "$FAKE_PIDFILE" ] && echo $! > "$FAKE_PIDFILE"
wait $!
printf '========= COMPUTE-SANITIZER\\n%s\\n' "${FAKE_SUMMARY:-========= ERROR SUMMARY: 0 errors}" > "$log"
"""


def load_script():
    spec = importlib.util.spec_from_file_location("failure_matrix", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sanitizer_summaries():
    clean = load_script().sanitizer_clean
    assert clean("========= ERROR SUMMARY: 0 errors")[0]
    assert clean("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")[0]
    assert not clean("========= ERROR SUMMARY: 3 errors")[0]
    assert not clean("========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warnings)")[0]
    assert not clean("========= COMPUTE-SANITIZER\n")[0]  # no summary: it did not finish


def test_only_initcheck_runs_mark_cublas_outputs(monkeypatch):
    """initcheck cannot see cuBLAS's writes, so its server run zeroes cuBLAS outputs first
    (MINILLM_INITCHECK=1); no other run does."""
    monkeypatch.delenv("MINILLM_INITCHECK", raising=False)
    env = load_script().server_env
    assert env("initcheck")["MINILLM_INITCHECK"] == "1"
    for tool in (None, "memcheck", "racecheck", "synccheck"):
        assert "MINILLM_INITCHECK" not in env(tool)
        assert env(tool)["PYTHONUNBUFFERED"] == "1"


def fake_sanitizer_env(tmp_path, **extra: str) -> dict:
    """The environment with the compute-sanitizer stand-in first on PATH; extra: its FAKE_* settings."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT), **extra}


def matrix_cmd(tiny, out: Path, tools: str, output_len: int = 4) -> list[str]:
    return [sys.executable, str(SCRIPT), str(tiny), "--device", "cpu", "--out", str(out),
            "--num-blocks", "64", "--max-model-len", "256", "--concurrency", "1,2",
            "--num-prompts", "2", "--input-len", "24", "--output-len", str(output_len),
            "--sanitize-tools", tools, "--startup-timeout", "120", "--ladder-timeout", "120"]


def run_matrix(tiny, tmp_path, tools: str, summary: str | None = None):
    env = fake_sanitizer_env(tmp_path, **({"FAKE_SUMMARY": summary} if summary else {}))
    out = tmp_path / tools.replace(",", "_")
    r = subprocess.run(matrix_cmd(tiny, out, tools), capture_output=True, text=True, env=env, timeout=600)
    return r, json.loads((out / "matrix.json").read_text())


@pytest.mark.slow
def test_clean_sanitizer_runs_pass(tiny, tmp_path):
    r, points = run_matrix(tiny, tmp_path, "memcheck,racecheck")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p["sanitizer"] for p in points] == ["memcheck", "racecheck"]
    for p in points:
        assert p["sanitizer_clean"] and p["sanitizer_summary"]
        assert [(g["ok"], g["failed"]) for g in p["ladder"]["rungs"]] == [(2, 0), (2, 0)]


@pytest.mark.slow
def test_a_reported_error_fails_the_run(tiny, tmp_path):
    r, points = run_matrix(tiny, tmp_path, "initcheck", "========= ERROR SUMMARY: 2 errors")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED" in r.stdout
    assert points[0]["sanitizer_clean"] is False
    assert all(g["failed"] == 0 for g in points[0]["ladder"]["rungs"])  # the requests themselves were fine


@pytest.mark.slow
def test_a_server_that_dies_under_the_load_fails_the_run(tiny, tmp_path):
    """A sanitizer or the OOM killer can kill the server mid-ladder with nothing in its log (session
    37's racecheck runs): the point records that the server did not live through the ladder, the
    line says so, and the run fails. Here the server is killed (SIGKILL) once it is serving."""
    pidfile, out = tmp_path / "server.pid", tmp_path / "died"
    env = fake_sanitizer_env(tmp_path, FAKE_PIDFILE=str(pidfile), MINILLM_TEST_STEP_DELAY="0.05")
    proc = subprocess.Popen(matrix_cmd(tiny, out, "racecheck", output_len=100), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        log = out / "server-racecheck-256.log"
        deadline = time.monotonic() + 120
        while not (log.exists() and "minillm ready" in log.read_text(errors="replace")):
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # the ladder's first requests are in flight (100 tokens at 0.05 s a step)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        text, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    point = json.loads((out / "matrix.json").read_text())[0]
    assert point["server_alive_after_ladder"] is False
    assert "the server died during the ladder" in text and "FAILED" in text, text
    assert proc.returncode == 1


@pytest.mark.slow
def test_a_server_that_does_not_stop_is_killed_with_its_sanitizer(tiny, tmp_path):
    """A server stuck in a step (a kernel under racecheck) does not stop on SIGTERM: after
    --stop-timeout the matrix kills its process group, the server under the sanitizer included. Killing
    only the sanitizer left part227's servers running, their host memory growing, into the next point.
    Here each step sleeps 30 s, so the ladder times out and SIGTERM cannot stop the server in time."""
    pidfile, out = tmp_path / "server.pid", tmp_path / "stuck"
    env = fake_sanitizer_env(tmp_path, FAKE_PIDFILE=str(pidfile), MINILLM_TEST_STEP_DELAY="30")
    cmd = matrix_cmd(tiny, out, "racecheck")
    cmd[cmd.index("--ladder-timeout") + 1] = "10"  # time for the bench client to start and send, on a busy machine
    t0 = time.monotonic()
    r = subprocess.run(cmd + ["--stop-timeout", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert time.monotonic() - t0 < 120, "the matrix waited for the stuck step"
    point = json.loads((out / "matrix.json").read_text())[0]
    assert point["server_killed"] is True
    assert "was killed" in r.stdout and r.returncode == 1, r.stdout + r.stderr
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return  # the server is gone
    status = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}").exists() else ""
    assert "zombie" in status, f"the server {pid} outlived the matrix"


def test_a_server_past_the_memory_limit_is_killed(tiny, tmp_path):
    """--host-memory-limit-gb: a server group holding more host memory is killed at once (racecheck's
    memory grew to the OOM killer, whose SIGKILL left no message: session 38) and the point fails,
    saying why. A limit below what any Python server holds makes the fault real."""
    out = tmp_path / "limit"
    env = fake_sanitizer_env(tmp_path)
    r = subprocess.run(matrix_cmd(tiny, out, "racecheck") + ["--host-memory-limit-gb", "0.02"], capture_output=True,
                       text=True, env=env, timeout=300)
    point = json.loads((out / "matrix.json").read_text())[0]
    # >=: the watch kills once the group is past the limit, but the recorded peak is rounded, so a
    # group caught just past 0.02 GiB may read back as 0.02 (CI at stop 53 saw that).
    assert point["memory_limit_killed"] is True and point["peak_rss_gb"] >= 0.02
    assert "killed at the host memory limit (0.02 GB" in r.stdout and r.returncode == 1, r.stdout + r.stderr


def test_memory_watch_sees_a_group_and_spares_it_under_the_limit():
    """MemoryWatch sums the group's resident memory (a child that holds 200 MB is counted) and leaves
    a group under the limit alone."""
    mod = load_script()
    child = subprocess.Popen([sys.executable, "-c", "import time; b = b'x' * (200 << 20); time.sleep(3)"],
                             start_new_session=True)
    try:
        time.sleep(1.0)
        watch = mod.MemoryWatch(child.pid, limit_gb=64)
        time.sleep(0.6)
        watch.stop()
        assert not watch.killed and child.poll() is None
        assert 0.19 < watch.peak_gb < 1.0
    finally:
        child.kill()
        child.wait()
