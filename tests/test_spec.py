"""Speculative decoding is lossless: greedy token-identical, sampled distribution-identical.

Also checks the DFlash drafter against the `dflash` reference package on the same weights.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.tools.random_model import write_dflash_drafter, write_random_model

from hf_models import make_tiny

PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7],
    list(range(1, 21)) + [1, 2, 3],
    [9, 9, 9],
    [100, 101, 102, 100, 101],
    [42],
    list(range(30, 70)),
] * 3  # 18 requests: concurrency up to 16 with some waiting


def write_models(tmp_path_factory) -> tuple:
    """A tiny Qwen3 target and a poorer one-layer drafter with its tokenizer."""
    target = tmp_path_factory.mktemp("target")
    make_tiny("qwen3", target, seed=0)
    poor = tmp_path_factory.mktemp("poor")
    make_tiny("qwen3", poor, seed=7, num_hidden_layers=1)
    return target, poor


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return write_models(tmp_path_factory)


def spec_configs(models, k):
    target, poor = models
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3},
        "draft_model": {"method": "draft_model", "model": str(poor), "num_speculative_tokens": k},
        "self_draft": {"method": "draft_model", "model": str(target), "num_speculative_tokens": k},
    }


@pytest.fixture(scope="module")
def greedy_reference(models):
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=16, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("method", ["ngram", "draft_model", "self_draft"])
def test_greedy_lossless(models, greedy_reference, method, k):
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=16, max_model_len=128,
              speculative_config=spec_configs(models, k)[method])
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == greedy_reference
    spec = llm.engine.stats().spec
    assert spec["rounds"] > 0
    if method == "self_draft":  # the model drafting for itself is always right
        assert spec["acceptance_rate"] == 1.0


@pytest.mark.parametrize("method", ["ngram", "self_draft"])
def test_min_p_reaches_the_verification_rows(models, greedy_reference, method):
    """min_p 1 keeps only each row's top token, so hot sampling with drafts verified is greedy
    decoding: the verification rows (accept, residual, bonus) filter by min_p as plain rows do."""
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=16, max_model_len=128,
              speculative_config=spec_configs(models, 3)[method])
    params = [SamplingParams(temperature=1.7, min_p=1.0, max_tokens=24, ignore_eos=True, seed=s)
              for s in range(len(PROMPTS))]
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == greedy_reference
    spec = llm.engine.stats().spec
    assert 0 < spec["accepted_tokens"] < spec["draft_tokens"] or method == "self_draft"
    assert spec["acceptance_rate"] == 1.0 or method == "ngram"  # the model drafting for itself is right


@pytest.mark.parametrize("method", ["draft_model", "self_draft"])
def test_draft_model_draft_vocab_is_lossless(models, greedy_reference, method):
    """draft_vocab_size with a drafter model: its LM head keeps the first 64 rows, so every draft
    is an id below 64, and the output is still plain greedy decoding's. The model drafting for
    itself then accepts only where its own next token is below 64."""
    cfg = {**spec_configs(models, 3)[method], "draft_vocab_size": 64}
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=16, max_model_len=128, speculative_config=cfg)
    proposer = llm.engine.proposer
    assert proposer.model.lm_head.shape[0] == 64 == proposer.draft_vocab_size
    drafted = []
    propose = proposer.propose
    proposer.propose = lambda seqs, ks: (propose(seqs, ks), drafted.extend(t for s in seqs for t in s.draft_ids))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == greedy_reference
    assert drafted and max(drafted) < 64
    spec = llm.engine.stats().spec
    if method == "self_draft":
        below = sum(t < 64 for ids in greedy_reference for t in ids)
        assert 0 < spec["accepted_tokens"] <= below
        assert spec["acceptance_rate"] < 1.0 or below == sum(map(len, greedy_reference))


def test_draft_vocab_with_logit_adjustments(models):
    """Requests whose logits are adjusted (min_tokens banning stop ids, logit_bias, penalties) on
    ids past a drafter's draft_vocab_size: the drafter's own steps skip those ids (its logits stop
    at 64 columns) and the output is non-speculative decoding's; the LLM API's stop ids past the
    vocabulary are no-ops there too. These killed the engine with an IndexError."""
    target = str(models[0])
    cfg = {**spec_configs(models, 3)["self_draft"], "draft_vocab_size": 64}
    spec = LLM(target, device="cpu", max_num_seqs=4, max_model_len=128, speculative_config=cfg)
    plain = LLM(target, device="cpu", max_num_seqs=4, max_model_len=128)
    vocab = plain.engine.model.cfg.vocab_size
    prompts = [[1, 2, 3, 200], [5, 100, 7]]  # ids past 64 in the prompts (repetition penalty)
    for params in (SamplingParams(temperature=0, max_tokens=8, min_tokens=4, stop_token_ids=[vocab + 5]),
                   SamplingParams(temperature=0, max_tokens=8, logit_bias={150: 5.0, 3: 1.0}),
                   SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.3, presence_penalty=0.5)):
        want = [o.token_ids for o in plain.generate(prompts, params)]
        assert [o.token_ids for o in spec.generate(prompts, params)] == want
    assert spec.engine.stats().spec["draft_tokens"] > 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_lossless_with_preemption(models, greedy_reference, method):
    # 16 sequences of up to 128 tokens need 128 blocks of 16; 24 blocks force preemption
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=16, max_model_len=128, num_blocks=24,
              speculative_config=spec_configs(models, 3)[method])
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == greedy_reference
    assert llm.engine.stats().preemptions > 0


def test_stop_inside_accepted_run(models):
    """max_tokens and stop tokens cut an accepted run exactly where plain decoding stops."""
    target = str(models[0])
    base = LLM(target, device="cpu").generate(PROMPTS[:4], SamplingParams(temperature=0, max_tokens=40,
                                                                           ignore_eos=True))
    stop_ids = [b.token_ids[5] for b in base]
    spec = LLM(target, device="cpu", speculative_config=spec_configs(models, 8)["self_draft"])
    for b, stop in zip(base, stop_ids):
        out = spec.generate([b.prompt_token_ids], SamplingParams(temperature=0, max_tokens=7,
                                                                 stop_token_ids=[stop], ignore_eos=True))[0]
        first = b.token_ids.index(stop)
        if first < 7:
            assert out.token_ids == b.token_ids[: first + 1] and (out.finish_reason, out.stop_reason) == ("stop", stop)
        else:
            assert out.token_ids == b.token_ids[:7] and out.finish_reason == "length"


def test_stop_string_inside_accepted_run(models):
    """A stop string completed mid-run ends the output at the same token as plain decoding."""
    target = str(models[0])
    plain = LLM(target, device="cpu")
    spec = LLM(target, device="cpu", speculative_config=spec_configs(models, 8)["self_draft"])
    checked = 0
    for prompt in PROMPTS[:4]:
        full = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
        if len(full.text) < 12:
            continue
        stop = full.text[8:11]
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
        a = plain.generate([prompt], params)[0]
        b = spec.generate([prompt], params)[0]
        assert (b.token_ids, b.text, b.finish_reason, b.stop_reason) == (a.token_ids, a.text, "stop", stop)
        assert len(b.token_ids) < 40
        kept = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop],
                              include_stop_str_in_output=True)
        c = spec.generate([prompt], kept)[0]
        assert (c.token_ids, c.text) == (a.token_ids, a.text + stop)  # the same cut, the string kept
        checked += 1
    assert checked >= 2


def exact_two_token_distribution(llm, prompt, params):
    """P(t1, t2) under the target with params' temperature and filters, from its logits."""
    from minillm.engine.sampler import probs_from_logits

    # the sampler sees each parameter as a float32 row value
    filters = (float(np.float32(params.temperature)), float(np.float32(params.top_p)), params.top_k,
               float(np.float32(params.min_p)))
    first = probs_from_logits(llm.engine.score([prompt])[0][-1], *filters)
    joint = {}
    for t1 in np.nonzero(first)[0]:
        second = probs_from_logits(llm.engine.score([prompt + [int(t1)]])[0][-1], *filters)
        for t2 in np.nonzero(second)[0]:
            joint[(int(t1), int(t2))] = first[t1] * second[t2]
    return joint


