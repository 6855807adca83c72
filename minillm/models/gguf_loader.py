"""Load a GGUF file: config from its metadata, float32 weights, and the tokenizer it embeds.

llama.cpp's GGUF keeps everything a model needs in one file: the hyperparameters as
`{arch}.*` metadata, the tensors (often quantised, in GGML's reversed dimension order), and the
tokenizer as `tokenizer.ggml.*` arrays. This module turns that into what the HF loader
produces: a ModelConfig, float32 weights under the canonical names of minillm/models/config.py
(HF [out, in] layout), a Tokenizer built with the `tokenizers` library, and generation defaults.

Two conversions the llama.cpp converter applied are undone here:
  * Llama q/k rows are permuted for llama.cpp's interleaved ("normal") RoPE; we put them back in
    HF's half-split order, which minillm's RoPE expects (Qwen files are not permuted).
  * Llama 3.x "llama3" rope scaling is stored as a `rope_freqs` tensor of per-frequency factors
    instead of metadata; we recover the rope_scaling parameters from it.

The tokenizer is built to encode exactly like transformers' GGUF tokenizer
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), which is what the tests compare against.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from minillm.models.config import SUPPORTED_ARCHITECTURES, ModelConfig, RopeScaling
from minillm.models.hf_loader import (
    SAMPLING_DEFAULTS,
    attention_shape,
    check_sampling_default,
    check_weights,
    config_bool,
    config_float,
    config_int,
    count_non_finite,
    expected_shapes,
    refuse_dropped,
    regular_file,
    shown,
)
from minillm.models.tokenizer import Tokenizer

_Q = GGMLQuantizationType
SUPPORTED_TENSOR_TYPES = (
    _Q.F32, _Q.F16, _Q.BF16, _Q.Q8_0, _Q.Q4_0, _Q.Q4_1, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K,
)

# GGUF tensor name -> canonical name (see minillm/models/config.py)
_GLOBAL_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "norm", "output.weight": "lm_head"}
_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "attn_output.weight": "o",
    "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
}

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4
_SPECIAL_TOKEN_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id")

# Pre-tokenizer split regexes by `tokenizer.ggml.pre`, the same table transformers uses (the
# regexes are llama.cpp's / the original tokenizer.json's). A name not listed -- "smollm",
# "gpt2", "default", ... -- gets the GPT-2 regex built into ByteLevel, as in transformers.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION
    + r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
         "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


# ---- metadata ---------------------------------------------------------------------------------
def read_metadata(reader: GGUFReader, where: str) -> dict[str, Any]:
    """Every key/value of the file as Python values (strings, numbers, bools, lists)."""
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):  # the header's own bookkeeping (version, counts)
            continue
        try:
            value = f.contents()
        except UnicodeDecodeError as e:  # gguf decodes strings as UTF-8 here, naming neither key nor file
            raise ValueError(f"{where}: metadata '{key}' is not valid UTF-8 ({e.reason} at byte {e.start}); "
                             "the file is damaged or was not written by a GGUF writer") from None
        if f.types and f.types[0] == GGUFValueType.ARRAY and isinstance(value, np.ndarray):
            value = value.tolist()
        meta[key] = value
    return meta


def architecture(meta: dict, where: str) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{where}: unsupported architecture {arch!r} (general.architecture); "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _f32(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def _string(meta: dict, key: str, where: str) -> str | None:
    """A string-typed metadata value, None when absent."""
    v = meta.get(key)
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{where}: metadata '{key}' must be a string, got {shown(v)}")
    return v


def _array(meta: dict, key: str, kind: type | tuple, where: str, length: int | None = None) -> list | None:
    """An array-typed metadata value of `kind` items (and `length` of them, if given); None when absent."""
    v = meta.get(key)
    if v is None:
        return None
    if not (isinstance(v, list) and (length is None or len(v) == length)
            and all(isinstance(x, kind) and not isinstance(x, bool) for x in v)):
        what = {str: "strings", int: "integers"}.get(kind, "numbers")
        count = f"{length} " if length is not None else ""
        raise ValueError(f"{where}: metadata '{key}' must be an array of {count}{what}, got {shown(v)}")
    return v


def _token_id(meta: dict, key: str, n_tokens: int, where: str) -> int | None:
    """A special token's id, None when absent; it must name one of the n_tokens tokens."""
    i = meta.get(key)
    if i is not None and (isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_tokens):
        raise ValueError(f"{where}: metadata '{key}' must be a token id below {n_tokens}, got {shown(i)}")
    return i


