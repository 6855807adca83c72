"""Token sampling: greedy, temperature, top-k, min-p, top-p, with a counter-based per-request RNG.

The random number for a token depends only on (request seed, position of the token, stream),
never on what else is in the batch, so seeded output is reproducible under any batching. The
hash is splitmix64, simple enough to write identically in CUDA (cuda/sampling.cu).

This is the NumPy twin of the device sampler and the reference for its tests.
"""

from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1

# Streams: independent random numbers for the same (seed, position).
STREAM_SAMPLE = 0
STREAM_ACCEPT = 1
STREAM_RESIDUAL = 2
# A drafter that samples its drafts (DFlash and the draft model at temperature > 0) draws them with
# the request's seed xor this salt, so its draws are independent of the target's accept and residual
# draws at the same positions (the rejection-sampling proof needs the draft independent of those
# uniforms).
DRAFT_SEED_SALT = 0x5DEECE66D2545F49


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def hash_uniform(seed: int, position: int, stream: int = STREAM_SAMPLE) -> float:
    """A float in [0, 1) from (seed, position, stream); 24 bits so float32 holds it exactly."""
    h = _splitmix64((seed & _M64) ^ _splitmix64((position << 2 | stream) & _M64))
    return (h >> 40) / float(1 << 24)


def probs_from_logits(logits: np.ndarray, temperature: float, top_p: float, top_k: int,
                      min_p: float = 0.0) -> np.ndarray:
    """The distribution sampled from: softmax(logits / T) restricted to top-k and min-p, then top-p.

    min_p (vLLM's) keeps the tokens with p >= min_p * max p, i.e. x >= max x + ln(min_p) for
    x = logits / T; like top-k it keeps the tokens at or above a threshold of x, so the two
    together keep the stricter one's set. top-p then applies to the renormalised survivors.
    Returns float64 probabilities over the whole vocabulary (zeros outside the kept set).
    """
    x = logits.astype(np.float64) / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = np.partition(x, vocab - top_k)[vocab - top_k]
        x = np.where(x >= kth, x, -np.inf)
    if min_p > 0.0:  # the threshold in float64, as cuda/sampling.cu computes it
        x = np.where(x >= x.max() + np.log(np.float64(min_p)), x, -np.inf)
    x = x - x.max()
    p = np.exp(x)
    p /= p.sum()
    if top_p < 1.0:
        mask = np.zeros(vocab, dtype=bool)
        mask[top_p_set(p, top_p)] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def descending(w: np.ndarray) -> np.ndarray:
    """argsort(-w, kind="stable"): w descending, ties in index order. NumPy's default sort, then the
    ids within each run of ties sorted: the stable sort took 15 ms for 151,936 float64s, this ~3.5
    (one more sort of the tied places' keys where there are ties). NaNs come last either way, in some
    order."""
    order = np.argsort(-w)
    sw = w[order]
    tie = sw[1:] == sw[:-1]
    if tie.any():  # the places in runs of equal w: each run's ids ascending (keys run * n + id are unique)
        at = np.flatnonzero(np.concatenate((tie, [False])) | np.concatenate(([False], tie)))
        vals, ids = sw[at], order[at]
        run = np.cumsum(np.concatenate(([True], vals[1:] != vals[:-1])))
        order[at] = ids[np.argsort(run * w.shape[0] + ids)]
    return order


def top_p_set(p: np.ndarray, top_p: float) -> np.ndarray:
    """The ids in the smallest prefix of the order (p descending, id ascending) whose mass reaches
    top_p, the token crossing it included: those i of order = argsort(-p, stable) with
    cumsum(p[order])[i] - p[order][i] < top_p. Ids with p = 0 (top-k's, min-p's) may be left out:
    they weigh nothing, kept or not.

    A full sort took 7.7 ms a 49,152-id row (SmolLM2's; +22% on a batch of 8's CPU step). This sorts only
    the m largest p and their ties (np.partition), m = 256 (more where the largest p is small), then 16x
    as many, until a candidate set's mass reaches top_p + 1e-12. Those candidates are the order's first
    entries, so their cumulative sums are the same bits as the full sort's; past them every token's
    cum - p is at least the last candidate's cum less a rounding (~2e-16), so none is kept. A row that
    needs a quarter of its ids or more (a flat one) takes the full sort.
    """
    vocab = p.shape[0]
    nonzero = np.count_nonzero(p)
    top = p.max()  # m ids weigh at most m * top; none that would do (NaN logits, a tiny top): the full sort
    m = max(256, int(2 * top_p / top)) if 2 * top_p < vocab * top else vocab
    while 4 * m < vocab:
        if nonzero <= m:  # every id with mass: zeros come last in the order
            sel = np.flatnonzero(p)
        else:
            sel = np.flatnonzero(p >= np.partition(p, vocab - m)[vocab - m])  # the m-th largest and up
        w = p[sel]  # in id order, so the stable sort keeps ties in it
        if w.sum() >= top_p + 1e-9:  # (pairwise) then the exact check below passes: sort
            order = descending(w)
            w = w[order]
            cum = np.cumsum(w)
            if cum[-1] >= top_p + 1e-12:
                return sel[order][cum - w < top_p]
        if nonzero <= m:
            break
        m *= 16
    order = descending(p)
    w = p[order]
    cum = np.cumsum(w)
    return order[cum - w < top_p]


