"""The server's load log (minillm/server/stats_log.py): the periodic stats line's figures, its silence
when idle, and, through a real server and the openai client, the request lines of
--enable-log-requests and the flags' validation."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from test_server import Server, serve_cli

from minillm.engine.engine import EngineStats
from minillm.sampling_params import SamplingParams
from minillm.server.stats_log import log_stats_forever, request_added_line, stats_line

STATS = re.compile(r"engine: prompt ([0-9.]+) tok/s, generation ([0-9.]+) tok/s, running (\d+), waiting (\d+)")


def test_stats_line_figures():
    prev = EngineStats(prompt_tokens=100, generation_tokens=50)
    now = EngineStats(running=3, waiting=1, blocks_total=200, blocks_used=50, preemptions=2,
                      prefix_cache_hit_rate=0.25, prompt_tokens=300, generation_tokens=90,
                      spec={"rounds": 10, "acceptance_rate": 0.5, "mean_acceptance_length": 2.5, "paused_steps": 4,
                            "backoff_steps": 7})
    line = stats_line(prev, now, 4.0)
    assert line.startswith("engine: prompt 50.0 tok/s, generation 10.0 tok/s, running 3, waiting 1, ")
    assert "KV cache 25.0% used, prefix cache hit rate 25.0%, preemptions 2" in line
    assert line.endswith("speculation: acceptance 0.50, mean length 2.50, paused 4 steps, backed off 7 steps")
    # no speculation figures before a round; nothing at all for an idle interval
    assert "speculation" not in stats_line(prev, EngineStats(running=1, spec={"rounds": 0}), 1.0)
    assert stats_line(now, EngineStats(prompt_tokens=300, generation_tokens=90), 10.0) is None


def test_log_stats_forever_logs_busy_intervals_only(caplog):
    """One line an interval while tokens flow or requests wait, none once idle."""
    snapshots = iter([EngineStats(), EngineStats(running=1, prompt_tokens=40, generation_tokens=4),
                      EngineStats(running=1, prompt_tokens=40, generation_tokens=12)]
                     + [EngineStats(prompt_tokens=40, generation_tokens=12)] * 100)
    last = [EngineStats()]

    def read():
        last[0] = next(snapshots, last[0])
        return last[0]

    async def run():
        task = asyncio.get_running_loop().create_task(log_stats_forever(read, 0.01))
        await asyncio.sleep(0.2)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="minillm.server"):
        asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine:")]
    assert len(lines) == 2, lines
    assert "running 1" in lines[0] and "generation 0.0 tok/s" not in lines[1]


def test_request_added_line_has_settings_not_text():
    line = request_added_line("cmpl-1", 12, SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3))
    assert line == "request cmpl-1: 12 prompt tokens, max_tokens 7, temperature 0.5, top_p 0.9, top_k 5, seed 3"


def test_server_logs_requests_and_stats(byte_llama, tmp_path):
    """--enable-log-requests: a line as a request is admitted and one as it finishes, with its id;
    stats lines while it runs (a short interval), none once the server is idle."""
    srv = Server(byte_llama, tmp_path / "server.log", "--enable-log-requests", "--log-stats-interval", "0.2",
                 env={"MINILLM_TEST_STEP_DELAY": "0.02"})
    try:
        out = srv.client().completions.create(model=srv.client().models.list().data[0].id, prompt="hello there",
                                              max_tokens=20, temperature=0)
        rid = out.id
        time.sleep(1.0)  # idle intervals: no stats line
        text = srv.text()
        assert re.search(rf"request {re.escape(rid)}[^:]*: \d+ prompt tokens, max_tokens 20, temperature 0", text), text
        done = rf"request {re.escape(rid)}\S* finished \(length\): \d+ prompt \+ 20 output tokens"
        assert re.search(done, text), text
        busy = STATS.findall(text)
        assert busy and any(float(gen) > 0 for _, gen, _, _ in busy), text
        time.sleep(1.0)
        assert len(STATS.findall(srv.text())) == len(busy), "a stats line while idle"
    finally:
        assert srv.stop() == 0, srv.text()


def test_disable_log_stats(byte_llama, tmp_path):
    srv = Server(byte_llama, tmp_path / "server.log", "--disable-log-stats", "--log-stats-interval", "0.1",
                 env={"MINILLM_TEST_STEP_DELAY": "0.02"})
    try:
        srv.client().completions.create(model=srv.client().models.list().data[0].id, prompt="hi", max_tokens=16)
        assert not STATS.search(srv.text()) and "request " not in srv.text()
    finally:
        assert srv.stop() == 0, srv.text()


@pytest.mark.parametrize("flags,message", [
    (["--log-stats-interval", "0"], "--log-stats-interval must be a positive number"),
    (["--log-stats-interval", "nan"], "--log-stats-interval must be a positive number"),
    (["--enable-log-requests", "--disable-log-requests"], "contradict each other"),
])
def test_bad_log_flags_are_refused(flags, message):
    r = serve_cli(*flags)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_queue_time_is_the_wait_for_a_slot(byte_llama):
    """RequestOutput.queued_s, on a request's first output only: with one sequence slot, the second
    request waits in the queue for the whole of the first."""
    from minillm.engine.engine import LLMEngine

    engine = LLMEngine(model=str(byte_llama), device="cpu", max_num_seqs=1, max_model_len=64)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    t0 = time.monotonic()
    a, b = engine.add_request([1, 2, 3], params), engine.add_request([4, 5, 6], params)
    queued, first_done = {}, None
    while engine.has_unfinished():
        for out in engine.step():
            if out.queued_s is not None:
                assert out.request_id not in queued, "queued_s on a later output"
                queued[out.request_id] = out.queued_s
            if out.request_id == a and out.finished:
                first_done = time.monotonic() - t0
    assert set(queued) == {a, b}
    assert queued[a] < 0.5 * first_done and queued[b] >= 0.5 * first_done, (queued, first_done)
