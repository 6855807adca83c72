"""The DFlash drafter's work in CUDA graphs: drafting steps replay graphs of the drafter's runner,
the context update runs inside the target's graphs, and both give what eager steps give.

On the CPU the graphs are emulated (GraphEmulatingBackend: a "graph" reruns the captured function
at the bucket's shape, and a host transfer inside it raises, as it cannot be part of a CUDA graph),
which checks the plumbing: graph selection, padding, the logits transform and the context update
inside the captured function. The `gpu` test checks the real thing against enforce_eager.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.backends import cuda_ops
from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine.engine import graph_buckets
from minillm.engine.runner import FORWARD_ONLY
from minillm.engine.scheduler import ScheduledSeq
from minillm.engine.sequence import Sequence
from minillm.tools.random_model import write_dflash_drafter, write_random_model

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], list(range(1, 21)) + [1, 2, 3], [9, 9, 9],
           [100, 101, 102, 100, 101], [42], list(range(30, 70))]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SOFTCAP = 1.0  # the drafter's final_logit_softcapping: drafted logits lie in (-1, 1) once applied


class GraphEmulatingBackend(NumpyBackend):
    """The NumPy backend with capture_graph: replay() reruns the captured function (the same
    Python, at the captured shapes); uploads, downloads and syncs inside it raise."""

    def __init__(self) -> None:
        super().__init__()
        self.in_graph = False

    def capture_graph(self, fn):
        return _EmulatedGraph(self, fn)

    def _no_host(self, what: str) -> None:
        if self.in_graph:
            raise AssertionError(f"{what} inside a captured function: a CUDA graph cannot hold it")

    def to_host(self, x):
        self._no_host("to_host")
        return super().to_host(x)

    def copy_from_host(self, dst, src) -> None:
        self._no_host("copy_from_host")
        super().copy_from_host(dst, src)

    def synchronize(self) -> None:
        self._no_host("synchronize")


class _EmulatedGraph:
    def __init__(self, backend: GraphEmulatingBackend, fn):
        self.backend, self.fn = backend, fn
        self.replay()  # the capture: the function's work must be host-transfer free

    def replay(self) -> None:
        self.backend.in_graph = True
        try:
            self.fn()
        finally:
            self.backend.in_graph = False


def write_drafter(drafter: Path, target: Path) -> tuple[str, str]:
    """A random DFlash drafter for target, with a logits multiplier and soft-cap to apply."""
    write_dflash_drafter(drafter, target, seed=4, force=True)
    cfg_file = drafter / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["dflash_config"].update(output_multiplier=2.0, final_logit_softcapping=SOFTCAP)
    cfg_file.write_text(json.dumps(cfg))
    return str(target), str(drafter)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The tiny random Qwen3 preset (head_dim 16) and its drafter."""
    target = tmp_path_factory.mktemp("target")
    write_random_model(target, "tiny", seed=3, force=True)
    return write_drafter(tmp_path_factory.mktemp("drafter"), target)


@pytest.fixture(scope="module")
def pair_d64(tmp_path_factory):
    """A tiny Qwen3 of head_dim 64 and its drafter: on the GPU attention then takes the decode
    kernel (the real models' path), not the tiled fallback head_dim 16 gets."""
    from hf_models import make_tiny

    target = tmp_path_factory.mktemp("target64")
    make_tiny("qwen3", target, seed=0, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, intermediate_size=256)
    return write_drafter(tmp_path_factory.mktemp("drafter64"), target)


@pytest.fixture(scope="module")
def pair2(tmp_path_factory):
    """The tiny preset and a DFlash2 drafter (convs and a candidate selector; minillm.spec.dflash2)."""
    target = tmp_path_factory.mktemp("target2")
    write_random_model(target, "tiny", seed=3, force=True)
    drafter = tmp_path_factory.mktemp("drafter2")
    write_dflash_drafter(drafter, target, seed=6, num_layers=2, force=True,
                         dflash2={"conv_group_size": 16, "selector_rank": 24, "selector_top_k": 12})
    return str(target), str(drafter)


def spec(drafter: str, k: int) -> dict:
    return {"method": "dflash", "model": drafter, "num_speculative_tokens": k}


