"""Every kernel in cuda/ compiles for Hopper with nvcc, in release and debug form (no GPU needed).

CI has nvcc but no GPU: this is what makes a kernel that does not compile fail CI. The tests
also check the pieces of the CUDA backend that need no GPU: the source hash that keys the
compile cache covers included headers, and asking for the CUDA backend without a GPU fails
with a clear message.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from nvcc_jobs import (
    CUDA_DIR,
    DECODE_GROUP_JOB,
    INLINE_SOURCES,
    SOURCES,
    VARIANTS,
    NvccPool,
    compile_name,
    variant_name,
)

NVCC = shutil.which("nvcc")


def test_there_are_kernels():
    names = {p.stem for p in SOURCES}
    assert {"rows", "elementwise", "norm", "attention", "sampling"} <= names
    assert (CUDA_DIR / "common.cuh").is_file()


def job_param(name: str, *values, id: str):
    """A parameter set whose test reads the nvcc job `name` (the nvcc_jobs mark: conftest.py starts it)."""
    return pytest.param(*values, marks=pytest.mark.nvcc_jobs(name), id=id)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CI installs CUDA 13.0)")
@pytest.mark.parametrize("src,debug", [job_param(compile_name(src, debug), src, debug,
                                                 id=f"{src.stem}-{'debug' if debug else 'release'}")
                                       for src in SOURCES for debug in (False, True)])
def test_nvcc_compiles_for_sm90a(src: Path, debug: bool, nvcc_pool: NvccPool):
    assert_nvcc_compiles(nvcc_pool, compile_name(src, debug))


def assert_nvcc_compiles(pool: NvccPool, name: str) -> None:
    cmd, r = pool.result(name)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CI installs CUDA 13.0)")
@pytest.mark.parametrize("script", [job_param(f"script {script}", script, id=script)
                                    for script in sorted(INLINE_SOURCES)])
def test_scripts_inline_kernels_compile(script: str, nvcc_pool: NvccPool):
    assert_nvcc_compiles(nvcc_pool, f"script {script}")


def test_cache_key_covers_headers(tmp_path, monkeypatch):
    from minillm.backends import compile as kc

    (tmp_path / "h.cuh").write_text("#define X 1\n")
    (tmp_path / "k.cu").write_text('#include "h.cuh"\nextern "C" __global__ void k() {}\n')
    monkeypatch.setattr(kc, "CUDA_DIR", tmp_path)
    code1, d1 = kc.source_with_hash("k")
    (tmp_path / "h.cuh").write_text("#define X 2\n")
    code2, d2 = kc.source_with_hash("k")
    assert d1 != d2 and code1 != code2  # CuPy's cache keys on the code string


def test_cuda_backend_without_gpu_fails_clearly():
    from minillm.backends.cuda_ops import CudaBackend, cuda_available, cuda_unavailable_reason

    if cuda_available():
        pytest.skip("a GPU is present")
    assert cuda_unavailable_reason()
    with pytest.raises(RuntimeError, match=r"\(device='cuda'\) needs an NVIDIA GPU"):
        CudaBackend()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CI installs CUDA 13.0)")
def test_pdl_launch_structs_match_cuda_h(tmp_path: Path):
    """minillm/backends/pdl.py mirrors CUlaunchConfig / CUlaunchAttribute for ctypes: its sizes,
    field offsets and the attribute id must be cuda.h's (a mismatch would launch garbage)."""
    import ctypes

    from minillm.backends import pdl

    src = tmp_path / "layout.cpp"
    src.write_text(textwrap.dedent("""
        #include <cstddef>
        #include <cstdio>
        #include <cuda.h>
        int main() {
          printf("%zu %zu %zu %zu %zu %zu %d\\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
                 sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),
                 offsetof(CUlaunchConfig, numAttrs), (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
        }
    """))
    exe = tmp_path / "layout"
    r = subprocess.run([NVCC, str(src), "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    A, C = pdl._LaunchAttribute, pdl._LaunchConfig
    assert got == [ctypes.sizeof(A), A.value.offset, ctypes.sizeof(C), C.hStream.offset, C.attrs.offset,
                   C.numAttrs.offset, pdl.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]


def test_pdl_kernel_args_are_typed():
    """Kernel arguments go to cuLaunchKernelEx at the width CuPy would pass; a bare Python int
    (width unknown) is refused rather than guessed."""
    import ctypes

    import numpy as np

    from minillm.backends.pdl import kernel_arg

    assert isinstance(kernel_arg(np.int32(3)), ctypes.c_int32)
    assert isinstance(kernel_arg(np.int64(3)), ctypes.c_int64)
    assert kernel_arg(np.float32(0.5)).value == 0.5
    assert isinstance(kernel_arg(np.uint64(0)), ctypes.c_uint64)
    with pytest.raises(TypeError, match="unsupported kernel argument int"):
        kernel_arg(3)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CI installs CUDA 13.0)")
@pytest.mark.parametrize("name,defines", [job_param(variant_name(name, defines), name, defines, id=" ".join(defines))
                                          for name, defines in VARIANTS])
def test_nvcc_compiles_measured_variants(name: str, defines: list[str], nvcc_pool: NvccPool):
    assert_nvcc_compiles(nvcc_pool, variant_name(name, defines))


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CI installs CUDA 13.0)")
@pytest.mark.nvcc_jobs(DECODE_GROUP_JOB.name, "lint default decode_attention ptx")
def test_decode_attention_modules_hold_what_the_backend_asks_for(nvcc_pool: NvccPool):
    """The backend compiles cuda/decode_attention.cu once per (storage type, head dim) it uses
    (_decode_defines): that module holds exactly the kernels it then looks up, and the four modules
    together hold every kernel of the whole file (none left unreachable, none asked for twice)."""
    import re

    from minillm.backends.cuda_ops import _DECODE_HEAD_DIMS, decode_group_names

    def entries(ptx: str) -> set[str]:
        return set(re.findall(r"^\.visible \.entry (\w+)\(", ptx, re.MULTILINE))

    assert entries(nvcc_pool.output(DECODE_GROUP_JOB.name)) == set(decode_group_names("bf16", 128))
    groups = [decode_group_names(t, d) for t in ("bf16", "f32") for d in _DECODE_HEAD_DIMS]
    assert sum(len(g) for g in groups) == len(set().union(*groups))
    assert entries(nvcc_pool.output("lint default decode_attention ptx")) == set().union(*groups)


