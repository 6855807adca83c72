"""Benchmark statistics and reporting: per-request timings -> per-rung figures -> table, JSON, PNG.

Definitions follow `vllm bench serve`:
  TTFT  time from sending the request to the first streamed output chunk
  TPOT  per request, (latency - TTFT) / (output tokens - 1): the decode time per token after the first
  ITL   gaps between consecutive output chunks, pooled over all requests of the rung
Throughputs count successful requests only and divide by the rung's wall time. A rung with any
failed request is VOID: its figures describe a server that dropped work, so they are not comparable.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class RequestResult:
    """What one streamed request did; times in seconds from perf_counter."""

    ok: bool
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float | None = None  # None when no output chunk arrived
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile with linear interpolation (numpy's default, as vLLM reports); None if empty."""
    return float(np.percentile(values, p)) if len(values) else None


def mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def tpot(r: RequestResult) -> float | None:
    """Time per output token after the first; None with fewer than two tokens (nothing to divide)."""
    if r.ttft is None or r.output_tokens < 2:
        return None
    return (r.latency - r.ttft) / (r.output_tokens - 1)


def itl_from_timestamps(start: float, chunk_times: list[float]) -> tuple[float | None, list[float]]:
    """(TTFT, inter-chunk gaps) from the request's start and the arrival times of its output chunks."""
    if not chunk_times:
        return None, []
    return chunk_times[0] - start, [b - a for a, b in zip(chunk_times, chunk_times[1:])]


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vllm bench serve's --goodput keys (values in ms)


def meets_slos(r: RequestResult, slos_ms: dict[str, float]) -> bool:
    """Whether a finished request met every service-level objective (ms): time to first token,
    time per output token (a one-token output has none to miss), end-to-end latency."""
    got = {"ttft": r.ttft, "tpot": tpot(r) or 0.0, "e2el": r.latency}
    return all(got[k] is not None and 1e3 * got[k] <= v for k, v in slos_ms.items())


def rung_stats(results: list[RequestResult], duration: float, concurrency: int,
               slos_ms: dict[str, float] | None = None) -> dict:
    """One rung's figures (times in ms). `void` is True when any request failed. With slos_ms
    (vllm bench serve's --goodput), `goodput_requests_s`: the requests a second that met them all."""
    ok = [r for r in results if r.ok]
    failed = len(results) - len(ok)
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.prompt_len for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    itls = [g for r in ok for g in r.itl]
    errors = list(dict.fromkeys(r.error for r in results if not r.ok))[:5]  # distinct, in order
    goodput = {}
    if slos_ms:
        good = sum(meets_slos(r, slos_ms) for r in ok)
        goodput = {"goodput_ok": good, "goodput_requests_s": good / duration if duration > 0 else 0.0}
    return {
        "concurrency": concurrency, "num_prompts": len(results), "ok": len(ok), "failed": failed,
        "void": failed > 0, "duration_s": duration,
        "input_tokens": in_tok, "output_tokens": out_tok,
        "output_tok_s": out_tok / duration if duration > 0 else 0.0,
        "total_tok_s": (in_tok + out_tok) / duration if duration > 0 else 0.0,
        "requests_s": len(ok) / duration if duration > 0 else 0.0,
        "ttft_ms_mean": _ms(mean(ttfts)), "ttft_ms_p50": _ms(percentile(ttfts, 50)),
        "ttft_ms_p99": _ms(percentile(ttfts, 99)),
        "tpot_ms_mean": _ms(mean(tpots)), "tpot_ms_p50": _ms(percentile(tpots, 50)),
        "tpot_ms_p99": _ms(percentile(tpots, 99)),
        "itl_ms_mean": _ms(mean(itls)), "itl_ms_p99": _ms(percentile(itls, 99)),
        **goodput,
        "errors": errors,
    }


def ladder_continues(rung: dict, keep_going: bool) -> bool:
    """A VOID rung ends the ladder: higher concurrency on a failing server only hides the cause."""
    return keep_going or not rung["void"]


# ---- output -------------------------------------------------------------------------------------
_COLUMNS = [  # (header, key, format)
    ("c", "concurrency", "d"), ("n", "num_prompts", "d"), ("ok", "ok", "d"), ("failed", "failed", "d"),
    ("out tok/s", "output_tok_s", ".1f"), ("total tok/s", "total_tok_s", ".1f"),
    ("req/s", "requests_s", ".2f"),
    ("TTFT mean", "ttft_ms_mean", ".1f"), ("TTFT p50", "ttft_ms_p50", ".1f"),
    ("TTFT p99", "ttft_ms_p99", ".1f"),
    ("TPOT mean", "tpot_ms_mean", ".2f"), ("TPOT p50", "tpot_ms_p50", ".2f"),
    ("TPOT p99", "tpot_ms_p99", ".2f"),
    ("ITL mean", "itl_ms_mean", ".2f"), ("ITL p99", "itl_ms_p99", ".2f"),
]


