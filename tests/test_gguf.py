"""GGUF loader: the embedded SmolLM2 file (against transformers), every supported tensor type,
llama q/k un-permutation, qwen2/qwen3 tensor names, rope scaling, and the load errors.

Small files are written into tmp_path with gguf.GGUFWriter (tests/gguf_util.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFReader

from minillm.models.gguf_loader import SUPPORTED_TENSOR_TYPES, load_gguf
from minillm.models.loader import default_model_path

from gguf_util import (
    Q,
    converter_permute,
    random_weights,
    tiny_config,
    write_gguf,
    write_model,
)


@pytest.fixture(scope="module")
def smollm():
    return load_gguf(default_model_path())


def assert_same_weights(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert got[name].dtype == np.float32, name
        assert type(got[name]) is np.ndarray and got[name].flags.writeable, name  # not a view of the file
        assert got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


# ---- the embedded default model ----------------------------------------------------------------
def test_default_model_config(smollm):
    cfg, weights, tok, gen = smollm
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.head_dim, cfg.intermediate_size) == (49152, 64, 1536)
    assert cfg.tie_word_embeddings and "lm_head" not in weights
    assert not cfg.attention_bias and not cfg.qk_norm
    assert cfg.rms_norm_eps == 1e-5 and cfg.rope_theta == 100000.0
    assert cfg.rope_scaling.kind == "default" and cfg.max_position_embeddings == 8192
    assert cfg.eos_token_ids == [2] and cfg.bos_token_id == 1
    assert weights["embed"].shape == (49152, 576) and weights["layers.29.down"].shape == (576, 1536)
    assert all(w.dtype == np.float32 for w in weights.values())
    assert len(weights) == 2 + 30 * 9
    assert tok.vocab_size == 49152 and tok.eos_token_ids == [2] and tok.bos_token == "<|im_start|>"
    assert tok.chat_template.startswith("{% for message in messages %}")
    assert gen == {}


def test_default_model_weights_match_transformers(smollm):
    """transformers' own GGUF loader dequantises and un-permutes; every tensor must agree exactly."""
    from transformers import AutoModelForCausalLM

    from minillm.models.hf_loader import canonical_name

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    _, weights, _, _ = smollm
    seen = set()
    for hf_name, t in model.state_dict().items():
        name = canonical_name(hf_name)
        assert name is not None, hf_name
        if name == "lm_head":  # tied: transformers materialises it from the embedding
            name = "embed"
        np.testing.assert_array_equal(weights[name], t.float().numpy(), err_msg=hf_name)
        seen.add(name)
    assert seen == set(weights)


# ---- tensor types ------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", SUPPORTED_TENSOR_TYPES, ids=lambda q: q.name)
def test_tensor_type_dequantises_like_gguf(tmp_path, qtype):
    # qwen3: no q/k permutation, so each weight is exactly gguf.quants.dequantize of its bytes
    cfg = tiny_config("qwen3", num_layers=1)
    w = random_weights(cfg)
    path, expected = write_model(tmp_path / "m.gguf", cfg, w, qtype=qtype)
    stored = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    assert stored["blk.0.attn_q.weight"] == qtype and stored["token_embd.weight"] == qtype
    got = load_gguf(path)[1]
    assert_same_weights(got, expected)
    # and it is the matrix we wrote, not a transpose or a reshuffle (k-quants hold random blocks)
    if qtype not in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        tol = {Q.F32: 0, Q.F16: 1e-2, Q.BF16: 5e-2, Q.Q8_0: 0.1}.get(qtype, 1.0)
        np.testing.assert_allclose(got["layers.0.up"], w["layers.0.up"], atol=tol)
        assert np.corrcoef(got["layers.0.q"].ravel(), w["layers.0.q"].ravel())[0, 1] > 0.9


# ---- llama q/k permutation ---------------------------------------------------------------------
@pytest.mark.parametrize("qtype,bias", [(Q.F32, False), (Q.F32, True), (Q.Q8_0, False)],
                         ids=["f32", "f32-bias", "q8_0"])
