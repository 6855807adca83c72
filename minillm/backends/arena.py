"""The device arena: every device allocation happens at startup, through here, and is accounted.

The CUDA backend installs `Arena.malloc` as CuPy's allocator when it is created. Until `seal()`,
each allocation is served from the arena's own memory pool and recorded under a label (what it
is for: an explicit `label(...)` or the first call site outside the backend). After `seal()` any
device allocation raises `ArenaSealedError` carrying the Python stack of the call that tried it:
the step loop never allocates, which is what makes CUDA-graph capture safe and turns a would-be
silent cudaMalloc in the hot path into an immediate, located error. `memory_plan()` prints
what was allocated, the totals, and what the device has free after.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections import OrderedDict

_BACKEND_DIR = os.path.dirname(os.path.abspath(__file__))


class ArenaSealedError(MemoryError):
    """A device allocation after startup (or inside a graph capture)."""


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _call_site() -> str:
    """The first frame outside minillm/backends and CuPy: who asked for the memory."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_BACKEND_DIR) and f"{os.sep}cupy" not in path:
            name = getattr(f.f_code, "co_qualname", f.f_code.co_name)
            return f"{os.path.basename(path)}:{name}"
        f = f.f_back
    return "unknown"


class Arena:
    def __init__(self) -> None:
        import cupy

        self._cupy = cupy
        self.pool = cupy.cuda.MemoryPool()
        self.sealed = False
        self._capturing = False
        self._labels: list[str] = []
        self.plan: OrderedDict[str, list[int]] = OrderedDict()  # label -> [count, bytes]
        self._previous = None

    # ---- the allocator --------------------------------------------------------------------
    def malloc(self, nbytes: int):
        if self.sealed or self._capturing:
            why = "inside a CUDA graph capture" if self._capturing else "after startup (arena sealed)"
            stack = "".join(traceback.format_stack()[:-1])
            raise ArenaSealedError(
                f"device allocation of {nbytes} bytes {why}; every device buffer must be made at "
                f"startup. Allocation requested at:\n{stack}"
            )
        mem = self.pool.malloc(nbytes)
        what = self._labels[-1] if self._labels else _call_site()
        rec = self.plan.setdefault(what, [0, 0])
        rec[0] += 1
        rec[1] += nbytes
        return mem

    def install(self) -> None:
        """Route CuPy's device allocations through this arena (done when the backend starts)."""
        cupy = self._cupy
        getter = getattr(cupy.cuda, "get_allocator", None)
        self._previous = getter() if getter else None
        cupy.cuda.set_allocator(self.malloc)

    def uninstall(self) -> None:
        self._cupy.cuda.set_allocator(self._previous)

    def seal(self) -> None:
        """From now on any device allocation raises ArenaSealedError with its call site."""
        self.sealed = True

    def unseal(self) -> None:
        """Allow allocations again (tests, or a deliberate re-plan such as a new KV pool size)."""
        self.sealed = False

    @contextlib.contextmanager
    def capturing(self):
        """Forbid allocations while a graph is being captured, sealed or not."""
        self._capturing = True
        try:
            yield
        finally:
            self._capturing = False

    @contextlib.contextmanager
    def label(self, what: str):
        """Account the allocations made inside this block under `what` in the memory plan."""
        self._labels.append(what)
        try:
            yield
        finally:
            self._labels.pop()

    # ---- reporting ------------------------------------------------------------------------
    def memory_plan(self) -> str:
        free, total = self._cupy.cuda.runtime.memGetInfo()
        width = max([len(k) for k in self.plan] + [10])
        lines = [f"device memory plan ({'sealed' if self.sealed else 'open'})"]
        lines.append(f"  {'what':<{width}}  {'buffers':>7}  {'size':>12}")
        for what, (count, nbytes) in self.plan.items():
            lines.append(f"  {what:<{width}}  {count:>7}  {_fmt_bytes(nbytes):>12}")
        asked = sum(n for _, n in self.plan.values())
        lines.append(f"  {'total asked':<{width}}  {'':>7}  {_fmt_bytes(asked):>12}")
        lines.append(f"  {'pool held':<{width}}  {'':>7}  {_fmt_bytes(self.pool.total_bytes()):>12}")
        lines.append(f"  device: {_fmt_bytes(total)} total, {_fmt_bytes(free)} free after the plan")
        return "\n".join(lines)
