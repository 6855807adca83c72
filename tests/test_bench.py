"""minillm.bench: the random dataset, the ladder statistics, the SSE client's failure rules, the
offline throughput command, and the serve ladder end to end against the real minillm server."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minillm.bench import report
from minillm.bench.dataset import load_tokenizer, nano_vllm_workload, random_requests
from minillm.bench.report import RequestResult
from minillm.tools.random_model import write_random_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


@pytest.fixture(scope="module")
def tok(tiny):
    return load_tokenizer(str(tiny))


# ---- dataset ------------------------------------------------------------------------------------
@pytest.mark.parametrize("input_len", [1, 7, 64, 300])
def test_random_prompts_have_exact_length_and_no_special_tokens(tok, input_len):
    reqs = random_requests(tok, 12, input_len, 5, seed=3)
    for r in reqs:
        ids = tok.encode(r.prompt, add_special_tokens=False)  # what the server will see
        assert ids == r.prompt_ids and len(ids) == input_len == r.prompt_len
        assert not tok.special_token_ids.intersection(ids)
        assert r.output_len == 5
    assert len({r.prompt for r in reqs}) == 12  # distinct prompts, no accidental prefix sharing


def test_random_dataset_range_ratio_and_seed(tok):
    reqs = random_requests(tok, 200, 100, 40, range_ratio=0.5, seed=0)
    ins, outs = [r.prompt_len for r in reqs], [r.output_len for r in reqs]
    assert 50 <= min(ins) < 60 and 140 < max(ins) <= 150  # uniform over [50, 150]
    assert 20 <= min(outs) and max(outs) <= 60
    again = random_requests(tok, 200, 100, 40, range_ratio=0.5, seed=0)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]
    assert random_requests(tok, 3, 100, 40, seed=1)[0].prompt != reqs[0].prompt
    with pytest.raises(ValueError, match="range-ratio"):
        random_requests(tok, 1, 10, 10, range_ratio=1.0)


def test_nano_vllm_workload():
    prompts, outs = nano_vllm_workload([3, 4, 5], num_seqs=50, min_len=100, max_len=120, seed=0)
    assert len(prompts) == len(outs) == 50
    assert all(100 <= len(p) <= 120 and set(p) <= {3, 4, 5} for p in prompts)
    assert all(100 <= n <= 120 for n in outs)
    assert nano_vllm_workload([3, 4, 5], 50, 100, 120, 0) == (prompts, outs)


# ---- statistics ---------------------------------------------------------------------------------
def test_bytes_roofline_counts_each_decode_steps_reads():
    """Sequence (p = 3, o = 3): its decode steps make tokens 1 and 2 over 4 and 5 keys; (p = 2,
    o = 1) has no decode step; max(o) - 1 = 2 steps read the weights."""
    from minillm.bench.throughput import bytes_roofline

    r = bytes_roofline([3, 2], [3, 1], kv_bytes_per_token=10, weight_bytes=1000, bandwidth=100.0)
    assert r["kv_read_bytes"] == (4 + 5) * 10
    assert r["weight_read_bytes"] == 2 * 1000
    assert r["floor_s"] == pytest.approx((90 + 2000) / 100.0)
    assert r["roofline_tok_s"] == pytest.approx(4 / r["floor_s"])
    # a larger bandwidth or a shorter context only raises the roofline
    assert bytes_roofline([3, 2], [3, 1], 10, 1000, 200.0)["roofline_tok_s"] > r["roofline_tok_s"]
    assert bytes_roofline([1, 2], [3, 1], 10, 1000, 100.0)["roofline_tok_s"] > r["roofline_tok_s"]


def test_engine_bytes_roofline_uses_the_models_sizes(tiny):
    """What the GPU run adds to its result, here on the NumPy engine (float32 storage)."""
    from minillm.args import EngineArgs
    from minillm.bench.decode import weight_bytes
    from minillm.bench.throughput import bytes_roofline, engine_bytes_roofline
    from minillm.engine.engine import LLMEngine

    engine = LLMEngine(EngineArgs(model=str(tiny), device="cpu", max_num_seqs=2, max_model_len=64))
    cfg = engine.config
    r = engine_bytes_roofline(engine, [5, 7], [4, 2], 1e9)
    assert r == bytes_roofline([5, 7], [4, 2], 2 * cfg.num_layers * cfg.kv_size * 4, weight_bytes(engine.model), 1e9)
    assert r["weight_read_bytes"] == 3 * weight_bytes(engine.model) > 0


def test_decode_roofline_counts_the_untied_embedding_table_as_one_row(tiny):
    """A decode step reads the LM head whole but one row of an untied embedding table: the table
    is not in the step's weight bytes (the tiny preset is untied, like Qwen3-8B)."""
    from minillm.args import EngineArgs
    from minillm.bench.decode import weight_bytes
    from minillm.engine.engine import LLMEngine

    model = LLMEngine(EngineArgs(model=str(tiny), device="cpu", max_num_seqs=1, max_model_len=64)).model
    assert model.lm_head is not model.embed
    layers = sum(getattr(lw, f).nbytes for lw in model.layers for f in lw.__dataclass_fields__
                 if getattr(lw, f) is not None)
    assert weight_bytes(model) == layers + model.norm.nbytes + model.lm_head.nbytes
    model.lm_head = model.embed  # tied: the table is the LM head, read whole every step
    assert weight_bytes(model) == layers + model.norm.nbytes + model.embed.nbytes