def chi_square_p(counts: dict, probs: dict, n: int) -> float:
    from scipy.stats import chisquare

    keys = sorted(probs)
    unexpected = sum(c for key, c in counts.items() if key not in probs)
    assert unexpected == 0, f"{unexpected} samples outside the target's support"
    obs = np.array([counts.get(key, 0) for key in keys], dtype=np.float64)
    exp = np.array([probs[key] for key in keys]) * n
    return chisquare(obs, exp).pvalue


def two_token_counts(llm, prompt, n: int) -> dict:
    """How often each pair of first two tokens came out of n seeded requests (temperature 1.3, top-k 5)."""
    counts: dict = {}
    for start in range(0, n, 1000):
        ps = [SamplingParams(temperature=1.3, top_k=5, max_tokens=2, ignore_eos=True, seed=s)
              for s in range(start, start + 1000)]
        for out in llm.generate([prompt] * 1000, ps):
            key = tuple(out.token_ids)
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("method", ["none", "ngram", "draft_model"])
def test_sampling_lossless(models, method):
    """20,000 seeded samples of two tokens match the target's exact joint distribution.

    The prompt holds every token of the tiny vocabulary, so the n-gram drafter always finds the
    first sampled token earlier and proposes (mostly wrong) continuations.
    """
    prompt = np.random.default_rng(0).permutation(256).tolist()
    spec = None if method == "none" else spec_configs(models, 3)[method]
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=1000, max_model_len=264, max_num_batched_tokens=16000,
              speculative_config=spec)
    params = SamplingParams(temperature=1.3, top_k=5, max_tokens=2, ignore_eos=True)
    probs = exact_two_token_distribution(llm, prompt, params)
    n = 20_000
    assert chi_square_p(two_token_counts(llm, prompt, n), probs, n) > 0.001
    if method != "none":
        assert llm.engine.stats().spec["draft_tokens"] > 0  # drafts were really verified


@pytest.mark.parametrize("batched_tokens", [16000, 16])
def test_draft_model_drafts_drawn_from_q_are_accepted(models, batched_tokens):
    """At temperature > 0 the draft model draws each draft from q (its step's distribution under the
    request's filters) and the target verifies it against q: a model drafting for itself (q = p up to
    rounding) has nearly every draft accepted, where one-hot verification would accept d with
    probability p(d) only (~1 / vocab for this nearly flat random model). batched_tokens 16: the
    drafter catches up on the prompts in chunks, so a step's q rows land in scattered slots."""
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=4, max_model_len=128,
              max_num_batched_tokens=batched_tokens, speculative_config=spec_configs(models, 3)["self_draft"])
    assert llm.engine.runner.draft_q is llm.engine.proposer
    params = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, ignore_eos=True, seed=s) for s in range(7)]
    params.append(SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))  # a greedy row beside them
    llm.generate(PROMPTS[:8], params)
    stats = llm.engine.stats().spec
    assert stats["draft_tokens"] > 100 and stats["acceptance_rate"] > 0.9, stats


def test_draft_model_drafts_drawn_from_q_with_preemption(models):
    """Drawn drafts under preemption (a pool of 24 blocks for 16 sequences): every output runs to
    its length and the self-drafts stay accepted against q."""
    llm = LLM(str(models[0]), device="cpu", max_num_seqs=16, max_model_len=128, num_blocks=24,
              speculative_config=spec_configs(models, 3)["self_draft"])
    outs = llm.generate(PROMPTS, [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s)
                                  for s in range(len(PROMPTS))])
    assert all(len(o.token_ids) == 24 for o in outs)
    assert llm.engine.stats().preemptions > 0
    stats = llm.engine.stats().spec
    assert stats["draft_tokens"] > 100 and stats["acceptance_rate"] > 0.9, stats


@pytest.fixture(scope="module")
def dflash_pair(tmp_path_factory):
    target = tmp_path_factory.mktemp("dft")
    write_random_model(target, "tiny", seed=3, force=True)
    drafter = tmp_path_factory.mktemp("dfd")
    write_dflash_drafter(drafter, target, seed=4, force=True)
    return target, drafter


