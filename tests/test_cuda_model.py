"""The whole model on the CUDA backend against the NumPy backend: ragged prefill, then decode.

A tiny random Qwen3 / Qwen2 / Llama is built twice from the same float weights (Transformer
constructed directly), and both are driven with hand-made StepInputs over the same paged layout:
one prefill of several ragged prompts, then decode steps, one of them padded to a bucket with a
padding row (negative slot, seq_len 0), with the runner's one-query hint (so each layer's q/k
rotation, KV store and attention run as one kernel). Logits must agree within 2e-2 relative error, and greedy
tokens must agree wherever the NumPy top-2 margin is clear of bf16 noise. The decode step is
also captured as a CUDA graph once and replayed for the following steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from minillm.backends.numpy_ops import NumpyBackend
from minillm.models.config import ModelConfig
from minillm.models.transformer import StepInputs, Transformer, Workspace

pytestmark = pytest.mark.gpu

CONFIGS = {
    "qwen3": dict(arch="qwen3", vocab_size=512, hidden_size=256, num_layers=3, num_heads=4,
                  num_kv_heads=2, head_dim=64, intermediate_size=512, qk_norm=True,
                  tie_word_embeddings=True, rope_theta=1e6),
    "qwen2": dict(arch="qwen2", vocab_size=384, hidden_size=192, num_layers=2, num_heads=6,
                  num_kv_heads=2, head_dim=32, intermediate_size=320, attention_bias=True),
    "llama": dict(arch="llama", vocab_size=300, hidden_size=128, num_layers=2, num_heads=8,
                  num_kv_heads=1, head_dim=16, intermediate_size=256, rms_norm_eps=1e-5),
}
BS, MAX_BLOCKS, NUM_BLOCKS = 16, 6, 24


def random_weights(cfg: ModelConfig, rng) -> dict[str, np.ndarray]:
    """Float32 weights holding bf16-representable values, so both backends use the same model."""
    import ml_dtypes

    def bf(x):
        return np.asarray(np.asarray(x, ml_dtypes.bfloat16), np.float32)

    def lin(o, i):
        return bf(rng.standard_normal((o, i)) / np.sqrt(i))

    def norm(n):
        return bf(1 + 0.1 * rng.standard_normal(n))

    hs, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    w = {"embed": bf(rng.standard_normal((cfg.vocab_size, hs))), "norm": norm(hs)}
    if not cfg.tie_word_embeddings:
        w["lm_head"] = lin(cfg.vocab_size, hs)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        w |= {p + "attn_norm": norm(hs), p + "q": lin(q, hs), p + "k": lin(kv, hs),
              p + "v": lin(kv, hs), p + "o": lin(hs, q), p + "mlp_norm": norm(hs),
              p + "gate": lin(cfg.intermediate_size, hs), p + "up": lin(cfg.intermediate_size, hs),
              p + "down": lin(hs, cfg.intermediate_size)}
        if cfg.qk_norm:
            w[p + "q_norm"], w[p + "k_norm"] = norm(cfg.head_dim), norm(cfg.head_dim)
        if cfg.attention_bias:
            for n, size in (("q_bias", q), ("k_bias", kv), ("v_bias", kv)):
                w[p + n] = bf(0.1 * rng.standard_normal(size))
    return w


class Driver:
    """One backend's model, KV pool, workspace and fixed-size step buffers."""

    def __init__(self, backend, cfg, weights, max_tokens=64, max_seqs=4):
        self.be = backend
        self.model = Transformer(cfg, weights, backend, max_positions=MAX_BLOCKS * BS)
        self.kv = self.model.allocate_kv_cache(NUM_BLOCKS, BS)
        self.ws = Workspace(backend, cfg, max_tokens, max_seqs)
        self.max_tokens, self.max_seqs = max_tokens, max_seqs

    def inputs(self, ids, pos, slots, bt, lens, qs, li) -> StepInputs:
        a = lambda x: self.be.asarray(np.asarray(x, np.int32), dtype=np.int32)  # noqa: E731
        return StepInputs(a(ids), a(pos), a(slots), a(bt), a(lens), a(qs), a(li))

    def step(self, x: StepInputs, T: int, R: int) -> np.ndarray:
        logits = self.model.forward(x, T, R, self.kv, self.ws)
        return np.asarray(self.be.to_host(logits), np.float32)


