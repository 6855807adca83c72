"""EngineArgs: values that parse but cannot mean anything are refused up front, naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from minillm.args import EngineArgs


@pytest.mark.parametrize("model", ["", 5, b"model.gguf"])
def test_model_must_be_a_non_empty_path(model):
    with pytest.raises(ValueError, match="the model must be a non-empty path"):
        EngineArgs(model=model)


def test_model_paths_and_the_default_pass():
    for model in (None, "smollm2-135m-instruct", "dir", Path("model.gguf")):
        EngineArgs(model=model)


@pytest.mark.parametrize("name", ["max_num_seqs", "max_model_len", "max_num_batched_tokens", "num_blocks"])
@pytest.mark.parametrize("value", [2**31, 2**63, 10**20])
def test_sizes_past_int32_name_the_flag(name, value):
    with pytest.raises(ValueError, match=f"--{name.replace('_', '-')} must be below 2\\*\\*31"):
        EngineArgs(**{name: value})


@pytest.mark.parametrize("name", ["enable_prefix_caching", "enforce_eager", "async_scheduling"])
@pytest.mark.parametrize("value", ["false", "no", 0, 1])
def test_switches_must_be_bools(name, value):
    """LLM(enforce_eager="false") must not turn eager mode on because the string is truthy."""
    with pytest.raises(ValueError, match=f"{name} must be True or False"):
        EngineArgs(**{name: value})


def test_switches_accept_bools_and_async_none():
    EngineArgs(enable_prefix_caching=False, enforce_eager=True, async_scheduling=None)
    EngineArgs(async_scheduling=False)
    with pytest.raises(ValueError, match="enable_prefix_caching must be True or False, got None"):
        EngineArgs(enable_prefix_caching=None)


def test_empty_model_on_the_command_line(capsys):
    from minillm.generate import main

    assert main(["", "--device", "cpu", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the model must be a non-empty path") and err.count("\n") == 1


@pytest.mark.parametrize("argv, model", [([], None), (["m.gguf"], "m.gguf"), (["--model", "m.gguf"], "m.gguf"),
                                         (["--port", "0", "--model", "dir"], "dir")])
def test_model_as_positional_or_flag(argv, model):
    """vLLM's older entry point spells the model --model; both spellings reach EngineArgs."""
    from minillm.serve import parse_args

    ns = parse_args(argv)
    assert ns.model == model and EngineArgs.from_cli(ns).model == model


def test_model_given_twice_is_refused_in_one_line(capsys):
    """Both spellings with different models: argparse would keep whichever came last, silently."""
    from minillm.serve import parse_args

    for argv in (["/nonexistent", "--model", "tiny"], ["--model", "tiny", "/nonexistent"]):
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1
        assert "the model is given twice: '/nonexistent' as MODEL and 'tiny' as --model" in err
    assert parse_args(["m.gguf", "--model", "m.gguf"]).model == "m.gguf"  # the same one twice is one model


def test_vllm_parallelism_and_remote_code_flags():
    """vLLM's usual command lines and LLM(...) calls carry -tp 1 and --trust-remote-code: taken; a
    parallel size above 1 (one GPU here) is refused by name rather than run on one GPU."""
    from minillm.serve import parse_args

    ns = parse_args(["m.gguf", "-tp", "1", "--pipeline-parallel-size", "1", "--trust-remote-code"])
    args = EngineArgs.from_cli(ns)
    assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.trust_remote_code) == (1, 1, True)
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        with pytest.raises(ValueError, match=f"--{name.replace('_', '-')} 2: minillm runs a model on one GPU"):
            EngineArgs(**{name: 2})
        with pytest.raises(ValueError, match=f"--{name.replace('_', '-')} must be an integer"):
            EngineArgs(**{name: "2"})
    with pytest.raises(ValueError, match="trust_remote_code must be True or False"):
        EngineArgs(trust_remote_code="yes")


