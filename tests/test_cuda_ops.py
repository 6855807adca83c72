"""Each CUDA op against its NumPy twin (the oracle), on fresh random inputs, outputs poisoned.

Inputs are rounded to the backend's storage dtype first and the oracle runs in float32 on the
same rounded values, so the tolerances only cover the output rounding and summation order:
bf16 storage ~1e-2 relative, fp32 storage ~1e-5. Every output buffer is filled with NaN before
the op runs, so an element the kernel forgot to write fails the comparison.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
from cuda_util import host, rel_err, rounded, tol

from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine import sampler as np_sampler

pytestmark = pytest.mark.gpu
REF = NumpyBackend()


def poisoned(be, shape, dtype=None):
    out = be.empty(shape, dtype=dtype)
    be.copy_from_host(out, np.full(shape, np.nan, dtype=np.float32).astype(out.dtype))
    return out


def i32(be, x):
    return be.asarray(np.asarray(x, dtype=np.int32), dtype=np.int32)


# ---- row ops ----------------------------------------------------------------------------------
def test_embed_gather_copy(be):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((1000, 96)).astype(np.float32)
    ids = rng.integers(0, 1000, 37).astype(np.int32)
    t_dev = be.asarray(table)
    out = poisoned(be, (37, 96))
    be.embed(i32(be, ids), t_dev, out)
    assert np.array_equal(host(be, out), rounded(be, table)[ids])

    idx = rng.integers(0, 37, 5).astype(np.int32)
    g = poisoned(be, (5, 96))
    be.gather_rows(out, i32(be, idx), g)
    assert np.array_equal(host(be, g), rounded(be, table)[ids][idx])

    big = poisoned(be, (37, 300))
    be.copy(out, big[:, 100:196])  # a strided destination, like the drafter's capture buffer
    h = host(be, big)
    assert np.array_equal(h[:, 100:196], rounded(be, table)[ids])
    assert np.isnan(h[:, :100]).all() and np.isnan(h[:, 196:]).all()


def test_fill_input_ids(be):
    """Async scheduling's fill: rows with a source take the previous step's sampled id, the rest
    (and everything past len(input_ids)) stay; equal to the NumPy twin."""
    rng = np.random.default_rng(11)
    for n, n_prev in ((1, 1), (37, 16), (700, 300)):  # 700 rows: more than one CTA
        ids = rng.integers(0, 50000, n + 5).astype(np.int32)
        prev = rng.integers(0, 150000, n_prev).astype(np.int32)
        src = np.where(rng.random(n + 5) < 0.6, rng.integers(0, n_prev, n + 5), -1).astype(np.int32)
        ref = ids.copy()
        REF.fill_input_ids(ref[:n], prev, src)
        dev = i32(be, ids)
        be.fill_input_ids(dev[:n], i32(be, prev), i32(be, src))
        got = be.to_host(dev)
        assert np.array_equal(got, ref) and np.array_equal(got[n:], ids[n:])
    with pytest.raises(TypeError):
        be.fill_input_ids(be.zeros((4,), np.float32), i32(be, prev), i32(be, src))


@pytest.mark.parametrize("seed", range(8))
def test_stage_inputs(be, seed):
    """A step's inputs read from pinned host memory by cuda/rows.cu stage_inputs: the runs' rows and
    the fill equal the NumPy twin's, every other byte of the poisoned buffer stays (test_step_staging
    has the cases); and a run of 96 KB, more units than one wave of CTAs' threads."""
    from test_step_staging import POISON, stage_case

    src, dst, runs, fill = stage_case(seed)
    want = dst.copy()
    REF.stage_inputs(want, src, runs, fill)
    dev = be.asarray(dst, dtype=np.uint8)
    if fill is not None:
        fill.prev_tokens = i32(be, fill.prev_tokens)
    be.stage_inputs(dev, src, runs, fill)
    assert np.array_equal(be.to_host(dev), want)
    big = np.random.default_rng(seed).integers(0, 256, 1 << 17, dtype=np.uint8)
    dev = be.asarray(np.full(big.shape[0], POISON, np.uint8), dtype=np.uint8)
    be.stage_inputs(dev, big, [(0, 1 << 16, 2, 48 << 10)])
    got = be.to_host(dev)
    assert np.array_equal(got[: 48 << 10], big[: 48 << 10]) and np.array_equal(got[1 << 16:][: 48 << 10],
                                                                                big[1 << 16:][: 48 << 10])
    assert (got[48 << 10: 1 << 16] == POISON).all() and (got[(1 << 16) + (48 << 10):] == POISON).all()
    with pytest.raises(TypeError):
        be.stage_inputs(be.zeros((64,), np.int32), src, runs)


def test_step_buffers_larger_than_the_staging_ring(be):
    """Step buffers whose full upload is larger than the backend's pinned ring (600 sequences of
    8,192 blocks: 19.7 MB of block tables) grow it at startup, and a step of every sequence uploads
    its rows intact (a blob past the ring once failed in np.frombuffer)."""
    from minillm.engine.runner import StepBuffers

    buf = StepBuffers(be, max_tokens=64, max_seqs=600, max_logits=8, max_blocks=8192)
    assert be._staging_cap >= 2 * buf.packed_host.shape[0]
    rng = np.random.default_rng(5)
    buf.host["block_tables"][:] = rng.integers(0, 1 << 20, buf.host["block_tables"].shape, dtype=np.int32)
    buf.host["positions"][:40] = np.arange(40)
    for _ in range(3):  # the ring wraps: each upload is past half of it
        buf.upload(599, 40, 8)
    assert np.array_equal(be.to_host(buf.dev["block_tables"][:599]), buf.host["block_tables"][:599])
    assert np.array_equal(be.to_host(buf.dev["positions"][:40]), np.arange(40))


def test_copy_to_pinned(be):
    """The readback's copy: a kernel's stores into a pinned slot equal the device array, alone or
    inside stage_inputs (a deferred readback); a pageable destination is refused (the kernel would
    fault on it)."""
    from minillm.engine.readback import TokenReadback

    rb = TokenReadback(be, 700)
    vals = np.random.default_rng(3).integers(-9, 150000, 700).astype(np.int32)
    slot, n = rb.start(i32(be, vals))
    assert n == 700 and np.array_equal(rb.wait((slot, n)), vals)
    with pytest.raises(ValueError, match="pinned"):
        be.copy_to_pinned(np.zeros(8, np.int32), i32(be, vals[:8]))
    # deferred: the copy rides on a stage_inputs launch (copy_out), or wait() queues it
    dev = i32(be, vals)
    ticket = rb.defer(dev[:600])
    staged = be.asarray(np.zeros(64, np.uint8), dtype=np.uint8)
    be.stage_inputs(staged, np.arange(64, dtype=np.uint8), [(0, 64, 1, 32)], copy_out=(dev[:600], rb.slot(ticket)))
    rb.queued(ticket)
    assert np.array_equal(rb.wait(ticket), vals[:600])
    assert np.array_equal(be.to_host(staged)[:32], np.arange(32)) and not be.to_host(staged)[32:].any()
    ticket = rb.defer(dev[:5])
    assert np.array_equal(rb.wait(ticket), vals[:5])
    with pytest.raises(ValueError, match="pinned"):
        be.stage_inputs(staged, np.arange(64, dtype=np.uint8), [(0, 64, 1, 32)],
                        copy_out=(dev[:8], np.zeros(8, np.int32)))


def test_advance_blocks(be):
    """A drafting step's blocks moved past each sequence's accepted drafts: positions, slots,
    context lengths, first input ids and the window's sample positions equal the NumPy twin's, bit
    for bit; rows past the blocks, and the other rows' ids, stay. Sequences with no drafts, all
    accepted, none, and one clamped to the end of its block table."""
    rng = np.random.default_rng(12)
    B, n, bs, width, first, count = 6, 16, 16, 8, 1, 8
    tables = rng.permutation(200)[: B * width].reshape(B, width).astype(np.int32)
    r_total = 60
    tokens = rng.integers(0, 50000, r_total).astype(np.int32)
    accepted = (rng.random(r_total) < 0.7).astype(np.int32)
    rows = np.array([0, 9, 18, 27, 36, 45], np.int32)
    drafts = np.array([8, 8, 0, 8, 5, 8], np.int32)
    accepted[9:17] = 1  # sequence 1: all 8 accepted
    accepted[27] = 0  # sequence 3: none
    base = np.array([3, 40, 17, 100, 64, width * bs - n - 2], np.int32)
    limit = np.full(B, width * bs - n, np.int32)  # sequence 5 reaches it: its start is clamped
    accepted[45:53] = 1
    size = B * n + 7
    arrays = {name: rng.integers(-5, 5, size if name != "seq_lens" else B + 2).astype(np.int32)
              for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "sample_pos")}
    ref = {k: v.copy() for k, v in arrays.items()}
    REF.advance_blocks(*ref.values(), tables, bs, tokens, accepted, rows, drafts, base, limit, n, first, count)
    dev = {k: i32(be, v) for k, v in arrays.items()}
    be.advance_blocks(*dev.values(), i32(be, tables), bs, i32(be, tokens), i32(be, accepted), i32(be, rows),
                      i32(be, drafts), i32(be, base), i32(be, limit), n, first, count)
    for k in arrays:
        assert np.array_equal(be.to_host(dev[k]), ref[k]), k
    assert ref["positions"][5 * n] == limit[5]  # clamped
    assert ref["positions"][n] == base[1] + 8 and ref["input_ids"][n] == tokens[9 + 8]
    assert ref["positions"][3 * n] == base[3] and ref["input_ids"][2 * n] == tokens[18]
    assert np.array_equal(ref["input_ids"][1:n], arrays["input_ids"][1:n])  # only first ids change
    assert np.array_equal(ref["positions"][B * n:], arrays["positions"][B * n:])


def test_store_kv_skips_padding_rows(be):
    rng = np.random.default_rng(2)
    nb, bs, KH, D, T = 10, 16, 2, 64, 12
    qkv = rng.standard_normal((T, (4 + 2 * KH) * D)).astype(np.float32)
    q_dev = be.asarray(qkv)
    k = q_dev[:, 4 * D: (4 + KH) * D].reshape(T, KH, D)
    v = q_dev[:, (4 + KH) * D:].reshape(T, KH, D)
    kc0 = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    vc0 = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    kc, vc = be.asarray(kc0), be.asarray(vc0)
    slots = rng.permutation(nb * bs)[:T].astype(np.int32)
    slots[[3, 7]] = -1
    be.store_kv(k, v, kc, vc, i32(be, slots))
    rk, rv = rounded(be, kc0), rounded(be, vc0)
    r = rounded(be, qkv)
    REF.store_kv(r[:, 4 * D:(4 + KH) * D].reshape(T, KH, D), r[:, (4 + KH) * D:].reshape(T, KH, D),
                 rk, rv, slots)
    assert np.array_equal(host(be, kc), rk) and np.array_equal(host(be, vc), rv)


# ---- norms / activation -------------------------------------------------------------------------
@pytest.mark.parametrize("N", [64, 576, 1000, 1004, 4096, 8192])  # 1004: not 8-aligned, scalar kernel
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(be, N, with_residual):
    rng = np.random.default_rng(N)
    rows = 33
    x = rng.standard_normal((rows, N)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)
    res = rng.standard_normal((rows, N)).astype(np.float32)
    out = poisoned(be, (rows, N))
    r_dev = be.asarray(res) if with_residual else None
    be.rms_norm(be.asarray(x), be.asarray(w), 1e-6, out, residual=r_dev)
    rr = rounded(be, res) if with_residual else None
    ref = np.empty_like(x)
    REF.rms_norm(rounded(be, x), rounded(be, w), 1e-6, ref, residual=rr)
    assert rel_err(host(be, out), ref) < tol(be)
    if with_residual:
        assert rel_err(host(be, r_dev), rr) < tol(be) / 2


def rope_case(rng, T: int, H: int, KH: int, D: int):
    """A Qwen3-style RoPE table, a fused qkv activation [T, (H + 2 KH) D], q/k norm weights and
    positions: the inputs of qk_norm_rope and qk_norm_rope_store_kv."""
    from minillm.models.config import ModelConfig
    from minillm.models.rope import cos_sin_table

    cfg = ModelConfig(arch="qwen3", vocab_size=10, hidden_size=H * D, num_layers=1, num_heads=H,
                      num_kv_heads=KH, head_dim=D, intermediate_size=10, rope_theta=1e6)
    cs = cos_sin_table(cfg, 4096)
    qkv = rng.standard_normal((T, (H + 2 * KH) * D)).astype(np.float32)
    qw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    kw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    pos = rng.integers(0, 4096, T).astype(np.int32)
    return cs, qkv, qw, kw, pos


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_qk_norm_rope(be, D, qk_norm):
    T, H, KH = 9, 8, 2
    cs, qkv, qw, kw, pos = rope_case(np.random.default_rng(D + qk_norm), T, H, KH, D)
    dev = be.asarray(qkv)
    q = dev[:, : H * D].reshape(T, H, D)
    k = dev[:, H * D: (H + KH) * D].reshape(T, KH, D)
    be.qk_norm_rope(q, k, be.asarray(qw) if qk_norm else None, be.asarray(kw) if qk_norm else None,
                    1e-6, i32(be, pos), be.asarray(cs, dtype=np.float32))
    ref = rounded(be, qkv)
    REF.qk_norm_rope(ref[:, : H * D].reshape(T, H, D), ref[:, H * D: (H + KH) * D].reshape(T, KH, D),
                     rounded(be, qw) if qk_norm else None, rounded(be, kw) if qk_norm else None,
                     1e-6, pos, cs)
    got = host(be, dev)
    assert rel_err(got[:, : (H + KH) * D], ref[:, : (H + KH) * D]) < tol(be)
    assert np.array_equal(got[:, (H + KH) * D:], ref[:, (H + KH) * D:])  # v untouched


@pytest.mark.parametrize("D", [32, 64, 128, 256])  # 32: the shared-memory path, others registers
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("H,KH", [(8, 2), (9, 3)])  # 12 heads: 3 full CTAs; 15: a partial one
def test_qk_norm_rope_store_kv(be, D, qk_norm, H, KH, monkeypatch):
    """The fused op against the oracle, and bit for bit against qk_norm_rope then store_kv, and
    against itself launched as one CTA a token (the grid of large steps)."""
    rng = np.random.default_rng(D + qk_norm + H)
    T, nb, bs = 12, 10, 16
    cs, qkv, qw, kw, pos = rope_case(rng, T, H, KH, D)
    kc0 = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    vc0 = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    slots = rng.permutation(nb * bs)[:T].astype(np.int32)
    slots[[3, 7]] = -1  # padding rows: rotated in place, never stored

    def split(a):
        return (a[:, : H * D].reshape(T, H, D), a[:, H * D: (H + KH) * D].reshape(T, KH, D),
                a[:, (H + KH) * D:].reshape(T, KH, D))

    def run(fused: bool):
        dev, kc, vc = be.asarray(qkv), be.asarray(kc0), be.asarray(vc0)
        q, k, v = split(dev)
        w = (be.asarray(qw), be.asarray(kw)) if qk_norm else (None, None)
        args = (1e-6, i32(be, pos), be.asarray(cs, dtype=np.float32))
        if fused:
            be.qk_norm_rope_store_kv(q, k, v, *w, *args, kc, vc, i32(be, slots))
        else:
            be.qk_norm_rope(q, k, *w, *args)
            be.store_kv(k, v, kc, vc, i32(be, slots))
        return host(be, dev), host(be, kc), host(be, vc)

    got = run(fused=True)
    for a, b in zip(got, run(fused=False)):
        assert np.array_equal(a, b)
    if be.name == "cuda":
        from minillm.backends import cuda_ops

        monkeypatch.setattr(cuda_ops, "_QK_TOKEN_CTA_MIN", 1)  # every warp walks several heads
        for fused in (True, False):
            for a, b in zip(got, run(fused)):
                assert np.array_equal(a, b)
    ref, rk, rv = rounded(be, qkv), rounded(be, kc0), rounded(be, vc0)
    REF.qk_norm_rope_store_kv(*split(ref), rounded(be, qw) if qk_norm else None,
                              rounded(be, kw) if qk_norm else None, 1e-6, pos, cs, rk, rv, slots)
    assert rel_err(got[0], ref) < tol(be)  # q and k rotated in place, v untouched
    written = np.zeros(nb * bs, bool)
    written[slots[slots >= 0]] = True
    gk, gv = got[1].reshape(nb * bs, -1), got[2].reshape(nb * bs, -1)
    rk, rv = rk.reshape(nb * bs, -1), rv.reshape(nb * bs, -1)
    assert rel_err(gk[written], rk[written]) < tol(be)
    assert np.array_equal(gk[~written], rk[~written]) and np.array_equal(gv, rv)


