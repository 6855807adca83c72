"""Shared helpers of the CUDA op tests (test_cuda_ops.py, test_cuda_dflash2.py; their backend
fixture `be` is conftest.py's): the oracle's view of a device input, and the comparisons."""

from __future__ import annotations

import numpy as np


def tol(be) -> float:
    return 1e-5 if be.dtype == np.float32 else 1.2e-2


def rounded(be, x: np.ndarray) -> np.ndarray:
    """x as the device will hold it, back in float32 for the oracle."""
    return np.asarray(np.asarray(x, dtype=be.dtype), dtype=np.float32)


def host(be, x) -> np.ndarray:
    return np.asarray(be.to_host(x), dtype=np.float32)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    assert not np.isnan(got).any(), "unwritten (NaN) elements in the output"
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
