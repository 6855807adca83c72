"""StepProfiler: where an engine step's time goes, step by step (`bench throughput --profile`).

Each engine step is cut into consecutive phases by host timestamps, so the phases add up to the
step's wall time exactly:

  schedule  scheduler.schedule(): admission, preemption, block allocation, prefix-cache lookups
  prepare   runner.prepare() (host step inputs), graph padding, the upload of the inputs
  execute   forward + sample, until the sampled tokens are on the host
  post      the engine's bookkeeping: appending tokens, stop checks, detokenisation, outputs
  propose   speculative decoding only: the drafter's proposals for the next step (a DFlash
            drafter's step is launched without waiting, and the step's outputs are rendered
            after it, while it runs: then both are counted here, not in post)

With engine.overlap_outputs (inside LLM.generate) the rendering of the previous step's outputs
(detokenisation, stop strings, outputs) runs while the device works, between launch and the
results, so it is counted in execute, not post, and device then also covers any time the device
sat idle waiting for that rendering to end (the end event is recorded after it). The session-3
H200 profile predates the overlap.

Inside execute, `launch` is the host time from the upload to asking for the results (enqueueing
the eager kernels, or one graph replay); execute - launch is the host waiting for the device plus
the copy back. On CUDA, `device` is the time between two events recorded on the backend stream,
one after the upload and one before the results are read: the device time of forward + sample,
including any gap where the device waited for eager launches. On the CPU backend the forward runs
on the host, synchronously, and device = launch.

Off (engine.profiler is None, the default) nothing here runs: the engine tests one attribute per
phase. On, it adds a few perf_counter calls and two event records per step; it neither allocates
device memory (CUDA events are not device allocations, the arena never sees them) nor syncs the
stream (an event pair is read once it has completed: at a later step, or at detach()).

With engine.async_scheduling (LLM.generate's default) a step() call launches step n + 1 and then
waits for step n's ids: schedule and prepare are step n + 1's, execute is its launch plus the wait
for step n (launch ends at collecting()), device is step n + 1's device time, post accepts and
renders step n, and num_sampled counts step n's tokens. A call that has nothing to launch and only
waits for the step in flight (a run's last) is recorded with kind "collect". When the next step
cannot be scheduled ahead (it might preempt) the call first waits for the step in flight: that
wait is counted in schedule. host (wall - execute) is then host time outside the call's wait,
not time the device idles: the device runs the launched step meanwhile.

The engine calls begin / scheduled / (collecting) / executed / proposing / end from step(). The runner is not
edited: while attached, the profiler shadows three of its seams on the instance (buf.upload and
_results, to mark the start and end of the device work, and replay_timer, to know a graph ran)
and detach() restores them.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass

PHASES = ("schedule", "prepare", "execute", "post", "propose")
KINDS = ("prefill", "mixed", "decode-graph", "decode-eager", "verify-graph", "verify-eager", "collect")
DECODE_BUCKETS = ((1, 8), (9, 32), (33, 64), (65, 128), (129, 256))  # sequences per decode step


@dataclass
class StepRecord:
    """One engine step that ran the model. Times in milliseconds."""

    kind: str  # one of KINDS: prefill chunks only / prefill and decodes / decodes only / drafts verified
    num_seqs: int
    num_tokens: int  # tokens computed: prompt chunks, decodes, drafts to verify
    num_prefill_tokens: int  # of which prompt (or recomputation) chunks
    num_sampled: int  # tokens appended to outputs
    schedule_ms: float
    prepare_ms: float
    execute_ms: float
    post_ms: float
    propose_ms: float
    launch_ms: float  # host part of execute before the results are read (see the module docstring)
    device_ms: float | None = None  # CUDA: filled in once the step's events have completed

    @property
    def wall_ms(self) -> float:
        return self.schedule_ms + self.prepare_ms + self.execute_ms + self.post_ms + self.propose_ms

    @property
    def host_ms(self) -> float:
        """Host time outside execute: the device is idle then (each step ends on reading results)."""
        return self.wall_ms - self.execute_ms


def step_kind(batch, graph: bool) -> str:
    """The kind of a step from its scheduled items (minillm.engine.scheduler.ScheduledSeq)."""
    if not batch:  # async scheduling: a call that only collected the step in flight
        return "collect"
    if any(item.num_draft for item in batch):
        return "verify-graph" if graph else "verify-eager"
    decodes = sum(item.decode for item in batch)
    if decodes == len(batch):
        return "decode-graph" if graph else "decode-eager"
    return "prefill" if decodes == 0 else "mixed"


class StepProfiler:
    """Records a StepRecord per engine step while attached: `StepProfiler(engine)` ... `.detach()`."""

    def __init__(self, engine):
        self.engine = engine
        self.runner = engine.runner
        self.records: list[StepRecord] = []
        self.cuda = engine.backend.name == "cuda"
        self._pending: deque = deque()  # (record, start event, end event) not read yet
        self._free_events: list = []
        if self.cuda:
            self._cp = engine.backend.cp
            self._stream = engine.backend.stream
            self._free_events = [self._cp.cuda.Event() for _ in range(8)]  # grown on demand
        self._in_execute = False
        self._start = self._end = self._batch = None
        self._attach()

    # ---- attaching ------------------------------------------------------------------------------
    def _attach(self) -> None:
        if getattr(self.engine, "profiler", None) is not None:
            raise RuntimeError("the engine already has a step profiler attached")
        runner, buf = self.runner, self.runner.buf
        for obj, name in ((buf, "upload"), (runner, "_results")):
            if not callable(getattr(obj, name, None)):  # the runner changed: say where to look
                raise RuntimeError(f"StepProfiler needs {type(obj).__name__}.{name}; update step_profile.py")
        self._upload, self._results = buf.upload, runner._results
        self._replay_timer = runner.replay_timer
        buf.upload = self._timed_upload
        runner._results = self._timed_results
        runner.replay_timer = self._graph_replay
        self.engine.profiler = self

    def detach(self) -> None:
        """Restore the runner and the engine, and read every outstanding device time (syncs)."""
        if self.engine.profiler is not self:
            return
        del self.runner.buf.upload  # the instance shadows go: the class methods show through again
        del self.runner._results
        self.runner.replay_timer = self._replay_timer
        self.engine.profiler = None
        self._read_events(wait=True)

    # ---- the runner's seams -----------------------------------------------------------------------
    def _timed_upload(self, *args, **kwargs):
        self._upload(*args, **kwargs)
        if self._in_execute:  # the device work of forward + sample starts after the inputs
            self._t_upload = time.perf_counter()
            if self.cuda:
                self._start = self._event()
                self._start.record(self._stream)

    def _timed_results(self, *args, **kwargs):
        if self._in_execute and self._t_results is None:
            self._t_results = time.perf_counter()
            self._record_end()
        return self._results(*args, **kwargs)

    def _graph_replay(self, replay) -> None:
        if self._in_execute:
            self._graph = True
        if self._replay_timer is not None:  # a benchmark's own timer keeps working
            self._replay_timer(replay)
        else:
            replay()

    def _record_end(self) -> None:
        if self.cuda and self._start is not None and self._end is None:
            self._end = self._event()
            self._end.record(self._stream)

    def _event(self):
        return self._free_events.pop() if self._free_events else self._cp.cuda.Event()

    def _read_events(self, wait: bool) -> None:
        """Device times of completed steps (oldest first); wait=True waits for all of them."""
        while self._pending:
            record, start, end = self._pending[0]
            if not wait and not end.done:
                break
            end.synchronize()
            record.device_ms = self._cp.cuda.get_elapsed_time(start, end)
            self._free_events += [start, end]
            self._pending.popleft()

    # ---- the engine's hooks (LLMEngine.step) ----------------------------------------------------
    def begin(self) -> None:
        if self._pending:
            self._read_events(wait=False)
        self._start = self._end = None
        self._t_upload = self._t_results = self._t_propose = None
        self._graph = False
        self._t0 = time.perf_counter()

    def scheduled(self, batch) -> None:
        self._t_sched = time.perf_counter()
        self._batch = batch
        self._in_execute = True

    def collecting(self) -> None:
        """Async scheduling: the engine is about to wait for the previous step's ids (the
        runner's _results seam is not used there); launch ends here, as at _results."""
        if self._in_execute and self._t_results is None:
            self._t_results = time.perf_counter()
            self._record_end()

    def executed(self) -> None:
        self._in_execute = False
        if self._t_results is None:  # nothing sampled (prefill chunks only): the step did not wait
            self._record_end()
        self._t_exec = time.perf_counter()

    def proposing(self) -> None:
        self._t_propose = time.perf_counter()

    def end(self, num_sampled: int) -> None:
        t_end = time.perf_counter()
        batch = self._batch
        self._batch = None
        t_res = self._t_results if self._t_results is not None else self._t_exec
        t_up = self._t_upload if self._t_upload is not None else t_res  # nothing uploaded: no launch
        t_prop = self._t_propose if self._t_propose is not None else t_end
        record = StepRecord(
            kind=step_kind(batch, self._graph), num_seqs=len(batch),
            num_tokens=sum(item.num_new for item in batch),
            num_prefill_tokens=sum(item.num_new for item in batch if not item.decode and not item.num_draft),
            num_sampled=num_sampled,
            schedule_ms=(self._t_sched - self._t0) * 1e3, prepare_ms=(t_up - self._t_sched) * 1e3,
            execute_ms=(self._t_exec - t_up) * 1e3, post_ms=(t_prop - self._t_exec) * 1e3,
            propose_ms=(t_end - t_prop) * 1e3, launch_ms=(t_res - t_up) * 1e3,
        )
        if not self.cuda:
            record.device_ms = record.launch_ms  # the NumPy forward runs on the host
        elif self._end is not None:
            self._pending.append((record, self._start, self._end))
        elif not batch:
            record.device_ms = 0.0  # a "collect" call launched nothing
        self.records.append(record)

    # ---- results ------------------------------------------------------------------------------
    def summary(self, run_s: float | None = None) -> dict:
        self._read_events(wait=True)
        return summarize(self.records, run_s, "cuda-events" if self.cuda else "host")

    def step_table(self) -> dict:
        """Every step, column-wise (compact in JSON)."""
        rows = [dict(asdict(r), wall_ms=r.wall_ms) for r in self.records]
        return {k: [row[k] for row in rows] for k in (rows[0] if rows else ())}


