"""The whole engine on the CUDA backend: graphs vs eager, the sealed arena, speculation, SmolLM2.

All tests carry the `gpu` mark and skip without a GPU (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from minillm import LLM, SamplingParams

from hf_models import make_tiny

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 99, 3, 42], list(range(1, 40)), [100, 101, 102, 100, 101, 102, 100], [7] * 20,
           [9, 8, 7, 6, 5, 4, 3, 2, 1], list(range(200, 250))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_tiny("qwen3", path, seed=0, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, intermediate_size=256)
    return str(path)


def test_graphs_and_eager_give_identical_tokens(tiny):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    sampled = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=24, ignore_eos=True, seed=i)
               for i in range(len(PROMPTS))]
    graphs = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256)
    assert graphs.engine.runner.graphs, "no CUDA graphs were captured"
    eager = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256, enforce_eager=True)
    assert not eager.engine.runner.graphs
    for params in (greedy, sampled):
        a = [o.token_ids for o in graphs.generate(PROMPTS, params)]
        b = [o.token_ids for o in eager.generate(PROMPTS, params)]
        assert a == b


def test_gpu_greedy_matches_cpu_reference(tiny):
    """bf16 on the GPU vs float32 NumPy: logits within 2e-2 relative, greedy tokens agree."""
    cpu = LLM(tiny, device="cpu", max_num_seqs=64, max_model_len=256)
    gpu = LLM(tiny, device="cuda", max_num_seqs=64, max_model_len=256)
    for ref, got in zip(cpu.engine.score(PROMPTS[:3]), gpu.engine.score(PROMPTS[:3])):
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel < 2e-2, f"relative error {rel:.3e}"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    a = [o.token_ids for o in cpu.generate(PROMPTS, params)]
    b = [o.token_ids for o in gpu.generate(PROMPTS, params)]
    agree = np.mean([x[:8] == y[:8] for x, y in zip(a, b)])
    assert agree >= 5 / 6, f"only {agree:.0%} of prompts agree on their first 8 greedy tokens"


def test_logprobs_on_the_gpu(tiny):
    """Logprobs read from the graphs' logits buffer (synchronous steps while asked for) against
    log_softmax of the same model's scored logits, and against the CPU reference's."""
    gpu = LLM(tiny, device="cuda", max_num_seqs=64, max_model_len=256)
    cpu = LLM(tiny, device="cpu", max_num_seqs=64, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
    for llm in (gpu, cpu):
        for prompt, out in zip(PROMPTS[:3], llm.generate(PROMPTS[:3], params)):
            assert [lp.token_id for lp in out.logprobs] == out.token_ids
            lg = llm.engine.score([prompt + out.token_ids[:-1]])[0].astype(np.float64)
            ls = lg - lg.max(-1, keepdims=True)
            ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
            for j, lp in enumerate(out.logprobs):
                assert abs(lp.logprob - ls[len(prompt) - 1 + j, lp.token_id]) < 0.05
                assert lp.top[0][0] == lp.token_id  # greedy
    assert gpu.engine.num_pipelined_steps == 0  # logprob requests keep the steps synchronous


def test_penalties_on_the_gpu(tiny):
    """Penalised greedy decoding on the GPU (eager steps: the penalties sit between forward and
    sampler) follows the penalised argmax of the same model's scored logits, up to bf16 ties."""
    gpu = LLM(tiny, device="cuda", max_num_seqs=64, max_model_len=256)
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=1.0,
                       frequency_penalty=0.5, repetition_penalty=1.3)
    for prompt, out in zip(PROMPTS[:3], gpu.generate(PROMPTS[:3], p)):
        raw = gpu.engine.score([prompt + out.token_ids[:-1]])[0].astype(np.float64)
        for j, tok in enumerate(out.token_ids):
            x = raw[len(prompt) - 1 + j].copy()
            hist = out.token_ids[:j]
            for t in set(prompt) | set(hist):
                x[t] = x[t] / 1.3 if x[t] > 0 else x[t] * 1.3
                x[t] -= 0.5 * hist.count(t) + 1.0 * (t in hist)
            assert x[tok] >= x.max() - 0.05


