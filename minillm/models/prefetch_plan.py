"""Which weight bytes a small decode step asks the GPU to pull into L2, and before which product.

A decode step of a few tokens reads every weight matrix once, in a fixed order (per layer qkv, o,
gate_up, down; then the LM head), and between those products runs kernels that barely touch HBM
(norms, q/k norm + RoPE, attention over a short context). A prefetch issued before a product can
use that idle HBM time to pull the bytes that come next into L2 (cuda/prefetch.cu), so the next
products start on data already on chip.

The plan treats the matrices as one stream of bytes in reading order. Right after each product
chosen in `points` (in stream order, so the prefetch runs while the small kernels that follow it
run) it asks for the bytes from the start of the next product up to `distance` bytes past that
start that no earlier prefetch asked for. `distance` bounds what is in flight ahead of the
reader, so what is prefetched is still in the 50 MB L2 when it is read. All of it is fixed at
startup (the matrices never move), so a captured CUDA graph replays it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRODUCTS = ("qkv", "o", "gate_up", "down")  # in the order a layer reads them


@dataclass
class PrefetchPlan:
    max_tokens: int  # steps of at most this many tokens prefetch (larger ones keep HBM busy)
    first: list[tuple[object, int, int]] = field(default_factory=list)  # after the embedding gather
    # after[layer][product]: (array, first byte, end byte) ranges to prefetch after that product
    after: list[dict[str, list[tuple[object, int, int]]]] = field(default_factory=list)


def plan_prefetch(layers, lm_head, distance: int, points: tuple[str, ...], max_tokens: int) -> PrefetchPlan:
    """The ranges prefetched after each chosen product, for `layers` (LayerWeights) and the LM head."""
    for p in points:
        if p not in PRODUCTS:
            raise ValueError(f"prefetch point {p!r}: expected some of {', '.join(PRODUCTS)}")
    stream = [(getattr(lw, p), i, p) for i, lw in enumerate(layers) for p in PRODUCTS]
    stream.append((lm_head, len(layers), "lm_head"))
    starts, pos = [], 0
    for a, _, _ in stream:
        starts.append(pos)
        pos += int(a.nbytes)
    plan = PrefetchPlan(max_tokens, after=[{p: [] for p in PRODUCTS} for _ in layers])

    def cut(lo: int, hi: int) -> list[tuple[object, int, int]]:  # [lo, hi) along the matrices
        out = []
        for b, s in zip((m for m, _, _ in stream), starts):
            first, last = max(lo, s), min(hi, s + int(b.nbytes))
            if first < last:
                out.append((b, first - s, last - s))
        return out

    plan.first = cut(0, distance)  # the first qkv, read right after the step's embedding gather
    issued = distance  # stream bytes some earlier prefetch already covers
    for j, (_, layer, product) in enumerate(stream[:-1]):
        nxt = starts[j + 1]
        if product in points and issued < nxt + distance:
            plan.after[layer][product] = cut(max(issued, nxt), nxt + distance)
            issued = nxt + distance
    return plan