def emulated_llm(monkeypatch, target: str, **kw) -> LLM:
    monkeypatch.setattr("minillm.engine.engine.select_backend", lambda device, dtype: GraphEmulatingBackend())
    return LLM(target, device="cpu", max_model_len=256, **kw)


def record_drafts(llm: LLM) -> list:
    """Wrap the proposer: every round's draft tokens, sequence by sequence, go to the list returned
    (once on the host: a deferred round's when the engine resolves it)."""
    proposer, rounds = llm.engine.proposer, []
    original = proposer._assign

    def assign(tokens, waiting):
        original(tokens, waiting)
        rounds.extend(list(s.draft_ids) for s, *_ in waiting)

    proposer._assign = assign
    return rounds


def test_drafter_graphs_are_captured_per_bucket(monkeypatch, pair):
    target, drafter = pair
    llm = emulated_llm(monkeypatch, target, max_num_seqs=4, speculative_config=spec(drafter, 3))
    eng = llm.engine
    block = eng.proposer.block
    buckets = graph_buckets(4)
    assert set(eng.proposer.runner.graphs) == {(b, block) for b in buckets}
    assert set(eng.runner.graphs) == ({(b, r) for b in buckets for r in (1, 4)}
                                      | {(b, 1, FORWARD_ONLY) for b in buckets})  # decode steps also stop at logits
    assert eng.runner.after_forward == eng.proposer.update_context
    # enforce_eager: no graphs for either model
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=4, enforce_eager=True,
                speculative_config=spec(drafter, 3))
    assert not eager.engine.runner.graphs and not eager.engine.proposer.runner.graphs


def test_graph_for_selects_the_drafter_graph(monkeypatch, pair):
    target, drafter = pair
    llm = emulated_llm(monkeypatch, target, max_num_seqs=4, speculative_config=spec(drafter, 3))
    runner = llm.engine.proposer.runner
    block = llm.engine.proposer.block

    def seq(n: int, min_tokens: int = 0) -> Sequence:
        s = Sequence("s", list(range(1, n + 1)), SamplingParams(min_tokens=min_tokens, max_tokens=8), 0)
        s.num_computed = n - 1
        s.draft_ids = [0] * (block - 1)
        return s

    def drafting(s: Sequence) -> ScheduledSeq:  # what DFlashProposer.propose schedules
        return ScheduledSeq(s, block, num_draft=block - 1, start=s.num_tokens - 1)

    for n_seqs, bucket in ((1, 1), (2, 2), (3, 4), (4, 4)):
        items = [drafting(seq(5)) for _ in range(n_seqs)]
        pick = runner._graph_for(items, n_seqs * block)
        assert (pick.bucket, pick.rows) == (bucket, block) and pick.graph is runner.graphs[(bucket, block)]
    fresh = Sequence("p", [1, 2, 3], SamplingParams(), 0)
    assert runner._graph_for([ScheduledSeq(fresh, 3)], 3) is None  # a prefill chunk: eager
    assert runner._graph_for([drafting(seq(5, min_tokens=4))], block) is None  # min_tokens: eager (no
    # FORWARD_ONLY graph for blocks)
    # the target runner picks its verification graphs, never a drafter-shaped one
    s = seq(5)
    s.draft_ids = [0, 0, 0]
    pick = llm.engine.runner._graph_for([ScheduledSeq(s, 4, num_draft=3)], 4)
    assert (pick.bucket, pick.rows, pick.samples) == (1, 4, True)


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_emulated_graphs_match_eager(monkeypatch, pair, draft_vocab):
    """Same tokens, same drafts round by round, same drafted logits, with graphs and without;
    both runners really replayed. draft_vocab: the drafter's LM head a quarter of the target's
    rows (draft_vocab_size)."""
    target, drafter = pair
    _graphs_match_eager(monkeypatch, target, drafter, draft_vocab)


def test_emulated_dflash2_graphs_match_eager(monkeypatch, pair2):
    """A DFlash2 drafter's convs and candidate selector run inside its drafting graphs (no host
    transfer) and draft what its eager steps draft."""
    _graphs_match_eager(monkeypatch, *pair2, False, softcapped=False)


