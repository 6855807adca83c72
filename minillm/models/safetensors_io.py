"""Read safetensors files into NumPy, bf16 included.

The `safetensors` package's NumPy reader refuses bfloat16 (NumPy has no such dtype), and bf16
is what most checkpoints ship. The format is a little-endian u64 header length, a JSON header
of {name: {dtype, shape, data_offsets}}, then the raw bytes; views come straight off an mmap.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, read-only array view) for every tensor in the file."""
    path = Path(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if len(mm) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", mm[:8])
    try:
        header = json.loads(mm[8 : 8 + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file (bad header: {e})") from None
    base = 8 + n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {meta['dtype']}; supported: {', '.join(DTYPES)}")
        start, end = meta["data_offsets"]
        arr = np.frombuffer(mm, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize, offset=base + start)
        yield name, arr.reshape(meta["shape"])
