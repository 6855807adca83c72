"""Launch plans that are pure functions of static sizes, so they are checked here on the CPU: the
decode attention's split count (minillm.backends.cuda_ops.decode_splits), which kernel takes a
launch of split short runs (short_run_on_three), which cuda/gemv.cu
kernel takes a product of a few rows (small_product_kernel, gated_product_kernel for the gate_up
product with SiLU), the batch-1 o product that merges the attention's splits (o_merge_plan) and
cuda/gemm.cu's launch shape for
17-256 rows (wide_product_plan); the GPU side (every split count gives the same
attention) is tests/test_cuda_ops.py's, the timing of each scripts/decode_splits.py's."""

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minillm.backends import cuda_ops
from minillm.backends.cuda_ops import (
    _GEMV_MAX_M,
    decode_min_part,
    decode_rope_max_tokens,
    decode_splits,
    env_int,
    gated_product_kernel,
    gated_split_max_rows,
    gemv1_stage_plan,
    mlp_split_plan,
    o_merge_plan,
    one_row_mode,
    one_row_product_kernel,
    short_run_on_three,
    short_run_three_mode,
    small_product_kernel,
    smem_carveout,
    wide_product_plan,
)


def test_decode_min_part_shorter_only_for_one_row_small_groups():
    """Splits of at least 32 keys for a one-row step whose KV heads serve at most 2 query heads (the
    0.6B shape, part254 / part255), 64 for every other step (the 8B's G = 4 was slower with 32, the 0.6B's
    batch 4 too, part256); MINILLM_DECODE_MIN_PART's value, when given, for every step."""
    assert decode_min_part(1, 1) == decode_min_part(1, 2) == 32
    assert decode_min_part(1, 4) == decode_min_part(1, 8) == 64
    assert decode_min_part(2, 2) == decode_min_part(9, 1) == 64
    assert decode_min_part(1, 2, 64) == 64 and decode_min_part(4, 4, 48) == 48


