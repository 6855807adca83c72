"""OpenAI tool calling on /v1/chat/completions (minillm/server/tools.py): the Hermes-style parser
on strings (whole and streamed in pieces), then the real server on a tiny random model driven by
the official openai client: named and "required" tool_choice forced by a JSON schema, "auto"
parsing the model's <tool_call> tags (the random model is steered into writing them with a
structured-outputs choice), streaming, history with tool calls and tool results rendered by a
template that shows them, "none", and every malformed tool field a 400 naming it.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import Server

from minillm.server import tools
from minillm.server.tools import HermesParser, Llama3JsonParser, NamedParser, Piece, RequiredParser

from hf_models import make_tiny


def run(parser, chunks: list[str]) -> Piece:
    """The parser fed chunks one by one, then finished: everything it gave, merged."""
    out = Piece()
    for c in chunks:
        out += parser.feed(c)
    return out + parser.finish()


def calls_of(piece: Piece) -> list[tuple[str, dict]]:
    return [(d.name, json.loads(d.arguments)) for d in piece.calls]


def pieces(text: str, n: int) -> list[str]:
    return [text[k:k + n] for k in range(0, len(text), n)]


# ---- the auto parser on strings ------------------------------------------------------------
ONE = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
       '<tool_call>{"name": "b", "arguments": {"y": "<tool_call>"}}</tool_call>\n')


@pytest.mark.parametrize("size", [len(ONE) + len(TWO), 1, 2, 3, 5, 11])
def test_hermes_parser_same_in_any_pieces(size):
    """One call after text; two calls (a tag inside a string argument stays an argument); split
    anywhere, even inside the tags, the parser gives what it gives for the whole text."""
    one = run(HermesParser(), pieces(ONE, size))
    assert one.content == "Let me look." and calls_of(one) == [("get_weather", {"city": "Paris"})]
    two = run(HermesParser(), pieces(TWO, size))
    assert two.content == "" and calls_of(two) == [("a", {"x": 1}), ("b", {"y": "<tool_call>"})]
    assert [d.index for d in two.calls] == [0, 1] and all(d.id.startswith("call_") for d in two.calls)
    assert len({d.id for d in two.calls}) == 2


def test_hermes_parser_text_around_calls():
    text = 'Before. <tool_call>{"name": "f", "arguments": {}}</tool_call> between <tool_call>{"name": "g", ' \
           '"arguments": "{\\"k\\": [1, 2]}"}</tool_call> after.'
    p = run(HermesParser(), pieces(text, 4))
    assert p.content == "Before. between after."  # the whitespace before each run of calls, once
    assert calls_of(p) == [("f", {}), ("g", {"k": [1, 2]})]  # arguments written as a JSON string: parsed


@pytest.mark.parametrize("text", [
    'x <tool_call>{"name": "f", "arguments": {"a": 1}</tool_call> y',  # unbalanced
    'x <tool_call>{"arguments": {}}</tool_call> y',  # no name
    'x <tool_call>{"name": "f", "arguments": [1]}</tool_call> y',  # arguments not an object
    'x <tool_call>not json</tool_call>',
    "x <tool_call> never closed, not json",
    "a < b and <tool_ but no tag <",
    "  spaces stay  \n",
])
def test_hermes_parser_malformed_stays_content(text):
    """No call read: the content is the output exactly, whole or in one-character pieces."""
    for size in (len(text), 1):
        p = run(HermesParser(), pieces(text, size))
        assert p.calls == [] and p.content == text


def test_hermes_parser_holds_back_only_a_possible_tag():
    p = HermesParser()
    assert p.feed("Hello <to").content == "Hello"  # "<to" may open a tag; the space may precede one
    assert p.feed("day").content == " <today"
    assert p.feed(" <tool_call>").content == ""
    assert p.feed('{"name": "f", "arguments": {}}').calls == []  # nothing until the tag closes
    done = p.feed("</tool_call> done")
    assert done.content == " done" and calls_of(done) == [("f", {})]
    # an output that ends inside a call's tag is still a call (models often stop there)
    end = run(HermesParser(), ['<tool_call>{"name": "f", "arguments": {"a": 2}}'])
    assert calls_of(end) == [("f", {"a": 2})]


def test_hermes_parser_without_parallel_calls_keeps_the_first():
    p = run(HermesParser(parallel=False), [TWO])
    assert calls_of(p) == [("a", {"x": 1})] and p.content == ""


def every_split(text: str) -> list[list[str]]:
    """text whole, cut in two at every place, and one character a piece."""
    return [[text], *([text[:k], text[k:]] for k in range(1, len(text))), list(text)]


def test_hermes_parser_close_tag_inside_an_argument():
    """A call whose argument holds "</tool_call>" (a model writing about tool calls) is a call: the
    tag inside the JSON string does not end it. Before, the call was cut there and all of it was content."""
    text = 'x <tool_call>{"name": "f", "arguments": {"s": "a </tool_call> b"}}</tool_call> y'
    for chunks in every_split(text):
        p = run(HermesParser(), chunks)
        assert (p.content, calls_of(p)) == ("x y", [("f", {"s": "a </tool_call> b"})]), chunks
    # the output ends in the call (models stop there): a call too
    p = run(HermesParser(), ['<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}'])
    assert calls_of(p) == [("f", {"s": "</tool_call>"})] and p.content == ""
    # not a call after all: it ended at its first close tag, as before, and what follows is read as ever
    bad = '<tool_call>{"s": "</tool_call> <tool_call>{"name": "g", "arguments": {}}</tool_call> z'
    for chunks in every_split(bad):
        p = run(HermesParser(), chunks)
        assert (p.content, calls_of(p)) == ('<tool_call>{"s": "</tool_call> z', [("g", {})]), chunks
    for junk in ('<tool_call>{"s": "</tool_call>', '<tool_call>{"a</tool_call>' + '<tool_call>{\\"a</tool_call>' * 50):
        p = run(HermesParser(), pieces(junk, 3))
        assert (p.content, p.calls) == (junk, [])


FRAGMENTS = ['{"name": "f", "arguments": {"s": "', '{"name": "g", "parameters": {}}', '"}}', "\\\"", '"', "{", "}",
             "<tool_call>", "</tool_call>", "<tool", "_call>", "</", "<", "<|python_tag|>", ";", "x", " ", "\n", "é"]


@settings(max_examples=500, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=12), cuts=st.lists(st.integers(0, 150), max_size=10),
       make=st.sampled_from([HermesParser, lambda: HermesParser(parallel=False), Llama3JsonParser]))
def test_any_chunking_parses_the_same(parts, cuts, make):
    """However the output is cut, the streamed content and calls are the whole output's; with no call
    read the content is the output exactly; every call's arguments are a JSON object."""
    text = "".join(parts)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    whole, streamed = run(make(), [text]), run(make(), [text[a:b] for a, b in zip(bounds, bounds[1:])])
    assert (streamed.content, calls_of(streamed)) == (whole.content, calls_of(whole))
    assert whole.calls or whole.content == text
    assert all(isinstance(args, dict) for _, args in calls_of(whole))


