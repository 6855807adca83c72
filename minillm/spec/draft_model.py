"""Draft-model drafter: a smaller model with the target's tokenizer, run for k steps per round.

Its KV pool has the target's geometry and is addressed by the same block tables, so the block
manager that sizes, shares and frees the target's blocks does the same for the drafter's. Each
round first catches the drafter up on the tokens it has not seen (the prompt, then the tokens
accepted last round), then drafts k tokens one at a time, each step batched across sequences;
on the GPU those steps replay CUDA graphs (capture_graphs), and from the second draft on each
step takes its input from the step before on the device, so the k steps run back to back.

Drafts: the argmax for greedy requests; at temperature > 0 a draw from q, each step's distribution
under the request's temperature and filters (the seed salted: runner.DRAW_DRAFTS), and the target
verifies each draft against that q (accept with probability min(1, p / q), else draw from
max(p - q, 0)). Every drafting step's logits rows are copied into `logits`, one run of k rows a
sequence, which the verification step reads (ModelRunner.draft_q); rounds whose sequences are all
greedy copy nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from minillm.engine.runner import DRAW_DRAFTS, ModelRunner
from minillm.engine.scheduler import ScheduledSeq
from minillm.engine.sequence import Sequence
from minillm.models.transformer import Transformer
from minillm.spec.config import draft_vocab_size as draft_vocab

_IN_FLIGHT = 0  # a draft's placeholder while its step runs (a valid id: prepare may read it as one)


class DraftModelProposer:
    needs_kv = True
    lookahead = 0  # its KV stays within the target's next-step positions

    def __init__(self, loaded, backend, k: int, max_tokens: int, max_seqs: int, max_model_len: int,
                 draft_vocab_size: int | None = None):
        self.k = k
        self.config = loaded.config
        # drafting from the first draft_vocab_size ids (config.draft_vocab_size): its logits and LM
        # head keep only those rows; the embedding keeps every id, since any token can be an input
        V = loaded.config.vocab_size
        dv = self.draft_vocab_size = draft_vocab(draft_vocab_size, V)
        self.model = Transformer(replace(loaded.config, vocab_size=dv), loaded.weights, backend, max_model_len + 1)
        if dv < V:
            self.model.lm_head = self.model.lm_head[:dv]
        loaded.weights = {}
        self.max_tokens, self.max_seqs, self.max_model_len = max_tokens, max_seqs, max_model_len
        self.backend = backend
        self.launches = 0  # rounds so far: seq.draft_q names the one that drew its drafts
        self.samples_drafts = True  # drafts at temperature > 0 are draws from q (ModelRunner.draft_q)
        self._copy_q = False  # the round being drafted keeps its q rows (some sequence samples)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.config.kv_bytes_per_token(dtype_bytes)

    def attach(self, block_manager) -> None:
        """Allocate the drafter's KV pool (the target's geometry) and its step buffers."""
        self.kv = self.model.allocate_kv_cache(block_manager.num_blocks, block_manager.block_size)
        self.runner = ModelRunner(self.model, self.backend, self.kv, block_manager, max_tokens=self.max_tokens,
                                  max_seqs=self.max_seqs, max_logits=self.max_seqs, max_model_len=self.max_model_len)
        # each round's drafting distributions: sequence i of the round (its drafting order) at rows
        # i * k .. i * k + k - 1, draft j at row i * k + j (as a verification run reads them)
        self.logits = self.backend.empty((self.max_seqs * self.k, self.draft_vocab_size), dtype=np.float32)

    def capture_graphs(self, buckets: list[int]) -> None:
        """CUDA graphs of the drafter's steps for each bucket of sequences: one row a sequence
        (the k - 1 drafting steps, and catch-ups of one token: the correction after a rejection),
        and two rows, sampling the last (a catch-up once every draft was accepted: the last draft,
        which the drafter proposed but never read, and the bonus token). Eager, each of the ~10
        kernels a layer is a separate CuPy launch from Python: on the H200 the embedded SmolLM2
        drafting for itself ran a round of four drafts in 30 ms, 0.1x plain decoding (part242).
        A catch-up of more tokens (the first after the prompt, or after plain steps) runs eagerly."""
        self.runner.catch_up_graphs = True
        self.runner.capture_graphs(buckets, [1, 2], forward_only=True)

    def discard(self) -> None:
        """Forget the drafting steps a failed round left unread (LLMEngine.discard_in_flight)."""
        self.runner.readback.reset()

    def _mode(self):
        return DRAW_DRAFTS if self._copy_q else True

    def _keep_q(self, slots: list[int], j: int) -> None:
        """Copy the step just launched's logits rows (one a sequence, in order) into `logits` as
        draft j of the sequences in those drafting slots: one strided copy when the slots run
        0..n-1 (the usual case), else a row each. Enqueued behind the step, before the next one
        overwrites its rows."""
        if not self._copy_q or not slots:
            return
        rows = self.runner.ws.logits
        n = len(slots)
        if slots == list(range(n)):
            q = self.logits.reshape(self.max_seqs, self.k, -1)
            q[:n, j] = rows[:n]
            return
        for r, i in enumerate(slots):
            self.logits[i * self.k + j] = rows[r]

    def _run(self, items: list[ScheduledSeq], slot: dict) -> list:
        """One drafter forward; per item its draft (the argmax, or a draw from q), or None for a
        prefill chunk that does not reach the end; the rows' q kept as draft 0 (_keep_q)."""
        rows = self.runner.execute(items, greedy=self._mode())
        tokens, r, slots = [], 0, []
        for it in items:
            if not it.num_logits:
                tokens.append(None)
                continue
            tokens.append(int(rows[r]))
            slots.append(slot[id(it.seq)])
            r += 1
        self._keep_q(slots, 0)
        return tokens

    def propose(self, seqs: list[Sequence], ks: list[int]) -> None:
        """Set seq.draft_ids for each sequence."""
        # drafting order: k descending, so each later step's sequences are a prefix of this list
        # and its rows land in slots 0..n-1 (one strided copy of q a step)
        active = sorted(((s, k) for s, k in zip(seqs, ks) if k > 0), key=lambda sk: -sk[1])
        for s, _ in active:
            s.draft_ids = []
        if not active:
            return
        self.launches += 1
        self._copy_q = any(s.params.temperature > 0 for s, _ in active)
        slot = {id(s): i for i, (s, _) in enumerate(active)}
        for s, _ in active:
            s.draft_q = (self.launches, slot[id(s)] * self.k) if self._copy_q else None
        # catch-up: every token the drafter has not processed, in chunks that fit its workspace
        pending = {id(s): s.draft_computed for s, _ in active}
        while True:
            items, budget = [], self.max_tokens
            for s, _ in active:
                n = min(s.num_tokens - pending[id(s)], budget)
                if n > 0:
                    items.append(ScheduledSeq(s, n, start=pending[id(s)]))
                    budget -= n
            if not items:
                break
            tokens = self._run(items, slot)
            for it, tok in zip(items, tokens):
                pending[id(it.seq)] += it.num_new
                if tok is not None:  # caught up: its first draft
                    it.seq.draft_ids = [tok]
        for s, _ in active:
            s.draft_computed = s.num_tokens
        # k - 1 more single-token steps, batched over the sequences that still draft. From the second
        # on, each takes its input (the draft the step before sampled) on the device (src_row), so it
        # is launched before the host has read that step: the device runs the steps back to back while
        # the host prepares the next one and reads the one before (as many in flight as TokenReadback has slots)
        inflight: deque = deque()
        rows: dict[int, int] = {}  # each sequence's logits row in the step just launched
        for j in range(1, max(k for _, k in active)):
            items = [ScheduledSeq(s, 1, start=s.num_tokens + j - 1, src_row=rows.get(id(s), -1))
                     for s, k in active if k > j]
            handle = self.runner.launch(items, greedy=self._mode(), readback=True)
            self._keep_q(list(range(len(items))), j)
            rows = {}
            for i, it in enumerate(items):
                it.seq.draft_ids.append(_IN_FLIGHT)  # read by the next step's prepare, filled on the device
                it.seq.draft_computed = it.start + 1
                rows[id(it.seq)] = i
            inflight.append((items, handle))
            if len(inflight) == self.runner.readback.SLOTS:  # every readback slot holds an unread step
                self._collect(*inflight.popleft())
        while inflight:
            self._collect(*inflight.popleft())

    def _collect(self, items: list[ScheduledSeq], handle) -> None:
        """Put a launched step's drafts in place of their placeholders."""
        for it, tok in zip(items, self.runner.collect(handle).tolist()):
            it.seq.draft_ids[it.start + 1 - it.seq.num_tokens] = tok
