"""Load an HF model directory: config.json, *.safetensors (single or sharded), tokenizer files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from minillm.models.config import ModelConfig, RopeScaling
from minillm.models.rope import SUPPORTED_ROPE_SCALING
from minillm.models.safetensors_io import iter_safetensors
from minillm.models.tokenizer import Tokenizer
from minillm.sampling_params import SamplingParams

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

# HF tensor name suffix (after "model.layers.{i}.") -> canonical name suffix
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "self_attn.o_proj.weight": "o",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}


def shown(v) -> str:
    """A value as it reads in its file, cut short for an error message."""
    return json.dumps(v, default=str, ensure_ascii=False)[:40]


def regular_file(path: Path) -> Path:
    """path, unless it exists and is not a regular file: reading a FIFO waits for a writer forever
    (and a device may never end), so those are refused. A missing path is left to the caller."""
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "a FIFO, socket or device"
        raise ValueError(f"{path}: is {kind}, not a regular file")
    return path


def read_json(path: Path) -> dict:
    """A JSON object from path; a missing file, bad JSON or another JSON value is a clear error."""
    try:
        data = json.loads(regular_file(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing (an HF model directory needs config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a JSON object, got a JSON {type(data).__name__}")
    return data


def config_int(cfg: dict, key: str, where: str, default: int | None = None) -> int:
    """cfg[key] as a positive integer; absent or null gives default, or an error when there is none."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ValueError(f"{where}: '{key}' is missing; a model's config needs it")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: '{key}' must be a positive integer, got {shown(v)}")
    return v


def config_float(cfg: dict, key: str, where: str, default: float | None = None) -> float:
    """cfg[key] as a positive finite number (an epsilon, a RoPE base or factor: 0, a negative or NaN
    one gives a model that computes NaN or garbage); absent or null gives default, or an error."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ValueError(f"{where}: '{key}' is missing; a model's config needs it")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{where}: '{key}' must be a positive number, got {shown(v)}")
    return float(v)


def config_bool(cfg: dict, key: str, where: str, default: bool) -> bool:
    """cfg[key] as a bool; absent or null gives default. Only a real bool is taken: the string
    "false" would otherwise read as true."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ValueError(f"{where}: '{key}' must be true or false, got {shown(v)}")
    return v


def token_ids(cfg: dict, key: str, where: str, vocab_size: int) -> list[int] | None:
    """cfg[key], a token id or a list of them, as a list; None when absent or null."""
    v = cfg.get(key)
    if v is None:
        return None
    ids = v if isinstance(v, list) else [v]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{where}: '{key}' must be a token id or a list of token ids below the "
                         f"vocabulary size {vocab_size}, got {shown(v)}")
    return list(ids)


# The sampling defaults the server and the chat REPL fill requests from, checked at load as a
# request's would be (a bad one would otherwise fail every request, or the REPL, later)
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p")


def check_sampling_default(name: str, value, key: str, where: str) -> None:
    """value as SamplingParams takes `name`; the error names `key`, how the file spells it."""
    try:
        SamplingParams(**{name: value})
    except ValueError as e:
        raise ValueError(f"{where}: '{key}': {e}") from None


def generation_defaults(gen: dict, where: str) -> dict:
    """generation_config.json's object with its sampling defaults checked; a null one means unset."""
    gen = {k: v for k, v in gen.items() if not (k in SAMPLING_DEFAULTS and v is None)}
    for name in SAMPLING_DEFAULTS:
        if name in gen:
            check_sampling_default(name, gen[name], name, where)
    return gen


def sampling_defaults(generation_config: str, model_defaults: dict) -> dict:
    """--generation-config (vLLM's): "auto" keeps the model's own defaults, "vllm" none, and a folder
    its generation_config.json's (checked as a model's are). Only the sampling keys are kept."""
    if generation_config == "auto":
        gen = model_defaults
    elif generation_config == "vllm":
        gen = {}
    else:
        if Path(generation_config).is_file():  # the file itself: vLLM's flag takes its folder
            raise ValueError(f"--generation-config {generation_config}: a file; give the folder holding "
                             f"generation_config.json ({Path(generation_config).parent}), auto or vllm")
        path = Path(generation_config) / "generation_config.json"
        if not path.is_file():
            raise ValueError(f"--generation-config {generation_config}: no generation_config.json there; give auto, "
                             "vllm or a folder holding one")
        gen = generation_defaults(read_json(path), str(path))
    return {k: v for k, v in gen.items() if k in SAMPLING_DEFAULTS and v is not None}


def override_defaults(override: dict | None) -> dict:
    """--override-generation-config (vLLM's): sampling defaults that replace --generation-config's,
    each checked as a request's value would be; a key other than the sampling ones is refused."""
    if not override:
        return {}
    unknown = sorted(set(override) - set(SAMPLING_DEFAULTS))
    if unknown:
        raise ValueError(f"--override-generation-config: unknown key(s) {unknown}; the sampling defaults are "
                         f"{', '.join(SAMPLING_DEFAULTS)}")
    for name, value in override.items():
        check_sampling_default(name, value, name, "--override-generation-config")
    return dict(override)