@pytest.mark.parametrize("k", [1, 3, 8])
def test_dflash_greedy_lossless(dflash_pair, k):
    target, drafter = dflash_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = LLM(str(target), device="cpu", max_model_len=256).generate(PROMPTS[:6], params)
    llm = LLM(str(target), device="cpu", max_model_len=256, speculative_config={
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": k})
    outs = llm.generate(PROMPTS[:6], params)
    assert [o.token_ids for o in outs] == [b.token_ids for b in base]
    assert llm.engine.stats().spec["draft_tokens"] > 0


def test_dflash_drawn_drafts_sampling_lossless(dflash_pair):
    """At temperature > 0 the DFlash drafter draws its drafts from q (its rows' distributions
    under the request's filters) and the target verifies them against q: 20,000 seeded samples of
    two tokens match the target's exact joint distribution; and without filters, where the random
    drafter's q is close to the target's p (both nearly flat), most drafts are accepted, which
    one-hot verification (accepting d with probability p(d), ~1 / vocab here) would not do."""
    target, drafter = dflash_pair
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3}
    llm = LLM(str(target), device="cpu", max_num_seqs=1000, max_model_len=64, max_num_batched_tokens=16000,
              speculative_config=spec)
    assert llm.engine.runner.draft_q is llm.engine.proposer
    prompt = PROMPTS[0]
    params = SamplingParams(temperature=1.3, top_k=5, max_tokens=2, ignore_eos=True)
    probs = exact_two_token_distribution(llm, prompt, params)
    n = 20_000
    assert chi_square_p(two_token_counts(llm, prompt, n), probs, n) > 0.001
    assert llm.engine.stats().spec["draft_tokens"] > 0
    flat = LLM(str(target), device="cpu", max_num_seqs=16, max_model_len=128, speculative_config=spec)
    flat.generate(PROMPTS[:8], [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s)
                                for s in range(8)])
    stats = flat.engine.stats().spec
    assert stats["draft_tokens"] > 50 and stats["acceptance_rate"] > 0.3


