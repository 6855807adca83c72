"""The server's log lines about its load: a periodic stats line, and one line per request.

Every --log-stats-interval seconds (vLLM's default 10; off with --disable-log-stats) the server logs
throughput and queue state while it has work, as vLLM does:

    engine: prompt 1523.4 tok/s, generation 812.0 tok/s, running 8, waiting 2, KV cache 37.5% used,
    prefix cache hit rate 41.2%, preemptions 0, speculation: acceptance 0.63, mean length 2.89

An idle server logs nothing. --enable-log-requests adds a line when a request is admitted (its id,
prompt length and sampling settings, never its text) and one when it ends.
"""

from __future__ import annotations

import asyncio
import logging

from minillm.engine.engine import EngineStats
from minillm.sampling_params import SamplingParams

log = logging.getLogger("minillm.server")


def stats_line(prev: EngineStats, now: EngineStats, seconds: float) -> str | None:
    """The stats line for the interval from prev to now (seconds long); None when the engine had
    nothing to do in it (no tokens, nothing running or waiting)."""
    prompt = now.prompt_tokens - prev.prompt_tokens
    generated = now.generation_tokens - prev.generation_tokens
    if not (prompt or generated or now.running or now.waiting):
        return None
    used = now.blocks_used / now.blocks_total if now.blocks_total else 0.0
    line = (f"engine: prompt {prompt / seconds:.1f} tok/s, generation {generated / seconds:.1f} tok/s, "
            f"running {now.running}, waiting {now.waiting}, KV cache {100 * used:.1f}% used, "
            f"prefix cache hit rate {100 * now.prefix_cache_hit_rate:.1f}%, preemptions {now.preemptions}")
    spec = now.spec
    if spec and spec.get("rounds"):
        line += (f", speculation: acceptance {spec['acceptance_rate']:.2f}, mean length "
                 f"{spec['mean_acceptance_length']:.2f}")
        if spec.get("paused_steps"):
            line += f", paused {spec['paused_steps']} steps"
        if spec.get("backoff_steps"):  # plain steps of sequences whose drafts keep missing (backoff_after)
            line += f", backed off {spec['backoff_steps']} steps"
    return line


async def log_stats_forever(read_stats, interval: float) -> None:
    """Log stats_line every `interval` seconds from read_stats() (the engine thread's snapshot),
    until cancelled."""
    clock = asyncio.get_running_loop().time
    prev, t0 = read_stats(), clock()
    while True:
        await asyncio.sleep(interval)
        now, t1 = read_stats(), clock()
        line = stats_line(prev, now, max(t1 - t0, 1e-9))
        if line is not None:
            log.info("%s", line)
        prev, t0 = now, t1


def request_added_line(request_id: str, num_prompt_tokens: int, params: SamplingParams) -> str:
    """vLLM's --enable-log-requests line on admission: sizes and settings, not the prompt's text."""
    settings = [f"max_tokens {params.max_tokens}", f"temperature {params.temperature:g}"]
    if params.top_p < 1:
        settings.append(f"top_p {params.top_p:g}")
    if params.top_k > 0:
        settings.append(f"top_k {params.top_k}")
    if params.seed is not None:
        settings.append(f"seed {params.seed}")
    return f"request {request_id}: {num_prompt_tokens} prompt tokens, {', '.join(settings)}"


def request_finished_line(request_id: str, reason: str | None, num_prompt_tokens: int, num_output_tokens: int,
                          seconds: float) -> str:
    return (f"request {request_id} finished ({reason}): {num_prompt_tokens} prompt + {num_output_tokens} output "
            f"tokens in {seconds:.2f} s")
