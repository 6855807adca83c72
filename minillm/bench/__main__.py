"""python -m minillm.bench COMMAND ...: dispatch to each benchmark's own argument parser."""

from __future__ import annotations

import sys

USAGE = """usage: python -m minillm.bench {serve,throughput,decode,hf,spec,spec-cost} [options]

  serve       concurrency ladder against an OpenAI-compatible server (like `vllm bench serve`)
  throughput  offline throughput through minillm.LLM (nano-vllm's workload)
  decode      single-stream decode speed against the HBM roofline, split by kernel on the GPU
  hf          HF transformers' single-stream decode on the same workload (the reference)
  spec        acceptance and speedup of n-gram and self-drafting on copy-friendly prompts
  spec-cost   price of a rejected speculation round, and speedup against acceptance (GPU)

`python -m minillm.bench COMMAND --help` lists a command's options."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from minillm.bench.serve import main as serve_main

        return serve_main(rest)
    if command == "throughput":
        from minillm.bench.throughput import main as throughput_main

        return throughput_main(rest)
    if command == "decode":
        from minillm.bench.decode import main as decode_main

        return decode_main(rest)
    if command == "hf":
        from minillm.bench.hf_reference import main as hf_main

        return hf_main(rest)
    if command == "spec":
        from minillm.bench.spec import main as spec_main

        return spec_main(rest)
    if command == "spec-cost":
        from minillm.bench.spec_cost import main as spec_cost_main

        return spec_cost_main(rest)
    print(f"unknown benchmark {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
