"""OpenAI's Responses API (POST /v1/responses, minillm/server/responses.py).

On strings: the request rewritten as its chat body, and ResponseBuilder giving the same items
whether the output arrives whole or a character at a time. Then a real server on a tiny random
model with the qwen3 reasoning parser, driven by the official openai client: the output (steered
with a structured-outputs choice) as reasoning, message and function_call items, streamed events in
order that add up to the non-streamed response, a conversation with calls and their outputs
prefilling exactly what the chat endpoint prefills, incomplete at max_output_tokens, JSON schema
output, every malformed field a 400 naming it, and a failure mid-stream as an error event and
response.failed.
"""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import jsonschema
import openai
import pydantic
import pytest
from test_server import Server

from minillm.server import responses
from minillm.server.protocol import ModelInfo, ProtocolError, RequestBody, chat_prompt
from minillm.server.reasoning import ReasoningSplitter
from minillm.server.tools import HermesParser

from hf_models import make_tiny

THOUGHT = "<think>\nI ought to greet.\n</think>\n\nHello there!"
CALL = 'Let me look.\n<tool_call>{"name": "temp", "arguments": {"n": 4}}</tool_call>'
TEMP = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
TOOLS = [{"type": "function", "name": "temp", "description": "a temperature", "parameters": TEMP}]


def forced(text: str) -> dict:
    return {"structured_outputs": {"choice": [text]}}


