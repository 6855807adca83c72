"""`python -m minillm.bench serve`: a concurrency ladder against any OpenAI-compatible server.

    python -m minillm.bench serve --base-url http://127.0.0.1:8000 --input-len 1024 --output-len 128 \\
        --concurrency 1,2,4,8,16 --num-prompts 8,8,16,32,64 --ignore-eos --result-json r.json --plot r.png

Like `vllm bench serve` with `--dataset random` and `--max-concurrency`: each rung sends its prompts
(fresh ones per rung, so a prefix cache cannot serve one rung from another) with at most c in flight,
streams every response and times it. `--dataset custom --dataset-path FILE.jsonl` sends real prompts
instead (one {"prompt": text} a line, each rung in its own seeded order; with a file shorter than a
rung they repeat). With --request-rate the requests also arrive over time, as
`vllm bench serve --request-rate R --burstiness B` sends them (gamma-distributed gaps, mean 1 / R).
--backend picks the route: /v1/completions (openai), /v1/chat/completions (openai-chat) or
/v1/responses (openai-responses: its output deltas are the tokens, its usage the final response's).
A request fails on a non-200 status, an SSE error event (or response.failed), a choice finished
with finish_reason "abort" or "error", a broken or unterminated stream, a malformed chunk (its
number and field named: "chunk 3: choices[0].delta is null"), a usage chunk whose counts are not
counts, a timeout, or (with --ignore-eos) fewer tokens than max_tokens. A rung with any failure is
VOID and ends the ladder unless --keep-going; the exit status is then 1. Bad flags (and a
--result-json or --plot that cannot be written, or would overwrite --dataset-path or each other)
are refused before any request: one "error:" line, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from minillm.args import STARTUP_ERRORS, CliParser
from minillm.bench.dataset import BenchRequest, custom_prompts, custom_requests, load_tokenizer, random_requests
from minillm.bench.report import (
    GOODPUT_METRICS,
    RequestResult,
    check_output_path,
    check_plot_path,
    format_table,
    itl_from_timestamps,
    ladder_continues,
    need,
    plot_ladder,
    rung_stats,
    same_file,
    save_json,
)
from minillm.models.hf_loader import shown

ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions", "openai-responses": "/v1/responses"}
# the Responses API's stream: the events that carry output, and those that end it with the response
RESPONSES_DELTAS = ("response.output_text.delta", "response.reasoning_text.delta",
                    "response.function_call_arguments.delta")
RESPONSES_ENDS = ("response.completed", "response.incomplete")
# The slowest --request-rate taken: a mean gap of 1000 s between requests. Below it a rung would
# in effect never finish (1e-300 requests/s waits ~1e300 s for its second request).
MIN_REQUEST_RATE = 1e-3


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def rate_list(text: str) -> list[float]:
    """--request-rate: comma-separated requests per second (>= MIN_REQUEST_RATE), or inf (all at once)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates (requests/s) or inf, got {text!r}") from None
    if not values or not all(v >= MIN_REQUEST_RATE for v in values):  # nan fails every comparison
        raise argparse.ArgumentTypeError(f"expected rates >= {MIN_REQUEST_RATE:g} requests/s (or inf), got {text!r}")
    return values


