"""A model with a broken file beside config.json (tokenizer files, generation_config.json, safetensors)
or broken GGUF metadata is refused at load with a ValueError naming the file and the key or field: never
a bare Exception or TypeError from deep inside, a hang on a FIFO, or a model that loads silently wrong.
(config.json itself: test_model_config_errors.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_model_config_errors import ROOT, one_error_line

from minillm.chat import Chat
from minillm.models.gguf_loader import load_gguf
from minillm.models.hf_loader import load_hf_dir
from minillm.sampling_params import SamplingParams
from minillm.tools import random_model

from gguf_util import random_weights, tiny_config, write_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return random_model.write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def copy_of(tiny: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny, out)
    return out


def edit_json(path: Path, name: str, edit) -> Path:
    """path/name replaced by edit(its dict); a str or bytes result is written as is."""
    new = edit(json.loads((path / name).read_text()))
    if isinstance(new, bytes):
        (path / name).write_bytes(new)
    else:
        (path / name).write_text(new if isinstance(new, str) else json.dumps(new))
    return path


def refused(path: Path, file: str, *words: str) -> str:
    """load_hf_dir(path) raises a ValueError that starts with path/file and holds every word."""
    with pytest.raises(ValueError) as e:
        load_hf_dir(path)
    msg = str(e.value)
    assert msg.startswith(str(path / file)) and all(w in msg for w in words), msg
    return msg


def put(key, value):
    return lambda d: {**d, key: value}


def drop(key):
    return lambda d: {k: v for k, v in d.items() if k != key}


# ---- tokenizer.json, tokenizer_config.json, chat_template.jinja --------------------------------------
def test_sentencepiece_only_checkpoint_says_how_to_convert(tiny, tmp_path):
    path = copy_of(tiny, tmp_path)
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.model").write_bytes(b"\x0a\x00")
    with pytest.raises(FileNotFoundError) as e:
        load_hf_dir(path)
    assert "only a SentencePiece tokenizer.model" in str(e.value) and "save_pretrained" in str(e.value), e.value


def test_truncated_tokenizer_json(tiny, tmp_path):
    path = copy_of(tiny, tmp_path)
    text = (path / "tokenizer.json").read_text()
    (path / "tokenizer.json").write_text(text[: len(text) // 2])  # the tokenizers library: a bare Exception
    refused(path, "tokenizer.json", "not a valid tokenizer.json")


def test_tokenizer_json_with_an_empty_vocabulary(tiny, tmp_path):
    """It loaded, and every prompt was then refused as "the prompt is empty"."""
    import json

    path = copy_of(tiny, tmp_path)
    tj = json.loads((path / "tokenizer.json").read_text())
    tj["model"]["vocab"], tj["model"]["merges"], tj["added_tokens"] = {}, [], []
    (path / "tokenizer.json").write_text(json.dumps(tj))
    refused(path, "tokenizer.json", "empty vocabulary")


@pytest.mark.parametrize("edit,words", [
    (lambda c: "[1]", "must be a JSON object"),
    (lambda c: '{"chat_template": ', "not valid JSON"),
    (lambda c: b"\xff\xfe\x00garbage", "not valid JSON"),
    (put("chat_template", 5), "'chat_template' must be a string or a list"),
    (put("chat_template", {"a": 1}), "'chat_template' must be a string or a list"),
    (put("chat_template", ["x", "y"]), "'chat_template' must be a string or a list"),
    (put("bos_token", 5), "'bos_token' must be a string"),
    (put("eos_token", ["a"]), "'eos_token' must be a string"),
    (put("eos_token", {"content": 3}), "'eos_token' must be a string"),
    (put("add_bos_token", "false"), "'add_bos_token' must be true or false"),
    (put("add_eos_token", "false"), "'add_eos_token' must be true or false"),
])
def test_bad_tokenizer_config(tiny, tmp_path, edit, words):
    refused(edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", edit), "tokenizer_config.json", words)


def test_added_token_objects_and_named_templates_are_read(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", lambda c: {
        **c, "eos_token": {"content": "<|im_end|>", "special": True},
        "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})
    tok = load_hf_dir(path)[2]
    assert tok.eos_token == "<|im_end|>" and tok.chat_template == "D"


def test_chat_template_jinja_not_utf8(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", drop("chat_template"))
    (path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    refused(path, "chat_template.jinja", "not UTF-8")


# ---- generation_config.json --------------------------------------------------------------------------
@pytest.mark.parametrize("edit,words", [
    (put("temperature", "hot"), "'temperature': temperature must be a number"),
    (put("temperature", float("nan")), "'temperature'"),
    (put("temperature", -1), "'temperature'"),
    (put("top_p", [1]), "'top_p': top_p must be in (0, 1]"),
    (put("top_k", "x"), "'top_k': top_k must be an integer"),
    (put("min_p", "x"), "'min_p': min_p must be in [0, 1]"),
    (put("eos_token_id", 2.5), "'eos_token_id' must be a token id"),
    (put("eos_token_id", ["a"]), "'eos_token_id' must be a token id"),
    (put("eos_token_id", -1), "'eos_token_id' must be a token id"),
    (put("eos_token_id", 10**12), "'eos_token_id' must be a token id"),
])
def test_bad_generation_config(tiny, tmp_path, edit, words):
    path = edit_json(copy_of(tiny, tmp_path), "generation_config.json", edit)
    refused(path, "generation_config.json", words)


def test_null_sampling_default_means_unset(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "generation_config.json", put("temperature", None))
    assert "temperature" not in load_hf_dir(path)[3]


def test_chat_repl_reads_bad_defaults_without_a_traceback():
    """Defaults that bypassed the loaders' checks reach SamplingParams' ValueError (main prints it)."""
    engine = SimpleNamespace(generation_defaults={"top_p": [1], "temperature": None})
    ns = SimpleNamespace(system=None, max_tokens=8, temperature=None, top_p=None, top_k=None, min_p=None)
    chat = Chat(engine, ns)
    assert chat.sampling["temperature"] == 0.7
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(**chat.sampling)


# ---- safetensors ---------------------------------------------------------------------------------------
def read_st(path: Path) -> tuple[dict, bytes]:
    raw = (path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path: Path, header, data: bytes) -> Path:
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def first_tensor(header: dict) -> str:
    return min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def with_entry(**fields):
    """An edit of the first tensor's header entry: fields set (None: removed)."""
    def edit(h):
        e = {**h[first_tensor(h)], **fields}
        h[first_tensor(h)] = {k: v for k, v in e.items() if v is not None}
        return h
    return edit


