"""python -m minillm.bench spec [MODEL]: acceptance and speedup of speculative decoding on real prompts.

Greedy chat prompts that invite copying (summarise or edit a given text, continue code) run once
without speculation and once per drafter: n-gram prompt lookup, and the model drafting for itself
(where every draft should be accepted). The table gives output tok/s, the speedup over no
speculation, the mean acceptance length and whether the output is lossless.

Lossless means token-identical to the run without speculation, which the NumPy (float32) backend
gives in practice. On the GPU (bf16) a verification step scores k + 1 rows in one forward, through
other kernels than a one-row decode step, so its rounding differs: where the two best logits are
within that rounding (a near-tie) greedy can pick the other one, and the outputs are incomparable
from there on. So each output that departs is judged at its first differing token: the plain model
scores the common prefix, and the departure is a near-tie when both runs' tokens are among those
logits' top 3 and within 2% of the larger logit's magnitude of each other, whichever leads (the
criterion of tests/test_gpu_engine.py's GPU/CPU agreement, both ways); otherwise it is wrong. The lossless
column says yes (identical), near-tie (every departure is one) or NO, and the command exits 1 on NO.

--temperature T samples instead (prompt i with seed i). Rejection sampling keeps the distribution, not
the tokens, so the column says "sampled"; a fourth run, self-1hot, verifies the self-drafts as one-hot
(accepting a draft with probability p(d)) instead of against the drafter's q, to show what q buys.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from minillm.args import DEVICES, STARTUP_ERRORS, CliParser
from minillm.bench.report import check_output_path, need, save_json

if TYPE_CHECKING:
    from minillm import LLM

PASSAGE = (
    "The paged KV cache splits every sequence's keys and values into fixed-size blocks. A block "
    "table maps each sequence's logical blocks to physical ones, so memory is allocated on demand "
    "and freed at once when a request finishes. Prefix caching lets requests that share a prompt "
    "share its blocks, and preemption frees a sequence's blocks when the pool runs out."
)
CODE = '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    out = [0, 1]
    while len(out) < n:
        out.append(out[-1] + out[-2])
    return out[:n]


def primes(n: int) -> list[int]:
    """Return the primes below n."""
'''
PROMPTS = [
    [{"role": "user", "content": f"Repeat this paragraph, changing 'blocks' to 'pages':\n\n{PASSAGE}"}],
    [{"role": "user", "content": f"Summarise this paragraph in two sentences:\n\n{PASSAGE}"}],
    [{"role": "user", "content": f"Continue this Python file:\n\n{CODE}"}],
]


MAX_MODEL_LEN = 1024  # every run's context: the chat prompts (~200 tokens) and their outputs

TIE = 0.02  # a near-tie's largest gap, relative to the logit: bf16 GPU logits agree with float32 within 2e-2


def run(model: str | None, spec: dict | None, max_tokens: int, device: str, temperature: float = 0.0,
        one_hot: bool = False) -> tuple[dict, LLM]:
    """The prompts through one LLM, one stream at a time (temperature > 0: prompt i sampled with seed i);
    returns the figures and the LLM. one_hot: the drafter's drafts verified as one-hot, not against
    its q (how every drafter was verified before session 60; a comparison only)."""
    from minillm import LLM, SamplingParams

    try:
        llm = LLM(model, device=device, max_model_len=MAX_MODEL_LEN, speculative_config=spec)
    except STARTUP_ERRORS as e:  # a bad model path or device: main prints one "error:" line
        raise ValueError(str(e)) from None
    if one_hot:
        llm.engine.runner.draft_q = None
    prompts = [llm.tokenizer.encode_chat(m) for m in PROMPTS]
    # generate refused it naming max_tokens, a flag this command does not have
    longest = max(len(p) for p in prompts)
    need(longest + max_tokens <= MAX_MODEL_LEN,
         f"--max-tokens {max_tokens}: the longest prompt ({longest} tokens) and its output would exceed the "
         f"{MAX_MODEL_LEN}-token context of these runs; give at most {MAX_MODEL_LEN - longest}")
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    t = time.perf_counter()
    outs = [llm.generate([p], SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                             seed=i if temperature > 0 else None))[0]
            for i, p in enumerate(prompts)]  # one stream at a time
    dt = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    return ({"spec": spec, "tokens": n, "seconds": dt, "tok_per_s": n / dt,
             "token_ids": [o.token_ids for o in outs], "stats": llm.engine.stats().spec}, llm)


def next_logits(llm: LLM, ids: list[int]) -> np.ndarray:
    """The plain model's logits for the token after ids (its logits buffer holds max_num_seqs
    rows, fewer than a prompt has: only the last row is asked for)."""
    return llm.engine.score([ids], last_only=True)[0][-1]


def judge_departure(logits: np.ndarray, base_tok: int, spec_tok: int) -> dict:
    """Where a speculative run's greedy token (spec_tok) left the plain run's (base_tok), given the
    plain model's logits there: a near-tie, which rounding can flip, when both tokens are in the top
    3 and within TIE of the larger logit's magnitude of each other, whichever leads (the scoring
    forward rounds too: a plain token far behind the speculative one is as suspect); else wrong."""
    base, spec = float(logits[base_tok]), float(logits[spec_tok])
    above = np.asarray(logits)
    rank = 1 + int(np.count_nonzero(above > spec))
    base_rank = 1 + int(np.count_nonzero(above > base))
    gap = base - spec
    tie = max(rank, base_rank) <= 3 and abs(gap) <= TIE * max(abs(base), abs(spec), 1.0)
    return {"base_token": int(base_tok), "base_logit": base, "spec_token": int(spec_tok), "spec_logit": spec,
            "spec_rank": rank, "gap": gap, "classification": "near-tie" if tie else "wrong"}


def departures(llm: LLM, prompts: list[list[int]], base: list[list[int]], outs: list[list[int]]) -> list[dict]:
    """judge_departure at each output's first token that differs from base's. Where one output
    stopped first (a strict prefix of the other), its token there is its stop: the likeliest EOS."""
    found = []
    for i, (a, b) in enumerate(zip(base, outs)):
        if a == b:
            continue
        n = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        logits = next_logits(llm, prompts[i] + a[:n])
        base_tok, spec_tok = (s[n] if n < len(s) else max(llm.engine.eos_ids, key=lambda t: logits[t])
                              for s in (a, b))
        found.append({"prompt": i, "position": n, **judge_departure(logits, base_tok, spec_tok)})
    return found


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.bench spec", description=__doc__)
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--device", default="cpu", choices=DEVICES)
    p.add_argument("--k", type=int, default=4, help="draft tokens a round (>= 1)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample at this temperature (prompt i with seed i) instead of greedily: the drafts are "
                        "then verified by rejection sampling, so outputs are not compared token by token; a "
                        "fourth run verifies the self-drafts as one-hot, as before drafts were drawn from q")
    p.add_argument("--result-json", default=None)
    ns = p.parse_args(argv)
    if ns.model == "":  # "" would otherwise quietly mean the default
        p.error("the model must be a non-empty path or alias; leave it out for the embedded SmolLM2")
    target = ns.model or "smollm2-135m-instruct"
    configs = [("none", None),
               ("ngram", {"method": "ngram", "num_speculative_tokens": ns.k, "prompt_lookup_max": 4}),
               ("self-draft", {"method": "draft_model", "model": target, "num_speculative_tokens": ns.k})]
    sampled = ns.temperature > 0
    if sampled:
        configs.append(("self-1hot", configs[-1][1]))
    results = {}
    try:
        # the engine's refusal of a larger one named --speculative-config and --max-model-len
        need(1 <= ns.k < MAX_MODEL_LEN, f"--k must be >= 1 and below the runs' context of {MAX_MODEL_LEN}, got {ns.k}")
        need(ns.max_tokens >= 1, f"--max-tokens must be >= 1, got {ns.max_tokens}")
        need(bool(np.isfinite(ns.temperature)) and ns.temperature >= 0,
             f"--temperature must be a number >= 0, got {ns.temperature}")
        check_output_path(ns.result_json, "--result-json")
        for name, spec in configs:
            results[name], llm = run(ns.model, spec, ns.max_tokens, ns.device, ns.temperature,
                                     one_hot=name == "self-1hot")
            if spec is None:
                plain = llm  # kept to score departures
            del llm  # the others go before the next one takes its device memory
            gc.collect()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    base = results["none"]
    prompts = [plain.tokenizer.encode_chat(m) for m in PROMPTS]
    print(f"{'method':<12}{'tok/s':>8}{'speedup':>9}{'accept len':>12}{'accept rate':>13}  lossless")
    for name, r in results.items():
        st = r["stats"] or {}
        if sampled:  # another sample with speculation on: its distribution is what the tests check
            r["lossless"], r["departures"], r["verdict"] = None, [], "sampled"
        else:
            r["lossless"] = r["token_ids"] == base["token_ids"]
            r["departures"] = departures(plain, prompts, base["token_ids"], r["token_ids"])
            r["verdict"] = ("yes" if r["lossless"] else
                            "near-tie" if all(d["classification"] == "near-tie" for d in r["departures"]) else "NO")
        r["speedup"] = r["tok_per_s"] / base["tok_per_s"]
        print(f"{name:<12}{r['tok_per_s']:>8.1f}{r['speedup']:>8.2f}x"
              f"{st.get('mean_acceptance_length', 1.0):>12.2f}{st.get('acceptance_rate', 0.0):>13.2f}  {r['verdict']}")
    for name, r in results.items():
        for d in r["departures"]:
            print(f"{name} departs on prompt {d['prompt']} at token {d['position']}: none {d['base_token']} "
                  f"(logit {d['base_logit']:.3f}), {name} {d['spec_token']} (logit {d['spec_logit']:.3f}, "
                  f"rank {d['spec_rank']}), gap {d['gap']:.4f}: {d['classification']}")
    if ns.result_json:
        if not save_json(ns.result_json, results):  # token ids too: a departure can be replayed
            return 2
    return 0 if all(r["verdict"] != "NO" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