def waves_time(work, resident, ctx, s, cost=128):
    return -(-work * s // resident) * (ctx / s + cost)


def test_fills_the_last_wave():
    # ragged contexts at batch 128, 0.6B heads (1,024 CTAs on 792 slots): 2 waves, the second a
    # third full; 3 splits make 3,072 CTAs in 4 nearly full waves (measured best: 4-5 splits,
    # 3 within 2%; no split 19% slower)
    assert decode_splits(1024, 792, 2048, 32) == 3
    # 8B heads at batch 64: 512 CTAs on 396 slots
    assert decode_splits(512, 396, 2048, 32) == 3


def test_few_tokens_take_every_split_allowed():
    assert decode_splits(8, 660, 576, 9) == 9  # one sequence, 8 KV heads: 72 CTAs, one wave
    assert decode_splits(8, 660, 32832, 64) == 64


def test_many_full_waves_are_not_split():
    assert decode_splits(20 * 660, 660, 2112, 33) == 1


@given(st.integers(1, 20000), st.integers(1, 5000), st.integers(16, 65536), st.integers(1, 64))
def test_never_slower_than_no_split_by_its_model(work, resident, ctx, max_splits):
    s = decode_splits(work, resident, ctx, max_splits)
    assert 1 <= s <= max_splits
    assert waves_time(work, resident, ctx, s) <= waves_time(work, resident, ctx, 1)
    assert all(waves_time(work, resident, ctx, s) <= waves_time(work, resident, ctx, t) * 1.001
               for t in range(1, max_splits + 1))


def test_small_products_choose_their_kernel():
    # 1-2 rows: the GEMV; 3-16 rows with K % 64 == 0: the tensor-core skinny GEMM (faster at 3-4
    # rows, part147); 9-16 rows of a weight over 128 M elements (the 8B LM head's 622 M) and
    # anything above 16 rows: cuBLAS; a K the skinny kernel cannot tile keeps the GEMV up to 4 rows
    assert [small_product_kernel(m, 4096, 1024) for m in (1, 2)] == ["gemv"] * 2
    assert [small_product_kernel(m, 4096, 1024) for m in (3, 4, 8, 9, 16)] == ["skinny"] * 5
    assert small_product_kernel(17, 4096, 1024) is None
    assert small_product_kernel(8, 24576, 4096) == "skinny"
    assert [small_product_kernel(m, 24576, 4096) for m in (9, 16)] == ["skinny"] * 2  # the 8B gate_up
    assert small_product_kernel(9, 151936, 4096) is None
    assert [small_product_kernel(m, 1000, 200) for m in (1, 4, 5)] == ["gemv", "gemv", None]
    # and the GEMV never gets more rows than cuda/gemv.cu instantiates (GEMV_MAX_M)
    src = (Path(__file__).resolve().parents[1] / "cuda" / "gemv.cu").read_text()
    assert int(re.search(r"#define GEMV_MAX_M (\d+)", src).group(1)) == _GEMV_MAX_M
    assert all(small_product_kernel(m, n, k) != "gemv" for m in range(_GEMV_MAX_M + 1, 40)
               for n, k in ((1000, 200), (4096, 1024), (24576, 4096)))


def test_head_ctas_kv_div():
    """One query head a CTA (MINILLM_DECODE_HEAD_CTAS): G CTAs a KV head for one-row steps at the G
    whose tests ran on the H200 (2, 4, 8: Qwen3-0.6B's 2, 8B's 4; SmolLM2's 3 since session 47's
    part271), not at others such as 16 (MINILLM_DECODE_HEAD_CTAS=2 takes any G, for testing one); never
    for several rows, under the o product's merge, or with the knob off."""
    kv_div = cuda_ops.head_ctas_kv_div
    assert [kv_div(g, 1, 1, False) for g in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 4, 8, 1]
    assert [kv_div(g, 1, 2, False) for g in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 4, 8, 16]
    assert kv_div(2, 2, 1, False) == kv_div(2, 1, 1, True) == kv_div(2, 1, 0, False) == kv_div(3, 2, 2, False) == 1


def test_skinny2w4_launch_by_grid():
    """With MINILLM_SKINNY2_W4 on, 9-16 rows of a grid past 2 CTAs an SM and at most 4 take the
    4-warp gemm_skinny2w4_* on 128 threads (the 8B qkv's 384 CTAs on an H200's 132 SMs); grids of
    one wave of 8-warp CTAs (the 8B o / down, 256), past 4 an SM (1,536), other row counts, or the
    knob off keep their kernel on 256 threads."""
    launch = cuda_ops.skinny_product_launch
    assert launch(9, 6144, 132, True) == ("gemm_skinny2w4_", 128)
    assert launch(16, 16 * 528, 132, True) == ("gemm_skinny2w4_", 128)
    assert launch(16, 16 * 528 + 1, 132, True) == ("gemm_skinny2_", 256)
    assert launch(9, 16 * 264, 132, True) == ("gemm_skinny2_", 256)
    assert launch(9, 16 * 264 + 1, 132, True) == ("gemm_skinny2w4_", 128)
    assert launch(9, 6144, 132, False) == ("gemm_skinny2_", 256)
    assert launch(8, 6144, 132, True) == ("gemm_skinny_", 256)
    assert launch(17, 6144, 132, True) == ("gemm_skinny4_", 256)
    assert launch(9, 6144, 66, True) == ("gemm_skinny2_", 256)  # 384 CTAs past 4 an SM of 66 SMs
    # gated (gate_up's F columns): never the 4-warp kernel
    assert launch(9, 6144, 132, True, gated=True) == ("gemm_skinny2_", 256)


def test_skinny_kernels_by_rows(monkeypatch):
    """2-8 rows take gemm_skinny_*, 9-16 the two-tile gemm_skinny2_*, 17-32 the four-tile
    gemm_skinny4_*, which the routing gives 17-20 rows of large narrowing products (N <= K and at
    least 16 M weights: the 8B o and down) by default and the others only with _SKINNY_MAX_M raised
    (opt-in, session 26), and never past the kernels' 32 rows."""
    assert [cuda_ops._skinny_prefix(m) for m in (2, 8, 9, 16, 17, 32)] == (
        ["gemm_skinny_"] * 2 + ["gemm_skinny2_"] * 2 + ["gemm_skinny4_"] * 2)
    assert small_product_kernel(24, 4096, 1024) is None and gated_product_kernel(24, 3072, 1024) is None
    # the 8B o and down: 17-20 rows on the four-tile kernel, 21+ on cuBLAS; the 0.6B o and down
    # (under 16 M weights) and the 8B qkv (wide) on cuBLAS at every row count past 16
    for n, k in ((4096, 4096), (4096, 12288)):
        assert [small_product_kernel(m, n, k) for m in (17, 18, 20, 21, 24, 32)] == ["skinny"] * 3 + [None] * 3
    for n, k in ((1024, 2048), (1024, 3072), (6144, 4096)):
        assert [small_product_kernel(m, n, k) for m in (16, 17, 18, 20)] == ["skinny"] + [None] * 3
    monkeypatch.setattr(cuda_ops, "_SKINNY_NARROW_MAX_M", 16)  # off: cuBLAS again
    assert small_product_kernel(18, 4096, 4096) is None and small_product_kernel(16, 4096, 4096) == "skinny"
    monkeypatch.setattr(cuda_ops, "_SKINNY_MAX_M", 64)
    monkeypatch.setattr(cuda_ops, "_GATED_SKINNY_MAX_M", 64)
    assert [small_product_kernel(m, 4096, 1024) for m in (17, 32, 33)] == ["skinny", "skinny", None]
    assert [gated_product_kernel(m, 3072, 1024) for m in (17, 32, 33)] == ["skinny", "skinny", None]
    assert small_product_kernel(24, 151936, 4096) is None  # the LM head: over the weight bound
    # _SKINNY_FOUR_TILE_MAX_W keeps 17-32 rows of larger weights on cuBLAS, 9-16 rows unaffected
    monkeypatch.setattr(cuda_ops, "_SKINNY_FOUR_TILE_MAX_W", 4096 * 4096)
    assert [small_product_kernel(18, n, 4096) for n in (4096, 6144)] == ["skinny", None]
    assert [small_product_kernel(16, n, 4096) for n in (4096, 6144)] == ["skinny", "skinny"]
    assert gated_product_kernel(18, 12288, 4096) is None and gated_product_kernel(18, 1024, 1024) == "skinny"


def test_one_row_product_deep_kernel_from_a_row_length_within_one_wave():
    """MINILLM_GEMV1_DEEP_MIN_K (0: never): a one-row bf16 product of rows at least that long
    takes gemv1_deep_bf16 when its grid (8 columns a CTA) fits one wave of 4 CTAs an SM; the
    Qwen3-8B qkv (768 CTAs on 132 SMs), the LM heads (fp32 logits) and shorter rows keep theirs."""
    sms = 132
    assert one_row_product_kernel(4096, 12288, False, sms, 0) == "gemv1_bf16"
    assert one_row_product_kernel(4096, 12288, False, sms, 4096) == "gemv1_deep_bf16"  # 8B down
    assert one_row_product_kernel(4096, 4096, False, sms, 4096) == "gemv1_deep_bf16"  # 8B o
    assert one_row_product_kernel(6144, 4096, False, sms, 4096) == "gemv1_bf16"  # 8B qkv: 768 CTAs
    assert one_row_product_kernel(8 * 4 * sms, 4096, False, sms, 4096) == "gemv1_deep_bf16"  # one wave
    assert one_row_product_kernel(8 * 4 * sms + 1, 4096, False, sms, 4096) == "gemv1_bf16"
    assert one_row_product_kernel(1024, 3072, False, sms, 4096) == "gemv1_bf16"  # 0.6B down: short
    assert one_row_product_kernel(1024, 3072, False, sms, 2048) == "gemv1_deep_bf16"
    assert one_row_product_kernel(1024, 4096, True, sms, 4096) == "gemv1_f32"


def test_one_row_product_preloading_kernel_only_within_one_wave():
    """MINILLM_GEMV1_PRE: one-row bf16 products whose grid fits one wave of 4 CTAs an SM take
    gemv1_pre_bf16 (the 0.6B o and down); the 8B qkv (768 CTAs), the deep kernel's products and
    the fp32 LM heads keep theirs; without it nothing does."""
    sms = 132
    assert one_row_product_kernel(1024, 2048, False, sms, 4096, pre=True) == "gemv1_pre_bf16"  # 0.6B o
    assert one_row_product_kernel(1024, 3072, False, sms, 4096, pre=True) == "gemv1_pre_bf16"  # 0.6B down
    assert one_row_product_kernel(1024, 3072, False, sms, 4096) == "gemv1_bf16"
    assert one_row_product_kernel(8 * 4 * sms, 1024, False, sms, 4096, pre=True) == "gemv1_pre_bf16"
    assert one_row_product_kernel(8 * 4 * sms + 1, 1024, False, sms, 4096, pre=True) == "gemv1_bf16"
    assert one_row_product_kernel(6144, 4096, False, sms, 4096, pre=True) == "gemv1_bf16"  # 8B qkv
    assert one_row_product_kernel(4096, 12288, False, sms, 4096, pre=True) == "gemv1_deep_bf16"  # 8B down
    assert one_row_product_kernel(1024, 4096, True, sms, 4096, pre=True) == "gemv1_f32"


def test_one_row_stage_plan_one_cta_an_sm_within_its_shared_memory():
    """gemv1_stage_plan (MINILLM_GEMV1_STAGE): rows split evenly over one CTA an SM, a CTA's weight share
    (gate and up rows both, gated) and x within 112 KB; the 0.6B's four products fit, the 8B's and the
    LM heads do not, nor does anything past the device's own limit."""
    sms, big = 132, 227 << 10
    assert gemv1_stage_plan(4096, 1024, False, sms, big) == (128, 32, (32 * 1024 + 1024) * 2)  # 0.6B qkv
    assert gemv1_stage_plan(1024, 2048, False, sms, big) == (128, 8, (8 * 2048 + 2048) * 2)  # 0.6B o
    assert gemv1_stage_plan(3072, 1024, True, sms, big) == (128, 24, (2 * 24 * 1024 + 1024) * 2)  # gate_up
    assert gemv1_stage_plan(1024, 3072, False, sms, big) == (128, 8, (8 * 3072 + 3072) * 2)  # 0.6B down
    assert gemv1_stage_plan(96, 64, False, sms, big) == (96, 1, (64 + 64) * 2)  # fewer rows than SMs
    assert gemv1_stage_plan(1537, 1000, False, sms, big) == (129, 12, (12 * 1000 + 1000) * 2)  # the last: 1 row
    assert gemv1_stage_plan(6144, 4096, False, sms, big) is None  # 8B qkv: 376 KB a CTA
    assert gemv1_stage_plan(151936, 1024, False, sms, big) is None  # an LM head
    assert gemv1_stage_plan(4096, 1024, False, sms, 48 << 10) is None  # the device's limit


def test_mlp_split_plan_one_cta_an_sm_rows_in_eights():
    """mlp_split_plan (MINILLM_MLP_SPLIT): act rows split over one CTA an SM in multiples of 8 (a down row's
    share is whole 16-byte words), the kernel bound the next of 8 / 16 / 24 / 32 up; rows of at most 1,024
    values (a thread's 8 outputs), and the gate_up share within the staged products' 112 KB."""
    sms, big = 132, 227 << 10
    assert mlp_split_plan(3072, 1024, sms, big) == (128, 24, (2 * 24 * 1024 + 1024) * 2, 24)  # 0.6B
    assert mlp_split_plan(3072, 1024, sms, big, True) == (128, 24, (3 * 24 * 1024 + 1024) * 2, 24)  # down staged
    assert mlp_split_plan(3072, 1024, sms, 140 << 10, True) is None  # 146 KB past the device's limit
    assert mlp_split_plan(1536, 576, sms, big) == (96, 16, (2 * 16 * 576 + 576) * 2, 16)  # SmolLM2-135M
    assert mlp_split_plan(512, 256, sms, big) == (64, 8, (2 * 8 * 256 + 256) * 2, 8)
    assert mlp_split_plan(2056, 1000, sms, big) == (129, 16, (2 * 16 * 1000 + 1000) * 2, 16)
    assert mlp_split_plan(3072, 1024, 100, big) is None  # 32 rows a CTA on 100 SMs: 130 KB
    assert mlp_split_plan(6144, 2048, sms, big) is None  # 1.7B: rows of 2,048
    assert mlp_split_plan(12288, 1024, sms, big) is None  # 96 rows a CTA
    assert mlp_split_plan(3076, 1024, sms, big) is None  # F not a multiple of 8
    assert mlp_split_plan(3072, 1024, sms, 48 << 10) is None  # the device's limit


def test_one_row_modes_from_the_environment(monkeypatch):
    """MINILLM_GEMV1_STAGE takes 0, 1 or 2 (its default when unset); any other value is refused naming the
    variable and the three modes."""
    name, default = "MINILLM_GEMV1_STAGE", 2
    monkeypatch.delenv(name, raising=False)
    assert one_row_mode(name, default, "what") == default
    for v in (0, 1, 2):
        monkeypatch.setenv(name, str(v))
        assert one_row_mode(name, default, "what") == v
    for bad in ("3", "on", "-1"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            one_row_mode(name, default, "what")


def test_gated_split_mode_from_the_environment(monkeypatch):
    """MINILLM_GATED_SPLIT_MAX_M: 2 by default (part196: batch-1 graphs 8B -1.2%, 0.6B -1.0%; part199:
    batch-2 graphs 8B -1.5%, 0.6B -2.4%), 0 to 4 (the GEMV's rows) accepted; any other value is
    refused with the variable's name."""
    monkeypatch.delenv("MINILLM_GATED_SPLIT_MAX_M", raising=False)
    assert gated_split_max_rows() == 2
    for rows in range(5):
        monkeypatch.setenv("MINILLM_GATED_SPLIT_MAX_M", str(rows))
        assert gated_split_max_rows() == rows
    for raw in ("5", "-1", "on"):
        monkeypatch.setenv("MINILLM_GATED_SPLIT_MAX_M", raw)
        with pytest.raises(ValueError, match="MINILLM_GATED_SPLIT_MAX_M"):
            gated_split_max_rows()


def test_smem_carveout_from_the_environment(monkeypatch):
    """MINILLM_SMEM_CARVEOUT: unset (or empty) leaves the driver's choice per kernel (None); 0 to 100
    percent is set on every kernel; anything else is refused with the variable's name and the range."""
    monkeypatch.delenv("MINILLM_SMEM_CARVEOUT", raising=False)
    assert smem_carveout() is None
    monkeypatch.setenv("MINILLM_SMEM_CARVEOUT", "")
    assert smem_carveout() is None
    for v in (0, 50, 100):
        monkeypatch.setenv("MINILLM_SMEM_CARVEOUT", str(v))
        assert smem_carveout() == v
    for raw, what in (("101", "from 0"), ("-1", "integer >= 0"), ("max", "integer >= 0")):
        monkeypatch.setenv("MINILLM_SMEM_CARVEOUT", raw)
        with pytest.raises(ValueError, match=f"MINILLM_SMEM_CARVEOUT.*{what}"):
            smem_carveout()


@pytest.mark.parametrize("narrow,raised", [(16, 16), (20, 16), (32, 16), (16, 32), (32, 32)])
def test_small_products_get_past_the_row_gate(monkeypatch, narrow, raised):
    """The backend's matmul sends a product to the routing only when its rows are at most
    small_product_max_m() (CudaBackend._gemv_fits); every row count the routing gives a
    cuda/gemv.cu kernel must pass that gate. Session 28's first A/B of the narrowing route
    (part182) measured nothing because the gate still stopped at 16 rows."""
    monkeypatch.setattr(cuda_ops, "_SKINNY_NARROW_MAX_M", narrow)
    monkeypatch.setattr(cuda_ops, "_SKINNY_MAX_M", raised)
    monkeypatch.setattr(cuda_ops, "_GATED_SKINNY_MAX_M", raised)
    gate = cuda_ops.small_product_max_m()
    for n, k in ((4096, 4096), (4096, 12288), (6144, 4096), (1024, 3072), (1000, 200)):
        routed = [m for m in range(1, 40) if small_product_kernel(m, n, k) is not None
                  or gated_product_kernel(m, n, k) is not None]
        assert routed and max(routed) <= gate
    assert gate == max(narrow, raised)


def test_gated_products_choose_their_kernel(monkeypatch):
    # gate_up + SiLU fused: 1-2 rows on gemv_silu_mul; 3-8 rows with K % 64 == 0 on
    # gemm_skinny_silu_mul, 9-16 rows on gemm_skinny2_silu_mul up to 128 M weights (the 8B gate_up's
    # 100 M too since session 26, part174); 3-4 rows with another K on gemv_silu_mul; the rest unfused
    assert [gated_product_kernel(m, 3072, 1024) for m in (1, 2)] == ["gemv"] * 2
    assert [gated_product_kernel(m, 3072, 1024) for m in (3, 4, 8, 9, 16)] == ["skinny"] * 5
    assert [gated_product_kernel(m, 12288, 4096) for m in (3, 4, 8)] == ["skinny"] * 3
    assert [gated_product_kernel(m, 12288, 4096) for m in (9, 16)] == ["skinny"] * 2
    assert [gated_product_kernel(m, 40000, 4096) for m in (9, 16)] == [None] * 2
    assert [gated_product_kernel(m, 1000, 200) for m in (3, 4, 5)] == ["gemv", "gemv", None]
    assert gated_product_kernel(17, 3072, 1024) is None
    # with the skinny route off, the routing before it: 3-4 rows fused on the GEMV up to 32 M
    # weights, unfused above (the 8B gate_up: 100 M)
    monkeypatch.setattr(cuda_ops, "_GATED_SKINNY_MAX_M", 0)
    assert [gated_product_kernel(m, 3072, 1024) for m in (3, 4, 5)] == ["gemv", "gemv", None]
    assert gated_product_kernel(3, 12288, 4096) is None


@given(st.integers(1, 300), st.sampled_from([64, 192, 1024, 4096, 6144, 24576, 100]),
       st.sampled_from([64, 128, 1024, 2048, 3072, 12288, 200]), st.sampled_from([78, 132]))
def test_wide_products_hold_every_row_and_split_k_evenly(M, N, K, sms):
    """cuda/gemm.cu's launch shape: all M rows in one tile (32 MT of them), K split into equal
    slices of whole 64-wide stages (at least two a CTA unless unsplit), no more CTAs than SMs
    once split; the split never depends on M (a row's sums are the same in any batch)."""
    plan = wide_product_plan(M, N, K, sms)
    if not (17 <= M <= 256) or N % 64 or K % 64:
        assert plan is None
        return
    mt, s = plan
    assert mt in (2, 4, 6, 8) and M <= 32 * mt and (mt == 2 or M > 32 * (mt - 2))
    assert s in (1, 2, 4, 8) and K % (64 * s) == 0
    if s > 1:
        assert (N // 64) * s <= sms and K // s >= 128
    assert wide_product_plan(17, N, K, sms)[1] == wide_product_plan(256, N, K, sms)[1] == s


def test_wide_products_of_the_qwen3_shapes():
    """0.6B: qkv and the N = 1024 products split K (128 CTAs on 132 SMs), gate_up fills 96 SMs."""
    assert wide_product_plan(192, 4096, 1024, 132) == (6, 2)
    assert wide_product_plan(192, 1024, 2048, 132) == (6, 8)
    assert wide_product_plan(192, 1024, 3072, 132) == (6, 8)
    assert wide_product_plan(192, 6144, 1024, 132) == (6, 1)
    assert wide_product_plan(16, 6144, 1024, 132) is None and wide_product_plan(257, 6144, 1024, 132) is None


@pytest.mark.parametrize("raw", ["many", "-1", "2.5"])
def test_decode_env_integers_refuse_bad_values(monkeypatch, raw):
    """MINILLM_DECODE_ROPE_MAX / MINILLM_DECODE_ORDER_PART: a value that is not an integer >= 0 is
    refused with the variable's name and what it sets (read without a GPU)."""
    monkeypatch.setenv("MINILLM_DECODE_ROPE_MAX", raw)
    with pytest.raises(ValueError, match="MINILLM_DECODE_ROPE_MAX.*integer >= 0.*never fuses"):
        decode_rope_max_tokens()
    monkeypatch.setenv("MINILLM_DECODE_ORDER_PART", raw)
    with pytest.raises(ValueError, match="MINILLM_DECODE_ORDER_PART"):
        env_int("MINILLM_DECODE_ORDER_PART", 1024, "keys per split")
    monkeypatch.setenv("MINILLM_DECODE_ORDER_PART", "0")
    assert env_int("MINILLM_DECODE_ORDER_PART", 1024, "keys per split") == 0
    monkeypatch.delenv("MINILLM_DECODE_ORDER_PART")
    assert env_int("MINILLM_DECODE_ORDER_PART", 1024, "keys per split") == 1024


def test_split_short_runs_take_three_ctas_an_sm_past_one_wave(monkeypatch):
    """MINILLM_SHORT_RUN_3CTA: by default (1) a launch of split short runs takes the three-CTA kernel
    when its grid exceeds one wave of that kernel (3 x 132 on the H200): the 8B round's verification
    graph at c = 16 ((16 + a padding sequence) x 4 splits x 8 KV heads = 544; part178/part179:
    -4.1% / -4.2%), not at c = 8 (9 x 4 x 8 = 288; the three-CTA kernel there: +1.9%). 0 never,
    2 always; other values are refused."""
    monkeypatch.delenv("MINILLM_SHORT_RUN_3CTA", raising=False)
    mode = short_run_three_mode()
    assert mode == 1
    assert short_run_on_three(mode, 17 * 4 * 8, 3 * 132)
    assert not short_run_on_three(mode, 9 * 4 * 8, 3 * 132)
    assert not short_run_on_three(0, 17 * 4 * 8, 3 * 132) and short_run_on_three(2, 8, 3 * 132)
    for raw, ok in (("0", 0), ("2", 2)):
        monkeypatch.setenv("MINILLM_SHORT_RUN_3CTA", raw)
        assert short_run_three_mode() == ok
    for raw in ("3", "-1", "yes"):
        monkeypatch.setenv("MINILLM_SHORT_RUN_3CTA", raw)
        with pytest.raises(ValueError, match="MINILLM_SHORT_RUN_3CTA"):
            short_run_three_mode()


H200_SMEM = 227 * 1024 - 1024  # the backend's max_smem on the H200


@pytest.mark.parametrize("mode", [1, 2])
def test_o_merge_plans_of_the_qwen3_shapes(mode):
    """The batch-1 o product that merges the attention's splits (gemv1_merge_*): one wave of CTAs
    on 132 SMs (every CTA, or cluster, merges the whole row), GEMV_NR = 2 columns a warp, shared
    memory for the row, the weights and the partials of defer_max splits within the cap, and
    defer_max covering a 512-token prompt's 256 new tokens on 0.6B (12 splits of 64 keys)."""
    cl = 8 if mode == 2 else 1
    for name, N, H, D, warps in (("0.6B", 1024, 16, 128, 4), ("8B", 4096, 32, 128, 16)):
        K = H * D
        p = o_merge_plan(mode, N, K, H, D, 64, 132, H200_SMEM)
        assert p["kernel"] == f"gemv1_merge{'_cl8' if mode == 2 else ''}_bf16_w{warps}", name
        assert p["threads"] == 32 * warps and p["grid"] % cl == 0
        assert p["grid"] * 2 * warps >= N and p["grid"] <= 132, (name, p)
        fixed = K * 2 + H * 64 * 4 + -(-H // 4) * 16
        split_bytes = -(-H // cl) * D * 4
        assert p["smem"] == fixed + split_bytes * p["defer_max"] <= cuda_ops._O_MERGE_MAX_SMEM
        assert p["defer_max"] == min(64, (cuda_ops._O_MERGE_MAX_SMEM - fixed) // split_bytes)
        if name == "0.6B" or mode == 2:
            assert p["defer_max"] >= 12
    # 8B, every CTA merging: 11 splits (704 keys) fit, its bench's 512 + 128 tokens need 10
    assert o_merge_plan(1, 4096, 4096, 32, 128, 64, 132, H200_SMEM)["defer_max"] == 11


def test_o_merge_plan_limits():
    assert o_merge_plan(0, 1024, 2048, 16, 128, 64, 132, H200_SMEM) is None  # off
    assert o_merge_plan(1, 1024, 2000, 16, 125, 64, 132, H200_SMEM) is None  # K % 8
    assert o_merge_plan(1, 1024, 2048, 16, 128, 9, 132, H200_SMEM)["defer_max"] == 9  # the launch's splits
    assert o_merge_plan(1, 1024, 2048, 16, 128, 64, 132, 10_000) is None  # not one split's room
    # more outputs than 16 warps a CTA cover in one wave: still 16 warps, more than one wave
    assert o_merge_plan(1, 8192, 2048, 16, 128, 64, 132, H200_SMEM)["kernel"].endswith("_w16")


def test_short_run_bound_is_the_same_on_host_and_device():
    """The short-run launch's grid (cuda_ops) is sized for runs of at most _DECODE_MAX_Q queries;
    the device's rule (cuda/common.cuh short_run_on_tensor_cores) must count no longer run, or a
    prefill chunk's (tile, split) pairs outrun the grid and leave a merge counter set."""
    src = (Path(__file__).resolve().parents[1] / "cuda" / "common.cuh").read_text()
    bound = re.search(r"#define MINILLM_SHORT_RUN_MAX_Q (\d+)", src)
    assert bound and int(bound.group(1)) == cuda_ops._DECODE_MAX_Q
    rule = re.search(r"bool short_run_on_tensor_cores\(.*?\{(.*?)\}", src, re.S).group(1)
    assert "nq <= MINILLM_SHORT_RUN_MAX_Q" in rule


def test_split_row_limits_fall_back_when_the_driver_cannot_count(caplog):
    """The split kernels' row limits come from the driver's count of their clusters at once
    (cuda_ops._clusters_at_once); where it cannot say (no libcuda here on the CPU; on a GPU, a function
    handle the driver refuses), the SM-count estimate passed in is the limit, with a warning that names it."""
    from types import SimpleNamespace

    refused = SimpleNamespace(kernel=SimpleNamespace(ptr=0))  # no kernel: the driver has nothing to count
    with caplog.at_level("WARNING", logger="minillm"):
        assert cuda_ops._clusters_at_once(refused, 8, 15) == 15
        assert cuda_ops._clusters_at_once(refused, 4, 0) == 0
    assert "8-CTA clusters" in caplog.text and "15 rows" in caplog.text
