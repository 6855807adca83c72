"""How a step's inputs reach the device: runs of rows of the packed step buffer, trimmed to the step.

The runner keeps every step input in one packed byte buffer, a host copy and a device copy of the
same layout (engine/runner.py StepBuffers). A step uses only the first rows of each array (its
tokens, its sequences, its logits rows), so backend.stage_inputs copies just those: a run is
(offset, stride, rows, nbytes) in bytes, row j being [offset + j * stride, + nbytes) of both
buffers (arrays of one size side by side make one run; each row's stride inside the buffer). On
the GPU the device reads them straight from pinned host memory (cuda/rows.cu stage_inputs),
where this module's header describes them; the NumPy backend copies the same rows.

An optional StageFill then applies fill_input_ids' rule to one run's rows: async scheduling's
input ids that the previous step sampled, still on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_RUNS = 12  # cuda/rows.cu STAGE_MAX_RUNS
HEADER_INTS = 8 + 4 * MAX_RUNS  # cuda/rows.cu STAGE_HEADER_INTS


@dataclass
class StageFill:
    """After the copy: run `run`'s row ids_row, as int32, gets prev_tokens[src[i]] for i < n where
    src[i] >= 0, src being the same run's row rows_row (both rows as long as each other)."""

    run: int
    ids_row: int
    rows_row: int
    n: int
    prev_tokens: object  # int32, on the backend's device


def check_runs(runs: list[tuple[int, int, int, int]], size: int, fill: StageFill | None) -> None:
    """Refuse runs the kernel cannot take: too many, not 16-byte units, a row longer than its stride,
    rows whose strides leave the buffer of `size` bytes (each row's whole stride lies inside it, as
    every array's does: a run is then a (rows, stride) block), or a fill outside its run or longer
    than its rows."""
    if len(runs) > MAX_RUNS:
        raise ValueError(f"stage_inputs: {len(runs)} runs, at most {MAX_RUNS}")
    for offset, stride, rows, nbytes in runs:
        if min(offset, stride, rows, nbytes) < 0 or (offset | stride | nbytes) % 16:
            raise ValueError(f"stage_inputs: run {(offset, stride, rows, nbytes)} is not in 16-byte units")
        if nbytes > stride or offset + rows * stride > size:
            raise ValueError(f"stage_inputs: run {(offset, stride, rows, nbytes)} leaves its stride or the "
                             f"{size}-byte buffer")
    if fill is not None:
        if not 0 <= fill.run < len(runs):
            raise ValueError(f"stage_inputs: the fill's run {fill.run} is not one of the {len(runs)} runs")
        _, _, rows, nbytes = runs[fill.run]
        if not (0 <= fill.ids_row < rows and 0 <= fill.rows_row < rows and 0 <= fill.n <= nbytes // 4):
            raise ValueError(f"stage_inputs: fill rows {fill.ids_row}, {fill.rows_row} of {fill.n} ids do not fit "
                             f"run {fill.run} ({rows} rows of {nbytes} bytes)")
        if fill.prev_tokens.dtype != np.int32 or fill.prev_tokens.ndim != 1:
            raise TypeError("stage_inputs: the fill's prev_tokens must be a 1-D int32 array")


def header(runs: list[tuple[int, int, int, int]], fill: StageFill | None) -> np.ndarray:
    """The blob's header (cuda/rows.cu stage_inputs): counts, the fill, and each run in 16-byte units."""
    h = np.zeros(HEADER_INTS, np.int32)
    h[0] = len(runs)
    h[1] = -1
    if fill is not None:
        h[1:6] = fill.run, fill.ids_row, fill.rows_row, fill.n, fill.prev_tokens.shape[0]
    for k, (offset, stride, rows, nbytes) in enumerate(runs):
        h[8 + 4 * k: 12 + 4 * k] = offset // 16, stride // 16, rows, nbytes // 16
    return h