@pytest.mark.parametrize("make", [HermesParser, Llama3JsonParser])
def test_non_finite_arguments_are_not_calls(make):
    """NaN / Infinity parse in Python but are not JSON: arguments holding them were sent on as
    '{"x": NaN}', which a client's JSON.parse rejects. Such a call stays content, verbatim."""
    for args in ('{"x": NaN}', '{"x": [-Infinity]}', '"{\\"x\\": Infinity}"'):
        text = (f'<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>' if make is HermesParser
                else f'{{"name": "f", "parameters": {args}}}')
        p = run(make(), [text])
        assert (p.content, p.calls) == (text, []), text


def test_an_escaped_lone_surrogate_stays_escaped():
    """The model writes the six characters \\ud800 in an argument: rewritten with ensure_ascii=False the
    arguments held a real lone surrogate, which the reply's JSON then carried as an escape strict
    parsers refuse. Other non-ASCII text is still written as itself."""
    for parser in (HermesParser(), Llama3JsonParser()):
        body = '{"name": "f", "arguments": {"s": "\\ud800 é"}}'
        text = f"<tool_call>{body}</tool_call>" if isinstance(parser, HermesParser) else body
        msg, _ = tools.complete_message(parser, text, "stop")
        args = msg["tool_calls"][0]["function"]["arguments"]
        args.encode("utf-8")  # no lone surrogate in the string itself
        assert json.loads(args) == {"s": "\ud800 é"}


def test_hermes_parser_reads_parameters():
    """A call written with "parameters" (Llama's key) has those arguments; before, they were
    silently dropped and the call went out with {}."""
    p = run(HermesParser(), ['<tool_call>{"name": "f", "parameters": {"city": "Paris"}}</tool_call>'])
    assert calls_of(p) == [("f", {"city": "Paris"})]
    both = run(HermesParser(), ['<tool_call>{"name": "f", "arguments": {"a": 1}, "parameters": {"b": 2}}</tool_call>'])
    assert calls_of(both) == [("f", {"a": 1})]  # "arguments" wins


