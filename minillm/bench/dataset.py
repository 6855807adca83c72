"""Benchmark workloads and the tokenizer they are measured with.

- `random_requests`: vLLM's random dataset. Token ids drawn uniformly from the vocabulary without
  special tokens, decoded to text, re-encoded and trimmed/padded until the text encodes to exactly
  the requested number of tokens (so the server, which only sees text, sees that many).
- `custom_prompts` / `custom_requests`: vLLM's custom dataset, a JSONL file of {"prompt": text}
  objects, one a line (the serve ladder draws each rung's prompts from it).
- `nano_vllm_workload`: nano-vllm's offline workload (random token ids, lengths uniform in a range).
- `load_tokenizer`: just the tokenizer of a model argument minillm understands.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minillm.models.tokenizer import Tokenizer


@dataclass
class BenchRequest:
    prompt: str
    prompt_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def load_tokenizer(model: str | None) -> Tokenizer:
    """The tokenizer of an HF directory (tokenizer files only), a .gguf file, an alias or None (the
    embedded default; GGUF tokenizers live in the metadata, so those go through the full loader)."""
    from minillm.models.loader import load_model, resolve_model_path

    path = resolve_model_path(model)
    if path.is_dir():
        return Tokenizer.from_hf_dir(path)
    return load_model(model).tokenizer


def allowed_token_ids(tok: Tokenizer) -> np.ndarray:
    """Every id of the tokenizer except its special tokens (vLLM's random dataset draws from these)."""
    ids = np.arange(tok.vocab_size)
    return ids[~np.isin(ids, sorted(tok.special_token_ids))]


def exact_length_prompt(tok: Tokenizer, ids: list[int], length: int, rng: np.random.Generator,
                        allowed: np.ndarray, max_rounds: int = 16) -> tuple[str, list[int]] | None:
    """Text that encodes to exactly `length` tokens, none special, starting from `ids`; None when
    decode/encode does not settle within max_rounds (the caller then starts from fresh ids)."""
    special = tok.special_token_ids
    for _ in range(max_rounds):
        text = tok.decode(ids, skip_special_tokens=True)
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc) == length and not special.intersection(enc):
            return text, enc
        if special.intersection(enc):  # decoded pieces spelled a special token: start over
            return None
        if len(enc) > length:
            ids = enc[:length]
        else:
            ids = enc + rng.choice(allowed, length - len(enc)).tolist()
    return None


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """vLLM's [floor(L * (1 - r)), ceil(L * (1 + r))], at least 1."""
    return max(1, math.floor(length * (1 - range_ratio))), max(1, math.ceil(length * (1 + range_ratio)))


def random_requests(tok: Tokenizer, num_prompts: int, input_len: int, output_len: int,
                    range_ratio: float = 0.0, seed: int | Sequence[int] = 0) -> list[BenchRequest]:
    """vLLM's random dataset: prompts of exact token length (content tokens, no BOS/template).
    `seed` is anything numpy's default_rng takes: the serve ladder uses [seed, rung]."""
    if input_len < 1 or output_len < 1:
        raise ValueError(f"--input-len and --output-len must be >= 1, got {input_len} and {output_len}")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    allowed = allowed_token_ids(tok)
    in_lo, in_hi = length_range(input_len, range_ratio)
    out_lo, out_hi = length_range(output_len, range_ratio)
    in_lens = rng.integers(in_lo, in_hi + 1, num_prompts)
    out_lens = rng.integers(out_lo, out_hi + 1, num_prompts)
    requests = []
    for n_in, n_out in zip(in_lens.tolist(), out_lens.tolist()):
        for _ in range(100):
            found = exact_length_prompt(tok, rng.choice(allowed, n_in).tolist(), n_in, rng, allowed)
            if found is not None:
                break
        else:
            raise RuntimeError(f"could not build a prompt of exactly {n_in} tokens with this tokenizer")
        requests.append(BenchRequest(prompt=found[0], prompt_ids=found[1], output_len=n_out))
    return requests


def custom_prompts(path: str) -> list[str]:
    """vLLM's custom dataset: every line of a JSONL file an object with a non-empty "prompt" string
    of valid Unicode (other keys are ignored; blank lines are skipped). ValueError naming the line
    otherwise."""
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()  # -sig: a leading BOM (Windows editors)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--dataset-path {path}: cannot read it as UTF-8 text ({e})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--dataset-path {path}, line {n}: not JSON ({e.msg}); the file is read as JSONL, "
                             "one JSON object a line") from None
        prompt = obj.get("prompt") if isinstance(obj, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f'--dataset-path {path}, line {n}: each line must be an object with a non-empty '
                             f'"prompt" string, e.g. {{"prompt": "Summarise: ..."}}')
        try:  # JSON's "\ud800" escape parses to a lone surrogate: the tokenizer refused it mid-ladder
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f'--dataset-path {path}, line {n}: the "prompt" is not valid Unicode (a lone surrogate '
                             f"{prompt[e.start]!r} at character {e.start})") from None
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"--dataset-path {path}: no prompts in it (one JSON object a line)")
    return prompts


def custom_requests(tok: Tokenizer, prompts: list[str], num_prompts: int, output_len: int,
                    seed: int | Sequence[int] = 0) -> list[BenchRequest]:
    """num_prompts of the dataset's prompts in a seeded random order, each asking output_len tokens;
    the file is gone through again (prompts repeat) when it holds fewer."""
    order = np.random.default_rng(seed).permutation(len(prompts))
    picked = [prompts[order[i % len(prompts)]] for i in range(num_prompts)]
    return [BenchRequest(prompt=p, prompt_ids=tok.encode(p, add_special_tokens=False), output_len=output_len)
            for p in picked]


def nano_vllm_workload(allowed: list[int], num_seqs: int = 256, min_len: int = 100, max_len: int = 1024,
                       seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """(prompt token ids, output lengths): nano-vllm's bench.py, lengths uniform in [min_len, max_len]
    with Python's random. nano-vllm draws ids from [0, 10000]; we draw from `allowed` (the
    tokenizer's ordinary ids) so that small vocabularies work too."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= --min-len <= --max-len, got {min_len} and {max_len}")
    rng = random.Random(seed)
    prompts = [[rng.choice(allowed) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_seqs)]
    output_lens = [rng.randint(min_len, max_len) for _ in range(num_seqs)]
    return prompts, output_lens