SMALL_JSON = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
              "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"enum": ["x", "yz"]}}}


def test_structured_outputs_on_the_gpu(tiny):
    """Constrained greedy decoding on the GPU (cuda mask_logits between forward and sampler) takes,
    at every step, the best token the grammar allows in the same model's scored logits (up to bf16
    ties), parses, and stays lossless under n-gram and self-drafted speculation."""
    import json

    gpu = LLM(tiny, device="cuda", max_num_seqs=64, max_model_len=256)  # 64: score() takes the outputs
    so = {"json": SMALL_JSON, "disable_any_whitespace": True}
    p = SamplingParams(temperature=0, max_tokens=40, structured_outputs=so)
    outs = gpu.generate(PROMPTS[:3], p)
    grammars = gpu.engine.grammars
    for prompt, out in zip(PROMPTS[:3], outs):
        v = json.loads(out.text)
        assert set(v) == {"a", "b"} and out.finish_reason == "stop"
        raw = gpu.engine.score([prompt + out.token_ids[:-1]])[0].astype(np.float64)
        m = grammars.matcher(SamplingParams(structured_outputs=so).structured_outputs)
        for j, tok in enumerate(out.token_ids):
            bits = grammars.next_token_masks([(m, [])])[0]
            allowed = (np.unpackbits(bits.view(np.uint8), bitorder="little")[: raw.shape[1]]).astype(bool)
            x = np.where(allowed, raw[len(prompt) - 1 + j], -np.inf)
            assert allowed[tok] and x[tok] >= x.max() - 0.05, j
            m.consume_token(tok)
    assert gpu.engine.runner.forward_only_replays > 0  # decode steps replayed graphs that stop at the logits
    sampled = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs=so) for s in range(6)]
    assert all(set(json.loads(o.text)) == {"a", "b"} for o in gpu.generate(PROMPTS, sampled))
    for spec in ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                 {"method": "draft_model", "model": tiny, "num_speculative_tokens": 4}):
        llm = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256, speculative_config=spec)
        assert [o.token_ids for o in llm.generate(PROMPTS[:3], p)] == [o.token_ids for o in outs], spec["method"]


def test_allowed_tokens_and_thinking_constraints_on_the_gpu(tiny):
    """allowed_token_ids and a constraint that waits for the thinking (think_token_ids) through the
    cuda mask kernel, bad_words through suppress_tokens: samples stay in the set and never hold the
    word, the text after the end token is a choice, and greedy outputs are the same under n-gram
    speculation."""
    gpu = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256)
    tok = gpu.engine.tokenizer
    allowed = tok.encode("abc ", add_special_tokens=False)
    outs = gpu.generate(PROMPTS[:4], [SamplingParams(temperature=1.0, seed=s, max_tokens=24, allowed_token_ids=allowed)
                                      for s in range(4)])
    assert all(set(o.token_ids) <= set(allowed) for o in outs)
    a, b = allowed[0], allowed[1]  # bad_words ["ab"]: b may not follow a (a bias makes both likely)

    def pairs(**kw) -> int:
        outs = gpu.generate(PROMPTS[:4], [SamplingParams(temperature=1.0, seed=s, max_tokens=24,
                                                         logit_bias={a: 6.0, b: 6.0}, **kw) for s in range(4)])
        return sum(x == a and y == b for o in outs for x, y in zip(o.token_ids, o.token_ids[1:]))

    assert pairs() > 0 and pairs(bad_words=["ab"]) == 0
    end = tok.encode("%", add_special_tokens=False)[0]  # any id outside the choices' text can end a thinking
    assert end not in gpu.engine.eos_ids
    think = [SamplingParams(temperature=1.0, seed=s, max_tokens=60, logit_bias={end: 3.0}, think_token_ids=(None, end),
                            structured_outputs={"choice": ["yes", "no"]}) for s in range(4)]
    ended = 0
    for o in gpu.generate(PROMPTS[:4], think):
        if end in o.token_ids:
            k = o.token_ids.index(end)
            assert tok.decode(o.token_ids[k + 1:]) in ("yes", "no") and o.finish_reason == "stop", o.token_ids
            ended += 1
    assert ended >= 2  # at +3 the end token comes within 60 tokens for most seeds
    greedy = [SamplingParams(temperature=0, max_tokens=24, allowed_token_ids=allowed),
              SamplingParams(temperature=0, max_tokens=40, logit_bias={end: 1.0}, think_token_ids=(None, end),
                             structured_outputs={"choice": ["yes", "no"]})]
    want = [o.token_ids for o in gpu.generate(PROMPTS[:2], greedy)]
    spec = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1})
    assert [o.token_ids for o in spec.generate(PROMPTS[:2], greedy)] == want