def slo(text: str) -> tuple[str, float]:
    """--goodput's KEY:MS, e.g. ttft:200."""
    key, _, value = text.partition(":")
    if key not in GOODPUT_METRICS:
        raise argparse.ArgumentTypeError(f"expected KEY:MS with KEY one of {', '.join(GOODPUT_METRICS)}, got {text!r}")
    try:
        ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY:MS with MS a number of milliseconds, got {text!r}") from None
    if not (math.isfinite(ms) and ms > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of milliseconds > 0, got {text!r}")
    return key, ms


def arrival_offsets(n: int, rate: float, burstiness: float, seed) -> list[float]:
    """Seconds after the rung starts at which each of n requests is sent, as vllm bench serve draws
    them: gaps from a gamma distribution of shape `burstiness` and mean 1 / rate (burstiness 1: a
    Poisson process; smaller: burstier), the first request at 0; rate inf: all at 0."""
    if rate == float("inf") or n == 0:
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(prog="python -m minillm.bench serve",
                  description="Concurrency ladder against an OpenAI-compatible server.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="the server's root URL, without /v1 (--backend adds the route)")
    p.add_argument("--backend", choices=sorted(ENDPOINTS), default="openai",
                   help="openai: /v1/completions; openai-chat: /v1/chat/completions; openai-responses: "
                        "/v1/responses (each streamed)")
    p.add_argument("--model", default=None, help="model name to request (default: first id of /v1/models)")
    p.add_argument("--tokenizer", default=None,
                   help="model path/alias whose tokenizer builds the prompts (default: --model if it is "
                        "a path, else the embedded default)")
    p.add_argument("--dataset", "--dataset-name", choices=["random", "custom"], default="random",
                   help="random: prompts of random tokens, --input-len long; custom: the prompts of --dataset-path "
                        "(vLLM's names)")
    p.add_argument("--dataset-path", default=None,
                   help='with --dataset custom: a JSONL file, one {"prompt": text} object a line; each rung '
                        "draws its prompts from it in a seeded order (repeating them when it holds fewer)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [L*(1-r), L*(1+r)] (vLLM's --random-range-ratio)")
    p.add_argument("--concurrency", "--max-concurrency", type=int_list, default=[1, 2, 4, 8, 16],
                   help="comma-separated rungs (max requests in flight; --max-concurrency is vllm bench serve's name)")
    p.add_argument("--num-prompts", type=int_list, default=[8, 8, 16, 32, 64],
                   help="comma-separated, one per rung, or one for all rungs")
    p.add_argument("--request-rate", type=rate_list, default=[float("inf")],
                   help="requests per second arriving at each rung (one per rung, or one for all; inf: all "
                        f"at once; at least {MIN_REQUEST_RATE:g}), still at most --concurrency in flight; with "
                        "one --concurrency, a rung per rate")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the arrival gaps (1: Poisson; smaller is burstier)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (vLLM extension) and fail requests that stop short")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="dataset seed")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests before the ladder")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per request")
    p.add_argument("--keep-going", action="store_true", help="run every rung even after a VOID one")
    p.add_argument("--goodput", nargs="+", type=slo, default=None, metavar="KEY:MS",
                   help="service-level objectives, e.g. --goodput ttft:200 tpot:50 e2el:5000 (ms; keys "
                        f"{', '.join(GOODPUT_METRICS)}): each rung also reports the requests a second that met them "
                        "all (vllm bench serve's request goodput)")
    p.add_argument("--result-json", default=None)
    p.add_argument("--plot", default=None, help="PNG of output tok/s and TPOT vs concurrency")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Refuse the numeric flags the run cannot use before any request is sent: a nan temperature
    breaks the JSON body, a timeout <= 0 fails every request as if the server were at fault, and an
    infinite burstiness turns the arrival gaps into nan (every request sent at once under a finite
    --request-rate). A ValueError names the flag and what it takes."""
    # "" would quietly mean "ask the server for its model" (leave the flag out for that)
    need(args.model != "", "--model must be the served model's name; leave it out to ask the server for its first")
    # a URL without a scheme failed every request as a "broken stream"; one ending in /v1 (an OpenAI
    # client's base_url) asked for /v1/v1/completions and got a 404 per request
    need(args.base_url.lower().startswith(("http://", "https://")),
         f"--base-url must start with http:// or https://, got {args.base_url!r}")
    need(not args.base_url.rstrip("/").endswith("/v1"),
         f"--base-url {args.base_url} ends in /v1: give the server's root (e.g. http://127.0.0.1:8000); "
         f"--backend {args.backend} adds the route {ENDPOINTS[args.backend]}")
    keys = [k for k, _ in args.goodput or []]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    need(not twice, f"--goodput names {', '.join(twice)} more than once")
    need((args.dataset == "custom") == (args.dataset_path is not None),
         "--dataset custom needs --dataset-path FILE.jsonl" if args.dataset == "custom"
         else "--dataset-path is for --dataset custom")
    if args.dataset == "custom":  # read and checked before any request is sent
        args.custom_prompts = custom_prompts(args.dataset_path)
    need(args.input_len >= 1, f"--input-len must be >= 1, got {args.input_len}")
    need(args.output_len >= 1, f"--output-len must be >= 1, got {args.output_len}")
    need(0 <= args.range_ratio < 1, f"--range-ratio must be in [0, 1), got {args.range_ratio}")
    need(math.isfinite(args.timeout) and args.timeout > 0,
         f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    need(math.isfinite(args.temperature) and args.temperature >= 0,
         f"--temperature must be a finite number >= 0, got {args.temperature}")
    need(args.seed >= 0, f"--seed must be >= 0, got {args.seed}")  # numpy's generators take no negative seed
    need(args.warmup >= 0, f"--warmup must be >= 0, got {args.warmup}")
    need(math.isfinite(args.burstiness) and args.burstiness > 0,
         f"--burstiness must be a finite number > 0, got {args.burstiness}")
    check_output_path(args.result_json, "--result-json")
    check_output_path(args.plot, "--plot")
    check_plot_path(args.plot)
    # the result written over the dataset would destroy it; the plot written over the JSON, the result
    files = [(flag, path) for flag, path in (("--dataset-path", args.dataset_path), ("--result-json", args.result_json),
                                             ("--plot", args.plot)) if path]
    for i, (flag, path) in enumerate(files):
        for other, other_path in files[i + 1:]:
            need(not same_file(path, other_path),
                 f"{other} {other_path} is the file of {flag} {path}: writing it would overwrite that")
    if args.tokenizer is not None:  # read before any request, its errors named as the flag's (not a model's)
        from minillm.models.loader import DEFAULT_MODEL_ALIAS

        found = args.tokenizer != "" and Path(args.tokenizer).expanduser().exists()
        need(found or args.tokenizer == DEFAULT_MODEL_ALIAS,
             f"--tokenizer {args.tokenizer!r}: no such file or directory; give a model path (an HF directory with "
             f"tokenizer.json, or a .gguf file) or {DEFAULT_MODEL_ALIAS!r}")
        try:
            args.prompt_tokenizer = load_tokenizer(args.tokenizer)
        except STARTUP_ERRORS as e:
            raise ValueError(f"--tokenizer {args.tokenizer}: {e}") from None


# ---- one request --------------------------------------------------------------------------------
def request_payload(backend: str, model: str, req: BenchRequest, args: argparse.Namespace) -> dict:
    body = {"model": model, "temperature": args.temperature, "stream": True}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if backend == "openai-responses":  # its usage comes in the response that ends the stream
        return {**body, "input": req.prompt, "max_output_tokens": req.output_len}
    body.update(max_tokens=req.output_len, stream_options={"include_usage": True})
    if backend == "openai-chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


def _choice_has_output(backend: str, choice, name: str) -> bool:
    """Whether a streamed choice (`name`, e.g. "choices[0]") carries generated output (and so
    timestamps a token); ValueError naming the field when it is not shaped as the API says.

    A chat role-only delta ({"role": "assistant"}) may be sent before any token, and a closing chunk
    with only finish_reason (its delta empty or left out) comes after the last; neither counts. An
    empty completions text with no finish_reason does count: the server stepped, but held back an
    incomplete UTF-8 sequence.
    """
    if not isinstance(choice, dict):
        raise ValueError(f"{name} is {shown(choice)}, not an object")
    if backend == "openai-chat":
        delta = choice.get("delta", {})
        if not isinstance(delta, dict):
            raise ValueError(f"{name}.delta is {shown(delta)}, not an object")
        text, field = delta.get("content"), f"{name}.delta.content"
    else:
        text, field = choice.get("text"), f"{name}.text"
    if text is not None and not isinstance(text, str):  # a number would count as a token
        raise ValueError(f"{field} is {shown(text)}, not a string")
    if text:
        return True
    return text is not None and backend == "openai" and choice.get("finish_reason") is None


def chunk_has_output(backend: str, chunk) -> bool:
    """Whether a streamed chunk (parsed JSON) carries generated output; ValueError naming what is
    wrong with a malformed one, so the caller fails that request with it rather than with whatever
    the first bad lookup raised. Every choice is checked. A chunk with usage and no choices (the
    closing usage chunk of some servers) carries none."""
    if not isinstance(chunk, dict):
        raise ValueError(f"is {shown(chunk)}, not an object")
    if backend == "openai-responses":  # typed events: the output's deltas count, the rest do not
        if not isinstance(chunk.get("type"), str):
            raise ValueError(f"type is {shown(chunk.get('type'))}, not an event type")
        if chunk["type"] not in RESPONSES_DELTAS:
            return False
        if not isinstance(chunk.get("delta"), str):
            raise ValueError(f"{chunk['type']}'s delta is {shown(chunk.get('delta'))}, not a string")
        return bool(chunk["delta"])
    choices = chunk.get("choices")
    if choices is None and "usage" in chunk:
        return False
    if choices is None:
        raise ValueError("choices is missing" if "choices" not in chunk else "choices is null")
    if not isinstance(choices, list):
        raise ValueError(f"choices is {shown(choices)}, not a list")
    return any([_choice_has_output(backend, c, f"choices[{i}]") for i, c in enumerate(choices)])


def chunk_finishes(backend: str, chunk: dict) -> bool:
    """Whether a checked chunk (chunk_has_output passed it) ends a choice or the response: where the
    output's first token ended it (an EOS), this chunk is that token's arrival, as vLLM's bench
    times the first chunk with choices."""
    if backend == "openai-responses":
        return chunk["type"] in RESPONSES_ENDS
    return any(c.get("finish_reason") is not None for c in chunk.get("choices") or ())


# finish reasons of a choice the server gave up on (vLLM's FinishReason.ABORT and ERROR, minillm's
# "error"): without --ignore-eos such a request passed as a success with its partial output
FAILED_FINISHES = ("abort", "error")


def failed_finish(backend: str, chunk: dict) -> str | None:
    """The failed finish reason of a checked chunk's choices (chunk_has_output passed it), else None."""
    if backend == "openai-responses":  # its failures are response.failed events
        return None
    return next((c["finish_reason"] for c in chunk.get("choices") or () if c.get("finish_reason") in FAILED_FINISHES),
                None)


def usage_count(usage: object, key: str, default: int) -> int:
    """A token count from the stream's usage chunk, `default` without one (or without that key). A
    count that is not a non-negative integer (null, a string) raises ValueError: the caller fails
    that request only, instead of the statistics failing on it later and taking the run down."""
    if usage is None:
        return default
    if not isinstance(usage, dict):
        raise ValueError(f"usage is {usage!r}, not an object")
    value = usage.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"usage.{key} is {value!r}, not a token count")
    return value