# ---- tensors ----------------------------------------------------------------------------------
def canonical_name(gguf_name: str) -> str | None:
    """Map a GGUF tensor name to minillm's canonical name; None for tensors we do not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        idx, _, suffix = gguf_name[len("blk."):].partition(".")
        if idx.isdigit() and suffix in _LAYER_NAMES:
            return f"layers.{idx}.{_LAYER_NAMES[suffix]}"
    return None


def gguf_tensor_name(canonical: str) -> str:
    """The GGUF name of a canonical weight name (the inverse of canonical_name)."""
    for gguf_name, canon in _GLOBAL_NAMES.items():
        if canon == canonical:
            return gguf_name
    _, idx, suffix = canonical.split(".", 2) if canonical.count(".") >= 2 else ("", "", canonical)
    for gguf_suffix, canon in _LAYER_NAMES.items():
        if canon == suffix:
            return f"blk.{idx}.{gguf_suffix}"
    return canonical


def _dequantized(t, where: str) -> np.ndarray:
    """One tensor as float32 in NumPy (row-major) order, i.e. GGML's dims reversed."""
    if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
        raise ValueError(
            f"{where}: tensor {t.name!r} has type {t.tensor_type.name}, which minillm cannot "
            f"dequantise; supported: {', '.join(q.name for q in SUPPORTED_TENSOR_TYPES)}"
        )
    # GGML lists dims fastest-first ([in, out] for a matrix); NumPy wants [out, in].
    shape = tuple(int(d) for d in reversed(t.shape))
    values = dequantize(t.data, t.tensor_type)
    if values.size != math.prod(shape):
        raise ValueError(f"{where}: tensor {t.name!r}: {values.size} values for shape {shape}")
    # F32 tensors come back as read-only views of the file's memory map: copy those into memory
    out = np.array(values.reshape(shape), dtype=np.float32, order="C", copy=not values.flags.owndata)
    # corrupt bytes (a damaged download) decode to NaN or infinite weights, which run without an error
    # and give token 0 every step (count_non_finite: the safetensors loader's bit test)
    if bad := count_non_finite(out):
        raise ValueError(f"{where}: tensor {t.name!r} holds {bad} NaN or infinite values once dequantised: the "
                         "file is damaged (download it again)")
    return out


