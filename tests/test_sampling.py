"""Sampling semantics on the NumPy backend: filters (top-k, min-p, top-p), seeds, min_tokens, stop
conditions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.engine.sampler import hash_uniform, probs_from_logits, sample_from_probs

from hf_models import make_tiny


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=40), st.integers(-1, 45), st.floats(0.05, 1.0),
       st.floats(0.2, 3.0), st.sampled_from([0.0, 0.0, 1e-6, 0.05, 0.3, 0.9, 1.0]))
@settings(max_examples=300, deadline=None)
def test_probs_filters(logits, top_k, top_p, temperature, min_p):
    x = np.array(logits, dtype=np.float32)
    p = probs_from_logits(x, temperature, top_p, top_k, min_p)
    assert abs(p.sum() - 1) < 1e-9 and (p >= 0).all()
    kept = np.nonzero(p)[0]
    if 0 < top_k < len(x):  # nothing outside the k largest (ties at the k-th value may stay)
        assert (x[kept] >= np.sort(x)[-top_k]).all()
    # min-p keeps only tokens with p >= min_p * max p, p after temperature alone
    plain = probs_from_logits(x, temperature, 1.0, -1)
    assert (plain[kept] >= min_p * plain.max() * (1 - 1e-12)).all()
    if min_p == 0:  # off: the same bits as leaving it out
        assert np.array_equal(p, probs_from_logits(x, temperature, top_p, top_k))
    # top-p keeps the smallest high-probability set reaching top_p: dropping its least likely member
    # would fall below top_p (of the mass top-k and min-p leave, renormalised)
    full = probs_from_logits(x, temperature, 1.0, top_k, min_p)
    mass = full[kept].sum()
    assert mass >= top_p - 1e-9 or len(kept) == np.count_nonzero(full)
    assert mass - full[kept].min() < top_p + 1e-9
    # the kept tokens are the most likely ones
    if len(kept) < np.count_nonzero(full):
        assert full[kept].min() >= full[np.setdiff1d(np.nonzero(full)[0], kept)].max() - 1e-12


def full_sort_top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """top_p_set's definition, by sorting the whole row: the ids with mass it keeps, as a mask."""
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    mask = np.zeros(p.shape, bool)
    mask[order[cum - p[order] < top_p]] = True
    return mask & (p > 0)


@pytest.mark.parametrize("kind", ["normal", "peaked", "flat", "integer-ties", "bf16"])
def test_top_p_set_keeps_what_sorting_the_whole_row_keeps(kind):
    """The NumPy sampler's top-p sorts only candidates (the m largest p, m growing) where their mass is
    enough: the same ids, and the same probabilities bit for bit, as sorting every id, for rows that
    take each path (a small kept set, a large one, a flat row that sorts everything, runs of ties, zeros
    left by top-k and min-p) and top_p from 0.05 to just under 1."""
    import ml_dtypes

    from minillm.engine.sampler import top_p_set

    rng = np.random.default_rng(len(kind))
    paths = set()
    for V in (3000, 49152):
        for _ in range(3):
            if kind == "integer-ties":
                logits = rng.integers(-6, 6, V).astype(np.float32)
            else:
                scale = {"normal": 3.0, "peaked": 8.0, "flat": 0.05, "bf16": 3.0}[kind]
                logits = (scale * rng.standard_normal(V)).astype(np.float32)
                if kind == "bf16":  # runs of equal logits around most cut-offs
                    logits = logits.astype(ml_dtypes.bfloat16).astype(np.float32)
            for temperature, top_k, min_p in ((0.7, -1, 0.0), (1.5, -1, 0.0), (0.6, 20, 0.0), (1.0, -1, 0.02)):
                full = probs_from_logits(logits, temperature, 1.0, top_k, min_p)
                for top_p in (0.05, 0.5, 0.9, 0.95, 0.999, 1 - 1e-13):
                    want = full_sort_top_p(full, top_p)
                    got = np.zeros(V, bool)
                    got[top_p_set(full, top_p)] = True
                    assert np.array_equal(got & (full > 0), want), (V, temperature, top_k, min_p, top_p)
                    ref = np.where(want, full, 0.0)
                    assert np.array_equal(probs_from_logits(logits, temperature, top_p, top_k, min_p),
                                          ref / ref.sum())
                    paths.add(want.sum() <= 256)
    assert paths == {True, False} or kind in ("flat", "peaked"), "both small and large kept sets were tried"