# ---- the request as chat's ------------------------------------------------------------------
def test_request_becomes_its_chat_body():
    body = RequestBody({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5, "top_k": 3,
        "text": {"format": {"type": "json_schema", "name": "t", "schema": TEMP}}, "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "temp"}, "n": 3,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                               {"type": "input_text", "text": "b"}]},
                  {"type": "reasoning", "id": "rs_1", "summary": []},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
                  {"type": "function_call", "call_id": "c1", "name": "temp", "arguments": '{"n": 1}'},
                  {"type": "function_call", "call_id": "c2", "name": "temp", "arguments": ""},
                  {"type": "function_call_output", "call_id": "c1", "output": "20"},
                  {"type": "function_call", "call_id": "c3", "name": "temp", "arguments": "{}"}]})
    req = responses.chat_request(body)
    chat = dict(req.chat)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}], "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "temp", "arguments": '{"n": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "temp", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "20"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "temp", "arguments": "{}"}}]}]
    assert req.where == ["instructions", "input[0]", "input[2]", "input[5]", "input[6]"]
    assert chat["max_completion_tokens"] == 9 and (chat["temperature"], chat["top_k"]) == (0.5, 3)
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "t", "schema": TEMP,
                                                                              "strict": None}}
    assert chat["tools"] == [{"type": "function", "function": {"name": "temp", "description": "a temperature",
                                                              "parameters": TEMP}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "temp"}}
    assert "n" not in chat and body.unread() == ["n"]  # not a Responses field: named as ignored
    # a chat error comes back in the client's fields
    e = req.rename(ProtocolError("messages[3].content must be a string; 'max_completion_tokens' too", "messages[3]"))
    assert (e.message, e.param) == ("input[5].content must be a string; 'max_output_tokens' too", "input[5]")


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
    ({"input": "x", "background": True}, "background", "background"),
    ({"input": "x", "include": "all"}, "include", "an array of strings"),
    ({"input": "x", "reasoning": "high"}, "reasoning", "must be an object"),
    ({"input": "x", "truncation": "auto"}, "truncation", "auto"),
    ({"input": "x", "truncation": 5}, "truncation", "'truncation' 5 is not supported: only \"disabled\""),
    ({"input": "x", "stream_options": {"include_usage": True}}, "stream_options", "include_obfuscation"),
    ({}, "input", "required"),
    ({"input": []}, "input", "non-empty"),
    ({"input": [3]}, "input[0]", "must be an object"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "one of user"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content",
     "only text parts"),
    ({"input": [{"role": "user", "content": None}]}, "input[0].content", "a string or an array"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments", "must be a string"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]}, "input[0].arguments",
     "not JSON"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "the call it answers"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input[0].output", "a string"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stores none"),
    ({"input": [{"type": "web_search_call"}]}, "input[0].type", "not supported"),
    ({"input": "x", "instructions": ["a"]}, "instructions", "a string"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ({"input": "x", "tools": {"type": "function"}}, "tools", "an array"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice", "\"required\""),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "json_schema"),
    ({"input": "x", "text": "json"}, "text", "an object"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity", "not supported"),
    # wrong types of the refused scalar fields were taken as "asking for nothing" (empty containers, 0 for false)
    ({"input": "x", "previous_response_id": {}}, "previous_response_id", "stores no responses"),
    ({"input": "x", "previous_response_id": []}, "previous_response_id", "stores no responses"),
    ({"input": "x", "background": 0}, "background", "'background' 0 is not supported"),
    ({"input": "x", "truncation": {}}, "truncation", "'truncation' {} is not supported"),
    ({"input": "x", "stream_options": {"include_obfuscation": "yes"}}, "stream_options.include_obfuscation",
     "true or false"),
    # echoed back typed as strings (OpenAI's limits: 16 pairs, 64-character keys, 512-character values)
    ({"input": "x", "metadata": "tag"}, "metadata", "an object of string keys to string values"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata", "'metadata.k' must be a string"),
    ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16"),
    ({"input": "x", "metadata": {"k" * 65: "v"}}, "metadata", "keys take at most 64"),
    ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata", "got 513 characters"),
    ({"input": "x", "user": 5}, "user", "must be a string"),
    ({"input": "x", "store": "yes"}, "store", "true or false"),
    ({"input": "x", "include": ["message.output_text.logprob"]}, "include", "not one of OpenAI's"),
    # the flat Responses shape named (chat's check asked for a 'json_schema' key), name and strict checked
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": TEMP}}}, "text.format", "needs 'name'"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a b", "schema": TEMP}}}, "text.format",
     "needs 'name'"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "t", "schema": 5}}}, "text.format",
     "needs 'schema': a JSON schema object (give {\"type\": \"json_schema\", \"name\""),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "t", "schema": TEMP, "strict": "y"}}},
     "text.format", "'strict' must be true or false"),
    # tool_choice in the Responses shape, and the value the client sent
    ({"input": "x", "tools": TOOLS, "tool_choice": "maybe"}, "tool_choice", "{\"type\": \"function\", \"name\""),
    ({"input": "x", "tool_choice": {"type": "function", "name": "temp"}}, "tool_choice",
     "'tool_choice' {\"type\": \"function\", \"name\": \"temp\"} needs 'tools'"),
    ({"input": "x", "tools": [], "tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    # a call's output answers a call sent before it (nothing is stored to find it in)
    ({"input": [{"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "c9", "output": "1"}]},
     "input[1].call_id", "matches no function_call before it"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "1"},
                {"type": "function_call", "call_id": "c1", "name": "temp", "arguments": "{}"}]},
     "input[0].call_id", "matches no function_call"),
    # a call's own fields named (chat's check named a tool_calls entry the client never sent)
    ({"input": [{"type": "function_call", "call_id": "c", "name": "", "arguments": "{}"}]}, "input[0].name",
     "the name of the function called"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments",
     "must be a JSON object"),
])
def test_responses_only_fields_checked(body, param, words):
    with pytest.raises(ProtocolError) as e:
        responses.chat_request(RequestBody({"model": "m", **body}))
    assert e.value.param == param and words in e.value.message, e.value.message