def format_table(rungs: list[dict]) -> str:
    """A fixed-width table, one line per rung; times in ms; VOID rungs are marked. A rate column
    (requests/s, inf for all at once) when any rung had a --request-rate."""
    columns = list(_COLUMNS)
    if any(r.get("request_rate") is not None for r in rungs):
        columns.insert(1, ("rate", "request_rate", "g"))
    if any("goodput_requests_s" in r for r in rungs):
        columns.insert(columns.index(("req/s", "requests_s", ".2f")) + 1, ("goodput", "goodput_requests_s", ".2f"))
    head = [h for h, _, _ in columns] + ["status"]
    rows = [head]
    for r in rungs:
        cells = [("inf" if k == "request_rate" else "-") if r.get(k) is None else format(r[k], f)
                 for _, k, f in columns]
        rows.append(cells + ["VOID" if r["void"] else "ok"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n(times in ms)"


def write_json(path: str | Path, obj: dict | list) -> None:
    # NaN is not JSON; the statistics use None for "no data" instead
    Path(path).write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def need(ok: bool, message: str) -> None:
    """A flag check: each command's main prints the ValueError as one "error:" line and exits 2."""
    if not ok:
        raise ValueError(message)


def add_sampling_flags(p, temperature: float, what: str) -> None:
    """--temperature / --top-p / --top-k for `what` (every request's, or the one stream's)."""
    p.add_argument("--temperature", type=float, default=temperature, help=f"{what} temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help=f"{what} top_p (1: off)")
    p.add_argument("--top-k", type=int, default=-1, help=f"{what} top_k (-1 or 0: off; Qwen3's "
                   "generation_config: --temperature 0.6 --top-p 0.95 --top-k 20)")


def check_sampling_flags(ns) -> None:
    """add_sampling_flags' values, refused before the model loads (SamplingParams refused them only
    after it had, without naming the flag)."""
    need(math.isfinite(ns.temperature) and ns.temperature >= 0,
         f"--temperature must be a finite number >= 0, got {ns.temperature}")
    need(math.isfinite(ns.top_p) and 0 < ns.top_p <= 1, f"--top-p must be in (0, 1], got {ns.top_p}")
    need(-1 <= ns.top_k < 2**31, f"--top-k must be -1, 0 (off) or a positive integer below 2**31, got {ns.top_k}")


def context_error(error: Exception, lengths: str, max_model_len: int, spare: int) -> str:
    """A startup error's message where the command derived --max-model-len from its length flags
    (`lengths`, e.g. "--input-len 4000 + --output-len 90") plus `spare` positions: the engine's
    "--max-model-len N exceeds the model's context" named a flag the user never gave."""
    found = re.search(r"exceeds the model's context \(max_position_embeddings (\d+)\)", str(error))
    if found is None:
        return str(error)
    context = int(found.group(1))
    return (f"{lengths} (+ {spare} spare) = {max_model_len} positions exceed the model's context ({context} "
            f"positions); give lengths that sum to at most {context - spare}")


def derived_flags_note(error: str, sets: dict[str, str]) -> str:
    """`error` with a note naming where a command's own flags set the engine flags it mentions
    (`sets`: engine flag -> what set it): spec-cost's "lower --max-num-seqs" meant its --concurrency."""
    named = [f"{flag} is {why}" for flag, why in sets.items() if flag in error]
    return error if not named else f"{error} (here {'; '.join(named)})"


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (a link to it, or a file not written yet at the same place)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return Path(a).resolve() == Path(b).resolve()


def need_cuda(torch, device: str) -> None:
    """--device cuda on a machine where torch sees no GPU failed at the first .to("cuda") with an
    AssertionError traceback ("Torch not compiled with CUDA enabled")."""
    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "it sees no CUDA GPU"
        raise ValueError(f"--device cuda: torch {torch.__version__} cannot use a GPU ({why}); "
                         "use --device cpu, or run where torch.cuda.is_available() is True")


def check_output_path(path: str | Path | None, flag: str) -> None:
    """Refuse an output file that cannot be written before the benchmark runs (ValueError naming
    the flag): finding out at the end would throw the run's results away."""
    if path is None:
        return
    p = Path(path)
    folder = p.parent
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a directory")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{flag} {path} is not writable")


def check_plot_path(path: str | Path | None, flag: str = "--plot") -> None:
    """Refuse a plot whose extension matplotlib cannot write before the run (it raised ValueError in
    savefig, after the measuring), and one with no extension (savefig appended .png, so the file
    named as written was not there). Without matplotlib the plot is skipped with a note instead."""
    if path is None:
        return
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return
    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in kinds:
        raise ValueError(f"{flag} {path}: " + (f"matplotlib cannot write .{suffix} images" if suffix else
                                               "no extension to name the image type") +
                         f"; end it in .png (or .{', .'.join(sorted(k for k in kinds if k != 'png'))})")


def save_json(path: str | Path, obj: dict | list, flag: str = "--result-json") -> bool:
    """write_json at the end of a run; if it fails anyway (the disk filled, the directory went away
    since check_output_path), print the error and the result on stdout so that it is not lost.
    True when written."""
    try:
        write_json(path, obj)
    except OSError as e:
        print(f"error: cannot write {flag} {path}: {e}; the result follows", file=sys.stderr)
        print(json.dumps(obj, indent=2))
        return False
    return True


def plot_ladder(rungs: list[dict], path: str | Path, title: str = "") -> bool:
    """Output throughput and TPOT against concurrency, as a PNG. False (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on servers
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping the plot {path} (pip install matplotlib)",
              file=sys.stderr)
        return False
    good = [r for r in rungs if not r["void"]]
    void = [r for r in rungs if r["void"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    c = [r["concurrency"] for r in good]
    ax1.plot(c, [r["output_tok_s"] for r in good], "o-", label="output tok/s")
    if void:
        ax1.plot([r["concurrency"] for r in void], [r["output_tok_s"] for r in void], "rx", ms=10,
                 label="VOID rung")
    ax1.set(xlabel="concurrency", ylabel="output tokens / s", title="output throughput")
    for key, label in (("tpot_ms_mean", "TPOT mean"), ("tpot_ms_p99", "TPOT p99")):
        pts = [(r["concurrency"], r[key]) for r in good if r[key] is not None]
        if pts:
            ax2.plot(*zip(*pts), "o-", label=label)
    ax2.set(xlabel="concurrency", ylabel="ms", title="time per output token")
    for ax in (ax1, ax2):
        if len({r["concurrency"] for r in rungs}) > 1 and min(r["concurrency"] for r in rungs) > 0:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
