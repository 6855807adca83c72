"""End to end on the NumPy backend: the field report's failure (concurrency x context beyond the
KV pool) becomes preemption and recomputation with unchanged output, never a fault.

Covers: a burst of 8 requests on a pool 3x smaller than 8 x max_model_len, each output equal to
running it alone; FCFS admission with preempted requests resuming before newer ones; chunked
prefill that never starves a running decode; admission-time rejection of over-long requests;
the startup refusal of a pool that cannot hold one max_model_len sequence; and the MINILLM_DEBUG
index checks running through all of it without firing.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.args import EngineArgs
from minillm.engine import runner as runner_mod
from minillm.engine.engine import plan_kv_pool

from hf_models import make_tiny

BS = 8
MAX_MODEL_LEN = 96
C = 8
PER_SEQ = MAX_MODEL_LEN // BS  # 12 blocks
SMALL_POOL = C * PER_SEQ // 3  # 32 blocks: a third of what 8 full-length sequences need


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_preempt")
    make_tiny("qwen3", path, seed=5)
    return str(path)


def burst_requests():
    rng = random.Random(7)
    prompts, params = [], []
    for _ in range(C):
        n = rng.randrange(12, 40)
        prompts.append([rng.randrange(3, 256) for _ in range(n)])
        params.append(SamplingParams(temperature=0, max_tokens=MAX_MODEL_LEN - n - rng.randrange(0, 8),
                                     ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def alone_outputs(tiny_dir):
    """Each burst request run by itself on a roomy engine without a prefix cache: the oracle."""
    prompts, params = burst_requests()
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=1, max_model_len=MAX_MODEL_LEN, block_size=BS,
              enable_prefix_caching=False)
    return [llm.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params)]


def watch_admissions(engine, log: list):
    """Wrap the scheduler to record, per step, who was admitted and who was still waiting."""
    sched = engine.scheduler
    inner = sched.schedule

    def schedule():
        running = {id(s) for s in sched.running}
        out = inner()
        admitted = [i.seq for i in out.scheduled if id(i.seq) not in running]
        log.append((admitted, list(sched.waiting), list(out.preempted)))
        return out

    sched.schedule = schedule


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_burst_on_a_pool_3x_too_small_matches_running_alone(tiny_dir, alone_outputs, prefix_caching):
    prompts, params = burst_requests()
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=C, max_model_len=MAX_MODEL_LEN, block_size=BS,
              num_blocks=SMALL_POOL, enable_prefix_caching=prefix_caching)
    log: list = []
    watch_admissions(llm.engine, log)
    outs = llm.generate(prompts, params)
    st = llm.engine.stats()
    print(f"\nburst of {C} on {SMALL_POOL} blocks (prefix caching {prefix_caching}): "
          f"{st.preemptions} preemptions, hit rate {st.prefix_cache_hit_rate:.3f}")
    assert st.preemptions > 0, "the pool is a third of the demand: something must have been preempted"
    for i, (out, ref) in enumerate(zip(outs, alone_outputs)):
        assert out.finish_reason == "length"
        assert out.token_ids == ref, f"request {i} changed under preemption"
    assert st.blocks_used == 0 and st.running == 0 and st.waiting == 0
    assert st.blocks_free + st.blocks_cached == SMALL_POOL

    # FCFS: whoever is admitted is older than everything still waiting, preempted ones included
    assert any(pre for _, _, pre in log)
    for admitted, waiting, _ in log:
        if admitted and waiting:
            assert max(s.arrival for s in admitted) < min(s.arrival for s in waiting)


def test_preempted_request_resumes_before_newer_ones(tiny_dir):
    """Drive the engine step by step: the newest running request is the one preempted, and a
    request arriving after that is not admitted before the preempted one resumes."""
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=3, max_model_len=64, block_size=BS, num_blocks=10,
              enable_prefix_caching=False)
    eng = llm.engine
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    eng.add_request(list(range(3, 23)), greedy)
    b = eng.add_request(list(range(30, 50)), greedy)
    log: list = []
    watch_admissions(eng, log)
    while not any(pre for _, _, pre in log):
        eng.step()
        assert eng.has_unfinished()
    victims = [s.request_id for _, _, pre in log for s in pre]
    assert victims == [b], "the newest running request is preempted first"
    late = eng.add_request(list(range(60, 66)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    mark = len(log)
    while eng.has_unfinished():
        eng.step()
    order = [s.request_id for admitted, _, _ in log[mark:] for s in admitted]
    assert b in order and late in order and order.index(b) < order.index(late), order
    for admitted, waiting, _ in log:  # and at no step was anyone admitted past an older waiter
        if admitted and waiting:
            assert max(s.arrival for s in admitted) < min(s.arrival for s in waiting)


def test_chunked_prefill_does_not_starve_a_running_decode(tiny_dir):
    kw = dict(device="cpu", max_num_seqs=4, max_model_len=160, block_size=BS)
    # synchronous steps: the chunk sizes are read from num_computed as each step returns (with async
    # scheduling it would count the next step, launched before this one's outputs are returned)
    llm = LLM(tiny_dir, max_num_batched_tokens=16, async_scheduling=False, **kw)
    eng = llm.engine
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    long_prompt = [(7 * i) % 250 + 3 for i in range(100)]  # > 16 tokens: split across steps
    a = eng.add_request([5, 9, 11, 13], greedy)
    eng.step()  # a prefilled and sampled its first token
    b = eng.add_request(long_prompt, greedy)
    seq_b = eng.requests[b]
    chunks = []
    outs_a, outs_b = [], []
    while not outs_b:
        before = seq_b.num_computed
        outs = {o.request_id: o for o in eng.step()}
        assert a in outs, "the running decode was skipped while a long prompt was prefilling"
        assert len(outs[a].new_token_ids) == 1
        outs_a = outs[a].token_ids
        if b in outs:
            outs_b = outs[b].token_ids
        chunks.append(seq_b.num_computed - before)
    assert len(chunks) >= 7 and max(chunks) <= 15 and sum(chunks) == 100, chunks
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == a:
                outs_a = o.token_ids
            elif o.request_id == b:
                outs_b = o.token_ids
    ref = LLM(tiny_dir, **kw)  # default budget: each prompt in one step
    assert outs_a == ref.generate([[5, 9, 11, 13]], greedy)[0].token_ids
    assert outs_b == ref.generate([long_prompt], greedy)[0].token_ids


def test_over_long_requests_are_rejected_with_the_numbers(tiny_dir):
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=2, max_model_len=64, block_size=BS)
    with pytest.raises(ValueError, match=r"65 tokens.*max_model_len 64"):
        llm.generate([[3] * 65], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=r"60 tokens.*max_tokens \(10\).*70.*max_model_len 64.*at most 4"):
        llm.generate([[3] * 60], SamplingParams(max_tokens=10))
    # all-or-nothing: a bad prompt in a batch adds none of them
    with pytest.raises(ValueError):
        llm.generate([[3] * 10, [3] * 64], SamplingParams(max_tokens=1))
    assert not llm.engine.has_unfinished()
    assert len(llm.generate([[3] * 60], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids) == 4


def test_prompt_ids_outside_the_vocabulary_are_named(tiny_dir):
    """validate_prompt's fast path (plain ints, min and max in range) and its token-by-token one agree:
    every id that is not an integer in range is named, NumPy integers pass."""
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=2, max_model_len=64, block_size=BS)
    vocab = llm.engine.config.vocab_size
    one = SamplingParams(max_tokens=1)
    for bad, named in ([[3, vocab], rf"got \[{vocab}\]"], [[-1, 3], r"got \[-1\]"], [[3, True], r"got \[True\]"],
                       [[3, 2.0], r"got \[2.0\]"], [[3, "4"], r"got \['4'\]"]):
        with pytest.raises(ValueError, match=rf"must be integers in \[0, {vocab}\); {named}"):
            llm.generate([bad], one)
    assert llm.generate([[np.int64(3), 5, vocab - 1]], one)[0].token_ids


def test_startup_refuses_a_pool_that_cannot_hold_one_sequence(tiny_dir):
    with pytest.raises(ValueError) as e:
        LLM(tiny_dir, device="cpu", max_model_len=128, block_size=16, num_blocks=7)
    msg = str(e.value)
    for number in ("128", "8 blocks", "7 blocks", "112"):  # need, have, the largest that fits
        assert number in msg, msg
    assert "--max-model-len" in msg and "--num-blocks" in msg
    LLM(tiny_dir, device="cpu", max_model_len=128, block_size=16, num_blocks=8)  # exactly one fits

    # sized from device memory: the message names the memory and the utilisation flag
    args = EngineArgs(max_model_len=4096, block_size=16, max_num_seqs=4)
    with pytest.raises(ValueError, match=r"4096 needs 256 blocks.*pool has 100 blocks.*1600.*gpu-memory-utilization"):
        plan_kv_pool(args, kv_bytes_per_token=1024, max_model_len=4096, available_bytes=100 * 16 * 1024)
    assert plan_kv_pool(args, 1024, 4096, available_bytes=None) == 4 * 256  # the arena rule
    assert plan_kv_pool(args, 1024, 4096, available_bytes=300 * 16 * 1024) == 300  # what fits


def test_pool_refusal_names_the_drafters_lookahead_and_suggests_only_what_starts():
    """A drafter writes past a sequence's end (a DFlash block of 16: 15 positions). The message names that,
    and suggests a max_model_len only where one above the lookahead fits (a shorter one is refused for the
    drafter's k: it suggested -7 and 1 before); else the --num-blocks one sequence needs."""
    def refusal(num_blocks: int, bs: int) -> str:
        with pytest.raises(ValueError) as e:
            plan_kv_pool(EngineArgs(max_model_len=32, block_size=bs, num_blocks=num_blocks), 1024, 32, None,
                         lookahead=15)
        return str(e.value)

    for num_blocks, bs, need in [(1, 8, 6), (2, 8, 6), (1, 16, 3)]:
        msg = refusal(num_blocks, bs)
        assert "32 and the 15 positions its drafter writes past it" in msg and "largest" not in msg, msg
        assert msg.endswith(f"raise --num-blocks to at least {need}"), msg
    assert "the largest max_model_len that fits is 17" in refusal(2, 16)  # 32 slots, 15 ahead


def test_debug_checks_run_clean_through_a_preempting_workload(tiny_dir, alone_outputs, monkeypatch):
    monkeypatch.setenv("MINILLM_DEBUG", "1")
    calls = {"check": 0, "tokens": 0}
    inner_check = runner_mod.ModelRunner._check
    inner_prepare = runner_mod.ModelRunner.prepare

    def check(self, batch, t):
        calls["check"] += 1
        return inner_check(self, batch, t)

    def prepare(self, batch):
        t, r = inner_prepare(self, batch)
        # the slots prepare wrote are the block manager's, token by token
        want = [self.bm.slot(i.seq, p) for i in batch for p in range(i.start, i.start + i.num_new)]
        assert self.buf.host["slot_mapping"][:t].tolist() == want
        calls["tokens"] += t
        return t, r

    monkeypatch.setattr(runner_mod.ModelRunner, "_check", check)
    monkeypatch.setattr(runner_mod.ModelRunner, "prepare", prepare)
    prompts, params = burst_requests()
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=C, max_model_len=MAX_MODEL_LEN, block_size=BS,
              num_blocks=PER_SEQ + 4, max_num_batched_tokens=32)
    outs = llm.generate(prompts, params)
    st = llm.engine.stats()
    print(f"\nDEBUG run on {PER_SEQ + 4} blocks: {calls['check']} checked steps, {st.preemptions} preemptions")
    assert calls["check"] > 0 and st.preemptions > 0
    assert [o.token_ids for o in outs] == alone_outputs


