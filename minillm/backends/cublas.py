"""cuBLAS GemmEx through ctypes on libcublas, usable inside a CUDA-graph capture.

CuPy's own cuBLAS wrappers refuse to run during stream capture. libcublas itself is fine when
the handle is bound to the capturing stream and given a preallocated workspace before capture
(cublasSetStream_v2 + cublasSetWorkspace_v2), so it never allocates while the graph is recorded.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

# cudaDataType / cublasComputeType_t / cublasOperation_t / cublasGemmAlgo_t values
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUBLAS_GEMM_DEFAULT = -1

_STATUS = {
    0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
    11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED",
    16: "LICENSE_ERROR",
}
_lib = None


def open_cuda_library(name: str) -> ctypes.CDLL:
    """libNAME.so of the CUDA toolkit CuPy uses ("cublas", "cublasLt"), else the plain sonames."""
    tried = []
    try:  # what CuPy >= 14 itself uses to find the CUDA libraries
        from cuda.pathfinder import load_nvidia_dynamic_lib  # type: ignore

        path = load_nvidia_dynamic_lib(name).abs_path
        if path:  # None would make ctypes open the main program instead
            return ctypes.CDLL(path)
        tried.append("cuda.pathfinder: found no path")
    except Exception as e:  # noqa: BLE001 - fall through to the plain names
        tried.append(f"cuda.pathfinder: {e}")
    names = [f"lib{name}.so.13", f"lib{name}.so.12", f"lib{name}.so"]
    found = ctypes.util.find_library(name)
    if found:
        names.insert(0, found)
    for soname in names:
        try:
            return ctypes.CDLL(soname)
        except OSError as e:
            tried.append(f"{soname}: {e}")
    raise OSError(f"could not load lib{name}; tried:\n  " + "\n  ".join(tried))


def libcublas() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = open_cuda_library("cublas")
        vp, i, st = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
        lib.cublasDestroy_v2.argtypes = [vp]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, st]
        lib.cublasGetVersion_v2.argtypes = [vp, ctypes.POINTER(i)]
        lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        for f in ("cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2",
                  "cublasSetWorkspace_v2", "cublasGetVersion_v2", "cublasGemmEx"):
            getattr(lib, f).restype = i
        _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed: CUBLAS_STATUS_{_STATUS.get(status, status)}")


def cuda_dtype(dtype) -> int:
    dt = np.dtype(dtype)
    if dt == np.float32:
        return CUDA_R_32F
    if dt.name == "bfloat16":
        return CUDA_R_16BF
    raise TypeError(f"matmul supports bfloat16 and float32 arrays, got {dt}")


class Cublas:
    """One cuBLAS handle bound to one stream and one preallocated workspace."""

    def __init__(self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int):
        self.lib = libcublas()
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
        _check(
            self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(workspace_ptr), workspace_bytes),
            "cublasSetWorkspace",
        )
        self._alpha = ctypes.c_float(1.0)
        self._betas = {0.0: ctypes.c_float(0.0), 1.0: ctypes.c_float(1.0)}

    def version(self) -> int:
        v = ctypes.c_int()
        _check(self.lib.cublasGetVersion_v2(self.handle, ctypes.byref(v)), "cublasGetVersion")
        return v.value

    def gemm_xwt(self, M: int, N: int, K: int, x_ptr: int, x_type: int, ldx: int, w_ptr: int,
                 w_type: int, ldw: int, out_ptr: int, out_type: int, ldo: int, beta: float = 0.0) -> None:
        """out[M, N] (row-major, row stride ldo) = x[M, K] @ w[N, K].T (+ beta * out), fp32 math.

        Row-major out is column-major out.T [N, M] = w (op T on the col-major [K, N] view of w)
        times x.T (the col-major [K, M] view of x).
        """
        _check(
            self.lib.cublasGemmEx(
                self.handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, ctypes.byref(self._alpha),
                ctypes.c_void_p(w_ptr), w_type, ldw, ctypes.c_void_p(x_ptr), x_type, ldx,
                ctypes.byref(self._betas[beta]), ctypes.c_void_p(out_ptr), out_type, ldo,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
            ),
            "cublasGemmEx",
        )

    def close(self) -> None:
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()
