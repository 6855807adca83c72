"""Property tests of the paged KV cache: slot mappings, block tables, BlockManager + Scheduler.

Two layers:
  * stateless properties (hypothesis @given) of the slot mapping over random block sizes,
    block tables and lengths, checked against what ModelRunner.prepare writes into its host
    buffers (the indices a kernel reads);
  * a RuleBasedStateMachine that drives BlockManager + Scheduler the way LLMEngine.step does,
    with no model: requests from a few shared prefixes (prefix-cache hits), steps, speculative
    drafts that are partly accepted and rolled back with BlockManager.truncate, finishes, aborts
    and forced preemptions, over random pool shapes including overcommitted ones.

The state machine keeps a shadow KV pool: every slot a step writes records an id of the token
*and the whole prefix before it* (what a real K/V vector depends on). Each step then checks that
every position a sequence attends to reads its own prefix's id. That turns "no block is written
by two sequences", "the prefix cache serves the right KV" and "preemption recomputes correctly"
into one assertion that fails on the first corrupted slot, long before a kernel would fault.
"""

from __future__ import annotations

import random
from collections import Counter, deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine.block_manager import BlockManager
from minillm.engine.runner import ModelRunner, StepBuffers
from minillm.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from minillm.engine.sequence import Sequence, Status
from minillm.sampling_params import SamplingParams

BLOCK_SIZES = [8, 16, 32, 64, 128, 256]
VOCAB = 1000


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# Stateless properties of the slot mapping
# ---------------------------------------------------------------------------------------------

@st.composite
def table_and_length(draw):
    bs = draw(st.sampled_from(BLOCK_SIZES))
    num_blocks = draw(st.integers(1, 48))
    perm = draw(st.permutations(range(num_blocks)))
    n_table = draw(st.integers(1, num_blocks))
    length = draw(st.integers(1, n_table * bs))
    return bs, num_blocks, list(perm[:n_table]), length