def test_dflash_rounds_never_run_the_fused_decode_step(dflash_pair, monkeypatch):
    """decode_step_attention (one kernel: q/k norm + RoPE, KV store, attention) sees one new token a
    sequence, so a verification step (k + 1 rows a sequence) and the non-causal DFlash drafter must
    take the separate ops. cuda/decode_attention.cu tunes the fused kernel's merge apart from
    verification's on this (DEC_MERGE_FLIGHT_ROPE, session 25): plain decoding calls it with runs of
    one row only, a DFlash run not at all."""
    import inspect

    from minillm.backends.numpy_ops import NumpyBackend

    target, drafter = dflash_pair
    runs: list[list[int]] = []
    fused = NumpyBackend.decode_step_attention

    def recorded(self, *args, **kwargs):
        query_start = inspect.signature(fused).bind(self, *args, **kwargs).arguments["query_start"]
        runs.append(np.diff(np.asarray(query_start)).tolist())
        return fused(self, *args, **kwargs)

    monkeypatch.setattr(NumpyBackend, "decode_step_attention", recorded)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    LLM(str(target), device="cpu", max_model_len=256).generate(PROMPTS[:3], params)
    assert runs and all(set(r) == {1} for r in runs)
    runs.clear()
    llm = LLM(str(target), device="cpu", max_model_len=256, speculative_config={
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": 3})
    llm.generate(PROMPTS[:3], params)
    assert llm.engine.stats().spec["draft_tokens"] > 0
    assert runs == []


@pytest.mark.parametrize("k,frac", [(3, 4), (8, 4), (8, 0)])
def test_dflash_draft_vocab_is_lossless(dflash_pair, monkeypatch, k, frac):
    """draft_vocab_size: the drafter's LM head is the first V' rows of the target's, so every draft
    is an id below V' (frac 0: V' = 1, every draft is id 0); the output is still plain greedy
    decoding's, token for token."""
    from minillm.spec.dflash import DFlashProposer

    target, drafter = dflash_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(target), device="cpu", max_model_len=256)
    base = plain.generate(PROMPTS[:6], params)
    drafted = []
    assign = DFlashProposer._assign
    monkeypatch.setattr(DFlashProposer, "_assign",
                        lambda self, tokens, waiting: (drafted.extend(np.asarray(tokens).tolist()),
                                                       assign(self, tokens, waiting)))
    dv = plain.engine.config.vocab_size // frac if frac else 1
    llm = LLM(str(target), device="cpu", max_model_len=256, speculative_config={
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": k, "draft_vocab_size": dv})
    assert llm.engine.proposer.model.lm_head.shape[0] == dv == llm.engine.proposer.draft_vocab_size
    outs = llm.generate(PROMPTS[:6], params)
    assert [o.token_ids for o in outs] == [b.token_ids for b in base]
    assert llm.engine.stats().spec["draft_tokens"] > 0
    assert drafted and max(drafted) < dv
    if not frac:
        assert set(drafted) == {0}


def test_dflash_lossless_with_preemption_and_deferred_drafts(dflash_pair):
    """A pool small enough to preempt while drafts are still on the device (each round's drafting
    step is launched without waiting, and the next verification takes its drafts there): output
    identical to plain decoding, and verification steps really took device drafts."""
    target, drafter = dflash_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = LLM(str(target), device="cpu", max_model_len=128, max_num_seqs=16).generate(PROMPTS, params)
    llm = LLM(str(target), device="cpu", max_model_len=128, max_num_seqs=16, num_blocks=30,
              speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3})
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [b.token_ids for b in base]
    assert llm.engine.stats().preemptions > 0
    assert llm.engine.runner.draft_fills > 0 and llm.engine.drafted_behind > 0


def test_dflash_device_drafts_are_the_host_drafts(dflash_pair):
    """Every verification row that took its draft on the device (input id and the sampler's draft
    token) holds exactly the draft the host accepts against once the drafts are resolved."""
    from minillm.engine.engine import LLMEngine

    target, drafter = dflash_pair
    eng = LLMEngine(model=str(target), device="cpu", max_model_len=128, max_num_seqs=8,
                    speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 5})
    checked = []
    verify = eng._verify

    def checked_verify(item, row_tokens, r):
        d, k = eng.runner.buf.dev, item.num_draft
        rows = d["logits_indices"][r : r + k]
        assert d["draft_tokens"][r : r + k].tolist() == item.seq.draft_ids[:k]
        assert d["input_ids"][rows + 1].tolist() == item.seq.draft_ids[:k]
        checked.append(k)
        return verify(item, row_tokens, r)

    eng._verify = checked_verify
    run_engine(eng, PROMPTS[:8], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert sum(checked) > 0 and eng.runner.draft_fills > 0


def oracle_drafter(engine, continuations: dict) -> None:
    """Make engine's DFlash drafter propose, for about three positions in four, the token plain
    greedy decoding puts there (continuations: prompt ids -> every id of that run), so drafts
    are accepted and rounds advance by 0 to k: its sampler's ids are overwritten, by each row's
    sequence (its seed) and the position it drafts for (block row j's mask sits at start + j and
    is drafted for itself; sample_pos, as the device left it, says start + j + 1)."""
    runner = engine.proposer.runner
    original = runner._sample

    def sample(logits, r):
        original(logits, r)
        d = runner.buf.dev
        by_seed = {s.seed: s for s in engine.requests.values()}
        for row in range(r):
            seq, pos = by_seed.get(int(d["seeds"][row])), int(d["sample_pos"][row]) - 1
            ids = continuations.get(tuple(seq.prompt_ids)) if seq is not None else None
            if ids is not None and pos < len(ids) and (pos * 7 + seq.seed) % 4:
                d["out_tokens"][row] = ids[pos]

    runner._sample = sample


def test_dflash_early_drafts_are_the_late_drafts(dflash_pair):
    """Early drafting (the drafting step launched right behind the verification, each block's start
    set on the device from the accept flags) drafts exactly what drafting after the host has read
    the results does: every verification takes the same drafts at the same position, with prompts
    of mixed lengths (prefill chunks, decodes and verifications in one step) and a drafter right
    often enough that rounds accept 0 to k drafts; the output is plain greedy decoding's."""
    from minillm.engine.engine import LLMEngine

    target, drafter = dflash_pair
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain_engine = LLMEngine(model=str(target), device="cpu", max_model_len=128, max_num_seqs=8)
    plain = run_engine(plain_engine, PROMPTS, params)
    continuations = {tuple(plain_engine.encode_prompt(p)): plain_engine.encode_prompt(p) + list(ids)
                     for p, (ids, _, _) in zip(PROMPTS, plain)}
    runs = []
    for early in (True, False):
        eng = LLMEngine(model=str(target), device="cpu", max_model_len=128, max_num_seqs=8,
                        max_num_batched_tokens=64,
                        speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 5})
        eng.early_drafts = early
        oracle_drafter(eng, continuations)
        verified = []
        verify = eng._verify

        def recorded(item, row_tokens, r, verify=verify, verified=verified):
            verified.append((tuple(item.seq.prompt_ids), item.start, tuple(item.seq.draft_ids[: item.num_draft])))
            return verify(item, row_tokens, r)

        eng._verify = recorded
        assert run_engine(eng, PROMPTS, params) == plain
        runs.append((verified, eng.drafted_behind, eng.stats().spec))
    (early_drafts, behind, stats), (late_drafts, none, late_stats) = runs
    assert behind > 0 and none == 0
    assert stats["mean_acceptance_length"] > 2 and stats == late_stats
    by_request = [sorted(v, key=lambda x: (x[0], x[1])) for v in (early_drafts, late_drafts)]
    assert len(early_drafts) > 10 and by_request[0] == by_request[1]


def run_engine(engine, prompts, params) -> list[tuple]:
    """Drive an LLMEngine step by step, as the server does (no output overlap); each request's
    (token ids, text, finish reason)."""
    ids = [engine.add_request(p, params) for p in prompts]
    final = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = (o.token_ids, o.text, o.finish_reason)
    return [final[i] for i in ids]


def test_dflash_stop_strings_with_deferred_drafts(dflash_pair):
    """Stop strings found while rendering a step whose drafting step is already on the device end
    their sequences exactly where plain decoding does, and the others, whose blocks the freed
    ones may become, go on unharmed (engine stepped directly, as the server drives it)."""
    from minillm.engine.engine import LLMEngine

    target, drafter = dflash_pair
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLMEngine(model=str(target), device="cpu", max_model_len=128, max_num_seqs=16, num_blocks=40)
    full = run_engine(plain, PROMPTS[:6], greedy)
    stops = sorted({text[6:8] for _, text, _ in full if len(text) > 10})
    assert stops
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=stops)
    want = run_engine(plain, PROMPTS, params)
    spec = LLMEngine(model=str(target), device="cpu", max_model_len=128, max_num_seqs=16, num_blocks=40,
                     speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3})
    assert run_engine(spec, PROMPTS, params) == want
    assert any(reason == "stop" for _, _, reason in want)
    assert spec.runner.draft_fills > 0


REF_PROMPT = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 300, 301, 302]


