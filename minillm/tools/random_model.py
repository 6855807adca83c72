"""Write random-weight models with real Qwen3 shapes as HF directories, for speed and robustness work.

    python -m minillm.tools.random_model --preset qwen3-8b /data/qwen3-8b-random [--seed 0]
    python -m minillm.tools.random_model --dflash-for /data/qwen3-8b-random /data/qwen3-8b-dflash

A preset directory holds config.json (real Qwen3 keys), bf16 safetensors (one file, or shards plus
model.safetensors.index.json above ~4 GB), generation_config.json, tokenizer.json and
tokenizer_config.json (ChatML template, eos <|im_end|>). It loads with minillm's hf_loader and with
transformers' AutoModelForCausalLM. `--dflash-for` writes a random DFlash block drafter for a target
directory instead, in the layout `dflash.DFlashDraftModel.from_pretrained` reads.

Weights are N(0, 0.02) (norm weights 1.0), so activations stay in a sane range through every layer.
They are a pure function of (seed, tensor name, chunk index): the same seed gives the same bytes
whatever the thread count (numpy's PCG64 stream; its normal sampler has been stable for years).

The tokenizer is Qwen-style byte-level BPE (same split regex, ChatML special tokens), trained on a
synthetic corpus from a fixed-seed Python RNG (~4,000 tokens, what the tiny preset uses). For the
Qwen3 presets it is grown with synthetic merges to Qwen3's 151,643 ordinary tokens, so the special
tokens get Qwen3's ids and every id a random model emits decodes to text (a few-thousand-token
vocabulary would leave 97% of a 151,936-row LM head's picks as empty text in streams). It does not
depend on the seed. Nothing here touches the network. Generated weights are never committed.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np

from minillm.args import CliParser

WEIGHT_STD = 0.02
BF16_ONE = 0x3F80  # bit pattern of 1.0 in bfloat16
SHARD_BYTES = 4 * 10**9  # shard above this, like the real Qwen3-8B checkpoint (~4 GB shards)
CHUNK = 1 << 23  # elements generated per task: bounds memory and makes seeding thread-count free
TRAINED_BPE_VOCAB = 4000  # tokens learnt from the synthetic corpus; larger vocabularies are extended
# room kept beside the weights for the safetensors headers, configs and tokenizer.json (12 MB for Qwen3's)
SPACE_MARGIN = 64 << 20
# Generator threads at most: each keeps two CHUNK-element chunks (16 MB of bf16 each) waiting to be
# written, so --workers 100000 asked for ~3 TB of host memory; past the cores, threads gain nothing
MAX_WORKERS = 256

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The pre-tokenizer split of Qwen2/Qwen3's tokenizer.json, so text splits the way it does there.
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN3_COMMON = {
    "head_dim": 128, "num_key_value_heads": 8, "vocab_size": 151936, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
    "tokenizer_bpe_vocab": 151643,  # Qwen3's count: <|endoftext|> is 151643, <|im_end|> 151645
}
PRESETS: dict[str, dict] = {
    "qwen3-0.6b": {**_QWEN3_COMMON, "hidden_size": 1024, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "intermediate_size": 3072, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3_COMMON, "hidden_size": 4096, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "intermediate_size": 12288, "tie_word_embeddings": False},
    # for tests: every code path of the real shapes (GQA, qk-norm, untied head) at toy size; the
    # vocabulary leaves room above the tokenizer's ids, as Qwen3's does (DFlash's mask token lives there)
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 4096,
             "tie_word_embeddings": False, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
             "max_position_embeddings": 4096, "tokenizer_bpe_vocab": TRAINED_BPE_VOCAB},
}


# ---- tokenizer ------------------------------------------------------------------------------
_COMMON_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not but they "
    "which you one all were can there their has had more will would what when about if so out them "
    "some other time into these only two may then could its first like see over new after also people "
    "most way work used made such years many where even because well good each make between any long "
    "life world still much should own being great both year model token server request cache batch"
).split()
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "ch", "sh", "th", "st", "tr", "pl", "gr", "br")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "oo", "y")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "ng", "ck", "st", "nd")
_EXTRAS = ("café", "naïve", "über", "señor", "日本語", "中文", "русский", "😀", "→", "±", "€")
_CODE = ("def f(x):\n    return x + 1\n", "for i in range(10):\n    print(i)\n", "{\"key\": [1, 2, 3]}",
         "if (a == b) { return 0; }", "x = y * 2 - z / 3", "https://example.com/a/b?c=d")


def synthetic_corpus(num_sentences: int = 12000) -> list[str]:
    """English-like text (common words + pseudo-words with Zipf frequencies, numbers, code, some
    non-ASCII) from a fixed-seed Python RNG: identical on every machine and Python version."""
    rng = random.Random(20241130)
    pseudo = {
        "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                for _ in range(rng.choice((1, 2, 2, 3))))
        for _ in range(4000)
    }
    lexicon = _COMMON_WORDS + sorted(pseudo)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    lines = []
    for _ in range(num_sentences):
        words = rng.choices(lexicon, weights, k=rng.randint(4, 16))
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        if rng.random() < 0.05:
            words.insert(rng.randrange(len(words)), rng.choice(_EXTRAS))
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ",", "?", "!", ":")))
        if rng.random() < 0.03:
            lines.append(rng.choice(_CODE))
    return lines


@functools.lru_cache(maxsize=1)
def _trained_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level BPE trained on the synthetic corpus (~1 s)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=TRAINED_BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(synthetic_corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def _extend_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], size: int) -> None:
    """Grow a BPE to `size` ids with synthetic merges (word start + letters, at most 16 chars), so
    every id a full-vocabulary model can emit decodes to text, as with the real Qwen3 tokenizer."""
    rng = random.Random(151643)
    tokens = sorted(vocab, key=vocab.get)
    starts = [t for t in tokens if len(t) > 1 and t.startswith("Ġ")]  # "Ġ" is the byte-level space
    pieces = [t for t in tokens if t.isalpha() and not t.startswith("Ġ")]
    while len(vocab) < size:
        a, b = rng.choice(starts if rng.random() < 0.8 else tokens), rng.choice(pieces)
        if a + b in vocab or len(a + b) > 16:
            continue
        vocab[a + b] = len(vocab)
        merges.append((a, b))
        if a.startswith("Ġ"):
            starts.append(a + b)


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])


def build_tokenizer(bpe_vocab: int = TRAINED_BPE_VOCAB):
    """A Qwen-style byte-level BPE (same pre-tokenizer, decoder and special tokens) with `bpe_vocab`
    ordinary tokens; the special tokens follow them, so 151643 puts them at Qwen3's own ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    trained_vocab, trained_merges = _trained_bpe()
    vocab, merges = dict(trained_vocab), list(trained_merges)
    if bpe_vocab < len(vocab):
        raise ValueError(f"bpe_vocab {bpe_vocab} is below the trained vocabulary ({len(vocab)})")
    _extend_bpe(vocab, merges, bpe_vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def tokenizer_config(tok) -> dict:
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "chat_template": CHATML_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None,
    }