def read_tensors(reader: GGUFReader, where: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(weights under canonical names, other float tensors we look at such as rope_freqs)."""
    weights: dict[str, np.ndarray] = {}
    extra: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        canon = canonical_name(t.name)
        if canon is not None:
            weights[canon] = _dequantized(t, where)
        elif t.name == "rope_freqs.weight":
            extra[t.name] = _dequantized(t, where)
    return weights, extra


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of q/k rows (or biases).

    HF stores each head's rotary pairs as (first half, second half) of the head; the converter
    interleaves them (x0, x_{d/2}, x1, x_{d/2+1}, ...) for llama.cpp's adjacent-pair RoPE, by
    viewing a head's rows as [2, d/2] and transposing. Transposing the [d/2, 2] view back undoes it.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---- config -----------------------------------------------------------------------------------
def _llama3_scaling_from_factors(factors: np.ndarray, head_dim: int, theta: float,
                                 original_ctx: int, where: str) -> RopeScaling:
    """Recover llama3 rope_scaling from the converter's per-frequency factors (rope_freqs).

    The factor for the lowest frequencies is `factor` itself; low/high_freq_factor and the
    original context are not stored, so we take Llama 3's published values (1, 4, 8192 unless
    the file names the context) and check that they reproduce every stored factor.
    """
    rs = RopeScaling(kind="llama3", factor=_f32(factors.max()), low_freq_factor=1.0,
                     high_freq_factor=4.0, original_max_position_embeddings=original_ctx)
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / inv
    smooth = (original_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    expect = np.where(
        wavelen < original_ctx / rs.high_freq_factor, 1.0,
        np.where(wavelen > original_ctx / rs.low_freq_factor, rs.factor,
                 1.0 / ((1 - smooth) / rs.factor + smooth)),
    )
    if factors.shape != expect.shape or not np.allclose(factors, expect, rtol=1e-4):
        raise ValueError(
            f"{where}: tensor 'rope_freqs.weight' holds rope factors that are not llama3 scaling "
            f"with factor {rs.factor}, low_freq_factor 1, high_freq_factor 4 and original context "
            f"{original_ctx}; minillm supports rope scaling kinds default, linear, llama3, yarn"
        )
    return rs


def _rope_scaling(meta: dict, arch: str, head_dim: int, theta: float,
                  extra: dict[str, np.ndarray], where: str) -> RopeScaling:
    p = f"{arch}.rope.scaling."
    kind = meta.get(p + "type", "none")
    factor_key = p + "factor" if p + "factor" in meta else f"{arch}.rope.scale_linear"
    factor = _f32(config_float(meta, factor_key, where, 1.0))
    original_ctx = config_int(meta, p + "original_context_length", where, 8192)
    if "rope_freqs.weight" in extra:
        return _llama3_scaling_from_factors(
            extra["rope_freqs.weight"].astype(np.float64), head_dim, theta, original_ctx, where)
    if kind == "none" and factor != 1.0:
        kind = "linear"  # old files: only rope.scale_linear
    if kind == "none":
        return RopeScaling()
    if kind not in ("linear", "yarn"):
        raise ValueError(
            f"{where}: metadata {p + 'type'} = {kind!r} is not supported; "
            "supported rope scaling kinds: none, linear, yarn, llama3 (as a rope_freqs tensor)"
        )
    if p + "original_context_length" not in meta:  # llama.cpp's yarn then takes the training context, not 8192
        original_ctx = config_int(meta, f"{arch}.context_length", where, original_ctx)
    rs = RopeScaling(kind=kind, factor=factor, original_max_position_embeddings=original_ctx)
    if p + "yarn_beta_fast" in meta:
        rs.beta_fast = _f32(config_float(meta, p + "yarn_beta_fast", where))
    if p + "yarn_beta_slow" in meta:
        rs.beta_slow = _f32(config_float(meta, p + "yarn_beta_slow", where))
    if p + "attn_factor" in meta:
        rs.attention_factor = _f32(config_float(meta, p + "attn_factor", where))
    return rs


def config_from_gguf(meta: dict, weights: dict[str, np.ndarray], extra: dict[str, np.ndarray],
                     where: str) -> ModelConfig:
    """ModelConfig from `{arch}.*` metadata; vocab size from the embedding it must index. Values are
    checked with the HF loader's helpers, so errors name the file and the metadata key."""
    arch = architecture(meta, where)
    keys = ("embedding_length", "attention.head_count", "attention.head_count_kv", "attention.key_length")
    hidden, heads, kv_heads, head_dim = attention_shape(meta, where, tuple(f"{arch}.{k}" for k in keys))
    rope_dims = meta.get(f"{arch}.rope.dimension_count")
    if rope_dims is not None and config_int(meta, f"{arch}.rope.dimension_count", where) != head_dim:
        raise ValueError(
            f"{where}: {arch}.rope.dimension_count = {rope_dims} rotates only part of each head "
            f"(head_dim {head_dim}); minillm supports full-head RoPE only"
        )
    if "embed" not in weights:
        raise ValueError(f"{where}: tensor 'token_embd.weight' (the embedding) is missing")
    theta = _f32(config_float(meta, f"{arch}.rope.freq_base", where, 10000.0))
    has_bias = any(name.endswith(".q_bias") for name in weights)
    vocab_size = int(weights["embed"].shape[0])
    eos = _token_id(meta, "tokenizer.ggml.eos_token_id", vocab_size, where)
    return ModelConfig(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=config_int(meta, f"{arch}.block_count", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=config_int(meta, f"{arch}.feed_forward_length", where),
        rms_norm_eps=_f32(config_float(meta, f"{arch}.attention.layer_norm_rms_epsilon", where, 1e-6)),
        rope_theta=theta,
        rope_scaling=_rope_scaling(meta, arch, head_dim, theta, extra, where),
        max_position_embeddings=config_int(meta, f"{arch}.context_length", where, 4096),
        tie_word_embeddings="lm_head" not in weights,
        attention_bias=arch == "qwen2" or has_bias,
        qk_norm=arch == "qwen3",
        torch_dtype="float32",  # dequantised on load; the file's types are per tensor
        bos_token_id=_token_id(meta, "tokenizer.ggml.bos_token_id", vocab_size, where),
        eos_token_ids=[] if eos is None else [eos],
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


# ---- tokenizer --------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are given the characters
    from U+0100 upward, in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merges_from_file(meta: dict, vocab: dict[str, int], where: str) -> list[tuple[str, str]]:
    """tokenizer.ggml.merges as pairs, each naming tokens of the vocabulary (the tokenizers library
    would refuse any other with a bare Exception)."""
    merges = []
    for m in _array(meta, "tokenizer.ggml.merges", str, where):
        left, sep, right = m.partition(" ")
        if not sep:
            raise ValueError(f"{where}: tokenizer.ggml.merges entry {m!r} is not 'left right'")
        unknown = next((t for t in (left, right, left + right) if t not in vocab), None)
        if unknown is not None:
            raise ValueError(f"{where}: tokenizer.ggml.merges entry {m!r} names {unknown!r}, which is not in "
                             "tokenizer.ggml.tokens")
        merges.append((left, right))
    return merges


def _byte_level_bpe(meta: dict, where: str) -> tuple[HFTokenizer, dict[str, int], set[str]]:
    """Byte-level BPE (`tokenizer.ggml.model` "gpt2"): GPT-2, Llama 3, Qwen, SmolLM, ...

    Returns the tokenizer, its vocabulary and the alphabet its tokens are spelled in.
    """
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    if "tokenizer.ggml.merges" not in meta:
        raise ValueError(f"{where}: metadata 'tokenizer.ggml.merges' is missing (a gpt2 BPE tokenizer needs it)")
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())

    def byte_spelled(token: str) -> str:
        # A few converters write some tokens as raw text; BPE needs them in the byte alphabet.
        if set(token) <= alphabet:
            return token
        return "".join(spelling[b] for b in token.encode("utf-8"))

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab[byte_spelled(t)] = i  # a later duplicate wins, as when building a dict in transformers
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=_merges_from_file(meta, vocab, where), dropout=None,
                                 continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(_string(meta, "tokenizer.ggml.pre", where))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    return tok, vocab, alphabet


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's greedy "merge the best-scoring pair" order.

    Every way of cutting a token into two vocabulary tokens is a merge ranked by the token's
    score (then by longer left, longer right piece); among equals, the token listed first and,
    within one token, the cut whose pieces have the lower ids come first. This is the order
    transformers derives (its generate_merges), which is what we must reproduce token for token.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    score_of = dict(zip(tokens, scores))
    merges = []
    for token, score in score_of.items():
        cuts = [(token[:k], token[k:]) for k in range(1, len(token))]
        cuts = sorted((c for c in cuts if c[0] in vocab and c[1] in vocab), key=lambda c: (vocab[c[0]], vocab[c[1]]))
        merges.extend((score, left, right) for left, right in cuts)
    merges.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)  # stable: ties keep order
    return [(left, right) for _, left, right in merges]


