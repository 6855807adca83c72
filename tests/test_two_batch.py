"""Two-batch overlap: a decode step's rows run as two halves (on the GPU, on two streams).

Each half is its own sequences, so the split step must give the unsplit step's logits: on the
NumPy backend (halves one after the other) to float32 rounding, and on the CUDA backend both
eagerly and from a captured graph whose side stream joined the capture through the fork event.
The attention of a half reads q and writes its output by absolute row (token_range), so its
other rows must come out untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_model import BS, CONFIGS, MAX_BLOCKS, NUM_BLOCKS, Driver, layout, random_weights, rel

from minillm.backends.numpy_ops import NumpyBackend
from minillm.models.config import ModelConfig
from minillm.models.transformer import StepInputs

SEQS = 6  # decode rows: six sequences and two padding rows


def decode_step_host(rng, cfg):
    """A prefill of SEQS ragged prompts, then one decode row each plus two padding rows."""
    tables = rng.permutation(NUM_BLOCKS)[: SEQS * 4].reshape(SEQS, 4).astype(np.int32)
    tables = np.hstack([tables, np.zeros((SEQS, MAX_BLOCKS - 4), np.int32)])
    lens = [3, 9, 17, 30, 41, 50]
    ids = rng.integers(0, cfg.vocab_size, sum(lens))
    pos, slots, qs, li = layout(lens, lens, tables)
    prefill = dict(input_ids=ids, positions=pos, slot_mapping=slots, block_tables=tables,
                   seq_lens=lens, query_start=qs, logits_indices=li)
    lens = [n + 1 for n in lens]
    bt = np.vstack([tables, np.zeros((1, MAX_BLOCKS), np.int32)])
    pos, slots, qs, li = layout(lens + [0], [1] * SEQS + [2], bt)
    slots[SEQS:] = [-1, -1]
    pos[SEQS:] = [0, 0]
    decode = dict(input_ids=list(rng.integers(0, cfg.vocab_size, SEQS)) + [0, 0], positions=pos,
                  slot_mapping=slots, block_tables=bt, seq_lens=lens + [0], query_start=qs,
                  logits_indices=list(range(SEQS + 2)))
    return prefill, decode


def run(driver: Driver, prefill: dict, decode: dict) -> np.ndarray:
    """Prefill (one step, never split), then the decode step's logits of the real rows."""
    be = driver.be
    a = lambda x: be.asarray(np.asarray(x, np.int32), dtype=np.int32)  # noqa: E731
    x = StepInputs(*(a(v) for v in prefill.values()))
    driver.model.forward(x, len(prefill["input_ids"]), SEQS, driver.kv, driver.ws)
    x = StepInputs(*(a(v) for v in decode.values()), max_query_len=1)
    logits = driver.model.forward(x, SEQS + 2, SEQS + 2, driver.kv, driver.ws)
    return np.asarray(be.to_host(logits), np.float32)[:SEQS]


class CountingNumpy(NumpyBackend):
    forks = 0

    def fork(self) -> None:
        self.forks += 1


def test_two_halves_match_one_step_numpy():
    cfg = ModelConfig(**CONFIGS["qwen3"])
    rng = np.random.default_rng(3)
    weights = random_weights(cfg, rng)
    prefill, decode = decode_step_host(rng, cfg)
    whole = run(Driver(NumpyBackend(), cfg, weights, max_tokens=160, max_seqs=SEQS + 2), prefill, decode)
    be = CountingNumpy(two_batch_min_tokens=4)
    d = Driver(be, cfg, weights, max_tokens=160, max_seqs=SEQS + 2)
    assert d.model.two_batch_split(SEQS + 2, 1, True, ()) == 8 - 1  # 4 rounded up to 8, < T
    assert d.model.two_batch_split(SEQS + 2, 2, True, ()) == 0  # verification rows: never
    assert d.model.two_batch_split(3, 1, True, ()) == 0  # below the threshold
    halves = run(d, prefill, decode)
    assert be.forks == 1, "the decode step must have run as two halves"
    np.testing.assert_allclose(halves, whole, rtol=1e-5, atol=1e-5)


def test_attention_token_range_writes_only_its_rows():
    be = NumpyBackend()
    rng = np.random.default_rng(0)
    H, KH, D = 4, 2, 16
    kc = rng.standard_normal((8, BS, KH, D)).astype(np.float32)
    vc = rng.standard_normal((8, BS, KH, D)).astype(np.float32)
    bt = np.arange(8, dtype=np.int32).reshape(4, 2)
    sl, qs = np.array([5, 20, 1, 9], np.int32), np.arange(5, dtype=np.int32)
    q = rng.standard_normal((4, H, D)).astype(np.float32)
    full = np.zeros((4, H, D), np.float32)
    be.paged_attention(q, kc, vc, bt, sl, qs, 0.25, full)
    part = np.full((4, H, D), np.nan, np.float32)
    be.paged_attention(q, kc, vc, bt, sl, qs, 0.25, part, token_range=(1, 3))
    assert np.isnan(part[[0, 3]]).all()
    np.testing.assert_array_equal(part[1:3], full[1:3])
    with pytest.raises(ValueError, match="token_range"):
        be.paged_attention(q, kc, vc, bt, sl, qs, 0.25, part, token_range=(3, 3))


@pytest.mark.gpu
def test_two_halves_on_two_streams_match_one_step_cuda(monkeypatch):
    import ml_dtypes

    from minillm.backends.cuda_ops import CudaBackend

    cfg = ModelConfig(**CONFIGS["qwen3"])
    rng = np.random.default_rng(4)
    weights = random_weights(cfg, rng)
    prefill, decode = decode_step_host(rng, cfg)
    ref = run(Driver(NumpyBackend(), cfg, weights, max_tokens=160, max_seqs=SEQS + 2), prefill, decode)
    got = {}
    for least in ("0", "4"):
        monkeypatch.setenv("MINILLM_TWO_BATCH", least)
        be = CudaBackend(dtype=ml_dtypes.bfloat16)
        try:
            assert (be._side is None) == (least == "0")
            d = Driver(be, cfg, weights, max_tokens=160, max_seqs=SEQS + 2)
            got[least] = run(d, prefill, decode)
            assert rel(got[least], ref) < 2e-2
            if least == "4":  # the split step captured (side stream joined through the fork event)
                a = lambda x: be.asarray(np.asarray(x, np.int32), dtype=np.int32)  # noqa: E731
                x = StepInputs(*(a(v) for v in decode.values()), max_query_len=1)
                be.seal()
                graph = be.capture_graph(lambda: d.model.forward(x, SEQS + 2, SEQS + 2, d.kv, d.ws))
                be.copy_from_host(d.ws.logits[: SEQS + 2], np.full((SEQS + 2, cfg.vocab_size), np.nan,
                                                                   np.float32))
                graph.replay()
                replayed = np.asarray(be.to_host(d.ws.logits[:SEQS]), np.float32)
                np.testing.assert_array_equal(replayed, got[least])
        finally:
            be.unseal()
            be.close()
    assert rel(got["4"], got["0"]) < 2e-2