def first_block(target_dir, drafter_dir, ref_target, ref_draft):
    """One block drafted after REF_PROMPT's prefill, by minillm and by the reference drafter on the
    reference target's hidden states: (our draft hidden states, our drafts, the reference's final
    hidden states of the block, the block's first token)."""
    from dflash.model import extract_context_feature

    bs = ref_draft.block_size
    llm = LLM(str(target_dir), device="cpu", max_model_len=256, speculative_config={
        "method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": bs - 1})
    eng = llm.engine
    eng.add_request(REF_PROMPT, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), "r")
    eng.step()  # prefill: samples the first token, then launches the drafting of one block
    eng.proposer.resolve()  # the drafts' ids on the host (the next step would take them on the device)
    seq = eng.requests["r"]
    ours_hidden = eng.backend.to_host(eng.proposer.runner.ws.normed[:bs]).copy()
    with torch.no_grad():
        out = ref_target(torch.tensor([REF_PROMPT]), output_hidden_states=True)
        first = int(out.logits[0, -1].argmax())
        assert first == seq.output_ids[0]
        feats = extract_context_feature(out.hidden_states, ref_draft.target_layer_ids)
        block = torch.tensor([[first] + [ref_draft.mask_token_id] * (bs - 1)])
        noise = ref_target.get_input_embeddings()(block)
        pos = torch.arange(len(REF_PROMPT) + bs)[None]
        hidden = ref_draft(target_hidden=feats, noise_embedding=noise, position_ids=pos)[0]
    rel = np.abs(ours_hidden - hidden.numpy()).max() / np.abs(hidden.numpy()).max()
    assert rel < 1e-4, f"draft hidden states differ: relative error {rel:.2e}"
    return list(seq.draft_ids), hidden, first


def test_dflash_matches_reference(dflash_pair):
    """Draft hidden states and tokens equal dflash.DFlashDraftModel's, and dflash_generate agrees."""
    from dflash.model import DFlashDraftModel, dflash_generate
    from transformers import AutoModelForCausalLM

    target_dir, drafter_dir = dflash_pair
    ref_target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ref_draft = DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    prompt = REF_PROMPT
    ours_draft, hidden, _ = first_block(target_dir, drafter_dir, ref_target, ref_draft)
    with torch.no_grad():
        ref_draft_tokens = ref_draft.compute_logits(hidden[1:], ref_target.lm_head).argmax(-1)
    assert ours_draft == ref_draft_tokens.tolist()

    full = LLM(str(target_dir), device="cpu", max_model_len=256, speculative_config={
        "method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 8})
    ours = full.generate([prompt], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0].token_ids
    with torch.no_grad():
        ref = dflash_generate(ref_draft, ref_target, torch.tensor([prompt]), max_new_tokens=32, stop_token_ids=None)
    assert ours == ref[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def dflash2_pair(dflash_pair, tmp_path_factory):
    """The DFlash target with two random DFlash2 drafters: taps 4 (the 8B's default widths
    scaled down) and taps 2 (see test_dflash2_matches_reference)."""
    target = dflash_pair[0]
    out = []
    for taps in (4, 2):
        d = tmp_path_factory.mktemp(f"dfd2_{taps}")
        write_dflash_drafter(d, target, seed=5, num_layers=2, force=True,
                             dflash2={"conv_kernel_size": taps, "conv_group_size": 16, "selector_rank": 24,
                                      "selector_top_k": 12})
        out.append(d)
    return target, out[0], out[1]


def test_dflash2_matches_reference(dflash2_pair):
    """A DFlash2 drafter (convs around every draft layer's attention and MLP, a candidate selector
    instead of the argmax): draft hidden states and tokens equal dflash.DFlash2DraftModel's, whose
    selector picks other tokens than the argmax here; and dflash_generate agrees."""
    from dflash.model import DFlash2DraftModel, dflash_generate
    from transformers import AutoModelForCausalLM

    target_dir, drafter_dir, short_taps = dflash2_pair
    ref_target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ref_draft = DFlash2DraftModel.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    prompt, bs = REF_PROMPT, ref_draft.block_size
    ours_draft, hidden, first = first_block(target_dir, drafter_dir, ref_target, ref_draft)
    with torch.no_grad():
        ref_tokens, _, _ = ref_draft.propose(hidden[None, 1:], torch.tensor([first]), ref_target.lm_head, 0.0)
        argmax = ref_draft.compute_logits(hidden[1:], ref_target.lm_head).argmax(-1)
    assert ours_draft == ref_tokens[0].tolist()
    assert ours_draft != argmax.tolist()  # the selector's pairing term decided some drafts

    # whole runs, with the 2-tap drafter: the reference's conv fails on a last block shorter than
    # its taps (dflash/model.py pads blocks[:, :-offset] back to offset rows), which a 4-tap
    # drafter meets whenever a run ends 2 or 3 tokens past a round
    ref_short = DFlash2DraftModel.from_pretrained(short_taps, dtype=torch.float32).eval()
    for max_new in (32, 45):
        full = LLM(str(target_dir), device="cpu", max_model_len=256, speculative_config={
            "method": "dflash", "model": str(short_taps), "num_speculative_tokens": bs - 1})
        ours = full.generate([prompt], SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True))
        with torch.no_grad():
            ref = dflash_generate(ref_short, ref_target, torch.tensor([prompt]), max_new_tokens=max_new,
                                  stop_token_ids=None)
        assert ours[0].token_ids == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("k", [1, 3, 8])
def test_dflash2_greedy_lossless(dflash2_pair, k):
    """DFlash2 drafts (the selector's path) leave greedy output token-identical to plain decoding,
    for 18 requests at up to 16 at once in a pool that preempts, with drafts taken on the device and
    drafted behind verification steps."""
    target, drafter, _ = dflash2_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = LLM(str(target), device="cpu", max_model_len=128, max_num_seqs=16).generate(PROMPTS, params)
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
    llm = LLM(str(target), device="cpu", max_model_len=128, max_num_seqs=16, num_blocks=30, speculative_config=spec)
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert llm.engine.stats().preemptions > 0 and llm.engine.spec_stats.drafted > 0  # (random drafts: few accepted)
    assert llm.engine.runner.draft_fills > 0 and llm.engine.drafted_behind > 0
    if k == 3:  # the selector over a sliced head: candidates below draft_vocab_size, anchors anywhere
        sliced = LLM(str(target), device="cpu", max_model_len=128, max_num_seqs=16,
                     speculative_config={**spec, "draft_vocab_size": 1000})
        assert [o.token_ids for o in sliced.generate(PROMPTS, params)] == [o.token_ids for o in base]


def test_dflash2_checkpoints_that_are_refused(dflash2_pair, tmp_path):
    """A DFlash2 config or tensor minillm cannot run is refused at startup, by name."""
    import json

    target, drafter, _ = dflash2_pair
    conf = json.loads((drafter / "config.json").read_text())
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    cases = [
        (lambda c: c["dflash_config"].pop("selector_rank"), "needs selector_rank"),
        (lambda c: c["dflash_config"].update(conv_group_size=7), "does not divide hidden_size"),
        (lambda c: c["dflash_config"].update(selector_top_k=vocab + 1), f"selector_top_k {vocab + 1} must be 1 to"),
        (lambda c: c["dflash_config"].update(conv_kernel_size=3), "has shape"),  # the tensors say 4 taps
        (lambda c: c.update(is_causal=True), "causal DFlash draft layers are not supported"),
        (lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), "sliding_attention"),
    ]
    for i, (change, msg) in enumerate(cases):
        bad = tmp_path / f"bad{i}"
        bad.mkdir()
        c = json.loads(json.dumps(conf))
        change(c)
        (bad / "config.json").write_text(json.dumps(c))
        for name in os.listdir(drafter):
            if name.endswith(".safetensors"):
                os.symlink(drafter / name, bad / name)
        with pytest.raises(ValueError, match=msg):
            LLM(str(target), device="cpu", speculative_config={"method": "dflash", "model": str(bad),
                                                               "num_speculative_tokens": 2})


def watch_drafting(engine) -> list[tuple[int, int]]:
    """(running sequences, drafts asked) at every drafting decision of the engine: its late drafting
    (_draft_budgets) and its early drafting behind a verification step (propose_behind)."""
    seen = []
    budgets, behind = engine._draft_budgets, getattr(engine.proposer, "propose_behind", None)

    def _budgets():
        seqs, ks = budgets()
        seen.append((len(engine.scheduler.running), sum(ks)))
        return seqs, ks

    def _behind(seqs, bases, rows, drafts, *rest):
        seen.append((len(engine.scheduler.running), len(seqs)))
        return behind(seqs, bases, rows, drafts, *rest)

    engine._draft_budgets = _budgets
    if behind is not None:  # DFlash only
        engine.proposer.propose_behind = _behind
    return seen


@pytest.mark.parametrize("method", ["ngram", "self_draft", "dflash"])
def test_disable_by_batch_size_pauses_drafting_losslessly(models, dflash_pair, method):
    """vLLM's disable_by_batch_size: while at least 3 sequences run nothing is drafted, and drafting
    resumes as the batch shrinks (outputs of 4-40 tokens); greedy output is plain decoding's, the
    drafter's context kept current through the plain steps (DFlash) or caught up (a draft model)."""
    target = str(dflash_pair[0] if method == "dflash" else models[0])
    cfg = (spec_configs(models, 3)[method] if method != "dflash"
           else {"method": "dflash", "model": str(dflash_pair[1]), "num_speculative_tokens": 3})
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (4, 8, 12, 16, 24, 40)]
    plain = LLM(target, device="cpu", max_model_len=256).generate(PROMPTS[:6], params)
    llm = LLM(target, device="cpu", max_model_len=256, speculative_config={**cfg, "disable_by_batch_size": 3})
    seen = watch_drafting(llm.engine)
    outs = llm.generate(PROMPTS[:6], params)
    assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
    assert all(drafts == 0 for running, drafts in seen if running >= 3), seen
    assert any(drafts > 0 for running, drafts in seen if running < 3), seen
    spec = llm.engine.stats().spec
    assert spec["paused_steps"] > 0 and spec["rounds"] > 0
    assert llm.engine.num_pipelined_steps > 0  # the paused steps ran ahead (async scheduling)
    # the same steps paused and the same rounds when every step waits for the last
    sync = LLM(target, device="cpu", max_model_len=256, speculative_config={**cfg, "disable_by_batch_size": 3},
               async_scheduling=False)
    assert [o.token_ids for o in sync.generate(PROMPTS[:6], params)] == [p.token_ids for p in plain]
    assert sync.engine.stats().spec == spec and sync.engine.num_pipelined_steps == 0