def test_vllm_flags_for_what_minillm_does_one_way():
    """--enable-chunked-prefill, --kv-cache-dtype auto, --quantization gguf (with a .gguf model) and
    --uvicorn-log-level are taken from vLLM command lines; what minillm cannot do is refused by name."""
    from minillm.serve import parse_args

    ns = parse_args(["m.gguf", "--enable-chunked-prefill", "--kv-cache-dtype", "auto", "-q", "gguf",
                     "--uvicorn-log-level", "warning"])
    args = EngineArgs.from_cli(ns)
    assert (args.enable_chunked_prefill, args.kv_cache_dtype, args.quantization) == (True, "auto", "gguf")
    assert ns.log_level == "warning"
    assert EngineArgs(quantization="gguf").quantization == "gguf"  # the embedded default model is a GGUF file
    for kw, message in ((dict(enable_chunked_prefill=False), "--no-enable-chunked-prefill: minillm always splits"),
                        (dict(kv_cache_dtype="fp8"), "--kv-cache-dtype fp8: the KV cache is kept in the compute"),
                        (dict(quantization="awq"), "--quantization awq: minillm runs a checkpoint's float weights"),
                        (dict(model="dir", quantization="gguf"), "--quantization gguf")):
        with pytest.raises(ValueError, match=message):
            EngineArgs(**kw)


def test_tensor_parallel_above_one_fails_the_cli_in_one_line(capsys):
    from minillm.generate import main

    assert main(["--device", "cpu", "--prompt", "hi", "--tensor-parallel-size", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tensor-parallel-size 4: minillm runs a model on one GPU") and err.count("\n") == 1


FLAG_ERRORS = [
    (dict(speculative_config={"method": "nope"}), "method must be one of"),
    (dict(speculative_config={"method": "draft_model", "num_speculative_tokens": 2, "model": "/nonexistent/drafter"}),
     "--speculative-config \"model\" \\(the drafter\\): model '/nonexistent/drafter': no such file"),
    (dict(max_num_batched_tokens=4, max_num_seqs=8), "--max-num-batched-tokens 4 is below"),
    (dict(generation_config="/nonexistent"), "no generation_config.json there"),
    (dict(override_generation_config={"bogus": 1}), "unknown key"),
    (dict(chat_template="{% for m in messages %}"), "does not compile"),
    (dict(tokenizer="/nonexistent"), "--tokenizer '/nonexistent': not a directory"),
    (dict(device="cpu", dtype="float16"), "dtype"),
    (dict(device="cuda"), "needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("kw, message", FLAG_ERRORS, ids=[str(i) for i in range(len(FLAG_ERRORS))])
def test_flag_errors_come_before_the_weights_load(monkeypatch, kw, message):
    """What the flags alone decide is refused before the model loads (minutes for a large one)."""
    from conftest import cuda_available

    import minillm.engine.engine as engine_module

    if kw.get("device") == "cuda" and cuda_available():
        pytest.skip("a GPU is here: --device cuda is no error")

    def no_load(*_, **__):
        raise AssertionError("the weights were loaded before the flags were checked")

    monkeypatch.setattr(engine_module, "load_model", no_load)
    with pytest.raises((ValueError, RuntimeError, OSError), match=message):
        engine_module.LLMEngine(EngineArgs(**kw))


def test_default_token_budget_follows_the_backend(tiny):
    """Without --max-num-batched-tokens a CPU step computes at most 256 tokens (a prompt's chunk holds every
    other stream for the whole NumPy step), or one full decode step when that is more; a given budget is kept."""
    from minillm.engine.engine import LLMEngine

    def budget(**kw):
        return LLMEngine(model=str(tiny), device="cpu", max_model_len=128, **kw).max_num_batched_tokens

    assert budget() == 256
    assert budget(max_num_seqs=600) == 600
    assert budget(max_num_seqs=100, speculative_config={"method": "ngram", "num_speculative_tokens": 7}) == 800
    assert budget(max_num_batched_tokens=4096) == 4096
