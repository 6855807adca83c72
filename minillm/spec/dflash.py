"""DFlash block-diffusion drafter ("DFlash: Block Diffusion for Flash Speculative Decoding").

The drafter is a few Qwen3-style layers that see the target through its hidden states:
- context: after every target step, the hidden states after the layers in target_layer_ids are
  concatenated, projected by `fc`, normalised by `hidden_norm`, and turned by each draft layer's
  k_proj / k_norm / RoPE and v_proj into that layer's keys and values at the tokens' positions.
  They are stored in the drafter's paged KV pool, which shares the target's block tables.
- drafting: one block [last token, mask x (block_size - 1)] at the next positions, embedded with
  the target's embeddings, runs through the layers in a single forward whose attention is
  non-causal over context + block; the target's LM head gives the draft logits.
A draft layer over the pool is exactly a Qwen3 decoder layer with non-causal attention, so the
drafter is a `Transformer` sharing the target's embedding and LM head. A DFlash2 checkpoint adds
convs to those layers and a candidate selector in place of the argmax (spec/dflash2.py).

Drafts: the argmax of each draft row's logits for greedy requests; at temperature > 0 a draw from
q, the row's distribution under the request's temperature and filters, as the reference's
dflash_generate draws them, and the target verifies each against that q (accept with probability
min(1, p / q), else draw from max(p - q, 0)): the drafter's logits rows stay on the device until
its next step, and the verification step (which comes first) reads them (ModelRunner.draft_q).
DFlash2's selector proposes deterministically, so its drafts are verified as one-hot.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from minillm.engine.runner import DRAW_DRAFTS, BlockAdvance, ModelRunner
from minillm.engine.scheduler import ScheduledSeq
from minillm.engine.sequence import Sequence
from minillm.models.config import ModelConfig
from minillm.models.hf_loader import (
    attention_shape,
    canonical_name,
    check_weights,
    config_bool,
    config_float,
    config_int,
    count_non_finite,
    read_json,
    rope_scaling_from,
    shown,
)
from minillm.models.safetensors_io import iter_safetensors
from minillm.models.transformer import Transformer, Workspace
from minillm.spec.config import draft_vocab_size as draft_vocab
from minillm.spec.dflash2 import (
    CandidateSelector,
    check_backend,
    dflash2_settings,
    is_dflash2,
    take_dflash2_weights,
)


def dflash_block_size(path: str | Path) -> int:
    """The drafter's block size, read before anything is sized (it sets the KV lookahead)."""
    cfg_file = Path(path) / "config.json"
    try:
        cfg = read_json(cfg_file)
    except FileNotFoundError:
        raise FileNotFoundError(f"{cfg_file}: missing; a DFlash drafter is an HF directory with config.json") from None
    return _block_size(cfg, str(cfg_file))


def _block_size(cfg: dict, where: str) -> int:
    """dflash_config.block_size, else a top-level block_size, else 16."""
    dc = cfg.get("dflash_config") or {}
    return config_int(dc if isinstance(dc, dict) and "block_size" in dc else cfg, "block_size", where, 16)


