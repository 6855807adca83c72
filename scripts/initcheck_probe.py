"""Does compute-sanitizer's initcheck see what cuBLAS writes? (a GPU diagnostic, session 7)

The server reproducer under initcheck (part49) reported ~810k reads of uninitialised memory, all
shown in qk_norm_rope_store_kv, which reads the qkv rows that the preceding product wrote. This
writes a fresh (never-initialised) buffer with the backend's matmul, through cuBLAS (M = 256) or
through cuda/gemv.cu (M = 1), then reads it with rms_norm; run it under
`compute-sanitizer --tool initcheck` with the argument cublas or gemv.

    compute-sanitizer --tool initcheck python scripts/initcheck_probe.py cublas|gemv
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

from minillm.backends.cuda_ops import CudaBackend

M = 256 if sys.argv[1] == "cublas" else 1
be = CudaBackend(dtype=ml_dtypes.bfloat16)
rng = np.random.default_rng(0)
x = be.asarray(rng.standard_normal((M, 1024)).astype(np.float32))
w = be.asarray(rng.standard_normal((4096, 1024)).astype(np.float32) / 32)
nw = be.asarray(np.ones(4096, np.float32))
out, normed = be.empty((M, 4096)), be.empty((M, 4096))
be.matmul(x, w, out)
be.rms_norm(out, nw, 1e-6, out=normed)
be.synchronize()
print(sys.argv[1], "M =", M, "normed[0, :4] =", np.asarray(be.to_host(normed), np.float32)[0, :4])