def layout(lens: list[int], q_lens: list[int], tables: np.ndarray):
    """positions, slots, query_start and logits rows for sequences whose last q_lens tokens are new."""
    pos, slots, qs = [], [], [0]
    for b, (L, n) in enumerate(zip(lens, q_lens)):
        for p in range(L - n, L):
            pos.append(p)
            slots.append(tables[b, p // BS] * BS + p % BS if L > 0 else -1)
        qs.append(qs[-1] + n)
    return pos, slots, qs, [e - 1 for e in qs[1:]]


def rel(a, b) -> float:
    assert not np.isnan(a).any()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def greedy_agree(cuda_logits, ref_logits) -> None:
    top2 = np.sort(ref_logits, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.05 * np.abs(ref_logits).max(axis=-1)
    ours, theirs = cuda_logits.argmax(-1), ref_logits.argmax(-1)
    assert np.array_equal(ours[clear], theirs[clear]), (ours, theirs, clear)


@pytest.mark.parametrize("arch,dtype", [(a, "bfloat16") for a in CONFIGS] + [("qwen3", "float32")])
def test_model_prefill_then_decode_matches_numpy(arch, dtype):
    import ml_dtypes

    from minillm.backends.cuda_ops import CudaBackend

    rng = np.random.default_rng(len(arch))
    cfg = ModelConfig(**CONFIGS[arch])
    weights = random_weights(cfg, rng)
    be = CudaBackend(dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    limit = 2e-2 if dtype == "bfloat16" else 1e-4
    try:
        cu = Driver(be, cfg, weights)
        ref = Driver(NumpyBackend(), cfg, weights)
        tables = rng.permutation(NUM_BLOCKS)[: 3 * MAX_BLOCKS].reshape(3, MAX_BLOCKS).astype(np.int32)

        # prefill: three ragged prompts in one step
        lens = [5, 17, 33]
        ids = rng.integers(0, cfg.vocab_size, sum(lens))
        pos, slots, qs, li = layout(lens, lens, tables)
        args = (ids, pos, slots, tables, lens, qs, li)
        lc = cu.step(cu.inputs(*args), len(ids), 3)
        lr = ref.step(ref.inputs(*args), len(ids), 3)
        assert rel(lc, lr) < limit, f"prefill logits rel err {rel(lc, lr)}"
        print(f"{arch} {dtype} prefill logits rel err {rel(lc, lr):.2e}")
        greedy_agree(lc, lr)
        print(be.memory_plan())

        # decode: bucket of 4 rows, the 4th a padding row (slot -1, seq_len 0); NumPy's greedy
        # tokens feed both models so they stay on the same path. Step 1 eager, then captured.
        be_tables = np.vstack([tables, np.zeros((1, MAX_BLOCKS), np.int32)])
        x_cu = cu.inputs(*([0] * 4 for _ in range(3)), be_tables, [0] * 4, [0] * 5, [0] * 4)
        x_cu.max_query_len = 1  # one new token a sequence: the fused q/k rope + KV store + attention
        tok = lr.argmax(-1)
        graph = None
        for step in range(4):
            lens = [n + 1 for n in lens]
            pos, slots, qs, li = layout(lens + [0], [1, 1, 1, 1], be_tables)
            slots[3], pos[3] = -1, 0
            ids = list(tok) + [0]
            host = dict(input_ids=ids, positions=pos, slot_mapping=slots, block_tables=be_tables,
                        seq_lens=lens + [0], query_start=qs, logits_indices=li)
            for name, val in host.items():
                be.copy_from_host(getattr(x_cu, name), np.asarray(val, np.int32))
            if graph is None:
                lc = cu.step(x_cu, 4, 4)[:3]
                be.seal()  # from here on nothing may allocate: capture and replay
                graph = be.capture_graph(lambda: cu.model.forward(x_cu, 4, 4, cu.kv, cu.ws))
            else:
                graph.replay()
                lc = np.asarray(be.to_host(cu.ws.logits[:3]), np.float32)
            x_ref = ref.inputs(*host.values())
            x_ref.max_query_len = 1
            lr = ref.step(x_ref, 4, 4)[:3]
            assert rel(lc, lr) < limit, f"decode step {step}: rel err {rel(lc, lr)}"
            print(f"{arch} {dtype} decode step {step} logits rel err {rel(lc, lr):.2e}")
            greedy_agree(lc, lr)
            tok = lr.argmax(-1)
    finally:
        be.unseal()
        be.close()


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_one_sequence_decode_with_folded_norms_same_bits(arch):
    """A one-sequence decode step runs each layer's norms inside the qkv / gate_up products
    (MINILLM_FOLD_NORMS_MAX_K; these models are under the default's 1,024): its logits are the
    unfolded step's to the bit, eagerly and replayed from a graph whose only rms_norm launches are
    the last layer's MLP norm and the final norm, and match NumPy's (Qwen2's qkv bias included)."""
    import ml_dtypes

    from minillm.backends.cuda_ops import CudaBackend

    rng = np.random.default_rng(100 + len(arch))
    cfg = ModelConfig(**CONFIGS[arch])
    weights = random_weights(cfg, rng)
    be = CudaBackend(dtype=ml_dtypes.bfloat16)
    try:
        folded, unfolded, ref = Driver(be, cfg, weights), Driver(be, cfg, weights), Driver(NumpyBackend(), cfg, weights)
        tables = rng.permutation(NUM_BLOCKS)[:MAX_BLOCKS].reshape(1, MAX_BLOCKS).astype(np.int32)
        L = 21
        ids = rng.integers(0, cfg.vocab_size, L)
        args = (ids, *layout([L], [L], tables)[:2], tables, [L], *layout([L], [L], tables)[2:])
        for d in (folded, unfolded, ref):
            lr = d.step(d.inputs(*args), L, 1)
        graph = None
        for step in range(4):
            L += 1
            pos, slots, qs, li = layout([L], [1], tables)
            args = ([int(lr.argmax())], pos, slots, tables, [L], qs, li)
            got = {}
            for fold, d in ((True, folded), (False, unfolded)):
                be.fold_norms_max_k = 4096 if fold else 0
                x = d.inputs(*args)
                x.max_query_len = 1
                if fold and step == 2:  # a graph of the folded step, replayed
                    from collections import Counter

                    before = Counter(be.captured_launches)
                    graph = be.capture_graph(lambda d=d, x=x: d.model.forward(x, 1, 1, d.kv, d.ws))
                    launched = be.captured_launches - before
                    # every norm folded but the last layer's MLP norm (the residual stream must end
                    # in ws.residual) and the final norm
                    assert sum(n for k, n in launched.items() if "norm" in k and "gemv1" in k) == 2 * cfg.num_layers - 1
                    assert sum(n for k, n in launched.items() if k.startswith("rms_norm")) == 2, launched
                    graph.replay()  # capture only records: this runs the step
                    got[fold] = np.asarray(be.to_host(d.ws.logits[:1]), np.float32)
                else:
                    got[fold] = d.step(x, 1, 1)
            x_ref = ref.inputs(*args)
            x_ref.max_query_len = 1
            lr = ref.step(x_ref, 1, 1)
            assert np.array_equal(got[True], got[False]), f"step {step}"
            assert rel(got[True], lr) < 2e-2, f"decode step {step}: rel err {rel(got[True], lr)}"
            greedy_agree(got[True], lr)
    finally:
        be.close()


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_one_sequence_decode_with_staged_products_same_bits(arch):
    """MINILLM_GEMV1_STAGE (cuda/gemv.cu's gemv1_stage_*: one-row products whose CTAs copy their weight
    shares into shared memory before the PDL wait and release the next kernels at once): a one-sequence
    decode step's logits are the same bits at 0, 1 and 2, eagerly and replayed from a graph, where
    everything launched between kernels runs under PDL. At 2 (the default) the graph stages every
    layer's qkv, gate_up and down and, where the fused decode attention runs (head dim 64: qwen3), keeps
    the o product after it on its own kernel."""
    from collections import Counter

    import ml_dtypes

    from minillm.backends.cuda_ops import CudaBackend

    rng = np.random.default_rng(200 + len(arch))
    cfg = ModelConfig(**CONFIGS[arch])
    weights = random_weights(cfg, rng)
    be = CudaBackend(dtype=ml_dtypes.bfloat16)
    saved = be.gemv1_stage
    try:
        drivers = {s: Driver(be, cfg, weights) for s in (0, 1, 2)}
        tables = rng.permutation(NUM_BLOCKS)[:MAX_BLOCKS].reshape(1, MAX_BLOCKS).astype(np.int32)
        L = 19
        ids = rng.integers(0, cfg.vocab_size, L)
        args = (ids, *layout([L], [L], tables)[:2], tables, [L], *layout([L], [L], tables)[2:])
        for s, d in drivers.items():
            be.gemv1_stage = s
            lr = d.step(d.inputs(*args), L, 1)
        for step in range(4):
            L += 1
            pos, slots, qs, li = layout([L], [1], tables)
            args = ([int(lr.argmax())], pos, slots, tables, [L], qs, li)
            got = {}
            for s, d in drivers.items():
                be.gemv1_stage = s
                x = d.inputs(*args)
                x.max_query_len = 1
                if step == 2:  # a graph of this step, replayed
                    before = Counter(be.captured_launches)
                    graph = be.capture_graph(lambda d=d, x=x: d.model.forward(x, 1, 1, d.kv, d.ws))
                    launched = be.captured_launches - before
                    staged = sum(n for k, n in launched.items() if k.startswith("gemv1_stage"))
                    if s == 0:
                        assert staged == 0, launched
                    elif s == 2 and arch == "qwen3":
                        assert any(k.startswith("paged_decode") for k in launched), launched
                        assert staged == 3 * cfg.num_layers, launched  # qkv, gate_up, down
                        assert launched["gemv1_pre_bf16"] + launched["gemv1_bf16"] >= cfg.num_layers, launched
                    else:
                        assert staged >= 3 * cfg.num_layers, launched
                    graph.replay()  # capture only records: this runs the step
                    got[s] = np.asarray(be.to_host(d.ws.logits[:1]), np.float32)
                else:
                    got[s] = d.step(x, 1, 1)
            assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2]), f"step {step}"
            lr = got[0]
    finally:
        be.gemv1_stage = saved
        be.close()


@pytest.mark.parametrize("layers", [3, 4])
def test_one_sequence_decode_with_split_mlp(layers):
    """MINILLM_MLP_SPLIT (cuda/gemv.cu's gemv1_mlp_split_*: each layer's MLP but the last as one kernel
    adding its down sums into a ring row that the next qkv product reads): one-sequence decode steps,
    two eager and then one graph replayed for four more, match NumPy's logits (2e-2) and greedy tokens
    at 1 (fp32 atomic sums), 2 (fixed-point) and 3 (fp32, the down weight transposed at load), and the
    plain path's within the same bound. Two
    models at 2 give the same bits at every step (integer sums do not depend on the order the CTAs
    add). The graph launches the split kernel and its reader L - 1 times each. Rings of 2 and 3 rows."""
    from collections import Counter

    import ml_dtypes

    from minillm.backends.cuda_ops import CudaBackend

    rng = np.random.default_rng(300 + layers)
    cfg = ModelConfig(**(CONFIGS["qwen3"] | {"num_layers": layers}))
    weights = random_weights(cfg, rng)
    be = CudaBackend(dtype=ml_dtypes.bfloat16)
    saved = be.mlp_split
    modes = {"plain": 0, "f32": 1, "i64": 2, "i64 again": 2, "f32 down_t": 3, "f32 staged down_t": 4}
    try:
        drivers = {}
        for name, m in modes.items():
            be.mlp_split = m
            drivers[name] = Driver(be, cfg, weights)
            assert (drivers[name].ws.mlp_acc is None) == (m == 0)
            assert all((lw.down_t is None) == (m < 3) for lw in drivers[name].model.layers)
        ref = Driver(NumpyBackend(), cfg, weights)
        tables = rng.permutation(NUM_BLOCKS)[:MAX_BLOCKS].reshape(1, MAX_BLOCKS).astype(np.int32)
        L = 17
        ids = rng.integers(0, cfg.vocab_size, L)
        args = (ids, *layout([L], [L], tables)[:2], tables, [L], *layout([L], [L], tables)[2:])
        for name, d in drivers.items():
            be.mlp_split = modes[name]
            d.step(d.inputs(*args), L, 1)
        lr = ref.step(ref.inputs(*args), L, 1)
        fixed, graphs = {}, {}
        for step in range(6):
            L += 1
            pos, slots, qs, li = layout([L], [1], tables)
            args = ([int(lr.argmax())], pos, slots, tables, [L], qs, li)
            got = {}
            for name, d in drivers.items():
                be.mlp_split = modes[name]
                if step < 2:
                    x = d.inputs(*args)
                    x.max_query_len = 1
                    got[name] = d.step(x, 1, 1)
                    continue
                if name not in graphs:
                    fixed[name] = x = d.inputs(*args)
                    x.max_query_len = 1
                    before = Counter(be.captured_launches)
                    graphs[name] = be.capture_graph(lambda d=d, x=x: d.model.forward(x, 1, 1, d.kv, d.ws))
                    launched = be.captured_launches - before
                    split = sum(n for k, n in launched.items() if k.startswith("gemv1_mlp_split"))
                    readers = sum(n for k, n in launched.items() if k.startswith("gemv1_stage_norm1_acc"))
                    want = 0 if modes[name] == 0 else layers - 1
                    assert split == want and readers == want, launched
                for field, val in zip(("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens",
                                       "query_start", "logits_indices"), args):
                    be.copy_from_host(getattr(fixed[name], field), np.asarray(val, np.int32))
                graphs[name].replay()
                got[name] = np.asarray(be.to_host(d.ws.logits[:1]), np.float32)
            x_ref = ref.inputs(*args)
            x_ref.max_query_len = 1
            lr = ref.step(x_ref, 1, 1)
            assert np.array_equal(got["i64"], got["i64 again"]), f"step {step}"
            for name, lc in got.items():
                assert rel(lc, lr) < 2e-2, f"{name} step {step}: rel err {rel(lc, lr)}"
                assert rel(lc, got["plain"]) < 2e-2, f"{name} step {step}"
                greedy_agree(lc, lr)
            ring = be.to_host(drivers["i64"].ws.mlp_acc)
            assert not ring[:-1].any() and ring[-1].any()  # every row zero but the last split layer's
    finally:
        be.mlp_split = saved
        be.close()