def shifted(h):
    """The second tensor made to start 2 bytes into the first one (same length): they share bytes."""
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    begin, end = h[names[1]]["data_offsets"]
    h[names[1]]["data_offsets"] = [begin - 2, end - 2]
    return h


@pytest.mark.parametrize("edit,words", [
    (lambda h: [1, 2, 3], "the header is a JSON list"),
    (lambda h: {**h, "__metadata__": [1]}, "'__metadata__' must be an object"),
    (lambda h: {**h, first_tensor(h): [1, 2]}, "header entry must be an object"),
    (with_entry(data_offsets=None), "'data_offsets' must be [begin, end]"),
    (with_entry(data_offsets="0,10"), "'data_offsets' must be [begin, end]"),
    (with_entry(shape="64x64"), "'shape' must be a list of non-negative integers"),
    (with_entry(shape=[-1, 4]), "'shape' must be a list of non-negative integers"),
    (with_entry(data_offsets=[-100, 10]), "do not lie within"),
    (with_entry(dtype="F32"), "bytes, but shape"),  # bf16 bytes read as half as many float32s
    (shifted, "no gap or overlap"),
])
def test_bad_safetensors_header(tiny, tmp_path, edit, words):
    path = copy_of(tiny, tmp_path)
    header, data = read_st(path)
    refused(write_st(path, edit(header), data), "model.safetensors", words)


def test_truncated_safetensors(tiny, tmp_path):
    path = copy_of(tiny, tmp_path)
    raw = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(raw[:-1])
    refused(path, "model.safetensors", "do not lie within", "a truncated file?")


def test_safetensors_with_bytes_no_tensor_owns(tiny, tmp_path):
    path = copy_of(tiny, tmp_path)
    header, data = read_st(path)
    refused(write_st(path, header, data + b"\0" * 8), "model.safetensors", "bytes no tensor owns")


