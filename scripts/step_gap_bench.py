"""What the stream operations around a decode step's CUDA graph cost on the device.

    python scripts/step_gap_bench.py MODEL_DIR [--ctx 512] [--iters 200]

With async scheduling the host is ahead of the device, so a batch-1 decode step costs the
device its graph plus what the runner queues around it. Until session 59 that was two host-to-device
copies (the packed step buffer, the block-table rows), fill_input_ids (a kernel: the input id the
previous step sampled, still on the device) and a device-to-host copy of the sampled id: ~19 us of
0.72 ms on the 0.6B shape (bench decode's async figure against its graph's). Since then it is one
stage_inputs launch (the step's rows read by the device from pinned host memory, the fill with
them, and the previous step's ids stored into pinned host memory: part316 measured why).

Builds the engine over MODEL_DIR (max_num_seqs 1), prefills a --ctx prompt, decodes a few steps,
then queues --iters back-to-back iterations of each body below between two CUDA events (the host
stays ahead: nothing waits inside a loop) and prints microseconds an iteration, median of 3
loops, and each body's excess over the graph alone. The bodies re-run the same step (same inputs,
same KV slot), which is all a timing needs. The old way is emulated beside the new, and the parts
of each, and the same operations captured into one graph.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams

STAGE_SRC = r"""
extern "C" __global__ void stage_in(const int4* __restrict__ src, int4* __restrict__ dst, int n16) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += gridDim.x * blockDim.x)
        dst[i] = src[i];
}
extern "C" __global__ void copy_out(const int* __restrict__ src, int* __restrict__ dst, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    engine = LLMEngine(model=ns.model, device="cuda", max_num_seqs=1, max_model_len=ns.ctx + 64)
    be, runner = engine.backend, engine.runner
    cp, stream = be.cp, be.stream
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 1000, ns.ctx).tolist()
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), request_id="r")
    for _ in range(8):
        engine.step()
    be.synchronize()
    g = runner.graphs[(1, 1)]
    buf, d = runner.buf, runner.buf.dev
    R = runner._logits_rows(1, 1)
    n_up = d["out_tokens"].data.ptr - buf.packed_dev.data.ptr  # the host-written part of the buffer
    rt = cp.cuda.runtime
    pin_out = cp.cuda.alloc_pinned_memory(64)
    pin_in = cp.cuda.alloc_pinned_memory(n_up)
    np.frombuffer(pin_in, np.uint8, n_up)[:] = buf.packed_host[:n_up]
    mod = cp.RawModule(code=STAGE_SRC)
    stage_in, copy_out = mod.get_function("stage_in"), mod.get_function("copy_out")
    src_rows, out_tokens, input_ids = d["src_rows"][:1], d["out_tokens"][:1], d["input_ids"][:1]
    readback = runner.readback
    ev = cp.cuda.Event()

    def upload():  # the runner's: the step's rows, read by the device from pinned memory, and the fill
        buf.upload(2, 1, R, fill_from=d["out_tokens"])

    def upload_and_read_back():  # the runner's async plain step: the previous ids' copy rides on the upload
        buf.upload(2, 1, R, fill_from=d["out_tokens"], copy_out=(out_tokens, readback.host[0]))
        ev.record(stream)

    def read_back():  # TokenReadback.start: a kernel's stores into a pinned slot, an event
        be.copy_to_pinned(readback.host[0], out_tokens)
        ev.record(stream)

    bt = d["block_tables"][:2]
    bt_at = bt.data.ptr - buf.packed_dev.data.ptr

    def old_upload():  # before session 59: the host-written buffer, then the block-table rows, by the
        # copy engine, an event behind each (cuda_ops.copy_from_host)
        rt.memcpyAsync(buf.packed_dev.data.ptr, pin_in.ptr, n_up, rt.memcpyHostToDevice, stream.ptr)
        ev.record(stream)
        rt.memcpyAsync(bt.data.ptr, pin_in.ptr + bt_at, bt.nbytes, rt.memcpyHostToDevice, stream.ptr)
        ev.record(stream)

    def old_read_back():
        d2h()
        ev.record(stream)

    def fill():
        be.fill_input_ids(input_ids, d["out_tokens"], src_rows)

    def h2d(n):
        rt.memcpyAsync(buf.packed_dev.data.ptr, pin_in.ptr, n, rt.memcpyHostToDevice, stream.ptr)

    def d2h():
        rt.memcpyAsync(pin_out.ptr, out_tokens.data.ptr, 4, rt.memcpyDeviceToHost, stream.ptr)

    def mapped_in():
        with stream:
            stage_in((8,), (256,), (pin_in.ptr, buf.packed_dev.data.ptr, np.int32(n_up // 16)))

    def mapped_out():
        with stream:
            copy_out((1,), (32,), (out_tokens.data.ptr, pin_out.ptr, np.int32(1)))

    def forward():
        runner._forward_and_sample(2, 1, R, 1)

    be.unseal()
    try:
        all_in = be.capture_graph(lambda: (h2d(n_up), fill(), forward(), d2h()))
        mapped_graph = be.capture_graph(lambda: (mapped_in(), fill(), forward(), mapped_out()))
    finally:
        be.seal()
    bodies = {
        "graph": [g.replay],
        "the runner's async step: upload (stage_inputs: the fill, the previous ids' copy) + graph":
            [upload_and_read_back, g.replay],
        "upload (stage_inputs, with the fill) + graph + readback (copy_to_pinned)": [upload, g.replay, read_back],
        "the old async step: two copies + fill + graph + D2H copy": [old_upload, fill, g.replay, old_read_back],
        "upload (stage_inputs, with the fill) + graph": [upload, g.replay],
        "old: two copies + graph": [old_upload, g.replay],
        "graph + readback (copy_to_pinned)": [g.replay, read_back],
        "fill + graph": [fill, g.replay],
        "graph + D2H copy": [g.replay, d2h],
        "64-byte copy + graph": [lambda: h2d(64), g.replay],
        "event record + graph": [lambda: ev.record(stream), g.replay],
        "whole buffer by a mapped-memory kernel + graph": [mapped_in, g.replay],
        "one graph: whole-buffer copy + fill + forward + D2H copy": [all_in.replay],
        "one graph: mapped whole buffer + fill + forward + mapped copy-out": [mapped_graph.replay],
    }

    def loop(body) -> float:
        s, e = cp.cuda.Event(), cp.cuda.Event()
        for f in body:  # warm-up
            f()
        s.record(stream)
        for _ in range(ns.iters):
            for f in body:
                f()
        e.record(stream)
        e.synchronize()
        return cp.cuda.get_elapsed_time(s, e) * 1e3 / ns.iters

    results = {}
    for _rep in range(3):
        for name, body in bodies.items():
            results.setdefault(name, []).append(loop(body))
    base = float(np.median(results["graph"]))
    print(f"host-written buffer {n_up} bytes, iterations {ns.iters}")
    out = {}
    for name, ts in results.items():
        m = float(np.median(ts))
        out[name] = {"us": m, "excess_us": m - base, "runs": ts}
        print(f"{m:9.2f} us  (+{m - base:6.2f})  {name}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"host_bytes": n_up, "iters": ns.iters, "bodies": out}, f, indent=1)


if __name__ == "__main__":
    main()
