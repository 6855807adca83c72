"""Structured outputs (SamplingParams.structured_outputs; the server's response_format, structured_outputs
and guided_* fields): every output follows its constraint, other requests of the batch are untouched,
speculation stays lossless under a constraint, and constraints that cannot work are refused by name.

Real parts: llguidance's matcher over the embedded SmolLM2's BPE tokenizer and model (multi-character
tokens are where a mask can go wrong), and a random tiny model with a byte tokenizer, whose
arbitrary choices walk the grammar far from what a trained model would pick.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.backends.numpy_ops import NumpyBackend
from minillm.sampling_params import StructuredOutputsParams as SO

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
# a schema a random model finishes quickly: two keys, small values, no free whitespace
SMALL = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
         "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"enum": ["x", "yz"]}}}
QUESTION = [{"role": "user", "content": "Give a person as JSON with a name and an age. Who is it?"}]


def check_person(text: str) -> None:
    v = json.loads(text)
    assert set(v) == {"name", "age"} and isinstance(v["name"], str) and len(v["name"]) <= 12
    assert isinstance(v["age"], int) and not isinstance(v["age"], bool) and 0 <= v["age"] <= 120


def test_mask_logits_twin():
    """NumpyBackend.mask_logits against the bit layout spelled out: bit t % 32 of word t // 32,
    tokens past the mask banned, rows not named untouched."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 70)).astype(np.float32)
    rows = np.array([2, 0], np.int32)
    mask = rng.integers(-(2**31), 2**31, size=(2, 2), dtype=np.int64).astype(np.int32)  # 64 tokens: 64..69 banned
    want = logits.copy()
    for i, r in enumerate(rows):
        for t in range(70):
            if t >= 64 or not (int(mask[i, t // 32]) >> (t % 32)) & 1:
                want[r, t] = -np.inf
    NumpyBackend().mask_logits(logits, rows, mask)
    assert np.array_equal(logits, want)


@pytest.fixture(scope="module")
def smol():
    return LLM(device="cpu", max_model_len=512, max_num_seqs=8)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema(smol, temperature):
    outs = smol.chat([QUESTION] * 3, SamplingParams(temperature=temperature, seed=7, max_tokens=48,
                                                      structured_outputs=SO(json=PERSON)))
    for o in outs:
        assert o.finish_reason == "stop", o.text
        check_person(o.text)


def test_each_kind_of_constraint(smol):
    """regex, choice, GBNF grammar, json_object and a compact JSON schema, in one batch with an
    unconstrained request, which gives what it gives alone."""
    free = SamplingParams(temperature=0, max_tokens=12)
    alone = smol.chat([QUESTION], free)[0].text
    kinds = [SO(regex=r"(yes|no), because [a-z ]{1,20}\."), SO(choice=["Paris", "London", "Rome"]),
             SO(grammar='root ::= "The answer is " ("red" | "blue") "."'), SO(json_object=True),
             SO(json=PERSON, disable_any_whitespace=True)]
    params = [SamplingParams(temperature=0, max_tokens=48, structured_outputs=so) for so in kinds] + [free]
    outs = smol.chat([QUESTION] * len(params), params)
    regex, choice, grammar, obj, compact, unconstrained = (o.text for o in outs)
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,20}\.", regex), regex
    assert choice in ("Paris", "London", "Rome")
    assert grammar in ("The answer is red.", "The answer is blue.")
    assert isinstance(json.loads(obj), dict), obj
    check_person(compact)
    assert compact == json.dumps(json.loads(compact), separators=(",", ":"), ensure_ascii=False)  # no whitespace
    assert unconstrained == alone
    assert all(o.finish_reason == "stop" for o in outs[:-1])
    assert choice != alone  # the constraint changed what was generated


@pytest.mark.parametrize("parallel_min", [1, 1000])
def test_masks_follow_drafts(smol, monkeypatch, parallel_min):
    """A verification step's row j gets the mask after drafts 0 .. j - 1: each row equals a fresh
    matcher's after those tokens, rows past a draft the grammar refuses repeat the last reachable
    row, and the matcher is left where it was; computed by llguidance's threads or one by one."""
    monkeypatch.setattr("minillm.engine.structured.MASK_PARALLEL_MIN", parallel_min)
    eng = smol.engine
    g = eng.grammars
    so = SO(json=PERSON)
    tok = eng.tokenizer
    good = tok.encode('{"name": "Al', add_special_tokens=False)
    bad = tok.encode("hello", add_special_tokens=False)[:1]
    m = g.matcher(so)
    m.consume_token(good[0])
    drafts = good[1:3] + bad + good[3:4]
    other = g.matcher(SO(regex="[0-9]+"))
    masks, digits = np.split(g.next_token_masks([(m, drafts), (other, [])]), [len(drafts) + 1])
    assert masks.shape == (len(drafts) + 1, (eng.config.vocab_size + 31) // 32)
    for j in range(3):  # rows reachable: after 0, 1, 2 drafts (the third draft is refused)
        fresh = g.matcher(so)
        for t in good[: 1 + j]:
            assert fresh.consume_token(t)
        want = g.next_token_masks([(fresh, [])])[0]
        assert np.array_equal(masks[j], want), j
    assert np.array_equal(masks[3], masks[2]) and np.array_equal(masks[4], masks[2])
    assert not (int(masks[2][bad[0] >> 5]) >> (bad[0] & 31)) & 1  # the refused draft is banned in its row
    again = g.next_token_masks([(m, [])])  # m consumed only good[0], as before the call
    assert np.array_equal(again[0], masks[0])
    nine = tok.encode("9", add_special_tokens=False)[0]
    assert (int(digits[0][nine >> 5]) >> (nine & 31)) & 1 and not (int(digits[0][bad[0] >> 5]) >> (bad[0] & 31)) & 1


def test_speculative_is_lossless_under_a_constraint(smol):
    """Greedy outputs with the model drafting for itself (acceptance near k, so masks after several
    drafts decide) and with n-gram drafts (often refused by the grammar) equal plain decoding's,
    constrained the same way."""
    params = [SamplingParams(temperature=0, max_tokens=24, structured_outputs=SO(json=PERSON)),
              SamplingParams(temperature=0, max_tokens=12, structured_outputs=SO(regex=r"[A-Z][a-z]+( [a-z]+){2,6}\."))]
    prompts = [QUESTION, [{"role": "user", "content": "Say something about cats."}]]
    want = [o.token_ids for o in smol.chat(prompts, params)]
    from minillm.models.loader import default_model_path
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    for spec in ({"method": "draft_model", "model": str(default_model_path()), "num_speculative_tokens": 3}, ngram):
        llm = LLM(device="cpu", max_model_len=512, max_num_seqs=4, speculative_config=spec)
        got = [o.token_ids for o in llm.chat(prompts, params)]
        assert got == want, spec["method"]
        if spec["method"] == "draft_model":
            assert llm.engine.spec_stats.accepted > 0  # drafts were verified under the masks



def test_random_model_follows_the_constraint(tiny):
    """A random model with a byte tokenizer: every sample at temperature 1 still parses."""
    llm = LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=8)
    outs = llm.generate(["hello"] * 8, [SamplingParams(temperature=1.0, seed=s, max_tokens=40,
                                                       structured_outputs=SO(json=SMALL, disable_any_whitespace=True))
                                        for s in range(8)])
    seen = set()
    for o in outs:
        v = json.loads(o.text)
        assert set(v) == {"a", "b"} and 0 <= v["a"] <= 9 and v["b"] in ("x", "yz"), o.text
        seen.add(o.text)
    assert len(seen) > 1  # the seeds sampled different outputs, each inside the constraint


def test_constrained_steps_between_rounds_run_ahead(tiny, drafter):
    """A random DFlash drafter is never right, so sequences back off; the plain steps between probe
    rounds run ahead (async), each constrained row's mask taken once the step before is accepted:
    the outputs are the synchronous engine's (seeded ones too: backoff is decided per sequence),
    the greedy one plain decoding's, and all parse."""
    params = [SamplingParams(temperature=t, seed=s, max_tokens=40,
                             structured_outputs=SO(json=SMALL, disable_any_whitespace=True))
              for t, s in ((0.0, 0), (1.0, 1), (1.0, 2))]
    plain = LLM(str(tiny), device="cpu", max_model_len=128).generate(["hello"], params[:1])[0].token_ids
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3, "backoff_after": 1,
            "backoff_max_steps": 8}
    outs = {}
    for ahead in (False, None):  # None: LLM's default, async scheduling
        llm = LLM(str(tiny), device="cpu", max_model_len=128, speculative_config=spec, async_scheduling=ahead)
        outs[ahead] = llm.generate(["hello"] * 3, params)
        assert llm.engine.spec_stats.backoff_steps > 0
    assert llm.engine.num_pipelined_steps > 0
    assert [o.token_ids for o in outs[None]] == [o.token_ids for o in outs[False]]
    assert outs[None][0].token_ids == plain
    assert all(set(json.loads(o.text)) == {"a", "b"} for o in outs[None])


@pytest.mark.parametrize("kwargs, match", [
    (dict(json={"type": "objec"}), "does not compile"),
    (dict(json="{not json"), "not JSON"),
    (dict(regex="[a-"), "does not compile"),
    (dict(grammar="start: foo"), "does not compile"),
    (dict(choice=[]), "non-empty list"),
    (dict(regex="a+", choice=["a"]), "exactly one"),
    (dict(), "exactly one"),
    (dict(regex="a+", disable_any_whitespace=True), "json and json_object only"),
    (dict(json_object=1), "true or false"),
])
def test_bad_constraints_are_refused(smol, kwargs, match):
    with pytest.raises(ValueError, match=match):
        smol.generate(["hi"], SamplingParams(max_tokens=4, structured_outputs=kwargs))
    assert not smol.engine.has_unfinished()  # nothing was left half-admitted


def test_compiled_constraints_are_reused(smol):
    """n choices and repeated requests copy one compiled matcher (a copy starts where the template
    does, and what one copy consumes does not move another)."""
    g = smol.engine.grammars
    so = SO(json=PERSON)
    a = g.matcher(so)
    b = g.matcher(SO(json=dict(PERSON)))  # an equal schema: the same template
    assert len([k for k in g._templates if k == so.grammar_source()]) == 1
    tok = smol.engine.tokenizer.encode('{"name"', add_special_tokens=False)
    assert all(a.consume_token(t) for t in tok)
    fresh = g.next_token_masks([(b, [])])[0]
    assert np.array_equal(fresh, g.next_token_masks([(g.matcher(so), [])])[0])
    assert not np.array_equal(fresh, g.next_token_masks([(a, [])])[0])
    outs = smol.chat([QUESTION] * 3, SamplingParams(temperature=1.0, seed=1, max_tokens=48, structured_outputs=so))
    for o in outs:
        check_person(o.text)


def test_logprobs_list_no_banned_alternatives(tiny):
    """top logprobs of a constrained row list only tokens the constraint allows (a banned one is -inf,
    which JSON would show as -9999): two choices starting with different bytes, two alternatives."""
    llm = LLM(str(tiny), device="cpu", max_model_len=128)
    out = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=8, logprobs=5,
                                              structured_outputs=SO(choice=["yes", "no"])))[0]
    assert out.text in ("yes", "no")
    first = out.logprobs[0]
    assert len(first.top) == 2 and all(np.isfinite(v) for _, v in first.top)
    assert {llm.engine.tokenizer.decode([i]) for i, _ in first.top} == {"y", "n"}
    assert all(len(lp.top) == 1 for lp in out.logprobs[1:])  # one way to go on


