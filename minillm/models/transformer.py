"""The Llama / Qwen2 / Qwen3 decoder, written once against the backend op table.

One forward runs one engine step: the new tokens of every scheduled sequence flattened into
T rows (prefill chunks, decodes and speculative verification alike), attending over the paged
KV cache. Every activation lives in a Workspace allocated once for the largest step, so the
same code is what a CUDA graph captures. The model never branches on the backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.models.config import ModelConfig
from minillm.models.rope import cos_sin_table


@dataclass
class CausalConv:
    """A DFlash2 layer's grouped dynamic causal convolution around its attention or its MLP.

    Its `proj` [2 * ks * groups, hidden] turns the sub-block's normed input into per-row, per-tap,
    per-group kernel weights; half 0 (with base[0]) convolves that input along each drafted block
    before the sub-block, half 1 (with base[1]) convolves the sub-block's output after it."""

    base: object  # [2, ks, hidden]
    proj: object  # [2 * ks * groups, hidden]
    group_size: int


@dataclass
class LayerWeights:
    attn_norm: object
    qkv: object  # [q + 2kv, hidden]: q, k and v projections fused into one matrix
    qkv_bias: object | None
    q_norm: object | None
    k_norm: object | None
    o: object
    mlp_norm: object
    gate_up: object  # [2 * ffn, hidden]: gate and up fused
    down: object
    attn_conv: CausalConv | None = None  # DFlash2 drafters only
    mlp_conv: CausalConv | None = None
    down_t: object | None = None  # [F, hidden]: down transposed, for the split MLP's mode 3 (MINILLM_MLP_SPLIT)


@dataclass
class StepInputs:
    """Per-step indices, built by the runner from the block manager (backend int32 arrays)."""

    input_ids: object  # [T]
    positions: object  # [T]
    slot_mapping: object  # [T]
    block_tables: object  # [B, max_blocks]
    seq_lens: object  # [B] context length after this step
    query_start: object  # [B + 1]
    logits_indices: object  # [R] rows of T whose logits are wanted
    max_query_len: int | None = None  # host hint: the most new tokens of any sequence (None: T)
    # host hint for a decode step: its rows, longest context first; decode attention starts their
    # work in this order, so a ragged batch's short contexts fill the tail (results do not change)
    attn_order: object | None = None  # [T]
    # host hint for a step with long query runs: every row of its sequences of at most
    # backend.decode_max_q queries (the rows the decode kernel takes), longest context first
    decode_rows: object | None = None  # [n]
    # host hint: runs of 2+ queries may take the backend's tensor-core attention (False: the decode
    # kernel takes them, as for a step of fewer than backend.short_run_min_seqs sequences)
    short_runs: bool = True


def mlp_acc_dtype(backend, cfg: ModelConfig):
    """The dtype of the split MLP's sums (backend.mlp_split_dtype) for this model, or None where one-row
    steps run the MLP as two products."""
    if cfg.conv_width or cfg.conv_kernel_size:
        return None
    return backend.mlp_split_dtype(cfg.hidden_size, cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size,
                                   cfg.num_layers)


