"""N-gram drafter (prompt lookup): propose the tokens that followed the latest match of the suffix.

Runs on the host with no model. For the longest n in [max, min] whose last n tokens occurred
earlier in the sequence, the k tokens after the most recent earlier occurrence are the draft.
"""

from __future__ import annotations

import numpy as np

from minillm.engine.sequence import Sequence


class NgramProposer:
    needs_kv = False  # no model, so no KV of its own
    lookahead = 0

    def __init__(self, k: int, min_n: int, max_n: int):
        self.k = k
        self.min_n = min_n
        self.max_n = max_n

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 0

    def attach(self, block_manager) -> None:
        pass

    def propose(self, seqs: list[Sequence], ks: list[int]) -> None:
        for seq, k in zip(seqs, ks):
            seq.draft_ids = lookup(np.asarray(seq.all_ids), self.min_n, self.max_n, k) if k > 0 else []


def lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Draft up to k tokens for `tokens` by prompt lookup; [] when no n-gram recurs.

    The n-grams grow from 1: the earlier positions whose last n tokens match the suffix are kept,
    and extended by one token at a time, until none is left or n reaches max_n. An n-gram that does
    not recur has no longer one that does, so this costs O(len(tokens)) plus, for each n past 1, the
    occurrences still matching.
    (Comparing every n from max_n down cost O(len * max_n^2): 10 s a step at 4,000 tokens with a
    large prompt_lookup_max.)"""
    L = len(tokens)
    if L < 2:
        return []
    # ends[j]: where an earlier occurrence of the suffix's last n tokens ends (before the suffix itself)
    ends = np.nonzero(tokens[: L - 1] == tokens[L - 1])[0]
    best, n = -1, 1
    while ends.size:
        if n >= min_n:
            best = int(ends[-1])  # the most recent occurrence of the longest n so far
        if n >= max_n:
            break
        ends = ends[ends >= n]  # room for one more token before it
        ends = ends[tokens[ends - n] == tokens[L - 1 - n]]
        n += 1
    return tokens[best + 1 : best + 1 + k].tolist() if best >= 0 else []
