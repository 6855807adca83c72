"""Random request bodies against the real server (hypothesis): a valid completions, chat or
Responses request with one to three fields set to random JSON values (the API's own field names,
nested lists and objects, unicode, huge and negative numbers, NaN and Infinity as Python's json
writes them), and Responses input items with random fields, sent streamed or not. Whatever comes
in, the answer is a 4xx with the OpenAI error body or a 200 whose body parses (a stream ends with
[DONE], a Responses stream with its response's last event); never a 5xx, a hang or a dead engine,
and the server still answers a plain request after all of it. tests/test_server_errors.py names
each bad field's 400; this is the net under what nobody listed.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import Server

from hf_models import make_tiny

COMMON = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed",
          "stop", "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
          "logprobs", "min_tokens", "ignore_eos", "stream", "stream_options", "response_format",
          "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "skip_special_tokens", "include_stop_str_in_output", "prompt_logprobs", "user", "truncate_prompt_tokens",
          "allowed_token_ids", "return_tokens_as_token_ids", "bad_words", "logits_processors", "priority",
          "guided_whitespace_pattern"]
COMPLETION = COMMON + ["prompt", "echo", "suffix", "best_of", "use_beam_search"]
CHAT = COMMON + ["messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs", "chat_template_kwargs",
                 "add_generation_prompt", "continue_final_message", "include_reasoning", "chat_template", "documents",
                 "functions", "function_call"]
RESPONSES = ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "seed", "stop",
             "stream", "stream_options", "text", "tools", "tool_choice", "parallel_tool_calls", "metadata",
             "previous_response_id", "reasoning", "include", "truncation", "top_logprobs", "background", "store",
             "structured_outputs", "chat_template_kwargs", "logit_bias", "min_tokens", "priority", "n"]
INPUT_ITEM = ["type", "role", "content", "call_id", "name", "arguments", "output", "id", "status"]

scalars = (st.none() | st.booleans() | st.integers(-3, 300) | st.integers(-(2 ** 70), 2 ** 70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["", "auto", "none", "required", "user", "assistant", "json_object", "json_schema",
                              "function", "<think>", "</think>", "\ud800"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(["type", "role", "content", "name", "json", "regex",
                                                         "choice", "schema", "function", "parameters",
                                                         "include_usage", "tool_calls", "x", "format", *INPUT_ITEM])
                                        | st.text(max_size=6),
                                        inner, max_size=4), max_leaves=10)


def bodies(chat: bool, responses: bool = False):
    if responses:
        base, fields = {"input": "hi", "max_output_tokens": 3}, RESPONSES
    elif chat:
        base, fields = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, CHAT
    else:
        base, fields = {"prompt": "hi", "max_tokens": 3}, COMPLETION
    edits = st.lists(st.tuples(st.sampled_from(fields) | st.text(max_size=8), values), min_size=1, max_size=3)
    return edits.map(lambda kv: {**base, **dict(kv)})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path: Path = tmp_path_factory.mktemp("tiny-qwen3")
    make_tiny("qwen3", path)
    # priority scheduling, so that random priorities (huge and negative ones too) reach the scheduler
    srv = Server(path, tmp_path_factory.mktemp("log") / "server.log", "--max-model-len", "128",
                 "--max-num-seqs", "8", "--reasoning-parser", "qwen3", "--scheduling-policy", "priority")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.text()


def check_answer(r: httpx.Response, body: dict) -> None:
    where = f"{r.status_code} for {body!r}: {r.text[:400]}"
    assert r.status_code < 500, where
    if r.status_code != 200:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], where
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        if "/v1/responses" in str(r.url):  # typed events, the last one the response as it ended
            last = json.loads(events[-1])
            assert last["type"] in ("response.completed", "response.incomplete"), where
            assert [json.loads(e)["sequence_number"] for e in events] == list(range(len(events))), where
            return
        assert events and events[-1] == "[DONE]", where
        for e in events[:-1]:
            json.loads(e)
        return
    if "/v1/responses" in str(r.url):
        assert r.json()["status"] in ("completed", "incomplete") and r.json()["output"], where
        return
    assert isinstance(r.json()["choices"], list), where


def send(server, path: str, body: dict) -> httpx.Response:
    # Python's json writes NaN / Infinity as bare words, which the server must refuse, not trip on
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    return httpx.post(f"{server.url}{path}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies(chat=False))
def test_random_completion_bodies(server, body):
    check_answer(send(server, "/v1/completions", body), body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies(chat=True))
def test_random_chat_bodies(server, body):
    check_answer(send(server, "/v1/chat/completions", body), body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies(chat=True, responses=True) | st.builds(lambda items: {"input": items, "max_output_tokens": 3},
                                                          st.lists(st.dictionaries(st.sampled_from(INPUT_ITEM),
                                                                                   values, max_size=5),
                                                                   min_size=1, max_size=3)))
def test_random_responses_bodies(server, body):
    """Random Responses fields, and random input items (their own keys, random values)."""
    check_answer(send(server, "/v1/responses", body), body)


def test_still_serving_after_the_fuzz(server):
    """Runs after the three above (file order): the engine took all of it and still generates."""
    assert httpx.get(f"{server.url}/health").status_code == 200
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True},
                   timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert " ERROR " not in server.text(), server.text()[-3000:]  # no engine fault, no unhandled error