def sample_from_probs(p: np.ndarray, u: float) -> int:
    """Inverse-CDF sample over tokens in index order (deterministic for a given u)."""
    cum = np.cumsum(p)
    idx = int(np.searchsorted(cum, u * cum[-1], side="right"))
    idx = min(idx, len(p) - 1)
    while p[idx] == 0.0 and idx > 0:  # u landed on the edge of a zero-mass run
        idx -= 1
    return idx


def sample(logits, temperature, top_p, top_k, seeds, positions, out_tokens, draft_tokens=None,
           out_accepted=None, min_p=None, draft_logits=None, draft_rows=None) -> None:
    """Sample one token per row of logits [B, V] into out_tokens [B].

    temperature[b] == 0 selects greedy argmax (every filter ignored). positions[b] is the position
    the sampled token will occupy, the counter of the request's RNG. min_p [B] (None: 0 for every
    row, off) comes last so that callers without it keep their argument order.

    Speculative verification in the same pass: where draft_tokens[b] = d >= 0, row b is the
    target's distribution p at a drafted position. Then out_accepted[b] = 1 and out_tokens[b] = d
    if d is accepted, which is with probability min(1, p(d) / q(d)) (greedy: d equals the argmax);
    otherwise out_accepted[b] = 0 and out_tokens[b] is drawn from normalise(max(p - q, 0)) (greedy:
    the argmax, the correction). q is the drafter's distribution d was drawn from: where
    draft_rows[b] = j >= 0, the drafter's logits row draft_logits[j] (V' <= V columns; ids from V'
    on weigh 0) under row b's temperature and filters, as a drafter sampling with the request's
    parameters drew it; otherwise the drafter proposed d deterministically and q is one-hot on d,
    so d is accepted with probability p(d) and the residual is p without d. The accept and
    residual draws use their own RNG streams; rows without a draft sample on the usual one, which
    is what the bonus token after a fully accepted run uses.
    """
    if (draft_tokens is None) != (out_accepted is None):
        raise ValueError("sample: draft_tokens and out_accepted go together")
    if (draft_logits is None) != (draft_rows is None):
        raise ValueError("sample: draft_logits and draft_rows go together")
    for b in range(logits.shape[0]):
        d = -1 if draft_tokens is None else int(draft_tokens[b])
        t = float(temperature[b])
        if t <= 0.0:
            out_tokens[b] = int(np.argmax(logits[b]))
            if out_accepted is not None:
                out_accepted[b] = int(d >= 0 and out_tokens[b] == d)
            continue
        filters = (t, float(top_p[b]), int(top_k[b]), 0.0 if min_p is None else float(min_p[b]))
        p = probs_from_logits(logits[b], *filters)
        seed, pos = int(seeds[b]), int(positions[b])
        if d < 0:
            out_tokens[b] = sample_from_probs(p, hash_uniform(seed, pos))
            if out_accepted is not None:
                out_accepted[b] = 0
            continue
        j = -1 if draft_rows is None else int(draft_rows[b])
        q = np.zeros_like(p)
        if j >= 0:  # the drafter's own distribution, over its first V' ids
            qv = probs_from_logits(draft_logits[j], *filters)
            q[: qv.shape[0]] = qv
        else:  # a deterministic draft: one-hot
            q[d] = 1.0
        # accept with probability min(1, p(d) / q(d)): u < p / q as u * q < p (no division; a d
        # outside q's support, which a drafter never draws, is accepted wherever p(d) > 0)
        accepted = hash_uniform(seed, pos, STREAM_ACCEPT) * q[d] < p[d]
        if accepted:
            out_tokens[b] = d
        else:
            residual = np.maximum(p - q, 0.0)
            if residual.sum() <= 0:  # p <= q everywhere (rounding): p itself
                residual = p
            out_tokens[b] = sample_from_probs(residual, hash_uniform(seed, pos, STREAM_RESIDUAL))
        out_accepted[b] = int(accepted)