def _sentencepiece_bpe(meta: dict, where: str) -> tuple[HFTokenizer, dict[str, int], None]:
    """SentencePiece-style BPE (`tokenizer.ggml.model` "llama"): Llama 2, Mistral, TinyLlama, ...

    "▁" stands for a space, one is put before the text (tokenizer.ggml.add_space_prefix, on by
    default), and characters outside the vocabulary fall back to <0xXX> byte tokens.
    """
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in meta:
        merges = _merges_from_file(meta, vocab, where)
    elif "tokenizer.ggml.scores" in meta:
        merges = _merges_from_scores(tokens, _array(meta, "tokenizer.ggml.scores", (int, float), where, len(tokens)))
    else:
        raise ValueError(f"{where}: a 'llama' tokenizer needs tokenizer.ggml.scores or tokenizer.ggml.merges")
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=True, byte_fallback=True))
    prefix = config_bool(meta, "tokenizer.ggml.add_space_prefix", where, True)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok, vocab, None


def _add_whole_tokens(tok: HFTokenizer, meta: dict, vocab: dict[str, int], alphabet: set[str] | None,
                      where: str) -> None:
    """Register the tokens that must match whole, before pre-tokenizing.

    Control tokens (<|im_start|>, </s>) are special; user-defined ones (<think>) match whole but
    are ordinary text. In a byte-level vocabulary a control token spelled outside the byte
    alphabet is a converter mislabel and is left alone (transformers skips it too, so the
    vocabulary keeps the size the model expects). The bos/eos/unk/pad tokens are special
    whatever their type, as transformers registers them.
    """
    tokens = meta["tokenizer.ggml.tokens"]
    types = _array(meta, "tokenizer.ggml.token_type", int, where, len(tokens)) or []
    special = [t for t, ty in zip(tokens, types) if ty == _CONTROL and (alphabet is None or set(t) <= alphabet)]
    for key in _SPECIAL_TOKEN_IDS:
        i = meta.get(key)
        if isinstance(i, int) and 0 <= i < len(tokens) and tokens[i] in vocab and tokens[i] not in special:
            special.append(tokens[i])
    user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab and t not in special]
    if special:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


