"""minillm.tools.random_model: the tiny preset loads in minillm and transformers alike, is a pure
function of the seed, shards like HF, and its DFlash drafter loads in the dflash package."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy: safe_open(framework="numpy") needs it
import numpy as np
import pytest
from safetensors import safe_open

from minillm.models.hf_loader import load_hf_dir
from minillm.tools import random_model as rm


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return rm.write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def test_tiny_loads_in_minillm_with_the_preset_shapes(tiny):
    cfg, weights, tok, gen = load_hf_dir(tiny)
    p = rm.PRESETS["tiny"]
    assert (cfg.arch, cfg.hidden_size, cfg.num_layers) == ("qwen3", p["hidden_size"], p["num_hidden_layers"])
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.qk_norm and not cfg.tie_word_embeddings and cfg.torch_dtype == "bfloat16"
    im_end = tok.tok.token_to_id("<|im_end|>")
    assert cfg.eos_token_ids[0] == im_end and tok.eos_token == "<|im_end|>"
    assert tok.vocab_size <= cfg.vocab_size
    assert {tok.tok.token_to_id(t) for t in rm.SPECIAL_TOKENS} == tok.special_token_ids
    # N(0, 0.02) matrices, unit norms: what keeps activations sane
    embed = weights["embed"].astype(np.float32)  # the loader keeps the stored bf16
    assert weights["embed"].dtype.name == "bfloat16"
    assert abs(embed.std() - 0.02) < 0.001 and abs(embed.mean()) < 0.001
    assert np.all(weights["layers.1.q_norm"] == 1.0) and np.all(weights["norm"] == 1.0)
    text = "Hello world, the model token server 12345 café"
    assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert gen["eos_token_id"][0] == im_end


def test_tiny_loads_in_transformers_and_configs_agree(tiny):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg, _, tok, _ = load_hf_dir(tiny)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    hf = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads,
            hf.head_dim, hf.intermediate_size, hf.vocab_size, hf.tie_word_embeddings) == (
        cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
        cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings)
    assert hf.rms_norm_eps == cfg.rms_norm_eps
    ids = tok.encode("the model token server")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg.vocab_size)
    assert torch.isfinite(logits).all() and 0.01 < logits.std().item() < 10
    hf_tok = transformers.AutoTokenizer.from_pretrained(tiny)
    assert hf_tok("the model token server")["input_ids"] == ids
    assert hf_tok.eos_token == "<|im_end|>"


def test_same_seed_same_bytes_other_seed_other_weights(tiny, tmp_path):
    again = rm.write_random_model(tmp_path / "again", "tiny", seed=0, workers=1)  # thread count is free
    other = rm.write_random_model(tmp_path / "other", "tiny", seed=1)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_refuses_to_overwrite_without_force(tiny):
    with pytest.raises(FileExistsError, match="--force"):
        rm.write_random_model(tiny, "tiny")


def test_sharded_output_loads_everywhere(tmp_path, monkeypatch):
    monkeypatch.setattr(rm, "SHARD_BYTES", 200_000)  # force several shards on the tiny preset
    out = rm.write_random_model(tmp_path / "sharded", "tiny", seed=0)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    for f in shards:
        with safe_open(str(out / f), framework="numpy") as st:
            assert all(index["weight_map"][k] == f for k in st.keys())
    assert index["metadata"]["total_size"] == sum(
        2 * int(np.prod(shape)) for _, shape, _ in rm.qwen3_tensor_specs(json.loads((out / "config.json").read_text())))
    _, weights, _, _ = load_hf_dir(out)
    assert "lm_head" in weights
    transformers = pytest.importorskip("transformers")
    transformers.AutoModelForCausalLM.from_pretrained(out)


def test_qwen3_tokenizer_fills_the_vocab_with_qwen3_special_ids():
    tok = rm.build_tokenizer(rm.PRESETS["qwen3-8b"]["tokenizer_bpe_vocab"])
    assert [tok.token_to_id(t) for t in rm.SPECIAL_TOKENS] == [151643, 151644, 151645]
    assert tok.get_vocab_size() == 151646 <= rm.PRESETS["qwen3-8b"]["vocab_size"]
    # every ordinary id decodes to text, so a random model's output streams as text
    rng = np.random.default_rng(0)
    assert all(tok.decode([int(i)]) for i in rng.integers(4000, 151643, 200))


def test_preset_configs_match_the_real_qwen3_shapes():
    eot, im_end = 151643, 151645
    small, big = rm.qwen3_config("qwen3-0.6b", eot, im_end), rm.qwen3_config("qwen3-8b", eot, im_end)
    assert (small["hidden_size"], small["num_hidden_layers"], small["num_attention_heads"],
            small["num_key_value_heads"], small["head_dim"], small["intermediate_size"],
            small["vocab_size"], small["tie_word_embeddings"], small["rope_theta"],
            small["max_position_embeddings"]) == (1024, 28, 16, 8, 128, 3072, 151936, True, 1e6, 40960)
    assert (big["hidden_size"], big["num_hidden_layers"], big["num_attention_heads"],
            big["num_key_value_heads"], big["intermediate_size"], big["tie_word_embeddings"]) == (
        4096, 36, 32, 8, 12288, False)
    n_params = sum(int(np.prod(s)) for _, s, _ in rm.qwen3_tensor_specs(big))
    assert 8.1e9 < n_params < 8.3e9  # Qwen3-8B: 8.19B parameters
    assert len(rm._shard(rm.qwen3_tensor_specs(big))) == 5  # ~4 GB shards, like the real checkpoint
    with pytest.raises(ValueError, match="qwen3-0.6b"):
        rm.qwen3_config("qwen3-1b", eot, im_end)


def test_dflash_target_layers():
    assert rm.dflash_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # as z-lab's Qwen3-8B drafter
    assert rm.dflash_target_layer_ids(2, 5) == [0, 1]
    assert rm.dflash_target_layer_ids(28, 1) == [14]


def test_dflash_drafter_loads_in_the_dflash_package(tiny, tmp_path):
    torch = pytest.importorskip("torch")
    dflash = pytest.importorskip("dflash.model")
    transformers = pytest.importorskip("transformers")
    out = rm.write_dflash_drafter(tmp_path / "drafter", tiny, seed=0)
    cfg = json.loads((out / "config.json").read_text())
    target_cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 5 and cfg["dflash_config"]["block_size"] == 16
    assert cfg["num_target_layers"] == target_cfg["num_hidden_layers"]
    assert cfg["hidden_size"] == target_cfg["hidden_size"]
    mask = cfg["dflash_config"]["mask_token_id"]
    assert load_hf_dir(tiny)[2].vocab_size == mask < target_cfg["vocab_size"]
    drafter, info = dflash.DFlashDraftModel.from_pretrained(out, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert drafter.block_size == 16 and drafter.mask_token_id == mask
    # drafting is lossless: greedy output with the drafter equals plain greedy generation
    target = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    ids = torch.tensor([[39, 68, 322, 78, 600, 11, 259]])
    spec = dflash.dflash_generate(drafter, target, ids, max_new_tokens=24, stop_token_ids=None)
    plain = target.generate(ids, max_new_tokens=24, do_sample=False)
    assert spec.tolist() == plain.tolist()


def test_dflash2_drafter_loads_in_the_dflash_package(tiny, tmp_path, capsys):
    """--dflash2: a DFlash2DraftModel checkpoint with every tensor the package reads, under its
    names (the codebooks without ".weight"); without --dflash-for the flag is refused."""
    torch = pytest.importorskip("torch")
    dflash = pytest.importorskip("dflash.model")
    assert rm.main(["--dflash-for", str(tiny), str(tmp_path / "d2"), "--dflash2", "--num-layers", "2"]) == 0
    cfg = json.loads((tmp_path / "d2" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert {k: cfg["dflash_config"][k] for k in rm.DFLASH2_DEFAULTS} == {
        **rm.DFLASH2_DEFAULTS, "conv_group_size": min(128, cfg["hidden_size"])}
    drafter, info = dflash.DFlash2DraftModel.from_pretrained(tmp_path / "d2", output_loading_info=True,
                                                             dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert drafter.candidate_selector.top_k == rm.DFLASH2_DEFAULTS["selector_top_k"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        rm.main(["--preset", "tiny", str(tmp_path / "m"), "--dflash2"])
    assert "--dflash2 writes a drafter" in capsys.readouterr().err


def test_cli(tmp_path, capsys):
    assert rm.main(["--preset", "tiny", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert rm.main([str(tmp_path / "m"), "--preset", "tiny"]) == 2  # exists, no --force
    assert "--force" in capsys.readouterr().err
    assert rm.main(["--dflash-for", str(tmp_path / "nothing"), str(tmp_path / "d")]) == 2
    assert "config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rm.main([str(tmp_path / "x")])  # neither --preset nor --dflash-for


def test_num_layers_keeps_the_widths(tmp_path, capsys):
    """--num-layers: the preset's widths with another layer count, loaded as such; a DFlash drafter
    for the shallow target picks its layers among those; fewer than one layer is refused."""
    out = tmp_path / "shallow"
    assert rm.main(["--preset", "tiny", str(out), "--num-layers", "3"]) == 0
    cfg, weights, _, _ = load_hf_dir(out)
    assert cfg.num_layers == 3 and cfg.hidden_size == rm.PRESETS["tiny"]["hidden_size"]
    assert "layers.2.q_norm" in weights and "layers.3.q_norm" not in weights
    assert json.loads((out / "config.json").read_text())["max_window_layers"] == 3
    drafter = rm.write_dflash_drafter(tmp_path / "d", out)
    ids = json.loads((drafter / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert ids and all(0 <= i < 3 for i in ids)
    # with --dflash-for, the drafter's own layer count (it used to be ignored: always 5)
    assert rm.main(["--dflash-for", str(out), str(tmp_path / "d2"), "--num-layers", "2"]) == 0
    assert json.loads((tmp_path / "d2" / "config.json").read_text())["num_hidden_layers"] == 2
    capsys.readouterr()
    assert rm.main(["--preset", "tiny", str(tmp_path / "none"), "--num-layers", "0"]) == 2
    assert "--num-layers must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--preset", "tiny", ""], "OUT_DIR is empty"),  # used to write the model into the current directory
    (["--preset", "tiny", "OUT", "--seed", "-1"], "--seed must be >= 0"),  # numpy's error, after a partial write
    (["--preset", "tiny", "OUT", "--workers", "-1"], "--workers must be 1 to 256"),
    (["--preset", "tiny", "OUT", "--workers", "0"], "--workers must be 1 to 256"),  # silently the CPU count
    (["--preset", "tiny", "OUT", "--workers", "100000"], "--workers must be 1 to 256"),  # ~3 TB of chunks queued
    (["--dflash-for", "TARGET", "OUT", "--num-layers", "0"], "--num-layers must be at least 1"),
    (["--dflash-for", "", "OUT"], "--dflash-for is empty"),
    (["--dflash-for", "GGUF", "OUT"], "not a directory"),  # a NotADirectoryError traceback
])
def test_bad_flags_are_refused_before_anything_is_written(tiny, tmp_path, monkeypatch, capsys, flags, message):
    """One error line naming the flag, exit status 2, and nothing written: not OUT_DIR, not the
    current directory, so that a corrected rerun needs no --force."""
    monkeypatch.chdir(tmp_path)
    from minillm.models.loader import default_model_path

    argv = [{"OUT": str(tmp_path / "out"), "TARGET": str(tiny), "GGUF": str(default_model_path())}.get(a, a)
            for a in flags]
    assert rm.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_model_its_filesystem_cannot_hold(tmp_path, monkeypatch, capsys):
    """The weights' bytes, counted from the config before anything is written, against the free
    space of the output's filesystem (a --num-layers typo wrote gigabytes until the disk filled)."""
    out = rm.write_random_model(tmp_path / "m", "tiny", num_layers=3)
    cfg = {**rm.qwen3_config("tiny", 0, 1), "num_hidden_layers": 3}
    written = sum(2 * int(np.prod(shape)) for _, shape, _ in rm.qwen3_tensor_specs(cfg))
    free = rm.SPACE_MARGIN + written - 1
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=free))
    assert rm.main(["--preset", "tiny", str(tmp_path / "a" / "b"), "--num-layers", "3"]) == 2
    err = capsys.readouterr().err
    assert "--preset tiny with 3 layers takes" in err and str(tmp_path) in err and "GB free" in err, err
    assert not (tmp_path / "a").exists()
    # a drafter's size too, whatever its layer count (its target layers are not listed 10**12 times)
    assert rm.main(["--dflash-for", str(out), str(tmp_path / "d"), "--num-layers", str(10**12)]) == 2
    assert "a 1000000000000-layer DFlash drafter takes" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    # with --force, the weights it replaces are deleted first: their space counts as free
    assert rm.main(["--preset", "tiny", str(out), "--num-layers", "3", "--force"]) == 0
    assert rm.weight_bytes(rm.qwen3_tensor_specs, cfg) == written
    assert written < (out / "model.safetensors").stat().st_size < written + 4096  # + the header
    assert rm.weight_bytes(rm.qwen3_tensor_specs, {**cfg, "num_hidden_layers": 10**12}) > 10**16  # counted, not listed


