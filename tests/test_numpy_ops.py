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
