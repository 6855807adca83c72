"""python -m minillm.bench decode [MODEL]: single-stream decode speed against the HBM roofline.

One request with a random --input-len prompt decodes --output-len tokens greedily (eos ignored), or
sampled with --temperature / --top-p / --top-k (seed 0: the same tokens in both passes).
Each decode step is timed on the host after its tokens reach the host (so the device is idle),
warm-up steps dropped, median reported (median_step_ms, tok_per_s: the synchronous engine, the
device waits for the host between steps). Then, unless --no-async-scheduling, the same prompt
decodes again with async scheduling, where step n + 1 is launched before step n's token is back:
pipelined_step_ms is the wall time per token over its timed steps (warm-up dropped), the speed
a generate() sees; median_step_ms minus it is the host time the pipelining hid, and it cannot go
below median_graph_ms (the device time of a step). The roofline is bytes read per step (every
weight once, plus the KV cache) over the copy bandwidth measured in the same run with CUDA events. On the
GPU, one extra eager step is replayed op by op between CUDA events for the time split by kernel.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np

from minillm.args import STARTUP_ERRORS, CliParser, EngineArgs, add_engine_args
from minillm.bench.gpu_timing import record_replays, replay_ms
from minillm.bench.report import (
    add_sampling_flags,
    check_output_path,
    check_sampling_flags,
    context_error,
    need,
    save_json,
)

OPS = ("embed", "rms_norm", "qk_norm_rope", "qk_norm_rope_store_kv", "decode_step_attention", "matmul",
       "matmul_silu_mul", "rms_norm_matmul", "rms_norm_matmul_silu_mul", "silu_mul", "store_kv", "paged_attention",
       "gather_rows", "copy", "sample", "decode_layers")


def copy_bandwidth(backend, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (median of 10)."""
    cp = backend.cp
    backend.unseal()
    try:
        a = cp.empty(nbytes // 2, dtype=np.uint8)
        b = cp.empty_like(a)
    finally:
        backend.seal()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(13):
        s.record(backend.stream)
        with backend.stream:
            b[...] = a
        e.record(backend.stream)
        e.synchronize()
        if i >= 3:
            times.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
    del a, b
    return nbytes / float(np.median(times))


def weight_bytes(model) -> int:
    """Weight bytes one decode step reads: every layer's weights, the final norm and the LM head.
    The embedding table counts only where it is also the LM head (tied): otherwise a step reads
    one row of it per token, not the table (Qwen3-8B's untied 1.24 GB table counted once made its
    roofline 254 tok/s instead of ~275 at the same bandwidth: session 15)."""
    def fields(obj) -> list:  # a layer's arrays, and those of the dataclasses in it (DFlash2's convs)
        values = [getattr(obj, f) for f in obj.__dataclass_fields__]
        return [a for v in values if v is not None for a in (fields(v) if hasattr(v, "__dataclass_fields__") else [v])
                if hasattr(a, "nbytes")]

    arrays = [model.norm, model.lm_head]
    for lw in model.layers:
        arrays += fields(lw)
    return int(sum(a.nbytes for a in arrays))


def per_op_times(engine) -> dict[str, float]:
    """Time one eager decode step op by op with CUDA events: {op: microseconds}. An op that calls
    another timed op (decode_step_attention its o product's matmul) is charged its own time only,
    the inner op the rest, so no time counts twice."""
    be = engine.backend
    cp = be.cp
    totals: dict[str, float] = defaultdict(float)
    originals = {}
    pending = []  # (name, start, end, index of the enclosing call or -1)
    open_calls: list[int] = []

    def wrap(name):
        fn = getattr(be, name)

        def timed(*a, **kw):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            i = len(pending)
            pending.append((name, s, e, open_calls[-1] if open_calls else -1))
            open_calls.append(i)
            s.record(be.stream)
            try:
                return fn(*a, **kw)
            finally:
                e.record(be.stream)
                open_calls.pop()
        return timed

    for name in OPS:
        originals[name] = getattr(be, name)
        setattr(be, name, wrap(name))
    graphs, engine.runner.graphs = engine.runner.graphs, {}
    try:
        engine.step()
        be.synchronize()
    finally:
        engine.runner.graphs = graphs
        for name, fn in originals.items():
            setattr(be, name, fn)
    spans = [cp.cuda.get_elapsed_time(s, e) * 1e3 for _, s, e, _ in pending]
    own = list(spans)
    for i, (_, _, _, parent) in enumerate(pending):
        if parent >= 0:
            own[parent] -= spans[i]
    for (name, _, _, _), t in zip(pending, own):
        totals[name] += t
    return dict(totals)


def pipelined(engine, prompt: list[int], params, warmup: int) -> dict:
    """Decode the prompt again with async scheduling on: wall time per token over the timed steps."""
    engine.async_scheduling = True
    engine.add_request(prompt, params, request_id="decode-async")
    while engine.requests["decode-async"].num_computed < len(prompt):
        engine.step()  # prefill (prefix-cache hits from the first pass make it short)
    pipelined_before = engine.num_pipelined_steps
    steps = []
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        steps.append((time.perf_counter() - t, sum(len(o.new_token_ids) for o in outs)))
    timed = steps[warmup:]
    wall, tokens = sum(s for s, _ in timed), sum(n for _, n in timed)
    return {"pipelined_step_ms": 1e3 * wall / tokens, "pipelined_tok_per_s": tokens / wall,
            "pipelined_steps": engine.num_pipelined_steps - pipelined_before}


def run(engine, input_len: int, output_len: int, warmup: int = 8, async_pass: bool = True,
        temperature: float = 0.0, top_p: float = 1.0, top_k: int = -1) -> dict:
    from minillm.sampling_params import SamplingParams

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, min(engine.config.vocab_size, engine.tokenizer.vocab_size), input_len).tolist()
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=output_len + 1,
                            ignore_eos=True, seed=0 if temperature > 0 else None)
    engine.async_scheduling = False  # the first pass: synchronous steps, timed one by one
    engine.add_request(prompt, params, request_id="decode")
    t0 = time.perf_counter()
    engine.step()  # prefill (a single chunk when input_len <= max_num_batched_tokens)
    while engine.requests["decode"].num_computed < input_len:
        engine.step()
    ttft = time.perf_counter() - t0
    steps = []
    ops: dict[str, float] = {}
    replays: list = []
    if engine.backend.name == "cuda" and engine.runner.graphs:
        replays = record_replays(engine.runner, engine.backend)
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        steps.append((time.perf_counter() - t, sum(len(o.new_token_ids) for o in outs)))
        if len(steps) == output_len // 2 and engine.backend.name == "cuda" and engine.has_unfinished():
            ops = per_op_times(engine)
    engine.runner.replay_timer = None
    timed = steps[warmup:]
    graph_ms = replay_ms(engine.backend, replays[warmup:])
    step_s = float(np.median([s for s, _ in timed]))
    tokens_per_step = float(np.mean([n for _, n in timed]))
    result = {"input_len": input_len, "output_len": output_len, "temperature": temperature, "top_p": top_p,
              "top_k": top_k, "ttft_s": ttft, "median_step_ms": step_s * 1e3,
              "tokens_per_step": tokens_per_step, "tok_per_s": tokens_per_step / step_s,
              "device": engine.backend.name, "graphs": bool(engine.runner.graphs)}
    if graph_ms:  # the step's device time alone; the rest of median_step_ms is host work
        result["median_graph_ms"] = float(np.median(graph_ms))
    if async_pass:
        result.update(pipelined(engine, prompt, params, warmup))
    if engine.backend.name == "cuda":
        kv = engine.config.kv_bytes_per_token(2) * (input_len + output_len // 2)
        add_roofline(result, weight_bytes(engine.model), kv, copy_bandwidth(engine.backend))
        result["eager_step_op_us"] = ops
    return result


def add_roofline(result: dict, weight_bytes: int, kv_bytes: int, bandwidth: float) -> None:
    """A step reads every weight once and the KV cache (at mid-generation): the roofline is that
    many bytes at the copy bandwidth, and each measured speed a fraction of it (the async figure,
    the one the report quotes, where the run has it)."""
    roofline = bandwidth / (weight_bytes + kv_bytes)
    result.update(weight_bytes=weight_bytes, kv_bytes_mid=kv_bytes, copy_bw_Bps=bandwidth,
                  roofline_tok_per_s=roofline, fraction_of_roofline=result["tok_per_s"] / roofline)
    if "pipelined_tok_per_s" in result:
        result["pipelined_fraction_of_roofline"] = result["pipelined_tok_per_s"] / roofline


WARMUP_STEPS = 8  # decode steps of each pass dropped before timing


def check_args(ns: argparse.Namespace) -> None:
    """Refuse lengths the run cannot time: with --output-len at or below the warm-up steps no
    timed step is left (a median of nothing, a division by zero tokens)."""
    need(ns.input_len >= 1, f"--input-len must be >= 1, got {ns.input_len}")
    check_sampling_flags(ns)
    need(ns.output_len > WARMUP_STEPS,
         f"--output-len must be > {WARMUP_STEPS} (the warm-up steps dropped before timing), got {ns.output_len}")
    # the request asks output_len + 1 tokens; a shorter context failed in add_request with a traceback
    need(ns.max_model_len is None or ns.max_model_len >= ns.input_len + ns.output_len + 1,
         f"--max-model-len {ns.max_model_len} is below --input-len {ns.input_len} + --output-len {ns.output_len} "
         f"+ 1 = {ns.input_len + ns.output_len + 1}; give at least that, or leave it out")
    check_output_path(ns.result_json, "--result-json")


SPARE_POSITIONS = 16  # the default --max-model-len's room past the prompt and its output


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.bench decode", description=__doc__)
    add_engine_args(p)
    p.set_defaults(max_num_seqs=1)  # one stream; an explicit --max-num-seqs is kept (a graph bucket's size)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256,
                   help=f"decode steps (> {WARMUP_STEPS}: the first {WARMUP_STEPS} are not timed)")
    add_sampling_flags(p, 0.0, "the stream's")
    p.add_argument("--result-json", default=None)
    ns = p.parse_args(argv)
    from minillm.engine.engine import LLMEngine

    derived = ns.max_model_len is None
    max_model_len = ns.input_len + ns.output_len + SPARE_POSITIONS
    try:
        check_args(ns)
        args = EngineArgs.from_cli(ns)
        if derived:
            args.max_model_len = max_model_len
        engine = LLMEngine(args)
    except STARTUP_ERRORS as e:  # bad flags, a bad model or tokenizer, no GPU
        message = str(e) if not derived else context_error(
            e, f"--input-len {ns.input_len} + --output-len {ns.output_len}", max_model_len, SPARE_POSITIONS)
        print(f"error: {message}", file=sys.stderr)
        return 2
    r = run(engine, ns.input_len, ns.output_len, WARMUP_STEPS, async_pass=args.async_scheduling is not False,
            temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k)
    r["model"] = engine.model_name
    sampled = (f" sampled (temperature {ns.temperature}, top_p {ns.top_p}, top_k {ns.top_k})"
               if ns.temperature > 0 else "")
    line = f"{r['model']}{sampled}: {r['tok_per_s']:.1f} tok/s (median step {r['median_step_ms']:.3f} ms"
    line += f", of which the CUDA graph {r['median_graph_ms']:.3f} ms)" if "median_graph_ms" in r else ")"
    if "pipelined_step_ms" in r:
        line += (f"; async scheduling: {r['pipelined_tok_per_s']:.1f} tok/s "
                 f"({r['pipelined_step_ms']:.3f} ms per token)")
    if "roofline_tok_per_s" in r:
        line += (f"; roofline {r['roofline_tok_per_s']:.0f} tok/s at {r['copy_bw_Bps'] / 1e12:.2f} TB/s: "
                 f"synchronous {100 * r['fraction_of_roofline']:.1f}% of it")
        if "pipelined_fraction_of_roofline" in r:
            line += f", async {100 * r['pipelined_fraction_of_roofline']:.1f}%"
        ops = r["eager_step_op_us"]
        total = sum(ops.values())
        line += "\n  eager step by op (us): " + ", ".join(
            f"{k} {v:.0f} ({100 * v / total:.0f}%)" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]))
    print(line)
    if ns.result_json and not save_json(ns.result_json, r):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
