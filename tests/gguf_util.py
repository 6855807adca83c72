"""Write small GGUF files (tiny models, tiny byte-level tokenizers) for the GGUF tests.

Independent of minillm's loader on purpose: names, the llama.cpp q/k permutation, the byte
alphabet and the metadata layout are written here from llama.cpp's conventions, so a test that
loads these files checks the loader against them rather than against itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from minillm.models.config import ModelConfig

Q = GGMLQuantizationType

# canonical name suffix -> llama.cpp tensor name suffix
_LAYER = {
    "attn_norm": "attn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight",
    "v": "attn_v.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight", "o": "attn_output.weight",
    "mlp_norm": "ffn_norm.weight", "gate": "ffn_gate.weight", "up": "ffn_up.weight",
    "down": "ffn_down.weight",
}
_GLOBAL = {"embed": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}

# Byte offsets of the float16 scale fields in one block of the k-quants that gguf.quants cannot
# quantise; the rest of a block is bit fields where any bytes are valid (see ggml-common.h).
K_QUANT_F16_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def gguf_name(canonical: str) -> str:
    if canonical in _GLOBAL:
        return _GLOBAL[canonical]
    _, idx, suffix = canonical.split(".", 2)
    return f"blk.{idx}.{_LAYER[suffix]}"


def tiny_config(arch: str = "llama", **overrides) -> ModelConfig:
    """Small enough to write in milliseconds; every matrix row is a multiple of 256 (k-quant blocks)."""
    fields = dict(arch=arch, vocab_size=len(TINY_TOKENS), hidden_size=256, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=64, intermediate_size=256, rms_norm_eps=1e-5,
                  rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False,
                  attention_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    fields.update(overrides)
    return ModelConfig(**fields)


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> HF-layout shape, written out here rather than taken from the loader."""
    h, q, kv, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    shapes = {"embed": (cfg.vocab_size, h), "norm": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({p + "attn_norm": (h,), p + "q": (q, h), p + "k": (kv, h), p + "v": (kv, h),
                       p + "o": (h, q), p + "mlp_norm": (h,), p + "gate": (f, h), p + "up": (f, h),
                       p + "down": (h, f)})
        if cfg.attention_bias:
            shapes.update({p + "q_bias": (q,), p + "k_bias": (kv,), p + "v_bias": (kv,)})
        if cfg.qk_norm:
            shapes.update({p + "q_norm": (cfg.head_dim,), p + "k_norm": (cfg.head_dim,)})
    return shapes


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in hf_shapes(cfg).items()}


def converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k permutation (HF half-split rotary pairs -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode_tensor(w: np.ndarray, qtype: GGMLQuantizationType, seed: int = 0):
    """(data to write, raw_dtype for GGUFWriter, what gguf.quants.dequantize gives for it).

    Types gguf.quants cannot quantise (the k-quants) get random blocks with finite scales, which
    exercise the dequantiser just as well: the expected values are still gguf's own dequantize.
    """
    if qtype == Q.F32:
        return w, None, w
    try:
        data = quantize(w, qtype)
    except NotImplementedError:
        if qtype not in K_QUANT_F16_FIELDS:
            raise
        data = random_blocks(w.shape, qtype, seed)
    return data, qtype, dequantize(data, qtype).reshape(w.shape)


def random_blocks(shape: tuple[int, ...], qtype: GGMLQuantizationType, seed: int = 0) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for off in K_QUANT_F16_FIELDS[qtype]:
        scales = rng.uniform(0.001, 0.05, len(raw)).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, cols // block * size)


# ---- a tiny byte-level BPE tokenizer --------------------------------------------------------------
def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    direct = [*range(33, 127), *range(161, 173), *range(174, 256)]
    out, n = {}, 0
    for b in range(256):
        if b in direct:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ Ċ", "e r", "Ġ 1"]
TINY_USER_DEFINED = ["<think>"]
TINY_TOKENS = (TINY_SPECIALS + byte_alphabet()
               + ["".join(m.split(" ")) for m in TINY_MERGES] + TINY_USER_DEFINED)
TINY_TYPES = [3] * len(TINY_SPECIALS) + [1] * (len(TINY_TOKENS) - len(TINY_SPECIALS) - 1) + [4]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def tiny_tokenizer_metadata(pre: str = "default") -> dict:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": TINY_TOKENS,
        "tokenizer.ggml.token_type": TINY_TYPES,
        "tokenizer.ggml.merges": TINY_MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


# A tiny SentencePiece-style vocabulary ("llama" tokenizer): "▁" is a space, <0xXX> byte tokens
# catch everything else, and merges come from the scores (equal scores test the tie order).
SPM_PIECES = {"▁": -1.0, "t": -2.0, "h": -2.0, "e": -2.0, "a": -2.0, "i": -2.0, "n": -2.0, "r": -2.0,
              "1": -2.0, "2": -2.0, "▁t": -3.0, "he": -3.0, "▁the": -3.5, "in": -4.0, "▁a": -4.0,
              "er": -4.0, "▁▁": -5.0, "▁▁▁▁": -6.0, "12": -5.0, "▁1": -5.0, "her": -4.5, "▁in": -4.5}
SPM_TOKENS = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *SPM_PIECES, "<think>"]
SPM_TYPES = [2, 3, 3, *[6] * 256, *[1] * len(SPM_PIECES), 4]
SPM_SCORES = [0.0, 0.0, 0.0, *[0.0] * 256, *SPM_PIECES.values(), 0.0]