def _graphs_match_eager(monkeypatch, target: str, drafter: str, draft_vocab: bool, softcapped: bool = True):
    plain_llm = LLM(target, device="cpu", max_model_len=256)
    plain = [o.token_ids for o in plain_llm.generate(PROMPTS, GREEDY)]
    cfg = spec(drafter, 5)
    if draft_vocab:
        cfg["draft_vocab_size"] = plain_llm.engine.config.vocab_size // 4
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, enforce_eager=True,
                speculative_config=cfg)
    graphs = emulated_llm(monkeypatch, target, max_num_seqs=8, speculative_config=cfg)
    drafts = {}
    for name, llm in (("eager", eager), ("graphs", graphs)):
        drafts[name] = record_drafts(llm)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert drafts["graphs"] == drafts["eager"] and drafts["eager"]
    assert graphs.engine.stats().spec == eager.engine.stats().spec
    assert graphs.engine.proposer.runner.replays > 0 and graphs.engine.runner.replays > 0
    assert eager.engine.proposer.runner.replays == 0 and eager.engine.runner.replays == 0
    # verification steps took their drafts from the drafter's output on the device
    assert graphs.engine.runner.draft_fills > 0 and eager.engine.runner.draft_fills > 0
    # the logits transform ran inside the drafter's graph: the last drafted block's logits are
    # soft-capped, and equal the eager drafter's for the same one-sequence step
    for llm in (eager, graphs):
        llm.generate([PROMPTS[0]], GREEDY)
    k = graphs.engine.proposer.k  # logits rows of a one-block step (its drafts')
    a = graphs.engine.proposer.runner.ws.logits[:k]
    b = eager.engine.proposer.runner.ws.logits[:k]
    assert np.abs(a).max() <= SOFTCAP or not softcapped
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_emulated_graphs_draw_what_eager_draws(monkeypatch, pair):
    """At temperature > 0 the drafts are draws from q, verified against q: with graphs (the
    drafter's draws and the verification against its logits rows inside them) the seeded tokens,
    drafts and counts are eager's, and most drafts are accepted (the random drafter's q is close
    to the random target's nearly flat p; one-hot verification would accept ~1 / vocab)."""
    target, drafter = pair
    cfg = spec(drafter, 5)
    params = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, ignore_eos=True, seed=s)
              for s in range(len(PROMPTS))]
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, enforce_eager=True, speculative_config=cfg)
    graphs = emulated_llm(monkeypatch, target, max_num_seqs=8, speculative_config=cfg)
    runs = {}
    for name, llm in (("eager", eager), ("graphs", graphs)):
        drafts = record_drafts(llm)
        runs[name] = ([o.token_ids for o in llm.generate(PROMPTS, params)], drafts, llm.engine.stats().spec)
    assert runs["graphs"] == runs["eager"]
    assert runs["graphs"][2]["acceptance_rate"] > 0.3 and runs["graphs"][2]["draft_tokens"] > 50
    assert graphs.engine.proposer.runner.replays > 0 and graphs.engine.runner.replays > 0


@pytest.mark.gpu
def test_dflash_drawn_drafts_on_gpu(pair):
    """On the GPU, graphs and eager draw and verify the same seeded drafts at temperature > 0 (one
    sequence at a time: the same shapes, the same bits), and most are accepted."""
    target, drafter = pair
    params = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, ignore_eos=True, seed=s) for s in range(3)]
    runs = {}
    for eager in (True, False):
        llm = LLM(target, device="cuda", max_model_len=256, max_num_seqs=1, enforce_eager=eager,
                  speculative_config=spec(drafter, 5))
        drafts = record_drafts(llm)
        runs[eager] = ([o.token_ids for o in llm.generate(PROMPTS[:3], params)], drafts, llm.engine.stats().spec)
        if not eager:
            assert llm.engine.proposer.runner.replays > 0 and llm.engine.runner.replays > 0
    assert runs[False] == runs[True]
    assert runs[False][2]["acceptance_rate"] > 0.3 and runs[False][2]["draft_tokens"] > 20