def test_a_garbled_runner_switch_is_a_start_up_error(tiny_dir, monkeypatch):
    """The runner's switches are read when it is made: a value that is not on or off stops the start with
    the variable's name (they were read at import, where "false" meant on)."""
    monkeypatch.setenv("MINILLM_DECODE_ORDER", "nope")
    with pytest.raises(ValueError, match="MINILLM_DECODE_ORDER='nope'"):
        LLM(tiny_dir, device="cpu", max_num_seqs=2, max_model_len=64, block_size=BS)


def test_debug_check_fires_on_a_corrupted_block_table(tiny_dir, monkeypatch):
    """The check is live in the engine: a block table pointing past the pool is caught on the host
    before any kernel could read it."""
    monkeypatch.setenv("MINILLM_DEBUG", "1")
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=2, max_model_len=64, block_size=BS)
    eng = llm.engine
    rid = eng.add_request([3, 4, 5], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    eng.step()
    seq = eng.requests[rid]
    seq.block_table[0] = eng.block_manager.num_blocks  # one past the end
    with pytest.raises(AssertionError, match="outside the pool"):
        eng.step()
    assert np.asarray(eng.kv[0]).shape[1] == eng.block_manager.num_blocks


@pytest.mark.parametrize("drafter", ["ngram", "self"])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_field_report_setup_speculation_on_an_overcommitted_pool(tiny_dir, monkeypatch, drafter, prefix_caching):
    """The field report's configuration in miniature: 8 concurrent requests, speculative decoding,
    a pool far below 8 x max_model_len. Drafts, rollback and preemption interleave; outputs must
    equal greedy decoding alone and the DEBUG index checks must stay quiet."""
    monkeypatch.setenv("MINILLM_DEBUG", "1")
    rng = random.Random(11)
    prompts, params = [], []
    for _ in range(C):
        n = rng.randrange(12, 40)
        motif = [rng.randrange(3, 256) for _ in range(4)]  # repetitive: the n-gram drafter has matches
        prompts.append((motif * 10)[:n])
        params.append(SamplingParams(temperature=0, max_tokens=MAX_MODEL_LEN - n - rng.randrange(0, 8),
                                     ignore_eos=True))
    ref = LLM(tiny_dir, device="cpu", max_num_seqs=1, max_model_len=MAX_MODEL_LEN, block_size=BS,
              enable_prefix_caching=False)
    alone = [ref.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params)]
    spec = ({"method": "ngram", "num_speculative_tokens": 4} if drafter == "ngram"
            else {"method": "draft_model", "model": tiny_dir, "num_speculative_tokens": 3})  # accepts ~all
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=C, max_model_len=MAX_MODEL_LEN, block_size=BS,
              num_blocks=PER_SEQ + 2, max_num_batched_tokens=48, enable_prefix_caching=prefix_caching,
              speculative_config=spec)
    outs = llm.generate(prompts, params)
    st = llm.engine.stats()
    print(f"\n{drafter} drafter, prefix caching {prefix_caching}, {PER_SEQ + 2} blocks: "
          f"{st.preemptions} preemptions, {st.spec['accepted_tokens']} accepted drafts")
    assert st.preemptions > 0 and st.spec["accepted_tokens"] > 0
    assert [o.token_ids for o in outs] == alone
    assert st.blocks_used == 0