@pytest.mark.parametrize("bits,count", [
    (0x7FC0, 1), (0x7F80, 1), (0xFF80, 1), (0xFFC1, 3),  # bf16 NaN, +inf, -inf, a negative NaN (three times)
])
def test_non_finite_safetensors_weights(tiny, tmp_path, bits, count):
    """NaN or infinite weights (a checkpoint saved after training diverged) used to load and give token 0
    at every step; GGUF files were checked, safetensors were not."""
    path = copy_of(tiny, tmp_path)
    header, data = read_st(path)
    name = "model.layers.1.mlp.up_proj.weight"
    assert header[name]["dtype"] == "BF16"
    begin = header[name]["data_offsets"][0]
    data = bytearray(data)
    for k in range(count):
        data[begin + 2 * (7 + 50 * k): begin + 2 * (8 + 50 * k)] = struct.pack("<H", bits)
    write_st(path, header, bytes(data))
    refused(path, "model.safetensors", f"tensor {name!r} holds {count} NaN or infinite value(s)")


def test_non_finite_check_finds_every_float_dtype():
    """The bit test behind it, for each dtype safetensors stores floats in (bf16 through ml_dtypes)."""
    import ml_dtypes
    import numpy as np

    from minillm.models.hf_loader import count_non_finite

    for dtype in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        big = np.asarray([np.finfo(dtype).max, -np.finfo(dtype).max, 0, -0.0, 1e-3], dtype=dtype)
        assert count_non_finite(big) == 0, dtype
        for bad in (np.nan, np.inf, -np.inf, -np.nan):
            t = big.copy()
            t[2] = bad
            assert count_non_finite(t) == 1, (dtype, bad)


# ---- FIFOs must not hang the load ----------------------------------------------------------------------
def finishes(fn, timeout: float = 60):
    """fn()'s exception; fails (rather than hangs) when fn does not return within timeout."""
    box = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: B036  (handed to the test)
            box.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the load hung"
    return box[0] if box else None


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "generation_config.json", "model.safetensors"])
def test_fifo_in_a_model_directory_is_refused(tiny, tmp_path, name):
    path = copy_of(tiny, tmp_path)
    (path / name).unlink()
    os.mkfifo(path / name)
    e = finishes(lambda: load_hf_dir(path))
    assert isinstance(e, ValueError) and str(path / name) in str(e) and "not a regular file" in str(e), e


def test_fifo_gguf_is_refused(tmp_path):
    os.mkfifo(tmp_path / "m.gguf")
    e = finishes(lambda: load_gguf(tmp_path / "m.gguf"))
    assert isinstance(e, ValueError) and "not a regular file" in str(e), e


# ---- GGUF metadata -------------------------------------------------------------------------------------
@pytest.mark.parametrize("meta,words", [
    ({"llama.attention.head_count": 0}, "'llama.attention.head_count' must be a positive integer"),
    ({"llama.attention.head_count_kv": 0}, "'llama.attention.head_count_kv' must be a positive integer"),
    ({"llama.attention.head_count_kv": [2, 2]}, "'llama.attention.head_count_kv' must be a positive integer"),
    ({"llama.attention.head_count_kv": 3}, "llama.attention.head_count 4 is not a multiple of"),
    ({"llama.embedding_length": "x"}, "'llama.embedding_length' must be a positive integer"),
    ({"llama.block_count": 0}, "'llama.block_count' must be a positive integer"),
    ({"llama.block_count": 1}, "has tensors of layer(s) 1 but llama.block_count is 1"),
    ({"llama.context_length": 0}, "'llama.context_length' must be a positive integer"),
    ({"llama.rope.freq_base": 0.0}, "'llama.rope.freq_base' must be a positive number"),
    ({"llama.rope.freq_base": float("nan")}, "'llama.rope.freq_base' must be a positive number"),
    ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "'llama.attention.layer_norm_rms_epsilon' must be"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 0.0},
     "'llama.rope.scaling.factor' must be a positive number"),
    ({"tokenizer.ggml.add_bos_token": "false"}, "'tokenizer.ggml.add_bos_token' must be true or false"),
    ({"tokenizer.ggml.tokens": "abc"}, "'tokenizer.ggml.tokens' must be an array of strings"),
    ({"tokenizer.ggml.tokens": list(range(271))}, "'tokenizer.ggml.tokens' must be an array of strings"),
    ({"tokenizer.ggml.merges": "Ġ t"}, "'tokenizer.ggml.merges' must be an array of strings"),
    ({"tokenizer.ggml.merges": ["Ġ t", "zz qq"]}, "entry 'zz qq' names 'zz', which is not in tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.token_type": 3}, "'tokenizer.ggml.token_type' must be an array of 271 integers"),
    ({"tokenizer.ggml.pre": 3}, "'tokenizer.ggml.pre' must be a string"),
    ({"tokenizer.ggml.eos_token_id": [2, 0]}, "'tokenizer.ggml.eos_token_id' must be a token id"),
    ({"tokenizer.ggml.eos_token_id": 2.5}, "'tokenizer.ggml.eos_token_id' must be a token id"),
    ({"tokenizer.ggml.bos_token_id": "x"}, "'tokenizer.ggml.bos_token_id' must be a token id"),
    ({"tokenizer.chat_template": 5}, "'tokenizer.chat_template' must be a string"),
    ({"general.sampling.temp": "hot"}, "'general.sampling.temp': temperature must be"),
    ({"general.sampling.temp": float("nan")}, "'general.sampling.temp': temperature must be"),
    ({"general.sampling.top_p": 2.0}, "'general.sampling.top_p': top_p must be"),
    ({"general.sampling.top_k": "x"}, "'general.sampling.top_k': top_k must be"),
    ({"general.sampling.min_p": "x"}, "'general.sampling.min_p': min_p must be"),
])
def test_bad_gguf_metadata(tmp_path, meta, words):
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), extra_metadata=meta)
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    assert str(e.value).startswith(str(path)) and words in str(e.value), e.value


