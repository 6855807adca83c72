"""Benchmarks: `python -m minillm.bench serve` (a concurrency ladder against any OpenAI-compatible
server, like `vllm bench serve`) and `python -m minillm.bench throughput` (offline, through
minillm.LLM, nano-vllm's workload). Workloads live in dataset.py, statistics and output in report.py."""
