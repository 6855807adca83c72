"""python -m minillm.bench hf [MODEL]: HF transformers' single-stream decode on the same workload.

The reference every minillm figure is put beside: greedy decode of --output-len tokens after a
random --input-len prompt, eos ignored, timed after a warm-up run. `--static-cache --compile`
use a static KV cache and torch.compile (what transformers recommends for fast decode). Needs
torch and transformers (the [test] extra); a GGUF model is loaded through transformers' GGUF
support, so both engines read the very same file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from minillm.args import STARTUP_ERRORS, CliParser
from minillm.bench.report import check_output_path, need, need_cuda, save_json


def decode_rate(output_len: int, full_s: float, one_s: float) -> float:
    """Decode tokens a second: the output_len - 1 tokens after the first over the time a run of
    output_len takes beyond a run of one. A run that took no longer than the one-token run (timing
    noise on a short --output-len) gave a negative or infinite rate, reported as a measurement."""
    need(full_s > one_s, f"the {output_len}-token run ({full_s:.4f} s) took no longer than the 1-token run "
                         f"({one_s:.4f} s): the decode time is lost in the noise; give a larger --output-len")
    return (output_len - 1) / (full_s - one_s)


def hf_model_source(path: Path) -> tuple[Path, dict]:
    """(what transformers' from_pretrained takes, its extra arguments) for an HF directory or a GGUF
    file. A GGUF file is read by minillm's checked reader first: transformers' own failed a truncated
    one with a struct.error traceback, and hf-batch passed the file where a directory goes."""
    if path.suffix != ".gguf":
        return path, {}
    from minillm.models.gguf_loader import open_gguf

    open_gguf(path, str(path))
    return path.parent, {"gguf_file": path.name}


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_args(ns: argparse.Namespace) -> None:
    """Refuse flags the run cannot use before loading torch (a ValueError naming the flag)."""
    need(ns.input_len >= 1, f"--input-len must be >= 1, got {ns.input_len}")
    # the decode speed is output_len - 1 tokens over the time a 1-token run does not take
    need(ns.output_len >= 2, f"--output-len must be >= 2, got {ns.output_len}")
    # without --compile the mode was ignored, silently
    need(ns.compile_mode is None or ns.compile, f"--compile-mode {ns.compile_mode} needs --compile")
    check_output_path(ns.result_json, "--result-json")


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.bench hf", description=__doc__)
    p.add_argument("model", nargs="?", default=None, help="HF directory or .gguf (default: embedded SmolLM2)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="float32 on cpu, bfloat16 on cuda by default")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128,
                   help="tokens generated (>= 2: the first comes from the prefill)")
    p.add_argument("--static-cache", action="store_true")
    p.add_argument("--compile", action="store_true")
    # choices: torch.compile's documented modes (another failed at the first generate, after the load)
    p.add_argument("--compile-mode", default=None, choices=COMPILE_MODES,
                   help="torch.compile mode, with --compile (default: default; reduce-overhead failed inside the "
                        "static cache on the H200)")
    p.add_argument("--result-json", default=None)
    ns = p.parse_args(argv)
    try:
        check_args(ns)
        import torch
        from transformers import AutoModelForCausalLM

        from minillm.models.loader import resolve_model_path

        need_cuda(torch, ns.device)

        path = resolve_model_path(ns.model)
        dtype = getattr(torch, ns.dtype or ("float32" if ns.device == "cpu" else "bfloat16"))
        source, kw = hf_model_source(path)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kw)
        model = model.to(ns.device).eval()
        # transformers only warned past the model's context, then timed positions it was never trained on
        # (and minillm's decode refuses them): not the reference run
        context = getattr(model.config, "max_position_embeddings", None)
        need(context is None or ns.input_len + ns.output_len <= context,
             f"--input-len {ns.input_len} + --output-len {ns.output_len} = {ns.input_len + ns.output_len} "
             f"tokens exceed the model's context ({context} positions); give lengths that sum to at most {context}")
    except STARTUP_ERRORS as e:  # bad flags, no torch / transformers, a model they cannot load, no GPU
        print(f"error: {e}", file=sys.stderr)
        return 2
    compile_mode = ns.compile_mode or "default"
    if ns.compile:
        model.forward = torch.compile(model.forward, mode=compile_mode)
    vocab = model.config.vocab_size
    ids = torch.tensor([np.random.default_rng(0).integers(0, min(vocab, 32000), ns.input_len).tolist()],
                       device=ns.device)
    gen = dict(do_sample=False, min_new_tokens=ns.output_len, max_new_tokens=ns.output_len,
               pad_token_id=0, eos_token_id=None)
    if ns.static_cache:
        gen["cache_implementation"] = "static"

    def timed(n: int) -> float:
        if ns.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, **{**gen, "min_new_tokens": n, "max_new_tokens": n})
        if ns.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    timed(ns.output_len)  # warm-up (and compilation)
    full, one = timed(ns.output_len), timed(1)  # subtract the prefill to leave decode alone
    try:
        tok_s = decode_rate(ns.output_len, full, one)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {"engine": "transformers", "model": str(path), "device": ns.device, "dtype": str(dtype),
              "static_cache": ns.static_cache, "compile": ns.compile and compile_mode, "input_len": ns.input_len,
              "output_len": ns.output_len, "decode_tok_per_s": tok_s}
    print(f"transformers {path.name} on {ns.device}: {tok_s:.1f} tok/s decode")
    if ns.result_json and not save_json(ns.result_json, result):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
