"""`python -m minillm.bench hf-batch [MODEL]`: HF transformers' continuous batching on nano-vllm's workload.

    python -m minillm.bench hf-batch /data/qwen3-0.6b-random --device cuda

The baseline beside `python -m minillm.bench throughput`: the same 256 prompts and per-request
output lengths (minillm.bench.dataset.nano_vllm_workload, same seed), fed to transformers'
ContinuousBatchingManager (what `generate_batch` runs) with paged SDPA attention, temperature 0.6,
eos unreachable. Prints output tok/s and the total time; --result-json writes them.
Needs torch and transformers (the [test] extra).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from minillm.args import STARTUP_ERRORS, CliParser
from minillm.bench.dataset import allowed_token_ids, load_tokenizer, nano_vllm_workload
from minillm.bench.hf_reference import hf_model_source
from minillm.bench.report import check_output_path, need, need_cuda, save_json


def check_args(ns: argparse.Namespace) -> None:
    """Refuse flags the run cannot use before loading anything (a ValueError naming the flag)."""
    need(ns.num_seqs >= 1 and 1 <= ns.min_len <= ns.max_len,
         f"--num-seqs must be >= 1 and 1 <= --min-len <= --max-len, got {ns.num_seqs}, {ns.min_len}, {ns.max_len}")
    need(math.isfinite(ns.temperature) and ns.temperature >= 0,
         f"--temperature must be a finite number >= 0, got {ns.temperature}")
    need(math.isfinite(ns.timeout) and ns.timeout > 0,
         f"--timeout must be a finite number of seconds > 0, got {ns.timeout}")
    check_output_path(ns.result_json, "--result-json")


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.bench hf-batch", description=__doc__)
    p.add_argument("model", nargs="?", default=None, help="HF directory or GGUF file (default: embedded SmolLM2)")
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attn-implementation", default="paged|sdpa")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    p.add_argument("--result-json", default=None)
    ns = p.parse_args(argv)
    try:
        check_args(ns)
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        from minillm.models.loader import resolve_model_path

        need_cuda(torch, ns.device)

        path = resolve_model_path(ns.model)
        source, kw = hf_model_source(path)
        # not a model transformers reads: said here, not as three attention implementations' refusals
        AutoConfig.from_pretrained(source, **kw)
    except STARTUP_ERRORS as e:  # bad flags, no torch / transformers, no such model
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype = torch.float32 if ns.device == "cpu" else torch.bfloat16
    # the paged SDPA implementation's name changed across transformers 5.x releases
    for attn in dict.fromkeys([ns.attn_implementation, "paged|sdpa", "sdpa_paged", "sdpa"]):
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation=attn, **kw)
            break
        except ValueError as e:
            print(f"attn_implementation={attn!r} refused: {str(e)[:200]}", file=sys.stderr)
    else:
        raise SystemExit("no paged attention implementation accepted by this transformers")
    model = model.to(ns.device).eval()
    # as `bench throughput` refuses it: positions past the model's context, which transformers only warned of
    context = getattr(model.config, "max_position_embeddings", None)
    if context is not None and 2 * ns.max_len > context:
        print(f"error: --max-len {ns.max_len}: a prompt and its output of up to {ns.max_len} tokens each need "
              f"{2 * ns.max_len} positions, past the model's context ({context}); give --max-len <= {context // 2}",
              file=sys.stderr)
        return 2
    vocab = model.config.vocab_size
    # the very prompts and lengths `minillm.bench throughput` draws: same allowed ids, same seed
    allowed = [int(i) for i in allowed_token_ids(load_tokenizer(str(path))) if i < vocab]
    prompts, out_lens = nano_vllm_workload(allowed, ns.num_seqs, ns.min_len, ns.max_len, ns.seed)
    unreachable_eos = vocab + 1  # ignore_eos: generation stops at each request's max_new_tokens
    gc = GenerationConfig(max_new_tokens=max(out_lens), do_sample=ns.temperature > 0,
                          temperature=ns.temperature, eos_token_id=unreachable_eos, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=gc)
    manager.start()
    try:
        manager.add_request(prompts[0][:16], max_new_tokens=4, eos_token_id=unreachable_eos)  # warm-up
        manager.get_result(timeout=ns.timeout)
        t0 = time.perf_counter()
        for ids, n in zip(prompts, out_lens):
            manager.add_request(ids, max_new_tokens=n, eos_token_id=unreachable_eos)
        done, out_tok, failed = 0, 0, 0
        while done < len(prompts) and time.perf_counter() - t0 < ns.timeout:
            r = manager.get_result(timeout=1.0)
            if r is None or not r.is_finished():
                continue
            done += 1
            out_tok += len(r.generated_tokens)
            failed += r.error is not None
        dt = time.perf_counter() - t0
    finally:
        manager.stop(block=True, timeout=30)
    in_tok = sum(len(x) for x in prompts)
    result = {"engine": "transformers generate_batch (ContinuousBatchingManager)", "model": str(path),
              "device": ns.device, "dtype": str(dtype), "attn_implementation": attn,
              "transformers": __import__("transformers").__version__, "num_seqs": ns.num_seqs,
              "finished": done, "failed": failed, "output_tokens": out_tok,
              "expected_output_tokens": sum(out_lens), "time_s": dt, "output_tok_s": out_tok / dt,
              "total_tok_s": (in_tok + out_tok) / dt}
    print(f"transformers continuous batching {path.name} on {ns.device}: {done}/{len(prompts)} "
          f"finished, {out_tok} tokens in {dt:.2f} s: {out_tok / dt:.1f} output tok/s")
    if ns.result_json and not save_json(ns.result_json, result):
        return 2
    return 0 if done == len(prompts) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
