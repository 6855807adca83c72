"""Device time on the CUDA backend with CUDA events: captured graphs and the runner's replays.

Shared by `bench decode` and the GPU diagnostics in scripts/ (decode_splits, skinny_bench,
gemv_bench, step_kernels), which all time graph replays the same way: CUDA events on the backend
stream around each replay, warm-up replays dropped, the median reported.
"""

from __future__ import annotations

import numpy as np


def replay_us(backend, graph, per: int = 1, warmup: int = 3, reps: int = 10) -> float:
    """Median microseconds of graph.replay() over reps replays after warmup ones, divided by per
    (the calls one replay holds)."""
    cp = backend.cp
    times = []
    for i in range(warmup + reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(backend.stream)
        graph.replay()
        e.record(backend.stream)
        e.synchronize()
        if i >= warmup:
            times.append(cp.cuda.get_elapsed_time(s, e) * 1e3 / per)
    return float(np.median(times))


def graph_us(backend, fn, calls: int = 20, warmup: int = 3, reps: int = 10) -> float:
    """Microseconds a call of fn, captured `calls` times back to back in one graph (no Python
    launch cost between them)."""
    graph = backend.capture_graph(lambda: [fn() for _ in range(calls)])
    return replay_us(backend, graph, calls, warmup, reps)


def record_replays(runner, backend) -> list:
    """Bracket every graph replay of runner with CUDA events (runner.replay_timer) from now on;
    returns the list the (start, end) pairs go to (replay_ms reads it). Set runner.replay_timer =
    None to stop."""
    cp, stream = backend.cp, backend.stream
    pairs: list = []

    def timer(replay) -> None:
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        replay()
        e.record(stream)
        pairs.append((s, e))
    runner.replay_timer = timer
    return pairs


def replay_ms(backend, pairs: list) -> list[float]:
    """Milliseconds of each replay record_replays recorded (none recorded: [], on any backend)."""
    return [float(backend.cp.cuda.get_elapsed_time(s, e)) for s, e in pairs]
