"""A draft model's steps in CUDA graphs: its one-token drafting steps and its catch-ups replay
graphs of the drafter's runner (one row a sequence, or two: the last draft and the bonus token once
every draft was accepted), and give what eager steps give.

On the CPU the graphs are emulated (test_dflash_graphs.GraphEmulatingBackend: a "graph" reruns the
captured function at the bucket's shape, and a host transfer inside it raises), which checks the
plumbing: graph selection for the catch-up runs, padding, one logits row a sequence.
"""

from __future__ import annotations

import pytest
from test_dflash_graphs import emulated_llm
from test_spec import write_models

from minillm import LLM, SamplingParams
from minillm.engine.engine import graph_buckets
from minillm.engine.runner import FORWARD_ONLY
from minillm.engine.scheduler import ScheduledSeq
from minillm.engine.sequence import Sequence

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], list(range(1, 21)) + [1, 2, 3], [9, 9, 9],
           [100, 101, 102, 100, 101], [42], list(range(30, 70))] * 2
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Qwen3 target and a poorer one-layer drafter with its tokenizer (test_spec's pair)."""
    return tuple(str(p) for p in write_models(tmp_path_factory))


def draft_spec(model: str, k: int) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k}


def watch_replays(runner) -> list[tuple[int, int]]:
    """Every graph replay of runner as (bucket, rows), in order."""
    seen, original = [], runner._replay

    def replay(pick, *a):
        seen.append((pick.bucket, pick.rows))
        return original(pick, *a)

    runner._replay = replay
    return seen


def test_drafter_graphs_are_captured(monkeypatch, models):
    target, _ = models
    llm = emulated_llm(monkeypatch, target, max_num_seqs=4, speculative_config=draft_spec(target, 3))
    runner = llm.engine.proposer.runner
    buckets = graph_buckets(4)
    assert set(runner.graphs) == ({(b, r) for b in buckets for r in (1, 2)}
                                  | {(b, 1, FORWARD_ONLY) for b in buckets})
    assert runner.catch_up_graphs and not llm.engine.runner.catch_up_graphs
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=4, enforce_eager=True,
                speculative_config=draft_spec(target, 3))
    assert not eager.engine.proposer.runner.graphs


def test_catch_up_runs_select_the_two_row_graph(monkeypatch, models):
    target, _ = models
    llm = emulated_llm(monkeypatch, target, max_num_seqs=4, speculative_config=draft_spec(target, 3))
    runner = llm.engine.proposer.runner

    def seq(n: int) -> Sequence:
        return Sequence("s", list(range(1, n + 1)), SamplingParams(max_tokens=8), 0)

    def catch_up(s: Sequence, n: int) -> ScheduledSeq:  # what DraftModelProposer.propose schedules
        return ScheduledSeq(s, n, start=s.num_tokens - n)

    pick = runner._graph_for([catch_up(seq(6), 1)], 1)
    assert (pick.bucket, pick.rows) == (1, 1)
    pick = runner._graph_for([catch_up(seq(6), 2), catch_up(seq(7), 1), catch_up(seq(9), 2)], 5)
    assert (pick.bucket, pick.rows) == (4, 2) and pick.graph is runner.graphs[(4, 2)]
    assert runner._logits_rows(8, 4) == 4  # one logits row a sequence, not one a token row
    assert runner._graph_for([catch_up(seq(9), 3)], 3) is None  # longer catch-ups: eager
    # the target's runner takes no catch-up run (a prefill chunk of two tokens stays eager)
    assert llm.engine.runner._graph_for([ScheduledSeq(seq(6), 2, start=4)], 2) is None


@pytest.mark.parametrize("drafter", ["self", "poor"])
def test_emulated_drafter_graphs_match_eager(monkeypatch, models, drafter):
    """Same tokens as plain decoding, and the eager engine's drafts and acceptance, with the
    drafter's steps on (emulated) graphs; both graph shapes replayed. self: every draft is
    accepted, so every round's catch-up is two rows; poor: catch-ups of one row, mostly."""
    target, poor = models
    model = target if drafter == "self" else poor
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, GREEDY)]
    eager = LLM(target, device="cpu", max_model_len=256, max_num_seqs=8, enforce_eager=True,
                speculative_config=draft_spec(model, 3))
    graphs = emulated_llm(monkeypatch, target, max_num_seqs=8, speculative_config=draft_spec(model, 3))
    replays = watch_replays(graphs.engine.proposer.runner)
    for llm in (eager, graphs):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert graphs.engine.stats().spec == eager.engine.stats().spec
    assert eager.engine.proposer.runner.replays == 0
    rows = {r for _, r in replays}
    assert 1 in rows
    if drafter == "self":
        assert graphs.engine.stats().spec["acceptance_rate"] == 1.0
        assert 2 in rows  # the catch-ups after fully accepted rounds


def test_drafter_graphs_with_preemption_and_penalties(monkeypatch, models):
    """A pool small enough to preempt, and requests whose logits change before sampling (the
    drafter's one-row steps then replay graphs that stop at the logits): the outputs are plain
    decoding's."""
    target, poor = models
    params = [GREEDY, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.3)] * 6
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, params)]
    llm = emulated_llm(monkeypatch, target, max_num_seqs=8, num_blocks=20, speculative_config=draft_spec(poor, 3))
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == plain
    runner = llm.engine.proposer.runner
    assert llm.engine.stats().preemptions > 0
    assert runner.replays > 0 and runner.forward_only_replays > 0


@pytest.mark.parametrize("graphs", [False, True])
def test_drafting_steps_are_chained_on_the_device(monkeypatch, models, graphs):
    """From the second drafting step of a round on, each step's input (the draft the step before
    sampled) is filled on the device (ScheduledSeq.src_row): the steps are launched back to back,
    at most two unread. Self-drafting must still be right every time, and give plain decoding's
    tokens, eager and on (emulated) graphs."""
    target, _ = models
    k = 4
    plain = [o.token_ids for o in LLM(target, device="cpu", max_model_len=256).generate(PROMPTS, GREEDY)]
    kw = dict(max_num_seqs=8, speculative_config=draft_spec(target, k))
    llm = (emulated_llm(monkeypatch, target, **kw) if graphs
           else LLM(target, device="cpu", max_model_len=256, enforce_eager=True, **kw))
    runner = llm.engine.proposer.runner
    fills, unread, most_unread, original = [], [0], [0], runner._upload
    launch, collect = runner.launch, runner.collect

    def upload(*a):
        fills.append(runner.num_fill)
        return original(*a)

    def counted_launch(*a, **kw):
        unread[0] += 1
        most_unread[0] = max(most_unread[0], unread[0])
        return launch(*a, **kw)

    def counted_collect(handle):
        unread[0] -= 1
        return collect(handle)

    monkeypatch.setattr(runner, "_upload", upload)
    monkeypatch.setattr(runner, "launch", counted_launch)
    monkeypatch.setattr(runner, "collect", counted_collect)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert llm.engine.stats().spec["acceptance_rate"] == 1.0  # every chained input was the right draft
    # rows filled on the device: a sequence's round of k = 4 drafts chains two of its steps (fewer
    # near max_tokens, where k shrinks)
    assert sum(fills) >= llm.engine.stats().spec["rounds"]
    assert most_unread[0] == 2 and unread[0] == 0