# ---- GGUF files cut short, or not GGUF at all -----------------------------------------------------------
@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path_factory.mktemp("gguf") / "m.gguf", cfg, random_weights(cfg))
    return path.read_bytes()


@pytest.mark.parametrize("cut", [2, 23])
def test_gguf_cut_inside_its_header(tmp_path, gguf_bytes, cut):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes[:cut])
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    assert str(e.value) == (f"{path}: the GGUF file is truncated: {cut} bytes, fewer than the 24 of its header; "
                            "the download or copy did not finish?")


@pytest.mark.parametrize("cut", [24, 100, 1000])
def test_gguf_cut_inside_its_metadata(tmp_path, gguf_bytes, cut):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes[:cut])
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: the GGUF file is truncated (or its metadata is corrupt): it is {cut} bytes but "
                          "its header and metadata read on to byte "), msg
    assert int(msg.split("read on to byte ")[1].split(";")[0]) > cut and "dtype" not in msg


@pytest.mark.parametrize("part", ["half", "all but one byte"])
def test_gguf_cut_inside_its_tensor_data(tmp_path, gguf_bytes, part):
    size = len(gguf_bytes) // 2 if part == "half" else len(gguf_bytes) - 1
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes[:size])
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    assert re.fullmatch(
        rf"{re.escape(str(path))}: the GGUF file is truncated: it is {size} bytes but its tensor data ends at byte "
        rf"{len(gguf_bytes)} \({len(gguf_bytes) - size} byte\(s\) missing; the cut is in tensor 'blk\.\d+\.\w+"
        r"\.weight'\); the download or copy did not finish\?", str(e.value)), e.value
    path.write_bytes(gguf_bytes)  # whole again: it loads
    load_gguf(path)


@pytest.mark.parametrize("data,words", [
    (b"", "the file is empty (0 bytes), not a GGUF model"),
    (b"PK\x03\x04" + b"\0" * 60, "not a GGUF file: it starts with b'PK\\x03\\x04', not GGUF's magic b'GGUF'"),
    (b"{}", "not a GGUF file: it starts with b'{}', not GGUF's magic b'GGUF'"),
], ids=["empty", "zip", "json"])
def test_not_gguf(tmp_path, data, words):
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    assert str(e.value) == f"{path}: {words}"


def test_a_cut_gguf_through_the_cli(tmp_path, gguf_bytes, capsys):
    from minillm.generate import main

    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes[:100])
    assert main([str(path), "--device", "cpu", "--prompt", "x"]) != 0
    err = capsys.readouterr().err
    assert "the GGUF file is truncated" in err and str(path) in err and "Traceback" not in err


