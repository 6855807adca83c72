"""Log probabilities of sampled tokens (OpenAI's `logprobs`) and of prompt tokens (vLLM's
`prompt_logprobs`, OpenAI's `echo` with `logprobs`), from a step's logits on the host.

A request that asks for logprobs makes its steps synchronous (the engine falls back from
async scheduling while one is running), so after a step's sampled ids arrive the logits
buffer still holds that step's rows: each wanted row is copied to the host and reduced there.
The values are log_softmax of the logits the sampler draws from: before temperature, top-k, min-p
and top-p; after what changes the logits themselves (min_tokens' masking, penalties, logit_bias,
allowed_token_ids, bad words, a structured output's mask), which vLLM's default ("raw_logprobs")
leaves out; without those the two agree. A banned token (-inf) is
never listed among the alternatives, so a row with fewer than N allowed tokens lists fewer.

Prompt tokens need the logits of every prompt row, while a step computes logits only for the rows
it samples from (the workspace's logits buffer holds max_logits rows). The final hidden states of
every row of the step are still in the workspace (ws.normed) once it ran, so prompt_logprobs()
runs the LM head over a chunk's prompt rows there, at most max_logits rows at a time, into the
logits buffer, and reduces each slice on the host before the next overwrites it: no device
memory beyond what startup sized, whatever the prompt's length. These are the raw model's. Each
prompt token also gets its rank in its row (vLLM's `rank`: 1 + the tokens ranked above it, in the
top lists' order, so a token listed among the top N has its position there), wherever it ranks.
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
    # 1-based rank of token_id in its row (higher logprob first, ties: lower id first); computed
    # for prompt tokens (rows_logprobs), None for sampled ones
    rank: int | None = None


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
        best = [(int(i), float(row[i] - lse)) for i in idx if row[i] > -np.inf]
    return TokenLogprob(int(token), float(row[token] - lse), best)


def rows_logprobs(logits: np.ndarray, tokens, top: int, block: int = 1 << 21) -> list[TokenLogprob]:
    """token_logprob for each row of logits [m, vocab] and its token, with its rank, vectorised (the
    host work of prompt logprobs is one such row per prompt token), in float64 blocks of about
    `block` values."""
    logits = np.asarray(logits)
    m, vocab = logits.shape
    out: list[TokenLogprob] = []
    step = max(1, block // max(vocab, 1))
    k = min(top, vocab)
    for a in range(0, m, step):
        x = logits[a : a + step].astype(np.float64)
        n = x.shape[0]
        mx = x.max(axis=1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(x - mx).sum(axis=1))
        toks = np.asarray(tokens[a : a + n], dtype=np.int64)
        own = x[np.arange(n), toks][:, None]
        vals = (own[:, 0] - lse).tolist()
        # rank: tokens above it, and tokens equal to it with a lower id (the top lists' tie order)
        ranks = (1 + np.count_nonzero(x > own, axis=1)
                 + np.count_nonzero((x == own) & (np.arange(vocab) < toks[:, None]), axis=1)).tolist()
        if k > 0:
            idx = np.argpartition(-x, k - 1, axis=1)[:, :k]
            best = np.take_along_axis(x, idx, axis=1)
            order = np.lexsort((idx, -best), axis=1)  # by value, then id: token_logprob's order
            idx = np.take_along_axis(idx, order, axis=1)
            best = np.take_along_axis(best, order, axis=1) - lse[:, None]
            tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), best.tolist())]
        else:
            tops = [[] for _ in range(n)]
        out.extend(TokenLogprob(int(t), v, tp, r) for t, v, tp, r in zip(toks.tolist(), vals, tops, ranks))
    return out


def prompt_logprobs(runner, row: int, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Logprobs of `tokens` after the step `runner` just ran: tokens[j] is predicted by the step's
    row `row + j` (the prompt position before it). The LM head runs over those rows' final hidden
    states (ws.normed, which the forward fills for every row) in slices of the logits buffer's
    rows; the caller has read everything it needs from that buffer already (the sampled rows'
    logprobs), and no other step may run in between (prompt logprob requests keep steps synchronous)."""
    ws, backend, lm_head = runner.ws, runner.backend, runner.model.lm_head
    cap = ws.logits.shape[0]
    out: list[TokenLogprob] = []
    for a in range(0, len(tokens), cap):
        m = min(cap, len(tokens) - a)
        backend.matmul(ws.normed[row + a : row + a + m], lm_head, out=ws.logits[:m])
        out.extend(rows_logprobs(backend.to_host(ws.logits[:m]), tokens[a : a + m], top))
    return out