def test_backing_off_steps_run_ahead_on_graphs(monkeypatch, pair):
    """backoff_after on emulated graphs: the plain steps between probe rounds run ahead (async
    scheduling) as graph replays that fill their input ids on the device and store the drafter's
    context; tokens, drafts and counts are the eager engine's, and plain decoding's."""
    target, drafter = pair
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, GREEDY)]
    cfg = {**spec(drafter, 3), "backoff_after": 1, "backoff_max_steps": 4}
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, enforce_eager=True,
                speculative_config=cfg)
    graphs = emulated_llm(monkeypatch, target, max_num_seqs=8, speculative_config=cfg)
    eng, ahead = graphs.engine, []
    run_ahead = eng._step_async

    def step_async():  # the graph replays of each step that ran ahead
        before = eng.runner.replays
        out = run_ahead()
        ahead.append(eng.runner.replays - before)
        return out

    eng._step_async = step_async
    drafts = {}
    for name, llm in (("eager", eager), ("graphs", graphs)):
        drafts[name] = record_drafts(llm)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert drafts["graphs"] == drafts["eager"] and drafts["eager"]
    assert eng.stats().spec == eager.engine.stats().spec and eng.stats().spec["backoff_steps"] > 0
    assert eng.num_pipelined_steps > 0 and sum(ahead) > 0, ahead


def test_drafting_steps_compute_logits_for_the_drafts_only(monkeypatch, pair):
    """A drafting step computes the LM head for each block's rows 1..k only (the drafts; the
    runner's logits_window), eagerly and in graph replays; those rows' drafts are the ones a
    drafter asked for every row of the block gives (the first round, same state, k = block - 1)."""
    target, drafter = pair
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, GREEDY)]
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, enforce_eager=True,
                speculative_config=spec(drafter, 3))
    graphs = emulated_llm(monkeypatch, target, max_num_seqs=8, speculative_config=spec(drafter, 3))
    block = eager.engine.proposer.block
    widest = LLM(target, device="cpu", max_model_len=256, enforce_eager=True,
                 speculative_config=spec(drafter, block - 1))
    first = {}
    for name, llm in (("eager", eager), ("graphs", graphs), ("widest", widest)):
        runner, steps = llm.engine.proposer.runner, []
        forward = runner._forward

        def counted(x, t, r, *a, forward=forward, steps=steps, **kw):
            steps.append((t, r))
            return forward(x, t, r, *a, **kw)

        runner._forward = counted
        rounds = record_drafts(llm)
        llm.generate([PROMPTS[1]], GREEDY)
        first[name] = rounds[0]
        if name != "widest":
            assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
        k = llm.engine.proposer.k
        assert steps and all(t % block == 0 and r == t // block * k for t, r in steps), steps
    assert graphs.engine.proposer.runner.replays > 0
    assert first["eager"] == first["graphs"] == first["widest"][:3] and len(first["widest"]) == block - 1


def test_block_fill_is_the_generic_fill_of_the_window(pair):
    """A drafting step's whole-array fill (ModelRunner._prepare_blocks) writes exactly what the
    generic fills (_prepare_runs, _prepare_any) write for the same blocks, kept to the window's
    logits rows: checked on every drafting step of a run of one and of several sequences. (With
    early drafting the fill is written before the drafts' acceptance is known and moved on the
    device; test_spec's test_dflash_early_drafts_are_the_late_drafts checks that path's drafts.)"""
    from minillm.engine.runner import ModelRunner

    target, drafter = pair
    llm = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, enforce_eager=True,
              speculative_config=spec(drafter, 3))
    llm.engine.early_drafts = False  # each drafting step filled from the host's accepted tokens
    runner = llm.engine.proposer.runner
    first, count = runner.logits_window
    rows = ("input_ids", "positions", "slot_mapping", "src_rows")
    logit_rows = ("logits_indices", "temperature", "top_p", "top_k", "seeds", "sample_pos", "draft_tokens", "draft_src",
                  "draft_q_rows")
    checked = []

    def compared(batch):
        h, B = runner.buf.host, len(batch)
        for generic in (ModelRunner._prepare_runs, ModelRunner._prepare_any):
            runner.buf.table_rows[:] = -1
            t, r = generic(runner, batch)
            assert r == t
            qs = h["query_start"][: B + 1].copy()
            window = (qs[:-1, None] + first + np.arange(count)).ravel()
            want = {name: h[name][:t].copy() for name in rows}
            want.update({name: h[name][window].copy() for name in logit_rows})
            want.update(seq_lens=h["seq_lens"][:B].copy(), query_start=qs, tables=h["block_tables"][:B].copy())
            for name in rows + logit_rows:
                h[name][:] = 7777  # poisoned: every compared entry must be written
            runner.buf.table_rows[:] = -1
            assert runner._prepare_blocks(batch) == (t, window.size)
            got = {name: h[name][:t] for name in rows}
            got.update({name: h[name][: window.size] for name in logit_rows})
            got.update(seq_lens=h["seq_lens"][:B], query_start=h["query_start"][: B + 1], tables=h["block_tables"][:B])
            for name, v in want.items():
                np.testing.assert_array_equal(got[name], v, err_msg=name)
        checked.append(B)
        return ModelRunner.prepare(runner, batch)

    runner.prepare = compared
    llm.generate([PROMPTS[0]], GREEDY)
    llm.generate(PROMPTS, GREEDY)
    assert 1 in checked and max(checked) >= 4
    # anything but such blocks is refused, not filled wrongly
    fresh = Sequence("p", [1, 2, 3], SamplingParams(), 0)
    with pytest.raises(ValueError, match="logits_window"):
        runner._prepare_blocks([ScheduledSeq(fresh, 3)])