@pytest.mark.parametrize("method", ["draft_model", "self_draft", "dflash"])
def test_backoff_is_lossless_and_spares_rounds(models, dflash_pair, method):
    """backoff_after: a sequence whose rounds accept nothing decodes plainly for 1, 2, 4 ... steps
    between probe rounds. Greedy output stays plain decoding's; a poor drafter (a 1-layer random
    model, a random DFlash drafter) runs fewer rounds than without the backoff; the model drafting
    for itself, always right, never backs off."""
    target = str(dflash_pair[0] if method == "dflash" else models[0])
    cfg = (spec_configs(models, 3)[method] if method != "dflash"
           else {"method": "dflash", "model": str(dflash_pair[1]), "num_speculative_tokens": 3})
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS[:6], params)]

    def run(extra, async_scheduling=None):
        llm = LLM(target, device="cpu", max_model_len=256, speculative_config={**cfg, **extra},
                  async_scheduling=async_scheduling)
        outs = [o.token_ids for o in llm.generate(PROMPTS[:6], params)]
        return outs, {**llm.engine.stats().spec, "pipelined": llm.engine.num_pipelined_steps}

    always, always_stats = run({})
    backoff, stats = run({"backoff_after": 1, "backoff_max_steps": 8})
    assert always == plain and backoff == plain
    # running the plain steps ahead changes when the host works, not what is drafted or verified
    sync, sync_stats = run({"backoff_after": 1, "backoff_max_steps": 8}, async_scheduling=False)
    assert sync == plain and sync_stats["pipelined"] == 0
    assert {k: v for k, v in sync_stats.items() if k != "pipelined"} == \
        {k: v for k, v in stats.items() if k != "pipelined"}, (sync_stats, stats)
    assert always_stats["backoff_steps"] == 0 and always_stats["pipelined"] == 0
    if method == "self_draft":
        assert stats["backoff_steps"] == 0 and stats["rounds"] == always_stats["rounds"]
    else:
        assert stats["backoff_steps"] > 0 and stats["rounds"] < always_stats["rounds"], (stats, always_stats)
        # while every sequence backs off, the plain steps run ahead of the host (async scheduling)
        assert stats["pipelined"] > 0, stats


