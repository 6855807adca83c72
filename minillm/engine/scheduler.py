"""Scheduler: continuous batching with chunked prefill and preemption instead of faults.

Each step has a budget of max_num_batched_tokens and at most max_num_seqs sequences. Running
sequences go first (oldest first): a decode takes one token (plus its speculative drafts), an
unfinished prefill takes the next chunk of what the budget leaves. Then waiting sequences are
admitted first-come first-served, preempted ones (which keep their arrival order) before newer.
Under --scheduling-policy priority every "oldest" and "newest" here reads "by (priority,
arrival)": a lower priority value runs first, ties by arrival (vLLM's order); under fcfs every
priority is 0.

When the pool has no block for a running sequence, the newest running sequence is preempted: its
blocks are freed and it is recomputed later from its prompt plus the tokens it already produced,
so its output is unchanged. The pool is never indexed past its end and no request fails for lack
of blocks.

With async scheduling the engine calls schedule() while a step is still in flight: a sequence's
num_tokens then counts its token in flight (Sequence.num_pending), so a decode is planned at the
position that token will take; a sequence whose token in flight is its last (max_tokens or
max_model_len) gets no row. The engine only schedules ahead when no preemption can happen.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence, Status


def order(seq: Sequence) -> tuple[int, int]:
    """A sequence's place in the queues: by priority (lower first), then arrival."""
    return seq.priority, seq.arrival


def insert_in_order(queue: list[Sequence] | deque[Sequence], seq: Sequence) -> None:
    """seq into a queue kept in order(), after every sequence that does not come later (searched
    from the end: a new arrival usually belongs there)."""
    i = len(queue)
    while i > 0 and order(queue[i - 1]) > order(seq):
        i -= 1
    queue.insert(i, seq)


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new: int  # tokens computed this step, starting at position `start`
    num_draft: int = 0  # of which the last num_draft are speculative drafts to verify
    all_logits: bool = False  # scoring: logits for every new token, nothing sampled
    start: int = -1  # first position computed; -1: seq.num_computed (a drafter passes its own)
    # a draft model's chained step (one new token): its input id is row src_row of the previous
    # step's sampled ids, taken on the device, since the host has not read that step yet; -1: none
    src_row: int = -1
    # Derived once here, from the sequence as it is when scheduled (tokens appended after the step
    # must not change what the step was), and read several times per item on the hot path:
    # samples: this chunk reaches the end of the sequence (and its drafts), so tokens are sampled;
    # num_logits: rows whose logits are computed (the last one plus one per draft, or all of them);
    # decode: a plain decode, one new token at the sequence's end (the runner's vectorised case).
    samples: bool = field(init=False)
    num_logits: int = field(init=False)
    decode: bool = field(init=False)

    def __post_init__(self) -> None:
        num_tokens = self.seq.num_tokens
        if self.start < 0:
            self.start = self.seq.num_computed
        self.samples = not self.all_logits and self.start + self.num_new - self.num_draft >= num_tokens
        if self.all_logits:
            self.num_logits = self.num_new
        else:
            self.num_logits = self.num_draft + 1 if self.samples else 0
        self.decode = (self.num_new == 1 and not self.num_draft and not self.all_logits
                       and self.start == num_tokens - 1)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new for s in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()  # in (priority, arrival) order
        self.running: list[Sequence] = []  # the same order: the last is the one preemption picks
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        insert_in_order(self.waiting, seq)  # last among its priority

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.bm.free_sequence(seq)
        seq.status = Status.WAITING
        seq.draft_ids = []
        seq.num_preemptions += 1
        self.num_preemptions += 1
        insert_in_order(self.waiting, seq)  # resumes before newer requests of its priority
        out.preempted.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()

        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            if seq.num_pending and len(seq.output_ids) + seq.num_pending >= seq.max_output_len:
                continue  # async scheduling: its token in flight is its last, a row now would be dropped
            remaining = seq.num_tokens - seq.num_computed
            num_draft = len(seq.draft_ids) if remaining == 1 else 0
            if remaining + num_draft > budget:
                num_draft = 0
            n = min(remaining + num_draft, budget)
            if self.bm.blocks_needed(seq, seq.num_computed + n):  # most decode steps need none
                while not self.bm.can_allocate(seq, seq.num_computed + n):
                    victim = next(s for s in reversed(self.running) if id(s) not in scheduled_ids)
                    self._preempt(victim, out)
                    if victim is seq:
                        break
                if seq.status is not Status.RUNNING:
                    continue
                self.bm.allocate(seq, seq.num_computed + n)
            out.scheduled.append(ScheduledSeq(seq, n, num_draft))
            scheduled_ids.add(id(seq))
            budget -= n

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.bm.match_prefix(seq)
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self.bm.can_allocate(seq, seq.num_computed + n):
                self.bm.free_sequence(seq)  # give back the prefix-cache blocks it took
                break
            self.waiting.popleft()
            self.bm.record_prefix_lookup(seq.num_tokens, hit)
            self.bm.allocate(seq, seq.num_computed + n)
            seq.status = Status.RUNNING
            if seq.first_scheduled_at is None:  # a resumed (preempted) sequence keeps its first
                seq.first_scheduled_at = time.monotonic()
                seq.num_cached_tokens = hit
            # keep running in order (a resumed sequence goes back to its place), so the newest
            # (or lowest-priority) running sequence is always the last: the one preemption picks
            insert_in_order(self.running, seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire seq (finished or aborted) and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free_sequence(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