def test_descending_is_the_stable_descending_order():
    """descending(w) (NumPy's fast sort, ties put back in index order) is argsort(-w, kind="stable")
    exactly: distinct values, runs of ties (integer and bf16-rounded logits' probabilities, zeros),
    and small rows; with NaNs, the same order up to the NaNs, which come last."""
    import ml_dtypes

    from minillm.engine.sampler import descending

    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(50_000), np.exp(rng.integers(-6, 6, 50_000).astype(np.float64)),
            rng.standard_normal(50_000).astype(ml_dtypes.bfloat16).astype(np.float64),
            np.r_[np.zeros(20_000), rng.random(30_000)], np.zeros(1000), np.array([1.0]), np.array([2.0, 2.0])]
    for w in rows:
        assert np.array_equal(descending(w), np.argsort(-w, kind="stable")), w[:4]
    assert not np.array_equal(np.argsort(-rows[1]), np.argsort(-rows[1], kind="stable")), "the ties need the fix"
    w = rng.standard_normal(5000)
    w[rng.choice(5000, 40, replace=False)] = np.nan
    got, want = descending(w), np.argsort(-w, kind="stable")
    assert np.array_equal(got[:4960], want[:4960]) and np.isnan(w[got[4960:]]).all()


def test_top_p_set_takes_the_full_sort_without_a_usable_top():
    """NaN logits or a denormal largest p: no exception or warning, the full sort's answer."""
    from minillm.engine.sampler import top_p_set

    for bad in (np.full(3000, np.nan), np.r_[np.full(2999, 0.0), 5e-324]):
        order = np.argsort(-bad, kind="stable")
        cum = np.cumsum(bad[order])
        with np.errstate(invalid="ignore"):
            assert np.array_equal(np.sort(top_p_set(bad, 0.9)), np.sort(order[cum - bad[order] < 0.9]))


def test_min_p_keeps_tokens_within_min_p_of_the_top():
    """vLLM's min_p by hand: p >= min_p * p_max after temperature, renormalised."""
    x = np.array([2.0, 4.0, 3.0, 1.5, 0.0, -1.0], np.float32)  # p / p_max = e^(x - 4) at T = 1
    rel = np.exp(x.astype(np.float64) - 4.0)  # 0.135, 1, 0.368, 0.082, 0.018, 0.0067

    def only(keep, t=1.0):
        w = np.where(keep, np.exp((x.astype(np.float64) - 4.0) / t), 0.0)
        return w / w.sum()

    for min_p, keep in [(0.1, rel >= 0.1), (0.3, rel >= 0.3), (0.01, rel >= 0.01), (1.0, x == 4)]:
        assert np.allclose(probs_from_logits(x, 1.0, 1.0, -1, min_p), only(keep), rtol=1e-12, atol=0)
        assert np.count_nonzero(probs_from_logits(x, 1.0, 1.0, -1, min_p)) == keep.sum()
    # after temperature: T = 2 flattens e^(x - 4) to its square root, so 0.3 keeps 0.368 ** 0.5 and 0.135 ** 0.5
    assert np.allclose(probs_from_logits(x, 2.0, 1.0, -1, 0.3), only(np.sqrt(rel) >= 0.3, 2.0), rtol=1e-12, atol=0)
    assert np.count_nonzero(probs_from_logits(x, 2.0, 1.0, -1, 0.3)) == 3
    # ties at the top all stay with min_p = 1
    tied = np.array([3.0, 1.0, 3.0, 0.0], np.float32)
    assert probs_from_logits(tied, 0.7, 1.0, -1, 1.0).tolist() == [0.5, 0.0, 0.5, 0.0]


