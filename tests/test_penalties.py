"""Presence, frequency and repetition penalties (SamplingParams): the op against its definition,
greedy decoding against an oracle built from the engine's own unpenalised logits (LLMEngine.score),
the incremental history penalties read against a recount, and logit_bias. (Async scheduling's
fallback for penalties: tests/test_async_scheduling.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine.engine import LLMEngine


def penalised(logits: np.ndarray, prompt: list[int], out: list[int], p: SamplingParams) -> np.ndarray:
    """The definition: repetition on prompt and output tokens, then frequency and presence on
    output tokens, as vLLM applies them."""
    x = logits.astype(np.float64).copy()
    seen = sorted(set(prompt) | set(out)) if p.repetition_penalty != 1 else sorted(set(out))
    for t in seen:
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        c = out.count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    return x


def test_penalize_logits_op():
    be = NumpyBackend()
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 50)).astype(np.float32)
    want = logits.copy()
    rows, ids = np.array([0, 0, 2], np.int32), np.array([4, 7, 4], np.int32)
    pos, neg, sub = np.array([0.5, 0.5, 1.0], np.float32), np.array([2.0, 2.0, 1.0], np.float32), \
        np.array([0.1, 0.0, 1.5], np.float32)
    for r, t, a, b, s in zip(rows, ids, pos, neg, sub):
        want[r, t] = (want[r, t] * a if want[r, t] > 0 else want[r, t] * b) - s
    be.penalize_logits(logits, rows, ids, pos, neg, sub)
    assert np.array_equal(logits, want)


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=48)


@pytest.mark.parametrize("pen", [dict(presence_penalty=1.5), dict(frequency_penalty=0.7),
                                 dict(repetition_penalty=1.8), dict(presence_penalty=-0.5, frequency_penalty=0.3,
                                                                    repetition_penalty=0.7)])
def test_greedy_follows_the_penalised_logits(llm, pen):
    prompt = [11, 12, 13, 11, 12, 13, 11, 12]
    p = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, **pen)
    out = llm.generate([prompt], p)[0].token_ids
    raw = llm.engine.score([prompt + out[:-1]])[0]
    for j, tok in enumerate(out):
        x = penalised(raw[len(prompt) - 1 + j], prompt, out[:j], p)
        assert x[tok] >= x.max() - 1e-4, f"step {j}: took {tok}, the penalised argmax is {int(x.argmax())}"
    plain = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0].token_ids
    if pen.get("presence_penalty", 0) > 0 and len(set(plain)) < len(plain):
        assert out != plain  # the unpenalised run repeats tokens; a presence penalty changes the path


def test_verification_rows_follow_their_drafts():
    """Row j of a sequence verifying drafts d0 .. d(k-1) is penalised as if d0 .. d(j-1) had been
    output (the runner's rows against the definition); a plain row beside it as usual."""
    from types import SimpleNamespace

    from minillm.engine.runner import ModelRunner

    runner = SimpleNamespace(backend=NumpyBackend(), _adjustments=ModelRunner._adjustments)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.4)
    verifying = SimpleNamespace(params=p, prompt_ids=[1, 2], output_ids=[3, 3], draft_ids=[4, 3, 5],
                                penalty_history=None)
    plain = SimpleNamespace(params=p, prompt_ids=[6], output_ids=[4], draft_ids=[], penalty_history=None)
    batch = [SimpleNamespace(seq=verifying, num_logits=4), SimpleNamespace(seq=plain, num_logits=1)]
    logits = np.random.default_rng(1).standard_normal((5, 12)).astype(np.float32)
    want = [penalised(logits[j], [1, 2], [3, 3, *[4, 3, 5][:j]], p) for j in range(4)]
    want.append(penalised(logits[4], [6], [4], p))
    ModelRunner._adjust_logits(runner, batch, logits)
    assert np.allclose(logits, np.array(want), atol=1e-5)


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.integers(0, 40), max_size=20), rep=st.booleans(),
       steps=st.lists(st.tuples(st.lists(st.integers(0, 40), max_size=24), st.integers(0, 60)), max_size=8),
       drafted=st.lists(st.integers(0, 40), max_size=5))
