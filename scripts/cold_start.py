"""How long a first start takes on a GPU: `python -m minillm.serve` with an empty CuPy kernel cache, then again
with the cache it filled (a warm start), seconds until /health answers.

    python scripts/cold_start.py MODEL [TREE ...] [--port 8011] [--timeout 300] [--json OUT]

Each TREE (a checkout's root: this one by default, or a `git archive` of an older commit) starts the server
with PYTHONPATH pointing at it and CUPY_CACHE_DIR at a fresh directory of its own, so nothing compiled by
another tree or an earlier run is read back. The server's log goes to <cache dir>/serve.log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def time_start(tree: Path, model: str, port: int, cache: Path, timeout: float, extra: list[str]) -> float | None:
    """Seconds from launching the server to its first healthy /health (None: it exited or timed out)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
           "CUPY_CACHE_DIR": str(cache)}
    with open(cache / "serve.log", "a") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "minillm.serve", "--model", model, "--device", "cuda",
                                 "--port", str(port), *extra], cwd=tree, env=env, stdout=log, stderr=log)
        took = None
        try:
            while proc.poll() is None and time.perf_counter() - t0 < timeout:
                if healthy(port):
                    took = time.perf_counter() - t0
                    break
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one start")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--serve-arg", action="append", default=[], help="one more argument for the server")
    ns = p.parse_args()
    results = []
    for tree in ns.trees:
        cache = Path(tempfile.mkdtemp(prefix="minillm_cold_"))
        row = {"tree": str(tree), "cache_dir": str(cache)}
        for kind in ("cold", "warm"):
            row[kind + "_s"] = time_start(tree.resolve(), ns.model, ns.port, cache, ns.timeout, ns.serve_arg)
            shown = "no /health" if row[kind + "_s"] is None else f"{row[kind + '_s']:.1f} s"
            print(f"{tree}: {kind} start {shown} (log {cache / 'serve.log'})", flush=True)
        results.append(row)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["cold_s"] is not None and r["warm_s"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
