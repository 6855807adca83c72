"""nvcc runs for the compile tests, started together on every core: each test then waits for its own.

One nvcc is one process on one core, and the kernel sources take minutes between them (one
decode_attention.cu ~100 s on a CI core), so run one after another they were most of CI's time
while its second core idled. The runs start when the first test asks for one, so a test's result is
still its own compile's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NvccJob:
    """One nvcc run: a .cu file (or source text written to one) and the flags beyond the common ones."""
    name: str
    src: Path | None = None
    text: str | None = None
    flags: tuple[str, ...] = ()


class NvccPool:
    """Runs every job given, on os.cpu_count() workers, from the first result asked for; close() drops
    the ones not started."""

    def __init__(self, nvcc: str, include: Path, jobs: list[NvccJob]):
        self.nvcc, self.include = nvcc, include
        self.jobs = {j.name: j for j in jobs}
        assert len(self.jobs) == len(jobs), "job names must be unique"
        self._futures: dict[str, Future] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="minillm_nvcc_")
        self._dir = Path(self._tmp.name)

    def result(self, name: str) -> tuple[list[str], subprocess.CompletedProcess]:
        """The command and outcome of job `name` (waiting for it)."""
        if self._executor is None:  # this one first (a run of one test waits for its own), then the rest
            self._executor = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))
            for n in (name, *(n for n in self.jobs if n != name)):
                self._futures[n] = self._executor.submit(self._run, self.jobs[n])
        return self._futures[name].result()

    def close(self) -> None:
        """Drop the runs not started (a failing test under -x ends the session early), wait for the
        ones running, and remove their outputs."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._tmp.cleanup()

    def _run(self, job: NvccJob) -> tuple[list[str], subprocess.CompletedProcess]:
        work = self._dir / job.name.replace(" ", "_").replace("/", "_")
        work.mkdir(parents=True, exist_ok=True)
        src = job.src
        if src is None:
            src = work / "source.cu"
            src.write_text(job.text or "")
        cmd = [self.nvcc, "-arch=sm_90a", "-std=c++17", f"-I{self.include}", "-c", str(src),
               "-o", str(work / (src.stem + ".o")), *job.flags]
        return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=900)
