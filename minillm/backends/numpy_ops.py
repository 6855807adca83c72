"""NumPy reference backend: every op of the table in float32 on the CPU.

Each op here is the specification and the test oracle of its CUDA twin (same name, same
signature). Ops write into buffers the caller owns (`out=`), so the CUDA twin never allocates.

Shapes (T tokens in a step, B sequences, H query heads, KH kv heads, D head_dim):
    q [T, H, D], k/v [T, KH, D], caches [num_blocks, block_size, KH, D]
    block_tables [B, max_blocks] int32, seq_lens [B] int32 (context after this step),
    query_start [B + 1] int32 (row offsets of each sequence's new tokens in q)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.backends.staging import StageFill, check_runs
from minillm.engine.sampler import sample as _sample


@dataclass
class _DecoderPlan:
    """NumpyBackend.decoder_plan: a model's decoder layers and one row of scratch."""

    cfg: object
    layers: list
    cos_sin: np.ndarray
    scale: float
    qkv: np.ndarray
    normed: np.ndarray
    attn: np.ndarray
    gate_up: np.ndarray
    act: np.ndarray
    query_start: np.ndarray


class NumpyBackend:
    name = "numpy"
    device = "cpu"
    dtype = np.float32

    # below this many rows a matmul is a matrix-vector product: one BLAS thread is faster, and a
    # multithreaded OpenBLAS gemv on a busy 2-core machine was measured 20x slower (docs/BENCHMARKS.md)
    SINGLE_THREAD_ROWS = 64

    def __init__(self) -> None:
        from threadpoolctl import ThreadpoolController

        self._blas = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        self._max_threads = max((c.num_threads for c in self._blas), default=1)
        self._threads = self._max_threads

    def _blas_threads(self, n: int) -> None:
        if n != self._threads:
            for c in self._blas:
                c.set_num_threads(n)
            self._threads = n

    # ---- memory -------------------------------------------------------------------------
    def asarray(self, host: np.ndarray, dtype=None) -> np.ndarray:
        """Copy a host array into this backend's storage (default: the compute dtype, float32)."""
        return np.ascontiguousarray(host, dtype=dtype or self.dtype)

    def empty(self, shape, dtype=None) -> np.ndarray:
        return np.empty(shape, dtype=dtype or self.dtype)

    def zeros(self, shape, dtype=None) -> np.ndarray:
        return np.zeros(shape, dtype=dtype or self.dtype)

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)

    def copy_from_host(self, dst: np.ndarray, src: np.ndarray) -> None:
        dst[...] = src

    def synchronize(self) -> None:
        pass

    def stage_inputs(self, dst: np.ndarray, src: np.ndarray, runs: list[tuple[int, int, int, int]],
                     fill: StageFill | None = None, copy_out: tuple | None = None) -> None:
        """dst's rows of each run (offset, stride, rows, nbytes: row j is [offset + j * stride,
        + nbytes)) = src's, then the fill: ids[i] = prev_tokens[src_rows[i]] for i < fill.n where
        src_rows[i] >= 0, ids and src_rows being the fill run's rows ids_row and rows_row
        (minillm/backends/staging.py). copy_out (ids, host row): host_row[:len(ids)] = ids first
        (a deferred readback of the previous step's ids)."""
        check_runs(runs, min(dst.shape[0], src.shape[0]), fill)
        if copy_out is not None:
            self.copy_to_pinned(copy_out[1], copy_out[0])
        for offset, stride, rows, nbytes in runs:  # check_runs: each run is a (rows, stride) block
            block = slice(offset, offset + rows * stride)
            dst[block].reshape(rows, stride)[:, :nbytes] = src[block].reshape(rows, stride)[:, :nbytes]
        if fill is not None and fill.n:
            offset, stride, _, _ = runs[fill.run]
            ids = dst[offset + fill.ids_row * stride:][: 4 * fill.n].view(np.int32)
            src_rows = dst[offset + fill.rows_row * stride:][: 4 * fill.n].view(np.int32)
            live = np.flatnonzero(src_rows >= 0)
            ids[live] = fill.prev_tokens[src_rows[live]]

    def ensure_staging(self, nbytes: int) -> None:
        """Room for an upload of nbytes (the CUDA backend's pinned ring); nothing to do here."""

    def copy_to_pinned(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:len(src)] = src (int32): the readback of a step's sampled ids."""
        dst[: src.shape[0]] = src

    # ---- ops ----------------------------------------------------------------------------
    def copy(self, x, out) -> None:
        out[...] = x

    def embed(self, ids: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
        np.take(table, ids, axis=0, out=out)

    def rms_norm(self, x, w, eps: float, out, residual=None) -> None:
        """out = rmsnorm(x [+ residual]) * w; with residual, residual <- x + residual first."""
        if residual is not None:
            residual += x
            x = residual
        var = np.mean(np.square(x), axis=-1, keepdims=True)
        np.multiply(x * (1.0 / np.sqrt(var + eps)), w, out=out)

    def qk_norm_rope(self, q, k, q_w, k_w, eps: float, positions, cos_sin) -> None:
        """In place: optional per-head RMSNorm of q and k (Qwen3), then rotate-half RoPE.

        cos_sin is [max_pos, head_dim] holding cos in the first half and sin in the second.
        """
        if q_w is not None:
            self.rms_norm(q, q_w, eps, out=q)
            self.rms_norm(k, k_w, eps, out=k)
        half = q.shape[-1] // 2
        cs = cos_sin[positions]
        cos = cs[:, None, :half]
        sin = cs[:, None, half:]
        for x in (q, k):
            x1 = x[..., :half].copy()
            x2 = x[..., half:]
            x[..., :half] = x1 * cos - x2 * sin
            x[..., half:] = x2 * cos + x1 * sin

    def qk_norm_rope_store_kv(self, q, k, v, q_w, k_w, eps: float, positions, cos_sin, k_cache,
                              v_cache, slot_mapping) -> None:
        """qk_norm_rope then store_kv, as one op (one kernel on the GPU).

        q and k are normed and rotated in place (k too, so the result equals the two-op
        sequence); the rotated k rows and the v rows go to the caches, padding rows skipped.
        """
        self.qk_norm_rope(q, k, q_w, k_w, eps, positions, cos_sin)
        self.store_kv(k, v, k_cache, v_cache, slot_mapping)

    def decode_step_attention(self, q, k, v, q_w, k_w, eps: float, positions, cos_sin, k_cache,
                              v_cache, slot_mapping, block_tables, seq_lens, query_start,
                              scale: float, out, order=None, o_proj=None, o_out=None) -> None:
        """qk_norm_rope_store_kv then causal paged_attention, for a step of one new token a
        sequence (one kernel on the GPU, which leaves q and k as they were; here they are
        rotated in place, so callers use neither afterwards). order is the GPU's launch order of
        the rows (longest context first); the result does not depend on it. o_proj / o_out
        (together): then o_out = out @ o_proj.T, the output projection (on the GPU a one-row
        step's o product can merge the attention's splits itself)."""
        if (o_proj is None) != (o_out is None):
            raise ValueError("decode_step_attention: o_proj and o_out go together")
        self.qk_norm_rope_store_kv(q, k, v, q_w, k_w, eps, positions, cos_sin, k_cache, v_cache,
                                   slot_mapping)
        self.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out,
                             causal=True, max_query_len=1)
        if o_proj is not None:
            self.matmul(out.reshape(out.shape[0], -1), o_proj, o_out)

    def matmul(self, x, w, out, bias=None) -> None:
        """out = x @ w.T (+ bias); w in [out_features, in_features] layout."""
        self._blas_threads(1 if x.shape[0] < self.SINGLE_THREAD_ROWS else self._max_threads)
        np.matmul(x, w.T, out=out)
        if bias is not None:
            out += bias

    def silu_mul(self, gate_up, out) -> None:
        """out = silu(gate) * up for gate_up = [gate | up] along the last axis."""
        f = out.shape[-1]
        gate = gate_up[..., :f]
        np.multiply(gate / (1.0 + np.exp(-gate)), gate_up[..., f:], out=out)

    def matmul_silu_mul(self, x, w_gate_up, out, gate_up) -> None:
        """out = silu(x @ gate.T) * (x @ up.T) for w_gate_up = [gate; up] ([2F, K]): matmul then
        silu_mul, as one op (one GEMV kernel on the GPU for few rows). gate_up [M, 2F] is the
        caller's buffer for the unfused path (here always; the GPU may leave it unwritten)."""
        self.matmul(x, w_gate_up, out=gate_up)
        self.silu_mul(gate_up, out=out)

    def folds_norms(self, rows: int, hidden: int) -> bool:
        """Whether steps of `rows` rows run each layer's RMSNorms inside the products after them
        (rms_norm_matmul / rms_norm_matmul_silu_mul). Here one-row steps do, so the CPU runs the
        layer order the GPU's batch-1 steps run (the results are the unfolded ones either way)."""
        return rows == 1

    def rms_norm_matmul(self, x, residual, norm_w, eps: float, w, out, residual_out, normed, bias=None) -> None:
        """out = (rms_norm(x [+ residual]) * norm_w) @ w.T (+ bias); with residual, residual_out <-
        x + residual first (residual unchanged). normed: the normalised rows (scratch: the GPU's
        folded kernel leaves it unwritten)."""
        if residual is not None:
            np.add(residual, x, out=residual_out)
            x = residual_out
        self.rms_norm(x, norm_w, eps, out=normed)
        self.matmul(normed, w, out=out, bias=bias)

    def rms_norm_matmul_silu_mul(self, x, residual, norm_w, eps: float, w_gate_up, out, residual_out, normed,
                                 gate_up) -> None:
        """out = silu(n @ gate.T) * (n @ up.T) for n = rms_norm(x [+ residual]) * norm_w; residual
        as rms_norm_matmul's. normed, gate_up: scratch (the GPU's folded kernel leaves them unwritten)."""
        if residual is not None:
            np.add(residual, x, out=residual_out)
            x = residual_out
        self.rms_norm(x, norm_w, eps, out=normed)
        self.matmul_silu_mul(normed, w_gate_up, out=out, gate_up=gate_up)

    # the CUDA backend's MINILLM_MLP_SPLIT; here a switch a test sets, so the CPU runs the split MLP's ring
    mlp_split = 0

    def mlp_split_dtype(self, hidden: int, intermediate: int, qkv_rows: int, num_layers: int):
        """The dtype of the split MLP's sum rows where one-row steps run it (mlp_split set, 3+ layers), else None."""
        return np.float32 if self.mlp_split and num_layers >= 3 else None

    def rms_norm_mlp_split(self, x, residual, norm_w, eps: float, w_gate_up, w_down, acc, zero,
                           residual_out) -> None:
        """acc += (silu(n @ gate.T) * (n @ up.T)) @ w_down.T for n = rms_norm(x + residual) * norm_w;
        residual_out <- x + residual; zero[:] = 0 (the ring row the product before read)."""
        F = w_gate_up.shape[0] // 2
        if self.mlp_split >= 3:  # down given transposed, [F, K]: back to [K, F], the plain path's BLAS call
            w_down = np.ascontiguousarray(w_down.T)
        np.add(residual, x, out=residual_out)
        normed = np.empty_like(residual_out)
        self.rms_norm(residual_out, norm_w, eps, out=normed)
        act = np.empty((x.shape[0], F), np.float32)
        self.matmul_silu_mul(normed, w_gate_up, out=act, gate_up=np.empty((x.shape[0], 2 * F), np.float32))
        zero[...] = 0
        down = np.empty_like(acc)
        self.matmul(act, w_down, out=down)
        acc += down

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        """Write each token's k/v to its physical slot (block * block_size + offset).

        A negative slot marks a padding row (a CUDA-graph bucket larger than the batch): skipped.
        """
        bs = k_cache.shape[1]
        live = slot_mapping >= 0
        blocks, offsets = np.divmod(slot_mapping[live], bs)
        k_cache[blocks, offsets] = k[live]
        v_cache[blocks, offsets] = v[live]

    def decoder_plan(self, cfg, layers, cos_sin, scale: float):
        """What decode_layers needs of a model, made once at startup: its config, layer weights,
        RoPE table and one row of scratch activations."""
        e = self.empty
        return _DecoderPlan(cfg, layers, cos_sin, scale, qkv=e((1, cfg.q_size + 2 * cfg.kv_size)),
                            normed=e((1, cfg.hidden_size)), attn=e((1, cfg.num_heads, cfg.head_dim)),
                            gate_up=e((1, 2 * cfg.intermediate_size)), act=e((1, cfg.intermediate_size)),
                            query_start=np.array([0, 1], np.int32))

    def decode_layers(self, plan, residual, hidden, k_cache, v_cache, positions, slot_mapping,
                      block_tables, seq_lens) -> None:
        """Every decoder layer for one new token (the first row of the step inputs), op by op:
        residual [1, hidden] holds the embedded token on entry and, on exit, the residual stream
        before the last layer's down output, which is in hidden [1, hidden] (the state the final
        rms_norm(hidden, residual=residual) expects). The twin of cuda/decode_layers.cu."""
        c = plan.cfg
        q = plan.qkv[:, : c.q_size].reshape(1, c.num_heads, c.head_dim)
        k = plan.qkv[:, c.q_size : c.q_size + c.kv_size].reshape(1, c.num_kv_heads, c.head_dim)
        v = plan.qkv[:, c.q_size + c.kv_size :].reshape(1, c.num_kv_heads, c.head_dim)
        for i, lw in enumerate(plan.layers):
            self.rms_norm(hidden if i else residual, lw.attn_norm, c.rms_norm_eps, out=plan.normed,
                          residual=residual if i else None)
            self.matmul(plan.normed, lw.qkv, out=plan.qkv, bias=lw.qkv_bias)
            self.qk_norm_rope_store_kv(q, k, v, lw.q_norm, lw.k_norm, c.rms_norm_eps, positions,
                                       plan.cos_sin, k_cache[i], v_cache[i], slot_mapping)
            # the first sequence's keys only: a graph's step also holds padding sequences after it
            self.paged_attention(q, k_cache[i], v_cache[i], block_tables[:1], seq_lens[:1], plan.query_start,
                                 plan.scale, out=plan.attn)
            self.matmul(plan.attn.reshape(1, c.q_size), lw.o, out=hidden)
            self.rms_norm(hidden, lw.mlp_norm, c.rms_norm_eps, out=plan.normed, residual=residual)
            self.matmul_silu_mul(plan.normed, lw.gate_up, out=plan.act, gate_up=plan.gate_up)
            self.matmul(plan.act, lw.down, out=hidden)

    def paged_attention(
        self, q, k_cache, v_cache, block_tables, seq_lens, query_start, scale: float, out,
        causal: bool = True, max_query_len: int | None = None, decode_rows=None,
        short_runs: bool = True,
    ) -> None:
        """Grouped-query attention of each sequence's new queries over its paged context.

        The j-th new query of sequence b sits at position seq_lens[b] - q_len + j and, when
        causal, sees keys at positions <= its own; non-causal queries see the whole context.
        A sequence with seq_lens[b] == 0 is padding: its rows are written as zeros.
        max_query_len, decode_rows and short_runs are the CUDA backend's launch hints (the most new
        queries of any sequence; the rows of the short sequences; whether short runs may take its
        tensor-core kernel); the result does not depend on them.
        """
        _, H, D = q.shape
        bs, KH = k_cache.shape[1], k_cache.shape[2]
        G = H // KH
        for b in range(len(seq_lens)):
            s, e = int(query_start[b]), int(query_start[b + 1])
            nq, L = e - s, int(seq_lens[b])
            if nq == 0:
                continue
            if L == 0:
                out[s:e] = 0.0
                continue
            nb = -(-L // bs)
            blocks = block_tables[b, :nb]
            k = k_cache[blocks].reshape(nb * bs, KH, D)[:L].transpose(1, 2, 0)  # [KH, D, L]
            v = v_cache[blocks].reshape(nb * bs, KH, D)[:L].transpose(1, 0, 2)  # [KH, L, D]
            qb = q[s:e].reshape(nq, KH, G, D).transpose(1, 2, 0, 3)  # [KH, G, nq, D]
            scores = qb @ k[:, None]  # [KH, G, nq, L]
            scores *= scale
            if causal and nq > 1:  # query j sits at L - nq + j: only the last nq keys hold later ones
                tail = scores[..., L - nq:]  # (added in place, not a boolean scatter: the same bits, faster)
                tail += np.triu(np.full((nq, nq), -np.inf, np.float32), 1)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores, out=scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = p @ v[:, None]  # [KH, G, nq, D]
            out[s:e] = o.transpose(2, 0, 1, 3).reshape(nq, H, D)

    def gather_rows(self, x, idx, out) -> None:
        np.take(x, idx, axis=0, out=out)

    def fill_input_ids(self, input_ids, prev_tokens, src_rows) -> None:
        """input_ids[r] = prev_tokens[src_rows[r]] for every row r < len(input_ids) whose
        src_rows[r] >= 0; other rows keep their id. Async scheduling: a step launched before the
        previous step's sampled ids reach the host takes them from the device (int32 arrays)."""
        src = np.asarray(src_rows[: input_ids.shape[0]])
        live = np.flatnonzero(src >= 0)
        input_ids[live] = prev_tokens[src[live]]

    def advance_blocks(self, input_ids, positions, slot_mapping, seq_lens, sample_pos, block_tables,
                       block_size: int, tokens, accepted, row, drafts, base, limit, n: int, first: int,
                       count: int) -> None:
        """A DFlash drafting step launched right behind the verification step, before the host
        has read its accept flags: move each of its B = len(row) blocks of n rows past the drafts
        that were accepted. Block i: a = the leading nonzero flags in accepted[row[i] .. row[i] +
        drafts[i]), start = min(base[i] + a, limit[i]); its first input id becomes tokens[row[i] +
        a], row j goes to position start + j and the slot its block-table row gives, seq_lens[i]
        to start + n, and the rows of the window [first, first + count) sample position p + 1 (the
        inputs were written for a = 0; int32 arrays, updated in place)."""
        B = row.shape[0]
        if B == 0:
            return
        kmax = max(1, int(drafts.max()))
        idx = np.minimum(row[:, None] + np.arange(kmax), accepted.shape[0] - 1)
        ok = (np.arange(kmax) < drafts[:, None]) & (accepted[idx] != 0)
        a = np.cumprod(ok, axis=1).sum(axis=1)
        start = np.minimum(base + a, limit)
        p = start[:, None] + np.arange(n)  # [B, n]
        positions[: B * n] = p.ravel()
        slot_mapping[: B * n] = (block_tables[np.arange(B)[:, None], p // block_size] * block_size
                                 + p % block_size).ravel()
        input_ids[np.arange(B) * n] = tokens[row + a]
        seq_lens[:B] = start + n
        sample_pos[: B * count] = (p[:, first : first + count] + 1).ravel()

    def suppress_tokens(self, logits, rows, token_ids) -> None:
        """logits[rows[i], token_ids[i]] = -inf (min_tokens keeps EOS/stop tokens from being drawn)."""
        logits[rows, token_ids] = -np.inf

    def mask_logits(self, logits, rows, bitmask) -> None:
        """logits[rows[i], t] = -inf for every token t whose bit is clear in bitmask[i] (int32
        words, bit t % 32 of word t // 32; tokens past the mask's 32 x words are banned too):
        structured outputs' allowed tokens (minillm/engine/structured.py)."""
        V = logits.shape[-1]
        words = np.ascontiguousarray(bitmask, dtype=np.int32)
        bits = np.unpackbits(words.view(np.uint8).reshape(words.shape[0], -1), axis=1, bitorder="little")
        allowed = np.zeros((words.shape[0], V), dtype=bool)
        n = min(V, bits.shape[1])
        allowed[:, :n] = bits[:, :n].astype(bool)
        block = logits[rows]
        block[~allowed] = -np.inf
        logits[rows] = block

    def penalize_logits(self, logits, rows, token_ids, scale_pos, scale_neg, subtract) -> None:
        """For each entry i (no (row, token) twice): x = logits[rows[i], token_ids[i]] becomes
        (x * scale_pos[i] if x > 0 else x * scale_neg[i]) - subtract[i] (repetition, presence and
        frequency penalties, SamplingParams)."""
        x = logits[rows, token_ids]
        with np.errstate(over="ignore"):  # a huge repetition_penalty takes a negative logit to -inf, as on the GPU
            logits[rows, token_ids] = np.where(x > 0, x * scale_pos, x * scale_neg) - subtract

    def scale(self, x, factor: float) -> None:
        x *= factor

    def softcap(self, x, cap: float) -> None:
        """x = tanh(x / cap) * cap, in place."""
        np.tanh(x / cap, out=x)
        x *= cap

    # ---- DFlash2 drafters (minillm/spec/dflash2.py) ----------------------------------------
    def grouped_causal_conv(self, x, base, dyn, half: int, group_size: int, block_rows: int, out) -> None:
        """DFlash2's grouped dynamic causal convolution along each block of block_rows rows:
        out[t, c] = sum over o < ks, o <= t % block_rows, of
                    (base[o, c] + dyn[t, (half * ks + o) * G + c // group_size]) * x[t - o, c]
        x, out [T, C]; base [ks, C] (one half of a conv's base_kernel); dyn [T, 2 * ks * G] (the
        conv's kernel_projection of its input, G = C / group_size); T a multiple of block_rows."""
        ks, (T, C) = base.shape[0], x.shape
        G = C // group_size
        at = np.arange(T) % block_rows
        acc = np.zeros((T, C), np.float32)
        for o in range(ks):
            shifted = np.zeros((T, C), np.float32)
            shifted[o:] = x[: T - o]
            shifted[at < o] = 0.0  # taps before the block's first row see zeros
            d = np.repeat(dyn[:, (half * ks + o) * G : (half * ks + o + 1) * G], group_size, axis=1)
            acc += base[o] * shifted
            acc += d * shifted
        out[...] = acc

    def dflash2_select(self, logits, hproj, input_ids, block_rows: int, k: int, pred, succ, top_k: int,
                       cand_ids, cand_vals, out) -> None:
        """DFlash2's candidate selector, greedy, for S = rows / k blocks of k logits rows each.
        Block s starts from prev = input_ids[s * block_rows] (its anchor, the last accepted token);
        its position p (row s * k + p) takes the top_k ids of its logits row (the largest values,
        ties to the lower id) into cand_ids[row] (ascending ids) and their logits into
        cand_vals[row], scores each candidate c as
            logits[row, c] + sum_r pred[prev, r] * hproj[row, r] * succ[c, r],
        writes the best (ties to the lower id) to out[row], and makes it prev."""
        rows = logits.shape[0]
        for s in range(rows // k):
            prev = int(input_ids[s * block_rows])
            for p in range(k):
                row = s * k + p
                lg = logits[row]
                kth = np.partition(lg, lg.size - top_k)[lg.size - top_k]
                above = np.flatnonzero(lg > kth)
                at = np.flatnonzero(lg == kth)[: top_k - above.size]
                ids = np.sort(np.concatenate([above, at]))
                cand_ids[row] = ids
                cand_vals[row] = lg[ids]
                pair = (pred[prev].astype(np.float32) * hproj[row].astype(np.float32))
                scores = lg[ids] + succ[ids].astype(np.float32) @ pair
                best = ids[np.flatnonzero(scores == scores.max())[0]]  # ids ascend: the first is the lowest
                out[row] = best
                prev = int(best)

    def sample(self, logits, temperature, top_p, top_k, seeds, positions, out_tokens,
               draft_tokens=None, out_accepted=None, min_p=None, draft_logits=None, draft_rows=None) -> None:
        _sample(logits, temperature, top_p, top_k, seeds, positions, out_tokens, draft_tokens,
                out_accepted, min_p, draft_logits, draft_rows)
