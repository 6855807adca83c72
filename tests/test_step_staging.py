"""Step inputs reach the device trimmed to the step (backend.stage_inputs, minillm/backends/staging.py):
only the rows of each array a step reads are copied, and the async fill of input ids rides along.

Checked here: the NumPy op's copies and fill, the checks on runs, StepBuffers' runs against every
array's count, and, the strong one, engines whose device buffers are poisoned before every upload
(every byte no run rewrites turns into garbage) give the tokens of an engine that is not poisoned,
for plain, chunked, preempting, async, n-gram, draft-model and DFlash workloads, eager and on
emulated graphs: no step reads a row it did not upload. The CUDA kernel against this op is in
test_cuda_ops (gpu)."""

from __future__ import annotations

import numpy as np
import pytest
from test_async_scheduling import CONFIGS, drive
from test_dflash_graphs import GraphEmulatingBackend
from test_overlap_outputs import workload

from minillm.backends.numpy_ops import NumpyBackend
from minillm.backends.staging import MAX_RUNS, StageFill, check_runs, header
from minillm.engine.engine import LLMEngine
from minillm.engine.runner import StepBuffers

POISON = 0x7F  # int32 0x7f7f7f7f: an index error or a huge position; float 3.4e38


def random_runs(rng, size: int) -> list[tuple[int, int, int, int]]:
    runs, at = [], 0
    for _ in range(int(rng.integers(1, 6))):
        stride = 16 * int(rng.integers(1, 8))
        rows = int(rng.integers(1, 5))
        if at + rows * stride > size:
            break
        runs.append((at, stride, rows, 16 * int(rng.integers(0, stride // 16 + 1))))
        at += rows * stride + 16 * int(rng.integers(0, 3))
    return runs


def expected_stage(dst: np.ndarray, src: np.ndarray, runs, fill: StageFill | None) -> np.ndarray:
    out = dst.copy()
    for offset, stride, rows, nbytes in runs:
        for j in range(rows):
            a = offset + j * stride
            out[a: a + nbytes] = src[a: a + nbytes]
    if fill is not None:
        offset, stride = runs[fill.run][:2]
        ids = out[offset + fill.ids_row * stride:][: 4 * fill.n].view(np.int32)
        rows = out[offset + fill.rows_row * stride:][: 4 * fill.n].view(np.int32)
        for i in range(fill.n):
            if rows[i] >= 0:
                ids[i] = fill.prev_tokens[rows[i]]
    return out


def stage_case(seed: int):
    """A random buffer pair, runs and (every other seed) a fill over a two-row int32 run."""
    rng = np.random.default_rng(seed)
    size = 2048
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.full(size, POISON, np.uint8)
    runs = random_runs(rng, size - 256)
    fill = None
    if seed % 2:
        n_prev, n = 37, int(rng.integers(0, 17))
        prev = rng.integers(0, 1000, n_prev).astype(np.int32)
        runs.append((size - 128, 64, 2, 64))
        src[size - 128: size - 64].view(np.int32)[:] = rng.integers(0, 1000, 16)
        src[size - 64:].view(np.int32)[:] = rng.integers(-1, n_prev, 16)
        fill = StageFill(len(runs) - 1, 0, 1, n, prev)
    return src, dst, runs, fill


@pytest.mark.parametrize("seed", range(12))
def test_stage_inputs_copies_the_runs_and_fills(seed):
    src, dst, runs, fill = stage_case(seed)
    want = expected_stage(dst, src, runs, fill)
    NumpyBackend().stage_inputs(dst, src, runs, fill)
    assert np.array_equal(dst, want)
    outside = np.ones(dst.shape[0], bool)
    for offset, stride, rows, nbytes in runs:
        for j in range(rows):
            outside[offset + j * stride: offset + j * stride + nbytes] = False
    assert (dst[outside] == POISON).all()  # nothing past the runs' rows was written


def test_check_runs_refuses_what_the_kernel_cannot_take():
    prev = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="at most"):
        check_runs([(0, 16, 1, 16)] * (MAX_RUNS + 1), 4096, None)
    with pytest.raises(ValueError, match="16-byte"):
        check_runs([(8, 16, 1, 16)], 4096, None)
    with pytest.raises(ValueError, match="leaves"):
        check_runs([(4000, 64, 2, 64)], 4096, None)
    with pytest.raises(ValueError, match="not one of"):
        check_runs([(0, 64, 2, 64)], 4096, StageFill(1, 0, 1, 4, prev))
    with pytest.raises(ValueError, match="do not fit"):
        check_runs([(0, 64, 2, 64)], 4096, StageFill(0, 0, 1, 17, prev))  # 17 ids in 64 bytes
    with pytest.raises(TypeError, match="int32"):
        check_runs([(0, 64, 2, 64)], 4096, StageFill(0, 0, 1, 4, prev.astype(np.int64)))
    h = header([(32, 64, 2, 48)], StageFill(0, 0, 1, 5, prev))
    assert h[:6].tolist() == [1, 0, 0, 1, 5, 4] and h[8:12].tolist() == [2, 4, 2, 3]


@pytest.mark.parametrize("counts", [(1, 1, 1), (2, 7, 2), (5, 40, 9), (17, 64, 17), (3, 0, 0)])
def test_step_buffer_runs_cover_each_array_to_its_count(counts):
    """After an upload into a poisoned device buffer, every array holds the host's values up to
    the count a step of these (sequences, tokens, logits rows) reads."""
    num_seqs, t, r = counts
    buf = StepBuffers(NumpyBackend(), max_tokens=64, max_seqs=17, max_logits=17, max_blocks=9)
    rng = np.random.default_rng(num_seqs)
    buf.packed_host[:] = rng.integers(0, 256, buf.packed_host.shape[0], dtype=np.uint8)
    buf.packed_dev[:] = POISON
    buf.upload(num_seqs, t, r)
    need = {"seeds": r, "logits_indices": r, "temperature": r, "top_p": r, "top_k": r, "min_p": r,
            "sample_pos": r, "draft_tokens": r, "draft_src": r, "draft_q_rows": r, "seq_lens": num_seqs,
            "query_start": num_seqs + 1,
            "adv_row": num_seqs, "adv_drafts": num_seqs, "adv_base": num_seqs, "adv_limit": num_seqs,
            "attn_order": min(t, 17), "block_tables": num_seqs, "input_ids": t, "positions": t,
            "slot_mapping": t, "src_rows": t}
    assert set(need) | {"out_tokens", "out_accepted"} == set(buf.host)
    for name, n in need.items():
        assert np.array_equal(buf.dev[name][:n].view(np.uint8), buf.host[name][:n].view(np.uint8)), name
    assert (buf.dev["out_tokens"].view(np.uint8) == POISON).all()  # never uploaded
    assert len(buf.runs(num_seqs, t, r)) <= MAX_RUNS


class Poisoning:
    """Every byte of the step buffer that an upload's runs do not rewrite is garbage from then on
    (the sampler's outputs past them excepted: steps read those on the device by design)."""

    uploads = copies_out = 0

    def stage_inputs(self, dst, src, runs, fill=None, copy_out=None) -> None:
        dst[: max(offset + rows * stride for offset, stride, rows, _ in runs)] = POISON
        self.uploads += 1
        self.copies_out += copy_out is not None
        super().stage_inputs(dst, src, runs, fill, copy_out)


class PoisoningEager(Poisoning, NumpyBackend):
    pass


class PoisoningGraphs(Poisoning, GraphEmulatingBackend):
    pass


POISON_CONFIGS = {name: CONFIGS[name] for name in ("plain", "chunked", "preempting", "ngram", "dflash")}
POISON_CONFIGS["draft_model"] = dict(max_num_seqs=4, max_num_batched_tokens=64, speculative_config={
    "method": "draft_model", "model": "TINY", "num_speculative_tokens": 3})


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("name", list(POISON_CONFIGS))
def test_poisoned_step_buffers_change_no_token(tiny, drafter, monkeypatch, name, graphs):
    kw = dict(dict(device="cpu", max_model_len=256), **POISON_CONFIGS[name])
    spec = kw.get("speculative_config")
    if spec is not None:
        kw["speculative_config"] = dict(spec, model={"DRAFTER": str(drafter), "TINY": str(tiny)}.get(spec.get("model")))
        if spec["method"] == "ngram":
            del kw["speculative_config"]["model"]
    prompts, params = workload(tiny, kw)
    want = drive(LLMEngine(model=str(tiny), **kw), prompts, params, False)
    backend = PoisoningGraphs() if graphs else PoisoningEager()
    monkeypatch.setattr("minillm.engine.engine.select_backend", lambda device, dtype: backend)
    engine = LLMEngine(model=str(tiny), **kw)
    assert bool(getattr(engine.runner, "graphs", None)) == graphs
    for async_scheduling in (False, True):
        assert drive(engine, prompts, params, async_scheduling) == want, f"async={async_scheduling}"
    assert backend.uploads > 0
    if engine.num_pipelined_steps:  # async plain steps: their ids rode on the next step's upload
        assert backend.copies_out > 0


def test_deferred_readback_rides_on_the_next_upload_or_is_queued_by_wait():
    """TokenReadback.defer: the ids reach the host through the next upload's copy_out, or through
    wait() when no upload came; never twice pending; reset() forgets it."""
    from minillm.engine.readback import TokenReadback

    be = NumpyBackend()
    buf = StepBuffers(be, max_tokens=8, max_seqs=3, max_logits=4, max_blocks=2)
    rb = TokenReadback(be, 4)
    out = buf.dev["out_tokens"]
    out[:3] = [7, 8, 9]
    ticket = rb.defer(out[:3])
    with pytest.raises(RuntimeError, match="second deferred"):
        rb.defer(out[:3])
    pending = rb.pending()
    buf.upload(1, 1, 1, copy_out=(pending[1], rb.slot(pending[0])))
    rb.queued(ticket)
    assert rb.pending() is None
    out[:3] = [1, 2, 3]  # the next step's sampler: the copy was taken before it
    assert rb.wait(ticket).tolist() == [7, 8, 9]
    ticket = rb.defer(out[:2])  # no upload before the wait: wait() copies
    assert rb.wait(ticket).tolist() == [1, 2] and rb.pending() is None
    rb.defer(out[:1])
    rb.reset()
    assert rb.pending() is None


def test_header_layout_matches_the_kernel():
    """staging.py's header sizes are cuda/rows.cu's (the kernel reads the header the host writes)."""
    import re
    from pathlib import Path

    from minillm.backends.staging import HEADER_INTS

    src = (Path(__file__).resolve().parents[1] / "cuda" / "rows.cu").read_text()
    assert int(re.search(r"#define STAGE_MAX_RUNS (\d+)", src).group(1)) == MAX_RUNS
    assert re.search(r"#define STAGE_HEADER_INTS \(8 \+ 4 \* STAGE_MAX_RUNS\)", src)
    assert HEADER_INTS == 8 + 4 * MAX_RUNS and HEADER_INTS % 4 == 0  # the rows start 16-byte aligned
