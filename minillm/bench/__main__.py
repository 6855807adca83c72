"""python -m minillm.bench COMMAND ...: dispatch to each benchmark's own argument parser."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "serve": "minillm.bench.serve",
    "throughput": "minillm.bench.throughput",
    "decode": "minillm.bench.decode",
    "hf": "minillm.bench.hf_reference",
    "hf-batch": "minillm.bench.hf_batch",
    "spec": "minillm.bench.spec",
    "spec-cost": "minillm.bench.spec_cost",
}

USAGE = """usage: python -m minillm.bench {serve,throughput,decode,hf,hf-batch,spec,spec-cost} [options]

  serve       concurrency ladder against an OpenAI-compatible server (like `vllm bench serve`)
  throughput  offline throughput through minillm.LLM (nano-vllm's workload)
  decode      single-stream decode speed against the HBM roofline, split by kernel on the GPU
  hf          HF transformers' single-stream decode on the same workload (the reference)
  hf-batch    HF transformers' continuous batching on the throughput workload
  spec        acceptance and speedup of n-gram and self-drafting on copy-friendly prompts
  spec-cost   price of a rejected speculation round, and speedup against acceptance (GPU)

`python -m minillm.bench COMMAND --help` lists a command's options."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    module = COMMANDS.get(command)
    if module is not None:  # imported on demand: each benchmark pulls in only what it needs
        return importlib.import_module(module).main(rest)
    print(f"unknown benchmark {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C outside a ladder's rungs (which report what finished): stop quietly
        sys.exit(130)