def test_penalty_history_is_the_recount(prompt, rep, steps, drafted):
    """PenaltyHistory (updated as the output grows, a token or many at a time, or cut) holds what
    counting every id again gives: the output's distinct ids and counts, and with the repetition
    penalty those of prompt and output; with a verification row's drafts on top."""
    from minillm.engine.penalty_history import PenaltyHistory

    hist, out = PenaltyHistory(prompt, rep), []
    for new, keep in steps:
        out = (out + new)[: keep if keep < 50 else None]  # sometimes cut, as a stop string does
        hist.update(out)
        for extra in ([], drafted):
            ids, counts, seen = hist.with_drafts(extra)
            want_ids, want_counts = np.unique(np.asarray(out + extra, np.int64), return_counts=True)
            assert ids.tolist() == want_ids.tolist() and counts.tolist() == want_counts.tolist()
            assert (seen is None) == (not rep)
            if rep:
                assert seen.tolist() == sorted(set(prompt) | set(out) | set(extra))
        assert hist.with_drafts([])[1].tolist() == np.unique(np.asarray(out, np.int64), return_counts=True)[1].tolist()


@pytest.mark.parametrize("method", ["ngram", "self_draft", "dflash"])
def test_with_speculation_equal_to_plain_decoding(tiny, drafter, llm, method):
    """Verification row j of a drafted run is penalised as if drafts 0 .. j - 1 were already output,
    so greedy decoding with drafts takes the plain decoder's path, which the penalties change."""
    spec = {"ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2},
            "self_draft": {"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 4},
            "dflash": {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3}}[method]
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [30, 31, 32, 33], [9] * 6]
    eng = LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=8, speculative_config=spec)
    plain = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for pen in (dict(presence_penalty=1.5), dict(frequency_penalty=0.7, repetition_penalty=1.3)):
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **pen)
        want = [o.token_ids for o in llm.generate(prompts, params)]
        assert [o.token_ids for o in eng.generate(prompts, params)] == want
        assert want != [o.token_ids for o in llm.generate(prompts, plain)]  # the penalties matter here
    if method != "ngram":  # penalties stop the repeats n-gram lookup feeds on: it may draft nothing
        assert eng.engine.stats().spec["draft_tokens"] > 0


def test_out_of_range():
    for bad in (dict(presence_penalty=3.0), dict(frequency_penalty=-2.5), dict(repetition_penalty=0.0),
                dict(repetition_penalty=1e-300), dict(repetition_penalty=float("nan"))):  # 1e-300: 0 in float32
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_logit_bias(llm, tiny):
    prompt = [21, 22, 23, 24]
    plain = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0].token_ids
    forced = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                                   logit_bias={777: 100}))[0].token_ids
    assert forced == [777] * 6
    banned = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                                   logit_bias={plain[0]: -100}))[0].token_ids
    assert banned[0] != plain[0] and plain[0] not in banned
    two = llm.generate([prompt] * 4, [SamplingParams(max_tokens=8, temperature=1.0, seed=s, ignore_eos=True,
                                                     logit_bias={5: 100, 9: 100}) for s in range(4)])
    assert {t for o in two for t in o.token_ids} <= {5, 9} and len({t for o in two for t in o.token_ids}) == 2
    with pytest.raises(ValueError, match="logit_bias token ids"):
        llm.engine.add_request([1, 2], SamplingParams(logit_bias={10**7: 1.0}))
    # no history needed: async scheduling keeps pipelining; and speculation stays lossless with it
    eng = LLMEngine(model=str(tiny), device="cpu", max_model_len=128, async_scheduling=True)
    spec = LLMEngine(model=str(tiny), device="cpu", max_model_len=128,
                     speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    outs = []
    for e in (eng, spec):
        e.add_request([5, 6, 7, 5, 6, 7, 5], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True,
                                                           logit_bias={6: 3.0, 7: -2.0}), request_id="b")
        ids = []
        while e.has_unfinished():
            for o in e.step():
                ids += o.new_token_ids
        outs.append(ids)
    assert outs[0] == outs[1] and eng.num_pipelined_steps > 0