def test_deeply_nested_arguments_never_raise():
    """Arguments nested about as deep as Python's json takes: json.loads could take what json.dumps
    then could not write, and the RecursionError escaped (a 500, or a stream cut by an error event).
    Now whatever the depth the output is a call or verbatim content."""
    for depth in range(1, 1100, 1):
        nested = "[" * depth + "]" * depth
        for make, text in ((HermesParser, f'<tool_call>{{"name": "f", "arguments": {{"a": {nested}}}}}</tool_call>'),
                           (Llama3JsonParser, f'{{"name": "f", "parameters": {{"a": {nested}}}}}'),
                           (RequiredParser, f'[{{"arguments": {{"a": {nested}}}, "name": "f"}}]')):
            p = run(make(), [text])
            if p.calls:
                assert calls_of(p)[0][0] == "f"
            elif make is not RequiredParser:
                assert p.content == text


def test_required_parser_never_raises_on_a_bad_name():
    """(The schema forbids it, but a parser never crashes a stream:) a name with a bad escape is not
    read as the call's header; before, json.loads raised."""
    text = '[{"name": "\\q", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    for size in (1, 40):
        p = run(RequiredParser(), pieces(text, size))
        assert calls_of(p) == [("g", {})]


def test_huge_output_is_read_in_linear_time():
    """A huge argument (a file's text) and a long run of whitespace (a model stuck writing newlines),
    streamed a few characters at a time: every piece used to search or copy all the held text
    (seconds to a minute of the event loop for ~1M characters); now each is read once. (The bound is
    loose: the old code took 30-40 s here, the new well under one.)"""
    import time

    big = "abcd" * 250_000
    cases = [(HermesParser, f'<tool_call>{{"name": "f", "arguments": {{"s": "{big}"}}}}</tool_call>'),
             (HermesParser, "x" + " \n" * 200_000),
             (Llama3JsonParser, f'{{"name": "f", "parameters": {{"s": "{big}"}}}}'),
             (Llama3JsonParser, " \n" * 200_000 + "x"),
             (RequiredParser, f'[{{"name": "f", "arguments": {{"s": "{big}"}}}}]')]
    for make, text in cases:
        start, parser = time.perf_counter(), make()
        got = [parser.feed(c) for c in pieces(text, 4)] + [parser.finish()]  # (not run(): adding Pieces copies)
        assert time.perf_counter() - start < 8, make
        content, calls = "".join(g.content for g in got), [d for g in got for d in g.calls]
        if calls:
            assert (calls[0].name, json.loads("".join(d.arguments for d in calls))) == ("f", {"s": big})
        else:
            assert content == text


# ---- llama3_json -----------------------------------------------------------------------------
LLAMA = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": "; {"}}'


@pytest.mark.parametrize("size", [len(LLAMA), 1, 2, 3, 7])
def test_llama3_parser_same_in_any_pieces(size):
    """Calls after the python tag, separated by ";" (a ";" or "{" inside a string is an argument),
    "parameters" or "arguments"; bare JSON calls too; split anywhere, the same calls and no content."""
    p = run(Llama3JsonParser(), pieces(LLAMA, size))
    assert calls_of(p) == [("a", {"x": 1}), ("b", {"y": "; {"})] and p.content == ""
    assert [d.index for d in p.calls] == [0, 1] and len({d.id for d in p.calls}) == 2
    bare = run(Llama3JsonParser(), pieces(' \n{"name": "f", "parameters": {}}', size))
    assert calls_of(bare) == [("f", {})] and bare.content == ""


@pytest.mark.parametrize("text", [
    "The answer is 4.",  # no call: content, streamed as it comes
    '{"name": "f", "parameters": {}} and more',  # text after the calls: not a call output
    '{"name": "f", "parameters": [1]}',  # parameters not an object
    '{"nam": "f", "parameters": {}}',
    '{"name": "f", "parameters": {}',  # cut short
    "<|python_tag|>print(1)",  # the tag's other use, code: content
    "{not json",
    "<|python",  # what may have been the tag's start
])
def test_llama3_parser_anything_else_is_content(text):
    for size in (len(text), 1, 3):
        p = run(Llama3JsonParser(), pieces(text, size))
        assert p.content == text and not p.calls, (text, size)


def test_llama3_parser_streams_content_and_holds_calls():
    p = Llama3JsonParser()
    assert p.feed("  ") == Piece() and p.feed("Hel") == Piece("  Hel") and p.feed("lo") == Piece("lo")
    q = Llama3JsonParser()
    assert q.feed("<|py") == Piece() and q.feed('thon_tag|>{"name": "f", "parameters": {}}') == Piece()
    assert calls_of(q.finish()) == [("f", {})]
    one = run(Llama3JsonParser(parallel=False), [LLAMA])
    assert calls_of(one) == [("a", {"x": 1})]


def test_complete_message():
    msg, why = tools.complete_message(HermesParser(), "\n" + TWO, "stop")
    assert msg["content"] is None and why == "tool_calls"
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["a", "b"]
    assert msg["tool_calls"][0]["type"] == "function" and json.loads(msg["tool_calls"][1]["function"]["arguments"])
    msg, why = tools.complete_message(HermesParser(), "plain <b>text</b>", "length")
    assert msg == {"role": "assistant", "content": "plain <b>text</b>"} and why == "length"
    msg, why = tools.complete_message(HermesParser(), ONE, "length")  # a call, but cut: OpenAI says length
    assert msg["content"] == "Let me look." and len(msg["tool_calls"]) == 1 and why == "length"
    # a forced call that a stop string (or stop token) ended before its constraint: its arguments are
    # not whole JSON, and "tool_calls" would tell the client to run them
    for parser, text in ((NamedParser("f"), '{"a": "x'), (RequiredParser(), '[{"name": "f", "arguments": {"a": "x')):
        msg, why = tools.complete_message(parser, text, "stop", "}")
        assert why == "stop" and len(msg["tool_calls"]) == 1
    msg, why = tools.complete_message(NamedParser("f"), '{"a": "x"}', "stop", None)  # ended by its constraint
    assert why == "tool_calls" and json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"a": "x"}
    msg, why = tools.complete_message(HermesParser(), "\n" + TWO, "stop", "!")  # auto: whole calls before the stop
    assert why == "tool_calls"