def test_allocation_in_step_loop_raises(tiny):
    import cupy

    from minillm.backends.arena import ArenaSealedError

    llm = LLM(tiny, device="cuda", max_num_seqs=4, max_model_len=128)
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=4))  # steps run fine sealed
    with pytest.raises(ArenaSealedError, match="test_gpu_engine.py"):
        cupy.empty(1024, dtype=np.float32)
    engine = llm.engine
    original = engine.runner.launch  # what step() calls (execute is only the drafters' and score's)

    def leaky_launch(batch, *a, **kw):
        cupy.zeros(16)  # what a careless kernel wrapper might do mid-step
        return original(batch, *a, **kw)

    engine.runner.launch = leaky_launch
    engine.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(ArenaSealedError, match="leaky_launch"):
        engine.step()


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculation_lossless_on_gpu(tiny, method):
    spec = {"method": method, "num_speculative_tokens": 4}
    if method == "draft_model":
        spec["model"] = tiny  # self-drafting: every draft is right
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    base = [o.token_ids for o in LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256)
            .generate(PROMPTS, params)]
    llm = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256, speculative_config=spec)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == base
    stats = llm.engine.stats().spec
    assert stats["rounds"] > 0
    if method == "draft_model":
        assert stats["acceptance_rate"] > 0.9  # bf16 batch effects may flip a rare near-tie
        assert llm.engine.proposer.runner.replays > 0  # the drafter's steps replayed CUDA graphs


@pytest.mark.parametrize("method", ["ngram", "dflash", "draft_model"])
def test_sampled_speculation_lossless_on_gpu(tmp_path, method):
    """Rejection sampling on the device: 20,000 seeded two-token samples with speculation on
    match the target's exact joint distribution (computed from its own GPU logits)."""
    from test_spec import chi_square_p, exact_two_token_distribution

    from minillm.tools.random_model import write_dflash_drafter

    target, drafter = tmp_path / "t", tmp_path / "d"
    make_tiny("qwen3", target, seed=0)  # a 256-token vocabulary
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    if method == "dflash":
        write_dflash_drafter(drafter, target, seed=4, force=True)
        spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3}
    if method == "draft_model":  # a poorer one-layer drafter, its drafts drawn from its q
        make_tiny("qwen3", drafter, seed=7, num_hidden_layers=1)
        spec = {"method": "draft_model", "model": str(drafter), "num_speculative_tokens": 3}
    prompt = np.random.default_rng(0).permutation(256).tolist()  # every token: n-gram always drafts
    # float32 storage: the exact distribution (prefill logits) and the sampled steps (decode and
    # verification shapes) then agree to ~1e-6, far below what 20,000 samples can resolve
    llm = LLM(str(target), device="cuda", dtype="float32", max_num_seqs=256, max_model_len=300,
              max_num_batched_tokens=16384, speculative_config=spec)
    probs = exact_two_token_distribution(llm, prompt, SamplingParams(temperature=1.3, top_k=5))
    n, counts = 20_000, {}
    for start in range(0, n, 2000):
        ps = [SamplingParams(temperature=1.3, top_k=5, max_tokens=2, ignore_eos=True, seed=s)
              for s in range(start, start + 2000)]
        for out in llm.generate([prompt] * 2000, ps):
            counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
    assert chi_square_p(counts, probs, n) > 0.001
    assert llm.engine.stats().spec["draft_tokens"] > 0