# ---- configs --------------------------------------------------------------------------------
def qwen3_config(preset: str, endoftext_id: int, im_end_id: int) -> dict:
    """config.json with the keys (and key order) of the real Qwen3 checkpoints."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": endoftext_id, "eos_token_id": im_end_id, "head_dim": p["head_dim"],
        "hidden_act": "silu", "hidden_size": p["hidden_size"], "initializer_range": 0.02,
        "intermediate_size": p["intermediate_size"],
        "max_position_embeddings": p["max_position_embeddings"],
        "max_window_layers": p["num_hidden_layers"], "model_type": "qwen3",
        "num_attention_heads": p["num_attention_heads"], "num_hidden_layers": p["num_hidden_layers"],
        "num_key_value_heads": p["num_key_value_heads"], "rms_norm_eps": p["rms_norm_eps"],
        "rope_scaling": None, "rope_theta": p["rope_theta"], "sliding_window": None,
        "tie_word_embeddings": p["tie_word_embeddings"], "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": p["vocab_size"],
    }


def generation_config(endoftext_id: int, im_end_id: int) -> dict:
    # Qwen3's shipped sampling defaults, so servers exercise their generation-defaults path
    return {"bos_token_id": endoftext_id, "do_sample": True, "eos_token_id": [im_end_id, endoftext_id],
            "pad_token_id": endoftext_id, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "transformers_version": "4.51.0"}


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _layer_specs(prefix: str, cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    h, d, ffn = cfg["hidden_size"], _head_dim(cfg), cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return [
        (prefix + "input_layernorm.weight", (h,), "ones"),
        (prefix + "self_attn.q_proj.weight", (q, h), "normal"),
        (prefix + "self_attn.k_proj.weight", (kv, h), "normal"),
        (prefix + "self_attn.v_proj.weight", (kv, h), "normal"),
        (prefix + "self_attn.o_proj.weight", (h, q), "normal"),
        (prefix + "self_attn.q_norm.weight", (d,), "ones"),
        (prefix + "self_attn.k_norm.weight", (d,), "ones"),
        (prefix + "post_attention_layernorm.weight", (h,), "ones"),
        (prefix + "mlp.gate_proj.weight", (ffn, h), "normal"),
        (prefix + "mlp.up_proj.weight", (ffn, h), "normal"),
        (prefix + "mlp.down_proj.weight", (h, ffn), "normal"),
    ]


def qwen3_tensor_specs(cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, init) of every tensor of a Qwen3ForCausalLM checkpoint, in HF file order."""
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], cfg["hidden_size"]), "normal")]
    for i in range(cfg["num_hidden_layers"]):
        specs += _layer_specs(f"model.layers.{i}.", cfg)
    specs.append(("model.norm.weight", (cfg["hidden_size"],), "ones"))
    if not cfg["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (cfg["vocab_size"], cfg["hidden_size"]), "normal"))
    return specs


def dflash_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """dflash's build_target_layer_ids (layers 1 .. L-3 evenly), falling back to evenly spaced
    distinct layers when the target is too shallow for that formula (e.g. the tiny preset)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end - start >= num_draft_layers - 1:  # tested first: a huge --num-layers lists at most the target's
        return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    n = min(num_draft_layers, num_target_layers)
    return sorted({round(i * (num_target_layers - 1) / max(n - 1, 1)) for i in range(n)})


def dflash_config(target_cfg: dict, mask_token_id: int, num_layers: int = 5, block_size: int = 16) -> dict:
    """config.json of a DFlash drafter (a Qwen3Config plus the dflash keys dflash/model.py reads)."""
    layer_ids = dflash_target_layer_ids(target_cfg["num_hidden_layers"], num_layers)
    return {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "block_size": block_size,
        "bos_token_id": target_cfg.get("bos_token_id"),
        "dflash_config": {"block_size": block_size, "mask_token_id": mask_token_id,
                          "target_layer_ids": layer_ids},
        "eos_token_id": target_cfg.get("eos_token_id"), "head_dim": _head_dim(target_cfg),
        "hidden_act": "silu", "hidden_size": target_cfg["hidden_size"], "initializer_range": 0.02,
        "intermediate_size": target_cfg["intermediate_size"],
        "max_position_embeddings": target_cfg.get("max_position_embeddings", 40960),
        "max_window_layers": num_layers, "model_type": "qwen3",
        "num_attention_heads": target_cfg["num_attention_heads"], "num_hidden_layers": num_layers,
        "num_key_value_heads": target_cfg.get("num_key_value_heads") or target_cfg["num_attention_heads"],
        "num_target_layers": target_cfg["num_hidden_layers"],
        "rms_norm_eps": target_cfg.get("rms_norm_eps", 1e-6), "rope_scaling": None,
        "rope_theta": target_cfg.get("rope_theta", 1000000.0), "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": target_cfg["vocab_size"],
    }


def dflash_tensor_specs(cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """DFlashDraftModel's state dict: no embedding or LM head (it borrows the target's); a
    DFlash2DraftModel's adds each layer's two convs and the candidate selector, under the names
    its from_pretrained reads (the codebooks without ".weight")."""
    h, dc = cfg["hidden_size"], cfg["dflash_config"]
    v2 = "selector_rank" in dc
    specs = []
    for i in range(cfg["num_hidden_layers"]):
        specs += _layer_specs(f"layers.{i}.", cfg)
        if v2:
            ks, groups = dc["conv_kernel_size"], h // dc["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                # a base of ones: every tap counts (the reference leaves the parameter's init to the file)
                specs += [(f"layers.{i}.{conv}.base_kernel", (2, ks, h), "ones"),
                          (f"layers.{i}.{conv}.kernel_projection.weight", (2 * ks * groups, h), "normal")]
    n_ctx = len(dc["target_layer_ids"])
    specs += [("norm.weight", (h,), "ones"), ("fc.weight", (h, n_ctx * h), "normal"),
              ("hidden_norm.weight", (h,), "ones")]
    if v2:
        r, v = dc["selector_rank"], cfg["vocab_size"]
        specs += [("candidate_selector.predecessor_codebook", (v, r), "unit"),
                  ("candidate_selector.successor_codebook", (v, r), "unit"),
                  ("candidate_selector.hidden_projection.weight", (r, h), "normal")]
    return specs


def weight_bytes(specs_of, cfg: dict) -> int:
    """Bytes of the bf16 tensors specs_of(cfg) lists, counted from one layer: listing every layer of a
    mistyped --num-layers (10**9) would take longer and more memory than refusing it."""
    one = sum(2 * int(np.prod(shape)) for _, shape, _ in specs_of({**cfg, "num_hidden_layers": 1}))
    layer = sum(2 * int(np.prod(shape)) for _, shape, _ in _layer_specs("", cfg))
    return one + (cfg["num_hidden_layers"] - 1) * layer


# ---- weights --------------------------------------------------------------------------------
def _chunk_bf16(seed: int, name: str, index: int, n: int, init: str) -> np.ndarray:
    """Elements [index*CHUNK, index*CHUNK + n) of a tensor, as bf16 bit patterns (uint16)."""
    if init == "ones":
        return np.full(n, BF16_ONE, dtype=np.uint16)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode()), index])))
    x = rng.standard_normal(n, dtype=np.float32)
    if init != "unit":  # "unit": standard normal (a DFlash2 selector's codebooks, so their term counts)
        x *= WEIGHT_STD
    return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def _chunks(specs) -> Iterator[tuple[str, int, int, str]]:
    for name, shape, init in specs:
        total = int(np.prod(shape))
        for index, start in enumerate(range(0, total, CHUNK)):
            yield name, index, min(CHUNK, total - start), init


def write_safetensors(path: Path, specs, seed: int, pool: ThreadPoolExecutor, ahead: int = 4) -> None:
    """Stream one bf16 safetensors file: header first (shapes are known), then chunks in order,
    generated by the pool at most `ahead` chunks in advance, so memory stays at a few chunks instead
    of the whole model."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in specs:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors pads the header so the data is 8-byte aligned
    # written under a temporary name and renamed when whole: an interrupted run (Ctrl-C, a full disk)
    # leaves no truncated file under the real name for a loader to read as a model
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            pending: list[Future] = []
            for job in _chunks(specs):
                pending.append(pool.submit(_chunk_bf16, seed, *job))
                if len(pending) >= ahead:
                    f.write(pending.pop(0).result())
            for fut in pending:
                f.write(fut.result())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _shard(specs, limit: int | None = None) -> list[list]:
    limit = limit or SHARD_BYTES
    shards, size = [[]], 0
    for spec in specs:
        nbytes = 2 * int(np.prod(spec[1]))
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def write_weights(out_dir: Path, specs, seed: int, workers: int | None = None) -> list[Path]:
    """model.safetensors, or model-0000k-of-0000n.safetensors + index when above SHARD_BYTES."""
    shards = _shard(specs)
    workers = workers or min(os.cpu_count() or 1, MAX_WORKERS)
    for old in [*out_dir.glob("*.safetensors"), *out_dir.glob("*.safetensors.partial"),
                out_dir / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)  # a stale shard or index from an earlier run would be read too
    files = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        if len(shards) == 1:
            files.append(out_dir / "model.safetensors")
            write_safetensors(files[0], specs, seed, pool, 2 * workers)
            return files
        weight_map = {}
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(out_dir / fname, shard, seed, pool, 2 * workers)
            files.append(out_dir / fname)
            weight_map.update({name: fname for name, _, _ in shard})
    total = sum(2 * int(np.prod(shape)) for _, shape, _ in specs)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


