"""The host-side shortcuts of a step give what the general code gives: the runner's vectorised
decode fill matches its per-sequence loop byte for byte, and RequestOutput.token_ids (copied
lazily) is still the snapshot of its own step when read after later steps."""

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


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 16]), st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5)), min_size=2,
                                             max_size=12), st.randoms(use_true_random=False))
def test_decode_fill_matches_the_general_fill(bs, specs, rnd):
    """specs: (prompt length, outputs so far) per sequence; every one decodes its last token."""
    max_len = max(p + o for p, o in specs)
    num_blocks = sum(-(-(p + o) // bs) for p, o in specs) + 3
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
    runner.buf = StepBuffers(NumpyBackend(), len(batch), len(batch) + 1, len(batch), max_blocks)

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
