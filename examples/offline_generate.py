"""Offline generation with the LLM API on the embedded default model (CPU or GPU, whichever is there).

    python examples/offline_generate.py
"""

from minillm import LLM, SamplingParams

llm = LLM()  # SmolLM2-135M-Instruct; pass a path to an HF directory or a .gguf file for another model
prompts = ["The capital of France is", "def fibonacci(n):"]
for out in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24)):
    print(repr(out.text), out.finish_reason)

chat = [{"role": "user", "content": "Name three colors."}]
print(llm.chat(chat, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=32, seed=1))[0].text)
