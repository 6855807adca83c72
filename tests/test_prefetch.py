"""The L2 prefetch of small decode steps: the plan's ranges (minillm.models.prefetch_plan) on the CPU,
and on the GPU that prefetching changes no token and faults nowhere (cuda/prefetch.cu)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.models.prefetch_plan import PRODUCTS, plan_prefetch

from hf_models import make_tiny

MB = 1 << 20


def fake_layers(n: int, sizes_mb=(8, 4, 12, 6)):
    return [SimpleNamespace(**{p: np.zeros(s * MB // 8, np.uint8) for p, s in zip(PRODUCTS, sizes_mb)})
            for _ in range(n)]


def covered(plan) -> list[tuple[int, int, int]]:
    """Every prefetched range as (id of its array, first, end), in issue order."""
    ranges = list(plan.first)
    for layer in plan.after:
        for p in PRODUCTS:
            ranges += layer[p]
    return [(id(a), lo, hi) for a, lo, hi in ranges]


@pytest.mark.parametrize("distance_mb", [1, 3, 32])
@pytest.mark.parametrize("points", [PRODUCTS, ("qkv", "down"), ("o",)])
def test_plan_covers_the_stream_once_in_reading_order(distance_mb, points):
    layers = fake_layers(3)
    lm_head = np.zeros(40 * MB // 8, np.uint8)
    plan = plan_prefetch(layers, lm_head, distance_mb * MB // 8, points, max_tokens=8)
    order = [getattr(lw, p) for lw in layers for p in PRODUCTS] + [lm_head]
    index = {id(a): k for k, a in enumerate(order)}
    pos = [(index[a], lo, hi) for a, lo, hi in covered(plan)]
    # in stream order, never overlapping, each range inside its matrix
    flat = [sum(order[j].nbytes for j in range(k)) + lo for k, lo, _ in pos]
    ends = [sum(order[j].nbytes for j in range(k)) + hi for k, _, hi in pos]
    assert all(0 <= lo < hi <= order[k].nbytes for k, lo, hi in pos)
    assert all(e <= f for e, f in zip(ends, flat[1:])), "ranges overlap or go backwards"
    assert flat[0] == 0 and ends[0] == min(distance_mb * MB // 8, order[0].nbytes)
    if points == PRODUCTS and distance_mb * MB // 8 >= max(a.nbytes for a in order[:-1]):
        # a window at least a product long, sliding after every product, leaves no gap
        assert all(e == f for e, f in zip(ends, flat[1:]))
    # after each product the window reaches `distance` past the next product's start, no further
    stream_start = np.cumsum([0] + [a.nbytes for a in order])
    for i, layer in enumerate(plan.after):
        for k, p in enumerate(PRODUCTS):
            if layer[p]:
                assert p in points
                nxt = stream_start[i * 4 + k + 1]
                a, _, hi = layer[p][-1]
                assert stream_start[index[id(a)]] + hi == nxt + distance_mb * MB // 8


def test_plan_refuses_an_unknown_point():
    with pytest.raises(ValueError, match="prefetch point 'up'"):
        plan_prefetch(fake_layers(1), np.zeros(16, np.uint8), MB, ("up",), 8)


def test_cpu_backend_has_no_prefetch(monkeypatch):
    from minillm.backends.numpy_ops import NumpyBackend

    monkeypatch.setenv("MINILLM_L2_PREFETCH", "32")
    assert NumpyBackend().prefetch_config() is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_tiny("qwen3", path, seed=0, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, intermediate_size=256)
    return str(path)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["0.01", "0.05:qkv,down"])
def test_prefetch_changes_no_token(tiny, monkeypatch, spec):
    """Greedy and seeded sampling with the prefetch on equal the same engine's tokens with it off,
    in CUDA graphs (PDL launches) and eagerly; a fault in the kernel would fail the run."""
    prompts = [[5, 17, 99, 3, 42], list(range(1, 40)), [7] * 20]
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, ignore_eos=True, seed=3)]
    monkeypatch.setenv("MINILLM_L2_PREFETCH", "0")
    want = [[o.token_ids for o in LLM(tiny, device="cuda", max_num_seqs=4, max_model_len=256).generate(prompts, p)]
            for p in params]
    monkeypatch.setenv("MINILLM_L2_PREFETCH", spec)
    for eager in (False, True):
        llm = LLM(tiny, device="cuda", max_num_seqs=4, max_model_len=256, enforce_eager=eager)
        assert llm.engine.runner.model.prefetch is not None
        assert [[o.token_ids for o in llm.generate(prompts, p)] for p in params] == want


@pytest.mark.gpu
def test_bad_prefetch_spec_is_refused(tiny, monkeypatch):
    monkeypatch.setenv("MINILLM_L2_PREFETCH", "lots")
    with pytest.raises(ValueError, match="MINILLM_L2_PREFETCH='lots'"):
        LLM(tiny, device="cuda", max_num_seqs=4, max_model_len=256)