def test_an_interrupted_write_leaves_no_weights_file(tmp_path, monkeypatch):
    """A run stopped part-way through the weights (here: the generator fails on its third chunk)
    leaves neither a truncated model.safetensors nor its temporary file, so a rerun needs no
    --force and writes the whole model."""
    real = rm._chunk_bf16
    calls = []

    def failing(*args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(rm, "_chunk_bf16", failing)
    out = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        rm.write_random_model(out, "tiny", workers=1)
    assert len(calls) >= 3
    assert not list(out.glob("*.safetensors*")), sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(rm, "_chunk_bf16", real)
    rm.write_random_model(out, "tiny", workers=1)
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.partial"))


def test_dflash_for_a_target_config_minillm_cannot_run(tiny, tmp_path, capsys):
    """The target's config.json is read with the loader's checks: a string layer count was a TypeError
    traceback, and a DFlash drafter given as the target was written a drafter of its own."""
    for patch, message in (({"num_hidden_layers": "x"}, "'num_hidden_layers' must be a positive integer"),
                           ({"architectures": ["DFlashDraftModel"]}, "unsupported architectures")):
        target = tmp_path / "target"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(tiny, target)
        cfg = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**cfg, **patch}))
        assert rm.main(["--dflash-for", str(target), str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.splitlines()) == 1 and message in err, err
        assert not (tmp_path / "out").exists()
