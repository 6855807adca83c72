"""EngineArgs: values that parse but cannot mean anything are refused up front, naming the flag."""

from __future__ import annotations

import json
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


# ---- the server's own flags and environment ---------------------------------------------------


def serve_refusal(argv, capsys) -> str:
    """The one "error:" line parse_args exits 2 with."""
    from minillm.serve import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("key", ["secret ", " secret", "secret\n", "pässwort", "sec\tret", "secret\x7f"])
def test_api_key_no_client_could_send_is_refused(monkeypatch, key):
    """HTTP strips a header value's outer spaces and clients refuse (or the server misreads) non-ASCII
    bytes: such a key started a server that answered every request 401."""
    from minillm.serve import parse_args, server_flag_problem

    monkeypatch.delenv("MINILLM_API_KEY", raising=False)
    problem = server_flag_problem(parse_args(["--api-key", key]))
    assert problem and problem.startswith("--api-key (or $MINILLM_API_KEY) has spaces or a newline"), problem
    monkeypatch.setenv("MINILLM_API_KEY", key)  # a key read from a file keeps its newline
    assert server_flag_problem(parse_args([])) == problem
    for fine in ("sk-abc123", "two words", "~!@#$%^&*()"):
        assert server_flag_problem(parse_args(["--api-key", fine])) is None


@pytest.mark.parametrize("host", ["fd://3", "unix:/tmp/minillm.sock", "0.0.0.0:8080", "http://localhost",
                                  "127.0.0.1 ", "[::1", "::1]", "local host"])
def test_host_must_be_an_address_alone(host):
    """Hypercorn reads its own bind syntax into the host: 'fd://3' listened on every interface at a
    random port; a port or scheme in it only failed name resolution ("Name or service not known")."""
    from minillm.serve import parse_args, server_flag_problem

    problem = server_flag_problem(parse_args(["--host", host]))
    assert problem == (f"--host {host!r} is not an address or host name: give one alone, e.g. 127.0.0.1, 0.0.0.0, "
                       "::1 or localhost, without a scheme or a port (the port is --port)")


def test_host_addresses_and_names_pass():
    from minillm.serve import _hypercorn_config, parse_args, server_flag_problem

    for host in ("127.0.0.1", "0.0.0.0", "::", "::1", "[::1]", "fe80::1%lo", "localhost", "my-box.example"):
        assert server_flag_problem(parse_args(["--host", host])) is None, host
    assert _hypercorn_config("[::1]", 0).bind == _hypercorn_config("::1", 0).bind == ["[::1]:0"]


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e300", " "])
def test_step_delay_env_is_refused_before_the_model_loads(monkeypatch, capsys, value):
    """MINILLM_TEST_STEP_DELAY went to time.sleep in the engine thread: 'abc' was a traceback after the
    model loaded, and -1, nan or 1e300 killed the engine at the first request."""
    from minillm.serve import main

    monkeypatch.setenv("MINILLM_TEST_STEP_DELAY", value)
    # a missing model: had the variable not been checked first, the error would be about the model
    assert main(["/nonexistent/model", "--device", "cpu", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: MINILLM_TEST_STEP_DELAY={value!r}: give seconds from 0 to 3600"), err


def test_step_delay_env_accepts_seconds(monkeypatch):
    from minillm.serve import parse_args, server_flag_problem

    for value in ("", "0", "0.003", "30"):
        monkeypatch.setenv("MINILLM_TEST_STEP_DELAY", value)
        assert server_flag_problem(parse_args([])) is None, value


@pytest.mark.parametrize("origin, canonical", [
    ("http://localhost:3000/", "'http://localhost:3000'"),  # copied from the address bar
    ("http://localhost:3000/app", "'http://localhost:3000'"),
    ("HTTP://UI.Example", "'http://ui.example'"),
    ("https://ui.example:443", "'https://ui.example'"),
    ("localhost:3000", None), ("ui.example", None), ("http://[::1", None), ("http://u:p@ui.example", None),
])
def test_cors_origins_that_could_never_match_are_refused(capsys, origin, canonical):
    """A browser's Origin header is compared exactly: an origin with a path or a trailing slash, in capitals,
    with the default port or without a scheme silently never matched, and every page's call failed CORS."""
    err = serve_refusal(["--allowed-origins", json.dumps([origin])], capsys)
    assert err.startswith(f"error: argument --allowed-origins: {origin!r} "), err
    assert (f"a browser sends that page's origin as {canonical}" in err) if canonical else ("is not an origin" in err)


def test_cors_origins_as_browsers_send_them_pass():
    from minillm.serve import parse_args

    origins = ["*", "http://localhost:3000", "https://ui.example", "http://[::1]:8080", "chrome-extension://abc",
               "null"]
    assert parse_args(["--allowed-origins", json.dumps(origins)]).allowed_origins == origins


@pytest.mark.parametrize("flag", ["--allowed-methods", "--allowed-headers"])
def test_cors_companions_need_allowed_origins(capsys, flag):
    """Without --allowed-origins the server sends no CORS headers, so these did nothing, silently."""
    from minillm.serve import parse_args

    err = serve_refusal([flag, '["GET"]'], capsys)
    assert err.startswith(f"error: {flag} needs --allowed-origins"), err
    ns = parse_args(["--allowed-origins", '["http://ui.example"]', flag, '["GET"]'])
    assert getattr(ns, flag[2:].replace("-", "_")) == ["GET"]
    ns = parse_args([])
    assert (ns.allowed_origins, ns.allowed_methods, ns.allowed_headers) == (None, ["*"], ["*"])


def test_served_model_name_given_twice_keeps_every_name():
    """A second --served-model-name silently replaced the first's names (argparse's last one wins)."""
    from minillm.serve import parse_args

    ns = parse_args(["--served-model-name", "a", "--served-model-name", "b", "c"])
    assert ns.served_model_name == ["a", "b", "c"]
    assert parse_args(["--served-model-name", "a", "b"]).served_model_name == ["a", "b"]
    assert parse_args([]).served_model_name is None
