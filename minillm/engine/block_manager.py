"""BlockManager: the paged KV pool's free list, reference counts, block tables and prefix cache.

Every index a kernel reads (block tables, slot mapping) is derived from the state kept here, and
the pool never hands out a block it does not own, so nothing can index past its end.

A block is in exactly one of three states:
    free     ref_count 0, no cached contents          (in `free`)
    held     ref_count > 0, in some block tables
    cached   ref_count 0 but its full-block contents are kept for prefix hits (in `evictable`,
             least recently used first); evicted only when the free list is empty.
Full blocks are keyed by a hash chained over the token ids of the whole prefix; a hit is confirmed
by comparing the block's tokens. A block that is cached or shared is never written again.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from minillm.engine.sequence import Sequence


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, ref 0, LRU first
        self.hash_to_block: dict[int, int] = {}
        # prefix cache statistics, in tokens
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---- accounting -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks obtainable now: truly free plus evictable cached blocks."""
        return len(self.free) + len(self.evictable)

    @property
    def num_cached(self) -> int:
        return len(self.evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free) - len(self.evictable)

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs so that its first num_tokens tokens have slots."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free

    # ---- allocation -----------------------------------------------------------------------
    def _take_block(self) -> int:
        if self.free:
            b = self.free.popleft()
        elif self.evictable:
            b, _ = self.evictable.popitem(last=False)  # least recently used
            del self.hash_to_block[self.block_hash[b]]
            self.block_hash[b] = None
            self.block_tokens[b] = None
        else:
            raise RuntimeError("KV pool exhausted: the scheduler must check can_allocate first")
        self.ref_count[b] = 1
        return b

    def _release_block(self, b: int) -> None:
        self.ref_count[b] -= 1
        assert self.ref_count[b] >= 0, f"block {b} released more often than acquired"
        if self.ref_count[b] == 0:
            if self.block_hash[b] is not None:
                self.evictable[b] = None  # most recently used at the end
            else:
                self.free.append(b)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's block table so tokens [0, num_tokens) have slots."""
        n = self.blocks_needed(seq, num_tokens)
        if n > self.num_free:
            raise RuntimeError(f"need {n} blocks, {self.num_free} free: check can_allocate first")
        for _ in range(n):
            seq.block_table.append(self._take_block())
        if n:
            seq.blocks_changed()

    def free_sequence(self, seq: Sequence) -> None:
        """Release all of seq's blocks (finish, abort, preemption); cached ones stay evictable."""
        for b in reversed(seq.block_table):  # tail first, so the prefix is evicted last
            self._release_block(b)
        seq.block_table = []
        seq.blocks_changed()
        seq.num_computed = 0
        seq.draft_computed = 0
        seq.num_hashed_blocks = 0
        seq.last_hash = None

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll seq back to its first num_tokens tokens (speculative rejection); frees blocks past it."""
        assert num_tokens >= seq.num_hashed_blocks * self.block_size, "cannot truncate into cached blocks"
        keep = -(-num_tokens // self.block_size)
        if len(seq.block_table) > keep:
            while len(seq.block_table) > keep:
                self._release_block(seq.block_table.pop())
            seq.blocks_changed()
        seq.num_computed = min(seq.num_computed, num_tokens)

    # ---- prefix cache ---------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> int:
        """Attach the longest cached run of seq's leading full blocks; returns tokens matched.

        At least one prompt token is always left to compute, since its logits are needed; so is
        every row whose logits prompt logprobs still need (positions from len(prompt_logprobs) - 1).
        """
        assert not seq.block_table, "prefix matching is for a sequence without blocks"
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        limit = seq.num_tokens - 1
        if seq.prompt_logprobs is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens:
            limit = min(limit, len(seq.prompt_logprobs) - 1)
        max_blocks = limit // bs
        parent = None
        matched = 0
        for i in range(max_blocks):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            h = chain_hash(parent, tokens)
            b = self.hash_to_block.get(h)
            if b is None or self.block_tokens[b] != tokens:
                break
            if self.ref_count[b] == 0:
                self.evictable.pop(b)
            self.ref_count[b] += 1
            seq.block_table.append(b)
            parent = h
            matched += 1
        if matched:
            seq.blocks_changed()
        seq.num_hashed_blocks = matched
        seq.last_hash = parent
        seq.num_computed = matched * bs
        seq.draft_computed = matched * bs  # cached blocks hold the drafter's KV too (see commit_full_blocks)
        return matched * bs

    def record_prefix_lookup(self, num_tokens: int, num_hit: int) -> None:
        """Count an admitted sequence's prefix lookup for the hit rate (in tokens)."""
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit

    def commit_full_blocks(self, seq: Sequence, upto: int | None = None) -> None:
        """Register seq's newly completed full blocks (KV computed) in the prefix cache.

        upto limits it to the first upto tokens: with a drafter that keeps KV in the same blocks,
        only blocks both models have computed are cached.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        # only blocks whose tokens are all in the sequence: while drafts are verified num_computed
        # runs ahead of the appended tokens, and hashing a partial token list would cache a block
        # no lookup can ever hit and chain every later block of seq off a wrong hash (likewise with
        # async scheduling, where num_computed counts a step in flight whose sampled id is unknown)
        computed = min(seq.num_computed, seq.num_known_tokens)
        full = (computed if upto is None else min(upto, computed)) // bs
        for i in range(seq.num_hashed_blocks, full):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            h = chain_hash(seq.last_hash, tokens)
            b = seq.block_table[i]
            if h not in self.hash_to_block and self.block_hash[b] is None:
                self.hash_to_block[h] = b
                self.block_hash[b] = h
                self.block_tokens[b] = tokens
            seq.last_hash = h
            seq.num_hashed_blocks = i + 1

    # ---- indices for the kernels ----------------------------------------------------------
    def slot(self, seq: Sequence, position: int) -> int:
        """Physical slot of a token position: block_table[pos // bs] * bs + pos % bs."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def check_sequence(self, seq: Sequence) -> None:
        """MINILLM_DEBUG=1: every block-table entry is a live block held by this sequence."""
        for b in seq.block_table:
            if not (0 <= b < self.num_blocks):
                raise AssertionError(f"{seq.request_id}: block {b} outside the pool of {self.num_blocks}")
            if self.ref_count[b] <= 0:
                raise AssertionError(f"{seq.request_id}: block {b} in its table is not held")
