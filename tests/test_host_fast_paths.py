"""The host-side shortcuts of a step give what the general code gives: the runner's vectorised
decode fill matches its per-sequence loop byte for byte (also step after step, with the block-table
rows it keeps from earlier steps), RequestOutput.token_ids (copied lazily) and .text (joined when
read) are still the snapshots of their own step when read after later steps, and the text folded
into its head reads as it does whole."""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.backends.numpy_ops import NumpyBackend
from minillm.engine.block_manager import BlockManager
from minillm.engine.runner import ModelRunner, StepBuffers
from minillm.engine.scheduler import ScheduledSeq
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams

VOCAB = 997


def decode_runner(bs: int, specs, rnd, room: int = 0, spare_blocks: int = 0) -> tuple[ModelRunner, list[ScheduledSeq]]:
    """A runner with just a block manager and step buffers (all prepare() needs; room: rows and
    sequences beyond the batch; spare_blocks: free blocks beyond what the batch holds) and a batch
    of sequences that each decode their last token; specs: (prompt length, outputs so far) each."""
    max_len = max(p + o for p, o in specs)
    num_blocks = sum(-(-(p + o) // bs) for p, o in specs) + 3 + spare_blocks
    bm = BlockManager(num_blocks, bs)
    perm = list(range(num_blocks))
    rnd.shuffle(perm)
    bm.free = deque(perm)  # scattered physical blocks
    batch = []
    for i, (p, o) in enumerate(specs):
        params = SamplingParams(temperature=rnd.choice([0.0, 0.7]), top_p=rnd.choice([1.0, 0.9]),
                                top_k=rnd.choice([-1, 5]))
        seq = Sequence(f"s{i}", [rnd.randrange(VOCAB) for _ in range(p)], params, rnd.getrandbits(64))
        seq.output_ids = [rnd.randrange(VOCAB) for _ in range(o)]
        bm.allocate(seq, seq.num_tokens)
        seq.num_computed = seq.num_tokens - 1
        batch.append(ScheduledSeq(seq, 1))
    assert all(item.decode for item in batch)
    runner = ModelRunner.__new__(ModelRunner)  # prepare() needs only the block manager and buffers
    runner.bm = bm
    max_blocks = -(-max_len // bs)
    n = len(batch) + room
    runner.buf = StepBuffers(NumpyBackend(), n, n + 1, n, max_blocks)
    return runner, batch


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 16]), st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5)), min_size=2,
                                             max_size=12), st.randoms(use_true_random=False))
def test_decode_fill_matches_the_general_fill(bs, specs, rnd):
    """specs: (prompt length, outputs so far) per sequence; every one decodes its last token."""
    runner, batch = decode_runner(bs, specs, rnd)
    h = runner.buf.host
    stale = {k: np.asarray(rnd.randrange(1, 100)).astype(v.dtype) for k, v in h.items()}
    for k, a in h.items():  # what an earlier step left: both fills start from it
        a[...] = stale[k]
    assert runner._prepare_any(batch) == (len(batch), len(batch))
    want = {k: v.copy() for k, v in h.items()}
    for k, a in h.items():
        a[...] = stale[k]
    assert runner._prepare_decode(batch) == len(batch)
    for k in want:
        if k != "out_tokens":  # written by the sampler, not by prepare
            np.testing.assert_array_equal(h[k], want[k], err_msg=k)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 4, 16]), st.lists(st.tuples(st.integers(1, 30), st.integers(0, 5), st.sampled_from(
    ["verify", "block", "score"]), st.integers(0, 8)), min_size=2, max_size=10), st.booleans(),
    st.randoms(use_true_random=False))