@pytest.mark.parametrize("method", ["draft_model", "dflash"])
def test_async_plain_steps_between_rounds_preempt_and_cache(models, dflash_pair, method):
    """The plain steps of backing-off sequences run ahead (async scheduling) in a pool small enough
    to preempt and with the prefix cache on: the output is plain decoding's, run for run, and the
    second run of the same prompts hits blocks the first cached (blocks both models computed)."""
    target = str(dflash_pair[0] if method == "dflash" else models[0])
    cfg = (spec_configs(models, 3)[method] if method != "dflash"
           else {"method": "dflash", "model": str(dflash_pair[1]), "num_speculative_tokens": 3})
    prompts = [list(range(40, 76)) + [i] for i in range(8)]  # a shared 36-token prefix: two full blocks
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain_llm = LLM(target, device="cpu", max_model_len=128, max_num_seqs=8)
    plain = [o.token_ids for o in plain_llm.generate(prompts, params)]
    llm = LLM(target, device="cpu", max_model_len=128, max_num_seqs=8, num_blocks=26,
              speculative_config={**cfg, "backoff_after": 1, "backoff_max_steps": 4})
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(prompts, params)] == plain
    stats = llm.engine.stats()
    assert stats.preemptions > 0 and stats.spec["backoff_steps"] > 0, stats
    assert llm.engine.num_pipelined_steps > 0 and stats.prefix_cache_hit_rate > 0, stats


