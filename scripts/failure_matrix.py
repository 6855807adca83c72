"""The field report's failure matrix, served by `minillm.serve` and driven by `minillm.bench serve`.

For each --max-model-len it starts a real server with the report's flags (--max-num-seqs 16
--num-blocks 3744 --no-enable-prefix-caching, DFlash speculation k = 8 when --drafter is given),
runs the concurrency ladder (1024 prompt / 512 output tokens by default, eos ignored), records
every rung, and stops the server with SIGTERM. With --sanitize the server runs (eagerly) under
`compute-sanitizer --tool memcheck` (--sanitize-tools memcheck,racecheck,initcheck,synccheck runs
the point once under each) and each sanitizer's summary is kept; --sanitizer-args passes more flags
(racecheck and synccheck instrument cuBLAS's kernels too, and a step under them can take minutes).

The exit status is 1 when any rung has a failed request, any point could not run, or any
sanitizer reported an error or a hazard (or wrote no summary), else 0.

    python scripts/failure_matrix.py MODEL [--drafter DIR] --out DIR [--max-model-len 2048,4096,...]
    python scripts/failure_matrix.py MODEL --drafter DIR --out DIR --max-model-len 4096 --concurrency 8 \
        --num-prompts 8 --output-len 16 --sanitize-tools memcheck,racecheck,initcheck,synccheck
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """Direct child processes of pid, read from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the process group pgid, from /proc."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp, ..., rss is the 22nd field
            total += int(fields[21]) * page
    return total


def host_memory_total_gb() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("/proc/meminfo has no MemTotal")


class MemoryWatch:
    """Polls a process group's resident memory from a thread; past limit_gb it kills the group (a
    sanitizer's host memory growing toward the OOM killer, whose SIGKILL leaves no message: session 38).
    peak_gb and killed say what it saw."""

    def __init__(self, pgid: int, limit_gb: float, every_s: float = 0.25):
        self.pgid, self.limit, self.every = pgid, limit_gb * 2**30, every_s
        self.peak, self.killed = 0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, group_rss_bytes(self.pgid))
            if self.peak > self.limit:
                self.killed = True
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_gb(self) -> float:
        # Three decimals: a group killed just past a small limit must not read back as the limit.
        return round(self.peak / 2**30, 3)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready after {timeout:.0f} s")


