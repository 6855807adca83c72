"""Read safetensors files into NumPy, bf16 included.

The `safetensors` package's NumPy reader refuses bfloat16 (NumPy has no such dtype), and bf16
is what most checkpoints ship. The format is a little-endian u64 header length, a JSON header
of {name: {dtype, shape, data_offsets}}, then the raw bytes; views come straight off an mmap.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# "BF16" is ml_dtypes.bfloat16, looked up when a file holds one (_dtype): importing it was most of
# `import minillm`'s 1.6 s on the 2-core CPU machine, 0.3 s without (scripts/startup_time.py; BENCHMARKS.md)
DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def _dtype(name: str) -> type:
    if name == "BF16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return DTYPES[name]


def _tensor_entries(header: dict, data_len: int, path: Path) -> dict[str, tuple]:
    """name -> (dtype, shape, begin) of every tensor, checked as the reference safetensors library
    checks them: a known dtype, a shape of non-negative integers, and data_offsets [begin, end] that
    hold exactly the shape's bytes and, in order, fill the data section with no gap or overlap. So a
    truncated file or tensors sharing bytes are refused instead of read as wrong values."""
    if not isinstance(header.get("__metadata__", {}), dict):
        raise ValueError(f"{path}: the header's '__metadata__' must be an object")
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        bad = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ValueError(f"{bad}: its header entry must be an object with dtype, shape and data_offsets")
        dtype = info.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"{bad} has dtype {dtype}; supported: {', '.join(DTYPES)}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"{bad}: 'shape' must be a list of non-negative integers, got {shape!r:.40}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise ValueError(f"{bad}: 'data_offsets' must be [begin, end] (two integers), got {offsets!r:.40}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise ValueError(f"{bad}: data_offsets {offsets} do not lie within the file's {data_len} bytes of "
                             "tensor data (a truncated file?)")
        nbytes = math.prod(shape) * np.dtype(_dtype(dtype)).itemsize
        if end - begin != nbytes:
            raise ValueError(f"{bad}: data_offsets {offsets} hold {end - begin} bytes, but shape {shape} of "
                             f"{dtype} is {nbytes} bytes")
        entries[name] = (_dtype(dtype), shape, begin, end)
    at = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda e: e[1][2:]):
        if begin != at:
            raise ValueError(f"{path}: tensor {name!r} starts at data byte {begin}, expected {at}: the tensors "
                             "must follow one another with no gap or overlap")
        at = end
    if at != data_len:
        raise ValueError(f"{path}: the tensors end at data byte {at}, but the file has {data_len} (bytes "
                         "no tensor owns)")
    return {name: e[:3] for name, e in entries.items()}


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, read-only array view) for every tensor in the file."""
    from minillm.models.hf_loader import regular_file  # imported here: hf_loader imports this module

    path = regular_file(Path(path))  # opening a FIFO would wait for a writer forever
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:  # (mmap refuses an empty file with a message that names no file)
            raise ValueError(f"{path}: not a safetensors file (too short)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (n,) = struct.unpack("<Q", mm[:8])
    if n > len(mm) - 8:
        raise ValueError(f"{path}: not a safetensors file (a header of {n} bytes in a file of {len(mm)})")
    try:
        header = json.loads(mm[8 : 8 + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file (bad header: {e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (the header is a JSON {type(header).__name__}, "
                         "not an object)")
    base = 8 + n
    for name, (dtype, shape, begin) in _tensor_entries(header, len(mm) - base, path).items():
        arr = np.frombuffer(mm, dtype=dtype, count=math.prod(shape), offset=base + begin)
        yield name, arr.reshape(shape)
