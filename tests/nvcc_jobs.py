"""The test suite's nvcc runs, started in the background when collection finds a test that needs them.

One nvcc is one process on one core, and the kernel sources take minutes between them (one
decode_attention.cu ~120 s on a CI core; every compile and PTX run of the suite ~13 core-minutes).
Most of the Python tests keep one of CI's two cores busy, so the runs start as soon as the tests are
collected, at the lowest CPU priority (nice 19: they take the idle core and yield the busy one), and
conftest.py moves the tests that read them to the end of the session. Each such test names the runs
it reads with the `nvcc_jobs` mark, and only the selected tests' runs start (`pytest -k rows` compiles
rows.cu alone). A test's result is still its own run's: it waits for that run and checks its outcome.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "cuda"
SOURCES = sorted(CUDA_DIR.glob("*.cu"))
DEBUG_FLAGS = ("-DMINILLM_CUDA_DEBUG=1", "-lineinfo")

# compile-time variants that scripts/decode_splits.py measures (--variant), the release-at-exit
# build of the A/B runs (PDL_LATE=0, cuda/common.cuh), MINILLM_PDL_PREFILL's, the timeline build
# (MINILLM_TIMELINE, scripts/step_timeline.py) and the decode attention's merge batch sizes other
# than the defaults (h200_report.sh's part162 / part168 / part169 measured 4 and 16) with its merge's
# two-trip form (DEC_MERGE_ONE_TRIP=0), its keys after the PDL wait (DEC_KV_PREWAIT=0), its phase
# stamps (DEC_TL_PHASES), its pre-wait loads in three dependent trips (DEC_INDEX_GUESS=0) and its head-a-CTA form on
# 512 threads (DEC_KVD_THREADS), the two-tile skinny
# GEMM's unpipelined loop (part174's A/B), the folded products' register bounds (GEMV_*NORM_MIN_BLOCKS) and the
# sampler without its top-p gather (SAMPLE_TOPP_GATHER=0), its wide build (SAMPLE_THREADS=1024,
# MINILLM_SAMPLE_WIDE_ROWS and MINILLM_VERIFY_WIDE_ROWS) and its top-k rows' argmax in a pass of its own
# (SAMPLE_FUSED_ARGMAX=0, both widths), so they do not rot
VARIANTS = [("decode_attention", ["-DDEC_NO_MATH=1", "-DDEC_MERGE_FLIGHT=4", "-DMINILLM_TIMELINE=1",
                                  "-DDEC_TL_PHASES=1", "-DDEC_INDEX_GUESS=0", "-DDEC_KVD_THREADS=512",
                                  "-DDEC_KVD_U=8", "-DDEC_KVD_MIN_BLOCKS=1"]),
            ("decode_attention", ["-DDEC_CPL=2", "-DDEC_U=2", "-DPDL_PREWAIT_INDEX=0", "-DDEC_MERGE_FLIGHT=16",
                                  "-DDEC_MERGE_FLIGHT_ROPE=4", "-DDEC_MERGE_ONE_TRIP=0", "-DDEC_KV_PREWAIT=0"]),
            ("gemv", ["-DPDL_LATE=0", "-DGEMV_PREFETCH_MAX=0", "-DGEMV_MAX_M=8", "-DSKINNY2_PIPELINED=0",
                      "-DGEMV_NORM_MIN_BLOCKS=5", "-DGEMV_GATED_NORM_MIN_BLOCKS=8"]),
            ("gemv", ["-DSKINNY2_PREWAIT=0"]),
            ("norm", ["-DNORM_EARLY_MIN_ROWS=1000000"]), ("norm", ["-DMINILLM_TIMELINE=1"]),
            ("prefill_attention", ["-DPF_PDL=1"]),
            ("prefill_attention", ["-DPF_PDL=1", "-DPDL_PREWAIT_INDEX=0"]),
            ("sampling", ["-DSAMPLE_TOPP_GATHER=0"]),
            ("sampling", ["-DSAMPLE_THREADS=1024"]),
            ("sampling", ["-DSAMPLE_FUSED_ARGMAX=0"]),
            ("sampling", ["-DSAMPLE_FUSED_ARGMAX=0", "-DSAMPLE_THREADS=1024"])]

# GPU diagnostics in scripts/ that carry their own kernel source (device runs only; compiled here so
# a broken one fails CI rather than a device call): script -> the variable holding it
INLINE_SOURCES = {"handoff_bench": "SRC", "preload_bench": "SRC", "stream_bench": "READ_SRC"}

# the PDL load lint's builds (scripts/pdl_load_lint.py, tests/test_pdl_loads.py): name -> (defines,
# modules); "stale" is session 41's folded norms as they were, which the lint must catch
LINT_BUILDS = {"default": ((), None), "stale": (("NORM_ROW_L2=0",), ("gemv",))}


def pdl_load_lint():
    """scripts/pdl_load_lint.py, a script beside the tests."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import pdl_load_lint as lint

    return lint