def test_invalid_speculative_configs(models, dflash_pair):
    target = str(models[0])
    bad = [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method must be one of"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs \"model\""),
        ({"method": "dflash", "model": str(dflash_pair[1]), "num_speculative_tokens": 16}, "block size minus one"),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "unknown keys"),
        ({}, "method must be one of"),  # not silently "no speculation"
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": None}, "prompt_lookup_min must be"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": "4"}, "prompt_lookup_max must be"),
        ({"method": "draft_model", "model": 123, "num_speculative_tokens": 2}, "model must be a path"),
        ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 1}, "disable_by_batch_size must"),
        ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": "8"}, "disable_by_batch_size must"),
        ({"method": "ngram", "num_speculative_tokens": 2, "backoff_after": 0}, "backoff_after must be an integer >= 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "backoff_after": 2, "backoff_max_steps": 0},
         "backoff_max_steps must be an integer >= 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "backoff_max_steps": 4},
         "backoff_max_steps needs backoff_after"),
        ({"method": "ngram", "num_speculative_tokens": 10**6}, "below --max-model-len"),
        # the other drafter kind's keys, which were ignored: n-grams drafted with a drafter named,
        # a drafter model run with prompt_lookup_* (even min > max) set
        ({"method": "ngram", "model": target, "num_speculative_tokens": 2}, 'method "ngram" .* takes no "model"'),
        ({"method": "draft_model", "model": target, "num_speculative_tokens": 2, "prompt_lookup_min": 5,
          "prompt_lookup_max": 3}, 'prompt_lookup_max and prompt_lookup_min apply to method "ngram"'),
        ({"model": target, "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "apply to method \"ngram\", not to "
                                                                                 "'draft_model'"),
        ({"method": "dflash", "model": str(dflash_pair[1] / "config.json"), "num_speculative_tokens": 2},
         r'the drafter\).*a drafter is a directory'),
    ]
    for cfg, msg in bad:
        with pytest.raises(ValueError, match=msg):
            LLM(target, device="cpu", speculative_config=cfg)
    for method in ("draft_model", "dflash"):  # a missing drafter says it is the drafter
        with pytest.raises(FileNotFoundError, match=r'"model" \(the drafter\)'):
            LLM(target, device="cpu", speculative_config={"method": method, "model": "/nonexistent/drafter",
                                                          "num_speculative_tokens": 2})
    dflash = {"method": "dflash", "model": str(dflash_pair[1]), "num_speculative_tokens": 2}
    for cfg, msg in [({**dflash, "draft_vocab_size": 0}, "draft_vocab_size must be an integer >= 1"),
                     ({**dflash, "draft_vocab_size": 10**9}, r"draft_vocab_size 1000000000 must be in \[1, "),
                     ({"method": "ngram", "num_speculative_tokens": 2, "draft_vocab_size": 8},
                      "draft_vocab_size applies to a drafter model")]:
        with pytest.raises(ValueError, match=msg):
            LLM(str(dflash_pair[0]), device="cpu", speculative_config=cfg)
    # a mask token outside the target's vocabulary (the first request used to kill the engine)
    import json
    bad_mask = dflash_pair[1].parent / (dflash_pair[1].name + "_badmask")
    bad_mask.mkdir(exist_ok=True)
    conf = json.loads((dflash_pair[1] / "config.json").read_text())
    for name in os.listdir(dflash_pair[1]):
        if name.endswith(".safetensors") and not (bad_mask / name).exists():
            os.symlink(dflash_pair[1] / name, bad_mask / name)
    good_mask = conf["dflash_config"]["mask_token_id"]
    for mask in (10**6, -1, 3.5):
        conf["dflash_config"]["mask_token_id"] = mask
        (bad_mask / "config.json").write_text(json.dumps(conf))
        with pytest.raises(ValueError, match="mask_token_id must be a token id in"):
            LLM(str(dflash_pair[0]), device="cpu", speculative_config={**dflash, "model": str(bad_mask)})
    conf["dflash_config"]["mask_token_id"] = good_mask
    # the drafter's other settings: these gave tracebacks (a list where a number goes), took
    # "false" as true, or loaded and failed the first request (a string epsilon or softcap, a block
    # of 100,000 tokens: a 149 GiB attention in the first step)
    for key, value, msg in [("output_multiplier", [1], "dflash_config: 'output_multiplier' must be a positive"),
                            ("final_logit_softcapping", "x", "'final_logit_softcapping' must be a positive"),
                            ("target_layer_ids", 5, "target_layer_ids must be a list"),
                            ("block_size", 100_000, "block_size 100000 reaches past --max-model-len"),
                            ("rms_norm_eps", "x", "'rms_norm_eps' must be a positive number"),
                            ("rope_theta", [1], "'rope_theta' must be a positive number"),
                            ("attention_bias", "false", "'attention_bias' must be true or false"),
                            ("rope_scaling", {"rope_type": "yarn", "factor": "x"}, "'factor' must be a positive")]:
        bad = json.loads(json.dumps(conf))
        (bad["dflash_config"] if key in bad["dflash_config"] or key in ("output_multiplier", "final_logit_softcapping")
         else bad)[key] = value
        (bad_mask / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=msg):
            LLM(str(dflash_pair[0]), device="cpu", speculative_config={**dflash, "model": str(bad_mask)})
    # a drafter's own rope_scaling is its RoPE (as the reference builds it from its config; the target's was taken)
    (bad_mask / "config.json").write_text(json.dumps({**conf, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    own = LLM(str(dflash_pair[0]), device="cpu", speculative_config={**dflash, "model": str(bad_mask)})
    assert (own.engine.proposer.cfg.rope_scaling.kind, own.engine.proposer.cfg.rope_scaling.factor) == ("linear", 2.0)
    # a drafter with another vocabulary
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(str(dflash_pair[0]), device="cpu",
            speculative_config={"method": "draft_model", "model": target, "num_speculative_tokens": 2})


def test_vllm_ngram_spellings():
    """vLLM's older n-gram spellings, "model": "ngram" (or "[ngram]") and "method": "[ngram]", are
    n-gram drafting: "model": "ngram" was taken as a drafter path and failed as a missing file."""
    from minillm.spec.config import SpeculativeConfig

    for d in ({"model": "ngram"}, {"model": "[ngram]"}, {"method": "[ngram]"}, {"method": "ngram", "model": "ngram"}):
        cfg = SpeculativeConfig.from_dict({**d, "num_speculative_tokens": 3, "prompt_lookup_max": 2})
        assert (cfg.method, cfg.model, cfg.prompt_lookup_max) == ("ngram", None, 2), d
    # a drafter method keeps its path, whatever its name
    assert SpeculativeConfig.from_dict({"method": "dflash", "model": "ngram", "num_speculative_tokens": 3}).model \
        == "ngram"


def _lookup_by_definition(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Prompt lookup as specified: the longest n in [min_n, max_n] whose last n tokens occur earlier;
    the k tokens after its most recent earlier occurrence."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        ends = [e for e in range(n - 1, L - 1) if tokens[e - n + 1 : e + 1] == tokens[L - n :]]
        if ends:
            return tokens[ends[-1] + 1 : ends[-1] + 1 + k]
    return []


@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 5), st.integers(0, 8), st.integers(1, 5))
@settings(max_examples=400, deadline=None)
def test_ngram_lookup_is_the_definition(tokens, min_n, extra, k):
    from minillm.spec.ngram import lookup

    max_n = min_n + extra if extra < 8 else 10**9  # 8: a prompt_lookup_max past any sequence
    assert lookup(np.asarray(tokens, dtype=np.int64), min_n, max_n, k) == _lookup_by_definition(tokens, min_n, max_n, k)


def test_ngram_lookup_with_a_huge_prompt_lookup_max_is_fast():
    """A large prompt_lookup_max (10**9 passes the config's checks) compared every n from
    min(max, len - 1) down, each over the whole sequence: 10 s a decode step at 4,000 tokens (a hang
    in practice). The n-grams now grow only while they still recur."""
    import time

    from minillm.spec.ngram import lookup

    tokens = np.random.default_rng(0).integers(0, 4000, 4000)
    t0 = time.perf_counter()
    lookup(tokens, 1, 10**9, 4)
    assert time.perf_counter() - t0 < 1.0  # well under 1 ms now


def test_a_dflash_drafter_with_nan_weights_is_refused(dflash_pair, tmp_path):
    """The drafter's weights get the target's NaN / inf check (its own safetensors reader had none:
    a NaN drafter drafts token 0 every round, lossless but never accepted)."""
    import shutil

    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    target, drafter = dflash_pair
    bad = tmp_path / "bad"
    shutil.copytree(drafter, bad)
    (st,) = bad.glob("*.safetensors")
    tensors = load_file(st)
    name = next(n for n in sorted(tensors) if n.endswith("mlp.up_proj.weight"))
    t = tensors[name].copy()
    assert t.dtype == ml_dtypes.bfloat16
    t.flat[3] = np.nan
    tensors[name] = t
    save_file(tensors, st)
    with pytest.raises(ValueError, match=f"tensor '{name}' holds 1 NaN or infinite value"):
        LLM(str(target), device="cpu", max_model_len=64, max_num_seqs=2,
            speculative_config={"method": "dflash", "model": str(bad), "num_speculative_tokens": 3})


def test_dflash2_settings_past_a_backends_kernels_are_refused_by_name():
    """A backend whose selector kernels are bounded (the CUDA backend's dflash2_limits: top_k and rank
    in shared memory) refuses a drafter past them at startup, naming the setting and the bound; a
    backend without bounds (NumPy) runs it."""
    from types import SimpleNamespace

    from minillm.backends.cuda_ops import CudaBackend
    from minillm.spec.dflash2 import check_backend

    max_top_k, max_rank = CudaBackend.dflash2_limits
    bounded = SimpleNamespace(name="bounded", dflash2_limits=CudaBackend.dflash2_limits)
    check_backend(bounded, {"selector_top_k": max_top_k, "selector_rank": max_rank}, "d")
    with pytest.raises(ValueError, match=f"d: selector_top_k {max_top_k + 1} is past .*at most {max_top_k}"):
        check_backend(bounded, {"selector_top_k": max_top_k + 1, "selector_rank": 8}, "d")
    with pytest.raises(ValueError, match=f"selector_rank {max_rank + 1} is past .*at most {max_rank}"):
        check_backend(bounded, {"selector_top_k": 8, "selector_rank": max_rank + 1}, "d")
    check_backend(SimpleNamespace(name="numpy"), {"selector_top_k": max_top_k + 1, "selector_rank": max_rank + 1}, "d")
