"""SamplingParams.logprobs: each output token's log probability and its top alternatives, against
the engine's own logits (LLMEngine.score, the same forward without sampling) as the oracle; the
stop-string cut. (Async scheduling's fallback for them: tests/test_async_scheduling.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.logprobs import token_logprob


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=48)


def oracle(llm, prompt, out_ids):
    """log_softmax of the logits that produced each output token."""
    ls = log_softmax(llm.engine.score([prompt + out_ids[:-1]])[0])
    return ls[len(prompt) - 1 :]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_equal_the_models_distribution(llm, temperature):
    prompts = [list(range(10, 30)), list(range(500, 507))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=temperature, seed=3, ignore_eos=True,
                                                logprobs=4))
    for prompt, out in zip(prompts, outs):
        assert [lp.token_id for lp in out.logprobs] == out.token_ids
        want = oracle(llm, prompt, out.token_ids)
        for j, lp in enumerate(out.logprobs):
            assert abs(lp.logprob - want[j, lp.token_id]) < 1e-4  # raw logits: temperature does not enter
            assert len(lp.top) == 4
            ids, vals = [i for i, _ in lp.top], [v for _, v in lp.top]
            assert vals == sorted(vals, reverse=True)
            assert set(ids) == set(np.argsort(-want[j], kind="stable")[:4].tolist())
            assert all(abs(v - want[j, i]) < 1e-4 for i, v in lp.top)
        if temperature == 0:
            assert all(lp.top[0][0] == lp.token_id for lp in out.logprobs)


def test_no_logprobs_unless_asked(llm):
    out = llm.generate([[10, 11, 12]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert out.logprobs is None
    zero = llm.generate([[10, 11, 12]], SamplingParams(max_tokens=3, ignore_eos=True, logprobs=0))[0]
    assert len(zero.logprobs) == 3 and all(lp.top == [] for lp in zero.logprobs)


def test_cut_by_a_stop_string_with_the_ids(llm):
    prompt = list(range(40, 60))
    first = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    stop = first.text[3:5]
    out = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=stop,
                                                logprobs=1))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) < 12
    assert [lp.token_id for lp in out.logprobs] == out.token_ids


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2},
                                  {"method": "draft_model", "num_speculative_tokens": 4},
                                  {"method": "dflash", "num_speculative_tokens": 3}],
                         ids=["ngram", "self_draft", "dflash"])
def test_with_speculation_equal_to_plain_decoding(tiny, drafter, llm, spec):
    """With drafts, token i of an accepted run takes its logprobs from the verification row that
    chose it: the same (within float32 rounding of a wider product) as decoding token by token.
    The model drafting for itself accepts whole runs, so every row position is exercised; the
    DFlash drafter drafts through the target's LM head after the rows are read."""
    if spec["method"] != "ngram":
        spec = {**spec, "model": str(tiny if spec["method"] == "draft_model" else drafter)}
    eng = LLM(str(tiny), device="cpu", max_model_len=128, max_num_seqs=8, speculative_config=spec)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [30, 31, 32, 33], [9] * 6]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)
    for got, want in zip(eng.generate(prompts, params), llm.generate(prompts, params)):
        assert got.token_ids == want.token_ids
        assert [lp.token_id for lp in got.logprobs] == got.token_ids
        for g, w in zip(got.logprobs, want.logprobs):
            assert abs(g.logprob - w.logprob) < 1e-4
            assert [i for i, _ in g.top] == [i for i, _ in w.top]
            assert np.allclose([v for _, v in g.top], [v for _, v in w.top], atol=1e-4)
    assert eng.engine.stats().spec["draft_tokens"] > 0


def test_out_of_range(tiny):
    with pytest.raises(ValueError, match="logprobs must be"):
        SamplingParams(logprobs=21)


def test_token_logprob_ties_and_top_larger_than_vocab():
    row = np.array([0.0, 1.0, 1.0, -np.inf], np.float32)
    lp = token_logprob(row, 2, 10)
    assert [i for i, _ in lp.top] == [1, 2, 0]  # ties by id; a banned (-inf) token is no alternative
    assert abs(sum(np.exp(v) for _, v in lp.top) - 1) < 1e-12 and lp.logprob == lp.top[1][1]


def test_logprob_bodies_carry_no_infinity():
    """A token a logit transform ruled out has logprob -inf; JSON has no inf, so every body says
    -9999.0 (vLLM's clamp) and strict JSON encoding succeeds."""
    import json

    from minillm.engine.logprobs import TokenLogprob
    from minillm.server.protocol import chat_logprobs, completion_logprobs, prompt_logprobs_body

    ruled_out = [TokenLogprob(3, float("-inf"), [(1, -0.1), (3, float("-inf"))], rank=2)]
    bodies = [completion_logprobs(ruled_out, str), chat_logprobs(ruled_out, str),
              prompt_logprobs_body([None, *ruled_out], str, top=2)]
    text = json.dumps(bodies, allow_nan=False)
    assert "-9999.0" in text


def test_score_last_only_is_the_last_row_and_fits_longer_prompts(tiny):
    """score(last_only=True): each prompt's last row of score(), one logits row a prompt, so a prompt
    longer than the logits buffer (max_num_seqs rows) can still be scored."""
    llm = LLM(tiny, device="cpu", max_num_seqs=4, max_model_len=256)
    short, long = list(range(1, 4)), list(range(1, 40))
    full = llm.engine.score([short])[0]
    last = llm.engine.score([short, long], last_only=True)
    assert [a.shape[0] for a in last] == [1, 1]
    # float32 sums in another batch shape: equal within rounding, far from any other row's
    np.testing.assert_allclose(last[0][0], full[-1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(last[0][0], full[-2], rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="do not fit"):
        llm.engine.score([long])  # 39 rows against a 4-row buffer
