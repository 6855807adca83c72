"""What a long prompt costs the other streams on the CPU backend, per step token budget, and what the
budget costs a burst of short requests.

    python scripts/cpu_long_prompt.py [--budgets 2048 512 256] [--prompt-len 1500] [--rounds 2]

One stream decodes (greedy, the embedded SmolLM2) while a prompt of --prompt-len tokens (the README's text)
arrives; for each --max-num-batched-tokens the engine steps until the prompt's first token. Reports that
time, the decoding stream's longest gap between two tokens (how long the prompt's chunks held it), and
the time of LLM.generate on 16 prompts of 100 tokens, 32 greedy tokens each: medians over --rounds fresh
engines, the budgets alternated round by round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from minillm import LLM, SamplingParams
from minillm.engine.engine import LLMEngine

ROOT = Path(__file__).resolve().parent.parent


def one_run(budget: int, prompt_ids: list[int]) -> tuple[float, float]:
    """(the long prompt's time to first token, the decoding stream's longest gap), seconds."""
    engine = LLMEngine(device="cpu", max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=budget)
    greedy = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    engine.add_request("Count from one to a thousand:", greedy, request_id="stream")
    while not engine.step():  # until the stream decodes
        pass
    engine.add_request(prompt_ids, SamplingParams(temperature=0, max_tokens=1), request_id="long")
    t_added = last = time.perf_counter()
    ttft, gap = None, 0.0
    while ttft is None:
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            if out.request_id == "stream":
                gap, last = max(gap, now - last), now
            elif out.request_id == "long":
                ttft = now - t_added
    return ttft, gap


def burst(budget: int, ids: list[int]) -> float:
    """Seconds LLM.generate takes for 16 prompts of 100 tokens (slices of ids), 32 greedy tokens each."""
    llm = LLM(device="cpu", max_model_len=1024, max_num_batched_tokens=budget)
    prompts = [ids[i * 100:(i + 1) * 100] for i in range(16)]
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", type=int, nargs="+", default=[2048, 512, 256])
    p.add_argument("--prompt-len", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    tokenizer = LLMEngine(device="cpu", max_model_len=2048).tokenizer
    text_ids = tokenizer.encode((ROOT / "README.md").read_text())
    prompt_ids = text_ids[: args.prompt_len]
    runs: dict[int, list[tuple[float, float, float]]] = {b: [] for b in args.budgets}
    for r in range(args.rounds):
        for b in args.budgets:
            runs[b].append((*one_run(b, prompt_ids), burst(b, text_ids)))
            ttft, gap, batch = runs[b][-1]
            print(f"round {r + 1} budget {b}: first token {ttft:.2f} s, stream's longest gap {gap:.2f} s, "
                  f"16 short requests {batch:.2f} s", flush=True)
    print(f"{len(prompt_ids)}-token prompt beside one decoding stream; 16 x (100 in, 32 out); medians of {args.rounds}")
    print("budget | the prompt's first token (s) | the stream's longest gap (s) | 16 short requests (s)")
    for b, rs in runs.items():
        print(" | ".join([str(b)] + [f"{statistics.median(r[i] for r in rs):.2f}" for i in range(3)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
