"""cuBLASLt matmul through ctypes: every algorithm its heuristic offers for a product, not just one.

cublasGemmEx (minillm/backends/cublas.py) runs the single algorithm cuBLAS's heuristic ranks
first. For the decode steps of a large batch (17-256 rows x the 0.6B model's 4-12 MB matrices) the
kernels it picks read the weights at ~1 TB/s (ncu, docs/BENCHMARKS.md, session 8). cuBLASLt's
cublasLtMatmulAlgoGetHeuristic returns a ranked list of algorithms instead; timing each once per
product shape is how an engine can pick a faster one. This module is the measuring half:
`scripts/cublaslt_bench.py` times every candidate against GemmEx (on the H200 the best was
0.99-1.10x GemmEx, so the engine does not use it; docs/BENCHMARKS.md, session 8). Like GemmEx here it takes a
caller-owned workspace and the backend's stream, so it never allocates and can be captured.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from minillm.backends.cublas import CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F, _check, open_cuda_library

# cublasLtMatmulDescAttributes_t / cublasLtMatmulPreferenceAttributes_t values (cublasLt.h)
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE_BYTES = 1

_lib = None


class _Algo(ctypes.Structure):  # cublasLtMatmulAlgo_t: opaque, 8 x uint64
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def libcublaslt() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = open_cuda_library("cublasLt")
        vp, i, st, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64
        sigs = {
            "cublasLtCreate": [ctypes.POINTER(vp)],
            "cublasLtDestroy": [vp],
            "cublasLtMatmulDescCreate": [ctypes.POINTER(vp), i, i],
            "cublasLtMatmulDescDestroy": [vp],
            "cublasLtMatmulDescSetAttribute": [vp, i, vp, st],
            "cublasLtMatrixLayoutCreate": [ctypes.POINTER(vp), i, u64, u64, i64],
            "cublasLtMatrixLayoutDestroy": [vp],
            "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(vp)],
            "cublasLtMatmulPreferenceDestroy": [vp],
            "cublasLtMatmulPreferenceSetAttribute": [vp, i, vp, st],
            "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i, ctypes.POINTER(_Heuristic),
                                               ctypes.POINTER(i)],
            "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(_Algo), vp, st, vp],
        }
        for name, args in sigs.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = i
        _lib = lib
    return _lib


@dataclass
class LtProduct:
    """One product shape's descriptors and its heuristic's candidate algorithms (best-ranked first)."""
    M: int
    N: int
    K: int
    desc: ctypes.c_void_p
    layouts: tuple  # A (w), B (x), C = D (out)
    candidates: list  # [_Heuristic]


class CublasLt:
    """One cuBLASLt handle on one stream with one preallocated workspace."""

    def __init__(self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int):
        self.lib = libcublaslt()
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.stream = ctypes.c_void_p(stream_ptr)
        self.workspace = ctypes.c_void_p(workspace_ptr)
        self.workspace_bytes = workspace_bytes
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._products: list[LtProduct] = []

    def product(self, M: int, N: int, K: int, x_type: int, ldx: int, w_type: int, ldw: int,
                out_type: int, ldo: int, max_candidates: int = 16) -> LtProduct:
        """Descriptors and candidate algorithms of out[M, N] (row-major) = x[M, K] @ w[N, K].T, laid
        out as cublas.Cublas.gemm_xwt does: column-major out.T [N, M] = op_T(w) x."""
        lib = self.lib
        desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate")
        for attr, op in ((_DESC_TRANSA, CUBLAS_OP_T), (_DESC_TRANSB, CUBLAS_OP_N)):
            v = ctypes.c_int(op)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.sizeof(v)),
                   "cublasLtMatmulDescSetAttribute")
        layouts = []
        for dtype, rows, cols, ld in ((w_type, K, N, ldw), (x_type, K, M, ldx), (out_type, N, M, ldo)):
            lay = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
            layouts.append(lay)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_size_t(self.workspace_bytes)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                        ctypes.sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute")
        results = (_Heuristic * max_candidates)()
        n = ctypes.c_int(0)
        a, b, c = layouts
        status = lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, c, c, pref, max_candidates,
                                                    results, ctypes.byref(n))
        lib.cublasLtMatmulPreferenceDestroy(pref)
        _check(status, "cublasLtMatmulAlgoGetHeuristic")
        candidates = [results[i] for i in range(n.value) if results[i].state == 0]
        p = LtProduct(M, N, K, desc, tuple(layouts), candidates)
        self._products.append(p)
        return p

    def matmul(self, p: LtProduct, index: int, x_ptr: int, w_ptr: int, out_ptr: int) -> None:
        """out = x @ w.T with candidate `index` of p (fp32 sums, beta 0), on the handle's stream."""
        a, b, c = p.layouts
        h = p.candidates[index]
        _check(self.lib.cublasLtMatmul(
            self.handle, p.desc, ctypes.byref(self._alpha), ctypes.c_void_p(w_ptr), a, ctypes.c_void_p(x_ptr), b,
            ctypes.byref(self._beta), ctypes.c_void_p(out_ptr), c, ctypes.c_void_p(out_ptr), c,
            ctypes.byref(h.algo), self.workspace, self.workspace_bytes, self.stream), "cublasLtMatmul")

    def close(self) -> None:
        for p in self._products:
            self.lib.cublasLtMatmulDescDestroy(p.desc)
            for lay in p.layouts:
                self.lib.cublasLtMatrixLayoutDestroy(lay)
        self._products = []
        if self.handle:
            self.lib.cublasLtDestroy(self.handle)
            self.handle = ctypes.c_void_p()
