"""A serving load under compute-sanitizer in pieces: each scenario in its own offline process.

compute-sanitizer's racecheck holds host memory for every checked launch of a kernel that uses
shared memory (~2-7 GB a second on the H200's host) and gives it back only when the process exits
(session 39, docs/gpu-test-report.md), so one serving process under it reaches any host's limit
within a minute. This runs each piece of the load (`python -m minillm.generate` with that piece's
flags) in its own process under each tool asked for, watches the process group's resident memory,
kills a piece that passes --host-memory-limit-gb, and records each piece's summary.

Pieces: batch8 (eight short prompts batched), long (a ~3,000-token prompt in 1,024-token chunks),
dflash (two prompts with DFlash speculation, needs --drafter), batch8_dflash (eight with DFlash),
long_dflash (the long prompt with DFlash: verification over a split context).
The exit status is 1 unless every piece finished with a clean summary (no error, no hazard), 2 on
bad arguments.

    python scripts/sanitize_pieces.py MODEL --drafter DIR --out DIR [--no-cublas] \\
        [--tool memcheck,racecheck,initcheck,synccheck] [--pieces batch8,long,dflash] \\
        [--sanitizer-args "--show-backtrace no"]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failure_matrix import MemoryWatch, host_memory_total_gb, sanitizer_clean, server_env  # noqa: E402 - a sibling script

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
SHORT = "the quick brown fox jumps over the lazy dog " * 6  # ~60 tokens
LONG = "the quick brown fox jumps over the lazy dog " * 150  # ~3,000 tokens (Qwen3's and the random presets')


def piece_args(name: str, drafter: str | None, k: int, max_rows: int | None = None) -> list[str]:
    """minillm.generate's flags for one piece (after the model and the common flags). max_rows: the
    most token rows a step may hold (--no-cublas: the project's products take at most 256 rows;
    past that, cuBLAS would)."""
    spec = (["--speculative-config", json.dumps({"method": "dflash", "model": drafter, "num_speculative_tokens": k})]
            if drafter else [])
    eight = [a for i in range(8) for a in ("--prompt", f"{i}: {SHORT}")]

    def budget(n: int) -> list[str]:
        return ["--max-num-batched-tokens", str(min(n, max_rows or n))]

    pieces = {
        "batch8": ["--max-num-seqs", "8", *budget(512), *eight, "--max-tokens", "4"],
        "long": ["--max-num-seqs", "1", *budget(1024), "--prompt", LONG, "--max-tokens", "4"],
        # five tokens, two or more rounds a sequence: with 16 the piece passed 110 GB of host memory
        # under racecheck before it finished (part235)
        "dflash": [*spec, "--max-num-seqs", "2", *budget(256), "--prompt", SHORT,
                   "--prompt", "2: " + SHORT, "--max-tokens", "5"],
        "batch8_dflash": [*spec, "--max-num-seqs", "8", *budget(512), *eight, "--max-tokens", "5"],
        "long_dflash": [*spec, "--max-num-seqs", "1", *budget(1024), "--prompt", LONG, "--max-tokens", "4"],
    }
    return pieces[name]


OWN_GEMM_MAX_ROWS = 256  # MINILLM_GEMM=own: cuda/gemv.cu and cuda/gemm.cu take products of up to this many rows


PIECES = ("batch8", "long", "dflash", "batch8_dflash", "long_dflash")


def run_piece(name: str, cmd: list[str], env: dict, out: Path, limit_gb: float, timeout: float) -> dict:
    """Run cmd (the sanitizer and generate) in its own process group; kill the group at the memory
    limit or the timeout. The piece's record: outcome, return code, peak memory, summary."""
    log_path = out / f"{name}.log"
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        watch = MemoryWatch(proc.pid, limit_gb)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        watch.stop()
        try:  # the whole group: at the timeout, and whatever a finished piece left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    outcome = (f"killed at the host memory limit ({limit_gb:g} GB)" if watch.killed
               else f"killed at the timeout ({timeout:g} s)" if timed_out else None)
    text = log_path.read_text(errors="replace")
    finished = proc.returncode == 0 and '"finish_reason"' in text
    return {"piece": name, "cmd": " ".join(cmd), "rc": proc.returncode, "wall_s": round(time.time() - t0, 1),
            "peak_rss_gb": watch.peak_gb, "finished": finished,
            "outcome": outcome or ("finished" if finished else f"failed (exit {proc.returncode}; see {log_path})")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--drafter", default=None, help="DFlash drafter directory (the dflash pieces need it)")
    p.add_argument("--k", type=int, default=8, help="speculative tokens a round (default 8)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tool", default="racecheck",
                   help=f"compute-sanitizer tool(s), comma-separated, of {', '.join(TOOLS)}: every piece runs under "
                        "each (default racecheck)")
    p.add_argument("--pieces", default=None, help=f"comma-separated, of {', '.join(PIECES)} (default: all that "
                                                  "apply: the dflash ones with --drafter)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--sanitizer-args", default="", help='more compute-sanitizer flags, e.g. "--show-backtrace no"')
    p.add_argument("--no-cublas", action="store_true",
                   help=f"MINILLM_GEMM=own and steps of at most {OWN_GEMM_MAX_ROWS} tokens: no cuBLAS kernel in "
                        "the process (racecheck stops at any uninstrumented kernel: with --kernel-name it stops on the "
                        "project's own kernels too, session 43's part256b)")
    p.add_argument("--host-memory-limit-gb", type=float, default=None,
                   help="kill a piece whose processes hold more (default: 85%% of the host's memory)")
    p.add_argument("--timeout", type=float, default=600, help="seconds a piece may run (default 600)")
    p.add_argument("--no-compile-first", action="store_true",
                   help="on cuda the first piece runs once without the sanitizer so the kernels compile outside "
                        "it (under it a fresh machine's compile takes over a minute); this skips that")
    args = p.parse_args(argv)
    tools = args.tool.split(",")
    if not tools or any(t not in TOOLS for t in tools):
        p.error(f"--tool: {args.tool!r}; give one or more of {', '.join(TOOLS)}, comma-separated")
    names = args.pieces.split(",") if args.pieces else [n for n in PIECES if args.drafter or "dflash" not in n]
    bad = [n for n in names if n not in PIECES]
    if bad:
        p.error(f"--pieces: unknown piece(s) {bad}; choose from {', '.join(PIECES)}")
    if not args.drafter and any("dflash" in n for n in names):
        p.error("the dflash pieces need --drafter DIR (a DFlash checkpoint for MODEL)")
    if args.k < 1:
        p.error(f"--k must be at least 1, got {args.k}")
    limit = args.host_memory_limit_gb if args.host_memory_limit_gb is not None else 0.85 * host_memory_total_gb()
    if limit <= 0:
        p.error(f"--host-memory-limit-gb must be positive, got {limit:g}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [sys.executable, "-m", "minillm.generate", args.model, "--device", args.device, "--max-model-len",
              str(args.max_model_len), "--enforce-eager", "--no-enable-prefix-caching", "--ignore-eos", "--json"]
    max_rows = OWN_GEMM_MAX_ROWS if args.no_cublas else None

    def tool_env(tool: str) -> dict:
        env = server_env(tool)  # initcheck: cuBLAS's outputs zeroed first (it cannot see cuBLAS's writes)
        if args.no_cublas:
            env["MINILLM_GEMM"] = "own"
        return env

    if args.device == "cuda" and not args.no_compile_first:
        first = common + piece_args(names[0], args.drafter, args.k, max_rows)
        r = subprocess.run(first, capture_output=True, text=True, env=tool_env(tools[0]), timeout=args.timeout)
        print(f"compiled (the first piece without the sanitizer): exit {r.returncode}", flush=True)
    records, ok = [], True
    for tool in tools:
        for name in names:
            tag = name if len(tools) == 1 else f"{tool}-{name}"
            san_log = out / f"sanitizer-{tag}.log"
            cmd = (["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", "--log-file", str(san_log)]
                   + args.sanitizer_args.split() + common + piece_args(name, args.drafter, args.k, max_rows))
            rec = {"tool": tool, **run_piece(tag, cmd, tool_env(tool), out, limit, args.timeout)}
            text = san_log.read_text(errors="replace") if san_log.exists() else ""
            rec["sanitizer_clean"], rec["sanitizer_summary"] = sanitizer_clean(text)
            rec["ok"] = rec["finished"] and rec["sanitizer_clean"]
            ok = ok and rec["ok"]
            records.append(rec)
            (out / "pieces.json").write_text(json.dumps(records, indent=2))
            print(f"{tag}: {rec['outcome']}, {rec['wall_s']} s, peak {rec['peak_rss_gb']} GB; {tool}: "
                  f"{' / '.join(rec['sanitizer_summary']) or 'no summary'}", flush=True)
    if not ok:
        print(f"FAILED: {[r['piece'] for r in records if not r['ok']]} (not finished, or the sanitizer reported)",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
