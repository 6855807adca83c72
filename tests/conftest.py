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