def test_required_and_named_parsers():
    text = '[{"name": "f", "arguments": {"s": "}]{\\"[", "n": [1, {"m": 2}]}}, {"name": "g", "arguments": {}}]'
    whole = run(RequiredParser(), [text])
    assert calls_of(whole) == [("f", {"s": '}]{"[', "n": [1, {"m": 2}]}), ("g", {})]
    for size in (1, 3, 7):
        p = RequiredParser()
        deltas = [p.feed(c) for c in pieces(text, size)] + [p.finish()]
        heads = [d for piece in deltas for d in piece.calls if d.id is not None]
        assert [d.name for d in heads] == ["f", "g"]
        merged = Piece()
        for piece in deltas:
            merged += piece
        assert calls_of(merged) == calls_of(whole)
    # the arguments go out as they are written, not at the end of the call
    p = RequiredParser()
    first = p.feed('[{"name": "f", "arguments": {"s": "ab')
    assert first.calls[0].name == "f" and first.calls[0].arguments == '{"s": "ab'
    assert p.feed('c"}}').calls[0].arguments == 'c"}'  # the call's own closing brace is not its arguments'
    # keys in the other order: the call goes out whole when its object closes
    assert calls_of(run(RequiredParser(), ['[{"arguments": {"a": 1}, "name": "h"}]'])) == [("h", {"a": 1})]

    named = NamedParser("f")
    a, b = named.feed('{"x"'), named.feed(": 1}")
    assert (a.calls[0].name, a.calls[0].arguments, a.calls[0].index) == ("f", '{"x"', 0) and a.calls[0].id
    assert b.calls[0].id is None and b.calls[0].arguments == ": 1}"
    assert named.finish().calls == []
    cut = NamedParser("f").finish()  # nothing written (max_tokens): the call still has its header
    assert cut.calls[0].name == "f" and cut.calls[0].arguments == ""


