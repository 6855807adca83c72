"""CUDA backend: the op table of numpy_ops.NumpyBackend over the hand-written kernels in cuda/.

Storage is bfloat16 (ml_dtypes.bfloat16 arrays in CuPy) with fp32 arithmetic in every kernel;
CudaBackend(dtype=np.float32) runs the same kernels on fp32 storage, which is how the tests pin
indexing bugs against the NumPy oracle at tight tolerances. Matmuls go to cuBLAS GemmEx through
ctypes (capture-safe); everything else is a RawKernel from cuda/*.cu.

Every op is enqueued on the backend's one stream and writes into caller-owned buffers. Device
memory comes from the arena (arena.py): allocate at startup, then `seal()`; afterwards any
allocation raises with its call site. Per-step values (positions, lengths, block tables,
sampling parameters) are read by kernels from device buffers, never passed as kernel scalars, so
`capture_graph(fn)` records a step once and `.replay()` runs it for any batch content of the same
bucket shape.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from minillm.backends import compile as kc
from minillm.backends import staging
from minillm.backends.arena import Arena
from minillm.backends.compile import env_flag, env_int
from minillm.backends.cublas import Cublas, cuda_dtype
from minillm.backends.pdl import PdlLauncher, max_active_clusters, pdl_enabled

log = logging.getLogger("minillm")

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    BF16 = None

_ATT_THREADS = 128  # cuda/attention.cu
_SAMPLE_THREADS = 512  # cuda/sampling.cu
_SAMPLE_WIDE_THREADS = 1024  # the wide build's (SAMPLE_THREADS; MINILLM_SAMPLE_WIDE_ROWS, MINILLM_VERIFY_WIDE_ROWS)
_VERIFY_KERNELS = {8: "verify_drawn_drafts_cl8", 4: "verify_drawn_drafts_cl4", 2: "verify_drawn_drafts_pair",
                   1: "verify_drawn_drafts"}  # by CTAs a row
_SAMPLE_MAX_VOCAB = 512 * 2048  # cuda/sampling.cu: the tiled draw's DRAW_TILE * DRAW_MAX_TILES
# cuda/gemv.cu's GEMV takes products of at most _GEMV_MAX_M rows (its GEMV_MAX_M, the same). Measured on
# the H200 (docs/BENCHMARKS.md, spec-cost): an 8-sequence decode step of the 8B shape took 11.5 ms
# with 8-row GEMVs against 7.3 ms for 16 sequences through cuBLAS, so above 4 rows the GEMV is not
# used (gemm_skinny, on tensor cores, takes 3-16 rows; cuBLAS more: small_product_kernel).
# cuda/decode_attention.cu: instantiated head dims and query heads per KV head; at most
# _DECODE_MAX_SPLITS splits of at least _DECODE_MIN_PART keys each.
_DECODE_HEAD_DIMS, _DECODE_MAX_G, _DECODE_MAX_SPLITS, _DECODE_MIN_PART = (64, 128), 8, 64, 64
# Query heads a KV head that take the one-query-head-a-CTA attention (MINILLM_DECODE_HEAD_CTAS): those whose
# tests have run on the H200 (the op tests at G = 2 / 4 / 8, the engines at 2 and 4; session 45; G = 3, the op
# tests and SmolLM2's GPU tests with MINILLM_DECODE_HEAD_CTAS=2, part271 in session 47).
_HEAD_CTAS_GPU_TESTED_G = (2, 3, 4, 8)
# ... and at least _DECODE_MIN_PART_ONE_ROW keys a split in a one-row step whose KV heads serve at most
# _DECODE_MIN_PART_ONE_ROW_MAX_G query heads each (decode_min_part)
_DECODE_MIN_PART_ONE_ROW, _DECODE_MIN_PART_ONE_ROW_MAX_G = 32, 2
# decode steps of at most this many rows fold q/k norm + RoPE + KV store into attention
# (MINILLM_DECODE_ROPE_MAX overrides)
_DECODE_ROPE_MAX_DEFAULT = 32
# a decode step given a launch order (longest context first) whose CTAs fill the GPU without
# splitting takes splits of this many keys instead of the wave model's even parts (the model
# assumes every CTA alike). H200: on ragged batches the order with 1,024-key parts read KV at
# 3.7-3.9 TB/s against 3.4-3.6 for the wave model's 3 even parts (part79: B = 256 of U[100, 2048]
# 289-303 us against 312-337); in the throughput workload 2,048 (no split up to 2,048 keys) beat
# 1,024 by 1.4% on one machine (part82/83: 23,520-23,721 against 23,263-23,380 tok/s) and 512 /
# 768 / 1,536 were slower. MINILLM_DECODE_ORDER_PART overrides (0: the wave model).
_DECODE_ORDER_PART_DEFAULT = 2048
_DECODE_MAX_Q = 16  # sequences with at most this many new queries in a step take the decode kernel
# (cuda/common.cuh's MINILLM_SHORT_RUN_MAX_Q is the same bound, on the device)
# ... except runs of 2..16 queries (speculative verification, DFlash blocks) whose context is at
# most this many keys: the tensor-core prefill kernel reads each K/V tile once for all of them
# (cuda/common.cuh short_run_on_tensor_cores). MINILLM_SHORT_RUN_MAX_CTX overrides (0: never)
_SHORT_RUN_MAX_CTX_DEFAULT = 2048
# ... its keys split over up to this many CTAs (one a 128 keys), so a step of few sequences still
# fills the GPU (8B, one sequence of 512: 8 CTAs unsplit). MINILLM_SHORT_RUN_SPLITS overrides
_SHORT_RUN_SPLITS_DEFAULT = 4
# ... for steps of at least this many sequences; fewer keep their short runs on the decode kernel
# (MINILLM_SHORT_RUN_MIN_SEQS overrides; the backend's short_run_min_seqs says why)
_SHORT_RUN_MIN_SEQS_DEFAULT = 3
# ... on cuda/prefill_attention.cu's paged_prefill_short_* (Q_IN_STAGE: three CTAs an SM instead of
# two, the same bits) when the launch's grid exceeds one wave of that kernel (1), never (0) or always
# (2). A rejected 8B DFlash k = 8 round's graphs at 512 keys (part178, H200): c = 16 (a grid of 544,
# 384 CTAs with work) -4.1%; on for every launch, c = 2 / 4 / 8 +0.1 / +0.4 / +1.9% (c = 8: a grid of
# 288, 192 with work; its 168-register build spills 60 bytes, not measured apart). The grid is an upper
# bound (up to 4 splits a run where 512 keys make 3, and a CUDA graph's padding sequence), so it is
# held against the larger wave, 3 x SMs: 288 stays on two CTAs an SM, 544 takes three; no bucket
# between them was measured. MINILLM_SHORT_RUN_3CTA overrides
_SHORT_RUN_3CTA_DEFAULT = 1
# cuda/gemv.cu's gemv1_merge_*: a batch-1 decode step's o product merging the attention's splits
# itself, so the attention leaves its partials unmerged (decode_step_attention given o_proj).
# MINILLM_O_MERGE: 0 off, 1 every CTA merges the whole row, 2 clusters of _O_MERGE_CLUSTER CTAs
# share the merge. Its dynamic shared memory is at most _O_MERGE_MAX_SMEM (its CTAs wait beside the
# attention's): rows of more splits than fit are merged by the attention as before (o_merge_plan).
# Off: slower on both shapes in either form (H200, session 29: batch-1 graphs 0.6B +25% / +3-7%,
# 8B +4% / +2%; cuda/gemv.cu says why)
_O_MERGE_DEFAULT, _O_MERGE_CLUSTER, _O_MERGE_MAX_SMEM = 0, 8, 200 << 10
# a decode CTA's fixed cost (loading q, merging key groups, writing and merging a partial), in keys'
# worth of streaming: what makes one more split not free. Fitted on the H200 (decode_splits)
_DECODE_SPLIT_COST_KEYS = 128
# kernels of these cuda/ modules begin with pdl_entry(), so graphs may launch them with PDL
# (cuda/gemm.cu's and cuda/decode_layers.cu's too, added as they load: _load_on_demand)
_PDL_MODULES = ("rows", "norm", "elementwise", "decode_attention", "sampling", "gemv")
# cuda/prefill_attention.cu: query rows per CTA, keys per tile, most splits of a short run
_PF_ROWS, _PF_BK, _PF_MAX_SPLITS = 64, 64, 8
# cuda/decode_layers.cu: compute threads (warps) per CTA (one more warp feeds its weight ring), GEMV
# partial sums a CTA holds, most splits of a KV head, most query heads per KV head it is built for
_DL_THREADS, _DL_WARPS, _DL_RED, _DL_MAX_S, _DL_MAX_G = 480, 15, 2048, 32, 8
# its weight ring: at most this many slots (DL_MAX_SLOTS), each at least this many bytes
_DL_MAX_SLOTS, _DL_MIN_SLOT = 8, 16384
_DL_SYNC_HEADS = 96  # DL_HEADS: where the per-KV-head merge counters start in its sync buffer


@dataclass
class _CudaDecoderPlan:
    """CudaBackend.decoder_plan: the kernel's name and shared memory, its [layers, 9] table of
    weight pointers (LayerPtrs in cuda/decode_layers.cu) and its scratch."""

    cfg: object
    name: str
    smem: int
    xs_len: int  # floats of the kernel's activation / attention scratch in shared memory
    n_slots: int  # the weight ring: slots of slot_bytes each
    slot_bytes: int
    cos_sin: object
    scale: float
    layers: list  # keeps the weights the table points to alive
    table: object
    qkv: object
    attn: object
    act: object
    part: object
    sync: object
    prof: object = None  # [layers * 5, SMs, 2] uint64 barrier timestamps (scripts/decode_layers_profile.py)


def _clusters_at_once(kern, ctas: int, fallback: int) -> int:
    """Rows a batch may have for a split sampling kernel that gives a row a cluster of `ctas` CTAs: the
    clusters of it the GPU holds at once, by the driver (pdl.max_active_clusters); a batch of more rows runs
    in two waves. H100 (132 SMs), against one CTA or a pair a row: clusters of 8 faster up to 15 rows and
    slower at 16 (part354-356), the driver's count 15; clusters of 4 faster up to 30 rows and slower at 31
    (part358, part359), the driver's count 30, not the SM count's 33 (a cluster must fit in one GPC, and GPCs
    differ in SMs); pairs 66. Where the driver cannot say: `fallback`, an estimate from the SM count."""
    try:
        return max_active_clusters(kern.kernel.ptr, ctas * 64, _SAMPLE_THREADS)
    except (OSError, AttributeError, RuntimeError) as e:
        log.warning("the driver's count of %d-CTA clusters at once is unavailable (%s): %d rows, from the SM count",
                    ctas, e, fallback)
        return fallback


def _prefill_smem(D: int, q_in_stage: bool = False) -> int:
    """Dynamic shared memory of cuda/prefill_attention.cu's kernel (its PfLayout): Q, then two
    stages of K and V tiles, bf16 rows padded by 8 elements; the short-run kernel
    (paged_prefill_short_*) keeps Q in the second stage, so the two stages alone."""
    ldq = D + 8
    return 2 * ((0 if q_in_stage else _PF_ROWS * ldq) + 2 * 2 * _PF_BK * ldq)


_GEMV_MAX_M, _GEMV_THREADS, _GEMV_COLS_PER_CTA = 4, 128, 2 * 4  # GEMV_NR * GEMV_WARPS in gemv.cu
# cuda/gemv.cu's gemv1_norm{C}_bf16 / gemv1_silu_mul_split_norm{C}_bf16: rms_norm_vec's chunks a thread
# replayed on 128 threads, C = 1 / 2 / 4 for rows of at most 1,024 / 2,048 / 4,096 values
_NORM_FOLD_CHUNKS = (1, 2, 4)
# MINILLM_FOLD_NORMS_MAX_K: one-row steps of models this wide or narrower fold their norms. H200,
# session 34 (part206, batch-1 graphs at 512 keys, alternated twice): 0.6B (1,024) 0.8325 -> 0.8224 ms
# (-1.2%), 8B (4,096) 4.2701 -> 4.3158 ms (+1.1%): each of the 8B gate_up's 3,072 CTAs reads the 16 KB
# row and residual before its first weight load, which costs more than the two launches saved
_FOLD_NORMS_MAX_K_DEFAULT = 1024


def norm_fold_chunks(K: int) -> int | None:
    """C of the folded-norm product kernels for rows of K values (K % 8 == 0), or None past 4,096:
    rms_norm_vec takes 128 threads of one 8-value chunk up to 1,024 values, then 256 threads of 1, 2
    (or 4) chunks; C is the chunks each of the product's 128 threads takes over."""
    chunks = K // 8
    return next((c for c in _NORM_FOLD_CHUNKS if chunks <= 128 * c), None)
# cuda/gemv.cu's gemv1_deep_bf16 (8 chunks a lane in flight): 124 registers (ptxas), so 4 CTAs of 128
# threads an SM; it takes a one-row product whose grid fits one wave of that (one_row_product_kernel)
_GEMV1_DEEP_CTAS_PER_SM = 4
# gemv1_pre_bf16 (its first weights loaded before the PDL wait): 108 registers, 4 CTAs an SM too.
# One-wave grids take it (MINILLM_GEMV1_PRE=0: never). Batch-1 graphs alternated twice on one H200
# (session 43, part253): 0.6B 0.8092 -> 0.8018 ms (-0.9%: its o and down), 8B 4.2822 -> 4.2835 (none
# of its products is routed there); its same-bits and route tests passed there
_GEMV1_PRE_CTAS_PER_SM = 4
_GEMV1_PRE_DEFAULT = 1
# MINILLM_GEMV1_DEEP_MIN_K (0: never) and the one-row gate_up split (gemv1_silu_mul_split_bf16, not the
# fused gemv1_silu_mul_bf16). Batch-1 graphs alternated twice on one H200 (session 31, part196): 8B
# 4.339 ms -> deep 4.282 (-1.3%: its o and down), split 4.287 (-1.2%), both 4.273 (-1.5%); 0.6B
# 0.8375 -> split 0.8292 (-1.0%), deep from 2048 (its o and down) 0.8462 (+1.0%), so deep starts at
# 4096 and leaves the 0.6B shape alone.
_GEMV1_DEEP_MIN_K_DEFAULT = 4096
# MINILLM_GATED_SPLIT_MAX_M: gate_up products of up to this many rows (at most 4, the GEMV's) stream
# gate and up rows on different warps of a CTA (gemv1_silu_mul_split_bf16 for one row, 70 registers
# against 118; gemv_silu_mul_split_bf16 for 2-4, 80 against 128; the same bits); 0: never. Of the
# real shapes only 1- and 2-row products reach the GEMV (3-4 rows take gemm_skinny_silu_mul when
# K % 64 == 0). Batch-2 graphs alternated twice on one H200 (session 32, part199): 0.6B 0.9304 ->
# 0.9079 ms (-2.4%), 8B 4.5463 -> 4.4792 (-1.5%) with 2 against 1.
_GATED_SPLIT_MAX_M_DEFAULT = 2
# cuda/gemv.cu's gemm_skinny: tensor-core products of 2-16 rows (sent 3-16), K % 64 == 0. Measured
# on the H200 (scripts/skinny_bench.py, docs/BENCHMARKS.md): 1.0-2.9x cuBLAS on the 0.6B shapes and 1.1-1.4x
# on the 8B ones up to 8 rows; with 9-16 rows (two tiles of x, each CTA reading all of x again
# from L2) 0.91-0.95x cuBLAS on the 8B gate_up and down (50-100 M weights) but still 1.1-1.3x on
# its qkv and o, so 9-16 rows took it only for weights up to 32 M. Since 9-16 rows take the
# software-pipelined gemm_skinny2_* (session 26), the 8B gate_up and down go there too: the c = 1
# DFlash round (9-row verification) -3.0% against cuBLAS + silu_mul (part174), hence
# _SKINNY_TWO_TILE_MAX_W 128 M (the LM heads' 155-622 M stay on cuBLAS). At 2-4 rows
# it beat the GEMV in 23 of 24 measured (shape, rows) cases (session 5, part22; 1.3-1.9x at 4
# rows, where the GEMV's per-row FMAs on CUDA cores outgrow its loads; the one loss 0.98x). Since
# the GEMV takes at most 4 rows (fewer registers, session 20), 2 rows are faster on it: decode
# steps' graphs at batch 2, 0.6B 1.005 -> 0.976 ms, 8B 4.710 -> 4.638 (session 21, part146); at 3
# and 4 rows it still loses (0.6B +6% / +14%, 8B +6% / +13%, part147). So the GEMV keeps 1-2 rows
# (_GEMV_PREFERRED_M) and the rows whose K the skinny kernel cannot take.
# 17-32 rows (the c = 2 DFlash round's 18-row verification, its drafter's 32-row block) fit
# gemm_skinny4_*. Sending every such product there (_SKINNY_MAX_M = _GATED_SKINNY_MAX_M = 32) lost:
# the c = 2 round +3.9%, 8B 24- / 32-row steps +8.9% / +6.4% (session 27, part176, H200). Timed one
# weight at a time (session 28, part181, scripts/skinny_bench.py --rows), cuBLAS streams the wide
# products (qkv, gate_up: N > K, many output tiles) at 3.4-4.1 TB/s on the 8B shapes and the
# four-tile kernel loses there (0.63-0.97x at 18 rows, both shapes), but on the narrowing ones (o,
# down: N <= K, few output tiles, which cuBLAS splits over K and reduces in a second kernel) it is
# even or ahead (8B o 1.04x, down 0.99x, 0.6B o / down 1.11x / 1.28x at 18 rows). In graphs
# (part183, A/B on one machine): the c = 2 round's 18-row verification with the 8B o and down there
# -1.3% (the o alone -1.3%); but plain steps of 24 rows +2.7% (0.6B) / +1.3% (8B), of 32 rows
# +1.7% / -1.9%. So 17 to _SKINNY_NARROW_MAX_M rows (the c = 2 verification up to k = 9) take it
# for narrowing products of at least _SKINNY_NARROW_MIN_W weights (the 8B o and down; the 0.6B's
# were not measured in a graph at these rows) and nothing else.
_SKINNY_MAX_M, _SKINNY_THREADS, _SKINNY_COLS_PER_CTA, _SKINNY_K = 16, 256, 16, 64
_SKINNY_KERNEL_MAX_M = 32  # gemm_skinny4_*'s four 8-row tiles
_SKINNY_NARROW_MAX_M, _SKINNY_NARROW_MIN_W = 20, 16 << 20  # 16: never
_SKINNY_TWO_TILE_MAX_W = 128 << 20  # weight elements
# past 16 rows only weights up to this many elements (A/B runs: part181 / part183 sent the 8B o
# alone, 17 M)
_SKINNY_FOUR_TILE_MAX_W = 128 << 20
_GEMV_PREFERRED_M = 2
# the fused gate_up GEMV + SiLU saves the silu_mul launch (~2.5 us), which at 3-4 rows outweighs
# the GEMV's loss on small matrices (0.6B gate_up: 4.8 us vs 3.3 + 2.5) but not on large ones
# (8B gate_up at 4 rows: 63.9 us vs 48.6 + 2.5): above this many weights 3-4 rows go unfused. With
# the 128-register gated kernel (GEMV_MAX_M 4) fusing them still lost: 8B batch-3 / 4 graphs +0.8%
# / +2.3% (session 21, part146)
_GATED_GEMV_MAX_W = 32 << 20
# gemm_skinny_silu_mul (the gate_up product + SiLU on the skinny GEMM, one launch) takes gate_up
# products of _GATED_SKINNY_MIN_M.._GATED_SKINNY_MAX_M rows (0: never), 9-16 rows only of weights
# gemm_skinny takes them for (_SKINNY_TWO_TILE_MAX_W). Decode-step graphs on the H200 against
# gemv_silu_mul (3-4 rows) / gemm_skinny + silu_mul (session 22, part153): 0.6B batch 3 / 4 / 8
# -5.5% / -7.3% / -4.2%, 8B -1.0% / -0.9% / -0.7%; at 9-16 rows of the 8B gate_up (100 M weights)
# it lost to cuBLAS + silu_mul (the c = 1 DFlash round +1.4%) until the two-tile case was pipelined
# (gemm_skinny2_silu_mul, session 26: with the down product, -3.0%).
_GATED_SKINNY_MIN_M, _GATED_SKINNY_MAX_M = 3, 16