def test_draft_model_drafts_drawn_from_q_on_gpu(tiny):
    """Self-drafting at temperature 1: the drafts drawn from q (each drafting step's rows copied for
    the verification, the drafter's steps on graphs, the arena refusing any allocation) are nearly
    all accepted, where one-hot verification would accept a draft with probability p(d) only."""
    spec = {"method": "draft_model", "model": tiny, "num_speculative_tokens": 4}
    llm = LLM(tiny, device="cuda", max_num_seqs=8, max_model_len=256, speculative_config=spec)
    assert llm.engine.runner.draft_q is llm.engine.proposer
    llm.generate(PROMPTS, [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s)
                           for s in range(len(PROMPTS))])
    stats = llm.engine.stats().spec
    assert stats["draft_tokens"] > 50 and stats["acceptance_rate"] > 0.9, stats
    assert llm.engine.proposer.runner.replays > 0


def test_dflash_lossless_on_gpu(tmp_path):
    from minillm.tools.random_model import write_dflash_drafter, write_random_model

    target, drafter = tmp_path / "t", tmp_path / "d"
    write_random_model(target, "tiny", seed=3, force=True)
    write_dflash_drafter(drafter, target, seed=4, force=True)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    base = [o.token_ids for o in LLM(str(target), device="cuda", max_model_len=256).generate(PROMPTS, params)]
    llm = LLM(str(target), device="cuda", max_model_len=256,
              speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 8})
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == base
    assert llm.engine.stats().spec["draft_tokens"] > 0
    # disable_by_batch_size: plain graph steps while 3+ sequences run, DFlash rounds once fewer do
    # (outputs of 4-32 tokens); the drafter's context, stored by every target step, stays current
    mixed = [SamplingParams(temperature=0, max_tokens=4 + 7 * (i % 5), ignore_eos=True) for i in range(len(PROMPTS))]
    base = [o.token_ids for o in LLM(str(target), device="cuda", max_model_len=256).generate(PROMPTS, mixed)]
    llm = LLM(str(target), device="cuda", max_model_len=256,
              speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 8,
                                  "disable_by_batch_size": 3})
    assert [o.token_ids for o in llm.generate(PROMPTS, mixed)] == base
    spec = llm.engine.stats().spec
    assert spec["paused_steps"] > 0 and spec["draft_tokens"] > 0
    # backoff_after: the random drafter's rounds accept nothing, so sequences back off to plain graph
    # steps between probe rounds; the tokens stay the same
    llm = LLM(str(target), device="cuda", max_model_len=256,
              speculative_config={"method": "dflash", "model": str(drafter), "num_speculative_tokens": 8,
                                  "backoff_after": 1, "backoff_max_steps": 8})
    assert [o.token_ids for o in llm.generate(PROMPTS, mixed)] == base
    assert llm.engine.stats().spec["backoff_steps"] > 0


def test_smollm2_greedy_on_gpu_agrees_with_cpu():
    """The embedded SmolLM2 (GGUF) greedy on the GPU (bf16) against the NumPy backend (fp32): equal
    token for token, or departing only at a near-tie. Where the two first differ, the fp32 logits
    (the CPU scoring the common prefix) must rank the GPU's token among their top 3 and within 2% of
    the top logit's magnitude of it: a gap bf16's rounding can close (the whole-model logits agree
    within 2e-2 relative, test_gpu_greedy_matches_cpu_reference). A GPU token the reference puts
    further down is a wrong kernel, not precision."""
    from minillm.models.loader import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    prompts = [[{"role": "user", "content": "What is the capital of France?"}],
               [{"role": "user", "content": "Write a Python function that adds two numbers."}],
               [{"role": "user", "content": "List three colors."}]]
    params = SamplingParams(temperature=0, max_tokens=32)
    # 96 sequences' worth of logits: score() returns every position of a prompt of up to ~75 tokens
    cpu = LLM(device="cpu", max_model_len=160, max_num_seqs=96)
    gpu = LLM(device="cuda", max_model_len=160, max_num_seqs=96)
    agree = []
    for conv in prompts:
        prompt = cpu.tokenizer.encode_chat(conv, True)
        a = cpu.generate([prompt], params)[0].token_ids
        b = gpu.generate([prompt], params)[0].token_ids
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree.append(n)
        if n == min(len(a), len(b)):
            continue
        ref = cpu.engine.score([prompt + a[:n]])[0][-1]  # fp32 logits for token n
        top = np.argsort(ref)[::-1]
        gap = float(ref[a[n]] - ref[b[n]])
        print(f"departs at token {n}: CPU {a[n]} (logit {ref[a[n]]:.3f}), GPU {b[n]} (CPU rank "
              f"{int(np.where(top == b[n])[0][0]) + 1}, gap {gap:.4f})")
        assert b[n] in top[:3], f"at token {n} the GPU chose {b[n]}, outside the reference's top 3 {top[:3]}"
        assert gap <= 0.02 * max(abs(float(ref[a[n]])), 1.0), f"at token {n} the reference's gap is {gap:.4f}"
    print("SmolLM2 GPU/CPU greedy agreement (tokens):", agree)


