"""Structured outputs after a thinking model's thinking (SamplingParams.think_token_ids; the server sets
it with --reasoning-parser when <think> and </think> are one token each, as in Qwen3's vocabulary): the
tokens up to </think> are the model's own, the constraint holds for what follows, speculation stays
lossless across the tag, and a vocabulary without the tags keeps the constraint from the first token.

Real parts: a random tiny Qwen3 with a byte tokenizer plus the two tags as added tokens, llguidance's
matcher, the NumPy backend, and the real server with the official openai client.
"""

from __future__ import annotations

import json

import pytest
from test_server import Server

from minillm import LLM, SamplingParams
from minillm.engine.structured import ThinkState
from minillm.sampling_params import StructuredOutputsParams as SO

from hf_models import add_think_tokens, make_tiny

CHOICE = SO(choice=["yes", "no"])
START, END = 256, 257  # add_think_tokens' ids


@pytest.fixture(scope="module")
def think_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-think")
    make_tiny("qwen3", path, vocab_size=258)
    assert add_think_tokens(path) == (START, END)
    return path


@pytest.fixture(scope="module")
def llm(think_dir):
    return LLM(str(think_dir), device="cpu", max_model_len=256, max_num_seqs=8)


def answer_after_thinking(o) -> tuple[int | None, str]:
    """(index of the first </think> in the output's ids or None, the text after it)."""
    if END not in o.token_ids:
        return None, ""
    k = o.token_ids.index(END)
    return k, o.text[o.text.index("</think>") + len("</think>"):]


@pytest.mark.parametrize("state, drafts, want", [
    (None, [5, END, 6], (0, False)),  # the constraint holds: every row
    (ThinkState.THINKING, [], (None, False)),  # thinking, no drafts: the one row is free
    (ThinkState.THINKING, [5, 6], (None, False)),
    (ThinkState.THINKING, [5, END, 6], (2, False)),  # rows after the draft </think> are constrained
    (ThinkState.THINKING, [END], (1, False)),
    (ThinkState.MAY_OPEN, [], (0, True)),  # the first token: the constraint's or <think>
    (ThinkState.MAY_OPEN, [5, END], (0, True)),  # a first draft other than <think>: constrained from it on
    (ThinkState.MAY_OPEN, [START, 5], (None, True)),  # <think> drafted: row 0 alone is the matcher's
    (ThinkState.MAY_OPEN, [START, 5, END, 6], (3, True)),
    (ThinkState.MAY_OPEN, [START, END], (2, True)),
])
def test_rows_of_a_step(state, drafts, want):
    assert ThinkState.rows(state, drafts, (START, END)) == want


def test_states_token_by_token():
    assert ThinkState.initial(SamplingParams(structured_outputs=CHOICE, think_token_ids=(None, END))) == "thinking"
    assert ThinkState.initial(SamplingParams(structured_outputs=CHOICE, think_token_ids=(START, END))) == "may_open"
    assert ThinkState.initial(SamplingParams(think_token_ids=(START, END))) is None  # nothing to hold back
    assert ThinkState.after("may_open", START, (START, END)) == ("thinking", False)
    assert ThinkState.after("may_open", 5, (START, END)) == (None, True)  # the answer from the first token
    assert ThinkState.after("thinking", START, (START, END)) == ("thinking", False)
    assert ThinkState.after("thinking", END, (START, END)) == (None, False)  # </think> itself is not the answer's
    assert ThinkState.after(None, END, (START, END)) == (None, True)


@pytest.mark.parametrize("bad", [(END,), (START, START), (-1, END), ("a", END), (START, None), (True, END)])
def test_bad_think_token_ids_are_refused(bad):
    with pytest.raises(ValueError, match="think_token_ids"):
        SamplingParams(think_token_ids=bad)


def test_think_token_ids_past_the_vocabulary_are_refused(llm):
    with pytest.raises(ValueError, match="think_token_ids"):
        llm.generate(["hi"], SamplingParams(structured_outputs=CHOICE, think_token_ids=(None, 258)))


