"""Async scheduling (LLMEngine.async_scheduling, --async-scheduling; on inside LLM.generate): step
n + 1 is scheduled and launched before step n's sampled ids are on the host, its input ids filled
on the device (fill_input_ids). Every request must come out exactly as from the synchronous
engine: token ids, text, finish reason, streamed text, token counts, with greedy and seeded
sampling, stop tokens and strings, min_tokens, max_tokens, max_model_len, eos, preemption, prefix
caching, chunked prefill, aborts and speculative decoding (whose rounds fall back to the synchronous
path; the plain steps between them, backing off or paused, pipeline). The counter
num_pipelined_steps proves the pipelined path ran."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_overlap_outputs import workload

from minillm import LLM, SamplingParams
from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine.engine import LLMEngine
from minillm.engine.readback import TokenReadback
from minillm.engine.step_profile import StepProfiler


def drive(engine: LLMEngine, prompts, params, async_scheduling: bool, abort_at: dict | None = None) -> dict:
    """Every request's (token ids, text, finish reason, streamed text), step() driven by hand;
    abort_at {request id: step number} aborts requests between steps."""
    engine.async_scheduling = async_scheduling
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(p, sp, request_id=str(i))
    streamed: dict[str, str] = {}
    done = {}
    steps = 0
    while engine.has_unfinished():
        for rid, at in (abort_at or {}).items():
            if at == steps and rid in engine.requests:
                engine.abort_request(rid)
                done[rid] = "aborted"
        for o in engine.step():
            streamed[o.request_id] = streamed.get(o.request_id, "") + o.new_text
            if o.finished:
                done[o.request_id] = (o.token_ids, o.text, o.finish_reason)
        steps += 1
    assert not engine._unrendered and not engine.requests and engine._inflight is None
    assert all(not s.num_pending for s in engine.scheduler.running)
    bm = engine.block_manager
    assert bm.num_used == 0 and all(c == 0 for c in bm.ref_count)  # every block given back
    return {rid: v if v == "aborted" else (*v, streamed.get(rid, "")) for rid, v in done.items()}


def async_engine_with(tiny, kw, prompts, params) -> LLMEngine:
    """An engine scheduling asynchronously with the requests added (ids "0", "1", ...), for tests
    that drive its steps by hand."""
    engine = LLMEngine(model=str(tiny), **kw)
    engine.async_scheduling = True
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(p, sp, request_id=str(i))
    return engine


def both(tiny, kw, prompts, params, **drive_kw):
    sync_engine, async_engine = LLMEngine(model=str(tiny), **kw), LLMEngine(model=str(tiny), **kw)
    sync = drive(sync_engine, prompts, params, False, **drive_kw)
    asynchronous = drive(async_engine, prompts, params, True, **drive_kw)
    return sync, asynchronous, sync_engine, async_engine


CONFIGS = {
    "plain": dict(max_num_seqs=4, max_num_batched_tokens=64),
    "chunked": dict(max_num_seqs=6, max_num_batched_tokens=20),  # prefill chunks beside decodes
    "preempting": dict(max_num_seqs=8, max_num_batched_tokens=48, num_blocks=10, max_model_len=128),
    "ngram": dict(max_num_seqs=4, max_num_batched_tokens=64,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}),
    "dflash": dict(max_num_seqs=4, max_num_batched_tokens=64,
                   speculative_config={"method": "dflash", "model": "DRAFTER", "num_speculative_tokens": 4}),
    # the random drafter's rounds fail, so sequences back off to plain steps, which pipeline
    "dflash_backoff": dict(max_num_seqs=4, max_num_batched_tokens=64,
                           speculative_config={"method": "dflash", "model": "DRAFTER", "num_speculative_tokens": 4,
                                               "backoff_after": 1, "backoff_max_steps": 4}),
    # no drafts while 3 or more run: those plain steps pipeline
    "ngram_paused": dict(max_num_seqs=4, max_num_batched_tokens=64,
                         speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                             "disable_by_batch_size": 3}),
}
PIPELINING_SPEC = ("dflash_backoff", "ngram_paused")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_async_outputs_equal_synchronous(tiny, drafter, name):
    kw = dict(dict(device="cpu", max_model_len=256), **CONFIGS[name])
    if "speculative_config" in kw and kw["speculative_config"].get("model") == "DRAFTER":
        kw["speculative_config"] = dict(kw["speculative_config"], model=str(drafter))
    prompts, params = workload(tiny, kw)
    sync, asynchronous, sync_engine, async_engine = both(tiny, kw, prompts, params)
    if name == "ngram_paused":
        # the batch's size decides the pause, and running ahead admits and retires sequences a step
        # apart from the synchronous engine, so steps draft at other times; seeded sampling draws
        # differently in a drafting step (as with speculation on and off), greedy never does
        greedy = [str(i) for i, p in enumerate(params) if p.temperature == 0]
        assert asynchronous.keys() == sync.keys()
        assert {r: asynchronous[r] for r in greedy} == {r: sync[r] for r in greedy}
        assert async_engine.num_pipelined_steps > 0 and async_engine.stats().spec["paused_steps"] > 0
        return
    assert asynchronous == sync
    assert {v[2] for v in sync.values()} == {"stop", "length"}
    assert any(p.stop and sync[str(i)][2] == "stop" for i, p in enumerate(params))  # a stop string hit
    assert async_engine.stats().generation_tokens == sync_engine.stats().generation_tokens
    if "speculative_config" in kw:
        assert async_engine.stats().spec["draft_tokens"] > 0
        assert async_engine.stats().spec == sync_engine.stats().spec  # the same rounds, drafts, plain steps
        # rounds are synchronous; only the plain steps between them (backing off, paused) pipeline
        assert (async_engine.num_pipelined_steps > 0) == (name in PIPELINING_SPEC)
    else:
        assert async_engine.num_pipelined_steps > 0
    if "num_blocks" in kw:
        assert async_engine.stats().preemptions > 0 and sync_engine.stats().preemptions > 0


@pytest.mark.parametrize("graphs", [False, True])
def test_history_dependent_requests_pipeline(tiny, monkeypatch, graphs):
    """Penalties and grammars need every id before a step's own: such a step's forward is launched
    while the previous step is in flight and its changes and sampler once that step's ids are in
    (Runner.launch(defer_sampling=True), finish_sampling), eagerly or after a FORWARD_ONLY graph
    (the NumPy backend with graphs emulated); outputs equal the synchronous engine's."""
    if graphs:
        from test_dflash_graphs import GraphEmulatingBackend

        class OpByOp(GraphEmulatingBackend):  # (NumPy's one-op decoder plans one sequence, not a bucket)
            def decoder_plan(self, *a, **kw):
                return None

        monkeypatch.setattr("minillm.engine.engine.select_backend", lambda device, dtype: OpByOp())
    small = {"type": "object", "additionalProperties": False, "required": ["a"],
             "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}}}
    kinds = [dict(presence_penalty=1.2, frequency_penalty=0.4, repetition_penalty=1.3),
             dict(structured_outputs={"json": small, "disable_any_whitespace": True}),
             dict(structured_outputs={"regex": "[a-z]{3,20}"}), dict(logit_bias={5: 3.0}), {}]
    params = [SamplingParams(temperature=t, seed=i, max_tokens=14, **kw)
              for i, (kw, t) in enumerate((k, t) for k in kinds for t in (0.0, 0.8))]
    prompts = [[11 + i, 12, 13 + 2 * i] for i in range(len(params))]
    kw = dict(device="cpu", max_model_len=128, max_num_seqs=16)
    sync, asynchronous, _, async_engine = both(tiny, kw, prompts, params)
    assert asynchronous == sync
    assert async_engine.num_pipelined_steps > 0
    if graphs:
        assert async_engine.runner.forward_only_replays > 0


def test_pipelined_path_covers_the_decode_steps(tiny):
    """Plain decoding: after the first step every step is launched while the previous one is in
    flight, and the sequences' limits are known ahead, so no row is launched only to be dropped."""
    engine = LLMEngine(model=str(tiny), device="cpu", max_model_len=256, max_num_seqs=4)
    launched = []
    launch = engine.runner.launch
    engine.runner.launch = lambda batch, *a, **k: (launched.append(len(batch)), launch(batch, *a, **k))[1]
    prompts = [[11, 12, 13], [21, 22, 23, 24], [31, 32]]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for n in (9, 5, 7)]
    out = drive(engine, prompts, params, True)
    assert [len(out[str(i)][0]) for i in range(3)] == [9, 5, 7]
    assert len(launched) == 9  # one prefill step, then one decode step per further token of the longest
    assert engine.num_pipelined_steps == len(launched) - 1
    assert sum(launched) == 1 + 1 + 1 + 8 + 4 + 6  # rows: three prefills, then decodes, none wasted