def test_reasoning_effort_goes_to_the_template():
    """reasoning.effort is chat's reasoning_effort, which reaches the chat template as a variable
    (beside the caller's own: theirs win); a summary setting and include values that ask for nothing
    made here are taken and named as ignored."""
    req = responses.chat_request(RequestBody({
        "model": "m", "input": "x", "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"]}))
    assert req.chat["reasoning_effort"] == "low" and req.echo["reasoning"] == {"effort": "low", "summary": "auto"}
    assert req.ignored == ["include: reasoning.encrypted_content", "reasoning.summary"]
    seen = []

    class Tok:  # records what the template is given
        def encode_chat(self, messages, add_generation_prompt, add_special_tokens, template_kwargs, **kw):
            seen.append(template_kwargs)
            return [1]

    info = ModelInfo(names=["m"], max_model_len=64, vocab_size=8, tokenizer=Tok())
    chat_prompt({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"}, info)
    chat_prompt({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low",
                 "chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": False}}, info)
    assert seen == [{"reasoning_effort": "low"}, {"reasoning_effort": "high", "enable_thinking": False}]


def test_template_reads():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel

    from minillm.models.tokenizer import Tokenizer

    hf = HFTokenizer(WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok = Tokenizer(hf, chat_template="{% if reasoning_effort %}{{ reasoning_effort }}{% endif %}"
                                      "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert tok.template_reads("reasoning_effort") and tok.template_reads("messages")
    assert not tok.template_reads("tools") and not tok.template_reads("m")  # (m is the loop's own)
    tok.chat_template, tok._template = "{% for t in tools %}{{ t }}{% endfor %}", None  # set afterwards
    assert tok.template_reads("tools") and not tok.template_reads("reasoning_effort")


def test_neutral_values_pass():
    """What a client sends when it asks for nothing: accepted."""
    responses.chat_request(RequestBody({
        "model": "m", "input": "x", "previous_response_id": None, "background": False, "include": [],
        "reasoning": {"effort": None, "summary": None}, "truncation": "disabled", "top_logprobs": 0, "store": True,
        "stream_options": {"include_obfuscation": False}, "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tools": [], "metadata": {"a": "b"}}))
    # tool_choice "auto" (the default the Response object echoes) with no tools asks for nothing: not chat's 400
    for tools in (None, []):
        req = responses.chat_request(RequestBody({"model": "m", "input": "x", "tools": tools, "tool_choice": "auto"}))
        assert "tool_choice" not in req.chat and req.echo["tool_choice"] == "auto"
    # the limits themselves are fine, and a call's output after its call
    responses.chat_request(RequestBody({
        "model": "m", "metadata": {f"{i:064d}": "v" * 512 for i in range(16)}, "user": "u", "store": False,
        "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": ""},
                  {"type": "function_call_output", "call_id": "c", "output": "1"}]}))


# ---- the output as items ----------------------------------------------------------------------
def build(text: str, size: int, reasoning: bool = True, tools: bool = True, complete: bool = True):
    b = responses.ResponseBuilder("resp_x", ReasoningSplitter("qwen3") if reasoning else None,
                                  HermesParser() if tools else None)
    pieces = [text[k:k + size] for k in range(0, len(text), size)] or [""]
    for k, piece in enumerate(pieces):
        b.feed(piece, k == len(pieces) - 1)
    b.finish(complete)
    return b


def shape(output: list[dict]) -> list[tuple]:
    """The items without their random ids."""
    out = []
    for item in output:
        if item["type"] == "function_call":
            out.append(("function_call", item["name"], item["arguments"], item["status"]))
        else:
            out.append((item["type"], item["content"][0]["text"], item["status"]))
    return out


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_items_same_in_any_pieces(size):
    text = THOUGHT.replace("Hello there!", CALL + "\n")
    b = build(text, size)
    assert shape(b.output) == [("reasoning", "I ought to greet.", "completed"),
                               ("message", "Let me look.", "completed"),
                               ("function_call", "temp", '{"n": 4}', "completed")]
    events = b.take_events()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # what the deltas add up to is each item's text
    texts: dict[str, str] = {}
    for e in events:
        if e["type"].endswith(".delta"):
            texts[e["item_id"]] = texts.get(e["item_id"], "") + e["delta"]
    assert [texts[item["id"]] for item in b.output] == [
        "I ought to greet.", "Let me look.", '{"n": 4}']
    kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
    assert kinds == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.done",
                     "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.content_part.added", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.done",
                     "response.output_item.done"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [a["status"] for a in added] == ["in_progress"] * 3 and added[1]["content"] == []


def test_blank_content_opens_no_item_and_an_empty_output_gets_its_message():
    b = build('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n\n<tool_call>{"name": "b", "arguments": {}}'
              '</tool_call>\n', 3, reasoning=False)
    assert shape(b.output) == [("function_call", "a", "{}", "completed"), ("function_call", "b", "{}", "completed")]
    assert shape(build("", 1).output) == [("message", "", "completed")]
    assert shape(build("  \n", 1, tools=False).output) == [("message", "  \n", "completed")]
    # cut short: the item open at the end is incomplete, the ones before it complete
    assert shape(build("<think>\nhmm</think>Hel", 2, complete=False).output) == [
        ("reasoning", "hmm", "completed"), ("message", "Hel", "incomplete")]


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-responses")
    make_tiny("llama", path)
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    # the step delay keeps a long request in flight for the disconnect tests
    srv = Server(model_dir, tmp_path_factory.mktemp("log") / "server.log", "--served-model-name", "tiny",
                 "--reasoning-parser", "qwen3", env={"MINILLM_TEST_STEP_DELAY": "0.003"})
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def create(server, **kw):
    return server.client().responses.create(model="tiny", **{"input": "hi", "max_output_tokens": 80, **kw})


def streamed(server, **kw) -> tuple[list, dict]:
    """The stream's events (as dicts) and the response its last event carries."""
    events = [e.model_dump(exclude_none=True) for e in create(server, stream=True, **kw)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == [] and events[1]["type"] == "response.in_progress"
    return events, events[-1]["response"]


def test_reasoning_and_message_items(server):
    r = create(server, extra_body=forced(THOUGHT))
    assert r.status == "completed" and r.error is None and r.incomplete_details is None
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == "Hello there!"
    assert r.output[0].content[0].text == "I ought to greet."
    # usage: the same prompt and output tokens as the chat endpoint's for the same request
    chat = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   max_completion_tokens=80, extra_body=forced(THOUGHT))
    assert chat.choices[0].message.content == "Hello there!"
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert 0 < u.output_tokens_details.reasoning_tokens < u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0
    body = r.model_dump()
    assert (body["store"], body["tools"], body["tool_choice"], body["max_output_tokens"]) == (False, [], "auto", 80)


def test_stream_adds_up_to_the_response(server):
    whole = create(server, extra_body=forced(THOUGHT)).model_dump(exclude_none=True)
    events, final = streamed(server, extra_body=forced(THOUGHT))
    assert events[-1]["type"] == "response.completed" and final["status"] == "completed"
    strip = [{k: v for k, v in item.items() if k != "id"} for item in final["output"]]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]]
    assert final["usage"] == whole["usage"]
    deltas = [e for e in events if e["type"] in ("response.reasoning_text.delta", "response.output_text.delta")]
    assert len(deltas) > 6  # a token at a time
    assert "".join(e["delta"] for e in deltas if "reasoning" in e["type"]) == "I ought to greet."
    assert "".join(e["delta"] for e in deltas if "output_text" in e["type"]) == "Hello there!"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [d["id"] for d in done] == [item["id"] for item in final["output"]]


