"""Lossless verification of drafted tokens (the NumPy twin of the device verifier).

Greedy: accept the longest prefix of the draft equal to the target's argmax, then the target's
token at the first mismatch (correction) or after the last draft (bonus).

Sampling (Leviathan et al. / Chen et al.): accept draft d_j with probability min(1, p(d_j) / q(d_j));
on the first rejection draw from normalize(max(p - q, 0)); when all k are accepted draw a bonus
token from p. n-gram drafts are deterministic, so q is one-hot. Every draw uses the request's
counter RNG on its own stream, so the output distribution is exactly the target's.
"""

from __future__ import annotations

import numpy as np

from minillm.engine.sampler import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    hash_uniform,
    probs_from_logits,
    sample_from_probs,
)


def verify_greedy(draft: list[int], target_tokens: list[int]) -> list[int]:
    """target_tokens[j] is the target's argmax after draft[:j]; returns the tokens to append."""
    a = 0
    while a < len(draft) and draft[a] == target_tokens[a]:
        a += 1
    return list(draft[:a]) + [int(target_tokens[a])]


def verify_sampled(draft: list[int], logits: np.ndarray, draft_probs: np.ndarray | None,
                   temperature: float, top_p: float, top_k: int, seed: int, pos0: int,
                   bonus_token: int) -> list[int]:
    """Rejection sampling over k drafts with logits [k + 1, V] of the target at their positions.

    draft_probs [k, V] is the drafter's distribution for each draft (None: one-hot drafts).
    pos0 is the position of the first draft; bonus_token is the target's own sample at
    position pos0 + k (drawn by the sampler on its usual stream), used when all are accepted.
    """
    out: list[int] = []
    for j, d in enumerate(draft):
        p = probs_from_logits(logits[j], temperature, top_p, top_k)
        q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
        u = hash_uniform(seed, pos0 + j, STREAM_ACCEPT)
        if q_d > 0 and u * q_d < p[d]:
            out.append(int(d))
            continue
        if draft_probs is None:
            residual = p.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p - draft_probs[j], 0.0)
        if residual.sum() <= 0:  # p == q exactly: any draw from p is right
            residual = p
        out.append(sample_from_probs(residual / residual.sum(), hash_uniform(seed, pos0 + j, STREAM_RESIDUAL)))
        return out
    out.append(int(bonus_token))
    return out