def test_request_checks_and_schemas():
    t = [{"type": "function", "function": {"name": "a", "parameters": {
              "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "b"}}]
    req = tools.parse_tool_request({"tools": t, "tool_choice": "required", "parallel_tool_calls": False})
    schema = req.constraint().json
    # each function's parameters under the wrapper's $defs, their own references rebased onto them
    assert schema["maxItems"] == 1 and schema["minItems"] == 1 and schema["$defs"] == {"b": {"type": "object"}, "a": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/a/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}}
    assert [i["properties"]["name"] for i in schema["items"]["anyOf"]] == [{"enum": ["a"]}, {"enum": ["b"]}]
    assert schema["items"]["anyOf"][1]["properties"]["arguments"] == {"$ref": "#/$defs/b"}
    for ok in ([{"name": "a", "arguments": {"p": 3}}], [{"name": "b", "arguments": {}}]):
        jsonschema.validate(ok, schema)
    for bad in ([], [{"name": "a", "arguments": {"p": "x"}}], [{"name": "c", "arguments": {}}],
                [{"name": "b", "arguments": {}}] * 2):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    named = tools.parse_tool_request({"tools": t, "tool_choice": {"type": "function", "function": {"name": "b"}}})
    assert (named.choice, named.function) == ("function", "b") and named.constraint().json["type"] == "object"
    assert tools.parse_tool_request({"tools": t}).choice == "auto"
    assert tools.parse_tool_request({"tools": t}).constraint() is None
    assert tools.parse_tool_request({"tool_choice": "none"}) is None
    assert tools.parse_tool_request({"tools": [], "parallel_tool_calls": True}) is None


# ---- the server ------------------------------------------------------------------------------
# a template that shows what it is given: the tools, and the history's tool calls and results
TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.tool_calls %}{{ m.content }}{% for c in m.tool_calls %}<tool_call>{{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
    "{% elif m.role == 'tool' %}[{{ m.tool_call_id }}] {{ m.content }}"
    "{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}"  # (trim_blocks eats a newline after a tag)
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
DIGIT = {"type": "object", "additionalProperties": False, "required": ["unit", "n"],
         "properties": {"unit": {"enum": ["c", "f"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
FLAG = {"type": "object", "additionalProperties": False, "required": ["on"], "properties": {"on": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {"name": "temp", "description": "a reading", "parameters": DIGIT}},
         {"type": "function", "function": {"name": "switch", "parameters": FLAG}}]
SCHEMAS = {"temp": DIGIT, "switch": FLAG}
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-tools")
    make_tiny("llama", path, max_position_embeddings=1024)
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    srv = Server(model_dir, tmp_path_factory.mktemp("log") / "server.log", "--served-model-name", "tiny")
    yield srv
    assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


def chat(server, **kw):
    return server.client().chat.completions.create(model="tiny", messages=kw.pop("messages", MSGS), **kw)


def stream(server, **kw) -> list:
    return list(chat(server, stream=True, stream_options={"include_usage": True}, **kw))


def streamed_calls(chunks) -> tuple[list[dict], str, str | None]:
    """(calls, content, finish_reason) put together from a stream's deltas, checking that each call's
    first delta carries its id, type and name and the later ones only arguments."""
    calls: list[dict] = []
    content, finish = "", None
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        content += ch.delta.content or ""
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            if d.index == len(calls):
                assert d.id.startswith("call_") and d.type == "function" and d.function.name
                calls.append({"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""})
            else:
                assert d.index == len(calls) - 1 and d.id is None and d.function.name is None
                calls[-1]["arguments"] += d.function.arguments
    return calls, content, finish


def check_call(call, name: str | None = None) -> dict:
    """A response's tool call: a function of TOOLS, arguments that parse and follow its schema."""
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 10
    assert call.function.name == name if name else call.function.name in SCHEMAS
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_named_tool_choice(server):
    named = {"type": "function", "function": {"name": "temp"}}
    for seed in range(3):
        r = chat(server, tools=TOOLS, tool_choice=named, max_tokens=40, seed=seed)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) == 1
        check_call(msg.tool_calls[0], "temp")
    # streamed: a header delta, then argument fragments, the same arguments as the response's
    chunks = stream(server, tools=TOOLS, tool_choice=named, max_tokens=40, seed=0)
    calls, content, finish = streamed_calls(chunks)
    ref = chat(server, tools=TOOLS, tool_choice=named, max_tokens=40, seed=0).choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0]["name"] == "temp" and finish == "tool_calls" and content == ""
    assert calls[0]["arguments"] == ref[0].function.arguments
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls) > 2  # in pieces
    assert chunks[-1].usage.completion_tokens > 5 and chunks[-1].choices == []
    # cut by a stop string: "stop" with the call as far as it got, streamed and not ("tool_calls" before)
    r = chat(server, tools=TOOLS, tool_choice=named, max_tokens=40, seed=0, stop=[":"])
    assert r.choices[0].finish_reason == "stop" and ":" not in r.choices[0].message.tool_calls[0].function.arguments
    calls, _, finish = streamed_calls(stream(server, tools=TOOLS, tool_choice=named, max_tokens=40, seed=0, stop=[":"]))
    assert finish == "stop" and calls[0]["arguments"] == r.choices[0].message.tool_calls[0].function.arguments
    # cut by max_tokens: the call as far as it got, finish_reason length (as OpenAI)
    cut = chat(server, tools=TOOLS, tool_choice=named, max_tokens=3, seed=0).choices[0]
    assert cut.finish_reason == "length" and cut.message.tool_calls[0].function.name == "temp"
    assert len(cut.message.tool_calls[0].function.arguments) <= 3


def test_required_tool_choice(server):
    """An array of calls, each one of the two functions with arguments that follow its schema;
    over a few seeds (a hot temperature: the random model leans hard on one name) both functions
    and a reply of several calls turn up. A reply cut by max_tokens keeps its finished calls."""
    names, most = set(), 0
    for seed in range(12):
        r = chat(server, tools=TOOLS, tool_choice="required", max_tokens=150, seed=seed, temperature=2.0)
        ch = r.choices[0]
        assert ch.finish_reason in ("tool_calls", "length") and ch.message.content is None
        done = ch.message.tool_calls if ch.finish_reason == "tool_calls" else ch.message.tool_calls[:-1]
        assert ch.message.tool_calls and [check_call(c) for c in done]
        names |= {c.function.name for c in done}
        most = max(most, len(done))
        if names == set(SCHEMAS) and most > 1:
            break
    assert names == set(SCHEMAS) and most > 1, (names, most)
    kw = dict(tools=TOOLS, tool_choice="required", max_tokens=150, seed=seed, temperature=2.0)
    calls, content, finish = streamed_calls(stream(server, **kw))
    ref = chat(server, **kw).choices[0]
    assert finish == ref.finish_reason and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments)
                                                            for c in ref.message.tool_calls]


def test_parallel_tool_calls_false_gives_one_call(server):
    for seed in range(4):
        r = chat(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=150, seed=seed,
                 temperature=2.0)
        assert len(r.choices[0].message.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"
        check_call(r.choices[0].message.tool_calls[0])


# parameters as pydantic writes them (model_json_schema): the nested model under $defs, by its
# class name, which two functions may share with different fields
def pydantic_like(fields: dict) -> dict:
    item = {"type": "object", "additionalProperties": False, "required": list(fields), "properties": fields}
    return {"type": "object", "additionalProperties": False, "required": ["item"],
            "properties": {"item": {"$ref": "#/$defs/Item"}}, "$defs": {"Item": item}}


REF_SCHEMAS = {
    "put": pydantic_like({"x": {"type": "integer", "minimum": 0, "maximum": 9}}),
    "flip": pydantic_like({"on": {"type": "boolean"}}),
    # a linked list: "#" is the parameters schema itself
    "chain": {"type": "object", "additionalProperties": False, "required": ["next"],
              "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}},
}
REF_TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in REF_SCHEMAS.items()]


def test_parameters_with_refs(server):
    """$ref in a function's parameters resolves against those parameters, as in the schema alone,
    with tool_choice "required" (where they sit inside the array of calls: "#" once meant the
    array, a 500 after 0 tokens; two functions' $defs/Item clashed, a 400) and named."""
    def check(call) -> dict:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, REF_SCHEMAS[call.function.name])
        return args

    for name in REF_SCHEMAS:
        named = {"type": "function", "function": {"name": name}}
        for seed in range(2):
            ch = chat(server, tools=REF_TOOLS, tool_choice=named, max_tokens=60, seed=seed, temperature=2.0).choices[0]
            assert ch.finish_reason == "tool_calls", ch
            check(ch.message.tool_calls[0])
    names = set()
    for seed in range(16):
        ch = chat(server, tools=REF_TOOLS, tool_choice="required", max_tokens=100, seed=seed,
                  temperature=2.0).choices[0]
        assert ch.finish_reason in ("tool_calls", "length") and ch.message.tool_calls, ch
        done = ch.message.tool_calls if ch.finish_reason == "tool_calls" else ch.message.tool_calls[:-1]
        for c in done:
            check(c)
            names.add(c.function.name)
        if names == set(REF_SCHEMAS):
            break
    assert names == set(REF_SCHEMAS), names
    # response_format takes the same schemas: its $refs point into the schema itself
    for schema in REF_SCHEMAS.values():
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        ch = chat(server, response_format=fmt, max_tokens=60, seed=0, temperature=2.0).choices[0]
        assert ch.finish_reason == "stop", ch
        jsonschema.validate(json.loads(ch.message.content), schema)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "loop"}}])
def test_parameters_with_a_ref_loop_are_400(server, choice):
    """Parameters that are a reference to themselves and nothing else: no arguments match them. A
    400 naming the function, from a "required" tool_choice too (there it once failed mid-output)."""
    loop = [*TOOLS, {"type": "function", "function": {"name": "loop", "parameters": {"$ref": "#"}}}]
    for stream in (False, True):
        r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "tiny", "messages": MSGS, "tools": loop,
                                                                  "tool_choice": choice, "stream": stream})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tools" and "function 'loop''s parameters" in err["message"], err
        assert "no text matches it" in err["message"] and "structured_outputs:" not in err["message"], err