async def send_request(client, url: str, backend: str, body: dict, prompt_len: int,
                       expect_tokens: int | None) -> RequestResult:
    """Stream one request; `expect_tokens` set means fewer output tokens than that is a failure."""
    start = time.perf_counter()
    chunk_times: list[float] = []
    usage: dict | None = None
    done = False
    n_chunks = 0
    finish_at: float | None = None  # when the first chunk carrying a finish reason came
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                return RequestResult(False, prompt_len, error=f"HTTP {resp.status_code}: {text[:300]}")
            event = "message"
            async for line in resp.aiter_lines():
                if not line:
                    event = "message"  # a blank line ends an SSE event
                    continue
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                n_chunks += 1
                try:
                    obj = json.loads(data)
                except json.JSONDecodeError as e:
                    return RequestResult(False, prompt_len, error=f"chunk {n_chunks}: not JSON ({e}): {data[:100]}")
                kind = obj.get("type") if isinstance(obj, dict) and backend == "openai-responses" else None
                if kind == "response.failed":
                    err = (obj.get("response") or {}).get("error") or obj
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    return RequestResult(False, prompt_len, error=f"response.failed: {msg}")
                if event == "error" or (isinstance(obj, dict) and "error" in obj and kind is None):
                    err = obj.get("error", obj) if isinstance(obj, dict) else obj
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    return RequestResult(False, prompt_len, error=f"SSE error event: {msg}")
                try:
                    has_output = chunk_has_output(backend, obj)
                except ValueError as e:
                    return RequestResult(False, prompt_len, error=f"chunk {n_chunks}: {e} (the chunk: {data[:100]})")
                gave_up = failed_finish(backend, obj)
                if gave_up:  # its text so far is not the answer asked for: not a success to time
                    return RequestResult(False, prompt_len, error=f"chunk {n_chunks}: finish_reason {gave_up!r}")
                if has_output:
                    chunk_times.append(time.perf_counter())
                elif finish_at is None and chunk_finishes(backend, obj):
                    finish_at = time.perf_counter()
                if kind in RESPONSES_ENDS:  # the whole response, its usage in the Responses API's names
                    use = (obj.get("response") or {}).get("usage")
                    usage = ({"prompt_tokens": use.get("input_tokens"), "completion_tokens": use.get("output_tokens")}
                             if isinstance(use, dict) else use)
                    done = True
                    break
                if obj.get("usage") and kind is None:
                    usage = obj["usage"]
    except Exception as e:  # a reset connection, a read timeout, bad JSON: the stream is broken
        return RequestResult(False, prompt_len, error=f"broken stream: {type(e).__name__}: {e}")
    end = time.perf_counter()
    if not done:
        return RequestResult(False, prompt_len, error="stream ended without " + (
            "response.completed" if backend == "openai-responses" else "data: [DONE]"))
    if not chunk_times and finish_at is not None:  # the first token ended it (EOS): no text, but a token
        chunk_times = [finish_at]
    ttft, itl = itl_from_timestamps(start, chunk_times)
    try:  # the usage chunk is exact; without it each output chunk is taken as one token
        n_out = usage_count(usage, "completion_tokens", len(chunk_times))
        n_in = usage_count(usage, "prompt_tokens", prompt_len)
    except ValueError as e:
        return RequestResult(False, prompt_len, error=f"bad usage chunk: {e}")
    result = RequestResult(True, n_in, n_out, ttft, end - start, itl)
    if expect_tokens is not None and n_out < expect_tokens:
        result.ok = False
        result.error = f"ignore_eos set but only {n_out} of {expect_tokens} tokens came back"
    return result


