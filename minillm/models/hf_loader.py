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


def rope_scaling_from(d, where: str, max_positions: int, original: int | None = None) -> RopeScaling:
    """rope_scaling (or rope_parameters), checked here rather than when the RoPE table is built:
    a kind minillm implements, positive factors. Both "rope_type" and the older "type" name it.
    max_positions is the config's max_position_embeddings and original its top-level
    original_max_position_embeddings, if any: transformers' defaults for the rope_scaling keys."""
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
    # transformers' default for a missing original_max_position_embeddings (llama3, yarn) is the config's
    # own (top-level, else max_position_embeddings), not Llama 3's 8192: a yarn config written as Qwen's
    # docs show but without the key ran with another RoPE than the reference
    rs = RopeScaling(kind=kind, original_max_position_embeddings=config_int(
        d, "original_max_position_embeddings", where, original or max_positions))
    rs.factor = config_float(d, "factor", where)  # no default: transformers refuses a scaling without one too
    for key in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
        if d.get(key) is not None:
            setattr(rs, key, config_float(d, key, where))
    if kind == "llama3" and rs.high_freq_factor <= rs.low_freq_factor:  # divides by their difference
        raise ValueError(f"{where}: rope_scaling's high_freq_factor {rs.high_freq_factor} must be greater than "
                         f"its low_freq_factor {rs.low_freq_factor}")
    # yarn variants (DeepSeek's, gpt-oss's) that transformers computes otherwise than minillm's RoPE: refused,
    # not run as plain yarn. (mscale alone, without mscale_all_dim, transformers ignores too.)
    if kind == "yarn" and rs.attention_factor is None and d.get("mscale") and d.get("mscale_all_dim"):
        raise ValueError(f"{where}: rope_scaling's 'mscale' and 'mscale_all_dim' (DeepSeek's yarn attention factor) "
                         "are not supported; minillm implements plain yarn")
    if kind == "yarn" and d.get("truncate", True) is not True:
        raise ValueError(f"{where}: rope_scaling's 'truncate' {shown(d['truncate'])} is not supported; minillm "
                         "implements yarn's truncated correction range only")
    return rs


def unsupported_features(cfg: dict, arch: str, where: str) -> None:
    """Refuse config.json settings that change what the model computes but that minillm does not
    implement: the model would load and run without them and give other outputs than the reference."""
    quant = cfg.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        # its tensors (qweight/scales, FP8 with scales, ...) would fail later as "missing" or "unsupported dtype"
        raise ValueError(f"{where}: a quantized checkpoint (quantization_config: quant_method {shown(method)}); "
                         "minillm reads unquantized safetensors (F32/F16/BF16) or GGUF files: use the "
                         "unquantized model, or a GGUF quantization of it")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # the MLP is SwiGLU; another activation would be silently replaced
        raise ValueError(f"{where}: 'hidden_act' {shown(act)} is not supported; minillm's MLP uses silu")
    if config_bool(cfg, "mlp_bias", where, False):
        raise ValueError(f"{where}: 'mlp_bias' true is not supported; minillm's MLP has no biases")
    prf = cfg.get("partial_rotary_factor")
    if prf is not None and prf != 1:
        raise ValueError(f"{where}: 'partial_rotary_factor' {shown(prf)} is not supported; minillm applies RoPE "
                         "to the whole head")
    if arch in ("qwen2", "qwen3") and config_bool(cfg, "use_sliding_window", where, False):
        # as transformers reads it: layers from max_window_layers on (or those layer_types names) attend
        # to the last sliding_window tokens only; minillm attends to all of them
        window = cfg.get("sliding_window")
        layers = config_int(cfg, "num_hidden_layers", where)
        types = cfg.get("layer_types")
        if isinstance(types, list):
            sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        else:
            sliding = list(range(config_int(cfg, "max_window_layers", where, 28), layers))
        if window is not None and sliding and config_int(cfg, "sliding_window", where) < config_int(
                cfg, "max_position_embeddings", where, 4096):
            raise ValueError(f"{where}: 'use_sliding_window' is true (a window of {window} tokens in {len(sliding)} "
                             f"of {layers} layers), but minillm has no sliding-window attention; set it to false "
                             "to run with full attention (the reference differs past the window)")


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
    unsupported_features(cfg, arch, where)
    max_positions = config_int(cfg, "max_position_embeddings", where, 4096)
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
        rope_scaling=rope_scaling_from(rope_params, where, max_positions,
                                       config_int(cfg, "original_max_position_embeddings", where, 0) or None),
        max_position_embeddings=max_positions,
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
        if c.conv_kernel_size:  # a DFlash2 drafter's convs (models/transformer.py's CausalConv)
            for conv in ("attn_conv.", "mlp_conv."):
                shapes.update({p + conv + "base": (2, c.conv_kernel_size, c.hidden_size),
                               p + conv + "proj": (c.conv_width, c.hidden_size)})
    return shapes