def _skinny_takes(M: int, N: int, K: int) -> bool:
    """gemm_skinny (and its gated twin) can take M rows of an [N, K] weight, and is not slower
    than cuBLAS there: K in whole 64-wide blocks, at most _SKINNY_MAX_M rows, or
    _SKINNY_NARROW_MAX_M of a large narrowing product (N <= K, at least _SKINNY_NARROW_MIN_W
    weights), never more than the kernels' 32; past 8 rows only of weights up to
    _SKINNY_TWO_TILE_MAX_W, past 16 only up to _SKINNY_FOUR_TILE_MAX_W."""
    narrow = N <= K and N * K >= _SKINNY_NARROW_MIN_W
    rows_ok = M <= _SKINNY_MAX_M or (narrow and M <= _SKINNY_NARROW_MAX_M)
    return (K % _SKINNY_K == 0 and rows_ok and M <= _SKINNY_KERNEL_MAX_M
            and (M <= 8 or N * K <= _SKINNY_TWO_TILE_MAX_W)
            and (M <= 16 or N * K <= _SKINNY_FOUR_TILE_MAX_W))


def _skinny_prefix(M: int) -> str:
    """The cuda/gemv.cu skinny kernels for M rows: gemm_skinny_* take 2-8 rows (one tile of x), the
    two-tile gemm_skinny2_* 9-16 and the four-tile gemm_skinny4_* 17-32 (kernels of their own, so each
    has its own register count; 17-32 rows by default only of the large narrowing products,
    _skinny_takes)."""
    return "gemm_skinny_" if M <= 8 else "gemm_skinny2_" if M <= 16 else "gemm_skinny4_"


def head_ctas_kv_div(G: int, T: int, head_ctas: int, o_merged: bool) -> int:
    """CTAs sharing a KV head in a decode step's fused attention: G (one query head a CTA,
    paged_decode_rope_kvd_*) for one-row steps with MINILLM_DECODE_HEAD_CTAS 1, not under the o
    product's merge, at G whose tests have run on the GPU (_HEAD_CTAS_GPU_TESTED_G), or at any G
    with MINILLM_DECODE_HEAD_CTAS 2 (for testing another G); else 1."""
    tested = G in _HEAD_CTAS_GPU_TESTED_G or head_ctas == 2
    return G if head_ctas and T == 1 and not o_merged and tested else 1


def skinny_product_launch(M: int, N: int, num_sms: int, w4: bool, gated: bool = False) -> tuple[str, int]:
    """The skinny kernel's name prefix and threads (none takes dynamic shared memory) for a product of M
    rows and N columns (gated: N of gate_up's halves, the kernel's name then goes on "silu_mul_bf16"):
    _skinny_prefix's kernels on 8 warps a CTA; with w4 (MINILLM_SKINNY2_W4), 9-16 rows of a plain
    product whose grid is past one wave of 2 CTAs an SM (102 registers) and fits one of 4 CTAs of 4
    warps an SM on gemm_skinny2w4_* (the 8B qkv's 384 CTAs: 1.45 waves on 8 warps, DRAM 62% busy,
    part266). MINILLM_SKINNY2_RING's gemm_skinny2_ring_* (the weights through shared memory by a ninth
    warp's TMA copies) measured slower and was removed in session 57 (part272: the c = 1 round +64%)."""
    ctas = _cdiv(N, _SKINNY_COLS_PER_CTA)
    if w4 and not gated and 9 <= M <= 16 and 2 * num_sms < ctas <= 4 * num_sms:
        return "gemm_skinny2w4_", _SKINNY_THREADS // 2
    return _skinny_prefix(M), _SKINNY_THREADS


def gated_product_kernel(M: int, F: int, K: int) -> str | None:
    """Which cuda/gemv.cu kernel computes a bf16 gate_up product of M rows with SiLU-and-multiply
    fused ([2F, K] weights): "gemv" (gemv_silu_mul; one row: gemv1_silu_mul, split or not), "skinny"
    (gemm_skinny_silu_mul), or None: matmul into gate_up, then silu_mul (the caller checks dtypes and
    alignment). One row unfused (a plain product, then silu_mul: the same bits) took the 8B batch-1
    graph -0.22% (session 31, part195), the split kernel -1.2% (part196); that route was removed."""
    if M <= min(_GEMV_PREFERRED_M, _GEMV_MAX_M):
        return "gemv"
    if _GATED_SKINNY_MIN_M <= M <= _GATED_SKINNY_MAX_M and _skinny_takes(M, 2 * F, K):
        return "skinny"
    if M <= _GEMV_MAX_M and (2 * F * K <= _GATED_GEMV_MAX_W or K % _SKINNY_K):
        return "gemv"
    return None


def one_row_product_kernel(N: int, K: int, f32_out: bool, num_sms: int, deep_min_k: int,
                           pre: bool = False) -> str:
    """The cuda/gemv.cu kernel of a one-row product of N outputs over K: gemv1_deep_bf16 (8 chunks a
    lane in flight) for rows of at least deep_min_k (0: never) whose grid fits one wave of its 4 CTAs
    an SM, else gemv1_bf16 / gemv1_f32 (4 in flight, 7 CTAs an SM). Session 31's part195 ran every
    one-row product with 8: the 8B down (512 CTAs) streamed 3.96 -> 4.10 TB/s, o (512) 5.71 -> 5.79,
    qkv (768: past a wave) 4.49 -> 4.13 (scripts/stream_bench.py). With pre (MINILLM_GEMV1_PRE),
    other bf16 grids that fit one wave of 4 CTAs an SM take gemv1_pre_bf16 (weights asked for before
    the PDL wait); on it, every gemv1_bf16 launch of a batch-1 graph measured 0.6B (o, down: 128
    CTAs) -0.9% and 8B (qkv: 768 CTAs, two waves at 4 an SM) +0.8% (session 42, part252)."""
    ctas = _cdiv(N, _GEMV_COLS_PER_CTA)
    if f32_out:
        return "gemv1_f32"
    if deep_min_k and K >= deep_min_k and ctas <= _GEMV1_DEEP_CTAS_PER_SM * num_sms:
        return "gemv1_deep_bf16"
    return "gemv1_pre_bf16" if pre and ctas <= _GEMV1_PRE_CTAS_PER_SM * num_sms else "gemv1_bf16"


# cuda/gemv.cu's gemv1_stage_*: a one-row product whose CTAs (one an SM) copy their whole share of the
# weights into shared memory before the PDL wait and release their dependents at once. MINILLM_GEMV1_STAGE:
# 0 never, 1 every one-row product whose share fits, 2 (the default) all of those but the one right after
# the decode attention (the o product), whose copies would load HBM under the attention's latency-bound
# merge. 0.6B batch-1 graphs alternated twice on H100s (part298-part300): 1 +2.7% (the merge 1.3 -> 5.0
# us a layer), 2 -2.4%. The 8B's products do not fit (its qkv would need 376 KB a CTA); streaming them through
# two shared-memory slots a CTA instead (gemv1_ring_*, MINILLM_GEMV1_RING) measured slower and was removed in
# session 57 (the 8B batch-1 graph 5.53 -> 9.02 / 8.77 ms at 1 / 2, H100)
_GEMV1_STAGE_MAX_SMEM = 112 << 10
_GEMV1_STAGE_DEFAULT = 2
_ONE_ROW_MODES = "0 never, 1 every product it takes, 2 all but the one right after the decode attention"


def one_row_mode(name: str, default: int, what: str) -> int:
    """MINILLM_GEMV1_STAGE: one of _ONE_ROW_MODES, or a ValueError naming the variable."""
    mode = env_int(name, default, f"{what}: {_ONE_ROW_MODES}")
    if mode not in (0, 1, 2):
        raise ValueError(f"{name}={mode}: use {_ONE_ROW_MODES}")
    return mode


def gemv1_stage_plan(N: int, K: int, gated: bool, num_sms: int, max_smem: int) -> tuple[int, int, int] | None:
    """(grid, rows a CTA, dynamic shared memory bytes) of cuda/gemv.cu's gemv1_stage_* for a one-row
    product of N outputs (gate and up rows each, gated) over K, or None when a CTA's share of the
    weights and x would not fit in _GEMV1_STAGE_MAX_SMEM (or the device's opt-in limit)."""
    rpc = _cdiv(N, num_sms)
    smem = ((2 if gated else 1) * rpc * K + K) * 2
    if smem > min(max_smem, _GEMV1_STAGE_MAX_SMEM):
        return None
    return _cdiv(N, rpc), rpc, smem


# cuda/gemv.cu's gemv1_mlp_split_*: a one-row layer's MLP (its norm, gate_up, act and down) in one kernel
# without a grid barrier, each CTA adding its share of the down product's sums into a row of ws.mlp_acc that
# the next layer's staged qkv product reads (gemv1_stage_norm1_acc_*). MINILLM_MLP_SPLIT: 0 off (the
# default until it is measured), 1 fp32 atomic sums (their bits depend on the order the CTAs finish), 2
# fixed-point int64 sums (the same bits every run)
_MLP_SPLIT_DEFAULT = 0
_MLP_SPLIT_ROWS = (8, 16, 24, 32)  # the kernels' bounds on act rows a CTA (down words held in registers)
_MLP_SPLIT_ACC = {1: ("f32", np.float32), 2: ("i64", np.int64)}
# mode 3: fp32 sums over the down weight transposed ([F, K], a copy made at load: Transformer's down_t), so
# each CTA's down columns are one contiguous block and a warp's loads 512 contiguous bytes
# mode 4: the same, each CTA's down_t rows copied into shared memory behind its gate_up share (bulk copies)
_MLP_SPLIT_KERNEL = {1: "f32", 2: "i64", 3: "f32t", 4: "f32s"}
_MLP_SPLIT_DTYPE = {1: np.float32, 2: np.int64, 3: np.float32, 4: np.float32}
_MLP_SPLIT_MAX_SMEM = 160 << 10  # mode 4's shares: 146 KB on the 0.6B, beside the next qkv product's 66 KB


def mlp_split_plan(F: int, K: int, num_sms: int, max_smem: int,
                   staged_down: bool = False) -> tuple[int, int, int, int] | None:
    """(grid, act rows a CTA, dynamic shared memory bytes, the kernel's row bound) of cuda/gemv.cu's
    gemv1_mlp_split_* for an MLP of F activations over rows of K, or None where it does not apply: K over
    1,024 (a thread's 8 outputs), K or F not a multiple of 8, more than 32 act rows a CTA, or a gate_up share
    past _GEMV1_STAGE_MAX_SMEM."""
    if K % 8 or K > 1024 or F % 8:
        return None
    rpc = _cdiv(_cdiv(F, num_sms), 8) * 8
    bound = next((r for r in _MLP_SPLIT_ROWS if r >= rpc), None)
    smem = ((3 if staged_down else 2) * rpc * K + K) * 2
    if bound is None or smem > min(max_smem, _MLP_SPLIT_MAX_SMEM if staged_down else _GEMV1_STAGE_MAX_SMEM):
        return None
    return _cdiv(F, rpc), rpc, smem, bound


def small_product_max_m() -> int:
    """The most rows of x any cuda/gemv.cu product kernel is sent (larger products go straight to
    cuBLAS): the GEMV's, the skinny kernels' and their narrowing route's bounds."""
    return max(_GEMV_MAX_M, min(max(_SKINNY_MAX_M, _SKINNY_NARROW_MAX_M), _SKINNY_KERNEL_MAX_M))


def small_product_kernel(M: int, N: int, K: int) -> str | None:
    """Which cuda/gemv.cu kernel computes a bf16 product of M rows of x with an [N, K] weight:
    "gemv", "skinny", or None for cuBLAS (the caller checks dtypes and alignment)."""
    skinny = _skinny_takes(M, N, K)
    if M <= (min(_GEMV_PREFERRED_M, _GEMV_MAX_M) if skinny else _GEMV_MAX_M):
        return "gemv"
    return "skinny" if skinny else None


# cuda/gemm.cu: products of _WIDE_MIN_M-_WIDE_MAX_M bf16 rows, 64 weight rows a CTA, K-slices of a
# multiple of 64 summed across a cluster of 1-8 CTAs; opt-in (MINILLM_GEMM=wide), cuBLAS was faster
_WIDE_MIN_M, _WIDE_MAX_M, _GW_BN, _GW_BK, _GW_THREADS = 17, 256, 64, 64, 256
_GW_MT, _GW_SPLITS = (2, 4, 6, 8), (1, 2, 4, 8)
_GW_STAGES = {2: 8, 4: 6, 6: 5, 8: 4}  # GwLayout::STAGES, by MT


def wide_gemm_smem(mt: int) -> int:
    """Dynamic shared memory of gemm_wx_m<mt>_*: its cp.async stages (GwLayout in cuda/gemm.cu),
    at least the fp32 partial tile that reuses them."""
    mp = 32 * mt
    return max(_GW_STAGES[mt] * (_GW_BN + mp) * (_GW_BK + 8) * 2, _GW_BN * (mp + 4) * 4)


def wide_product_plan(M: int, N: int, K: int, num_sms: int) -> tuple[int, int] | None:
    """(MT, S) for cuda/gemm.cu's product of M rows with an [N, K] weight, or None for cuBLAS: MT
    pairs of 8-row x tiles a warp (32 MT rows held), S CTAs splitting K. S depends on (N, K) and
    the SM count only, never on M, so a row's result is the same in any batch: the most splits
    (up to 8) that keep one CTA a SM for the N / 64 column tiles and at least two 64-wide k
    stages a CTA."""
    if not (_WIDE_MIN_M <= M <= _WIDE_MAX_M) or N % _GW_BN or K % _GW_BK:
        return None
    mt = 2 * _cdiv(M, 64)
    tiles = N // _GW_BN
    for s in sorted(_GW_SPLITS, reverse=True):
        if tiles * s <= num_sms and K % (_GW_BK * s) == 0 and K // s >= 2 * _GW_BK:
            return mt, s
    return mt, 1


def decode_min_part(T: int, G: int, override: int = 0) -> int:
    """Fewest keys in a split of cuda/decode_attention.cu for a step of T rows whose KV heads serve G
    query heads each: override (MINILLM_DECODE_MIN_PART) when given, else 32 for a one-row step with
    G <= 2, else 64. A split's keys are a chain of dependent latencies at batch 1, so shorter splits
    (more CTAs) shorten the attention, until the last split's merge of more partials costs more.
    Batch-1 graphs at 512 keys alternated twice on one H200 (session 43, part254 / part255): 32 keys
    (17 active splits) against 64 (9): 0.6B shape (G = 2) -1.6% / -2.9%, 8B shape (G = 4) +0.5% /
    +0.4%; 48: 0.6B +2.0%, 8B +1.1%; 16: 0.6B +0.6%, 8B +2.2%; 32 with 32 splits' partials in flight in
    the merge (DEC_MERGE_FLIGHT_ROPE=32) 0.6B -3.0%, 8B +0.9%. 0.6B batch-2 graphs: 0.0%, batch 4: +4.1%
    (part256), so steps of more rows keep 64."""
    if override:
        return override
    return _DECODE_MIN_PART_ONE_ROW if T == 1 and G <= _DECODE_MIN_PART_ONE_ROW_MAX_G else _DECODE_MIN_PART


def decode_splits(work: int, resident: int, ctx: int, max_splits: int,
                  split_cost: int = _DECODE_SPLIT_COST_KEYS) -> int:
    """Splits per (token, KV head) for cuda/decode_attention.cu, from static sizes (graph-safe).

    work: CTAs without splitting (tokens x KV heads); resident: CTAs the GPU holds at once (SMs
    x the kernel's occupancy); ctx: keys per token (the bucket's capacity). The model: the CTAs of
    a launch are alike, so it takes ceil(work x s / resident) waves of (ctx / s + split_cost)
    each. Few tokens get as many splits as fill the GPU, up to max_splits; many tokens get a
    split count that leaves no wave nearly empty. Checked on the H200 against every split count
    (scripts/decode_splits.py, 11 shapes, uniform and ragged contexts): with split_cost 128 the
    choice was within 2.1% of the fastest in every case; the previous rule (splits until 2 x SMs
    CTAs) was 32% off at 8B heads, batch 64, context 2048 and 16% off at batch 128 of ragged
    contexts.
    """
    best, best_cost = 1, float("inf")
    for s in range(1, max(1, max_splits) + 1):
        cost = _cdiv(work * s, max(1, resident)) * (ctx / s + split_cost)
        if cost < best_cost * 0.999:  # a tie keeps fewer splits
            best, best_cost = s, cost
    return best


