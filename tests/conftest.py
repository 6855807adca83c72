"""Shared fixtures, the `gpu` mark (GPU tests skip unless CuPy finds a CUDA device), and the nvcc runs
that start in the background once the tests are collected (tests/nvcc_jobs.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from nvcc_jobs import NvccPool, suite_jobs

_NVCC_POOL = pytest.StashKey[NvccPool]()


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run count
def pytest_collection_modifyitems(config, items):
    if not cuda_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # the tests that read nvcc runs go last, and the runs they name (their nvcc_jobs marks) start now,
    # at nice 19, on all cores but one: the Python tests keep the other (nvcc_jobs.py)
    readers = [item for item in items if "nvcc_pool" in getattr(item, "fixturenames", ())]
    nvcc = shutil.which("nvcc")
    if readers and nvcc and not config.option.collectonly:
        items[:] = [item for item in items if item not in readers] + readers
        pool = config.stash[_NVCC_POOL] = NvccPool(nvcc, suite_jobs())
        pool.start([name for item in readers for mark in item.iter_markers("nvcc_jobs") for name in mark.args])


def pytest_sessionfinish(session):
    pool = session.config.stash.get(_NVCC_POOL, None)
    if pool is not None:
        pool.close()


@pytest.fixture(scope="session")
def nvcc_pool(request) -> NvccPool:
    """The suite's nvcc runs (tests/nvcc_jobs.py), started when the tests were collected."""
    pool = request.config.stash.get(_NVCC_POOL, None)
    if pool is None:
        pytest.skip("nvcc is not on PATH (CI installs CUDA 13.0)")
    return pool


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A random-weight tiny Qwen3 directory (seed 1); a test module may define its own `tiny`."""
    from minillm.tools.random_model import write_random_model

    return write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=1)


@pytest.fixture(scope="session")
def drafter(tiny, tmp_path_factory):
    """A random DFlash drafter for `tiny` (seed 2)."""
    from minillm.tools.random_model import write_dflash_drafter

    return write_dflash_drafter(tmp_path_factory.mktemp("dflash"), tiny, seed=2)


@pytest.fixture(scope="session")
def byte_llama(tmp_path_factory):
    """A tiny random Llama directory (tests/hf_models.py make_tiny, seed 0) with the byte tokenizer, a
    token a byte: shared, so read-only (a test that changes its files makes its own)."""
    from hf_models import make_tiny

    path = tmp_path_factory.mktemp("byte-llama")
    make_tiny("llama", path)
    return path


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def be(request):
    """A CUDA backend in each storage dtype, for the op tests (test_cuda_ops.py, test_cuda_dflash2.py);
    those are marked gpu, so they skip before it is built on a machine without one."""
    import ml_dtypes

    from minillm.backends.cuda_ops import CudaBackend

    dt = ml_dtypes.bfloat16 if request.param == "bfloat16" else np.float32
    b = CudaBackend(dtype=dt)
    yield b
    b.close()