HF_ATTENTION_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def attention_shape(cfg: dict, where: str, keys: tuple[str, ...] = HF_ATTENTION_KEYS) -> tuple[int, int, int, int]:
    """(hidden_size, heads, KV heads, head_dim) of a config, checked to fit together; keys are how
    cfg spells those four (a GGUF file: {arch}.embedding_length, ...)."""
    hidden_key, heads_key, kv_key, dim_key = keys
    hidden, heads = config_int(cfg, hidden_key, where), config_int(cfg, heads_key, where)
    kv_heads = config_int(cfg, kv_key, where, heads)
    if heads % kv_heads:
        raise ValueError(f"{where}: {heads_key} {heads} is not a multiple of {kv_key} {kv_heads}")
    if cfg.get(dim_key) is not None:
        return hidden, heads, kv_heads, config_int(cfg, dim_key, where)
    if hidden % heads:
        raise ValueError(f"{where}: {hidden_key} {hidden} is not a multiple of {heads_key} {heads} "
                         f"(and no {dim_key} is given)")
    return hidden, heads, kv_heads, hidden // heads


def rope_scaling_from(d, where: str) -> RopeScaling:
    """rope_scaling (or rope_parameters), checked here rather than when the RoPE table is built:
    a kind minillm implements, positive factors. Both "rope_type" and the older "type" name it."""
    if not d:
        return RopeScaling()
    if not isinstance(d, dict):
        raise ValueError(f"{where}: 'rope_scaling' must be an object, got {shown(d)}")
    kind = d.get("rope_type", d.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    if kind not in SUPPORTED_ROPE_SCALING:
        raise ValueError(f"{where}: rope_scaling type {shown(kind)} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ROPE_SCALING)}")
    rs = RopeScaling(kind=kind, factor=config_float(d, "factor", where, 1.0))
    for key in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
        if d.get(key) is not None:
            setattr(rs, key, config_float(d, key, where))
    rs.original_max_position_embeddings = config_int(d, "original_max_position_embeddings", where,
                                                     rs.original_max_position_embeddings)
    return rs


def config_from_hf(cfg: dict, where: str) -> ModelConfig:
    """The ModelConfig of an HF config.json's object; a field missing or of the wrong kind is a
    ValueError naming the file and the field (never a KeyError or TypeError from deep inside)."""
    try:
        return _config_from_hf(cfg, where)
    except (TypeError, ValueError, AttributeError) as e:
        if str(e).startswith(where):
            raise
        raise ValueError(f"{where}: a field has a value of the wrong kind ({e})") from None


def _config_from_hf(cfg: dict, where: str) -> ModelConfig:
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ValueError(f"{where}: 'architectures' must be a list of names, got {shown(archs)}")
    arch = next((ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    if arch is None:
        raise ValueError(
            f"{where}: unsupported architectures {archs}; supported: {', '.join(ARCHITECTURES)}"
        )
    hidden, heads, kv_heads, head_dim = attention_shape(cfg, where)
    vocab_size = config_int(cfg, "vocab_size", where)
    bos = token_ids(cfg, "bos_token_id", where, vocab_size)
    rope_params = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    # transformers v5 moves rope_theta into rope_parameters
    theta_in = rope_params if cfg.get("rope_theta") is None and isinstance(rope_params, dict) else cfg
    return ModelConfig(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=config_int(cfg, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=config_int(cfg, "intermediate_size", where),
        rms_norm_eps=config_float(cfg, "rms_norm_eps", where, 1e-6),
        rope_theta=config_float(theta_in, "rope_theta", where, 10000.0),
        rope_scaling=rope_scaling_from(rope_params, where),
        max_position_embeddings=config_int(cfg, "max_position_embeddings", where, 4096),
        tie_word_embeddings=config_bool(cfg, "tie_word_embeddings", where, False),
        attention_bias=arch == "qwen2" or config_bool(cfg, "attention_bias", where, False),
        qk_norm=arch == "qwen3",
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=token_ids(cfg, "eos_token_id", where, vocab_size) or [],
        pad_token_id=cfg.get("pad_token_id"),
    )


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not (isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())):
            raise ValueError(f"{index}: needs a 'weight_map' object of tensor name -> shard file name")
        # a shard is read from the model directory only: "../x" or "/x" would load weights from
        # wherever the index says (and path / "/x" is "/x")
        for name, f in weight_map.items():
            if Path(f).is_absolute() or ".." in Path(f).parts:
                raise ValueError(f"{index}: weight_map maps {shown(name)} to {f!r}, outside the model directory; "
                                 f"shard names must be file names relative to {path}")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (path / f).exists()]
        if missing:
            raise FileNotFoundError(f"{index}: lists shards that are missing: {missing}")
        return [path / f for f in files]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files (minillm reads safetensors weights only)")
    return files


def canonical_name(hf_name: str) -> str | None:
    """Map an HF tensor name to minillm's canonical name; None for tensors we do not use."""
    if hf_name == "model.embed_tokens.weight":
        return "embed"
    if hf_name == "model.norm.weight":
        return "norm"
    if hf_name == "lm_head.weight":
        return "lm_head"
    if hf_name.startswith("model.layers."):
        rest = hf_name[len("model.layers."):]
        idx, _, suffix = rest.partition(".")
        if suffix in _LAYER_NAMES:
            return f"layers.{idx}.{_LAYER_NAMES[suffix]}"
    return None


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes = {"embed": (c.vocab_size, c.hidden_size), "norm": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "attn_norm": (c.hidden_size,), p + "mlp_norm": (c.hidden_size,),
            p + "q": (c.q_size, c.hidden_size), p + "k": (c.kv_size, c.hidden_size),
            p + "v": (c.kv_size, c.hidden_size), p + "o": (c.hidden_size, c.q_size),
            p + "gate": (c.intermediate_size, c.hidden_size),
            p + "up": (c.intermediate_size, c.hidden_size),
            p + "down": (c.hidden_size, c.intermediate_size),
        })
        if c.attention_bias:
            shapes.update({p + "q_bias": (c.q_size,), p + "k_bias": (c.kv_size,), p + "v_bias": (c.kv_size,)})
        if c.qk_norm:
            shapes.update({p + "q_norm": (c.head_dim,), p + "k_norm": (c.head_dim,)})
    return shapes


def check_weights(weights: dict[str, np.ndarray], cfg: ModelConfig, where: str,
                  layers_key: str = "num_hidden_layers") -> None:
    """Every expected tensor present with its expected shape, or a message naming it; no layer past
    the config's count, and no layer tensor the config does not use (q/k norms or q/k/v biases of a
    config without them): the model would silently run without it. layers_key names the count."""
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in weights:
            raise ValueError(f"{where}: tensor {name!r} is missing (expected shape {shape})")
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"{where}: tensor {name!r} has shape {tuple(weights[name].shape)}, expected {shape}"
            )
    layers = {str(i) for i in range(cfg.num_layers)}
    extra = sorted({n.split(".")[1] for n in weights if n.startswith("layers.")} - layers)
    if extra:
        raise ValueError(f"{where}: has tensors of layer(s) {', '.join(extra[:5])} but {layers_key} is "
                         f"{cfg.num_layers}; the weights and the config disagree")
    unused = sorted({n.split(".", 2)[2] for n in weights if n.startswith("layers.") and n not in expected})
    if unused:
        norms = "q/k norms (Qwen3's), but the config's architecture has none"
        biases = "q/k/v biases, but the config's attention_bias is off"
        why = {"q_norm": norms, "k_norm": norms, "q_bias": biases, "k_bias": biases, "v_bias": biases}
        reasons = sorted({why.get(u, "tensors the config does not use") for u in unused})
        raise ValueError(f"{where}: its layers hold {', '.join(unused)}: {'; '.join(reasons)} (model_type "
                         f"{cfg.arch!r}). The model would run without them: the weights and the config disagree")


