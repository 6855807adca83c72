"""The step profiler (minillm/engine/step_profile.py, `bench throughput --profile`) on the CPU backend:
its steps and tokens add up to what the engine did, its phases add up to each step's wall time,
it changes no output, and it leaves the engine as it found it."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.step_profile import KINDS, PHASES, StepProfiler, StepRecord, format_summary, summarize
from minillm.tools.random_model import write_random_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def _workload(n=10, seed=0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, 4000, int(rng.integers(5, 90))).tolist() for _ in range(n)]
    params = [SamplingParams(max_tokens=int(rng.integers(2, 25)), ignore_eos=True, temperature=0.8, seed=i)
              for i in range(n)]
    return prompts, params


def _run(engine, prompts, params, profile: bool):
    """Drive engine.step() by hand: the outputs, the steps that ran the model, each step's wall ms."""
    profiler = StepProfiler(engine) if profile else None
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(p, sp, request_id=str(i))
    outputs, walls = {}, []
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        walls.append((time.perf_counter() - t) * 1e3)
        for o in outs:
            if o.finished:
                outputs[o.request_id] = o.token_ids
    if profiler is not None:
        profiler.detach()
    return outputs, walls, profiler


ENGINE = dict(device="cpu", max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
              enable_prefix_caching=False)  # no cached prompt blocks: every prompt token is computed


def test_profile_adds_up_and_changes_nothing(tiny):
    prompts, params = _workload()
    plain, _, _ = _run(LLM(str(tiny), **ENGINE).engine, prompts, params, profile=False)
    engine = LLM(str(tiny), **ENGINE).engine
    runner = engine.runner
    outputs, walls, prof = _run(engine, prompts, params, profile=True)

    assert outputs == plain  # same tokens with the profiler on
    assert engine.scheduler.num_preemptions == 0
    recs = prof.records
    assert len(recs) == len(walls)  # one record per step (every step here ran the model)
    n_prompt = sum(len(p) for p in prompts)
    n_out = sum(len(t) for t in outputs.values())
    assert sum(r.num_sampled for r in recs) == n_out
    # every prompt token and every output token but each sequence's last is computed exactly once
    assert sum(r.num_tokens for r in recs) == n_prompt + n_out - len(prompts)
    assert sum(r.num_prefill_tokens for r in recs) == n_prompt
    kinds = {r.kind for r in recs}
    assert {"prefill", "mixed", "decode-eager"} <= kinds <= set(KINDS)
    for r, wall in zip(recs, walls):
        assert all(getattr(r, f"{p}_ms") >= 0 for p in PHASES) and r.launch_ms >= 0
        assert r.device_ms == r.launch_ms <= r.execute_ms  # CPU: the forward runs on the host
        assert r.propose_ms == 0
        assert r.wall_ms == pytest.approx(sum(getattr(r, f"{p}_ms") for p in PHASES))
        assert r.wall_ms <= wall  # the phases cover the step from inside it...
    assert sum(r.wall_ms for r in recs) > 0.9 * sum(walls)  # ...and nearly all of it

    # detached: the engine and runner are as they were
    assert engine.profiler is None and runner.replay_timer is None
    assert "upload" not in vars(runner.buf) and "_results" not in vars(runner)

    s = prof.summary(run_s=sum(walls) / 1e3)
    assert s["steps"] == s["by_kind"]["all"]["steps"] == len(recs)
    assert sum(k["steps"] for name, k in s["by_kind"].items() if name != "all") == len(recs)
    assert s["by_kind"]["all"]["tokens"] == n_prompt + n_out - len(prompts)
    assert s["by_kind"]["all"]["share"] == pytest.approx(sum(r.wall_ms for r in recs) / sum(walls))
    decode_steps = sum(r.kind.startswith("decode") for r in recs)
    assert sum(b["steps"] for b in s["decode_by_batch"]) == decode_steps
    assert [b["seqs"] for b in s["decode_by_batch"]] == ["1-8"]  # max_num_seqs 4
    json.dumps(s, allow_nan=False)
    text = format_summary(s)
    assert "decode-eager" in text and "mixed" in text and "1-8" in text