def test_the_constraint_waits_for_the_thinking(llm):
    """deepseek_r1's way (every output thinks): the tokens before </think> are free (bytes the choice
    bans), the text after it is exactly a choice; without think_token_ids the same request is a choice
    from its first token."""
    outs = llm.generate(["hello"] * 8, [SamplingParams(temperature=1, seed=s, max_tokens=60, structured_outputs=CHOICE,
                                                       logit_bias={END: 3}, think_token_ids=(None, END))
                                        for s in range(8)])
    thought = 0
    for o in outs:
        k, answer = answer_after_thinking(o)
        assert k is not None, o.token_ids  # at +3, </think> comes within 60 tokens for these seeds
        assert answer in ("yes", "no") and o.finish_reason == "stop", o.text
        thought += k >= 2 and any(t not in b"yesno" for t in o.token_ids[:k])
    assert thought >= 2  # outputs thought in tokens the constraint would have banned
    plain = llm.generate(["hello"], SamplingParams(temperature=1, seed=0, max_tokens=60, structured_outputs=CHOICE,
                                                   logit_bias={END: 3}))[0]
    assert plain.text in ("yes", "no")


def test_qwen3_decides_at_the_first_token(llm):
    """qwen3's way: a first token other than <think> is the constrained answer's; <think> first opens
    a thinking that the constraint waits out."""
    def params(max_tokens, bias):
        return [SamplingParams(temperature=1, seed=s, max_tokens=max_tokens, structured_outputs=CHOICE,
                               logit_bias=bias, think_token_ids=(START, END)) for s in range(4)]

    no_think = llm.generate(["hello"] * 4, params(30, {START: -100}))
    assert all(o.text in ("yes", "no") for o in no_think), [o.text for o in no_think]
    thinks = llm.generate(["hello"] * 4, params(60, {START: 8, END: 6}))
    for o in thinks:
        k, answer = answer_after_thinking(o)
        assert o.token_ids[0] == START and k is not None and answer in ("yes", "no"), o.token_ids


@pytest.mark.parametrize("think_ids, bias", [((None, END), {END: 1}), ((START, END), {START: 1, END: 1})])
def test_speculation_is_lossless_across_the_tag(think_dir, llm, think_ids, bias):
    """Greedy outputs with the model drafting for itself (its drafts cross </think> inside one
    verification step) and with n-gram drafts equal plain decoding's."""
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=CHOICE, logit_bias=bias,
                            think_token_ids=think_ids)
    want = llm.generate(["hello", "hi there"], params)
    for o in want:
        k, answer = answer_after_thinking(o)
        assert k is not None and k >= 2 and answer in ("yes", "no"), o.token_ids  # a thinking, then the answer
    for spec in ({"method": "draft_model", "model": str(think_dir), "num_speculative_tokens": 3},
                 {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}):
        spec_llm = LLM(str(think_dir), device="cpu", max_model_len=256, max_num_seqs=4, speculative_config=spec)
        got = spec_llm.generate(["hello", "hi there"], params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want], spec["method"]
        if spec["method"] == "draft_model":
            assert spec_llm.engine.spec_stats.accepted > 0


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def servers(think_dir, tmp_path_factory):
    srvs = {p: Server(think_dir, tmp_path_factory.mktemp("log") / "server.log", "--served-model-name", "tiny",
                      "--reasoning-parser", p) for p in ("deepseek_r1", "qwen3")}
    yield srvs
    for srv in srvs.values():
        assert srv.stop() == 0, srv.text()
        assert "Traceback" not in srv.text()


@pytest.mark.parametrize("stream", [False, True])
def test_server_thinks_then_answers_the_schema(servers, stream):
    """With --reasoning-parser deepseek_r1 a response_format's schema holds after the thinking: the
    reasoning is the model's own text, the content parses."""
    client = servers["deepseek_r1"].client()
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=80, temperature=1, seed=3,
              logit_bias={str(END): 3},
              response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {
                  "type": "object", "required": ["a"], "additionalProperties": False,
                  "properties": {"a": {"enum": ["x", "y"]}}}}})
    if stream:
        reasoning, content = "", ""
        for c in client.chat.completions.create(stream=True, **kw):
            d = c.choices[0].delta.model_dump(exclude_none=True) if c.choices else {}
            reasoning += d.get("reasoning_content", "")
            content += d.get("content", "")
    else:
        msg = client.chat.completions.create(**kw).choices[0].message
        reasoning, content = msg.model_extra["reasoning_content"], msg.content
    assert json.loads(content)["a"] in ("x", "y"), (reasoning, content)
    assert reasoning is not None and "</think>" not in reasoning


def test_server_qwen3_without_thinking_answers_from_the_start(servers):
    """qwen3: an output that does not open with <think> is the answer, constrained from its first token."""
    r = servers["qwen3"].client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20, temperature=1, seed=1,
        logit_bias={str(START): -100}, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    msg = r.choices[0].message
    assert msg.content in ("yes", "no") and msg.model_extra.get("reasoning_content") is None
