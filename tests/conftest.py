"""Shared fixtures and the `gpu` mark: GPU tests skip unless CuPy finds a CUDA device."""

from __future__ import annotations

import pytest


def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
