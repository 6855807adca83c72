"""The embedded SmolLM2 GGUF: minillm's greedy chat output equals HF transformers' on the same file."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.models.loader import default_model_path

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
]


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return tok, model, LLM(device="cpu", max_model_len=512)


def test_greedy_chat_matches_transformers_for_32_tokens(pair):
    tok, model, llm = pair
    prompts = []
    for chat in CHATS:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert ids == llm.tokenizer.encode_chat(chat)  # same prompt tokens to start from
        prompts.append(ids)
    # min_tokens masks EOS for 32 tokens exactly as min_new_tokens does in transformers
    ours = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, min_tokens=32))  # one batch
    for ids, out in zip(prompts, ours):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                 pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        assert out.token_ids == ref


def test_skip_special_tokens_false_keeps_their_text(pair):
    """vLLM's skip_special_tokens=False: the special tokens the model samples stay in the text as
    transformers' decode(skip_special_tokens=False) writes them; by default they are left out. With
    ignore_eos, SmolLM2's greedy answer runs on past its <|im_end|> into the next turn's <|im_start|>."""
    tok, _, llm = pair
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    kept, skipped = (llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                          skip_special_tokens=skip))[0]
                     for skip in (False, True))
    assert kept.token_ids == skipped.token_ids
    assert {1, 2} <= set(kept.token_ids)  # <|im_start|>, <|im_end|> among them
    assert kept.text == tok.decode(kept.token_ids, skip_special_tokens=False)
    assert skipped.text == tok.decode(kept.token_ids, skip_special_tokens=True) != kept.text