CALL_TEXT = ('Checking. <tool_call>{"name": "temp", "arguments": {"unit": "c", "n": 4}}</tool_call>\n'
             '<tool_call>{"name": "switch", "arguments": {"on": true}}</tool_call>')


def test_auto_parses_tool_calls(server):
    """The random model made to write Hermes tags (a structured-outputs choice): the non-streamed
    reply and the streamed deltas both give the two calls and the text before them; the tags,
    which the byte tokenizer sends a character at a time, never reach the streamed content."""
    force = {"structured_outputs": {"choice": [CALL_TEXT]}}
    r = chat(server, tools=TOOLS, max_tokens=200, extra_body=force)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Checking."
    assert [check_call(c) for c in ch.message.tool_calls] == [{"unit": "c", "n": 4}, {"on": True}]
    assert [c.function.name for c in ch.message.tool_calls] == ["temp", "switch"]
    chunks = stream(server, tools=TOOLS, tool_choice="auto", max_tokens=200, extra_body=force)
    calls, content, finish = streamed_calls(chunks)
    assert content == "Checking." and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("temp", {"unit": "c", "n": 4}),
                                                                       ("switch", {"on": True})]
    assert not any("<" in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # parallel_tool_calls false: the first call only
    one = chat(server, tools=TOOLS, parallel_tool_calls=False, max_tokens=200, extra_body=force).choices[0]
    assert [c.function.name for c in one.message.tool_calls] == ["temp"]
    # no call in the output, or a malformed one: plain content, finish_reason stop
    bad = "Nope <tool_call>{\"name\": \"temp\", \"arguments\": {]}</tool_call>"
    r = chat(server, tools=TOOLS, max_tokens=200, extra_body={"structured_outputs": {"choice": [bad]}})
    assert r.choices[0].message.content == bad and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    calls, content, finish = streamed_calls(stream(server, tools=TOOLS, max_tokens=200,
                                                   extra_body={"structured_outputs": {"choice": [bad]}}))
    assert (calls, content, finish) == ([], bad, "stop")


def test_tool_choice_none(server):
    """"none": the tools are rendered into the prompt, but the output is plain content even when
    it looks like a call."""
    r = chat(server, tools=TOOLS, tool_choice="none", max_tokens=200,
             extra_body={"structured_outputs": {"choice": [CALL_TEXT]}})
    assert r.choices[0].message.content == CALL_TEXT and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    count = httpx.post(f"{server.url}/tokenize", json={"messages": MSGS, "tools": TOOLS}).json()["count"]
    plain = chat(server, max_tokens=1).usage.prompt_tokens
    assert r.usage.prompt_tokens == count > plain + 100  # the tools' JSON, one token a byte


def test_history_with_tool_calls_renders(server):
    """An assistant message with tool_calls (content null, arguments a JSON string) and a tool
    message reach the template as it expects them: arguments as an object, the tool's call id."""
    history = [*MSGS,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "temp",
                                                                     "arguments": '{"unit": "c", "n": 4}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "4 C"}]
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": history, "tools": TOOLS[1:]}).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}).json()["prompt"]
    tool = json.dumps(TOOLS[1])  # transformers' tojson: keys in order, nothing escaped
    assert text == (f"<tools>{tool}\n</tools>\n<user>hi\n"
                    '<assistant><tool_call>call_1 temp {"unit": "c", "n": 4}</tool_call>\n'
                    "<tool>[call_1] 4 C\n<assistant>")
    r = chat(server, messages=history, tools=TOOLS[1:], max_tokens=2)
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].finish_reason == "length"


BAD = [
    ({"tools": {"name": "f"}}, "tools", "must be an array"),
    ({"tools": ["f"]}, "tools", "tools[0] must be an object"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools", "tools[0].type must be \"function\""),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0].function must be an object"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "letters, digits"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools", "1-64"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "tools[1].function.name 'temp' is listed twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools",
     "tools[0].function.parameters must be a JSON schema of an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools", "parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 5}}]}, "tools", "description"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}] * 129}, "tools", "at most 128"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "\"none\", \"auto\", \"required\""),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not in 'tools' (it lists temp, switch)"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "temp"}}, "tool_choice", "{\"type\": \"function\""),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tool_choice": {"type": "function", "function": {"name": "temp"}}}, "tool_choice", "needs 'tools'"),
    ({"tool_choice": "auto", "tools": []}, "tool_choice", "needs 'tools'"),
    ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "already constrains the output"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "wrong"}}}}}], "tool_choice": "required"}, "tools",
     "cannot be used as a JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$defs": [1]}}}],
      "tool_choice": "required"}, "tools", "$defs must be an object"),
    ({"messages": [{"role": "tool", "content": "4 C"}]}, "messages[0].tool_call_id", "tool_call_id must be a string"),
    ({"messages": [{"role": "tool", "tool_call_id": "c"}]}, "messages[0].content", "content is missing"),
    ({"messages": [{"role": "assistant", "tool_calls": {"id": "c"}}]}, "messages[0].tool_calls", "must be an array"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]},
     "messages[0].tool_calls[0]", "must be {\"id\""),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[0].tool_calls[0]", ".id must be a string"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                 "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0]", "arguments is not JSON"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"id": "c"}]}]}, "messages[0].tool_calls",
     "only assistant messages"),
]