def test_min_p_composes_with_top_k_and_top_p():
    x = np.array([2.0, 4.0, 3.0, 1.5, 0.0, -1.0], np.float32)
    # min_p 0.1 keeps 3 tokens: top_k 2 is stricter and wins, top_k 5 is looser and min_p wins
    assert np.array_equal(probs_from_logits(x, 1.0, 1.0, 2, 0.1), probs_from_logits(x, 1.0, 1.0, 2))
    assert np.array_equal(probs_from_logits(x, 1.0, 1.0, 5, 0.1), probs_from_logits(x, 1.0, 1.0, -1, 0.1))
    # top_p applies to min_p's survivors renormalised: over the full distribution the two largest
    # hold 0.849 < 0.85, so top_p 0.85 keeps 3; over min_p 0.1's three they hold 0.910: 2 kept
    assert np.count_nonzero(probs_from_logits(x, 1.0, 0.85, -1)) == 3
    got = probs_from_logits(x, 1.0, 0.85, -1, 0.1)
    w = np.exp(np.array([0.0, 4.0, 3.0, 0, 0, 0]) - 4.0) * [0, 1, 1, 0, 0, 0]
    assert np.allclose(got, w / w.sum(), rtol=1e-12, atol=0)
    # and all three: top_k 2 and min_p 0.1 leave 2, top_p 0.7 of those (0.731 on the top one) keeps 1
    assert probs_from_logits(x, 1.0, 0.7, 2, 0.1).tolist() == [0, 1, 0, 0, 0, 0]


def test_min_p_sampling_never_draws_a_filtered_token():
    from minillm.engine.sampler import sample

    rng = np.random.default_rng(3)
    V, n = 40, 4000
    logits = np.tile((rng.standard_normal(V) * 0.5).astype(np.float32), (n, 1))
    temp, top_p, top_k = np.full(n, 0.8, np.float32), np.ones(n, np.float32), np.full(n, -1, np.int32)
    seeds, pos = np.arange(n, dtype=np.uint64), np.full(n, 9, np.int32)
    for mp in (0.05, 0.3):
        min_p = np.full(n, mp, np.float32)
        x = logits[0].astype(np.float64) / float(temp[0])  # in float64, from the float32 row values
        allowed = x >= x.max() + np.log(np.float64(min_p[0]))
        assert 1 < allowed.sum() < V
        out = np.zeros(n, np.int32)
        sample(logits, temp, top_p, top_k, seeds, pos, out, min_p=min_p)
        assert allowed[out].all() and len(set(out.tolist())) == allowed.sum()
        # with drafts (the verification rows): a filtered draft is never accepted, nor drawn
        draft = rng.integers(0, V, n).astype(np.int32)
        acc = np.zeros(n, np.int32)
        sample(logits, temp, top_p, top_k, seeds, pos, out, draft, acc, min_p)
        assert allowed[out].all() and not acc[~allowed[draft]].any() and acc[allowed[draft]].any()
    # min_p off (None or zeros) draws what it drew before; greedy ignores min_p
    ref, off = np.zeros(n, np.int32), np.zeros(n, np.int32)
    sample(logits, temp, top_p, top_k, seeds, pos, ref)
    sample(logits, temp, top_p, top_k, seeds, pos, off, min_p=np.zeros(n, np.float32))
    assert np.array_equal(ref, off)
    greedy = np.zeros(n, np.int32)
    sample(logits, np.zeros(n, np.float32), top_p, top_k, seeds, pos, greedy, min_p=np.ones(n, np.float32))
    assert (greedy == np.argmax(logits[0])).all()


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