def test_runs_fill_matches_the_general_fill(bs, specs, cached_rows, rnd):
    """A batch whose every row gives logits: speculative verification (1 + k rows, k drafts past
    the sequence's end), a DFlash drafter's block (from the last token, mask drafts) and scoring
    (every token's logits). The whole-array fill matches the per-sequence loop byte for byte,
    whether the block-table rows are fresh or kept from an earlier step (cached_rows)."""
    runner, batch = decode_runner(bs, [(p, o) for p, o, _, _ in specs], rnd, spare_blocks=10 * len(specs))
    items = []
    for item, (_, _, kind, k) in zip(batch, specs):
        seq = item.seq
        if kind == "verify":
            k = max(1, k)
            seq.draft_ids = [rnd.randrange(VOCAB) for _ in range(k)]
            runner.bm.allocate(seq, seq.num_tokens + k)  # the drafts' lookahead slots
            items.append(ScheduledSeq(seq, k + 1, k))
        elif kind == "block":
            block = k + 2
            seq.draft_ids = [VOCAB] * (block - 1)  # the mask token
            runner.bm.allocate(seq, seq.num_tokens + block - 1)
            items.append(ScheduledSeq(seq, block, num_draft=block - 1, start=seq.num_tokens - 1))
        else:
            items.append(ScheduledSeq(seq, seq.num_tokens, all_logits=True, start=0))
    assert all(it.num_logits == it.num_new for it in items)
    max_blocks = max(len(it.seq.block_table) for it in items)
    t = sum(it.num_new for it in items)
    runner.buf = StepBuffers(NumpyBackend(), t, len(items) + 1, t, max_blocks)
    h = runner.buf.host
    stale = {k: np.asarray(rnd.randrange(1, 100)).astype(v.dtype) for k, v in h.items()}
    for k, a in h.items():
        a[...] = stale[k]
    assert runner._prepare_any(items) == (t, t)
    want = {k: v.copy() for k, v in h.items()}
    for k, a in h.items():
        a[...] = stale[k]
    if cached_rows:  # the rows a decode fill left: kept where the versions still match
        runner._fill_block_tables([it.seq for it in items])
    assert runner._prepare_runs(items) == (t, t)
    for k in want:
        if k not in ("out_tokens", "out_accepted"):  # written by the sampler, not by prepare
            np.testing.assert_array_equal(h[k], want[k], err_msg=k)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([1, 16]), st.lists(st.tuples(st.integers(1, 30), st.integers(0, 5), st.sampled_from(
    ["fresh", "stale", "one-hot"]), st.integers(1, 8)), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_drawn_drafts_fill_their_q_rows_and_drop_stale_ones(bs, specs, rnd):
    """Verification runs whose drafts a drafter drew from q (seq.draft_q: its step, their first
    logits row): from its latest step, row j checks draft j against q row first + j; from an older
    one, whose rows that step overwrote, the run's rows carry no draft (they sample as plain rows);
    drawn deterministically (draft_q None), one-hot. Both fills agree."""
    runner, batch = decode_runner(bs, [(p, o) for p, o, _, _ in specs], rnd, spare_blocks=10 * len(specs))

    class Drafter:  # what ModelRunner.draft_q reads
        launches = 5
        logits = None

    runner.draft_q = Drafter()
    items, want_drafts, want_q = [], [], []
    for item, (_, _, kind, k) in zip(batch, specs):
        seq = item.seq
        seq.draft_ids = [rnd.randrange(VOCAB) for _ in range(k)]
        first = rnd.randrange(0, 64)
        seq.draft_q = {"fresh": (5, first), "stale": (4, first), "one-hot": None}[kind]
        runner.bm.allocate(seq, seq.num_tokens + k)
        items.append(ScheduledSeq(seq, k + 1, k))
        want_drafts += (seq.draft_ids if kind != "stale" else [-1] * k) + [-1]
        want_q += (list(range(first, first + k)) if kind == "fresh" else [-1] * k) + [-1]
    t = sum(it.num_new for it in items)
    runner.buf = StepBuffers(NumpyBackend(), t, len(items) + 1, t, max(len(it.seq.block_table) for it in items))
    h = runner.buf.host
    for fill in (runner._prepare_any, runner._prepare_runs):
        for a in h.values():
            a[...] = rnd.randrange(1, 100)
        assert fill(items) == (t, t)
        np.testing.assert_array_equal(h["draft_tokens"][:t], want_drafts, err_msg=fill.__name__)
        np.testing.assert_array_equal(h["draft_q_rows"][:t], want_q, err_msg=fill.__name__)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 4, 16]), st.lists(st.tuples(st.integers(1, 30), st.integers(0, 5), st.sampled_from(
    ["device", "host", "score"]), st.integers(1, 8)), min_size=1, max_size=10), st.randoms(use_true_random=False))