@pytest.mark.parametrize("body,param,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_tool_fields_are_400(server, body, param, message):
    for extra in ({}, {"stream": True}):  # a stream is refused before it starts
        r = httpx.post(f"{server.url}/v1/chat/completions",
                       json={"model": "tiny", "messages": MSGS, "max_tokens": 4, **body, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and message in err["message"], err


def test_errors_leave_the_server_serving(server):
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        chat(server, tool_choice="required", max_tokens=2)
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert chat(server, max_tokens=2).choices[0].message.tool_calls is None


@pytest.fixture(scope="module")
def smol():
    from minillm import LLM

    return LLM(device="cpu", max_model_len=1024, max_num_seqs=4)


def test_smollm2_template_ignores_tools(smol):
    """What the embedded default model's chat template does with tool calling: it renders no tools
    and drops an assistant's tool calls (its text, empty, stays), and a tool message is one more
    turn. So "auto" has little to go on with it; "required" and named calls still hold (below)."""
    from minillm.server import protocol

    tok = smol.tokenizer
    info = protocol.ModelInfo(names=["m"], max_model_len=2048, vocab_size=tok.vocab_size, tokenizer=tok)
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "temp", "arguments": '{"unit": "c", "n": 4}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 C"}]
    with_tools = protocol.chat_prompt({"messages": history}, info, tools=TOOLS)
    assert with_tools == protocol.chat_prompt({"messages": history}, info)
    text = tok.decode(with_tools, skip_special_tokens=False)
    assert "temp" not in text and text.endswith(
        "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n4 C<|im_end|>\n<|im_start|>assistant\n")


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
               "type": "object", "additionalProperties": False, "required": ["city", "unit"],
               "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
           {"type": "function", "function": {"name": "get_time", "parameters": {
               "type": "object", "required": ["tz"], "properties": {"tz": {"type": "string", "maxLength": 20}}}}}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_smollm2_forced_calls(smol, choice):
    """The forcing schemas on a trained model with a BPE vocabulary (multi-character tokens across
    the compact separators): greedy, SmolLM2 calls get_weather for Paris."""
    from minillm import SamplingParams

    req = tools.parse_tool_request({"tools": WEATHER, "tool_choice": choice})
    q = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    out = smol.chat([q], SamplingParams(temperature=0, max_tokens=80, structured_outputs=req.constraint()))[0]
    msg, why = tools.complete_message(req.parser(), out.text, out.finish_reason)
    assert why == "tool_calls" and msg["content"] is None and len(msg["tool_calls"]) == 1, out.text
    call = msg["tool_calls"][0]["function"]
    args = json.loads(call["arguments"])
    jsonschema.validate(args, WEATHER[0]["function"]["parameters"])
    assert call["name"] == "get_weather" and args["city"] == "Paris"


def test_llama3_json_parser_on_the_server(server, model_dir, tmp_path):
    """--tool-call-parser llama3_json: the random model made to write Llama 3's JSON calls gives
    tool_calls, streamed and not; the default server reads the same output as content."""
    text = '{"name": "temp", "parameters": {"unit": "f", "n": 2}}; {"name": "switch", "parameters": {"on": false}}'
    force = {"structured_outputs": {"choice": [text]}}
    srv = Server(model_dir, tmp_path / "server.log", "--served-model-name", "tiny", "--tool-call-parser", "llama3_json")
    try:
        ch = chat(srv, tools=TOOLS, max_tokens=200, extra_body=force).choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        assert [check_call(c) for c in ch.message.tool_calls] == [{"unit": "f", "n": 2}, {"on": False}]
        calls, content, finish = streamed_calls(stream(srv, tools=TOOLS, max_tokens=200, extra_body=force))
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("temp", {"unit": "f", "n": 2}),
                                                                           ("switch", {"on": False})]
        assert content == "" and finish == "tool_calls"
    finally:
        assert srv.stop() == 0, srv.text()
    plain = chat(server, tools=TOOLS, max_tokens=200, extra_body=force).choices[0]  # hermes reads it as text
    assert plain.message.content == text and not plain.message.tool_calls and plain.finish_reason == "stop"


def test_vllm_tool_flags_parse():
    """vLLM's command line for tools (`--enable-auto-tool-choice --tool-call-parser hermes`) starts a
    server here too; an unknown parser is refused by argparse, naming the choices."""
    from minillm.serve import parse_args

    ns = parse_args(["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"])
    assert ns.enable_auto_tool_choice and ns.tool_call_parser == "llama3_json"
    assert parse_args([]).tool_call_parser == "hermes"
    with pytest.raises(SystemExit):
        parse_args(["--tool-call-parser", "mistral"])
