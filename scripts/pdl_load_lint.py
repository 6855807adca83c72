"""Which kernel parameters does each PDL kernel read through the read-only path? (no GPU needed)

    python scripts/pdl_load_lint.py [--define NAME=VALUE ...]

A kernel that graphs launch with PDL runs beside the kernel before it, which may still be writing
its input; a load of such data through the read-only path (`ld.global.nc`: `__ldg`, or a plain load
of a `const __restrict__` pointer) may return a stale line (session 41: the folded norms' x, greedy
runs on graphs that did not repeat; docs/DEVELOPING.md). This compiles the PDL modules to PTX with
nvcc, follows each `ld.global.nc` address back to the kernel parameter it derives from (through
cvta, add, sub, mov, selp and mad.wide), and prints, per kernel, the parameters read that way. The
exit status is 1 when one is not in READ_ONLY (data that no kernel writes while the engine runs:
weights, and step inputs the host uploads before a step), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"
# the modules whose kernels graphs launch with PDL (cuda_ops.py _PDL_MODULES, and the tensor-core
# attention built with PF_PDL)
PDL_MODULES = {"rows": (), "norm": (), "elementwise": (), "decode_attention": (), "sampling": (), "gemv": (),
               "prefill_attention": ("PF_PDL=1",)}
# parameters a kernel may read through the read-only path: weights (constant for the engine's life)
# and step inputs the host uploads before each step (between launches, which end the path's lines'
# life). A struct parameter's field is NAME+OFFSET (NormArgs na: res +0, w +8, res_out +16).
READ_ONLY = {
    "w", "bias", "q_w", "k_w", "nw", "cos_sin", "na+8",  # weights (nw: a folded norm's)
    "positions", "slots", "seq_lens", "query_start", "block_tables", "order", "src_rows", "idx",
    "temperature", "top_p", "top_k", "min_p", "seeds", "draft", "q_rows", "row", "drafts", "base",  # step inputs
    "limit",
}
# the fused decode step (paged_decode_rope_*) reads only cache rows older than its launch
# (and fill_bias_*'s b is the bias)
READ_ONLY_IN = {"paged_decode_rope_": {"kc", "vc"}, "fill_bias_": {"b"}}

_ENTRY = re.compile(r"\.visible \.entry (\w+)\(")
_PARAM = re.compile(r"\[(\w+)_param_(\d+)(?:\+(\d+))?\]")
_DEF = re.compile(r"^\s*(?:@%p\d+\s+)?([a-z][\w.]*)\s+(%rd\d+),\s*(.*?);")
_NC = re.compile(r"ld\.global\.nc[\w.]*\s+[^\[]*\[(%rd\d+)")


def param_names(source: str, kernel: str) -> list[str]:
    """The parameter names of an extern "C" kernel in preprocessed source."""
    m = re.search(r"\b" + kernel + r"\s*\(", source)
    if m is None:
        return []
    depth, i = 1, m.end()
    while depth and i < len(source):
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
    pieces, depth, cur = [], 0, ""
    for ch in source[m.end() : i - 1]:
        if ch == "," and depth == 0:
            pieces.append(cur)
            cur = ""
            continue
        depth += {"(": 1, ")": -1, "<": 1, ">": -1}.get(ch, 0)
        cur += ch
    pieces.append(cur)
    return [re.findall(r"\w+", p)[-1] for p in pieces if re.findall(r"\w+", p)]


def nc_params(ptx: str, source: str) -> dict[str, set[str]]:
    """Per kernel, the parameters (or struct fields) its ld.global.nc addresses derive from; an
    address the walk cannot place counts as '?'."""
    out: dict[str, set[str]] = {}
    for block in re.split(r"(?=\.visible \.entry )", ptx)[1:]:
        kernel = _ENTRY.match(block).group(1)
        names = param_names(source, kernel)
        prov: dict[str, set[str]] = {}
        defs: list[tuple[str, str, str]] = []
        for line in block.splitlines():
            d = _DEF.match(line)
            if d:
                defs.append(d.groups())
        changed = True
        while changed:  # flow-insensitive: a register's sources are every definition's
            changed = False
            for op, dst, args in defs:
                src: set[str] = set()
                if op.startswith("ld.param"):
                    p = _PARAM.search(args)
                    if p:
                        name = names[int(p.group(2))] if int(p.group(2)) < len(names) else f"param_{p.group(2)}"
                        src = {f"{name}+{p.group(3)}" if p.group(3) else name}
                elif op.startswith(("cvta", "mov", "add", "sub", "selp", "mad.wide")):
                    regs = re.findall(r"%rd\d+", args)
                    if op.startswith("mad.wide"):
                        regs = regs[-1:]  # d = a * b + c: the base is c
                    for r in regs:
                        src |= prov.get(r, set())
                if not src <= prov.get(dst, set()):
                    prov.setdefault(dst, set()).update(src)
                    changed = True
        found = set()
        for m in _NC.finditer(block):
            found |= prov.get(m.group(1)) or {"?"}
        if found:
            out[kernel] = found
    return out


def violations(found: dict[str, set[str]]) -> dict[str, set[str]]:
    bad = {}
    for kernel, params in found.items():
        allowed = READ_ONLY | set().union(*(v for k, v in READ_ONLY_IN.items() if kernel.startswith(k)))
        extra = params - allowed
        if extra:
            bad[kernel] = extra
    return bad


def module_flags(mod: str, defines: tuple[str, ...] = ()) -> list[str]:
    """The -D flags of a PDL module's build (its own defines, then `defines`)."""
    return [f"-D{d}" for d in (*PDL_MODULES[mod], *defines)]


def lint_outputs(outputs: list[tuple[str, str]]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(every kernel's read-only-path parameters, the ones outside READ_ONLY), from each module's
    (PTX, preprocessed source)."""
    found: dict[str, set[str]] = {}
    for ptx, source in outputs:
        found.update(nc_params(ptx, source))
    return found, violations(found)


def lint(defines: tuple[str, ...] = (), modules: tuple[str, ...] = tuple(PDL_MODULES)
         ) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """lint_outputs over the modules, built with nvcc here (every module's runs on every core)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH")

    def run(cmd: list[str]) -> str:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr}")
        return r.stdout

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = []  # each module's PTX file, its nvcc run and its preprocessed source's
        for mod in modules:
            flags = ["-arch=sm_90a", "-std=c++17", f"-I{CUDA_DIR}", *module_flags(mod, defines)]
            src, ptx = CUDA_DIR / f"{mod}.cu", Path(tmp) / f"{mod}.ptx"
            runs.append((ptx, pool.submit(run, [nvcc, *flags, "-ptx", str(src), "-o", str(ptx)]),
                         pool.submit(run, [nvcc, *flags, "-E", str(src)])))
        outputs = []
        for ptx, ptx_run, source_run in runs:
            ptx_run.result()
            outputs.append((ptx.read_text(), source_run.result()))
    return lint_outputs(outputs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--define", action="append", default=[], help="NAME=VALUE, added to every module")
    ns = p.parse_args(argv)
    if any("=" not in d for d in ns.define):
        p.error("--define takes NAME=VALUE")
    found, bad = lint(tuple(ns.define))
    for kernel in sorted(found):
        mark = "  <- not read-only: " + ", ".join(sorted(bad[kernel])) if kernel in bad else ""
        print(f"{kernel}: {', '.join(sorted(found[kernel]))}{mark}")
    print(f"{len(found)} kernels read through the read-only path; {len(bad)} read something another kernel writes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