def test_verification_graphs_without_the_decode_kernel(monkeypatch, pair):
    """A backend that sends short runs to a tensor-core kernel (short_run_max_ctx, as the CUDA one)
    gets each verification and drafting graph also without the decode kernel's launch, and a step
    replays that one only when every run takes the tensor-core kernel: 2+ queries and at most
    short_run_max_ctx keys (here 40)."""
    from minillm.engine.runner import SHORT_RUNS

    class ShortRunBackend(GraphEmulatingBackend):
        decode_max_q = 16
        short_run_max_ctx = 40

    target, drafter = pair
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, GREEDY)]
    monkeypatch.setattr("minillm.engine.engine.select_backend", lambda device, dtype: ShortRunBackend())
    llm = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, speculative_config=spec(drafter, 3))
    runner, drafting = llm.engine.runner, llm.engine.proposer.runner
    buckets = graph_buckets(8)
    assert {g for g in runner.graphs if SHORT_RUNS in g} == {(b, 4, SHORT_RUNS) for b in buckets}
    block = llm.engine.proposer.block
    assert {g for g in drafting.graphs if len(g) == 3} == {(b, block, SHORT_RUNS) for b in buckets}
    seen = []  # (short graph taken, least queries a run, most keys, padding rows) of each step
    for r in (runner, drafting):
        check = r._short_runs_only

        def record(B, t, T, r=r, check=check):
            h = r.buf.host
            ok = check(B, t, T)
            # a drafting step behind a verification: the device moves each block past up to its
            # drafts' count of accepted ids, so the keys it sees reach the host's + drafts
            adv = r._advance
            host_keys = h["seq_lens"][:B]
            keys = host_keys if adv is None else host_keys + adv.drafts
            seen.append((ok, int(np.diff(h["query_start"][: B + 1]).min()), int(keys.max()), T - t,
                         int(keys.max() - host_keys.max())))
            return ok
        r._short_runs_only = record
    for i in (2, 5):  # 3 prompt tokens: the short graphs, the drafter's until its context passes 40
        assert llm.generate([PROMPTS[i]], GREEDY)[0].token_ids == plain[i]  # 40: full graphs
    # a padding run of one row (a sequence short of its k drafts) is the decode kernel's too
    assert all(ok == (nq >= 2 and keys <= 40 and pad != 1) for ok, nq, keys, pad, _ in seen)
    assert any(pad == 1 for *_, pad, _ in seen)
    # and some drafting step behind a verification was refused the short graph by its drafts alone
    assert any(not ok and keys - extra <= 40 < keys and nq >= 2 and pad != 1 for ok, nq, keys, pad, extra in seen)
    for r in (runner, drafting):
        assert 0 < r.short_run_replays < r.replays  # both kinds of graph were replayed


