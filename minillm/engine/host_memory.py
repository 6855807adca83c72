"""Host RAM for the CPU (NumPy) backend: what startup allocates, against what the machine has left.

NumPy would fail a pool larger than RAM with a bare "Unable to allocate 977 GiB", or be granted one
lazily and be killed once the cache fills. So before anything that scales with the flags exists,
the engine sums those buffers (host_startup_bytes) against the RAM left (host_memory_available). A
default pool that does not fit shrinks to what does, as the GPU's does to its free memory; an
explicit --num-blocks, or a configuration whose other buffers alone do not fit, is refused with the
bytes needed and available and the flags that size each part (check_host_memory).
"""

from __future__ import annotations

import logging
import os

from minillm.args import EngineArgs
from minillm.models.transformer import Workspace

log = logging.getLogger("minillm")
GiB = 1 << 30

HOST_POOL_SHARE = 0.9  # of the RAM left, what a default pool shrunk to fit may take with the rest

# BlockManager's Python bookkeeping a block (list entries, the free deque, the int objects)
BLOCK_BOOKKEEPING_BYTES = 64


def host_memory_available() -> tuple[int, str] | None:
    """(bytes of RAM this process may still take, where the figure comes from): /proc/meminfo's
    MemAvailable (else the free physical pages), lowered to a cgroup's limit less its usage where
    one is set; None where neither can be read."""
    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages"))
        except (OSError, ValueError, AttributeError):
            pass
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max" or a huge v1 value: no limit
            found.append((max(0, int(limit) - usage), f"the cgroup's {limit_path} less its usage"))
        break
    return min(found) if found else None


def host_startup_bytes(cfg, num_blocks: int, block_size: int, kv_bytes_per_token: int, max_tokens: int,
                       max_seqs: int, max_logits: int, max_model_len: int, dtype_bytes: int) -> dict[str, int]:
    """What the NumPy backend's startup allocates that scales with the flags, by part: the KV pool,
    the workspace (activations for max_tokens rows, float32 logits for max_logits rows), the step
    buffers (runner.StepBuffers' arrays and block tables, a host and a backend copy each) and the
    block manager's bookkeeping. max_model_len: with the drafter's lookahead."""
    max_blocks = -(-max_model_len // block_size)
    seqs = max_seqs + 1  # the runner's spare (graph padding) row
    step = 16 * max_tokens + 28 * seqs + 48 * max_logits + 4 * seqs * max_blocks
    return {"KV cache": num_blocks * block_size * kv_bytes_per_token,
            "workspace": Workspace.nbytes(cfg, max_tokens, max_logits, dtype_bytes),
            "step buffers": 2 * step,
            "block bookkeeping": BLOCK_BOOKKEEPING_BYTES * num_blocks}


def check_host_memory(args: EngineArgs, parts: dict[str, int], available: tuple[int, str] | None,
                      num_blocks: int, block_bytes: int, max_model_len: int, max_num_batched_tokens: int) -> None:
    """Refuse, before allocating, a CPU configuration whose startup buffers (host_startup_bytes)
    exceed the RAM left: NumPy would fail with a bare "Unable to allocate", or the pool would be
    granted lazily and the process killed once the cache fills. The message gives the bytes needed
    and available and the flags that set each part."""
    if available is None:
        return
    free, source = available
    need = sum(parts.values())
    if need <= free:
        return

    def size(n: int) -> str:
        return f"{n / GiB:.2f} GiB ({n} bytes)"

    bs = args.block_size
    kv_flags = (f"--num-blocks {num_blocks}" if args.num_blocks is not None else
                f"--max-num-seqs {args.max_num_seqs} x --max-model-len {max_model_len}")
    batched = ("--max-num-batched-tokens" if args.max_num_batched_tokens is not None else
               "--max-num-batched-tokens (its default on this backend)")
    why = {"KV cache": f"{num_blocks} blocks x {bs} tokens x {block_bytes // bs} bytes, set by {kv_flags}",
           "workspace": f"{max_num_batched_tokens} token rows by {batched}, "
                        f"{args.max_num_seqs} logits rows by --max-num-seqs",
           "step buffers": f"--max-num-batched-tokens {max_num_batched_tokens}, --max-num-seqs {args.max_num_seqs} "
                           f"x --max-model-len {max_model_len}",
           "block bookkeeping": f"{num_blocks} blocks"}
    detail = "; ".join(f"{name} {size(n)} ({why[name]})" for name, n in parts.items())
    rest = need - parts["KV cache"] - parts["block bookkeeping"]
    fit = max(0, (free - rest) // (block_bytes + BLOCK_BOOKKEEPING_BYTES))
    fix = ("lower --num-blocks" if args.num_blocks is not None else
           "lower --max-num-seqs or --max-model-len, or set --num-blocks")
    if parts["workspace"] + parts["step buffers"] > free // 2:
        fix += ", and lower --max-num-seqs / --max-num-batched-tokens (they size the workspace)"
    raise ValueError(
        f"the CPU backend's startup buffers need {size(need)} of RAM but only {size(free)} is available "
        f"({source}): {detail}. {fix}"
        + (f"; at most {fit} KV blocks ({fit * bs} tokens) fit beside the rest (--num-blocks {fit})" if fit else "")
    )


def plan_host_pool(args: EngineArgs, cfg, num_blocks: int, kv_bytes_per_token: int, max_tokens: int, max_logits: int,
                   max_model_len: int, lookahead: int, dtype_bytes: int) -> int:
    """The KV blocks the CPU backend allocates: num_blocks (engine.plan_kv_pool's) when startup's
    buffers fit the RAM left; else, for a default pool, as many as fit beside the rest if one
    sequence's do (a warning says how many); else a ValueError (check_host_memory's)."""
    bs = args.block_size
    block_bytes = kv_bytes_per_token * bs
    total_len = max_model_len + lookahead
    need = host_startup_bytes(cfg, num_blocks, bs, kv_bytes_per_token, max_tokens, args.max_num_seqs, max_logits,
                              total_len, dtype_bytes)
    available = host_memory_available()
    if available is None or sum(need.values()) <= available[0]:
        return num_blocks
    per_seq = -(-total_len // bs)
    rest = sum(need.values()) - need["KV cache"] - need["block bookkeeping"]
    # a capped pool leaves a tenth of the RAM to the rest of the machine (the GPU's default
    # --gpu-memory-utilization is 0.9 too)
    fit = max(0, (int(available[0] * HOST_POOL_SHARE) - rest) // (block_bytes + BLOCK_BOOKKEEPING_BYTES))
    if args.num_blocks is None and fit >= per_seq:
        log.warning("the KV pool is capped at %d blocks (%d tokens, %.2f GiB) to fit the RAM left (%s): the default "
                    "--max-num-seqs %d x --max-model-len %d would need %d; %d sequences of max_model_len fit at once "
                    "(requests beyond that wait or are preempted)", fit, fit * bs, fit * block_bytes / GiB,
                    available[1], args.max_num_seqs, max_model_len, num_blocks, fit // per_seq)
        return fit
    check_host_memory(args, need, available, num_blocks, block_bytes, max_model_len, max_tokens)
    return num_blocks  # (check_host_memory raised: need > available)
