"""`python -m minillm.bench throughput [MODEL] [engine flags]`: offline throughput through minillm.LLM.

    python -m minillm.bench throughput /data/qwen3-0.6b-random --device cuda --max-num-seqs 256

nano-vllm's bench.py workload by default: 256 sequences of random token ids, prompt and output
lengths uniform in [100, 1024], eos ignored, temperature 0.6; one untimed warm-up generate first.
Prints output tok/s and the total time; --result-json writes the figures. Engine flags are
minillm.args' (the same as serve's); --seed seeds both the engine and the workload.

--profile times every engine step of the timed run by phase (schedule, prepare, execute with its
device time from CUDA events, post, propose; minillm/engine/step_profile.py) and prints it by step
kind and by decode batch size; the summary goes into --result-json as "step_profile", every step
into --profile-json. Off, nothing is timed; on, a step costs a few microseconds more.

On the GPU each run also measures the copy bandwidth and reports the workload's bytes roofline
(bytes_roofline): the decode steps' unavoidable reads, every sequence's KV cache once a step and
the weights once a step, at that bandwidth; prefill is not counted, so the real floor is higher.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from minillm.args import STARTUP_ERRORS, CliParser, EngineArgs, add_engine_args
from minillm.bench.dataset import allowed_token_ids, nano_vllm_workload
from minillm.bench.report import add_sampling_flags, check_output_path, check_sampling_flags, need, same_file, save_json


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(prog="python -m minillm.bench throughput",
                  description="Offline throughput through minillm.LLM (nano-vllm's workload).")
    add_engine_args(p)
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt and output (tokens)")
    p.add_argument("--max-len", type=int, default=1024, help="longest prompt and output (tokens)")
    add_sampling_flags(p, 0.6, "every request's")
    p.add_argument("--result-json", default=None)
    p.add_argument("--profile", action="store_true",
                   help="time every step of the timed run by phase (schedule / prepare / execute, with "
                        "device time from CUDA events / post / propose) and kind (prefill, mixed, "
                        "decode graph or eager, verify); print the table, add it to --result-json")
    p.add_argument("--profile-json", default=None,
                   help="write the step profile with every step's record here (implies --profile)")
    return p


def bytes_roofline(prompt_lens: list[int], output_lens: list[int], kv_bytes_per_token: int,
                   weight_bytes: int, bandwidth: float) -> dict:
    """The decode steps' floor from bytes alone. A sequence's first token comes from its prefill;
    the step that makes its token j (1 <= j < o) reads its p + j cached keys and values, so it
    reads (o - 1) p + (o - 1) o / 2 tokens' KV in all; every decode step reads the weights once,
    and there are at least max(o) - 1 of them. Time = bytes / bandwidth (bytes per second)."""
    kv_tokens = sum((o - 1) * p + (o - 1) * o // 2 for p, o in zip(prompt_lens, output_lens))
    kv = kv_tokens * kv_bytes_per_token
    weights = weight_bytes * max(0, max(output_lens, default=1) - 1)
    seconds = (kv + weights) / bandwidth
    out = sum(output_lens)
    return {"kv_read_bytes": kv, "weight_read_bytes": weights, "bandwidth_Bps": bandwidth,
            "floor_s": seconds, "roofline_tok_s": out / seconds if seconds > 0 else float("inf")}


def engine_bytes_roofline(engine, prompt_lens: list[int], output_lens: list[int], bandwidth: float) -> dict:
    """bytes_roofline with an engine's KV bytes per token (its storage dtype) and weight bytes."""
    from minillm.bench.decode import weight_bytes

    kv_per_token = engine.config.kv_bytes_per_token(np.dtype(engine.backend.dtype).itemsize)
    return bytes_roofline(prompt_lens, output_lens, kv_per_token, weight_bytes(engine.model), bandwidth)