def test_env_flags_read_words_and_refuse_garbage(monkeypatch):
    """The on/off developer switches (MINILLM_PDL, MINILLM_DEBUG, ...): 1/0, true/false, yes/no, on/off in any
    case; unset or empty is the default. "false" was once read as on (and "true" as off by the switches that
    compared with "1"); anything else is now an error naming the variable."""
    from minillm.backends import compile as kc

    for raw, want in [("1", True), ("TRUE", True), ("yes", True), (" on ", True), ("0", False), ("False", False),
                      ("no", False), ("OFF", False)]:
        monkeypatch.setenv("MINILLM_X", raw)
        assert kc.env_flag("MINILLM_X", not want, "x") is want
    for raw, default in [("", True), ("  ", False)]:
        monkeypatch.setenv("MINILLM_X", raw)
        assert kc.env_flag("MINILLM_X", default, "x") is default
    monkeypatch.delenv("MINILLM_X")
    assert kc.env_flag("MINILLM_X", True, "x") is True
    monkeypatch.setenv("MINILLM_X", "maybe")
    with pytest.raises(ValueError, match=r"MINILLM_X='maybe': give 1 or 0 .*\(what it does\)"):
        kc.env_flag("MINILLM_X", False, "what it does")


def test_extra_defines_from_the_environment(monkeypatch):
    """MINILLM_CUDA_DEFINES adds -D defines to every module (the variants above under the tests)."""
    from minillm.backends import compile as kc

    monkeypatch.setenv("MINILLM_CUDA_DEFINES", " DEC_U=2 ,DEC_CPL=2,,")
    assert kc.extra_defines() == ("DEC_U=2", "DEC_CPL=2")
    monkeypatch.delenv("MINILLM_CUDA_DEFINES")
    assert kc.extra_defines() == ()


