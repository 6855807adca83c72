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


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matmul_is_rms_norm_then_matmul(with_residual):
    """The folded-norm products' twins: rms_norm (updating a copy of the residual, which is left
    as it was) then the product, bit for bit; residual_out gets the sum."""
    rng = np.random.default_rng(11)
    K, N, F = 96, 40, 30
    x = rng.standard_normal((1, K)).astype(np.float32)
    res = rng.standard_normal((1, K)).astype(np.float32) if with_residual else None
    nw = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    wg = (rng.standard_normal((2 * F, K)) / np.sqrt(K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    res_before = None if res is None else res.copy()
    out, act = np.empty((1, N), np.float32), np.empty((1, F), np.float32)
    res_out, res_out2 = np.full((1, K), np.nan, np.float32), np.full((1, K), np.nan, np.float32)
    scratch, gu = np.empty((1, K), np.float32), np.empty((1, 2 * F), np.float32)
    REF.rms_norm_matmul(x, res, nw, 1e-6, w, out, res_out if with_residual else None, scratch, bias=bias)
    REF.rms_norm_matmul_silu_mul(x, res, nw, 1e-6, wg, act, res_out2 if with_residual else None, scratch, gu)

    r = None if res is None else res.copy()
    normed, ref, ref_act = np.empty((1, K), np.float32), np.empty((1, N), np.float32), np.empty((1, F), np.float32)
    REF.rms_norm(x, nw, 1e-6, out=normed, residual=r)
    REF.matmul(normed, w, out=ref, bias=bias)
    REF.matmul_silu_mul(normed, wg, out=ref_act, gate_up=np.empty((1, 2 * F), np.float32))
    assert np.array_equal(out, ref) and np.array_equal(act, ref_act)
    if with_residual:
        assert np.array_equal(res, res_before)  # the folded kernels' CTAs all read it: never written
        assert np.array_equal(res_out, r) and np.array_equal(res_out2, r)
    else:
        assert np.isnan(res_out).all()


def test_one_row_steps_with_folded_norms_match_unfolded(tmp_path, monkeypatch):
    """One-row steps run each layer's norms inside the products after them (Transformer.forward,
    the residual stream alternating between two rows); the engine's greedy tokens and logprobs are
    those of the unfolded layer order, through decode steps and a prefix-cached prompt. (The CPU
    normally runs one-row steps through decode_layers, the one-kernel decoder's twin: switched off
    here, as the GPU has it by default.)"""
    from minillm import LLM, SamplingParams
    from minillm.tools import random_model as rm

    model = rm.write_random_model(tmp_path / "tiny", "tiny", seed=5)
    calls = {"rms_norm_matmul": 0, "rms_norm_matmul_silu_mul": 0}
    def counting(name):
        op = getattr(NumpyBackend, name)

        def counted(self, *a, **kw):
            calls[name] += 1
            return op(self, *a, **kw)
        return counted
    for name in calls:
        monkeypatch.setattr(NumpyBackend, name, counting(name))
    monkeypatch.setattr(NumpyBackend, "decoder_plan", lambda self, *a: None)
    prompts = ["the quick brown fox", "the quick brown fox jumps over"]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=3)
    got = {}
    for fold in (True, False):
        monkeypatch.setattr(NumpyBackend, "folds_norms", lambda self, rows, hidden, f=fold: f and rows == 1)
        llm = LLM(str(model), device="cpu", max_num_seqs=1, max_model_len=64, enable_prefix_caching=True)
        outs = llm.generate(prompts, params)
        got[fold] = [(o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs])
                     for o in outs]
        if fold:
            folded = dict(calls)
    assert got[True] == got[False]
    L = rm.PRESETS["tiny"]["num_hidden_layers"]
    assert folded["rms_norm_matmul"] >= 11 * L and folded["rms_norm_matmul_silu_mul"] >= 11 * (L - 1)


@pytest.mark.parametrize("layers", [3, 4])
def test_one_row_steps_with_split_mlp_match(tmp_path, monkeypatch, layers):
    """With the split MLP on (the CUDA backend's MINILLM_MLP_SPLIT; here NumpyBackend.mlp_split), one-row
    steps run each layer's MLP but the last as rms_norm_mlp_split, adding the down sums into a ring row
    of the workspace that the next layer's qkv product reads. On the CPU those sums are the plain
    path's bits, so greedy tokens and logprobs over many steps (and a prefix-cached prompt) must be
    identical: a ring row not zeroed before its adds would carry one step's sums into the next. After
    the run every ring row but the last layer's is zero again (odd and even ring lengths)."""
    from minillm import LLM, SamplingParams
    from minillm.tools import random_model as rm

    model = rm.write_random_model(tmp_path / "tiny", "tiny", seed=6, num_layers=layers)
    calls = {"n": 0}
    op = NumpyBackend.rms_norm_mlp_split

    def counted(self, *a, **kw):
        calls["n"] += 1
        return op(self, *a, **kw)
    monkeypatch.setattr(NumpyBackend, "rms_norm_mlp_split", counted)
    monkeypatch.setattr(NumpyBackend, "decoder_plan", lambda self, *a: None)
    monkeypatch.setattr(NumpyBackend, "folds_norms", lambda self, rows, hidden: rows == 1)
    prompts = ["the quick brown fox", "the quick brown fox jumps over", "a b"]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=3)
    got, rings = {}, {}
    for split in (3, 1, 0):  # 3: down given transposed
        monkeypatch.setattr(NumpyBackend, "mlp_split", split)
        llm = LLM(str(model), device="cpu", max_num_seqs=1, max_model_len=64, enable_prefix_caching=True)
        outs = llm.generate(prompts, params)
        got[split] = [(o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs]) for o in outs]
        rings[split] = llm.engine.runner.ws.mlp_acc
    assert got[1] == got[0] and got[3] == got[0]
    assert rings[0] is None and rings[1].shape == (layers - 1, 1, 64)
    assert not rings[1][:-1].any() and rings[1][-1].any()
    assert rings[3].shape == rings[1].shape and not rings[3][:-1].any()
    assert calls["n"] >= 2 * 3 * 11 * (layers - 1)
