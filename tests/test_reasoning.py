"""Reasoning output on /v1/chat/completions (`--reasoning-parser`, minillm/server/reasoning.py): the
split of a whole output for both parsers, the streaming splitter against it for every way of cutting
the text (hypothesis), then real servers on a tiny random model driven by the official openai client,
the output forced with structured outputs so it holds the tags (one byte token a character, so every
tag arrives in pieces): reasoning_content and content, whole and streamed, include_reasoning, tool
calls after the thinking, the completions endpoint and a server without a parser left alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import ROOT, Server

from minillm.server.reasoning import Delta, ReasoningSplitter, split_reasoning

from hf_models import make_tiny


def stream_split(parser: str, chunks: list[str]) -> tuple[list[Delta], Delta]:
    """The splitter fed chunks one by one, then finished: each step's delta, and all of them added."""
    s = ReasoningSplitter(parser)
    deltas = [s.feed(c) for c in chunks] + [s.finish()]
    total = Delta()
    for d in deltas:
        total += d
    return deltas, total


# ---- the split of a whole output -----------------------------------------------------------
BOTH = [  # (output, reasoning, content), the same for both parsers: the output opens with <think>
    ("<think>\nplan it\n</think>\n\nThe answer.", "plan it", "The answer."),
    ("  \n<think>plan</think>answer", "plan", "answer"),  # whitespace before the open tag
    ("<think>plan</think>", "plan", None),  # nothing after the thinking: content null
    ("<think>plan</think>\n\n", "plan", None),
    ("<think>\n\n</think>\n\nanswer", "", "answer"),  # an empty think block
    ("<think>a</think>b</think>c", "a", "b</think>c"),  # only the first end tag splits
    ("<think><think>a</think>b", "<think>a", "b"),  # one open tag removed
    ("<think> a \n\n</think>  b\n", " a ", "  b\n"),  # only newlines are stripped
]


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("text,reasoning,content", BOTH)
def test_split_with_end_tag(parser, text, reasoning, content):
    assert split_reasoning(text, parser) == (reasoning, content)


@pytest.mark.parametrize("text,qwen3,deepseek_r1", [
    # not opening with <think>: qwen3 reads it as the answer, as it is; deepseek_r1 as thinking
    # whose open tag was in the prompt (Qwen3-Thinking-2507, R1)
    ("plan</think>\nanswer", (None, "plan</think>\nanswer"), ("plan", "answer")),
    ("x <think>a</think>b", (None, "x <think>a</think>b"), ("x <think>a", "b")),  # an open tag after text
    ("</think>answer", (None, "</think>answer"), ("", "answer")),
    ("<think</think>x", (None, "<think</think>x"), ("<think", "x")),
    # thinking cut short (max_tokens): all reasoning for both
    ("<think>\nstill thinking\n", ("still thinking", None), ("still thinking", None)),
    (" <think>", ("", None), ("", None)),
    # no tags: qwen3 with thinking off (all content); deepseek_r1 thinks from the first token
    ("just an answer\n", (None, "just an answer\n"), ("just an answer", None)),
    ("", (None, ""), ("", None)),
    ("<thi", (None, "<thi"), ("<thi", None)),  # half a tag is text
    ("\n<think", (None, "\n<think"), ("<think", None)),
    ("a <think>b", (None, "a <think>b"), ("a <think>b", None)),
])
def test_split_by_parser(text, qwen3, deepseek_r1):
    assert split_reasoning(text, "qwen3") == qwen3
    assert split_reasoning(text, "deepseek_r1") == deepseek_r1


def test_unknown_parser():
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        split_reasoning("x", "qwen")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        ReasoningSplitter("r1")


# ---- the streaming splitter ------------------------------------------------------------------
def test_splitter_holds_back_only_a_possible_tag():
    s = ReasoningSplitter("qwen3")
    assert s.feed("  <th") == Delta()  # may open the thinking
    assert s.feed("ink>\nab</") == Delta("ab")  # "</" may close it
    assert s.feed("b") == Delta("</b")  # it did not
    assert s.feed("\n\n") == Delta()  # newlines that may end the reasoning wait
    assert s.feed("c\n</thi") == Delta("\n\nc")
    assert s.feed("nk>\n") == Delta()  # the thinking ends; its last newline and the content's first are dropped
    assert s.feed("\nan") == Delta(content="an")
    assert s.feed("swer</think>") == Delta(content="swer</think>")  # content goes out as it comes
    assert s.finish() == Delta()
    # qwen3 without <think>: the answer, streamed as it comes (a </think> in it is text)
    s = ReasoningSplitter("qwen3")
    assert s.feed("\npl") == Delta(content="\npl") and s.feed("ain</th") == Delta(content="ain</th")
    assert s.feed("ink>x") == Delta(content="ink>x") and s.finish() == Delta()
    s = ReasoningSplitter("qwen3")
    assert s.feed(" <") == Delta() and s.feed("a") == Delta(content=" <a")  # held only while it may open
    # deepseek_r1 thinks from the start: reasoning streams at once
    s = ReasoningSplitter("deepseek_r1")
    assert s.feed("plan") == Delta("plan") and s.feed(" more</th") == Delta(" more")
    assert s.finish() == Delta("</th")  # the output ended on half a tag: it was text


