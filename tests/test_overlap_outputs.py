"""Overlapped output rendering (LLMEngine.overlap_outputs, on inside LLM.generate): a step's text
and outputs are made while the next step runs, and a stop string ends its sequence one step late.
Every request must come out exactly as from the synchronous engine: the same token ids, text and
finish reason, with stop strings, stop tokens, min_tokens, max_tokens, speculation, preemption."""

from __future__ import annotations

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.engine import LLMEngine


def drive(engine: LLMEngine, prompts, params, overlap: bool) -> dict:
    """Every request's (token ids, text, finish reason, streamed text) with step() driven by hand."""
    engine.overlap_outputs = overlap
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(p, sp, request_id=str(i))
    streamed: dict[str, str] = {}
    done = {}
    while engine.has_unfinished():
        for o in engine.step():
            streamed[o.request_id] = streamed.get(o.request_id, "") + o.new_text
            if o.finished:
                done[o.request_id] = (o.token_ids, o.text, o.finish_reason)
    assert not engine._unrendered and not engine.requests
    return {rid: (*v, streamed[rid]) for rid, v in done.items()}


def workload(tiny, engine_kw, n=12, seed=0):
    """Random prompts; greedy and seeded sampling; stop strings taken from a first run's own text
    (so they do occur, sometimes early), stop tokens, min_tokens and max_tokens limits."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, 4000, int(rng.integers(3, 40))).tolist() for _ in range(n)]
    base = [SamplingParams(max_tokens=int(rng.integers(4, 30)), ignore_eos=True,
                           temperature=0.0 if i % 2 else 0.9, seed=i) for i in range(n)]
    first = drive(LLMEngine(model=str(tiny), **engine_kw), prompts, base, overlap=False)
    params = []
    for i, sp in enumerate(base):
        ids, text = first[str(i)][0], first[str(i)][1]
        kw = dict(max_tokens=sp.max_tokens, ignore_eos=True, temperature=sp.temperature, seed=sp.seed)
        if i % 3 == 0 and len(text) > 4:
            a = int(rng.integers(0, len(text) - 2))
            kw["stop"] = [text[a : a + 2], "\x00never"]
        elif i % 3 == 1 and len(ids) > 3:
            kw["stop_token_ids"] = [ids[len(ids) // 2]]
            kw["min_tokens"] = 2
        params.append(SamplingParams(**kw))
    return prompts, params


@pytest.mark.parametrize("engine_kw", [
    dict(max_num_seqs=4, max_num_batched_tokens=64),
    dict(max_num_seqs=8, max_num_batched_tokens=48, num_blocks=10, max_model_len=128),  # preempts
    dict(max_num_seqs=4, max_num_batched_tokens=64,
         speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}),
    dict(max_num_seqs=4, max_num_batched_tokens=64,
         speculative_config={"method": "dflash", "model": "DRAFTER", "num_speculative_tokens": 4}),
], ids=["plain", "preempting", "ngram", "dflash"])
def test_overlapped_outputs_equal_synchronous(tiny, drafter, engine_kw):
    kw = dict(dict(device="cpu", max_model_len=256), **engine_kw)
    if "speculative_config" in kw and kw["speculative_config"].get("model") == "DRAFTER":
        kw["speculative_config"] = dict(kw["speculative_config"], model=str(drafter))
    prompts, params = workload(tiny, kw)
    sync_engine, overlap_engine = LLMEngine(model=str(tiny), **kw), LLMEngine(model=str(tiny), **kw)
    sync = drive(sync_engine, prompts, params, overlap=False)
    overlapped = drive(overlap_engine, prompts, params, overlap=True)
    assert overlapped == sync
    reasons = {v[2] for v in sync.values()}
    assert reasons == {"stop", "length"}  # both kinds of ending were exercised
    assert any(p.stop and sync[str(i)][2] == "stop" for i, p in enumerate(params))  # a stop string hit
    assert overlap_engine.stats().generation_tokens == sync_engine.stats().generation_tokens
    if "speculative_config" in kw:
        assert overlap_engine.stats().spec["draft_tokens"] > 0
    if "num_blocks" in kw:
        assert overlap_engine.stats().preemptions > 0 and sync_engine.stats().preemptions > 0


def test_generate_overlaps_and_restores(tiny):
    """LLM.generate runs overlapped (its results equal the synchronous engine's, above) and leaves
    the engine synchronous for callers that drive step() themselves."""
    llm = LLM(str(tiny), device="cpu", max_model_len=256)
    prompts, params = workload(tiny, dict(max_num_seqs=4, max_num_batched_tokens=64), n=6, seed=3)
    outs = llm.generate(prompts, params)
    ref = drive(LLMEngine(model=str(tiny), device="cpu", max_model_len=256), prompts, params, overlap=False)
    assert [(o.token_ids, o.text, o.finish_reason) for o in outs] == [ref[str(i)][:3] for i in range(6)]
    assert llm.engine.overlap_outputs is False
