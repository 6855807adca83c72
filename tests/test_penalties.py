"""Presence, frequency and repetition penalties (SamplingParams): the op against its definition,
greedy decoding against an oracle built from the engine's own unpenalised logits (LLMEngine.score),
and logit_bias. (Async scheduling's fallback for penalties: tests/test_async_scheduling.py.)"""

from __future__ import annotations

import numpy as np
import pytest

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


def test_refused_with_speculation_and_out_of_range(tiny):
    eng = LLMEngine(model=str(tiny), device="cpu", max_model_len=128,
                    speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="penalties with speculative decoding"):
        eng.add_request([10, 11], SamplingParams(presence_penalty=1.0))
    for bad in (dict(presence_penalty=3.0), dict(frequency_penalty=-2.5), dict(repetition_penalty=0.0)):
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