# ---- a rung -------------------------------------------------------------------------------------
class _Progress:
    """tqdm when it is installed, else one rewritten status line on stderr."""

    def __init__(self, total: int, desc: str):
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
        except ImportError:
            self.bar = None
        self.total, self.desc, self.n = total, desc, 0

    def update(self) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.update(1)
        else:
            print(f"\r{self.desc}: {self.n}/{self.total}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


async def run_rung(base_url: str, backend: str, model: str, requests: list[BenchRequest], concurrency: int,
                   args: argparse.Namespace, show_progress: bool = True,
                   offsets: list[float] | None = None) -> tuple[list[RequestResult], float]:
    """All requests with at most `concurrency` in flight, request i sent no earlier than offsets[i]
    seconds after the start (default: all at once); (results in request order, wall seconds)."""
    import httpx

    url = base_url.rstrip("/") + ENDPOINTS[backend]
    sem = asyncio.Semaphore(concurrency)
    progress = _Progress(len(requests), f"c={concurrency}") if show_progress else None
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)

    async def one(client, req: BenchRequest, offset: float) -> RequestResult:
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:
            body = request_payload(backend, model, req, args)
            expect = req.output_len if args.ignore_eos else None
            try:
                res = await asyncio.wait_for(send_request(client, url, backend, body, req.prompt_len, expect),
                                             args.timeout)
            except asyncio.TimeoutError:
                res = RequestResult(False, req.prompt_len, error=f"timed out after {args.timeout} s")
        if progress:
            progress.update()
        return res

    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(client, r, o) for r, o in zip(requests, offsets or [0.0] * len(requests))))
        duration = time.perf_counter() - start
    if progress:
        progress.close()
    return list(results), duration


