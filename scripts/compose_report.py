"""Turn the JSON results under docs/results/ into docs/BENCHMARKS.md and its plots.

    python scripts/compose_report.py            # after copying a device run's results into docs/results

Every number in the report comes from a file in docs/results/, written by the command named beside
it (scripts/h200_report.sh on the H200; the CPU commands on the 2-core development machine).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "docs" / "results"
IMG = ROOT / "docs" / "img"

# The field report's ladder (../shared/field-report.md), for the side-by-side table.
FIELD = {
    (2048, 8): "ok, 70.08 tok/s, TPOT 108.40 ms", (4096, 8): "illegal memory access",
    (8192, 1): "ok, 24.84 tok/s", (8192, 2): "ok, 40.11 tok/s", (8192, 4): "ok, 59.13 tok/s",
    (8192, 8): "illegal memory access (31 ok, 1 failed)", (16384, 2): "ok, 42.61 tok/s",
    (16384, 4): "illegal memory access (15 ok, 1 failed)", (32768, 1): "ok, 25.13 tok/s",
    (32768, 2): "illegal memory access (1 ok, 7 failed)",
}


def load(name: str):
    p = RES / name
    return json.loads(p.read_text()) if p.exists() else None


def plots(matrix) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    IMG.mkdir(parents=True, exist_ok=True)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for point in matrix:
        rungs = point.get("ladder", {}).get("rungs", [])
        c = [r["concurrency"] for r in rungs]
        a1.plot(c, [r["output_tok_s"] for r in rungs], "o-", label=f"max-model-len {point['max_model_len']}")
        a2.plot(c, [r["tpot_ms_mean"] for r in rungs], "o-", label=f"max-model-len {point['max_model_len']}")
    for ax, y in ((a1, "output tokens/s"), (a2, "mean TPOT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    a1.legend(fontsize=8)
    fig.suptitle("Failure matrix on an H200: Qwen3-0.6B shape, DFlash k=8 (random drafter), 1024 in / 512 out")
    fig.tight_layout()
    fig.savefig(IMG / "failure_matrix.png", dpi=110)
    plt.close(fig)
    return ["img/failure_matrix.png"]


def matrix_table(matrix) -> str:
    lines = ["| max-model-len | c | c x ctx | minillm: ok / n | out tok/s | TPOT mean (ms) | TTFT mean (ms) "
             "| field report |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for point in matrix:
        mml = point["max_model_len"]
        for r in point.get("ladder", {}).get("rungs", []):
            c = r["concurrency"]
            lines.append(f"| {mml} | {c} | {mml * c:,} | {r['ok']} / {r['num_prompts']}"
                         f"{' VOID' if r['void'] else ''} | {r['output_tok_s']:.1f} | {r['tpot_ms_mean']:.2f} | "
                         f"{r['ttft_ms_mean']:.1f} | {FIELD.get((mml, c), '-')} |")
    return "\n".join(lines)


def main() -> None:
    matrix = load("h200_failure_matrix.json") or []
    images = plots(matrix)
    ok = sum(1 for p in matrix for r in p.get("ladder", {}).get("rungs", []) if not r["void"])
    total = sum(len(p.get("ladder", {}).get("rungs", [])) for p in matrix)
    template = (ROOT / "docs" / "BENCHMARKS.template.md").read_text()
    text = template.replace("{{MATRIX_TABLE}}", matrix_table(matrix))
    text = text.replace("{{MATRIX_SUMMARY}}", f"{ok} of {total} rungs finished with ok = n")
    text = text.replace("{{MATRIX_PLOT}}", "".join(f"![failure matrix]({p})\n" for p in images))
    (ROOT / "docs" / "BENCHMARKS.md").write_text(text)
    print(f"wrote docs/BENCHMARKS.md ({ok}/{total} matrix rungs ok), plots: {images}")


if __name__ == "__main__":
    main()