def test_steps_of_one_sequence_keep_short_runs_on_the_decode_kernel(monkeypatch, pair):
    """short_run_min_seqs (MINILLM_SHORT_RUN_MIN_SEQS=2): attention is told (StepInputs.short_runs)
    to keep the short runs of a one-sequence step on the decode kernel, in eager steps and graph
    replays alike, and the bucket-1 graphs get no variant without the decode kernel's launch."""
    from minillm.engine.runner import SHORT_RUNS

    class MinSeqsBackend(GraphEmulatingBackend):
        decode_max_q = 16
        short_run_max_ctx = 1 << 20
        short_run_min_seqs = 2

        def __init__(self) -> None:
            super().__init__()
            self.hints: list = []  # (most queries a run, real sequences, short_runs) per attention

        def paged_attention(self, q, k_cache, v_cache, block_tables, seq_lens, query_start, *a,
                            short_runs=True, **kw):
            real = int(((np.diff(query_start) > 0) & (seq_lens > 0)).sum())
            self.hints.append((kw.get("max_query_len"), real, short_runs))
            return super().paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start,
                                           *a, short_runs=short_runs, **kw)

    target, drafter = pair
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, GREEDY)]
    monkeypatch.setattr("minillm.engine.engine.select_backend", lambda device, dtype: MinSeqsBackend())
    llm = LLM(target, device="cpu", max_model_len=256, max_num_seqs=4, speculative_config=spec(drafter, 3))
    for r in (llm.engine.runner, llm.engine.proposer.runner):
        short = {g[0] for g in r.graphs if SHORT_RUNS in g}
        assert 1 not in short and short == {b for b in graph_buckets(4) if b >= 2}
    assert llm.generate([PROMPTS[0]], GREEDY)[0].token_ids == plain[0]
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], GREEDY)] == plain[:3]
    # verification and drafting steps of one and of three sequences (0: the graphs' captures)
    hints = llm.engine.backend.hints
    runs = [(real, ok) for most_q, real, ok in hints if most_q and 1 < most_q <= 16 and real]
    assert {real for real, _ in runs} == {1, 3}
    assert all(ok == (real >= 2) for real, ok in runs)


def test_spec_cost_phases(monkeypatch, pair):
    """bench spec-cost's phase split: the target step (context update inside), the proposal, and
    the context update alone, eagerly and through a captured graph."""
    from minillm.bench.spec_cost import phase_times

    target, drafter = pair
    for llm in (LLM(target, device="cpu", max_model_len=256, max_num_seqs=2, enforce_eager=True,
                    speculative_config=spec(drafter, 3)),
                emulated_llm(monkeypatch, target, max_num_seqs=2, speculative_config=spec(drafter, 3))):
        phases = phase_times(llm.engine, PROMPTS[:2], 6)
        assert set(phases) == {"target_step", "propose", "context_update_in_target_step"}
        assert all(v > 0 for v in phases.values())