def test_eos_and_prefix_caching(tiny):
    """eos ends sequences (ignore_eos off) and shared prompt prefixes hit the prefix cache (blocks
    are committed once their ids are known); a request fills max_model_len to the last slot."""
    rng = np.random.default_rng(5)
    shared = rng.integers(10, 4000, 40).tolist()
    prompts = [shared + rng.integers(10, 4000, int(rng.integers(1, 20))).tolist() for _ in range(8)]
    prompts += [rng.integers(10, 4000, 112).tolist()]  # prompt + max_tokens == max_model_len
    params = [SamplingParams(max_tokens=int(rng.integers(5, 30)), temperature=0.8 if i % 2 else 0.0, seed=i)
              for i in range(8)]
    params += [SamplingParams(max_tokens=16, ignore_eos=True)]
    kw = dict(device="cpu", max_model_len=128, max_num_seqs=3, max_num_batched_tokens=48)
    # eos: make the most frequent greedy token of a first run the model's eos, so it does occur
    first = drive(LLMEngine(model=str(tiny), **kw), prompts, params, False)
    ids = [t for v in first.values() for t in v[0]]
    eos = int(np.bincount(ids).argmax())
    engines = []
    results = []
    for asy in (False, True):
        e = LLMEngine(model=str(tiny), **kw)
        e.eos_ids = frozenset([eos])
        engines.append(e)
        results.append(drive(e, prompts, params, asy))
    assert results[1] == results[0]
    assert "stop" in {v[2] for v in results[0].values()}
    assert results[0]["8"][2] == "length" and len(results[0]["8"][0]) == 16
    assert engines[1].num_pipelined_steps > 0
    assert engines[1].block_manager.prefix_hits > 0


