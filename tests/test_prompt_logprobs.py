"""SamplingParams.prompt_logprobs: each prompt token's log probability given the tokens before it
(None for the first), computed chunk by chunk from the prefill's rows through the LM head in slices
of the logits buffer. The oracle is log_softmax of LLMEngine.score's logits (every row of the prompt
in one step, on an engine whose logits buffer holds them all). The engines under test prefill in
chunks of 16 and hold 4 logits rows, so both the chunking and the slicing are exercised, with and
without prefix caching, with a shared prefix already cached, and through preemption."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.engine import LLMEngine
from tests.test_logprobs import log_softmax

CHUNKED = dict(device="cpu", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16, block_size=8)


@pytest.fixture(scope="module")
def oracle(tiny):
    eng = LLMEngine(model=str(tiny), device="cpu", max_model_len=128, max_num_seqs=128)

    def prompt_logprobs(prompt: list[int]) -> np.ndarray:
        """[len(prompt) - 1, vocab]: row t - 1 is prompt token t's distribution."""
        return log_softmax(eng.score([prompt])[0])[:-1]

    return prompt_logprobs


def check(oracle, prompt: list[int], plps, top: int) -> None:
    assert len(plps) == len(prompt) and plps[0] is None
    if len(prompt) == 1:
        return
    want = oracle(prompt)
    for t, lp in enumerate(plps[1:], start=1):
        assert lp.token_id == prompt[t]
        assert abs(lp.logprob - want[t - 1, prompt[t]]) < 1e-4
        v = want[t - 1, prompt[t]]  # its rank wherever it ranks (tolerant of float32 near-ties)
        assert np.count_nonzero(want[t - 1] > v + 1e-5) < lp.rank <= np.count_nonzero(want[t - 1] >= v - 1e-5)
        assert len(lp.top) == top
        assert [i for i, _ in lp.top] == np.argsort(-want[t - 1], kind="stable")[:top].tolist()
        assert all(abs(v - want[t - 1, i]) < 1e-4 for i, v in lp.top)


PROMPTS = [list(range(100, 150)), [7, 8, 9], [42], list(range(300, 337))]


def test_rank_follows_the_top_lists_order():
    """rank: 1 + the tokens above it, ties broken by id as the top lists break them, so a prompt
    token listed among the top N has its position there; rows_logprobs agrees with token_logprob."""
    from minillm.engine.logprobs import rows_logprobs, token_logprob

    logits = np.array([[0.0, 2.0, 1.0, 2.0, -1.0], [5.0, 5.0, 5.0, 5.0, 5.0], [-np.inf, 0.0, 3.0, 1.0, 1.0]],
                      dtype=np.float32)
    tokens = [3, 2, 0]
    got = rows_logprobs(logits, tokens, top=3, block=10)  # blocks of 2 rows: the rows split
    assert [lp.rank for lp in got] == [2, 3, 5]
    assert [i for i, _ in got[0].top] == [1, 3, 2] and [i for i, _ in got[1].top] == [0, 1, 2]
    assert got[2].logprob == -np.inf and [i for i, _ in got[2].top] == [2, 3, 4]
    for row, t, lp in zip(logits, tokens, got):
        ref = token_logprob(row, t, 3)
        assert lp.logprob == pytest.approx(ref.logprob) and lp.top == pytest.approx(ref.top)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prompt_logprobs_equal_the_oracle_across_chunks(tiny, oracle, prefix_caching):
    llm = LLM(str(tiny), enable_prefix_caching=prefix_caching, **CHUNKED)
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    plain = llm.generate(PROMPTS, greedy)
    params = [SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, prompt_logprobs=3),
              SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, prompt_logprobs=0, logprobs=2),
              SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, prompt_logprobs=1),
              greedy]
    outs = llm.generate(PROMPTS, params)
    for prompt, p, out, ref in zip(PROMPTS, params, outs, plain):
        assert out.token_ids == ref.token_ids  # asking for them changes nothing else
        if p.prompt_logprobs is None:
            assert out.prompt_logprobs is None
        else:
            check(oracle, prompt, out.prompt_logprobs, p.prompt_logprobs)
    assert outs[1].logprobs is not None and len(outs[1].logprobs) == 5
    assert not llm.engine._sync_requests and not llm.engine.has_unfinished()


def test_max_tokens_one_scores_the_prompt(tiny, oracle):
    """What a loglikelihood request amounts to: the prompt scored, one token generated."""
    llm = LLM(str(tiny), **CHUNKED)
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    assert len(out.token_ids) == 1
    check(oracle, PROMPTS[0], out.prompt_logprobs, 2)