def test_drafts_on_device_fill_what_host_drafts_would(bs, specs, rnd):
    """Verification runs whose drafts are still in the drafter's sampled ids (seq.draft_row, as a
    deferred DFlash round leaves them, placeholders on the host) next to runs with host drafts and
    scoring: both fills point the device fills at the right rows, so after them input_ids and
    draft_tokens hold exactly what a fill from the real drafts on the host gives."""
    runner, batch = decode_runner(bs, [(p, o) for p, o, _, _ in specs], rnd, spare_blocks=10 * len(specs))
    items, on_device = [], []
    for item, (_, _, kind, k) in zip(batch, specs):
        seq = item.seq
        if kind == "score":
            items.append(ScheduledSeq(seq, seq.num_tokens, all_logits=True, start=0))
            continue
        seq.draft_ids = [rnd.randrange(VOCAB) for _ in range(k)]
        runner.bm.allocate(seq, seq.num_tokens + k)
        items.append(ScheduledSeq(seq, k + 1, k))
        if kind == "device":
            on_device.append(seq)
    t = sum(it.num_new for it in items)
    runner.buf = StepBuffers(NumpyBackend(), t, len(items) + 1, t, max(len(it.seq.block_table) for it in items))
    h = runner.buf.host
    runner._prepare_any(items)  # every draft on the host: the reference
    want = {k: h[k][:t].copy() for k in ("input_ids", "draft_tokens")}
    source = np.full(8 * len(specs) + 9, -7, np.int32)  # the drafter's ids; -7: rows nobody reads
    for i, seq in enumerate(on_device):
        seq.draft_row = 9 * i + 1
        source[seq.draft_row : seq.draft_row + len(seq.draft_ids)] = seq.draft_ids
        seq.draft_ids = [VOCAB] * len(seq.draft_ids)  # placeholders: the mask token
    runner.draft_source = source
    for fill in (runner._prepare_any, runner._prepare_runs):
        for a in h.values():
            a[...] = rnd.randrange(1, 100)
        assert fill(items) == (t, t)
        assert runner.fills_from_drafts == bool(on_device)
        if runner.fills_from_drafts:
            NumpyBackend().fill_input_ids(h["input_ids"][:t], source, h["src_rows"][:t])
            NumpyBackend().fill_input_ids(h["draft_tokens"][:t], source, h["draft_src"][:t])
        for k in want:
            np.testing.assert_array_equal(h[k][:t], want[k], err_msg=f"{fill.__name__}: {k}")


OPS = ["grow", "lookahead", "trim", "finish", "preempt", "shuffle", "join", "leave", "other_step", "pad"]
MAX_LEN = 48  # tokens a sequence may reach, lookahead blocks included


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1, 2, 16]), st.integers(2, 8), st.booleans(),
       st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2**16)), min_size=1, max_size=40),
       st.randoms(use_true_random=False))