def test_aborts_between_steps(tiny):
    """Aborting a request whose row is in flight: its blocks are freed at once, its row dropped."""
    kw = dict(device="cpu", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64)
    prompts, params = workload(tiny, kw, n=8, seed=4)
    abort_at = {"1": 3, "4": 6, "6": 0}
    sync, asynchronous, _, async_engine = both(tiny, kw, prompts, params, abort_at=abort_at)
    assert asynchronous == sync
    assert sum(v == "aborted" for v in sync.values()) == 3
    assert async_engine.num_pipelined_steps > 0


def test_aborts_while_backing_off(tiny, drafter):
    """Aborts while the plain steps of backing-off sequences run ahead (a step in flight): the other
    requests come out as from the synchronous engine without aborts (backoff is per sequence, so
    neither the aborts nor running ahead change what they draft), and every block is given back."""
    kw = dict(device="cpu", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
              speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4,
                                  "backoff_after": 1, "backoff_max_steps": 8})
    prompts, params = workload(tiny, kw, n=8, seed=4)
    ref = drive(LLMEngine(model=str(tiny), **kw), prompts, params, False)
    engine = async_engine_with(tiny, kw, prompts, params)
    done, aborted = {}, []
    while engine.has_unfinished():
        running = [s for s in engine.scheduler.running if not s.finished]
        if engine._inflight is not None and len(aborted) < 2 and running:
            aborted.append(running[0].request_id)  # its row is in the step in flight
            engine.abort_request(aborted[-1])
        for o in engine.step():
            if o.finished:
                done[o.request_id] = (o.token_ids, o.text, o.finish_reason)
    assert len(aborted) == 2 and not set(aborted) & done.keys()
    assert done == {r: v[:3] for r, v in ref.items() if r not in aborted}
    assert engine._inflight is None and not engine.requests and engine.block_manager.num_used == 0
    assert engine.stats().spec["backoff_steps"] > 0


