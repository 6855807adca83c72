"""python -m minillm.bench spec-cost TARGET --drafter DFLASH_DIR: what speculation costs and buys.

1. Cost when nothing is accepted: decode steps of c = 1, 2, 4, ... sequences with no speculation,
   then with the DFlash drafter (k drafts per round; a random drafter is never right), median step
   time each; the ratio is the price of a verify step plus a draft step over a plain decode step.
   With --temperature T (and --top-p / --top-k) both sample (seeded requests): the drafter then
   draws its drafts from q and the target verifies them against q (verify_drawn_drafts on the GPU),
   so the price includes that.
2. Speedup against acceptance: a benchmark-only drafter that knows each sequence's greedy
   continuation (from a plain run) and proposes each next token correctly with probability p
   (otherwise a wrong token), for several p; tokens per step and tokens/s against no speculation.
   Greedy verification keeps the output lossless, which the benchmark checks against the same
   engine's output with every draft rejected.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from minillm.args import STARTUP_ERRORS, CliParser
from minillm.bench.decode import weight_bytes
from minillm.bench.report import (
    add_sampling_flags,
    check_output_path,
    check_sampling_flags,
    context_error,
    derived_flags_note,
    need,
    save_json,
)
from minillm.engine.engine import LLMEngine
from minillm.sampling_params import SamplingParams


class OracleProposer:
    """Benchmark-only: drafts the known continuation, each token right with probability p."""

    needs_kv = False
    lookahead = 0

    def __init__(self, reference: dict[str, list[int]], p: float, vocab: int, seed: int = 0):
        self.reference = reference
        self.p = p
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)

    def propose(self, seqs, ks) -> None:
        for seq, k in zip(seqs, ks):
            ref = self.reference[seq.request_id]
            n = len(seq.output_ids)
            draft = []
            for j in range(k):
                right = ref[n + j] if n + j < len(ref) else 0
                draft.append(right if self.rng.random() < self.p else (right + 1) % self.vocab)
            seq.draft_ids = draft


def run_steps(engine: LLMEngine, prompts: list[list[int]], out_len: int,
              sampling: dict | None = None) -> tuple[list, dict]:
    """Run the prompts to completion, greedily or (sampling: SamplingParams' temperature, top_p,
    top_k) sampling with request i's seed i; each step's (seconds, whether a prompt was still in its
    prefill, the new tokens of each output), and the outputs."""
    how = sampling or {"temperature": 0}
    ids = [engine.add_request(p, SamplingParams(max_tokens=out_len, ignore_eos=True, seed=i if sampling else None,
                                                **how), request_id=f"r{i}")
           for i, p in enumerate(prompts)]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    steps = []
    while engine.has_unfinished():
        sched = engine.scheduler
        prefill = bool(sched.waiting) or any(s.num_computed < s.num_prompt_tokens for s in sched.running)
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        for o in outs:
            outputs[o.request_id] = o.token_ids
        steps.append((dt, prefill, [len(o.new_token_ids) for o in outs]))
    return steps, outputs


def decode_steps(engine: LLMEngine, prompts: list[list[int]], out_len: int,
                 sampling: dict | None = None) -> tuple[float, float, dict]:
    """Run the prompts to completion; (median decode step seconds, tokens per step, outputs)."""
    steps, outputs = run_steps(engine, prompts, out_len, sampling)
    decode = [(dt, sum(new) / len(new)) for dt, prefill, new in steps if not prefill and new]
    decode = decode[2:] or decode
    return float(np.median([s for s, _ in decode])), float(np.mean([n for _, n in decode])), outputs


def decode_rate(engine: LLMEngine, prompts: list[list[int]], out_len: int) -> tuple[float, dict]:
    """Run the prompts to completion; (output tokens a second once every sequence has its first token,
    outputs). A whole run's rate, not a median step: with backoff the steps are mostly plain and a few
    rounds. The clock starts after the prefill is collected: an asynchronous engine returns a step's
    tokens one call late, so a per-call split would charge the prefill to the first decode step."""
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    ids = [engine.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
    outputs: dict[str, list[int]] = {i: [] for i in ids}
    t0, tokens = None, 0
    while engine.has_unfinished():
        for o in engine.step():
            outputs[o.request_id] = o.token_ids
            if t0 is not None:
                tokens += len(o.new_token_ids)
        if t0 is None and all(outputs.values()):
            t0 = time.perf_counter()
    seconds = time.perf_counter() - t0 if t0 is not None else 0.0
    return tokens / seconds if seconds > 0 else 0.0, outputs


def backoff_runs(common: dict, spec_config: dict, prompts: list[list[int]], cs: list[int], out_len: int,
                 repeats: int) -> list[dict]:
    """Whole runs of out_len tokens a sequence, plain and with a backing-off drafter, alternated
    `repeats` times at each concurrency; the median rates. Both engines schedule asynchronously, as
    LLM and the server run them, so the plain steps between rounds run ahead of the host too; the
    drafter's engine also runs synchronously in each repeat (`backoff_sync_tok_s`): what running
    those steps ahead buys."""
    served = {**common, "async_scheduling": True}
    plain, spec = LLMEngine(**served), LLMEngine(**served, speculative_config=spec_config)
    runs = []
    for c in cs:
        rates: dict[str, list[float]] = {"plain": [], "backoff": [], "backoff_sync": []}
        same, rounds, backoff_steps = True, 0, 0
        for _ in range(repeats):
            rate, reference = decode_rate(plain, prompts[:c], out_len)
            rates["plain"].append(rate)
            for mode, ahead in (("backoff", True), ("backoff_sync", False)):
                spec.async_scheduling = ahead
                before = spec.stats().spec
                rate, outs = decode_rate(spec, prompts[:c], out_len)
                rates[mode].append(rate)
                after = spec.stats().spec
                same = same and outs == reference
            rounds, backoff_steps = after["rounds"] - before["rounds"], after["backoff_steps"] - before["backoff_steps"]
        med = {mode: float(np.median(r)) for mode, r in rates.items()}
        base, rate, sync = med["plain"], med["backoff"], med["backoff_sync"]
        runs.append({"concurrency": c, "backoff_after": spec_config["backoff_after"], "output_len": out_len,
                     "repeats": repeats, "plain_tok_s": base, "backoff_tok_s": rate, "cost": base / rate - 1,
                     "backoff_sync_tok_s": sync, "sync_cost": base / sync - 1,
                     **{f"{mode}_runs_tok_s": r for mode, r in rates.items()},
                     "rounds": rounds, "backoff_steps": backoff_steps, "same_as_plain_decode": same})
        print(f"c={c:>2}: with backoff_after {spec_config['backoff_after']}, {out_len} tokens a sequence, median of "
              f"{repeats}: {rate:.1f} tok/s against plain {base:.1f} ({100 * (base / rate - 1):+.1f}% time; "
              f"synchronous {sync:.1f}, {100 * (base / sync - 1):+.1f}%; {rounds} rounds, {backoff_steps} plain steps "
              f"of backing-off sequences a run), same tokens as plain decode {same}", flush=True)
    return runs


def logprob_paths(engine: LLMEngine, prompts: list[list[int]], out_len: int,
                  top: int = 2) -> dict[str, tuple[list[int], list]]:
    """Run the prompts greedily with `top` logprobs a token; {request id: (tokens, TokenLogprobs)}."""
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True, logprobs=top)
    ids = [engine.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
    paths: dict[str, tuple[list[int], list]] = {i: ([], []) for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            paths[o.request_id][0].extend(o.new_token_ids)
            paths[o.request_id][1].extend(o.new_logprobs or [])
    return paths


EXPLAIN_TOP = 20  # logprobs a token in --explain's reruns: the most SamplingParams allows


def logprob_gap(lps: list, i: int, a: int, b: int) -> float | None:
    """Token a's logprob minus token b's at output position i (None: either is not in that row's list)."""
    if i >= len(lps):
        return None
    scores = dict(lps[i].top)
    scores[lps[i].token_id] = lps[i].logprob
    return scores[a] - scores[b] if a in scores and b in scores else None


def top_of(lps: list, i: int, n: int = 3) -> list[list]:
    """The n best [token, logprob] pairs at output position i, best first ([] past the end)."""
    if i >= len(lps):
        return []
    return [[int(t), float(v)] for t, v in list(lps[i].top)[:n]]


def explain_divergence(engine: LLMEngine, prompts: list[list[int]], own: dict, outs: dict, p_ok: float,
                       vocab: int, out_len: int) -> list[dict]:
    """Where an oracle run's greedy output left the all-rejected run's: both runs again with their
    top-20 logprobs, and at each sequence's first differing position the two tokens' logprobs in
    each run and each run's three best tokens there. Both paths share every earlier token, so the
    position's logits come from the same prefix; a gap of a few hundredths that changes sign
    between the runs is a bf16 near-tie that the two runs' differently shaped verification steps
    round apart, not a lost or wrong token."""
    engine.proposer = OracleProposer(own, 0.0, vocab)
    base = logprob_paths(engine, prompts, out_len, EXPLAIN_TOP)
    engine.proposer = OracleProposer(own, p_ok, vocab)
    spec = logprob_paths(engine, prompts, out_len, EXPLAIN_TOP)
    found = []
    for rid in sorted(own, key=lambda r: int(r[1:])):
        if rid not in outs or outs[rid] == own[rid]:
            continue
        i = next(j for j, (a, b) in enumerate(zip(own[rid], outs[rid])) if a != b)
        a, b = own[rid][i], outs[rid][i]
        found.append({"request": rid, "position": i, "all_rejected_token": a, "oracle_token": b,
                      "gap_all_rejected_run": logprob_gap(base[rid][1], i, a, b),
                      "gap_oracle_run": logprob_gap(spec[rid][1], i, a, b),
                      "top_all_rejected_run": top_of(base[rid][1], i), "top_oracle_run": top_of(spec[rid][1], i),
                      "reproduced": base[rid][0] == own[rid] and spec[rid][0] == outs[rid]})
    return found


def round_bytes_floor(engine: LLMEngine) -> dict:
    """The weight bytes a rejected DFlash round reads against a plain decode step's: the
    verification reads the target's weights once, as a plain step does; the drafting step reads the
    drafter's layers and its LM head (a slice of the target's with draft_vocab_size); the context
    update reads fc, the hidden norm and every drafter layer's k/v rows. Their ratio is what the
    round would cost at bandwidth with KV reads and compute free: the floor under the measured
    price (decode.weight_bytes counts a step's weights the same way)."""
    p = engine.proposer
    target = weight_bytes(engine.model)
    drafter = weight_bytes(p.model) + sum(a.nbytes for a in p.context_weights() + p.drafting_weights())
    return {"target_weight_bytes": target, "drafter_weight_bytes": int(drafter),
            "bytes_floor": (target + drafter) / target}


def phase_times(engine: LLMEngine, prompts: list[list[int]], out_len: int,
                sampling: dict | None = None) -> dict[str, float]:
    """Median ms per step of each phase of a speculative step: the target's step (forward,
    sampling and verification, and the DFlash context update, which runs inside it: in its CUDA
    graph when replayed), and the drafter's proposal (its own graph when replayed). The backend is
    synchronised around every phase, so the phases run apart here (a separate pass). The context
    update alone is timed by context_update_ms, run the way the engine runs it."""
    backend = engine.backend
    times: dict[str, list[float]] = {"target_step": [], "propose": []}
    started: list[float] = []

    def begin(fn):  # the target step runs from runner.launch to runner.collect (synchronous here)
        def timed(*a, **kw):
            backend.synchronize()
            started.append(time.perf_counter())
            return fn(*a, **kw)
        return timed

    def finish(fn, key, own_start: bool):
        def timed(*a, **kw):
            if own_start:
                backend.synchronize()
                started.append(time.perf_counter())
            out = fn(*a, **kw)
            backend.synchronize()
            times[key].append(time.perf_counter() - started.pop())
            return out
        return timed

    wrapped = [(engine.runner, "launch", begin(engine.runner.launch)),
               (engine.runner, "collect", finish(engine.runner.collect, "target_step", False)),
               (engine.proposer, "propose", finish(engine.proposer.propose, "propose", True))]
    for obj, name, timed in wrapped:
        setattr(obj, name, timed)
    early, engine.early_drafts = engine.early_drafts, False  # the drafter apart from the target step
    try:
        decode_steps(engine, prompts, out_len, sampling)
    finally:
        engine.early_drafts = early
        for obj, name, _ in wrapped:
            delattr(obj, name)  # back to the class's method
    out = {k: 1e3 * float(np.median(v[2:] or v)) for k, v in times.items() if v}
    if engine.runner.after_forward is not None:
        out["context_update_in_target_step"] = context_update_ms(
            engine, len(prompts) * (1 + engine.num_speculative_tokens))
    return out


def context_update_ms(engine: LLMEngine, num_tokens: int, reps: int = 50) -> float:
    """ms of the DFlash context update (engine.runner.after_forward) for a step of num_tokens rows,
    run as in the engine: replayed as a CUDA graph (here a graph of its own, in the engine part of
    the target's) when the engine uses graphs, else eagerly. Every row is padding (slot -1, so
    nothing is stored); the matmuls, norms and RoPE do their full work."""
    runner, backend = engine.runner, engine.backend
    runner._pad(0, 0, 0, 0, num_tokens, 0)
    runner.buf.upload(1, num_tokens, 0)
    x = runner._inputs(1, num_tokens, 0, 1)

    def update():
        runner.after_forward(x, num_tokens)

    update()
    run = update
    if runner.graphs and hasattr(backend, "capture_graph"):
        run = backend.capture_graph(update).replay
    backend.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        run()
    backend.synchronize()
    return 1e3 * (time.perf_counter() - t) / reps


def fmt_gap(gap: float | None) -> str:
    return f"not in the top {EXPLAIN_TOP}" if gap is None else f"{gap:+.4f}"


def fmt_top(top: list[list]) -> str:
    return ", ".join(f"{t} {v:.4f}" for t, v in top) or "none"


def number_list(text: str, flag: str, kind=int) -> list:
    """A comma-separated flag's values; ValueError naming the flag when one is not a `kind`."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        noun = "integers" if kind is int else "numbers"
        raise ValueError(f"{flag} must be comma-separated {noun}, got {text!r}") from None
    need(bool(values), f"{flag} is empty")
    return values


SPARE_POSITIONS = 32  # the engines' max_model_len past the prompt and the longest output


def longest_output(ns: argparse.Namespace) -> int:
    """The most tokens a sequence generates, for every run's context. --backoff-output-len counts even
    without --backoff-after: the context sizes the block tables, which set the decode attention's plans,
    so the recorded rounds (BENCHMARKS.md) were all measured with it; a long --input-len lowers it."""
    return max(ns.output_len, ns.backoff_output_len)


def check_args(ns: argparse.Namespace) -> tuple[list[int], list[float]]:
    """Refuse flags the run cannot use before building an engine; (concurrencies, accept probabilities)."""
    need(ns.k >= 1, f"--k must be >= 1, got {ns.k}")
    check_sampling_flags(ns)
    need(ns.input_len >= 1, f"--input-len must be >= 1, got {ns.input_len}")
    # decode_steps times the steps after a sequence's prefill: its first token comes from the prefill
    need(ns.output_len >= 2, f"--output-len must be >= 2, got {ns.output_len}")
    cs = number_list(ns.concurrency, "--concurrency")
    need(min(cs) >= 1, f"--concurrency values must be >= 1, got {ns.concurrency!r}")
    accept = number_list(ns.accept, "--accept", float)
    need(all(0 <= a <= 1 for a in accept), f"--accept values must be probabilities in [0, 1], got {ns.accept!r}")
    need(ns.draft_vocab_size is None or ns.draft_vocab_size >= 1,
         f"--draft-vocab-size must be >= 1, got {ns.draft_vocab_size}")
    need(ns.backoff_after is None or ns.backoff_after >= 1, f"--backoff-after must be >= 1, got {ns.backoff_after}")
    need(ns.backoff_after is None or ns.drafter is not None, "--backoff-after needs --drafter")
    # 0 would otherwise mean the default budget, and a budget below a verification step of every
    # sequence is refused by the speculative engines only, built after the plain runs
    need(ns.max_num_batched_tokens is None or ns.max_num_batched_tokens >= max(cs) * (1 + ns.k),
         f"--max-num-batched-tokens must be >= the largest --concurrency x (1 + --k) = {max(cs) * (1 + ns.k)} "
         f"(a verification step of every sequence), got {ns.max_num_batched_tokens}")
    # the drafter's engine is built after the plain runs: a mistyped path would cost them first
    need(ns.drafter is None or (ns.drafter != "" and (Path(ns.drafter).expanduser() / "config.json").is_file()),
         f"--drafter {ns.drafter!r}: not a drafter directory (no config.json there); give a DFlash drafter's "
         "HF directory (python -m minillm.tools.random_model --dflash-for TARGET DIR writes a random one)")
    if ns.drafter is not None:  # its block bounds --k; read (and its config.json checked) before the plain runs
        from minillm.spec.dflash import dflash_block_size

        try:
            block = dflash_block_size(Path(ns.drafter).expanduser())
        except (OSError, ValueError) as e:
            raise ValueError(f"--drafter {ns.drafter}: {e}") from None
        need(ns.k <= block - 1, f"--k {ns.k} is past the drafter's block: at most its block_size - 1 = {block - 1}")
    need(ns.backoff_output_len >= 2, f"--backoff-output-len must be >= 2, got {ns.backoff_output_len}")
    need(ns.backoff_repeats >= 1, f"--backoff-repeats must be >= 1, got {ns.backoff_repeats}")
    # the oracle's engine, built after the plain runs, refused it there with a traceback
    context = ns.input_len + longest_output(ns) + SPARE_POSITIONS
    need(ns.k < context, f"--k {ns.k} must be below the runs' context of {context} positions (--input-len + "
                         f"the longest output + {SPARE_POSITIONS}); give a smaller --k")
    check_output_path(ns.result_json, "--result-json")
    return cs, accept


def main(argv: list[str] | None = None) -> int:
    p = CliParser(prog="python -m minillm.bench spec-cost", description=__doc__)
    p.add_argument("model")
    p.add_argument("--drafter", default=None, help="DFlash or DFlash2 drafter directory (the cost half)")
    p.add_argument("--k", type=int, default=8)
    add_sampling_flags(p, 0.0, "the cost half's requests' (seeded; at a temperature > 0 the drafter's drafts are "
                       "draws from its q, verified against q)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--accept", default="0,0.5,0.7,0.8,0.9,1.0", help="oracle drafter's per-token accuracy")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="step token budget (default: every prompt prefills in one step, so no "
                        "sequence verifies in a step that prefills another)")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="the DFlash drafter drafts from the first N token ids only (draft_vocab_size)")
    p.add_argument("--explain", action="store_true",
                   help="where an oracle point's output departs from the all-rejected run's, rerun both "
                        "with logprobs and print the two tokens' logprob gap there (a bf16 near-tie or not)")
    p.add_argument("--backoff-after", type=int, default=None,
                   help="also the drafter with backoff_after N (plain steps between probe rounds while nothing is "
                        "accepted): its whole-run decode rate against plain decoding's, the steady-state cost")
    p.add_argument("--backoff-output-len", type=int, default=512,
                   help="output tokens a sequence of the --backoff-after runs (default 512)")
    p.add_argument("--backoff-repeats", type=int, default=3,
                   help="plain and backoff runs alternated this many times a concurrency; medians (default 3)")
    p.add_argument("--result-json", default=None)
    ns = p.parse_args(argv)
    try:
        cs, accept = check_args(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    budget = ns.max_num_batched_tokens
    if budget is None:
        budget = max(2048, max(cs) * (ns.input_len + ns.k + 1))
    common = dict(model=ns.model, device=ns.device, max_num_seqs=max(cs), seed=0,
                  max_model_len=ns.input_len + longest_output(ns) + SPARE_POSITIONS,
                  enable_prefix_caching=False,
                  enforce_eager=ns.enforce_eager, dtype=ns.dtype, max_num_batched_tokens=budget)
    sets = {"--max-num-seqs": f"the largest --concurrency ({max(cs)})",
            "--max-model-len": f"--input-len + the longest output + {SPARE_POSITIONS} ({common['max_model_len']})",
            "--num-blocks": "not a spec-cost flag (the pool holds the largest --concurrency's sequences)"}
    rng = np.random.default_rng(0)
    try:  # the target (and its flags: device, dtype, budget) fails here if it fails at all
        plain = LLMEngine(**common)
    except STARTUP_ERRORS as e:  # the context is derived from the length flags: name those, not --max-model-len
        lengths = f"--input-len {ns.input_len} + " + (
            f"--output-len {ns.output_len}" if longest_output(ns) == ns.output_len
            else f"--backoff-output-len {ns.backoff_output_len}")
        message = derived_flags_note(context_error(e, lengths, common['max_model_len'], SPARE_POSITIONS), sets)
        print(f"error: {message}", file=sys.stderr)
        return 2
    if ns.draft_vocab_size is not None and ns.draft_vocab_size > plain.config.vocab_size:  # before the plain runs
        print(f"error: --draft-vocab-size {ns.draft_vocab_size} is past the target's vocabulary "
              f"({plain.config.vocab_size} ids); give at most that", file=sys.stderr)
        return 2
    vocab = min(plain.config.vocab_size, plain.tokenizer.vocab_size)
    prompts = [rng.integers(0, vocab, ns.input_len).tolist() for _ in range(max(cs))]
    result: dict = {"model": ns.model, "k": ns.k, "input_len": ns.input_len, "output_len": ns.output_len,
                    "draft_vocab_size": ns.draft_vocab_size, "temperature": ns.temperature, "top_p": ns.top_p,
                    "top_k": ns.top_k, "cost": [], "speedup": []}
    sampling = {"temperature": ns.temperature, "top_p": ns.top_p, "top_k": ns.top_k} if ns.temperature > 0 else None
    base_steps, reference = {}, {}
    for c in cs:
        step, _, outs = decode_steps(plain, prompts[:c], ns.output_len)
        base_steps[c] = step
        reference.update({f"r{i}": outs[f"r{i}"] for i in range(c)})
    cost_base = base_steps  # the cost half's plain steps: sampled ones at --temperature
    if sampling and ns.drafter:
        cost_base = {c: decode_steps(plain, prompts[:c], ns.output_len, sampling)[0] for c in cs}
    del plain
    cost_cs = cs if ns.drafter else []  # without a drafter: the speedup half only
    dflash = {"method": "dflash", "model": ns.drafter, "num_speculative_tokens": ns.k}
    if ns.draft_vocab_size is not None:
        dflash["draft_vocab_size"] = ns.draft_vocab_size
    try:
        spec = None if not ns.drafter else LLMEngine(**common, speculative_config=dflash)
    except STARTUP_ERRORS as e:  # a bad --drafter or --draft-vocab-size, or the drafter's pool too large
        print(f"error: {derived_flags_note(str(e), sets)}", file=sys.stderr)
        return 2
    if spec is not None:
        result.update(round_bytes_floor(spec))
        print(f"weights a rejected round reads: target {result['target_weight_bytes'] / 1e9:.3f} GB + drafter "
              f"{result['drafter_weight_bytes'] / 1e9:.3f} GB: a floor of {result['bytes_floor']:.2f}x a plain "
              "step's at bandwidth", flush=True)
    for c in cost_cs:
        step, per_step, outs = decode_steps(spec, prompts[:c], ns.output_len, sampling)
        # sampled: verification draws on streams of its own, so the tokens are another sample
        same = None if sampling else all(outs[f"r{i}"] == reference[f"r{i}"] for i in range(c))
        base = cost_base[c]
        result["cost"].append({"concurrency": c, "plain_step_ms": 1e3 * base, "spec_step_ms": 1e3 * step,
                               "ratio": step / base, "tokens_per_step": per_step,
                               "same_as_plain_decode": same})
        print(f"c={c:>2}: plain step {1e3 * base:.2f} ms, DFlash k={ns.k} step {1e3 * step:.2f} ms "
              f"({step / base:.2f}x), {per_step:.2f} tokens/step, same tokens as plain decode "
              f"{'n/a (sampled)' if same is None else same}", flush=True)
    for c in dict.fromkeys((cost_cs[0], cost_cs[-1])) if cost_cs else ():  # one concurrency: once
        phases = phase_times(spec, prompts[:c], ns.output_len, sampling)
        result.setdefault("phases_ms", []).append({"concurrency": c, **phases})
        print(f"c={c:>2}: phases (ms, synchronised): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()),
              flush=True)
    del spec  # one drafter engine at a time
    if ns.backoff_after is not None:
        result["backoff"] = backoff_runs(common, {**dflash, "backoff_after": ns.backoff_after}, prompts, cost_cs,
                                         ns.backoff_output_len, ns.backoff_repeats)
    oracle = LLMEngine(**common, speculative_config={"method": "ngram", "num_speculative_tokens": ns.k})
    for c in dict.fromkeys((cs[0], cs[-1])):  # one concurrency: once, not its curve twice
        # The continuation to propose comes from this engine's own verification-shaped steps (a
        # first run whose drafts are all wrong): in bf16 a 1-row decode step and a (1 + k)-row
        # verification step round differently, and on random weights, whose top logits are close,
        # that alone changes the greedy path (docs/BENCHMARKS.md, section 6).
        oracle.proposer = OracleProposer(reference, 0.0, vocab)
        _, _, own = decode_steps(oracle, prompts[:c], ns.output_len)
        same_as_plain = all(own[f"r{i}"] == reference[f"r{i}"] for i in range(c))
        for p_ok in accept:
            oracle.proposer = OracleProposer(own, p_ok, vocab)
            step, per_step, outs = decode_steps(oracle, prompts[:c], ns.output_len)
            same = all(outs[f"r{i}"] == own[f"r{i}"] for i in range(c))
            speedup = (per_step / step) / (1.0 / base_steps[c])
            result["speedup"].append({"accept_prob": p_ok, "concurrency": c, "tokens_per_step": per_step,
                                      "step_ms": 1e3 * step, "speedup": speedup, "lossless": same,
                                      "verify_path_equals_plain_decode": same_as_plain})
            print(f"p={p_ok:.1f} c={c:>2}: {per_step:.2f} tokens/step, step {1e3 * step:.2f} ms, "
                  f"speedup {speedup:.2f}x, lossless {same}", flush=True)
            if not same and ns.explain:
                found = explain_divergence(oracle, prompts[:c], own, outs, p_ok, vocab, ns.output_len)
                result["speedup"][-1]["divergences"] = found
                for d in found:
                    print(f"    {d['request']} departs at token {d['position']}: "
                          f"{d['all_rejected_token']} (all rejected) / {d['oracle_token']} (oracle); logprob of the "
                          f"first minus the second: {fmt_gap(d['gap_all_rejected_run'])} in the all-rejected run, "
                          f"{fmt_gap(d['gap_oracle_run'])} in the oracle's; reproduced {d['reproduced']}; best three "
                          f"(token, logprob): {fmt_top(d['top_all_rejected_run'])} / {fmt_top(d['top_oracle_run'])}",
                          flush=True)
    if ns.result_json and not save_json(ns.result_json, result):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