# ---- entry points ---------------------------------------------------------------------------
def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _check_args(out_dir: str | Path, seed: int, workers: int | None, num_layers: int | None) -> None:
    """Refuse what would otherwise fail part-way through the weights (a partial model left behind)
    or write somewhere else than asked; ValueError naming the flag."""
    if os.fspath(out_dir) == "":
        raise ValueError("OUT_DIR is empty (it would write into the current directory); give the directory to write")
    if seed < 0:
        raise ValueError(f"--seed must be >= 0 (numpy seeds are non-negative), got {seed}")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be 1 to {MAX_WORKERS} (each thread holds two 16 MB chunks; leave it "
                         f"out for one a CPU), got {workers}")
    if num_layers is not None and num_layers < 1:
        raise ValueError(f"--num-layers must be at least 1, got {num_layers}")


def _check_space(out: Path, nbytes: int, force: bool, what: str) -> None:
    """Refuse a model the output's filesystem cannot hold before writing any of it: a full disk
    stops the run part-way and leaves a partial model that a rerun refuses without --force."""
    folder = out
    while not folder.exists():  # out and its parents are created later
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if force and out.is_dir():  # write_weights deletes the old weights first
        free += sum(f.stat().st_size for f in out.glob("*.safetensors"))
    if nbytes + SPACE_MARGIN > free:
        raise ValueError(f"{what} takes {nbytes / 1e9:.2f} GB (+ {SPACE_MARGIN >> 20} MiB for the other files) but "
                         f"the filesystem of {os.path.abspath(folder)} has {free / 1e9:.2f} GB free; free some space, "
                         "write to another OUT_DIR, or ask for a smaller model (--num-layers)")