def test_priority_scheduling_end_to_end(tiny_dir, alone_outputs):
    """scheduling_policy="priority": with one seat, requests finish in priority order (lower first,
    ties by arrival), each output what it is alone; on a pool too small for the batch the
    lowest-priority sequences are the ones preempted. Under fcfs a priority is refused."""
    from minillm.engine.engine import LLMEngine

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[11 + i, 12, 13 + i] for i in range(4)]
    alone = [o.token_ids for o in LLM(tiny_dir, device="cpu", max_model_len=MAX_MODEL_LEN).generate(prompts, params)]
    eng = LLMEngine(model=tiny_dir, device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=1,
                    scheduling_policy="priority")
    for i, prio in enumerate((3, 0, 3, -1)):
        eng.add_request(prompts[i], params, request_id=str(i), priority=prio)
    finished, outs = [], {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                finished.append(o.request_id)
                outs[o.request_id] = o.token_ids
    assert finished == ["3", "1", "0", "2"]
    assert [outs[str(i)] for i in range(4)] == alone
    # a burst on a third of the pool it needs: preemption falls on the low-priority half
    burst, burst_params = burst_requests()
    llm = LLM(tiny_dir, device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=C, block_size=BS,
              num_blocks=SMALL_POOL, scheduling_policy="priority")
    victims = []
    schedule = llm.engine.scheduler.schedule

    def watched():
        out = schedule()
        victims.extend(s.priority for s in out.preempted)
        return out

    llm.engine.scheduler.schedule = watched
    priority = [0 if i % 2 else 5 for i in range(len(burst))]
    got = llm.generate(burst, burst_params, priority=priority)
    assert [o.token_ids for o in got] == alone_outputs
    assert victims and victims.count(5) > victims.count(0), victims
    fcfs = LLM(tiny_dir, device="cpu", max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        fcfs.generate(prompts[:1], params, priority=[1])
    with pytest.raises(ValueError, match="priority must be an integer"):
        fcfs.engine.add_request(prompts[0], params, priority=True)
    with pytest.raises(ValueError, match="one integer a prompt"):
        llm.generate(prompts, params, priority=[0])