@pytest.mark.parametrize("min_p", [0.0, 0.1])
@pytest.mark.parametrize("draft_rank", [0, 1, 7])
def test_verifying_a_draft_leaves_the_distribution_exact(draft_rank, min_p):
    """A draft row's output (the draft if accepted, else the residual draw) is distributed as p:
    P(d) = p(d) and P(x) = (1 - p(d)) p(x) / (1 - p(d)) = p(x), whichever token was drafted
    (one min-p filters out too: never accepted)."""
    from scipy.stats import chisquare

    from minillm.engine.sampler import sample

    rng = np.random.default_rng(draft_rank)
    V, n = 12, 20_000
    logits = np.tile(rng.standard_normal(V).astype(np.float32) * 2, (n, 1))
    temp, top_p, top_k = np.full(n, 0.9, np.float32), np.full(n, 0.95, np.float32), np.full(n, 8, np.int32)
    p = probs_from_logits(logits[0], 0.9, 0.95, 8, float(np.float32(min_p)))
    draft = np.full(n, int(np.argsort(-p, kind="stable")[draft_rank]), np.int32)
    out, accepted = np.zeros(n, np.int32), np.zeros(n, np.int32)
    sample(logits, temp, top_p, top_k, np.arange(n, dtype=np.uint64), np.full(n, 5, np.int32), out,
           draft, accepted, np.full(n, min_p, np.float32))
    assert np.array_equal(accepted == 1, out == draft)
    assert abs(accepted.mean() - p[draft[0]]) < 4 * np.sqrt(p[draft[0]] * (1 - p[draft[0]]) / n) + 1e-9
    support = np.nonzero(p)[0]
    counts = np.bincount(out, minlength=V)
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[support], p[support] * n).pvalue > 0.001


def draw_then_verify(p_logits, q_logits, filters, n, sample_fn):
    """n seeded rounds of one draft: d drawn from q (the drafter's row, seed salted as a drawing
    drafter salts it), then the target's row verifies it against that q. Returns (out, accepted, d)."""
    from minillm.engine.sampler import DRAFT_SEED_SALT

    temp, top_p, top_k, min_p = (np.full(n, f, dt) for f, dt in zip(filters, (np.float32, np.float32, np.int32,
                                                                            np.float32)))
    seeds, pos = np.arange(n, dtype=np.uint64), np.full(n, 5, np.int32)
    d = np.zeros(n, np.int32)
    sample_fn(np.tile(q_logits, (n, 1)), temp, top_p, top_k, seeds ^ np.uint64(DRAFT_SEED_SALT), pos, d, min_p=min_p)
    out, accepted = np.zeros(n, np.int32), np.zeros(n, np.int32)
    q_rows = np.zeros(n, np.int32)  # every row's q: the one drafter row
    sample_fn(np.tile(p_logits, (n, 1)), temp, top_p, top_k, seeds, pos, out, d, accepted, min_p,
              draft_logits=q_logits[None], draft_rows=q_rows)
    return out, accepted, d


@pytest.mark.parametrize("filters", [(1.0, 1.0, 0, 0.0), (0.8, 0.9, 0, 0.0), (1.3, 1.0, 6, 0.0), (1.0, 1.0, 0, 0.2)])
@pytest.mark.parametrize("q_vocab", [12, 9])
def test_verifying_drawn_drafts_against_q_leaves_the_distribution_exact(filters, q_vocab):
    """A draft drawn from the drafter's q (its own logits under the request's temperature and
    filters; a drafter over the first q_vocab ids only) and verified against that q: accepted with
    probability min(1, p / q), else drawn from max(p - q, 0). The output is distributed as p, and
    the acceptance rate is sum(min(p, q)), which one-hot verification of the same drafts (p(d))
    would not reach."""
    from scipy.stats import chisquare

    from minillm.engine.sampler import sample

    rng = np.random.default_rng(q_vocab)
    V, n = 12, 20_000
    p_logits = (rng.standard_normal(V) * 1.5).astype(np.float32)
    q_logits = (p_logits[:q_vocab] + rng.standard_normal(q_vocab).astype(np.float32) * 0.7).astype(np.float32)
    f = tuple(float(np.float32(x)) if i != 2 else x for i, x in enumerate(filters))
    p = probs_from_logits(p_logits, *f)
    q = np.zeros(V)
    q[:q_vocab] = probs_from_logits(q_logits, *f)
    out, accepted, d = draw_then_verify(p_logits, q_logits, filters, n, sample)
    assert np.array_equal(accepted == 1, out == d)
    assert (q[d] > 0).all()  # every draft is a draw from q
    rate = np.minimum(p, q).sum()
    assert abs(accepted.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / n) + 1e-9
    assert rate > (p * q).sum() + 0.05  # one-hot verification of draws from q accepts sum(p q)
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


