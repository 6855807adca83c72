"""The CPU (NumPy) backend checks its startup buffers against the RAM left before allocating any:
a configuration that cannot fit is refused with the bytes needed and available and the flags that
size each part, not numpy's bare "Unable to allocate 977 GiB" (or a pool granted lazily and the
process killed once it fills). KV pools past int32 slot indices are refused on every backend."""

from __future__ import annotations

import re

import pytest

from minillm import LLM
from minillm.args import EngineArgs
from minillm.engine.engine import MAX_SLOTS, check_host_memory, host_memory_available, host_startup_bytes
from minillm.generate import main


def test_a_pool_larger_than_ram_is_refused_naming_the_flags(tiny):
    avail = host_memory_available()
    assert avail is not None and avail[0] > 0
    # 128e6 blocks of 16 tokens x 512 bytes (the tiny model's K and V): ~1 TB of KV cache, below 2**31 slots
    with pytest.raises(ValueError) as e:
        LLM(str(tiny), device="cpu", max_num_seqs=10**6, max_model_len=2048)
    msg = str(e.value)
    assert msg.startswith("the CPU backend's startup buffers need ") and "of RAM but only " in msg
    need, free = (int(x) for x in re.findall(r"\((\d+) bytes\)", msg)[:2])
    assert need > 10**12 > free > 0
    assert "KV cache 976.56 GiB (1048576000000 bytes) (128000000 blocks x 16 tokens x 512 bytes, set by " \
           "--max-num-seqs 1000000 x --max-model-len 2048)" in msg
    assert "--max-num-batched-tokens" in msg and "lower --max-num-seqs or --max-model-len, or set --num-blocks" in msg
    # an explicit --num-blocks is named instead; what fits is offered
    with pytest.raises(ValueError, match=r"set by --num-blocks 100000000\).*lower --num-blocks; at most \d+ KV "
                                         r"blocks \(\d+ tokens\) fit beside the rest"):
        LLM(str(tiny), device="cpu", num_blocks=10**8)


def test_the_cli_refuses_in_one_line(tiny, capsys):
    rc = main([str(tiny), "--device", "cpu", "--max-num-seqs", "1000000", "--max-model-len", "2048", "--prompt", "x"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and "Unable to allocate" not in err
    assert "--max-num-seqs 1000000 x --max-model-len 2048" in err and "of RAM but only" in err


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
