"""GEMV variants timed inside CUDA graphs (a GPU diagnostic for cuda/gemv.cu).

Each variant is a chain of 20 launches of one decode-shaped product (M = 1) captured into a
graph, replayed 3 times to warm up and 10 times under CUDA events; the table gives the median
per launch and the weight bytes per second. Variants: the kernel as committed at a reference
commit (--ref, read with git show), the current kernel, and the current kernel with x read
through __ldg; the last two launched plainly and with programmatic dependent launch (PDL).
(Session 3 used it to measure rms_norm fused into this kernel, rejected: docs/BENCHMARKS.md.)

    PYTHONPATH=. python scripts/gemv_bench.py [--ref fecfc53] [--json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np

from minillm.backends import compile as kc
from minillm.backends.cuda_ops import CudaBackend
from minillm.bench.gpu_timing import replay_us

SHAPES = {  # name: (K, N, gated)
    "0.6B qkv": (1024, 4096, False), "0.6B o": (2048, 1024, False),
    "0.6B gate_up": (1024, 3072, True), "0.6B down": (3072, 1024, False),
    "8B qkv": (4096, 6144, False), "8B o": (4096, 4096, False),
    "8B gate_up": (4096, 12288, True), "8B down": (12288, 4096, False),
}
X_PLAIN = "reinterpret_cast<const uint4*>(x + (i64)m * ldx)[c]"
X_LDG = "__ldg(reinterpret_cast<const uint4*>(x + (i64)m * ldx) + c)"
CALLS, WARM, REPS = 20, 3, 10


def module(code: str):
    import cupy

    mod = cupy.RawModule(code=code, options=kc.compile_options(False))
    mod.compile()
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="fecfc53",
                    help="commit whose cuda/gemv.cu is the reference, or a file holding that source")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import cupy

    be = CudaBackend(dtype=ml_dtypes.bfloat16)
    src = (kc.CUDA_DIR / "gemv.cu").read_text()
    if Path(a.ref).is_file():  # a copy of the reference source (no git history on the device)
        old = Path(a.ref).read_text()
    else:
        old = subprocess.run(["git", "show", f"{a.ref}:cuda/gemv.cu"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1]).stdout
    mods = {"new": module(src), "new_ldg_x": module(src.replace(X_PLAIN, X_LDG))}
    if old:
        mods["ref"] = module(old)
    pdl = be.pdl
    rng = np.random.default_rng(0)
    bf = ml_dtypes.bfloat16
    rows = []
    for name, (K, N, gated) in SHAPES.items():
        NW = 2 * N if gated else N
        w = cupy.asarray(rng.standard_normal((NW, K)).astype(bf))
        x = cupy.asarray(rng.standard_normal((1, K)).astype(bf))
        out = cupy.zeros((1, N), dtype=bf)
        null = np.uint64(0)
        i32, i64 = np.int32, np.int64
        grid = ((N + 7) // 8,)

        for variant in ("ref", "new", "new_ldg_x"):
            if variant not in mods:
                continue
            kern = mods[variant].get_function("gemv_silu_mul_bf16" if gated else "gemv_bf16")
            for use_pdl in (False, True):
                if use_pdl and (pdl is None or variant == "ref"):
                    continue
                ar = ((x, i64(K), w, out, i64(N), i32(1), i32(N), i32(K)) if gated else
                      (x, i64(K), w, null, out, i64(N), i32(1), i32(N), i32(K)))

                def chain(kern=kern, ar=ar, use_pdl=use_pdl, grid=grid):
                    for _ in range(CALLS):
                        if use_pdl:
                            pdl.launch(kern.kernel.ptr, grid, (128,), ar)
                        else:
                            with be.stream:
                                kern(grid, (128,), ar)

                with be.stream:
                    kern(grid, (128,), ar)  # load it
                us = replay_us(be, be.capture_graph(chain), CALLS, WARM, REPS)
                tbs = NW * K * 2 / (us * 1e-6) / 1e12
                label = variant + (" pdl" if use_pdl else "")
                rows.append({"shape": name, "variant": label, "us": round(us, 2), "TB/s": round(tbs, 2)})
                print(f"{name:14s} {label:28s} {us:8.2f} us  {tbs:5.2f} TB/s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