def test_min_p_through_the_engine(llm):
    """min_p reaches the runner's sampling rows: min_p 1 keeps only the top token, so a hot
    sampled run is the greedy one; batched beside other requests a seeded min_p run is unchanged."""
    prompt = [5, 6, 7, 8, 9]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].token_ids
    hot = SamplingParams(temperature=1.5, min_p=1.0, max_tokens=12, ignore_eos=True, seed=3)
    assert llm.generate([prompt], hot)[0].token_ids == greedy
    assert llm.generate([prompt], SamplingParams(temperature=0, min_p=0.5, max_tokens=12,
                                                 ignore_eos=True))[0].token_ids == greedy
    params = SamplingParams(temperature=1.0, min_p=0.05, max_tokens=12, ignore_eos=True, seed=77)
    alone = llm.generate([prompt], params)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=s) for s in range(3)]
    batched = llm.generate([[1, 2, 3], prompt, [40, 41], [7]], [others[0], params, others[1], others[2]])
    assert batched[1].token_ids == alone


def test_min_tokens_and_stop_token_ids(llm):
    prompt = [10, 11, 12]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].token_ids
    stop = greedy[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop]))[0]
    assert out.token_ids == [stop] and (out.finish_reason, out.stop_reason) == ("stop", stop)  # vLLM's stop_reason
    # a stop token is not text, unless include_stop_str_in_output asks for it (as in vLLM): then the text
    # is what the same ids give when the output is cut there by max_tokens instead. Stopped on the first
    # greedy token (a first occurrence) that adds text
    def text(n):
        return llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0].text

    i = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i] and text(i) != text(i + 1))
    for include, want in ((False, text(i)), (True, text(i + 1))):
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[greedy[i]],
                                                    include_stop_str_in_output=include))[0]
        assert out.token_ids == greedy[: i + 1] and out.text == want, (include, out.text, want)
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
    assert out.finish_reason == "stop" and out.text == text[: text.index(stop)] and out.stop_reason == stop
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5 and out.stop_reason is None


def test_stop_strings_wait_for_more_than_min_tokens(llm):
    """As vLLM's detokenizer: a stop string is looked for only once more than min_tokens ids are out. One
    that the m-th id completes stops the output there with min_tokens = m - 1, and not with min_tokens = m
    (the next id's search starts past it, as vLLM's does)."""
    prompt = [30, 31, 32]

    def text(n):
        return llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0].text

    texts = [text(n) for n in range(1, 16)]
    m = next(m for m in range(2, 15) if texts[m - 1].startswith(texts[m - 2]) and len(texts[m - 1]) > len(texts[m - 2])
             and texts[m - 1].find(texts[m - 1][len(texts[m - 2]):]) == len(texts[m - 2]))
    stop = texts[m - 1][len(texts[m - 2]):]  # what the m-th id adds, first seen there
    before = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop],
                                                   min_tokens=m - 1))[0]
    assert len(before.token_ids) == m and before.finish_reason == "stop" and before.text == texts[m - 2]
    at = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop],
                                               min_tokens=m))[0]
    assert len(at.token_ids) > m and at.text.startswith(texts[m - 1])


def test_invalid_sampling_params_are_refused():
    for kw, msg in [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
                    ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"min_tokens": 5, "max_tokens": 2},
                                                                         "min_tokens"),
                    ({"stop": [""]}, "stop"), ({"seed": 1.5}, "seed"), ({"min_p": -0.1}, "min_p"),
                    ({"min_p": 1.5}, "min_p"), ({"min_p": float("nan")}, "min_p"), ({"min_p": "0.1"}, "min_p"),
                    ({"min_p": True}, "min_p"),
                    # values the runner's float32 buffers would turn into infinity or 0
                    ({"temperature": float("inf")}, "temperature"), ({"temperature": 1e39}, "temperature"),
                    ({"temperature": float("nan")}, "temperature"), ({"top_p": 1e-100}, "top_p"),
                    ({"top_p": float("nan")}, "top_p"), ({"temperature": True}, "temperature"),
                    ({"min_tokens": True}, "min_tokens"), ({"stop": 5}, "stop"),
                    # switches take booleans only: "false" would turn one on
                    ({"ignore_eos": "false"}, "ignore_eos must be True or False"),
                    ({"skip_special_tokens": "false"}, "skip_special_tokens"),
                    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
                    ({"stop_token_ids": 5}, "stop_token_ids"), ({"stop_token_ids": [True]}, "stop_token_ids"),
                    ({"logit_bias": [1, 2]}, "logit_bias must be a dict"), ({"n": 0}, "n must be an integer in"),
                    ({"structured_outputs": {"bogus": 1}}, "unknown field.*bogus")]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**kw)
    # their float32 limits themselves are served
    SamplingParams(temperature=3.4028234663852886e38, top_p=1.1754943508222875e-38, repetition_penalty=1e-30)