def inline_source(script: str) -> str:
    """The kernel source a script in scripts/ carries (INLINE_SOURCES names its variable)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_inline_{script}", ROOT / "scripts" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, INLINE_SOURCES[script])


@dataclass(frozen=True)
class NvccJob:
    """One nvcc run: a .cu file (or source text written to one) and the flags beyond the common ones.
    mode: "c" an object file, "ptx" PTX, "E" the preprocessed source (its stdout)."""
    name: str
    src: Path | None = None
    text: str | None = None
    flags: tuple[str, ...] = ()
    mode: str = "c"


def compile_name(src: Path, debug: bool) -> str:
    """The job compiling one source in release or debug form."""
    return f"{src.stem} {'debug' if debug else 'release'}"


def variant_name(name: str, defines: list[str]) -> str:
    """The job compiling a source with VARIANTS' defines."""
    return f"{name} {' '.join(defines)}"


def lint_jobs(build: str) -> list[NvccJob]:
    """The PTX and preprocessed-source runs of one LINT_BUILDS build, module by module."""
    lint = pdl_load_lint()
    defines, modules = LINT_BUILDS[build]
    return [NvccJob(f"lint {build} {mod} {mode}", src=CUDA_DIR / f"{mod}.cu",
                    flags=tuple(lint.module_flags(mod, defines)), mode=mode)
            for mod in modules or lint.PDL_MODULES for mode in ("ptx", "E")]


def lint_names(build: str) -> list[str]:
    """lint_jobs' names: each module's PTX run, then its preprocessed source's."""
    return [job.name for job in lint_jobs(build)]


# the decode attention as the backend builds it, one module per (storage type, head dim) (cuda_ops._decode_defines):
# the PTX of the bf16, head-dim-128 module (Qwen3's) against the kernels the backend asks it for
DECODE_GROUP_JOB = NvccJob("decode_attention bf16 d128 ptx", src=CUDA_DIR / "decode_attention.cu",
                           flags=("-DDEC_ONLY_T=1", "-DDEC_ONLY_D=128"), mode="ptx")


def suite_jobs() -> list[NvccJob]:
    """Every nvcc run the tests read: each source in release and debug form, the VARIANTS, the scripts'
    kernels, the lint's PTX and preprocessed source of each PDL module in each LINT_BUILDS build, and one
    decode attention module as the backend builds it."""
    jobs = [NvccJob(compile_name(src, debug), src=src, flags=DEBUG_FLAGS if debug else ()) for src in SOURCES
            for debug in (False, True)]
    jobs += [NvccJob(variant_name(name, defines), src=CUDA_DIR / f"{name}.cu", flags=tuple(defines))
             for name, defines in VARIANTS]
    jobs += [NvccJob(f"script {script}", text=inline_source(script)) for script in sorted(INLINE_SOURCES)]
    jobs += [job for build in LINT_BUILDS for job in lint_jobs(build)]
    jobs.append(DECODE_GROUP_JOB)
    return jobs


