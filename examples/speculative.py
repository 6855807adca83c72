"""Speculative decoding: n-gram prompt lookup and self-drafting give the same greedy tokens as none.

    python examples/speculative.py
"""

from minillm import LLM, SamplingParams

prompt = "Repeat exactly: the paged KV cache maps logical blocks to physical blocks. " * 2
params = SamplingParams(temperature=0, max_tokens=48)
for spec in (None,
             {"method": "ngram", "num_speculative_tokens": 4},
             {"method": "draft_model", "model": "smollm2-135m-instruct", "num_speculative_tokens": 4}):
    llm = LLM(device="cpu", speculative_config=spec)
    out = llm.generate([prompt], params)[0]
    stats = llm.engine.stats().spec
    print((spec or {}).get("method", "none"), out.token_ids[:8], stats.get("mean_acceptance_length"))