def test_generate_is_async_by_default_and_flag_turns_it_off(tiny):
    prompts, params = workload(tiny, dict(max_num_seqs=4, max_num_batched_tokens=64), n=6, seed=3)
    ref = drive(LLMEngine(model=str(tiny), device="cpu", max_model_len=256), prompts, params, False)
    llm = LLM(str(tiny), device="cpu", max_model_len=256)
    assert llm.engine.async_scheduling
    outs = llm.generate(prompts, params)
    assert [(o.token_ids, o.text, o.finish_reason) for o in outs] == [ref[str(i)][:3] for i in range(6)]
    assert llm.engine.num_pipelined_steps > 0
    off = LLM(str(tiny), device="cpu", max_model_len=256, async_scheduling=False)
    assert not off.engine.async_scheduling
    assert [o.token_ids for o in off.generate(prompts, params)] == [o.token_ids for o in outs]
    assert off.engine.num_pipelined_steps == 0
    assert not LLMEngine(model=str(tiny), device="cpu").async_scheduling  # step() drivers: synchronous


def test_turning_it_off_mid_run(tiny):
    """A step still in flight when async scheduling is switched off is collected by the next step."""
    kw = dict(device="cpu", max_model_len=256, max_num_seqs=4)
    prompts, params = workload(tiny, kw, n=5, seed=6)
    ref = drive(LLMEngine(model=str(tiny), **kw), prompts, params, False)
    engine = async_engine_with(tiny, kw, prompts, params)
    done = {}
    steps = 0
    while engine.has_unfinished():
        if steps == 4:
            engine.async_scheduling = False
        for o in engine.step():
            if o.finished:
                done[o.request_id] = (o.token_ids, o.text, o.finish_reason)
        steps += 1
    assert done == {rid: v[:3] for rid, v in ref.items()}


def test_step_profile_under_async_scheduling(tiny):
    engine = LLMEngine(model=str(tiny), device="cpu", max_model_len=256, max_num_seqs=4)
    engine.async_scheduling = True
    prof = StepProfiler(engine)
    for i in range(3):
        engine.add_request([10 + i, 20, 30], SamplingParams(max_tokens=8, ignore_eos=True), request_id=str(i))
    while engine.has_unfinished():
        engine.step()
    prof.detach()
    recs = prof.records
    assert sum(r.num_sampled for r in recs) == 3 * 8  # each call counts the tokens it accepted
    assert all(r.launch_ms <= r.execute_ms + 1e-9 and r.device_ms is not None for r in recs)
    assert [r.kind for r in recs] == ["prefill"] + ["decode-eager"] * 7 + ["collect"]
    assert recs[0].num_sampled == 0 and recs[-1].num_tokens == 0 and recs[-1].num_sampled == 3


def test_fill_input_ids_numpy_twin():
    be = NumpyBackend()
    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, 100, 12).astype(np.int32)
    prev = rng.integers(1000, 2000, 5).astype(np.int32)
    src = np.full(16, -1, np.int32)  # longer than input_ids: only the first 12 rows count
    src[[0, 3, 4, 11]] = [4, 0, 4, 2]
    src[14] = 1
    expect = input_ids.copy()
    expect[[0, 3, 4, 11]] = prev[[4, 0, 4, 2]]
    be.fill_input_ids(input_ids, prev, src)
    assert np.array_equal(input_ids, expect)
    empty = np.zeros(0, np.int32)
    be.fill_input_ids(empty, prev, src)  # nothing to fill