def test_incremental_decode_fill_matches_a_fresh_fill_every_step(bs, width, prefix_caching, ops, rnd):
    """One runner decodes a changing batch for many steps, keeping block-table rows between steps;
    before each op's decode step its buffers must equal a from-scratch fill: new buffers holding
    junk, filled by the general per-sequence loop. Between steps, sequences gain blocks, lose
    them (speculative rejection), finish and leave their row to a new sequence (possibly sharing a
    cached prefix), are preempted and readmitted, the batch is reordered, grows and shrinks, and
    the same rows are overwritten by non-decode steps and graph padding."""
    max_blocks = -(-MAX_LEN // bs)
    max_seqs = 10
    bm = BlockManager(max_seqs * max_blocks + 8, bs, enable_prefix_caching=prefix_caching)
    perm = list(range(bm.num_blocks))
    rnd.shuffle(perm)
    bm.free = deque(perm)
    prompts = [[rnd.randrange(VOCAB) for _ in range(MAX_LEN)] for _ in range(2)]  # shared prefixes
    count = iter(range(10**6))

    def admit(seq):
        """(Re)admit seq as the scheduler does: prefix-cache hit first, then fresh blocks."""
        if not seq.block_table:
            bm.match_prefix(seq)
        bm.allocate(seq, seq.num_tokens)

    def new_seq():
        p = rnd.randrange(1, MAX_LEN // 2)
        params = SamplingParams(temperature=rnd.choice([0.0, 0.7]), top_k=rnd.choice([-1, 5]))
        seq = Sequence(f"s{next(count)}", rnd.choice(prompts)[:p], params, rnd.getrandbits(64))
        admit(seq)
        return seq

    def finish(seq):
        seq.num_computed = seq.num_tokens
        bm.commit_full_blocks(seq)  # its full blocks stay cached for a later prompt
        bm.free_sequence(seq)

    runner = ModelRunner.__new__(ModelRunner)
    runner.bm = bm
    runner.buf = StepBuffers(NumpyBackend(), max_seqs, max_seqs + 1, max_seqs, max_blocks)
    seqs = [new_seq() for _ in range(width)]
    for op, arg in ops:
        i = arg % len(seqs)
        seq = seqs[i]
        if op == "grow" and seq.num_tokens + arg % 20 < MAX_LEN:  # decoded tokens, new blocks
            seq.output_ids += [rnd.randrange(VOCAB) for _ in range(1 + arg % 20)]
            bm.allocate(seq, seq.num_tokens)
        elif op == "lookahead":  # blocks for drafts, beyond the sequence's tokens
            bm.allocate(seq, min(MAX_LEN, seq.num_tokens + arg % 9))
        elif op == "trim":  # drafts rejected: tokens and the blocks past them go
            drop = arg % (len(seq.output_ids) + 1)
            keep = max(seq.num_tokens - drop, seq.num_hashed_blocks * bs, 1)
            del seq.output_ids[max(0, keep - seq.num_prompt_tokens):]
            bm.truncate(seq, seq.num_tokens)
        elif op == "finish":  # a new sequence takes the row
            finish(seq)
            seqs[i] = new_seq()
        elif op == "preempt":  # same sequence, same row, other blocks
            bm.free_sequence(seq)
            admit(seq)
        elif op == "shuffle":
            rnd.shuffle(seqs)
        elif op == "join" and len(seqs) < max_seqs:
            seqs.insert(i, new_seq())
        elif op == "leave" and len(seqs) > 2:
            finish(seqs.pop(i))
        elif op == "other_step":  # a prefill chunk of some sequences writes their rows its own way
            sub = [ScheduledSeq(s, 1, start=0) for s in rnd.sample(seqs, 1 + arg % len(seqs))]
            runner._prepare_any(sub)
        elif op == "pad":  # a graph replay pads the rows past a smaller batch
            runner._pad(arg % len(seqs), 0, 0, max_seqs, 0, 0)
        for s in seqs:
            s.num_computed = s.num_tokens - 1  # every sequence decodes its last token
        batch = [ScheduledSeq(s, 1) for s in seqs]
        B = len(batch)
        assert runner._prepare_decode(batch) == B

        fresh = ModelRunner.__new__(ModelRunner)
        fresh.bm = bm
        fresh.buf = StepBuffers(NumpyBackend(), max_seqs, max_seqs + 1, max_seqs, max_blocks)
        for a in fresh.buf.host.values():
            a[...] = np.asarray(rnd.randrange(1, 100)).astype(a.dtype)  # junk the fill must cover
        assert fresh._prepare_any(batch) == (B, B)
        want, got = fresh.buf.host, runner.buf.host
        for k in want:
            # out_*: written by the sampler; attn_order: by prepare() after either fill; adv_*:
            # only by a drafting step launched behind a verification (runner.BlockAdvance)
            if k not in ("out_tokens", "out_accepted", "attn_order") and not k.startswith("adv_"):
                n = B + 1 if k == "query_start" else B
                np.testing.assert_array_equal(got[k][:n], want[k][:n], err_msg=f"{op}: {k}")
        for b, s in enumerate(seqs):  # each row: the sequence's blocks, then zeros
            row = [*s.block_table, *[0] * (max_blocks - len(s.block_table))]
            assert got["block_tables"][b].tolist() == row, (op, b)


def test_request_output_token_ids_are_a_snapshot_of_their_step(tmp_path):
    from minillm.engine.engine import LLMEngine
    from minillm.tools.random_model import write_random_model

    model = write_random_model(tmp_path / "tiny", "tiny", seed=0)
    engine = LLMEngine(model=str(model), device="cpu", max_num_seqs=2, max_model_len=64)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True), request_id="a")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [len(o.token_ids) for o in outs] == [1, 2, 3, 4, 5, 6]  # read only now, after the last step
    assert outs[-1].finished and outs[-1].token_ids == [t for o in outs for t in o.new_token_ids]
    first = outs[0].token_ids
    first.append(-1)  # a caller's copy: the engine's sequence and later reads are unaffected
    assert outs[0].token_ids is first and outs[1].token_ids == outs[-1].token_ids[:2]
    # text too: each output's text is its step's, read after the last step
    assert [o.text for o in outs] == ["".join(x.new_text for x in outs[: k + 1]) for k in range(6)]