class NvccPool:
    """Runs the jobs asked for on all cores but one at nice 19, from start() (every job, if
    result() comes first); close() drops the ones not started and stops the ones running."""

    def __init__(self, nvcc: str, jobs: list[NvccJob], include: Path = CUDA_DIR):
        self.nvcc, self.include = nvcc, include
        # the longest runs first (whole compiles of the largest sources), so the last to end is short
        order = {"c": 0, "ptx": 1, "E": 2}
        jobs = sorted(jobs, key=lambda j: (order[j.mode], 0 if j.src is None else -j.src.stat().st_size))
        self.jobs = {j.name: j for j in jobs}
        assert len(self.jobs) == len(jobs), "job names must be unique"
        self._futures: dict[str, Future] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        self._closed = False
        self._tmp = tempfile.TemporaryDirectory(prefix="minillm_nvcc_")
        self._dir = Path(self._tmp.name)

    def start(self, names: list[str] | None = None) -> None:
        """Submit the jobs named (every job: None), the longest first, unless already started."""
        if self._executor is not None:
            return
        # all cores but one: the Python tests keep a core of their own (a timing-bound test failed once
        # with both of CI's two cores compiling beside it)
        self._executor = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 1) - 1))
        wanted = set(self.jobs if names is None else names)
        for n in self.jobs:
            if n in wanted:
                self._futures[n] = self._executor.submit(self._run, self.jobs[n])

    def result(self, name: str) -> tuple[list[str], subprocess.CompletedProcess]:
        """The command and outcome of job `name` (waiting for it)."""
        self.start()
        assert name in self._futures, f"nvcc job {name!r} was not started: name it in the test's nvcc_jobs mark"
        return self._futures[name].result()

    def output(self, name: str) -> str:
        """The PTX (mode "ptx") or preprocessed source (mode "E") of job `name`; a failed run raises."""
        cmd, r = self.result(name)
        if r.returncode:
            raise AssertionError(f"{' '.join(cmd)}\n{r.stderr}")
        return r.stdout if self.jobs[name].mode == "E" else self._out(self.jobs[name]).read_text()

    def close(self) -> None:
        """Drop the runs not started (a failing test under -x ends the session early), stop the ones
        running, and remove their outputs."""
        with self._lock:
            self._closed = True
            for p in self._running:
                _kill_group(p)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._tmp.cleanup()

    def _out(self, job: NvccJob) -> Path:
        work = self._dir / job.name.replace(" ", "_").replace("/", "_")
        src = job.src or work / "source.cu"
        return work / (src.stem + {"c": ".o", "ptx": ".ptx"}[job.mode])

    def _run(self, job: NvccJob) -> tuple[list[str], subprocess.CompletedProcess]:
        work = self._dir / job.name.replace(" ", "_").replace("/", "_")
        work.mkdir(parents=True, exist_ok=True)
        src = job.src
        if src is None:
            src = work / "source.cu"
            src.write_text(job.text or "")
        cmd = [self.nvcc, "-arch=sm_90a", "-std=c++17", f"-I{self.include}", *job.flags]
        cmd += ["-E", str(src)] if job.mode == "E" else \
            ["-ptx" if job.mode == "ptx" else "-c", str(src), "-o", str(self._out(job))]
        with self._lock:
            if self._closed:
                return cmd, subprocess.CompletedProcess(cmd, -9, "", "the pool was closed")
            # nice(1), not preexec_fn (unsafe beside threads): nvcc's cicc and ptxas inherit it; a session
            # of its own, so close() stops them with nvcc
            p = subprocess.Popen([*self._nice, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            self._running.add(p)
        try:
            out, err = p.communicate(timeout=1800)  # at nice 19 a run may wait for a busy core
        except subprocess.TimeoutExpired:
            _kill_group(p)
            out, err = p.communicate()
            err += "\n(nvcc ran past 1800 s and was killed)"
        with self._lock:
            self._running.discard(p)
        return cmd, subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _kill_group(p: subprocess.Popen) -> None:
    """Stop nvcc and the compilers it started (its process group)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
