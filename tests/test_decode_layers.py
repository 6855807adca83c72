"""All decoder layers of a one-token step in one kernel (cuda/decode_layers.cu) against the same
model run op by op (its NumPy twin's sequence, on the same CUDA backend) and against the NumPy
backend.

A random model prefills a context through the op-by-op path, then decodes one token twice: with
the model's decoder plan switched off and on. The logits, the residual state the final norm
reads, and the new token's K/V rows in every layer's cache (poisoned in between, so a row the
kernel does not write fails) must agree within bf16 noise; the logits also match the NumPy
backend within 2e-2. Contexts cross attention-split and block boundaries (1 to 5,000 keys, block
sizes 16 and 32, blocks in random order), head dims 64 and 128, 1 to 8 query heads per KV head,
q/k norm and attention bias. A captured graph replayed at later positions equals eager steps.
Compile-time variants of the kernel (VARIANTS) are held to the same checks.
On the CPU the twin runs and must equal the op-by-op path exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from minillm.backends.numpy_ops import NumpyBackend
from minillm.models.config import ModelConfig
from minillm.models.transformer import StepInputs, Transformer, Workspace
from tests.test_cuda_model import random_weights

CONFIGS = {
    "qwen3-d128-g2": dict(arch="qwen3", vocab_size=512, hidden_size=256, num_layers=3, num_heads=4,
                          num_kv_heads=2, head_dim=128, intermediate_size=640, qk_norm=True,
                          tie_word_embeddings=True, rope_theta=1e6),
    "llama-d64-g3": dict(arch="llama", vocab_size=384, hidden_size=192, num_layers=2, num_heads=6,
                         num_kv_heads=2, head_dim=64, intermediate_size=512, rms_norm_eps=1e-5),
    "qwen2-d64-g8-bias": dict(arch="qwen2", vocab_size=300, hidden_size=256, num_layers=2, num_heads=8,
                              num_kv_heads=1, head_dim=64, intermediate_size=384, attention_bias=True),
    "qwen3-d128-g1": dict(arch="qwen3", vocab_size=256, hidden_size=512, num_layers=2, num_heads=4,
                          num_kv_heads=4, head_dim=128, intermediate_size=1024, qk_norm=True),
}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


class Case:
    """One model, a paged KV pool with blocks in random order, and a context prefilled op by op."""

    def __init__(self, be, cfg: ModelConfig, weights, ctx: int, bs: int, extra: int, seed: int):
        rng = np.random.default_rng(seed)
        self.be, self.cfg, self.bs = be, cfg, bs
        n_pos = ctx + extra + 1
        self.max_blocks = -(-n_pos // bs)
        self.model = Transformer(cfg, weights, be, max_positions=n_pos + 8)
        self.kv = self.model.allocate_kv_cache(self.max_blocks + 3, bs)
        self.ws = Workspace(be, cfg, max_tokens=max(ctx, 1), max_logits=1)
        self.table = rng.permutation(self.max_blocks + 3)[: self.max_blocks].astype(np.int32)
        self.ids = rng.integers(0, cfg.vocab_size, n_pos).astype(np.int32)
        if ctx:
            self.model.forward(self.inputs(0, ctx), ctx, 1, self.kv, self.ws)

    def slot(self, p: int) -> int:
        return int(self.table[p // self.bs]) * self.bs + p % self.bs

    def inputs(self, start: int, n: int) -> StepInputs:
        a = lambda x: self.be.asarray(np.asarray(x, np.int32), dtype=np.int32)  # noqa: E731
        return StepInputs(a(self.ids[start:start + n]), a(np.arange(start, start + n)),
                          a([self.slot(p) for p in range(start, start + n)]), a(self.table[None]),
                          a([start + n]), a([0, n]), a([n - 1]))

    def decode(self, p: int, one_op: bool, x: StepInputs | None = None):
        """Decode position p; returns (logits, residual, hidden, K rows, V rows of every layer)."""
        plan = self.model.decoder
        if not one_op:
            self.model.decoder = None
        try:
            logits = self.model.forward(x or self.inputs(p, 1), 1, 1, self.kv, self.ws)
        finally:
            self.model.decoder = plan
        h = self.be.to_host
        blk, off = divmod(self.slot(p), self.bs)
        return (h(logits).astype(np.float32), h(self.ws.residual[:1]).astype(np.float32),
                h(self.ws.hidden[:1]).astype(np.float32), h(self.kv[0][:, blk, off]).astype(np.float32),
                h(self.kv[1][:, blk, off]).astype(np.float32))

    def poison_row(self, p: int) -> None:
        blk, off = divmod(self.slot(p), self.bs)
        for c in self.kv:
            h = np.array(self.be.to_host(c))
            h[:, blk, off] = np.nan
            self.be.copy_from_host(c, h.astype(h.dtype))


@pytest.fixture(autouse=True)
def fused_decode_on(monkeypatch):
    """The CUDA backend builds the plan only when asked (it is not faster yet: docs/BENCHMARKS.md)."""
    monkeypatch.setenv("MINILLM_FUSED_DECODE", "1")


def cuda_bf16():
    from minillm.backends.cuda_ops import CudaBackend, cuda_available

    if not cuda_available():
        pytest.skip("needs a GPU")
    import ml_dtypes

    return CudaBackend(dtype=ml_dtypes.bfloat16)


def check_one_kernel(case: Case, ctx: int):
    """Decode position ctx op by op, poison its K/V row, decode it again with the kernel: logits,
    residual, hidden and the K/V rows must be written and agree within bf16 noise. Returns the
    kernel's results."""
    ref = case.decode(ctx, one_op=False)
    case.poison_row(ctx)
    got = case.decode(ctx, one_op=True)
    for name, g, r in zip(("logits", "residual", "hidden", "K row", "V row"), got, ref):
        assert np.isfinite(g).all(), f"{name}: not written"
        assert rel(g, r) < 2e-2, f"{name}: {rel(g, r):.3g}"
    assert rel(got[0], ref[0]) < 1e-2
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("ctx,bs", [(0, 16), (40, 16), (31, 32), (700, 16), (5000, 32)])
def test_one_kernel_matches_op_by_op(arch, ctx, bs):
    be = cuda_bf16()
    cfg = ModelConfig(**CONFIGS[arch])
    w = random_weights(cfg, np.random.default_rng(1))
    case = Case(be, cfg, w, ctx, bs, extra=0, seed=ctx + bs)
    assert case.model.decoder is not None, "the kernel should take this model"
    got = check_one_kernel(case, ctx)
    # and against the NumPy backend (float32 weights holding the same bf16 values)
    npc = Case(NumpyBackend(), cfg, w, ctx, bs, extra=0, seed=ctx + bs)
    want = npc.decode(ctx, one_op=True)[0]
    assert rel(got[0], want) < 2e-2
    be.close()