def test_text_folded_into_its_head_reads_the_same(tmp_path, monkeypatch):
    """A sequence's text moves into its head every TEXT_FOLD characters (engine._render: appending to
    one long str is quadratic). With a fold every few characters, every output (its delta, its text
    read after the last step, its ids and finish) is what it is unfolded, with stop strings that
    straddle the folds, kept in the output or not."""
    from minillm.engine import engine as engine_mod
    from minillm.engine.engine import LLMEngine
    from minillm.tools.random_model import write_random_model

    model = write_random_model(tmp_path / "tiny", "tiny", seed=0)
    engine = LLMEngine(model=str(model), device="cpu", max_num_seqs=4, max_model_len=256)

    def run(fold: int, **params) -> list[tuple]:
        monkeypatch.setattr(engine_mod, "TEXT_FOLD", fold)
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=150, ignore_eos=True, temperature=0, **params),
                           request_id="a")
        outs = []
        while engine.has_unfinished():
            outs += engine.step()
        return [(o.new_text, o.text, o.token_ids, o.finish_reason) for o in outs]

    whole = run(10**9)
    text = whole[-1][1]
    assert len(text) > 100 and "".join(o[0] for o in whole) == text
    for params in ({}, {"stop": [text[90:93]]}, {"stop": [text[60:75], "never there"]},
                   {"stop": [text[95:99]], "include_stop_str_in_output": True}):
        want = run(10**9, **params)
        assert run(8, **params) == want and run(3, **params) == want, params
        if params:
            assert want[-1][3] == "stop" and len(want[-1][1]) < len(text)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5)), min_size=1, max_size=12),
       st.integers(0, 3), st.randoms(use_true_random=False))
def test_decode_attention_order_is_longest_first_and_a_permutation(specs, extra, rnd):
    """prepare() gives a decode step's attention its rows longest context first (ties in batch
    order); graph padding appends the padding rows, so the order stays a permutation of every row
    the kernel launches for; a step with longer query runs leaves it alone."""
    runner, batch = decode_runner(4, specs, rnd, room=3)
    B = len(batch)
    assert runner.prepare(batch) == (B, B)
    h = runner.buf.host
    order = h["attn_order"][:B].tolist()
    lens = h["seq_lens"][:B].tolist()
    assert sorted(order) == list(range(B))
    assert order == sorted(range(B), key=lambda b: (-lens[b], b))
    T = B + extra  # a graph bucket of T sequences, one row each
    runner._pad(B, B, B, T, T, T)
    assert sorted(h["attn_order"][:T].tolist()) == list(range(T))
    assert h["attn_order"][:B].tolist() == order
    seq = batch[0].seq  # the first sequence recomputing its last two tokens: not a decode step
    seq.num_computed -= 1
    runner.prepare([ScheduledSeq(seq, 2)])
    assert runner.max_query_len == 2 and runner.num_decode_rows is None
    assert h["attn_order"][:B].tolist() == order


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(4, 40), st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=10),
       st.randoms(use_true_random=False))
def test_decode_rows_are_the_short_sequences_rows_longest_first(specs, rnd):
    """In a step whose longest query run exceeds decode_max_q, prepare() lists exactly the rows of
    the sequences with at most decode_max_q new tokens (what the decode kernel takes), sequence
    by sequence, longest context first, each sequence's rows in order; none when they overflow
    the buffer."""
    runner, batch = decode_runner(4, [(p, o) for p, o, _ in specs], rnd)
    runner.decode_max_q = 2
    max_len = max(p + o for p, o, _ in specs)  # room for every row; attn_order: a row a sequence
    runner.buf = StepBuffers(NumpyBackend(), 4 * len(specs), len(specs) + 1, 4 * len(specs), -(-max_len // 4))
    items = []
    for item, (_, _, n) in zip(batch, specs):
        n = min(n, item.seq.num_tokens)
        item.seq.num_computed = item.seq.num_tokens - n
        items.append(ScheduledSeq(item.seq, n))
    t, _ = runner.prepare(items)
    h = runner.buf.host
    qs = h["query_start"][: len(items) + 1]
    lens = h["seq_lens"][: len(items)]
    short = [b for b, it in enumerate(items) if it.num_new <= 2]
    expect = [r for b in sorted(short, key=lambda b: (-lens[b], b)) for r in range(qs[b], qs[b + 1])]
    if runner.max_query_len <= 2:
        assert runner.num_decode_rows is None  # the decode kernel takes the whole step
    elif len(expect) > h["attn_order"].shape[0]:
        assert runner.num_decode_rows is None
    else:
        assert runner.num_decode_rows == len(expect)
        assert h["attn_order"][: len(expect)].tolist() == expect