FRAGMENTS = ["<think>", "</think>", "<thi", "nk>", "</", "think>", "<", ">", "t", "abc", "x y", " ", "\n", "\n\n"]


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.sampled_from(FRAGMENTS), max_size=12), cuts=st.lists(st.integers(0, 80), max_size=10),
       parser=st.sampled_from(["qwen3", "deepseek_r1"]))
def test_any_chunking_streams_the_same_split(parts, cuts, parser):
    """However the output is cut into pieces, the streamed reasoning and content add up to the whole
    output's split, no tag text leaks into either, and reasoning never follows content."""
    text = "".join(parts)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    deltas, total = stream_split(parser, chunks)
    reasoning, content = split_reasoning(text, parser)
    assert (total.reasoning, total.content) == (reasoning or "", content or "")
    first_content = next((k for k, d in enumerate(deltas) if d.content), len(deltas))
    assert not any(d.reasoning for d in deltas[first_content + 1:])


def test_long_blank_runs_split_in_linear_time():
    """A model stuck writing whitespace, streamed two characters at a time: before the thinking opens
    (held: <think> may follow) and inside it (newlines held: they may end the reasoning). Each piece
    used to copy all the held text (15 s for these 400k characters, the event loop blocked); now each
    is kept once. (A loose bound, as the machine may be busy.)"""
    import time

    for parser, text in (("qwen3", " \n" * 200_000 + "<think>a</think>b"), ("deepseek_r1", "\n" * 400_000 + "x"),
                         ("qwen3", "<think>a" + "\n" * 400_000 + "b</think>c")):
        start = time.perf_counter()
        s = ReasoningSplitter(parser)
        deltas = [s.feed(text[k:k + 2]) for k in range(0, len(text), 2)] + [s.finish()]
        assert time.perf_counter() - start < 5, (parser, text[:10])
        reasoning, content = split_reasoning(text, parser)
        assert "".join(d.reasoning for d in deltas) == reasoning
        assert "".join(d.content for d in deltas) == (content or "")