def test_profile_with_speculative_decoding(tiny):
    """Verification steps get their kind and the drafter's time its own phase; outputs unchanged."""
    spec = {"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 2}
    prompts, params = _workload(6, seed=1)
    plain, _, _ = _run(LLM(str(tiny), speculative_config=spec, **ENGINE).engine, prompts, params, profile=False)
    outputs, walls, prof = _run(LLM(str(tiny), speculative_config=spec, **ENGINE).engine, prompts, params,
                                profile=True)
    assert outputs == plain
    recs = prof.records
    assert len(recs) == len(walls)
    assert sum(r.num_sampled for r in recs) == sum(len(t) for t in outputs.values())
    assert any(r.kind == "verify-eager" for r in recs)
    assert any(r.propose_ms > 0 for r in recs)
    assert all(r.wall_ms <= w for r, w in zip(recs, walls))


class _FakeEvent:
    """cupy.cuda.Event's surface as the profiler uses it, stamped with the host clock (the test
    makes that clock tick 1 us a call, so timings do not depend on how busy the machine is)."""

    made = 0

    def __init__(self):
        _FakeEvent.made += 1
        self.t = None

    def record(self, stream):
        assert stream == "backend-stream"
        self.t = time.perf_counter()

    @property
    def done(self):
        return True

    def synchronize(self):
        pass


def test_event_path_with_a_fake_cuda_backend(tiny, monkeypatch):
    """The CUDA branch (event pairs, the end event of a step that samples nothing, recycling) on
    the CPU: the backend claims to be CUDA and hands out host-clock events."""
    from types import SimpleNamespace

    engine = LLM(str(tiny), **ENGINE).engine
    fake_cp = SimpleNamespace(cuda=SimpleNamespace(
        Event=_FakeEvent, get_elapsed_time=lambda s, e: (e.t - s.t) * 1e3))
    monkeypatch.setattr(engine.backend, "name", "cuda", raising=False)
    monkeypatch.setattr(engine.backend, "cp", fake_cp, raising=False)
    monkeypatch.setattr(engine.backend, "stream", "backend-stream", raising=False)
    clock = [0]

    def tick() -> float:
        clock[0] += 1
        return clock[0] * 1e-6

    monkeypatch.setattr(time, "perf_counter", tick)
    def slow(read):  # reading a step's results takes 1 ms: an end event recorded after it would show
        def wrapped(*args, **kwargs):
            clock[0] += 1000
            return read(*args, **kwargs)
        return wrapped

    # the synchronous read, and the asynchronous engine's (LLM.generate schedules ahead)
    monkeypatch.setattr(engine.runner, "_results", slow(engine.runner._results))
    monkeypatch.setattr(engine, "_collect", slow(engine._collect))
    monkeypatch.setattr(engine, "_collect_inflight", slow(engine._collect_inflight))
    _FakeEvent.made = 0
    prompts, params = _workload(8, seed=2)
    prompts[0] = prompts[0] * 3  # longer than a 64-token step: a chunk that samples nothing
    outputs, walls, prof = _run(engine, prompts, params, profile=True)
    recs = prof.records
    assert len(recs) == len(walls) and any(r.num_sampled == 0 for r in recs)
    for r in recs:
        assert r.device_ms is not None and 0 <= r.device_ms <= r.execute_ms
        if r.num_sampled:  # the end event went down before the results were read
            assert r.device_ms == pytest.approx(r.launch_ms, abs=0.05)
    assert _FakeEvent.made == 8  # the up-front pool: pairs are read at the next step and reused
    assert prof.summary()["device_timing"] == "cuda-events"


def test_summary_buckets_and_medians():
    def rec(kind, seqs, wall, device=None):
        return StepRecord(kind, seqs, seqs, 0, seqs, 1.0, 1.0, wall - 3.0, 1.0, 0.0, 0.5, device)

    recs = [rec("decode-graph", 4, 10.0, 6.0), rec("decode-graph", 8, 12.0, 7.0), rec("decode-eager", 200, 20.0, 15.0),
            rec("decode-graph", 300, 30.0, 25.0), rec("prefill", 2, 40.0, 38.0)]
    s = summarize(recs, run_s=0.2, device_timing="cuda-events")
    assert s["steps"] == 5 and s["steps_s"] == pytest.approx(0.112) and s["outside_steps_s"] == pytest.approx(0.088)
    g = s["by_kind"]["decode-graph"]
    assert g["steps"] == 3 and g["total_ms"]["wall"] == pytest.approx(52.0) and g["median_ms"]["device"] == 7.0
    assert g["share"] == pytest.approx(52.0 / 200)
    buckets = {b["seqs"]: b for b in s["decode_by_batch"]}
    assert list(buckets) == ["1-8", "129-256", ">256"]
    b = buckets["1-8"]
    assert (b["steps"], b["graph_steps"]) == (2, 2)
    assert b["median_ms"] == {"wall": 11.0, "device": 6.5, "host": 3.0, "other": 1.5}
    assert "prefill" in format_summary(s)


def test_throughput_command_profile(tiny, tmp_path, capsys):
    from minillm.bench.throughput import main

    out, prof = tmp_path / "tp.json", tmp_path / "steps.json"
    rc = main([str(tiny), "--device", "cpu", "--num-seqs", "6", "--min-len", "4", "--max-len", "24",
               "--max-num-seqs", "4", "--result-json", str(out), "--profile-json", str(prof)])
    assert rc == 0
    assert "step profile:" in capsys.readouterr().out
    res = json.loads(out.read_text())
    s = res["step_profile"]
    assert s["device_timing"] == "host" and s["by_kind"]["all"]["sampled"] == res["output_tokens"]
    steps = json.loads(prof.read_text())["steps"]
    assert len(steps["kind"]) == s["steps"] and sum(steps["num_sampled"]) == res["output_tokens"]