def check_weights(weights: dict[str, np.ndarray], cfg: ModelConfig, where: str,
                  layers_key: str = "num_hidden_layers") -> None:
    """Every expected tensor present with its expected shape, or a message naming it; no layer past
    the config's count, and no layer tensor the config does not use (q/k norms or q/k/v biases of a
    config without them): the model would silently run without it. layers_key names the count."""
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in weights:
            # an untied config over a tied checkpoint (no lm_head.weight) is a likely cause: say so
            tied = ("; a model whose output layer is its embedding needs tie_word_embeddings true in its config"
                    if name == "lm_head" else "")
            raise ValueError(f"{where}: tensor {name!r} is missing (expected shape {shape}){tied}")
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


# Layer tensors minillm does not use that change nothing: older Llama checkpoints saved RoPE's buffer
_HARMLESS_LAYER_TENSORS = ("self_attn.rotary_emb.inv_freq",)

# The bits that make a float NaN or infinite: its exponent all ones
_EXPONENT_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000, "float64": 0x7FF0000000000000}


def count_non_finite(t: np.ndarray) -> int:
    """How many NaN or infinite values a float tensor (bf16 included) holds.

    A checkpoint saved after a training run diverged holds NaN weights, which run without an error and
    give token 0 at every step. Two max() passes over the bits find them at memory speed with no
    temporary: as integers, a positive NaN/inf is the largest signed value (exponent all ones, sign
    0), a negative one the largest unsigned value. Only then are they counted. On the
    2-core CPU machine: 0.3 ms for the tiny preset, 90 ms for qwen3-0.6b's 1.2 GB warm (so ~1.2 s for a
    16 GB model; the first pass also takes the mmap's page faults, which the backend's conversion
    would otherwise take), against seconds for the conversion itself."""
    exp = _EXPONENT_BITS.get(t.dtype.name)
    if t.size == 0 or exp is None:
        return 0
    size = t.dtype.itemsize
    sign = 1 << (8 * size - 1)
    if int(t.view(f"i{size}").max()) < exp and int(t.view(f"u{size}").max()) < sign | exp:
        return 0
    return int(t.size - np.count_nonzero(np.isfinite(t)))


def load_safetensors(files: list[Path], check_finite: bool = True) -> dict[str, np.ndarray]:
    """All tensors of the files under canonical names, in their stored dtype (views of the files;
    the backend converts once, so a bf16 checkpoint reaches a bf16 GPU without a float32 detour).
    Refused, naming the file and the tensor: a weight of an integer dtype, one two files both hold, a
    layer tensor minillm would drop (an o_proj or MLP bias, a quantized one's scales), and, unless
    check_finite is off, a weight holding NaN or infinite values."""
    out: dict[str, np.ndarray] = {}
    source: dict[str, Path] = {}
    for f in files:
        dropped = []
        for name, t in iter_safetensors(f):
            canon = canonical_name(name)
            if canon is None:
                if name.startswith("model.layers.") and not name.endswith(_HARMLESS_LAYER_TENSORS):
                    dropped.append(name)
                continue
            if canon in out:  # a second copy (an old single-file download beside the shards?) would win silently
                raise ValueError(f"{f}: tensor {name!r} is also in {source[canon]}; a model directory must hold each "
                                 "weight once (remove the file that does not belong)")
            if not (np.issubdtype(t.dtype, np.floating) or t.dtype.name == "bfloat16"):
                raise ValueError(f"{f}: tensor {name!r} has dtype {t.dtype.name}, not a float: minillm reads F32, F16 "
                                 "and BF16 weights (a quantized checkpoint? use the unquantized one or a GGUF file)")
            if check_finite and (bad := count_non_finite(t)):
                raise ValueError(f"{f}: tensor {name!r} holds {bad} NaN or infinite value(s); the model would "
                                 "compute NaN (a checkpoint saved after training diverged, or a damaged file)")
            out[canon], source[canon] = t, f
        refuse_dropped(str(f), dropped, "no o_proj or MLP biases; unquantized weights")
    return out


def refuse_dropped(where: str, dropped: list[str], layout: str) -> None:
    """Refuse a file's layer tensors the loader has no place for (safetensors and GGUF names): the
    model would load and run without them. layout: what the supported layouts lack, for the message."""
    if dropped:
        raise ValueError(f"{where}: holds layer tensors minillm does not implement: {', '.join(dropped[:4])}"
                         + (f" (and {len(dropped) - 4} more)" if len(dropped) > 4 else "")
                         + "; the model would run without them. minillm supports the Llama, Qwen2 and Qwen3 "
                         f"layouts (q/k/v biases only; {layout})")


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
