"""Where the one-kernel decoder's time goes (cuda/decode_layers.cu), from its barrier timestamps.

    PYTHONPATH=. python scripts/decode_layers_profile.py MODEL [--ctx 512] [--variant slots=4 ...]

Decodes a few tokens of one `ctx`-token request, then launches the kernel alone on that step's
inputs (it rewrites the same K/V row) with the profile buffer on: every CTA's thread 0 records
%globaltimer when its CTA arrives at each grid barrier and when it is released. Per stage (median
over layers):
  - stage: the critical path, last CTA's arrival minus the previous barrier's last release;
  - skew: last arrival minus the median arrival (load imbalance or a slow SM);
  - barrier: last release minus last arrival (the cost of the barrier itself);
  - then thread 0's clock inside a GEMV stage (median CTA): pre (the barrier and x's load), x (x to
    bf16), wait (for weight tiles to land), tiles (all of them, waits included), out (epilogue).
Kernel time (CUDA events, median of 20 launches) for the default build and each --variant
(compile-time defines of the kernel, e.g. DL_ATT_PRE=1; slots=N: the weight ring in N slots sharing
the same shared memory; ringkb=K: a ring of K KiB, leaving the rest of the SM to the L1 cache).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STAGES = ("norm+qkv", "attention", "o", "norm+gate_up", "down")
PHASES = ("pre", "x", "wait", "tiles", "out")  # DL_PH_* in cuda/decode_layers.cu: thread 0's clock


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--variant", action="append", default=[], help="NAME=VALUE[,NAME=VALUE]")
    a = p.parse_args()
    os.environ["MINILLM_FUSED_DECODE"] = "1"  # the backend builds the plan only when asked

    from minillm.args import EngineArgs
    from minillm.backends import compile as kc
    from minillm.engine.engine import LLMEngine
    from minillm.sampling_params import SamplingParams

    engine = LLMEngine(EngineArgs(model=a.model, device="cuda", max_num_seqs=1, max_model_len=a.ctx + 64,
                                  enable_prefix_caching=False))
    be, runner = engine.backend, engine.runner
    model, plan = runner.model, runner.model.decoder
    if plan is None:
        sys.exit("this model/backend has no one-kernel decoder (see CudaBackend.decoder_plan)")
    rng = np.random.default_rng(0)
    vocab = min(engine.config.vocab_size, engine.tokenizer.vocab_size)
    engine.add_request(rng.integers(0, vocab, a.ctx).tolist(),
                       SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), request_id="0")
    for _ in range(8):
        engine.step()
    be.synchronize()
    cp = be.cp
    d = runner.buf.dev
    k_cache, v_cache = runner.kv
    L = len(model.layers)
    be.arena.unseal()  # a diagnostic buffer the engine does not plan for
    nb = 5 * L - 1  # barriers a launch: barrier b ends stage b % 5 (the first layer needs no 0th)
    plan.prof = cp.zeros(nb * be.num_sms * 2 + be.num_sms * 4 * len(PHASES), dtype=np.uint64)
    be.arena.seal()
    default_kernel = be.k[plan.name]

    def launch() -> None:
        be.decode_layers(plan, runner.ws.residual[:1], runner.ws.hidden[:1], k_cache, v_cache, d["positions"][:1],
                         d["slot_mapping"][:1], d["block_tables"][:1], d["seq_lens"][:1])

    cfg = model.cfg
    print(f"{a.model}: {L} layers, hidden {cfg.hidden_size}, ctx {a.ctx}, {be.num_sms} CTAs x (480 + 32) threads, "
          f"{plan.smem // 1024} KiB shared memory")
    from minillm.backends.cuda_ops import _dl_ring_shape

    default_ring, default_smem = (plan.n_slots, plan.slot_bytes), plan.smem
    per_sm = int(be.props.get("sharedMemPerMultiprocessor", 0) or 0)
    ring_free = plan.n_slots * plan.slot_bytes + 1023  # what the default ring may use
    max_k = max(cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size)
    for variant in [""] + a.variant:
        parts = [x for x in variant.split(",") if x]
        knobs = {x.split("=")[0]: int(x.split("=")[1]) for x in parts if x.split("=")[0] in ("slots", "ringkb")}
        defines = tuple(x for x in parts if x.split("=")[0] not in knobs)
        free = knobs["ringkb"] * 1024 if "ringkb" in knobs else ring_free
        plan.n_slots, plan.slot_bytes = (_dl_ring_shape(free, max_k, knobs.get("slots"))
                                         if knobs else default_ring)
        # a smaller ring leaves more of the SM's 256 KiB to the L1 cache (at least half stays shared
        # memory, so one CTA an SM)
        plan.smem = max(default_smem - default_ring[0] * default_ring[1] + plan.n_slots * plan.slot_bytes,
                        per_sm // 2 + 1024)
        if defines:
            D, G = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
            kern = kc.get_kernel("decode_layers", "decode_layers", be.debug,
                                 (f"DL_D={D}", f"DL_G={G}") + defines)
            kern.max_dynamic_shared_size_bytes = plan.smem
            be.k[plan.name] = kern
        else:
            be.k[plan.name] = default_kernel
        times = []
        for i in range(23):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record(be.stream)
            launch()
            e.record(be.stream)
            e.synchronize()
            if i >= 3:
                times.append(cp.cuda.get_elapsed_time(s, e) * 1e3)
        raw = be.to_host(plan.prof).astype(np.int64)  # the last launch: barrier timestamps, phase clocks
        t = raw[:nb * be.num_sms * 2].reshape(nb, be.num_sms, 2)
        phases = raw[nb * be.num_sms * 2:].reshape(be.num_sms, 4, len(PHASES)) / 1e3 / L  # us a layer
        arrive, release = t[:, :, 0], t[:, :, 1]
        last_arrive, last_release = arrive.max(1), release.max(1)
        b = np.arange(1, nb)  # stage b: from barrier b - 1's last release to barrier b's last arrival
        stage_b = (last_arrive[1:] - last_release[:-1]) / 1e3
        skew_b = (last_arrive - np.median(arrive, 1)) / 1e3
        barrier_b = (last_release - last_arrive) / 1e3
        stage = [np.median(stage_b[b % 5 == j]) for j in range(5)]
        skew = [np.median(skew_b[np.arange(nb) % 5 == j]) for j in range(5)]
        barrier = [np.median(barrier_b[np.arange(nb) % 5 == j]) for j in range(5)]
        total = (last_release[-1] - arrive.min()) / 1e3
        print(f"\n[{variant or 'default'}] kernel {np.median(times):.1f} us (events, median of 20); "
              f"first arrival to last release {total:.1f} us, {total / L:.2f} us a layer")
        ph = np.median(phases, 0)  # [qkv, o, gate_up, down][phase], median CTA
        ph = np.insert(ph, 1, 0.0, axis=0)  # no GEMV in the attention stage
        print(f"{'stage':14s} {'stage us':>9s} {'skew us':>8s} {'barrier us':>11s} |"
              + "".join(f" {x:>8s}" for x in PHASES))
        for j, name in enumerate(STAGES):
            print(f"{name:14s} {stage[j]:9.2f} {skew[j]:8.2f} {barrier[j]:11.2f} |"
                  + "".join(f" {x:8.2f}" for x in ph[j]))
        print(f"{'sum':14s} {sum(stage):9.2f} {sum(skew):8.2f} {sum(barrier):11.2f} |"
              + "".join(f" {x:8.2f}" for x in ph.sum(0)))
        j = int(np.argmax(skew))  # the most skewed stage: which CTAs arrive late
        late = (arrive - np.median(arrive, 1, keepdims=True))[np.arange(nb) % 5 == j] / 1e3
        worst = np.argsort(-np.median(late, 0))[:8]
        print(f"latest CTAs at the end of '{STAGES[j]}' (median us after the median CTA): "
              + ", ".join(f"{c}: {np.median(late[:, c]):.2f}" for c in worst))
    be.k[plan.name] = default_kernel
    plan.prof = None


if __name__ == "__main__":
    main()