# compile-time alternatives of the kernel (cuda/decode_layers.cu; comma-separated defines), each
# checked like the default
VARIANTS = ["DL_MMA_B=1", "DL_WARP_ARRIVE=1", "DL_MIN_PART=64"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("ctx,bs", [(40, 16), (700, 32)])
def test_kernel_variant_matches_op_by_op(variant, arch, ctx, bs):
    from minillm.backends import compile as kc

    be = cuda_bf16()
    cfg = ModelConfig(**CONFIGS[arch])
    w = random_weights(cfg, np.random.default_rng(1))
    case = Case(be, cfg, w, ctx, bs, extra=0, seed=ctx + bs)
    plan = case.model.decoder
    assert plan is not None, "the kernel should take this model"
    defines = (f"DL_D={cfg.head_dim}", f"DL_G={cfg.num_heads // cfg.num_kv_heads}", *variant.split(","))
    kern = kc.get_kernel("decode_layers", "decode_layers", be.debug, defines)
    kern.max_dynamic_shared_size_bytes = plan.smem
    be.k[plan.name] = kern
    got = check_one_kernel(case, ctx)
    # a second launch on the same inputs: the same bits (the sums' order is fixed), so the first
    # left its barrier and merge counters at zero (a stale count would let barriers pass early)
    again = case.decode(ctx, one_op=True)
    for name, g, r in zip(("logits", "residual", "hidden", "K row", "V row"), again, got):
        assert np.array_equal(g, r), f"{name}: a second launch differs"
    be.close()


@pytest.mark.gpu
def test_graph_replays_at_later_positions():
    """The kernel reads position, slot, context length and block table from device buffers: a
    graph captured at one position replays correctly at the next ones (eager op-by-op oracle)."""
    be = cuda_bf16()
    cfg = ModelConfig(**CONFIGS["qwen3-d128-g2"])
    w = random_weights(cfg, np.random.default_rng(2))
    ctx, steps = 60, 5
    case = Case(be, cfg, w, ctx, 16, extra=steps, seed=3)
    twin = Case(be, cfg, w, ctx, 16, extra=steps, seed=3)  # same layout, decoded op by op
    x = case.inputs(ctx, 1)
    graph = be.capture_graph(lambda: case.model.forward(x, 1, 1, case.kv, case.ws))
    for p in range(ctx, ctx + steps):
        fresh = case.inputs(p, 1)
        for dst, src in zip((x.input_ids, x.positions, x.slot_mapping, x.seq_lens),
                            (fresh.input_ids, fresh.positions, fresh.slot_mapping, fresh.seq_lens)):
            be.copy(src, out=dst)
        graph.replay()
        got = be.to_host(case.ws.logits[:1]).astype(np.float32)
        want = twin.decode(p, one_op=False)[0]
        assert rel(got, want) < 1e-2, f"position {p}: {rel(got, want):.3g}"
    be.close()


def test_numpy_twin_equals_op_by_op():
    """On the CPU decode_layers is the op-by-op sequence itself: bit-equal results."""
    cfg = ModelConfig(**CONFIGS["llama-d64-g3"])
    w = random_weights(cfg, np.random.default_rng(4))
    case = Case(NumpyBackend(), cfg, w, 37, 16, extra=0, seed=5)
    ref = case.decode(37, one_op=False)
    case.poison_row(37)
    got = case.decode(37, one_op=True)
    for g, r in zip(got, ref):
        assert np.array_equal(g, r)
