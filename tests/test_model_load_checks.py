"""Mismatches a model directory or GGUF file can carry that used to load and fail later, refused at load
with a ValueError naming the file and the entry: token ids past the embedding (tokenizer.json,
tokenizer_config.json, bos ids), a chat template that does not compile (found at the first chat request
before), and a shard index whose shard names leave the model directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_model_config_errors import ROOT, one_error_line
from test_model_file_errors import copy_of, edit_json, put, refused

from minillm.models.gguf_loader import load_gguf
from minillm.models.hf_loader import load_hf_dir
from minillm.tools import random_model

from gguf_util import random_weights, tiny_config, write_model

VOCAB = 4096  # the tiny preset's vocab_size; its tokenizer has 4003 ids (a padded embedding)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return random_model.write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def added_token(content: str, i: int) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


# ---- token ids past the embedding ---------------------------------------------------------------------
def test_a_padded_embedding_loads(tiny):
    """Fewer tokenizer ids than embedding rows is common (Qwen, 151,665 of 151,936) and fine."""
    cfg, _, tok, _ = load_hf_dir(tiny)
    assert tok.vocab_size == 4003 < cfg.vocab_size == VOCAB


def test_tokens_up_to_the_last_row_load(tiny, tmp_path):
    """Added tokens filling the embedding exactly: the largest id is vocab_size - 1."""
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer.json", lambda t: {
        **t, "added_tokens": t["added_tokens"] + [added_token(f"<x{i}>", i) for i in range(4003, VOCAB)]})
    tok = load_hf_dir(path)[2]
    assert tok.encode(f"a<x{VOCAB - 1}>")[-1] == VOCAB - 1


@pytest.mark.parametrize("edit,words", [
    # added tokens following the vocabulary one past the last embedding row
    (lambda t: {**t, "added_tokens": t["added_tokens"] + [added_token(f"<x{i}>", i) for i in range(4003, VOCAB + 1)]},
     f'"<x{VOCAB}>" has id {VOCAB}'),
    # an id the tokenizers library quietly renumbers (to 4003): the file's id is what the model was trained on
    (lambda t: {**t, "added_tokens": t["added_tokens"] + [added_token("<far>", 5000)]}, '"<far>" has id 5000'),
    # the same, in a file whose vocabulary comes first and holds a token spelled "added_tokens"
    (lambda t: {"model": {**t["model"], "vocab": {"added_tokens": 3999, **t["model"]["vocab"]}},
                **{k: v for k, v in t.items() if k != "model"},
                "added_tokens": t["added_tokens"] + [added_token("<far>", 5000)]}, '"<far>" has id 5000'),
    # the BPE vocabulary itself
    (lambda t: {**t, "model": {**t["model"], "vocab": {**t["model"]["vocab"], "zzz": VOCAB + 7}}},
     f'"zzz" has id {VOCAB + 7}'),
    # a post-processor adding a special token to every prompt
    (lambda t: {**t, "post_processor": {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [VOCAB], "tokens": ["<s>"]}}}},
     f'"<s>" has id {VOCAB}'),
])
def test_tokenizer_json_ids_past_the_embedding(tiny, tmp_path, edit, words):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer.json", edit)
    refused(path, "tokenizer.json", words, f"vocab_size is {VOCAB}")


def test_tokenizer_config_added_tokens_past_the_embedding(tiny, tmp_path):
    entry = {"content": "<late>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
             "special": True}
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json",
                     lambda c: {**c, "added_tokens_decoder": {**c["added_tokens_decoder"], "4100": entry}})
    refused(path, "tokenizer_config.json", '"<late>" has id 4100', f"vocab_size is {VOCAB}")


@pytest.mark.parametrize("decoder,words", [
    ([1, 2], "'added_tokens_decoder' must be an object"),
    ({"x": {"content": "a"}}, "'added_tokens_decoder' keys must be token ids"),
    ({"-1": {"content": "a"}}, "'added_tokens_decoder' keys must be token ids"),
])
def test_malformed_added_tokens_decoder(tiny, tmp_path, decoder, words):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", put("added_tokens_decoder", decoder))
    refused(path, "tokenizer_config.json", words)


@pytest.mark.parametrize("file", ["config.json", "generation_config.json"])
def test_bos_id_past_the_embedding(tiny, tmp_path, file):
    path = edit_json(copy_of(tiny, tmp_path), file, put("bos_token_id", VOCAB))
    refused(path, file, "'bos_token_id' must be a token id", f"below the vocabulary size {VOCAB}")


def test_cli_refuses_ids_past_the_embedding_in_one_line(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer.json", lambda t: {
        **t, "added_tokens": t["added_tokens"] + [added_token("<far>", 5000)]})
    r = subprocess.run([sys.executable, "-m", "minillm.generate", str(path), "--device", "cpu", "--prompt", "<far>"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_error_line(r, '"<far>" has id 5000')


# ---- chat templates that do not compile ----------------------------------------------------------------
BAD_TEMPLATE = "{% for m in messages %}\n{{ m.content }\n{% endfor %}"  # line 2: '}' closes nothing


def test_chat_template_syntax_error_in_tokenizer_config(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", put("chat_template", BAD_TEMPLATE))
    refused(path, "tokenizer_config.json", "'chat_template' does not compile", "line 2", "unexpected '}'")


def test_chat_template_syntax_error_in_a_named_template(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", put(
        "chat_template", [{"name": "default", "template": BAD_TEMPLATE}, {"name": "rag", "template": "ok"}]))
    refused(path, "tokenizer_config.json", "'chat_template' does not compile", "line 2")


def test_chat_template_syntax_error_in_chat_template_jinja(tiny, tmp_path):
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json",
                     lambda c: {k: v for k, v in c.items() if k != "chat_template"})
    (path / "chat_template.jinja").write_text("{% if messages %}hi")
    refused(path, "chat_template.jinja", "does not compile", "line 1", "endif")


def test_a_template_that_fails_only_when_rendered_still_loads(tiny, tmp_path):
    """raise_exception / an unknown variable are the template's own business at request time."""
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json",
                     put("chat_template", "{{ raise_exception('no system role') }}{{ nothing.here }}"))
    tok = load_hf_dir(path)[2]
    with pytest.raises(Exception, match="no system role"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_gguf_chat_template_syntax_error(tmp_path):
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg),
                          extra_metadata={"tokenizer.chat_template": BAD_TEMPLATE})
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: metadata 'tokenizer.chat_template' does not compile") and "line 2" in msg, msg