# ---- aggregation ----------------------------------------------------------------------------------
def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _total(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _phase_stats(records: list[StepRecord], fn) -> dict:
    cols = {p: [getattr(r, f"{p}_ms") for r in records] for p in PHASES}
    cols["device"] = [r.device_ms for r in records]
    cols["launch"] = [r.launch_ms for r in records]
    cols["wall"] = [r.wall_ms for r in records]
    cols["host"] = [r.host_ms for r in records]
    return {k: fn(v) for k, v in cols.items()}


def bucket_label(n: int) -> str:
    for lo, hi in DECODE_BUCKETS:
        if lo <= n <= hi:
            return f"{lo}-{hi}"
    return f">{DECODE_BUCKETS[-1][1]}"


def summarize(records: list[StepRecord], run_s: float | None = None, device_timing: str = "host") -> dict:
    """Per kind: count, tokens, total and median ms per phase, share of the run; decode steps by batch
    size bucket: medians of wall, device, host (outside execute) and other (execute - device)."""
    steps_ms = sum(r.wall_ms for r in records)
    run_ms = run_s * 1e3 if run_s is not None else steps_ms
    by_kind = {}
    for kind in KINDS + ("all",):
        rs = records if kind == "all" else [r for r in records if r.kind == kind]
        if not rs:
            continue
        total = _phase_stats(rs, _total)
        by_kind[kind] = {
            "steps": len(rs), "tokens": sum(r.num_tokens for r in rs),
            "prefill_tokens": sum(r.num_prefill_tokens for r in rs), "sampled": sum(r.num_sampled for r in rs),
            "median_seqs": _median([r.num_seqs for r in rs]), "median_tokens": _median([r.num_tokens for r in rs]),
            "share": total["wall"] / run_ms if run_ms else None,
            "total_ms": total, "median_ms": _phase_stats(rs, _median),
        }
    buckets = []
    decode = [r for r in records if r.kind.startswith("decode")]
    for label in [f"{lo}-{hi}" for lo, hi in DECODE_BUCKETS] + [f">{DECODE_BUCKETS[-1][1]}"]:
        rs = [r for r in decode if bucket_label(r.num_seqs) == label]
        if not rs:
            continue
        other = [r.execute_ms - r.device_ms if r.device_ms is not None else None for r in rs]
        buckets.append({
            "seqs": label, "steps": len(rs), "graph_steps": sum(r.kind == "decode-graph" for r in rs),
            "share": sum(r.wall_ms for r in rs) / run_ms if run_ms else None,
            "median_ms": {"wall": _median([r.wall_ms for r in rs]), "device": _median([r.device_ms for r in rs]),
                          "host": _median([r.host_ms for r in rs]), "other": _median(other)},
        })
    return {"device_timing": device_timing, "steps": len(records), "steps_s": steps_ms / 1e3,
            "run_s": run_ms / 1e3, "outside_steps_s": (run_ms - steps_ms) / 1e3,
            "by_kind": by_kind, "decode_by_batch": buckets}


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_summary(s: dict) -> str:
    """The summary as three plain-text tables."""
    timing = ("device = CUDA events on the backend stream" if s["device_timing"] == "cuda-events"
              else "CPU backend: device = the host forward + sample")
    lines = [f"step profile: {s['steps']} steps, {s['steps_s']:.2f} s in steps of a {s['run_s']:.2f} s run "
             f"({s['outside_steps_s']:.2f} s outside steps); {timing}"]
    cols = ("wall", "schedule", "prepare", "execute", "device", "launch", "post", "propose")
    head = "".join(f"{c:>10}" for c in cols)
    lines.append("\nby step kind, totals in s (seqs and tok/step: medians; share: of the run)")
    lines.append(f"{'kind':<14}{'steps':>7}{'share':>8}{'seqs':>6}{'tok/step':>9}{'tokens':>9}{head}")
    for kind, k in s["by_kind"].items():
        t = k["total_ms"]
        vals = "".join(f"{_f(t[c] / 1e3 if t[c] is not None else None, '.3f'):>10}" for c in cols)
        lines.append(f"{kind:<14}{k['steps']:>7}{_f(k['share'] and 100 * k['share'], '.1f'):>7}%"
                     f"{_f(k['median_seqs'], '.0f'):>6}{_f(k['median_tokens'], '.0f'):>9}{k['tokens']:>9}{vals}")
    lines.append("\nby step kind, medians in ms")
    lines.append(f"{'kind':<14}{'steps':>7}{'':>32}{head}")
    for kind, k in s["by_kind"].items():
        m = k["median_ms"]
        lines.append(f"{kind:<14}{k['steps']:>7}{'':>32}" + "".join(f"{_f(m[c], '.3f'):>10}" for c in cols))
    if s["decode_by_batch"]:
        lines.append("\ndecode steps by batch size, medians in ms (host: outside execute, the device idles "
                     "unless async scheduling runs the launched step meanwhile; other: execute - device, "
                     "launch + wait + copy back)")
        lines.append(f"{'seqs':<10}{'steps':>7}{'graph':>7}{'share':>8}" +
                     "".join(f"{c:>10}" for c in ("wall", "device", "host", "other")))
        for b in s["decode_by_batch"]:
            m = b["median_ms"]
            lines.append(f"{b['seqs']:<10}{b['steps']:>7}{b['graph_steps']:>7}"
                         f"{_f(b['share'] and 100 * b['share'], '.1f'):>7}%" +
                         "".join(f"{_f(m[c], '.3f'):>10}" for c in ("wall", "device", "host", "other")))
    return "\n".join(lines)
