"""DFlash2 drafters: DFlash with convolutions in its layers and a candidate selector.

A DFlash2 checkpoint (the `dflash` package's DFlash2DraftModel) is a DFlash drafter plus:
- in every layer, a grouped dynamic causal convolution around the attention and another around
  the MLP (models/transformer.py's CausalConv): along the drafted block, each row mixes itself
  with the kernel_size - 1 rows before it, per channel group, with weights that are a fixed base
  plus a projection of the row's own normed input;
- a candidate selector instead of each position's argmax: the top_k ids of a position's draft
  logits are rescored by a low-rank pairing of the previous draft token with the candidate,
      score(c) = logit(c) + sum_r pred[prev, r] * h[r] * succ[c, r]   (h: the position's hidden,
  projected to rank r), and the best becomes the draft and the next position's prev. The block's
  first token (the last accepted one) is the first prev.
minillm drafts greedily (the target verifies one-hot drafts losslessly), so the selector's argmax
path is all it needs; the backend op `dflash2_select` runs it on the device.
"""

from __future__ import annotations

import numpy as np

from minillm.models.hf_loader import config_int

DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def is_dflash2(cfg: dict) -> bool:
    """A DFlash2 checkpoint: its architecture says so, or it carries a DFlash2 setting."""
    dc = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    archs = cfg.get("architectures") or []
    return any("DFlash2" in str(a) for a in archs) or any(k in dc or k in cfg for k in DFLASH2_KEYS)


def dflash2_settings(cfg: dict, hidden: int, vocab: int, where: str) -> dict:
    """The four DFlash2 settings (dflash_config first, then the top level, as the reference reads
    them), checked against the drafter's hidden size and the target's vocabulary."""
    dc = cfg.get("dflash_config") or {}
    merged = {k: dc[k] if k in dc else cfg.get(k) for k in DFLASH2_KEYS}
    missing = [k for k, v in merged.items() if v is None]
    if missing:
        raise ValueError(f"{where}: a DFlash2 drafter needs {', '.join(missing)} (in dflash_config)")
    st = {k: config_int(merged, k, where) for k in DFLASH2_KEYS}
    if hidden % st["conv_group_size"]:
        raise ValueError(f"{where}: conv_group_size {st['conv_group_size']} does not divide hidden_size {hidden}")
    if not 1 <= st["selector_top_k"] <= vocab:
        raise ValueError(f"{where}: selector_top_k {st['selector_top_k']} must be 1 to the vocabulary size {vocab}")
    if st["selector_rank"] < 1:
        raise ValueError(f"{where}: selector_rank {st['selector_rank']} must be at least 1")
    return st


def take_dflash2_weights(raw: dict, st: dict, n_layers: int, hidden: int, vocab: int, where: str) -> tuple[dict, dict]:
    """Pop the conv and selector tensors out of `raw` (the checkpoint's tensors by file name):
    (the convs under the model's canonical names layers.{i}.{attn,mlp}_conv.{base,proj}, the
    selector's pred / succ / proj). Shapes are checked; a missing tensor is named."""
    ks, groups, rank = st["conv_kernel_size"], hidden // st["conv_group_size"], st["selector_rank"]

    def take(name: str, shape: tuple, *aliases: str):
        for n in (name, *aliases):
            if n in raw:
                t = raw.pop(n)
                if t.shape != shape:
                    raise ValueError(f"{where}: tensor {n!r} has shape {tuple(t.shape)}, expected {shape}")
                return t
        raise ValueError(f"{where}: tensor {name!r} is missing (a DFlash2 drafter has one)")

    convs = {}
    for i in range(n_layers):
        for ours, theirs in (("attn_conv", "attention_conv"), ("mlp_conv", "mlp_conv")):
            p = f"layers.{i}.{theirs}."
            convs[f"layers.{i}.{ours}.base"] = take(p + "base_kernel", (2, ks, hidden), "model." + p + "base_kernel")
            convs[f"layers.{i}.{ours}.proj"] = take(p + "kernel_projection.weight", (2 * ks * groups, hidden),
                                                    "model." + p + "kernel_projection.weight")
    s = "candidate_selector."
    # the reference stores the codebooks without ".weight" (DFlash2DraftModel.from_pretrained's key_mapping)
    selector = {"pred": take(s + "predecessor_codebook", (vocab, rank), s + "predecessor_codebook.weight"),
                "succ": take(s + "successor_codebook", (vocab, rank), s + "successor_codebook.weight"),
                "proj": take(s + "hidden_projection.weight", (rank, hidden))}
    return convs, selector


def check_backend(backend, st: dict, where: str) -> None:
    """The backend runs these settings: a backend with bounded selector kernels says so in
    `dflash2_limits` (max top_k, max rank); the NumPy backend has none."""
    limits = getattr(backend, "dflash2_limits", None)
    if limits is None:
        return
    for key, top in zip(("selector_top_k", "selector_rank"), limits):
        if st[key] > top:
            raise ValueError(f"{where}: {key} {st[key]} is past what the {backend.name} backend's selector kernels "
                             f"support (at most {top}); run this drafter on the CPU backend")


class CandidateSelector:
    """The selector's weights and step buffers; select() replaces a drafting step's argmax."""

    def __init__(self, backend, weights: dict, top_k: int, max_rows: int, draft_vocab: int):
        a = backend.asarray
        self.backend, self.top_k = backend, top_k
        self.pred, self.succ, self.proj = a(weights["pred"]), a(weights["succ"]), a(weights["proj"])
        if top_k > draft_vocab:
            raise ValueError(f"selector_top_k {top_k} is past the draft vocabulary ({draft_vocab} ids); "
                             "give a larger draft_vocab_size")
        rank = self.proj.shape[0]
        self.hproj = backend.empty((max_rows, rank))
        self.cand_ids = backend.empty((max_rows, top_k), dtype=np.int32)
        self.cand_vals = backend.empty((max_rows, top_k), dtype=np.float32)

    def select(self, logits, hidden, input_ids, block_rows: int, k: int, out) -> None:
        """out[:rows] = the greedy path of each block's k positions (rows = logits rows, k a block);
        hidden: those rows' final normed hidden states; input_ids: the step's ids (block s's first
        row, s * block_rows, holds its anchor)."""
        B, r = self.backend, logits.shape[0]
        B.matmul(hidden, self.proj, out=self.hproj[:r])
        B.dflash2_select(logits, self.hproj[:r], input_ids, block_rows, k, self.pred, self.succ, self.top_k,
                         self.cand_ids[:r], self.cand_vals[:r], out)
