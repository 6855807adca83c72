"""Bad input never reaches the engine and never gets a 5xx: every case gets a 4xx with the OpenAI
error body, and the engine's prompt-token counter does not move. Also the API key, 404/405/413,
and `python -m minillm.serve` refusing bad flags with one line and exit code 2.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from test_server import ROOT, Server

from hf_models import make_tiny

KEY = "sk-test-minillm"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3")
    make_tiny("qwen3", path)
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    srv = Server(model_dir, tmp_path_factory.mktemp("log") / "server.log", "--api-key", KEY,
                 "--served-model-name", "tiny", "tiny-alias", "--max-model-len", "256")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.text()


def post(server, path: str, body, headers=AUTH) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{server.url}{path}", content=body, headers={**headers, "Content-Type": "application/json"})
    return httpx.post(f"{server.url}{path}", json=body, headers=headers)


def check_error(r: httpx.Response, status: int, param: str | None = "?") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "?":
        assert err["param"] == param, err
    return err


OK = {"prompt": "hi", "max_tokens": 2}
LONG = [65] * 250
COMPLETION_CASES = [
    (b'{"prompt": "hi", ', None),
    (b"[1, 2]", None),
    (b'{"prompt": "hi", "temperature": NaN}', None),
    (b"\xff\xfe", None),
    ({"max_tokens": 2}, "prompt"),
    ({"prompt": 123}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": {"text": "hi"}}, "prompt"),
    ({"prompt": [1, 256]}, "prompt"),
    ({"prompt": [1, -1]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": [1, 2.5]}, "prompt"),
    ({"prompt": ["a", 5]}, "prompt"),
    ({"prompt": [[65], []]}, "prompt"),
    ({"prompt": ["a"] * 257}, "prompt"),
    ({"prompt": ["a"] * 5, "n": 60}, "n"),
    ({**OK, "max_tokens": 0}, "max_tokens"),
    ({**OK, "max_tokens": -5}, "max_tokens"),
    ({**OK, "max_tokens": "8"}, "max_tokens"),
    ({**OK, "max_tokens": True}, "max_tokens"),
    ({**OK, "max_tokens": 2.5}, "max_tokens"),
    ({**OK, "temperature": -0.1}, "temperature"),
    ({**OK, "temperature": "hot"}, "temperature"),
    ({**OK, "temperature": True}, "temperature"),
    ({**OK, "top_p": 0}, "top_p"),
    ({**OK, "top_p": 1.5}, "top_p"),
    ({**OK, "top_p": False}, "top_p"),
    ({**OK, "top_k": -2}, "top_k"),
    ({**OK, "top_k": 1.5}, "top_k"),
    ({**OK, "min_tokens": -1}, "min_tokens"),
    ({**OK, "min_tokens": 3}, "min_tokens"),
    ({**OK, "seed": "x"}, "seed"),
    ({**OK, "seed": True}, "seed"),
    ({**OK, "stop": 5}, "stop"),
    ({**OK, "stop": ["ok", 1]}, "stop"),
    ({**OK, "stop": [""]}, "stop"),
    ({**OK, "stop_token_ids": [999]}, "stop_token_ids"),
    ({**OK, "stop_token_ids": "2"}, "stop_token_ids"),
    ({**OK, "ignore_eos": 1}, "ignore_eos"),
    ({**OK, "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ({**OK, "n": 0}, "n"),
    ({**OK, "n": 65}, "n"),
    ({**OK, "n": True}, "n"),
    ({**OK, "n": 2, "best_of": 3}, "best_of"),
    ({**OK, "logprobs": 21}, "logprobs"),
    ({**OK, "logprobs": -1}, "logprobs"),
    ({**OK, "logprobs": True}, "logprobs"),
    ({**OK, "echo": "yes"}, "echo"),
    ({**OK, "echo": True, "logprobs": 21}, "logprobs"),
    ({**OK, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({**OK, "prompt_logprobs": -1}, "prompt_logprobs"),
    ({**OK, "prompt_logprobs": "2"}, "prompt_logprobs"),
    ({**OK, "prompt_logprobs": True}, "prompt_logprobs"),
    ({**OK, "prompt_logprobs": 1.5}, "prompt_logprobs"),
    ({**OK, "stream": True, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({**OK, "echo": True, "logprobs": 2, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({**OK, "max_tokens": 0, "echo": False}, "max_tokens"),
    ({**OK, "max_tokens": 0, "echo": True, "min_tokens": 1}, "min_tokens"),
    ({"prompt": [65] * 256, "max_tokens": 0, "echo": True, "logprobs": 1}, "prompt"),
    ({**OK, "best_of": 3}, "best_of"),
    ({**OK, "min_p": 1.5}, "min_p"),
    ({**OK, "min_p": -0.1}, "min_p"),
    ({**OK, "min_p": "0.1"}, "min_p"),
    ({**OK, "min_p": True}, "min_p"),
    ({**OK, "min_p": [0.1]}, "min_p"),
    ({**OK, "use_beam_search": True}, "use_beam_search"),
    ({**OK, "priority": 1}, "priority"),  # vLLM's fields that change what runs, refused rather than ignored
    ({**OK, "guided_json": {"type": "object"}, "guided_whitespace_pattern": " ?"}, "guided_whitespace_pattern"),
    ({**OK, "return_tokens_as_token_ids": "yes"}, "return_tokens_as_token_ids"),
    ({**OK, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),  # vLLM's: an integer >= 1 or -1
    ({**OK, "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({**OK, "truncate_prompt_tokens": 1.5}, "truncate_prompt_tokens"),
    ({**OK, "truncate_prompt_tokens": 4.0}, "truncate_prompt_tokens"),
    ({**OK, "truncate_prompt_tokens": True}, "truncate_prompt_tokens"),
    ({**OK, "truncate_prompt_tokens": "4"}, "truncate_prompt_tokens"),
    ({**OK, "truncate_prompt_tokens": [4]}, "truncate_prompt_tokens"),
    ({**OK, "max_tokens": 256, "truncate_prompt_tokens": -1}, "max_tokens"),  # -1 would keep no prompt token
    ({"prompt": LONG, "max_tokens": 7, "truncate_prompt_tokens": 250}, "max_tokens"),  # k keeps it all: no room
    ({"prompt": [[65], LONG], "max_tokens": 8, "truncate_prompt_tokens": 249}, "max_tokens"),
    ({**OK, "guided_json": {"type": "objec"}}, "guided_json"),  # structured outputs: constraints that do not compile
    ({**OK, "guided_json": "{not json"}, "guided_json"),
    ({**OK, "guided_json": [1]}, "guided_json"),
    ({**OK, "guided_regex": "[a-"}, "guided_regex"),
    ({**OK, "guided_regex": ""}, "guided_regex"),
    ({**OK, "guided_choice": []}, "guided_choice"),
    ({**OK, "guided_choice": ["a", 1]}, "guided_choice"),
    ({**OK, "guided_grammar": "start: foo"}, "guided_grammar"),
    ({**OK, "guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),  # two constraints
    ({**OK, "structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    ({**OK, "structured_outputs": {}}, "structured_outputs"),
    ({**OK, "structured_outputs": {"regex": "a+", "whitespace_pattern": " "}}, "structured_outputs"),
    ({**OK, "structured_outputs": "a+"}, "structured_outputs"),
    ({**OK, "structured_outputs": {"json_object": "yes"}}, "structured_outputs"),
    ({**OK, "response_format": {"type": "json_schema"}}, "response_format"),
    ({**OK, "guided_regex": "a+", "min_tokens": 2}, "min_tokens"),  # the grammar decides where output ends
    ({**OK, "guided_regex": "[^\\s\\S]"}, "guided_regex"),  # no text matches: found with the tokenizer
    ({**OK, "stream": True, "guided_regex": "[^\\s\\S]"}, "guided_regex"),  # a 400, not an error event
    ({**OK, "presence_penalty": 2.5}, "presence_penalty"),
    ({**OK, "frequency_penalty": "x"}, "frequency_penalty"),
    ({**OK, "repetition_penalty": 0}, "repetition_penalty"),
    ({**OK, "repetition_penalty": 1e-300}, "repetition_penalty"),  # 0 in float32: 1 / 0 logit scale
    ({**OK, "repetition_penalty": 1e39}, "repetition_penalty"),  # infinite in float32
    (b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e999}', "temperature"),  # inf
    ({**OK, "temperature": 1e39}, "temperature"),  # infinite in float32
    ({**OK, "top_p": 1e-320}, "top_p"),  # 0 in float32: top-p would keep no token
    ({**OK, "logit_bias": {"\u00b2": 5}}, "logit_bias"),  # str.isdigit, but not a token id
    ({**OK, "logit_bias": {"\uff11": 5}}, "logit_bias"),  # a fullwidth 1: int() takes it, JSON keys must be ASCII
    (b'{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),  # a lone surrogate: not text
    (b'{"prompt": "hi", "max_tokens": 2, "stop": ["\\udc00"]}', "stop"),
    (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "?"),  # deeper than the JSON parser recurses
    ({**OK, "logit_bias": {"x": 5}}, "logit_bias"),
    ({**OK, "logit_bias": {"1": 101}}, "logit_bias"),
    ({**OK, "logit_bias": {"1": True}}, "logit_bias"),
    ({**OK, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({**OK, "logit_bias": [1]}, "logit_bias"),
    ({**OK, "logit_bias": {"9" * 5000: 1}}, "logit_bias"),  # int() refuses over 4,300 digits: was a 500
    ({**OK, "best_of": True}, "best_of"),  # == 1, but not an integer
    ({**OK, "best_of": 1.0}, "best_of"),
    ({**OK, "best_of": []}, "best_of"),
    ({**OK, "best_of": {}}, "best_of"),
    ({**OK, "best_of": "1"}, "best_of"),
    ({**OK, "bad_words": [" "]}, "bad_words"),
    # constraints that compile, and whose first mask is fine, but whose first token meets a limit of
    # llguidance's (the bytes it forces after it): was a 500 "failed mid-output (after 0 output tokens)"
    ({**OK, "guided_grammar": 'root ::= "x" root'}, "guided_grammar"),
    ({**OK, "guided_regex": "(a{1000}){1000}"}, "guided_regex"),
    ({**OK, "structured_outputs": {"regex": "(a{1000}){1000}"}}, "structured_outputs"),
    ({**OK, "stream": True, "guided_grammar": 'root ::= "x" root'}, "guided_grammar"),
    ({**OK, "stream": "yes"}, "stream"),
    ({**OK, "stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ({**OK, "stream_options": []}, "stream_options"),
    ({**OK, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**OK, "stream": True, "stream_options": {"continuous_usage_stats": 1}}, "continuous_usage_stats"),
    ({**OK, "model": 5}, "model"),
    ({"prompt": [65] * 257}, "prompt"),
    ({"prompt": [65] * 256}, "prompt"),
    ({"prompt": LONG, "max_tokens": 7}, "max_tokens"),
]

MSG = [{"role": "user", "content": "hi"}]
CHAT_CASES = [
    ({"max_tokens": 2}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),  # vLLM's chat echo: not yet
    ({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}, "functions"),  # use tools
    ({"messages": [{"role": "user", "content": "hi"}], "function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "user", "content": "hi"}], "documents": [{"text": "x"}]}, "documents"),
    ({"messages": MSG, "chat_template": "{{ messages[0].content }}"}, "chat_template"),  # --chat-template's
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [1]}, "messages[0]"),
    (b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages"),  # a lone surrogate
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"messages": MSG, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": MSG, "max_tokens": False}, "max_tokens"),
    ({"messages": MSG, "logprobs": 1}, "logprobs"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"messages": MSG, "prompt_logprobs": [1]}, "prompt_logprobs"),
    ({"messages": MSG, "stream": True, "prompt_logprobs": -3}, "prompt_logprobs"),
    ({"messages": MSG, "tools": [{"type": "retrieval"}]}, "tools"),  # (tool calling: tests/test_tool_calling.py)
    ({"messages": MSG, "chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
    ({"messages": MSG, "chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"messages": MSG, "chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs"),
    ({"messages": MSG, "add_generation_prompt": "no"}, "add_generation_prompt"),
    ({"messages": MSG, "continue_final_message": 1}, "continue_final_message"),
    ({"messages": MSG, "continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"messages": [*MSG, {"role": "assistant", "content": ""}], "continue_final_message": True},
     "continue_final_message"),
    ({"messages": MSG, "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": MSG, "response_format": "json"}, "response_format"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
     "response_format"),
    ({"messages": MSG, "response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice"),
    ({"messages": MSG, "tool_choice": "required"}, "tool_choice"),
    ({"messages": MSG, "min_p": 2}, "min_p"),
    ({"messages": MSG, "logit_bias": {"9" * 5000: 1}}, "logit_bias"),
    ({"messages": MSG, "guided_grammar": 'root ::= "x" root'}, "guided_grammar"),
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "^(a{1000}){1000}$"}}}}, "response_format"),
    ({"messages": MSG, "min_p": "high"}, "min_p"),
    ({"messages": MSG, "temperature": -1}, "temperature"),
    ({"messages": [{"role": "user", "content": "x" * 300}]}, "messages"),
    ({"messages": MSG, "max_tokens": 250}, "max_tokens"),
    ({"messages": MSG, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"messages": MSG, "truncate_prompt_tokens": False}, "truncate_prompt_tokens"),
    ({"messages": MSG, "max_completion_tokens": 300, "truncate_prompt_tokens": -1}, "max_completion_tokens"),
]


# vLLM's utility routes (outside /v1: no API key, as in vLLM)
TOOLS = [{"type": "function", "function": {"name": "f"}}]
BAD_TOOLS = [{"type": "function", "function": {"name": "f g"}}]
UTILITY_CASES = [
    ("/tokenize", b'{"prompt": "hi", ', None),
    ("/tokenize", b"[1, 2]", None),
    ("/tokenize", b"\xff\xfe", None),
    ("/tokenize", b"", None),
    ("/tokenize", b'{"prompt": "\\udc00"}', "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": None, "messages": None}, "prompt"),
    ("/tokenize", {"prompt": "hi", "messages": MSG}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": [65, 66]}, "prompt"),
    ("/tokenize", {"prompt": ["hi"]}, "prompt"),
    ("/tokenize", {"prompt": "hi", "model": 5}, "model"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": 1}, "add_special_tokens"),
    ("/tokenize", {"prompt": "hi", "return_token_strs": 1}, "return_token_strs"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": "hi"}, "messages"),
    ("/tokenize", {"messages": [1]}, "messages[0]"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ("/tokenize", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/tokenize", {"messages": MSG, "add_generation_prompt": "no"}, "add_generation_prompt"),
    ("/tokenize", {"messages": MSG, "add_special_tokens": 0}, "add_special_tokens"),
    ("/tokenize", {"messages": MSG, "return_token_strs": "yes"}, "return_token_strs"),
    ("/tokenize", {"messages": MSG, "continue_final_message": True, "add_generation_prompt": True},
     "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "user", "content": " "}], "continue_final_message": True},
     "continue_final_message"),
    ("/tokenize", {"messages": MSG, "continue_final_message": "yes"}, "continue_final_message"),
    ("/tokenize", {"messages": MSG, "chat_template": "{{ messages }}"}, "chat_template"),
    ("/tokenize", {"messages": MSG, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ("/tokenize", {"messages": MSG, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ("/tokenize", {"messages": MSG, "tools": BAD_TOOLS}, "tools"),
    ("/detokenize", b"not json", None),
    ("/detokenize", b'{"tokens": [1, NaN]}', None),
    ("/detokenize", b'"tokens"', None),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"prompt": "hi"}, "tokens"),
    ("/detokenize", {"tokens": "65"}, "tokens"),
    ("/detokenize", {"tokens": {"0": 65}}, "tokens"),
    ("/detokenize", {"tokens": [65, 256]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [65, True]}, "tokens"),
    ("/detokenize", {"tokens": [65.0]}, "tokens"),
    ("/detokenize", {"tokens": ["65"]}, "tokens"),
    ("/detokenize", {"tokens": [[65]]}, "tokens"),
    ("/detokenize", {"tokens": [2**70]}, "tokens"),
    ("/detokenize", {"tokens": [65], "model": ["tiny"]}, "model"),
]


def prompt_tokens(server) -> float:
    return server.metrics()["minillm:prompt_tokens_total"]


@pytest.mark.parametrize("body,param", COMPLETION_CASES, ids=[str(i) for i in range(len(COMPLETION_CASES))])
def test_bad_completion_requests(server, body, param):
    before = prompt_tokens(server)
    check_error(post(server, "/v1/completions", body), 400, param)
    assert prompt_tokens(server) == before  # never reached the engine


@pytest.mark.parametrize("body,param", CHAT_CASES, ids=[str(i) for i in range(len(CHAT_CASES))])
def test_bad_chat_requests(server, body, param):
    before = prompt_tokens(server)
    check_error(post(server, "/v1/chat/completions", body), 400, param)
    assert prompt_tokens(server) == before


@pytest.mark.parametrize("path,body,param", UTILITY_CASES, ids=[str(i) for i in range(len(UTILITY_CASES))])
def test_bad_tokenize_requests(server, path, body, param):
    check_error(post(server, path, body, headers={}), 400, param)


def test_constraint_errors_name_the_field_once(server):
    for field in ("guided_regex", "structured_outputs"):
        value = "[a-" if field == "guided_regex" else {"regex": "[a-"}
        err = check_error(post(server, "/v1/completions", {**OK, field: value}), 400, field)
        assert err["message"].startswith(f"'{field}': the regex does not compile") and "structured_outputs:" not in \
            err["message"], err["message"]


def test_audit_messages_say_what_is_wrong(server):
    """Messages that named the wrong problem, or echoed a 5,000-character key whole."""
    err = check_error(post(server, "/v1/completions", {**OK, "best_of": "1"}), 400, "best_of")
    assert err["message"] == "'best_of' must be an integer, got \"1\""  # not "best_of other than n"
    err = check_error(post(server, "/v1/completions", {**OK, "best_of": True}), 400, "best_of")
    assert err["message"] == "'best_of' must be an integer, got true"
    err = check_error(post(server, "/v1/completions", {**OK, "n": 2, "best_of": 3}), 400, "best_of")
    assert "best_of other than n" in err["message"]
    assert post(server, "/v1/completions", {**OK, "n": 2, "best_of": 2}).status_code == 200
    err = check_error(post(server, "/v1/completions", {**OK, "bad_words": ["ok", " "]}), 400, "bad_words")
    assert "only whitespace" in err["message"] and "non-empty" not in err["message"], err["message"]
    err = check_error(post(server, "/v1/completions", {**OK, "logit_bias": {"9" * 5000: 1}}), 400, "logit_bias")
    assert err["message"].startswith("'logit_bias' keys must be token ids below 256") and len(err["message"]) < 120
    token = post(server, "/detokenize", {"tokens": [65]}).json()["prompt"]
    for key in ("65", "0065", "0" * 5000 + "65"):  # leading zeros: token 65, however many
        r = post(server, "/v1/completions", {**OK, "logit_bias": {key: 100}, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == token * 2, r.text
    for field, value, what in (("guided_grammar", 'root ::= "x" root', "Too many items"),
                               ("guided_regex", "(a{1000}){1000}", "too many expressions")):
        err = check_error(post(server, "/v1/completions", {**OK, field: value}), 400, field)
        assert err["message"].startswith(f"'{field}': the ") and what in err["message"], err["message"]
        assert "first token" in err["message"] and err["type"] == "invalid_request_error"
    # a constraint that is fine on its first token still serves
    r = post(server, "/v1/completions", {**OK, "guided_grammar": 'root ::= "x" "y"*', "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("x"), r.text


def test_tokenize_errors_name_the_problem(server):
    err = check_error(post(server, "/tokenize", {"prompt": "hi", "messages": MSG}), 400)
    assert err["message"] == "give either 'prompt' (text) or 'messages' (a chat), not both"
    err = check_error(post(server, "/tokenize", {"model": "tiny"}), 400)
    assert err["message"] == "'prompt' (text) or 'messages' (a chat) is required"
    err = check_error(post(server, "/tokenize", {"messages": MSG, "tools": BAD_TOOLS}), 400)
    assert err["message"] == "tools[0].function.name must be 1-64 letters, digits, underscores or dashes, got \"f g\""
    err = check_error(post(server, "/detokenize", {"tokens": [65, 256]}), 400)
    assert err["message"] == "'tokens' token ids must be integers in [0, 256); got 256"
    err = check_error(post(server, "/detokenize", {}), 400)
    assert err["message"] == "'tokens' is required: an array of token ids"
    # what is fine: an empty text, an empty list, a prompt longer than the context (counting it is the point)
    assert post(server, "/tokenize", {"prompt": ""}).json() == {"count": 0, "max_model_len": 256, "tokens": []}
    assert post(server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}
    long = post(server, "/tokenize", {"prompt": "x" * 1000, "continue_final_message": True, "tools": TOOLS})
    assert long.status_code == 200 and long.json()["count"] == 1000  # chat-only fields: ignored with a prompt
    ok = post(server, "/tokenize", {"messages": MSG, "continue_final_message": False, "tools": [],
                                    "chat_template_kwargs": {}, "add_generation_prompt": None})
    assert ok.status_code == 200 and ok.json()["count"] == len("<user>hi\n<assistant>")
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_messages_name_the_problem(server):
    err = check_error(post(server, "/v1/completions", {**OK, "suffix": "!"}), 400)
    assert "not supported yet" in err["message"]
    err = check_error(post(server, "/v1/completions", {**OK, "echo": True, "logprobs": 21}), 400)
    assert err["message"] == "'logprobs' must be between 0 and 20, got 21"
    err = check_error(post(server, "/v1/completions", {"prompt": LONG, "max_tokens": 7}), 400)
    assert err["code"] == "context_length_exceeded" and "256" in err["message"]
    err = check_error(post(server, "/v1/completions", {"prompt": ["hi", LONG], "max_tokens": 7}), 400, "max_tokens")
    assert "prompt 1 of the batch has 250" in err["message"]  # which of a batch's prompts is too long
    err = check_error(post(server, "/v1/completions", {"prompt": [[65], [65] * 256]}), 400, "prompt")
    assert err["message"].startswith("prompt 1 of the batch has 256 tokens")
    err = check_error(post(server, "/v1/chat/completions", {"messages": [{"role": "user"}]}), 400,
                      "messages[0].content")
    assert "missing" in err["message"]
    err = check_error(post(server, "/v1/completions", {**OK, "truncate_prompt_tokens": 0}), 400)
    assert err["message"].startswith("'truncate_prompt_tokens' must be an integer >= 1") and "-1" in err["message"]
    err = check_error(post(server, "/v1/completions", {**OK, "max_tokens": 300, "truncate_prompt_tokens": -1}), 400)
    assert err["message"].startswith("truncate_prompt_tokens -1 keeps max_model_len 256 - max_tokens 300")
    assert err["code"] == "context_length_exceeded"
    # the room for max_tokens is what the truncated prompt leaves: 256 - 249 = 7
    err = check_error(post(server, "/v1/completions", {"prompt": LONG, "max_tokens": 8, "truncate_prompt_tokens": 249}),
                      400, "max_tokens")
    assert "has 249 and max_tokens asks for 8" in err["message"] and "at most 7" in err["message"]
    err = check_error(post(server, "/v1/completions", {**OK, "top_p": 1e-100}), 400, "top_p")
    assert "float32" in err["message"] and "top_k=1" in err["message"]
    err = check_error(post(server, "/v1/completions", {**OK, "top_p": 1.5}), 400)
    assert "(0, 1]" in err["message"]
    err = check_error(post(server, "/v1/chat/completions", {"messages": MSG, "prompt_logprobs": 21}), 400)
    assert err["message"] == "'prompt_logprobs' must be between 0 and 20, got 21"
    err = check_error(post(server, "/v1/completions", {**OK, "prompt_logprobs": True}), 400)
    assert err["message"] == "'prompt_logprobs' must be an integer, got true"


def test_unknown_model_is_404(server):
    err = check_error(post(server, "/v1/completions", {**OK, "model": "gpt-4"}), 404, "model")
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        server.client(api_key=KEY).chat.completions.create(model="gpt-4", messages=MSG, max_tokens=2)
    for path, body in (("/tokenize", {"model": "gpt-4", "prompt": "hi"}),
                       ("/tokenize", {"model": "gpt-4", "messages": MSG}),
                       ("/detokenize", {"model": "gpt-4", "tokens": [65]})):
        err = check_error(post(server, path, body), 404, "model")
        assert err["code"] == "model_not_found" and "gpt-4" in err["message"]
    for name in ("gpt-4", "tiny/extra", "TINY"):
        err = check_error(httpx.get(f"{server.url}/v1/models/{name}", headers=AUTH), 404, "model")
        assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        server.client(api_key=KEY).models.retrieve("gpt-4")
    # the served names, each its own card; the utility routes take any of them
    cl = server.client(api_key=KEY)
    assert [cl.models.retrieve(n).id for n in ("tiny", "tiny-alias")] == ["tiny", "tiny-alias"]
    assert post(server, "/detokenize", {"model": "tiny-alias", "tokens": [65]}).status_code == 200


def test_served_names_and_unknown_fields(server):
    cl = server.client(api_key=KEY)
    assert [m.id for m in cl.models.list().data] == ["tiny", "tiny-alias"]
    r = post(server, "/v1/completions", {**OK, "model": "tiny-alias", "user": "me", "some_future_field": {"a": 1}})
    assert r.status_code == 200 and r.json()["model"] == "tiny-alias"
    r = post(server, "/v1/completions", {"prompt": [[65, 66]], "max_tokens": 1, "presence_penalty": 0})
    assert r.status_code == 200 and r.json()["model"] == "tiny"
    r = post(server, "/v1/chat/completions", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": None},
        {"role": "user", "content": "more", "name": "bob"}], "max_tokens": 1})
    assert r.status_code == 200


def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": f"Bearer{KEY}"}):
        err = check_error(post(server, "/v1/completions", OK, headers=headers), 401)
        assert err["code"] == "invalid_api_key"
    # the scheme's name is case-insensitive (RFC 9110)
    assert post(server, "/v1/completions", OK, headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    check_error(httpx.get(f"{server.url}/v1/models"), 401)
    check_error(httpx.get(f"{server.url}/v1/models/tiny"), 401)
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.retrieve("tiny")
    # vLLM's utility routes live outside /v1 and, as there, need no key
    assert post(server, "/tokenize", {"prompt": "hi"}, headers={}).status_code == 200
    assert post(server, "/detokenize", {"tokens": [65]}, headers={}).status_code == 200
    assert httpx.get(f"{server.url}/version").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes need no key
    assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_http_level_errors(server):
    check_error(httpx.get(f"{server.url}/v1/nope", headers=AUTH), 404)
    r = httpx.get(f"{server.url}/v1/completions", headers=AUTH)
    check_error(r, 405)
    assert "POST" in r.headers["Allow"]  # what the route takes
    check_error(httpx.get(f"{server.url}/tokenize"), 405)
    check_error(httpx.post(f"{server.url}/version"), 405)
    check_error(httpx.post(f"{server.url}/v1/models/tiny", headers=AUTH), 405)
    check_error(httpx.get(f"{server.url}/v1/models/", headers=AUTH), 404)
    r = post(server, "/tokenize", b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
    big = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'
    r = post(server, "/v1/completions", big)
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
    # the unread body ends the connection, and the 413 says so: a keep-alive client's next request
    # goes out on a new one (it failed 2 times in 15 with "Server disconnected without sending a response")
    with httpx.Client(base_url=server.url, headers=AUTH) as client:
        for _ in range(5):
            r = client.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
            assert r.status_code == 413 and r.headers["Connection"] == "close"
            assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_odd_bodies_and_names_get_clear_errors(server):
    """What a hand-written or generated body can hold beyond the fields' own checks, on the routes
    earlier audits left aside: an integer of 5,000 digits (the message was Python's advice to the
    server: "use sys.set_int_max_str_digits()"), a number beyond a double's range (json reads 1e999
    as infinity: an unknown field's was taken), a body nested deeper than any field needs, and a
    5,000-character model name (echoed whole in the 404)."""
    err = check_error(post(server, "/tokenize", b'{"prompt": "hi", "n": ' + b"9" * 5000 + b"}", headers={}), 400, None)
    assert err["message"] == "the request body holds an integer of more than 4300 digits; no field takes one that large"
    for path, body in (("/tokenize", b'{"prompt": "hi", "x": 1e999}'), ("/detokenize", b'{"tokens": [], "x": -1e999}'),
                       ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "x": {"y": [1e400]}}')):
        err = check_error(post(server, path, body), 400, "x")
        assert "beyond a double's range" in err["message"] and "1.8e308" in err["message"], err
    for path, body in (("/tokenize", {"prompt": "hi", "x": [[[[]]]]}), ("/detokenize", {"tokens": [], "x": {}})):
        assert post(server, path, body, headers={}).status_code == 200  # unknown fields: still ignored
    deep = b"[" * 300 + b"]" * 300
    err = check_error(post(server, "/tokenize", b'{"prompt": "hi", "x": ' + deep + b"}", headers={}), 400, "x")
    assert err["message"] == "'x' is nested too deeply: send at most 256 levels of arrays and objects"
    err = check_error(post(server, "/tokenize", b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}", headers={}), 400)
    assert "at most 256 levels" in err["message"]
    for r in (httpx.get(f"{server.url}/v1/models/{'m' * 5000}", headers=AUTH),
              post(server, "/tokenize", {"prompt": "hi", "model": "m" * 5000}, headers={}),
              post(server, "/v1/completions", {**OK, "model": "m" * 5000})):
        err = check_error(r, 404, "model")
        assert err["code"] == "model_not_found" and "(5000 characters)" in err["message"] and len(err["message"]) < 300
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("flags,words", [
    (["--max-num-batched-tokens", "4"], "--max-num-batched-tokens"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--num-blocks", "2", "--max-model-len", "256"], "--num-blocks"),
    (["--block-size", "12"], "--block-size"),
    (["--speculative-config", "{not json"], "--speculative-config"),
    (["--dtype", "bfloat16"], "--dtype"),
    (["--step-timeout", "0"], "--step-timeout"),  # every step would count as hung: the first request kills it
    (["--step-timeout", "nan"], "--step-timeout"),
    (["--shutdown-grace", "-5"], "--shutdown-grace"),
    (["--api-key", ""], "--api-key"),  # would look like auth on, and let every request in
    (["--host", ""], "--host"),
    (["--served-model-name", ""], "--served-model-name"),
])
def test_serve_refuses_bad_config_with_one_line(model_dir, flags, words):
    r = subprocess.run([sys.executable, "-m", "minillm.serve", str(model_dir), "--device", "cpu", "--port", "0",
                        *flags], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_serve_refuses_missing_model():
    r = subprocess.run([sys.executable, "-m", "minillm.serve", "/nonexistent/model", "--device", "cpu", "--port",
                        "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and "/nonexistent/model" in r.stderr


@pytest.mark.parametrize("body", [
    {**OK, "seed": -1}, {**OK, "seed": 2**64 - 1}, {**OK, "top_k": 2**40},
    {**OK, "temperature": 1e-320}, {**OK, "temperature": 1e38}, {**OK, "top_p": 1.2e-38},
    {**OK, "repetition_penalty": 1e-30, "logprobs": 2}, {**OK, "repetition_penalty": 2, "logprobs": 2},
    {**OK, "repetition_penalty": 1e6, "logprobs": 2}, {**OK, "repetition_penalty": 3.4e38, "logprobs": 2},
    {**OK, "min_tokens": 2, "stop_token_ids": [2]}, {**OK, "stop": list("abcdefgh")},
    b'{"prompt": "\\ud83d\\ude00 hi", "max_tokens": 2}',  # a surrogate pair: one character, fine
    {**OK, "use_beam_search": False, "guided_json": None},  # refused fields at their neutral values
    {**OK, "min_p": 0}, {**OK, "min_p": 1}, {**OK, "min_p": 1e-320, "temperature": 2.0},
])
def test_edge_values_are_served_and_the_engine_survives(server, body):
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert not re.search(r"\b(NaN|-?Infinity)\b", r.text), r.text  # not JSON: strict parsers refuse them
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_logprobs_and_penalties_served_with_speculation(model_dir, tmp_path):
    """A speculative server serves what the plain one does: logprobs, prompt logprobs, echo and
    penalties, streamed or not (the engine verifies drafts against the penalised rows)."""
    srv = Server(model_dir, tmp_path / "server.log", "--max-model-len", "256",
                 "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}')
    try:
        bodies = [
            ("/v1/completions", {**OK, "prompt_logprobs": 0}),
            ("/v1/completions", {**OK, "max_tokens": 0, "echo": True, "logprobs": 1}),
            ("/v1/completions", {**OK, "logprobs": 2, "repetition_penalty": 1.2}),
            ("/v1/completions", {**OK, "frequency_penalty": -0.5, "presence_penalty": 0.5}),
            ("/v1/chat/completions", {"messages": MSG, "prompt_logprobs": 2, "logprobs": True}),
            ("/v1/chat/completions", {"messages": MSG, "presence_penalty": 0.5}),
        ]
        for path, body in bodies:
            for stream in (False, True):
                r = post(srv, path, {**body, "stream": stream}, headers={})
                assert r.status_code == 200, r.text
                assert "error" not in r.text
        r = post(srv, "/v1/completions", {**OK, "max_tokens": 0, "echo": True, "logprobs": 1}, headers={})
        assert r.json()["choices"][0]["logprobs"]["token_logprobs"][0] is None
        r = post(srv, "/v1/chat/completions", {"messages": MSG, "prompt_logprobs": 2, "logprobs": True}, headers={})
        assert r.json()["prompt_logprobs"][0] is None and r.json()["choices"][0]["logprobs"]["content"]
        # vLLM's speculation counters: the accepted tokens by draft position add up to the accepted tokens
        m = srv.metrics()
        per_pos = [v for k, v in m.items() if k.startswith("minillm:spec_decode_num_accepted_tokens_per_pos_total")]
        assert m["minillm:spec_decode_num_drafts_total"] == m["minillm:spec_decode_rounds"] > 0
        assert m["minillm:spec_decode_num_draft_tokens_total"] >= m["minillm:spec_decode_num_accepted_tokens_total"]
        assert len(per_pos) == 2 and sum(per_pos) == m["minillm:spec_decode_num_accepted_tokens_total"]
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.text()


def test_out_of_range_seed(server):
    check_error(post(server, "/v1/completions", {**OK, "seed": 2**64}), 400, "seed")