@pytest.mark.parametrize("F", [1000, 1001])
def test_silu_mul(be, F):
    """F = 1000 takes bf16's 8-column kernel, 1001 the one-column one; a row stride that is no
    multiple of 8 sends the same data through the one-column kernel: the same bits."""
    rng = np.random.default_rng(3)
    gu = (2 * rng.standard_normal((17, 2 * F))).astype(np.float32)
    out = poisoned(be, (17, F))
    be.silu_mul(be.asarray(gu), out)
    ref = np.empty((17, F), np.float32)
    REF.silu_mul(rounded(be, gu), ref)
    assert rel_err(host(be, out), ref) < tol(be)
    padded = be.asarray(np.pad(gu, ((0, 0), (0, 1))))[:, : 2 * F]  # row stride 2F + 1
    out2 = poisoned(be, (17, F))
    be.silu_mul(padded, out2)
    assert np.array_equal(host(be, out2), host(be, out))


def test_logit_transforms(be):
    rng = np.random.default_rng(4)
    x = (20 * rng.standard_normal((6, 500))).astype(np.float32)
    for op, arg in (("scale", 0.37), ("softcap", 30.0)):
        d = be.asarray(x, dtype=np.float32)
        getattr(be, op)(d, arg)
        ref = x.copy()
        getattr(REF, op)(ref, arg)
        assert rel_err(host(be, d), ref) < 1e-5
    d = be.asarray(x, dtype=np.float32)
    rows, ids = np.array([0, 0, 5, 2], np.int32), np.array([1, 499, 0, 7], np.int32)
    be.suppress_tokens(d, rows, ids)  # host index lists, as the runner passes them
    ref = x.copy()
    REF.suppress_tokens(ref, rows, ids)
    assert np.array_equal(host(be, d), ref)
    # penalties: random entries, each (row, token) once; then 70,000 (more than one scratch load)
    flat = rng.choice(6 * 500, size=2900, replace=False)
    rows, ids = (flat // 500).astype(np.int32), (flat % 500).astype(np.int32)
    pos, neg = rng.uniform(0.5, 2, 2900).astype(np.float32), rng.uniform(0.5, 2, 2900).astype(np.float32)
    sub = rng.uniform(-2, 2, 2900).astype(np.float32)
    d = be.asarray(x, dtype=np.float32)
    be.penalize_logits(d, rows, ids, pos, neg, sub)
    ref = x.copy()
    REF.penalize_logits(ref, rows, ids, pos, neg, sub)
    assert rel_err(host(be, d), ref) < 1e-6
    big = np.tile(np.arange(500, dtype=np.int32), 140)[:70000]
    big_rows = np.repeat(np.arange(140, dtype=np.int32), 500)[:70000]
    logits = rng.standard_normal((140, 500)).astype(np.float32)
    d = be.asarray(logits, dtype=np.float32)
    ones = np.ones(70000, np.float32)
    be.penalize_logits(d, big_rows, big, ones, ones, ones)
    assert rel_err(host(be, d), logits - 1) < 1e-6


@pytest.mark.parametrize("V", [500, 4096, 151936])
def test_mask_logits(be, V):
    """Structured outputs' bans: random bitmasks on some rows, a mask narrower than the logits
    (tokens past it banned), and more rows than one scratch load takes at V = 151,936."""
    rng = np.random.default_rng(V)
    n_rows = 40 if V == 151936 else 6
    x = rng.standard_normal((n_rows, V)).astype(np.float32)
    rows = rng.permutation(n_rows)[: n_rows - 1].astype(np.int32)
    words = (V + 31) // 32 - (1 if V == 4096 else 0)  # at 4096: the last 32 tokens lie past the mask
    bitmask = rng.integers(-(2**31), 2**31, size=(rows.size, words), dtype=np.int64).astype(np.int32)
    d = be.asarray(x, dtype=np.float32)
    be.mask_logits(d, rows, bitmask)
    ref = x.copy()
    REF.mask_logits(ref, rows, bitmask)
    got = host(be, d)
    assert np.array_equal(np.isneginf(got), np.isneginf(ref))
    assert np.array_equal(got[np.isfinite(ref)], ref[np.isfinite(ref)])
    assert np.isfinite(ref[[r for r in range(n_rows) if r not in rows]]).all()  # unmasked rows untouched


# ---- matmul -----------------------------------------------------------------------------------
@pytest.mark.parametrize("M,K,N", [(1, 64, 96), (7, 200, 1000), (64, 512, 384), (300, 128, 4096),
                                   (3, 1024, 1537), (8, 4096, 260), (9, 64, 33), (1, 1000, 1537),
                                   (1, 4104, 300), (2, 1024, 1537)])
# M <= 4: cuda/gemv.cu (1: gemv1, the last group partial; 2 rows even where K suits the skinny GEMM)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out_f32", [False, True])
def test_matmul(be, M, K, N, bias, out_f32):
    rng = np.random.default_rng(M * N + bias)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    out = poisoned(be, (M, N), dtype=np.float32 if out_f32 else None)
    be.matmul(be.asarray(x), be.asarray(w), out, bias=be.asarray(b) if bias else None)
    ref = rounded(be, x).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    if bias:
        ref += rounded(be, b)
    t = 1e-5 if (be.dtype == np.float32 or out_f32) else tol(be)
    assert rel_err(host(be, out), ref) < t


def test_matmul_with_marked_cublas_outputs(be):
    """Under MINILLM_INITCHECK=1 a cuBLAS product's output is zeroed before the GEMM (a write
    initcheck sees); the product must come out the same, in a row-strided output too."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = (rng.standard_normal((384, 256)) / 16).astype(np.float32)
    wide = poisoned(be, (64, 400))
    be.mark_blas_outputs, wide_gemm = True, be.wide_gemm
    be.wide_gemm = False  # under MINILLM_GEMM=wide 64 rows would go to cuda/gemm.cu
    try:
        be.matmul(be.asarray(x), be.asarray(w), wide[:, :384])
    finally:
        be.mark_blas_outputs, be.wide_gemm = False, wide_gemm
    ref = rounded(be, x).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    got = host(be, wide)
    assert rel_err(got[:, :384], ref) < tol(be)
    assert np.isnan(got[:, 384:]).all(), "the zeroing went past the output's columns"


@pytest.mark.parametrize("M,K,N", [(48, 512, 256), (192, 1024, 1024)])
def test_cublaslt_candidates(be, M, K, N):
    """Every algorithm cuBLASLt's heuristic offers (minillm/backends/cublaslt.py, what
    scripts/cublaslt_bench.py times) computes the product, each into a freshly poisoned output."""
    from minillm.backends.cublas import cuda_dtype
    from minillm.backends.cublaslt import CublasLt

    rng = np.random.default_rng(M + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    dx, dw = be.asarray(x), be.asarray(w)
    ref = rounded(be, x).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    t = cuda_dtype(be.dtype)
    lt = CublasLt(be.stream.ptr, be._blas_ws.data.ptr, be._blas_ws.nbytes)
    try:
        p = lt.product(M, N, K, t, K, t, K, t, N)
        assert p.candidates, "the heuristic offered no algorithm"
        for i in range(len(p.candidates)):
            out = poisoned(be, (M, N))
            lt.matmul(p, i, dx.data.ptr, dw.data.ptr, out.data.ptr)
            assert rel_err(host(be, out), ref) < tol(be), f"candidate {i} of {len(p.candidates)}"
    finally:
        lt.close()


@pytest.mark.parametrize("M", [3, 4, 5, 8, 9, 16])  # (2 rows go to the GEMV: _GEMV_PREFERRED_M)
@pytest.mark.parametrize("K,N", [(64, 16), (576, 1000), (1024, 4096), (3072, 1030)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out_f32", [False, True])
def test_matmul_skinny(be, M, K, N, bias, out_f32):
    """3-16 bf16 rows go to cuda/gemv.cu's tensor-core kernel (its permuted k order must give the
    plain dot products), x rows inside a wider buffer; also replayed in a graph."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    rng = np.random.default_rng(M * N + K + bias)
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    xd, wd, bd = be.asarray(big)[:, 64:], be.asarray(w), be.asarray(b) if bias else None
    out = poisoned(be, (M, N), dtype=np.float32 if out_f32 else None)
    assert be._gemv_fits(xd, wd, out, bd, M, K, xd.strides[0] // xd.itemsize)
    from minillm.backends.cuda_ops import small_product_kernel
    assert small_product_kernel(M, N, K) == "skinny"
    from minillm.backends.cuda_ops import _SKINNY_TWO_TILE_MAX_W
    assert N * K <= _SKINNY_TWO_TILE_MAX_W  # so 9-16 rows take the kernel too
    be.matmul(xd, wd, out, bias=bd)
    ref = rounded(be, big[:, 64:]).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    if bias:
        ref += rounded(be, b)
    assert rel_err(host(be, out), ref) < (1e-5 if out_f32 else tol(be))
    out2 = poisoned(be, (M, N), dtype=np.float32 if out_f32 else None)
    g = be.capture_graph(lambda: be.matmul(xd, wd, out2, bias=bd))
    g.replay()
    assert np.array_equal(host(be, out2), host(be, out))


def skinny_products(be, x, w, b, M: int, prefix: str):
    """prefix + "bf16" (gemm_skinny_, gemm_skinny2_ or gemm_skinny4_) of x[:M] with all 2N rows of w (+ b), and
    prefix + "silu_mul_bf16" with w as [gate; up]: the two outputs."""
    from minillm.backends import compile as kc

    K, N = x.shape[1], w.shape[0] // 2
    plain, gated = poisoned(be, (M, 2 * N)), poisoned(be, (M, N))
    with be.stream:
        kc.get_kernel("gemv", prefix + "bf16", False)(
            ((2 * N + 15) // 16,), (256,),
            (x, np.int64(K), w, b, plain, np.int64(2 * N), np.int32(M), np.int32(2 * N), np.int32(K)))
        kc.get_kernel("gemv", prefix + "silu_mul_bf16", False)(
            ((N + 15) // 16,), (256,), (x, np.int64(K), w, gated, np.int64(N), np.int32(M), np.int32(N), np.int32(K)))
    be.synchronize()
    return host(be, plain), host(be, gated)


@pytest.mark.parametrize("M", [9, 13, 16])
@pytest.mark.parametrize("K,N", [(64, 40), (576, 1000), (12288, 520)])
def test_skinny2_same_bits_as_skinny(be, M, K, N):
    """9-16 rows: gemm_skinny2_* (the two-tile kernels, software-pipelined loads) give the bits of
    gemm_skinny_*'s two-tile case (the unpipelined loop, which the host sent them to before session
    26): the same sums in the same order, plain and gated, with warps that get no k block (K = 64),
    fewer blocks than warps, and the 8B down product's K (12,288)."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    rng = np.random.default_rng(M * K + N)
    x = be.asarray(rng.standard_normal((16, K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((2 * N, K)) / np.sqrt(K)).astype(np.float32))
    b = be.asarray(rng.standard_normal(2 * N).astype(np.float32))
    two = skinny_products(be, x, w, b, M, "gemm_skinny2_")
    one = skinny_products(be, x, w, b, M, "gemm_skinny_")
    assert not np.isnan(two[0]).any() and not np.isnan(two[1]).any()
    assert np.array_equal(two[0], one[0]) and np.array_equal(two[1], one[1])
    ref = rounded(be, host(be, x)[:M]).astype(np.float64) @ host(be, w).astype(np.float64).T + host(be, b)
    assert rel_err(two[0], ref) < tol(be)


@pytest.mark.parametrize("M", [17, 24, 32])
@pytest.mark.parametrize("K,N", [(64, 40), (576, 1000), (4096, 520)])
def test_skinny4_rows_are_skinny2s(be, M, K, N):
    """17-32 rows: gemm_skinny4_* (four 8-row tiles, opt-in) give, row for row, the bits of
    gemm_skinny2_* on the first 16 rows and on the rest: each row's sums run over the same k blocks
    in the same order whatever tile it sits in, plain and gated; and the oracle's values."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    rng = np.random.default_rng(M * K + N + 4)
    x = be.asarray(rng.standard_normal((32, K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((2 * N, K)) / np.sqrt(K)).astype(np.float32))
    b = be.asarray(rng.standard_normal(2 * N).astype(np.float32))
    four = skinny_products(be, x, w, b, M, "gemm_skinny4_")
    head = skinny_products(be, x, w, b, 16, "gemm_skinny2_")
    tail = skinny_products(be, x[16:], w, b, M - 16, "gemm_skinny2_")
    for i in range(2):  # plain, gated
        assert not np.isnan(four[i]).any()
        assert np.array_equal(four[i][:16], head[i]) and np.array_equal(four[i][16:], tail[i])
    ref = rounded(be, host(be, x)[:M]).astype(np.float64) @ host(be, w).astype(np.float64).T + host(be, b)
    assert rel_err(four[0], ref) < tol(be)


@pytest.mark.parametrize("M", [9, 16])
@pytest.mark.parametrize("K,per_sm,short", [(4096, 3, 0), (576, 3, 40), (1024, 4, 8)])
@pytest.mark.parametrize("out_f32", [False, True])
def test_skinny2w4_products(be, M, K, per_sm, short, out_f32, monkeypatch):
    """MINILLM_SKINNY2_W4: a 9-16-row product whose grid of 16-column CTAs is past 2 an SM and at
    most 4 (the 8B qkv's 384 CTAs on 132 SMs) takes gemm_skinny2w4_* (4 warps a CTA, each twice the
    k blocks): the oracle's values with a last CTA's columns cut short, x rows inside a wider buffer,
    outputs poisoned, a graph replay's bits and its launch record; with the knob off, gemm_skinny2_*."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    N = 16 * per_sm * be.num_sms - short
    rng = np.random.default_rng(M * K + N)
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    xd, wd, bd = be.asarray(big)[:, 64:], be.asarray(w), be.asarray(b)
    dtype = np.float32 if out_f32 else None
    monkeypatch.setattr(be, "skinny2_w4", 1)
    out = poisoned(be, (M, N), dtype=dtype)
    before = Counter(be.captured_launches)
    g = be.capture_graph(lambda: be.matmul(xd, wd, out, bias=bd))
    g.replay()
    kernel = "gemm_skinny2w4_" + ("f32" if out_f32 else "bf16")
    assert be.captured_launches - before == Counter({kernel: 1})
    ref = rounded(be, big[:, 64:]).astype(np.float64) @ rounded(be, w).astype(np.float64).T + rounded(be, b)
    assert rel_err(host(be, out), ref) < (1e-5 if out_f32 else tol(be))
    out2 = poisoned(be, (M, N), dtype=dtype)
    be.matmul(xd, wd, out2, bias=bd)
    assert np.array_equal(host(be, out2), host(be, out))
    monkeypatch.setattr(be, "skinny2_w4", 0)
    before = Counter(be.captured_launches)
    be.capture_graph(lambda: be.matmul(xd, wd, out2, bias=bd))
    assert be.captured_launches - before == Counter({"gemm_skinny2_" + ("f32" if out_f32 else "bf16"): 1})


@pytest.mark.parametrize("M", [17, 26, 32])
def test_matmul_routes_17_to_32_rows_to_skinny4_when_raised(be, M, monkeypatch):
    """With _SKINNY_MAX_M and _GATED_SKINNY_MAX_M raised to 32 (the opt-in route), the backend's
    matmul and matmul_silu_mul send 17-32 rows to gemm_skinny4_* (the fused product leaves gate_up
    unwritten): the oracle's values, x rows inside a wider buffer, and a graph replay's bits."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    from minillm.backends import cuda_ops

    monkeypatch.setattr(cuda_ops, "_SKINNY_MAX_M", 32)
    monkeypatch.setattr(cuda_ops, "_GATED_SKINNY_MAX_M", 32)
    K, N, F = 1024, 1000, 520
    rng = np.random.default_rng(M)
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    wg = (2 * rng.standard_normal((2 * F, K)) / np.sqrt(K)).astype(np.float32)
    xd, wd, wgd = be.asarray(big)[:, 64:], be.asarray(w), be.asarray(wg)
    assert cuda_ops.small_product_kernel(M, N, K) == "skinny" and cuda_ops.gated_product_kernel(M, F, K) == "skinny"
    out, act, gate_up = poisoned(be, (M, N)), poisoned(be, (M, F)), poisoned(be, (M, 2 * F))
    be.matmul(xd, wd, out)
    be.matmul_silu_mul(xd, wgd, act, gate_up)
    xr = rounded(be, big[:, 64:]).astype(np.float64)
    assert rel_err(host(be, out), xr @ rounded(be, w).astype(np.float64).T) < tol(be)
    ref = np.empty((M, F))
    REF.silu_mul(xr @ rounded(be, wg).astype(np.float64).T, ref)
    assert rel_err(host(be, act), ref) < tol(be)
    assert np.isnan(host(be, gate_up)).all()
    out2, act2 = poisoned(be, (M, N)), poisoned(be, (M, F))
    before = Counter(be.captured_launches)
    g = be.capture_graph(lambda: (be.matmul(xd, wd, out2), be.matmul_silu_mul(xd, wgd, act2, gate_up)))
    g.replay()
    assert np.array_equal(host(be, out2), host(be, out)) and np.array_equal(host(be, act2), host(be, act))
    # the graph's record of its launches (scripts/ab_table.py compares settings by it)
    assert be.captured_launches - before == Counter({"gemm_skinny4_bf16": 1, "gemm_skinny4_silu_mul_bf16": 1})
    monkeypatch.setattr(cuda_ops, "_SKINNY_MAX_M", 16)
    before = Counter(be.captured_launches)
    be.capture_graph(lambda: be.matmul(xd, wd, out2))
    assert be.captured_launches - before == Counter({"cublas": 1})


@pytest.mark.parametrize("M", [17, 40, 64, 65, 128, 150, 192, 256])
@pytest.mark.parametrize("K,N", [(128, 64), (512, 192), (2048, 1024), (1024, 4096), (3072, 1024)])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_wide(be, M, K, N, bias):
    """17-256 bf16 rows go to cuda/gemm.cu when it is on (K split over a cluster of 1-8 CTAs,
    partial tiles summed through distributed shared memory): x rows inside a wider buffer, a
    row-strided output whose other columns stay untouched; the first 17 rows alone give the same
    bits (the split does not depend on M); a graph replay gives the same bits."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    from minillm.backends.cuda_ops import wide_product_plan
    assert be.wide_gemm_possible, "the H200 runs cuda/gemm.cu"
    assert wide_product_plan(M, N, K, be.num_sms) is not None
    saved, be.wide_gemm = be.wide_gemm, True  # opt-in in the engine (MINILLM_GEMM=wide)
    try:
        _check_wide_product(be, M, K, N, bias)
    finally:
        be.wide_gemm = saved


def _check_wide_product(be, M, K, N, bias):
    rng = np.random.default_rng(M * N + K + bias)
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    xd, wd, bd = be.asarray(big)[:, 64:], be.asarray(w), be.asarray(b) if bias else None
    wide = poisoned(be, (M, N + 8))
    be.matmul(xd, wd, wide[:, :N], bias=bd)
    ref = rounded(be, big[:, 64:]).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    if bias:
        ref += rounded(be, b)
    got = host(be, wide)
    assert rel_err(got[:, :N], ref) < tol(be)
    assert np.isnan(got[:, N:]).all(), "written past the output's columns"
    few = poisoned(be, (17, N))
    be.matmul(xd[:17], wd, few, bias=bd)
    assert np.array_equal(host(be, few), got[:17, :N]), "a row's result depends on the batch"
    again = poisoned(be, (M, N))
    g = be.capture_graph(lambda: be.matmul(xd, wd, again, bias=bd))
    g.replay()
    assert np.array_equal(host(be, again), got[:, :N])


class _NoBlas:
    """Stands in for the backend's cuBLAS handle: any product sent to it fails the test."""

    def gemm_xwt(self, *args):
        raise AssertionError("a product went to cuBLAS under MINILLM_GEMM=own")


@pytest.mark.parametrize("M", [5, 9, 16, 24, 32, 40, 100])
@pytest.mark.parametrize("K,N,out_f32", [(1024, 151_936, True),  # the 0.6B LM head (fp32 logits)
                                         (1024, 4096, False), (3072, 1000, False), (128, 64, False)])
def test_matmul_own_route_has_no_cublas(be, M, K, N, out_f32, monkeypatch):
    """MINILLM_GEMM=own (sanitizer runs): every bf16 product of up to 32 rows goes to the skinny
    kernels whatever its weight (the LM head's 151,936 rows included), up to 256 rows of bf16 output
    to cuda/gemm.cu; none reaches cuBLAS, and the values are the oracle's."""
    if be.dtype == np.float32:
        pytest.skip("the own kernels are the bf16 path")
    if out_f32 and M > 32:
        pytest.skip("fp32 outputs past 32 rows stay on cuBLAS (cuda/gemm.cu writes bf16)")
    if M > 32 and N % 64:
        pytest.skip("past 32 rows cuda/gemm.cu takes whole 64-column tiles; the rest stays on cuBLAS")
    monkeypatch.setattr(be, "own_gemm", True)
    monkeypatch.setattr(be, "wide_gemm", True)
    monkeypatch.setattr(be, "blas", _NoBlas())
    rng = np.random.default_rng(M * 7 + N)
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    xd, wd = be.asarray(big)[:, 64:], be.asarray(w)
    out = poisoned(be, (M, N), dtype=np.float32 if out_f32 else None)
    be.matmul(xd, wd, out)
    ref = rounded(be, big[:, 64:]).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    assert rel_err(host(be, out), ref) < (1e-5 if out_f32 else tol(be))


def test_gemv_strided_rows_and_graph(be):
    """Decode-sized products with x rows inside a wider buffer (the model's views), also replayed."""
    rng = np.random.default_rng(5)
    M, K, N = 4, 1024, 3000
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    xd = be.asarray(big)[:, 64:]
    wd = be.asarray(w)
    out = poisoned(be, (M, N))
    be.matmul(xd, wd, out)
    ref = rounded(be, big[:, 64:]).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    assert rel_err(host(be, out), ref) < tol(be)
    out2 = poisoned(be, (M, N))
    g = be.capture_graph(lambda: be.matmul(xd, wd, out2))
    g.replay()
    assert np.array_equal(host(be, out2), host(be, out))


@pytest.mark.parametrize("M,K,F", [(1, 64, 96), (2, 200, 50), (3, 200, 70),  # gemv_silu_mul
                                   (3, 1024, 1537), (4, 4096, 260), (8, 512, 300), (3, 4096, 4100),
                                   (9, 1024, 1000), (12, 256, 33), (16, 4096, 520),  # gemm_skinny_silu_mul
                                   (9, 4096, 12288),  # gemm_skinny2_silu_mul: the 8B gate_up (session 26)
                                   (33, 256, 1000), (5, 200, 70)])  # unfused: cuBLAS, then silu_mul
def test_matmul_silu_mul(be, M, K, F):
    """The fused gate_up products + SiLU-and-multiply against the oracle, x rows inside a wider
    buffer (the model's views): gemv_silu_mul for 1-2 rows (3-4 where K % 64 != 0),
    gemm_skinny_silu_mul for 3-16 rows with K % 64 == 0 (one and two 8-row tiles, F not a
    multiple of 16; no case here is over its 9-16-row size bound); a fused launch leaves the
    gate_up buffer unwritten, and replays in a graph. Other shapes go unfused (a product into
    gate_up, then silu_mul)."""
    if F * K > (1 << 22) and be.dtype == np.float32:
        pytest.skip("the large gate_up is a bf16 dispatch case")
    rng = np.random.default_rng(M * F + K)
    big = rng.standard_normal((M, K + 64)).astype(np.float32)
    w = (2 * rng.standard_normal((2 * F, K)) / np.sqrt(K)).astype(np.float32)
    xd, wd = be.asarray(big)[:, 64:], be.asarray(w)
    out, gate_up = poisoned(be, (M, F)), poisoned(be, (M, 2 * F))
    be.matmul_silu_mul(xd, wd, out, gate_up)
    gu = rounded(be, big[:, 64:]).astype(np.float64) @ rounded(be, w).astype(np.float64).T
    ref = np.empty((M, F))
    REF.silu_mul(gu, ref)
    got = host(be, out)
    assert rel_err(got, ref) < tol(be)
    from minillm.backends.cuda_ops import _SKINNY_TWO_TILE_MAX_W, gated_product_kernel
    kernel = gated_product_kernel(M, F, K) if be.dtype != np.float32 else None
    if be.dtype != np.float32:  # the cases above cover each route
        assert kernel == ("gemv" if M <= 2 or (M <= 4 and K % 64) else
                          "skinny" if K % 64 == 0 and (M <= 8 or (M <= 16 and 2 * F * K <= _SKINNY_TWO_TILE_MAX_W))
                          else None)
    fused = kernel is not None
    assert np.isnan(host(be, gate_up)).all() == fused
    out2 = poisoned(be, (M, F))
    g = be.capture_graph(lambda: be.matmul_silu_mul(xd, wd, out2, gate_up))
    g.replay()
    assert np.array_equal(host(be, out2), got)


def one_row_inputs(be, K: int, N: int):
    """A random bf16 row x [1, K], weights w [2N, K] and bias b [2N] (skips the fp32 backend)."""
    if be.dtype == np.float32:
        pytest.skip("cuda/gemv.cu is the bf16 path")
    rng = np.random.default_rng(K + N)
    x = be.asarray(rng.standard_normal((1, K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((2 * N, K)) / np.sqrt(K)).astype(np.float32))
    return x, w, be.asarray(rng.standard_normal(2 * N).astype(np.float32))


def one_row_gemvs(be, x, w, b, defines=()):
    """gemv1_bf16 of x with all 2N rows of w (+ b) and gemv1_silu_mul_bf16 with w as [gate; up],
    built with defines: the two outputs."""
    from minillm.backends import compile as kc

    K, N = x.shape[1], w.shape[0] // 2
    plain, gated = poisoned(be, (1, 2 * N)), poisoned(be, (1, N))
    with be.stream:
        kc.get_kernel("gemv", "gemv1_bf16", False, defines)(
            ((2 * N + 7) // 8,), (128,),
            (x, np.int64(K), w, b, plain, np.int64(2 * N), np.int32(2 * N), np.int32(K)))
        kc.get_kernel("gemv", "gemv1_silu_mul_bf16", False, defines)(
            ((N + 7) // 8,), (128,), (x, np.int64(K), w, gated, np.int64(N), np.int32(N), np.int32(K)))
    be.synchronize()
    return host(be, plain), host(be, gated)


@pytest.mark.parametrize("K,N", [(64, 96), (1000, 1537), (1024, 4096), (4104, 300)])
def test_one_row_gemv_staged_loads_same_bits(be, K, N):
    """gemv1_* (one row: four chunks' loads issued before any FMA) against the same kernels built
    with GEMV_STAGED=0 (the plain unrolled loop): the same sums in the same order, so the same
    bits, the gated product included; chunk counts that leave the last group partial."""
    x, w, b = one_row_inputs(be, K, N)
    (p1, g1), (p0, g0) = (one_row_gemvs(be, x, w, b, defines) for defines in ((), ("GEMV_STAGED=0",)))
    assert not np.isnan(p1).any() and not np.isnan(g1).any()
    assert np.array_equal(p1, p0) and np.array_equal(g1, g0)
    ref = rounded(be, host(be, x)).astype(np.float64) @ host(be, w).astype(np.float64).T + host(be, b)
    assert rel_err(p1, ref) < tol(be)


@pytest.mark.parametrize("K,N", [(64, 96), (1000, 1537), (4104, 300), (4096, 2050)])
def test_one_row_split_and_deep_kernels_same_bits(be, K, N):
    """gemv1_silu_mul_split_bf16 (gate and up rows on different warps of a CTA) gives
    gemv1_silu_mul_bf16's bits, and gemv1_deep_bf16 (8 chunks a lane in flight) and gemv1_pre_bf16
    (its first weights loaded before the PDL wait) gemv1_bf16's: the same sums in the same order.
    Column counts that leave a CTA's last warps past the end (they must still reach the split
    kernel's barrier) and chunk counts that leave the last group partial."""
    from minillm.backends import compile as kc

    x, w, b = one_row_inputs(be, K, N)
    plain, gated = one_row_gemvs(be, x, w, b)
    split, deep, pre = poisoned(be, (1, N)), poisoned(be, (1, 2 * N)), poisoned(be, (1, 2 * N))
    with be.stream:
        kc.get_kernel("gemv", "gemv1_silu_mul_split_bf16", False)(
            ((N + 3) // 4,), (128,), (x, np.int64(K), w, split, np.int64(N), np.int32(N), np.int32(K)))
        for name, out in (("gemv1_deep_bf16", deep), ("gemv1_pre_bf16", pre)):
            kc.get_kernel("gemv", name, False)(
                ((2 * N + 7) // 8,), (128,),
                (x, np.int64(K), w, b, out, np.int64(2 * N), np.int32(2 * N), np.int32(K)))
    be.synchronize()
    assert not np.isnan(gated).any() and not np.isnan(plain).any()
    assert np.array_equal(host(be, split), gated)
    assert np.array_equal(host(be, deep), plain)
    assert np.array_equal(host(be, pre), plain)


@pytest.mark.parametrize("K,N,with_res,bias", [(64, 96, False, False), (64, 96, True, True),
                                               (1024, 4096, True, False),  # 0.6B qkv: one chunk a thread
                                               (1000, 1537, True, True), (2048, 300, True, False),  # two chunks
                                               (2560, 2050, True, False), (4096, 6144, True, True),  # four (8B qkv)
                                               (4096, 1000, False, False)])
def test_rms_norm_matmul_folded_same_bits(be, K, N, with_res, bias):
    """The one-row qkv / gate_up products with the RMSNorm folded in (gemv1_norm{C}_bf16,
    gemv1_silu_mul_split_norm{C}_bf16) give the unfolded path's bits (rms_norm_vec, then the
    product: MINILLM_FOLD_NORMS_MAX_K=0's route): the product's output, and the residual sum in
    residual_out, residual itself untouched; in a graph too, launching only the folded kernel
    (normed and gate_up left unwritten). Every chunk count a thread replays (1 / 2 / 4), a row
    shorter than the CTA, the last chunk group partial, with and without a residual and a bias."""
    if be.dtype == np.float32:
        pytest.skip("cuda/gemv.cu is the bf16 path")
    from minillm.backends.cuda_ops import norm_fold_chunks

    rng = np.random.default_rng(K + N)
    x = be.asarray(rng.standard_normal((1, K)).astype(np.float32))
    res = be.asarray(rng.standard_normal((1, K)).astype(np.float32)) if with_res else None
    nw = be.asarray((1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((2 * N, K)) / np.sqrt(K)).astype(np.float32))
    b = be.asarray(rng.standard_normal(2 * N).astype(np.float32)) if bias else None
    res_before = host(be, res) if with_res else None
    got = {}
    saved = be.fold_norms_max_k, be.gemv1_stage
    try:
        be.gemv1_stage = 0  # these kernels, not gemv1_stage_* (test_one_row_stage_kernels_same_bits)
        for fold in (False, True):
            be.fold_norms_max_k = 4096 if fold else 0
            assert be.folds_norms(1, K) == fold and norm_fold_chunks(K) is not None
            runs = []
            for graph in (False, True):
                out, act, res_out = poisoned(be, (1, 2 * N)), poisoned(be, (1, N)), poisoned(be, (1, K))
                normed, gate_up = poisoned(be, (1, K)), poisoned(be, (1, 2 * N))

                def call(out=out, act=act, ro=res_out if with_res else None, normed=normed, gate_up=gate_up):
                    be.rms_norm_matmul(x, res, nw, 1e-6, w, out, ro, normed, bias=b)
                    be.rms_norm_matmul_silu_mul(x, res, nw, 1e-6, w, act, ro, normed, gate_up)
                if graph:
                    before = Counter(be.captured_launches)
                    be.capture_graph(call).replay()
                    launched = be.captured_launches - before
                    if fold:
                        c = norm_fold_chunks(K)
                        assert launched == Counter({f"gemv1_norm{c}_bf16": 1,
                                                    f"gemv1_silu_mul_split_norm{c}_bf16": 1}), launched
                        assert np.isnan(host(be, normed)).all() and np.isnan(host(be, gate_up)).all()
                else:
                    call()
                runs.append((host(be, out), host(be, act), host(be, res_out)))
            assert all(np.array_equal(a, c) for a, c in zip(runs[0][:2], runs[1][:2]))
            got[fold] = runs[0]
    finally:
        be.fold_norms_max_k, be.gemv1_stage = saved
    for a, c in zip(got[False][:2], got[True][:2]):
        assert not np.isnan(a).any() and np.array_equal(a, c)
    if with_res:
        assert np.array_equal(got[False][2], got[True][2]) and not np.isnan(got[True][2]).any()
        assert np.array_equal(host(be, res), res_before)  # every CTA read it: never written
        h = rounded(be, host(be, x) + res_before)
        assert np.array_equal(got[True][2], h)
    else:
        h = host(be, x)
    n = rounded(be, h / np.sqrt(np.mean(h.astype(np.float64) ** 2) + 1e-6) * host(be, nw))
    ref = n.astype(np.float64) @ host(be, w).astype(np.float64).T + (host(be, b) if bias else 0)
    assert rel_err(got[True][0], ref) < tol(be)


def test_rms_norm_matmul_unfolded_routes(be):
    """Rows the folded kernels do not take (two rows, more than 4,096 values, fp32 storage) run
    rms_norm then the product and give the same results as those two ops: residual_out holds the
    sum, residual is untouched; residual_out aliasing residual is refused."""
    rng = np.random.default_rng(7)
    for M, K, N in ((2, 256, 96), (1, 4104, 64)):
        x = be.asarray(rng.standard_normal((M, K)).astype(np.float32))
        res = be.asarray(rng.standard_normal((M, K)).astype(np.float32))
        nw = be.asarray((1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
        w = be.asarray((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32))
        assert not be.folds_norms(M, K)
        res_before = host(be, res)
        out, res_out, normed = poisoned(be, (M, N)), poisoned(be, (M, K)), poisoned(be, (M, K))
        be.rms_norm_matmul(x, res, nw, 1e-6, w, out, res_out, normed)
        res2, normed2, out2 = be.asarray(res_before), poisoned(be, (M, K)), poisoned(be, (M, N))
        be.rms_norm(x, nw, 1e-6, out=normed2, residual=res2)
        be.matmul(normed2, w, out=out2)
        assert np.array_equal(host(be, out), host(be, out2)) and not np.isnan(host(be, out)).any()
        assert np.array_equal(host(be, res_out), host(be, res2))
        assert np.array_equal(host(be, res), res_before)
    with pytest.raises(ValueError, match="must not be residual"):
        x1 = be.asarray(rng.standard_normal((1, 64)).astype(np.float32))
        r1 = be.asarray(rng.standard_normal((1, 64)).astype(np.float32))
        be.rms_norm_matmul(x1, r1, be.asarray(np.ones(64, np.float32)), 1e-6,
                           be.asarray(np.ones((8, 64), np.float32)), poisoned(be, (1, 8)), r1, poisoned(be, (1, 64)))


@pytest.mark.parametrize("M,K,F", [(2, 1024, 1536), (2, 72, 96), (3, 1000, 1537), (4, 4104, 300), (4, 72, 96)])
def test_gated_split_kernel_rows_same_bits(be, M, K, F):
    """gemv_silu_mul_split_bf16 (2-4 rows, gate and up rows on different warps) gives
    gemv_silu_mul_bf16's bits, through the backend's route under MINILLM_GATED_SPLIT_MAX_M (M rows
    and up take the split kernel, fewer the fused one; in a graph too), on column counts that leave a
    CTA's last warps past the end.
    (3-4 rows reach the GEMV only when K is not a multiple of 64: else the skinny kernel takes them.)"""
    if be.dtype == np.float32:
        pytest.skip("cuda/gemv.cu is the bf16 path")
    rng = np.random.default_rng(M * K + F)
    x = be.asarray(rng.standard_normal((M, K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((2 * F, K)) / np.sqrt(K)).astype(np.float32))
    saved = be.gated_split_max_m
    outs, launched = {}, {}
    try:
        for max_m in (M - 1, M):
            be.gated_split_max_m = max_m
            gate_up = poisoned(be, (M, 2 * F))
            be.matmul_silu_mul(x, w, poisoned(be, (M, F)), gate_up)  # eagerly first, as capture_graph asks
            out = poisoned(be, (M, F))
            before = Counter(be.captured_launches)
            be.capture_graph(lambda o=out, g=gate_up: be.matmul_silu_mul(x, w, o, g)).replay()
            launched[max_m] = be.captured_launches - before
            outs[max_m] = host(be, out)
    finally:
        be.gated_split_max_m = saved
    assert launched[M - 1] == Counter(gemv_silu_mul_bf16=1), launched
    assert launched[M] == Counter(gemv_silu_mul_split_bf16=1), launched
    assert not np.isnan(outs[M - 1]).any() and np.array_equal(outs[M - 1], outs[M])


def test_one_row_gated_product_routes_same_bits(be):
    """The one-row gate_up product's routes, fused and split (MINILLM_GATED_SPLIT_MAX_M 0 / 1), give the same
    bits, leave gate_up unwritten and launch the kernel they name, in a graph too; and a one-row
    product on gemv1_deep_bf16 (MINILLM_GEMV1_DEEP_MIN_K) or gemv1_pre_bf16 (MINILLM_GEMV1_PRE)
    gives gemv1_bf16's."""
    x, w, b = one_row_inputs(be, 1024, 1536)
    saved = be.gated_split_max_m, be.gemv1_deep_min_k, be.gemv1_pre, be.gemv1_stage
    outs, launched = {}, {}
    try:
        be.gemv1_stage = 0  # these routes, not gemv1_stage_* (which takes both shapes when on)
        for route, split in (("fused", 0), ("split", 1)):
            be.gated_split_max_m = split
            out, gate_up = poisoned(be, (1, 1536)), poisoned(be, (1, 3072))
            be.matmul_silu_mul(x, w, out, gate_up)
            outs[route] = host(be, out), host(be, gate_up)
            before = Counter(be.captured_launches)
            out2 = poisoned(be, (1, 1536))
            be.capture_graph(lambda o=out2, g=gate_up: be.matmul_silu_mul(x, w, o, g)).replay()
            launched[route] = be.captured_launches - before
            assert np.array_equal(host(be, out2), outs[route][0]), route
        for key, min_k, pre in ((0, 0, 0), (1024, 1024, 0), ("pre", 0, 1)):
            be.gemv1_deep_min_k, be.gemv1_pre = min_k, pre
            be.matmul(x, w, poisoned(be, (1, 3072)), bias=b)  # eagerly first, as capture_graph asks
            out = poisoned(be, (1, 3072))
            before = Counter(be.captured_launches)
            be.capture_graph(lambda o=out: be.matmul(x, w, o, bias=b)).replay()
            launched[key] = be.captured_launches - before
            outs[key] = host(be, out)
    finally:
        be.gated_split_max_m, be.gemv1_deep_min_k, be.gemv1_pre, be.gemv1_stage = saved
    fused, gu0 = outs["fused"]
    assert not np.isnan(fused).any() and np.isnan(gu0).all() and np.isnan(outs["split"][1]).all()
    assert np.array_equal(fused, outs["split"][0])
    assert launched["fused"] == Counter(gemv1_silu_mul_bf16=1), launched
    assert launched["split"] == Counter(gemv1_silu_mul_split_bf16=1), launched
    assert launched[0] == Counter(gemv1_bf16=1) and launched[1024] == Counter(gemv1_deep_bf16=1), launched
    assert not np.isnan(outs[0]).any() and np.array_equal(outs[0], outs[1024])
    assert launched["pre"] == Counter(gemv1_pre_bf16=1), launched  # 384 CTAs: one wave of 4 an SM
    assert np.array_equal(outs[0], outs["pre"])


@pytest.mark.parametrize("K,N", [(64, 96), (1000, 1537), (1024, 4096), (2048, 1024), (3072, 1024), (1024, 3072),
                                 (4096, 300)])
def test_one_row_stage_kernels_same_bits(be, K, N):
    """gemv1_stage_* (MINILLM_GEMV1_STAGE=1: each CTA's whole share of the weights copied into shared
    memory before the PDL wait, dependents released at once) give the bits of the kernels they replace:
    the plain product with a bias, the gated one, and both with the RMSNorm and a residual folded in;
    eagerly and from a graph, where exactly they launch for every product whose share fits (the others
    keep their kernels). The 0.6B's four products, fewer rows than SMs, a last CTA short of rows."""
    if be.dtype == np.float32:
        pytest.skip("cuda/gemv.cu is the bf16 path")
    from minillm.backends.cuda_ops import gemv1_stage_plan, norm_fold_chunks

    rng = np.random.default_rng(K * 7 + N)
    x = be.asarray(rng.standard_normal((1, K)).astype(np.float32))
    res = be.asarray(rng.standard_normal((1, K)).astype(np.float32))
    nw = be.asarray((1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((2 * N, K)) / np.sqrt(K)).astype(np.float32))
    b = be.asarray(rng.standard_normal(N).astype(np.float32))
    wp = w[:N]  # the plain products' [N, K]
    c = norm_fold_chunks(K)
    fits = {g: gemv1_stage_plan(N, K, g, be.num_sms, be.max_smem) is not None for g in (False, True)}
    want = Counter({n: 1 for n, g in (("gemv1_stage_bf16", False), ("gemv1_stage_silu_mul_bf16", True),
                                      (f"gemv1_stage_norm{c}_bf16", False),
                                      (f"gemv1_stage_silu_mul_norm{c}_bf16", True)) if fits[g]})
    saved = be.gemv1_stage, be.fold_norms_max_k
    got = {}
    try:
        be.fold_norms_max_k = 4096
        for stage in (0, 1):
            be.gemv1_stage = stage
            runs = []
            for graph in (False, True):
                o = {k: poisoned(be, (1, n)) for k, n in (("plain", N), ("gated", N), ("nplain", N),
                                                          ("ngated", N), ("res_out", K))}
                normed, gate_up = poisoned(be, (1, K)), poisoned(be, (1, 2 * N))

                def call(o=o, normed=normed, gate_up=gate_up):
                    be.matmul(x, wp, o["plain"], bias=b)
                    be.matmul_silu_mul(x, w, o["gated"], gate_up)
                    be.rms_norm_matmul(x, res, nw, 1e-6, wp, o["nplain"], o["res_out"], normed, bias=b)
                    be.rms_norm_matmul_silu_mul(x, res, nw, 1e-6, w, o["ngated"], o["res_out"], normed, gate_up)
                if graph:
                    before = Counter(be.captured_launches)
                    be.capture_graph(call).replay()
                    launched = be.captured_launches - before
                    if stage:
                        assert all(launched[n] == 1 for n in want), (launched, want)
                        assert sum(v for n, v in launched.items() if "stage" in n) == len(want), launched
                else:
                    call()
                runs.append({k: host(be, v) for k, v in o.items()})
            assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])
            got[stage] = runs[0]
    finally:
        be.gemv1_stage, be.fold_norms_max_k = saved
    for k in got[0]:
        assert not np.isnan(got[1][k]).any() and np.array_equal(got[0][k], got[1][k]), k
    ref = rounded(be, host(be, x)).astype(np.float64) @ host(be, wp).astype(np.float64).T + host(be, b)
    assert rel_err(got[1]["plain"], ref) < tol(be)


@pytest.mark.parametrize("mode", [1, 2, 3, 4])
@pytest.mark.parametrize("K,F,N", [(1024, 3072, 4096),  # 0.6B: 24 act rows a CTA
                                   (576, 1536, 960),  # SmolLM2-135M: 16 rows
                                   (256, 512, 384),  # 8 rows, fewer CTAs than SMs
                                   (1000, 2056, 1500)])  # the last CTA's share short (8 rows of 16)
def test_split_mlp_matches_numpy(be, mode, K, F, N):
    """MINILLM_MLP_SPLIT's two kernels: a layer's MLP in one kernel (gemv1_mlp_split_*: norm, gate_up,
    act, its CTAs adding their shares of the down sums into a ring row, zeroing the other) and the
    next layer's staged qkv product reading that row as its x (gemv1_stage_norm1_acc_*). Against the
    NumPy twins composed the same way (rms_norm_mlp_split, then rms_norm_matmul): the sums, the two
    residual sums (the second rounded once from the unrounded sums) and the product; the zeroed row
    (it held garbage) all zero; eagerly and from a graph launching exactly those two kernels. The
    fixed-point sums (mode 2) have the same bits in both runs."""
    if be.dtype == np.float32:
        pytest.skip("cuda/gemv.cu is the bf16 path")
    from minillm.backends.cuda_ops import mlp_split_plan

    rng = np.random.default_rng(K + F + mode)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    hx = {"x": f32(rng.standard_normal((1, K))), "res": f32(rng.standard_normal((1, K))),
          "nw": f32(1 + 0.1 * rng.standard_normal(K)), "nw2": f32(1 + 0.1 * rng.standard_normal(K)),
          "gu": f32(rng.standard_normal((2 * F, K)) / np.sqrt(K)),
          "down": f32(rng.standard_normal((K, F)) / np.sqrt(F)),
          "wq": f32(rng.standard_normal((N, K)) / np.sqrt(K)), "b": f32(rng.standard_normal(N))}
    d = {k: be.asarray(v) for k, v in hx.items()}
    d["down_t"] = be.asarray(np.ascontiguousarray(hx["down"].T))  # mode 3's layout
    hx = {k: rounded(be, v) for k, v in hx.items()}  # what the device holds
    plan = mlp_split_plan(F, K, be.num_sms, be.max_smem, mode == 4)
    assert plan is not None
    saved = be.mlp_split
    try:
        be.mlp_split = mode
        dt = be.mlp_split_dtype(K, F, N, 3)
        assert dt == (np.int64 if mode == 2 else np.float32)
        want = Counter({f"gemv1_mlp_split_{ {1: 'f32', 2: 'i64', 3: 'f32t', 4: 'f32s'}[mode]}_r{plan[3]}_bf16": 1,
                        f"gemv1_stage_norm1_acc_{'i64' if mode == 2 else 'f32'}_bf16": 1})
        runs = []
        for graph in (False, True):
            ring = be.zeros((2, 1, K), dtype=dt)
            be.copy_from_host(ring[1], rng.integers(-2 ** 40, 2 ** 40, (1, K)).astype(dt))  # garbage to zero
            o = {"res_out": poisoned(be, (1, K)), "res_out2": poisoned(be, (1, K)), "out": poisoned(be, (1, N))}
            normed = poisoned(be, (1, K))

            def call(ring=ring, o=o, normed=normed):
                be.rms_norm_mlp_split(d["x"], d["res"], d["nw"], 1e-6, d["gu"],
                                      d["down_t"] if mode >= 3 else d["down"], acc=ring[0],
                                      zero=ring[1], residual_out=o["res_out"])
                be.rms_norm_matmul(ring[0], o["res_out"], d["nw2"], 1e-6, d["wq"], o["out"], o["res_out2"],
                                   normed, bias=d["b"])
            if graph:
                before = Counter(be.captured_launches)
                be.capture_graph(call).replay()
                assert be.captured_launches - before == want
            else:
                call()
            sums = be.to_host(ring)
            assert not sums[1].any()
            got = {k: host(be, v) for k, v in o.items()}
            got["sums"] = sums[0].astype(np.float64) * (2.0 ** -28 if mode == 2 else 1.0)
            runs.append(got)
    finally:
        be.mlp_split = saved
    if mode == 2:
        assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])
    # the NumPy twins on the same rounded values
    ref_ring = np.zeros((2, 1, K), np.float32)
    ref_ring[1] = 7.0
    r = {"res_out": np.empty((1, K), np.float32), "res_out2": np.empty((1, K), np.float32),
         "out": np.empty((1, N), np.float32)}
    REF.rms_norm_mlp_split(hx["x"], hx["res"], hx["nw"], 1e-6, hx["gu"], hx["down"], acc=ref_ring[0],
                           zero=ref_ring[1], residual_out=r["res_out"])
    assert not ref_ring[1].any()
    for got in runs:
        assert np.array_equal(got["res_out"], rounded(be, r["res_out"]))
        assert rel_err(got["sums"], ref_ring[0]) < tol(be)
        h2 = got["res_out"] + got["sums"].astype(np.float32)  # the product's residual: summed, rounded once
        assert np.array_equal(got["res_out2"], rounded(be, h2))
        REF.rms_norm_matmul(ref_ring[0], r["res_out"], hx["nw2"], 1e-6, hx["wq"], r["out"], r["res_out2"],
                            np.empty((1, K), np.float32), bias=hx["b"])
        assert rel_err(got["out"], r["out"]) < tol(be)


def test_dependent_chain_in_a_graph_matches_eager(be):
    """60 dependent kernels (the decoder's residual pattern: normed = rmsnorm(t + h), h <- t + h;
    t = normed @ W, 30 times) recorded into a graph, where the backend launches them with
    programmatic dependent launch (each waits in pdl_entry for the previous one's writes): every
    replay is bit-identical to the eager run. A kernel reading its input before the previous
    kernel's writes land would break that."""
    rng = np.random.default_rng(11)
    M, K = 2, 1024
    h0 = be.asarray(rng.standard_normal((M, K)).astype(np.float32))
    g = be.asarray((1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
    w = be.asarray((rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32))
    h, t, normed = be.empty((M, K)), be.empty((M, K)), be.empty((M, K))

    def chain():
        be.copy(h0, out=h)
        be.copy(h0, out=t)
        for _ in range(30):
            be.rms_norm(t, g, 1e-6, out=normed, residual=h)
            be.matmul(normed, w, out=t)

    from minillm.backends.pdl import PdlLauncher

    chain()
    want = host(be, t)
    assert np.isfinite(want).all()
    saved, be.pdl = be.pdl, PdlLauncher(be.stream.ptr)  # on for this capture, whatever MINILLM_PDL says
    try:
        graph = be.capture_graph(chain)
    finally:
        pdl, be.pdl = be.pdl, saved
    assert pdl.launches >= 60 if be.dtype != np.float32 else pdl.launches >= 30  # fp32: cuBLAS matmuls
    for _ in range(5):
        be.copy_from_host(t, np.zeros((M, K), np.float32).astype(t.dtype))
        graph.replay()
        assert np.array_equal(host(be, t), want)


# ---- paged attention --------------------------------------------------------------------------
def make_attention_case(rng, q_lens, ctx_lens, H, KH, D, bs, extra_rows=0):
    """Random paged KV pool, block tables (unused entries -1) and ragged queries."""
    B = len(q_lens)
    max_blocks = max(1, max(-(-c // bs) for c in ctx_lens))
    need = sum(-(-c // bs) for c in ctx_lens)
    nb = need + 3
    perm = rng.permutation(nb)
    bt = np.full((B, max_blocks), -1, np.int32)
    o = 0
    for b, c in enumerate(ctx_lens):
        n = -(-c // bs)
        bt[b, :n] = perm[o: o + n]
        o += n
    qs = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(qs[-1]) + extra_rows
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    kc = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    vc = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    return q, kc, vc, bt, np.asarray(ctx_lens, np.int32), qs


def check_attention(be, case, causal, variants, scale=None):
    q, kc, vc, bt, sl, qs = case
    T, H, D = q.shape
    scale = scale or D ** -0.5
    rq, rk, rv = rounded(be, q), rounded(be, kc), rounded(be, vc)
    ref = np.full(q.shape, np.nan, np.float32)
    REF.paged_attention(rq, rk, rv, bt, sl, qs, scale, ref, causal=causal)
    live = int(qs[-1])
    dq, dk, dv = be.asarray(q), be.asarray(kc), be.asarray(vc)
    dbt, dsl, dqs = i32(be, bt), i32(be, sl), i32(be, qs)
    for variant in variants:
        kernel, bq, n_splits = variant if len(variant) == 3 else ("tiled", *variant)
        if variant[0] is None:
            kernel = None  # the backend's own choice
        if kernel in ("prefill", "split") and be.dtype == np.float32:
            continue  # the tensor-core kernel is bf16 only; fp32 storage takes the tiled one
        for _ in range(2):  # twice: the decode kernel's split counters must reset themselves
            out = poisoned(be, q.shape)
            plan = be.attention(dq, dk, dv, dbt, dsl, dqs, scale, out, causal=causal, bq=bq,
                                n_splits=n_splits, kernel=kernel)
            got = host(be, out)
            err = rel_err(got[:live], ref[:live])
            assert err < tol(be), f"variant {variant} plan={plan}: rel err {err}"
            assert np.isnan(got[live:]).all(), "rows outside every sequence must stay untouched"


# (bq, n_splits) of the tiled kernel, or (kernel, bq, n_splits); (None, None) = the backend's choice
VARIANTS = [(None, None), (1, 1), (1, 7), (4, 1), (16, 3),
            ("decode", None, None), ("decode", None, 1), ("decode", None, 5), ("prefill", None, None),
            ("split", None, None), ("split", None, 3)]


@pytest.mark.parametrize("G", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("bs", [16, 32])
def test_paged_attention_shapes(be, G, D, bs):
    if be.dtype == np.float32 and (bs == 32 or G in (2, 3, 8)):
        pytest.skip("fp32 storage: a representative subset is enough")
    rng = np.random.default_rng(G * 1000 + D + bs)
    KH = 2
    H = KH * G
    cases = {
        "decode": ([1, 1, 1, 1], [1, 17, 200, 513]),
        "prefill": ([5, 40, 1], [5, 40, 1]),
        "chunked": ([7, 33], [100, 33 + 64]),
        "verify": ([5, 5, 5], [5, 70, 300]),
        "padding": ([1, 1, 3, 1], [20, 0, 0, 9]),  # seq_len 0: rows written as zeros
        "empty-seq": ([0, 4, 0, 2], [0, 30, 16, 2]),
    }
    for name, (ql, cl) in cases.items():
        case = make_attention_case(rng, ql, cl, H, KH, D, bs, extra_rows=2 if name == "decode" else 0)
        for causal in (True, False):
            check_attention(be, case, causal, VARIANTS)


def test_attention_counter_check(be):
    """MINILLM_CHECK_ATT_COUNTERS's check: split attention (decode splits and split short runs on
    the tensor-core kernel) leaves every split counter at 0, also in a step whose prefill chunks
    have fewer keys than short_run_max_ctx beside verification runs (before session 36 the
    short-run launch counted such chunks as short runs too: its grid ran out, the last run's rows
    were never written and a merge counter stayed set); a counter left set is reported with its
    token and KV head."""
    rng = np.random.default_rng(11)
    H, KH, D, bs = 8, 2, 128, 16
    check, limit, most = be.check_att_counters, be.short_run_max_ctx, be.short_run_max_splits
    try:
        be.check_att_counters = True
        if be.dtype != np.float32:
            be.short_run_max_ctx, be.short_run_max_splits = 2048, 4
        for q_lens, ctx, most_q in (([1, 9, 1, 5], [700, 300, 64, 900], 9),
                                    ([40, 9, 100, 9], [300, 300, 300, 200], 100)):
            q, kc, vc, bt, sl, qs = make_attention_case(rng, q_lens, ctx, H, KH, D, bs)
            ref = np.full(q.shape, np.nan, np.float32)
            REF.paged_attention(rounded(be, q), rounded(be, kc), rounded(be, vc), bt, sl, qs, D ** -0.5, ref)
            args = (be.asarray(q), be.asarray(kc), be.asarray(vc), i32(be, bt), i32(be, sl), i32(be, qs),
                    D ** -0.5)
            for kernel in ("decode", None):
                out = poisoned(be, q.shape)
                be.attention(*args, out, kernel=kernel, max_query_len=most_q)
                got = host(be, out)
                assert rel_err(got, ref) < tol(be), (q_lens, kernel)  # NaN (a row never written) fails
        be._att_counters[3 * KH + 1] = 2  # as a merge that never ran would leave it
        left = r"left 1 split counter\(s\) set: \(token, KV head, count\) \[\(3, 1, 2\)\]"
        with pytest.raises(RuntimeError, match=left):
            be.attention(*args, poisoned(be, q.shape), kernel="decode", max_query_len=100)
    finally:
        be._att_counters.fill(0)
        be.check_att_counters, be.short_run_max_ctx, be.short_run_max_splits = check, limit, most


def test_decode_modules_of_another_storage_type_load_on_first_use(be):
    """A start compiles the decode attention for its storage type alone, a module per head dim
    (cuda_ops._decode_defines): the other type's kernels are not loaded, load on their first eager
    use and compute what the oracle does, and a first use inside a graph capture is refused by name
    rather than recording a module load."""
    from minillm.backends.cuda_ops import _DECODE_HEAD_DIMS, BF16, decode_group_names

    other = "f32" if be.dtype != np.float32 else "bf16"
    other_dt = np.float32 if other == "f32" else BF16
    mine = "bf16" if other == "f32" else "f32"
    assert all(n in be.k for d in _DECODE_HEAD_DIMS for n in decode_group_names(mine, d))
    rng = np.random.default_rng(21)
    H, KH, bs = 4, 2, 16
    for D in (64, 128):
        q, kc, vc, bt, sl, qs = make_attention_case(rng, [1, 1], [33, 300], H, KH, D, bs)
        args = (be.asarray(q, other_dt), be.asarray(kc, other_dt), be.asarray(vc, other_dt), i32(be, bt),
                i32(be, sl), i32(be, qs), D ** -0.5)
        names = decode_group_names(other, D)
        if names[0] not in be.k:
            out = be.empty(q.shape, other_dt)
            with pytest.raises(RuntimeError, match=r"first asked for inside a graph capture"):
                be.capture_graph(lambda args=args, out=out: be.attention(*args, out, kernel="decode",
                                                                          max_query_len=1))
            assert names[0] not in be.k
        out = be.empty(q.shape, other_dt)
        be.copy_from_host(out, np.full(q.shape, np.nan, np.float32).astype(other_dt))
        be.attention(*args, out, kernel="decode", max_query_len=1)
        assert all(n in be.k for n in names)
        r = lambda x: np.asarray(np.asarray(x, other_dt), np.float32)  # noqa: E731 - as the device holds it
        ref = np.full(q.shape, np.nan, np.float32)
        REF.paged_attention(r(q), r(kc), r(vc), bt, sl, qs, D ** -0.5, ref)
        got = np.asarray(be.to_host(out), np.float32)
        assert rel_err(got, ref) < (1e-5 if other == "f32" else 1.2e-2)


@pytest.mark.parametrize("part", [64, 112, 512])
def test_decode_fixed_parts(be, part):
    """Keys split in parts of a fixed size: a token takes ceil(len / part) splits, the rest of
    the grid exits at once, and a context within one part is written without a merge."""
    rng = np.random.default_rng(part)
    H, KH, D, bs = 8, 2, 128, 16
    for ql, cl in (([1, 1, 1, 1, 1], [1, 64, 65, 300, 1100]), ([5, 5], [5, 700])):
        case = make_attention_case(rng, ql, cl, H, KH, D, bs, extra_rows=1)
        q, kc, vc, bt, sl, qs = case
        ref = np.full(q.shape, np.nan, np.float32)
        REF.paged_attention(rounded(be, q), rounded(be, kc), rounded(be, vc), bt, sl, qs, D ** -0.5, ref)
        live = int(qs[-1])
        for _ in range(2):  # the split counters must reset themselves
            out = poisoned(be, q.shape)
            plan = be.attention(be.asarray(q), be.asarray(kc), be.asarray(vc), i32(be, bt), i32(be, sl),
                                i32(be, qs), D ** -0.5, out, kernel="decode", part=part)
            got = host(be, out)
            assert plan["min_part"] == part and plan["n_splits"] == -(-bt.shape[1] * bs // part)
            assert rel_err(got[:live], ref[:live]) < tol(be), plan
            assert np.isnan(got[live:]).all()


def test_attention_batch_invariant(be):
    """A sequence's rows come out bit-identical whether its step is all short (decode kernel
    alone) or shares it with a long prefill chunk (per-sequence split): speculative verification
    in bf16 depends on it."""
    if be.dtype == np.float32:
        pytest.skip("the split is the bf16 path")
    rng = np.random.default_rng(11)
    H, KH, D, bs = 16, 8, 128, 16
    q, kc, vc, bt, sl, qs = make_attention_case(rng, [9, 9, 300], [700, 120, 300], H, KH, D, bs)
    dq, dk, dv = be.asarray(q), be.asarray(kc), be.asarray(vc)
    mixed = poisoned(be, q.shape)
    be.attention(dq, dk, dv, i32(be, bt), i32(be, sl), i32(be, qs), D ** -0.5, mixed)  # split
    alone = poisoned(be, q.shape)
    be.attention(dq, dk, dv, i32(be, bt[:2]), i32(be, sl[:2]), i32(be, qs[:3]), D ** -0.5, alone,
                 max_query_len=9)  # the two verification blocks without the prefill chunk
    assert np.array_equal(host(be, mixed)[:18], host(be, alone)[:18])
    # the runner's decode_rows hint (the short sequences' rows, in any order) changes no bit
    for rows in (list(range(18)), list(range(9, 18)) + list(range(9))):
        hinted = poisoned(be, q.shape)
        be.attention(dq, dk, dv, i32(be, bt), i32(be, sl), i32(be, qs), D ** -0.5, hinted,
                     decode_rows=i32(be, np.array(rows)))
        assert np.array_equal(host(be, hinted)[:18], host(be, mixed)[:18]), "decode rows"
        assert np.array_equal(host(be, hinted)[18:], host(be, mixed)[18:]), "prefill rows"
    # no short sequence: an empty hint launches no decode kernel, and the prefill rows are the same
    prefill = poisoned(be, q.shape)
    be.attention(dq[18:], dk, dv, i32(be, bt[2:]), i32(be, sl[2:]), i32(be, qs[2:] - 18), D ** -0.5,
                 prefill[18:], decode_rows=i32(be, np.zeros(0)))
    assert np.array_equal(host(be, prefill)[18:], host(be, mixed)[18:])


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_short_runs_on_tensor_cores(be, causal, D):
    """Runs of 2-16 queries (verification blocks; DFlash blocks, non-causal) with at most
    short_run_max_ctx keys take the tensor-core kernel, longer contexts and single queries the
    decode kernel, in one step: every row matches the oracle, with the short runs' keys split over
    up to 4 CTAs (merged by the last) or not; unsplit, each sequence's rows are bit-identical to
    its kernel run alone; split, the three-CTAs-an-SM kernel (paged_prefill_short_*, Q in the
    second K/V stage) gives the same bits as the two-CTA one. With the limit at 0 the decode
    kernel takes them all."""
    if be.dtype == np.float32:
        pytest.skip("the tensor-core kernel is the bf16 path")
    rng = np.random.default_rng(5 + causal + D)
    H, KH, bs = 16, 4, 16
    # (queries, context): short runs under and over the limit, a decode row, a run at the limit
    q_lens, ctx = [9, 9, 1, 16, 2], [300, 3000, 500, 2048, 40]
    case = make_attention_case(rng, q_lens, ctx, H, KH, D, bs)
    q, kc, vc, bt, sl, qs = case
    rq, rk, rv = rounded(be, q), rounded(be, kc), rounded(be, vc)
    ref = np.full(q.shape, np.nan, np.float32)
    REF.paged_attention(rq, rk, rv, bt, sl, qs, D ** -0.5, ref, causal=causal)
    args = (be.asarray(q), be.asarray(kc), be.asarray(vc), i32(be, bt), i32(be, sl), i32(be, qs), D ** -0.5)

    def run(**kw):
        out = poisoned(be, q.shape)
        plan = be.attention(*args, out, causal=causal, **kw)
        return host(be, out), plan

    limit, most, three = be.short_run_max_ctx, be.short_run_max_splits, be.short_run_three_ctas
    try:
        be.short_run_max_ctx = 2048
        on_tc, _ = run(kernel="prefill")
        alone, _ = run(kernel="decode")
        for splits in (1, 4):  # contexts 300 and 2,048: 3 and 4 splits; 40: one
            be.short_run_max_splits = splits
            got, plan = run(max_query_len=16)
            assert plan["kernel"] == "split" and plan["short_run_splits"] == splits
            assert rel_err(got, ref) < tol(be), splits
            again, _ = run(max_query_len=16)  # the merge counters reset themselves
            assert np.array_equal(got, again)
            if splits > 1:  # split short runs on either kernel: the same bits
                assert plan["short_run_three_ctas"] == (three == 2)  # 1: this small launch is one wave
                for mode in (0, 2):
                    be.short_run_three_ctas = mode
                    other, plan = run(max_query_len=16)
                    be.short_run_three_ctas = three
                    assert plan["short_run_three_ctas"] == (mode == 2)
                    assert np.array_equal(other, got), f"MINILLM_SHORT_RUN_3CTA={mode}"
            for b, tensor_cores in enumerate([True, False, False, True, True]):
                rows = slice(qs[b], qs[b + 1])
                if not tensor_cores:
                    assert np.array_equal(got[rows], alone[rows]), (b, splits)
                elif splits == 1:
                    assert np.array_equal(got[rows], on_tc[rows]), (b, splits)
        be.short_run_max_ctx = 0
        off, plan = run(max_query_len=16)
        assert plan["kernel"] == "decode" and np.array_equal(off, alone)
    finally:
        be.short_run_max_ctx, be.short_run_max_splits, be.short_run_three_ctas = limit, most, three


@pytest.mark.parametrize("bs", [16, 32])
def test_paged_attention_long_context(be, bs):
    """Contexts from 1 to 32k tokens: decode rows and a chunked-prefill tail at 32k."""
    rng = np.random.default_rng(bs)
    H, KH, D = 8, 2, 128
    case = make_attention_case(rng, [1, 1, 1, 1], [1, 4096, 32768, 10000], H, KH, D, bs)
    check_attention(be, case, True, [(None, None), (1, 1), (1, 64), ("decode", None, 1),
                                     ("decode", None, 64)])
    case = make_attention_case(rng, [64, 1], [32768, 32000], H, KH, D, bs)
    check_attention(be, case, True, [(None, None), (1, None), ("decode", None, None),
                                     ("prefill", None, None)])


@pytest.mark.parametrize("G", [1, 2, 4, 8])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_decode_step_attention(be, G, D, qk_norm):
    """The fused decode step (q/k norm + RoPE + KV store inside the decode kernel) against the
    oracle, and against the same backend's two ops: caches bit for bit, attention to tolerance.
    Contexts 1 to 700 (the newest key alone, in one split or the last of several), a padding
    sequence of two rows (seq_len 0, slot -1) and a row outside every sequence. A launch order
    (longest context first, the runner's hint) must change no bit of the outputs."""
    if be.dtype == np.float32 and (G in (2, 8) or not qk_norm):
        pytest.skip("fp32 storage: a representative subset is enough")
    rng = np.random.default_rng(G * 100 + D + qk_norm)
    KH, bs = 2, 16
    H = KH * G
    lens = [1, 17, 64, 65, 300, 700]
    B = len(lens)
    T = B + 3  # B decode rows, the padding sequence's two rows, one unused row
    cs, qkv, qw, kw, pos = rope_case(rng, T, H, KH, D)
    nbps = -(-max(lens) // bs)
    nb = B * nbps + 2
    tables = rng.permutation(nb)[: B * nbps].reshape(B, nbps).astype(np.int32)
    tables = np.vstack([tables, np.zeros((1, nbps), np.int32)])
    sl = np.asarray(lens + [0], np.int32)
    qs = np.asarray(list(range(B + 1)) + [B + 2], np.int32)
    pos[:B] = sl[:B] - 1
    pos[B:] = 0
    slots = np.full(T, -1, np.int32)
    slots[:B] = [tables[b, (n - 1) // bs] * bs + (n - 1) % bs for b, n in enumerate(lens)]
    kc0 = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)
    vc0 = rng.standard_normal((nb, bs, KH, D)).astype(np.float32)

    def split(a):
        return (a[:, : H * D].reshape(T, H, D), a[:, H * D: (H + KH) * D].reshape(T, KH, D),
                a[:, (H + KH) * D:].reshape(T, KH, D))

    def run(fused: bool, n_splits=None, order=None):
        dev, kc, vc = be.asarray(qkv), be.asarray(kc0), be.asarray(vc0)
        q, k, v = split(dev)
        w = (be.asarray(qw), be.asarray(kw)) if qk_norm else (None, None)
        rope = (1e-6, i32(be, pos), be.asarray(cs, dtype=np.float32), kc, vc, i32(be, slots))
        att = (i32(be, tables), i32(be, sl), i32(be, qs))
        out = poisoned(be, (T, H, D))
        if fused:
            plan = be.decode_step_attention(q, k, v, *w, *rope, *att, D ** -0.5, out, order=order,
                                            n_splits=n_splits)
            assert plan["kernel"] == "decode_rope"
        else:
            be.qk_norm_rope_store_kv(q, k, v, *w, *rope)
            be.attention(q, kc, vc, *att, D ** -0.5, out, kernel="decode", n_splits=n_splits, order=order)
        return host(be, out), host(be, kc), host(be, vc)

    # copies: for fp32 storage rounded() returns its argument, which the oracle rotates in place
    ref_q = rounded(be, qkv).copy()
    rk, rv = rounded(be, kc0).copy(), rounded(be, vc0).copy()
    ref = np.full((T, H, D), np.nan, np.float32)
    REF.decode_step_attention(*split(ref_q), rounded(be, qw) if qk_norm else None,
                              rounded(be, kw) if qk_norm else None, 1e-6, pos, cs, rk, rv, slots,
                              tables, sl, qs, D ** -0.5, ref)
    for n_splits in (None, 1, 5):
        for _ in range(2):  # twice: split counters reset themselves
            got = run(True, n_splits)
            two = run(False, n_splits)
            assert np.array_equal(got[1], two[1]) and np.array_equal(got[2], two[2]), "caches differ"
            rows = [(round(rel_err(got[0][r], ref[r]), 6), round(rel_err(two[0][r], ref[r]), 6))
                    for r in range(B + 2)]  # (fused, two ops) against the oracle, by row
            assert rel_err(got[0][: B + 2], ref[: B + 2]) < tol(be), (n_splits, rows)
            assert rel_err(got[0][: B + 2], two[0][: B + 2]) < tol(be)
            assert np.isnan(got[0][B + 2:]).all(), "the unused row must stay untouched"
            assert rel_err(got[1], rk) < tol(be) and rel_err(got[2], rv) < tol(be)
        # rows longest context first, then the unused row and the padding rows
        order = i32(be, np.concatenate([np.argsort(-np.asarray(lens), kind="stable"), [B + 2, B + 1, B]]))
        # the backend uses an order only from a full wave of CTAs, then with its own split
        # length: both off here, so the order is all that differs
        least, be.decode_order_min_ctas = be.decode_order_min_ctas, 0
        parts, be.decode_order_part = be.decode_order_part, 0
        try:
            for fused, plain in ((True, got), (False, two)):
                ordered = run(fused, n_splits, order)
                assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(ordered, plain)), \
                    ("the launch order changed the result", fused, n_splits)
        finally:
            be.decode_order_min_ctas, be.decode_order_part = least, parts
    limit, be.decode_rope_max_tokens = be.decode_rope_max_tokens, T - 1  # above it: the two ops
    try:
        dev, kc, vc = be.asarray(qkv), be.asarray(kc0), be.asarray(vc0)
        out = poisoned(be, (T, H, D))
        w = (be.asarray(qw), be.asarray(kw)) if qk_norm else (None, None)
        plan = be.decode_step_attention(*split(dev), *w, 1e-6, i32(be, pos), be.asarray(cs, dtype=np.float32),
                                        kc, vc, i32(be, slots), i32(be, tables), i32(be, sl), i32(be, qs),
                                        D ** -0.5, out)
        assert plan["kernel"] == "decode"
        assert np.array_equal(host(be, kc), got[1]) and rel_err(host(be, out)[: B + 2], ref[: B + 2]) < tol(be)
    finally:
        be.decode_rope_max_tokens = limit



def o_merge_step(be, case: dict, merge: int, graph: bool):
    """One row's decode_step_attention with its o product under MINILLM_O_MERGE=merge, eagerly or
    replayed from a graph: (attention row, o product, plan, the graph's launches or None)."""
    H, KH, D, N, L = case["H"], case["KH"], case["D"], case["N"], case["L"]
    be.o_merge = merge
    dev, kc, vc = be.asarray(case["qkv"]), be.asarray(case["kc"]), be.asarray(case["vc"])
    q = dev[:, : H * D].reshape(1, H, D)
    k = dev[:, H * D: (H + KH) * D].reshape(1, KH, D)
    v = dev[:, (H + KH) * D:].reshape(1, KH, D)
    args = (q, k, v, be.asarray(case["qw"]), be.asarray(case["kw"]), 1e-6, i32(be, case["pos"]),
            be.asarray(case["cs"], dtype=np.float32), kc, vc, i32(be, case["slots"]), i32(be, case["table"]),
            i32(be, np.asarray([L], np.int32)), i32(be, np.asarray([0, 1], np.int32)), D ** -0.5)
    out, o, wd = poisoned(be, (1, H, D)), poisoned(be, (1, N)), be.asarray(case["w"])
    if not graph:
        plan = be.decode_step_attention(*args, out, o_proj=wd, o_out=o)
        return host(be, out), host(be, o), plan, None
    plan = {}  # capturing runs nothing: the replay writes the poisoned outputs
    before = Counter(be.captured_launches)
    g = be.capture_graph(lambda: plan.update(be.decode_step_attention(*args, out, o_proj=wd, o_out=o)))
    launched = be.captured_launches - before
    g.replay()
    return host(be, out), host(be, o), plan, launched


@pytest.mark.parametrize("G,D", [(2, 128), (4, 128), (2, 64), (8, 64)])
@pytest.mark.parametrize("mode", [1, 2])
def test_decode_step_o_merge(be, G, D, mode, monkeypatch):
    """A one-row decode step given its o product (decode_step_attention's o_proj / o_out): with
    MINILLM_O_MERGE (1: every CTA of gemv1_merge_* merges the attention's splits, 2: clusters share
    it) the attention's output and the o product are the same bits as the unmerged path's
    (attention merging its own splits, then gemv1), eagerly and replayed from a graph; the o
    product matches the oracle. Contexts of one key (one split, still left to the product), a few
    splits, and more splits than the merge's shared memory is given room for (merged by the
    attention, as without it). Splits of at least 64 keys (MINILLM_DECODE_MIN_PART; one-row steps of
    G <= 2 take 32 by default), so 700 keys make 11 splits, within the merge's room for 20."""
    if be.dtype == np.float32:
        pytest.skip("the merge is the bf16 path")
    from minillm.backends import cuda_ops

    monkeypatch.setattr(be, "decode_min_part", 64)
    rng = np.random.default_rng(G * 10 + D + mode)
    KH, bs, N = 2, 16, 384
    H = KH * G
    # room for 20 splits (1,280 keys): 3,000 keys (47 splits) are merged by the attention
    cl = cuda_ops._O_MERGE_CLUSTER if mode == 2 else 1
    room = H * D * 2 + H * 64 * 4 + -(-H // 4) * 16 + -(-H // cl) * D * 4 * 20
    monkeypatch.setattr(cuda_ops, "_O_MERGE_MAX_SMEM", room)
    nbps = -(-3000 // bs)
    w = (rng.standard_normal((N, H * D)) / np.sqrt(H * D)).astype(np.float32)
    default = be.o_merge
    for L in [1, 17, 300, 700, 3000]:
        cs, qkv, qw, kw, pos = rope_case(rng, 1, H, KH, D)
        table = rng.permutation(nbps + 1)[:nbps].reshape(1, nbps).astype(np.int32)
        pos[:] = L - 1
        case = dict(H=H, KH=KH, D=D, N=N, L=L, cs=cs, qkv=qkv, qw=qw, kw=kw, pos=pos, table=table, w=w,
                    slots=np.asarray([table[0, (L - 1) // bs] * bs + (L - 1) % bs], np.int32),
                    kc=rng.standard_normal((nbps + 1, bs, KH, D)).astype(np.float32),
                    vc=rng.standard_normal((nbps + 1, bs, KH, D)).astype(np.float32))
        try:
            base_att, base_o, base_plan, _ = o_merge_step(be, case, 0, False)
            assert "o_merge" not in base_plan
            for graph in (False, True):
                att, o, plan, launched = o_merge_step(be, case, mode, graph)
                merge, ns = plan["o_merge"], plan["n_splits"]
                assert merge["kernel"].startswith("gemv1_merge_cl8" if mode == 2 else "gemv1_merge_bf16")
                assert merge["defer_max"] == min(20, ns), (merge, plan)
                part = max(plan["min_part"], (-(-L // ns) + 15) // 16 * 16)
                assert ((-(-L // part) if ns > 1 else 1) <= 20) == (L <= 700), (L, plan)
                if launched is not None:
                    assert launched[merge["kernel"]] == 1 and launched["gemv1_bf16"] == 0, launched
                assert np.array_equal(att, base_att), (L, graph, "the attention's row differs")
                assert np.array_equal(o, base_o), (L, graph, "the o product differs")
        finally:
            be.o_merge = default
        assert not np.isnan(base_att).any()
        ref = rounded(be, base_att).astype(np.float64).reshape(1, -1) @ rounded(be, w).astype(np.float64).T
        assert rel_err(base_o, ref) < tol(be)

def head_ctas_step(be, c: dict, head_ctas: int, graph: bool):
    """One row's decode_step_attention with MINILLM_DECODE_HEAD_CTAS=head_ctas on case c (as
    test_decode_step_one_query_head_a_cta builds it), eagerly or replayed from a graph: (attention
    row, k cache, v cache, the graph's launches or None)."""
    H, KH, D = c["H"], c["KH"], c["D"]
    be.decode_head_ctas = head_ctas
    dev, kc, vc = be.asarray(c["qkv"]), be.asarray(c["kc"]), be.asarray(c["vc"])
    args = (dev[:, : H * D].reshape(1, H, D), dev[:, H * D: (H + KH) * D].reshape(1, KH, D),
            dev[:, (H + KH) * D:].reshape(1, KH, D), be.asarray(c["qw"]), be.asarray(c["kw"]), 1e-6,
            i32(be, c["pos"]), be.asarray(c["cs"], dtype=np.float32), kc, vc, i32(be, c["slots"]),
            i32(be, c["table"]), i32(be, np.asarray([c["L"]], np.int32)), i32(be, np.asarray([0, 1], np.int32)),
            D ** -0.5)
    out = poisoned(be, (1, H, D))
    launched = None
    if graph:
        before = Counter(be.captured_launches)
        g = be.capture_graph(lambda: be.decode_step_attention(*args, out))
        launched = be.captured_launches - before
        g.replay()
    else:
        be.decode_step_attention(*args, out)
    return host(be, out), host(be, kc), host(be, vc), launched


@pytest.mark.parametrize("G,D", [(2, 128), (4, 128), (2, 64), (3, 64), (8, 64)])  # G = 3, D = 64: SmolLM2's
def test_decode_step_one_query_head_a_cta(be, G, D, monkeypatch):
    """MINILLM_DECODE_HEAD_CTAS=1: a one-row decode step's fused attention on paged_decode_rope_kvd_*
    (one query head a CTA, G CTAs sharing a KV head, one of them storing the new k and v) leaves the
    caches bit for bit as the default kernel does, and its attention matches the oracle and the
    default to tolerance, eagerly and replayed from a graph (which launches that kernel). Contexts of
    one key (the newest alone) to many splits. Every G here takes the kernel (the route's list of
    GPU-tested G, cuda_ops._HEAD_CTAS_GPU_TESTED_G, is what this test extends)."""
    from minillm.backends import cuda_ops

    monkeypatch.setattr(cuda_ops, "_HEAD_CTAS_GPU_TESTED_G", (G,))
    rng = np.random.default_rng(G * 10 + D + 7)
    KH, bs = 2, 16
    H = KH * G
    nbps = -(-3000 // bs)
    name = f"paged_decode_rope_kvd_{'f32' if be.dtype == np.float32 else 'bf16'}_d{D}_g1"
    saved = be.decode_head_ctas
    try:
        for L in [1, 17, 64, 65, 300, 700, 3000]:
            cs, qkv, qw, kw, pos = rope_case(rng, 1, H, KH, D)
            pos[:] = L - 1
            table = rng.permutation(nbps + 1)[:nbps].reshape(1, nbps).astype(np.int32)
            c = dict(H=H, KH=KH, D=D, L=L, cs=cs, qkv=qkv, qw=qw, kw=kw, pos=pos, table=table,
                     slots=np.asarray([table[0, (L - 1) // bs] * bs + (L - 1) % bs], np.int32),
                     kc=rng.standard_normal((nbps + 1, bs, KH, D)).astype(np.float32),
                     vc=rng.standard_normal((nbps + 1, bs, KH, D)).astype(np.float32))
            rq = rounded(be, qkv).copy()
            ref = np.full((1, H, D), np.nan, np.float32)
            REF.decode_step_attention(rq[:, : H * D].reshape(1, H, D), rq[:, H * D: (H + KH) * D].reshape(1, KH, D),
                                      rq[:, (H + KH) * D:].reshape(1, KH, D), rounded(be, qw), rounded(be, kw), 1e-6,
                                      pos, cs, rounded(be, c["kc"]).copy(), rounded(be, c["vc"]).copy(), c["slots"],
                                      table, np.asarray([L], np.int32), np.asarray([0, 1], np.int32), D ** -0.5, ref)
            base = head_ctas_step(be, c, 0, False)
            assert rel_err(base[0], ref) < tol(be), L
            for graph in (False, True):
                got, kc, vc, launched = head_ctas_step(be, c, 1, graph)
                assert not np.isnan(got).any(), (L, graph)
                assert np.array_equal(kc, base[1]) and np.array_equal(vc, base[2]), (L, graph, "caches differ")
                assert rel_err(got, ref) < tol(be) and rel_err(got, base[0]) < tol(be), (L, graph)
                if launched is not None:
                    assert launched[name] == 1, launched
    finally:
        be.decode_head_ctas = saved


# ---- sampling ---------------------------------------------------------------------------------
def run_sampler(be, logits, temp, top_p, top_k, seeds, pos, min_p=None):
    B = logits.shape[0]
    out = be.empty((B,), dtype=np.int32)
    be.copy_from_host(out, np.full(B, -7, np.int32))
    be.sample(be.asarray(logits, dtype=np.float32), be.asarray(temp, dtype=np.float32),
              be.asarray(top_p, dtype=np.float32), i32(be, top_k),
              be.asarray(seeds, dtype=seeds.dtype), i32(be, pos), out,
              min_p=None if min_p is None else be.asarray(min_p, dtype=np.float32))
    got = be.to_host(out)
    ref = np.zeros(B, np.int32)
    np_sampler.sample(logits, temp, top_p, top_k, seeds, pos, ref, min_p=min_p)
    return got, ref


def near_tie(logits, t, tp, k, seed, pos, token, mp=0.0) -> bool:
    """Whether the NumPy sampler's choice sits within the device's rounding of a boundary: the
    device weighs tokens in float32 (~1e-7 relative each) and sums 512-token tiles, so its CDF may
    be ~1e-8 off NumPy's (a flat 151,936-token row, estimated); top-k and min-p are exact, and top-p's
    masses come from the same float32 weights, so its cut-off may move where the sorted mass passes
    top_p within ~1e-7 (allowed 2e-7, as the CDF)."""
    p = np_sampler.probs_from_logits(logits, t, tp, k, mp)
    cum = np.cumsum(p)
    target = np_sampler.hash_uniform(seed, pos) * cum[-1]
    near_cdf = min(abs(cum[token] - target), abs((cum[token - 1] if token else 0) - target)) < 2e-7
    order = np.sort(np_sampler.probs_from_logits(logits, t, 1.0, k, mp))[::-1]
    near_topp = tp < 1 and np.min(np.abs(np.cumsum(order) - tp)) < 2e-7
    # min-p's threshold M + ln(min_p): the device's log may round it an ulp off NumPy's
    x = logits.astype(np.float64) / t
    near_minp = mp > 0 and np.min(np.abs(x - (x.max() + np.log(mp)))) < 1e-12 * max(1.0, abs(x.max()))
    return bool(near_cdf or near_topp or near_minp)


SAMPLE_BUILDS = pytest.mark.parametrize("sample_build", ["wide", "512", "cl8", "cl4", "cl2"], indirect=True)


@pytest.fixture
def sample_build(request, be):
    """Each build of sample_tokens on the op tests' small batches: "wide" (1,024 threads a row, the
    default past the split up to a row an SM: MINILLM_SAMPLE_WIDE_ROWS), "512" (larger batches' kernel), and
    a row split over a cluster of 8 CTAs of 512 threads ("cl8", sample_tokens_cl8: the default up to the
    clusters the GPU holds at once, 15 on an H100, MINILLM_SAMPLE_CLUSTER_ROWS), of 4 ("cl4",
    sample_tokens_cl4: the default past those up to 30 rows on an H100, MINILLM_SAMPLE_CLUSTER4_ROWS) or of 2
    ("cl2", sample_tokens_cl2: MINILLM_SAMPLE_CLUSTER2_ROWS), by the backend's row limits. Parametrized by the
    outermost mark (SAMPLE_BUILDS), so last in the test ids: selections like -k "sampler_matches and
    bfloat16-normal-1000" still match."""
    saved = be.sample_wide_rows, be.sample_cluster_rows, be.sample_cluster4_rows, be.sample_cluster2_rows
    wide = request.param.endswith("wide")
    if wide and "sample_tokens_wide" not in be.k:
        pytest.skip("MINILLM_SAMPLE_WIDE_ROWS=0 and MINILLM_VERIFY_WIDE_ROWS=0: the wide build is not loaded")
    be.sample_wide_rows = 1 << 30 if wide else 0
    be.sample_cluster_rows = 1 << 30 if request.param == "cl8" else 0
    be.sample_cluster4_rows = 1 << 30 if request.param == "cl4" else 0
    be.sample_cluster2_rows = 1 << 30 if request.param == "cl2" else 0
    try:
        yield request.param
    finally:
        be.sample_wide_rows, be.sample_cluster_rows, be.sample_cluster4_rows, be.sample_cluster2_rows = saved


@SAMPLE_BUILDS
@pytest.mark.parametrize("V", [1000, 1001, 151936])  # 1001: rows not 16-byte aligned (the draw's scalar loads)
@pytest.mark.parametrize("kind", ["normal", "integer-ties", "peaked", "flat", "cluster"])
def test_sampler_matches_numpy(be, V, kind, sample_build):
    check_sampler_matches_numpy(be, V, kind, 0.0)


# a test of its own, so the ids that scripts select (-k "sampler_matches and bfloat16-normal-1000") stay one test
@SAMPLE_BUILDS
@pytest.mark.parametrize("min_p", [0.05, 0.3])
@pytest.mark.parametrize("V", [1000, 151936])
@pytest.mark.parametrize("kind", ["normal", "integer-ties", "peaked", "flat", "cluster"])
def test_sampler_min_p_matches_numpy(be, V, kind, min_p, sample_build):
    check_sampler_matches_numpy(be, V, kind, min_p)


def check_sampler_matches_numpy(be, V, kind, min_p):
    rng = np.random.default_rng(V + len(kind))
    B = 24
    if kind == "integer-ties":
        logits = rng.integers(-4, 4, (B, V)).astype(np.float32)
    elif kind == "cluster":  # a top token at 8.99 and up to 3,000 in [8, 8.5), far above the rest: one
        # radix bin whose masses bound its tokens far below their count at T 0.3, so the top-p gather
        # (SAMPLE_TOPP_GATHER) is tried and overflows at V 151,936 (rows 12, 16, 18; checked with NumPy),
        # and fits at V 1,000
        logits = (3.0 * rng.standard_normal((B, V)) - 20.0).astype(np.float32)
        for row in logits:
            ids = rng.permutation(V)[: min(3001, V // 2)]
            row[ids[1:]] = rng.uniform(8.0, 8.5, len(ids) - 1)
            row[ids[0]] = 8.99
    else:  # peaked: top-p cuts after a token or two; flat: deep in the tail
        scale = {"normal": 3.0, "peaked": 25.0, "flat": 0.01}[kind]
        logits = (scale * rng.standard_normal((B, V))).astype(np.float32)
    temp = rng.choice([0.0, 0.3, 1.0, 1.5], B).astype(np.float32)
    top_p = rng.choice([1.0, 0.93, 0.61, 0.17], B).astype(np.float32)
    top_k = rng.choice([0, 1, 5, 50, V], B).astype(np.int32)
    seeds = rng.integers(-(2**62), 2**62, B).astype(np.int64)
    pos = rng.integers(0, 100000, B).astype(np.int32)
    mp = None  # min_p 0: the rows above exactly, no min_p array (a null pointer to the kernel)
    if min_p:  # most rows min_p (beside the drawn top-k / top-p); rows 0-9 pin it alone, with
        # top-k, with top-p, with both, at two temperatures; the rest keep their draws, greedy included
        mp = np.where(rng.random(B) < 0.85, min_p, 0.0).astype(np.float32)
        mp[:10] = min_p
        temp[:10] = np.tile(np.float32([1.0, 0.3]), 5)
        top_k[:10] = [0, 0, 0, 0, 50, 5, 0, 0, 50, 5]
        top_p[:10] = np.float32([1, 1, 1, 1, 1, 1, 0.61, 0.93, 0.93, 0.61])
    got, ref = run_sampler(be, logits, temp, top_p, top_k, seeds, pos, mp)
    greedy = temp == 0
    assert np.array_equal(got[greedy], ref[greedy]), "greedy must be exact"
    for b in np.nonzero(got != ref)[0]:
        m = 0.0 if mp is None else float(mp[b])
        assert near_tie(logits[b], float(temp[b]), float(top_p[b]), int(top_k[b]), int(seeds[b]),
                        int(pos[b]), int(ref[b]), m), (
            f"row {b}: device {got[b]} vs numpy {ref[b]} (T={temp[b]}, top_p={top_p[b]}, top_k={top_k[b]}, "
            f"min_p={m})")


@pytest.mark.parametrize("min_p", [0.0, 0.1])
def test_sampler_distribution_follows_seeds(be, min_p):
    """Same logits, many seeds: the device draws equal the NumPy draws seed by seed."""
    rng = np.random.default_rng(9)
    B, V = 256, 50
    logits = np.tile(rng.standard_normal(V).astype(np.float32), (B, 1))
    temp = np.full(B, 0.8, np.float32)
    top_p = np.full(B, 0.9, np.float32)
    top_k = np.full(B, 20, np.int32)
    seeds = np.arange(B, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    pos = np.full(B, 3, np.int32)
    got, ref = run_sampler(be, logits, temp, top_p, top_k, seeds, pos,
                           np.full(B, min_p, np.float32) if min_p else None)
    assert (got == ref).mean() > 0.99
    assert len(set(got.tolist())) > 3


@SAMPLE_BUILDS
@pytest.mark.parametrize("V", [1000, 151936])
@pytest.mark.parametrize("kind", ["normal", "integer-ties"])
def test_sampler_verifies_drafts_like_numpy(be, V, kind, sample_build):
    """integer-ties: top-p's cut-off keeps some of a run of tied logits on most rows (the draw's tie
    ranks, TiedRow), and drafts from the top of the order are often among those ties."""
    check_sampler_verifies_drafts(be, V, 0.0, kind)


@SAMPLE_BUILDS
@pytest.mark.parametrize("V", [1000, 151936])
def test_sampler_min_p_verifies_drafts_like_numpy(be, V, sample_build):
    """With min_p 0.05 on every row the unlikely drafts are ones it filters out: never accepted."""
    check_sampler_verifies_drafts(be, V, 0.05)


def check_sampler_verifies_drafts(be, V, min_p, kind="normal"):
    """Rows carrying a draft: the accept flag and the (draft or residual) token equal NumPy's."""
    rng = np.random.default_rng(V + 5 if kind == "normal" else V + 6)
    B = 48
    if kind == "integer-ties":
        logits = rng.integers(-4, 4, (B, V)).astype(np.float32)
    else:
        logits = (3.0 * rng.standard_normal((B, V))).astype(np.float32)
    temp = rng.choice([0.0, 0.7, 1.3], B).astype(np.float32)
    top_p = rng.choice([1.0, 0.9, 0.5], B).astype(np.float32)
    top_k = rng.choice([0, 1, 5, 50], B).astype(np.int32)
    seeds = rng.integers(0, 2**62, B).astype(np.int64)
    pos = rng.integers(0, 100000, B).astype(np.int32)
    # drafts: the argmax (mostly accepted), a likely token, an unlikely one, none (-1: bonus row)
    order = np.argsort(-logits, axis=1, kind="stable")  # order[:, 0]: the argmax, the first index of ties
    draft = np.where(rng.random(B) < 0.3, order[:, 0], np.where(rng.random(B) < 0.5, order[:, 2],
                                                                  order[:, V // 2])).astype(np.int32)
    draft[rng.random(B) < 0.15] = -1
    mp = np.full(B, min_p, np.float32) if min_p else None
    out, acc = be.empty((B,), dtype=np.int32), be.empty((B,), dtype=np.int32)
    be.copy_from_host(out, np.full(B, -7, np.int32))
    be.copy_from_host(acc, np.full(B, -7, np.int32))
    be.sample(be.asarray(logits, dtype=np.float32), be.asarray(temp, dtype=np.float32),
              be.asarray(top_p, dtype=np.float32), i32(be, top_k), be.asarray(seeds, dtype=np.int64),
              i32(be, pos), out, i32(be, draft), acc, None if mp is None else be.asarray(mp, dtype=np.float32))
    got, got_acc = be.to_host(out), be.to_host(acc)
    ref, ref_acc = np.zeros(B, np.int32), np.zeros(B, np.int32)
    np_sampler.sample(logits, temp, top_p, top_k, seeds, pos, ref, draft, ref_acc, mp)
    assert set(ref_acc[draft >= 0].tolist()) == {0, 1}, "the case should both accept and reject"
    greedy = temp == 0
    assert np.array_equal(got[greedy], ref[greedy]) and np.array_equal(got_acc[greedy], ref_acc[greedy])
    assert np.array_equal(got_acc[draft < 0], np.zeros((draft < 0).sum())), "no draft, no accept"
    differ = np.nonzero((got != ref) | (got_acc != ref_acc))[0]
    assert len(differ) <= 1, f"rows {differ}: device {got[differ]}/{got_acc[differ]} vs " \
                             f"numpy {ref[differ]}/{ref_acc[differ]}"  # one near-tie at most
    if min_p:  # a sampled row's draft below M + ln(min_p) is never accepted
        rows = np.nonzero((draft >= 0) & (temp > 0))[0]
        x = logits[rows].astype(np.float64) / temp[rows, None]
        out = x[np.arange(len(rows)), draft[rows]] < x.max(1) + np.log(np.float64(mp[0]))
        assert out.any() and not got_acc[rows[out]].any()


@pytest.fixture
def verify_build(request, be):
    """Each kernel verifying drafts drawn from q: "pair" (two CTAs a row, verify_drawn_drafts_pair, the
    default up to the pairs the GPU holds at once: MINILLM_VERIFY_PAIR_ROWS) and "single" (one CTA a row), each with 512
    threads a CTA or the wide build's 1,024 ("-wide": MINILLM_VERIFY_WIDE_ROWS), and "cl8" / "cl4" (a row
    split over a cluster of 8 or 4 CTAs of 512 threads, verify_drawn_drafts_cl8 / _cl4:
    MINILLM_VERIFY_CLUSTER_ROWS, MINILLM_VERIFY_CLUSTER4_ROWS), by the backend's row limits."""
    saved = be.verify_cluster_rows, be.verify_cluster4_rows, be.verify_pair_rows, be.verify_wide_rows
    wide = request.param.endswith("-wide")
    if wide and "verify_drawn_drafts_wide" not in be.k:
        pytest.skip("MINILLM_SAMPLE_WIDE_ROWS=0 and MINILLM_VERIFY_WIDE_ROWS=0: the wide build is not loaded")
    be.verify_cluster_rows = 1 << 30 if request.param == "cl8" else 0
    be.verify_cluster4_rows = 1 << 30 if request.param == "cl4" else 0
    be.verify_pair_rows = 1 << 30 if request.param.startswith("pair") else 0
    be.verify_wide_rows = 1 << 30 if wide else 0
    try:
        yield request.param
    finally:
        be.verify_cluster_rows, be.verify_cluster4_rows, be.verify_pair_rows, be.verify_wide_rows = saved


def test_split_kernels_clusters_fit_the_sms(be):
    """The driver's count of clusters resident at once (pdl.max_active_clusters) for the split sampling
    kernels: at least one, and no more than the SMs hold at one CTA an SM (79-108 registers x 512 threads);
    clusters of 4 at least as many as of 8, pairs at least as many as clusters of 4. Each tier's default row
    limit (where its variable is not set) is its own kernel's count (the cl2 sampler's two fewer)."""
    from minillm.backends.pdl import max_active_clusters

    ctas = {"sample_tokens_cl8": 8, "sample_tokens_cl4": 4, "sample_tokens_cl2": 2, "verify_drawn_drafts_cl8": 8,
            "verify_drawn_drafts_cl4": 4, "verify_drawn_drafts_pair": 2}
    n = {name: max_active_clusters(be.k[name].kernel.ptr, c * 64, 512) for name, c in ctas.items()}
    for name, c in ctas.items():
        assert 1 <= n[name] <= be.num_sms // c, (name, n[name])
    assert n["verify_drawn_drafts_cl8"] <= n["verify_drawn_drafts_cl4"] <= n["verify_drawn_drafts_pair"], n
    tiers = (("MINILLM_SAMPLE_CLUSTER_ROWS", "sample_cluster_rows", "sample_tokens_cl8", 0),
             ("MINILLM_SAMPLE_CLUSTER4_ROWS", "sample_cluster4_rows", "sample_tokens_cl4", 0),
             ("MINILLM_SAMPLE_CLUSTER2_ROWS", "sample_cluster2_rows", "sample_tokens_cl2", 2),  # part362
             ("MINILLM_VERIFY_PAIR_ROWS", "verify_pair_rows", "verify_drawn_drafts_pair", 0),
             ("MINILLM_VERIFY_CLUSTER_ROWS", "verify_cluster_rows", "verify_drawn_drafts_cl8", 0),
             ("MINILLM_VERIFY_CLUSTER4_ROWS", "verify_cluster4_rows", "verify_drawn_drafts_cl4", 0))
    for env, attr, name, short in tiers:
        if env not in os.environ:
            assert getattr(be, attr) == max(0, n[name] - short), (attr, env, n[name])


@pytest.mark.parametrize("verify_build", ["pair", "single", "pair-wide", "single-wide", "cl8", "cl4"],
                         indirect=True)
@pytest.mark.parametrize("V,QV", [(1000, 1000), (1001, 999), (151936, 151936), (151936, 32768)])
@pytest.mark.parametrize("kind", ["normal", "integer-ties"])
def test_sampler_verifies_drawn_drafts_like_numpy(be, V, QV, kind, verify_build):
    """Drafts drawn from the drafter's q (its rows, QV <= V ids) and verified against q
    (verify_drawn_drafts, which takes the whole batch): accept flags and tokens equal NumPy's, but for a
    near-tie; rows without a q row keep the one-hot verification, rows without a draft their sample.
    integer-ties: p's and q's top-p cut-offs keep some of a run of tied logits on most rows. Both
    kernels: a row's two CTAs exchange p's and q's filters (pair), or one CTA finds both (single)."""
    from minillm.engine.sampler import DRAFT_SEED_SALT

    rng = np.random.default_rng(V + QV if kind == "normal" else V + QV + 1)
    B = 48
    if kind == "integer-ties":
        logits = rng.integers(-4, 4, (B, V)).astype(np.float32)
        q_logits = (logits[:, :QV] + rng.integers(-1, 2, (B, QV))).astype(np.float32)
    else:
        logits = (3.0 * rng.standard_normal((B, V))).astype(np.float32)
        q_logits = (logits[:, :QV] + 1.5 * rng.standard_normal((B, QV))).astype(np.float32)
    temp = rng.choice([0.0, 0.7, 1.3], B).astype(np.float32)
    top_p = rng.choice([1.0, 0.9, 0.5], B).astype(np.float32)
    top_k = rng.choice([0, 5, 50], B).astype(np.int32)
    mp = rng.choice([0.0, 0.0, 0.02], B).astype(np.float32)
    seeds = rng.integers(0, 2**62, B).astype(np.int64)
    pos = rng.integers(0, 100000, B).astype(np.int32)
    draft = np.zeros(B, np.int32)  # drawn from q as a drafting step draws them (greedy rows: q's argmax)
    np_sampler.sample(q_logits, temp, top_p, top_k, (seeds ^ DRAFT_SEED_SALT).astype(np.int64), pos, draft, min_p=mp)
    q_rows = rng.permutation(B).astype(np.int32)  # any drafter row order
    q_in = np.empty_like(q_logits)
    q_in[q_rows] = q_logits
    q_rows[rng.random(B) < 0.15] = -1  # one-hot rows
    draft[rng.random(B) < 0.1] = -1  # bonus rows
    out, acc = be.empty((B,), dtype=np.int32), be.empty((B,), dtype=np.int32)
    be.copy_from_host(out, np.full(B, -7, np.int32))
    be.copy_from_host(acc, np.full(B, -7, np.int32))
    be.sample(be.asarray(logits, dtype=np.float32), be.asarray(temp, dtype=np.float32),
              be.asarray(top_p, dtype=np.float32), i32(be, top_k), be.asarray(seeds, dtype=np.int64),
              i32(be, pos), out, i32(be, draft), acc, be.asarray(mp, dtype=np.float32),
              draft_logits=be.asarray(q_in, dtype=np.float32), draft_rows=i32(be, q_rows))
    got, got_acc = be.to_host(out), be.to_host(acc)
    ref, ref_acc = np.zeros(B, np.int32), np.zeros(B, np.int32)
    np_sampler.sample(logits, temp, top_p, top_k, seeds, pos, ref, draft, ref_acc, mp, q_in, q_rows)
    drawn = (draft >= 0) & (q_rows >= 0) & (temp > 0)
    assert set(ref_acc[drawn].tolist()) == {0, 1}, "the case should both accept and reject drawn drafts"
    assert np.array_equal(got_acc[draft < 0], np.zeros((draft < 0).sum())), "no draft, no accept"
    differ = np.nonzero((got != ref) | (got_acc != ref_acc))[0]
    assert len(differ) <= 1, f"rows {differ}: device {got[differ]}/{got_acc[differ]} vs " \
                             f"numpy {ref[differ]}/{ref_acc[differ]}"  # one near-tie at most


def test_drawn_drafts_keep_the_distribution_on_device(be):
    """20,000 drafts drawn from q and verified against it on the device: the tokens follow p
    (chi-square) and the acceptance rate is sum(min(p, q))."""
    from scipy.stats import chisquare
    from test_sampling import draw_then_verify

    def device_sample(logits, temp, top_p, top_k, seeds, pos, out, draft=None, accepted=None, min_p=None,
                      draft_logits=None, draft_rows=None):
        o = be.empty(out.shape, dtype=np.int32)
        a = None if accepted is None else be.empty(out.shape, dtype=np.int32)
        be.sample(be.asarray(logits, dtype=np.float32), be.asarray(temp, dtype=np.float32),
                  be.asarray(top_p, dtype=np.float32), i32(be, top_k), be.asarray(seeds, dtype=np.uint64),
                  i32(be, pos), o, None if draft is None else i32(be, draft), a,
                  be.asarray(min_p, dtype=np.float32),
                  draft_logits=None if draft_logits is None else be.asarray(draft_logits, dtype=np.float32),
                  draft_rows=None if draft_rows is None else i32(be, draft_rows))
        out[:] = be.to_host(o)
        if accepted is not None:
            accepted[:] = be.to_host(a)

    rng = np.random.default_rng(4)
    V, n = 12, 20_000
    p_logits = (rng.standard_normal(V) * 1.5).astype(np.float32)
    q_logits = (p_logits + rng.standard_normal(V).astype(np.float32) * 0.7).astype(np.float32)
    filters = (0.9, 0.95, 0, 0.0)
    out, accepted, d = draw_then_verify(p_logits, q_logits, filters, n, device_sample)
    f = (float(np.float32(0.9)), float(np.float32(0.95)), 0, 0.0)
    p, q = np_sampler.probs_from_logits(p_logits, *f), np_sampler.probs_from_logits(q_logits, *f)
    assert np.array_equal(accepted == 1, out == d) and (q[d] > 0).all()
    rate = np.minimum(p, q).sum()
    assert abs(accepted.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / n)
    support = np.nonzero(p)[0]
    counts = np.bincount(out, minlength=V)
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[support], p[support] * n).pvalue > 0.001


# ---- arena and graphs -------------------------------------------------------------------------
def test_allocation_after_seal_raises_with_call_site(be):
    from minillm.backends.arena import ArenaSealedError

    plan = be.memory_plan()
    assert "total asked" in plan and "free after" in plan
    be.seal()
    try:
        with pytest.raises(ArenaSealedError) as e:
            be.empty((1024,))
        assert "test_cuda_ops.py" in str(e.value)  # the message names the call site
    finally:
        be.unseal()


def test_captured_graph_replays_like_eager(be):
    """A decode-like step (attention, matmul, sampling) captured once while the arena is sealed,
    replayed with new per-step inputs copied into the same buffers."""
    rng = np.random.default_rng(11)
    H, KH, D, bs, B = 8, 2, 64, 16, 3
    q, kc, vc, bt, sl, qs = make_attention_case(rng, [1] * B, [40, 90, 7], H, KH, D, bs)
    bt = np.where(bt < 0, 0, bt)  # every table entry valid: later steps grow the contexts to 96
    w = (rng.standard_normal((300, H * D)) / np.sqrt(H * D)).astype(np.float32)
    dq, dk, dv, dw = be.asarray(q), be.asarray(kc), be.asarray(vc), be.asarray(w)
    dbt, dsl, dqs = i32(be, bt), i32(be, sl), i32(be, qs)
    attn = be.empty((B, H, D))
    logits = be.empty((B, 300), dtype=np.float32)
    params = [be.asarray([0.0, 0.7, 1.0], dtype=np.float32), be.asarray([1.0, 0.9, 1.0], dtype=np.float32),
              i32(be, np.zeros(B)), be.asarray(np.arange(B), dtype=np.int64), i32(be, np.zeros(B))]
    toks = be.empty((B,), dtype=np.int32)

    def step():
        be.paged_attention(dq, dk, dv, dbt, dsl, dqs, D ** -0.5, attn)
        be.matmul(attn.reshape(B, H * D), dw, logits)
        be.sample(logits, *params, toks)

    step()
    be.seal()
    try:
        graph = be.capture_graph(step)
        results = []
        for new_lens in ([41, 91, 8], [3, 96, 60]):
            be.copy_from_host(dsl, np.asarray(new_lens, np.int32))
            be.copy_from_host(dq, rng.standard_normal(q.shape).astype(np.float32).astype(be.dtype))
            graph.replay()
            replayed = (host(be, logits), be.to_host(toks))
            step()
            eager = (host(be, logits), be.to_host(toks))
            results.append((replayed, eager))
    finally:
        be.unseal()
    for (rl, rt), (el, et) in results:
        assert not np.isnan(rl).any()
        np.testing.assert_allclose(rl, el, rtol=1e-6, atol=1e-6)
        assert np.array_equal(rt, et)


def test_debug_build_traps_a_bad_block_table():
    """MINILLM_CUDA_DEBUG=1: an out-of-range block id stops the kernel with a named check (run in
    a subprocess: a trapped kernel poisons its CUDA context)."""
    code = textwrap.dedent("""
        import numpy as np
        from minillm.backends.cuda_ops import CudaBackend
        be = CudaBackend(dtype=np.float32, debug=True)
        i = lambda x: be.asarray(np.asarray(x, np.int32), dtype=np.int32)
        q = be.asarray(np.ones((1, 2, 64), np.float32)); kc = be.zeros((4, 16, 1, 64))
        out = be.empty((1, 2, 64))
        be.paged_attention(q, kc, kc, i([[0, 99]]), i([20]), i([0, 1]), 0.125, out)
        be.synchronize()
        print("NO TRAP")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    text = r.stdout + r.stderr
    assert r.returncode != 0 and "NO TRAP" not in text, text[-3000:]
    # the device printf normally reaches stdout; the trap itself surfaces as a launch failure
    assert "MINILLM_CHECK failed" in text or "cudaErrorLaunchFailure" in text or "trap" in text.lower(), (
        text[-3000:])
