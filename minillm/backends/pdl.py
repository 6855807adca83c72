"""Kernel launches with programmatic dependent launch (PDL, Hopper), through the driver API (and the
driver's count of a cluster kernel's clusters that fit at once, max_active_clusters).

A decode step at small batch is a chain of ~170-230 dependent kernels, each only a few
microseconds long. With the CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION attribute the
dependency on the previous kernel becomes programmatic: the kernel's launch is set up while the
previous one runs, and its code waits (griddepcontrol.wait, cuda/common.cuh pdl_entry) before
touching what that kernel wrote. Recorded during stream capture, the attribute becomes a
programmatic edge of the CUDA graph.

CuPy's RawKernel launch cannot set launch attributes, so the backend uses this launcher, through
ctypes on libcuda's cuLaunchKernelEx, only while capturing a graph (where its Python cost is paid
once); eager launches stay on CuPy's path. MINILLM_PDL=0 turns it off.

Measured on the H200 (docs/BENCHMARKS.md, same machine): decode graphs 0.6B 1.078 -> 1.049 ms, 8B
4.771 -> 4.728 ms. Kernels do not release their dependents early (launch_dependents at entry made
the same graphs 7-10% slower; likely because the next kernels' CTAs sat resident, waiting).
"""

from __future__ import annotations

import ctypes

import numpy as np

from minillm.backends.compile import env_flag

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h, CUlaunchAttributeID


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, 64-byte value union
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
            np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.float32): ctypes.c_float}


def pdl_enabled() -> bool:
    return env_flag("MINILLM_PDL", True, "0: graphs launch every kernel without programmatic dependent launch")


def kernel_arg(a):
    """A kernel argument as the ctypes value cuLaunchKernelEx copies: a device array is its
    pointer, a NumPy scalar its value (the same sizes CuPy's launch would pass)."""
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return ctypes.c_void_p(data.ptr)
    if isinstance(a, np.generic) and a.dtype in _SCALARS:
        return _SCALARS[a.dtype](a.item())
    raise TypeError(f"PDL launch: unsupported kernel argument {type(a).__name__} "
                    "(pass device arrays or numpy int32/int64/uint64/float32 scalars)")


class PdlLauncher:
    """cuLaunchKernelEx with programmatic stream serialization allowed, on one stream."""

    def __init__(self, stream_ptr: int):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self.lib.cuLaunchKernelEx.restype = ctypes.c_int
        self.attr = _LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attr.value[0] = 1  # programmaticStreamSerializationAllowed
        self.stream_ptr = stream_ptr
        self.launches = 0

    def launch(self, function_ptr: int, grid, block, args, shared_mem: int = 0) -> None:
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        values = [kernel_arg(a) for a in args]
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        cfg = _LaunchConfig(*grid, *block, shared_mem, ctypes.c_void_p(self.stream_ptr),
                            ctypes.pointer(self.attr), 1)
        status = self.lib.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(function_ptr), params, None)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {status}")
        self.launches += 1


def max_active_clusters(function_ptr: int, grid_x: int, threads: int, shared_mem: int = 0) -> int:
    """How many clusters of a kernel built with __cluster_dims__ the GPU holds at once, by the driver
    (cuOccupancyMaxActiveClusters, with the kernel's own cluster size): a grid of more clusters runs in
    waves, which is why the split sampler loses from 16 clusters of 8 on 132 SMs (scripts/cluster_occupancy.py)."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                 ctypes.POINTER(_LaunchConfig)]
    lib.cuOccupancyMaxActiveClusters.restype = ctypes.c_int
    cfg = _LaunchConfig(grid_x, 1, 1, threads, 1, 1, shared_mem, None, None, 0)
    n = ctypes.c_int(0)
    status = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(function_ptr), ctypes.byref(cfg))
    if status != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {status}")
    return n.value