# ---- the ladder ---------------------------------------------------------------------------------
def first_model_id(base_url: str, timeout: float) -> str:
    import httpx

    url = base_url.rstrip("/") + "/v1/models"
    try:
        r = httpx.get(url, timeout=timeout)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except Exception as e:
        raise RuntimeError(f"cannot list models at {url} ({type(e).__name__}: {e}); is the server up? "
                           "or pass --model") from None


def check_reachable(base_url: str, timeout: float) -> None:
    """With --model given nothing was asked of the server before the prompts were built: a huge
    --input-len spent minutes on them before the first request found no server. Any HTTP answer will do."""
    import httpx

    try:
        httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout)
    except httpx.TransportError as e:
        raise RuntimeError(f"cannot reach the server at {base_url} ({type(e).__name__}: {e}); is it up?") from None


def tokenizer_source(tokenizer: str | None, model: str) -> str | None:
    """--tokenizer, else the model name when minillm can load it (a path or the alias), else None."""
    from minillm.models.loader import DEFAULT_MODEL_ALIAS

    if tokenizer is not None:
        return tokenizer
    if model == DEFAULT_MODEL_ALIAS or Path(model).expanduser().exists():
        return model
    return None


def run_ladder(args: argparse.Namespace) -> dict:
    """Run every rung (stopping after a VOID one unless --keep-going); the JSON-ready result."""
    rungs_c = args.concurrency
    if len(rungs_c) == 1 and len(args.request_rate) > 1:  # one concurrency, a rung per rate
        rungs_c = rungs_c * len(args.request_rate)
    nums = args.num_prompts * len(rungs_c) if len(args.num_prompts) == 1 else args.num_prompts
    if len(nums) != len(rungs_c):
        raise ValueError(f"--num-prompts has {len(nums)} values for {len(rungs_c)} --concurrency rungs; "
                         "give one per rung or a single one")
    rates = args.request_rate * len(rungs_c) if len(args.request_rate) == 1 else args.request_rate
    if len(rates) != len(rungs_c):
        raise ValueError(f"--request-rate has {len(rates)} values for {len(rungs_c)} --concurrency rungs; "
                         "give one per rung or a single one")
    if args.model is not None:
        check_reachable(args.base_url, min(args.timeout, 30.0))
    model = args.model or first_model_id(args.base_url, min(args.timeout, 30.0))
    tok_src = tokenizer_source(args.tokenizer, model)
    if tok_src is None:
        print(f"note: model {model!r} is not a local path; building prompts with the embedded default "
              "tokenizer (pass --tokenizer for exact prompt lengths)", file=sys.stderr)
    tok = args.prompt_tokenizer if args.tokenizer is not None else load_tokenizer(tok_src)
    result = {
        "benchmark": "serve", "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "base_url": args.base_url,
        "backend": args.backend, "model": model, "tokenizer": tok_src or "(embedded default)",
        "dataset": ({"name": args.dataset, "input_len": args.input_len, "output_len": args.output_len,
                     "range_ratio": args.range_ratio, "seed": args.seed} if args.dataset == "random" else
                    {"name": "custom", "path": args.dataset_path, "prompts_in_file": len(args.custom_prompts),
                     "output_len": args.output_len, "seed": args.seed}),
        "ignore_eos": args.ignore_eos, "temperature": args.temperature, "burstiness": args.burstiness,
        "goodput_slos_ms": dict(args.goodput) if args.goodput else None,
        "rungs": [], "void": False,
    }
    def rung_requests(n: int, output_len: int, seed: list[int], range_ratio: float) -> list[BenchRequest]:
        if args.dataset == "custom":
            return custom_requests(tok, args.custom_prompts, n, output_len, seed)
        return random_requests(tok, n, args.input_len, output_len, range_ratio, seed)

    if args.dataset == "custom" and max(nums) > len(args.custom_prompts):
        print(f"note: {args.dataset_path} holds {len(args.custom_prompts)} prompts and a rung sends up to "
              f"{max(nums)}: prompts repeat within a rung (a prefix cache then serves the repeats)", file=sys.stderr)
    if args.warmup > 0:
        warm = rung_requests(args.warmup, min(args.output_len, 16), [args.seed, 1 << 20], 0.0)
        results, _ = asyncio.run(run_rung(args.base_url, args.backend, model, warm, 1, args, False))
        failed = [r for r in results if not r.ok]
        if failed:
            result["void"] = True
            result["warmup_error"] = failed[0].error
            print(f"warm-up request failed: {failed[0].error}", file=sys.stderr)
            return result
    try:  # Ctrl-C: the rung running is cancelled, the ones that finished are reported (anywhere in the loop)
        for i, (c, n, rate) in enumerate(zip(rungs_c, nums, rates)):
            requests = rung_requests(n, args.output_len, [args.seed, i], args.range_ratio)
            offsets = arrival_offsets(n, rate, args.burstiness, [args.seed, i, 1])
            results, duration = asyncio.run(run_rung(args.base_url, args.backend, model, requests, c, args,
                                                     offsets=offsets))
            rung = rung_stats(results, duration, c, dict(args.goodput) if args.goodput else None)
            rung["request_rate"] = None if rate == float("inf") else rate  # JSON has no inf
            result["rungs"].append(rung)
            status = "VOID: " + "; ".join(rung["errors"]) if rung["void"] else "ok"
            print(f"c={c} n={n}{'' if rate == float('inf') else f' rate={rate:g}/s'}: "
                  f"{rung['output_tok_s']:.1f} out tok/s, {rung['ok']} ok, "
                  f"{rung['failed']} failed ({status})", file=sys.stderr)
            result["void"] |= rung["void"]
            if not ladder_continues(rung, args.keep_going):
                print("stopping the ladder at a VOID rung (pass --keep-going to run the rest)", file=sys.stderr)
                break
    except KeyboardInterrupt:
        print(f"interrupted: reporting the {len(result['rungs'])} rung(s) that finished", file=sys.stderr)
        result["interrupted"] = True
    except STARTUP_ERRORS as e:  # a later rung's prompts could not be built (--num-prompts 8,10**15: no memory)
        if not result["rungs"]:
            raise  # nothing measured yet: main's one "error:" line
        # main used to print only this error, throwing away the rungs already measured
        print(f"error: {e}; reporting the {len(result['rungs'])} rung(s) that finished", file=sys.stderr)
        result["error"], result["void"] = str(e), True
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        result = run_ladder(args)
    except STARTUP_ERRORS as e:  # bad flags, no server, no tokenizer
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result["rungs"]:
        print(format_table(result["rungs"]))
    if args.result_json:
        if not save_json(args.result_json, result):
            return 2
        print(f"wrote {args.result_json}")
    if args.plot and result["rungs"]:
        title = f"{result['model']} via {args.backend}: in {args.input_len}, out {args.output_len}"
        try:
            if plot_ladder(result["rungs"], args.plot, title):
                print(f"wrote {args.plot}")
        except OSError as e:  # checked up front, but the disk may fill; the table and JSON stand
            print(f"error: cannot write --plot {args.plot}: {e}", file=sys.stderr)
            return 2
    return 130 if result.get("interrupted") else 2 if "error" in result else 1 if result["void"] else 0


if __name__ == "__main__":
    sys.exit(main())
