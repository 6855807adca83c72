"""Is plain greedy decoding self-consistent on a device? (a diagnostic)

    python scripts/decode_consistency.py [MODEL] --device cuda [--repeats 3] [--json F]

`bench spec` on the H200 (part244) found SmolLM2's plain greedy run taking, at one token, a token the
same model scored 12.7 logits below the best when it read the common prefix in one forward: not a
bf16 near-tie. This runs bench spec's prompts greedily with no speculation, several times in one
process under each scheduling (async, synchronous, eager async, eager synchronous; or with n-gram
or self-drafting speculation, --configs ngram,self_draft), and checks:
  - repeat: each run's tokens equal the first run's of that configuration (a race or a read of
    unwritten memory shows as runs that differ);
  - across configurations: the tokens equal the first configuration's, or depart at a near-tie;
  - teacher-forced: the model scores each prompt plus its output in one forward (the prefill path),
    and every generated token must be that forward's argmax, or a near-tie of it
    (minillm.bench.spec.judge_departure); a "wrong" one is a decode step that computed something
    else than the prefill does.
Prefix caching is off unless --prefix-caching: with it on, a repeat's prefill reads the prompt's cached
blocks and computes only the rest, with other row counts and so other kernels and another rounding
than the first run's full prefill. On flat logits (a random model, a near-tie in a real one) that
alone parts the first run from the later ones (part249: every later repeat equal to each other and
not to the first), which is not what the repeat check looks for.
Exit status 1 when some run differs from its repeat or some token is wrong.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys

import numpy as np

from minillm import LLM, SamplingParams
from minillm.bench.spec import PROMPTS, judge_departure

CONFIGS = {"async": {}, "sync": {"async_scheduling": False}, "eager_async": {"enforce_eager": True},
           "eager_sync": {"enforce_eager": True, "async_scheduling": False},
           # speculation: verification steps (the attention off the fused decode step, rejected drafts'
           # slots written again) under the same checks
           "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}},
           "self_draft": {"speculative_config": {"method": "draft_model", "num_speculative_tokens": 4}}}


def engine_args(name: str, model: str | None) -> dict:
    """CONFIGS[name], with the drafter of self_draft set to the model itself."""
    kw = {k: dict(v) if isinstance(v, dict) else v for k, v in CONFIGS[name].items()}
    spec = kw.get("speculative_config")
    if spec is not None and spec["method"] == "draft_model":
        spec["model"] = model or "smollm2-135m-instruct"
    return kw


def teacher_forced(llm: LLM, prompt: list[int], out: list[int]) -> list[dict]:
    """Each output token that is not the one-forward argmax of its prefix, judged."""
    logits = llm.engine.score([prompt + out])[0]
    found = []
    for j, tok in enumerate(out):
        row = logits[len(prompt) + j - 1]
        best = int(np.argmax(row))
        if best != tok:
            found.append({"position": j, **judge_departure(row, best, tok)})
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default="async,sync,eager_async,eager_sync",
                   help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--prefix-caching", action="store_true",
                   help="keep prefix caching on (repeats after the first then prefill from the cache)")
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    bad = [n for n in ns.configs.split(",") if n not in CONFIGS]
    if bad or ns.repeats < 1 or ns.max_tokens < 1:
        p.error(f"--configs: unknown {bad}, choose from {', '.join(CONFIGS)}" if bad
                else "--repeats and --max-tokens must be >= 1")
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens)
    report, ok, first = {}, True, None
    for name in ns.configs.split(","):
        # max_num_seqs 256: score() returns a logits row for every position of prompt + output
        llm = LLM(ns.model, device=ns.device, max_model_len=1024, max_num_seqs=256,
                  enable_prefix_caching=ns.prefix_caching, **engine_args(name, ns.model))
        prompts = [llm.tokenizer.encode_chat(m) for m in PROMPTS]
        runs = [[llm.generate([q], params)[0].token_ids for q in prompts] for _ in range(ns.repeats)]
        same = [r == runs[0] for r in runs]
        wrong = [teacher_forced(llm, q, o) for q, o in zip(prompts, runs[0])]
        for r in runs[1:]:  # a repeat that differs: its own tokens judged too
            if r != runs[0]:
                wrong += [teacher_forced(llm, q, o) for q, o in zip(prompts, r)]
        first = first or runs[0]
        across = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(first, runs[0])]
        bad = [d for ds in wrong for d in ds if d["classification"] == "wrong"]
        ok = ok and all(same) and not bad
        report[name] = {"repeats_equal": same, "first_difference_from_first_config": across,
                        "prefix_caching": llm.engine.block_manager.enable_prefix_caching,
                        "not_argmax": wrong, "token_ids": runs}
        print(f"{name}: repeats equal {same}; departs from {next(iter(report))} at {across}; "
              f"tokens not the prefill's argmax: {sum(map(len, wrong))}, wrong {len(bad)}")
        for ds in wrong:
            for d in ds:
                print(f"  token {d['position']}: chose {d['spec_token']} (logit {d['spec_logit']:.3f}, rank "
                      f"{d['spec_rank']}), argmax {d['base_token']} ({d['base_logit']:.3f}): {d['classification']}")
        del llm
        gc.collect()
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(report, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
