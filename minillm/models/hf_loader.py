"""Load an HF model directory: config.json, *.safetensors (single or sharded), tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minillm.models.config import ModelConfig, RopeScaling
from minillm.models.safetensors_io import iter_safetensors
from minillm.models.tokenizer import Tokenizer

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


def read_json(path: Path) -> dict:
    """A JSON object from path; a missing file, bad JSON or another JSON value is a clear error."""
    try:
        data = json.loads(path.read_text())
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
        raise ValueError(f"{where}: '{key}' must be a positive integer, got {json.dumps(v)[:40]}")
    return v


def attention_shape(cfg: dict, where: str) -> tuple[int, int, int, int]:
    """(hidden_size, heads, KV heads, head_dim) of a config, checked to fit together."""
    hidden, heads = config_int(cfg, "hidden_size", where), config_int(cfg, "num_attention_heads", where)
    kv_heads = config_int(cfg, "num_key_value_heads", where, heads)
    if heads % kv_heads:
        raise ValueError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if cfg.get("head_dim"):
        return hidden, heads, kv_heads, config_int(cfg, "head_dim", where)
    if hidden % heads:
        raise ValueError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                         "(and no head_dim is given)")
    return hidden, heads, kv_heads, hidden // heads


def rope_scaling_from(d: dict | None) -> RopeScaling:
    if not d:
        return RopeScaling()
    kind = d.get("rope_type", d.get("type", "default"))
    rs = RopeScaling(kind=kind, factor=float(d.get("factor", 1.0)))
    for key in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow"):
        if key in d:
            setattr(rs, key, float(d[key]))
    if "original_max_position_embeddings" in d:
        rs.original_max_position_embeddings = int(d["original_max_position_embeddings"])
    if d.get("attention_factor") is not None:
        rs.attention_factor = float(d["attention_factor"])
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
        raise ValueError(f"{where}: 'architectures' must be a list of names, got {json.dumps(archs)[:40]}")
    arch = next((ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    if arch is None:
        raise ValueError(
            f"{where}: unsupported architectures {archs}; supported: {', '.join(ARCHITECTURES)}"
        )
    hidden, heads, kv_heads, head_dim = attention_shape(cfg, where)
    rope_params = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    rope_theta = cfg.get("rope_theta")
    if rope_theta is None and isinstance(rope_params, dict):
        rope_theta = rope_params.get("rope_theta")
    if isinstance(rope_params, dict) and rope_params.get("rope_type", "default") == "default":
        rope_params = None
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=config_int(cfg, "vocab_size", where),
        hidden_size=hidden,
        num_layers=config_int(cfg, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=config_int(cfg, "intermediate_size", where),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta or 10000.0),
        rope_scaling=rope_scaling_from(rope_params),
        max_position_embeddings=config_int(cfg, "max_position_embeddings", where, 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch == "qwen3",
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
        pad_token_id=cfg.get("pad_token_id"),
    )


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not (isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())):
            raise ValueError(f"{index}: needs a 'weight_map' object of tensor name -> shard file name")
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


def check_weights(weights: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> None:
    """Every expected tensor present with its expected shape, or a message naming it."""
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise ValueError(f"{where}: tensor {name!r} is missing (expected shape {shape})")
        if tuple(weights[name].shape) != shape:
            raise ValueError(
                f"{where}: tensor {name!r} has shape {tuple(weights[name].shape)}, expected {shape}"
            )


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


def load_hf_dir(path: str | Path):
    """(ModelConfig, weights, Tokenizer, generation defaults) from an HF directory."""
    path = Path(path)
    cfg = config_from_hf(read_json(path / "config.json"), str(path / "config.json"))
    gen = {}
    if (path / "generation_config.json").exists():
        gen = read_json(path / "generation_config.json")
        eos = gen.get("eos_token_id")
        if eos is not None:
            cfg.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
    weights = load_safetensors(_tensor_files(path))
    check_weights(weights, cfg, str(path))
    tokenizer = Tokenizer.from_hf_dir(path, eos_token_ids=cfg.eos_token_ids)
    for i in tokenizer.eos_token_ids:
        if i not in cfg.eos_token_ids:
            cfg.eos_token_ids.append(i)
    return cfg, weights, tokenizer, gen
