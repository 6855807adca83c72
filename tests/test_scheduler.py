"""Scheduler behaviour, scenario by scenario, with no model: FCFS admission, the step budget,
chunked prefill next to running decodes, preemption of the newest sequence and its resumption
ahead of newer requests, drafts, and retiring sequences.

`step()` below does the bookkeeping LLMEngine.step does after a forward pass (num_computed,
prefix-cache commit, one sampled token when the chunk reached the end), with a fake "model"
whose next token is a function of the context, so recomputation after preemption must give the
same tokens.
"""

from __future__ import annotations

import pytest

from minillm.engine.block_manager import BlockManager
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence, Status
from minillm.sampling_params import SamplingParams


def fake_token(ids: list[int]) -> int:
    return (sum(ids[-4:]) * 31 + len(ids)) % 997


def make(bs=8, num_blocks=64, max_num_seqs=4, budget=64, prefix=True):
    bm = BlockManager(num_blocks, bs, prefix)
    return bm, Scheduler(bm, max_num_seqs, budget)


def req(name: str, n: int, max_tokens: int = 8, base: int = 0) -> Sequence:
    return Sequence(name, [(base + i) % 997 for i in range(n)], SamplingParams(max_tokens=max_tokens), 0)


def step(sched: Scheduler):
    """One scheduler step plus LLMEngine.step's bookkeeping; returns the SchedulerOutput."""
    out = sched.schedule()
    assert len(out.scheduled) <= sched.max_num_seqs
    assert out.num_tokens <= sched.max_num_batched_tokens
    for item in out.scheduled:
        seq = item.seq
        samples = item.samples
        seq.num_computed += item.num_new
        sched.bm.commit_full_blocks(seq)
        if samples:
            seq.output_ids.append(fake_token(seq.all_ids))
            if len(seq.output_ids) >= seq.params.max_tokens:
                sched.finish(seq, "length")
    return out


def run(sched: Scheduler, max_steps: int = 10_000) -> int:
    steps = 0
    while sched.has_work():
        step(sched)
        steps += 1
        assert steps < max_steps, "the scheduler stopped making progress"
    return steps


def test_fcfs_admission_respects_max_num_seqs():
    _, sched = make(max_num_seqs=2)
    a, b, c = req("a", 5), req("b", 5), req("c", 5)
    for s in (a, b, c):
        sched.add(s)
    out = step(sched)
    assert [i.seq for i in out.scheduled] == [a, b]
    assert list(sched.waiting) == [c]
    sched.finish(a, "stop")
    out = step(sched)
    assert [i.seq for i in out.scheduled] == [b, c], "the freed seat goes to the next waiting request"


def test_head_of_line_request_is_not_overtaken():
    """A waiting request that does not fit yet blocks newer ones (FCFS), so it cannot starve."""
    bm, sched = make(bs=8, num_blocks=6, budget=64)
    a = req("a", 30, max_tokens=10)  # 4 blocks, grows to 5
    big = req("big", 30, max_tokens=2)  # needs 4 blocks: does not fit next to a
    small = req("small", 3, max_tokens=2)  # would fit, but arrived later
    for s in (a, big, small):
        sched.add(s)
    out = step(sched)
    assert [i.seq for i in out.scheduled] == [a]
    assert list(sched.waiting) == [big, small]
    assert not big.block_table and big.num_computed == 0, "a failed admission must give its blocks back"
    run(sched)
    assert big.finished and small.finished


def test_chunked_prefill_shares_the_budget_with_a_running_decode():
    bm, sched = make(budget=16)
    dec = req("dec", 4, max_tokens=40)
    sched.add(dec)
    step(sched)  # dec prefilled, one token out
    long = req("long", 100, max_tokens=2, base=300)
    sched.add(long)
    chunks = []
    while not long.output_ids:  # until its prefill is done and its first token sampled
        before_dec, before_long = len(dec.output_ids), long.num_computed
        out = step(sched)
        assert out.scheduled[0].seq is dec and out.scheduled[0].num_new == 1, "the decode goes first"
        assert len(dec.output_ids) == before_dec + 1, "the running decode advanced this step"
        assert out.num_tokens <= 16
        chunks.append(long.num_computed - before_long)
    assert len(chunks) >= 100 // 15 and all(c <= 15 for c in chunks), chunks
    assert sum(chunks) == 100


def test_newest_is_preempted_and_resumes_before_newer_requests():
    bm, sched = make(bs=8, num_blocks=6, max_num_seqs=3, budget=64, prefix=False)
    a = req("a", 16, max_tokens=30, base=0)  # 2 blocks, grows
    b = req("b", 16, max_tokens=30, base=100)  # 2 blocks, grows
    sched.add(a)
    sched.add(b)
    step(sched)
    c = req("c", 8, max_tokens=4, base=200)  # arrives after b
    sched.add(c)
    preempted = []
    for _ in range(40):
        out = step(sched)
        preempted += out.preempted
        if preempted:
            break
    assert preempted and preempted[0] is b, "the newest running sequence is the victim"
    assert b.status is Status.WAITING and not b.block_table and b.num_computed == 0
    assert b.num_preemptions == 1 and sched.num_preemptions >= 1
    if c in sched.waiting:  # b keeps its place in arrival order, ahead of the newer c
        assert list(sched.waiting).index(b) < list(sched.waiting).index(c)
    # b comes back before c is admitted: watch every admission
    admitted = []
    while sched.has_work():
        running = set(map(id, sched.running))
        out = step(sched)
        admitted += [i.seq.request_id for i in out.scheduled if id(i.seq) not in running]
    assert "b" in admitted and ("c" not in admitted or admitted.index("b") < admitted.index("c"))
    # recomputation reproduces the same tokens: b's output equals b alone on a roomy pool
    _, alone = make(num_blocks=64)
    b2 = req("b2", 16, max_tokens=30, base=100)
    alone.add(b2)
    run(alone)
    assert b.output_ids == b2.output_ids