_TOKENIZER_BUILDERS = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}
SUPPORTED_TOKENIZERS = tuple(_TOKENIZER_BUILDERS)


def tokenizer_from_gguf(meta: dict, where: str) -> Tokenizer:
    """minillm's Tokenizer from `tokenizer.*` metadata."""
    kind = meta.get("tokenizer.ggml.model")
    if kind is None or "tokenizer.ggml.tokens" not in meta:
        raise ValueError(
            f"{where}: no tokenizer in the file (metadata 'tokenizer.ggml.model' / "
            "'tokenizer.ggml.tokens' missing); minillm needs the tokenizer embedded in the GGUF"
        )
    if not isinstance(kind, str) or kind not in _TOKENIZER_BUILDERS:
        raise ValueError(
            f"{where}: tokenizer.ggml.model = {kind!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_TOKENIZERS)} (byte-level BPE and SentencePiece BPE); "
            "use the model's HF directory instead"
        )
    tokens = _array(meta, "tokenizer.ggml.tokens", str, where)
    if not tokens:
        raise ValueError(f"{where}: metadata 'tokenizer.ggml.tokens' is empty")
    tok, vocab, alphabet = _TOKENIZER_BUILDERS[kind](meta, where)
    _add_whole_tokens(tok, meta, vocab, alphabet, where)

    def token(key: str) -> str | None:
        i = _token_id(meta, key, len(tokens), where)
        return None if i is None else tokens[i]

    # llama.cpp stops at end-of-generation tokens: eos, and end-of-turn / end-of-message if set.
    eos_ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        i = _token_id(meta, key, len(tokens), where)
        if i is not None and i not in eos_ids:
            eos_ids.append(i)
    # SentencePiece files that do not say add BOS, as llama.cpp and transformers assume
    add_bos = config_bool(meta, "tokenizer.ggml.add_bos_token", where, kind == "llama")
    return Tokenizer(
        tok,
        chat_template=_string(meta, "tokenizer.chat_template", where),
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        eos_token_ids=eos_ids,
        add_bos_token=add_bos,
        chat_template_where=f"{where}: metadata 'tokenizer.chat_template'",
    )