def release_before_wait(source: str) -> list[str]:
    """Functions of a .cu source that call pdl_release() with no pdl_entry() before it in their body."""
    import re

    starts = [m.start() for m in re.finditer(r'^(?:__device__|extern "C"|template)', source, re.M)]
    bad = []
    for m in re.finditer(r"\bpdl_release\(\);", source):
        start = max((i for i in starts if i < m.start()), default=0)
        if "pdl_entry();" not in source[start : m.start()]:
            bad.append(source[start : source.index("(", start)].split()[-1])
    return bad


# The kernels allowed to release their dependents before their own wait. cuda/norm.cu's, from
# NORM_EARLY_MIN_ROWS rows (session 20: 0.6B batch 4 -2%): its successors (the products of
# gemv.cu and gemm.cu, the row copies of rows.cu, cuBLAS without a programmatic edge) do nothing
# before their own wait but read weights, so nothing races the kernel before the norm, still
# running. cuda/gemv.cu's gemv1_stage_* (MINILLM_GEMV1_STAGE, one-row steps): their successors are
# products (weights and norm weights before the wait) and the decode attention, whose pre-wait
# loads read only step inputs and cache rows of earlier steps, which no kernel of the step writes
# (the step's own key is stored by that attention kernel, after its wait).
EARLY_RELEASE = {"norm.cu": ["rms_norm_vec_impl"], "gemv.cu": ["gemv1_stage_impl"]}


def test_kernels_release_dependents_only_after_their_own_wait():
    """cuda/common.cuh's late release keeps at most two grids past their waits only if every
    kernel releases after its own griddepcontrol.wait: a release before it lets the grid after next
    start while the previous one still runs, and work done before a wait could race two kernels.
    The exceptions are named above; a new one fails here until it is argued and listed."""
    calls = 0
    for src in SOURCES:
        text = src.read_text()
        calls += text.count("pdl_release();")
        assert release_before_wait(text) == EARLY_RELEASE.get(src.name, []), src.name
    assert calls >= 4  # the GEMVs, the skinny GEMM, rms_norm, decode attention
    early = "__device__ void f() {\n  minillm::pdl_release();\n  minillm::pdl_entry();\n}\n"
    assert release_before_wait(early) == ["f"]


def test_gpus_before_hopper_are_refused_by_name():
    """The kernels need compute capability 9.0+ (clusters, PDL; cuda/gemv.cu does not compile for
    sm_80): an older GPU is named with its compute capability, a Hopper or later one passes."""
    from minillm.backends.cuda_ops import too_old_reason

    msg = too_old_reason("80", b"NVIDIA A100-SXM4-80GB")
    assert msg is not None and "NVIDIA A100-SXM4-80GB" in msg and "compute capability 8.0" in msg
    assert "Hopper" in msg and "9.0+" in msg
    assert "compute capability 8.9" in too_old_reason("89", "NVIDIA L40S")
    assert too_old_reason("90", "NVIDIA H200") is None and too_old_reason("100", "NVIDIA B200") is None


def test_auto_device_falls_back_to_the_cpu_and_says_why(monkeypatch, caplog):
    """--device auto where CuPy is installed but the CUDA backend cannot run (an A100 here, faked: no
    such GPU exists on the test machines) picks the NumPy backend and logs the reason; --device cuda
    refuses with it."""
    import importlib.util
    import logging

    from minillm.backends import cuda_ops
    from minillm.backends.numpy_ops import NumpyBackend
    from minillm.engine import engine

    reason = cuda_ops.too_old_reason("80", "NVIDIA A100-SXM4-80GB")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "cupy" else real_find_spec(name, *a))
    monkeypatch.setattr(cuda_ops, "cuda_unavailable_reason", lambda: reason)
    with caplog.at_level(logging.INFO, logger="minillm"):
        assert isinstance(engine.select_backend("auto", "auto"), NumpyBackend)
    assert reason in caplog.text and "--device auto: the CPU backend" in caplog.text
    with pytest.raises(RuntimeError, match=r"compute capability 8\.0"):
        cuda_ops.CudaBackend()
