"""Log probabilities of sampled tokens (OpenAI's `logprobs`), from the step's logits on the host.

A request that asks for logprobs makes its steps synchronous (the engine falls back from
async scheduling while one is running), so after a step's sampled ids arrive the logits
buffer still holds that step's rows: each wanted row is copied to the host and reduced there.
The values are the model's own distribution, log_softmax of the logits (vLLM's default
"raw_logprobs"): before temperature, top-k and top-p; after what changes the logits themselves
(min_tokens' masking, penalties, logit_bias).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_LOGPROBS = 20  # top alternatives a request may ask for (OpenAI's top_logprobs limit)


@dataclass
class TokenLogprob:
    """One sampled token: its logprob and the `top` most likely tokens with theirs (best first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def token_logprob(logits_row: np.ndarray, token: int, top: int) -> TokenLogprob:
    """log_softmax(logits_row) at token, and its top `top` entries (ties: lower id first)."""
    row = np.asarray(logits_row, dtype=np.float64)
    m = float(row.max())
    lse = m + float(np.log(np.exp(row - m).sum()))
    best: list[tuple[int, float]] = []
    if top > 0:
        k = min(top, row.shape[0])
        idx = np.argpartition(-row, k - 1)[:k]
        idx = idx[np.lexsort((idx, -row[idx]))]  # by value, then id: a stable order
        best = [(int(i), float(row[i] - lse)) for i in idx]
    return TokenLogprob(int(token), float(row[token] - lse), best)