def test_llama_qk_permutation_is_undone(tmp_path, qtype, bias):
    cfg = tiny_config("llama", attention_bias=bias)  # 4 heads, 2 kv heads: k uses the kv count
    w = random_weights(cfg)
    path, expected = write_model(tmp_path / "m.gguf", cfg, w, qtype=qtype)
    raw_q = next(t for t in GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    got = load_gguf(path)[1]
    assert_same_weights(got, expected)
    if qtype == Q.F32:  # HF weights back exactly, although the file holds permuted rows
        assert not np.array_equal(raw_q.data, w["layers.0.q"])
        for name in w:
            np.testing.assert_array_equal(got[name], w[name], err_msg=name)


def test_converter_permutation_turns_half_split_rope_into_interleaved():
    """Why undoing it is right: llama.cpp's adjacent-pair RoPE on permuted rows equals HF's
    half-split RoPE (what minillm implements) on the original rows, permuted the same way."""
    d, pos, theta = 8, 5, 10000.0
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(ang), np.sin(ang)

    def half_split(x):
        a, b = x[: d // 2], x[d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin])

    def interleaved(x):
        a, b = x[0::2], x[1::2]
        out = np.empty_like(x)
        out[0::2], out[1::2] = a * cos - b * sin, b * cos + a * sin
        return out

    x = np.random.default_rng(0).standard_normal(d)
    np.testing.assert_allclose(interleaved(converter_permute(x, 1)), converter_permute(half_split(x), 1))


# ---- qwen2 / qwen3 / tied ----------------------------------------------------------------------
def test_qwen2_biases(tmp_path):
    cfg = tiny_config("qwen2")
    w = random_weights(cfg)
    got_cfg, got, _, _ = load_gguf(write_model(tmp_path / "m.gguf", cfg, w)[0])
    assert got_cfg.arch == "qwen2" and got_cfg.attention_bias and not got_cfg.qk_norm
    assert {"layers.1.q_bias", "layers.1.k_bias", "layers.1.v_bias"} <= set(got)
    assert_same_weights(got, w)  # nothing permuted for qwen


def test_qwen3_qk_norm_and_head_dim_from_key_length(tmp_path):
    cfg = tiny_config("qwen3", head_dim=128)  # 4 x 128 != hidden 256: head_dim must come from metadata
    w = random_weights(cfg)
    got_cfg, got, _, _ = load_gguf(write_model(tmp_path / "m.gguf", cfg, w)[0])
    assert got_cfg.qk_norm and not got_cfg.attention_bias and got_cfg.head_dim == 128
    assert got["layers.0.q_norm"].shape == (128,) and got["layers.0.q"].shape == (512, 256)
    assert_same_weights(got, w)


def test_tied_embeddings_when_output_is_absent(tmp_path):
    cfg = tiny_config("llama", tie_word_embeddings=True)
    got_cfg, got, _, _ = load_gguf(write_model(tmp_path / "m.gguf", cfg, random_weights(cfg))[0])
    assert got_cfg.tie_word_embeddings and "lm_head" not in got
    untied = tiny_config("llama")
    got_cfg, got, _, _ = load_gguf(write_model(tmp_path / "u.gguf", untied, random_weights(untied))[0])
    assert not got_cfg.tie_word_embeddings and "lm_head" in got


# ---- rope scaling, generation defaults ----------------------------------------------------------
def llama3_factors(head_dim, theta, factor=8.0, low=1.0, high=4.0, old=8192):
    """The rope_freqs tensor llama.cpp's converter writes for rope_type llama3."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    from minillm.models.rope import inv_freq_and_scale

    cfg = tiny_config("llama", rope_theta=500000.0)
    factors = llama3_factors(64, 500000.0)
    assert ((factors > 1) & (factors < 8)).sum() == 3  # the smooth middle band is exercised too
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg),
                          extra_tensors={"rope_freqs.weight": factors})
    got = load_gguf(path)[0]
    rs = got.rope_scaling
    assert (rs.kind, rs.factor, rs.low_freq_factor, rs.high_freq_factor) == ("llama3", 8.0, 1.0, 4.0)
    assert rs.original_max_position_embeddings == 8192
    inv = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(inv_freq_and_scale(got)[0], inv / factors, rtol=1e-5)


def test_unknown_rope_freqs_are_refused(tmp_path):
    cfg = tiny_config("llama")
    factors = np.linspace(1, 3, 32).astype(np.float32)
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), extra_tensors={"rope_freqs.weight": factors})
    with pytest.raises(ValueError, match="rope_freqs") as e:
        load_gguf(path)
    assert str(path) in str(e.value)


def test_yarn_rope_scaling_and_sampling_defaults(tmp_path):
    cfg = tiny_config("qwen3")
    meta = {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
            "qwen3.rope.scaling.original_context_length": 32768,
            "general.sampling.temp": 0.6, "general.sampling.top_p": 0.95, "general.sampling.top_k": 20,
            "general.sampling.min_p": 0.05}
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), extra_metadata=meta)
    got_cfg, _, _, gen = load_gguf(path)
    rs = got_cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.original_max_position_embeddings) == ("yarn", 4.0, 32768)
    assert gen == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05}


def test_yarn_without_original_context_takes_the_training_context(tmp_path):
    """As llama.cpp does (n_ctx_orig_yarn = n_ctx_train): minillm used to take Llama 3's 8192."""
    cfg = tiny_config("qwen3")
    meta = {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0}
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), extra_metadata=meta)
    rs = load_gguf(path)[0].rope_scaling
    assert (rs.kind, rs.original_max_position_embeddings) == ("yarn", cfg.max_position_embeddings)


# ---- errors name the file and the item ------------------------------------------------------------
def load_error(path) -> str:
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    msg = str(e.value)
    assert str(path) in msg
    return msg


def test_unsupported_architecture(tmp_path):
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), arch="phi3")
    msg = load_error(path)
    assert "'phi3'" in msg and "llama, qwen2, qwen3" in msg