# ---- the server --------------------------------------------------------------------------------
THOUGHT = "<think>\nI ought to greet.\n</think>\n\nHello there!"
MSGS = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "temp", "parameters": {
    "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}}}]


def forced(text: str) -> dict:
    return {"structured_outputs": {"choice": [text]}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-reasoning")
    make_tiny("llama", path)
    return path


def start(model_dir, tmp_path_factory, *flags):
    return Server(model_dir, tmp_path_factory.mktemp("log") / "server.log", "--served-model-name", "tiny", *flags)


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """One server per parser, and one without."""
    srvs = {name: start(model_dir, tmp_path_factory, *flags) for name, flags in
            [("qwen3", ["--reasoning-parser", "qwen3"]), ("deepseek_r1", ["--reasoning-parser", "deepseek_r1"]),
             (None, [])]}
    yield srvs
    for srv in srvs.values():
        assert srv.stop() == 0, srv.text()
        assert "Traceback" not in srv.text()


def chat(server, **kw):
    return server.client().chat.completions.create(model="tiny", messages=MSGS, **{"max_tokens": 80, **kw})


def streamed(server, **kw) -> tuple[str | None, str, str | None, list]:
    """(reasoning, content, finish_reason, deltas) put together from a stream; reasoning is None when
    no delta carried any. Checks that no delta is empty and reasoning never follows content."""
    chunks = list(chat(server, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning, content, finish, deltas = None, "", None, []
    for c in chunks[1:]:
        ch = c.choices[0]
        finish = ch.finish_reason or finish
        d = ch.delta.model_dump(exclude_none=True)
        if ch.finish_reason is None:
            assert d and all(v != "" for v in d.values()), d  # no empty deltas
        if "reasoning_content" in d:
            assert not content, "reasoning after content"
            reasoning = (reasoning or "") + d["reasoning_content"]
        content += d.get("content", "")
        deltas.append(d)
    return reasoning, content, finish, deltas


def raw_message(server, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions",
                   json={"model": "tiny", "messages": MSGS, "max_tokens": 80, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_qwen3_reasoning_apart(servers):
    srv = servers["qwen3"]
    msg = chat(srv, extra_body=forced(THOUGHT)).choices[0].message
    assert (msg.reasoning_content, msg.content) == ("I ought to greet.", "Hello there!")
    reasoning, content, finish, deltas = streamed(srv, extra_body=forced(THOUGHT))
    assert (reasoning, content, finish) == ("I ought to greet.", "Hello there!", "stop")
    assert sum("reasoning_content" in d for d in deltas) > 3  # it streamed, a token at a time
    assert not any("<" in d.get("reasoning_content", "") + d.get("content", "") for d in deltas)  # no tag leaked
    # thinking off (no tags): all content, reasoning_content null
    msg = chat(srv, extra_body=forced("Plain answer.")).choices[0].message
    assert (msg.reasoning_content, msg.content) == (None, "Plain answer.")
    assert streamed(srv, extra_body=forced("Plain answer."))[:3] == (None, "Plain answer.", "stop")
    # thinking cut short by max_tokens: all reasoning, content null
    r = chat(srv, extra_body=forced(THOUGHT), max_tokens=12).choices[0]
    assert (r.message.reasoning_content, r.message.content, r.finish_reason) == ("I ou", None, "length")
    assert streamed(srv, extra_body=forced(THOUGHT), max_tokens=12)[:3] == ("I ou", "", "length")


def test_sampled_output_streams_as_it_splits(servers):
    """A sampled output in the shape of a thought (a regex): streamed, the same split as whole."""
    regex = {"structured_outputs": {"regex": "<think>[a-z ]{3,8}</think>\n\n[a-z]{3,8}"}}
    for seed in range(3):
        kw = dict(temperature=1.0, seed=seed, extra_body=regex)
        msg = chat(servers["qwen3"], **kw).choices[0].message
        assert re.fullmatch("[a-z ]{3,8}", msg.reasoning_content) and re.fullmatch("[a-z]{3,8}", msg.content)
        assert streamed(servers["qwen3"], **kw)[:2] == (msg.reasoning_content, msg.content)


def test_deepseek_r1_thinks_from_the_start(servers):
    srv = servers["deepseek_r1"]
    for text, want in [("I ought to greet.\n</think>\n\nHello", ("I ought to greet.", "Hello")),
                       (THOUGHT, ("I ought to greet.", "Hello there!")),
                       ("Only thinking so far", ("Only thinking so far", None))]:
        msg = chat(srv, extra_body=forced(text)).choices[0].message
        assert (msg.reasoning_content, msg.content) == want
        assert streamed(srv, extra_body=forced(text))[:2] == (want[0], want[1] or "")
    # a forced tool call is the call's JSON from its first token: not read as thinking
    r = chat(srv, tools=TOOLS, tool_choice="required").choices[0]
    assert r.finish_reason == "tool_calls" and r.message.tool_calls[0].function.name == "temp"
    assert r.message.reasoning_content is None and r.message.content is None


def test_include_reasoning_false(servers):
    msg = raw_message(servers["qwen3"], include_reasoning=False, **forced(THOUGHT))
    assert msg == {"role": "assistant", "content": "Hello there!"}
    reasoning, content, _, _ = streamed(servers["qwen3"], extra_body={"include_reasoning": False, **forced(THOUGHT)})
    assert (reasoning, content) == (None, "Hello there!")
    for stream in (False, True):
        r = httpx.post(f"{servers['qwen3'].url}/v1/chat/completions",
                       json={"model": "tiny", "messages": MSGS, "include_reasoning": "no", "stream": stream})
        assert r.status_code == 400 and r.json()["error"]["param"] == "include_reasoning", r.text
        assert "'include_reasoning' must be a boolean" in r.json()["error"]["message"]


def test_no_parser_leaves_the_output_whole(servers):
    srv = servers[None]
    assert raw_message(srv, **forced(THOUGHT)) == {"role": "assistant", "content": THOUGHT}
    reasoning, content, _, deltas = streamed(srv, extra_body=forced(THOUGHT))
    assert reasoning is None and content == THOUGHT
    assert "reasoning_content" in raw_message(servers["qwen3"], **forced(THOUGHT))


def test_completions_endpoint_unaffected(servers):
    c = servers["qwen3"].client().completions.create(model="tiny", prompt="hi", max_tokens=80,
                                                      extra_body=forced(THOUGHT))
    assert c.choices[0].text == THOUGHT and "reasoning_content" not in c.choices[0].model_dump()


def test_tool_call_after_thinking(servers):
    """A <tool_call> inside the thinking is reasoning; the one after it is the call."""
    text = ('<think>\nMaybe <tool_call>{"name": "temp", "arguments": {"n": 1}}</tool_call> first.\n</think>\n\n'
            '<tool_call>{"name": "temp", "arguments": {"n": 4}}</tool_call>')
    srv = servers["qwen3"]
    r = chat(srv, tools=TOOLS, max_tokens=200, extra_body=forced(text)).choices[0]
    assert r.finish_reason == "tool_calls" and r.message.content is None
    assert r.message.reasoning_content == 'Maybe <tool_call>{"name": "temp", "arguments": {"n": 1}}</tool_call> first.'
    assert [(c.function.name, json.loads(c.function.arguments)) for c in r.message.tool_calls] == [("temp", {"n": 4})]
    reasoning, content, finish, deltas = streamed(srv, tools=TOOLS, max_tokens=200, extra_body=forced(text))
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert (reasoning, content, finish) == (r.message.reasoning_content, "", "tool_calls")
    assert calls[0]["function"]["name"] == "temp" and json.loads(calls[0]["function"]["arguments"]) == {"n": 4}
    assert len(calls) == 1


def test_unknown_parser_flag_is_one_line():
    p = subprocess.run([sys.executable, "-m", "minillm.serve", "--reasoning-parser", "qwen"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert "--reasoning-parser" in last and "'qwen3'" in last and "'deepseek_r1'" in last, p.stderr