def load_safetensors(files: list[Path]) -> dict[str, np.ndarray]:
    """All tensors of the files under canonical names, in their stored dtype (views of the files;
    the backend converts once, so a bf16 checkpoint reaches a bf16 GPU without a float32 detour)."""
    out: dict[str, np.ndarray] = {}
    for f in files:
        for name, t in iter_safetensors(f):
            canon = canonical_name(name)
            if canon is not None:
                out[canon] = t
    return out


def load_hf_dir(path: str | Path, tokenizer_dir: Path | None = None):
    """(ModelConfig, weights, Tokenizer, generation defaults) from an HF directory; the tokenizer
    from tokenizer_dir instead when given (--tokenizer)."""
    path = Path(path)
    cfg = config_from_hf(read_json(path / "config.json"), str(path / "config.json"))
    gen = {}
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        gen = generation_defaults(read_json(gen_path), str(gen_path))
        eos = token_ids(gen, "eos_token_id", str(gen_path), cfg.vocab_size)
        if eos is not None:
            cfg.eos_token_ids = eos
        # not used, but one past the vocabulary says the files do not belong together
        token_ids(gen, "bos_token_id", str(gen_path), cfg.vocab_size)
    weights = load_safetensors(_tensor_files(path))
    check_weights(weights, cfg, str(path))
    tokenizer = Tokenizer.from_hf_dir(tokenizer_dir or path, eos_token_ids=cfg.eos_token_ids,
                                      vocab_size=cfg.vocab_size)
    for i in tokenizer.eos_token_ids:
        if i not in cfg.eos_token_ids:
            cfg.eos_token_ids.append(i)
    return cfg, weights, tokenizer, gen
