"""A sequence's tokens as the penalties read them, kept up to date as its output grows.

Presence and frequency penalties need each output token's count, the repetition penalty the set of
prompt and output tokens. Recomputing them every step (np.unique over every output id, a union with
the prompt) cost O(n log n) a row a step: milliseconds a row once outputs reach thousands of tokens,
every step. Here they are sorted arrays that a step's new tokens update in place of a rebuild.
"""

from __future__ import annotations

import numpy as np

NONE = np.zeros(0, np.int64)


def _add(ids: np.ndarray, counts: np.ndarray | None, new: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """ids (sorted, unique) with new's tokens added; counts (aligned with ids) counting them."""
    if len(new) > 16:  # many at once (the first step after a long prompt, a preemption): a rebuild
        if counts is None:
            return np.union1d(ids, np.asarray(new, np.int64)), None
        both = np.concatenate([ids, np.asarray(new, np.int64)])
        weights = np.concatenate([counts, np.ones(len(new), np.int64)])
        ids, inverse = np.unique(both, return_inverse=True)
        return ids, np.bincount(inverse, weights=weights, minlength=len(ids)).astype(np.int64)
    for t in new:
        i = int(np.searchsorted(ids, t))
        if i < len(ids) and ids[i] == t:
            if counts is not None:
                counts[i] += 1
        else:
            ids = np.insert(ids, i, t)
            counts = None if counts is None else np.insert(counts, i, 1)
    return ids, counts


class PenaltyHistory:
    """Sorted unique output ids with their counts, and (for the repetition penalty) the sorted
    union of prompt and output ids; `update` takes the output's ids so far."""

    def __init__(self, prompt_ids: list[int], repetition: bool):
        self.ids, self.counts = NONE, NONE
        self.prompt = np.unique(np.asarray(prompt_ids, np.int64)) if repetition else None
        self.seen = self.prompt  # prompt and output ids (repetition only)
        self.n = 0  # output ids counted so far

    def update(self, output_ids: list[int]) -> None:
        if len(output_ids) < self.n:  # the output was cut (a stop string): count again
            self.ids, self.counts, self.seen, self.n = NONE, NONE, self.prompt, 0
        new = output_ids[self.n:]
        if new:
            self.ids, self.counts = _add(self.ids, self.counts, new)
            if self.seen is not None:
                self.seen, _ = _add(self.seen, None, new)
            self.n = len(output_ids)

    def with_drafts(self, drafted: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(output ids, counts, seen) as a verification row that follows drafted sees them: new arrays
        with drafts, else the history's own (to read, not to write)."""
        if not drafted:
            return self.ids, self.counts, self.seen
        ids, counts = _add(self.ids, self.counts.copy(), list(drafted))
        seen = None if self.seen is None else _add(self.seen, None, list(drafted))[0]
        return ids, counts, seen