def test_generate_refuses_bad_prompts_and_leaves_nothing_behind(llm, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ref = llm.generate([[5, 6, 7]], params)[0].token_ids
    for bad in (None, 5, [None], [[True, False]]):
        with pytest.raises(ValueError, match="prompt"):
            llm.generate(bad, params)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate([[5, 6, 7]], {"max_tokens": 2})
    with pytest.raises(ValueError, match="got 0 sampling params for 1 prompts"):  # [] is not "none given"
        llm.generate([[5, 6, 7]], [])
    # a constraint refused only when its request is added (it does not compile) takes the batch's
    # earlier requests out with it
    bad = SamplingParams(max_tokens=2, structured_outputs={"regex": "(("})
    with pytest.raises(ValueError, match="prompt 2: structured_outputs"):
        llm.generate([[5, 6, 7]] * 3, [params, params, bad])
    assert not llm.engine.requests and not llm.engine.has_unfinished()
    assert llm.generate(np.array([5, 6, 7]), params)[0].token_ids == ref  # numpy ids are ids
    # interrupted mid-generation (Ctrl-C): its requests are aborted, not run first by the next call
    step, calls = llm.engine.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[9, 10, 11]] * 3, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    monkeypatch.undo()
    assert not llm.engine.requests  # none of the interrupted ones is left to run
    assert llm.generate([[5, 6, 7]], params)[0].token_ids == ref


def test_generate_takes_vllm_prompt_dicts(llm):
    """vLLM's TextPrompt {"prompt": text} and TokensPrompt {"prompt_token_ids": ids}, alone or in a list,
    run as their text or ids (they were refused as "got dict"); other keys are refused, not dropped.
    numpy ids come back as ints (json.dumps of prompt_token_ids failed on np.int64), and a tuple of
    SamplingParams is one a prompt, as a list is."""
    import json

    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    text = "hello there"
    ids = llm.tokenizer.encode(text)
    by_ids, by_text = llm.generate([[5, 6, 7], text], params)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt": text}], params)
    assert [(o.prompt_token_ids, o.token_ids) for o in out] == [([5, 6, 7], by_ids.token_ids), (ids, by_text.token_ids)]
    assert llm.generate({"prompt_token_ids": np.array([5, 6, 7])}, params)[0].token_ids == by_ids.token_ids
    for bad, words in [({"prompt": text, "prompt_token_ids": ids}, "exactly one of"), ({}, "exactly one of"),
                       ({"prompt": text, "multi_modal_data": {}}, "multi_modal_data"),
                       ({"prompt_token_ids": text}, "'prompt_token_ids' must be a list of token ids"),
                       ({"prompt": [5, 6]}, "'prompt' must be a string")]:
        with pytest.raises(ValueError, match=words):
            llm.generate([[5, 6, 7], bad], params)
    assert not llm.engine.requests
    out = llm.generate([[np.int64(5), np.int32(6), 7]], (params,))[0]
    assert json.loads(json.dumps(out.prompt_token_ids)) == [5, 6, 7] and out.token_ids == by_ids.token_ids
    assert len(llm.generate([[5], [6]], (params, params))) == 2


def test_generate_progress_bar_and_lora_request(llm, capsys):
    """vLLM's use_tqdm and lora_request keywords (they were a TypeError): a callable use_tqdm makes the bar
    and is advanced once a finished prompt; True draws one on stderr (tqdm's, or minillm's own line without
    tqdm); False leaves stderr alone; a LoRA adapter is refused by name before anything runs."""
    from minillm import llm as llm_module

    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    made = []

    class Bar:
        def __init__(self, total, desc):
            self.total, self.desc, self.n, self.closed = total, desc, 0, False
            made.append(self)

        def update(self, n=1):
            self.n += n

        def close(self):
            self.closed = True

    ref = llm.generate([[5, 6, 7], [8, 9]], params)
    out = llm.generate([[5, 6, 7], [8, 9]], params, use_tqdm=Bar)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    assert [(b.total, b.n, b.closed) for b in made] == [(2, 2, True)]
    capsys.readouterr()
    llm.generate([[5, 6, 7]], params, use_tqdm=False)
    assert capsys.readouterr().err == ""
    llm.generate([[5, 6, 7]], params, use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err
    bar = llm_module._StderrProgress(total=2, desc="Processed prompts")
    bar.update(1)
    bar.update(1)
    bar.close()
    assert capsys.readouterr().err.split("\r")[-1] == "Processed prompts: 2/2\n"
    chats = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=Bar)
    assert len(chats) == 1 and made[-1].n == 1
    for kwargs, words in [(dict(use_tqdm="yes"), "use_tqdm must be True, False or a callable"),
                          (dict(lora_request=object()), "no LoRA adapters")]:
        with pytest.raises(ValueError, match=words):
            llm.generate([[5, 6, 7]], params, **kwargs)
        with pytest.raises(ValueError, match=words):
            llm.chat([{"role": "user", "content": "hi"}], params, **kwargs)
    assert not llm.engine.requests


