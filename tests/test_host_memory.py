"""The CPU (NumPy) backend checks its startup buffers against the RAM left before allocating any:
a default KV pool that does not fit shrinks to what does; a configuration that cannot fit is refused
with the bytes needed and available and the flags that size each part, not numpy's bare "Unable to
allocate 977 GiB" (or a pool granted lazily and the process killed once it fills). KV pools past
int32 slot indices are refused on every backend."""

from __future__ import annotations

import re

import pytest

from minillm import LLM, SamplingParams
from minillm.args import EngineArgs
from minillm.engine.engine import MAX_SLOTS
from minillm.engine.host_memory import check_host_memory, host_memory_available, host_startup_bytes
from minillm.generate import main


def test_a_pool_larger_than_ram_is_refused_naming_the_flags(tiny):
    """An explicit --num-blocks of ~1 TB of KV cache (100e6 blocks of 16 tokens x 512 bytes): refused
    with the bytes needed and available, the flag, and what would fit."""
    avail = host_memory_available()
    assert avail is not None and avail[0] > 0
    with pytest.raises(ValueError) as e:
        LLM(str(tiny), device="cpu", num_blocks=10**8)
    msg = str(e.value)
    assert msg.startswith("the CPU backend's startup buffers need ") and "of RAM but only " in msg
    need, free = (int(x) for x in re.findall(r"\((\d+) bytes\)", msg)[:2])
    assert need > 8 * 10**11 > free > 0
    assert "KV cache 762.94 GiB (819200000000 bytes) (100000000 blocks x 16 tokens x 512 bytes, set by " \
           "--num-blocks 100000000)" in msg
    assert re.search(r"lower --num-blocks; at most \d+ KV blocks \(\d+ tokens\) fit beside the rest", msg)


def test_a_default_pool_shrinks_to_the_ram_left(tiny, monkeypatch, caplog):
    """RAM short of the default pool (made so: the machine's cannot be filled in a test) but enough
    for one sequence: the pool is capped to what fits, with a warning, and requests still run."""
    full = LLM(str(tiny), device="cpu", max_num_seqs=8, max_model_len=512).engine
    default = full.num_blocks
    parts = host_startup_bytes(full.config, default, 16, full.config.kv_bytes_per_token(4), full.max_num_batched_tokens,
                               8, 8, 512, 4)
    rest = sum(parts.values()) - parts["KV cache"] - parts["block bookkeeping"]
    one_block = 16 * full.config.kv_bytes_per_token(4) + 64
    room = int((rest + 3 * (default // 8) * one_block) / 0.9) + 1  # three sequences' blocks beside the rest
    monkeypatch.setattr("minillm.engine.host_memory.host_memory_available", lambda: (room, "test"))
    with caplog.at_level("WARNING", logger="minillm"):
        llm = LLM(str(tiny), device="cpu", max_num_seqs=8, max_model_len=512)
    assert llm.engine.num_blocks == 3 * (default // 8)
    assert "the KV pool is capped at" in caplog.text and "3 sequences of max_model_len fit at once" in caplog.text
    outs = llm.generate([[5, 6, 7]] * 6, SamplingParams(max_tokens=4, temperature=0))
    assert all(len(o.token_ids) == 4 for o in outs)
    # less than one sequence: refused, naming what one needs
    monkeypatch.setattr("minillm.engine.host_memory.host_memory_available", lambda: (rest + 2 * one_block, "test"))
    with pytest.raises(ValueError, match=r"of RAM but only .* is available \(test\)"):
        LLM(str(tiny), device="cpu", max_num_seqs=8, max_model_len=512)


def test_the_cli_refuses_in_one_line(tiny, capsys):
    rc = main([str(tiny), "--device", "cpu", "--num-blocks", "100000000", "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and "Unable to allocate" not in err
    assert "set by --num-blocks 100000000" in err and "of RAM but only" in err


def test_int32_slot_indices(tiny):
    with pytest.raises(ValueError, match=r"2147483648 token slots \(134217728 blocks x --block-size 16\), but slot "
                                         r"indices are int32: at most 2147483647; lower --num-blocks below 134217728"):
        LLM(str(tiny), device="cpu", num_blocks=MAX_SLOTS // 16)
    with pytest.raises(ValueError, match=r"the pool defaults to --max-num-seqs 1000000 sequences of --max-model-len "
                                         r"4096 \(256 blocks each\): lower them, or set --num-blocks"):
        LLM(str(tiny), device="cpu", max_num_seqs=10**6)


def test_the_plan_counts_what_the_flags_size(tiny):
    from minillm.models.loader import load_model

    cfg = load_model(str(tiny)).config
    parts = host_startup_bytes(cfg, 100, 16, 512, 2048, 16, 16, 4096, 4)
    assert parts["KV cache"] == 100 * 16 * 512 and parts["block bookkeeping"] == 100 * 64
    bigger = host_startup_bytes(cfg, 100, 16, 512, 4096, 64, 64, 4096, 4)
    assert bigger["workspace"] > parts["workspace"] and bigger["step buffers"] > parts["step buffers"]
    args = EngineArgs(model=str(tiny), device="cpu")
    check_host_memory(args, parts, (sum(parts.values()), "test"), 100, 16 * 512, 4096, 2048)  # fits exactly
    with pytest.raises(ValueError, match=r"only 0\.00 GiB \(1000 bytes\) is available \(test\)"):
        check_host_memory(args, parts, (1000, "test"), 100, 16 * 512, 4096, 2048)
    check_host_memory(args, parts, None, 100, 16 * 512, 4096, 2048)  # nothing readable: no check