def _prepare(out_dir: str | Path, force: bool) -> Path:
    out = Path(out_dir)
    if out.exists() and not force and ((out / "config.json").exists() or any(out.glob("*.safetensors"))):
        raise FileExistsError(f"{out}: already holds a model; pass --force (force=True) to overwrite it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_random_model(out_dir: str | Path, preset: str = "tiny", seed: int = 0, force: bool = False,
                       workers: int | None = None, num_layers: int | None = None) -> Path:
    """Write a random-weight Qwen3 preset as an HF directory; returns the directory. num_layers
    keeps the preset's widths with fewer (or more) layers: a sanitizer's cost grows with the
    launches, and a shallow model runs every kernel at its real size in far fewer of them."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    _check_args(out_dir, seed, workers, num_layers)
    tok = build_tokenizer(PRESETS[preset]["tokenizer_bpe_vocab"])
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    cfg = qwen3_config(preset, eot, im_end)
    if num_layers is not None:
        cfg["num_hidden_layers"] = cfg["max_window_layers"] = num_layers
    if tok.get_vocab_size(with_added_tokens=True) > cfg["vocab_size"]:
        raise ValueError(f"preset {preset}: tokenizer has more ids than vocab_size {cfg['vocab_size']}")
    _check_space(Path(out_dir), weight_bytes(qwen3_tensor_specs, cfg), force,
                 f"--preset {preset} with {cfg['num_hidden_layers']} layers")
    out = _prepare(out_dir, force)
    write_weights(out, qwen3_tensor_specs(cfg), seed, workers)
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", generation_config(eot, im_end))
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True))
    _write_json(out / "tokenizer_config.json", tokenizer_config(tok))
    return out


# a DFlash2 drafter's settings (write_dflash_drafter(dflash2=True)); the widths are this tool's choice
DFLASH2_DEFAULTS = {"conv_kernel_size": 4, "conv_group_size": 128, "selector_rank": 64, "selector_top_k": 16}


def write_dflash_drafter(out_dir: str | Path, target_dir: str | Path, seed: int = 0, num_layers: int = 5,
                         block_size: int = 16, force: bool = False, workers: int | None = None,
                         dflash2: bool | dict = False) -> Path:
    """Write a random DFlash drafter for the HF model in target_dir; returns the directory.
    dflash2: a DFlash2 drafter instead (True: DFLASH2_DEFAULTS; a dict overrides some of them)."""
    from tokenizers import Tokenizer

    _check_args(out_dir, seed, workers, num_layers)
    if os.fspath(target_dir) == "":
        raise ValueError("--dflash-for is empty; give the target's HF model directory")
    from minillm.models.hf_loader import config_from_hf, read_json

    target = Path(target_dir)
    if not target.exists():
        raise FileNotFoundError(f"--dflash-for {target}: no such directory; give the target's HF model directory "
                                "(with config.json)")
    if not target.is_dir():  # a GGUF target too: the drafter's config copies the target's config.json
        raise ValueError(f"--dflash-for {target}: not a directory; give the target's HF model directory "
                         "(with config.json)")
    try:
        target_cfg = read_json(target / "config.json")
    except FileNotFoundError:
        raise FileNotFoundError(f"{target / 'config.json'}: missing; --dflash-for needs an HF model "
                                "directory") from None
    config_from_hf(target_cfg, str(target / "config.json"))  # a model minillm runs, with sizes the drafter copies
    # DFlash's mask token is the first id past the tokenizer (151669 for Qwen3): an embedding row
    # of the target that no text ever produces
    tj = target / "tokenizer.json"
    mask = Tokenizer.from_file(str(tj)).get_vocab_size(with_added_tokens=True) if tj.exists() else None
    if mask is None or mask >= target_cfg["vocab_size"]:
        mask = target_cfg["vocab_size"] - 1
    cfg = dflash_config(target_cfg, mask, num_layers, block_size)
    if dflash2:
        v2 = {**DFLASH2_DEFAULTS, **(dflash2 if isinstance(dflash2, dict) else {})}
        v2["conv_group_size"] = min(v2["conv_group_size"], cfg["hidden_size"])  # a tiny model's width
        if cfg["hidden_size"] % v2["conv_group_size"]:
            raise ValueError(f"conv_group_size {v2['conv_group_size']} does not divide hidden_size "
                             f"{cfg['hidden_size']}")
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["dflash_config"].update(v2)
    _check_space(Path(out_dir), weight_bytes(dflash_tensor_specs, cfg), force, f"a {num_layers}-layer DFlash drafter")
    out = _prepare(out_dir, force)
    write_weights(out, dflash_tensor_specs(cfg), seed, workers)
    _write_json(out / "config.json", cfg)
    return out


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.tools.random_model", description=__doc__.split("\n")[0])
    p.add_argument("out_dir", help="directory to write (created if missing)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="model shape to write")
    p.add_argument("--seed", type=int, default=0, help="weights are a pure function of the seed (default 0)")
    p.add_argument("--dflash-for", metavar="TARGET_DIR", default=None,
                   help="write a random DFlash drafter (block 16; 5 layers, or --num-layers) for this target instead")
    p.add_argument("--dflash2", action="store_true",
                   help="with --dflash-for: a DFlash2 drafter (convs and a candidate selector; "
                        + ", ".join(f"{k} {v}" for k, v in DFLASH2_DEFAULTS.items()) + ")")
    p.add_argument("--force", action="store_true", help="overwrite a model already in OUT_DIR")
    p.add_argument("--workers", type=int, default=None,
                   help=f"generator threads, 1 to {MAX_WORKERS} (default: CPU count)")
    p.add_argument("--num-layers", type=int, default=None,
                   help="the preset's widths with this many layers (e.g. a shallow model for sanitizer runs); "
                        "with --dflash-for, the drafter's layers (default 5)")
    args = p.parse_args(argv)
    if (args.preset is None) == (args.dflash_for is None):
        p.error("give exactly one of --preset NAME or --dflash-for TARGET_DIR")
    if args.dflash2 and args.dflash_for is None:
        p.error("--dflash2 writes a drafter: give --dflash-for TARGET_DIR")
    t0 = time.perf_counter()
    try:
        if args.dflash_for is not None:
            layers = {} if args.num_layers is None else {"num_layers": args.num_layers}
            out = write_dflash_drafter(args.out_dir, args.dflash_for, args.seed, force=args.force,
                                       workers=args.workers, dflash2=args.dflash2, **layers)
        else:
            out = write_random_model(args.out_dir, args.preset, args.seed, force=args.force,
                                     workers=args.workers, num_layers=args.num_layers)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {out} ({size / 1e9:.2f} GB of weights) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