def test_token_readback_slots():
    rb = TokenReadback(NumpyBackend(), 8)
    a = rb.start(np.arange(5, dtype=np.int32))
    b = rb.start(np.arange(10, 13, dtype=np.int32))
    with pytest.raises(RuntimeError):
        rb.start(np.arange(3, dtype=np.int32))  # both slots hold unread ids
    assert rb.wait(a).tolist() == [0, 1, 2, 3, 4]
    c = rb.start(np.arange(20, 22, dtype=np.int32))
    assert rb.wait(b).tolist() == [10, 11, 12] and rb.wait(c).tolist() == [20, 21]


def test_server_with_no_async_scheduling(tmp_path):
    """The server schedules ahead by default (tests/test_server.py runs that way); with
    --no-async-scheduling its streams end right too: the server suite's stream, stop-string,
    concurrency and disconnect tests against a synchronous server."""
    import test_server as ts

    from hf_models import make_tiny

    make_tiny("llama", tmp_path / "model")
    srv = ts.Server(tmp_path / "model", tmp_path / "server.log", "--no-async-scheduling",
                    env={"MINILLM_TEST_STEP_DELAY": "0.003"})
    try:
        for test in (ts.test_completion, ts.test_completion_stream_matches_non_stream, ts.test_stop_strings,
                     ts.test_eight_concurrent_streams, ts.test_n_choices, ts.test_disconnect_non_streamed):
            test(srv)
        for n in (1, 4):
            ts.test_disconnect_frees_blocks(srv, n)
    finally:
        assert srv.stop() == 0, srv.text()
    assert "Traceback" not in srv.text()


@pytest.mark.gpu
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_async_equals_synchronous_on_gpu(tiny, enforce_eager):
    """On the GPU (graphs: the fill runs between the upload and the replay; eager): the same tokens
    as synchronous steps, greedy and seeded. Every request is admitted at once and its limits are
    known ahead, so both engines run the same batches (bf16 matmuls are not batch invariant:
    with stop tokens the rows an async step drops would change a batch's shape)."""
    rng = np.random.default_rng(9)
    prompts = [rng.integers(10, 4000, int(rng.integers(3, 60))).tolist() for _ in range(12)]
    params = [SamplingParams(max_tokens=int(rng.integers(8, 40)), ignore_eos=True,
                             temperature=0.0 if i % 2 else 0.8, top_p=0.9, top_k=50, seed=i)
              for i in range(12)]
    kw = dict(device="cuda", max_model_len=256, max_num_seqs=16, enforce_eager=enforce_eager)
    sync = drive(LLMEngine(model=str(tiny), **kw), prompts, params, False)
    engine = LLMEngine(model=str(tiny), **kw)
    assert bool(engine.runner.graphs) != enforce_eager
    got = drive(engine, prompts, params, True)
    assert got == sync
    assert engine.num_pipelined_steps > 0
    if not enforce_eager:
        assert engine.runner.replays > 0


@pytest.mark.parametrize("kind", ["logprobs", "penalties"])
def test_requests_that_need_synchronous_steps(tiny, kind):
    """Logprobs (a step's logits are read before the next step overwrites them) and penalties
    (they need every id sampled so far) make steps synchronous while such a request runs: the
    same outputs and logprobs as synchronous steps, no step pipelined meanwhile, pipelining after."""
    kw = dict(model=str(tiny), device="cpu", max_model_len=128, max_num_seqs=4)
    prompts = [[10 + i, 20 + i, 30 + i] for i in range(6)]
    extra = dict(logprobs=2) if kind == "logprobs" else dict(frequency_penalty=0.8, presence_penalty=0.3)
    params = [SamplingParams(max_tokens=6 + i, temperature=0.7, seed=i, ignore_eos=True,
                             **(extra if i in (1, 2) else {})) for i in range(6)]
    runs = []
    for async_scheduling in (False, True):
        eng = LLMEngine(**kw)
        eng.async_scheduling = async_scheduling
        for i, (p, sp) in enumerate(zip(prompts, params)):
            eng.add_request(p, sp, request_id=str(i))
        got, pipelined_while_needed = {}, 0
        while eng.has_unfinished():
            before, needed = eng.num_pipelined_steps, bool(eng._sync_requests)
            for o in eng.step():
                g = got.setdefault(o.request_id, [[], []])
                g[0] += o.new_token_ids
                g[1] += [(lp.token_id, round(lp.logprob, 6)) for lp in o.new_logprobs or []]
            pipelined_while_needed += needed and eng.num_pipelined_steps > before
        assert pipelined_while_needed == 0
        runs.append((got, eng.num_pipelined_steps))
    (sync, _), (asynchronous, pipelined) = runs
    assert asynchronous == sync and pipelined > 0  # pipelined once those requests finished
    if kind == "logprobs":
        assert all(len(sync[str(i)][1]) == len(sync[str(i)][0]) > 0 for i in (1, 2))


