"""Sampling semantics on the NumPy backend: filters, seeds, min_tokens, stop conditions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.engine.sampler import hash_uniform, probs_from_logits, sample_from_probs

from hf_models import make_tiny


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=40), st.integers(-1, 45), st.floats(0.05, 1.0),
       st.floats(0.2, 3.0))
@settings(max_examples=200, deadline=None)
def test_probs_filters(logits, top_k, top_p, temperature):
    x = np.array(logits, dtype=np.float32)
    p = probs_from_logits(x, temperature, top_p, top_k)
    assert abs(p.sum() - 1) < 1e-9 and (p >= 0).all()
    kept = np.nonzero(p)[0]
    if 0 < top_k < len(x):  # nothing outside the k largest (ties at the k-th value may stay)
        assert (x[kept] >= np.sort(x)[-top_k]).all()
    # top-p keeps the smallest high-probability set reaching top_p: dropping its least likely member
    # would fall below top_p
    full = probs_from_logits(x, temperature, 1.0, top_k)
    mass = full[kept].sum()
    assert mass >= top_p - 1e-9 or len(kept) == np.count_nonzero(full)
    assert mass - full[kept].min() < top_p + 1e-9
    # the kept tokens are the most likely ones
    if len(kept) < np.count_nonzero(full):
        assert full[kept].min() >= full[np.setdiff1d(np.nonzero(full)[0], kept)].max() - 1e-12


def test_inverse_cdf_draw_matches_probabilities():
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = [sample_from_probs(p, hash_uniform(7, i)) for i in range(20000)]
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert freq[1] == 0 and np.abs(freq - p).max() < 0.015


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_tiny("qwen3", path, seed=1)
    return LLM(str(path), device="cpu", max_num_seqs=8, max_model_len=128)


@pytest.mark.parametrize("draft_rank", [0, 1, 7])
def test_verifying_a_draft_leaves_the_distribution_exact(draft_rank):
    """A draft row's output (the draft if accepted, else the residual draw) is distributed as p:
    P(d) = p(d) and P(x) = (1 - p(d)) p(x) / (1 - p(d)) = p(x), whichever token was drafted."""
    from scipy.stats import chisquare

    from minillm.engine.sampler import sample

    rng = np.random.default_rng(draft_rank)
    V, n = 12, 20_000
    logits = np.tile(rng.standard_normal(V).astype(np.float32) * 2, (n, 1))
    temp, top_p, top_k = np.full(n, 0.9, np.float32), np.full(n, 0.95, np.float32), np.full(n, 8, np.int32)
    p = probs_from_logits(logits[0], 0.9, 0.95, 8)
    draft = np.full(n, int(np.argsort(-p, kind="stable")[draft_rank]), np.int32)
    out, accepted = np.zeros(n, np.int32), np.zeros(n, np.int32)
    sample(logits, temp, top_p, top_k, np.arange(n, dtype=np.uint64), np.full(n, 5, np.int32), out,
           draft, accepted)
    assert np.array_equal(accepted == 1, out == draft)
    assert abs(accepted.mean() - p[draft[0]]) < 4 * np.sqrt(p[draft[0]] * (1 - p[draft[0]]) / n) + 1e-9
    support = np.nonzero(p)[0]
    counts = np.bincount(out, minlength=V)
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[support], p[support] * n).pvalue > 0.001


def test_seeded_sampling_is_independent_of_the_batch(llm):
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, ignore_eos=True, seed=1234)
    alone = llm.generate([prompt], params)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=s) for s in range(5)]
    batched = llm.generate([[1, 2, 3]] * 2 + [prompt] + [[40, 41]] * 3, others[:2] + [params] + others[2:5])
    assert batched[2].token_ids == alone
    assert llm.generate([prompt], params)[0].token_ids == alone  # and across runs
    different = llm.generate([prompt], SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12,
                                                      ignore_eos=True, seed=99))[0].token_ids
    assert different != alone


def test_min_tokens_and_stop_token_ids(llm):
    prompt = [10, 11, 12]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].token_ids
    stop = greedy[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop]))[0]
    assert out.token_ids == [stop] and out.finish_reason == "stop"
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, min_tokens=4,
                                                stop_token_ids=[stop], ignore_eos=True))[0]
    assert stop not in out.token_ids[:4] and len(out.token_ids) >= 4


def test_stop_strings_cut_the_text_before_them(llm):
    prompt = [20, 21, 22]
    full = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    text = full.text
    assert len(text) > 6
    stop = text[3:6]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.text == text[: text.index(stop)]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_invalid_sampling_params_are_refused():
    for kw, msg in [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
                    ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_tokens": 5, "max_tokens": 2},
                                                                         "min_tokens"),
                    ({"stop": [""]}, "stop"), ({"seed": 1.5}, "seed")]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**kw)