def test_a_constraint_completed_at_max_tokens_stops(tiny):
    """The token that completes the constraint is also the last max_tokens allows: the output is
    whole, so its finish reason is "stop" (it was "length")."""
    llm = LLM(str(tiny), device="cpu", max_model_len=128)
    so = SO(json=SMALL, disable_any_whitespace=True)
    full = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=60, structured_outputs=so))[0]
    assert full.finish_reason == "stop"
    n = len(full.token_ids)
    exact = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=n, structured_outputs=so))[0]
    assert (exact.text, exact.finish_reason) == (full.text, "stop")
    short = llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=n - 1, structured_outputs=so))[0]
    assert short.finish_reason == "length" and full.text.startswith(short.text)


def test_min_tokens_with_a_constraint_is_refused():
    with pytest.raises(ValueError, match="min_tokens cannot be combined"):
        SamplingParams(min_tokens=2, structured_outputs=SO(regex="a+"))


def test_changed_logits_replay_graphs_that_stop_at_the_logits(monkeypatch, tiny):
    """Decode steps whose logits change before sampling (penalties, logit_bias, min_tokens, a
    grammar) replay a FORWARD_ONLY graph and run the changes and the sampler after it (on the
    NumPy backend with graphs emulated: replay reruns the captured Python, and a host transfer
    inside it raises), giving the tokens of eager steps; batches with none of them keep the
    sampling graphs."""
    from test_dflash_graphs import GraphEmulatingBackend

    class OpByOp(GraphEmulatingBackend):  # the model op by op, as on the GPU (NumPy's one-op decoder
        def decoder_plan(self, *a, **kw):  # plans one sequence, not a graph's bucket + padding slot)
            return None

    kinds = [dict(presence_penalty=1.0, repetition_penalty=1.3), dict(logit_bias={7: 5.0, 9: -100.0}),
             dict(min_tokens=6), dict(structured_outputs=SO(json=SMALL, disable_any_whitespace=True)), {}]
    params = [SamplingParams(temperature=t, seed=3, max_tokens=12, **kw) for kw in kinds for t in (0.0, 0.8)]
    prompts = [[5 + i, 17, 99, 3 + i] for i in range(len(params))]
    want = [o.token_ids for o in LLM(str(tiny), device="cpu", max_model_len=128).generate(prompts, params)]
    monkeypatch.setattr("minillm.engine.engine.select_backend", lambda device, dtype: OpByOp())
    llm = LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=16)
    runner = llm.engine.runner
    assert [o.token_ids for o in llm.generate(prompts, params)] == want  # one batch, all kinds
    assert runner.forward_only_replays > 0
    for p, prompt, w in zip(params, prompts, want):  # each kind alone
        assert llm.generate([prompt], p)[0].token_ids == w
    before = runner.forward_only_replays, runner.replays
    llm.generate(prompts[-2:], params[-2:])  # nothing changes logits: the sampling graphs
    assert runner.forward_only_replays == before[0] and runner.replays > before[1]
