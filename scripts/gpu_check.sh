#!/usr/bin/env bash
# The one script the device machine runs for the CUDA backend's checks. Logs go to $OUT.
#   scripts/gpu_check.sh                 environment facts, then every gpu test in tests/test_cuda_*.py
#   scripts/gpu_check.sh -k attention    extra pytest arguments narrow the test run
#   scripts/gpu_check.sh --bench         kernel timings (CUDA events, median of replays)
#   scripts/gpu_check.sh --sanitize      the gpu tests under compute-sanitizer memcheck + racecheck
#                                        (MEMCHECK_K / RACECHECK_K: pytest -k selections)
set -uo pipefail
OUT=${OUT:-/tmp/minillm-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
T=${GPU_CHECK_TIMEOUT:-420}

env_facts() {
  nvidia-smi
  python3 - <<'PY'
import sys, numpy, cupy
rt = cupy.cuda.runtime
p = rt.getDeviceProperties(0)
print("python", sys.version.split()[0], "| numpy", numpy.__version__, "| cupy", cupy.__version__)
print("cuda runtime", rt.runtimeGetVersion(), "| driver", rt.driverGetVersion(),
      "| nvrtc", cupy.cuda.nvrtc.getVersion())
print("device", p["name"].decode() if isinstance(p["name"], bytes) else p["name"],
      "| cc", cupy.cuda.Device().compute_capability, "| SMs", p["multiProcessorCount"],
      "| smem optin", p["sharedMemPerBlockOptin"])
PY
  nvcc --version | tail -1
}

bench() {
  timeout "$T" python3 - <<'PY'
"""Timings of the CUDA backend's kernels on this GPU: median of CUDA-event-timed repeats."""
import numpy as np, cupy as cp
from minillm.backends.cuda_ops import CudaBackend
from minillm.models.config import ModelConfig
from minillm.models.transformer import StepInputs, Transformer, Workspace

be = CudaBackend()
rng = np.random.default_rng(0)
rows = []

def timed(fn, n=30):
    for _ in range(3):
        fn()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(n):
        s.record(be.stream); fn(); e.record(be.stream); e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e3)
    return float(np.median(ts))

def graph_timed(fn, reps=20):
    """Per-call time inside a CUDA graph of `reps` back-to-back calls (no Python launch cost)."""
    g = be.capture_graph(lambda: [fn() for _ in range(reps)])
    return timed(g.replay, 10) / reps

def i32(x):
    return be.asarray(np.asarray(x, np.int32), dtype=np.int32)

def attention_case(B, q_len, ctx, H=32, KH=8, D=128, bs=16):
    nbps = -(-ctx // bs)
    kc = be.asarray(rng.standard_normal((B * nbps, bs, KH, D), dtype=np.float32))
    vc = be.asarray(rng.standard_normal((B * nbps, bs, KH, D), dtype=np.float32))
    bt = i32(rng.permutation(B * nbps).reshape(B, nbps))
    q = be.asarray(rng.standard_normal((B * q_len, H, D), dtype=np.float32))
    out = be.empty((B * q_len, H, D))
    sl, qs = i32([ctx] * B), i32(np.arange(B + 1) * q_len)
    kv_bytes = 2 * B * ctx * KH * D * 2
    flops = 4 * B * H * D * q_len * (ctx - (q_len - 1) / 2)
    return (q, kc, vc, bt, sl, qs, D ** -0.5, out), kv_bytes, flops

cases = [("decode", 1, 1, 512, 16), ("decode", 1, 1, 512, 32), ("decode", 1, 1, 32768, 32),
         ("decode", 64, 1, 2048, 32), ("decode", 256, 1, 1024, 16), ("verify k=8", 16, 9, 4096, 32),
         ("verify k=4", 16, 5, 4096, 32), ("prefill", 1, 4096, 4096, 32),
         ("chunked prefill", 1, 512, 16384, 32)]
for name, B, ql, ctx, H in cases:
    args, nbytes, flops = attention_case(B, ql, ctx, H=H)
    for kernel in (["tiled", "decode"] if ql <= 16 else ["tiled", "prefill"]):
        plan = {}
        def run():
            plan.update(be.attention(*args, kernel=kernel))
        us = graph_timed(run, 20 if ql <= 16 else 2)
        rows.append((f"attention {name} H={H} B={B} q={ql} ctx={ctx} [{kernel}, in a graph]", us,
                     f"{nbytes / us / 1e6:.2f} TB/s KV, {flops / us / 1e6:.1f} TFLOP/s, "
                     f"splits={plan.get('n_splits')} bq={plan.get('bq', 1)}"))
    del args

V = 151936
for B in (1, 64):
    logits = be.asarray(rng.standard_normal((B, V), dtype=np.float32) * 3, dtype=np.float32)
    out = be.empty((B,), dtype=np.int32)
    for label, t, p, k in [("greedy", 0.0, 1.0, 0), ("temperature", 0.8, 1.0, 0),
                           ("top-k 50", 0.8, 1.0, 50), ("top-p 0.9", 0.8, 0.9, 0),
                           ("top-k 50 + top-p 0.9", 0.8, 0.9, 50)]:
        prm = (be.asarray(np.full(B, t), dtype=np.float32), be.asarray(np.full(B, p), dtype=np.float32),
               i32(np.full(B, k)), be.asarray(np.arange(B), dtype=np.int64), i32(np.zeros(B)))
        us = timed(lambda: be.sample(logits, *prm, out))
        rows.append((f"sample {label} B={B} V={V}", us, ""))

for M, K, N in [(1, 4096, 12288), (4, 4096, 12288), (16, 4096, 12288), (256, 4096, 12288),
                (1, 1024, 4096), (1, 1024, 6144), (1, 3072, 1024), (1, 4096, 24576), (1, 12288, 4096)]:
    x = be.asarray(rng.standard_normal((M, K), dtype=np.float32))
    w = be.asarray(rng.standard_normal((N, K), dtype=np.float32))
    o = be.empty((M, N))
    us = graph_timed(lambda: be.matmul(x, w, o), 10)
    rows.append((f"matmul M={M} K={K} N={N} (in a graph)", us, f"{N * K * 2 / us / 1e6:.2f} TB/s weights"))
    del x, w, o

# one decode step of Qwen3-0.6B shapes (random weights) captured as a graph, batch 1 and 32
cfg = ModelConfig(arch="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                  num_kv_heads=8, head_dim=128, intermediate_size=3072, qk_norm=True,
                  tie_word_embeddings=True, rope_theta=1e6)
def w(*shape):
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02)
W = {"embed": w(cfg.vocab_size, 1024), "norm": 1 + w(1024)}
for i in range(cfg.num_layers):
    p = f"layers.{i}."
    W |= {p + "attn_norm": 1 + w(1024), p + "q": w(2048, 1024), p + "k": w(1024, 1024),
          p + "v": w(1024, 1024), p + "o": w(1024, 2048), p + "mlp_norm": 1 + w(1024),
          p + "gate": w(3072, 1024), p + "up": w(3072, 1024), p + "down": w(1024, 3072),
          p + "q_norm": 1 + w(128), p + "k_norm": 1 + w(128)}
model = Transformer(cfg, W, be, max_positions=1024)
del W
bs, ctx, nbps = 16, 512, 1024 // 16
kv = model.allocate_kv_cache(32 * nbps, bs)
ws = Workspace(be, cfg, 64, 64)
for B in (1, 32):
    bt = rng.permutation(32 * nbps)[: B * nbps].reshape(B, nbps)
    x = StepInputs(i32(rng.integers(0, 1000, B)), i32([ctx - 1] * B),
                   i32(bt[:, (ctx - 1) // bs] * bs + (ctx - 1) % bs), i32(bt), i32([ctx] * B),
                   i32(np.arange(B + 1)), i32(np.arange(B)))
    prm = (be.asarray(np.full(B, 0.8), dtype=np.float32), be.asarray(np.full(B, 0.9), dtype=np.float32),
           i32(np.full(B, 50)), be.asarray(np.arange(B), dtype=np.int64), i32(np.full(B, ctx)))
    toks = be.empty((B,), dtype=np.int32)
    def step():
        logits = model.forward(x, B, B, kv, ws)
        be.sample(logits, *prm, toks)
    eager = timed(step, 10)
    be.seal()
    g = be.capture_graph(step)
    us = timed(g.replay)
    be.unseal()
    rows.append((f"Qwen3-0.6B decode step B={B} ctx={ctx} (graph; eager {eager:.0f} us)", us,
                 f"{B * 1e6 / us:.0f} tok/s"))
print(be.memory_plan())
print(f"\n{'what':<62} {'us':>9}  notes")
for n, us, note in rows:
    print(f"{n:<62} {us:>9.1f}  {note}")
PY
}

case "${1:-}" in
  --bench)
    env_facts 2>&1 | tee "$OUT/env.txt"
    bench 2>&1 | tee "$OUT/bench.log" ;;
  --sanitize)
    shift
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      sel=${MEMCHECK_K:-"not long_context and not debug_build"}
      [ "$tool" = racecheck ] && sel=${RACECHECK_K:-"attention_shapes and bfloat16-16-64-4 or sampler_matches and bfloat16-normal-1000"}
      timeout "$T" compute-sanitizer --tool "$tool" --print-limit 20 \
        python3 -m pytest -q -m gpu -p no:cacheprovider -x -k "$sel" tests/test_cuda_ops.py "$@" \
        2>&1 | tail -40 | tee "$OUT/sanitize_$tool.log"
    done ;;
  *)
    env_facts 2>&1 | tee "$OUT/env.txt"
    timeout "$T" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEsP --durations=15 \
      --junitxml="$OUT/junit.xml" tests/test_cuda_*.py "$@" 2>&1 | tee "$OUT/gpu_tests.log" ;;
esac
