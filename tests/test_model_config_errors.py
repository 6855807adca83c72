"""A model directory whose config.json (or shard index) is malformed is refused with a ValueError naming
the file and the field, never a KeyError / TypeError / ZeroDivisionError from deep inside the loader;
the CLIs turn it into one "error:" line and exit code 2. Also the CLIs' own startup failures and
engine arguments of the wrong kind."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_server import ROOT

from minillm.args import EngineArgs
from minillm.models.hf_loader import load_hf_dir

from hf_models import make_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny("llama", path)
    return path


def broken_copy(tiny: Path, tmp_path: Path, edit) -> Path:
    """A copy of the tiny model with config.json replaced by edit(its dict) (a str is written as is)."""
    out = tmp_path / "model"
    shutil.copytree(tiny, out)
    cfg = json.loads((out / "config.json").read_text())
    new = edit(cfg)
    (out / "config.json").write_text(new if isinstance(new, str) else json.dumps(new))
    return out


def drop(key):
    return lambda c: {k: v for k, v in c.items() if k != key}


def put(key, value):
    return lambda c: {**c, key: value}


@pytest.mark.parametrize("edit,words", [
    (lambda c: "[]", "must be a JSON object"),
    (lambda c: '{"architectures": ', "not valid JSON"),
    (drop("num_attention_heads"), "'num_attention_heads' is missing"),
    (drop("vocab_size"), "'vocab_size' is missing"),
    (put("num_attention_heads", 0), "'num_attention_heads' must be a positive integer"),
    (put("hidden_size", "64"), "'hidden_size' must be a positive integer"),
    (put("num_hidden_layers", 2.5), "'num_hidden_layers' must be a positive integer"),
    (put("num_key_value_heads", 3), "not a multiple of num_key_value_heads"),
    (lambda c: {**drop("head_dim")(c), "hidden_size": 66}, "not a multiple of num_attention_heads"),
    (put("architectures", "LlamaForCausalLM"), "'architectures' must be a list"),
    (put("rope_theta", "fast"), "'rope_theta' must be a positive number"),
    (put("rope_scaling", {"rope_type": "llama3", "factor": [2]}), "'factor' must be a positive number"),
    # values that used to load a silently wrong model (a string "false" is true; theta 0 became 10000)
    (put("tie_word_embeddings", "false"), "'tie_word_embeddings' must be true or false"),
    (put("attention_bias", "false"), "'attention_bias' must be true or false"),
    (put("rope_theta", 0), "'rope_theta' must be a positive number"),
    (put("rms_norm_eps", float("nan")), "'rms_norm_eps' must be a positive number, got NaN"),
    (put("rms_norm_eps", -1e-6), "'rms_norm_eps' must be a positive number"),
    (put("eos_token_id", "x"), "'eos_token_id' must be a token id or a list of token ids"),
    (put("eos_token_id", 2.5), "'eos_token_id' must be a token id"),
    (put("eos_token_id", [2, 256]), "below the vocabulary size 256"),
    # rope_scaling checked at load, not when the RoPE table is built
    (put("rope_scaling", {"rope_type": "yarn", "factor": 0}), "'factor' must be a positive number"),
    (put("rope_scaling", {"rope_type": "weird", "factor": 2.0}), 'rope_scaling type "weird" is not supported'),
    (put("rope_scaling", [1]), "'rope_scaling' must be an object"),
    (put("head_dim", 0), "'head_dim' must be a positive integer"),
    (put("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}),
     "high_freq_factor 4.0 must be greater than its low_freq_factor 4.0"),  # was a division by zero
    (put("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707}),
     "'mscale' and 'mscale_all_dim' (DeepSeek's yarn attention factor) are not supported"),
    (put("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "truncate": False}), "'truncate' false is not supported"),
    # a scaling without its factor ran as factor 1 (transformers refuses it)
    (put("rope_scaling", {"rope_type": "linear"}), "'factor' is missing"),
    (put("rope_scaling", {"rope_type": "yarn", "original_max_position_embeddings": 128}), "'factor' is missing"),
    # settings that change what the model computes, which used to load and be silently ignored
    (put("quantization_config", {"quant_method": "gptq", "bits": 4}),
     'a quantized checkpoint (quantization_config: quant_method "gptq")'),
    (put("hidden_act", "gelu"), '\'hidden_act\' "gelu" is not supported'),
    (put("mlp_bias", True), "'mlp_bias' true is not supported"),
    (put("partial_rotary_factor", 0.5), "'partial_rotary_factor' 0.5 is not supported"),
    (lambda c: {**c, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 16,
                "max_window_layers": 1}, "'use_sliding_window' is true (a window of 16 tokens in 1 of 2 layers)"),
    (lambda c: {**c, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 16,
                "layer_types": ["sliding_attention"] * 2}, "(a window of 16 tokens in 2 of 2 layers)"),
])
def test_malformed_config_is_a_value_error_naming_the_field(tiny, tmp_path, edit, words):
    path = broken_copy(tiny, tmp_path, edit)
    with pytest.raises(ValueError) as e:
        load_hf_dir(path)
    assert str(e.value).startswith(str(path / "config.json")) and words in str(e.value), e.value


def test_more_layers_of_tensors_than_the_config_says(tiny, tmp_path):
    path = broken_copy(tiny, tmp_path, put("num_hidden_layers", 1))
    with pytest.raises(ValueError, match=r"has tensors of layer\(s\) 1 but num_hidden_layers is 1") as e:
        load_hf_dir(path)
    assert str(path) in str(e.value)


def test_old_style_rope_scaling_type_is_honoured(tiny, tmp_path):
    """{"type": "linear"} (no "rope_type") used to be read as plain RoPE."""
    path = broken_copy(tiny, tmp_path, put("rope_scaling", {"type": "linear", "factor": 2.0}))
    rs = load_hf_dir(path)[0].rope_scaling
    assert (rs.kind, rs.factor) == ("linear", 2.0)


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    make_tiny("qwen2", path)
    return path


@pytest.mark.parametrize("model,edit", [
    ("qwen2", lambda c: {**c, "use_sliding_window": False, "sliding_window": 16}),
    # Qwen2.5's configs: the window is as long as the context, or only layers past the last one slide
    ("qwen2", lambda c: {**c, "use_sliding_window": True, "sliding_window": c["max_position_embeddings"],
                         "max_window_layers": 1}),
    ("qwen2", lambda c: {**c, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
    ("llama", lambda c: {**c, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}),
    ("llama", put("hidden_act", "silu")), ("llama", put("mlp_bias", False)),
    ("llama", put("partial_rotary_factor", 1.0)),
    ("llama", put("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0})),  # transformers ignores it
], ids=["window-off", "window-of-the-context", "no-sliding-layer", "llama-has-none", "silu", "no-mlp-bias",
        "full-rope", "mscale-alone"])
def test_settings_that_change_nothing_still_load(tiny, tiny_qwen2, tmp_path, model, edit):
    load_hf_dir(broken_copy(tiny if model == "llama" else tiny_qwen2, tmp_path, edit))


@pytest.mark.parametrize("scaling,top,want", [
    # transformers' default for a missing original_max_position_embeddings: the config's
    # max_position_embeddings (the tiny model's 2048), not Llama 3's 8192, which minillm used to take
    ({"rope_type": "yarn", "factor": 4.0}, {}, (4.0, 2048)),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, {}, (8.0, 2048)),
    ({"rope_type": "yarn", "factor": 4.0}, {"original_max_position_embeddings": 512}, (4.0, 512)),  # top-level
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, {}, (4.0, 1024)),
])
def test_rope_scaling_defaults_are_transformers(tiny, tmp_path, scaling, top, want):
    path = broken_copy(tiny, tmp_path, lambda c: {**c, "max_position_embeddings": 2048, "rope_scaling": scaling, **top})
    cfg = load_hf_dir(path)[0]
    assert cfg.max_position_embeddings == 2048
    assert (cfg.rope_scaling.factor, cfg.rope_scaling.original_max_position_embeddings) == want


def test_shard_index_without_weight_map(tiny, tmp_path):
    path = broken_copy(tiny, tmp_path, lambda c: c)
    (path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match="needs a 'weight_map' object"):
        load_hf_dir(path)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def one_error_line(r: subprocess.CompletedProcess, words: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], r.stderr


def test_clis_refuse_a_malformed_config_with_one_line(tiny, tmp_path):
    path = broken_copy(tiny, tmp_path, drop("intermediate_size"))
    one_error_line(cli("minillm.serve", str(path), "--device", "cpu", "--port", "0"), "'intermediate_size'")
    one_error_line(cli("minillm.generate", str(path), "--device", "cpu", "--prompt", "hi"), "'intermediate_size'")
    spec = json.dumps({"method": "draft_model", "model": str(path), "num_speculative_tokens": 2})
    one_error_line(cli("minillm.generate", str(tiny), "--device", "cpu", "--prompt", "hi", "--speculative-config",
                       spec), "'intermediate_size'")


def test_bench_throughput_refuses_an_empty_workload(tiny):
    one_error_line(cli("minillm.bench", "throughput", str(tiny), "--device", "cpu", "--num-seqs", "0"), "--num-seqs")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is here: device='cuda' may work")
def test_clis_say_no_gpu_in_one_line(tiny):
    for args in (("minillm.generate", str(tiny), "--prompt", "hi"),
                 ("minillm.bench", "throughput", str(tiny), "--num-seqs", "2")):
        one_error_line(cli(*args, "--device", "cuda"), "needs an NVIDIA GPU")


@pytest.mark.parametrize("kw,flag", [
    (dict(seed=1.5), "--seed"), (dict(max_num_seqs="4"), "--max-num-seqs"),
    (dict(max_model_len=64.5), "--max-model-len"),
    (dict(block_size=16.0), "--block-size"), (dict(num_blocks=True), "--num-blocks"),
    (dict(gpu_memory_utilization="0.5"), "--gpu-memory-utilization"),
])
def test_engine_args_of_the_wrong_kind_are_named(kw, flag):
    with pytest.raises(ValueError, match=f"{flag} must be"):
        EngineArgs(**kw)


@pytest.mark.parametrize("module, extra", [("minillm.serve", ()), ("minillm.generate", ("--prompt", "hi")),
                                           ("minillm.chat", ())])
def test_a_shortened_flag_is_not_taken_for_a_longer_one(module, extra):
    """argparse would read --max-num-seq as --max-num-seqs; a misspelt flag is refused instead, in one line
    (not argparse's usage block) that says where the flags are listed."""
    r = cli(module, "--device", "cpu", "--max-num-seq", "4", *extra)
    one_error_line(r, f"unrecognized arguments: --max-num-seq (python -m {module} --help lists the flags)")
    assert r.stderr.count("\n") == 1 and r.stdout == ""


def test_a_vocabulary_over_the_device_samplers_rows_is_refused_at_startup(tiny, monkeypatch):
    """The CUDA sampler's tiled draw takes rows of up to 1,048,576 ids (cuda/sampling.cu DRAW_TILE *
    DRAW_MAX_TILES, CudaBackend.max_sample_vocab): a model with more is refused when the engine starts,
    not at its first sampled step. No such model fits a test, so the limit is lowered on the NumPy
    backend, which has none of its own."""
    from minillm import LLM
    from minillm.backends.numpy_ops import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "max_sample_vocab", 255, raising=False)  # the tiny model has 256
    with pytest.raises(ValueError, match="handles vocabularies up to 255 ids; this model has 256: run it on the CPU"):
        LLM(str(tiny), device="cpu", max_model_len=64)
    monkeypatch.setattr(NumpyBackend, "max_sample_vocab", 256, raising=False)
    assert LLM(str(tiny), device="cpu", max_model_len=64).generate(["hi"])[0].token_ids
