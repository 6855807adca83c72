"""Load the kernels in cuda/*.cu as CuPy RawModules, each compiled once per process.

CuPy's on-disk cache keys on the code string and the options, not on the headers a source
includes; we hash the source together with every header it includes (recursively) into a comment
at the top of the code string, so an edit to common.cuh recompiles every kernel that uses it.
NVRTC compiles in a temporary directory, hence the absolute -I of cuda/.
"""

from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_modules: dict[tuple, object] = {}


def debug_enabled() -> bool:
    """MINILLM_CUDA_DEBUG=1 compiles in the device index checks (MINILLM_CHECK) and -lineinfo."""
    return env_flag("MINILLM_CUDA_DEBUG", False, "the device index checks and -lineinfo")


def extra_defines() -> tuple[str, ...]:
    """MINILLM_CUDA_DEFINES="A=1,B=2": defines added to every module, for measuring a kernel's
    compile-time variants (scripts/decode_splits.py --variant) under the tests and benchmarks."""
    return tuple(d.strip() for d in os.environ.get("MINILLM_CUDA_DEFINES", "").split(",") if d.strip())


def source_with_hash(name: str) -> tuple[str, str]:
    """(code, digest): cuda/<name>.cu prefixed by a digest of it and the headers it includes."""
    path = CUDA_DIR / f"{name}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {path}")
    h = hashlib.sha256()
    seen: set[Path] = set()

    def visit(p: Path) -> None:
        if p in seen:
            return
        seen.add(p)
        text = p.read_text()
        h.update(p.name.encode() + b"\0" + text.encode())
        for inc in _INCLUDE.findall(text):
            q = (p.parent / inc).resolve()
            if q.is_file():
                visit(q)

    visit(path)
    digest = h.hexdigest()[:16]
    return f"// minillm {name}.cu sources+headers sha256:{digest}\n" + path.read_text(), digest


def _cuda_include_dirs() -> list[str]:
    """CUDA headers (cuda_bf16.h) for NVRTC, wherever this machine keeps them."""
    dirs = []
    try:  # where CuPy itself found the toolkit (system CUDA, CUDA_PATH or the pip wheels)
        from cupy import _environment

        if _environment.get_cuda_path():
            dirs.append(os.path.join(_environment.get_cuda_path(), "include"))
    except Exception:  # noqa: BLE001 - private API; the fallbacks below still apply
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs.append("/usr/local/cuda/include")
    try:  # pip wheels of the CUDA toolkit (nvidia/cu13/include, nvidia/cuda_runtime/include)
        import nvidia  # type: ignore

        for root in nvidia.__path__:
            for sub in ("cu13/include", "cuda_runtime/include", "cuda_nvrtc/include"):
                dirs.append(os.path.join(root, sub))
    except ImportError:
        pass
    dirs = [d for d in dirs if os.path.isfile(os.path.join(d, "cuda_bf16.h"))]
    # prefer a full toolkit: some pip wheels ship mma.h without the crt/mma.h it includes
    # (cuda/prefill_attention.cu needs both)
    dirs.sort(key=lambda d: not os.path.isfile(os.path.join(d, "crt", "mma.h")))
    return dirs[:1]


def arch_option() -> str:
    """-arch for this device: sm_90a on Hopper (wgmma/setmaxnreg need the 'a' target)."""
    import cupy

    cc = cupy.cuda.Device().compute_capability  # e.g. "90"
    return f"-arch=sm_{cc}a" if cc == "90" else f"-arch=sm_{cc}"


def env_int(name: str, default: int, what: str) -> int:
    """An integer >= 0 from the environment variable `name` (default when unset), or a ValueError
    that names the variable and what it sets (the backend's launch switches, the grammar's threads)."""
    raw = os.environ.get(name, str(default))
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: give an integer >= 0 ({what})") from None
    if v < 0:
        raise ValueError(f"{name}={v}: give an integer >= 0 ({what})")
    return v


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name: str, default: bool, what: str) -> bool:
    """An on/off switch from the environment variable `name` (default when unset or empty): 1 / true / yes / on
    or 0 / false / no / off, any case; anything else a ValueError that names it ("false" once read as on)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: give 1 or 0 (true / false, yes / no and on / off work too) ({what})")


def compile_options(debug: bool, defines: tuple[str, ...] = ()) -> tuple[str, ...]:
    opts = ["-std=c++17", f"-I{CUDA_DIR}", arch_option()]
    opts += [f"-I{d}" for d in _cuda_include_dirs()]
    if debug:
        opts += ["-DMINILLM_CUDA_DEBUG=1", "-lineinfo"]
    opts += [f"-D{d}" for d in defines]
    return tuple(opts)


def load_module(name: str, debug: bool | None = None, defines: tuple[str, ...] = ()):
    """The compiled cupy.RawModule for cuda/<name>.cu (compiled on first use in this process);
    defines ("NAME=VALUE") select a kernel's compile-time shape (cuda/decode_layers.cu's)."""
    import cupy

    debug = debug_enabled() if debug is None else debug
    defines = tuple(defines) + extra_defines()
    code, digest = source_with_hash(name)
    key = (name, digest, debug, tuple(defines), cupy.cuda.Device().id)
    mod = _modules.get(key)
    if mod is None:
        mod = cupy.RawModule(code=code, options=compile_options(debug, tuple(defines)))
        mod.compile()  # compile and load now, never lazily inside a graph capture
        _modules[key] = mod
    return mod


def compile_parallel(modules: list[tuple[str, tuple[str, ...]]], device_id: int, debug: bool | None = None) -> None:
    """Compile and load these (module, defines) pairs, each on its own thread: NVRTC releases the GIL
    while it compiles, so a first start in an environment takes about its slowest module's time rather
    than the sum (cuda/ is ~58 s of nvcc on one core of the CPU machine, its largest module ~10 s; a first
    start on the H200 65 -> 15 s, part292). A module that fails
    here is left for its caller's load_module to fail again, with its own message."""
    import cupy

    def one(module: tuple[str, tuple[str, ...]]) -> None:
        cupy.cuda.runtime.setDevice(device_id)  # makes the device's context current on this thread
        load_module(module[0], debug, module[1])

    with ThreadPoolExecutor(max_workers=max(1, min(len(modules), os.cpu_count() or 1))) as pool:
        for f in [pool.submit(one, m) for m in modules]:
            f.exception()  # wait for each; an error is raised again by the caller's own load


def get_kernel(module: str, name: str, debug: bool | None = None, defines: tuple[str, ...] = ()):
    """One extern "C" entry point of cuda/<module>.cu as a cupy.RawKernel."""
    return load_module(module, debug, defines).get_function(name)