def test_priority_orders_admission_and_picks_the_victim():
    """--scheduling-policy priority: waiting requests are admitted by (priority, arrival), lower
    first; when the pool runs out, the running sequence with the highest value (then the newest) is
    preempted, and it waits behind the higher-priority requests but ahead of equal, newer ones."""
    bm, sched = make(bs=8, num_blocks=6, max_num_seqs=2, budget=64, prefix=False)
    seqs = {}
    for name, prio in (("low", 5), ("mid", 1), ("high", -3), ("mid2", 1)):
        seqs[name] = req(name, 16, max_tokens=30, base=len(seqs) * 100)
        seqs[name].priority = prio
        sched.add(seqs[name])
    assert [s.request_id for s in sched.waiting] == ["high", "mid", "mid2", "low"]
    out = step(sched)
    assert [i.seq.request_id for i in out.scheduled] == ["high", "mid"]
    assert [s.request_id for s in sched.running] == ["high", "mid"]
    preempted = []
    for _ in range(40):  # two sequences of 16 tokens growing to 46 in a pool of 48 slots
        preempted += step(sched).preempted
        if preempted:
            break
    assert preempted and preempted[0] is seqs["mid"], "the lower-priority running sequence is the victim"
    assert [s.request_id for s in sched.waiting] == ["mid", "mid2", "low"]
    run(sched)
    assert all(s.finished for s in seqs.values())


def test_overcommitted_pool_only_preempts():
    """A pool that holds exactly one max-length sequence serves many at once, by preemption."""
    bs, max_model_len = 8, 64
    bm, sched = make(bs=bs, num_blocks=max_model_len // bs, max_num_seqs=6, budget=48)
    seqs = [req(f"s{i}", 10 + i, max_tokens=max_model_len - 10 - i, base=50 * i) for i in range(6)]
    for s in seqs:
        sched.add(s)
    run(sched)
    assert all(s.finish_reason == "length" and len(s.output_ids) == s.params.max_tokens for s in seqs)
    assert sched.num_preemptions > 0
    assert bm.num_used == 0 and len(bm.free) + bm.num_cached == bm.num_blocks


def test_drafts_ride_with_a_decode_and_are_dropped_when_the_budget_is_short():
    bm, sched = make(budget=8, max_num_seqs=2)
    a = req("a", 5, max_tokens=20)
    sched.add(a)
    step(sched)
    a.draft_ids = [1, 2, 3]
    bm.allocate(a, a.num_tokens + 3)  # the engine takes the drafts' blocks when it proposes
    out = sched.schedule()
    (item,) = out.scheduled
    assert (item.num_new, item.num_draft, item.samples, item.num_logits) == (4, 3, True, 4)
    # verification rejects all drafts: roll back to the last real token
    a.num_computed = item.start + 1
    bm.truncate(a, a.num_computed)
    a.draft_ids = []
    a.output_ids.append(7)
    assert len(a.block_table) == -(-a.num_computed // bm.block_size)

    b = req("b", 6, max_tokens=4, base=500)
    sched.add(b)
    step(sched)  # a decodes, b prefills 6 of the remaining 7
    a.draft_ids = [1, 2, 3, 4, 5, 6, 7, 8]  # 1 + 8 > budget 8: the drafts must wait
    out = sched.schedule()
    assert out.scheduled[0].seq is a and out.scheduled[0].num_draft == 0 and out.scheduled[0].num_new == 1
    assert out.num_tokens <= 8


def test_finish_and_abort_free_blocks_at_once():
    bm, sched = make(prefix=False)
    a, b = req("a", 20), req("b", 20, base=40)
    sched.add(a)
    sched.add(b)
    step(sched)
    used = bm.num_used
    sched.finish(a, "abort")
    assert a.status is Status.FINISHED and a.finish_reason == "abort" and not a.block_table
    assert bm.num_used == used - 3
    c = req("c", 4)
    sched.add(c)
    sched.finish(c, "abort")  # still waiting: no blocks, just gone
    assert c not in sched.waiting and c.finished
    sched.finish(b, "stop")
    assert bm.num_used == 0 and not sched.has_work()


@pytest.mark.parametrize("prefix", [True, False])
def test_identical_requests_in_one_step_each_get_their_own_blocks(prefix):
    """Two equal prompts admitted together compute the same blocks twice (no hit yet): the
    second must not write into the first's blocks, and later requests hit exactly one copy."""
    bm, sched = make(bs=8, prefix=prefix)
    a, b = req("a", 20, base=7), req("b", 20, base=7)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert not set(a.block_table) & set(b.block_table)
    c = req("c", 20, base=7)
    sched.add(c)
    step(sched)
    shared = set(c.block_table) & (set(a.block_table) | set(b.block_table))
    assert len(shared) == (2 if prefix else 0)
    run(sched)
    assert a.output_ids == b.output_ids == c.output_ids