class Workspace:
    """Activation buffers for up to max_tokens rows and max_logits logits rows, made once."""

    @staticmethod
    def nbytes(cfg: ModelConfig, max_tokens: int, max_logits: int, dtype_bytes: int) -> int:
        """What __init__ allocates, for planning memory before it exists."""
        per_token = 3 * cfg.hidden_size + cfg.q_size + 2 * cfg.kv_size + cfg.q_size + 3 * cfg.intermediate_size
        if cfg.conv_width:  # mixed and dyn
            per_token += cfg.hidden_size + cfg.conv_width
        # + the split MLP's ring (mlp_acc_dtype), counted at its widest (int64) whether or not a backend runs it
        return (dtype_bytes * (max_tokens * per_token + (max_logits + 1) * cfg.hidden_size)
                + 4 * max_logits * cfg.vocab_size + 8 * max(cfg.num_layers - 1, 0) * cfg.hidden_size)

    def __init__(self, backend, cfg: ModelConfig, max_tokens: int, max_logits: int):
        e = backend.empty
        self.max_tokens = max_tokens
        self.max_logits = max_logits
        self.residual = e((max_tokens, cfg.hidden_size))
        # one-row steps with the norms folded into the products (Transformer.forward) alternate the
        # residual stream between residual[:1] and this row: each folded norm reads one, writes the other
        self.residual_alt = e((1, cfg.hidden_size))
        self.hidden = e((max_tokens, cfg.hidden_size))
        self.normed = e((max_tokens, cfg.hidden_size))
        self.qkv = e((max_tokens, cfg.q_size + 2 * cfg.kv_size))
        # zeroed once: a graph's padding run of more than 16 rows (runner._pad; no keys) is a short
        # run to no attention kernel (cuda/common.cuh bounds those at 16 queries) and a long run to
        # none in a step without long runs, so its rows keep what they held: finite, and never read
        # by a real row (every later op is row by row; padding rows have no logits and store no KV)
        self.attn = backend.zeros((max_tokens, cfg.num_heads, cfg.head_dim))
        self.gate_up = e((max_tokens, 2 * cfg.intermediate_size))
        self.act = e((max_tokens, cfg.intermediate_size))
        self.last = e((max_logits, cfg.hidden_size))
        self.logits = e((max_logits, cfg.vocab_size), dtype=np.float32)
        if cfg.conv_width:  # DFlash2: a conv's output, and its kernel projection
            self.mixed = e((max_tokens, cfg.hidden_size))
            self.dyn = e((max_tokens, cfg.conv_width))
        # one-row steps under the backend's split MLP (Transformer.forward): layer i < L - 1 adds its down sums
        # into row i while zeroing row i - 1 (mod L - 1), which the qkv product before it read; zeroed once
        # here, so every row is zero before its adds in every step
        dt = mlp_acc_dtype(backend, cfg)
        self.mlp_acc = backend.zeros((cfg.num_layers - 1, 1, cfg.hidden_size), dtype=dt) if dt else None


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], backend, max_positions: int):
        self.cfg = cfg
        self.backend = backend
        a = backend.asarray
        w = weights
        self.embed = a(w["embed"])
        self.lm_head = self.embed if cfg.tie_word_embeddings else a(w["lm_head"])
        self.norm = a(w["norm"])
        self.layers: list[LayerWeights] = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            bias = None
            if cfg.attention_bias:
                bias = a(np.concatenate([w[p + "q_bias"], w[p + "k_bias"], w[p + "v_bias"]]))
            self.layers.append(
                LayerWeights(
                    attn_norm=a(w[p + "attn_norm"]),
                    qkv=a(np.concatenate([w[p + "q"], w[p + "k"], w[p + "v"]])),
                    qkv_bias=bias,
                    q_norm=a(w[p + "q_norm"]) if cfg.qk_norm else None,
                    k_norm=a(w[p + "k_norm"]) if cfg.qk_norm else None,
                    o=a(w[p + "o"]),
                    mlp_norm=a(w[p + "mlp_norm"]),
                    gate_up=a(np.concatenate([w[p + "gate"], w[p + "up"]])),
                    down=a(w[p + "down"]),
                    attn_conv=self._conv(w, p + "attn_conv.") if cfg.conv_kernel_size else None,
                    mlp_conv=self._conv(w, p + "mlp_conv.") if cfg.conv_kernel_size else None,
                    down_t=(a(np.ascontiguousarray(w[p + "down"].T))
                            if getattr(backend, "mlp_split", 0) in (3, 4) and mlp_acc_dtype(backend, cfg) else None),
                )
            )
        self.cos_sin = a(cos_sin_table(cfg, max_positions), dtype=np.float32)
        self.scale = cfg.head_dim ** -0.5
        # one-token steps run every layer as one op (on the GPU one persistent kernel,
        # cuda/decode_layers.cu); None where the backend has no such path for this model
        self.decoder = backend.decoder_plan(cfg, self.layers, self.cos_sin, self.scale)

    def _conv(self, w: dict, prefix: str) -> CausalConv:
        a = self.backend.asarray
        return CausalConv(base=a(w[prefix + "base"]), proj=a(w[prefix + "proj"]), group_size=self.cfg.conv_group_size)

    def _conv_in(self, conv: CausalConv, normed, ws: Workspace, T: int, block_rows: int):
        """A sub-block's input through its conv's first half; its kernel projection stays in ws.dyn
        for the second half (_conv_out)."""
        B = self.backend
        B.matmul(normed, conv.proj, out=ws.dyn[:T])
        B.grouped_causal_conv(normed, conv.base[0], ws.dyn[:T], 0, conv.group_size, block_rows, out=ws.mixed[:T])
        return ws.mixed[:T]

    def _conv_out(self, conv: CausalConv, y, ws: Workspace, T: int, block_rows: int):
        """A sub-block's output through its conv's second half (the kernels _conv_in projected)."""
        self.backend.grouped_causal_conv(y, conv.base[1], ws.dyn[:T], 1, conv.group_size, block_rows,
                                         out=ws.mixed[:T])
        return ws.mixed[:T]

    def allocate_kv_cache(self, num_blocks: int, block_size: int):
        """K and V pools [layers, num_blocks, block_size, kv_heads, head_dim]."""
        c = self.cfg
        shape = (c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim)
        return self.backend.zeros(shape), self.backend.zeros(shape)

    def forward(self, x: StepInputs, num_tokens: int, num_logits: int, kv, ws: Workspace,
                causal: bool = True, capture_layers: tuple[int, ...] = (), capture_out=None):
        """Run one step; returns logits [num_logits, vocab] (a view into the workspace).

        capture_layers/capture_out: write the hidden state after each listed layer into
        capture_out[:, j * hidden:(j + 1) * hidden] (the DFlash drafter's context features).
        """
        B, c = self.backend, self.cfg
        T = num_tokens
        k_cache, v_cache = kv
        residual, hidden, normed = ws.residual[:T], ws.hidden[:T], ws.normed[:T]
        qkv, attn = ws.qkv[:T], ws.attn[:T]
        q = qkv[:, : c.q_size].reshape(T, c.num_heads, c.head_dim)
        k = qkv[:, c.q_size : c.q_size + c.kv_size].reshape(T, c.num_kv_heads, c.head_dim)
        v = qkv[:, c.q_size + c.kv_size :].reshape(T, c.num_kv_heads, c.head_dim)
        hs = c.hidden_size

        B.embed(x.input_ids, self.embed, out=residual)
        # DFlash2 drafters convolve along each block of max_query_len rows (their steps' blocks)
        convs = c.conv_kernel_size > 0
        block_rows = x.max_query_len or T
        one_op = T == 1 and self.decoder is not None and causal and not capture_layers and not convs
        # one new token a sequence (the runner's hint): no row attends to another row's new key,
        # so each layer's q/k rotation and KV store fold into its attention kernel
        decode_step = x.max_query_len == 1 and causal
        if one_op:
            B.decode_layers(self.decoder, residual, hidden, k_cache, v_cache, x.positions, x.slot_mapping,
                            x.block_tables, x.seq_lens)
        # one row: each RMSNorm runs inside the product after it (one launch a norm fewer), so the
        # residual stream alternates between two rows (res, then spare) instead of updating in place
        fold = not one_op and not capture_layers and not convs and B.folds_norms(T, hs)
        res, spare = residual, ws.residual_alt[:T] if fold else None
        # and each layer's MLP but the last as one kernel whose down sums go to a row of ws.mlp_acc (its ring)
        ring = ws.mlp_acc if fold and T == 1 else None
        eps = c.rms_norm_eps
        layer_out = hidden  # where a layer leaves its output (a DFlash2 layer's last conv: ws.mixed)
        for i, lw in enumerate(() if one_op else self.layers):
            if fold:
                if i == 0:
                    B.rms_norm_matmul(residual, None, lw.attn_norm, eps, lw.qkv, out=qkv, residual_out=None,
                                      normed=normed, bias=lw.qkv_bias)
                else:
                    B.rms_norm_matmul(hidden if ring is None else ring[i - 1], res, lw.attn_norm, eps, lw.qkv,
                                      out=qkv, residual_out=spare, normed=normed, bias=lw.qkv_bias)
                    res, spare = spare, res
            else:
                if i == 0:
                    B.rms_norm(residual, lw.attn_norm, eps, out=normed)
                else:
                    B.rms_norm(layer_out, lw.attn_norm, eps, out=normed, residual=residual)
                    if i - 1 in capture_layers:
                        j = capture_layers.index(i - 1)
                        B.copy(residual, out=capture_out[:T, j * hs : (j + 1) * hs])
                a_in = normed if lw.attn_conv is None else self._conv_in(lw.attn_conv, normed, ws, T, block_rows)
                B.matmul(a_in, lw.qkv, out=qkv, bias=lw.qkv_bias)
            if decode_step:  # one kernel: q/k norm + RoPE, k and v into the caches, attention;
                # then the o product (which at batch 1 can merge the attention's splits itself)
                B.decode_step_attention(q, k, v, lw.q_norm, lw.k_norm, c.rms_norm_eps, x.positions,
                                        self.cos_sin, k_cache[i], v_cache[i], x.slot_mapping,
                                        x.block_tables, x.seq_lens, x.query_start, self.scale, out=attn,
                                        order=x.attn_order, o_proj=lw.o, o_out=hidden)
            else:
                # one kernel: normed + rotated q in place, k and v rows into the paged caches
                B.qk_norm_rope_store_kv(q, k, v, lw.q_norm, lw.k_norm, c.rms_norm_eps, x.positions,
                                        self.cos_sin, k_cache[i], v_cache[i], x.slot_mapping)
                B.paged_attention(q, k_cache[i], v_cache[i], x.block_tables, x.seq_lens,
                                  x.query_start, self.scale, out=attn, causal=causal,
                                  max_query_len=x.max_query_len, decode_rows=x.decode_rows,
                                  short_runs=x.short_runs)
                B.matmul(attn.reshape(T, c.q_size), lw.o, out=hidden)
            a_out = hidden if lw.attn_conv is None else self._conv_out(lw.attn_conv, hidden, ws, T, block_rows)
            # the last layer's MLP norm stays a launch, updating res in place: 2L - 2 alternations,
            # an even count, so the stream ends in ws.residual as the unfolded layers leave it
            if ring is not None and i < c.num_layers - 1:
                B.rms_norm_mlp_split(hidden, res, lw.mlp_norm, eps, lw.gate_up,
                                     lw.down if lw.down_t is None else lw.down_t, acc=ring[i],
                                     zero=ring[(i - 1) % len(ring)], residual_out=spare)
                res, spare = spare, res
                continue
            if fold and i < c.num_layers - 1:
                B.rms_norm_matmul_silu_mul(hidden, res, lw.mlp_norm, eps, lw.gate_up, out=ws.act[:T],
                                           residual_out=spare, normed=normed, gate_up=ws.gate_up[:T])
                res, spare = spare, res
            else:
                B.rms_norm(a_out, lw.mlp_norm, eps, out=normed, residual=res)
                m_in = normed if lw.mlp_conv is None else self._conv_in(lw.mlp_conv, normed, ws, T, block_rows)
                # gate_up GEMV and SiLU-and-multiply in one kernel when few rows (ws.gate_up unused then)
                B.matmul_silu_mul(m_in, lw.gate_up, out=ws.act[:T], gate_up=ws.gate_up[:T])
            B.matmul(ws.act[:T], lw.down, out=hidden)
            layer_out = hidden if lw.mlp_conv is None else self._conv_out(lw.mlp_conv, hidden, ws, T, block_rows)
        B.rms_norm(layer_out, self.norm, eps, out=normed, residual=residual)
        last_layer = c.num_layers - 1
        if last_layer in capture_layers:  # as in HF's hidden_states, the last one is after the final norm
            j = capture_layers.index(last_layer)
            B.copy(normed, out=capture_out[:T, j * hs : (j + 1) * hs])
        R = num_logits
        B.gather_rows(normed, x.logits_indices, out=ws.last[:R])
        B.matmul(ws.last[:R], self.lm_head, out=ws.logits[:R])
        return ws.logits[:R]
