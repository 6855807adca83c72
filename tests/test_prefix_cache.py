"""Prefix cache: block-level rules of BlockManager, then on a tiny model with the NumPy backend
that KV served from the cache is the KV a fresh engine computes, the hit rate is reported, and
greedy output does not depend on whether caching is on.
"""

from __future__ import annotations

import numpy as np
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.block_manager import BlockManager, chain_hash
from minillm.engine.sequence import Sequence

from hf_models import make_tiny

BS = 8


def seq(name: str, ids: list[int]) -> Sequence:
    return Sequence(name, ids, SamplingParams(), 0)


def compute(bm: BlockManager, s: Sequence) -> int:
    """Admit s like the scheduler does (prefix match, then blocks for the rest) and mark its
    prompt computed and committed; returns the tokens served from the cache."""
    hit = bm.match_prefix(s)
    bm.record_prefix_lookup(s.num_tokens, hit)
    bm.allocate(s, s.num_tokens)
    s.num_computed = s.num_tokens
    bm.commit_full_blocks(s)
    return hit


# ---- BlockManager rules -------------------------------------------------------------------

def test_shared_prefix_is_served_and_reference_counted():
    bm = BlockManager(16, BS)
    prefix = list(range(100, 124))  # 3 full blocks
    a = seq("a", prefix + [1, 2])
    assert compute(bm, a) == 0
    b = seq("b", prefix[:16] + [9] * 8 + [3])  # shares blocks 0 and 1, differs in block 2
    assert compute(bm, b) == 16
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref_count[x] for x in a.block_table[:3]] == [2, 2, 1]
    assert bm.hit_rate == pytest.approx(16 / (26 + 25))


def test_a_fully_cached_prompt_still_computes_its_last_token():
    bm = BlockManager(8, BS)
    a = seq("a", list(range(16)))
    compute(bm, a)
    b = seq("b", list(range(16)))  # both blocks cached, but the last token's logits are needed
    assert bm.match_prefix(b) == 8
    assert b.num_computed == 8 and len(b.block_table) == 1


def test_equal_block_after_a_different_prefix_is_not_a_hit():
    bm = BlockManager(8, BS)
    motif = [5] * BS
    compute(bm, seq("a", [1] * BS + motif + [0]))
    b = seq("b", [2] * BS + motif + [0])  # same second block, different first block
    assert bm.match_prefix(b) == 0


def test_freed_blocks_stay_cached_until_the_pool_needs_them_lru_tail_first():
    bm = BlockManager(4, BS)
    a = seq("a", list(range(3 * BS)) + [0])
    compute(bm, a)
    table = list(a.block_table)
    bm.free_sequence(a)
    assert bm.num_used == 0 and bm.num_cached == 3 and len(bm.free) == 1
    assert list(bm.evictable) == table[2::-1], "the tail is released first, so it is evicted first"
    assert list(bm.free) == [table[3]], "the partial last block is not cacheable"
    # one fresh block comes from the free list, the next evicts a's last block, not its first
    c = seq("c", [7] * (2 * BS))
    bm.allocate(c, 2 * BS)
    assert table[2] in c.block_table and table[0] not in c.block_table
    b = seq("b", list(range(3 * BS)) + [0])
    assert bm.match_prefix(b) == 2 * BS, "the surviving head of the prefix is still a hit"


def test_disabled_prefix_cache_registers_nothing():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    compute(bm, seq("a", list(range(20))))
    b = seq("b", list(range(20)))
    assert compute(bm, b) == 0 and not bm.hash_to_block and bm.hit_rate == 0.0


def test_commit_waits_for_tokens_to_be_appended():
    """During verification num_computed counts accepted drafts not yet appended to the
    sequence: their block must not be hashed from a partial token list (regression)."""
    bm = BlockManager(8, BS)
    a = seq("a", list(range(6)))
    compute(bm, a)
    a.output_ids.append(6)  # 7 tokens, 6 computed; drafts 7, 8 proposed and accepted
    bm.allocate(a, 9)
    a.num_computed = 9  # the engine sets this before appending the accepted tokens
    bm.commit_full_blocks(a)
    assert not bm.hash_to_block, "block 0 was cached before its last token existed"
    a.output_ids += [7, 8]
    bm.commit_full_blocks(a)
    assert bm.block_tokens[a.block_table[0]] == tuple(range(8))
    b = seq("b", list(range(10)))
    assert bm.match_prefix(b) == 8


def test_truncate_never_reaches_into_cached_blocks():
    bm = BlockManager(8, BS)
    a = seq("a", list(range(20)))
    compute(bm, a)
    with pytest.raises(AssertionError):
        bm.truncate(a, 12)  # block 1 (tokens 8..15) is registered
    bm.truncate(a, 17)
    assert len(a.block_table) == 3 and a.num_computed == 17


# ---- on a tiny model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_prefix")
    make_tiny("qwen3", path, seed=3)
    return str(path)


GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PREFIX = [(17 * i + 3) % 250 + 3 for i in range(4 * 16)]  # four blocks of 16


