"""AsyncEngine: the LLMEngine on its own thread, talking to the asyncio server through queues.

The event loop never calls into the engine while it steps. Adds and aborts go into a thread-safe
command queue that the engine thread drains between steps; each step's outputs go back with
one `loop.call_soon_threadsafe` into the asyncio queue of each request. An idle engine thread
sleeps on an Event (no busy spin). If the loop raises, the full traceback is logged, every open
request gets an EngineFailure, and the engine stops admitting: nothing hangs, nothing dies
silently (docs: shared/field-report.md).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable

from minillm.engine.engine import EngineStats, LLMEngine, RequestOutput
from minillm.sampling_params import SamplingParams
from minillm.server.stats_log import request_added_line, request_finished_line

log = logging.getLogger("minillm.server")


class EngineUnavailable(Exception):
    """The engine takes no new requests (it failed, or the server is shutting down): HTTP 503."""


class EngineFailure(Exception):
    """Delivered to an open request whose engine died or that was cut at shutdown."""

    def __init__(self, message: str, type: str = "internal_server_error", status: int = 500):
        super().__init__(message)
        self.message, self.type, self.status = message, type, status


class RequestStream:
    """One request's outputs, consumed with `async for`; close() aborts it if unfinished."""

    def __init__(self, owner: AsyncEngine, request_id: str, num_prompt_tokens: int = 0):
        self.owner = owner
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.t0 = time.monotonic()
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def close(self) -> None:
        self.owner._release(self)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, step_delay: float = 0.0, step_timeout: float = 120.0,
                 log_requests: bool = False):
        self.engine = engine
        self.log_requests = log_requests  # --enable-log-requests: a line as each request starts and ends
        self.step_delay = step_delay  # test hook (MINILLM_TEST_STEP_DELAY): slows each step down
        # a step running longer than this is a hung engine (a stuck GPU, a deadlock): the watchdog
        # logs where the engine thread is, fails every open stream and turns /health 503
        self.step_timeout = step_timeout
        self._step_began: float | None = None
        self.stats: EngineStats = engine.stats()  # snapshot written by the engine thread only
        self.error: BaseException | None = None
        self.accepting = True
        self.steps = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, RequestStream] = {}  # event-loop side only
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._dead = False
        self._fault_after: int | None = None
        self._thread: threading.Thread | None = None

    # ---- event-loop side ----------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._thread.start()
        self._watchdog = self.loop.create_task(self._watch_steps())

    async def _watch_steps(self) -> None:
        """Nothing hangs: a step that never returns is reported like a step that raised."""
        while not self._stop and not self._dead:
            await asyncio.sleep(min(1.0, self.step_timeout / 4))
            began = self._step_began
            if began is None or time.monotonic() - began <= self.step_timeout:
                continue
            frame = sys._current_frames().get(self._thread.ident) if self._thread else None
            where = "".join(traceback.format_stack(frame)) if frame is not None else "(thread gone)\n"
            log.error("engine step has not returned for %.0f s (--step-timeout); the engine thread is at:\n%s"
                      "failing %d open request(s)", time.monotonic() - began, where, len(self._streams))
            self._dead = True
            self._fail_all(TimeoutError(f"an engine step did not return within {self.step_timeout:g} s"))

    async def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    @property
    def healthy(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and not self._dead
                and self.error is None)

    @property
    def num_open(self) -> int:
        return len(self._streams)

    def check_admitting(self) -> None:
        if not self.accepting:
            raise EngineUnavailable("the server is shutting down and takes no new requests")
        if not self.healthy:
            raise EngineUnavailable(f"the engine loop has stopped ({self.error!r}); see the server log")

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams, priority: int = 0) -> RequestStream:
        self.check_admitting()
        stream = RequestStream(self, request_id, len(prompt_ids))
        self._streams[request_id] = stream
        if self.log_requests:
            log.info("%s", request_added_line(request_id, len(prompt_ids), params))
        self._submit(("add", request_id, prompt_ids, params, priority))
        return stream

    def _release(self, stream: RequestStream) -> None:
        if self._streams.pop(stream.request_id, None) is not None and not stream.finished:
            self._submit(("abort", stream.request_id))  # client gone: the engine frees its blocks now
            if self.log_requests:
                log.info("request %s aborted after %.2f s", stream.request_id, time.monotonic() - stream.t0)

    def inject_fault(self, after_steps: int = 0) -> None:
        """Test hook: make the engine loop raise after `after_steps` more steps."""
        self._submit(("fault", after_steps))

    def fail_open(self, failure: EngineFailure) -> None:
        """Cut every open request with `failure` (used at the end of the shutdown grace period)."""
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(failure)
            self._release(stream)

    async def drain(self, grace: float, force: asyncio.Event | None = None) -> None:
        """Stop admitting, wait up to `grace` s for open requests to finish, then cut the rest."""
        self.accepting = False
        deadline = time.monotonic() + grace
        while self._streams and time.monotonic() < deadline and not (force and force.is_set()):
            await asyncio.sleep(0.05)
        if self._streams:
            log.warning("shutdown: aborting %d request(s) still open", len(self._streams))
            self.fail_open(EngineFailure("the server is shutting down; the request was aborted",
                                         "server_shutdown", 503))
            for _ in range(40):  # let the streams write their error events before the sockets close
                if not self._streams:
                    break
                await asyncio.sleep(0.05)

    def _submit(self, cmd: tuple) -> None:
        self._cmds.put(cmd)
        self._wake.set()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:  # else aborted meanwhile: drop
                stream.queue.put_nowait(out)
                if out.finished and self.log_requests:
                    log.info("%s", request_finished_line(out.request_id, out.finish_reason, stream.num_prompt_tokens,
                                                         out.output_len, time.monotonic() - stream.t0))

    def _reject(self, request_id: str, failure: EngineFailure) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.queue.put_nowait(failure)

    def _fail_all(self, exc: BaseException) -> None:
        self.error = exc
        failure = EngineFailure(f"the engine failed: {type(exc).__name__}: {exc}; see the server log")
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(failure)

    # ---- engine-thread side -------------------------------------------------------------------
    def _post(self, fn: Callable, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def _drain_commands(self) -> None:
        eng = self.engine
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, prompt_ids, params, priority = cmd
                try:
                    eng.add_request(prompt_ids, params, rid, priority)
                except ValueError as e:  # validated before, so only a race could get here
                    self._post(self._reject, rid, EngineFailure(str(e), "invalid_request_error", 400))
                except Exception as e:  # a bug in admission: fail this request loudly, keep serving others
                    log.exception("adding request %s failed", rid)
                    eng.abort_request(rid)
                    self._post(self._reject, rid, EngineFailure(f"the engine could not admit the request: "
                                                                f"{type(e).__name__}: {e}"))
            elif cmd[0] == "abort":
                eng.abort_request(cmd[1])
            elif cmd[0] == "fault":
                self._fault_after = self.steps + cmd[1]

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop:
                self._drain_commands()
                if not eng.has_unfinished():
                    self.stats = eng.stats()
                    self._wake.wait()
                    self._wake.clear()
                    continue
                if self._fault_after is not None and self.steps >= self._fault_after:
                    raise RuntimeError("injected test fault (MINILLM_TEST_FAULTS)")
                self._step_began = time.monotonic()
                outputs = eng.step()
                if self.step_delay:  # inside the watched window: tests use it to play a slow step
                    time.sleep(self.step_delay)
                self._step_began = None
                if self._dead:  # the watchdog gave up on this step and failed its requests
                    return
                self.steps += 1
                self.stats = eng.stats()
                if outputs:
                    self._post(self._deliver, outputs)
        except BaseException as e:
            log.exception("engine loop failed after %d steps; failing %d open request(s)", self.steps,
                          len(self._streams))
            self._dead = True
            self._post(self._fail_all, e)
