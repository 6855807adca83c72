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
    def __init__(self, engine: AsyncEngine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        s, label = self.engine.stats, [self.model_name]

        def family(kind, name: str, doc: str, value: float):
            f = kind(f"minillm:{name}", doc, labels=["model_name"])
            f.add_metric(label, value)
            return f

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return family(GaugeMetricFamily, name, doc, value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return family(CounterMetricFamily, name, doc, value)

        yield gauge("engine_healthy", "1 while the engine loop runs", float(self.engine.healthy))
        yield gauge("num_requests_running", "Requests in the running batch", s.running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled", s.waiting)
        yield gauge("kv_cache_blocks_used", "KV blocks held by requests", s.blocks_used)
        yield gauge("kv_cache_blocks_total", "KV blocks in the pool", s.blocks_total)
        yield gauge("kv_cache_blocks_cached", "Free KV blocks kept for prefix reuse", s.blocks_cached)
        yield gauge("kv_cache_usage_perc", "Fraction of KV blocks held by requests",
                    s.blocks_used / s.blocks_total if s.blocks_total else 0.0)
        yield gauge("prefix_cache_hit_rate", "Prefix-cache hits / queries since start", s.prefix_cache_hit_rate)
        # vLLM's: prompt tokens looked up in the prefix cache, and those found (a hit rate over any window)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache", s.prefix_cache_queries)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache", s.prefix_cache_hits)
        yield counter("num_preemptions", "Preemptions (requests recomputed after their KV was taken)",
                      s.preemptions)
        yield counter("prompt_tokens", "Prompt tokens admitted", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens)
        spec = s.spec or {}
        for key, value in sorted(spec.items()):  # speculative decoding, when enabled: minillm's own figures
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield gauge(f"spec_decode_{key}", f"Speculative decoding: {key}", value)
        if spec:  # and vLLM's counters
            yield counter("spec_decode_num_drafts", "Speculative rounds", spec["rounds"])
            yield counter("spec_decode_num_draft_tokens", "Draft tokens proposed", spec["draft_tokens"])
            yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted", spec["accepted_tokens"])
            per_pos = CounterMetricFamily("minillm:spec_decode_num_accepted_tokens_per_pos",
                                          "Draft tokens accepted at each draft position",
                                          labels=["model_name", "position"])
            for pos, n in enumerate(spec["accepted_tokens_per_position"]):
                per_pos.add_metric([self.model_name, str(pos)], n)
            yield per_pos


class Metrics:
    """Every series carries vLLM's model_name label (the first served name), so its dashboards,
    which filter on it, read these."""

    def __init__(self, engine: AsyncEngine, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r, name = self.registry, ["model_name"]

        def histogram(metric: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(f"minillm:{metric}", doc, name, buckets=buckets, registry=r).labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token", _LATENCY)
        # vLLM's time_per_output_token_seconds (and inter_token_latency_seconds, its newer name) is the
        # time between successive outputs of one engine request, one observation each; the mean per
        # request is request_time_per_output_token_seconds
        self.itl = histogram("time_per_output_token_seconds", "Time between successive token outputs of an "
                             "engine request (choice), one observation each (inter-token latency)", _LATENCY)
        self.tpot = histogram("request_time_per_output_token_seconds", "Mean time per output token after the "
                              "first, per request", _LATENCY)
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency, arrival to its end (last token, "
                             "abort or error): one observation per request_success count", _E2E)
        self.finished = Counter("minillm:request_success", "Finished requests by reason",
                                ["model_name", "finished_reason"], registry=r)
        self.queue = histogram("request_queue_time_seconds", "Time from a request's admission by the engine to "
                               "its first scheduled step, per engine request (choice)", _LATENCY)
        self.prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per finished engine request "
                                       "(choice)", _TOKENS)
        self.generation_tokens = histogram("request_generation_tokens", "Generated tokens per finished engine "
                                           "request (choice)", _TOKENS)
        r.register(_EngineCollector(engine, model_name))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def timer(self) -> RequestTimer:
        return RequestTimer(self)


def request_reason(reasons: list[str]) -> str:
    """One request's finished_reason from its n choices': "error" if one failed, "abort" if one was cut off
    (a client gone after choice 0 finished counted as a success before), else the first choice's."""
    return next((r for r in ("error", "abort") if r in reasons), reasons[0])


class RequestTimer:
    """Latency bookkeeping for one request, from its arrival at the handler."""

    def __init__(self, metrics: Metrics):
        self.m = metrics
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.n = 0
        self._done = False
        self._last: dict[str, float] = {}  # each engine request's (choice's) last token output

    def output(self, out) -> None:
        """One engine output (RequestOutput) of one of the request's choices: its tokens, its time in
        the queue (on its first output), its prompt and generated token counts (on its last)."""
        if out.new_token_ids:
            t = time.perf_counter()
            last = self._last.get(out.request_id)
            if last is not None:
                self.m.itl.observe(t - last)
            self._last[out.request_id] = t
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
        self.m.finished.labels(self.m.model_name, reason).inc()
        self.m.e2e.observe(t - self.t0)  # every request counted in request_success, aborted and failed ones too
        if reason in ("stop", "length") and self.n > 1 and self.t_first is not None:
            self.m.tpot.observe((t - self.t_first) / (self.n - 1))
