"""cuda/dflash2.cu (DFlash2 drafters' grouped causal conv and candidate selector) against the NumPy
twins, on fresh random inputs, outputs poisoned before each run (NaN, or -7 for ids) so an element
the kernels forgot to write fails.

Inputs are rounded to the backend's storage dtype first and the oracle runs in float32 on the same
rounded values, as in test_cuda_ops.py.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from cuda_util import host, rel_err, rounded, tol

from minillm.backends.numpy_ops import NumpyBackend

pytestmark = pytest.mark.gpu
REF = NumpyBackend()
POISON_ID = -7


def poisoned(be, shape, dtype=None):
    out = be.empty(shape, dtype=dtype)
    fill = POISON_ID if np.dtype(out.dtype) == np.int32 else np.nan
    be.copy_from_host(out, np.full(shape, fill, dtype=np.float32).astype(out.dtype))
    return out


def i32(be, x):
    return be.asarray(np.asarray(x, dtype=np.int32), dtype=np.int32)


# ---- grouped_causal_conv ----------------------------------------------------------------------
def conv_case(be, rng, ks, group_size, block_rows, T, C, half):
    """(inputs as the oracle sees them, the oracle's output, the device inputs: x a column window
    of a wider buffer, so its rows are strided)."""
    G = C // group_size
    x = rounded(be, rng.standard_normal((T, C)))
    base = rounded(be, rng.standard_normal((ks, C)) * 0.5)
    dyn = rounded(be, rng.standard_normal((T, 2 * ks * G)) * 0.5)
    ref = np.empty((T, C), np.float32)
    REF.grouped_causal_conv(x, base, dyn, half, group_size, block_rows, ref)
    wide = np.zeros((T, C + 24), np.float32)
    wide[:, 8 : 8 + C] = x
    x_dev = be.asarray(wide)[:, 8 : 8 + C]
    return ref, (x_dev, be.asarray(base), be.asarray(dyn))


@pytest.mark.parametrize("ks,group_size,block_rows,T,C,half", [
    (4, 128, 16, 16, 1024, 0),  # one block
    (4, 128, 16, 48, 1024, 1),  # three blocks: taps stop at each block's first row
    (3, 32, 8, 40, 4096, 1),
    (2, 1, 5, 15, 96, 0),  # a group a channel, blocks of an odd length
    (5, 64, 3, 12, 192, 1),  # more taps than a block has rows
    (4, 256, 16, 16, 8192, 0),  # more columns than one launch's column chunks: threads loop
])
def test_grouped_causal_conv(be, ks, group_size, block_rows, T, C, half):
    rng = np.random.default_rng(ks * 1000 + T + C + half)
    ref, (x, base, dyn) = conv_case(be, rng, ks, group_size, block_rows, T, C, half)
    big = poisoned(be, (T, C + 16))  # a strided destination; its first 16 columns must stay
    be.grouped_causal_conv(x, base, dyn, half, group_size, block_rows, big[:, 16:])
    h = host(be, big)
    assert np.isnan(h[:, :16]).all()
    assert rel_err(h[:, 16:], ref) < tol(be)
    # the kernel rounds each product and sum as the twin does (no FMA), so the bits agree too
    assert np.array_equal(h[:, 16:], rounded(be, ref))


def test_grouped_causal_conv_checks(be):
    x = be.zeros((8, 64))
    base, dyn = be.zeros((3, 64)), be.zeros((8, 2 * 3 * 4))
    with pytest.raises(ValueError, match="overlaps"):
        be.grouped_causal_conv(x, base, dyn, 0, 16, 8, x)
    with pytest.raises(ValueError, match="multiple of block_rows"):
        be.grouped_causal_conv(x, base, dyn, 0, 16, 3, be.zeros((8, 64)))
    with pytest.raises(ValueError, match="dyn"):
        be.grouped_causal_conv(x, base, be.zeros((8, 5)), 0, 16, 8, be.zeros((8, 64)))
    with pytest.raises(TypeError):
        be.grouped_causal_conv(x, base, dyn, 0, 16, 8, be.zeros((8, 64), np.int32))


# ---- dflash2_select -------------------------------------------------------------------------------
def logits_rows(rng, rows: int, V: int) -> np.ndarray:
    """Rows of four kinds (row % 4), three of them full of ties, to pin the candidate set's tie rule
    (ties to the lower id) exactly: continuous; rounded to a dozen values (many ties at the k-th
    value, -0.0 beside 0.0); -inf but for 5 tokens (the k-th value -inf for top_k > 5); constant."""
    out = np.empty((rows, V), np.float32)
    for r in range(rows):
        kind = r % 4
        if kind == 0:
            out[r] = rng.standard_normal(V) * 3
        elif kind == 1:
            out[r] = np.round(rng.standard_normal(V) * 1.5)
        elif kind == 2:
            out[r] = -np.inf
            out[r, rng.choice(V, 5, replace=False)] = np.round(rng.standard_normal(5))
        else:
            out[r] = 0.5
    return out


@functools.lru_cache(maxsize=4)
def factors(V: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """pred and succ [V, rank] (shared by the cases of one shape: generating 151,936 x 128 twice a
    case is most of the test's time)."""
    rng = np.random.default_rng(V + rank)
    return (rng.standard_normal((V, rank)).astype(np.float32),
            rng.standard_normal((V, rank)).astype(np.float32))


def twin_scores(logits, hproj, pred, succ, cand_ids, prev: int, row: int) -> np.ndarray:
    pair = pred[prev] * hproj[row]
    return logits[row, cand_ids[row]] + succ[cand_ids[row]] @ pair


def check_path(logits, hproj, pred, succ, input_ids, block_rows, k, S, cand_ids, ref_out, got_out) -> None:
    """The device's tokens equal the twin's, block by block, except at a near tie: both compute each
    score in fp32 from the same inputs, but the dot products sum in different orders (the twin's
    BLAS, the kernel's lanes and warp sum), so where the twin's best two scores are within 1e-4
    relative (far above that rounding, ~1e-6) the kernel may pick the other. There the block's later
    positions follow a different prev and are not compared."""
    for s in range(S):
        prev = int(input_ids[s * block_rows])
        for p in range(k):
            row = s * k + p
            if got_out[row] != ref_out[row]:
                sc = np.sort(twin_scores(logits, hproj, pred, succ, cand_ids, prev, row))[::-1]
                assert sc.size > 1 and sc[0] - sc[1] <= 1e-4 * max(1.0, abs(sc[0])), (
                    f"block {s} position {p}: device {got_out[row]}, twin {ref_out[row]}, best scores {sc[:2]}")
                break
            prev = int(ref_out[row])


def select_case(be, V, top_k, k, S, rank, seed):
    """The oracle's inputs and outputs, and the device's inputs (logits of V = 1,000 with a row
    stride of V + 3, so rows are not 16-byte aligned: the scalar path of the radix passes)."""
    rng = np.random.default_rng(seed)
    rows, block_rows = S * k, k + 1  # anchors at s * block_rows, not s * k
    logits = logits_rows(rng, rows, V)
    pred, succ = (rounded(be, a) for a in factors(V, rank))
    hproj = rounded(be, rng.standard_normal((rows, rank)) / np.sqrt(rank))
    input_ids = rng.integers(0, V, S * block_rows).astype(np.int32)
    ref = (np.empty((rows, top_k), np.int32), np.empty((rows, top_k), np.float32), np.empty(rows, np.int32))
    REF.dflash2_select(logits, hproj, input_ids, block_rows, k, pred, succ, top_k, *ref)
    pad = 3 if V == 1000 else 0
    wide = np.zeros((rows, V + pad), np.float32)
    wide[:, :V] = logits
    dev = (be.asarray(wide, np.float32)[:, :V], be.asarray(hproj), i32(be, input_ids), block_rows, k,
           be.asarray(pred), be.asarray(succ), top_k)
    return (logits, hproj, pred, succ, input_ids, block_rows), ref, dev


def check_select(be, inputs, ref, cand_ids, cand_vals, out, k, S) -> None:
    logits, hproj, pred, succ, input_ids, block_rows = inputs
    got_ids, got_vals = be.to_host(cand_ids), be.to_host(cand_vals)
    assert (got_ids != POISON_ID).all() and not np.isnan(got_vals).any(), "unwritten candidates"
    for r in range(ref[0].shape[0]):
        assert np.array_equal(got_ids[r], ref[0][r]), f"row {r} (kind {r % 4}): candidates differ"
    assert np.array_equal(got_vals, ref[1])  # the logits themselves, copied
    got_out = be.to_host(out)
    assert (got_out != POISON_ID).all()
    check_path(logits, hproj, pred, succ, input_ids, block_rows, k, S, ref[0], ref[2], got_out)


@pytest.mark.parametrize("k,S,rank", [(1, 1, 16), (8, 3, 128), (8, 1, 16), (1, 3, 128)])
@pytest.mark.parametrize("top_k", [1, 8, 64, 256])
@pytest.mark.parametrize("V", [1000, 151936])
def test_dflash2_select(be, V, top_k, k, S, rank):
    inputs, ref, dev = select_case(be, V, top_k, k, S, rank, seed=V + 10 * top_k + 1000 * k + 7 * S + rank)
    rows = S * k
    cand_ids, cand_vals = poisoned(be, (rows, top_k), np.int32), poisoned(be, (rows, top_k), np.float32)
    out = poisoned(be, (rows,), np.int32)
    be.dflash2_select(*dev, cand_ids, cand_vals, out)
    check_select(be, inputs, ref, cand_ids, cand_vals, out, k, S)


def test_dflash2_in_graph(be):
    """Both ops recorded in a CUDA graph (the drafter's) and replayed on new inputs written into the
    same buffers: no allocation, no host sync inside."""
    rng = np.random.default_rng(5)
    V, top_k, k, S, rank = 151936, 64, 8, 3, 128
    inputs, ref, dev = select_case(be, V, top_k, k, S, rank, seed=6)
    rows = S * k
    logits_dev = be.empty((rows, V), np.float32)
    be.copy_from_host(logits_dev, inputs[0])
    dev = (logits_dev,) + dev[1:]
    cand_ids, cand_vals = poisoned(be, (rows, top_k), np.int32), poisoned(be, (rows, top_k), np.float32)
    out = poisoned(be, (rows,), np.int32)
    x_dev, base_dev, dyn_dev = be.zeros((32, 512)), be.zeros((4, 512)), be.zeros((32, 2 * 4 * 8))
    conv_out = poisoned(be, (32, 512))

    def step():
        be.grouped_causal_conv(x_dev, base_dev, dyn_dev, 1, 64, 16, conv_out)
        be.dflash2_select(*dev, cand_ids, cand_vals, out)

    step()  # once eagerly first, as capture_graph asks
    g = be.capture_graph(step)
    inputs = (logits_rows(rng, rows, V),) + inputs[1:]
    logits, hproj, pred, succ, input_ids, block_rows = inputs
    ref = (np.empty((rows, top_k), np.int32), np.empty((rows, top_k), np.float32), np.empty(rows, np.int32))
    REF.dflash2_select(logits, hproj, input_ids, block_rows, k, pred, succ, top_k, *ref)
    be.copy_from_host(logits_dev, logits)
    x = rounded(be, rng.standard_normal((32, 512)))
    base = rounded(be, rng.standard_normal((4, 512)))
    dyn = rounded(be, rng.standard_normal((32, 64)))
    for d, h in ((x_dev, x), (base_dev, base), (dyn_dev, dyn)):
        be.copy_from_host(d, h)
    conv_ref = np.empty((32, 512), np.float32)
    REF.grouped_causal_conv(x, base, dyn, 1, 64, 16, conv_ref)
    g.replay()
    check_select(be, inputs, ref, cand_ids, cand_vals, out, k, S)
    assert rel_err(host(be, conv_out), conv_ref) < tol(be)


def test_dflash2_select_checks(be):
    rows, V, rank = 8, 1000, 16
    logits = be.zeros((rows, V), np.float32)
    pred, succ = be.zeros((V, rank)), be.zeros((V, rank))
    ids = i32(be, np.zeros(16))

    def call(top_k=8, hproj=None, k=8, logits=logits):
        hproj = be.zeros((rows, rank)) if hproj is None else hproj
        be.dflash2_select(logits, hproj, ids, 9, k, pred, succ, top_k, be.zeros((rows, top_k), np.int32),
                          be.zeros((rows, top_k), np.float32), be.zeros((rows,), np.int32))

    for top_k in (0, 257):
        with pytest.raises(ValueError, match="top_k"):
            call(top_k=top_k)
    with pytest.raises(ValueError, match="top_k"):  # more than the row has
        be.dflash2_select(be.zeros((rows, 100), np.float32), be.zeros((rows, rank)), ids, 9, 8, pred, succ,
                          128, be.zeros((rows, 128), np.int32), be.zeros((rows, 128), np.float32),
                          be.zeros((rows,), np.int32))
    with pytest.raises(ValueError, match="rank"):
        call(hproj=be.zeros((rows, 1025)))
    with pytest.raises(ValueError, match="blocks of k"):
        call(k=3)
    with pytest.raises(TypeError, match="logits"):
        call(logits=be.zeros((rows, V)) if be.dtype != np.float32 else be.zeros((rows, V), np.float64))
