"""Where bf16 greedy on the GPU departs from the fp32 CPU reference, and whether it is a near-tie.

For each chat prompt: greedy tokens on the CPU (NumPy, fp32) and on the GPU (bf16); then both
backends score the CPU's sequence (prompt + generated) and, at every generated position up to the
first divergence and a few past it, this prints the CPU's top-2 logit gap, the GPU's top choice
and its gap, and the relative error of the GPU logits against the CPU's. A divergence where the
CPU's own top-2 gap is within the bf16 logits' error is a precision near-tie, not a wrong kernel.

    PYTHONPATH=. python scripts/greedy_divergence.py [MODEL]   (default: the embedded SmolLM2)
"""

from __future__ import annotations

import sys

import numpy as np

from minillm import LLM, SamplingParams

PROMPTS = ["What is the capital of France?", "Write a Python function that adds two numbers.",
           "List three colors."]


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    kw = {"max_model_len": 512} | ({"model": model} if model else {})
    cpu, gpu = LLM(device="cpu", **kw), LLM(device="cuda", **kw)
    params = SamplingParams(temperature=0, max_tokens=32)
    for text in PROMPTS:
        conv = [{"role": "user", "content": text}]
        prompt = cpu.tokenizer.encode_chat(conv, True)
        a = cpu.generate([prompt], params)[0].token_ids
        b = gpu.generate([prompt], params)[0].token_ids
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"\n{text!r}: {len(prompt)} prompt tokens, agree on {n} of {len(a)} generated")
        seq = prompt + a
        ref = cpu.engine.score([seq])[0]
        got = gpu.engine.score([seq])[0]
        print("  pos  cpu_tok  cpu_gap   gpu_tok  gpu_gap_to_cpu_tok  logits_rel_err")
        for i in range(min(len(a), n + 4)):
            r, g = ref[len(prompt) - 1 + i], got[len(prompt) - 1 + i]
            top2 = np.sort(r)[-2:]
            rel = float(np.linalg.norm(g - r) / np.linalg.norm(r))
            gt = int(np.argmax(g))
            mark = "  <- first divergence" if i == n else ""
            print(f"  {i:3d}  {int(np.argmax(r)):7d}  {top2[1] - top2[0]:7.4f}   {gt:7d}  "
                  f"{float(g[gt] - g[int(np.argmax(r))]):18.4f}  {rel:14.2e}{mark}")


if __name__ == "__main__":
    main()