def test_smollm2_greedy_on_graphs_repeats_and_matches_the_prefill():
    """Plain greedy decoding on CUDA graphs, the embedded SmolLM2, three prompts six times in one
    process: every run the same tokens, and every token the prefill's argmax of its prefix or a
    bf16 near-tie of it (scripts/decode_consistency.py's checks). Session 41 (part246-part248):
    with the norms folded into the one-row products reading x and the residual through L1, runs
    differed from repeat to repeat and some tokens were thousands of ranks down the prefill's list;
    read from L2 (cuda/gemv.cu NORM_ROW_L2), 8 of 8 repeats agreed."""
    import sys
    from pathlib import Path

    from minillm.models.loader import default_model_path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import decode_consistency as dc

    try:
        default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # prefix caching off: a later repeat would prefill from the cache, with other row counts, other
    # kernels and another rounding (test_greedy_on_graphs_repeats_bit_for_bit, part249)
    llm = LLM(device="cuda", max_model_len=1024, max_num_seqs=256, async_scheduling=False,
              enable_prefix_caching=False)
    assert llm.engine.runner.graphs
    prompts = [llm.tokenizer.encode_chat(m) for m in dc.PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=96)
    runs = [[llm.generate([p], params)[0].token_ids for p in prompts] for _ in range(6)]
    assert all(r == runs[0] for r in runs), "greedy runs on graphs differ between repeats"
    for p, out in zip(prompts, runs[0]):
        bad = [d for d in dc.teacher_forced(llm, p, out) if d["classification"] == "wrong"]
        assert not bad, f"tokens the prefill does not rank near the top: {bad}"


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_greedy_on_graphs_repeats_bit_for_bit(tmp_path, spec):
    """A random model of Qwen3-0.6B's widths (its one-row products fold their norms) with 12 layers:
    three prompts greedily, one at a time (batch-1 steps: the folded norms' path), six times in one
    process on CUDA graphs, plain and with n-gram speculation: every repeat gives the first one's
    tokens. A kernel that reads what the kernel
    before it wrote through the read-only path under PDL shows here as repeats that differ
    (session 41: the folded norms, docs/DEVELOPING.md); no sanitizer reports it. Prefix caching is
    off: with it, every repeat after the first prefills from the cache, with other row counts, other
    kernels and another rounding, and on a random model's flat logits that alone parted the first
    run from the five later ones, which agreed with each other (part249)."""
    from minillm.tools.random_model import write_random_model

    model = write_random_model(tmp_path / "m", "qwen3-0.6b", seed=1, num_layers=12)
    kw = {} if spec is None else {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                          "prompt_lookup_max": 3}}
    llm = LLM(str(model), device="cuda", max_num_seqs=8, max_model_len=512, async_scheduling=False,
              enable_prefix_caching=False, **kw)
    assert llm.engine.runner.graphs
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    runs = [[llm.generate([p], params)[0].token_ids for p in PROMPTS[:3]] for _ in range(6)]
    assert all(r == runs[0] for r in runs), [i for i, r in enumerate(runs) if r != runs[0]]