def test_unsupported_tensor_type(tmp_path):
    cfg = tiny_config("qwen3", num_layers=1)
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), qtype=Q.Q5_0)
    msg = load_error(path)
    assert "'token_embd.weight'" in msg and "Q5_0" in msg
    assert all(q.name in msg for q in SUPPORTED_TENSOR_TYPES)


def test_missing_tensor(tmp_path):
    cfg = tiny_config("qwen2")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), drop=("layers.1.k_bias",))
    msg = load_error(path)
    assert "'layers.1.k_bias'" in msg and "missing" in msg and "'blk.1.attn_k.bias'" in msg


@pytest.mark.parametrize("extra", [
    {"blk.0.attn_output.bias": np.ones(256, np.float32)},  # llama.cpp loads it for a llama; minillm has none
    {"blk.1.ffn_gate_inp.weight": np.ones((4, 256), np.float32)},  # a Mixtral, filed under "llama"
])
def test_layer_tensors_minillm_would_drop(tmp_path, extra):
    """They used to load, and the model ran without them."""
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), extra_tensors=extra)
    msg = load_error(path)
    assert msg.startswith(f"{path}: holds layer tensors minillm does not implement: {next(iter(extra))};"), msg


def test_shape_mismatch(tmp_path):
    cfg = tiny_config("llama")
    w = random_weights(cfg)
    w["layers.0.up"] = w["layers.0.up"][:128]
    msg = load_error(write_model(tmp_path / "m.gguf", cfg, w)[0])
    assert "'layers.0.up'" in msg and "(128, 256)" in msg and "(256, 256)" in msg
    assert "'blk.0.ffn_up.weight'" in msg


def test_missing_metadata_key(tmp_path):
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg),
                          extra_metadata={"llama.block_count": None})
    assert "'llama.block_count'" in load_error(path)


def test_unsupported_tokenizer_model(tmp_path):
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg),
                          extra_metadata={"tokenizer.ggml.model": "bert"})
    msg = load_error(path)
    assert "tokenizer.ggml.model" in msg and "'bert'" in msg and "gpt2, llama" in msg


def test_more_tokens_than_embedding_rows(tmp_path):
    cfg = tiny_config("llama", vocab_size=200)
    assert "271 tokens" in load_error(write_model(tmp_path / "m.gguf", cfg, random_weights(cfg))[0])


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    assert "not a GGUF file: it starts with b'not ', not GGUF's magic b'GGUF'" in load_error(path)


def test_metadata_string_that_is_not_utf8(tmp_path):
    """A damaged string value: gguf's own UnicodeDecodeError named neither the key nor the file."""
    cfg = tiny_config("llama")
    path, _ = write_model(tmp_path / "m.gguf", cfg, random_weights(cfg), extra_metadata={"general.name": "caf\u00e9"})
    data = path.read_bytes()
    assert data.count("caf\u00e9".encode()) == 1
    path.write_bytes(data.replace("caf\u00e9".encode(), b"caf\xe9!"))  # the same length: Latin-1, not UTF-8
    msg = load_error(path)
    assert str(path) in msg and "metadata 'general.name' is not valid UTF-8" in msg


def test_file_without_tokenizer(tmp_path):
    cfg = tiny_config("qwen3", num_layers=1)
    w = random_weights(cfg)
    from gguf_util import gguf_name, model_metadata

    path = write_gguf(tmp_path / "m.gguf", "qwen3", model_metadata(cfg),
                      {gguf_name(n): (a, None) for n, a in w.items()})
    assert "no tokenizer" in load_error(path)


def test_the_checked_reader_reads_what_the_library_reads():
    """open_gguf's reader (a plain array under the metadata, its own view per read) gives every field
    and tensor of the embedded GGUF as gguf's own GGUFReader does: the same parts, dtypes and bytes."""
    from minillm.models.gguf_loader import open_gguf

    path = default_model_path()
    ours, theirs = open_gguf(path, str(path)), GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields) and len(ours.fields) > 20
    for name, field in theirs.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data), name
        assert len(mine.parts) == len(field.parts), name
        for a, b in zip(mine.parts, field.parts):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.tensor_type, a.shape.tolist(), a.data_offset) == (b.tensor_type, b.shape.tolist(), b.data_offset)
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(tmp_path, qtype, bad):
    """Damaged bytes decode to NaN or infinite weights, which would run and give token 0 every step:
    the load names the tensor (in a quantised type, a block's scale carries it to the whole block)."""
    cfg = tiny_config()
    w = random_weights(cfg)
    w["layers.1.down"][3, 5] = bad
    with np.errstate(invalid="ignore"):  # (gguf's quantiser casting the NaN block)
        path, _ = write_model(tmp_path / "m.gguf", cfg, w, qtype=qtype)
    with pytest.raises(ValueError, match=r"tensor 'blk.1.ffn_down.weight' holds \d+ NaN or infinite values"):
        load_gguf(path)
