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

With async scheduling the copy need not be a launch of its own: defer() reserves the slot and
the runner's next upload (the next step, launched before this one is read) copies the ids in the
same kernel that stages its inputs; wait() queues the copy itself when no upload came first.

On the NumPy backend the sampler has already run when launch returns; the copy is a plain one.
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
        self._pending: tuple | None = None  # defer()'s ticket and ids, until an upload or wait() queues them

    def start(self, dev_rows) -> tuple[int, int]:
        """Enqueue the copy of dev_rows (device int32, contiguous) behind the work on the stream;
        returns the ticket wait() takes."""
        ticket = self.reserve(int(dev_rows.shape[0]))
        self.backend.copy_to_pinned(self.slot(ticket), dev_rows)
        self.queued(ticket)
        return ticket

    def reserve(self, n: int) -> tuple[int, int]:
        """A slot for n ids whose copy someone else queues (start, or the runner's next upload:
        backend.stage_inputs' copy_out); then queued(ticket) right behind that copy."""
        slot = self._next
        if self._busy[slot]:
            raise RuntimeError("TokenReadback: a third step's ids before the first was read")
        if n > self.max_rows:
            raise ValueError(f"TokenReadback: {n} rows, room for {self.max_rows}")
        self._busy[slot] = True
        self._next = (slot + 1) % self.SLOTS
        return slot, n

    def slot(self, ticket: tuple[int, int]) -> np.ndarray:
        """The pinned host row a reserved ticket's copy writes."""
        return self.host[ticket[0]]

    def queued(self, ticket: tuple[int, int]) -> None:
        """The ticket's copy is on the stream: the event wait() waits on goes behind it."""
        if self.cuda:
            self._events[ticket[0]].record(self.backend.stream)
        if self._pending is not None and self._pending[0] == ticket:
            self._pending = None

    def defer(self, dev_rows) -> tuple[int, int]:
        """Reserve a slot for dev_rows (a step's sampled ids) whose copy is not queued yet: the
        runner's next upload takes it (pending(); backend.stage_inputs copies it in the same launch,
        before that step's forward can overwrite the ids), or wait() queues it if no upload came.
        Async scheduling launches step n + 1 before it reads step n: a copy of its own is a launch
        between the two graphs (copy_to_pinned: +5.7 us over the graph on an H200, part317; riding on
        the upload took the step's 11.1 us around its graph to 9.2 on an H100, part321)."""
        if self._pending is not None:
            raise RuntimeError("TokenReadback: a second deferred copy before the first was queued")
        ticket = self.reserve(int(dev_rows.shape[0]))
        self._pending = (ticket, dev_rows)
        return ticket

    def pending(self) -> tuple | None:
        """(ticket, device ids) of the deferred copy not queued yet, or None."""
        return self._pending

    def reset(self) -> None:
        """Free every slot, unread: the steps that held them were given up (a step that raised, and
        the one launched around it; LLMEngine.discard_in_flight). A copy still queued on the stream
        lands before any later step's copy into its slot, which the stream orders after it."""
        self._busy = [False] * self.SLOTS
        self._next = 0
        self._pending = None

    def wait(self, ticket: tuple[int, int]) -> np.ndarray:
        """The ids of a started copy (a host copy of its own), once that step has finished."""
        if self._pending is not None and self._pending[0] == ticket:  # no upload took it: queue it now
            self.backend.copy_to_pinned(self.slot(ticket), self._pending[1])
            self.queued(ticket)
        slot, n = ticket
        if self.cuda:
            self._events[slot].synchronize()
        self._busy[slot] = False
        return self.host[slot, :n].copy()