@pytest.mark.gpu
@pytest.mark.parametrize("models", ["pair", "pair_d64"])
def test_dflash_graphs_match_eager_on_gpu(request, monkeypatch, models):
    """CUDA graphs for the drafter (drafting steps) and its context update (inside the target's
    graphs) give the tokens and drafts enforce_eager gives, and were really replayed.

    One sequence at a time (max_num_seqs=1), eager and graph steps have the very same shapes, so
    in bf16 too the drafts match bit for bit while every round drafts the full k (near max_tokens
    k shrinks, and a graph then runs more verification rows than the eager step: other GEMM
    shapes, possibly other roundings). Concurrently the bucket padding changes shapes, so that
    half runs in float32. pair_d64 in bf16 also runs one sequence with short_run_min_seqs 1, so
    its short runs take the tensor cores and the graphs without the decode kernel's launch."""
    target, drafter = request.getfixturevalue(models)
    k = 5
    configs = [(dict(max_num_seqs=1), PROMPTS[:3], None),
               (dict(max_num_seqs=8, dtype="float32"), PROMPTS, None)]
    if models == "pair_d64":
        configs.append((dict(max_num_seqs=1), PROMPTS[:3], "1"))
    for kw, prompts, min_seqs in configs:
        if min_seqs is None:
            monkeypatch.delenv("MINILLM_SHORT_RUN_MIN_SEQS", raising=False)
        else:
            monkeypatch.setenv("MINILLM_SHORT_RUN_MIN_SEQS", min_seqs)
        runs = {}
        for eager in (True, False):
            llm = LLM(target, device="cuda", max_model_len=256, enforce_eager=eager,
                      speculative_config=spec(drafter, k), **kw)
            rounds = record_drafts(llm)
            tokens = [o.token_ids for o in llm.generate(prompts, GREEDY)]
            runs[eager] = (tokens, [d for d in rounds if len(d) == k], llm.engine)
        (tok_e, drafts_e, eng_e), (tok_g, drafts_g, eng_g) = runs[True], runs[False]
        assert tok_g == tok_e
        assert eng_g.proposer.runner.graphs and eng_g.proposer.runner.replays > 0
        assert eng_g.runner.replays > 0
        if "dtype" not in kw:  # bf16, one sequence: the graphs without the decode kernel ran iff allowed
            default = cuda_ops._SHORT_RUN_MIN_SEQS_DEFAULT
            assert eng_g.backend.short_run_min_seqs == int(min_seqs or default)  # the setting took effect
            ran = (eng_g.runner.short_run_replays, eng_g.proposer.runner.short_run_replays)
            if eng_g.backend.short_run_min_seqs > 1:
                assert ran == (0, 0)
            elif models == "pair_d64":
                assert ran[0] > 0 and ran[1] > 0
        assert not eng_e.proposer.runner.graphs and eng_e.proposer.runner.replays == 0
        if kw["max_num_seqs"] == 1:  # a sequence drafts the full k until it nears max_tokens
            differ = sum(a != b for a, b in zip(drafts_g, drafts_e))
            assert drafts_e and len(drafts_g) == len(drafts_e) and not differ, (
                f"{differ} of {len(drafts_e)} full-k rounds drafted other tokens with graphs")


@pytest.mark.gpu
def test_dflash2_on_gpu(pair2):
    """A DFlash2 drafter on the GPU: in bf16, one sequence, graphs draft and emit what eager steps
    do (the same shapes, so the same bits) and really replayed; in float32 the first round's drafts
    equal the NumPy backend's (the selector's path from the same logits, up to float32 rounding
    of near-equal scores, which random weights make improbable)."""
    target, drafter = pair2
    runs = {}
    for eager in (True, False):
        llm = LLM(target, device="cuda", max_model_len=256, enforce_eager=eager, max_num_seqs=1,
                  speculative_config=spec(drafter, 5))
        rounds = record_drafts(llm)
        runs[eager] = ([o.token_ids for o in llm.generate(PROMPTS[:3], GREEDY)], rounds, llm.engine)
    (tok_e, drafts_e, _), (tok_g, drafts_g, eng_g) = runs[True], runs[False]
    assert tok_g == tok_e and drafts_g == drafts_e and drafts_e
    assert eng_g.proposer.runner.replays > 0
    first = {}
    for device in ("cpu", "cuda"):
        llm = LLM(target, device=device, dtype="float32", max_model_len=256, max_num_seqs=1,
                  speculative_config=spec(drafter, 5))
        rounds = record_drafts(llm)
        llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        first[device] = rounds[0]
    assert first["cuda"] == first["cpu"]


@pytest.mark.gpu
def test_dflash_draft_vocab_graphs_match_eager_on_gpu(pair):
    """draft_vocab_size on the GPU: the drafting graphs' LM head is a slice of the target's rows;
    graphs give eager's tokens and drafts (one sequence: the same shapes, so the same bits), every
    draft lies below the slice, and the graphs really ran."""
    target, drafter = pair
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    cfg = {**spec(drafter, 5), "draft_vocab_size": vocab // 4}
    runs = {}
    for eager in (True, False):
        llm = LLM(target, device="cuda", max_model_len=256, enforce_eager=eager, max_num_seqs=1,
                  speculative_config=cfg)
        rounds = record_drafts(llm)
        runs[eager] = ([o.token_ids for o in llm.generate(PROMPTS[:3], GREEDY)], rounds, llm.engine)
    (tok_e, drafts_e, _), (tok_g, drafts_g, eng_g) = runs[True], runs[False]
    assert tok_g == tok_e and drafts_g == drafts_e
    assert eng_g.proposer.runner.replays > 0
    assert max(t for d in drafts_g for t in d) < cfg["draft_vocab_size"]