def test_decode_bench_on_the_cpu_and_its_roofline(tiny, tmp_path):
    """`python -m minillm.bench decode` end to end on the NumPy engine (the GPU run adds the
    roofline: its arithmetic is checked here on fixed figures)."""
    import json

    from minillm.bench.decode import add_roofline
    from minillm.bench.decode import main as decode_main

    out = tmp_path / "decode.json"
    assert decode_main([str(tiny), "--device", "cpu", "--input-len", "16", "--output-len", "24",
                        "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["tokens_per_step"] == 1.0 and r["tok_per_s"] > 0 and r["pipelined_tok_per_s"] > 0
    assert r["pipelined_steps"] > 0  # the second pass did run with async scheduling
    assert "roofline_tok_per_s" not in r  # no copy bandwidth on the CPU
    r = {"tok_per_s": 8.0, "pipelined_tok_per_s": 9.0}
    add_roofline(r, weight_bytes=900, kv_bytes=100, bandwidth=1e4)
    assert r["roofline_tok_per_s"] == pytest.approx(10.0)
    assert r["fraction_of_roofline"] == pytest.approx(0.8)
    assert r["pipelined_fraction_of_roofline"] == pytest.approx(0.9)


def test_decode_bench_samples_with_its_flags(tiny, tmp_path, monkeypatch):
    """--temperature / --top-p / --top-k reach the stream's request (seeded: both passes draw the same
    tokens) and the result JSON; with top-k 1 the tokens are the greedy ones, without it they are not."""
    from minillm.bench.decode import main as decode_main
    from minillm.engine.engine import LLMEngine

    seen: list = []  # (params, {request id: tokens}) of each engine
    real_add, real_step = LLMEngine.add_request, LLMEngine.step

    def add(self, prompt, params=None, request_id=None, priority=0):
        if not seen or seen[-1][0] is not params:
            seen.append((params, {}))
        return real_add(self, prompt, params, request_id, priority)

    def step(self):
        outs = real_step(self)
        for o in outs:
            seen[-1][1].setdefault(o.request_id, []).extend(o.new_token_ids)
        return outs

    monkeypatch.setattr(LLMEngine, "add_request", add)
    monkeypatch.setattr(LLMEngine, "step", step)
    runs = {}
    for name, flags in (("topk1", ["--temperature", "1.5", "--top-k", "1", "--top-p", "0.95"]),
                        ("greedy", []), ("sampled", ["--temperature", "1.5"])):
        out = tmp_path / f"{name}.json"
        assert decode_main([str(tiny), "--device", "cpu", "--input-len", "8", "--output-len", "16",
                            "--result-json", str(out), *flags]) == 0
        runs[name] = (json.loads(out.read_text()), seen[-1])
    r, (params, tokens) = runs["topk1"]
    assert (r["temperature"], r["top_p"], r["top_k"]) == (1.5, 0.95, 1)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (1.5, 0.95, 1, 0)
    assert runs["greedy"][1][0].seed is None and runs["greedy"][0]["temperature"] == 0.0
    assert tokens["decode"] == tokens["decode-async"] == runs["greedy"][1][1]["decode"]
    sampled = runs["sampled"][1][1]
    assert sampled["decode"] == sampled["decode-async"] != runs["greedy"][1][1]["decode"]


def test_spec_cost_bench_on_the_cpu(tiny, tmp_path, capsys):
    """`python -m minillm.bench spec-cost` end to end on the NumPy engine: a random DFlash drafter's
    rounds emit exactly the plain greedy tokens, and the oracle drafter's curve is lossless with
    more tokens a step the more often it is right (float32: no rounding differences between a
    1-row step and a verification step)."""
    from minillm.bench.spec_cost import main as spec_cost_main
    from minillm.tools.random_model import write_dflash_drafter

    drafter = write_dflash_drafter(tmp_path / "dflash", tiny, num_layers=1, block_size=4)
    out = tmp_path / "spec.json"
    assert spec_cost_main([str(tiny), "--drafter", str(drafter), "--device", "cpu", "--k", "3",
                           "--concurrency", "1,3", "--input-len", "24", "--output-len", "20",
                           "--accept", "0,1", "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    floor = r["bytes_floor"]
    assert floor == (r["target_weight_bytes"] + r["drafter_weight_bytes"]) / r["target_weight_bytes"] > 1
    assert [c["concurrency"] for c in r["cost"]] == [1, 3]
    assert all(c["same_as_plain_decode"] and c["spec_step_ms"] > 0 for c in r["cost"])
    curve = {(s["concurrency"], s["accept_prob"]): s for s in r["speedup"]}
    assert set(curve) == {(1, 0.0), (1, 1.0), (3, 0.0), (3, 1.0)}
    assert all(s["lossless"] and s["verify_path_equals_plain_decode"] for s in curve.values())
    for c in (1, 3):  # all right: 3 drafts + a bonus token a round (the last rounds are cut short)
        assert curve[(c, 0.0)]["tokens_per_step"] == 1.0 and curve[(c, 1.0)]["tokens_per_step"] > 2.5
    # the drafter drafting from the first 16 ids only (draft_vocab_size): still the plain tokens
    assert spec_cost_main([str(tiny), "--drafter", str(drafter), "--device", "cpu", "--k", "3",
                           "--concurrency", "1", "--input-len", "24", "--output-len", "20", "--accept", "0",
                           "--draft-vocab-size", "16", "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["draft_vocab_size"] == 16 and r["cost"][0]["same_as_plain_decode"]
    assert 1 < r["bytes_floor"] < floor  # the drafter's LM head is 16 rows of the target's
    # --temperature: seeded sampled steps both ways; the drafts are draws from q, verified against it, so
    # the random drafter (as flat as the random target) has some accepted: more than a token a round
    assert spec_cost_main([str(tiny), "--drafter", str(drafter), "--device", "cpu", "--k", "3",
                           "--concurrency", "2", "--input-len", "24", "--output-len", "20", "--accept", "0",
                           "--temperature", "1.0", "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["temperature"] == 1.0 and r["cost"][0]["same_as_plain_decode"] is None
    assert r["cost"][0]["plain_step_ms"] > 0 and r["cost"][0]["tokens_per_step"] > 1.2, r["cost"]
    # --top-k 1 reaches both models' requests: q and p one-hot on their argmaxes, which the random drafter's
    # rarely share, so hardly a draft is accepted (a draft from the flat q above is, often)
    assert spec_cost_main([str(tiny), "--drafter", str(drafter), "--device", "cpu", "--k", "3",
                           "--concurrency", "2", "--input-len", "24", "--output-len", "20", "--accept", "0",
                           "--temperature", "1.0", "--top-k", "1", "--top-p", "0.9", "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert (r["top_k"], r["top_p"]) == (1, 0.9) and r["cost"][0]["tokens_per_step"] < 1.1, r["cost"]
    # past the target's vocabulary: refused before the plain runs (no result written, no steps timed)
    out.unlink()
    capsys.readouterr()
    assert spec_cost_main([str(tiny), "--drafter", str(drafter), "--device", "cpu", "--k", "3",
                           "--concurrency", "1", "--draft-vocab-size", "10000000", "--result-json", str(out)]) == 2
    err = capsys.readouterr()
    assert "--draft-vocab-size 10000000 is past the target's vocabulary" in err.err and "c= 1" not in err.out
    assert not out.exists()
    # --backoff-after: the random drafter backs off; the whole run's rate against plain decoding's,
    # the same tokens, and far fewer rounds than decode steps
    assert spec_cost_main([str(tiny), "--drafter", str(drafter), "--device", "cpu", "--k", "3",
                           "--concurrency", "1,2", "--input-len", "24", "--output-len", "8", "--accept", "0",
                           "--backoff-after", "1", "--backoff-output-len", "60", "--backoff-repeats", "2",
                           "--result-json", str(out)]) == 0
    runs = json.loads(out.read_text())["backoff"]
    assert [b["concurrency"] for b in runs] == [1, 2]
    for b in runs:
        assert b["same_as_plain_decode"] and b["backoff_tok_s"] > 0 and b["plain_tok_s"] > 0
        assert len(b["plain_runs_tok_s"]) == len(b["backoff_runs_tok_s"]) == len(b["backoff_sync_runs_tok_s"]) == 2
        assert b["backoff_sync_tok_s"] > 0
        assert 0 < b["rounds"] <= 8 * b["concurrency"] and b["backoff_steps"] > 40 * b["concurrency"], b


def test_percentiles_and_means():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert report.percentile(values, 50) == pytest.approx(50.5)
    assert report.percentile(values, 99) == pytest.approx(99.01)  # linear interpolation, as numpy/vLLM
    assert report.percentile([], 99) is None and report.mean([]) is None
    assert report.mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)


def test_ttft_itl_tpot_from_timestamps():
    start = 10.0
    chunks = [10.5, 10.6, 10.8, 11.1]  # first chunk 500 ms after sending, then gaps 100/200/300 ms
    ttft, itl = report.itl_from_timestamps(start, chunks)
    assert ttft == pytest.approx(0.5) and itl == pytest.approx([0.1, 0.2, 0.3])
    r = RequestResult(True, prompt_len=10, output_tokens=4, ttft=ttft, latency=1.1, itl=itl)
    assert report.tpot(r) == pytest.approx(0.6 / 3)  # (latency - ttft) / (tokens - 1)
    assert report.tpot(RequestResult(True, output_tokens=1, ttft=0.2, latency=0.2)) is None
    assert report.itl_from_timestamps(start, []) == (None, [])


def _results(n_ok: int, n_failed: int) -> list[RequestResult]:
    ok = [RequestResult(True, prompt_len=100, output_tokens=11, ttft=0.1 * (i + 1), latency=0.1 * (i + 1) + 1.0,
                        itl=[0.1] * 10) for i in range(n_ok)]
    bad = [RequestResult(False, prompt_len=100, error="HTTP 500: boom") for _ in range(n_failed)]
    return ok + bad


def test_rung_stats_on_constructed_timings():
    s = report.rung_stats(_results(4, 0), duration=2.0, concurrency=4)
    assert (s["ok"], s["failed"], s["void"]) == (4, 0, False)
    assert s["output_tok_s"] == pytest.approx(44 / 2.0)
    assert s["total_tok_s"] == pytest.approx((400 + 44) / 2.0)
    assert s["requests_s"] == pytest.approx(2.0)
    assert s["ttft_ms_mean"] == pytest.approx(250.0) and s["ttft_ms_p50"] == pytest.approx(250.0)
    assert s["ttft_ms_p99"] == pytest.approx(397.0)  # 300 + 0.97 * (400 - 300): interpolated
    assert s["tpot_ms_mean"] == pytest.approx(100.0) and s["tpot_ms_p99"] == pytest.approx(100.0)
    assert s["itl_ms_mean"] == pytest.approx(100.0)
    json.dumps(s, allow_nan=False)


def test_goodput_counts_the_requests_that_met_every_slo():
    """--goodput (vllm bench serve's): TTFTs are 100-400 ms, TPOTs 100 ms, latencies 1.1-1.4 s."""
    results = _results(4, 1)
    s = report.rung_stats(results, duration=2.0, concurrency=4, slos_ms={"ttft": 250.0})
    assert (s["goodput_ok"], s["goodput_requests_s"]) == (2, pytest.approx(1.0))  # 100 and 200 ms
    s = report.rung_stats(results, 2.0, 4, {"ttft": 1000.0, "tpot": 99.0})
    assert s["goodput_ok"] == 0  # every TPOT is 100 ms
    s = report.rung_stats(results, 2.0, 4, {"ttft": 1000.0, "tpot": 100.0, "e2el": 1300.0})
    assert s["goodput_ok"] == 3  # the 1.4 s request misses e2el; the failed one never counts
    assert "goodput" in report.format_table([s])
    assert "goodput_ok" not in report.rung_stats(results, 2.0, 4) and "goodput" not in report.format_table(
        [report.rung_stats(results, 2.0, 4)])
    one = RequestResult(True, prompt_len=5, output_tokens=1, ttft=0.05, latency=0.05)  # no TPOT to miss
    assert report.meets_slos(one, {"tpot": 1.0, "ttft": 60.0})


def test_goodput_flag_parsing(capsys):
    from minillm.bench.serve import main, slo

    assert slo("ttft:200") == ("ttft", 200.0) and slo("e2el:1.5") == ("e2el", 1.5)
    for bad in ("ttft", "itl:5", "tpot:x", "tpot:0", "tpot:inf", "tpot:nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            slo(bad)
    _refused(capsys, main, ["--base-url", _closed_url(), "--goodput", "ttft:1", "ttft:2"], "--goodput")


def test_a_failed_request_voids_the_rung_and_stops_the_ladder():
    s = report.rung_stats(_results(3, 1), duration=1.0, concurrency=4)
    assert (s["ok"], s["failed"], s["void"]) == (3, 1, True)
    assert s["output_tokens"] == 33  # throughput counts successful requests only
    assert s["errors"] == ["HTTP 500: boom"]
    assert not report.ladder_continues(s, keep_going=False)
    assert report.ladder_continues(s, keep_going=True)
    assert "VOID" in report.format_table([s])
    empty = report.rung_stats(_results(0, 2), duration=1.0, concurrency=2)
    assert empty["void"] and empty["ttft_ms_mean"] is None
    assert "-" in report.format_table([empty])


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rungs = [report.rung_stats(_results(4, 0), 2.0, 1), report.rung_stats(_results(3, 1), 1.0, 2)]
    assert report.plot_ladder(rungs, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the SSE client's failure rules, on canned responses (the server itself is tested below) ----
def _sse(*events: str) -> bytes:
    return "".join(f"{e}\n\n" for e in events).encode()


def _chunk(text: str, finish=None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


USAGE3 = "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})


def _send(status: int, body: bytes, expect: int | None = 3, broken: bool = False, backend="openai"):
    httpx = pytest.importorskip("httpx")
    from minillm.bench.serve import send_request

    class Stream(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield body
            if broken:
                raise httpx.ReadError("connection reset by peer")

    def handler(request):
        return httpx.Response(status, stream=Stream(), headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_request(client, "http://x/v1/completions", backend, {}, 5, expect)

    return asyncio.run(go())


def test_client_accepts_a_complete_stream():
    r = _send(200, _sse(_chunk("a"), _chunk("b"), _chunk("c"), _chunk("", "length"), USAGE3, "data: [DONE]"))
    assert r.ok and r.output_tokens == 3 and r.prompt_len == 5
    assert r.ttft is not None and len(r.itl) == 2  # the finish-only chunk is not a token
    no_usage = _send(200, _sse(_chunk("a"), _chunk("b"), "data: [DONE]"), expect=None)
    assert no_usage.ok and no_usage.output_tokens == 2  # counted by chunks


@pytest.mark.parametrize("status, body, broken, reason", [
    (500, b'{"error": {"message": "engine died"}}', False, "HTTP 500"),
    (200, _sse(_chunk("a"), 'event: error\ndata: {"error": {"message": "engine fault"}}'), False,
     "engine fault"),
    (200, _sse(_chunk("a"), 'data: {"error": {"message": "oops", "type": "server_error"}}'), False, "oops"),
    (200, _sse(_chunk("a"), _chunk("b")), False, "[DONE]"),
    (200, _sse(_chunk("a")), True, "broken stream"),
    (200, _sse(_chunk("a"), _chunk("b"), "data: " + json.dumps({"choices": [], "usage": {
        "prompt_tokens": 5, "completion_tokens": 2}}), "data: [DONE]"), False, "2 of 3 tokens"),
])
def test_client_failure_rules(status, body, broken, reason):
    r = _send(status, body, broken=broken)
    assert not r.ok and reason in r.error


def _data(obj) -> str:
    return "data: " + json.dumps(obj)


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
@pytest.mark.parametrize("reason", ["abort", "error"])
def test_client_fails_a_choice_the_server_gave_up_on(backend, reason):
    """finish_reason abort or error (vLLM's FinishReason.ABORT / ERROR): the output stopped because
    the server gave up, and without --ignore-eos the request passed as a success with fewer tokens."""
    if backend == "openai-chat":
        tok = _data({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
        end = _data({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    else:
        tok, end = _chunk("a"), _chunk("", reason)
    usage = _data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    r = _send(200, _sse(tok, tok, end, usage, "data: [DONE]"), expect=None, backend=backend)
    assert not r.ok and f"chunk 3: finish_reason '{reason}'" in r.error, r.error
    r = _send(200, _sse(tok, tok, end.replace(f'"{reason}"', '"stop"'), usage, "data: [DONE]"), expect=None,
              backend=backend)
    assert r.ok and r.output_tokens == 2, r.error  # an ordinary stop still passes


@pytest.mark.parametrize("backend, bad, reason", [
    ("openai-chat", _data({"choices": [{"index": 0, "delta": None}]}), "chunk 3: choices[0].delta is null"),
    ("openai-chat", _data({"choices": [{"delta": ["hi"]}]}), 'chunk 3: choices[0].delta is ["hi"], not an object'),
    ("openai-chat", _data({"choices": [{"delta": {"content": 5}}]}),
     "chunk 3: choices[0].delta.content is 5, not a string"),
    ("openai", _data({"choices": [{"text": None, "finish_reason": "length"}, {"text": 5}]}),
     "chunk 3: choices[1].text is 5, not a string"),
    ("openai", _data({"choices": {"text": "a"}}), 'chunk 3: choices is {"text": "a"}, not a list'),
    ("openai", _data({"id": "x", "object": "text_completion"}), "chunk 3: choices is missing"),
    ("openai", _data({"choices": [None]}), "chunk 3: choices[0] is null, not an object"),
    ("openai", _data(["a"]), 'chunk 3: is ["a"], not an object'),
    ("openai", "data: {not json", "chunk 3: not JSON"),
])
def test_client_names_what_is_wrong_with_a_malformed_chunk(backend, bad, reason):
    """The request fails with the chunk's number and the field (it used to be a vague 'broken stream')."""
    good = _data({"choices": [{"delta": {"content": "a"}}]}) if backend == "openai-chat" else _chunk("a")
    r = _send(200, _sse(good, good, bad, good, "data: [DONE]"), expect=None, backend=backend)
    assert not r.ok and reason in r.error and "broken stream" not in r.error, r.error


def test_client_takes_a_usage_chunk_without_choices_and_a_closing_chunk_without_delta():
    """Leniencies real servers need: usage alone in its chunk, a chat closing chunk with no delta."""
    tok = _data({"choices": [{"delta": {"content": "hi"}}]})
    close = _data({"choices": [{"index": 0, "finish_reason": "stop"}]})
    usage = _data({"usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    r = _send(200, _sse(tok, tok, close, usage, "data: [DONE]"), expect=None, backend="openai-chat")
    assert r.ok and r.output_tokens == 2, r.error


def test_chat_role_only_delta_is_not_the_first_token():
    role = "data: " + json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    tok = "data: " + json.dumps({"choices": [{"delta": {"content": "hi"}}]})
    r = _send(200, _sse(role, tok, tok, "data: [DONE]"), expect=None, backend="openai-chat")
    assert r.ok and r.output_tokens == 2 and len(r.itl) == 1


def test_an_output_ended_by_its_first_token_has_a_ttft():
    """A first token that ends the output (EOS) sends no text, only the finishing chunk: its arrival is
    the TTFT, as vLLM's bench times the first chunk with choices (these, the fastest requests, were
    left out of the TTFT statistics). The chat role chunk before it is still not the token."""
    usage1 = _data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
    r = _send(200, _sse(_chunk("", "stop"), usage1, "data: [DONE]"), expect=None)
    assert r.ok and r.output_tokens == 1 and r.ttft is not None and r.itl == []
    role = _data({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    close = _data({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    r = _send(200, _sse(role, close, usage1, "data: [DONE]"), expect=None, backend="openai-chat")
    assert r.ok and r.output_tokens == 1 and r.ttft is not None and r.itl == []
    r = _send(200, _sse(role, "data: [DONE]"), expect=None, backend="openai-chat")
    assert r.ok and r.ttft is None  # nothing finished: no token came


def _event(kind: str, **fields) -> str:
    return f"event: {kind}\n" + _data({"type": kind, **fields})


RESPONSE_DONE = _event("response.completed", response={"status": "completed", "usage": {
    "input_tokens": 5, "output_tokens": 3, "total_tokens": 8}})


def test_client_reads_a_responses_stream():
    """--backend openai-responses: the output deltas are the tokens (reasoning and call arguments too;
    the item and part events are not), the usage is the final response's, and the stream ends there."""
    created = _event("response.created", response={"status": "in_progress", "output": []})
    added = _event("response.output_item.added", output_index=0, item={"type": "message"})
    tok = _event("response.output_text.delta", delta="hi", item_id="m", output_index=0, content_index=0)
    think = _event("response.reasoning_text.delta", delta="hm", item_id="r", output_index=0, content_index=0)
    r = _send(200, _sse(created, think, added, tok, tok, RESPONSE_DONE), backend="openai-responses")
    assert r.ok and (r.prompt_len, r.output_tokens) == (5, 3) and len(r.itl) == 2, r.error
    cut = _event("response.incomplete", response={"usage": {"input_tokens": 5, "output_tokens": 1}})
    r = _send(200, _sse(created, tok, cut), expect=None, backend="openai-responses")
    assert r.ok and r.output_tokens == 1


@pytest.mark.parametrize("bad, reason", [
    (_event("response.failed", response={"status": "failed", "error": {"message": "engine fault"}}),
     "response.failed: engine fault"),
    ('event: error\ndata: {"type": "error", "message": "injected", "code": "x"}', "SSE error event: injected"),
    (_event("response.output_text.delta", delta=5), "delta is 5, not a string"),
    (_data({"delta": "x"}), "type is null, not an event type"),
    ("", "stream ended without response.completed"),
])
def test_client_responses_failure_rules(bad, reason):
    tok = _event("response.output_text.delta", delta="a")
    r = _send(200, _sse(tok, *([bad] if bad else [])), expect=None, backend="openai-responses")
    assert not r.ok and reason in r.error, r.error


# ---- offline throughput through minillm.LLM -----------------------------------------------------
def test_throughput_command(tiny, tmp_path, capsys):
    from minillm.bench.throughput import main

    out = tmp_path / "tp.json"
    rc = main([str(tiny), "--device", "cpu", "--num-seqs", "6", "--min-len", "4", "--max-len", "24",
               "--result-json", str(out)])
    assert rc == 0
    assert "Throughput:" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["output_tokens"] == res["expected_output_tokens"] > 0 and res["short_sequences"] == 0
    assert res["output_tok_s"] > 0 and res["workload"]["num_seqs"] == 6
    assert (res["workload"]["top_p"], res["workload"]["top_k"]) == (1.0, -1)


def test_throughput_samples_with_top_p_and_top_k(tiny, tmp_path, capsys, monkeypatch):
    """--top-p / --top-k reach every request (Qwen3's sampling defaults): with top-k 1 each output is
    the greedy one, whatever the temperature (the timed generate's outputs, recorded as it returns)."""
    from minillm import LLM
    from minillm.bench.throughput import main

    seen = []
    real = LLM.generate

    def recording(self, prompts, params=None, **kw):
        outs = real(self, prompts, params, **kw)
        seen.append((params, [list(o.token_ids) for o in outs]))
        return outs

    monkeypatch.setattr(LLM, "generate", recording)
    runs = {}
    for name, flags in (("topk1", ["--temperature", "1.5", "--top-k", "1", "--top-p", "0.95"]),
                        ("greedy", ["--temperature", "0"]), ("sampled", ["--temperature", "1.5"])):
        out = tmp_path / f"{name}.json"
        assert main([str(tiny), "--device", "cpu", "--num-seqs", "3", "--min-len", "4", "--max-len", "12",
                     "--result-json", str(out), *flags]) == 0
        runs[name] = (json.loads(out.read_text())["workload"], seen[-1])  # the timed generate: the last
    workload, (params, tokens) = runs["topk1"]
    assert (workload["top_p"], workload["top_k"]) == (0.95, 1)
    assert all((p.top_p, p.top_k, p.temperature) == (0.95, 1, 1.5) for p in params)
    assert tokens == runs["greedy"][1][1] and tokens != runs["sampled"][1][1]
    capsys.readouterr()


# ---- the serve ladder against the real server ---------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    try:
        import minillm.serve  # noqa: F401
    except ImportError as e:
        pytest.skip(f"minillm.serve does not import yet ({e}); the ladder needs the real server")
    httpx = pytest.importorskip("httpx")
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [sys.executable, "-m", "minillm.serve", str(tiny), "--host", "127.0.0.1", "--port", str(port),
           "--device", "cpu", "--max-model-len", "256", "--max-num-seqs", "4"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"server did not answer within 90 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    yield SimpleNamespace(base=base, log=log)
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.parametrize("backend", ["openai", "openai-chat", "openai-responses"])
def test_serve_ladder_end_to_end(server, tiny, tmp_path, backend, capsys):
    from minillm.bench.serve import main

    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["--base-url", server.base, "--backend", backend, "--input-len", "24", "--output-len", "6",
               "--concurrency", "1,2", "--num-prompts", "2,4", "--ignore-eos", "--result-json", str(out),
               "--plot", str(png), "--timeout", "60"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err + server.log.read_text()[-3000:]
    res = json.loads(out.read_text())
    assert res["tokenizer"] == res["model"] or os.path.samefile(res["tokenizer"], tiny)
    assert [r["concurrency"] for r in res["rungs"]] == [1, 2] and not res["void"]
    for rung, n in zip(res["rungs"], [2, 4]):
        assert (rung["num_prompts"], rung["ok"], rung["failed"]) == (n, n, 0)
        assert rung["output_tokens"] == 6 * n  # ignore_eos: every request ran to max_tokens
        if backend == "openai":  # the chat template adds its own tokens to the prompt
            assert rung["input_tokens"] == 24 * n
        assert rung["output_tok_s"] > 0 and rung["ttft_ms_p99"] > 0 and rung["tpot_ms_mean"] > 0
    assert "VOID" not in printed.out and "TPOT" in printed.out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in printed.err
    else:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_ctrl_c_reports_the_rungs_that_finished(server, tmp_path):
    """SIGINT mid-ladder: the finished rungs' table and JSON, exit 130, no traceback."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "minillm.bench", "serve", "--base-url", server.base, "--input-len", "16",
           "--output-len", "4", "--concurrency", "1,1", "--num-prompts", "2,400", "--ignore-eos",
           "--result-json", str(out), "--timeout", "60"]
    # SIGINT's default action in the child: a test run in the background of a non-interactive shell (as CI
    # may be) inherits it ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = ""
    while "c=1 n=2:" not in seen:  # the first rung's line: the second (400 requests) has begun
        line = proc.stderr.readline()
        assert line, f"the ladder ended early: {seen}{proc.stdout.read()}"
        seen += line
    proc.send_signal(signal.SIGINT)
    try:  # (not communicate(): it reads the pipes' descriptors and would miss what readline buffered)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 130, (seen, stderr)
    assert "Traceback" not in stderr and "interrupted: reporting the 1 rung(s) that finished" in stderr
    assert "TPOT" in stdout
    res = json.loads(out.read_text())
    assert res["interrupted"] and [r["num_prompts"] for r in res["rungs"]] == [2]


def test_serve_ladder_on_a_custom_dataset(server, tiny, tmp_path, capsys):
    """--dataset custom --dataset-path: the prompts of a JSONL file (vLLM's custom dataset), each
    rung's in its own seeded order, repeated when the file is shorter than a rung (with a note)."""
    from minillm.bench.dataset import load_tokenizer
    from minillm.bench.serve import main

    prompts = ["Summarise the plot of a short story about a lighthouse.", "Write a haiku about rain.",
               "def fibonacci(n):"]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate(prompts)) + "\n")
    out = tmp_path / "r.json"
    rc = main(["--base-url", server.base, "--dataset", "custom", "--dataset-path", str(data), "--output-len", "5",
               "--concurrency", "1,2", "--num-prompts", "2,4", "--ignore-eos", "--result-json", str(out),
               "--timeout", "60", "--goodput", "e2el:600000", "ttft:0.001"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err + server.log.read_text()[-3000:]
    res = json.loads(out.read_text())
    assert res["dataset"] == {"name": "custom", "path": str(data), "prompts_in_file": 3, "output_len": 5, "seed": 0}
    assert res["goodput_slos_ms"] == {"e2el": 600000.0, "ttft": 0.001} and "goodput" in printed.out
    assert all(r["goodput_ok"] == 0 for r in res["rungs"])  # no first token within a microsecond
    assert "prompts repeat" in printed.err  # the second rung sends 4 of a 3-prompt file
    tok = load_tokenizer(str(tiny))
    lengths = sorted(len(tok.encode(p, add_special_tokens=False)) for p in prompts)
    for rung, n in zip(res["rungs"], [2, 4]):
        assert (rung["ok"], rung["failed"], rung["output_tokens"]) == (n, 0, 5 * n)
        assert lengths[0] * n <= rung["input_tokens"] <= lengths[-1] * n


@pytest.mark.parametrize("lines, message", [
    (None, "cannot read it"),
    ("", "no prompts in it"),
    ('{"prompt": "ok"}\nnot json\n', "line 2: not JSON"),
    ('{"text": "no prompt key"}\n', 'line 1: each line must be an object with a non-empty "prompt"'),
    ('["a list"]\n', 'line 1: each line must be an object'),
    ('{"prompt": ""}\n', 'non-empty "prompt"'),
    # a JSON list, pretty-printed: its first line "[" is not JSON; the message says the file is JSONL
    ('[\n  {"prompt": "a"}\n]\n', "line 1: not JSON (Expecting value); the file is read as JSONL"),
    # JSON's \ud800 escape: a lone surrogate, which the tokenizer refused in the middle of the ladder
    # (its error naming neither the file nor the line, and the rungs already measured lost)
    ('{"prompt": "ok"}\n{"prompt": "a \\ud800 b"}\n', 'line 2: the "prompt" is not valid Unicode (a lone surrogate'),
])
def test_serve_refuses_a_bad_custom_dataset_before_any_request(tmp_path, capsys, lines, message):
    from minillm.bench.serve import main

    path = tmp_path / "d.jsonl"
    if lines is not None:
        path.write_text(lines)
    # nothing listens on port 9: a request sent would fail differently (and later)
    assert main(["--base-url", "http://127.0.0.1:9", "--dataset", "custom", "--dataset-path", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_custom_dataset_takes_a_file_with_a_byte_order_mark(tmp_path):
    """A JSONL file saved by a Windows editor starts with a BOM: line 1 was refused as "not JSON"."""
    from minillm.bench.dataset import custom_prompts

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "first"}\n{"prompt": "second"}\n', encoding="utf-8-sig")
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    assert custom_prompts(str(path)) == ["first", "second"]


@pytest.mark.parametrize("flags, message", [
    (["--dataset", "custom"], "--dataset custom needs --dataset-path"),
    (["--dataset-path", "x.jsonl"], "--dataset-path is for --dataset custom"),
])
def test_serve_custom_dataset_flags_go_together(capsys, flags, message):
    from minillm.bench.serve import main

    assert main(["--base-url", "http://127.0.0.1:9", *flags]) == 2
    assert message in capsys.readouterr().err


def test_arrival_offsets():
    """--request-rate: gamma gaps of mean 1 / rate (burstiness 1: exponential, a Poisson process),
    the first request at 0, the same offsets for the same seed; inf: everything at 0."""
    from minillm.bench.serve import arrival_offsets, rate_list

    offs = arrival_offsets(4001, 20.0, 1.0, [0, 1])
    gaps = np.diff(offs)
    assert offs[0] == 0 and (gaps > 0).all() and abs(gaps.mean() - 0.05) < 0.005
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential: coefficient of variation 1
    bursty = np.diff(arrival_offsets(4001, 20.0, 0.25, [0, 1]))
    assert abs(bursty.mean() - 0.05) < 0.01 and bursty.std() / bursty.mean() > 1.5  # cv = 1 / sqrt(0.25)
    assert arrival_offsets(5, 20.0, 1.0, [3]) == arrival_offsets(5, 20.0, 1.0, [3])
    assert arrival_offsets(3, float("inf"), 1.0, [0]) == [0.0, 0.0, 0.0]
    assert rate_list("inf,2.5") == [float("inf"), 2.5]
    for bad in ("0", "-1", "x", "", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            rate_list(bad)


def test_serve_ladder_at_a_request_rate(server, tmp_path, capsys):
    """Requests arrive over time at --request-rate: the rung lasts at least until the last arrival,
    and the JSON records each rung's rate (null for inf); one concurrency serves a rung per rate."""
    from minillm.bench.serve import arrival_offsets, main

    out = tmp_path / "r.json"
    rc = main(["--base-url", server.base, "--input-len", "16", "--output-len", "3", "--max-concurrency", "4",
               "--num-prompts", "6", "--request-rate", "8,inf", "--ignore-eos", "--result-json", str(out),
               "--timeout", "60"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    res = json.loads(out.read_text())
    assert [r["request_rate"] for r in res["rungs"]] == [8.0, None] and res["burstiness"] == 1.0
    assert res["rungs"][0]["duration_s"] >= arrival_offsets(6, 8.0, 1.0, [0, 0, 1])[-1]
    assert all(r["ok"] == 6 for r in res["rungs"]) and "rate=8/s" in printed.err
    table = printed.out.splitlines()
    assert table[0].split()[:2] == ["c", "rate"] and table[2].split()[1] == "8" and table[3].split()[1] == "inf"
    rc = main(["--base-url", server.base, "--concurrency", "1,2", "--num-prompts", "2", "--request-rate", "1,2,3"])
    assert rc == 2 and "--request-rate has 3 values for 2" in capsys.readouterr().err


def test_serve_ladder_stops_at_a_void_rung(server, tmp_path, capsys):
    from minillm.bench.serve import main

    # prompts longer than the server's --max-model-len 256: each request gets a 4xx, the first
    # rung is VOID, and the ladder stops there
    out = tmp_path / "void.json"
    rc = main(["--base-url", server.base, "--input-len", "300", "--output-len", "4", "--warmup", "0",
               "--concurrency", "1,2,4", "--num-prompts", "2", "--result-json", str(out)])
    assert rc == 1
    res = json.loads(out.read_text())
    assert res["void"] and len(res["rungs"]) == 1
    assert res["rungs"][0]["failed"] == 2 and res["rungs"][0]["errors"][0].startswith("HTTP 4")
    assert "VOID" in capsys.readouterr().out
    np.testing.assert_equal(res["rungs"][0]["ok"], 0)


def test_per_op_times_charge_nested_ops_once():
    """bench decode's eager split by op: an op that calls another timed op (decode_step_attention
    its o product's matmul) is charged its own time only. A stand-in clock replaces CUDA events
    (the arithmetic is what is checked; the GPU run records the real split)."""
    from minillm.bench.decode import OPS, per_op_times

    clock = [0.0]  # ms

    class Event:
        def record(self, stream):
            self.t = clock[0]

    class Backend:
        cp = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=lambda s, e: e.t - s.t))
        stream = None

        def synchronize(self):
            pass

        def matmul(self, *a, **kw):
            clock[0] += 0.002

        def decode_step_attention(self, *a, **kw):
            clock[0] += 0.005
            self.matmul()  # the o product, inside
            clock[0] += 0.001

        def rms_norm(self, *a, **kw):
            clock[0] += 0.003

    be = Backend()
    for name in OPS:  # the ops this stand-in lacks: free
        if not hasattr(be, name):
            setattr(be, name, lambda *a, **kw: None)

    class Engine:
        backend = be
        runner = SimpleNamespace(graphs={"g": 1})

        def step(self):
            be.rms_norm()
            be.decode_step_attention()
            be.matmul()

    eng = Engine()
    times = per_op_times(eng)
    assert eng.runner.graphs == {"g": 1}  # restored
    assert abs(times["decode_step_attention"] - 6.0) < 1e-6  # 5 + 1 us, not the matmul's 2
    assert abs(times["matmul"] - 4.0) < 1e-6  # both products
    assert abs(times["rms_norm"] - 3.0) < 1e-6
    assert abs(sum(times.values()) - 13.0) < 1e-6  # the step's span, counted once
    assert be.matmul.__func__ is Backend.matmul  # the timing wrappers are gone


# ---- bad input: one "error:" line and exit status 2, before any work --------------------------------
def _refused(capsys, main, argv: list[str], flag: str) -> None:
    """main(argv) refuses with exit status 2 and a single "error: ..." line that names `flag`."""
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and len(err.splitlines()) == 1 and flag in err, err


def _closed_url() -> str:
    return f"http://127.0.0.1:{_free_port()}"  # nothing listens: a check that comes too late fails on it


def test_serve_with_a_model_name_finds_no_server_before_building_prompts(capsys):
    """With --model given, a server that was not there was found only by the first request, after the
    prompts were built: minutes at a huge --input-len."""
    from minillm.bench.serve import main

    _refused(capsys, main, ["--base-url", _closed_url(), "--model", "x", "--input-len", "100000000"],
             "cannot reach the server")


@pytest.mark.parametrize("command", ["serve", "throughput", "decode", "spec", "hf", "hf-batch", "spec-cost"])
def test_an_unwritable_result_json_is_refused_before_the_run(tiny, tmp_path, capsys, command):
    """The run would execute and then lose its results to a FileNotFoundError at the end."""
    from minillm.bench.__main__ import main

    small = {"serve": ["--base-url", _closed_url()],
             "throughput": [str(tiny), "--device", "cpu", "--num-seqs", "2", "--min-len", "4", "--max-len", "8"],
             "decode": [str(tiny), "--device", "cpu", "--input-len", "8", "--output-len", "12"],
             "spec": [str(tiny), "--max-tokens", "4"],
             "hf": [str(tiny), "--input-len", "8", "--output-len", "4"],
             "hf-batch": [str(tiny), "--device", "cpu", "--num-seqs", "2", "--min-len", "4", "--max-len", "8"],
             "spec-cost": [str(tiny), "--device", "cpu", "--input-len", "8", "--output-len", "4",
                           "--concurrency", "1", "--accept", "0"]}[command]
    _refused(capsys, main, [command, *small, "--result-json", str(tmp_path / "missing" / "r.json")], "--result-json")
    _refused(capsys, main, [command, *small, "--result-json", str(tmp_path)], "is a directory")


def test_a_result_json_that_fails_at_the_end_is_printed_instead(tiny, tmp_path, capsys, monkeypatch):
    """check_output_path passed, but the write fails anyway (a full disk): the result goes to stdout."""
    from minillm.bench.throughput import main

    def full_disk(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_json", full_disk)
    rc = main([str(tiny), "--device", "cpu", "--num-seqs", "2", "--min-len", "4", "--max-len", "8",
               "--result-json", str(tmp_path / "tp.json")])
    printed = capsys.readouterr()
    assert rc == 2 and "error: cannot write --result-json" in printed.err and "No space left" in printed.err
    result = json.loads(printed.out[printed.out.index("{"):])
    assert result["benchmark"] == "throughput" and result["output_tokens"] > 0
    assert not (tmp_path / "tp.json").exists()


@pytest.mark.parametrize("flags, flag", [
    (["--timeout", "0"], "--timeout"), (["--timeout", "-1"], "--timeout"), (["--timeout", "nan"], "--timeout"),
    (["--temperature", "nan"], "--temperature"), (["--temperature", "-0.5"], "--temperature"),
    (["--seed", "-1"], "--seed"), (["--warmup", "-1"], "--warmup"),
    (["--burstiness", "inf", "--request-rate", "5"], "--burstiness"), (["--burstiness", "0"], "--burstiness"),
    (["--input-len", "0"], "--input-len"), (["--output-len", "0"], "--output-len"),
    (["--range-ratio", "nan"], "--range-ratio"), (["--plot", "/nonexistent-dir/p.png"], "--plot"),
    (["--model", ""], "--model"),  # "" quietly meant: ask the server
    (["--base-url", "127.0.0.1:8000"], "--base-url must start with http:// or https://"),  # failed every request
])
def test_serve_refuses_bad_numeric_flags_before_any_request(capsys, flags, flag):
    from minillm.bench.serve import main

    _refused(capsys, main, ["--base-url", _closed_url(), *flags], flag)


def test_serve_refuses_a_base_url_ending_in_v1(capsys):
    """An OpenAI client's base_url (http://host:port/v1): the routes became /v1/v1/..., a 404 per request."""
    from minillm.bench.serve import main

    _refused(capsys, main, ["--base-url", _closed_url() + "/v1/", "--model", "m"], "ends in /v1")


def test_serve_refuses_a_plot_matplotlib_cannot_write(tmp_path, capsys):
    """--plot r.xyz raised matplotlib's ValueError (a traceback) after the whole ladder had run; --plot r
    was written as r.png while "wrote r" was printed."""
    pytest.importorskip("matplotlib")
    from minillm.bench.serve import main

    for bad, reason in (("r.xyz", "cannot write .xyz images"), ("r", "no extension")):
        _refused(capsys, main, ["--base-url", _closed_url(), "--plot", str(tmp_path / bad)], reason)
    assert not list(tmp_path.iterdir())


def test_serve_refuses_an_output_that_would_overwrite_an_input(tmp_path, capsys):
    """--result-json naming the --dataset-path file wrote the result over the dataset (after the run,
    reported as "wrote"); --plot naming the --result-json file wrote the PNG over the JSON."""
    from minillm.bench.serve import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    (tmp_path / "link.jsonl").symlink_to(data)
    custom = ["--base-url", _closed_url(), "--dataset", "custom", "--dataset-path", str(data)]
    _refused(capsys, main, [*custom, "--result-json", str(data)], "is the file of --dataset-path")
    _refused(capsys, main, [*custom, "--result-json", str(tmp_path / "link.jsonl")], "is the file of --dataset-path")
    _refused(capsys, main, [*custom, "--result-json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.json")],
             "--plot")
    assert data.read_text() == '{"prompt": "hi"}\n' and not (tmp_path / "r.json").exists()


def test_serve_names_a_bad_tokenizer_before_any_request(tmp_path, capsys):
    """--tokenizer's errors name the flag (they read "model '/nonexistent'", and came only after the
    server was asked for its model)."""
    from minillm.bench.serve import main

    for bad in ("/nonexistent", "", str(tmp_path)):  # tmp_path: a directory without tokenizer.json
        _refused(capsys, main, ["--base-url", _closed_url(), "--tokenizer", bad], "--tokenizer")


def test_serve_refuses_a_request_rate_that_would_never_finish(capsys):
    """1e-300 requests/s would wait ~1e300 s for the second request: rates below MIN_REQUEST_RATE
    are refused by the flag's parser (exit status 2, the flag named)."""
    from minillm.bench.serve import MIN_REQUEST_RATE, main, rate_list

    assert rate_list(f"{MIN_REQUEST_RATE},inf") == [MIN_REQUEST_RATE, float("inf")]
    for bad in ("1e-300", f"{MIN_REQUEST_RATE / 2}", "5,1e-9"):
        with pytest.raises(argparse.ArgumentTypeError, match="requests/s"):
            rate_list(bad)
    with pytest.raises(SystemExit) as e:
        main(["--base-url", _closed_url(), "--request-rate", "1e-300"])
    assert e.value.code == 2 and "--request-rate" in capsys.readouterr().err


@pytest.mark.parametrize("usage, reason", [
    ({"prompt_tokens": 5, "completion_tokens": None}, "completion_tokens is None"),
    ({"prompt_tokens": 5, "completion_tokens": "3"}, "completion_tokens is '3'"),
    ({"prompt_tokens": None, "completion_tokens": 3}, "prompt_tokens is None"),
    ({"prompt_tokens": 5, "completion_tokens": -1}, "completion_tokens is -1"),
    (["not", "an", "object"], "not an object"),
])
@pytest.mark.parametrize("expect", [3, None])
def test_client_fails_a_request_whose_usage_counts_are_not_counts(usage, reason, expect):
    body = _sse(_chunk("a"), _chunk("b"), _chunk("c"), "data: " + json.dumps({"choices": [], "usage": usage}),
                "data: [DONE]")
    r = _send(200, body, expect=expect)
    assert not r.ok and "bad usage chunk" in r.error and reason in r.error
    assert isinstance(r.output_tokens, int) and isinstance(r.prompt_len, int)


@pytest.fixture(params=["null usage", "bad text"])
def null_usage_server(request):
    """A streaming completions server whose usage chunk says completion_tokens: null, or whose second
    chunk's text is a number (param)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            null_usage = request.param == "null usage"
            usage = {"prompt_tokens": 5, "completion_tokens": None if null_usage else body["max_tokens"]}
            chunks = [_chunk("x")] * body["max_tokens"]
            if not null_usage:
                chunks[1] = _data({"choices": [{"index": 0, "text": 7, "finish_reason": None}]})
            self.wfile.write(_sse(*chunks, "data: " + json.dumps({"choices": [], "usage": usage}), "data: [DONE]"))

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}", request.param
    srv.shutdown()
    srv.server_close()


def test_serve_ladder_survives_a_malformed_usage_chunk(null_usage_server, tiny, tmp_path, capsys):
    """A bad count or chunk fails its request (the rung is VOID, exit status 1), not the whole run."""
    pytest.importorskip("httpx")
    from minillm.bench.serve import main

    url, kind = null_usage_server
    out = tmp_path / "r.json"
    rc = main(["--base-url", url, "--model", "fake", "--tokenizer", str(tiny), "--input-len", "8",
               "--output-len", "4", "--concurrency", "1", "--num-prompts", "2", "--warmup", "0",
               "--result-json", str(out)])
    assert rc == 1, capsys.readouterr().err
    rung = json.loads(out.read_text())["rungs"][0]
    assert rung["void"] and (rung["ok"], rung["failed"]) == (0, 2)
    reason = ("bad usage chunk: usage.completion_tokens is None" if kind == "null usage"
              else "chunk 2: choices[0].text is 7, not a string")
    assert reason in rung["errors"][0], rung["errors"]


def test_an_error_building_a_later_rung_keeps_the_rungs_measured(server, tmp_path, capsys):
    """The second rung's 10**15 prompts cannot be allocated: main printed that error alone (exit 2) and
    threw away the first rung, measured and never written. Now the finished rungs are reported."""
    from minillm.bench.serve import main

    out = tmp_path / "r.json"
    rc = main(["--base-url", server.base, "--input-len", "8", "--output-len", "2", "--concurrency", "1,1",
               "--num-prompts", f"2,{10**15}", "--warmup", "0", "--result-json", str(out), "--timeout", "60"])
    printed = capsys.readouterr()
    assert rc == 2, printed.err
    assert "reporting the 1 rung(s) that finished" in printed.err and "TPOT" in printed.out
    res = json.loads(out.read_text())
    assert [(r["num_prompts"], r["ok"]) for r in res["rungs"]] == [(2, 2)]
    assert res["void"] and "allocate" in res["error"]


@pytest.mark.parametrize("flags, flag", [
    (["--input-len", "0"], "--input-len"), (["--input-len", "-4"], "--input-len"),
    (["--output-len", "8"], "--output-len"), (["--output-len", "0"], "--output-len"),
])
def test_decode_bench_refuses_lengths_it_cannot_time(tiny, capsys, flags, flag):
    """--output-len at or below the 8 warm-up steps leaves no timed step (a division by zero)."""
    from minillm.bench.decode import main

    _refused(capsys, main, [str(tiny), "--device", "cpu", "--input-len", "8", *flags], flag)


def test_decode_bench_reports_a_tokenizer_it_cannot_read(tiny, tmp_path, capsys):
    """An OSError while loading (here tokenizer_config.json is a directory) is a startup error too."""
    import shutil

    from minillm.bench.decode import main

    model = shutil.copytree(tiny, tmp_path / "model")
    (model / "tokenizer_config.json").unlink()
    (model / "tokenizer_config.json").mkdir()
    _refused(capsys, main, [str(model), "--device", "cpu", "--input-len", "8", "--output-len", "12"],
             "tokenizer_config.json")


# a spec-cost run small enough that a flag checked only after it (or not at all) fails the test quickly
SMALL_SPEC_COST = ["--input-len", "8", "--output-len", "4", "--concurrency", "1", "--accept", "0"]


@pytest.mark.parametrize("command, flags, flag", [
    ("spec", ["--k", "0"], "--k"), ("spec", ["--max-tokens", "0"], "--max-tokens"),
    ("hf", ["--input-len", "0"], "--input-len"), ("hf", ["--output-len", "1"], "--output-len"),
    ("hf-batch", ["--num-seqs", "0"], "--num-seqs"), ("hf-batch", ["--min-len", "0"], "--min-len"),
    ("hf-batch", ["--timeout", "-1"], "--timeout"), ("hf-batch", ["--temperature", "nan"], "--temperature"),
    ("throughput", ["--top-p", "0"], "--top-p"), ("throughput", ["--top-p", "nan"], "--top-p"),
    ("throughput", ["--top-p", "1.5"], "--top-p"), ("throughput", ["--top-k", "-2"], "--top-k"),
    ("throughput", ["--top-k", str(2**31)], "--top-k"),
    ("decode", ["--temperature", "nan"], "--temperature"), ("decode", ["--top-p", "0"], "--top-p"),
    ("decode", ["--top-k", "-2"], "--top-k"),
    ("spec-cost", ["--k", "0"], "--k"), ("spec-cost", ["--temperature", "-1"], "--temperature"),
    ("spec-cost", ["--temperature", "nan"], "--temperature"), ("spec-cost", ["--input-len", "0"], "--input-len"),
    ("spec-cost", ["--output-len", "1"], "--output-len"), ("spec-cost", ["--concurrency", "0"], "--concurrency"),
    ("spec-cost", ["--concurrency", "1,x"], "--concurrency"), ("spec-cost", ["--accept", "1.5"], "--accept"),
    ("spec-cost", ["--draft-vocab-size", "0"], "--draft-vocab-size"),
    ("spec-cost", ["--backoff-after", "0"], "--backoff-after"),
    ("spec-cost", ["--backoff-after", "2"], "--backoff-after needs --drafter"),
    ("spec-cost", ["--backoff-output-len", "1"], "--backoff-output-len"),
    ("spec-cost", ["--backoff-repeats", "0"], "--backoff-repeats"),
    # 0 was replaced by the default budget; a budget below a verification step failed after the plain runs
    ("spec-cost", ["--max-num-batched-tokens", "0", *SMALL_SPEC_COST], "--max-num-batched-tokens"),
    ("spec-cost", [*SMALL_SPEC_COST, "--max-num-batched-tokens", "8", "--concurrency", "2", "--k", "4"],
     "--max-num-batched-tokens"),
    # a missing drafter failed after the plain runs, named as --speculative-config; "" meant no drafter
    ("spec-cost", ["--drafter", "/nonexistent", *SMALL_SPEC_COST], "--drafter"),
    ("spec-cost", ["--drafter", "", *SMALL_SPEC_COST], "--drafter"),
])
def test_bench_commands_refuse_bad_flags_in_one_line(tiny, capsys, command, flags, flag):
    from minillm.bench.__main__ import main

    device = ["--device", "cpu"]
    _refused(capsys, main, [command, str(tiny), *device, *flags], flag)


def test_spec_cost_names_its_own_flags_in_a_pool_too_large(tiny, capsys):
    """spec-cost sizes the engine from --concurrency and the lengths; a pool too large for the RAM said
    "lower --max-num-seqs", a flag spec-cost does not take, without saying what set it."""
    from minillm.bench.__main__ import main

    _refused(capsys, main, ["spec-cost", str(tiny), "--device", "cpu", "--input-len", "8", "--output-len", "4",
                            "--concurrency", "1,30000000"],
             "--max-num-seqs is the largest --concurrency (30000000)")


def test_spec_cost_checks_k_against_the_drafters_block_first(tiny, tmp_path, capsys):
    """--k past the drafter's block (and a drafter config.json that does not parse) failed only once the
    plain runs were done; the drafter's config is read before them."""
    from minillm.bench.__main__ import main

    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 4}}))
    argv = ["spec-cost", str(tiny), "--device", "cpu", "--drafter", str(drafter), *SMALL_SPEC_COST]
    _refused(capsys, main, [*argv, "--k", "4"], "--k 4 is past the drafter's block: at most its block_size - 1 = 3")
    (drafter / "config.json").write_text("{")
    _refused(capsys, main, [*argv, "--k", "2"], f"--drafter {drafter}")


def test_spec_bench_reports_a_bad_model_or_device_in_one_line(tmp_path, capsys):
    from minillm.bench.spec import main

    _refused(capsys, main, [str(tmp_path / "no-such-model"), "--max-tokens", "4"], "no-such-model")
    with pytest.raises(SystemExit) as e:
        main(["--device", "bogus"])
    assert e.value.code == 2 and "--device" in capsys.readouterr().err


def test_spec_bench_on_the_cpu(tiny, tmp_path, capsys):
    """`python -m minillm.bench spec` end to end on the tiny model: lossless, and the JSON written."""
    from minillm.bench.spec import main

    out = tmp_path / "spec.json"
    assert main([str(tiny), "--device", "cpu", "--k", "2", "--max-tokens", "6", "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r) == {"none", "ngram", "self-draft"} and all(v["lossless"] for v in r.values())
    assert all(v["verdict"] == "yes" and v["departures"] == [] for v in r.values())
    table = capsys.readouterr().out
    assert table.splitlines()[0].endswith("lossless") and "departs" not in table
    assert [line.split()[-1] for line in table.splitlines()[1:4]] == ["yes", "yes", "yes"]


def test_spec_bench_sampled_on_the_cpu(tiny, tmp_path, capsys):
    """`bench spec --temperature`: sampled runs (no token comparison: "sampled"), a fourth one verifying
    the self-drafts as one-hot; against q the self-drafts are all but always accepted, one-hot far less
    (the tiny random model is nearly flat: p(d) is small). A bad temperature is refused."""
    from minillm.bench.spec import main

    out = tmp_path / "spec.json"
    assert main([str(tiny), "--device", "cpu", "--k", "2", "--max-tokens", "12", "--temperature", "1.0",
                 "--result-json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert set(r) == {"none", "ngram", "self-draft", "self-1hot"}
    assert all(v["verdict"] == "sampled" and v["lossless"] is None for v in r.values())
    assert r["self-draft"]["stats"]["acceptance_rate"] > 0.9 > 0.5 > r["self-1hot"]["stats"]["acceptance_rate"]
    capsys.readouterr()
    _refused(capsys, main, [str(tiny), "--device", "cpu", "--temperature", "-0.5"], "--temperature")


def test_spec_bench_judge_departure():
    """A departure is a near-tie when both tokens are in the scoring logits' top 3 and within 2% of
    the larger logit's magnitude (at least 0.02) of each other, whichever leads."""
    from minillm.bench.spec import judge_departure

    logits = np.array([10.0, 9.9, 8.0, 9.95, 9.97, -5.0, -5.05, 0.1, 0.09, 0.05], dtype=np.float32)
    tie = judge_departure(logits, 0, 4)  # runner-up, 0.03 behind: within 0.2
    assert tie["classification"] == "near-tie" and tie["spec_rank"] == 2
    assert (tie["base_token"], tie["spec_token"]) == (0, 4)
    assert tie["base_logit"] == pytest.approx(10.0) and tie["spec_logit"] == pytest.approx(9.97)
    assert tie["gap"] == pytest.approx(0.03, abs=1e-5)
    assert judge_departure(logits, 0, 3)["classification"] == "near-tie"  # third, 0.05 behind
    far = judge_departure(logits, 0, 2)  # 2.0 behind: a wrong token, not rounding
    assert far["classification"] == "wrong" and far["gap"] == pytest.approx(2.0)
    fourth = judge_departure(logits, 0, 1)  # 0.1 behind, within the gap, but fourth
    assert fourth["spec_rank"] == 4 and fourth["classification"] == "wrong"
    # a negative gap: the scoring logits prefer the speculative token; a near-tie only while the
    # plain token is close behind it (far behind, the plain run is the suspect one)
    ahead = judge_departure(logits, 4, 0)
    assert ahead["gap"] == pytest.approx(-0.03, abs=1e-5) and ahead["spec_rank"] == 1
    assert ahead["classification"] == "near-tie"
    assert judge_departure(logits, 5, 0)["classification"] == "wrong"  # gap -15
    assert judge_departure(logits, 1, 0)["classification"] == "wrong"  # gap -0.1, but the plain token 4th
    assert judge_departure(logits, 5, 6)["classification"] == "wrong"  # gap 0.05, ranked 7th
    # the allowed gap scales with the logit's magnitude (a negative one too), with a floor of 1.0
    small = np.array([0.1, 0.09, 0.05, -1.0])
    assert judge_departure(small, 0, 1)["classification"] == "near-tie"  # 0.01 <= 0.02 * 1.0
    assert judge_departure(small, 0, 2)["classification"] == "wrong"  # 0.05 > 0.02 * 1.0
    negative = np.array([-5.0, -5.09, -5.11, -9.0])
    assert judge_departure(negative, 0, 1)["classification"] == "near-tie"  # 0.09 <= 0.02 * 5
    assert judge_departure(negative, 0, 2)["classification"] == "wrong"  # 0.11 > 0.1


def _altered_spec_runs(monkeypatch, alter):
    """Wrap minillm.bench.spec.run so that alter(name, token_ids) edits each speculative run's
    outputs, as if it had departed (float32 speculation on the CPU never does); returns the plain
    run's outputs, filled in when it runs."""
    from minillm.bench import spec

    real, base = spec.run, []

    def run(model, cfg, max_tokens, device, *args, **kwargs):
        r, llm = real(model, cfg, max_tokens, device, *args, **kwargs)
        if cfg is None:
            base.extend(r["token_ids"])
        else:
            alter("ngram" if cfg["method"] == "ngram" else "self-draft", r["token_ids"])
        return r, llm

    monkeypatch.setattr(spec, "run", run)
    return base


def _scorer(tiny):
    """A plain LLM whose logits buffer takes a whole prompt, so engine.score gives the reference
    logits (the bench's own LLM scores only the last row)."""
    from minillm import LLM
    from minillm.bench.spec import PROMPTS

    llm = LLM(str(tiny), device="cpu", max_model_len=1024, max_num_seqs=256)
    return llm, [llm.tokenizer.encode_chat(m) for m in PROMPTS]


def test_spec_bench_reports_a_wrong_departure(tiny, tmp_path, capsys, monkeypatch):
    """ngram's second output takes the plain model's least likely token at position 2: a wrong
    token, so ngram's verdict is NO and the bench exits 1. self-draft's first output stops after
    3 tokens, a strict prefix of the plain one: its token at 3 is its stop, the likeliest EOS id."""
    from minillm.bench.spec import main

    ref, prompts = _scorer(tiny)

    def alter(name, ids):
        if name == "ngram":
            ids[1] = ids[1][:2] + [int(np.argmin(ref.engine.score([prompts[1] + ids[1][:2]])[0][-1]))]
        else:
            ids[0] = ids[0][:3]

    base = _altered_spec_runs(monkeypatch, alter)
    out = tmp_path / "spec.json"
    assert main([str(tiny), "--device", "cpu", "--k", "2", "--max-tokens", "6", "--result-json", str(out)]) == 1
    assert len(base[0]) > 3 and len(base[1]) > 2
    r = json.loads(out.read_text())
    assert r["none"]["verdict"] == "yes" and r["none"]["departures"] == []
    ng = r["ngram"]
    assert ng["lossless"] is False and ng["verdict"] == "NO" and len(ng["departures"]) == 1
    d = ng["departures"][0]
    logits = ref.engine.score([prompts[1] + base[1][:2]])[0][-1]
    assert (d["prompt"], d["position"], d["base_token"]) == (1, 2, base[1][2])
    assert d["spec_token"] == int(np.argmin(logits)) and d["spec_rank"] > 3 and d["classification"] == "wrong"
    assert d["base_logit"] == pytest.approx(float(logits[base[1][2]]), rel=1e-4, abs=1e-4)
    assert d["gap"] == pytest.approx(d["base_logit"] - d["spec_logit"]) and d["gap"] > 0
    sd = r["self-draft"]
    assert sd["lossless"] is False and len(sd["departures"]) == 1
    d = sd["departures"][0]
    logits = ref.engine.score([prompts[0] + base[0][:3]])[0][-1]
    eos = max(ref.engine.eos_ids, key=lambda t: logits[t])
    assert (d["prompt"], d["position"], d["base_token"], d["spec_token"]) == (0, 3, base[0][3], eos)
    assert sd["verdict"] == {"near-tie": "near-tie", "wrong": "NO"}[d["classification"]]
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[-1] for line in printed.splitlines()[1:4]}
    assert rows == {"none": "yes", "ngram": "NO", "self-draft": sd["verdict"]}
    assert f"ngram departs on prompt 1 at token 2: none {base[1][2]}" in printed
    assert f"self-draft departs on prompt 0 at token 3: none {base[0][3]}" in printed
    assert printed.count(" departs on ") == 2 and ": wrong" in printed


@pytest.mark.parametrize("scale, rc, verdict", [(1.01, 0, "near-tie"), (0.99, 1, "NO")])
def test_spec_bench_passes_a_near_tie(tiny, tmp_path, capsys, monkeypatch, scale, rc, verdict):
    """self-draft's third output takes the plain model's runner-up at position 1, and TIE is set
    just above that gap (relative to the top logit): a near-tie, so the verdict is near-tie and the
    bench exits 0. Just below it, the same departure is wrong: NO, and exit 1."""
    from minillm.bench import spec

    ref, prompts = _scorer(tiny)

    def alter(name, ids):
        if name == "self-draft":  # judged after every run, so TIE may be set here
            logits = ref.engine.score([prompts[2] + ids[2][:1]])[0][-1]
            second, top = np.sort(logits)[-2:]
            ids[2] = ids[2][:1] + [int(np.argsort(logits)[-2])]
            monkeypatch.setattr(spec, "TIE", scale * float(top - second) / max(abs(float(top)), 1.0))

    _altered_spec_runs(monkeypatch, alter)
    out = tmp_path / "spec.json"
    assert spec.main([str(tiny), "--device", "cpu", "--k", "2", "--max-tokens", "6", "--result-json", str(out)]) == rc
    r = json.loads(out.read_text())
    assert spec.TIE != 0.02 and r["ngram"]["verdict"] == "yes"
    sd = r["self-draft"]
    assert sd["verdict"] == verdict and sd["lossless"] is False
    assert [(d["prompt"], d["position"], d["spec_rank"]) for d in sd["departures"]] == [(2, 1, 2)]
    assert sd["departures"][0]["gap"] > 0
    assert capsys.readouterr().out.splitlines()[3].split()[-1] == verdict


def test_spec_cost_explains_a_departure(tiny):
    """explain_divergence reruns both paths with logprobs and reports, at the first token where an
    oracle run left the all-rejected run, each token's logprob gap in each run. Float32 on the CPU
    never departs, so the oracle's output here is the greedy path with one token swapped for the
    runner-up: the reruns reproduce the greedy path (not the swapped one), and the gap is the
    greedy token's lead over the runner-up in both."""
    from minillm.bench.spec_cost import OracleProposer, decode_steps, explain_divergence, logprob_paths
    from minillm.engine.engine import LLMEngine

    engine = LLMEngine(model=str(tiny), device="cpu", max_num_seqs=2, seed=0, max_model_len=64,
                       enable_prefix_caching=False, speculative_config={"method": "ngram",
                                                                         "num_speculative_tokens": 3})
    vocab = engine.config.vocab_size
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    engine.proposer = OracleProposer({"r0": [], "r1": []}, 0.0, vocab)  # every draft wrong
    _, _, greedy = decode_steps(engine, prompts, 8)
    engine.proposer = OracleProposer(greedy, 0.0, vocab)
    lps = logprob_paths(engine, prompts, 8, 20)["r1"][1]
    runner_up = lps[4].top[1][0]
    outs = {"r0": greedy["r0"], "r1": greedy["r1"][:4] + [runner_up] + greedy["r1"][5:]}
    found = explain_divergence(engine, prompts, greedy, outs, 0.5, vocab, 8)
    assert len(found) == 1
    d = found[0]
    assert (d["request"], d["position"], d["all_rejected_token"], d["oracle_token"]) == \
        ("r1", 4, greedy["r1"][4], runner_up)
    lead = lps[4].logprob - lps[4].top[1][1]
    assert lead > 0
    assert d["gap_all_rejected_run"] == pytest.approx(lead) and d["gap_oracle_run"] == pytest.approx(lead)
    for top in (d["top_all_rejected_run"], d["top_oracle_run"]):  # each run's three best, best first
        assert [t for t, _ in top] == [t for t, _ in lps[4].top[:3]]
        assert top[0][0] == greedy["r1"][4] and top[1][0] == runner_up and top[0][1] >= top[1][1] >= top[2][1]
    assert d["reproduced"] is False  # the oracle's rerun follows the greedy path, not the swapped one


# ---- lengths past the context, flags named by the command that took them --------------------------
# the tiny model's context is 4096 positions
@pytest.mark.parametrize("command, flags, flag", [
    # an explicit context too short for the request failed in add_request with a traceback
    ("decode", ["--input-len", "8", "--output-len", "20", "--max-model-len", "28"],
     "--max-model-len 28 is below --input-len 8 + --output-len 20 + 1 = 29"),
    # the derived context past the model's was reported as "--max-model-len 4106 exceeds ...", a flag not given
    ("decode", ["--input-len", "4000", "--output-len", "90"],
     "--input-len 4000 + --output-len 90 (+ 16 spare) = 4106 positions exceed the model's context (4096"),
    ("spec-cost", ["--input-len", "5000", "--output-len", "4", "--concurrency", "1", "--accept", "0"],
     "--input-len 5000 + --backoff-output-len 512 (+ 32 spare) = 5544 positions exceed the model's context"),
    # refused by the oracle's engine after the plain runs, as a traceback
    ("spec-cost", [*SMALL_SPEC_COST, "--k", "5000"], "--k 5000 must be below the runs' context"),
    # SamplingParams refused it after the model loaded, as "temperature must be ..."
    ("throughput", ["--num-seqs", "2", "--min-len", "4", "--max-len", "8", "--temperature", "nan"], "--temperature"),
    # generate refused it after the warm-up, naming max_tokens
    ("throughput", ["--num-seqs", "2", "--min-len", "4", "--max-len", "3000"], "--max-len 3000"),
    ("throughput", ["--num-seqs", "2", "--min-len", "4", "--max-len", "8", "--max-model-len", "10"], "--max-len 8"),
    ("spec", ["--max-tokens", "5000"], "--max-tokens 5000"),
    ("spec", ["--k", "5000"], "--k must be >= 1 and below the runs' context of 1024"),  # named --speculative-config
])
def test_bench_commands_name_their_own_length_flags(tiny, capsys, command, flags, flag):
    from minillm.bench.__main__ import main

    _refused(capsys, main, [command, str(tiny), "--device", "cpu", *flags], flag)


def test_context_error_keeps_other_errors():
    e = ValueError("--max-model-len 50 exceeds the model's context (max_position_embeddings 40); lower it")
    assert report.context_error(e, "--input-len 30 + --output-len 4", 50, 16) == (
        "--input-len 30 + --output-len 4 (+ 16 spare) = 50 positions exceed the model's context (40 positions); "
        "give lengths that sum to at most 24")
    assert report.context_error(ValueError("no such model"), "--input-len 1", 50, 16) == "no such model"


def test_spec_cost_context_names_backoff_output_len(tiny, capsys):
    """Every run's context holds --backoff-output-len (default 512) too, as every recorded round was measured
    (the block tables' width sets the decode attention's plans): a long --input-len past the model's context
    is refused with that flag in the sum, so the user knows what to lower."""
    from minillm.bench.spec_cost import main

    _refused(capsys, main, [str(tiny), "--device", "cpu", "--input-len", "3800", "--output-len", "4",
                            "--concurrency", "1", "--accept", "0"], "--backoff-output-len 512")


def test_spec_cost_with_one_concurrency_runs_its_curve_once(tiny, tmp_path):
    """(cs[0], cs[-1]) with one concurrency ran the oracle's curve twice: each point twice in the result."""
    from minillm.bench.spec_cost import main

    out = tmp_path / "r.json"
    assert main([str(tiny), "--device", "cpu", *SMALL_SPEC_COST, "--accept", "0,1", "--result-json", str(out)]) == 0
    points = [(s["concurrency"], s["accept_prob"]) for s in json.loads(out.read_text())["speedup"]]
    assert points == [(1, 0.0), (1, 1.0)]


def test_throughput_refuses_one_file_for_result_and_profile(tiny, tmp_path, capsys):
    """The result was written over the profile after "wrote" had been printed for it."""
    from minillm.bench.throughput import main

    small = [str(tiny), "--device", "cpu", "--num-seqs", "2", "--min-len", "4", "--max-len", "8"]
    (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    for profile in ("r.json", "./r.json", "link.json"):
        _refused(capsys, main, [*small, "--result-json", str(tmp_path / "r.json"), "--profile-json",
                                str(tmp_path / profile)], "is the file of --result-json")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("command, flags, flag", [
    ("hf", ["--input-len", "8", "--output-len", "4", "--compile-mode", "max-autotune"],
     "--compile-mode max-autotune needs --compile"),  # ignored without --compile
    # transformers only warned and timed positions past the context
    ("hf", ["--input-len", "4000", "--output-len", "97"], "= 4097 tokens exceed the model's context (4096"),
    ("hf-batch", ["--num-seqs", "1", "--min-len", "4", "--max-len", "2049"], "--max-len 2049"),
])
def test_hf_benches_refuse_bad_flags_in_one_line(tiny, capsys, command, flags, flag):
    pytest.importorskip("transformers")
    from minillm.bench.__main__ import main

    rc = main([command, str(tiny), "--device", "cpu", *flags])
    err = capsys.readouterr().err.strip().splitlines()  # transformers' loading bar may come first
    assert rc == 2 and err[-1].startswith("error: ") and flag in err[-1], err


@pytest.mark.parametrize("command", ["hf", "hf-batch"])
def test_hf_benches_refuse_cuda_without_a_gpu(tiny, capsys, command):
    """torch's AssertionError ("Torch not compiled with CUDA enabled") was a traceback."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from minillm.bench.__main__ import main

    _refused(capsys, main, [command, str(tiny), "--device", "cuda", "--num-seqs" if command == "hf-batch" else
                            "--input-len", "2"], "--device cuda: torch")


@pytest.mark.parametrize("command", ["hf", "hf-batch"])
def test_hf_benches_refuse_what_is_not_a_model_in_one_line(tmp_path, capsys, command):
    """A truncated GGUF was transformers' struct.error traceback; a folder without a model was, in
    hf-batch, three attention refusals ending in "no paged attention implementation accepted"."""
    pytest.importorskip("transformers")
    from minillm.bench.__main__ import main
    from minillm.models.loader import default_model_path

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(default_model_path()).read_bytes()[:100])
    _refused(capsys, main, [command, str(cut), "--device", "cpu"], "the GGUF file is truncated")
    _refused(capsys, main, [command, str(tmp_path), "--device", "cpu"], "Unrecognized model")


def test_hf_batch_reads_a_gguf_file(capsys):
    """hf-batch's default model, the embedded GGUF, was passed to transformers as a directory."""
    pytest.importorskip("transformers")
    from minillm.bench.__main__ import main

    assert main(["hf-batch", "--device", "cpu", "--num-seqs", "1", "--min-len", "2", "--max-len", "4"]) == 0
    assert "1/1 finished, 4 tokens" in capsys.readouterr().out


def test_hf_decode_rate_refuses_a_run_lost_in_the_noise():
    """--output-len 2 on a small model: the 2-token run often took less than the 1-token run, and a
    negative tok/s was reported (and written) as the reference."""
    from minillm.bench.hf_reference import decode_rate

    assert decode_rate(5, 3.0, 1.0) == pytest.approx(2.0)
    for full in (1.0, 0.5):
        with pytest.raises(ValueError, match="give a larger --output-len"):
            decode_rate(2, full, 1.0)
