"""/metrics after real traffic (totals add up, one latency observation per request, vLLM's meanings)
and /detokenize's checks, on a real `python -m minillm.serve` subprocess (test_server's Server)."""

from __future__ import annotations

import time

import httpx
import pytest
from test_server import Server

from hf_models import make_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny("llama", path)
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    srv = Server(model_dir, tmp_path_factory.mktemp("log") / "server.log", env={"MINILLM_TEST_STEP_DELAY": "0.003"})
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def added(before: dict, after: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def reasons(m: dict) -> float:
    return sum(v for k, v in m.items() if k.startswith("minillm:request_success_total"))


def test_totals_match_usage_and_one_observation_per_request(server):
    before = server.metrics()
    usages = []
    base = {"prompt": "hello there", "max_tokens": 6, "ignore_eos": True}
    usages.append(httpx.post(f"{server.url}/v1/completions", json=base).json()["usage"])
    usages.append(httpx.post(f"{server.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True}).json()["usage"])
    with httpx.stream("POST", f"{server.url}/v1/completions",
                      json={**base, "stream": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
    usages.append(httpx.Response(200, content=chunks[-1][6:]).json()["usage"])
    after = server.wait_idle()
    assert added(before, after, "minillm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert added(before, after, "minillm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    assert added(before, after, 'minillm:request_success_total{finished_reason="length"}') == 3
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_time_per_output_token_seconds"):
        assert added(before, after, f"minillm:{h}_count") == 3, h
    assert after["minillm:num_requests_running"] == after["minillm:num_requests_waiting"] == 0


def test_time_per_output_token_is_vllms_inter_token_latency(server):
    """vLLM's time_per_output_token_seconds observes the gap between successive outputs of each
    engine request (one per decode step after the first token); the per-request mean is
    request_time_per_output_token_seconds, once per request."""
    before = server.metrics()
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "abc", "max_tokens": 9, "n": 2,
                                                         "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 18
    after = server.metrics()
    assert added(before, after, "minillm:time_per_output_token_seconds_count") == 2 * 8
    assert added(before, after, "minillm:request_time_per_output_token_seconds_count") == 1
    assert added(before, after, "minillm:time_per_output_token_seconds_sum") > 0


def test_aborted_stream_gets_one_e2e_observation(server):
    """A client gone mid-stream: counted as an abort, and its latency observed once, as every request
    counted in request_success is (e2e count == request_success sum)."""
    before = server.metrics()
    body = {"prompt": "a long one", "max_tokens": 480, "stream": True, "ignore_eos": True, "n": 2}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert sum(next(lines).startswith("data: ") for _ in range(6)) >= 3
    deadline = time.monotonic() + 5
    while (m := server.wait_idle())["minillm:e2e_request_latency_seconds_count"] == \
            before["minillm:e2e_request_latency_seconds_count"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert added(before, m, 'minillm:request_success_total{finished_reason="abort"}') == 1
    assert added(before, m, "minillm:e2e_request_latency_seconds_count") == 1
    assert added(before, m, "minillm:time_to_first_token_seconds_count") == 1
    assert m["minillm:e2e_request_latency_seconds_count"] == reasons(m)
    assert m["minillm:num_requests_running"] == m["minillm:num_requests_waiting"] == 0


def test_spec_decode_counters(model_dir, tmp_path):
    srv = Server(model_dir, tmp_path / "spec.log", "--speculative-config",
                 '{"method": "ngram", "num_speculative_tokens": 3}')
    try:
        before = srv.metrics()
        outs = [httpx.post(f"{srv.url}/v1/completions", json={"prompt": "abcabcabcabcabcabc", "max_tokens": 30,
                                                              "ignore_eos": True, "temperature": 0}).json()
                for _ in range(2)]
        m = srv.wait_idle()
    finally:
        assert srv.stop() == 0
    assert added(before, m, "minillm:generation_tokens_total") == sum(o["usage"]["completion_tokens"] for o in outs)
    drafts, drafted = m["minillm:spec_decode_num_drafts_total"], m["minillm:spec_decode_num_draft_tokens_total"]
    accepted = m["minillm:spec_decode_num_accepted_tokens_total"]
    per_pos = [m[f'minillm:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}}'] for j in range(3)]
    assert drafts > 0 and 0 < accepted <= drafted <= 3 * drafts
    assert sum(per_pos) == accepted and drafts >= per_pos[0] >= per_pos[1] >= per_pos[2]


@pytest.fixture(scope="module")
def padded_server(tmp_path_factory):
    """A model whose embedding has 300 rows while its tokenizer has 257 tokens (256 bytes and the
    special <|eot|> at 256): ids 257..299 have no text."""
    from tokenizers import AddedToken, Tokenizer

    path = tmp_path_factory.mktemp("tiny-padded")
    make_tiny("llama", path, vocab_size=300)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<|eot|>", special=True)])
    tok.save(str(path / "tokenizer.json"))
    srv = Server(path, tmp_path_factory.mktemp("log") / "padded.log")
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def test_detokenize_refuses_ids_without_a_token(padded_server):
    url = f"{padded_server.url}/detokenize"
    for ids in ([280], [104, 299], [257]):
        r = httpx.post(url, json={"tokens": ids})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tokens" and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(url, json={"tokens": [300]}).status_code == 400
    assert httpx.post(url, json={"tokens": [72, 256, 73]}).json() == {"prompt": "i<|eot|>j"}


def test_detokenize_skip_special_tokens(padded_server):
    url = f"{padded_server.url}/detokenize"
    tok = httpx.post(f"{padded_server.url}/tokenize", json={"prompt": "a<|eot|>b", "return_token_strs": True}).json()
    assert tok["tokens"] == [64, 256, 65] and tok["token_strs"] == ["a", "<|eot|>", "b"]
    assert httpx.post(url, json={"tokens": tok["tokens"]}).json() == {"prompt": "a<|eot|>b"}
    assert httpx.post(url, json={"tokens": tok["tokens"], "skip_special_tokens": False}).json() == \
        {"prompt": "a<|eot|>b"}
    assert httpx.post(url, json={"tokens": tok["tokens"], "skip_special_tokens": True}).json() == {"prompt": "ab"}
    r = httpx.post(url, json={"tokens": tok["tokens"], "skip_special_tokens": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "skip_special_tokens"


def test_a_request_counts_as_its_worst_choice():
    """n choices, one finished_reason: a client gone after choice 0 finished (choice 1 aborted) counted as
    "stop" before; an abort or error of any choice is the request's."""
    from minillm.server.metrics import request_reason

    assert request_reason(["stop", "abort"]) == "abort" and request_reason(["abort", "error"]) == "error"
    assert request_reason(["length", "stop"]) == "length" and request_reason(["stop"]) == "stop"