@settings(max_examples=int(os.environ.get("MINILLM_ASYNC_EXAMPLES", "25")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_workloads_equal_synchronous(tiny, data):
    """Random engines and workloads (batch and pool sizes that queue, chunk, preempt; prefix caching
    on or off; shared prompt prefixes; greedy and seeded sampling; eos, stop tokens, min_tokens,
    max_tokens): async scheduling gives what synchronous steps give, and returns every block.
    Derandomized, so CI runs the same examples each time (MINILLM_ASYNC_EXAMPLES=200 for more)."""
    d = data.draw
    max_num_seqs = d(st.integers(1, 4), "max_num_seqs")
    kw = dict(device="cpu", max_model_len=96, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=max(max_num_seqs, d(st.sampled_from([8, 24, 64]), "budget")),
              num_blocks=d(st.sampled_from([None, 7, 10, 16]), "num_blocks"),
              enable_prefix_caching=d(st.booleans(), "prefix_caching"))
    n = d(st.integers(1, 6), "requests")
    rng = np.random.default_rng(d(st.integers(0, 2**16), "seed"))
    shared = rng.integers(10, 4000, int(rng.integers(0, 24))).tolist()
    prompts = [(shared if rng.random() < 0.5 else []) + rng.integers(10, 4000, int(rng.integers(1, 24))).tolist()
               for _ in range(n)]
    base = [SamplingParams(max_tokens=int(rng.integers(1, 41)), temperature=float(rng.choice([0.0, 0.9])), seed=i,
                           ignore_eos=bool(rng.random() < 0.5)) for i in range(n)]  # prompts <= 47: all fit
    first = drive(LLMEngine(model=str(tiny), **kw), prompts, base, False)
    params = []  # stops taken from a first run's own output, so that they occur
    for i, sp in enumerate(base):
        ids, text = first[str(i)][0], first[str(i)][1]
        extra = {}
        how = rng.integers(0, 3)
        if how == 1 and len(ids) > 1:
            extra = dict(stop_token_ids=[ids[int(rng.integers(0, len(ids)))]],
                         min_tokens=min(sp.max_tokens, int(rng.integers(0, 3))))
        elif how == 2 and len(text) > 2:
            a = int(rng.integers(0, len(text) - 1))
            extra = dict(stop=[text[a : a + 2]])
        params.append(SamplingParams(max_tokens=sp.max_tokens, temperature=sp.temperature, seed=sp.seed,
                                     ignore_eos=sp.ignore_eos, **extra))
    sync, asynchronous, _, async_engine = both(tiny, kw, prompts, params)
    assert asynchronous == sync
    assert len(sync) == n


@settings(max_examples=int(os.environ.get("MINILLM_ASYNC_SPEC_EXAMPLES", "10")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_backoff_workloads_equal_synchronous(tiny, drafter, data):
    """Random workloads on a DFlash engine whose drafter is never right, with random backoff
    settings (and pools that preempt): the plain steps between probe rounds run ahead, and every
    request comes out as from synchronous steps, with the same rounds and backoff counts; every
    block is returned (drive). With disable_by_batch_size too, greedy requests only: the pause
    follows the batch's size, which running ahead shifts by a step around admissions, and seeded
    sampling draws differently in a drafting step."""
    d = data.draw
    max_num_seqs = d(st.integers(1, 4), "max_num_seqs")
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": d(st.integers(1, 4), "k"),
            "backoff_after": d(st.integers(1, 2), "backoff_after"),
            "backoff_max_steps": d(st.sampled_from([1, 2, 8]), "backoff_max_steps")}
    pause = d(st.sampled_from([None, 2, 3]), "disable_by_batch_size")
    if pause is not None:
        spec["disable_by_batch_size"] = pause
    kw = dict(device="cpu", max_model_len=96, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=max(max_num_seqs * (1 + spec["num_speculative_tokens"]),
                                         d(st.sampled_from([16, 64]), "budget")),
              num_blocks=d(st.sampled_from([None, 10, 16]), "num_blocks"),
              enable_prefix_caching=d(st.booleans(), "prefix_caching"), speculative_config=spec)
    n = d(st.integers(1, 5), "requests")
    rng = np.random.default_rng(d(st.integers(0, 2**16), "seed"))
    prompts = [rng.integers(10, 4000, int(rng.integers(1, 24))).tolist() for _ in range(n)]
    temperatures = [0.0] if pause is not None else [0.0, 0.9]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 41)), temperature=float(rng.choice(temperatures)), seed=i,
                             ignore_eos=True) for i in range(n)]
    sync, asynchronous, sync_engine, async_engine = both(tiny, kw, prompts, params)
    assert asynchronous == sync and len(sync) == n
    if pause is None:
        assert async_engine.stats().spec == sync_engine.stats().spec