def sentencepiece_tokenizer_metadata() -> dict:
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": SPM_TOKENS,
        "tokenizer.ggml.scores": SPM_SCORES,
        "tokenizer.ggml.token_type": SPM_TYPES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.merges": None,  # none in the file: derived from the scores
        "tokenizer.ggml.pre": None,
        "tokenizer.chat_template": None,
        "tokenizer.ggml.add_bos_token": None,  # unset: SentencePiece files add BOS by default
    }


def model_metadata(cfg: ModelConfig, arch: str | None = None) -> dict:
    a = arch or cfg.arch
    return {
        f"{a}.block_count": cfg.num_layers,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_heads,
        f"{a}.attention.head_count_kv": cfg.num_kv_heads,
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.rope.freq_base": float(cfg.rope_theta),
    }


def _put(w: GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))


def write_gguf(path: Path, arch: str, metadata: dict, tensors: dict[str, tuple]) -> Path:
    """tensors: GGUF name -> (array, raw_dtype or None) as GGUFWriter.add_tensor takes them."""
    w = GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        _put(w, key, value)
    for name, (data, raw_dtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_model(path: Path, cfg: ModelConfig, weights: dict[str, np.ndarray],
                qtype: GGMLQuantizationType = Q.F32, arch: str | None = None,
                pre: str = "default", extra_metadata: dict | None = None,
                drop: tuple[str, ...] = (), extra_tensors: dict[str, np.ndarray] | None = None,
                ) -> tuple[Path, dict[str, np.ndarray]]:
    """Write cfg + HF-layout weights as llama.cpp would; return (path, what the loader should give).

    2-D weights are stored as qtype, 1-D ones (norms, biases) as F32 as llama.cpp keeps them.
    Llama q/k (and their biases) are permuted like the llama.cpp converter does. `drop` omits
    tensors by canonical name; extra_tensors (GGUF name -> array) are written as given;
    extra_metadata overrides keys, and a None value leaves the key out.
    """
    tensors, expected = {}, {}
    for i, (name, w) in enumerate(weights.items()):
        if name in drop:
            continue
        suffix = name.rsplit(".", 1)[-1]
        n_head = {"q": cfg.num_heads, "q_bias": cfg.num_heads,
                  "k": cfg.num_kv_heads, "k_bias": cfg.num_kv_heads}.get(suffix)
        # row j of the stored tensor is row rows[j] of the HF one
        rows = converter_permute(np.arange(w.shape[0]), n_head) if cfg.arch == "llama" and n_head else None
        stored = w if rows is None else w[rows]
        data, raw, deq = encode_tensor(stored, qtype if w.ndim == 2 else Q.F32, seed=i)
        tensors[gguf_name(name)] = (data, raw)
        if rows is not None:
            deq, back = np.empty_like(deq), deq
            deq[rows] = back
        expected[name] = deq
    for name, data in (extra_tensors or {}).items():
        tensors[name] = (data, None)
    meta = {**model_metadata(cfg, arch), **tiny_tokenizer_metadata(pre), **(extra_metadata or {})}
    meta = {k: v for k, v in meta.items() if v is not None}
    write_gguf(path, arch or cfg.arch, meta, tensors)
    return path, expected