def test_chat_names_what_the_template_refuses(tiny):
    """LLM.chat: the template's own refusal (raise_exception, a field it lacks), chat_template_kwargs
    that collide with the template's inputs and non-boolean switches were a jinja2 error, a TypeError
    from inside the tokenizer, or (add_generation_prompt="no") silently a generation prompt; each is now
    a ValueError naming it (and the conversation, in a batch), and the engine runs on."""
    template = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                "{{ raise_exception('a system message must come first') }}{% endif %}"
                "[{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% endif %}]"
                "{% if m.content == 'zero' %}{{ 1 / 0 }}{% endif %}"
                "{% if m.content == 'big' %}{{ range(10 ** 8) | length }}{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    llm = LLM(str(tiny), device="cpu", max_model_len=64, chat_template=template)
    greedy = SamplingParams(temperature=0, max_tokens=2)
    hi = {"role": "user", "content": "hi"}
    ref = llm.chat([hi], greedy)[0]
    with pytest.raises(ValueError, match=r"^conversation 1: the chat template refused the messages "
                                         r"\(TemplateError: a system message must come first\)"):
        llm.chat([[hi], [hi, {"role": "system", "content": "late"}]], greedy)
    with pytest.raises(ValueError, match=r"the chat template refused the messages \(UndefinedError: .*function"):
        llm.chat([hi, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}], greedy)
    # the template's own bugs on some messages (a raw ZeroDivisionError / OverflowError before)
    for content, why in (("zero", "ZeroDivisionError: division by zero"), ("big", "OverflowError: Range too big")):
        with pytest.raises(ValueError, match=rf"the chat template refused the messages \(TemplateError: {why}"):
            llm.chat([{"role": "user", "content": content}], greedy)
    for kw in ({"messages": []}, {"add_generation_prompt": False}, {"bos_token": "x"}, {1: 2}, {"a-b": 1}):
        with pytest.raises(ValueError, match="chat_template_kwargs key .* is not allowed"):
            llm.chat([hi], greedy, chat_template_kwargs=kw)
    for kw in ({"add_generation_prompt": "no"}, {"continue_final_message": 1}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be True or False"):
            llm.chat([hi], greedy, **kw)
    assert not llm.engine.requests
    out = llm.chat([hi], greedy)[0]
    assert (out.prompt_token_ids, out.token_ids) == (ref.prompt_token_ids, ref.token_ids)
    assert llm.chat([hi], greedy, add_generation_prompt=False)[0].prompt_token_ids == llm.tokenizer.encode("[hi]")


def test_truncate_prompt_tokens(llm):
    """vLLM's truncate_prompt_tokens in LLM.generate / LLM.chat / add_request: k keeps the prompt's
    last k tokens (what that tail alone gives; prompt_token_ids and prompt_logprobs are the tail's),
    a prompt of k or fewer is kept whole, -1 keeps max_model_len - max_tokens (so a prompt longer
    than the context runs); anything but an integer >= 1 or -1 is refused naming the field."""
    params = dict(temperature=0, max_tokens=4, ignore_eos=True)
    ids = [5 + i % 50 for i in range(40)]
    ref = llm.generate([ids[-9:]], SamplingParams(**params, prompt_logprobs=1))[0]
    out = llm.generate([ids], SamplingParams(**params, prompt_logprobs=1, truncate_prompt_tokens=9))[0]
    assert out.prompt_token_ids == ids[-9:] and out.token_ids == ref.token_ids
    assert len(out.prompt_logprobs) == 9 and out.prompt_logprobs[0] is None
    assert [lp.logprob for lp in out.prompt_logprobs[1:]] == pytest.approx(
        [lp.logprob for lp in ref.prompt_logprobs[1:]], abs=1e-5)
    whole = llm.generate([ids], SamplingParams(**params))[0]
    for k in (40, 1000):
        same = llm.generate([ids], SamplingParams(**params, truncate_prompt_tokens=k))[0]
        assert same.prompt_token_ids == ids and same.token_ids == whole.token_ids
    text = llm.tokenizer.decode(ids)
    assert llm.generate(text, SamplingParams(**params, truncate_prompt_tokens=9))[0].prompt_token_ids == \
        llm.tokenizer.encode(text)[-9:]

    # longer than max_model_len (128): -1 keeps 128 - max_tokens, refused without it
    long = [5 + i % 50 for i in range(300)]
    out = llm.generate([long, ids], SamplingParams(**params, truncate_prompt_tokens=-1))
    assert out[0].prompt_token_ids == long[-124:] and len(out[0].token_ids) == 4
    assert out[0].token_ids == llm.generate([long[-124:]], SamplingParams(**params))[0].token_ids
    assert out[1].prompt_token_ids == ids
    with pytest.raises(ValueError, match="prompt 0: the prompt has 300 tokens"):
        llm.generate([long, ids], SamplingParams(**params))
    with pytest.raises(ValueError, match="truncate_prompt_tokens -1 keeps max_model_len 128 - max_tokens 128"):
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=128, truncate_prompt_tokens=-1))
    # the engine's own entry point (the chat REPL's and the server's)
    eng = llm.engine
    rid = eng.add_request(long, SamplingParams(**params, truncate_prompt_tokens=100))
    assert eng.requests[rid].prompt_ids == long[-100:]
    eng.abort_request(rid)
    # LLM.chat: the rendered conversation's last k tokens
    msgs = [{"role": "user", "content": "hello there, how are you"}]
    full = llm.chat(msgs, SamplingParams(**params))[0].prompt_token_ids
    cut = llm.chat(msgs, SamplingParams(**params, truncate_prompt_tokens=6))[0]
    assert cut.prompt_token_ids == full[-6:] and len(full) > 6

    for bad in (0, -2, 1.5, True, "4", [4]):
        with pytest.raises(ValueError, match="truncate_prompt_tokens must be None, an integer >= 1"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_cpu_sampler_bench_times_each_tree_and_refuses_a_wrong_one(tmp_path):
    """scripts/cpu_sampler_bench.py: a row per vocabulary and mode with a time per tree; a folder
    without minillm/engine/sampler.py is named and refused before anything runs."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = [sys.executable, str(root / "scripts" / "cpu_sampler_bench.py")]
    r = subprocess.run([*script, str(root), str(root), "--vocab", "3000", "--repeats", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("V=   3000")]
    assert len(rows) == 6 and all(len(line.split("ms a row")[0].split()) >= 4 for line in rows)
    r = subprocess.run([*script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{tmp_path} holds no minillm/engine/sampler.py" in r.stderr