def test_an_interrupted_generate_leaves_no_step_in_flight(tiny, monkeypatch):
    """Ctrl-C between two steps of LLM.generate: its requests are aborted, the step already launched is
    taken off the device, and the engine is left idle; the next call's outputs are a fresh call's."""
    llm = LLM(str(tiny), device="cpu", max_model_len=256)
    prompts = [[3, 4, 5, 6], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in llm.generate(prompts, params)]
    free = llm.engine.block_manager.num_free
    real_step, calls = llm.engine.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 4:  # after three steps: one is in flight
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, params)
    assert llm.engine.num_pipelined_steps > 0
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    assert llm.engine.block_manager.num_free == free
    monkeypatch.undo()
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref


@pytest.mark.parametrize("method", [None, "dflash", "draft_model"])
@pytest.mark.parametrize("fault", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("where", ["target", "drafter"])
def test_a_step_that_raises_leaves_the_engine_usable(tiny, drafter, monkeypatch, method, fault, where):
    """A step that raises part-way (a failure, or Ctrl-C while the host waits for the device: inside
    a runner's collect) left the step in flight and its readback slot held, and every later
    generate failed with "TokenReadback: a third step's ids before the first was read". Now the
    requests are aborted, what was launched is dropped, and the next call's outputs are a fresh call's."""
    if method is None and where == "drafter":
        pytest.skip("no drafter")
    spec = {None: None, "dflash": {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3},
            "draft_model": {"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 3}}[method]
    llm = LLM(str(tiny), device="cpu", max_model_len=256, speculative_config=spec)
    prompts = [[3, 4, 5, 6, 3, 4, 5], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in llm.generate(prompts, params)]
    free = llm.engine.block_manager.num_free
    runner = llm.engine.runner if where == "target" else llm.engine.proposer.runner
    real_collect, calls = runner.collect, []

    def failing_collect(handle):
        calls.append(1)
        if len(calls) == 2:  # the second step (with async scheduling, one more is in flight)
            raise fault("device fault")
        return real_collect(handle)

    monkeypatch.setattr(runner, "collect", failing_collect)
    with pytest.raises(fault):
        llm.generate(prompts, params)
    monkeypatch.undo()
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    assert llm.engine.block_manager.num_free == free
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
