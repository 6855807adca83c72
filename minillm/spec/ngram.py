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
    """Draft up to k tokens for `tokens` by prompt lookup; [] when no n-gram recurs."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n :]
        # windows[i] == tokens[i:i+n] for i in [0, L-n); the suffix itself (i = L-n) is excluded
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: L - 1], n)
        hits = np.nonzero((windows == suffix).all(axis=1))[0]
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []
