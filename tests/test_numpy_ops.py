"""The NumPy backend's fused ops equal the unfused sequences they stand for (no GPU needed).

A fused op's NumPy twin is the oracle of its CUDA kernel, so it must be exactly the op sequence
the model ran before the fusion.
"""

from __future__ import annotations

import numpy as np
import pytest

from minillm.backends.numpy_ops import NumpyBackend
from minillm.models.config import ModelConfig
from minillm.models.rope import cos_sin_table

REF = NumpyBackend()


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qk_norm_rope_store_kv_is_qk_norm_rope_then_store_kv(qk_norm):
    rng = np.random.default_rng(7 + qk_norm)
    T, H, KH, D, nb, bs = 11, 8, 2, 64, 6, 8
    cfg = ModelConfig(arch="qwen3", vocab_size=10, hidden_size=H * D, num_layers=1, num_heads=H,
                      num_kv_heads=KH, head_dim=D, intermediate_size=10, rope_theta=1e6)
    cs = cos_sin_table(cfg, 512)
    qkv = rng.standard_normal((T, (H + 2 * KH) * D)).astype(np.float32)
    qw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if qk_norm else None
    kw = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if qk_norm else None
    pos = rng.integers(0, 512, T).astype(np.int32)
    slots = rng.permutation(nb * bs)[:T].astype(np.int32)
    slots[[0, 5]] = -1
    caches = rng.standard_normal((2, nb, bs, KH, D)).astype(np.float32)

    def split(a):
        return (a[:, : H * D].reshape(T, H, D), a[:, H * D: (H + KH) * D].reshape(T, KH, D),
                a[:, (H + KH) * D:].reshape(T, KH, D))

    a, ca = qkv.copy(), caches.copy()
    q, k, v = split(a)
    REF.qk_norm_rope_store_kv(q, k, v, qw, kw, 1e-6, pos, cs, ca[0], ca[1], slots)
    b, cb = qkv.copy(), caches.copy()
    q, k, v = split(b)
    REF.qk_norm_rope(q, k, qw, kw, 1e-6, pos, cs)
    REF.store_kv(k, v, cb[0], cb[1], slots)
    assert np.array_equal(a, b) and np.array_equal(ca, cb)
    assert not np.array_equal(ca, caches)  # something was stored


def test_matmul_silu_mul_is_matmul_then_silu_mul():
    rng = np.random.default_rng(3)
    M, K, F = 5, 96, 70
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((2 * F, K)) / np.sqrt(K)).astype(np.float32)
    out, gate_up = np.empty((M, F), np.float32), np.empty((M, 2 * F), np.float32)
    REF.matmul_silu_mul(x, w, out, gate_up)
    gu, ref = np.empty((M, 2 * F), np.float32), np.empty((M, F), np.float32)
    REF.matmul(x, w, out=gu)
    REF.silu_mul(gu, out=ref)
    assert np.array_equal(out, ref)
    g = x.astype(np.float64) @ w[:F].T.astype(np.float64)
    u = x.astype(np.float64) @ w[F:].T.astype(np.float64)
    assert np.allclose(out, g / (1 + np.exp(-g)) * u, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_folded_norm_products_are_the_unfused_ops(rows, bias):
    """A layer's MLP half with its norms folded (matmul_residual, rms_norm_matmul_silu_mul,
    matmul_residual, then rms_norm_matmul for the next qkv) equals matmul, rms_norm with the
    residual add, matmul_silu_mul, matmul, rms_norm, matmul bit for bit, residual included."""
    rng = np.random.default_rng(rows + 2 * bias)
    H, Q, F, NQKV = 64, 96, 80, 160
    r0 = rng.standard_normal((rows, H)).astype(np.float32)
    attn = rng.standard_normal((rows, Q)).astype(np.float32)
    w_o = (rng.standard_normal((H, Q)) / np.sqrt(Q)).astype(np.float32)
    w_gu = (rng.standard_normal((2 * F, H)) / np.sqrt(H)).astype(np.float32)
    w_down = (rng.standard_normal((H, F)) / np.sqrt(F)).astype(np.float32)
    w_qkv = (rng.standard_normal((NQKV, H)) / np.sqrt(H)).astype(np.float32)
    g1, g2 = (1 + 0.1 * rng.standard_normal((2, H))).astype(np.float32)
    b = rng.standard_normal(NQKV).astype(np.float32) if bias else None

    r, hidden, normed = r0.copy(), np.empty((rows, H), np.float32), np.empty((rows, H), np.float32)
    act, qkv = np.empty((rows, F), np.float32), np.empty((rows, NQKV), np.float32)
    REF.matmul(attn, w_o, out=hidden)
    REF.rms_norm(hidden, g1, 1e-6, out=normed, residual=r)
    REF.matmul_silu_mul(normed, w_gu, out=act, gate_up=np.empty((rows, 2 * F), np.float32))
    REF.matmul(act, w_down, out=hidden)
    REF.rms_norm(hidden, g2, 1e-6, out=normed, residual=r)
    REF.matmul(normed, w_qkv, out=qkv, bias=b)

    rf = r0.copy()
    sumsq = np.full((rows, REF.norm_partials(H)), np.nan, np.float32)
    act_f, qkv_f = np.full_like(act, np.nan), np.full_like(qkv, np.nan)
    REF.matmul_residual(attn, w_o, rf, sumsq)
    REF.rms_norm_matmul_silu_mul(rf, sumsq, g1, 1e-6, w_gu, out=act_f)
    REF.matmul_residual(act_f, w_down, rf, sumsq)
    np.testing.assert_allclose(sumsq.sum(-1), np.square(rf.astype(np.float64)).sum(-1), rtol=1e-5)
    REF.rms_norm_matmul(rf, sumsq, g2, 1e-6, w_qkv, out=qkv_f, bias=b)
    assert np.array_equal(rf, r) and np.array_equal(act_f, act) and np.array_equal(qkv_f, qkv)


def test_model_steps_with_folded_norms_equal_unfolded(tiny, monkeypatch):
    """The model with one-row steps folding their norms (as on the GPU) and with every step
    unfolded: the same greedy tokens and the same logprobs, bit for bit. (The NumPy backend runs
    one-row steps through decode_layers by default; here they go op by op, as on the GPU.)"""
    from minillm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
    prompts = [[1, 5, 9, 2], [7, 7, 3]]

    def run():
        llm = LLM(tiny, device="cpu", max_num_seqs=1, max_model_len=64)
        llm.engine.model.decoder = None
        outs = llm.generate(prompts, params)
        return [(o.token_ids, [(lp.logprob, lp.top) for lp in o.logprobs]) for o in outs]

    calls = []
    fold = NumpyBackend.matmul_residual
    monkeypatch.setattr(NumpyBackend, "matmul_residual", lambda self, *a: calls.append(1) or fold(self, *a))
    folded = run()
    assert len(calls) >= 2 * 5  # o and down of every layer of the decode steps
    monkeypatch.setattr(NumpyBackend, "folds_norms", lambda self, rows, hidden: False)
    n = len(calls)
    assert run() == folded and len(calls) == n