def test_instructions_are_the_system_message(server):
    r = create(server, instructions="Answer in French.", max_output_tokens=2)
    chat = server.client().chat.completions.create(model="tiny", max_tokens=2, messages=[
        {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.input_tokens > create(server, max_output_tokens=2).usage.input_tokens
    assert r.instructions == "Answer in French."


def test_incomplete_at_max_output_tokens(server):
    r = create(server, max_output_tokens=12, extra_body=forced(THOUGHT))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.status) for o in r.output] == [("reasoning", "incomplete")]
    events, final = streamed(server, max_output_tokens=12, extra_body=forced(THOUGHT))
    assert events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 12


def test_function_calls_and_the_next_turn(server):
    r = create(server, tools=TOOLS, max_output_tokens=200, extra_body=forced(CALL))
    assert [o.type for o in r.output] == ["message", "function_call"] and r.output_text == "Let me look."
    call = r.output[1]
    assert (call.name, json.loads(call.arguments), call.status) == ("temp", {"n": 4}, "completed")
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    events, final = streamed(server, tools=TOOLS, max_output_tokens=200, extra_body=forced(CALL))
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"n": 4}
    # the SDK's stream manager builds the response from the events and checks their order as it goes
    with server.client().responses.stream(model="tiny", input="hi", tools=TOOLS, max_output_tokens=200,
                                          extra_body=forced(CALL)) as stream:
        built = stream.get_final_response()
    assert [(o.type, o.status) for o in built.output] == [("message", "completed"), ("function_call", "completed")]
    assert built.output_text == "Let me look." and json.loads(built.output[1].arguments) == {"n": 4}
    # the next turn: the output items sent back, and the call's result
    turn = [{"role": "user", "content": "hi"}, *[o.model_dump(exclude_none=True) for o in r.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]
    r2 = create(server, input=turn, tools=TOOLS, max_output_tokens=3)
    chat = server.client().chat.completions.create(
        model="tiny", max_tokens=3, tools=[{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                                               if k != "type"}}],
        messages=[{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "Let me look.", "tool_calls": [
                      {"id": call.call_id, "type": "function", "function": {"name": "temp",
                                                                            "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "21 C"}])
    assert r2.usage.input_tokens == chat.usage.prompt_tokens


def test_forced_function_call_follows_its_schema(server):
    r = create(server, tools=TOOLS, tool_choice={"type": "function", "name": "temp"}, max_output_tokens=200)
    assert r.output[-1].type == "function_call" and r.output[-1].name == "temp"
    if r.status == "completed":  # (a random model may write digits until max_output_tokens)
        jsonschema.validate(json.loads(r.output[-1].arguments), TEMP)
    assert r.model_dump()["tool_choice"] == {"type": "function", "name": "temp"}
    # a stop string ends the call inside its arguments: the item is incomplete ("completed" before), streamed too
    kw = dict(tools=TOOLS, tool_choice={"type": "function", "name": "temp"}, extra_body={"stop": [":"]})
    r = create(server, **kw)
    assert r.output[-1].type == "function_call" and r.output[-1].status == "incomplete"
    assert ":" not in r.output[-1].arguments
    events, final = streamed(server, **kw)
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert done[-1]["item"]["status"] == "incomplete" and final["output"][-1]["arguments"] == r.output[-1].arguments


def test_json_schema_text_format(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = create(server, text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)

    class Answer(pydantic.BaseModel):  # the SDK's parse helper: a pydantic model as the schema, parsed back
        ok: bool  # (a random model may write an integer's digits until max_output_tokens: no integers here)

    parsed = server.client().responses.parse(model="tiny", input="hi", text_format=Answer, max_output_tokens=80)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Answer)


def test_bad_requests_name_the_field(server):
    """Through the server: the Responses fields named, chat's checks renamed into them."""
    cases = [
        ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens", "lower max_output_tokens"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens' must be >= 1"),
        ({"input": "x " * 600}, "input", "maximum context length"),
        ({"input": "hi", "temperature": "hot"}, "temperature", "must be a number"),
        ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools", "tools[0].name must be"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "'text.format'"),
        ({"input": [{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": 7}]},
         "input[1].call_id", "must be a string"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
        ({"input": "hi", "model": "other"}, "model", "does not exist"),
        ({"input": "hi", "reasoning": {"effort": 3}}, "reasoning.effort", "'reasoning.effort' must be a string"),
        ({"input": "hi", "top_logprobs": 25}, "top_logprobs", "between 0 and 20"),
        # not "must be a non-empty array": it is one, of reasoning items only
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "holds no message, only reasoning items"),
        ({"input": "hi", "logit_bias": {"9" * 5000: 1}}, "logit_bias", "token ids below"),  # was a 500
    ]
    for body, param, words in cases:
        for stream in (False, True):
            r = httpx.post(f"{server.url}/v1/responses", json={"model": "tiny", "stream": stream, **body})
            err = r.json()["error"]
            assert r.status_code in (400, 404) and err["param"] == param and words in err["message"], r.text
    with pytest.raises(openai.BadRequestError, match="stores no responses"):
        create(server, previous_response_id="resp_1")
    r = httpx.get(f"{server.url}/v1/responses/resp_123")
    assert r.status_code == 404 and "stores no responses" in r.json()["error"]["message"]


def test_refused_and_taken_as_openai_does(server):
    """Through the server and the official client: tool_choice "auto" with no tools (the default
    this server's own Response object echoes) is served, not a 400; metadata the Response object
    could not echo as strings, a call output answering no call, and a json_schema format without
    its name are 400s naming the field, streamed or not."""
    r = create(server, max_output_tokens=2, tool_choice="auto", tools=[])
    assert r.status in ("completed", "incomplete") and r.tool_choice == "auto" and r.tools == []
    cases = [(dict(metadata={"n": 1}), "metadata"), (dict(metadata={f"k{i}": "v" for i in range(17)}), "metadata"),
             (dict(input=[{"role": "user", "content": "hi"},
                          {"type": "function_call_output", "call_id": "call_x", "output": "2"}]), "input[1].call_id"),
             (dict(text={"format": {"type": "json_schema", "schema": TEMP}}), "text.format")]
    for kw, param in cases:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                create(server, stream=stream, **kw)
            assert e.value.body["param"] == param, e.value.body


def test_echoed_fields_that_json_cannot_carry_back(server):
    """Fields the Response object echoes (metadata, user, tools, reasoning) with a number beyond a
    double's range (json reads 1e999 as infinity: the 200 held a bare Infinity, which is not JSON)
    or nested ~900 deep (parsed, but encoding the echo was a RecursionError: a 500 after the
    generation, or a stream cut off without an error event): a 400 naming the field, before any work."""
    deep = "[" * 900 + "]" * 900
    cases = [(b'"metadata": {"k": 1e999}', "metadata", "beyond a double's range"),
             (b'"user": -1e999', "user", "beyond a double's range"),
             (b'"reasoning": {"summary": 1e999}', "reasoning", "beyond a double's range"),
             (f'"metadata": {{"k": {deep}}}'.encode(), "metadata", "nested too deeply"),
             (f'"reasoning": {{"summary": {deep}}}'.encode(), "reasoning", "nested too deeply"),
             (f'"tools": [{{"type": "function", "name": "f", "parameters": {{"type": "object", "x": {deep}}}}}]'
              .encode(), "tools", "nested too deeply")]
    for field, param, words in cases:
        for stream in (b"false", b"true"):
            r = httpx.post(f"{server.url}/v1/responses", content=b'{"input": "hi", "max_output_tokens": 2, "stream": '
                           + stream + b", " + field + b"}", headers={"Content-Type": "application/json"}, timeout=30)
            assert r.status_code == 400, r.text[:300]
            err = r.json()["error"]
            assert err["param"] == param and words in err["message"], err
    # what is fine still is, and echoed as sent
    r = create(server, max_output_tokens=2, metadata={"k": "v" * 512}, user="u")
    assert r.metadata == {"k": "v" * 512} and r.user == "u"


def test_stored_response_routes_name_the_id(server):
    """GET/DELETE /v1/responses/{id}, POST .../{id}/cancel, GET .../{id}/input_items: a 404 naming
    the id the client sent (it said 'resp_1/cancel'), a long one cut; POST
    /v1/responses/input_tokens (OpenAI's token count) is not an id: it points to /tokenize."""
    cl = server.client()
    for call in (lambda: cl.responses.retrieve("resp_1"), lambda: cl.responses.delete("resp_1"),
                 lambda: cl.responses.cancel("resp_1"), lambda: cl.responses.input_items.list("resp_1")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        err = e.value.body
        assert err["message"].startswith("response 'resp_1' not found") and "stores no responses" in err["message"]
        assert err["param"] == "response_id" and err["type"] == "not_found_error"
    r = httpx.get(f"{server.url}/v1/responses/{'r' * 5000}")
    assert r.status_code == 404 and "(5000 characters)" in r.json()["error"]["message"]
    assert len(r.json()["error"]["message"]) < 400
    r = httpx.post(f"{server.url}/v1/responses/input_tokens", json={"model": "tiny", "input": "hi"})
    assert r.status_code == 404 and "POST /tokenize" in r.json()["error"]["message"], r.text
    assert httpx.put(f"{server.url}/v1/responses/resp_1").status_code == 405


def test_unknown_fields_are_named_in_the_log(server):
    r = httpx.post(f"{server.url}/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2,
                                                       "n": 2, "temprature": 0.1, "metadata": {"k": "v"}})
    assert r.status_code == 200 and r.json()["metadata"] == {"k": "v"}
    assert f"{r.json()['id']}: fields present in the request but ignored: n, temprature" in server.text()
    # what an agent client sends: taken, and what is not acted on named
    r = create(server, max_output_tokens=2, reasoning={"effort": "high", "summary": "auto"},
               include=["reasoning.encrypted_content"], extra_body={"prompt_cache_key": "k1"})
    assert r.status in ("completed", "incomplete") and r.reasoning.effort == "high"
    assert (f"{r.id}: fields present in the request but ignored: prompt_cache_key, reasoning.effort (this model's "
            "chat template does not read it), include: reasoning.encrypted_content, reasoning.summary") in server.text()


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_the_request(server, stream):
    """A client that goes away mid-response: its request is aborted (blocks freed at once), not run
    to its 480 tokens."""
    before = server.metrics()
    body = {"model": "tiny", "input": "a long one", "max_output_tokens": 480, "ignore_eos": True, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(12)]  # a few events in: the request is mid-flight
            assert sum(g.startswith("data: ") for g in got) >= 4
    else:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            httpx.post(f"{server.url}/v1/responses", json=body, timeout=0.3)
    m = server.wait_idle()
    assert m["minillm:kv_cache_blocks_used"] == 0 and m["minillm:num_requests_running"] == 0
    abort = 'minillm:request_success_total{finished_reason="abort"}'
    assert m[abort] == before.get(abort, 0) + 1
    assert m["minillm:generation_tokens_total"] - before["minillm:generation_tokens_total"] < 240


@pytest.fixture(scope="module")
def plain(model_dir, tmp_path_factory):
    """A server without a reasoning parser, whose test hook fails the engine (the module's last test)."""
    srv = Server(model_dir, tmp_path_factory.mktemp("log") / "plain.log", "--served-model-name", "tiny",
                 env={"MINILLM_TEST_FAULTS": "1", "MINILLM_TEST_STEP_DELAY": "0.01"})
    yield srv
    assert srv.stop() == 0


def test_logprobs(plain, server):
    """include message.output_text.logprobs with top_logprobs: every token's logprob and its best
    alternatives in the message's text part, the chat endpoint's for the same greedy request;
    streamed, the deltas carry them. Refused where the output is read for reasoning or calls, whose
    tokens are not all the message's."""
    ask = dict(max_output_tokens=8, temperature=0, top_logprobs=2, include=["message.output_text.logprobs"],
               extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError, match="reasoning"):
        create(server, **ask)
    with pytest.raises(openai.BadRequestError, match="tool calls"):
        create(plain, tools=TOOLS, **ask)
    r = create(plain, **ask)
    lps = r.output[0].content[0].logprobs
    assert len(lps) == 8 and all(len(lp.top_logprobs) == 2 for lp in lps)
    assert "".join(lp.token for lp in lps) == r.output_text
    chat = plain.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
                                                  extra_body={"ignore_eos": True})
    want = chat.choices[0].logprobs.content
    assert [(lp.token, [t.token for t in lp.top_logprobs]) for lp in lps] == \
        [(lp.token, [t.token for t in lp.top_logprobs]) for lp in want]
    # the chat request reuses the first one's cached prompt, so its prefill computes fewer rows, whose
    # float32 products may round apart (~1e-8 on a CI machine with numpy 2.4.6; equal without the cache)
    assert [lp.logprob for lp in lps] == pytest.approx([lp.logprob for lp in want], rel=1e-5)
    events = [e.model_dump() for e in create(plain, stream=True, **ask)]
    deltas = [lp["token"] for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert deltas == [lp["token"] for lp in done["logprobs"]] == [lp.token for lp in lps]
    assert create(plain, max_output_tokens=2).output[0].content[0].logprobs == []  # not asked: none


def test_failure_mid_stream(plain):
    """The engine failing mid-response: a stream gets an error event, then response.failed carrying
    the error; a response that is not streamed is a 500 with an error body; later ones a 503."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        whole = pool.submit(httpx.post, f"{plain.url}/v1/responses", timeout=60, json={
            "model": "tiny", "input": "y", "max_output_tokens": 300, "ignore_eos": True})
        stream = create(plain, stream=True, max_output_tokens=300, extra_body={"ignore_eos": True})
        it = iter(stream)
        first = [next(it), next(it), next(it)]
        assert [e.type for e in first[:2]] == ["response.created", "response.in_progress"]
        httpx.post(f"{plain.url}/_test/fault", json={})
        rest = list(it)
        assert [e.type for e in rest[-2:]] == ["error", "response.failed"]
        assert "injected test fault" in rest[-2].message
        failed = rest[-1].response
        assert failed.status == "failed" and "injected test fault" in failed.error.message
        r = whole.result()
    assert r.status_code == 500 and "injected test fault" in r.json()["error"]["message"], r.text
    r = httpx.post(f"{plain.url}/v1/responses", json={"model": "tiny", "input": "x", "max_output_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"


def test_stream_starts_before_the_first_token(model_dir, tmp_path):
    """response.created and response.in_progress go out when the request is taken, not with the first
    token: behind a long prefill (here each engine step sleeps 1.5 s) the client saw no byte until then."""
    import time

    srv = Server(model_dir, tmp_path / "slow.log", "--served-model-name", "tiny",
                 env={"MINILLM_TEST_STEP_DELAY": "1.5"})
    try:
        seen = {}
        t0 = time.monotonic()
        with httpx.stream("POST", f"{srv.url}/v1/responses", timeout=60, json={
                "model": "tiny", "input": "hi", "max_output_tokens": 2, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    kind = json.loads(line[6:])["type"]
                    seen.setdefault(kind, time.monotonic() - t0)
        assert seen["response.created"] < 1.0 and seen["response.in_progress"] < 1.0, seen
        assert seen["response.output_text.delta"] > 1.4, seen  # the first step's token: after its delay
        assert "response.completed" in seen or "response.incomplete" in seen, seen
    finally:
        assert srv.stop() == 0, srv.text()


def test_cached_tokens_are_the_prefix_cache_hit(server):
    """usage.input_tokens_details.cached_tokens: the prompt tokens the prefix cache held (whole
    16-token blocks, the last prompt token always computed), none the first time."""
    text = "a long shared instruction that fills a few blocks of the cache " * 3
    first = create(server, instructions=text, input="one", max_output_tokens=2).usage
    again = create(server, instructions=text, input="one", max_output_tokens=2).usage
    assert first.input_tokens_details.cached_tokens == 0
    assert again.input_tokens_details.cached_tokens == (again.input_tokens - 1) // 16 * 16 > 0
    # (chat's usage says it only when served with --enable-prompt-tokens-details, as vLLM's)
    chat = server.client().chat.completions.create(model="tiny", max_tokens=2, messages=[
        {"role": "system", "content": text}, {"role": "user", "content": "one"}])
    assert chat.usage.prompt_tokens == again.input_tokens and chat.usage.prompt_tokens_details is None
