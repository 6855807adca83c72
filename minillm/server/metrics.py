"""Prometheus metrics for GET /metrics, in a CollectorRegistry of the app's own.

Engine state (queues, KV blocks, token counters, speculation) is read at scrape time from the
stats snapshot the engine thread keeps; request latencies are observed by the HTTP handlers.
Names follow vLLM's with a `minillm:` prefix so existing dashboards translate one to one.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from minillm.server.async_engine import AsyncEngine

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0)
_TOKENS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))  # 1, 2, 5, 10, ... 5e6: vLLM's 1-2-5 steps
_E2E = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0)


class _EngineCollector(Collector):
    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    def collect(self):
        s = self.engine.stats

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"minillm:{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"minillm:{name}", doc, value=value)

        yield gauge("engine_healthy", "1 while the engine loop runs", float(self.engine.healthy))
        yield gauge("num_requests_running", "Requests in the running batch", s.running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled", s.waiting)
        yield gauge("kv_cache_blocks_used", "KV blocks held by requests", s.blocks_used)
        yield gauge("kv_cache_blocks_total", "KV blocks in the pool", s.blocks_total)
        yield gauge("kv_cache_blocks_cached", "Free KV blocks kept for prefix reuse", s.blocks_cached)
        yield gauge("kv_cache_usage_perc", "Fraction of KV blocks held by requests",
                    s.blocks_used / s.blocks_total if s.blocks_total else 0.0)
        yield gauge("prefix_cache_hit_rate", "Prefix-cache hits / queries since start", s.prefix_cache_hit_rate)
        yield counter("num_preemptions", "Preemptions (requests recomputed after their KV was taken)",
                      s.preemptions)
        yield counter("prompt_tokens", "Prompt tokens admitted", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens)
        for key, value in sorted((s.spec or {}).items()):  # speculative decoding, when enabled
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield gauge(f"spec_decode_{key}", f"Speculative decoding: {key}", value)


class Metrics:
    def __init__(self, engine: AsyncEngine):
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("minillm:time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram("minillm:time_per_output_token_seconds", "Mean time per output token after the "
                              "first, per request", buckets=_LATENCY, registry=r)
        self.e2e = Histogram("minillm:e2e_request_latency_seconds", "Request latency, arrival to last token",
                             buckets=_E2E, registry=r)
        self.finished = Counter("minillm:request_success", "Finished requests by reason",
                                ["finished_reason"], registry=r)
        self.queue = Histogram("minillm:request_queue_time_seconds", "Time from a request's admission by the "
                               "engine to its first scheduled step, per engine request (choice)",
                               buckets=_LATENCY, registry=r)
        self.prompt_tokens = Histogram("minillm:request_prompt_tokens", "Prompt tokens per finished engine "
                                       "request (choice)", buckets=_TOKENS, registry=r)
        self.generation_tokens = Histogram("minillm:request_generation_tokens", "Generated tokens per finished "
                                           "engine request (choice)", buckets=_TOKENS, registry=r)
        r.register(_EngineCollector(engine))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def timer(self) -> RequestTimer:
        return RequestTimer(self)


class RequestTimer:
    """Latency bookkeeping for one request, from its arrival at the handler."""

    def __init__(self, metrics: Metrics):
        self.m = metrics
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.n = 0
        self._done = False

    def output(self, out) -> None:
        """One engine output (RequestOutput) of one of the request's choices: its tokens, its time in
        the queue (on its first output), its prompt and generated token counts (on its last)."""
        self.tokens(len(out.new_token_ids))
        if out.queued_s is not None:
            self.m.queue.observe(out.queued_s)
        if out.finished:
            self.m.prompt_tokens.observe(out.num_prompt_tokens)
            self.m.generation_tokens.observe(out.output_len)

    def tokens(self, n: int) -> None:
        if n and self.t_first is None:
            self.t_first = time.perf_counter()
            self.m.ttft.observe(self.t_first - self.t0)
        self.n += n

    def done(self, reason: str) -> None:
        if self._done:
            return
        self._done = True
        t = time.perf_counter()
        self.m.finished.labels(reason).inc()
        if reason in ("stop", "length"):
            self.m.e2e.observe(t - self.t0)
            if self.n > 1 and self.t_first is not None:
                self.m.tpot.observe((t - self.t_first) / (self.n - 1))