# ---- generation defaults ----------------------------------------------------------------------
# llama.cpp's converter copies generation_config.json's sampling values into `general.sampling.*`;
# we hand them back under generation_config.json's names, as the HF loader does.
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def generation_defaults_from(meta: dict, where: str) -> dict:
    """Sampling defaults the file carries (often none), as generation_config.json keys; checked as
    the HF loader checks generation_config.json's, with the error naming the metadata key."""
    out: dict[str, Any] = {}
    for key, name in _SAMPLING_KEYS.items():
        if key in meta:
            value = meta[key]
            if name in SAMPLING_DEFAULTS:
                check_sampling_default(name, value, key, where)
            else:
                config_float(meta, key, where)
            out[name] = value if name == "top_k" else _f32(value)
    return out


# ---- reading the file -------------------------------------------------------------------------
GGUF_MAGIC = b"GGUF"
GGUF_HEADER_BYTES = 24  # magic, version (uint32), tensor count and metadata count (uint64 each)


class _ShortRead(Exception):
    """A read of bytes [start, end) of a file that ends before end; in the tensor data, where the
    last tensor's data ends (data_end) and the first tensor cut (cut_tensor), where known."""

    def __init__(self, start: int, end: int):
        super().__init__(start, end)
        self.start, self.end = start, end
        self.data_end: int | None = None
        self.cut_tensor: str | None = None


class _CheckedReader(GGUFReader):
    """GGUFReader, whose reads past the end of a cut-short file fail with numpy's "When changing to
    a larger dtype, its size must be a divisor ..." (or a bare reshape error), raising _ShortRead
    with the bytes it wanted instead; and noting where the tensors' data should end."""

    _dtypes: dict = {}  # (dtype, byte order) -> the numpy dtype a read is viewed as

    def _get(self, offset, dtype, count=1, override_order=None):
        # GGUFReader._get's view, with less work a call: the reader slices the metadata ~250k times for a
        # vocabulary. A plain array over the same pages: np.memmap's hooks on each slice made the embedded
        # GGUF's opening take 6.6 s, 2.8 s without (session 50); the byte-ordered dtype looked up, not
        # built, each time (BENCHMARKS.md, session 51)
        data = self.data
        if type(data) is np.memmap:
            data = self.data = data.view(np.ndarray)
        order = self.byte_order if override_order is None else override_order
        dt = self._dtypes.get((dtype, order))
        if dt is None:
            dt = self._dtypes[(dtype, order)] = np.dtype(dtype).newbyteorder(order)
        end = offset + dt.itemsize * int(count)
        if end > len(data):
            raise _ShortRead(offset, end)
        return data[offset:end].view(dt)

    def _build_tensors(self, start_offs, fields):
        try:
            super()._build_tensors(start_offs, fields)
        except _ShortRead as e:  # where each tensor's data ends, from its info (as the reader sizes it)
            try:
                ends = []
                for field in fields:
                    _, name, _, dims, raw_dtype, offset = field.parts
                    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
                    n = 1
                    for d in dims.tolist():
                        n *= int(d)
                    ends.append((int(start_offs) + int(offset[0]) + n * type_size // block,
                                 bytes(name).decode("utf-8", "replace")))
                e.data_end = max(end for end, _ in ends)
                e.cut_tensor = min(((end, name) for end, name in ends if end > len(self.data)), default=(0, None))[1]
            except Exception:  # (a tensor info the reader took but we cannot size: the bare numbers)
                pass
            raise


