"""How close the batch-1 products come to a plain read of the same bytes (a GPU diagnostic).

    PYTHONPATH=. python scripts/stream_bench.py [--shapes gate_up,down] [--json F]

For each Qwen3-8B product (the one-row GEMVs a batch-1 decode step runs: qkv, o, gate_up with its
SiLU, down, the LM head; and the 0.6B shape's LM head), up to three ways over the same weight
bytes, each a chain of 20 launches in one CUDA graph (graph_us: 3 warm-up replays, the median of
10):
  - product: the backend's own call (CudaBackend.matmul / matmul_silu_mul, as the model makes it);
  - gate_up ungated: the [2F, K] gate_up matrix as one plain product (no gate/up row pairing);
  - read: every byte loaded once with 16-byte loads, grid-stride over 8 CTAs an SM, nothing computed.
Inside a decode step the products stream at 4.1-4.25 TB/s while they work (scripts/step_timeline.py);
this says whether the gap to a plain read is the kernel's or its neighbours' in the step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ml_dtypes
import numpy as np

from minillm.backends.cuda_ops import CudaBackend
from minillm.bench.gpu_timing import graph_us

# name: (K, N, gated, fp32 out), Qwen3-8B but the last; the LM heads write fp32 logits, as the model's
SHAPES = {"qkv": (4096, 6144, False, False), "o": (4096, 4096, False, False), "gate_up": (4096, 12288, True, False),
          "down": (12288, 4096, False, False), "lm_head": (4096, 151936, False, True),
          "lm_head_06b": (1024, 151936, False, True)}

READ_SRC = r"""
extern "C" __global__ void stream_read(const uint4* __restrict__ p, long long n16, unsigned* sink) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long s = (long long)gridDim.x * blockDim.x;
  unsigned acc = 0;
  for (; i + 3 * s < n16; i += 4 * s) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + s), c = __ldg(p + i + 2 * s), d = __ldg(p + i + 3 * s);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n16; i += s) acc ^= __ldg(p + i).x;
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never taken
}
"""


def measure(be, read, sink, K: int, N: int, gated: bool, f32_out: bool) -> dict[str, float]:
    """Microseconds a call of each way over one product's weights."""
    NW = 2 * N if gated else N
    w, x = be.zeros((NW, K)), be.zeros((1, K))  # the values do not change the time
    nbytes = NW * K * 2
    got = {}
    if gated:
        act, gu = be.zeros((1, N)), be.zeros((1, NW))
        got["product"] = graph_us(be, lambda: be.matmul_silu_mul(x, w, out=act, gate_up=gu))
        got["ungated"] = graph_us(be, lambda: be.matmul(x, w, out=gu))
    else:
        out = be.zeros((1, N), dtype=np.float32 if f32_out else None)
        got["product"] = graph_us(be, lambda: be.matmul(x, w, out=out))

    def read_all():
        with be.stream:
            read((8 * be.num_sms,), (256,), (w, np.int64(nbytes // 16), sink))

    got["read"] = graph_us(be, read_all)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which products (comma-separated)")
    a = ap.parse_args()
    import cupy

    be = CudaBackend(dtype=ml_dtypes.bfloat16)
    read = cupy.RawModule(code=READ_SRC, options=("-std=c++17",)).get_function("stream_read")
    sink = cupy.zeros(1, dtype=np.uint32)
    rows = []
    for name in a.shapes.split(","):
        K, N, gated, f32_out = SHAPES[name]
        nbytes = (2 * N if gated else N) * K * 2
        for way, us in measure(be, read, sink, K, N, gated, f32_out).items():
            tbs = nbytes / (us * 1e-6) / 1e12
            rows.append({"shape": name, "way": way, "us": round(us, 2), "TB/s": round(tbs, 3)})
            print(f"{name:8s} {way:10s} {us:8.2f} us  {tbs:5.3f} TB/s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
