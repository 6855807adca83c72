"""TokenReadback: a step's sampled ids, device to host, without waiting for later steps.

Async scheduling launches step n + 1 before step n's ids are read. Reading them the plain way
(backend.to_host) would synchronise the whole stream, step n + 1 included, and the device would
idle again while the host schedules step n + 2. Instead the copy is enqueued on the stream right
after step n's sampler, into a pinned host slot of its own, with an event behind it; waiting on
that event waits for step n alone. On the GPU the copy is a kernel storing into the slot
(backend.copy_to_pinned): a copy engine's 4-byte transfer cost 10 us around a decode graph
(part316).

Two slots: at most two steps have unread ids (the one being collected and the one just launched).
A slot is taken again only after its ids were read, which the engine's order guarantees; start()
checks it, since a reused slot would hand one step the other's tokens.

On the NumPy backend the sampler has already run when launch returns: the ids are copied at once.
"""

from __future__ import annotations

import numpy as np


class TokenReadback:
    SLOTS = 2

    def __init__(self, backend, max_rows: int):
        self.backend = backend
        self.max_rows = max_rows
        self.cuda = backend.name == "cuda"
        n = self.SLOTS * max_rows
        if self.cuda:
            cp = backend.cp
            # pinned host memory (not a device allocation: the sealed arena never sees it), so the
            # copy runs asynchronously on the stream
            self._pinned = cp.cuda.alloc_pinned_memory(n * 4)
            self.host = np.frombuffer(self._pinned, np.int32, n).reshape(self.SLOTS, max_rows)
            self._events = [cp.cuda.Event(disable_timing=True) for _ in range(self.SLOTS)]
        else:
            self.host = np.zeros((self.SLOTS, max_rows), np.int32)
        self._busy = [False] * self.SLOTS
        self._next = 0

    def start(self, dev_rows) -> tuple[int, int]:
        """Enqueue the copy of dev_rows (device int32, contiguous) behind the work on the stream;
        returns the ticket wait() takes."""
        n = int(dev_rows.shape[0])
        slot = self._next
        if self._busy[slot]:
            raise RuntimeError("TokenReadback: a third step's ids before the first was read")
        if n > self.max_rows:
            raise ValueError(f"TokenReadback: {n} rows, room for {self.max_rows}")
        self._busy[slot] = True
        self._next = (slot + 1) % self.SLOTS
        self.backend.copy_to_pinned(self.host[slot], dev_rows)
        if self.cuda:
            self._events[slot].record(self.backend.stream)
        return slot, n

    def reset(self) -> None:
        """Free every slot, unread: the steps that held them were given up (a step that raised, and
        the one launched around it; LLMEngine.discard_in_flight). A copy still queued on the stream
        lands before any later step's copy into its slot, which the stream orders after it."""
        self._busy = [False] * self.SLOTS
        self._next = 0

    def wait(self, ticket: tuple[int, int]) -> np.ndarray:
        """The ids of a started copy (a host copy of its own), once that step has finished."""
        slot, n = ticket
        if self.cuda:
            self._events[slot].synchronize()
        self._busy[slot] = False
        return self.host[slot, :n].copy()