def sanitizer_clean(text: str) -> tuple[bool, list[str]]:
    """(clean, summary lines) of a compute-sanitizer log: memcheck, initcheck and synccheck end with
    'ERROR SUMMARY: N errors', racecheck with 'RACECHECK SUMMARY: N hazards displayed (E errors,
    W warnings)'. No summary at all (the sanitizer did not finish) is not clean."""
    lines = [ln.strip() for ln in text.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
    clean = bool(lines)
    for ln in lines:
        numbers = [int(w) for w in ln.replace("(", " ").replace(",", " ").split() if w.isdigit()]
        clean = clean and bool(numbers) and not any(numbers)
    return clean, lines


def point_ok(point: dict) -> bool:
    """Every rung ran and every request succeeded, the server lived through the ladder, and the
    sanitizer (if any) is clean."""
    rungs = point.get("ladder", {}).get("rungs", [])
    ok = bool(rungs) and "error" not in point and all(r.get("failed", 1) == 0 and r.get("ok") == r.get("num_prompts")
                                                      for r in rungs)
    return (ok and point.get("server_alive_after_ladder", True) and point.get("sanitizer_clean", True)
            and not point.get("memory_limit_killed"))


def server_env(tool: str | None) -> dict[str, str]:
    """The server's environment. Under initcheck the CUDA backend zeroes each cuBLAS output before
    the GEMM and the cuBLAS workspace at startup (MINILLM_INITCHECK=1): initcheck does not see
    cuBLAS's own writes, and reported every read of them (session 7, scripts/initcheck_probe.py)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tool == "initcheck":
        env["MINILLM_INITCHECK"] = "1"
    return env


def run_point(args, mml: int, out: Path, tool: str | None = None) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "minillm.serve", args.model, "--port", str(port), "--device", args.device,
           "--max-num-seqs", "16", "--num-blocks", str(args.num_blocks), "--no-enable-prefix-caching",
           "--max-model-len", str(mml)]
    cmd += args.server_args.split()
    if args.drafter:
        cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": args.drafter,
                                                    "num_speculative_tokens": args.k})]
    tag = f"{tool}-{mml}" if tool else str(mml)
    sanitizer_log = out / ("sanitizer-" + (f"{mml}" if tool == "memcheck" else tag) + ".log")
    if tool:
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "3",
               "--log-file", str(sanitizer_log)] + args.sanitizer_args.split() + cmd + ["--enforce-eager"]
    log = open(out / f"server-{tag}.log", "w")
    t0 = time.time()
    # its own process group, so a stop that has to kill takes the server under the sanitizer with it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(tool), start_new_session=True)
    watch = MemoryWatch(proc.pid, args.host_memory_limit_gb)
    point = {"max_model_len": mml, "cmd": " ".join(cmd), **({"sanitizer": tool} if tool else {})}
    try:
        wait_ready(url, proc, args.startup_timeout)
        point["startup_s"] = time.time() - t0
        bench = [sys.executable, "-m", "minillm.bench", "serve", "--base-url", url, "--backend", "openai-chat",
                 "--tokenizer", args.model, "--input-len", str(args.input_len), "--output-len", str(args.output_len),
                 "--concurrency", args.concurrency, "--num-prompts", args.num_prompts, "--ignore-eos",
                 "--warmup", "0", "--timeout", str(args.request_timeout),
                 "--result-json", str(out / f"ladder-{tag}.json")]
        r = subprocess.run(bench, capture_output=True, text=True, timeout=args.ladder_timeout)
        (out / f"bench-{tag}.log").write_text(r.stdout + r.stderr)
        point["bench_rc"] = r.returncode
        if (out / f"ladder-{tag}.json").exists():
            point["ladder"] = json.loads((out / f"ladder-{tag}.json").read_text())
    except Exception as e:  # a point that cannot run is recorded, and the matrix goes on
        point["error"] = f"{type(e).__name__}: {e}"
    finally:
        watch.stop()
        point["peak_rss_gb"] = watch.peak_gb
        if watch.killed:
            point["memory_limit_killed"] = True
        # a server that died under the load (a sanitizer's kill, the OOM killer) is gone before we stop it
        point["server_alive_after_ladder"] = bool(children(proc.pid)) if tool else proc.poll() is None
        if proc.poll() is None:
            # under compute-sanitizer, stop the server itself so the sanitizer exits normally and
            # writes its ERROR SUMMARY (signalling the sanitizer would cut the summary)
            for pid in (children(proc.pid) if tool else []) or [proc.pid]:
                os.kill(pid, signal.SIGTERM)
            try:
                proc.wait(timeout=args.stop_timeout)
            except subprocess.TimeoutExpired:  # e.g. a step stuck under racecheck: SIGTERM is not enough
                point["server_killed"] = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        try:  # whatever is left of the group (killing only the sanitizer once left the server running,
            os.killpg(proc.pid, signal.SIGKILL)  # its host memory growing until the OOM killer came: part227)
        except ProcessLookupError:
            pass
        point["server_rc"] = proc.returncode
        log.close()
    if tool:
        text = sanitizer_log.read_text(errors="replace") if sanitizer_log.exists() else ""
        point["sanitizer_clean"], point["sanitizer_summary"] = sanitizer_clean(text)
    return point


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--drafter", default=None, help="DFlash drafter directory (speculation on)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-blocks", type=int, default=3744)
    p.add_argument("--max-model-len", default="2048,4096,8192,16384,32768")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--num-prompts", default="2,4,8,16,32")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--sanitize", action="store_true", help="the server under compute-sanitizer memcheck")
    p.add_argument("--sanitize-tools", default=None,
                   help="comma-separated compute-sanitizer tools, each a run of every point (implies --sanitize)")
    p.add_argument("--sanitizer-args", default="",
                   help="more compute-sanitizer flags, e.g. --kernel-name-exclude kns=nvjet (cuBLAS's kernels, "
                        "which are not ours to check, run uninstrumented and much faster)")
    p.add_argument("--server-args", default="", help="more flags for minillm.serve, e.g. --no-async-scheduling")
    p.add_argument("--startup-timeout", type=float, default=300)
    p.add_argument("--request-timeout", type=float, default=600)
    p.add_argument("--ladder-timeout", type=float, default=1200)
    p.add_argument("--host-memory-limit-gb", type=float, default=None,
                   help="kill the server's process group when it holds more host memory (default: 85%% of the "
                        "host's; racecheck holds GBs a second until its process exits)")
    p.add_argument("--stop-timeout", type=float, default=60,
                   help="seconds the server has to stop after SIGTERM before it (and the sanitizer) is killed")
    args = p.parse_args(argv)
    if args.host_memory_limit_gb is None:
        args.host_memory_limit_gb = 0.85 * host_memory_total_gb()
    if args.host_memory_limit_gb <= 0:
        p.error(f"--host-memory-limit-gb must be positive, got {args.host_memory_limit_gb:g}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tools = args.sanitize_tools.split(",") if args.sanitize_tools else ["memcheck"] if args.sanitize else [None]
    bad = [t for t in tools if t not in (None, "memcheck", "racecheck", "initcheck", "synccheck")]
    if bad:
        p.error(f"--sanitize-tools: unknown tool(s) {bad}; use memcheck, racecheck, initcheck, synccheck")
    points = []
    for tool in tools:
        for mml in [int(x) for x in args.max_model_len.split(",")]:
            point = run_point(args, mml, out, tool)
            points.append(point)
            rungs = point.get("ladder", {}).get("rungs", [])
            summary = "; ".join(f"c={r.get('concurrency')} {r.get('ok')}/{r.get('num_prompts')}" for r in rungs)
            line = f"max_model_len {mml}: {summary or point.get('error', 'no result')}"
            if tool:
                line += f"; {tool}: {' / '.join(point['sanitizer_summary']) or 'no summary'}"
            if not point.get("server_alive_after_ladder", True):
                line += "; the server died during the ladder (see its log)"
            if point.get("memory_limit_killed"):
                line += (f"; the server was killed at the host memory limit ({args.host_memory_limit_gb:g} GB, "
                         "--host-memory-limit-gb)")
            if point.get("server_killed"):
                line += f"; the server did not stop within {args.stop_timeout:g} s of SIGTERM and was killed"
            print(line, flush=True)
            (out / "matrix.json").write_text(json.dumps(points, indent=2))
    failed = [pt["max_model_len"] for pt in points if not point_ok(pt)]
    if failed:
        print(f"FAILED: points at max_model_len {failed} (failed requests, no result, sanitizer reports or "
              "the memory limit)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
