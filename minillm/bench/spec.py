"""python -m minillm.bench spec [MODEL]: acceptance and speedup of speculative decoding on real prompts.

Greedy chat prompts that invite copying (summarise or edit a given text, continue code) run once
without speculation and once per drafter: n-gram prompt lookup, and the model drafting for itself
(where every draft should be accepted). Output must be token-identical (lossless); the table
gives output tok/s, the speedup over no speculation, and the mean acceptance length.
"""

from __future__ import annotations

import argparse
import sys
import time

from minillm.args import DEVICES, STARTUP_ERRORS
from minillm.bench.report import check_output_path, need, save_json

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


def run(model: str | None, spec: dict | None, max_tokens: int, device: str) -> dict:
    from minillm import LLM, SamplingParams

    try:
        llm = LLM(model, device=device, max_model_len=1024, speculative_config=spec)
    except STARTUP_ERRORS as e:  # a bad model path or device: main prints one "error:" line
        raise ValueError(str(e)) from None
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    prompts = [llm.tokenizer.encode_chat(m) for m in PROMPTS]
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    t = time.perf_counter()
    outs = [llm.generate([p], params)[0] for p in prompts]  # one stream at a time
    dt = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    return {"spec": spec, "tokens": n, "seconds": dt, "tok_per_s": n / dt,
            "token_ids": [o.token_ids for o in outs], "stats": llm.engine.stats().spec}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minillm.bench spec", description=__doc__)
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--device", default="cpu", choices=DEVICES)
    p.add_argument("--k", type=int, default=4, help="draft tokens a round (>= 1)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--result-json", default=None)
    ns = p.parse_args(argv)
    target = ns.model or "smollm2-135m-instruct"
    configs = [("none", None),
               ("ngram", {"method": "ngram", "num_speculative_tokens": ns.k, "prompt_lookup_max": 4}),
               ("self-draft", {"method": "draft_model", "model": target, "num_speculative_tokens": ns.k})]
    results = {}
    try:
        need(ns.k >= 1, f"--k must be >= 1, got {ns.k}")
        need(ns.max_tokens >= 1, f"--max-tokens must be >= 1, got {ns.max_tokens}")
        check_output_path(ns.result_json, "--result-json")
        for name, spec in configs:
            results[name] = run(ns.model, spec, ns.max_tokens, ns.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    base = results["none"]
    print(f"{'method':<12}{'tok/s':>8}{'speedup':>9}{'accept len':>12}{'accept rate':>13}  lossless")
    for name, r in results.items():
        st = r["stats"] or {}
        same = r["token_ids"] == base["token_ids"]
        print(f"{name:<12}{r['tok_per_s']:>8.1f}{r['tok_per_s'] / base['tok_per_s']:>8.2f}x"
              f"{st.get('mean_acceptance_length', 1.0):>12.2f}{st.get('acceptance_rate', 0.0):>13.2f}  {same}")
        r["lossless"] = same
        r["speedup"] = r["tok_per_s"] / base["tok_per_s"]
    if ns.result_json:
        saved = {k: {kk: vv for kk, vv in v.items() if kk != "token_ids"} for k, v in results.items()}
        if not save_json(ns.result_json, saved):
            return 2
    return 0 if all(r["lossless"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