def o_merge_plan(mode: int, N: int, K: int, H: int, D: int, n_splits: int, num_sms: int,
                 max_smem: int) -> dict | None:
    """gemv1_merge_*'s launch for a batch-1 o product of N outputs over K = H x D inputs after a
    decode launch of n_splits splits (mode: MINILLM_O_MERGE), or None where it does not apply.

    Warps a CTA: the fewest of 4 / 8 / 16 that make the grid one wave (GEMV_NR = 2 columns a
    warp), since every CTA merges the row (or its cluster does). Shared memory: the row (K bf16),
    split weights [H][64] and denominators, then the partials of the heads a CTA merges for up to
    defer_max splits, as many as fit _O_MERGE_MAX_SMEM (rows of more splits are merged by the
    attention, as without it; both kernels decide that from the row's length on the device)."""
    if mode == 0 or K != H * D or K % 8 or D % 8:
        return None
    cl = _O_MERGE_CLUSTER if mode == 2 else 1
    warps = next((w for w in (4, 8, 16) if _cdiv(N, 2 * w) <= num_sms), 16)
    fixed = K * 2 + H * 64 * 4 + _cdiv(H, 4) * 16
    head_split = _cdiv(H, cl) * D * 4  # one split's partials of a CTA's heads
    defer_max = min(n_splits, _DECODE_MAX_SPLITS, (min(max_smem, _O_MERGE_MAX_SMEM) - fixed) // head_split)
    if defer_max < 1:
        return None
    cluster = f"_cl{cl}" if cl > 1 else ""
    return dict(kernel=f"gemv1_merge{cluster}_bf16_w{warps}",
                grid=_cdiv(_cdiv(N, 2 * warps), cl) * cl, threads=32 * warps,
                smem=fixed + head_split * defer_max, defer_max=defer_max)


# The kernels use thread-block clusters, PDL and Hopper's instructions (cuda/gemv.cu, gemm.cu and
# sampling.cu do not compile for an older target), so the backend needs compute capability 9.0 or later
MIN_COMPUTE_CAPABILITY = 90


def cuda_unavailable_reason() -> str | None:
    """None when CuPy sees a CUDA device the kernels can run on, else why not (for the error message)."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001
        return f"CuPy is not importable ({type(e).__name__}: {e}); install cupy-cuda13x"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return f"CUDA reports no usable device ({type(e).__name__}: {e})"
    if n <= 0:
        return "CUDA reports 0 devices"
    return too_old_reason(cupy.cuda.Device(0).compute_capability, cupy.cuda.runtime.getDeviceProperties(0)["name"])


def too_old_reason(compute_capability: str, name) -> str | None:
    """None for a GPU of compute capability MIN_COMPUTE_CAPABILITY or later ("90": 9.0), else why the
    kernels cannot run on it."""
    cc = int(compute_capability)
    if cc >= MIN_COMPUTE_CAPABILITY:
        return None
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return (f"its kernels need a Hopper GPU or later (compute capability {MIN_COMPUTE_CAPABILITY // 10}.0+: "
            f"H100, H200), and device 0 ({name}) has compute capability {cc // 10}.{cc % 10}")


def cuda_available() -> bool:
    return cuda_unavailable_reason() is None


def storage_dtype(dtype) -> np.dtype:
    """The storage dtype for a --dtype value: auto/bfloat16 -> bfloat16, float32 -> float32."""
    if dtype is None or (isinstance(dtype, str) and dtype in ("auto", "bfloat16", "bf16")):
        return BF16
    if isinstance(dtype, str) and dtype in ("float32", "fp32"):
        return np.dtype(np.float32)
    if not isinstance(dtype, str) and np.dtype(dtype) in (BF16, np.dtype(np.float32)):
        return np.dtype(dtype)
    raise ValueError(f"--dtype {dtype} is not supported on the CUDA backend; use bfloat16 or float32")


def _decode_defines(sfx: str, D: int) -> tuple[str, ...]:
    """cuda/decode_attention.cu built for one storage type ("bf16" / "f32") and head dim alone."""
    return (f"DEC_ONLY_T={1 if sfx == 'bf16' else 2}", f"DEC_ONLY_D={D}")


def decode_group_names(sfx: str, D: int) -> list[str]:
    """The kernels of cuda/decode_attention.cu built under _decode_defines(sfx, D)."""
    return ([f"paged_decode{r}_{sfx}_d{D}_g{g}" for r in ("", "_rope") for g in range(1, _DECODE_MAX_G + 1)]
            + [f"paged_decode_rope_kvd_{sfx}_d{D}_g1"])


def _suffix(dtype) -> str:
    dt = np.dtype(dtype)
    if dt == np.float32:
        return "f32"
    if BF16 is not None and dt == BF16:
        return "bf16"
    raise TypeError(f"CUDA kernels support bfloat16 and float32 storage, got {dt}")


def _i32(x) -> np.int32:
    return np.int32(x)


def _i64(x) -> np.int64:
    return np.int64(x)


_NULL = np.uint64(0)


def _dl_ring_shape(free: int, max_k: int, n_slots: int | None = None) -> tuple[int, int]:
    """cuda/decode_layers.cu's weight ring in `free` bytes of shared memory: (slots, bytes a slot).
    By default at most 4 slots of at least 40 KiB: a tile costs ~1.2-1.4 us of compute whatever its
    size (docs/BENCHMARKS.md, session 6), so few, large tiles measured fastest (part34: 0.6B kernel
    955 us with 4 slots of 47 KiB, 990 with 2, 1,038 with 8; 8B 6.1 ms with 3 of 43 KiB, 6.9 with
    5). A slot holds at least one row of the widest matrix, padded by 16 bytes (the kernel's
    DL_MMA_B variant pads its rows)."""
    least = max(_DL_MIN_SLOT, _cdiv(2 * max_k + 16, 1024) * 1024)
    if n_slots is None:
        n_slots = max(2, min(4, free // max(least, 40 * 1024)))
    n = min(n_slots, _DL_MAX_SLOTS, free // least)
    return n, (free // max(n, 1)) // 1024 * 1024


def _dl_stage_red(rows: int, K: int, gated: bool, slot_bytes: int) -> int:
    """Partial sums one CTA of cuda/decode_layers.cu keeps for a GEMV stage of `rows` output rows
    (its stage_plan(): rows a ring slot holds, the K split that fills the warps)."""
    P = rows * (2 if gated else 1)
    rt = max(1, min(P, slot_bytes // (2 * K)))
    ks = max(1, min(_DL_WARPS // ((rt + 1) // 2), K // 8))
    return P * ks


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# cuda/norm.cu's qk_norm_rope kernels: from this many tokens, one CTA (4 warps) a token walking
# its heads instead of one warp a head. At 8,190 tokens x 32 heads the warp-a-head grid took 94 us
# a layer, bound by starting 65,536 small CTAs (part86); decode steps (at most a few hundred
# tokens) keep it. Sizes between were not measured.
_QK_TOKEN_CTA_MIN = 4096


def _qk_grid_y(T: int, n_heads: int) -> int:
    return 1 if T >= _QK_TOKEN_CTA_MIN else _cdiv(n_heads, 4)  # 4: norm.cu's QK_WARPS


def _rows(a, what: str) -> tuple[int, int]:
    """(number of rows, row stride in elements) for an array whose rows (over the first axis)
    are contiguous; raises for layouts the kernels cannot walk."""
    item = a.itemsize
    if a.ndim == 1:
        if a.strides[0] != item:
            raise ValueError(f"{what}: a 1-D array must be contiguous")
        return 1, a.shape[0]
    expect = item
    for n, s in zip(reversed(a.shape[1:]), reversed(a.strides[1:])):
        if n > 1 and s != expect:
            raise ValueError(f"{what}: rows of shape {a.shape} strides {a.strides} are not contiguous")
        expect *= n
    return a.shape[0], a.strides[0] // item


def _copy_unit(*byte_values: int) -> tuple[str, int]:
    """The widest copy unit (16, 4 or 2 bytes) all sizes, strides and addresses are aligned to."""
    g = 0
    for v in byte_values:
        g = math.gcd(g, int(v))
    for size, name in ((16, "u16"), (4, "u4"), (2, "u2")):
        if g % size == 0:
            return name, size
    raise TypeError("row copies need 2-byte aligned rows")


def decode_rope_max_tokens() -> int:
    """MINILLM_DECODE_ROPE_MAX: the most rows of a decode step whose q/k norm + RoPE + KV store
    run inside the attention kernel (decode_step_attention); larger steps launch them apart."""
    return env_int("MINILLM_DECODE_ROPE_MAX", _DECODE_ROPE_MAX_DEFAULT, "a row count; 0 never fuses")


def short_run_three_mode() -> int:
    """MINILLM_SHORT_RUN_3CTA: which kernel takes a launch of split short runs (short_run_on_three)."""
    mode = env_int("MINILLM_SHORT_RUN_3CTA", _SHORT_RUN_3CTA_DEFAULT,
                   "split short runs on the three-CTAs-an-SM kernel: 0 never, 1 past a wave, 2 always")
    if mode not in (0, 1, 2):
        raise ValueError(f"MINILLM_SHORT_RUN_3CTA={mode}: use 0 (never), 1 (when the launch's grid "
                         "exceeds one wave of the three-CTA kernel) or 2 (always)")
    return mode


def gated_split_max_rows() -> int:
    """MINILLM_GATED_SPLIT_MAX_M: the most rows (0-4) of a gate_up GEMV whose CTAs stream gate and up
    rows on different warps (gemv1_silu_mul_split_bf16 / gemv_silu_mul_split_bf16); 0 never."""
    rows = env_int("MINILLM_GATED_SPLIT_MAX_M", _GATED_SPLIT_MAX_M_DEFAULT,
                   "most rows of a gate_up product split over gate and up warps")
    if rows > _GEMV_MAX_M:
        raise ValueError(f"MINILLM_GATED_SPLIT_MAX_M={rows}: use 0 (never) to {_GEMV_MAX_M} (the GEMV's "
                         f"most rows); the default is {_GATED_SPLIT_MAX_M_DEFAULT}")
    return rows


def smem_carveout() -> int | None:
    """MINILLM_SMEM_CARVEOUT: the shared-memory share of each SM's unified L1 / shared memory, in percent
    (0-100; the driver takes the next supported capacity up), set on every kernel the backend launches;
    unset, the driver chooses per kernel. Why (not yet measured, session 49): in isolation the driver
    gave the decode chain's kernels different capacities (ncu: 32 KB for gemm_skinny2_bf16, 64 for its
    gated twin, 132 for the decode attention, 196 for the tensor-core attention), and an SM holding one
    kernel's CTAs cannot change its capacity for the next kernel's; the batch-1 timelines place the
    kernels that use shared memory after ones that use none 0.8-1.9 us after their producers' release,
    the others 0-0.6 us. If capacities are what holds them back (registers are the other candidate:
    cuda/gemv.cu's GEMV_*NORM_MIN_BLOCKS), one for all lets PDL's next grid onto every SM at once."""
    raw = os.environ.get("MINILLM_SMEM_CARVEOUT", "")
    if raw == "":
        return None
    v = env_int("MINILLM_SMEM_CARVEOUT", 0, "percent of the unified L1 / shared memory given to shared memory")
    if v > 100:
        raise ValueError(f"MINILLM_SMEM_CARVEOUT={v}: give a percent from 0 (the most L1) to 100 (the most "
                         "shared memory), or leave it unset for the driver's choice per kernel")
    return v


def short_run_on_three(mode: int, ctas: int, resident_three: int) -> bool:
    """Whether a launch of split short runs with a grid of ctas CTAs (an upper bound: each run's
    split count is its own length's, on the device, and a graph's padding sequence counts) takes
    paged_prefill_short_* (three CTAs an SM) rather than paged_prefill_* (two; the same bits):
    mode 2 always, 0 never, 1 when the grid exceeds resident_three, what the GPU holds of the
    three-CTA kernel at once (_SHORT_RUN_3CTA_DEFAULT says why that one)."""
    return mode == 2 or (mode == 1 and ctas > resident_three)


class CapturedGraph:
    """A CUDA graph recorded from one call of a function; replay() reruns it on the stream."""

    def __init__(self, graph, stream):
        self.graph = graph
        self.stream = stream

    def replay(self) -> None:
        self.graph.launch(stream=self.stream)


class CudaBackend:
    name = "cuda"
    decode_max_q = _DECODE_MAX_Q  # the runner's StepInputs.decode_rows: sequences this short
    dflash2_limits = (256, 1024)  # DFlash2's selector top_k and rank: cuda/dflash2.cu TOPK_MAX, PATH_MAX_RANK
    max_sample_vocab = _SAMPLE_MAX_VOCAB  # the sampler's rows: the runner refuses larger vocabularies
    device = "cuda"
    _last_launch = ""  # the kernel _launch sent last (_one_row_mode_takes's rule)

    def __init__(self, dtype=None, device_id: int = 0, cublas_workspace_bytes: int = 32 << 20,
                 attention_scratch_bytes: int = 64 << 20, staging_bytes: int = 16 << 20,
                 debug: bool | None = None):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(
                f"--device cuda (device='cuda') needs an NVIDIA GPU visible to CuPy: {reason}. "
                "Use --device cpu or auto (the NumPy backend) on machines without one."
            )
        import cupy

        self.cp = cupy
        self.dtype = storage_dtype(dtype)
        self._sfx = _suffix(self.dtype)
        self.device_id = device_id
        cupy.cuda.Device(device_id).use()
        self.props = cupy.cuda.runtime.getDeviceProperties(device_id)
        self.num_sms = int(self.props["multiProcessorCount"])
        self.arena = Arena()
        self.arena.install()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.debug = kc.debug_enabled() if debug is None else debug
        self._load_kernels_logged()
        with self.arena.label("backend: cuBLAS workspace + attention split scratch"), self.stream:
            self._blas_ws = cupy.empty(cublas_workspace_bytes, dtype=np.uint8)
            self._att_scratch = cupy.empty(attention_scratch_bytes // 4, dtype=np.float32)
            self._idx_scratch = cupy.empty((2, 1 << 16), dtype=np.int32)  # host-given index lists
            self._val_scratch = cupy.empty((3, 1 << 16), dtype=np.float32)  # and their values
            # cuda/decode_attention.cu: one split counter per (token, KV head); each step's last
            # split resets its counter, so zeroing once here is enough
            self._att_counters = cupy.zeros(1 << 16, dtype=np.int32)
        self.blas = Cublas(self.stream.ptr, self._blas_ws.data.ptr, cublas_workspace_bytes)
        # MINILLM_INITCHECK=1 (set by scripts/failure_matrix.py for its initcheck run): initcheck does
        # not see cuBLAS's writes, so each cuBLAS output is zeroed before its GEMM (matmul) and the
        # cuBLAS workspace once here (cuBLAS's split-K reduction reads partial sums it wrote there)
        self.mark_blas_outputs = env_flag("MINILLM_INITCHECK", False, "cuBLAS outputs zeroed for initcheck")
        # MINILLM_CHECK_ATT_COUNTERS=1 (a debug check, eager steps): after every attention call the
        # split counters must all be 0 again (each merge resets its own); one left set would make the
        # next launch that uses it merge before its splits have written (_check_att_counters)
        self.check_att_counters = env_flag("MINILLM_CHECK_ATT_COUNTERS", False, "the split counters checked")
        if self.mark_blas_outputs:
            cupy.cuda.runtime.memsetAsync(self._blas_ws.data.ptr, 0, cublas_workspace_bytes, self.stream.ptr)
        self._capturing = False
        # every launch recorded into a graph, by kernel name ("cublas" for cuBLAS's products): a
        # route or setting A/B whose record equals the base's changed no kernel (scripts/ab_table.py)
        self.captured_launches: Counter[str] = Counter()
        self._resident: dict[str, int] = {}  # CTAs of a kernel the GPU holds at once, by name (_resident_ctas)
        self.pdl = None  # graphs launch pdl_entry kernels through it (Hopper and later)
        if pdl_enabled() and int(self.props["major"]) >= 9:
            try:
                self.pdl = PdlLauncher(self.stream.ptr)
            except (OSError, AttributeError) as e:  # no libcuda.so.1 / no cuLaunchKernelEx
                print(f"minillm: programmatic dependent launch unavailable ({type(e).__name__}: {e}); "
                      "graphs launch kernels plainly", file=sys.stderr)
        self.decode_rope_max_tokens = decode_rope_max_tokens()
        self.decode_order_min_ctas: int | None = None  # an ordered step's least CTAs (None: one wave; tests: 0)
        self.decode_order_part = env_int("MINILLM_DECODE_ORDER_PART", _DECODE_ORDER_PART_DEFAULT,
                                         "keys per split of an ordered decode step (0: the wave model)")
        self.short_run_max_ctx = env_int("MINILLM_SHORT_RUN_MAX_CTX", _SHORT_RUN_MAX_CTX_DEFAULT,
                                         "most context keys of a 2-16-query run on the tensor-core kernel")
        self.short_run_max_splits = env_int("MINILLM_SHORT_RUN_SPLITS", _SHORT_RUN_SPLITS_DEFAULT,
                                            "most CTAs a short run's keys are split over")
        self.short_run_three_ctas = short_run_three_mode()  # 0 never, 1 past a wave of it, 2 always
        # steps of fewer sequences keep short runs on the decode kernel (the runner's hint): at one
        # sequence it is faster (a rejected 8B DFlash k = 8 round's graphs 6.440 -> 6.223 ms, part116),
        # at two too since both kernels changed (6.724 -> 6.689, -0.5%, part181), from four on the
        # tensor cores win (part115: c = 4 7.07 against 7.63 ms). 1: never
        self.short_run_min_seqs = env_int("MINILLM_SHORT_RUN_MIN_SEQS", _SHORT_RUN_MIN_SEQS_DEFAULT,
                                          "fewest sequences of a step whose short runs take the tensor cores")
        # 1: a one-row decode step's fused attention takes one query head a CTA (paged_decode_rope_kvd_*),
        # KV heads x G CTAs a split instead of KV heads. Batch-1 graphs alternated twice on one H200 (session
        # 44, part260): 0.6B -0.44%, 8B -0.46%; every GPU test but SmolLM2's passed with it on (session 45,
        # part268's first run: 656 passed, the 12 failures its new skinny tests' missing kernels), and the
        # repeat tests (part266). 0: KV heads a split, as before
        self.decode_head_ctas = env_int("MINILLM_DECODE_HEAD_CTAS", 1,
                                        "1: a one-row decode step's attention takes one query head a CTA "
                                        "at GPU-tested query heads a KV head, 2: at any")
        if self.decode_head_ctas not in (0, 1, 2):
            raise ValueError(f"MINILLM_DECODE_HEAD_CTAS={self.decode_head_ctas}: use 0, 1 or 2")
        # 1: 9-16-row products whose grid is past one wave of 8-warp CTAs take 4-warp ones
        # (skinny_product_launch): the 8B's rejected DFlash k = 8 round at c = 1 -1.07%, 8B batch-16 steps
        # -1.18% (graphs alternated twice on one H200, session 45, part268). 0: 8 warps a CTA always
        self.skinny2_w4 = env_int("MINILLM_SKINNY2_W4", 1, "1: 9-16-row products past a wave on 4-warp CTAs")
        if self.skinny2_w4 not in (0, 1):
            raise ValueError(f"MINILLM_SKINNY2_W4={self.skinny2_w4}: use 0 or 1")
        self.decode_min_part = env_int("MINILLM_DECODE_MIN_PART", 0,
                                       "fewest keys in a split of the decode kernel, every step (0: the rule)")
        self.gated_split_max_m = gated_split_max_rows()
        self.fold_norms_max_k = env_int("MINILLM_FOLD_NORMS_MAX_K", _FOLD_NORMS_MAX_K_DEFAULT,
                                        "longest row (0: none; at most 4,096) a one-row step normalises inside "
                                        "the qkv / gate_up products instead of an rms_norm launch")
        if not 0 <= self.fold_norms_max_k <= 128 * max(_NORM_FOLD_CHUNKS) * 8:
            raise ValueError(f"MINILLM_FOLD_NORMS_MAX_K={self.fold_norms_max_k}: use 0 (never) to 4096; "
                             f"the default is {_FOLD_NORMS_MAX_K_DEFAULT}")
        self.gemv1_deep_min_k = env_int("MINILLM_GEMV1_DEEP_MIN_K", _GEMV1_DEEP_MIN_K_DEFAULT,
                                        "shortest row a one-row product keeps 8 chunks a lane in flight for; 0 never")
        self.gemv1_pre = env_int("MINILLM_GEMV1_PRE", _GEMV1_PRE_DEFAULT,
                                 "1: one-row products of one wave load their first weights before the PDL wait")
        if self.gemv1_pre not in (0, 1):
            raise ValueError(f"MINILLM_GEMV1_PRE={self.gemv1_pre}: use 0 or 1")
        self.gemv1_stage = one_row_mode("MINILLM_GEMV1_STAGE", _GEMV1_STAGE_DEFAULT,
                                        "one-row products whose CTAs' weight shares fit in shared memory copy "
                                        "them there before the PDL wait (gemv1_stage_*)")
        self.mlp_split = env_int("MINILLM_MLP_SPLIT", _MLP_SPLIT_DEFAULT,
                                 "one-row steps run each layer's MLP but the last as one kernel adding its down "
                                 "sums into a ring row: 0 off, 1 fp32 atomics, 2 fixed-point int64 (same bits)")
        if self.mlp_split not in (0, 1, 2, 3, 4):
            raise ValueError(f"MINILLM_MLP_SPLIT={self.mlp_split}: use 0 (off), 1 (fp32 atomic sums), 2 "
                             "(fixed-point int64 sums, the same bits every run), 3 (fp32, down transposed) "
                             "or 4 (3 with the down shares staged)")
        self.o_merge = env_int("MINILLM_O_MERGE", _O_MERGE_DEFAULT,
                               "a batch-1 step's o product merges the attention's splits: 0 off, 1 each CTA, "
                               "2 in clusters")
        if self.o_merge not in (0, 1, 2):
            raise ValueError(f"MINILLM_O_MERGE={self.o_merge}: use 0 (off), 1 (every CTA of the o product "
                             "merges the row) or 2 (clusters of CTAs share the merge)")
        self._staging = cupy.cuda.alloc_pinned_memory(staging_bytes)
        self._staging_cap = staging_bytes
        self._staging_off = 0
        self._staging_event = cupy.cuda.Event(disable_timing=True)
        self._pinned_checked: set[int] = set()  # host addresses copy_to_pinned found page-locked
        self._stage_plans: dict[tuple, tuple] = {}  # stage_inputs' plan per shape of runs (_staging_plan)
        self.stream.synchronize()

    def _load_kernels_logged(self, quiet_s: float = 5.0) -> None:
        """_load_kernels, saying so when it takes long. A first start in an environment compiles every
        module (65 s on an H200 one after another, 15 s on threads since session 54; more on a machine with
        few cores) and once printed nothing meanwhile: a server seemed hung, and the failure matrix's 60 s
        start-up wait gave up on it. Warm starts read CuPy's on-disk cache in a second or two and log
        nothing here."""
        t0 = time.perf_counter()
        try:
            from cupy.cuda.compiler import get_cache_dir

            where = f" (cached in {get_cache_dir()})"
        except (ImportError, AttributeError):
            where = ""
        note = threading.Timer(quiet_s, lambda: log.info(
            "compiling the CUDA kernels: a first start in this environment takes 15 s or more (its modules "
            "compile in parallel, one a core); later starts "
            "read the compiled kernels back%s", where))
        note.daemon = True
        note.start()
        try:
            self._load_kernels()
        finally:
            note.cancel()
        if (took := time.perf_counter() - t0) > quiet_s:
            log.info("CUDA kernels ready in %.0f s", took)

    def _load_kernels(self) -> None:
        self.carveout = smem_carveout()  # None: the driver's choice per kernel
        k = {}
        self._pdl_kernels: set[str] = set()  # kernels that begin with pdl_entry (cuda/common.cuh)
        # The tensor-core kernel (verification runs, DFlash blocks) built with PF_PDL and launched
        # with PDL in graphs: a rejected DFlash round's graphs 0.6-0.9% shorter on the H200
        # (session 16, part111). MINILLM_PDL_PREFILL=0 launches it without, for A/B runs.
        pf_pdl = env_int("MINILLM_PDL_PREFILL", 1, "0: the tensor-core attention launched without PDL") == 1
        pf_defines = ("PF_PDL=1",) if pf_pdl else ()
        # Batches of at most this many rows sample with a 1,024-thread CTA a row (twice the warps of
        # sample_tokens' 512; one CTA an SM either way up to a row an SM, the default). Measured at 1-128
        # rows on an H100's 132 SMs (part346): top-k and top-p rows 20-32% faster, temperature 10%,
        # greedy 3-20%, min-p 2-3% (+2.2% at 128 rows); a sampled 0.6B step +2.2% tok/s. Past a row an
        # SM the 512-thread kernel fits two rows an SM in one wave: wide 2-15% slower at 192-256 rows
        # (part348). 0: never.
        self.sample_wide_rows = env_int("MINILLM_SAMPLE_WIDE_ROWS", self.num_sms,
                                        "batches of at most this many rows sample with 1,024 threads a row")
        # Batches of at most this many rows verify drafts drawn from q with the wide build's 1,024-thread
        # CTAs (the pair or the single kernel). H100, pair split (part350): top-p and top-k + top-p rows -14%
        # to -20% at 1-8 rows, -10% to -18% at 64 and -15% to -24% at 128 (the single kernel); temperature-only rows
        # +2% at 1-8 rows, +15% at 64 and +3% at 128. A filtered row costs 3-5x an unfiltered one, so the
        # wide build wins in time whenever filters are common; default: up to a row an SM, as sampling.
        self.verify_wide_rows = env_int("MINILLM_VERIFY_WIDE_ROWS", self.num_sms,
                                        "batches of at most this many rows verify drawn drafts with 1,024 threads")
        wide_defines = (f"SAMPLE_THREADS={_SAMPLE_WIDE_THREADS}",)
        wide_module = bool(self.sample_wide_rows or self.verify_wide_rows)
        modules = {
            "rows": ["gather_rows_u16", "gather_rows_u4", "gather_rows_u2",
                     "store_kv_u16", "store_kv_u4", "store_kv_u2", "fill_input_ids", "advance_blocks",
                     "stage_inputs", "copy_to_host_i32"],
            "elementwise": ["silu_mul_bf16", "silu_mul_f32", "silu_mul_bf16_vec8", "fill_bias_bf16_bf16",
                            "fill_bias_f32_f32", "fill_bias_f32_bf16", "scale_softcap_bf16",
                            "scale_softcap_f32", "suppress_tokens_bf16", "suppress_tokens_f32",
                            "penalize_logits_bf16", "penalize_logits_f32", "mask_logits_bf16",
                            "mask_logits_f32"],
            "norm": ["rms_norm_bf16", "rms_norm_f32", "qk_norm_rope_bf16", "qk_norm_rope_f32",
                     "qk_norm_rope_store_kv_bf16", "qk_norm_rope_store_kv_f32",
                     "rms_norm_vec1_bf16", "rms_norm_vec2_bf16", "rms_norm_vec4_bf16"],
            "attention": ["paged_attention_bf16", "paged_attention_f32",
                          "attention_combine_bf16", "attention_combine_f32"],
            "sampling": ["sample_tokens", "sample_tokens_cl2", "sample_tokens_cl4", "sample_tokens_cl8",
                         "verify_drawn_drafts", "verify_drawn_drafts_pair", "verify_drawn_drafts_cl4",
                         "verify_drawn_drafts_cl8"],
            "dflash2": ["grouped_causal_conv_bf16", "grouped_causal_conv_f32", "dflash2_topk",
                        "dflash2_path_bf16", "dflash2_path_f32"],
            "gemv": ["gemv_bf16", "gemv_f32", "gemv_silu_mul_bf16", "gemv1_bf16", "gemv1_f32", "gemv1_silu_mul_bf16",
                     "gemv1_silu_mul_split_bf16", "gemv_silu_mul_split_bf16", "gemv1_deep_bf16",
                     "gemv1_pre_bf16", "gemv1_stage_bf16", "gemv1_stage_silu_mul_bf16"]
            + [f"gemv1_{k}norm{c}_bf16" for k in ("", "silu_mul_split_", "stage_", "stage_silu_mul_")
               for c in _NORM_FOLD_CHUNKS]
            + [f"gemm_skinny{t}_{k}" for t in ("", "2", "4") for k in ("bf16", "f32", "silu_mul_bf16")]
            + ["gemm_skinny2w4_bf16", "gemm_skinny2w4_f32"]
            + [f"gemv1_merge{c}_bf16_w{w}" for c in ("", f"_cl{_O_MERGE_CLUSTER}") for w in (4, 8, 16)]
            + [f"gemv1_mlp_split_{a}_r{r}_bf16" for a in _MLP_SPLIT_KERNEL.values() for r in _MLP_SPLIT_ROWS]
            + [f"gemv1_stage_norm1_acc_{a}_bf16" for a, _ in _MLP_SPLIT_ACC.values()],
        }
        # every module of a start compiled at once (a first start's compile: the slowest module's time),
        # the decode attention for this storage type's head dims (another's loads if asked: _decode_kernel)
        kc.compile_parallel([(m, ()) for m in modules] + [("prefill_attention", pf_defines)]
                            + [("decode_attention", _decode_defines(self._sfx, d)) for d in _DECODE_HEAD_DIMS]
                            + ([("sampling", wide_defines)] if wide_module else []),
                            self.device_id, self.debug)
        for mod, names in modules.items():
            for n in names:
                k[n] = kc.get_kernel(mod, n, self.debug)
                if mod in _PDL_MODULES:
                    self._pdl_kernels.add(n)
        if wide_module:
            for n in modules["sampling"]:
                if n.endswith(("_cl2", "_cl4", "_cl8")):
                    continue  # the cluster kernels are built at 512 threads only (cuda/sampling.cu)
                k[f"{n}_wide"] = kc.get_kernel("sampling", n, self.debug, wide_defines)
                self._pdl_kernels.add(f"{n}_wide")
        # The split kernels' row limits below default to the driver's count of their clusters at once; where
        # it cannot say, clusters of 8 take one cluster less than the SMs hold, clusters of 4 none, pairs half
        # the SMs.
        cl8_guess = max(0, self.num_sms // 8 - 1)

        def split_rows(var: str, name: str, ctas: int, fallback: int, what: str, short: int = 0) -> int:
            at_once = _clusters_at_once(k[name], ctas, fallback)
            return env_int(var, max(0, at_once - short), f"batches of at most this many rows {what}")

        # Batches of at most this many rows sample with each row split over a cluster of 8 CTAs of 512
        # threads (sample_tokens_cl8: each CTA reads its share of the row in every radix pass and the
        # histograms are summed through distributed shared memory, then the draw splits the row's tiles).
        # H100, against the wide kernel (part352, part353): at 1-12 rows top-p rows -43%, top-k and top-k +
        # top-p -37% to -39%, temperature and min-p -21% to -25%, greedy -32% to -38%; at 13-15 rows still -14%
        # to -53% (part356); at 16 rows slower (+3% to +61%: 16 clusters of 8 no longer run at once on 132
        # SMs), at 32 +60% to +137%; a 0.6B step sampled with Qwen3's defaults +2.5% tok/s. The wide
        # (1,024-thread) split was slower at every batch. Default: the clusters of 8 the GPU holds at once
        # (_clusters_at_once; 15 on an H100). 0: never.
        self.sample_cluster_rows = split_rows("MINILLM_SAMPLE_CLUSTER_ROWS", "sample_tokens_cl8", 8, cl8_guess,
                                              "sample a row on a cluster of CTAs")
        # Batches past MINILLM_SAMPLE_CLUSTER_ROWS and of at most this many rows sample with each row split over
        # a cluster of 4 (sample_tokens_cl4), whose clusters still run at once where 16 clusters of 8 do not.
        # H100, against the wide kernel (part358, part359): at 16-30 rows -18% to -42% on every mode (top-p 0.9:
        # 139 -> 81 us at 16 rows), at 31 and 32 rows +23% to +51% (more clusters of 4 than run at once: two
        # waves). Default: the clusters of 4 the GPU holds at once (30 on an H100). 0: never.
        self.sample_cluster4_rows = split_rows("MINILLM_SAMPLE_CLUSTER4_ROWS", "sample_tokens_cl4", 4, 0,
                                               "sample a row on 4 CTAs")
        # Batches past MINILLM_SAMPLE_CLUSTER4_ROWS and of at most this many rows sample with each row split over
        # a pair of CTAs (sample_tokens_cl2), where more than 30 clusters of 4 (on an H100) would take two
        # waves and 66 pairs still run at once. H100, against the wide kernel (part362): at 31 and 48 rows -1%
        # to -17% on every mode (Qwen3's defaults -10% to -11%), at 64 -6% to -13% but greedy +7%, at 66 (every
        # SM busy) mixed, -9% to +11% (top-p 0.9 +11%), at 67 +65% to +85% (two waves). Default: two pairs
        # fewer than the GPU holds at once (64 on an H100). 0: never.
        self.sample_cluster2_rows = split_rows("MINILLM_SAMPLE_CLUSTER2_ROWS", "sample_tokens_cl2", 2,
                                               self.num_sms // 2, "sample a row on 2 CTAs", short=2)
        # Batches of at most this many rows verify drafts drawn from q with two CTAs a row (a cluster:
        # the target's row's max and filters on one SM, the drafter's on another; verify_drawn_drafts_pair).
        # Default: the pairs the GPU holds at once, so every pair runs in one wave (66 on an H100, half its SMs;
        # both builds hold one CTA an SM). 0: never.
        self.verify_pair_rows = split_rows("MINILLM_VERIFY_PAIR_ROWS", "verify_drawn_drafts_pair", 2,
                                           self.num_sms // 2, "verify drawn drafts with two CTAs a row")
        # Batches of at most this many rows verify drafts drawn from q with each row split over a cluster of
        # 8 CTAs of 512 threads (verify_drawn_drafts_cl8: p's filters, then q's, each over all eight as
        # sample_tokens_cl8 splits a row, then every later pass split by tiles over the eight; rows without a
        # drawn draft as sample_tokens_cl8). H100, against the pair (part354): q-draft rows -32% to -41% at 1
        # and 9 rows (top-p 0.9: 196 -> 131 us at one row), a sampled rejected DFlash k = 8 round of the 0.6B
        # shape at c = 1 (9 rows) -3%; at 12-15 rows -29% to -38% (part355, part356); at 16 rows filtered
        # rows +24% to +31% (too many clusters to run at once). Default: as the split sampler's.
        self.verify_cluster_rows = split_rows("MINILLM_VERIFY_CLUSTER_ROWS", "verify_drawn_drafts_cl8", 8, cl8_guess,
                                              "verify drawn drafts on a cluster")
        # The same over a cluster of 4 (verify_drawn_drafts_cl4) for batches past those and of at most this many
        # rows. H100, against the pair (part358, part359): q-draft rows -12% to -35% at 16-30 rows, +4% to +66%
        # at 31 and 32. Default: as the cl4 sampler's.
        self.verify_cluster4_rows = split_rows("MINILLM_VERIFY_CLUSTER4_ROWS", "verify_drawn_drafts_cl4", 4, 0,
                                               "verify drawn drafts on 4 CTAs")
        for d in _DECODE_HEAD_DIMS:
            k.update(self._decode_group(self._sfx, d))
        try:  # tensor-core prefill: needs the toolkit's mma.h, which not every install has
            for d in _DECODE_HEAD_DIMS:
                for name in (f"paged_prefill_bf16_d{d}", f"paged_prefill_short_bf16_d{d}"):
                    k[name] = kc.get_kernel("prefill_attention", name, self.debug, pf_defines)
                    if pf_pdl:
                        self._pdl_kernels.add(name)
            self.prefill_unavailable = None
        except Exception as e:  # noqa: BLE001 - NVRTC reports a missing header as a compile error
            self.prefill_unavailable = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
            print(f"minillm: tensor-core prefill attention unavailable ({self.prefill_unavailable}); "
                  "prefill uses the CUDA-core kernel", file=sys.stderr)
        # attention tiles may use more than the default 48 KiB of shared memory
        optin = self.props.get("sharedMemPerBlockOptin", 0)
        if not optin:
            optin = self.cp.cuda.Device(self.device_id).attributes.get(
                "MaxSharedMemoryPerBlockOptin", 48 << 10)
        self.max_smem = int(optin) - 1024  # the kernel's static shared memory lives there too
        for n in ("paged_attention_bf16", "paged_attention_f32",
                  *(f"paged_prefill{v}_bf16_d{d}" for v in ("", "_short") for d in _DECODE_HEAD_DIMS)):
            if n in k:
                k[n].max_dynamic_shared_size_bytes = self.max_smem
        for n in k:
            if n.startswith("gemv1_merge"):
                k[n].max_dynamic_shared_size_bytes = min(self.max_smem, _O_MERGE_MAX_SMEM)
            if n.startswith(("gemv1_stage", "gemv1_mlp_split")):
                k[n].max_dynamic_shared_size_bytes = min(self.max_smem, _MLP_SPLIT_MAX_SMEM if "f32s" in n
                                                         else _GEMV1_STAGE_MAX_SMEM)
        # cuda/gemm.cu for 17-256 rows, only with MINILLM_GEMM=wide (scripts/gemm_bench.py switches
        # it per call): measured 0.2-0.9x cuBLAS on the H200 (part63-65, docs/BENCHMARKS.md), so
        # cuBLAS stays the default and its module is compiled on first use (_wide_kernel); the
        # cluster launch needs Hopper
        self.wide_gemm_possible = (int(self.props["major"]) >= 9 and self.dtype != np.float32
                                   and wide_gemm_smem(max(_GW_MT)) <= self.max_smem)
        gemm = os.environ.get("MINILLM_GEMM", "")
        if gemm not in ("", "cublas", "wide", "own"):
            raise ValueError(f"MINILLM_GEMM={gemm!r}: use cublas (the default), wide (17-256 rows on "
                             "cuda/gemm.cu) or own (no cuBLAS up to 256 rows; for sanitizer runs)")
        self.wide_gemm = self.wide_gemm_possible and gemm in ("wide", "own")
        # MINILLM_GEMM=own: every bf16 product of up to 256 rows on the project's kernels, whatever
        # their speed there (cuda/gemv.cu's skinny kernels take 5-32 rows of any weight, cuda/gemm.cu
        # 33-256), so a sanitizer run checks a serving load with no cuBLAS kernel in it: under
        # racecheck an uninstrumented cuBLAS kernel stops the tool ("failed to handle a hardware
        # exception", session 39, part228), and an instrumented one is NVIDIA's to check, not ours
        self.own_gemm = gemm == "own" and self.dtype != np.float32  # the skinny kernels need no Hopper
        if self.carveout is not None:
            for kern in k.values():
                kern.preferred_shared_memory_carveout = self.carveout
        # the head-a-CTA attention's threads are its build's (DEC_KVD_THREADS, cuda/decode_attention.cu: 128
        # unless MINILLM_CUDA_DEFINES asks for more): the launch takes the bound the kernel was compiled with
        kvd = k[f"paged_decode_rope_kvd_{self._sfx}_d{_DECODE_HEAD_DIMS[0]}_g1"]
        self._kvd_threads = int(kvd.max_threads_per_block)
        self.k = k

    # ---- memory -------------------------------------------------------------------------
    def label(self, what: str):
        """Context manager: account allocations inside it under `what` in memory_plan()."""
        return self.arena.label(what)

    def seal(self) -> None:
        self.synchronize()
        self.arena.seal()

    def unseal(self) -> None:
        self.arena.unseal()

    def memory_plan(self) -> str:
        return self.arena.memory_plan()

    def asarray(self, host, dtype=None):
        """Copy a host array to the device (default: the compute dtype, bfloat16)."""
        dt = np.dtype(dtype) if dtype is not None else self.dtype
        if isinstance(host, self.cp.ndarray):
            with self.stream:
                return host.astype(dt, copy=True)
        h = np.ascontiguousarray(np.asarray(host), dtype=dt)  # bf16 rounding happens on the host
        with self.stream:
            out = self.cp.empty(h.shape, dtype=dt)
        self.copy_from_host(out, h)
        return out

    def empty(self, shape, dtype=None):
        with self.stream:
            return self.cp.empty(shape, dtype=np.dtype(dtype) if dtype is not None else self.dtype)

    def zeros(self, shape, dtype=None):
        with self.stream:
            return self.cp.zeros(shape, dtype=np.dtype(dtype) if dtype is not None else self.dtype)

    def to_host(self, x) -> np.ndarray:
        self.stream.synchronize()
        with self.stream:
            h = self.cp.asnumpy(x, stream=self.stream)
        self.stream.synchronize()
        return h

    def ensure_staging(self, nbytes: int) -> None:
        """A pinned staging ring of at least nbytes (startup: the step buffers ask for two of their
        largest uploads, so one stage_inputs blob always fits; a larger ring is host memory, allocated
        after the transfers queued in the old one have left it)."""
        if nbytes <= self._staging_cap:
            return
        self._staging_event.synchronize()
        self._staging = self.cp.cuda.alloc_pinned_memory(nbytes)
        self._staging_cap, self._staging_off = nbytes, 0

    def _ring_take(self, n: int) -> tuple[int, np.ndarray]:
        """n bytes of the pinned staging ring for a transfer about to be queued (its offset and a
        view): after a wrap, once the transfers queued before have left the ring (each records
        _staging_event behind it)."""
        off = (self._staging_off + 255) & ~255
        if off + n > self._staging_cap:
            self._staging_event.synchronize()
            off = 0
        self._staging_off = off + n
        return off, np.frombuffer(self._staging, dtype=np.uint8, count=n, offset=off)

    def copy_from_host(self, dst, src) -> None:
        """dst[...] = src through a pinned staging ring (async on the stream, no device alloc)."""
        if not dst.flags.c_contiguous:
            raise ValueError("copy_from_host needs a contiguous destination")
        h = np.ascontiguousarray(np.broadcast_to(np.asarray(src, dtype=dst.dtype), dst.shape))
        flat = h.reshape(-1).view(np.uint8)
        chunk = self._staging_cap // 2  # large arrays (weights) stream through in pieces
        for start in range(0, flat.size, chunk):
            part = flat[start:start + chunk]
            off, view = self._ring_take(part.size)
            view[:] = part
            self.cp.cuda.runtime.memcpyAsync(dst.data.ptr + start, self._staging.ptr + off, part.size,
                                             self.cp.cuda.runtime.memcpyHostToDevice,
                                             self.stream.ptr)
            self._staging_event.record(self.stream)

    def stage_inputs(self, dst, src: np.ndarray, runs: list[tuple[int, int, int, int]],
                     fill: staging.StageFill | None = None, copy_out: tuple | None = None) -> None:
        """dst (the device's packed step buffer, uint8) gets the rows of each run of src (the host's,
        same layout), then the fill (minillm/backends/staging.py), and copy_out's ids go to its
        pinned host row (copy_to_pinned's checks); twin of NumpyBackend.stage_inputs.
        The rows go into the pinned staging ring behind a header, and cuda/rows.cu stage_inputs
        reads them from there: one launch, no copy engine (eager only: a graph would replay the
        ring's later contents). A step's checks, header and copy plan are kept per shape (a
        decode step's repeat): its host time is then a few slice copies (part319)."""
        if self._capturing:
            raise RuntimeError("stage_inputs inside a graph capture: its ring blob changes every step")
        if dst.dtype != np.uint8 or dst.ndim != 1 or not dst.flags.c_contiguous or src.dtype != np.uint8:
            raise TypeError("stage_inputs: dst and src must be contiguous 1-D uint8 buffers")
        size = min(dst.shape[0], src.shape[0])
        key = (tuple(runs), size, None if fill is None else
               (fill.run, fill.ids_row, fill.rows_row, fill.n, fill.prev_tokens.shape[0]))
        plan = self._stage_plans.get(key)
        if plan is None:
            plan = self._staging_plan(runs, size, fill)
            if len(self._stage_plans) >= 4096:  # shapes of eager steps vary without end
                self._stage_plans.clear()
            self._stage_plans[key] = plan
        elif fill is not None and fill.prev_tokens.dtype != np.int32:
            raise TypeError("stage_inputs: the fill's prev_tokens must be a 1-D int32 array")
        head, nbytes_total, copies = plan
        off, view = self._ring_take(nbytes_total)
        view[: head.shape[0]] = head
        for pos, lo, rows, stride, nbytes in copies:  # check_runs: each run is a (rows, stride) block
            view[pos: pos + rows * nbytes].reshape(rows, nbytes)[...] = \
                src[lo: lo + rows * stride].reshape(rows, stride)[:, :nbytes]
        units = (nbytes_total - head.shape[0]) // 16
        out_src, out_dst, out_n = _NULL, _NULL, 0
        if copy_out is not None:
            out_n = copy_out[0].shape[0]
            self._check_pinned_copy(copy_out[1], copy_out[0])
            out_src, out_dst = copy_out[0], np.uint64(copy_out[1].ctypes.data)
        if units or out_n:
            prev = fill.prev_tokens if fill is not None else _NULL
            self._launch("stage_inputs", (max(min(_cdiv(units, 256), 264), 1),), (256,),
                         (np.uint64(self._staging.ptr + off), dst, prev, out_src, out_dst, _i32(out_n)))
        self._staging_event.record(self.stream)

    @staticmethod
    def _staging_plan(runs, size: int, fill) -> tuple[np.ndarray, int, list]:
        """stage_inputs' checked header (bytes), blob size and copies (blob position, src offset,
        rows, stride, bytes) for one shape of runs."""
        staging.check_runs(runs, size, fill)
        head = staging.header(runs, fill).view(np.uint8)
        pos, copies = head.shape[0], []
        for offset, stride, rows, nbytes in runs:
            if rows and nbytes:
                copies.append((pos, offset, rows, stride, nbytes))
                pos += rows * nbytes
        return head, pos, copies

    def copy_to_pinned(self, dst: np.ndarray, src) -> None:
        """dst[:n] = src (n = len(src), int32), queued on the stream: a kernel's stores into dst,
        which must lie in pinned host memory (a TokenReadback slot; checked once per address);
        twin of NumpyBackend.copy_to_pinned. Wait on an event recorded behind it before reading."""
        self._check_pinned_copy(dst, src)
        if src.shape[0]:
            self._launch("copy_to_host_i32", (1,), (256,), (src, np.uint64(dst.ctypes.data), _i32(src.shape[0])))

    def _check_pinned_copy(self, dst: np.ndarray, src) -> None:
        """A device-to-pinned copy's arrays: int32, contiguous, dst long enough and page-locked
        (checked once per address: a pageable address would fault in the kernel)."""
        n = src.shape[0]
        if src.dtype != np.int32 or src.ndim != 1 or src.strides[0] != 4:
            raise TypeError("copy_to_pinned: src must be a contiguous 1-D int32 array")
        if dst.dtype != np.int32 or dst.ndim != 1 or dst.strides[0] != 4 or dst.shape[0] < n:
            raise TypeError(f"copy_to_pinned: dst must be a contiguous 1-D int32 array of at least {n}")
        ptr = dst.ctypes.data
        if ptr not in self._pinned_checked:
            attrs = self.cp.cuda.runtime.pointerGetAttributes(ptr)
            if attrs.type != 1:  # cudaMemoryTypeHost: page-locked, mapped into the device's space
                raise ValueError("copy_to_pinned: dst is not pinned host memory (cupy.cuda.alloc_pinned_memory)")
            self._pinned_checked.add(ptr)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def capture_graph(self, fn: Callable[[], object]) -> CapturedGraph:
        """Record fn()'s device work (run it once eagerly first, so every kernel is loaded)."""
        self.synchronize()
        with self.stream, self.arena.capturing():
            self.stream.begin_capture()
            self._capturing = True
            try:
                fn()
            finally:
                self._capturing = False
                graph = self.stream.end_capture()
        graph.upload(self.stream)
        return CapturedGraph(graph, self.stream)

    def _launch(self, name: str, grid, block, args, shared_mem: int = 0) -> None:
        self._last_launch = name
        if self._capturing:
            self.captured_launches[name] += 1
            if self.pdl is not None and name in self._pdl_kernels:
                self.pdl.launch(self.k[name].kernel.ptr, grid, block, args, shared_mem)
                return
        with self.stream:
            self.k[name](grid, block, args, shared_mem=shared_mem)

    # ---- row copies ---------------------------------------------------------------------
    def _gather(self, src, idx, out, what: str) -> None:
        n, out_stride = _rows(out, what + " out")
        if n == 0:
            return
        n_src, src_stride = _rows(src, what + " source")
        if src.dtype != out.dtype:
            raise TypeError(f"{what}: source {src.dtype} and out {out.dtype} differ")
        row_bytes = out.size // n * out.itemsize
        if src.size // max(n_src, 1) * src.itemsize != row_bytes:
            raise ValueError(f"{what}: rows of {src.shape} and {out.shape} differ")
        it = out.itemsize
        unit, size = _copy_unit(row_bytes, src_stride * it, out_stride * it, src.data.ptr, out.data.ptr)
        if idx is not None:
            if idx.dtype != np.int32 or idx.shape[0] < n:
                raise TypeError(f"{what}: indices must be int32 with at least {n} entries")
        self._launch(
            "gather_rows_" + unit, (n,), (min(256, max(32, row_bytes // size)),),
            (src, _i64(src_stride * it // size), idx if idx is not None else _NULL, _i64(n_src),
             out, _i64(out_stride * it // size), _i32(n), _i32(row_bytes // size)),
        )

    def copy(self, x, out) -> None:
        if x.shape != out.shape:
            raise ValueError(f"copy: shapes {x.shape} and {out.shape} differ")
        try:
            if x.ndim == 1:
                x, out = x.reshape(1, -1), out.reshape(1, -1)
            self._gather(x, None, out, "copy")
        except (ValueError, TypeError, AttributeError):
            with self.stream:  # other layouts / dtype casts: CuPy's elementwise copy (no alloc)
                self.cp.copyto(out, x, casting="unsafe")

    def embed(self, ids, table, out) -> None:
        self._gather(table, ids, out, "embed")

    def gather_rows(self, x, idx, out) -> None:
        self._gather(x, idx, out, "gather_rows")

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        T, k_stride = _rows(k, "store_kv k")
        if T == 0:
            return
        _, v_stride = _rows(v, "store_kv v")
        if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
            raise ValueError("store_kv: caches must be contiguous [num_blocks, block_size, KH, D]")
        if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
            raise TypeError(f"store_kv: k/v {k.dtype} and cache {k_cache.dtype} differ")
        it = k.itemsize
        row_bytes = k[0].size * it
        n_slots = k_cache.shape[0] * k_cache.shape[1]
        unit, size = _copy_unit(row_bytes, k_stride * it, v_stride * it, k.data.ptr, v.data.ptr,
                                k_cache.data.ptr, v_cache.data.ptr)
        self._launch(
            "store_kv_" + unit, (T,), (min(256, max(32, row_bytes // size)),),
            (k, _i64(k_stride * it // size), v, _i64(v_stride * it // size), k_cache, v_cache,
             slot_mapping, _i32(T), _i32(row_bytes // size), _i64(n_slots)),
        )

    def fill_input_ids(self, input_ids, prev_tokens, src_rows) -> None:
        """input_ids[r] = prev_tokens[src_rows[r]] where src_rows[r] >= 0 (async scheduling: ids
        the previous step sampled, still on the device); twin of NumpyBackend.fill_input_ids."""
        n = input_ids.shape[0]
        if n == 0:
            return
        for a, what in ((input_ids, "input_ids"), (prev_tokens, "prev_tokens"), (src_rows, "src_rows")):
            if a.dtype != np.int32 or a.ndim != 1 or a.strides[0] != 4:
                raise TypeError(f"fill_input_ids: {what} must be a contiguous 1-D int32 array")
        if src_rows.shape[0] < n:
            raise ValueError(f"fill_input_ids: {src_rows.shape[0]} src_rows for {n} input ids")
        self._launch("fill_input_ids", (_cdiv(n, 256),), (256,),
                     (input_ids, prev_tokens, src_rows, _i32(n), _i32(prev_tokens.shape[0])))

    def advance_blocks(self, input_ids, positions, slot_mapping, seq_lens, sample_pos, block_tables,
                       block_size: int, tokens, accepted, row, drafts, base, limit, n: int, first: int,
                       count: int) -> None:
        """A drafting step's blocks moved past the drafts the verification accepted, on the device
        (cuda/rows.cu advance_blocks); twin of NumpyBackend.advance_blocks. B = row.shape[0] blocks
        of n rows."""
        B = row.shape[0]
        if B == 0:
            return
        arrays = ((input_ids, "input_ids"), (positions, "positions"), (slot_mapping, "slot_mapping"),
                  (seq_lens, "seq_lens"), (sample_pos, "sample_pos"), (tokens, "tokens"),
                  (accepted, "accepted"), (row, "row"), (drafts, "drafts"), (base, "base"), (limit, "limit"))
        for a, what in arrays:
            if a.dtype != np.int32 or a.ndim != 1 or a.strides[0] != 4:
                raise TypeError(f"advance_blocks: {what} must be a contiguous 1-D int32 array")
        if (block_tables.dtype != np.int32 or block_tables.ndim != 2 or not block_tables.flags.c_contiguous
                or block_tables.shape[0] < B):
            raise TypeError(f"advance_blocks: block_tables must be contiguous int32 [>= {B}, blocks]")
        if (min(input_ids.shape[0], positions.shape[0], slot_mapping.shape[0]) < B * n
                or seq_lens.shape[0] < B or sample_pos.shape[0] < B * count or tokens.shape[0] != accepted.shape[0]
                or min(drafts.shape[0], base.shape[0], limit.shape[0]) < B or not 0 <= first <= first + count <= n):
            raise ValueError(f"advance_blocks: {B} blocks of {n} rows (window {first}+{count}) do not fit its arrays")
        self._launch("advance_blocks", (_cdiv(B * n, 256),), (256,),
                     (input_ids, positions, slot_mapping, seq_lens, sample_pos, block_tables,
                      _i32(block_tables.shape[1]), _i32(block_size), tokens, accepted,
                      _i32(tokens.shape[0]), row, drafts, base, limit, _i32(B), _i32(n), _i32(first), _i32(count)))

    # ---- norms, activation --------------------------------------------------------------
    def rms_norm(self, x, w, eps: float, out, residual=None) -> None:
        rows, xs = _rows(x, "rms_norm x")
        if rows == 0:
            return
        _, os_ = _rows(out, "rms_norm out")
        rs = _rows(residual, "rms_norm residual")[1] if residual is not None else 0
        N = x.shape[-1]
        sfx = _suffix(x.dtype)
        chunks = N // 8
        ptrs = [a.data.ptr for a in (x, w, out) + ((residual,) if residual is not None else ())]
        if (sfx == "bf16" and N % 8 == 0 and chunks <= 1024 and all(p % 16 == 0 for p in ptrs)
                and all(st % 8 == 0 for st in (xs, os_, rs))):  # 16-byte rows: registers + vector I/O
            threads = 128 if chunks <= 128 else 256
            c = 1 if chunks <= threads else 2 if chunks <= 2 * threads else 4
            self._launch(
                f"rms_norm_vec{c}_bf16", (rows,), (threads,),
                (x, _i64(xs), residual if residual is not None else _NULL, _i64(rs), w,
                 np.float32(eps), out, _i64(os_), _i32(N), _i32(rows)),
            )
            return
        threads = 128 if N <= 1024 else 256 if N <= 4096 else 512
        self._launch(
            "rms_norm_" + sfx, (rows,), (threads,),
            (x, _i64(xs), residual if residual is not None else _NULL, _i64(rs), w,
             np.float32(eps), out, _i64(os_), _i32(N), _i32(rows)),
        )

    @staticmethod
    def _check_qk_rope(what: str, q, k, positions, cos_sin) -> None:
        D = q.shape[2]
        if q.strides[2] != q.itemsize or k.strides[2] != k.itemsize or D % 2 or D > 512:
            raise ValueError(f"{what}: heads must be contiguous with an even head_dim <= 512")
        if cos_sin.dtype != np.float32 or cos_sin.shape[1] != D:
            raise TypeError(f"{what}: cos_sin must be float32 [max_pos, head_dim]")
        if positions.dtype != np.int32:
            raise TypeError(f"{what}: positions must be int32, got {positions.dtype}")

    def qk_norm_rope(self, q, k, q_w, k_w, eps: float, positions, cos_sin) -> None:
        T, H, D = q.shape
        KH = k.shape[1]
        if T == 0:
            return
        self._check_qk_rope("qk_norm_rope", q, k, positions, cos_sin)
        it = q.itemsize
        self._launch(
            "qk_norm_rope_" + _suffix(q.dtype), (T, _qk_grid_y(T, H + KH)), (128,),
            (q, _i64(q.strides[0] // it), _i64(q.strides[1] // it), k, _i64(k.strides[0] // it),
             _i64(k.strides[1] // it), q_w if q_w is not None else _NULL,
             k_w if k_w is not None else _NULL, np.float32(eps), positions, cos_sin,
             _i32(cos_sin.shape[0]), _i32(T), _i32(H), _i32(KH), _i32(D)),
        )

    def qk_norm_rope_store_kv(self, q, k, v, q_w, k_w, eps: float, positions, cos_sin, k_cache,
                              v_cache, slot_mapping) -> None:
        """qk_norm_rope then store_kv in one launch (cuda/norm.cu); k is still updated in place."""
        T, H, D = q.shape
        KH = k.shape[1]
        if T == 0:
            return
        self._check_store_kv("qk_norm_rope_store_kv", q, k, v, positions, cos_sin, k_cache, v_cache,
                             slot_mapping)
        it = q.itemsize
        self._launch(
            "qk_norm_rope_store_kv_" + _suffix(q.dtype), (T, _qk_grid_y(T, H + 2 * KH)), (128,),
            (q, _i64(q.strides[0] // it), _i64(q.strides[1] // it), k, _i64(k.strides[0] // it),
             _i64(k.strides[1] // it), v, _i64(v.strides[0] // it), _i64(v.strides[1] // it),
             q_w if q_w is not None else _NULL, k_w if k_w is not None else _NULL, np.float32(eps),
             positions, cos_sin, _i32(cos_sin.shape[0]), k_cache, v_cache, slot_mapping,
             _i64(k_cache.shape[0] * k_cache.shape[1]), _i32(T), _i32(H), _i32(KH), _i32(D)),
        )

    def _check_store_kv(self, what: str, q, k, v, positions, cos_sin, k_cache, v_cache,
                        slot_mapping) -> None:
        T, H, D = q.shape
        KH = k.shape[1]
        self._check_qk_rope(what, q, k, positions, cos_sin)
        if v.shape != k.shape or v.strides[2] != v.itemsize:
            raise ValueError(f"{what}: v {v.shape} must have k's shape {k.shape}, heads contiguous")
        if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
            raise ValueError(f"{what}: caches must be contiguous [num_blocks, block_size, KH, D]")
        if k_cache.shape[2:] != (KH, D) or v_cache.shape != k_cache.shape:
            raise ValueError(f"{what}: caches {k_cache.shape} / {v_cache.shape} do not hold "
                             f"{KH} heads of {D}")
        if not (q.dtype == k.dtype == v.dtype == k_cache.dtype == v_cache.dtype):
            raise TypeError(f"{what}: q/k/v {q.dtype}/{k.dtype}/{v.dtype} and caches "
                            f"{k_cache.dtype}/{v_cache.dtype} differ")
        if slot_mapping.dtype != np.int32:
            raise TypeError(f"{what}: slot_mapping must be int32, got {slot_mapping.dtype}")

    def silu_mul(self, gate_up, out) -> None:
        rows, gs = _rows(gate_up, "silu_mul gate_up")
        if rows == 0:
            return
        _, os_ = _rows(out, "silu_mul out")
        F = out.shape[-1]
        if (out.dtype == gate_up.dtype == BF16 and F % 8 == gs % 8 == os_ % 8 == 0
                and gate_up.data.ptr % 16 == out.data.ptr % 16 == 0):
            self._launch("silu_mul_bf16_vec8", (rows, _cdiv(F, 8 * 128)), (128,),
                         (gate_up, _i64(gs), out, _i64(os_), _i32(F), _i32(rows)))
            return
        self._launch("silu_mul_" + _suffix(out.dtype), (rows, min(64, -(-F // 256))), (256,),
                     (gate_up, _i64(gs), out, _i64(os_), _i32(F), _i32(rows)))

    # ---- logits transforms ------------------------------------------------------------------
    def _scale_softcap(self, x, factor: float, cap: float) -> None:
        rows, stride = _rows(x, "logits")
        if rows == 0:
            return
        cols = x.size // rows
        self._launch("scale_softcap_" + _suffix(x.dtype), (rows, min(64, _cdiv(cols, 256))), (256,),
                     (x, _i64(stride), _i32(rows), _i32(cols), np.float32(factor), np.float32(cap)))

    def scale(self, x, factor: float) -> None:
        self._scale_softcap(x, factor, 0.0)

    def softcap(self, x, cap: float) -> None:
        """x = tanh(x / cap) * cap, in place."""
        if not cap > 0:
            raise ValueError(f"softcap needs a positive cap, got {cap}")
        self._scale_softcap(x, 1.0, cap)

    # ---- DFlash2 drafters (cuda/dflash2.cu) ---------------------------------------------------
    def grouped_causal_conv(self, x, base, dyn, half: int, group_size: int, block_rows: int, out) -> None:
        """Twin of NumpyBackend.grouped_causal_conv: x, out [T, C]; base [ks, C] (contiguous); dyn
        [T, 2 * ks * G], G = C / group_size; T a multiple of block_rows. One storage dtype for all.
        out may not overlap x (the kernel reads earlier rows of x while writing out)."""
        what = "grouped_causal_conv"
        if x.ndim != 2 or out.shape != x.shape:
            raise ValueError(f"{what}: x {x.shape} and out {out.shape} must be the same [T, C]")
        T, C = x.shape
        if T == 0:
            return
        _, xs = _rows(x, what + " x")
        _, os_ = _rows(out, what + " out")
        if base.ndim != 2 or base.shape[1] != C or not base.flags.c_contiguous:
            raise ValueError(f"{what}: base {base.shape} must be a contiguous [ks, {C}]")
        ks = base.shape[0]
        if ks < 1 or group_size < 1 or C % group_size or block_rows < 1 or T % block_rows or half not in (0, 1):
            raise ValueError(f"{what}: needs ks >= 1 (got {ks}), C={C} a multiple of group_size={group_size}, "
                             f"T={T} a multiple of block_rows={block_rows}, half 0 or 1 (got {half})")
        G = C // group_size
        if dyn.ndim != 2 or dyn.shape != (T, 2 * ks * G):
            raise ValueError(f"{what}: dyn {dyn.shape} must be [T, 2 * ks * G] = {(T, 2 * ks * G)}")
        _, ds = _rows(dyn, what + " dyn")
        if not (x.dtype == base.dtype == dyn.dtype == out.dtype):
            raise TypeError(f"{what}: x/base/dyn/out {x.dtype}/{base.dtype}/{dyn.dtype}/{out.dtype} differ")
        it = x.itemsize
        x_end = x.data.ptr + ((T - 1) * xs + C) * it
        out_end = out.data.ptr + ((T - 1) * os_ + C) * it
        if x.data.ptr < out_end and out.data.ptr < x_end:
            raise ValueError(f"{what}: out overlaps x; it cannot run in place")
        self._launch("grouped_causal_conv_" + _suffix(x.dtype), (T, min(64, _cdiv(C, 256))), (256,),
                     (x, _i64(xs), base, dyn, _i64(ds), out, _i64(os_), _i32(C), _i32(ks), _i32(half),
                      _i32(group_size), _i32(block_rows)))

    def dflash2_select(self, logits, hproj, input_ids, block_rows: int, k: int, pred, succ, top_k: int,
                       cand_ids, cand_vals, out) -> None:
        """Twin of NumpyBackend.dflash2_select: logits fp32 [rows, V] (rows = S * k); hproj [rows,
        rank]; pred, succ contiguous [vocab >= V, rank] (hproj's dtype); input_ids int32 (block s's
        anchor at s * block_rows); cand_ids int32 / cand_vals fp32 [rows, top_k]; out int32 [rows].
        Two launches: dflash2_topk (a CTA a row: the candidates) then dflash2_path (a CTA a block)."""
        what = "dflash2_select"
        max_top_k, max_rank = self.dflash2_limits
        if logits.ndim != 2:
            raise ValueError(f"{what}: logits {logits.shape} must be [rows, V]")
        rows, V = logits.shape
        if rows == 0:
            return
        _, ls = _rows(logits, what + " logits")
        if k < 1 or rows % k:
            raise ValueError(f"{what}: {rows} logits rows are not blocks of k={k}")
        S = rows // k
        if not 1 <= top_k <= min(max_top_k, V):
            raise ValueError(f"{what}: top_k={top_k} must be 1 to min({max_top_k}, V={V})")
        if hproj.ndim != 2 or hproj.shape[0] != rows:
            raise ValueError(f"{what}: hproj {hproj.shape} must be [rows={rows}, rank]")
        rank = hproj.shape[1]
        if not 1 <= rank <= max_rank:
            raise ValueError(f"{what}: rank {rank} must be 1 to {max_rank}")
        _, hs = _rows(hproj, what + " hproj")
        if pred.shape != succ.shape or pred.ndim != 2 or pred.shape[1] != rank or pred.shape[0] < V:
            raise ValueError(f"{what}: pred {pred.shape} and succ {succ.shape} must both be [vocab >= {V}, {rank}]")
        if not (pred.flags.c_contiguous and succ.flags.c_contiguous):
            raise ValueError(f"{what}: pred and succ must be contiguous")
        if not (hproj.dtype == pred.dtype == succ.dtype):
            raise TypeError(f"{what}: hproj/pred/succ {hproj.dtype}/{pred.dtype}/{succ.dtype} differ")
        if input_ids.ndim != 1 or input_ids.shape[0] <= (S - 1) * block_rows or block_rows < 1:
            raise ValueError(f"{what}: input_ids {input_ids.shape} must hold the anchors at s * block_rows "
                             f"(block_rows={block_rows}) for {S} blocks")
        if cand_ids.shape != (rows, top_k) or cand_vals.shape != (rows, top_k) or out.shape != (rows,):
            raise ValueError(f"{what}: cand_ids {cand_ids.shape} / cand_vals {cand_vals.shape} must be "
                             f"{(rows, top_k)} and out {out.shape} ({rows},)")
        _, cis = _rows(cand_ids, what + " cand_ids")
        _, cvs = _rows(cand_vals, what + " cand_vals")
        _rows(input_ids, what + " input_ids")
        _rows(out, what + " out")
        for a, dt, n in ((logits, np.float32, "logits"), (input_ids, np.int32, "input_ids"),
                         (cand_ids, np.int32, "cand_ids"), (cand_vals, np.float32, "cand_vals"),
                         (out, np.int32, "out")):
            if a.dtype != dt:
                raise TypeError(f"{what}: {n} must be {np.dtype(dt)}, got {a.dtype}")
        self._launch("dflash2_topk", (rows,), (512,),
                     (logits, _i64(ls), _i32(V), _i32(top_k), cand_ids, _i64(cis), cand_vals, _i64(cvs)))
        self._launch("dflash2_path_" + _suffix(hproj.dtype), (S,), (512,),
                     (cand_vals, _i64(cvs), cand_ids, _i64(cis), hproj, _i64(hs), pred, succ,
                      _i32(pred.shape[0]), _i32(rank), input_ids, _i32(block_rows), _i32(k), _i32(top_k), out))

    def suppress_tokens(self, logits, rows, token_ids) -> None:
        """logits[rows[i], token_ids[i]] = -inf; rows/token_ids may be host or device int32."""
        n = int(rows.shape[0])
        if n == 0:
            return
        if isinstance(rows, np.ndarray) or isinstance(token_ids, np.ndarray):
            if n > self._idx_scratch.shape[1]:
                raise ValueError(f"suppress_tokens: {n} entries, at most {self._idx_scratch.shape[1]}")
            self.copy_from_host(self._idx_scratch[0, :n], np.asarray(rows, np.int32))
            self.copy_from_host(self._idx_scratch[1, :n], np.asarray(token_ids, np.int32))
            rows, token_ids = self._idx_scratch[0, :n], self._idx_scratch[1, :n]
        R, stride = _rows(logits, "suppress_tokens logits")
        self._launch("suppress_tokens_" + _suffix(logits.dtype), (_cdiv(n, 256),), (256,),
                     (logits, _i64(stride), rows, token_ids, _i32(n), _i32(R),
                      _i32(logits.shape[-1])))

    def mask_logits(self, logits, rows, bitmask) -> None:
        """Twin of NumpyBackend.mask_logits; rows and the bitmask come from the host and go through
        the preallocated scratch (the rows in its first row, the words in its second), as many
        mask rows at a time as fit."""
        R, stride = _rows(logits, "mask_logits logits")
        n, words = bitmask.shape
        cap = self._idx_scratch.shape[1]
        if words > cap:
            raise ValueError(f"mask_logits: {words} words a row, at most {cap}")
        per, V = cap // words, logits.shape[-1]
        for lo in range(0, n, per):
            hi = min(n, lo + per)
            m = hi - lo
            self.copy_from_host(self._idx_scratch[0, :m], np.asarray(rows[lo:hi], np.int32))
            self.copy_from_host(self._idx_scratch[1, : m * words],
                                np.ascontiguousarray(bitmask[lo:hi], np.int32).reshape(-1))
            self._launch("mask_logits_" + _suffix(logits.dtype), (_cdiv(V, 256), m), (256,),
                         (logits, _i64(stride), self._idx_scratch[0, :m], self._idx_scratch[1, : m * words],
                          _i32(words), _i32(R), _i32(V)))

    def penalize_logits(self, logits, rows, token_ids, scale_pos, scale_neg, subtract) -> None:
        """Twin of NumpyBackend.penalize_logits; the entries come from the host (NumPy arrays) and
        go through the preallocated scratch, 65,536 at a time."""
        R, stride = _rows(logits, "penalize_logits logits")
        cap = self._idx_scratch.shape[1]
        for lo in range(0, int(rows.shape[0]), cap):
            hi = min(int(rows.shape[0]), lo + cap)
            n = hi - lo
            self.copy_from_host(self._idx_scratch[0, :n], np.asarray(rows[lo:hi], np.int32))
            self.copy_from_host(self._idx_scratch[1, :n], np.asarray(token_ids[lo:hi], np.int32))
            for j, a in enumerate((scale_pos, scale_neg, subtract)):
                self.copy_from_host(self._val_scratch[j, :n], np.asarray(a[lo:hi], np.float32))
            self._launch("penalize_logits_" + _suffix(logits.dtype), (_cdiv(n, 256),), (256,),
                         (logits, _i64(stride), self._idx_scratch[0, :n], self._idx_scratch[1, :n],
                          self._val_scratch[0, :n], self._val_scratch[1, :n], self._val_scratch[2, :n],
                          _i32(n), _i32(R), _i32(logits.shape[-1])))

    # ---- matmul -------------------------------------------------------------------------
    def matmul(self, x, w, out, bias=None) -> None:
        """out = x @ w.T (+ bias), w [out_features, in_features], fp32 sums: cuda/gemv.cu for up to
        _SKINNY_MAX_M bf16 rows (small_product_kernel: its GEMV or its tensor-core skinny GEMMs), cuBLAS beyond
        (or cuda/gemm.cu for 17-256 rows under MINILLM_GEMM=wide: wide_product_plan; under
        MINILLM_GEMM=own the skinny kernels take every product of 5-32 rows they can)."""
        M, ldx = _rows(x, "matmul x")
        N, K = w.shape
        if M == 0:
            return
        _, ldo = _rows(out, "matmul out")
        if x.shape[-1] != K or out.shape[-1] != N or out.shape[0] != M or not w.flags.c_contiguous:
            raise ValueError(f"matmul: x {x.shape} @ w {w.shape}.T -> out {out.shape} does not fit")
        kernel = small_product_kernel(M, N, K) if self._gemv_fits(x, w, out, bias, M, K, ldx) else None
        if (kernel is None and self.own_gemm and K % _SKINNY_K == 0
                and self._gemv_fits(x, w, out, bias, M, K, ldx, max_m=_SKINNY_KERNEL_MAX_M)):
            kernel = "gemv" if M <= _GEMV_MAX_M else "skinny"
        if kernel == "gemv" and M == 1 and out.dtype == self.dtype:
            plan = self._stage_plan(N, K, False)
            if plan is not None:
                grid, rpc, smem = plan
                self._launch("gemv1_stage_bf16", (grid,), (_GEMV_THREADS,),
                             (x, w, bias if bias is not None else _NULL, out, _i32(N), _i32(K), _i32(rpc)),
                             shared_mem=smem)
                return
        if kernel == "gemv":  # one row: its own kernels (cuda/gemv.cu's staged loads)
            rows = () if M == 1 else (_i32(M),)
            name = (one_row_product_kernel(N, K, out.dtype == np.float32, self.num_sms, self.gemv1_deep_min_k,
                                           bool(self.gemv1_pre))
                    if M == 1 else "gemv_" + _suffix(out.dtype))
            self._launch(name, (_cdiv(N, _GEMV_COLS_PER_CTA),),
                         (_GEMV_THREADS,), (x, _i64(ldx), w, bias if bias is not None else _NULL, out, _i64(ldo))
                         + rows + (_i32(N), _i32(K)))
            return
        if kernel == "skinny":
            prefix, threads = skinny_product_launch(M, N, self.num_sms, bool(self.skinny2_w4))
            self._launch(prefix + _suffix(out.dtype), (_cdiv(N, _SKINNY_COLS_PER_CTA),),
                         (threads,), (x, _i64(ldx), w, bias if bias is not None else _NULL, out,
                                      _i64(ldo), _i32(M), _i32(N), _i32(K)))
            return
        plan = (wide_product_plan(M, N, K, self.num_sms) if self.wide_gemm and out.dtype == self.dtype
                and self._gemv_fits(x, w, out, bias, M, K, ldx, max_m=_WIDE_MAX_M) else None)
        if plan is not None:
            mt, sp = plan
            self._launch(self._wide_kernel(mt, sp), (N // _GW_BN, sp), (_GW_THREADS,),
                         (x, _i64(ldx), w, bias if bias is not None else _NULL, out, _i64(ldo), _i32(M),
                          _i32(N), _i32(K)), shared_mem=wide_gemm_smem(mt))
            return
        beta = 0.0
        if bias is not None:  # out <- bias, then GEMM with beta = 1: a single rounding
            name = f"fill_bias_{_suffix(out.dtype)}_{_suffix(bias.dtype)}"
            self._launch(name, (M, min(64, -(-N // 256))), (256,),
                         (out, _i64(ldo), bias, _i32(N), _i32(M)))
            beta = 1.0
        elif self.mark_blas_outputs:
            # compute-sanitizer's initcheck does not see cuBLAS's writes (scripts/initcheck_probe.py:
            # every read of a GEMM's output is reported, values right), so under it the output is
            # zeroed first, a write it does see; the GEMM (beta = 0) then overwrites every element
            self._zero_rows(out, M, N, ldo)
        if self._capturing:
            self.captured_launches["cublas"] += 1
        with self.stream:
            self.blas.gemm_xwt(M, N, K, x.data.ptr, cuda_dtype(x.dtype), ldx, w.data.ptr,
                               cuda_dtype(w.dtype), K, out.data.ptr, cuda_dtype(out.dtype), ldo, beta)

    def _load_on_demand(self, name: str, module: str, kernel: str, smem: int, defines: tuple = ()) -> str:
        """Compile and load a PDL kernel of an opt-in path the first time it is asked for, with
        smem bytes of dynamic shared memory allowed; returns the name it is launched by."""
        if name not in self.k:
            kern = kc.get_kernel(module, kernel, self.debug, defines)
            kern.max_dynamic_shared_size_bytes = smem
            if self.carveout is not None:
                kern.preferred_shared_memory_carveout = self.carveout
            self.k[name] = kern
            self._pdl_kernels.add(name)
        return name

    def _decode_group(self, sfx: str, D: int) -> dict:
        """cuda/decode_attention.cu's kernels for one storage type and head dim, from a module of their own
        (_decode_defines): a quarter of the file's instantiations, ~10 of its ~34 s of nvcc."""
        names = decode_group_names(sfx, D)
        self._pdl_kernels.update(names)
        return {n: kc.get_kernel("decode_attention", n, self.debug, _decode_defines(sfx, D)) for n in names}

    def _decode_kernel(self, name: str, sfx: str, D: int) -> str:
        """name, its storage type and head dim's module loaded first where a start did not (a bf16 backend
        given fp32 arrays); never inside a graph capture, which cannot record a module load."""
        if name not in self.k:
            if self._capturing:
                raise RuntimeError(f"{name} was first asked for inside a graph capture; run the step eagerly "
                                   "once before capturing it (its module loads then)")
            for n, kern in self._decode_group(sfx, D).items():
                if self.carveout is not None:
                    kern.preferred_shared_memory_carveout = self.carveout
                self.k[n] = kern
        return name

    def _wide_kernel(self, mt: int, sp: int) -> str:
        """cuda/gemm.cu's instance for (MT, S), loaded on first use; the first product of 17-256
        rows should run eagerly (not while a graph is captured)."""
        name = f"gemm_wx_m{mt}_s{sp}"
        return self._load_on_demand(name, "gemm", name, wide_gemm_smem(mt))

    def _zero_rows(self, out, M: int, N: int, ldo: int) -> None:
        """Zero the [M, N] rows of out (row stride ldo elements) with memsets, whatever the dtype."""
        rt, it = self.cp.cuda.runtime, out.itemsize
        if ldo == N:
            rt.memsetAsync(out.data.ptr, 0, M * N * it, self.stream.ptr)
            return
        for m in range(M):
            rt.memsetAsync(out.data.ptr + m * ldo * it, 0, N * it, self.stream.ptr)

    def matmul_silu_mul(self, x, w_gate_up, out, gate_up) -> None:
        """out = silu(x @ gate.T) * (x @ up.T), w_gate_up = [gate; up] [2F, K]. Few bf16 rows: one
        cuda/gemv.cu kernel that leaves gate_up unwritten (gated_product_kernel); else matmul into
        gate_up, silu_mul."""
        M, ldx = _rows(x, "matmul_silu_mul x")
        if M == 0:
            return
        N2, K = w_gate_up.shape
        F = N2 // 2
        _, ldo = _rows(out, "matmul_silu_mul out")
        if (N2 % 2 or x.shape[-1] != K or out.shape != (M, F) or gate_up.shape != (M, N2)
                or not w_gate_up.flags.c_contiguous):
            raise ValueError(f"matmul_silu_mul: x {x.shape} @ w {w_gate_up.shape}.T -> gate_up "
                             f"{gate_up.shape} -> out {out.shape} does not fit")
        kernel = (gated_product_kernel(M, F, K) if out.dtype == self.dtype
                  and self._gemv_fits(x, w_gate_up, out, None, M, K, ldx) else None)
        plan = self._stage_plan(F, K, True) if kernel == "gemv" and M == 1 else None
        if plan is not None:
            grid, rpc, smem = plan
            self._launch("gemv1_stage_silu_mul_bf16", (grid,), (_GEMV_THREADS,),
                         (x, w_gate_up, out, _i32(F), _i32(K), _i32(rpc)), shared_mem=smem)
            return
        if kernel == "gemv":
            rows = () if M == 1 else (_i32(M),)
            # gate and up rows on different warps: half the columns a CTA
            split = M <= self.gated_split_max_m
            name = ("gemv1_" if M == 1 else "gemv_") + ("silu_mul_split_bf16" if split else "silu_mul_bf16")
            self._launch(name, (_cdiv(F, _GEMV_COLS_PER_CTA // 2 if split else _GEMV_COLS_PER_CTA),),
                         (_GEMV_THREADS,), (x, _i64(ldx), w_gate_up, out, _i64(ldo)) + rows + (_i32(F), _i32(K)))
            return
        if kernel == "skinny":
            prefix, threads = skinny_product_launch(M, F, self.num_sms, False, gated=True)
            self._launch(prefix + "silu_mul_bf16", (_cdiv(F, _SKINNY_COLS_PER_CTA),), (threads,),
                         (x, _i64(ldx), w_gate_up, out, _i64(ldo), _i32(M), _i32(F), _i32(K)))
            return
        self.matmul(x, w_gate_up, out=gate_up)
        self.silu_mul(gate_up, out=out)

    # ---- a layer's RMSNorm folded into the one-row product after it -----------------------
    def folds_norms(self, rows: int, hidden: int) -> bool:
        """Whether steps of `rows` rows run each layer's RMSNorms inside the products after them
        (rms_norm_matmul / rms_norm_matmul_silu_mul, cuda/gemv.cu's norm_row): one bf16 row of at
        most MINILLM_FOLD_NORMS_MAX_K values (default 1,024; the kernels take up to 4,096)."""
        return (rows == 1 and self.dtype != np.float32 and hidden % 8 == 0 and hidden <= self.fold_norms_max_k
                and norm_fold_chunks(hidden) is not None)

    def _norm_fold_args(self, what: str, x, residual, norm_w, w, residual_out, K: int):
        """The folded-norm kernels' row arguments, or None where they do not apply (the caller then
        runs rms_norm and the product)."""
        rows = [a for a in (x, residual, residual_out) if a is not None]
        if residual is not None and residual_out is not None and residual.data.ptr == residual_out.data.ptr:
            raise ValueError(f"{what}: residual_out must not be residual (every CTA reads residual)")
        if (not self.folds_norms(x.shape[0], K) or x.shape[-1] != K or norm_w.shape != (K,)
                or any(a.dtype != self.dtype or a.shape != (1, K) or a.data.ptr % 16 for a in rows)
                or norm_w.dtype != self.dtype or norm_w.data.ptr % 16 or w.dtype != self.dtype
                or w.data.ptr % 16 or not w.flags.c_contiguous):
            return None
        return (x, residual if residual is not None else _NULL, norm_w)

    def _norm_then(self, x, residual, norm_w, eps: float, residual_out, normed) -> None:
        """The unfolded path: residual_out <- x + residual, normed = its RMSNorm (residual unchanged)."""
        if residual is None:
            self.rms_norm(x, norm_w, eps, out=normed)
            return
        self.copy(residual, out=residual_out)
        self.rms_norm(x, norm_w, eps, out=normed, residual=residual_out)

    def rms_norm_matmul(self, x, residual, norm_w, eps: float, w, out, residual_out, normed, bias=None) -> None:
        """out = (rms_norm(x [+ residual]) * norm_w) @ w.T (+ bias); with residual, residual_out <-
        x + residual (rounded), residual unchanged. One row on the folded kernel (normed left
        unwritten), else rms_norm then matmul through normed."""
        N, K = w.shape
        if out.shape != (x.shape[0], N) or (residual is not None and residual_out is None):
            raise ValueError(f"rms_norm_matmul: x {x.shape} @ w {w.shape}.T -> out {out.shape} does not fit "
                             "(or residual without residual_out)")
        if x.dtype != self.dtype:  # the split MLP's sums (rms_norm_mlp_split), read by the staged product
            self._rms_norm_matmul_acc(x, residual, norm_w, eps, w, out, residual_out, bias)
            return
        a = self._norm_fold_args("rms_norm_matmul", x, residual, norm_w, w, residual_out, K)
        if a is None or out.dtype != self.dtype or (bias is not None and bias.dtype != self.dtype):
            self._norm_then(x, residual, norm_w, eps, residual_out, normed)
            self.matmul(normed, w, out=out, bias=bias)
            return
        tail = (np.float32(eps), residual_out if residual is not None else _NULL, w,
                bias if bias is not None else _NULL, out, _i32(N), _i32(K))
        plan = self._stage_plan(N, K, False)
        if plan is not None:
            grid, rpc, smem = plan
            self._launch(f"gemv1_stage_norm{norm_fold_chunks(K)}_bf16", (grid,), (_GEMV_THREADS,),
                         a + tail + (_i32(rpc),), shared_mem=smem)
            return
        self._launch(f"gemv1_norm{norm_fold_chunks(K)}_bf16", (_cdiv(N, _GEMV_COLS_PER_CTA),), (_GEMV_THREADS,),
                     a + tail)

    def rms_norm_matmul_silu_mul(self, x, residual, norm_w, eps: float, w_gate_up, out, residual_out, normed,
                                 gate_up) -> None:
        """out = silu(n @ gate.T) * (n @ up.T) for n = rms_norm(x [+ residual]) * norm_w; with
        residual, residual_out <- x + residual (rounded), residual unchanged. One row on the folded
        kernel (normed and gate_up left unwritten), else rms_norm then matmul_silu_mul."""
        N2, K = w_gate_up.shape
        F = N2 // 2
        if N2 % 2 or out.shape != (x.shape[0], F) or (residual is not None and residual_out is None):
            raise ValueError(f"rms_norm_matmul_silu_mul: x {x.shape} @ w {w_gate_up.shape}.T -> out {out.shape} "
                             "does not fit (or residual without residual_out)")
        a = self._norm_fold_args("rms_norm_matmul_silu_mul", x, residual, norm_w, w_gate_up, residual_out, K)
        if a is None or out.dtype != self.dtype:
            self._norm_then(x, residual, norm_w, eps, residual_out, normed)
            self.matmul_silu_mul(normed, w_gate_up, out=out, gate_up=gate_up)
            return
        tail = (np.float32(eps), residual_out if residual is not None else _NULL, w_gate_up, out, _i32(F), _i32(K))
        plan = self._stage_plan(F, K, True)
        if plan is not None:
            grid, rpc, smem = plan
            self._launch(f"gemv1_stage_silu_mul_norm{norm_fold_chunks(K)}_bf16", (grid,), (_GEMV_THREADS,),
                         a + tail + (_i32(rpc),), shared_mem=smem)
            return
        self._launch(f"gemv1_silu_mul_split_norm{norm_fold_chunks(K)}_bf16", (_cdiv(F, _GEMV_COLS_PER_CTA // 2),),
                     (_GEMV_THREADS,), a + tail)

    # ---- a layer's MLP as one kernel, its down sums split across CTAs (cuda/gemv.cu's gemv1_mlp_split) ----
    def mlp_split_dtype(self, hidden: int, intermediate: int, qkv_rows: int, num_layers: int):
        """The dtype of ws.mlp_acc's rows (the split MLP's sums) where one-row steps run each layer's MLP but
        the last as rms_norm_mlp_split (MINILLM_MLP_SPLIT), else None: the norms folded, both kernels' plans
        fitting (the next layer's qkv product staged, NORM 1), and 3+ layers (the ring's rows: the Transformer)."""
        if (self.mlp_split == 0 or num_layers < 3 or not self.folds_norms(1, hidden)
                or norm_fold_chunks(hidden) != 1 or self.gemv1_stage == 0
                or mlp_split_plan(intermediate, hidden, self.num_sms, self.max_smem, self.mlp_split == 4) is None
                or gemv1_stage_plan(qkv_rows, hidden, False, self.num_sms, self.max_smem) is None):
            return None
        return _MLP_SPLIT_DTYPE[self.mlp_split]

    def rms_norm_mlp_split(self, x, residual, norm_w, eps: float, w_gate_up, w_down, acc, zero,
                           residual_out) -> None:
        """acc += (silu(n @ gate.T) * (n @ up.T)) @ w_down.T for n = rms_norm(x + residual) * norm_w, one row;
        residual_out <- x + residual (rounded); zero[:] = 0 (after the kernel before this one finished: the
        ring row the last product read). acc / zero: [1, K] rows of mlp_split_dtype's type."""
        N2, K = w_gate_up.shape
        F = N2 // 2
        plan = mlp_split_plan(F, K, self.num_sms, self.max_smem, self.mlp_split == 4)
        rows = (x, residual, residual_out)
        down_shape = (F, K) if self.mlp_split >= 3 else (K, F)
        if (plan is None or self.mlp_split == 0 or N2 % 2 or w_down.shape != down_shape or norm_w.shape != (K,)
                or any(a.dtype != self.dtype or a.shape != (1, K) or a.data.ptr % 16 for a in rows)
                or acc.dtype != _MLP_SPLIT_DTYPE[self.mlp_split] or acc.shape != (1, K) or zero.shape != (1, K)
                or zero.dtype != acc.dtype or acc.data.ptr % 16 or zero.data.ptr % 16
                or acc.data.ptr == zero.data.ptr or residual.data.ptr == residual_out.data.ptr
                or not (w_gate_up.flags.c_contiguous and w_down.flags.c_contiguous)):
            raise ValueError(f"rms_norm_mlp_split: x {x.shape} {x.dtype}, gate_up {w_gate_up.shape}, down "
                             f"{w_down.shape}, acc {acc.shape} {acc.dtype}: not a one-row split MLP this "
                             "backend runs (mlp_split_dtype says which)")
        grid, rpc, smem, bound = plan
        self._launch(f"gemv1_mlp_split_{_MLP_SPLIT_KERNEL[self.mlp_split]}_r{bound}_bf16", (grid,),
                     (_GEMV_THREADS,), (x, residual, norm_w, np.float32(eps), residual_out, w_gate_up, w_down,
                                        acc, zero, _i32(F), _i32(K), _i32(rpc)), shared_mem=smem)

    def _rms_norm_matmul_acc(self, x, residual, norm_w, eps: float, w, out, residual_out, bias) -> None:
        """rms_norm_matmul of a split MLP's sums x (fp32 or fixed-point int64) and a residual, on the staged
        product that reads them (gemv1_stage_norm1_acc_*)."""
        N, K = w.shape
        names = {dt: a for a, dt in _MLP_SPLIT_ACC.values()}
        plan = gemv1_stage_plan(N, K, False, self.num_sms, self.max_smem)
        if (x.dtype.type not in names or plan is None or residual is None or norm_fold_chunks(K) != 1
                or x.shape != (1, K) or x.data.ptr % 16 or out.dtype != self.dtype
                or any(a.dtype != self.dtype or a.shape != (1, K) or a.data.ptr % 16 for a in (residual, residual_out))
                or residual.data.ptr == residual_out.data.ptr or norm_w.dtype != self.dtype
                or (bias is not None and bias.dtype != self.dtype) or not w.flags.c_contiguous):
            raise ValueError(f"rms_norm_matmul: x {x.shape} {x.dtype} is not a split MLP's sum row this "
                             f"backend reads into a product of {w.shape} (one row, a residual, K <= 1024)")
        grid, rpc, smem = plan
        self._launch(f"gemv1_stage_norm1_acc_{names[x.dtype.type]}_bf16", (grid,), (_GEMV_THREADS,),
                     (x, residual, norm_w, np.float32(eps), residual_out, w, bias if bias is not None else _NULL,
                      out, _i32(N), _i32(K), _i32(rpc)), shared_mem=smem)

    def _one_row_mode_takes(self, mode: int) -> bool:
        """Whether a one-row product launched now may take the kernels of a _ONE_ROW_MODES switch: 2 leaves
        out the product right after the decode attention, whose copies would slow its merge (part298)."""
        return mode == 1 or (mode == 2 and not self._last_launch.startswith("paged_decode"))

    def _stage_plan(self, N: int, K: int, gated: bool) -> tuple[int, int, int] | None:
        """gemv1_stage_plan under MINILLM_GEMV1_STAGE (None where the switch leaves this product out or the
        share does not fit)."""
        if not self._one_row_mode_takes(self.gemv1_stage):
            return None
        return gemv1_stage_plan(N, K, gated, self.num_sms, self.max_smem)

    def _gemv_fits(self, x, w, out, bias, M: int, K: int, ldx: int, max_m: int | None = None) -> bool:
        """At most max_m rows of bf16 with 16-byte aligned rows: what cuda/gemv.cu's kernels take
        (small_product_kernel chooses among them)."""
        max_m = small_product_max_m() if max_m is None else max_m
        bf = self.dtype if self.dtype != np.float32 else None
        return (bf is not None and M <= max_m and x.dtype == bf and w.dtype == bf and K % 8 == 0
                and x.data.ptr % 16 == 0 and (ldx * x.itemsize) % 16 == 0 and w.data.ptr % 16 == 0
                and out.dtype in (bf, np.float32) and (bias is None or bias.dtype == bf))

    # ---- all decoder layers of a one-token step ------------------------------------------
    def decoder_plan(self, cfg, layers, cos_sin, scale: float):
        """cuda/decode_layers.cu compiled for this model's head shape, its layer pointer table and
        scratch, made once at startup; None where the kernel does not apply (fp32 storage, head dim
        other than 64/128, more than 8 query heads per KV head) and unless MINILLM_FUSED_DECODE=1:
        measured on the H200 it is not faster than the op-by-op CUDA graph yet (0.6B: kernel
        0.95-0.99 ms against ~0.95 ms of layers in the graph; 8B: 6.1 against 4.4;
        docs/BENCHMARKS.md, session 6), so one-token steps run op by op unless asked."""
        D, NQ, NKV, H, F = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size, cfg.intermediate_size
        if (self.dtype == np.float32 or not env_flag("MINILLM_FUSED_DECODE", False, "the one-kernel decoder")
                or D not in (64, 128) or NQ % NKV or NQ // NKV > _DL_MAX_G or H % 8 or F % 8):
            return None
        G, QS, KVS = NQ // NKV, NQ * D, NKV * D
        att = G * D + 2 * D + 2 * _DL_WARPS * G + _DL_WARPS * G * D  # attention_stage's shared scratch
        xs_len = max(H, QS, F, att)
        # the layout at the top of decode_layers(): weight pointers, residual, partial sums, x (fp32
        # and bf16), then the ring at a 128-byte boundary
        fixed = 32 * len(layers) + 4 * (_cdiv(H, 4) * 4 + _DL_RED + _cdiv(xs_len, 4) * 4) + 2 * _cdiv(xs_len, 8) * 8
        fixed = _cdiv(fixed, 128) * 128 + 128  # + the dynamic buffer's own alignment slack
        n_slots, slot_bytes = _dl_ring_shape(self.max_smem - fixed, max(H, QS, F))
        stages = ((QS + 2 * KVS, H, False), (H, QS, False), (F, H, True), (H, F, False))  # qkv, o, gate_up, down
        if n_slots < 2 or any(_dl_stage_red(_cdiv(n, self.num_sms), k, g, slot_bytes) > _DL_RED for n, k, g in stages):
            return None
        ptrs = [a.data.ptr for lw in layers for a in (lw.qkv, lw.o, lw.gate_up, lw.down)]
        if any(p % 16 for p in ptrs):  # the TMA copies need 16-byte aligned rows
            return None
        # more than half an SM's shared memory: one CTA per SM, so every CTA is resident at once
        per_sm = int(self.props.get("sharedMemPerMultiprocessor", 0) or 0)
        smem = max(fixed + n_slots * slot_bytes, per_sm // 2 + 1024)
        if smem > self.max_smem:
            return None
        name = self._load_on_demand(f"decode_layers_d{D}_g{G}", "decode_layers", "decode_layers", smem,
                                    (f"DL_D={D}", f"DL_G={G}"))
        cp = self.cp
        ptr = lambda a: 0 if a is None else a.data.ptr  # noqa: E731
        table = np.array([[ptr(lw.attn_norm), ptr(lw.qkv), ptr(lw.qkv_bias), ptr(lw.q_norm), ptr(lw.k_norm),
                           ptr(lw.o), ptr(lw.mlp_norm), ptr(lw.gate_up), ptr(lw.down)] for lw in layers],
                         dtype=np.uint64)
        with self.arena.label("decode_layers: layer table + scratch"), self.stream:
            plan = _CudaDecoderPlan(
                cfg=cfg, name=name, smem=smem, xs_len=xs_len, n_slots=n_slots, slot_bytes=slot_bytes,
                cos_sin=cos_sin, scale=scale, layers=layers,
                table=cp.asarray(table), qkv=cp.empty(QS + 2 * KVS, dtype=self.dtype),
                attn=cp.empty(QS, dtype=self.dtype), act=cp.empty(F, dtype=self.dtype),
                part=cp.empty(NKV * _DL_MAX_S * G * (D + 2), dtype=np.float32),
                sync=cp.zeros(_DL_SYNC_HEADS + NKV, dtype=np.uint32))  # left zero after each run
        self.stream.synchronize()
        return plan

    def decode_layers(self, plan, residual, hidden, k_cache, v_cache, positions, slot_mapping,
                      block_tables, seq_lens) -> None:
        """Every decoder layer for one new token in one persistent kernel (cuda/decode_layers.cu;
        NumPy twin NumpyBackend.decode_layers): residual holds the embedded token on entry and the
        residual stream before the last down output on exit, hidden that output."""
        c = plan.cfg
        L, nb, bs, KH, D = k_cache.shape
        if (residual.shape[-1] != c.hidden_size or hidden.shape[-1] != c.hidden_size or L != len(plan.layers)
                or KH != c.num_kv_heads or D != c.head_dim or k_cache.shape != v_cache.shape
                or not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous)):
            raise ValueError(f"decode_layers: residual {residual.shape}, hidden {hidden.shape}, caches "
                             f"{k_cache.shape} do not fit the model")
        for a, what in ((positions, "positions"), (slot_mapping, "slot_mapping"), (seq_lens, "seq_lens"),
                        (block_tables, "block_tables")):
            if a.dtype != np.int32:
                raise TypeError(f"decode_layers: {what} must be int32")
        self._launch(plan.name, (self.num_sms,), (_DL_THREADS + 32,),
                     (plan.table, _i32(L), residual, hidden, plan.qkv, plan.attn, plan.act, plan.part,
                      plan.sync, k_cache, v_cache, _i64(nb * bs * KH * D), _i32(nb), positions, slot_mapping,
                      block_tables, _i32(block_tables.shape[-1]), seq_lens, plan.cos_sin,
                      _i32(plan.cos_sin.shape[0]), _i32(c.hidden_size), _i32(c.num_heads), _i32(KH),
                      _i32(c.intermediate_size), _i32(bs), np.float32(c.rms_norm_eps),
                      np.float32(plan.scale * math.log2(math.e)), _i32(plan.xs_len), _i32(plan.n_slots),
                      _i32(plan.slot_bytes),
                      plan.prof if plan.prof is not None else _NULL),
                     shared_mem=plan.smem)

    # ---- attention ----------------------------------------------------------------------
    def paged_attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start,
                        scale: float, out, causal: bool = True, max_query_len: int | None = None,
                        decode_rows=None, short_runs: bool = True) -> None:
        self.attention(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out, causal,
                       max_query_len=max_query_len, decode_rows=decode_rows, short_runs=short_runs)

    def decode_step_attention(self, q, k, v, q_w, k_w, eps: float, positions, cos_sin, k_cache,
                              v_cache, slot_mapping, block_tables, seq_lens, query_start,
                              scale: float, out, order=None, n_splits: int | None = None,
                              o_proj=None, o_out=None) -> dict:
        """qk_norm_rope_store_kv then causal paged_attention, for a step of one new token a
        sequence, in one launch (cuda/decode_attention.cu's paged_decode_rope_*: each CTA rotates
        its own q heads; the one whose split ends at the newest key stores k and v and adds that
        key from shared memory). q and k are not updated in place. Steps of more than
        decode_rope_max_tokens rows, and shapes the decode kernel does not take, run the two ops:
        every CTA rotating its own q heads costs more than the launch it saves once there are
        many CTAs (H200, part75, one machine: a batch-1 step's graph 1.129 -> 1.094 ms, batch 32
        2.327 -> 2.322, batch 128 5.714 -> 5.873). order (optional, [>= T] int32): the rows in
        the order their CTAs should start, longest context first (the runner's launch hint; see
        _decode_attention). o_proj / o_out (optional, together): also o_out = out @ o_proj.T, the
        attention's output projection; a one-row step under MINILLM_O_MERGE then leaves the
        attention's splits to that product to merge (cuda/gemv.cu's gemv1_merge_*: the same bits)."""
        T = q.shape[0]
        if (o_proj is None) != (o_out is None):
            raise ValueError("decode_step_attention: o_proj and o_out go together")
        if T == 0:
            return {}
        if T > self.decode_rope_max_tokens or not self._decode_kernel_fits(q, k_cache, out):
            self.qk_norm_rope_store_kv(q, k, v, q_w, k_w, eps, positions, cos_sin, k_cache, v_cache,
                                       slot_mapping)
            p = self.attention(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale,
                               out, True, max_query_len=1, order=order)
        else:
            p = self._fused_decode_step(q, k, v, q_w, k_w, eps, positions, cos_sin, k_cache, v_cache,
                                        slot_mapping, block_tables, seq_lens, query_start, scale, out,
                                        order, n_splits, o_proj, o_out)
            if self.check_att_counters and not self._capturing:
                self._check_att_counters(p, k_cache.shape[2], seq_lens, query_start, True)
        if o_proj is not None and "o_merge" not in p:  # not merged into the product: run it here
            self.matmul(out.reshape(T, -1), o_proj, o_out)
        return p

    def _fused_decode_step(self, q, k, v, q_w, k_w, eps, positions, cos_sin, k_cache, v_cache,
                           slot_mapping, block_tables, seq_lens, query_start, scale, out, order,
                           n_splits, o_proj, o_out) -> dict:
        """decode_step_attention's one-launch path (paged_decode_rope_*), and gemv1_merge_* after it
        where the o product merges the splits (then the plan carries "o_merge")."""
        T = q.shape[0]
        what = "decode_step_attention"
        self._check_store_kv(what, q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping)
        self._check_paged(what, q, k_cache, v_cache, block_tables, seq_lens, query_start, out)
        it = q.itemsize
        rope = (k, _i64(k.strides[0] // it), _i64(k.strides[1] // it), v, _i64(v.strides[0] // it),
                _i64(v.strides[1] // it), q_w if q_w is not None else _NULL,
                k_w if k_w is not None else _NULL, np.float32(eps), positions, cos_sin,
                _i32(cos_sin.shape[0]), slot_mapping, _i64(k_cache.shape[0] * k_cache.shape[1]))
        H, D = q.shape[1], q.shape[2]
        merge = None
        if o_proj is not None and T == 1 and self._o_merge_fits(out, o_proj, o_out):
            KH, bs = k_cache.shape[2], k_cache.shape[1]
            ns = self.decode_plan(T, H, KH, D, block_tables.shape[1] * bs, n_splits,
                                  self._decode_order(T, H, KH, D, order, n_splits, None)[1])["n_splits"]
            merge = o_merge_plan(self.o_merge, o_proj.shape[0], H * D, H, D, ns, self.num_sms, self.max_smem)
        kv_div = head_ctas_kv_div(H // k_cache.shape[2], T, self.decode_head_ctas, merge is not None)
        p = self._decode_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale,
                                   out, True, n_splits, None, 1 << 30, order=order,
                                   rope=rope + (_i32(merge["defer_max"] if merge else 0),), kv_div=kv_div)
        if merge is None:
            return {**p, "kernel": "decode_rope"}
        if p["n_splits"] != ns:  # both kernels must count the same splits
            raise AssertionError(f"decode_step_attention: o merge planned for {ns} splits, launched {p['n_splits']}")
        N, K = o_proj.shape
        self._launch(merge["kernel"], (merge["grid"],), (merge["threads"],),
                     (self._att_scratch, self._att_scratch[H * p["n_splits"] * D:], seq_lens, query_start,
                      _i32(seq_lens.shape[0]), _i32(p["n_splits"]), _i32(p["min_part"]), _i32(merge["defer_max"]),
                      _i32(H), _i32(D), o_proj, _NULL, o_out, _i32(N), _i32(K), out),
                     shared_mem=merge["smem"])
        return {**p, "kernel": "decode_rope", "o_merge": merge}

    def _o_merge_fits(self, out, o_proj, o_out) -> bool:
        """gemv1_merge_* takes the o product of a one-row step: bf16, the attention's row contiguous
        (it is rewritten whole), o_out a bf16 row, and a product gemv1 would take anyway."""
        if self.o_merge == 0 or self.dtype == np.float32:
            return False
        K = out.shape[1] * out.shape[2]
        x = out.reshape(1, K) if out.flags.c_contiguous else None
        return (x is not None and o_proj.shape[1] == K and o_out.shape == (1, o_proj.shape[0])
                and o_out.dtype == self.dtype and o_out.flags.c_contiguous
                and self._gemv_fits(x, o_proj, o_out, None, 1, K, K)
                and small_product_kernel(1, o_proj.shape[0], K) == "gemv")

    def attention_plan(self, T: int, B: int, H: int, KH: int, D: int, max_ctx: int, itemsize: int,
                       bq: int | None = None, n_splits: int | None = None) -> dict:
        """Launch shape from static sizes only (graph-safe): queries per CTA, splits, key tile."""
        G = H // KH
        if bq is None:  # queries per CTA: the bucket's mean query length, up to ~64 rows
            bq = max(1, min(_cdiv(T, max(B, 1)), 64 // G))  # decode 1, verify 1 + k, prefill 64/G
        rw = D * itemsize // 4 + 1

        def smem(rows: int, bk: int) -> int:  # bytes; the carve-up in cuda/attention.cu
            return 4 * (2 * rows * D + rows * bk + 3 * rows + 2 * bk * rw)

        bk = 64
        while True:
            while bk > 16 and smem(bq * G, bk) > self.max_smem:
                bk //= 2
            if smem(bq * G, bk) <= self.max_smem or bq == 1:
                break
            bq = max(1, bq // 2)
        if smem(bq * G, bk) > self.max_smem:
            raise ValueError(f"attention: {G} query heads per KV head x head_dim {D} do not fit "
                             f"in {self.max_smem} bytes of shared memory")
        tiles = T if bq == 1 else _cdiv(T, bq) + B
        cap = min(_ATT_THREADS, self._att_scratch.size // max(1, T * H * (D + 2)))
        if n_splits is None:  # enough CTAs to fill the GPU, no split shorter than one key tile
            n_splits = min(_cdiv(4 * self.num_sms, max(1, tiles * KH)), _cdiv(max_ctx, bk))
        n_splits = max(1, min(n_splits, cap))
        partition = 0  # the kernel splits each CTA's actual keys (its sequence length) evenly
        return dict(bq=bq, tiles=tiles, bk=bk, smem=smem(bq * G, bk), n_splits=n_splits,
                    partition=partition)

    @staticmethod
    def _check_paged(what: str, q, k_cache, v_cache, block_tables, seq_lens, query_start, out) -> None:
        """What every paged attention launch needs of its inputs."""
        _, H, D = q.shape
        KH, Dk = k_cache.shape[2:]
        if Dk != D or H % KH or D % 8 or q.strides[2] != q.itemsize or out.strides[2] != out.itemsize:
            raise ValueError(f"{what}: q {q.shape} vs cache {k_cache.shape} (head_dim % 8)")
        if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous
                and block_tables.flags.c_contiguous):
            raise ValueError(f"{what}: caches and block tables must be contiguous")
        for a, n in ((block_tables, "block_tables"), (seq_lens, "seq_lens"), (query_start, "query_start")):
            if a.dtype != np.int32:
                raise TypeError(f"{what}: {n} must be int32, got {a.dtype}")

    def _decode_kernel_fits(self, q, k_cache, out) -> bool:
        """cuda/decode_attention.cu is instantiated for these shapes and needs 16-byte q rows."""
        T, H, D = q.shape
        KH = k_cache.shape[2]
        return (D in _DECODE_HEAD_DIMS and H // KH <= _DECODE_MAX_G and q.dtype == k_cache.dtype
                and q.data.ptr % 16 == 0 and k_cache.data.ptr % 16 == 0
                and (q.strides[0] % 16, q.strides[1] % 16) == (0, 0)
                and q.dtype in (BF16, np.float32) and q.dtype == out.dtype)

    def _prefill_kernel_fits(self, q, k_cache, out) -> bool:
        """cuda/prefill_attention.cu: bf16 tensor cores, head dims 64/128, 16-byte q rows."""
        H, KH = q.shape[1], k_cache.shape[2]
        return (self.prefill_unavailable is None and self._decode_kernel_fits(q, k_cache, out)
                and q.dtype == BF16
                and H // KH <= _PF_ROWS and _prefill_smem(q.shape[2]) <= self.max_smem)

    def decode_plan(self, T: int, H: int, KH: int, D: int, max_ctx: int,
                    n_splits: int | None = None, part: int | None = None) -> dict:
        """Splits for the decode kernel from static sizes only (graph-safe). part: keys per split
        for every token (a token takes ceil(len / part) splits) instead of each token's keys
        divided into n_splits even parts."""
        min_part = decode_min_part(T, H // KH, self.decode_min_part)
        if n_splits is None and part is not None:
            n_splits = _cdiv(max_ctx, part)
        if n_splits is None:  # full waves of CTAs (decode_splits)
            n_splits = decode_splits(T * KH, self._decode_resident(D, H // KH), max_ctx,
                                     min(_DECODE_MAX_SPLITS, _cdiv(max_ctx, min_part)))
        if T * KH > self._att_counters.size:
            n_splits = 1
        # the partials of every split must fit the scratch (one split writes none)
        n_splits = min(n_splits, self._att_scratch.size // max(1, T * H * (D + 2)))
        n_splits = max(1, min(n_splits, _DECODE_MAX_SPLITS))
        return dict(kernel="decode", n_splits=n_splits, min_part=max(min_part, part or 0))

    def _short_run_splits(self, T: int, H: int, D: int, KH: int) -> int:
        """Most splits of a short run's keys on the tensor-core kernel in a step of T rows (each
        run takes one a 128 keys up to this): short_run_max_splits, fewer where the partials would
        not fit the scratch (steps of thousands of rows), none past the counters."""
        if T * KH > self._att_counters.size:
            return 1
        fit = self._att_scratch.size // max(1, T * H * (D + 2))
        return max(1, min(self.short_run_max_splits, _PF_MAX_SPLITS, fit))

    def _resident_ctas(self, name: str, smem: int = 0) -> int:
        """CTAs of kernel name (_ATT_THREADS threads, smem bytes of dynamic shared memory) the GPU
        holds at once, from the occupancy API, cached."""
        if name not in self._resident:
            from cupy_backends.cuda.api import driver
            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(self.k[name].kernel.ptr, _ATT_THREADS, smem)
            self._resident[name] = max(1, per_sm) * self.num_sms
        return self._resident[name]

    def _short_run_on_three(self, ctas: int, D: int) -> bool:
        """short_run_on_three for this GPU: the three-CTA kernel's resident CTAs from the occupancy API."""
        mode = self.short_run_three_ctas
        resident = self._resident_ctas(f"paged_prefill_short_bf16_d{D}", _prefill_smem(D, True)) if mode == 1 else 0
        return short_run_on_three(mode, ctas, resident)

    def _decode_resident(self, D: int, G: int) -> int:
        """CTAs of the decode kernel (the backend's dtype) for (head_dim, group) the GPU holds at once."""
        return self._resident_ctas(self._decode_kernel(f"paged_decode_{self._sfx}_d{D}_g{G}", self._sfx, D))

    def attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start, scale: float,
                  out, causal: bool = True, bq: int | None = None,
                  n_splits: int | None = None, kernel: str | None = None,
                  max_query_len: int | None = None, part: int | None = None, order=None,
                  decode_rows=None, short_runs: bool = True) -> dict:
        plan = self._attention(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out, causal,
                               bq, n_splits, kernel, max_query_len, part, order, decode_rows, short_runs)
        if self.check_att_counters and not self._capturing:
            self._check_att_counters(plan, k_cache.shape[2], seq_lens, query_start, causal)
        return plan

    def _check_att_counters(self, plan: dict, KH: int, seq_lens, query_start, causal: bool) -> None:
        """MINILLM_CHECK_ATT_COUNTERS: raise, with the step's shape, if an attention call left a
        split counter set."""
        counts = self.to_host(self._att_counters)
        left = np.flatnonzero(counts)
        if left.size:
            raise RuntimeError(
                f"attention left {left.size} split counter(s) set: (token, KV head, count) "
                f"{[(int(i) // KH, int(i) % KH, int(counts[i])) for i in left[:8]]}; plan {plan}; "
                f"causal {causal}; query_start {self.to_host(query_start).tolist()}; "
                f"seq_lens {self.to_host(seq_lens).tolist()}")

    def _attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start, scale: float,
                   out, causal: bool = True, bq: int | None = None,
                   n_splits: int | None = None, kernel: str | None = None,
                   max_query_len: int | None = None, part: int | None = None, order=None,
                   decode_rows=None, short_runs: bool = True) -> dict:
        """paged_attention with an optional forced kernel and launch shape (the tests run every
        variant): "decode" (cuda/decode_attention.cu) or "prefill" (cuda/prefill_attention.cu,
        bf16 tensor cores) for every sequence, "split" (each sequence by its own query count:
        at most _DECODE_MAX_Q to decode, more to prefill), "tiled" (cuda/attention.cu).

        By default bf16 steps split per sequence, so a token's attention does not depend on what
        shares its step (batch invariance: speculative verification in bf16 needs it), and a step
        whose max_query_len (a host hint; unknown: T) is 1 launches the decode kernel alone. Runs
        of 2-_DECODE_MAX_Q queries with at most short_run_max_ctx keys go to the tensor-core kernel
        (a step that may hold them launches both kernels; the rule is applied on the device).
        fp32 storage (tests) takes the decode kernel for short steps, else tiled.
        order: the decode kernel's launch order of the rows (_decode_attention).
        decode_rows (int32 [n], a host hint for "split"): every row of the sequences with at most
        _DECODE_MAX_Q queries, and no other; the decode kernel's grid then covers these n rows
        instead of all T (the others' CTAs would only exit). A row left out is not written.
        short_runs=False (a host hint): short runs stay on the decode kernel too."""
        T, H, D = q.shape
        if T == 0:
            return {}
        _, bs, KH, _ = k_cache.shape
        B = seq_lens.shape[0]
        self._check_paged("paged_attention", q, k_cache, v_cache, block_tables, seq_lens, query_start, out)
        most_q = max_query_len if max_query_len is not None else T
        short = most_q <= _DECODE_MAX_Q
        # runs of 2+ queries may go to the tensor-core kernel (by their context, on the device)
        short_on_tc = (short_runs and most_q >= 2 and self.short_run_max_ctx > 0
                       and self._prefill_kernel_fits(q, k_cache, out))
        if kernel is None:
            if bq is None and short and not short_on_tc and self._decode_kernel_fits(q, k_cache, out):
                kernel = "decode"
            elif bq is None and self._prefill_kernel_fits(q, k_cache, out):
                kernel = "split"
            elif bq is None and T <= 16 * B and self._decode_kernel_fits(q, k_cache, out):
                kernel = "decode"
            else:
                kernel = "tiled"
        split = kernel == "split"
        # a split step's short-run rule and split count, passed to both kernels
        smc = self.short_run_max_ctx if split and short_runs else 0
        splits = self._short_run_splits(T, H, D, KH) if smc else 1
        three = False  # split short runs launched on paged_prefill_short_*
        if kernel in ("prefill", "split"):
            if not self._prefill_kernel_fits(q, k_cache, out):
                raise ValueError(f"paged_attention: the prefill kernel does not take q {q.shape} "
                                 f"{q.dtype} with KV heads {KH}")
            G = H // KH
            bq = _PF_ROWS // G
            it = q.itemsize
            part_ml = self._att_scratch[T * H * splits * D:] if splits > 1 else self._att_scratch

            def prefill(tiles: int, min_nq: int, short_max_ctx: int, short_splits: int) -> bool:
                on_three = short_splits > 0 and self._short_run_on_three(tiles * KH, D)  # split short runs
                self._launch(
                    f"paged_prefill{'_short' if on_three else ''}_bf16_d{D}", (tiles, KH), (_ATT_THREADS,),
                    (q, _i64(q.strides[0] // it), _i64(q.strides[1] // it), k_cache, v_cache,
                     block_tables, _i32(block_tables.shape[1]), seq_lens, query_start, _i32(B), out,
                     _i64(out.strides[0] // it), _i64(out.strides[1] // it), _i32(KH), _i32(G), _i32(bs),
                     _i32(k_cache.shape[0]), np.float32(scale * math.log2(math.e)),
                     _i32(1 if causal else 0), _i32(bq), _i32(min_nq), _i32(short_max_ctx),
                     _i32(short_splits), self._att_scratch, part_ml, self._att_counters),
                    shared_mem=_prefill_smem(D, on_three),
                )
                return on_three

            if kernel == "prefill":
                prefill(_cdiv(T, bq) + B, 0, 0, 0)
                return dict(kernel="prefill", bq=bq, n_splits=1)
            if splits == 1:  # long runs and unsplit short runs in one launch
                prefill(_cdiv(T, bq) + B, _DECODE_MAX_Q + 1, smc, 0)
            else:  # long runs (if any can be), then the short runs' (tile, split) pairs
                if not short:
                    prefill(_cdiv(T, bq) + B, _DECODE_MAX_Q + 1, 0, 0)
                runs = min(B, T // 2)  # a short run has at least 2 of the T rows
                if runs:
                    three = prefill(runs * _cdiv(_DECODE_MAX_Q, bq) * splits, 1 << 30, smc, splits)
        if kernel in ("decode", "split"):
            if not self._decode_kernel_fits(q, k_cache, out):
                raise ValueError(f"paged_attention: the decode kernel does not take q {q.shape} "
                                 f"{q.dtype} with KV heads {KH}")
            rows = None
            if kernel == "split" and decode_rows is not None:
                order, rows = decode_rows, decode_rows.shape[0]
            p = self._decode_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start,
                                       scale, out, causal, n_splits, part,
                                       _DECODE_MAX_Q if split else 1 << 30, order=order, rows=rows,
                                       short_max_ctx=smc)
            if smc:
                p["short_run_splits"] = splits
                p["short_run_three_ctas"] = three
            return {**p, "kernel": kernel}
        p = self.attention_plan(T, B, H, KH, D, block_tables.shape[1] * bs, q.itemsize, bq, n_splits)
        it = q.itemsize
        sfx = _suffix(q.dtype)
        part_o = self._att_scratch
        part_ml = self._att_scratch[T * H * p["n_splits"] * D:]
        self._launch(
            "paged_attention_" + sfx, (p["tiles"], KH, p["n_splits"]), (_ATT_THREADS,),
            (q, _i64(q.strides[0] // it), _i64(q.strides[1] // it), k_cache, v_cache, block_tables,
             _i32(block_tables.shape[1]), seq_lens, query_start, _i32(B), _i32(T), out,
             _i64(out.strides[0] // it), _i64(out.strides[1] // it), part_o, part_ml, _i32(H),
             _i32(KH), _i32(D), _i32(bs), _i32(k_cache.shape[0]), np.float32(scale),
             _i32(1 if causal else 0), _i32(p["bq"]), _i32(p["n_splits"]), _i32(p["partition"]),
             _i32(p["bk"])),
            shared_mem=p["smem"],
        )
        if p["n_splits"] > 1:
            self._launch(
                "attention_combine_" + sfx, (T, H), (_ATT_THREADS,),
                (part_o, part_ml, query_start, _i32(B), _i32(T), out, _i64(out.strides[0] // it),
                 _i64(out.strides[1] // it), _i32(H), _i32(D), _i32(p["n_splits"])),
            )
        return p

    def _decode_order(self, T: int, H: int, KH: int, D: int, order, n_splits: int | None,
                      part: int | None) -> tuple:
        """The launch order a decode launch keeps (None: dropped) and the split length it takes
        with it (_decode_attention says when)."""
        least = self.decode_order_min_ctas
        if order is not None and T * KH < (self._decode_resident(D, H // KH) if least is None else least):
            order = None  # one wave even unsplit: the order's extra load at each CTA's start buys nothing
        if order is not None and n_splits is None and part is None and self.decode_order_part:
            part = self.decode_order_part  # longest first: fixed parts (_DECODE_ORDER_PART_DEFAULT)
        return order, part

    def _decode_attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start,
                          scale: float, out, causal: bool, n_splits: int | None, part: int | None,
                          max_nq: int, rope: tuple | None = None, order=None,
                          rows: int | None = None, short_max_ctx: int = 0, kv_div: int = 1) -> dict:
        """cuda/decode_attention.cu's paged_decode_* or, given rope (the decode step's k and v
        rows, norm weights, positions, cos/sin table and slots, as kernel arguments; causal and
        one query a sequence), paged_decode_rope_*: the same leading arguments either way.

        order (None, or [>= T] int32 whose first T entries are a permutation of 0..T-1): the rows
        whose CTAs start first. The GPU starts a grid's CTAs in index order; with an order the
        kernel maps index i to KV head i % KH, then split, then row order[i // (KH x splits)], so a
        ragged batch given longest first runs its long contexts first and its short ones fill the
        tail. The result is the same for any order. The order is dropped for steps whose CTAs
        fit one wave unsplit (decode_order_min_ctas; None: the GPU's resident CTAs), and an
        ordered step takes decode_order_part keys a split unless n_splits or part is given.
        rows (with order): launch only the rows order[:rows], a subset (attention's decode_rows).
        kv_div > 1 (with rope): paged_decode_rope_kvd_*, kv_div CTAs a KV head, each H / (KV heads x
        kv_div) query heads (the kernel's KH counts those head groups)."""
        T, H, D = q.shape
        _, bs, KH, _ = k_cache.shape
        if kv_div > 1:
            if rope is None or H % (KH * kv_div) or H // (KH * kv_div) != 1:
                raise ValueError(f"decode attention: kv_div {kv_div} needs the fused step and one query head a CTA "
                                 f"({H} heads, {KH} KV heads)")
            KH *= kv_div  # head groups, as the kernel counts them
        B = seq_lens.shape[0]
        if order is not None and (order.dtype != np.int32 or order.ndim != 1
                                  or order.shape[0] < (T if rows is None else rows) or (rows or 0) > T):
            raise ValueError(f"decode attention: an order must be int32 [>= {T}], decode_rows int32 "
                             f"[<= {T}]; got {order.dtype} {order.shape}")
        if rows is None:
            order, part = self._decode_order(T, H, KH, D, order, n_splits, part)
        # planned on T even with rows: the splits (so the bits) of a row do not depend on the hint
        p = self.decode_plan(T, H, KH, D, block_tables.shape[1] * bs, n_splits, part)
        if rows == 0:
            return p  # no short sequence in the step: nothing to launch
        ns = p["n_splits"]
        it = q.itemsize
        part_o = self._att_scratch
        part_ml = self._att_scratch[T * H * ns * D:]
        args = (q, _i64(q.strides[0] // it), _i64(q.strides[1] // it), k_cache, v_cache, block_tables,
                _i32(block_tables.shape[1]), seq_lens, query_start, _i32(B), _i32(T), out,
                _i64(out.strides[0] // it), _i64(out.strides[1] // it), part_o, part_ml,
                self._att_counters, _NULL if order is None else order, _i32(KH), _i32(bs),
                _i32(k_cache.shape[0]),
                np.float32(scale * math.log2(math.e)))
        if rope is None:
            name = "paged_decode_"
            args += (_i32(1 if causal else 0), _i32(ns), _i32(p["min_part"]), _i32(max_nq),
                     _i32(short_max_ctx))
        else:
            name = "paged_decode_rope_kvd_" if kv_div > 1 else "paged_decode_rope_"
            args += (_i32(ns), _i32(p["min_part"])) + rope + (_i32(kv_div),)
        sfx = _suffix(q.dtype)
        name = self._decode_kernel(f"{name}{sfx}_d{D}_g{H // KH}", sfx, D)
        self._launch(name, ((T if rows is None else rows) * KH * ns,),
                     (self._kvd_threads if kv_div > 1 else _ATT_THREADS,), args)
        return p

    # ---- sampling -----------------------------------------------------------------------
    def sample(self, logits, temperature, top_p, top_k, seeds, positions, out_tokens,
               draft_tokens=None, out_accepted=None, min_p=None, draft_logits=None, draft_rows=None) -> None:
        """One token per logits row on the device (and verification of drafted tokens where
        draft_tokens >= 0); twin of minillm.engine.sampler.sample. min_p None: off for every row
        (the kernel gets a null pointer). draft_logits / draft_rows: the drafter's rows of drafts
        drawn from q; verify_drawn_drafts then takes the whole batch in place of sample_tokens,
        verifying the rows with draft_rows >= 0 against q."""
        B, stride = _rows(logits, "sample logits")
        if B == 0:
            return
        checks = ((logits, np.float32, "logits"), (temperature, np.float32, "temperature"),
                  (top_p, np.float32, "top_p"), (top_k, np.int32, "top_k"),
                  (positions, np.int32, "positions"), (out_tokens, np.int32, "out_tokens"))
        if logits.shape[-1] > _SAMPLE_MAX_VOCAB:
            raise ValueError(f"sample: the device sampler handles vocabularies up to {_SAMPLE_MAX_VOCAB} ids "
                             f"(cuda/sampling.cu DRAW_TILE * DRAW_MAX_TILES), got {logits.shape[-1]}")
        if (draft_tokens is None) != (out_accepted is None):
            raise ValueError("sample: draft_tokens and out_accepted go together")
        if draft_tokens is not None:
            checks += ((draft_tokens, np.int32, "draft_tokens"), (out_accepted, np.int32, "out_accepted"))
        if min_p is not None:
            checks += ((min_p, np.float32, "min_p"),)
        if (draft_logits is None) != (draft_rows is None):
            raise ValueError("sample: draft_logits and draft_rows go together")
        if draft_rows is not None:
            if draft_tokens is None:
                raise ValueError("sample: draft_rows verify drafts: draft_tokens and out_accepted are needed")
            if draft_logits.ndim != 2 or draft_logits.shape[-1] > logits.shape[-1]:
                raise ValueError(f"sample: draft_logits {draft_logits.shape} must be rows of at most the "
                                 f"target's {logits.shape[-1]} ids")
            checks += ((draft_logits, np.float32, "draft_logits"), (draft_rows, np.int32, "draft_rows"))
        for a, dt, n in checks:
            if a.dtype != dt:
                raise TypeError(f"sample: {n} must be {np.dtype(dt)}, got {a.dtype}")
        if seeds.dtype not in (np.int64, np.uint64, np.int32):
            raise TypeError(f"sample: seeds must be int64/uint64/int32, got {seeds.dtype}")
        if draft_rows is not None:  # one launch: verify_drawn_drafts samples the other rows itself
            q_stride = _rows(draft_logits, "sample draft_logits")[1]
            # CTAs a row: a cluster of 8 or 4 (every pass split), a pair (p's and q's filters side by side), or one
            parts = (8 if B <= self.verify_cluster_rows else 4 if B <= self.verify_cluster4_rows
                     else 2 if B <= self.verify_pair_rows else 1)
            wide = parts <= 2 and B <= self.verify_wide_rows  # the clusters are built at 512 threads only
            self._launch(
                _VERIFY_KERNELS[parts] + ("_wide" if wide else ""), (parts * B,),
                (_SAMPLE_WIDE_THREADS if wide else _SAMPLE_THREADS,),
                (logits, _i64(stride), _i32(logits.shape[-1]), draft_logits, _i64(q_stride),
                 _i32(draft_logits.shape[-1]), temperature, top_p, top_k, _NULL if min_p is None else min_p,
                 seeds, _i32(seeds.itemsize), positions, draft_tokens, draft_rows, out_tokens, out_accepted, _i32(B)),
            )
            return
        # CTAs a row (a cluster)
        split = (8 if B <= self.sample_cluster_rows else 4 if B <= self.sample_cluster4_rows
                 else 2 if B <= self.sample_cluster2_rows else 1)
        wide = split == 1 and B <= self.sample_wide_rows  # the split is built at 512 threads only
        self._launch(
            ("sample_tokens" if split == 1 else f"sample_tokens_cl{split}") + ("_wide" if wide else ""), (split * B,),
            (_SAMPLE_WIDE_THREADS if wide else _SAMPLE_THREADS,),
            (logits, _i64(stride), _i32(logits.shape[-1]), temperature, top_p, top_k,
             _NULL if min_p is None else min_p, seeds, _i32(seeds.itemsize), positions, out_tokens,
             _NULL if draft_tokens is None else draft_tokens,
             _NULL if out_accepted is None else out_accepted, _i32(B)),
        )

    def close(self) -> None:
        """Release the cuBLAS handle and hand CuPy its previous allocator back."""
        self.synchronize()
        self.blas.close()
        self.arena.uninstall()
