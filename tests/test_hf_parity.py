"""Token-for-token agreement with HF transformers on tiny random Llama, Qwen2 and Qwen3 models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minillm import LLM, SamplingParams

from hf_models import make_tiny

ARCHS = ["llama", "qwen2", "qwen3"]
PROMPTS = [[5, 17, 99, 3, 42], [7, 8, 200, 31, 1, 9, 77, 120, 4, 66, 13, 2, 250],
           [100, 101, 102, 103, 104, 105, 106, 107, 108]]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = make_tiny(request.param, path, seed=ARCHS.index(request.param))
    llm = LLM(str(path), device="cpu", max_num_seqs=64, max_model_len=256)
    return request.param, model, llm


def test_logits_match_at_every_position(tiny):
    _, model, llm = tiny
    ours = llm.engine.score(PROMPTS)  # one ragged batch
    for prompt, got in zip(PROMPTS, ours):
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0].numpy()
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert rel < 1e-4, f"relative error {rel:.2e}"


def test_32_greedy_tokens_identical(tiny):
    _, model, llm = tiny
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                                 do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == ref
        assert out.finish_reason == "length"


def test_batch_equals_alone(tiny):
    _, _, llm = tiny
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    batched = [o.token_ids for o in llm.generate(PROMPTS, params)]
    alone = [llm.generate([p], params)[0].token_ids for p in PROMPTS]
    assert batched == alone