def load_dflash(path: str | Path, target: ModelConfig) -> tuple[ModelConfig, dict, dict]:
    """(draft ModelConfig, weights incl. fc/hidden_norm, dflash settings) from an HF directory."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{cfg_file}: missing; a DFlash drafter is an HF directory with config.json")
    cfg = read_json(cfg_file)
    where = str(cfg_file)
    if not isinstance(cfg.get("dflash_config") or {}, dict):
        raise ValueError(f"{where}: dflash_config must be a JSON object")
    dc = dict(cfg.get("dflash_config") or {})
    if "dflash_config" not in cfg:
        raise ValueError(f"{cfg_file}: no dflash_config: not a DFlash drafter checkpoint")
    n_layers = config_int(cfg, "num_hidden_layers", where)
    hidden, heads, kv_heads, head_dim = attention_shape(cfg, where)
    causal_layers(cfg, n_layers, where)
    v2 = dflash2_settings(cfg, hidden, target.vocab_size, where) if is_dflash2(cfg) else None

    def number(key: str, default: float | None) -> float | None:
        """A dflash setting as a positive number, from dflash_config, else the top level (older files)."""
        d, label = (dc, f"{where}: dflash_config") if key in dc else (cfg, where)
        return default if d.get(key) is None else config_float(d, key, label)

    layer_ids = dc.get("target_layer_ids") or cfg.get("target_layer_ids") or []
    if not isinstance(layer_ids, list):
        raise ValueError(f"{cfg_file}: dflash_config.target_layer_ids must be a list of the target's layer "
                         f"indices, got {shown(layer_ids)}")
    settings = {
        "block_size": _block_size(cfg, where),
        "mask_token_id": dc.get("mask_token_id", cfg.get("mask_token_id")),
        "target_layer_ids": list(layer_ids),
        "output_multiplier": number("output_multiplier", 1.0),
        "final_logit_softcapping": number("final_logit_softcapping", None),
        "input_embedding_scale": number("input_embedding_scale", 1.0),
    }
    mask = settings["mask_token_id"]
    if mask is None:
        raise ValueError(f"{cfg_file}: dflash_config.mask_token_id is missing")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < target.vocab_size:
        raise ValueError(f"{cfg_file}: dflash_config.mask_token_id must be a token id in [0, "
                         f"{target.vocab_size}) (the target's vocabulary), got {mask!r}")
    if not settings["target_layer_ids"]:
        raise ValueError(f"{cfg_file}: dflash_config.target_layer_ids is missing")
    bad = [i for i in settings["target_layer_ids"] if isinstance(i, bool) or not isinstance(i, int)
           or not 0 <= i < target.num_layers]
    if bad:
        raise ValueError(f"{cfg_file}: target_layer_ids {bad} outside the target's {target.num_layers} layers")
    if hidden != target.hidden_size:
        raise ValueError(f"{cfg_file}: hidden_size {hidden} differs from the target's {target.hidden_size}")
    max_positions = config_int(cfg, "max_position_embeddings", where, target.max_position_embeddings)
    dcfg = ModelConfig(
        arch="qwen3", vocab_size=target.vocab_size, hidden_size=hidden, num_layers=n_layers,
        num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=config_int(cfg, "intermediate_size", where),
        rms_norm_eps=config_float(cfg, "rms_norm_eps", where, 1e-6),
        rope_theta=config_float(cfg, "rope_theta", where, target.rope_theta),
        # its own rope_scaling when it names one (the reference builds its RoPE from its config), else the target's
        rope_scaling=target.rope_scaling if cfg.get("rope_scaling") is None else rope_scaling_from(
            cfg["rope_scaling"], where, max_positions),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True, attention_bias=config_bool(cfg, "attention_bias", where, False), qk_norm=True,
        conv_kernel_size=v2["conv_kernel_size"] if v2 else 0, conv_group_size=v2["conv_group_size"] if v2 else 0,
    )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    raw = load_safetensors_raw(files)
    weights = {}
    if v2 is not None:
        convs, settings["selector"] = take_dflash2_weights(raw, v2, n_layers, hidden, target.vocab_size, str(path))
        weights.update(convs)
        settings["selector_top_k"], settings["selector_rank"] = v2["selector_top_k"], v2["selector_rank"]
    for name, t in raw.items():
        if name in ("fc.weight", "hidden_norm.weight"):
            weights[name.split(".")[0]] = t
        else:
            canon = canonical_name(name if name.startswith("model.") else "model." + name)
            if canon is not None:
                weights[canon] = t
    need = dict(fc=(dcfg.hidden_size, len(settings["target_layer_ids"]) * dcfg.hidden_size),
                hidden_norm=(dcfg.hidden_size,))
    for k, shape in need.items():
        if k not in weights or weights[k].shape != shape:
            raise ValueError(f"{path}: tensor {k!r} missing or not of shape {shape}")
    # the embedding is the target's: only its shape is checked here
    check_weights({**weights, "embed": _Shape((dcfg.vocab_size, dcfg.hidden_size))}, dcfg, str(path))
    return dcfg, weights, settings


def causal_layers(cfg: dict, n_layers: int, where: str) -> None:
    """Refuse the causal or sliding-window draft layers the reference allows (`is_causal`, or a
    "sliding_attention" in layer_types): minillm's draft attention is non-causal over the whole
    context, so such a drafter would draft from other attention than it was trained with."""
    if cfg.get("is_causal"):
        raise ValueError(f"{where}: 'is_causal' {cfg['is_causal']!r}: causal DFlash draft layers are not "
                         "supported yet; minillm's draft attention sees the whole block")
    types = cfg.get("layer_types")
    if types is None:
        return
    if not isinstance(types, list) or len(types) != n_layers:
        raise ValueError(f"{where}: 'layer_types' must list one type for each of the {n_layers} layers")
    other = sorted({t for t in types if t != "full_attention"}, key=str)
    if other:
        raise ValueError(f"{where}: layer_types {other} are not supported yet; minillm's DFlash draft layers "
                         "are full (non-causal) attention")


class _Shape:
    """Stands in for a tensor in check_weights where only the shape matters (the shared embedding)."""

    def __init__(self, shape):
        self.shape = shape


def load_safetensors_raw(files) -> dict[str, np.ndarray]:
    """Every tensor under its file name (DFlash names are not HF model names), in its stored dtype;
    a float one holding NaN or inf is refused, as the target's are (a NaN drafter drafts token 0
    every round: lossless, but nothing is ever accepted)."""
    out = {}
    for f in files:
        for name, t in iter_safetensors(f):
            if bad := count_non_finite(t):
                raise ValueError(f"{f}: tensor {name!r} holds {bad} NaN or infinite value(s); the drafter would "
                                 "compute NaN (a damaged or diverged checkpoint)")
            out[name] = t
    return out


class DFlashProposer:
    needs_kv = True
    uses_target_hidden = True
    drafts_on_device = True  # propose(defer=True): the target takes the drafts on the device

    def __init__(self, path, target: Transformer, backend, k: int, max_tokens: int, max_seqs: int,
                 max_model_len: int, draft_vocab_size: int | None = None):
        dcfg, weights, st = load_dflash(path, target.cfg)
        if "selector" in st:
            check_backend(backend, st, str(path))
        # the LM head is the target's, or its first rows (config.draft_vocab_size: on the 8B shape
        # the whole head is ~1.24 GB of the ~3.2 GB a k = 8 drafting step reads)
        V = dcfg.vocab_size
        dcfg = replace(dcfg, vocab_size=draft_vocab(draft_vocab_size, V))
        self.draft_vocab_size = dcfg.vocab_size
        if st["input_embedding_scale"] != 1.0:
            raise ValueError(f"{path}: input_embedding_scale != 1 is not supported yet")
        self.block = st["block_size"]
        if not 1 <= k <= self.block - 1:
            raise ValueError(f"--speculative-config: num_speculative_tokens {k} must be in [1, block_size - 1 = "
                             f"{self.block - 1}] for this DFlash drafter")
        self.k = k
        self.mask = int(st["mask_token_id"])
        self.layer_ids = tuple(st["target_layer_ids"])
        self.multiplier = st["output_multiplier"]
        self.softcap = st["final_logit_softcapping"]
        self.lookahead = self.block - 1  # the block reaches block_size - 1 positions past the last token
        self.backend = backend
        self.cfg = dcfg
        fc, hidden_norm = weights.pop("fc"), weights.pop("hidden_norm")
        weights["embed"] = np.zeros((1, dcfg.hidden_size), np.float32)  # replaced by the target's below
        self.model = Transformer(dcfg, weights, backend, max_model_len + self.block)
        self.model.embed = target.embed
        self.model.lm_head = target.lm_head if dcfg.vocab_size == V else target.lm_head[: dcfg.vocab_size]
        self.fc = backend.asarray(fc)
        self.hidden_norm = backend.asarray(hidden_norm)
        self.max_tokens, self.max_seqs, self.max_model_len = max_tokens, max_seqs, max_model_len
        # target hidden states of a step, and their projection (the drafter's context input)
        H = dcfg.hidden_size
        self.capture = backend.empty((max_tokens, len(self.layer_ids) * H))
        self.ctx = Workspace(backend, dcfg, max_tokens, 1)
        self.ctx_hidden = backend.empty((max_tokens, H))
        self._pending = None  # a drafting step launched by propose(defer=True), not yet resolved
        self._behind = None  # one launched by propose_behind, not yet settled
        self.launches = 0  # drafting steps so far: seq.draft_q names the one that drew its drafts
        # each layer's k/v projection: the rows of its qkv weight (and bias) past q_size, as views
        # DFlash2: the candidate selector replaces each drafting step's argmax
        self.selector = None if "selector" not in st else CandidateSelector(
            backend, st["selector"], st["selector_top_k"], max_seqs * k, dcfg.vocab_size)
        qs = dcfg.q_size
        self._kv_proj = [(lw.qkv[qs:], None if lw.qkv_bias is None else lw.qkv_bias[qs:])
                         for lw in self.model.layers]

    @property
    def samples_drafts(self) -> bool:
        """Whether drafts at temperature > 0 are draws from q (not DFlash2's selector picks)."""
        return self.selector is None

    @property
    def logits(self):
        """The latest drafting step's logits rows: block i's draft j at row i * k + j."""
        return self.runner.ws.logits

    def _draw(self, items: list[ScheduledSeq], **launch):
        """Launch a drafting step: argmax rows, or draws from q at temperature > 0."""
        handle = self.runner.launch(items, greedy=DRAW_DRAFTS if self.samples_drafts else True, **launch)
        self.launches += 1
        return handle

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.cfg.kv_bytes_per_token(dtype_bytes)

    def context_weights(self) -> list:
        """The weights every target step's context update reads: fc, the hidden norm and each
        drafter layer's k/v rows (bench spec-cost counts them in a round's bytes)."""
        return [self.fc, self.hidden_norm] + [a for wb in self._kv_proj for a in wb if a is not None]

    def drafting_weights(self) -> list:
        """The weights a drafting step reads beyond its model's layers and head: a DFlash2
        drafter's selector projection (its codebooks give a few gathered rows a position)."""
        return [] if self.selector is None else [self.selector.proj]

    def attach(self, block_manager) -> None:
        """Allocate the context K/V pool (the target's geometry) and the block-draft step buffers."""
        self.kv = self.model.allocate_kv_cache(block_manager.num_blocks, block_manager.block_size)
        # non-causal attention and the logits transform belong to the runner, so a drafting step
        # is the same function eagerly and in the CUDA graphs capture_graphs records
        transform = self._transform_logits if self.multiplier != 1.0 or self.softcap else None
        self.runner = ModelRunner(self.model, self.backend, self.kv, block_manager,
                                  max_tokens=max(self.max_tokens, self.max_seqs * self.block), max_seqs=self.max_seqs,
                                  max_logits=self.max_seqs * self.block, max_model_len=self.max_model_len + self.block,
                                  causal=False, transform_logits=transform, logits_window=(1, self.k),
                                  select_drafts=None if self.selector is None else self._select)

    def capture_graphs(self, buckets: list[int]) -> None:
        """CUDA graphs of the drafting step (block rows per sequence) for each bucket of
        sequences; the context update is captured in the target's graphs (engine: after_forward)."""
        self.runner.capture_graphs(buckets, [self.block])

    # ---- context: every target step --------------------------------------------------------
    def update_context(self, x, num_tokens: int) -> None:
        """Store context K/V for the target step just run (x: its StepInputs, rows [0, num_tokens)).

        The target's runner calls it right after its forward (its after_forward), so in decode and
        verification steps it is part of the target's CUDA graph; it allocates nothing."""
        B, c, ws, T = self.backend, self.cfg, self.ctx, num_tokens
        f = self.ctx_hidden[:T]
        B.matmul(self.capture[:T], self.fc, out=ws.normed[:T])
        B.rms_norm(ws.normed[:T], self.hidden_norm, c.rms_norm_eps, out=f)
        # only keys and values: the rows of qkv past q_size (a context position is never a query;
        # computing q too read 2/3 more of each layer's qkv weights, 168 MB a round on the 8B shape)
        kv = ws.qkv.reshape(-1)[: T * 2 * c.kv_size].reshape(T, 2 * c.kv_size)
        k = kv[:, : c.kv_size].reshape(T, c.num_kv_heads, c.head_dim)
        v = kv[:, c.kv_size :].reshape(T, c.num_kv_heads, c.head_dim)
        no_q = k[:, :0]  # zero query heads: the fused kernel norms, rotates and stores k, copies v
        for i, lw in enumerate(self.model.layers):
            w_kv, b_kv = self._kv_proj[i]
            B.matmul(f, w_kv, out=kv, bias=b_kv)
            B.qk_norm_rope_store_kv(no_q, k, v, lw.q_norm, lw.k_norm, c.rms_norm_eps, x.positions,
                                    self.model.cos_sin, self.kv[0][i], self.kv[1][i], x.slot_mapping)

    # ---- drafting ----------------------------------------------------------------------------
    def propose(self, seqs: list[Sequence], ks: list[int], defer: bool = False) -> None:
        """Draft one block for every sequence with k > 0 (seq.draft_ids: k drafts).

        defer=True launches the drafting step without waiting for it: each sequence's draft_ids
        get k placeholders and draft_row where its drafts start in the drafter's sampled ids, so
        the target's next verification step takes them on the device (ModelRunner.draft_source)
        while the host schedules and prepares it; resolve() puts the ids on the host once that
        step has been launched. The device then never waits for the host between the two steps."""
        self.resolve()
        active = [(s, k) for s, k in zip(seqs, ks) if k > 0]
        for s in seqs:
            s.draft_ids = []
        if not active:
            return
        items = []
        for s, _ in active:
            s.draft_ids = [self.mask] * (self.block - 1)
            items.append(ScheduledSeq(s, self.block, num_draft=self.block - 1, start=s.num_tokens - 1))
        # the target verifies the drafts on the device (against q, the rows' logits, or one-hot);
        # a graph replay when one was captured
        handle = self._draw(items, readback=defer)
        for s, _ in active:
            s.draft_computed = s.num_tokens - 1  # the block's noise K/V is not context
        if defer:
            self._pending = (handle, [self._hold(s, k, i) for i, (s, k) in enumerate(active)])
        else:
            self._assign(self.runner.collect(handle), [(s, k, None, i) for i, (s, k) in enumerate(active)])

    def propose_behind(self, seqs: list[Sequence], bases: list[int], rows, drafts, tokens, accepted) -> None:
        """Launch the next drafting step right behind a verification step whose results the host
        has not read (the engine's early drafting): sequence i's block starts at bases[i] plus the
        drafts the verification accepts among drafts[i] from its logits row rows[i], worked out
        on the device (runner.BlockAdvance) from that step's sampled ids and accept flags. So the
        device goes from verifying to drafting without waiting for the host, which meanwhile
        accepts the tokens; settle() then says which sequences take how many of the drafts."""
        self.resolve()
        items = [ScheduledSeq(s, self.block, num_draft=self.block - 1, start=b) for s, b in zip(seqs, bases)]
        advance = BlockAdvance(tokens, accepted, np.asarray(rows, np.int32), np.asarray(drafts, np.int32),
                               fill_id=self.mask)
        handle = self._draw(items, readback=True, advance=advance)
        self._behind = (handle, {id(s): i for i, s in enumerate(seqs)})

    def settle(self, seqs: list[Sequence], ks: list[int]) -> None:
        """After the host has accepted the verification's tokens: each sequence with k > 0 that
        propose_behind drafted for takes k of its drafts (placeholders and draft_row, as
        propose(defer=True) leaves them); the others none."""
        handle, index = self._behind
        self._behind = None
        waiting = []
        for s, k in zip(seqs, ks):
            i = index.get(id(s), -1)
            s.draft_ids, s.draft_row = [], -1
            if k > 0 and i >= 0:
                s.draft_computed = s.num_tokens - 1  # the block's noise K/V is not context
                waiting.append(self._hold(s, k, i))
        self._pending = (handle, waiting)

    def discard(self) -> None:
        """Forget a drafting step launched and not read (its requests were aborted after a failed
        step: LLMEngine.discard_in_flight), so the next round neither waits on it nor gives its
        drafts to anyone."""
        self._pending = self._behind = None
        self.runner.readback.reset()

    def _hold(self, s: Sequence, k: int, i: int) -> tuple:
        """Give s k placeholder drafts and draft_row where block i's drafts start in the sampled
        ids (the logits window: each block's rows 1..k), so a verification step takes them on the
        device; returns its entry for _assign."""
        s.draft_ids = [self.mask] * k
        s.draft_row = i * self.k
        s.draft_q = (self.launches, i * self.k) if self.samples_drafts else None
        return (s, k, s.draft_ids, i)

    def resolve(self) -> None:
        """Wait for a deferred drafting step and give its sequences their draft ids (those whose
        drafts were dropped meanwhile, by preemption or a step without them, keep what they have)."""
        if self._pending is None:
            return
        handle, waiting = self._pending
        self._pending = None
        self._assign(self.runner.collect(handle), waiting)

    def _assign(self, tokens, waiting) -> None:
        """waiting: (sequence, k, the placeholder list it was given or None, its block's index)."""
        ids = tokens.tolist()  # one conversion, not an int() per draft
        for s, k, held, i in waiting:
            s.draft_row = -1
            if held is None:  # assigned right after its step: the latest
                s.draft_q = (self.launches, i * self.k) if self.samples_drafts else None
            if held is None or s.draft_ids is held:
                s.draft_ids = ids[i * self.k : i * self.k + k]

    def _select(self, logits, hidden, input_ids, out) -> None:
        """A drafting step's drafts by the DFlash2 selector: block i's rows start at i x block."""
        self.selector.select(logits, hidden, input_ids, self.block, self.k, out)

    def _transform_logits(self, logits) -> None:
        """output_multiplier and final-logit soft-capping, as the checkpoint asks."""
        if self.multiplier != 1.0:
            self.backend.scale(logits, self.multiplier)
        if self.softcap:
            self.backend.softcap(logits, float(self.softcap))
