"""What structured outputs cost a decode: the same batch generated free and under a constraint.

    PYTHONPATH=. python scripts/structured_bench.py MODEL [--device cuda] [--batch 1,8] [--tokens 128] [--json F]

For each batch size, B prompts of 64 random token ids generate --tokens tokens each (ignore_eos),
three ways, each run twice and the faster kept (the first run of each also warms its paths):
  - free: no constraint (graphs and asynchronous scheduling where the engine takes them);
  - regex: `[a-z ]+` (the matcher allows the vocabulary's lower-case-and-space tokens, and EOS, which
    a request sampling it ends on): each step replays a graph that stops at the logits (FORWARD_ONLY;
    before session 35 the whole step ran eagerly), and its mask and sampler wait for the previous
    step's ids while that forward runs (before, the steps were synchronous);
  - bias: a one-token logit_bias: the same graphs, nothing to wait for, no matcher;
  - penalty: presence_penalty 0.5: the same graphs, and the wait for the previous step's ids;
so regex against penalty is the matcher's and the mask's cost.
(A counted regex such as `[a-z ]{20000}` costs llguidance ~3.4 ms a mask over a 151k vocabulary
against ~35 us for `[a-z ]+`: part209 measured that one.)
Reported: output tokens a second and each constrained way as a ratio of free, and the matcher's mask
time a step (host, llguidance), timed around the runner's calls.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from minillm import LLM, SamplingParams

REGEX = "[a-z ]+"


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, float]:
    """(output tokens a second of the faster of two runs, its mean output tokens a request)."""
    best = (0.0, 0.0)
    for _ in range(2):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t0
        n = sum(len(o.token_ids) for o in outs)
        best = max(best, (n / dt, n / len(outs)))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--tokens", type=int, default=128, help="output tokens a request")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",")]
    if a.tokens < 1 or min(batches) < 1:
        ap.error("--tokens and every --batch must be >= 1")
    llm = LLM(a.model, device=a.device, max_num_seqs=max(batches), max_model_len=64 + a.tokens + 16)
    grammars = llm.engine.grammars
    mask_s = [0.0, 0]  # seconds in next_token_masks, calls

    def timed_masks(jobs, _inner=grammars.next_token_masks):
        t0 = time.perf_counter()
        try:
            return _inner(jobs)
        finally:
            mask_s[0] += time.perf_counter() - t0
            mask_s[1] += 1

    grammars.next_token_masks = timed_masks
    rng = np.random.default_rng(0)
    vocab = llm.engine.config.vocab_size
    rows = []
    for b in batches:
        prompts = [rng.integers(0, min(vocab, 32000), 64).tolist() for _ in range(b)]
        base = dict(max_tokens=a.tokens, ignore_eos=True, temperature=0)
        free, _ = run(llm, prompts, SamplingParams(**base))
        mask_s[:] = [0.0, 0]
        regex, regex_len = run(llm, prompts, SamplingParams(**base, structured_outputs={"regex": REGEX}))
        per_mask_us = 1e6 * mask_s[0] / max(mask_s[1], 1)
        bias, _ = run(llm, prompts, SamplingParams(**base, logit_bias={0: -1.0}))
        penalty, _ = run(llm, prompts, SamplingParams(**base, presence_penalty=0.5))
        row = dict(batch=b, tokens=a.tokens, free_tok_s=round(free, 1), regex_tok_s=round(regex, 1),
                   regex_mean_tokens=round(regex_len, 1), bias_tok_s=round(bias, 1),
                   penalty_tok_s=round(penalty, 1), regex_ratio=round(regex / free, 3),
                   bias_ratio=round(bias / free, 3), penalty_ratio=round(penalty / free, 3),
                   mask_us_a_step=round(per_mask_us, 1), pipelined_steps=llm.engine.num_pipelined_steps)
        rows.append(row)
        print(f"batch {b}: free {free:.1f} tok/s; regex {regex:.1f} ({regex / free:.2f}x, {regex_len:.0f} tokens "
              f"a request); with a bias {bias:.1f} ({bias / free:.2f}x); with a penalty {penalty:.1f} "
              f"({penalty / free:.2f}x); the matcher's masks {per_mask_us:.0f} us a step (host)")
    if a.json:
        a.json.write_text(json.dumps(dict(model=a.model, device=a.device, regex=REGEX, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
