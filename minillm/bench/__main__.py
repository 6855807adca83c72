"""python -m minillm.bench {serve,throughput} ...: dispatch to the benchmark's own argument parser."""

from __future__ import annotations

import sys

USAGE = """usage: python -m minillm.bench {serve,throughput} [options]

  serve       concurrency ladder against an OpenAI-compatible server (like `vllm bench serve`)
  throughput  offline throughput through minillm.LLM (nano-vllm's workload)

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
    print(f"unknown benchmark {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
