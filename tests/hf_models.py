"""Tiny random HF models made with transformers and saved as safetensors directories (test oracle)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def make_tiny(arch: str, path: Path, seed: int = 0, **overrides):
    """Save a tiny random llama/qwen2/qwen3 model to path and return the torch model (fp32, eval)."""
    torch.manual_seed(seed)
    kw = dict(TINY, **overrides)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**kw, head_dim=kw["hidden_size"] // kw["num_attention_heads"])
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**kw)
        cls = transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        head_dim = kw.pop("head_dim", 16)
        cfg = transformers.Qwen3Config(**kw, head_dim=head_dim)
        cls = transformers.Qwen3ForCausalLM
    else:
        raise ValueError(arch)
    cfg.eos_token_id = 2
    cfg.bos_token_id = 1
    model = cls(cfg).eval()
    with torch.no_grad():  # larger-than-init weights so the test would notice small mistakes
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    write_byte_tokenizer(path)
    return model


def write_byte_tokenizer(path: Path) -> None:
    """A 256-token byte-level tokenizer (ids 0..255 = bytes) so tiny models can take text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet[:256])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        '{"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}\\n{% endfor %}'
        '{% if add_generation_prompt %}<assistant>{% endif %}"}'
    )


def add_think_tokens(path: Path) -> tuple[int, int]:
    """Give write_byte_tokenizer's tokenizer <think> and </think> as one added token each (ids 256
    and 257, not special: decoded text keeps them, as Qwen3's does); the model needs vocab_size 258.
    Returns their ids."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tok.save(str(path / "tokenizer.json"))
    return tok.token_to_id("<think>"), tok.token_to_id("</think>")