def open_gguf(path: Path, where: str) -> GGUFReader:
    """The gguf library's reader over path, with a file that is not GGUF (no magic) or cut short
    (fewer bytes than its header, metadata or tensor data need) refused as such, with the sizes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if size == 0:
        raise ValueError(f"{where}: the file is empty (0 bytes), not a GGUF model")
    if head != GGUF_MAGIC[: len(head)]:
        raise ValueError(f"{where}: not a GGUF file: it starts with {head!r}, not GGUF's magic {GGUF_MAGIC!r}")
    if size < GGUF_HEADER_BYTES:
        raise ValueError(f"{where}: the GGUF file is truncated: {size} bytes, fewer than the "
                         f"{GGUF_HEADER_BYTES} of its header; the download or copy did not finish?")
    try:
        return _CheckedReader(path)
    except _ShortRead as e:
        if e.data_end is not None:  # the header and metadata are whole: the tensors' data is cut
            raise ValueError(
                f"{where}: the GGUF file is truncated: it is {size} bytes but its tensor data ends at byte "
                f"{e.data_end} ({e.data_end - size} byte(s) missing"
                + (f"; the cut is in tensor {e.cut_tensor!r}" if e.cut_tensor else "")
                + "); the download or copy did not finish?") from None
        raise ValueError(
            f"{where}: the GGUF file is truncated (or its metadata is corrupt): it is {size} bytes but its "
            f"header and metadata read on to byte {e.end}; the download or copy did not finish?") from None
    except Exception as e:  # the reader raises bare ValueErrors/struct errors on bad files
        raise ValueError(f"{where}: not a readable GGUF file ({type(e).__name__}: {e})") from None


# ---- entry point ------------------------------------------------------------------------------
def load_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray], Tokenizer, dict]:
    """(ModelConfig, float32 weights under canonical names, Tokenizer, generation defaults).

    The generation defaults are the `general.sampling.*` values, if the file has any.
    """
    path = Path(path)
    where = str(path)
    if not regular_file(path).is_file():
        raise FileNotFoundError(f"{where}: no such GGUF file")
    reader = open_gguf(path, where)
    meta = read_metadata(reader, where)
    architecture(meta, where)  # refuse early: before the (slow) dequantisation
    # layer tensors the loader would drop (an attn_output or FFN bias, a Mixtral's experts filed under
    # "llama") used to load and run without them, or fail as "missing" naming another tensor
    dropped = [t.name for t in reader.tensors if t.name.startswith("blk.") and canonical_name(t.name) is None
               and not t.name.endswith(".attn_rot_embd")]  # old files' RoPE buffer: harmless
    refuse_dropped(where, dropped, "no attn_output or FFN biases; no mixture-of-experts")
    tokenizer = tokenizer_from_gguf(meta, where)
    weights, extra = read_tensors(reader, where)
    cfg = config_from_gguf(meta, weights, extra, where)
    try:
        check_weights(weights, cfg, where, f"{cfg.arch}.block_count")
    except ValueError as e:  # add the name the user can look for in the file
        bad = next((n for n, s in expected_shapes(cfg).items()
                    if n not in weights or tuple(weights[n].shape) != s), None)
        if bad is None:  # not one tensor's fault: layers past block_count
            raise
        raise ValueError(f"{e}; in the file: {gguf_tensor_name(bad)!r}") from None
    n_tokens = len(meta["tokenizer.ggml.tokens"])
    if n_tokens > cfg.vocab_size:
        raise ValueError(
            f"{where}: the tokenizer has {n_tokens} tokens but the embedding only {cfg.vocab_size} rows"
        )
    if cfg.arch == "llama":
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            for name, n_head in (("q", cfg.num_heads), ("q_bias", cfg.num_heads),
                                 ("k", cfg.num_kv_heads), ("k_bias", cfg.num_kv_heads)):
                if p + name in weights:
                    weights[p + name] = unpermute_qk(weights[p + name], n_head)
    for i in tokenizer.eos_token_ids:
        if i not in cfg.eos_token_ids:
            cfg.eos_token_ids.append(i)
    return cfg, weights, tokenizer, generation_defaults_from(meta, where)
