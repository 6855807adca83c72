"""Sequence: one request's tokens, KV bookkeeping and decoding state."""

from __future__ import annotations

import enum
import itertools
import time

from minillm.sampling_params import SamplingParams

_arrival = itertools.count()
_block_versions = itertools.count()  # one counter for all sequences: a version names (sequence, table)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, seed: int):
        self.request_id = request_id
        self.arrival = next(_arrival)  # FCFS order; preempted sequences keep theirs
        self.priority = 0  # --scheduling-policy priority: lower runs first (vLLM's); 0 under fcfs
        # seconds (time.monotonic) it was added and first scheduled: its time in the queue
        self.added_at = time.monotonic()
        self.first_scheduled_at: float | None = None
        self.num_cached_tokens = 0  # prompt tokens the prefix cache held at its first scheduling
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.seed = seed
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        # vLLM's stop_reason: the stop string or stop_token_ids id that ended the output (None for EOS)
        self.stop_reason: int | str | None = None
        # KV state: tokens [0, num_computed) have their K/V in the blocks of block_table
        self.num_computed = 0
        # async scheduling: tokens sampled by steps in flight whose ids are not on the host yet.
        # They count in num_tokens (the scheduler plans the next step as if they were appended)
        # but not in num_known_tokens; pending_row is the row of the last one in the sampler
        # output of the step that sampled it (the next step's input id is copied from there on
        # the device). Always 0 outside the async path.
        self.num_pending = 0
        self.pending_row = -1
        # output tokens this sequence may have at most: min(max_tokens, max_model_len - prompt),
        # set by the engine (async scheduling does not schedule a row past it)
        self.max_output_len = params.max_tokens
        self.block_table: list[int] = []
        # renewed whenever block_table changes (only the block manager changes it); unique across
        # sequences, so the runner can tell from this int alone that a cached row is still this table
        self.block_version = next(_block_versions)
        self.num_hashed_blocks = 0  # leading blocks registered in the prefix cache
        self.last_hash: int | None = None  # chained hash of those blocks
        self.num_preemptions = 0
        # speculative decoding: proposed tokens awaiting verification (a drafter's argmax, or its
        # draws at temperature > 0) and how many positions the drafter's KV covers
        self.draft_ids: list[int] = []
        self.draft_computed = 0
        # >= 0 while the drafts are still on the device (a DFlash drafter launched without waiting):
        # their first row in the drafter's sampled ids; draft_ids then holds placeholders of the
        # right length until the drafter's resolve() (ModelRunner reads them on the device)
        self.draft_row = -1
        # drafts drawn from the drafter's distribution q (ModelRunner.draft_q): (the drafting step's
        # number, the drafter's logits row of the first draft); None: drawn deterministically
        self.draft_q: tuple[int, int] | None = None
        # speculation backoff (speculative config backoff_after): verification rounds in a row that
        # accepted no draft, and plain steps still to go before the next round
        self.spec_misses = 0
        self.spec_skip = 0
        # SamplingParams.logprobs: one TokenLogprob per output id (None when not asked for), and
        # those of the step just collected, until its ids are accepted
        self.output_logprobs: list | None = None
        self.new_logprobs: list = []
        # SamplingParams.prompt_logprobs: entry t for prompt token t (entry 0 is None), filled chunk
        # by chunk as the prefill computes the rows before them; its length is also where the rows
        # still wanted start (the prefix cache may not skip them: BlockManager.match_prefix)
        self.prompt_logprobs: list | None = None
        # SamplingParams.structured_outputs: llguidance's matcher of the constraint, fed every
        # accepted token (minillm/engine/structured.py); None without one
        self.grammar = None
        # SamplingParams.allowed_token_ids as one bitmask row (structured.token_mask); None without them
        self.allowed_mask = None
        # SamplingParams.bad_words as token sequences (each word alone and after a space); None without
        self.bad_word_ids: list[tuple[int, ...]] | None = None
        # with SamplingParams.think_token_ids: where the output stands against its thinking
        # (structured.ThinkState; None: the constraint holds)
        self.think_state: str | None = None
        self.ended_by_grammar = False  # the output ended where the constraint did (its last token is text)
        # why a sequence ended with finish reason "error" (its matcher failed mid-output:
        # structured.matcher_error), else None
        self.error: str | None = None
        # detokenisation state (owned by the engine)
        # presence / frequency / repetition penalties' view of the tokens (engine/penalty_history.py)
        self.penalty_history = None
        self.text = ""  # the text's end: the whole text is text_head + text (engine._render)
        self.text_head = ""
        self.sent_text_len = 0
        self.decoder = None

    def blocks_changed(self) -> None:
        """Called after every change to block_table (the runner's cached rows key on this)."""
        self.block_version = next(_block_versions)

    @property
    def num_tokens(self) -> int:
        """Tokens including those still in flight (num_pending): what the scheduler plans with."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids are on the host: the only ones that may be hashed or read."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def token(self, i: int) -> int:
        p = len(self.prompt_ids)
        return self.prompt_ids[i] if i < p else self.output_ids[i - p]

    def tokens(self, start: int, end: int) -> list[int]:
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed}, blocks={self.block_table})")
