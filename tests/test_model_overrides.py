"""Flags that override what a model directory says, as vLLM's do:

- --chat-template (LLM(chat_template=...)): a Jinja file or the template itself replaces the model's
  own for every chat, offline, in the generate CLI and in the server (its chat endpoint and /tokenize
  render the same ids); a value that is neither, or a template that does not compile, is refused at
  startup naming the flag.
- --generation-config: where requests' sampling defaults come from: the model's generation_config
  ("auto"), none ("vllm"), or another folder's generation_config.json.

Real parts: a random tiny model with a byte tokenizer, the NumPy backend, the real server.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from test_server import Server

from minillm import LLM, SamplingParams
from minillm.generate import main as generate_main
from minillm.models.tokenizer import read_chat_template

from hf_models import make_tiny

TEMPLATE = ("{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}"
            "{% if add_generation_prompt %}>{% endif %}")
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    path.write_text(TEMPLATE)
    return path


def test_read_a_file_or_the_template(template_file, tmp_path):
    assert read_chat_template(str(template_file)) == (TEMPLATE, f"--chat-template {template_file}")
    assert read_chat_template(TEMPLATE)[0] == TEMPLATE
    with pytest.raises(ValueError, match="no such file, and not a template"):
        read_chat_template(str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ValueError, match="the file is empty"):
        read_chat_template(str(tmp_path / "empty.jinja"))
    (tmp_path / "latin1.jinja").write_bytes(b"{{ caf\xe9 }}")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_chat_template(str(tmp_path / "latin1.jinja"))
    with pytest.raises(ValueError, match="a directory; give the path of a Jinja template file in it"):
        read_chat_template(str(tmp_path))


def test_read_a_template_from_a_pipe(tmp_path):
    """`--chat-template <(cat tpl.jinja)` passes /dev/fd/N, a pipe: it was "no such file" (only regular
    files were read)."""
    import os
    import threading

    fifo = tmp_path / "tpl.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TEMPLATE))
    writer.start()
    try:
        assert read_chat_template(str(fifo)) == (TEMPLATE, f"--chat-template {fifo}")
    finally:
        writer.join(timeout=10)


@pytest.mark.parametrize("inline", [False, True])
def test_offline_chat_renders_with_it(byte_llama, template_file, inline):
    llm = LLM(str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=2,
              chat_template=TEMPLATE if inline else str(template_file))
    out = llm.chat(MSGS, SamplingParams(max_tokens=2, temperature=0))[0]
    assert out.prompt_token_ids == llm.engine.tokenizer.encode("[user: hi]>", add_special_tokens=False)
    own = LLM(str(byte_llama), device="cpu", max_model_len=128, max_num_seqs=2)  # the model's template otherwise
    assert own.chat(MSGS, SamplingParams(max_tokens=2))[0].prompt_token_ids != out.prompt_token_ids


@pytest.mark.parametrize("value, match", [
    ("{% for m in messages %}", "--chat-template \\(the template given inline\\) does not compile"),
    ("chatml", "no such file, and not a template"),
    ("", "--chat-template must be"),
])
def test_bad_templates_are_refused_at_startup(byte_llama, value, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(byte_llama), device="cpu", max_model_len=128, chat_template=value)


def test_a_template_that_fails_every_chat_is_reported_at_startup(byte_llama, caplog):
    """It compiles, so it starts; the log says the template is at fault before any request blames its messages."""
    with caplog.at_level(logging.WARNING, logger="minillm"):
        LLM(str(byte_llama), device="cpu", max_model_len=128, chat_template="{{ raise_exception('no chats here') }}")
    warned = [r.getMessage() for r in caplog.records if "fails on a one-message" in r.getMessage()]
    assert len(warned) == 1 and "no chats here" in warned[0]
    assert "--chat-template (the template given inline)" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="minillm"):
        LLM(str(byte_llama), device="cpu", max_model_len=128, chat_template=TEMPLATE)
    assert not [r for r in caplog.records if "fails on a one-message" in r.getMessage()]


def test_the_cli_prints_one_error_line(byte_llama, capsys):
    assert generate_main([str(byte_llama), "--device", "cpu", "--chat", "--prompt", "hi",
                          "--chat-template", "{% if %}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --chat-template") and "does not compile" in err and err.count("\n") == 1


def test_server_chats_and_tokenizes_with_it(byte_llama, template_file, tmp_path):
    srv = Server(byte_llama, tmp_path / "server.log", "--served-model-name", "tiny", "--chat-template",
                 str(template_file))
    try:
        ids = httpx.post(f"{srv.url}/tokenize", json={"messages": MSGS}).json()["tokens"]
        r = srv.client().chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
        assert r.usage.prompt_tokens == len(ids) == len("[user: hi]>")  # the byte tokenizer: a token a byte
    finally:
        assert srv.stop() == 0, srv.text()


# ---- --generation-config -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greedy_dir(tmp_path_factory):
    """A tiny model whose generation_config asks for greedy decoding."""
    path = tmp_path_factory.mktemp("tiny-greedy")
    make_tiny("llama", path)
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 5, "eos_token_id": 2}))
    return path


def test_generation_config_auto_vllm_or_a_folder(greedy_dir, byte_llama, tmp_path):
    def defaults(path, **kw):
        return LLM(str(path), device="cpu", max_model_len=64, **kw).engine.generation_defaults

    assert defaults(greedy_dir) == {"temperature": 0.0, "top_k": 5}
    assert defaults(greedy_dir, generation_config="vllm") == {}
    other = tmp_path / "gen"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"top_p": 0.5, "max_length": 99}))
    assert defaults(byte_llama, generation_config=str(other)) == {"top_p": 0.5}
    with pytest.raises(ValueError, match="no generation_config.json there"):
        defaults(byte_llama, generation_config=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=f"a file; give the folder holding generation_config.json \\({other}\\)"):
        defaults(byte_llama, generation_config=str(other / "generation_config.json"))
    # a Path is a path, for the tokenizer as for the model
    assert LLM(byte_llama, tokenizer=Path(byte_llama), device="cpu", max_model_len=64).engine is not None
    (other / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    with pytest.raises(ValueError, match="generation_config.json: 'temperature'"):
        defaults(byte_llama, generation_config=str(other))


def test_override_generation_config(greedy_dir, byte_llama, capsys):
    """vLLM's --override-generation-config: merged over the model's defaults under auto, alone under
    vllm; a key other than the sampling ones, or a value a request could not take, is refused by name
    before any model loads; the CLI takes it as JSON."""
    def defaults(path, **kw):
        return LLM(str(path), device="cpu", max_model_len=64, **kw).engine.generation_defaults

    assert defaults(greedy_dir, override_generation_config={"temperature": 0.5, "min_p": 0.1}) == {
        "temperature": 0.5, "top_k": 5, "min_p": 0.1}
    assert defaults(greedy_dir, generation_config="vllm", override_generation_config='{"top_p": 0.9}') == {
        "top_p": 0.9}
    for bad, match in [({"max_tokens": 5}, r"unknown key\(s\) \['max_tokens'\]"),
                       ({"temperature": -1}, "--override-generation-config: 'temperature'"),
                       ("[1]", "must be a JSON object"), ("{temperature", "is not valid JSON")]:
        with pytest.raises(ValueError, match=match):
            LLM("/nonexistent/model", device="cpu", override_generation_config=bad)
    from minillm.generate import main

    assert main([str(byte_llama), "--device", "cpu", "--prompt", "hi", "--override-generation-config",
                 '{"top_k": "x"}']) == 2
    assert capsys.readouterr().err.startswith("error: --override-generation-config: 'top_k'")


def test_offline_defaults_follow_it(greedy_dir):
    """LLM.generate without sampling params takes get_default_sampling_params(), as vLLM's does."""
    llm = LLM(str(greedy_dir), device="cpu", max_model_len=64)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.top_p) == (0.0, 5, 1.0)
    greedy = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=16))[0].token_ids
    assert llm.generate(["hello"])[0].token_ids[:16] == greedy
    plain = LLM(str(greedy_dir), device="cpu", max_model_len=64, generation_config="vllm")
    assert plain.get_default_sampling_params().temperature == 1.0


def test_server_fills_requests_from_it(greedy_dir, tmp_path):
    """The model asks for greedy decoding: with auto, two requests that leave temperature out give
    the greedy tokens; with vllm they sample at temperature 1 (the seeds differ, so do the texts)."""
    def texts(srv):
        cl = srv.client()
        kw = dict(model="tiny", prompt="hello", max_tokens=24, extra_body={"ignore_eos": True})
        return [cl.completions.create(**kw).choices[0].text for _ in range(2)], \
            cl.completions.create(temperature=0, **kw).choices[0].text

    for mode in ("auto", "vllm"):
        srv = Server(greedy_dir, tmp_path / f"{mode}.log", "--served-model-name", "tiny", "--generation-config", mode)
        try:
            (a, b), greedy = texts(srv)
        finally:
            assert srv.stop() == 0, srv.text()
        if mode == "auto":
            assert a == b == greedy
        else:
            assert a != b
