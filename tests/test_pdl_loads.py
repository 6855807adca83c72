"""No kernel that graphs launch with PDL reads another kernel's output through the read-only path
(scripts/pdl_load_lint.py over nvcc's PTX; no GPU needed). Session 41 found the folded norms doing
it on the H200: greedy runs on graphs that differed between repeats, which no sanitizer reported
(docs/DEVELOPING.md)."""

from __future__ import annotations

import shutil

import pytest
from nvcc_jobs import NvccPool, lint_names, pdl_load_lint

lint = pdl_load_lint()
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (CI installs CUDA 13.0)")


def lint_build(pool: NvccPool, build: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The lint over one of nvcc_jobs.LINT_BUILDS, from the pool's nvcc runs (each module's PTX, then
    its preprocessed source)."""
    names = lint_names(build)
    return lint.lint_outputs([(pool.output(ptx), pool.output(pre)) for ptx, pre in zip(names[::2], names[1::2])])


@needs_nvcc
@pytest.mark.nvcc_jobs(*lint_names("default"))
def test_pdl_kernels_read_only_weights_and_step_inputs_through_the_read_only_path(nvcc_pool: NvccPool):
    found, bad = lint_build(nvcc_pool, "default")
    assert not bad, f"PDL kernels reading another kernel's output through ld.global.nc: {bad}"
    assert len(found) >= 50  # the walk placed the loads of most kernels (weights at least)
    assert "?" not in set().union(*found.values())  # and every one of them
    assert found["gemv1_norm1_bf16"] >= {"w", "nw"} and "x" not in found["gemv1_norm1_bf16"]


@needs_nvcc
@pytest.mark.nvcc_jobs(*lint_names("stale"))
def test_the_lint_sees_session_41s_stale_read(nvcc_pool: NvccPool):
    """The folded norms' loads as they were (NORM_ROW_L2=0): x through the read-only path."""
    _, bad = lint_build(nvcc_pool, "stale")
    assert bad.get("gemv1_norm1_bf16") == {"x"} and bad.get("gemv1_silu_mul_split_norm4_bf16") == {"x"}


def test_param_names_and_struct_fields():
    src = 'extern "C" __global__ void __launch_bounds__(128, (2) <= 2 ? 4 : 2) k(const int* __restrict__ a, ' \
          'NormArgs na, float eps) { }'
    assert lint.param_names(src, "k") == ["a", "na", "eps"]
    ptx = """.visible .entry k(
.param .u64 k_param_0,
.param .align 8 .b8 k_param_1[32]
)
{
ld.param.u64 %rd1, [k_param_0];
ld.param.u64 %rd2, [k_param_1+8];
cvta.to.global.u64 %rd3, %rd1;
mad.wide.s32 %rd4, %r1, 16, %rd3;
ld.global.nc.v4.u32 {%r2, %r3, %r4, %r5}, [%rd4];
cvta.to.global.u64 %rd5, %rd2;
ld.global.nc.u16 %rs1, [%rd5+2];
ld.global.nc.u16 %rs2, [%rd9];
}
"""
    assert lint.nc_params(ptx, src) == {"k": {"a", "na+8", "?"}}
    assert lint.violations({"k": {"a", "w"}, "paged_decode_rope_x": {"kc"}}) == {"k": {"a"}}