def cached_blocks(llm: LLM, ids: list[int]) -> list[int]:
    """Physical blocks that hold ids' full blocks in llm's prefix cache (must all be there)."""
    bm = llm.engine.block_manager
    out, parent = [], None
    for i in range(len(ids) // bm.block_size):
        tokens = tuple(ids[i * bm.block_size : (i + 1) * bm.block_size])
        parent = chain_hash(parent, tokens)
        assert parent in bm.hash_to_block, f"block {i} is not cached"
        out.append(bm.hash_to_block[parent])
    return out


def test_cached_prefix_kv_equals_recomputed_kv(tiny_dir):
    warm = LLM(tiny_dir, device="cpu", max_num_seqs=4, max_model_len=160, block_size=16)
    warm.generate([PREFIX + [5, 6, 7]], GREEDY)  # fills the cache with PREFIX's blocks
    prefix_blocks = cached_blocks(warm, PREFIX)
    before = [np.asarray(pool)[:, prefix_blocks].copy() for pool in warm.engine.kv]  # k_pool, v_pool
    out = warm.generate([PREFIX + [9, 10, 11, 12]], GREEDY)[0]
    hit_rate = warm.engine.stats().prefix_cache_hit_rate
    print(f"prefix cache hit rate after a shared-prefix request: {hit_rate:.3f}")
    assert hit_rate > 0

    fresh = LLM(tiny_dir, device="cpu", max_num_seqs=4, max_model_len=160, block_size=16)
    ref = fresh.generate([PREFIX + [9, 10, 11, 12]], GREEDY)[0]
    assert fresh.engine.stats().prefix_cache_hit_rate == 0
    assert out.token_ids == ref.token_ids

    # every full block of the second request in both pools: the four served from the cache are the
    # first request's blocks, bit for bit (served, not rewritten), and agree with what a cold engine
    # computes for them to float32 rounding, as does the one computed on top of the cache (bit equality
    # across engines is not asked: multithreaded BLAS may sum a product's terms in another order)
    ids = (PREFIX + [9, 10, 11, 12] + out.token_ids)[:-1]  # the last token is never computed
    ours, theirs = cached_blocks(warm, ids), cached_blocks(fresh, ids)
    assert len(ours) == 5 and ours[:4] == prefix_blocks
    for pool_w, pool_f, first in zip(warm.engine.kv, fresh.engine.kv, before):
        w, f = np.asarray(pool_w)[:, ours], np.asarray(pool_f)[:, theirs]  # [layers, blocks, bs, kvh, hd]
        assert np.abs(f).max() > 0
        np.testing.assert_array_equal(w[:, :4], first)
        np.testing.assert_allclose(w, f, rtol=1e-4, atol=1e-5)


def test_greedy_output_is_the_same_with_and_without_prefix_caching(tiny_dir):
    prompts = [PREFIX[:n] + [i + 3, 2 * i + 5] for i, n in enumerate((64, 48, 64, 17, 33, 64))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kw = dict(device="cpu", max_num_seqs=3, max_model_len=96, block_size=16, num_blocks=14)
    on = LLM(tiny_dir, enable_prefix_caching=True, **kw)
    off = LLM(tiny_dir, enable_prefix_caching=False, **kw)
    # a batch (some prompts wait and hit what the first ones computed), then one by one
    got_on = [o.token_ids for o in on.generate(prompts, params)]
    got_off = [o.token_ids for o in off.generate(prompts, params)]
    assert got_on == got_off
    seq_on = [on.generate([p], params)[0].token_ids for p in prompts]
    assert seq_on == got_off
    s_on, s_off = on.engine.stats(), off.engine.stats()
    print(f"hit rate with caching {s_on.prefix_cache_hit_rate:.3f}, without {s_off.prefix_cache_hit_rate:.3f}")
    assert s_on.prefix_cache_hit_rate > 0.3 and s_off.prefix_cache_hit_rate == 0
    assert s_on.blocks_used == 0 and s_off.blocks_used == 0 and s_off.blocks_cached == 0


def test_multi_turn_prompt_hits_blocks_completed_by_accepted_drafts(tiny_dir):
    """With speculative decoding, blocks are often completed by accepted drafts. The next turn of
    a chat (prompt + previous output) must hit every full block the first turn computed.

    Regression: the engine commits full blocks after verification but before appending the
    accepted tokens, so those blocks were hashed from partial token lists and no later lookup
    could hit them or any block after them (24 of 143 tokens hit instead of 136)."""
    llm = LLM(tiny_dir, device="cpu", max_num_seqs=2, max_model_len=256, block_size=8,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    prompt = [5, 6, 7, 8] * 6  # repetitive, so the n-gram drafter proposes and gets accepted
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))[0].token_ids
    assert llm.engine.stats().spec["accepted_tokens"] > 0
    bm = llm.engine.block_manager
    assert all(t is None or len(t) == bm.block_size for t in bm.block_tokens), "a block cached from a partial list"
    second = prompt + out[:-1]  # the first turn computed KV for all of these
    before = bm.prefix_hits
    llm.generate([second], SamplingParams(temperature=0, max_tokens=1))
    assert bm.prefix_hits - before == (len(second) - 1) // 8 * 8