def test_steps_run_ahead_again_once_the_prompt_is_scored(tiny):
    """Prompt logprobs keep steps synchronous only until the prompt is scored (the logits buffer
    must hold the step's rows when they are read); then async scheduling resumes, same tokens."""
    llm = LLM(str(tiny), **CHUNKED)
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = llm.generate([PROMPTS[0]], p)[0]
    before = llm.engine.num_pipelined_steps
    out = llm.generate([PROMPTS[0]], dataclasses.replace(p, prompt_logprobs=0))[0]
    assert out.token_ids == ref.token_ids and len(out.prompt_logprobs) == len(PROMPTS[0])
    assert llm.engine.num_pipelined_steps > before


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(tiny, oracle):
    """The prefix cache holds the shared prefix's blocks; a request with prompt logprobs computes
    them again (their rows' logits are needed) and still gives the oracle's values, and later
    requests without them keep hitting the cache."""
    llm = LLM(str(tiny), **CHUNKED)
    bm = llm.engine.block_manager
    prefix = list(range(200, 240))
    llm.generate([prefix + [5, 6, 7]], SamplingParams(max_tokens=2))
    assert bm.num_cached >= 5  # the 40-token prefix: 5 full blocks of 8
    hits = bm.prefix_hits
    prompt = prefix + [11, 12, 13, 14]
    out = llm.generate([prompt], SamplingParams(max_tokens=3, prompt_logprobs=2))[0]
    assert bm.prefix_hits == hits  # nothing taken from the cache
    check(oracle, prompt, out.prompt_logprobs, 2)
    llm.generate([prefix + [9]], SamplingParams(max_tokens=2))
    assert bm.prefix_hits >= hits + 40


def test_prompt_logprobs_through_preemption(tiny, oracle):
    """A pool for two of the three sequences' full lengths: preempted sequences recompute their
    prefill; the rows already scored are not scored twice and the rest still are."""
    llm = LLM(str(tiny), device="cpu", max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=8,
              num_blocks=12)
    prompts = [list(range(10 + 40 * i, 50 + 40 * i)) for i in range(3)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, prompt_logprobs=1))
    assert llm.engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == 20
        check(oracle, prompt, out.prompt_logprobs, 1)


@pytest.mark.parametrize("method", ["ngram", "self_draft", "dflash"])
def test_with_speculation(tiny, drafter, oracle, method):
    """Prompt rows are scored after the step's verification rows are read and before the drafter
    proposes, so speculation changes nothing: chunked prefills beside verifying sequences, with
    the prompt logprobs of each request and the plain decoder's tokens."""
    spec = {"ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2},
            "self_draft": {"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 3},
            "dflash": {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3}}[method]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=2)
    plain = LLM(str(tiny), **CHUNKED).generate(PROMPTS, params)
    llm = LLM(str(tiny), **CHUNKED, speculative_config=spec)
    outs = llm.generate(PROMPTS, params)
    assert llm.engine.stats().spec["draft_tokens"] > 0
    for prompt, out, want in zip(PROMPTS, outs, plain):
        assert out.token_ids == want.token_ids
        check(oracle, prompt, out.prompt_logprobs, 2)


def test_out_of_range():
    for bad in (21, -1, True, 1.5):
        with pytest.raises(ValueError, match="prompt_logprobs must be"):
            SamplingParams(prompt_logprobs=bad)


@pytest.mark.gpu
def test_prompt_logprobs_on_the_gpu(tiny):
    """The LM head over a prefill's rows in slices of the GPU's logits buffer (bf16 forward) against
    log_softmax of the same engine's scored logits, and against the CPU reference's."""
    gpu = LLM(str(tiny), device="cuda", max_num_seqs=4, max_model_len=256, max_num_batched_tokens=64)
    cpu = LLM(str(tiny), device="cpu", max_num_seqs=4, max_model_len=256, max_num_batched_tokens=64)
    prompt = [(37 * i) % 4000 + 3 for i in range(150)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=3)
    got = {}
    for name, llm in (("gpu", gpu), ("cpu", cpu)):
        got[name] = llm.generate([prompt], params)[0].prompt_logprobs
        assert len(got[name]) == len(prompt) and got[name][0] is None
    scored = LLM(str(tiny), device="cuda", max_num_seqs=256, max_model_len=256)
    want = log_softmax(scored.engine.score([prompt])[0])
    for t in range(1, len(prompt)):
        g, c = got["gpu"][t], got["cpu"][t]
        assert abs(g.logprob - want[t - 1, prompt[t]]) < 0.05
        assert abs(g.logprob - c.logprob) < 0.05