def test_cli_refuses_a_broken_template_in_one_line(tiny, tmp_path):
    """Even a plain completion: the server would otherwise start and fail every chat request."""
    path = edit_json(copy_of(tiny, tmp_path), "tokenizer_config.json", put("chat_template", BAD_TEMPLATE))
    r = subprocess.run([sys.executable, "-m", "minillm.generate", str(path), "--device", "cpu", "--prompt", "hi",
                        "--max-tokens", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_error_line(r, "'chat_template' does not compile")


# ---- shard index entries outside the model directory --------------------------------------------------
def with_index(path: Path, shard_for) -> Path:
    """path with a model.safetensors.index.json mapping every tensor to shard_for(its name)."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "np") as f:
        names = list(f.keys())
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard_for(n) for n in names}}))
    return path


def test_a_shard_in_a_subfolder_loads(tiny, tmp_path):
    path = with_index(copy_of(tiny, tmp_path), lambda n: "shards/model.safetensors")
    (path / "shards").mkdir()
    (path / "model.safetensors").rename(path / "shards" / "model.safetensors")
    assert "embed" in load_hf_dir(path)[1]


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_shard_names_outside_the_model_directory_are_refused(tiny, tmp_path, where):
    """Both used to load: the weights came from a file beside (or anywhere above) the directory."""
    path = copy_of(tiny, tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(path / "model.safetensors", outside)
    shard = "../elsewhere.safetensors" if where == "parent" else str(outside)
    first = [True]

    def shard_for(name):  # only one entry points outside; the message names it
        if first[0]:
            first[0] = False
            return shard
        return "model.safetensors"
    with_index(path, shard_for)
    refused(path, "model.safetensors.index.json", repr(shard), "outside the model directory")


def test_layer_tensors_the_config_does_not_use_are_refused(tiny, tmp_path):
    """A Qwen3 checkpoint (q/k norms) under a Llama config: the norms would be dropped and the model
    run without them, so the load names them and the disagreement."""
    path = edit_json(copy_of(tiny, tmp_path), "config.json",
                     lambda c: {**c, "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    with pytest.raises(ValueError) as e:
        load_hf_dir(path)
    msg = str(e.value)
    assert msg.startswith(str(path)) and "k_norm, q_norm" in msg and "'llama'" in msg, msg
    assert "the weights and the config disagree" in msg


# ---- tensors the loader would drop or misread ---------------------------------------------------------
def add_tensor(path: Path, name: str, dtype: str, shape: list[int], data: bytes) -> Path:
    """path's model.safetensors with one more tensor appended."""
    from test_model_file_errors import read_st, write_st

    header, blob = read_st(path)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
    return write_st(path, header, blob + data)


@pytest.mark.parametrize("name,shape", [
    ("model.layers.0.self_attn.o_proj.bias", [64]),  # a Llama with attention_bias: o_proj has one too
    ("model.layers.1.mlp.down_proj.bias", [64]),  # mlp_bias
    ("model.layers.0.self_attn.q_proj.scales", [4]),  # a quantized checkpoint's
])
def test_layer_tensors_minillm_would_drop_are_refused(tiny, tmp_path, name, shape):
    """They used to load, and the model ran without them."""
    import math

    path = add_tensor(copy_of(tiny, tmp_path), name, "BF16", shape, b"\x80\x3f" * math.prod(shape))
    refused(path, "model.safetensors", f"holds layer tensors minillm does not implement: {name}",
            "the model would run without them")


def test_rotary_inv_freq_buffers_are_ignored(tiny, tmp_path):
    """Older Llama checkpoints saved RoPE's inv_freq buffer with the weights: harmless, still loads."""
    path = add_tensor(copy_of(tiny, tmp_path), "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", [8],
                      b"\0" * 32)
    assert "layers.0.q" in load_hf_dir(path)[1]


def test_integer_weights_are_refused(tiny, tmp_path):
    """A weight stored as I16 (the same bytes as its bf16) used to load as integers."""
    from test_model_file_errors import read_st, write_st

    path = copy_of(tiny, tmp_path)
    header, blob = read_st(path)
    header["model.norm.weight"]["dtype"] = "I16"
    refused(write_st(path, header, blob), "model.safetensors",
            "tensor 'model.norm.weight' has dtype int16, not a float")


def test_a_weight_in_two_files_is_refused(tiny, tmp_path):
    """Without an index every *.safetensors is read: a leftover copy used to win silently (the later file)."""
    path = copy_of(tiny, tmp_path)
    shutil.copy(path / "model.safetensors", path / "consolidated.safetensors")
    with pytest.raises(ValueError) as e:
        load_hf_dir(path)
    msg = str(e.value)
    assert msg.startswith(str(path / "model.safetensors")) and "is also in" in msg, msg
    assert str(path / "consolidated.safetensors") in msg and "must hold each weight once" in msg, msg