# ---- the CLIs: one error line --------------------------------------------------------------------------
def test_clis_refuse_a_broken_tokenizer_with_one_line(tiny, tmp_path):
    path = copy_of(tiny, tmp_path)
    (path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    r = subprocess.run([sys.executable, "-m", "minillm.generate", str(path), "--device", "cpu", "--prompt", "hi"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_error_line(r, "not a valid tokenizer.json")


def test_chat_refuses_bad_sampling_defaults_with_one_line(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "generation_config.json", put("top_p", [1]))
    r = subprocess.run([sys.executable, "-m", "minillm.chat", str(path), "--device", "cpu"], input="hi\n",
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_error_line(r, "'top_p'")


# ---- --tokenizer (vLLM's flag): the tokenizer from another HF directory ----------------------------
def test_tokenizer_flag_supplies_a_checkpoint_without_one(tiny, tmp_path):
    """A checkpoint saved without tokenizer files: refused with a message that names --tokenizer;
    with --tokenizer naming the base model's directory it generates what the full directory does,
    chat template included."""
    from minillm import LLM
    from minillm.models.loader import load_model

    bare = copy_of(tiny, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        load_model(str(bare))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    chat = [{"role": "user", "content": "the quick brown fox"}]
    want = LLM(str(tiny), device="cpu", max_model_len=128)
    got = LLM(str(bare), device="cpu", max_model_len=128, tokenizer=str(tiny))
    text = ["the quick brown fox"]
    assert got.generate(text, params)[0].text == want.generate(text, params)[0].text
    assert got.chat(chat, params)[0].token_ids == want.chat(chat, params)[0].token_ids


def test_tokenizer_flag_on_a_gguf_and_its_refusals(tmp_path):
    """A GGUF file takes an HF tokenizer (its chat template too); a tokenizer with ids past the
    model's embedding, or a --tokenizer that is not a directory, is refused before any weight loads."""
    from minillm.models.loader import load_model

    from hf_models import write_byte_tokenizer

    cfg = tiny_config("llama")
    gguf, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg))
    byte_dir = tmp_path / "bytes"
    byte_dir.mkdir()
    write_byte_tokenizer(byte_dir)  # 256 tokens: within the GGUF's 271
    loaded = load_model(str(gguf), tokenizer=str(byte_dir))
    assert len(loaded.tokenizer.encode("hi", add_special_tokens=False)) == 2  # one token a byte
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "<user>hi\n<assistant>"
    big = random_model.write_random_model(tmp_path / "big", "tiny", seed=1)  # 4096 tokens
    with pytest.raises(ValueError, match="has id 4\\d{3}, but the model.s vocab_size is 271"):
        load_model(str(gguf), tokenizer=str(big))
    with pytest.raises(FileNotFoundError, match="--tokenizer .*not a directory"):
        load_model(str(gguf), tokenizer=str(tmp_path / "nowhere"))


def test_tokenizer_flag_on_the_command_line(tiny, tmp_path):
    """minillm.generate --tokenizer DIR; a bad one is one error line."""
    bare = copy_of(tiny, tmp_path)
    (bare / "tokenizer.json").unlink()
    r = subprocess.run([sys.executable, "-m", "minillm.generate", str(bare), "--device", "cpu", "--tokenizer",
                        str(tiny), "--prompt", "hello", "--max-tokens", "3", "--ignore-eos", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and '"finish_reason": "length"' in r.stdout, r.stderr
    one_error_line(subprocess.run([sys.executable, "-m", "minillm.generate", str(tiny), "--device", "cpu",
                                   "--tokenizer", str(tmp_path / "nowhere"), "--prompt", "hi"],
                                  cwd=ROOT, capture_output=True, text=True, timeout=120), "not a directory")


# ---- the model argument: a file inside the directory, a dangling or looping symlink ------------------
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_file_of_the_model_directory_names_the_directory(tiny, name):
    from minillm.models.loader import load_model

    with pytest.raises(ValueError) as e:
        load_model(str(tiny / name))
    assert str(e.value) == f"{tiny / name}: a file in an HF model directory; give the directory itself: {tiny}"


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_a_symlink_that_leads_nowhere(tmp_path, kind):
    from minillm.models.loader import load_model

    link = tmp_path / "model"
    link.symlink_to(link if kind == "loop" else tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match="a symbolic link that leads nowhere"):
        load_model(str(link))


def test_missing_lm_head_suggests_tie_word_embeddings(tiny, tmp_path):
    """A tied checkpoint (no lm_head.weight) under a config without tie_word_embeddings."""
    path = copy_of(tiny, tmp_path)
    header, data = read_st(path)
    begin, end = header.pop("lm_head.weight")["data_offsets"]
    for entry in header.values():  # the bytes after the removed tensor move down
        if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o - (end - begin) for o in entry["data_offsets"]]
    write_st(path, header, data[:begin] + data[end:])
    with pytest.raises(ValueError, match="tensor 'lm_head' is missing .*needs tie_word_embeddings true"):
        load_hf_dir(path)