@settings(max_examples=300, deadline=None)
@given(table_and_length())
def test_slot_is_injective_in_pool_and_inverts(case):
    bs, num_blocks, table, length = case
    bm = BlockManager(num_blocks, bs)
    seq = Sequence("s", [0] * length, SamplingParams(), 0)
    seq.block_table = table
    slots = [bm.slot(seq, p) for p in range(length)]
    assert len(set(slots)) == length, "two positions of one sequence share a slot"
    assert all(0 <= s < num_blocks * bs for s in slots), "slot past the end of the pool"
    for p, s in enumerate(slots):  # the slot decodes back to (its block, its offset)
        assert divmod(s, bs) == (table[p // bs], p % bs)


def bare_runner(bm: BlockManager, max_tokens: int, max_seqs: int, max_model_len: int) -> ModelRunner:
    """A ModelRunner with real step buffers but no model: prepare() needs only bm and buf."""
    runner = ModelRunner.__new__(ModelRunner)
    runner.bm = bm
    runner.max_tokens, runner.max_seqs = max_tokens, max_seqs
    runner.max_logits = max_seqs * 8
    runner.max_blocks = cdiv(max_model_len, bm.block_size)
    runner.buf = StepBuffers(NumpyBackend(), max_tokens, max_seqs, runner.max_logits, runner.max_blocks)
    return runner


@st.composite
def batches(draw):
    """A pool with its free list shuffled (so tables are scattered), and 1..4 sequences each
    with some tokens computed and a chunk (maybe a decode with drafts) scheduled."""
    bs = draw(st.sampled_from(BLOCK_SIZES))
    n = draw(st.integers(1, 4))
    specs = []
    for _ in range(n):
        length = draw(st.integers(1, 3 * bs))
        computed = draw(st.integers(0, length - 1))
        drafts = draw(st.integers(0, 4)) if computed == length - 1 else 0
        new = length - computed + drafts if drafts else draw(st.integers(1, length - computed))
        specs.append((length, computed, new, drafts))
    need = sum(cdiv(c + nw, bs) for _, c, nw, _ in specs)
    num_blocks = need + draw(st.integers(0, 8))
    perm = draw(st.permutations(range(num_blocks)))
    return bs, num_blocks, list(perm), specs


@settings(max_examples=200, deadline=None)
@given(batches())
def test_prepare_writes_the_block_managers_slots(case):
    bs, num_blocks, perm, specs = case
    bm = BlockManager(num_blocks, bs)
    bm.free = deque(perm)  # scattered physical blocks, as after a long run
    rng = random.Random(len(specs))
    batch = []
    for i, (length, computed, new, drafts) in enumerate(specs):
        seq = Sequence(f"s{i}", [rng.randrange(VOCAB) for _ in range(length)], SamplingParams(), i)
        seq.draft_ids = [rng.randrange(VOCAB) for _ in range(drafts)]
        bm.allocate(seq, computed + new)
        seq.num_computed = computed
        batch.append(ScheduledSeq(seq, new, drafts))
    max_len = max(c + nw for _, c, nw, _ in specs)
    runner = bare_runner(bm, sum(it.num_new for it in batch), len(batch), max_len)
    t, r = runner.prepare(batch)
    h = runner.buf.host

    assert t == sum(it.num_new for it in batch)
    slots = h["slot_mapping"][:t]
    assert len(set(slots.tolist())) == t, "one step writes a KV slot twice"
    assert slots.min() >= 0 and slots.max() < num_blocks * bs
    row = 0
    for b, it in enumerate(batch):
        seq, start, n = it.seq, it.seq.num_computed, it.num_new
        pos = list(range(start, start + n))
        assert h["query_start"][b] == row and h["query_start"][b + 1] == row + n
        assert h["positions"][row : row + n].tolist() == pos
        assert h["slot_mapping"][row : row + n].tolist() == [bm.slot(seq, p) for p in pos]
        want_ids = (seq.all_ids + seq.draft_ids)[start : start + n]
        assert h["input_ids"][row : row + n].tolist() == want_ids
        assert h["seq_lens"][b] == start + n
        assert h["block_tables"][b, : len(seq.block_table)].tolist() == seq.block_table
        row += n
    assert r == sum(it.num_logits for it in batch)
    assert h["logits_indices"][:r].tolist() == [  # the last row of each sampling chunk and its drafts
        i for it, end in zip(batch, np.cumsum([x.num_new for x in batch]))
        for i in range(end - it.num_logits, end)]
    runner._check(batch, t)  # the MINILLM_DEBUG check agrees that these indices are sound


def seq_of_row(query_start, B: int, t: int) -> int:
    """cuda/common.cuh seq_of_row: the last sequence b < B with query_start[b] <= t (a binary search)."""
    lo, hi = 0, B - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if query_start[mid] <= t:
            lo = mid
        else:
            hi = mid - 1
    return lo


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(0, 40))
def test_decode_index_guess_finds_what_the_search_finds(nqs, t):
    """cuda/decode_attention.cu's DEC_INDEX_GUESS, in Python: a row t inside the step's sequences is
    guessed to be sequence bg = min(t, B - 1), and the guess is taken when query_start[bg] <= t <
    query_start[bg + 1] (else the search runs). Over any query runs (empty ones and padding runs of
    several rows included) a taken guess is the search's sequence, and in a decode step (one query a
    sequence) the guess is always taken."""
    B = len(nqs)
    qs = np.concatenate([[0], np.cumsum(nqs)]).astype(int)
    bg = min(t, B - 1)
    inside = t < qs[B]
    guessed = inside and qs[bg] <= t < qs[bg + 1]
    if guessed:
        assert bg == seq_of_row(qs, B, t)
    if inside and all(n == 1 for n in nqs):
        assert guessed


def test_debug_check_fires_on_bad_indices():
    """The MINILLM_DEBUG host check must catch a slot that is not its position's (in range, in a block the
    sequence owns alone: the other checks let it through), a slot past the pool and a shared writable block."""
    bm = BlockManager(4, 8)
    a = Sequence("a", list(range(10)), SamplingParams(), 0)
    b = Sequence("b", list(range(10)), SamplingParams(), 0)
    bm.allocate(a, 10)
    runner = bare_runner(bm, 32, 2, 16)
    batch = [ScheduledSeq(a, 10)]
    t, _ = runner.prepare(batch)
    runner._check(batch, t)
    slots = runner.buf.host["slot_mapping"]
    slots[3], slots[4] = slots[4], slots[3]  # both a's, both in range, no slot twice
    with pytest.raises(AssertionError, match="row 3 of a: position 3, slot"):
        runner._check(batch, t)

    b.block_table = [a.block_table[0], 3]  # b writes into a's block 0
    bm.ref_count[a.block_table[0]] += 1
    bm.ref_count[3] += 1
    batch = [ScheduledSeq(a, 10), ScheduledSeq(b, 10)]
    t, _ = runner.prepare(batch)
    try:
        runner._check(batch, t)
    except AssertionError as e:
        assert "same KV slot" in str(e) or "shared" in str(e)
    else:
        raise AssertionError("a block written by two sequences went unnoticed")

    a.block_table = [0, 4]  # block 4 is past the pool of 4 blocks
    batch = [ScheduledSeq(a, 10)]
    t, _ = runner.prepare(batch)
    try:
        runner._check(batch, t)
    except AssertionError as e:
        assert "outside the pool" in str(e)
    else:
        raise AssertionError("a slot past the pool went unnoticed")


def test_a_decode_past_its_block_table_is_refused_not_written_into_block_0():
    """A decode whose position is past its block table (a block-manager fault) raised nowhere: the vectorised
    decode fill read the table row's zero padding, so it wrote its key into block 0, another sequence's."""
    bm = BlockManager(6, 8)
    a = Sequence("a", list(range(9)), SamplingParams(), 0)
    b = Sequence("b", list(range(9)), SamplingParams(), 0)
    for seq, have in ((a, 8), (b, 9)):  # a lacks the block its position 8 needs
        bm.allocate(seq, have)
        seq.num_computed = 8
    runner = bare_runner(bm, 32, 2, 16)
    with pytest.raises(IndexError, match="past its sequence's block table"):
        runner.prepare([ScheduledSeq(a, 1), ScheduledSeq(b, 1)])
    bm.allocate(a, 9)
    t, _ = runner.prepare([ScheduledSeq(a, 1), ScheduledSeq(b, 1)])
    assert runner.buf.host["slot_mapping"][:t].tolist() == [bm.slot(a, 8), bm.slot(b, 8)]


# ---------------------------------------------------------------------------------------------
# Stateful model of BlockManager + Scheduler driven like LLMEngine.step
# ---------------------------------------------------------------------------------------------

def next_token(ids: list[int]) -> int:
    """A deterministic stand-in for greedy decoding: equal contexts give equal tokens, so
    equal prompts also share decode blocks in the prefix cache."""
    return hash(tuple(ids[-3:])) % VOCAB


MAX_LIVE = 10


class KVMachine(RuleBasedStateMachine):
    """BlockManager + Scheduler under random requests, steps, drafts, finishes, aborts and
    preemptions, on a random pool shape; invariants are checked after every rule."""

    def __init__(self):
        super().__init__()
        self.bm: BlockManager | None = None

    @initialize(
        bs=st.sampled_from(BLOCK_SIZES),
        per_seq=st.integers(1, 5),
        last_block_short=st.integers(0, 255),
        max_num_seqs=st.integers(1, 6),
        k=st.integers(0, 4),
        extra_lookahead=st.integers(0, 3),
        pool=st.one_of(st.floats(0, 1), st.just(1.0), st.just(0.0)),
        extra_budget=st.integers(0, 2**16),
        prefix_caching=st.booleans(),
        auto_draft=st.booleans(),
        seed=st.integers(0, 2**31),
    )
    def setup(self, bs, per_seq, last_block_short, max_num_seqs, k, extra_lookahead, pool, extra_budget,
              prefix_caching, auto_draft, seed):
        self.bs = bs
        self.max_model_len = max(2, per_seq * bs - last_block_short % bs)
        self.k = k
        # positions past the last token a drafter writes (n-gram: k; DFlash: its block size - 1)
        self.lookahead = k + extra_lookahead if k else 0
        # what plan_kv_pool calls one sequence: max_model_len + lookahead positions
        self.per_seq = cdiv(self.max_model_len + self.lookahead, bs)
        # from exactly one such sequence (the startup minimum) up to the arena rule's
        # max_num_seqs of them: everything below that is overcommitted
        full = max_num_seqs * self.per_seq
        self.num_blocks = self.per_seq + round(pool * (full - self.per_seq))
        self.overcommitted = self.num_blocks < full
        self.max_num_seqs = max_num_seqs
        # the engine refuses a budget below one full decode step: max_num_seqs x (1 + k)
        # plus up to two max_model_len prompts, so some configs chunk every prefill and some none
        self.budget = max_num_seqs * (1 + k) + extra_budget % (2 * self.max_model_len)
        self.auto_draft = auto_draft and k > 0
        self.bm = BlockManager(self.num_blocks, bs, prefix_caching)
        self.sched = Scheduler(self.bm, max_num_seqs, self.budget)
        # the runner's block-table row: max_model_len + lookahead positions
        self.max_table = self.per_seq
        self.rng = random.Random(seed)
        self.prefixes = [[self.rng.randrange(VOCAB) for _ in range(self.max_model_len)] for _ in range(2)]
        # one prefix repeats a single block: equal block contents after different prefixes must
        # not be confused by the prefix cache (its hash chains over the whole prefix)
        motif = [self.rng.randrange(VOCAB) for _ in range(bs)]
        self.prefixes.append((motif * self.per_seq)[: self.max_model_len])
        self.prefixes.append(self.prefixes[0][:bs] + self.prefixes[2][: self.max_model_len - bs])
        self.shadow: list[object] = [None] * (self.num_blocks * bs)
        self.kv_ids: dict[int, list[int]] = {}  # per sequence: ids of its real tokens' KV
        self.live: list[Sequence] = []
        self.n_added = 0
        self.n_steps = 0

    # ---- helpers ------------------------------------------------------------------------
    def ids_of(self, seq: Sequence, upto: int, drafts: int = 0) -> list[int]:
        """KV identity of positions [0, upto): a hash chain over the tokens (and drafts)."""
        cache = self.kv_ids.setdefault(id(seq), [])
        toks = seq.all_ids
        while len(cache) < min(upto, len(toks)):
            cache.append(hash((cache[-1] if cache else None, toks[len(cache)])))
        out = cache[:upto]
        for d in seq.draft_ids[:drafts]:
            if len(out) >= upto:
                break
            out.append(hash((out[-1] if out else None, d)))
        assert len(out) == upto
        return out

    def decoding(self) -> list[Sequence]:
        """Running sequences that just sampled a token (what a drafter would extend)."""
        return [s for s in self.sched.running if s.num_tokens - s.num_computed == 1]

    def end(self, seq: Sequence, reason: str) -> None:
        self.sched.finish(seq, reason)
        self.live.remove(seq)
        self.kv_ids.pop(id(seq), None)

    # ---- rules --------------------------------------------------------------------------
    @precondition(lambda self: self.bm is not None and len(self.live) < MAX_LIVE)
    @rule(data=st.data())
    def add_request(self, data):
        # half the prompts span at least one full block, so there is something to share
        long = st.integers(min(self.bs + 1, self.max_model_len - 1), self.max_model_len - 1)
        L = data.draw(st.one_of(st.integers(1, self.max_model_len - 1), long), label="prompt_len")
        shared = data.draw(st.one_of(st.just(L), st.integers(0, L)), label="shared_prefix_len")
        which = data.draw(st.integers(0, len(self.prefixes) - 1), label="prefix")
        prompt = self.prefixes[which][:shared] + [self.rng.randrange(VOCAB) for _ in range(L - shared)]
        max_tokens = data.draw(st.integers(1, self.max_model_len - L), label="max_tokens")
        seq = Sequence(f"r{self.n_added}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0), 0)
        self.n_added += 1
        self.sched.add(seq)
        self.live.append(seq)

    @precondition(lambda self: self.bm is not None and self.sched.has_work())
    @rule(data=st.data(), n=st.integers(1, 4))
    def step(self, data, n):
        for _ in range(n):
            if self.sched.has_work():
                self._step(data)

    @precondition(lambda self: self.bm is not None and self.k > 0 and self.decoding())
    @rule(data=st.data())
    def propose_drafts(self, data):
        self._propose(data.draw(st.sampled_from(self.decoding()), label="drafted"), data)

    def _propose(self, seq: Sequence, data) -> None:
        """What LLMEngine._propose does: up to k drafts within max_model_len and max_tokens, with
        blocks for them (and the drafter's lookahead) taken now, shrinking k rather than
        preempting anyone for a guess."""
        k = min(data.draw(st.integers(1, self.k), label="num_drafts"), self.max_model_len - seq.num_tokens,
                seq.params.max_tokens - len(seq.output_ids))
        while k > 0 and not self.bm.can_allocate(seq, seq.num_tokens + max(k, self.lookahead)):
            k -= 1
        if k <= 0:
            return
        self.bm.allocate(seq, seq.num_tokens + max(k, self.lookahead))
        # part of the time the drafter is right for a while, as a real one would be
        right = data.draw(st.integers(0, k), label="draft_right")
        ids = list(seq.all_ids)
        drafts = []
        for j in range(k):
            tok = next_token(ids) if j < right else self.rng.randrange(VOCAB)
            drafts.append(tok)
            ids.append(tok)
        seq.draft_ids = drafts

    @precondition(lambda self: self.bm is not None and self.decoding())
    @rule(data=st.data())
    def finish_by_stop_token(self, data):
        self.end(data.draw(st.sampled_from(self.decoding()), label="stopped"), "stop")

    @precondition(lambda self: self.bm is not None and self.live)
    @rule(data=st.data())
    def abort(self, data):
        self.end(data.draw(st.sampled_from(self.live), label="aborted"), "abort")

    @precondition(lambda self: self.bm is not None and self.sched.running)
    @rule(data=st.data())
    def preempt(self, data):
        """Preempt an arbitrary running sequence between steps (any one, not just the newest)."""
        seq = data.draw(st.sampled_from(self.sched.running), label="preempted")
        self.sched._preempt(seq, SchedulerOutput())
        assert seq.status is Status.WAITING and not seq.block_table

    @precondition(lambda self: self.bm is not None and len(self.live) >= 3)
    @rule(data=st.data())
    def drain(self, data):
        """Run to completion: every request ends in a bounded number of steps (liveness), and
        then every block is free or cached-evictable."""
        bound = 4 * sum(s.params.max_tokens + s.num_tokens for s in self.live) + 10
        steps = 0
        while self.sched.has_work():
            self._step(data)
            steps += 1
            assert steps <= bound, f"no completion after {steps} steps: {self.sched.running} {self.sched.waiting}"
        assert not self.live
        assert self.bm.num_used == 0
        assert len(self.bm.free) + len(self.bm.evictable) == self.num_blocks

    # ---- one engine step, the bookkeeping of LLMEngine.step ------------------------------
    def _step(self, data) -> None:
        sched, bm, bs = self.sched, self.bm, self.bs
        running_before = list(sched.running)
        waiting_before = list(sched.waiting)
        out = sched.schedule()  # an overcommitted pool must preempt here, never raise
        self.n_steps += 1

        # -- limits
        assert out.scheduled, "work was pending but nothing was scheduled"
        assert len(out.scheduled) <= self.max_num_seqs
        assert out.num_tokens <= self.budget
        ids = [id(it.seq) for it in out.scheduled]
        assert len(set(ids)) == len(ids), "a sequence scheduled twice in one step"

        # -- preemption takes the newest running sequences, newest first
        assert [id(s) for s in out.preempted] == [id(s) for s in reversed(running_before)][: len(out.preempted)]
        if not self.overcommitted:
            assert not out.preempted, "a pool sized by the arena rule preempted"

        # -- running sequences are not starved: each one still running was scheduled unless
        # the budget ran out on the sequences ahead of it
        before = {id(s) for s in running_before}
        gone = {id(s) for s in out.preempted}
        running_tokens = sum(it.num_new for it in out.scheduled if id(it.seq) in before)
        for s in running_before:
            if id(s) not in gone and id(s) not in ids:
                assert running_tokens == self.budget, f"{s} skipped with budget left"

        # -- FCFS admission: the newly admitted are the oldest waiting, in order
        pool = sorted(waiting_before + list(out.preempted), key=lambda s: s.arrival)
        admitted = [it.seq for it in out.scheduled if id(it.seq) not in before or id(it.seq) in gone]
        assert [s.arrival for s in admitted] == [s.arrival for s in pool[: len(admitted)]]
        assert [s.arrival for s in sched.waiting] == [s.arrival for s in pool[len(admitted):]]

        # -- the chunk of each sequence, and the shadow KV writes
        limit = self.num_blocks * bs
        written: set[int] = set()
        reads = []
        for it in out.scheduled:
            seq, start, n = it.seq, it.start, it.num_new
            assert start == seq.num_computed
            assert seq.status is Status.RUNNING
            assert n >= 1
            assert it.num_draft <= len(seq.draft_ids)
            assert start + n <= seq.num_tokens + it.num_draft
            assert it.num_draft <= self.k
            if it.num_draft:
                assert start + n - it.num_draft == seq.num_tokens, "drafts scheduled mid-prefill"
            assert len(seq.block_table) * bs >= start + n, "a scheduled token has no slot"
            assert len(seq.block_table) <= self.max_table, "block table longer than the runner's row"
            kv = self.ids_of(seq, start + n, it.num_draft)
            for p in range(start, start + n):
                s = bm.slot(seq, p)
                assert 0 <= s < limit
                assert s not in written, f"slot {s} written twice in one step"
                written.add(s)
                self.shadow[s] = kv[p]
            reads.append((seq, start + n, kv))
        # attention runs after every sequence's store_kv: each context must read its own KV
        for seq, ctx, kv in reads:
            for p in range(ctx):
                assert self.shadow[bm.slot(seq, p)] == kv[p], (
                    f"{seq.request_id} position {p} reads KV that is not its own")

        # -- what LLMEngine.step does with the results, in its order: verify and roll back,
        # commit full blocks to the prefix cache, then append the tokens (and maybe finish)
        for it in out.scheduled:
            seq = it.seq
            samples = it.samples  # read before num_computed moves
            seq.num_computed += it.num_new
            new: list[int] = []
            if samples and it.num_draft:
                accepted = data.draw(st.integers(0, it.num_draft), label="accepted")
                new = seq.draft_ids[:accepted]
                new.append(next_token(seq.all_ids + new))  # the target's token after them
                seq.num_computed = it.start + 1 + accepted  # the last token and the accepted drafts
                bm.truncate(seq, seq.num_computed)
            elif samples:
                new = [next_token(seq.all_ids)]
            seq.draft_ids = []
            bm.commit_full_blocks(seq)
            for tok in new:
                seq.output_ids.append(tok)
                if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
                    self.end(seq, "length")
                    break
        if self.auto_draft:  # the engine drafts for every decoding sequence after each step
            for seq in self.decoding():
                self._propose(seq, data)

    # ---- invariants after every rule -----------------------------------------------------
    @invariant()
    def pool_accounting(self):
        bm = self.bm
        if bm is None:
            return
        live = list(self.sched.running) + list(self.sched.waiting)
        assert sorted(map(id, live)) == sorted(map(id, self.live)), "scheduler lost or kept a sequence"
        holders = Counter(b for s in live for b in s.block_table)
        for s in live:
            assert len(set(s.block_table)) == len(s.block_table), f"{s} holds a block twice"
        for b in range(self.num_blocks):
            assert bm.ref_count[b] == holders[b], f"block {b}: ref {bm.ref_count[b]}, {holders[b]} tables"
        free = list(bm.free)
        evictable = set(bm.evictable)
        held = {b for b in range(self.num_blocks) if bm.ref_count[b] > 0}
        assert len(set(free)) == len(free), "a block twice on the free list"
        assert not (set(free) & evictable) and not (held & set(free)) and not (held & evictable)
        assert len(free) + len(held) + len(evictable) == self.num_blocks
        for b in free:
            assert bm.block_hash[b] is None and bm.block_tokens[b] is None
        for b in evictable:
            assert bm.block_hash[b] is not None
        for h, b in bm.hash_to_block.items():
            assert bm.block_hash[b] == h
            assert len(bm.block_tokens[b]) == self.bs, f"block {b} cached with a partial token tuple"
        assert sum(x is not None for x in bm.block_hash) == len(bm.hash_to_block)
        if not bm.enable_prefix_caching:
            assert not bm.hash_to_block
        if not self.live:
            assert bm.num_used == 0, "all requests ended but blocks are still held"

    @invariant()
    def writable_blocks_are_exclusive(self):
        if self.bm is None:
            return
        bm, bs = self.bm, self.bs
        slots: set[int] = set()
        assert len(self.sched.running) <= self.max_num_seqs
        for s in self.sched.running:
            assert s.status is Status.RUNNING
            assert s.num_computed <= s.num_tokens
            assert cdiv(s.num_computed, bs) <= len(s.block_table) <= self.max_table
            first = s.num_computed // bs  # first block not fully computed: it will be written
            assert s.num_hashed_blocks <= first
            for b in s.block_table[first:]:
                assert bm.ref_count[b] == 1, f"writable block {b} of {s.request_id} is shared"
                assert bm.block_hash[b] is None, f"writable block {b} of {s.request_id} is in the prefix cache"
            for p in range(s.num_computed, len(s.block_table) * bs):
                slot = bm.slot(s, p)
                assert 0 <= slot < self.num_blocks * bs
                assert slot not in slots, f"slot {slot} writable by two sequences"
                slots.add(slot)
            # and the KV already computed is still intact (nobody overwrote a shared block)
            kv = self.ids_of(s, s.num_computed)
            for p in range(s.num_computed):
                assert self.shadow[bm.slot(s, p)] == kv[p], f"{s.request_id} lost its KV at {p}"
        arrivals = [s.arrival for s in self.sched.waiting]
        assert arrivals == sorted(arrivals), "waiting queue out of arrival order"
        for s in self.sched.waiting:
            assert s.status is Status.WAITING and not s.block_table and s.num_computed == 0


KVMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestKVMachine = KVMachine.TestCase


def test_hash_chain_ids_distinguish_prefixes():
    """Sanity of the shadow model itself: the same token after different prefixes differs."""
    m = KVMachine()
    m.kv_ids = {}
    a = Sequence("a", [1, 2, 3], SamplingParams(), 0)
    b = Sequence("b", [9, 2, 3], SamplingParams(), 0)
    ia, ib = m.ids_of(a, 3), m.ids_of(b, 3)
    assert ia[0] != ib[0] and ia[2] != ib[2]
    assert m.ids_of(a, 2) == ia[:2]  # a prefix's ids do not depend on what follows
