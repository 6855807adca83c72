"""The MINILLM_* environment variables minillm reads, and a startup check that names any other one
that is set: a misspelt switch, or one that has since been removed, would otherwise change nothing
without a word (docs/DEVELOPING.md describes each variable)."""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping

log = logging.getLogger("minillm")

# every name minillm/ reads (tests/test_envvars.py keeps this equal to the names in its source)
READ = frozenset({
    "MINILLM_API_KEY", "MINILLM_CHECK_ATT_COUNTERS", "MINILLM_CUDA_DEBUG", "MINILLM_CUDA_DEFINES", "MINILLM_DEBUG",
    "MINILLM_DECODE_HEAD_CTAS", "MINILLM_DECODE_MIN_PART", "MINILLM_DECODE_ORDER", "MINILLM_DECODE_ORDER_PART",
    "MINILLM_DECODE_ROPE_MAX", "MINILLM_EARLY_DRAFTS", "MINILLM_FOLD_NORMS_MAX_K", "MINILLM_FUSED_DECODE",
    "MINILLM_GATED_SPLIT_MAX_M", "MINILLM_GEMM", "MINILLM_GEMV1_DEEP_MIN_K", "MINILLM_GEMV1_PRE",
    "MINILLM_GEMV1_STAGE", "MINILLM_GRAMMAR_FUEL", "MINILLM_INITCHECK", "MINILLM_MASK_PARALLEL_MIN",
    "MINILLM_O_MERGE", "MINILLM_PDL", "MINILLM_PDL_PREFILL",
    "MINILLM_SAMPLE_CLUSTER2_ROWS", "MINILLM_SAMPLE_CLUSTER4_ROWS", "MINILLM_SAMPLE_CLUSTER_ROWS",
    "MINILLM_SAMPLE_WIDE_ROWS", "MINILLM_SHORT_RUN_3CTA",
    "MINILLM_SHORT_RUN_GRAPHS", "MINILLM_SHORT_RUN_MAX_CTX", "MINILLM_SHORT_RUN_MIN_SEQS", "MINILLM_SHORT_RUN_SPLITS",
    "MINILLM_SKINNY2_W4", "MINILLM_SMEM_CARVEOUT", "MINILLM_TEST_FAULTS", "MINILLM_TEST_STEP_DELAY",
    "MINILLM_VERIFY_CLUSTER4_ROWS", "MINILLM_VERIFY_CLUSTER_ROWS", "MINILLM_VERIFY_PAIR_ROWS",
    "MINILLM_VERIFY_WIDE_ROWS",
})
# read by the test suite only (hypothesis example counts)
TESTS = frozenset({"MINILLM_ASYNC_EXAMPLES", "MINILLM_ASYNC_SPEC_EXAMPLES", "MINILLM_STRESS_EXAMPLES"})
# switches that were read once, and what became of each
REMOVED = {
    "MINILLM_DFLASH2_CUDA": "is no longer needed: the CUDA backend runs DFlash2 drafters",
    "MINILLM_GEMV1_RING": "was removed in session 57 (gemv1_ring_*, measured slower)",
    "MINILLM_SKINNY2_RING": "was removed in session 57 (gemm_skinny2_ring_*, measured slower)",
    "MINILLM_L2_AHEAD": "was removed in session 58 (later products' weights asked into L2 early: the 0.6B "
                        "batch-1 graph +0.6-5.2% on an H200)",
    "MINILLM_STAGE_MLP": "was removed in session 58 (a one-row step's gate_up and down in one kernel with a grid "
                         "barrier: the 0.6B batch-1 graph +9.3% / +10.8% on an H100)",
    "MINILLM_GATED1_SPLIT": "was folded into MINILLM_GATED_SPLIT_MAX_M (0 is its old 0)",
    "MINILLM_SAMPLE_CLUSTER": "was folded into MINILLM_SAMPLE_CLUSTER4_ROWS in session 70 (the batches that sample "
                              "with 4 CTAs a row; MINILLM_SAMPLE_CLUSTER_ROWS' take 8)",
    **{name: "was removed (measured slower)" for name in (
        "MINILLM_NORM_FOLD", "MINILLM_NORM_POST", "MINILLM_L2_PREFETCH", "MINILLM_L2_PREFETCH_MB",
        "MINILLM_DECODE_ROPE_RUNS")},
    "MINILLM_GATED1_UNFUSED_MIN_W": "was removed",
}


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """One message for each MINILLM_* variable in `environ` that minillm does not read: what became of
    a removed one, or the nearest name it does read."""
    out = []
    for name in sorted(environ):
        if not name.startswith("MINILLM_") or name in READ or name in TESTS:
            continue
        if name in REMOVED:
            out.append(f"{name} is set, but it {REMOVED[name]}; it changes nothing")
            continue
        # compared without the shared prefix, which would make every name look alike
        near = difflib.get_close_matches(name[8:], sorted(r[8:] for r in READ), n=1, cutoff=0.75)
        hint = f" (did you mean MINILLM_{near[0]}?)" if near else ""
        out.append(f"{name} is set, but minillm reads no such variable{hint}; it changes nothing")
    return out


def warn_unknown_settings(environ: Mapping[str, str] | None = None) -> list[str]:
    """Log unknown_settings as warnings (at each engine start) and return them."""
    messages = unknown_settings(os.environ if environ is None else environ)
    for m in messages:
        log.warning(m)
    return messages