def run(ns: argparse.Namespace) -> dict:
    """Build the engine, warm it up, time one generate over the whole workload; the JSON-ready result."""
    from minillm import LLM, SamplingParams

    args = EngineArgs.from_cli(ns)
    if ns.num_seqs < 1 or ns.min_len < 1 or ns.max_len < ns.min_len:
        raise ValueError(f"--num-seqs must be >= 1 and 1 <= --min-len <= --max-len, got {ns.num_seqs}, "
                         f"{ns.min_len}, {ns.max_len}")
    check_sampling_flags(ns)
    check_output_path(ns.result_json, "--result-json")
    check_output_path(ns.profile_json, "--profile-json")
    # the result was written over the profile, after "wrote" had been printed for it
    need(not (ns.result_json and ns.profile_json and same_file(ns.result_json, ns.profile_json)),
         f"--profile-json {ns.profile_json} is the file of --result-json {ns.result_json}: give two files")
    try:
        llm = LLM(args.model, **{k: v for k, v in vars(args).items() if k != "model"})
    except STARTUP_ERRORS as e:
        raise ValueError(str(e)) from None
    # a prompt and its output are each up to --max-len: checked here, not mid-generate after the warm-up
    limit = llm.engine.max_model_len
    need(2 * ns.max_len <= limit,
         f"--max-len {ns.max_len}: a prompt and its output of up to {ns.max_len} tokens each need "
         f"{2 * ns.max_len} positions, past max_model_len {limit}; give --max-len <= {limit // 2} (or a "
         "larger --max-model-len, up to the model's context)")
    vocab = min(llm.tokenizer.vocab_size, llm.engine.config.vocab_size)
    allowed = [int(i) for i in allowed_token_ids(llm.tokenizer) if i < vocab]
    prompts, out_lens = nano_vllm_workload(allowed, ns.num_seqs, ns.min_len, ns.max_len, ns.seed)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=ns.temperature, top_p=ns.top_p,
                             top_k=ns.top_k) for n in out_lens]

    llm.generate([prompts[0][:16]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    profiler = None
    if ns.profile or ns.profile_json:
        from minillm.engine.step_profile import StepProfiler

        profiler = StepProfiler(llm.engine)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    if profiler is not None:
        profiler.detach()

    out_tok = sum(len(o.token_ids) for o in outs)
    in_tok = sum(len(p) for p in prompts)
    short = sum(len(o.token_ids) < n for o, n in zip(outs, out_lens))
    result = {
        "benchmark": "throughput", "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "model": llm.engine.model_name, "engine_args": vars(args),
        "workload": {"num_seqs": ns.num_seqs, "min_len": ns.min_len, "max_len": ns.max_len,
                     "temperature": ns.temperature, "top_p": ns.top_p, "top_k": ns.top_k, "seed": ns.seed,
                     "ignore_eos": True},
        "prompt_tokens": in_tok, "output_tokens": out_tok, "expected_output_tokens": sum(out_lens),
        "short_sequences": short, "time_s": dt,
        "output_tok_s": out_tok / dt, "total_tok_s": (in_tok + out_tok) / dt,
    }
    if llm.engine.backend.name == "cuda":
        # machines of one kind differ (23.3k-24.2k tok/s for one build in session 11): each run
        # records its own machine's copy bandwidth, measured after the timed generate
        from minillm.bench.decode import copy_bandwidth

        bw = copy_bandwidth(llm.engine.backend)
        result["copy_bandwidth_tb_s"] = bw / 1e12
        roof = engine_bytes_roofline(llm.engine, [len(p) for p in prompts], out_lens, bw)
        result["bytes_roofline"] = roof
        result["fraction_of_bytes_roofline"] = result["output_tok_s"] / roof["roofline_tok_s"]
    if profiler is not None:
        result["step_profile"] = profiler.summary(dt)
        if ns.profile_json:
            steps = {"summary": result["step_profile"], "steps": profiler.step_table()}
            if save_json(ns.profile_json, steps, "--profile-json"):
                print(f"wrote {ns.profile_json}")
    return result


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        result = run(ns)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Total: {result['output_tokens']} tok, Time: {result['time_s']:.2f} s, "
          f"Throughput: {result['output_tok_s']:.2f} tok/s (prompt + output: {result['total_tok_s']:.2f} tok/s)"
          + (f"; copy bandwidth {result['copy_bandwidth_tb_s']:.2f} TB/s" if "copy_bandwidth_tb_s" in result else ""))
    if "bytes_roofline" in result:
        roof = result["bytes_roofline"]
        print(f"bytes roofline {roof['roofline_tok_s']:.0f} output tok/s (decode steps' KV "
              f"{roof['kv_read_bytes'] / 1e12:.2f} TB + weights {roof['weight_read_bytes'] / 1e12:.2f} TB at the copy "
              f"bandwidth, prefill not counted) -> {100 * result['fraction_of_bytes_roofline']:.1f}% of it")
    if "step_profile" in result:
        from minillm.engine.step_profile import format_summary

        print(format_summary(result["step_profile"]))
    if result["short_sequences"]:
        print(f"error: {result['short_sequences']} sequences stopped before max_tokens although eos is "
              "ignored", file=sys.stderr)
    if ns.result_json:
        if not save_json(ns.result_json, result):
            return 2
        print(f"wrote {ns.result_json}")
    return 1 if result["short_sequences"] else 0


if __name__ == "__main__":
    sys.exit(main())
