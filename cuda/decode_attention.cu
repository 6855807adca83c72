// decode_attention.cu: paged attention for decode steps (and speculative-verification runs over
// long contexts), another twin of NumpyBackend.paged_attention (any ragged query lengths, causal or
// not; the backend picks it when a step's queries per sequence are few, attention.cu's tiled kernel
// otherwise).
//
// One CTA per (query token, KV head, split): the G query heads that share the KV head live in
// registers, and every K/V row of the split is read once with 16-byte loads. A row is spread
// over LPK = D / (16 / sizeof(T)) lanes (16 for bf16 head_dim 128; DEC_CPL=2 halves it), so a CTA
// of 128 threads has NG = 128 / LPK key groups; each group walks its keys U at a time (all U
// loads issued before any is used, for memory-level parallelism) with its own online softmax in
// base 2, rescaled once per U keys, and the groups are merged through shared memory at the end.
// The kernel is bound by its instructions more than its loads (session 8: the loads alone read
// 3.9-4.1 TB/s), so the per-key work is what to keep small.
// At batch 1 (512 keys: 8 KV heads x 8 splits of 64 keys) it is a chain of dependent latencies
// instead; session 15 measured there, in one step's graph (docs/results/h200_pdl_late_session15.txt,
// h200_early_kv_part109.txt), and kept none: DEC_U=8 or 2, DEC_CPL=2 (0.6B +2-3%, 8B +1-3%), the
// split's old keys prefetched into L2 before the PDL wait (0.6B +4.5%), the first keys' loads
// issued before the fused q/k norm + RoPE (0.6B +2%, 8B +-0.1%; 16 bytes of spills at 80 registers).
// Session 16 (docs/results/h200_session16_ab.txt): finding the CTA's work before the PDL wait
// (PDL_PREWAIT_INDEX) took 8B's graph 4.534 -> 4.501 ms, 0.6B unchanged; kept. Warps with a second
// head (8B's fresh CTA: k, v) prefetching its row into L1 before the first pass: no change; removed.
// Session 23 (part158, docs/results/h200_session23_ab.txt): at batch 1, the split's first 64 cached
// keys copied into shared memory (cp.async) before the PDL wait, with the qkv GEMV releasing this
// grid right after its own wait so the copies overlap its weight stream: the copies alone changed
// nothing (0.6B 0.881-0.887 against 0.883-0.891 ms, 8B 4.409-4.419 against 4.416-4.422), the early
// release made both graphs slower (0.6B 0.98, 8B 4.48 ms; 0.967 / 4.49 with the copies); removed.
// The same session timed a batch-1 graph's kernels from inside (scripts/step_timeline.py, part160):
// this kernel works 4.7 (0.6B) / 5.2 us (8B) from its wait to its release, and the o product's wait
// returns 4.9 / 7.1 us after that release, against ~1 us after the other kernels' releases: the
// merge below (partials, fence, atomic, the last CTA's dependent L2 reads) is most of the kernel.
// Merging a token's splits in clusters of 8 CTAs through distributed shared memory instead (no
// global partials, fences or atomics; part161, 652e735) was slower: batch-1 graphs 0.6B 0.890 ->
// 0.903 ms, 8B 4.428 -> 4.509; batch 4 1.022 -> 1.069, 4.741 -> 4.977; removed.
// Session 24 (part162, docs/results/h200_session24_ab.txt): the merge's loads batched (each lane's
// (m, l) once, the partials of 8 splits x a thread's elements before any add; the sums and their
// order unchanged) against one split's partials per element at a time: batch-1 graphs 0.6B 0.885
// -> 0.866-0.873 ms, 8B 4.363 -> 4.313-4.323, batch 4 1.025 -> 1.013, 4.694 -> 4.656, the DFlash
// c = 1 round 6.214 -> 6.101; the o product's wait 4.86 -> 4.10 us (0.6B), 7.07 -> 5.55 (8B); kept.
// On top of it, the first 8 splits' partials loaded with the (m, l) pairs and one thread arriving
// with an acq_rel atom instead of a fence in every thread (part164, 84819a2): 0.6B 0.865 -> 0.862,
// 8B 4.355 -> 4.367, the c = 1 round 6.192 -> 6.220; removed. The timeline build stamps this
// kernel's arrival and merge end (scripts/step_timeline.py splits the o product's wait by them).
// Session 25 (docs/results/h200_session25_ab.txt): each batch's weights read as float4s into
// registers and the adds as selects (part167): 0.6B 0.865 -> 0.847 ms, 8B 4.309 -> 4.260; the
// c = 1 round 6.181 -> 6.150 (part169); kept. fence.acq_rel.gpu for __threadfence: no change; with
// it and the first partials loaded before the weights pass, 8B kept only 4.309 -> 4.304 and the
// round went 6.102 -> 6.115; both removed. 16 splits in flight (DEC_MERGE_FLIGHT=16) with the
// fused step's slot / position loads issued before the PDL wait on top (part169): 0.6B -0.77%, 8B
// -0.11%, the c = 1 round +0.30%; the same with 16 for the fused step's kernel alone
// (DEC_MERGE_FLIGHT_ROPE; the round, whose graphs run only the other kernel, keeps 8; part171): 0.6B
// 0.8495 -> 0.8401 ms (-1.1%), 8B 4.273 -> 4.260 (one run each, -0.3%); kept, both.
// Session 43 (part254 / part255): splits of at least 32 keys instead of 64 at batch 1 (17 active
// splits at 512 keys, not 9): 0.6B (G = 2) -1.6% / -2.9%, 8B (G = 4) +0.5% / +0.4%; the host takes
// 32 for one-row steps of G <= 2 only (cuda_ops.decode_min_part). 16 and 48 were slower on both.
//
// Splits (flash-decoding): split s takes keys [s * part, (s + 1) * part) of this token's own
// context, part = max(min_part, ceil(len / n_splits)) rounded to 16, so a short context in a
// long-context bucket uses few splits and the rest exit at once (a context that fits one part
// is written by its one CTA directly). Each active split writes an unnormalised partial; the
// last of a (token, KV head) to finish (an atomic counter, which that CTA resets to 0 for the
// next step) merges them, so no second kernel is launched. The fused step's kernel given defer_max
// > 0 (a one-row step whose o product is gemv.cu's gemv1_merge_*) instead leaves a row of at most
// defer_max active splits unmerged, even a row of one split: that product merges the partials
// itself, with the same arithmetic (common.cuh's split helpers).
// Tokens of sequences with more than max_nq new queries, and short runs that
// minillm::short_run_on_tensor_cores gives it (short_max_ctx), are left to prefill_attention.cu: the
// kernel is chosen per sequence, not per batch, so a token's attention is computed the same way
// whatever else shares its step (batch invariance; speculative decoding relies on it in bf16).
// Grid sizes depend only on the bucket shape; where each CTA works comes from device buffers,
// so a captured graph replays for any batch.
// paged_decode_rope_* is the same kernel for a decode step (one new token a sequence) that also
// does norm.cu's qk_norm_rope_store_kv: the twin of NumpyBackend.decode_step_attention, one launch
// a layer fewer (the backend uses it for steps of at most MINILLM_DECODE_ROPE_MAX rows).
#include "common.cuh"

#define DEC_THREADS 128
#ifndef DEC_U  // keys per key group in flight (scripts/decode_splits.py --variant DEC_U=8 times others)
#define DEC_U 4
#endif
// CTAs per SM the register allocation must allow (__launch_bounds__), for G <= 2, G <= 4 and
// larger G. Measured on the H200 (scripts/decode_splits.py): with G = 2 the kernel took 96
// registers, 5 CTAs an SM; capped at 80 for 6 CTAs it read KV 9-11% faster at batch 192-256
// (3.42 -> 3.85 TB/s). With G = 4 the 80 cap spills (1.7x slower), but 128 (4 CTAs, not the 3 of
// its 158 registers) read 8B's B = 64 x 2,048 keys 16% faster (220 -> 184 us, part54); G = 8
// spills at 128 and keeps the default.
#ifndef DEC_MIN_BLOCKS_SMALL_G
#define DEC_MIN_BLOCKS_SMALL_G 6
#endif
#ifndef DEC_MIN_BLOCKS_MID_G
#define DEC_MIN_BLOCKS_MID_G 4
#endif
#ifndef DEC_MIN_BLOCKS
#define DEC_MIN_BLOCKS 1
#endif
#ifndef DEC_NO_MATH  // scripts/decode_splits.py --variant DEC_NO_MATH=1: loads without the math
#define DEC_NO_MATH 0
#endif
#ifndef DEC_MERGE_FLIGHT  // the last split's merge: splits whose partials are loaded at once
#define DEC_MERGE_FLIGHT 8
#endif
// Keys and values: the fused decode step (ROPE) reads only cache rows older than its launch (it adds
// the newest key from shared memory), so the read-only path's contract holds and it keeps __ldg.
// Elsewhere (verification, short runs, steps past MINILLM_DECODE_ROPE_MAX rows) the q/k norm kernel
// just before stored this step's rows, under PDL while this kernel already lived: they come through
// load_act (common.cuh), as the read-only path had them before session 41 with KV_LOADS_NC=1 (A/B).
// Not measured on the H200 yet. A line the read-only path kept from an earlier graph replay does not
// seem to outlive the next launch: every kernel reads the step inputs (positions, slots, seq_lens,
// block tables) through it at the same addresses each step, rewritten by the host in between, and
// graph runs of the same step repeat (part247 with the fold off); so the fused step's older keys,
// rewritten only between launches (a rejected draft's slot, a reused block), keep __ldg.
#ifndef KV_LOADS_NC
#define KV_LOADS_NC 0
#endif
#ifndef DEC_MERGE_FLIGHT_ROPE  // the same for the fused decode step (paged_decode_rope_*): a batch-1
#define DEC_MERGE_FLIGHT_ROPE 16  // step near 512 keys has 9 active splits (part171); verification keeps 8
#endif
// The last split's merge in one L2 round trip for one query head a CTA (G = 1: the one-row step's
// head-a-CTA kernel, paged_decode_rope_kvd_*): every warp loads the head's (m, l) pairs together with
// its threads' partials of up to 32 splits and computes the split weights itself, where the default
// has warp 0 load the pairs, weigh them into shared memory and a barrier before any partial is asked
// for (and a second round of loads past DEC_MERGE_FLIGHT_ROPE splits: a batch-1 step at 512 keys has
// 17). The same weights (split_weights), the same adds in the same order: the same bits. Session 48
// (part275, batch-1 graphs at 512 keys alternated twice, docs/results/h200_session48_ab.txt): 0.6B
// 0.7652 -> 0.7563 ms (-1.16%), 8B 4.2492 -> 4.2308 (-0.43%); the merge 1.82 -> 1.41 us (0.6B), 2.02 ->
// 1.58 (8B) in the timelines; its op tests 30 passed. The default since.
#ifndef DEC_MERGE_ONE_TRIP
#define DEC_MERGE_ONE_TRIP 1
#endif
// The head-a-CTA kernel (KV_DIV) loads its first DEC_U keys a key group (the split's first NG x DEC_U
// cached keys) into registers before its PDL wait, where the default asks for them only after the
// wait, the q row's load and the q norm + RoPE: those keys are rows older than the launch (the newest
// key comes from shared memory), read-only for the kernel's life (KV_LOADS_NC above), and the
// previous kernel (the qkv product) never writes the caches. Session 23's cp.async copy of the first
// 64 keys before the wait (two q heads a CTA, 64-key splits) changed nothing (part158). Session 48: the
// phase stamps (DEC_TL_PHASES) had a CTA's 32 keys take 2.5 us (0.6B) / 2.9 us (8B) from the end of
// its RoPE, its q norm + RoPE 0.8 / 1.6 us from the wait (part277); with these loads before the wait
// batch-1 graphs 0.6B 0.7875 -> 0.7792 ms (-1.05%), 8B 4.2186 -> 4.2032 (-0.37%), alternated twice
// (docs/results/h200_session48_ab.txt); its op tests and every GPU test passed with it (part278). The
// default since.
#ifndef DEC_KV_PREWAIT
#define DEC_KV_PREWAIT 1
#endif
// The fused decode step's kernels find their work before the PDL wait in one trip of loads (guessed;
// see decode_attention_impl). Why: in every batch-1 timeline since session 23 the attention's first CTA
// reaches its wait 1.5-1.9 us (0.6B) / 0.9-1.2 us (8B) after the qkv product's last release, the
// other kernels 0.5-0.9 us after their producers', and its wait returns 0.4 us after that (0.6B):
// the pre-wait loads (query_start[B], then the sequence's bounds and length, then the block-table
// entries, each waiting on the one before) are on the step's critical path. Measured (part281, session
// 51, an H100: batch-1 graphs at 512 keys, alternated twice): 0.6B 0.869 -> 0.827 ms (-4.8%), 8B 5.690 ->
// 5.646 ms (-0.8%); the default since. DEC_INDEX_GUESS=0 keeps the three dependent trips.
#ifndef DEC_INDEX_GUESS
#define DEC_INDEX_GUESS 1
#endif
// The head-a-CTA kernel's threads, keys a key group has in flight, and CTAs an SM its registers must
// allow (the host launches it with the threads its build allows: cuda_ops.py). Why: one split a query
// head and no merge at batch 1 (MINILLM_DECODE_MIN_PART=1024) would take the attention's tail (the
// partials, fence, counter and the last split's merge: 3.1 us of the 0.6B layer's hand-off into the
// o product, part275) off the step, but 128 threads with 4 keys a group in flight walk 512 keys in 16
// dependent rounds: +69% on the 0.6B step (part205). 512 threads with 8 keys a group (DEC_KVD_THREADS=512,
// DEC_KVD_U=8, DEC_KVD_MIN_BLOCKS=1) have 256 keys in flight, two rounds. Not yet measured (part279).
#ifndef DEC_KVD_THREADS
#define DEC_KVD_THREADS DEC_THREADS
#endif
#ifndef DEC_KVD_U
#define DEC_KVD_U DEC_U
#endif
#ifndef DEC_KVD_MIN_BLOCKS
#define DEC_KVD_MIN_BLOCKS DEC_MIN_BLOCKS_SMALL_G
#endif
// Diagnostics (scripts/step_timeline.py --phases): thread 0 of every CTA stamps timeline words 6 and 7
// after the q/k norm + RoPE and after its keys (before its release) instead of its arrival and merge.
#ifndef DEC_TL_PHASES
#define DEC_TL_PHASES 0
#endif
#ifndef DEC_CPL  // 16-byte chunks of a K/V row per lane (1: 16 lanes a bf16 d128 row; 2: 8 lanes)
#define DEC_CPL 1
#endif

namespace {

template <typename T>
struct Vec16;
template <>
struct Vec16<bf16> {
  static constexpr int N = 8;
  static __device__ __forceinline__ void to_f(const uint4& u, float* f) { minillm::unpack_bf16x8(u, f); }
};
template <>
struct Vec16<float> {
  static constexpr int N = 4;
  static __device__ __forceinline__ void to_f(const uint4& u, float* f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  }
};

// The merge's partials of splits [s0, s0 + FL) for this thread's EPT elements (0 past n_active):
// every load issued before any is used. head0: the KV head's first query head, t * H + kh * G.
template <int D, int G, int FL, int EPT, int THREADS>
__device__ __forceinline__ void load_partials(float (&x)[FL][EPT], const float* part_o, i64 head0, int n_splits,
                                              int s0, int n_active, int tid) {
#pragma unroll
  for (int i = 0; i < FL; ++i)
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const int e = tid + k * THREADS, g = e / D, d = e - g * D;
      x[i][k] = s0 + i < n_active && e < G * D ? __ldcg(part_o + ((head0 + g) * n_splits + s0 + i) * D + d) : 0.f;
    }
}

// What the fused decode step (paged_decode_rope_*) needs beyond attention: the step's raw k and v
// rows, Qwen3's q/k norm weights (null: no norm), RoPE's cos/sin table and the KV slot per token.
template <typename T>
struct RopeArgs {
  const T* k = nullptr;
  i64 k_tok = 0, k_head = 0;
  const T* v = nullptr;
  i64 v_tok = 0, v_head = 0;
  const T* q_w = nullptr;
  const T* k_w = nullptr;
  float eps = 0.f;
  const int* positions = nullptr;
  const float* cos_sin = nullptr;
  int max_pos = 0;
  const int* slots = nullptr;
  i64 n_slots = 0;
  T* k_cache = nullptr;  // the caches kc / vc, writable
  T* v_cache = nullptr;
  // CTAs a KV head is split over (1: one; MINILLM_DECODE_HEAD_CTAS): the launch's KH counts head
  // groups, KV heads x kv_div, each of G = query heads a KV head / kv_div
  int kv_div = 1;
};

template <typename T, int D, int G, bool ROPE, bool KV_DIV = false, int THREADS = DEC_THREADS, int U = DEC_U>
__device__ __forceinline__ void decode_attention_impl(
    const T* __restrict__ q, i64 q_tok, i64 q_head,
    const T* __restrict__ kc, const T* __restrict__ vc,  // [num_blocks, bs, KH, D]
    const int* __restrict__ block_tables, int bt_stride,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start, int B, int n_tokens,
    T* __restrict__ out, i64 o_tok, i64 o_head,
    float* __restrict__ part_o, float* __restrict__ part_ml, int* __restrict__ counters,
    const int* __restrict__ order, int KH, int block_size, int num_blocks, float scale_log2,
    int causal, int n_splits, int min_part, int max_nq, int short_max_ctx, const RopeArgs<T>& ra,
    int defer_max) {
#if !PDL_PREWAIT_INDEX
  minillm::pdl_entry();
#endif
  constexpr int VEC = Vec16<T>::N;
  constexpr int CPL = DEC_CPL;   // 16-byte chunks of a row per lane
  constexpr int LPK = D / VEC / CPL;  // lanes per key row
  constexpr int NG = THREADS / LPK;
  static_assert(LPK >= 2 && LPK <= 32 && (32 % LPK) == 0, "head_dim must give 2..32 lanes a row");
  __shared__ float s_ml[NG][G][2];
  __shared__ float s_acc[NG][G][D];
  __shared__ __align__(16) float s_w[G][64];  // the merging CTA's per-split weights (n_splits <= 64)
  constexpr bool ONE_TRIP = DEC_MERGE_ONE_TRIP && G == 1 && KV_DIV;
  __shared__ float s_w_warp[ONE_TRIP ? THREADS / 32 : 1][ONE_TRIP ? 64 : 1];  // ONE_TRIP: a warp's copy
  __shared__ float s_den[G];
  __shared__ int s_last;
  // ROPE: the G q heads and the new k, v rows after norm + RoPE (rounded to storage), and scratch
  __shared__ float s_rot[ROPE ? G + 2 : 1][ROPE ? D : 1];
  __shared__ float s_tmp[ROPE ? THREADS / 32 : 1][ROPE ? D : 1];

  const int tid = threadIdx.x, kl = tid % LPK, grp = tid / LPK;
  // CTA i of the 1-D grid -> (token, KV head, split). The hardware starts CTAs in index order, so
  // this is the order the work starts in. Without an order: tokens fastest, then KV heads, then
  // splits. With one (a permutation of the rows, longest context first: the runner's hint), KV
  // heads fastest, then splits, then tokens in that order: a ragged batch's longest contexts start
  // first and its short ones fill the tail (results do not depend on the order).
  int t, kh, split;
  {
    const int lin = blockIdx.x;
    if (order == nullptr) {
      t = lin % n_tokens;
      kh = (lin / n_tokens) % KH;
      split = lin / (n_tokens * KH);
    } else {
      kh = lin % KH;
      split = (lin / KH) % n_splits;
      t = order[lin / (KH * n_splits)];
      MINILLM_CHECK(t >= 0 && t < n_tokens);
    }
  }
  const int H = KH * G;
  // KV_DIV (paged_decode_rope_kvd_*, RopeArgs' kv_div): kv_div CTAs share KV head kv = kh / kv_div, each
  // with its own G query heads kh * G + g; the cache holds n_kv = KH / kv_div heads, and the group
  // kh == kv * kv_div (the leader) stores the new k and v. Every other kernel: kv = kh, n_kv = KH.
  const int kv = KV_DIV ? kh / ra.kv_div : kh, n_kv = KV_DIV ? KH / ra.kv_div : KH;
  const bool kv_leader = !KV_DIV || kh == kv * ra.kv_div;
  // ---- where this CTA works. Only step inputs are read here (query_start, seq_lens, positions,
  // slots, block tables, order: uploaded by the host before the step), so with PDL_PREWAIT_INDEX
  // (cuda/common.cuh) this runs before the PDL wait, during the previous kernel's tail, and the
  // lines this CTA reads next (its block-table entries, the RoPE row, the q/k norm weights) are
  // pulled into L1 there too. The wait comes before any return.
  // The fused step's slot and position are loaded with query_start's, not after the row's sequence
  // is known: part165/166's batch-1 timelines had this kernel's entry stamp a median 1.5 us (0.6B)
  // / 1.0 us (8B) after the qkv product's release (the other kernels 0.1-0.7 us), behind three
  // dependent loads. They depend on t alone: the step's input buffers are zeroed at startup and
  // have a row for every t < n_tokens.
  int slot_t = -1, pos_t = 0;
  if constexpr (ROPE) {
    if (t < n_tokens) {
      slot_t = ra.slots[t];
      pos_t = ra.positions[t];
    }
  }
  bool active = false;
  int b = 0, nq = 1, L = 0, j = 0, k_hi = 0, k_lo = 0, k_end = 0;
  int n_active = 1;  // splits that hold keys of this token; the others exit
  // DEC_INDEX_GUESS (the fused decode step's kernels): the loads below in one trip, by guessing that row
  // t is sequence t (a decode step: one query a sequence) and, in the head-a-CTA kernel (KV_PRE), that
  // its split is min_part keys long (a batch-1 step near 512 keys): the sequence's bounds and length and
  // this key group's block-table entries are asked for together with the slot and position, where the
  // default asks for query_start[B], then the sequence's bounds and length, then (after the split is
  // known) the entries: three dependent trips before this CTA's keys can be asked for. Each guess is
  // checked against what was loaded; a wrong one (a padding row, a longer split) takes the default's
  // loads (the same values, a trip later).
  constexpr bool KV_PRE = DEC_KV_PREWAIT && ROPE && KV_DIV;
  constexpr bool GUESS = DEC_INDEX_GUESS && ROPE;  // the entries only with KV_PRE (the keys before the wait)
  const int bg = min(t, B - 1);  // the guessed sequence (in bounds whenever B >= 1)
  int g_qb = 0, g_q0 = 0, g_q1 = 0, g_len = 0, g_phys[GUESS ? U : 1] = {}, g_inb[GUESS ? U : 1] = {};
  if constexpr (GUESS) {
    if (t < n_tokens && bg >= 0) {
      g_qb = query_start[B];
      g_q0 = query_start[bg];
      g_q1 = query_start[bg + 1];
      g_len = seq_lens[bg];
      if constexpr (KV_PRE) {
        const int* bt_g = block_tables + (i64)bg * bt_stride;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int key = split * min_part + grp * U + u, lb = key / block_size;
          g_phys[u] = lb < bt_stride ? bt_g[lb] : 0;
          g_inb[u] = key - lb * block_size;
        }
      }
    }
  }
  bool guessed = false;
  do {
    // rows outside every sequence: untouched
    if (t >= n_tokens || t >= (GUESS && bg >= 0 ? g_qb : query_start[B])) break;
    guessed = GUESS && g_q0 <= t && t < g_q1;  // then bg is the last sequence starting at or before t
    b = guessed ? bg : minillm::seq_of_row(query_start, B, t);
    const int qs = guessed ? g_q0 : query_start[b];
    nq = (guessed ? g_q1 : query_start[b + 1]) - qs;
    L = guessed ? g_len : seq_lens[b];
    MINILLM_CHECK(nq >= 1 && L >= 0 && L <= bt_stride * block_size);
    // a long query run, or a short one on tensor cores: prefill_attention.cu's (same launch step)
    if (nq > max_nq || minillm::short_run_on_tensor_cores(nq, L, short_max_ctx)) break;
    j = t - qs;
    k_hi = causal ? L - nq + j + 1 : L;  // keys this query may see
    k_hi = max(0, min(k_hi, L));
    k_end = k_hi;
    if (n_splits > 1) {
      const int part = minillm::decode_split_part(k_hi, n_splits, min_part);
      n_active = max(1, (k_hi + part - 1) / part);
      if (split >= n_active) break;  // uniform over the CTA, before any barrier
      k_lo = split * part;
      k_end = min(k_hi, k_lo + part);
    }
    active = true;
  } while (false);
  const int* bt = block_tables + (i64)b * bt_stride;
  i64 slot = -1;
  int pos = 0;
  if constexpr (ROPE) {
    if (active) {
      slot = slot_t;
      pos = pos_t;
    }
  }
  // keys [k0, k0 + U) of this lane's key group, its chunks of them (zero past k_stop). One integer
  // division a key (block_size is a runtime value, so it is a ~20-instruction sequence). load_keys
  // finds each key's entry and asks for its rows key by key, as the loop did before session 48; the
  // pre-wait path (load_kv) takes entries and rows in their blocks found before (the guess's). Session
  // 48 split every key group's loads into all entries, then all rows, and took key % block_size a
  // second time in the rows' offsets: nano-vllm's 256-sequence throughput run 24,162 -> 21,644 tok/s on
  // one H200 (part287's bisection, session 52), where the attention is most of a step. Dropping the
  // second division won back about half of it on an H100 (part288: 548b5cb 19,763, ba2a141 18,862,
  // d493560 19,233 tok/s, two runs each); this key-by-key order took back the rest (part289, another
  // H100: 548b5cb 19,578, d493560 19,245, key by key 19,732), batch-1 graphs unchanged.
  uint4 kr[U][CPL], vr[U][CPL];
  auto load_row = [&](int u, int phys, int inb) {  // key u's chunks: block phys, row inb of it
    MINILLM_CHECK(phys >= 0 && phys < num_blocks);
    const i64 off = (((i64)phys * block_size + inb) * n_kv + kv) * D + kl * VEC;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const uint4* kp = reinterpret_cast<const uint4*>(kc + off + j * LPK * VEC);
      const uint4* vp = reinterpret_cast<const uint4*>(vc + off + j * LPK * VEC);
      if constexpr (ROPE || KV_LOADS_NC) {  // rows older than this launch (see KV_LOADS_NC)
        kr[u][j] = __ldg(kp);
        vr[u][j] = __ldg(vp);
      } else {  // the q/k norm kernel just before stored this step's rows
        kr[u][j] = minillm::load_act(kp);
        vr[u][j] = minillm::load_act(vp);
      }
    }
  };
  auto load_kv = [&](int k0, int k_stop, const int (&phys)[U], const int (&inb)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < CPL; ++j) kr[u][j] = vr[u][j] = make_uint4(0u, 0u, 0u, 0u);
      if (k0 + u < k_stop) load_row(u, phys[u], inb[u]);
    }
  };
  auto load_keys = [&](int k0, int k_stop) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = k0 + u;
#pragma unroll
      for (int j = 0; j < CPL; ++j) kr[u][j] = vr[u][j] = make_uint4(0u, 0u, 0u, 0u);
      if (key < k_stop) {
        const int lb = key / block_size;
        MINILLM_CHECK(lb < bt_stride);
        load_row(u, bt[lb], key - lb * block_size);
      }
    }
  };
  // DEC_KV_PREWAIT (head-a-CTA kernel): the first keys of this group, before the wait. The newest key
  // (the fresh CTA's last) is not among them: it comes from shared memory after the loop.
  if constexpr (KV_PRE) {
    if (active) {
      const bool fresh_pre = slot >= 0 && k_hi == L && L > 0 && k_end == k_hi;
      const int k0 = k_lo + grp * U, k_stop = fresh_pre ? k_end - 1 : k_end;
      if constexpr (GUESS) {
        if (guessed && k_lo == split * min_part) {  // the entries loaded with the guess are these keys'
          load_kv(k0, k_stop, g_phys, g_inb);
        } else {
          load_keys(k0, k_stop);
        }
      } else {
        load_keys(k0, k_stop);
      }
    }
  }
#if PDL_PREWAIT_INDEX
  if (active) {  // L1 warm-up for what the CTA reads right after the wait
    constexpr int W_LINE = 128 / sizeof(T);  // weights a 128-byte line
    const int lane = tid & 31;
    if (tid < 32) {  // warp 0: this split's block-table entries
      const int first = k_lo / block_size, last = (max(k_end, k_lo + 1) - 1) / block_size;
      for (int lb = first + lane; lb <= last; lb += 32) minillm::prefetch_l1(bt + lb);
    } else if constexpr (ROPE) {  // warps 1-3: RoPE's cos/sin row and the q/k norm weights
      if (tid < 64) {
        if (pos >= 0 && pos < ra.max_pos && lane * 32 < D)  // fp32: 32 a line
          minillm::prefetch_l1(ra.cos_sin + (i64)pos * D + lane * 32);
      } else if (tid < 96) {
        if (ra.q_w != nullptr && lane * W_LINE < D) minillm::prefetch_l1(ra.q_w + lane * W_LINE);
      } else if (ra.k_w != nullptr && lane * W_LINE < D) {
        minillm::prefetch_l1(ra.k_w + lane * W_LINE);
      }
    }
  }
  minillm::pdl_entry();
#endif
  if (!active) return;

  // ---- ROPE (a decode step's fused q/k norm + RoPE + KV store): every CTA normalises and rotates
  // its G q heads (warp per head, norm.cu's arithmetic); the CTA whose split ends at the newest
  // key also does the token's k head, stores k and v to the token's slot, and adds that key from
  // shared memory after its loop (no CTA ever reads a cache row written in this launch).
  bool fresh = false;  // this CTA stores and appends the newest key (uniform over the CTA)
  if constexpr (ROPE) {
    MINILLM_CHECK(nq == 1 || L == 0);  // one new token a sequence: no other row needs this key
    MINILLM_CHECK(slot < ra.n_slots);
    fresh = slot >= 0 && k_hi == L && L > 0 && k_end == k_hi;
    MINILLM_CHECK(pos >= 0 && pos < ra.max_pos);
    const float* cs = ra.cos_sin + (i64)pos * D;
    const int warp = tid >> 5, lane = tid & 31;
    for (int hh = warp; hh < G + (fresh ? 2 : 0); hh += THREADS / 32) {  // warp-uniform
      float* dst = s_rot[hh];
      if (hh == G + 1) {  // v: copied as it is
        const T* src = ra.v + (i64)t * ra.v_tok + (i64)kv * ra.v_head;
        T* row = ra.v_cache + (slot * n_kv + kv) * D;
        for (int i = lane; i < D; i += 32) {
          if (kv_leader) row[i] = src[i];
          dst[i] = minillm::to_f(src[i]);
        }
        continue;
      }
      const bool is_q = hh < G;
      const T* x = is_q ? q + (i64)t * q_tok + (i64)(kh * G + hh) * q_head
                        : ra.k + (i64)t * ra.k_tok + (i64)kv * ra.k_head;
      T* row = is_q || !kv_leader ? nullptr : ra.k_cache + (slot * n_kv + kv) * D;
      minillm::warp_qk_norm_rope<T>(x, is_q ? ra.q_w : ra.k_w, ra.eps, cs, s_tmp[warp], D, lane,
                                    [&](int i, T o) {
                                      dst[i] = minillm::to_f(o);
                                      if (row) row[i] = o;
                                    });
      __syncwarp();  // s_tmp[warp] is the next head's scratch
    }
    __syncthreads();
    if (fresh) --k_end;  // the newest key comes from s_rot after the loop
  }
#if DEC_TL_PHASES
  minillm::timeline_stamp(6);
#endif

  // ---- this token's G query heads, pre-scaled by softmax scale * log2(e). Lane kl holds the
  // CPL 16-byte chunks kl, kl + LPK, ... of each row (so LPK lanes read a row's 16 * LPK bytes
  // contiguously per load), element i of chunk j at dims (kl + j * LPK) * VEC + i.
  constexpr int E = CPL * VEC;  // elements of a row per lane
  float qv[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      if constexpr (ROPE) {  // rotated above
#pragma unroll
        for (int i = 0; i < VEC; ++i) qv[g][j * VEC + i] = s_rot[g][(kl + j * LPK) * VEC + i];
      } else {
        const T* qp = q + (i64)t * q_tok + (i64)(kh * G + g) * q_head;
        // q: the q/k norm kernel just before wrote it (load_act, common.cuh)
        Vec16<T>::to_f(minillm::load_act(reinterpret_cast<const uint4*>(qp + (kl + j * LPK) * VEC)), qv[g] + j * VEC);
      }
    }
#pragma unroll
    for (int i = 0; i < E; ++i) qv[g][i] *= scale_log2;
  }
  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = minillm::neg_inf();
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < E; ++i) acc[g][i] = 0.f;
  }

  // The loop bound is uniform over the CTA (shuffles below need whole warps); keys past k_end
  // load nothing and update nothing.
  for (int base = k_lo; base < k_end; base += NG * U) {
    const int k0 = base + grp * U;
    if (!(KV_PRE && base == k_lo)) load_keys(k0, k_end);  // KV_PRE: the first keys are in already
#if DEC_NO_MATH  // memory only: every loaded word feeds one sum (the loads' ceiling, not attention)
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const uint4 a = kr[u][j], c = vr[u][j];
        acc[0][0] += __uint_as_float((a.x ^ a.y ^ a.z ^ a.w ^ c.x ^ c.y ^ c.z ^ c.w) & 0x007fffffu);
        l[0] = 1.f;
        m[0] = 0.f;
      }
    continue;
#endif
    float s[U][G];  // scores, complete after the shuffles
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[E];
#pragma unroll
      for (int j = 0; j < CPL; ++j) Vec16<T>::to_f(kr[u][j], kf + j * VEC);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < E; ++i) d = fmaf(qv[g][i], kf[i], d);
        s[u][g] = d;
      }
#pragma unroll
      for (int o = LPK / 2; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < G; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], o);
    }
    // one softmax rescale per U keys: the running max moves once a chunk, so acc and l are
    // scaled once and each key adds p * v (validity is uniform within a key group)
    if (k0 < k_end) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float m_new = m[g];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (k0 + u < k_end) m_new = fmaxf(m_new, s[u][g]);
        const float alpha = exp2f(m[g] - m_new);  // 0 while m is still -inf; m_new is finite
        l[g] *= alpha;
#pragma unroll
        for (int i = 0; i < E; ++i) acc[g][i] *= alpha;
        m[g] = m_new;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (k0 + u < k_end) {
          float vf[E];
#pragma unroll
          for (int j = 0; j < CPL; ++j) Vec16<T>::to_f(vr[u][j], vf + j * VEC);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float p = exp2f(s[u][g] - m[g]);
            l[g] += p;
#pragma unroll
            for (int i = 0; i < E; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
          }
        }
      }
    }
  }

  // ---- ROPE: key group 0 adds the newest key (its k and v in s_rot) to its running softmax;
  // the whole first warp runs the shuffles, the other groups in it discard the result
  if constexpr (ROPE) {
    if (fresh && tid < 32) {
      float sc[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float d = 0.f;
#pragma unroll
        for (int j = 0; j < CPL; ++j)
#pragma unroll
          for (int i = 0; i < VEC; ++i) d = fmaf(qv[g][j * VEC + i], s_rot[G][(kl + j * LPK) * VEC + i], d);
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        sc[g] = d;
      }
      if (grp == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float m_new = fmaxf(m[g], sc[g]);
          const float alpha = exp2f(m[g] - m_new), p = exp2f(sc[g] - m_new);
          l[g] = fmaf(l[g], alpha, p);
#pragma unroll
          for (int j = 0; j < CPL; ++j)
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
              const int e = j * VEC + i;
              acc[g][e] = fmaf(acc[g][e], alpha, p * s_rot[G + 1][(kl + j * LPK) * VEC + i]);
            }
          m[g] = m_new;
        }
      }
    }
  }

#if DEC_TL_PHASES
  minillm::timeline_stamp(7);
#endif
  // the next kernel is placed while this CTA merges (common.cuh). Releasing at entry instead, before the
  // PDL wait (DEC_RELEASE_EARLY, removed in session 57): 0.6B batch-1 graph 0.811 -> 0.834 ms on an H100
  minillm::pdl_release();
  // ---- merge the key groups of this CTA
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (kl == 0) {
      s_ml[grp][g][0] = m[g];
      s_ml[grp][g][1] = l[g];
    }
#pragma unroll
    for (int j = 0; j < CPL; ++j)
#pragma unroll
      for (int i = 0; i < VEC; ++i) s_acc[grp][g][(kl + j * LPK) * VEC + i] = acc[g][j * VEC + i];
  }
  __syncthreads();
  for (int e = tid; e < G * D; e += THREADS) {
    const int g = e / D, d = e - g * D;
    float M = minillm::neg_inf();
    for (int r = 0; r < NG; ++r) M = fmaxf(M, s_ml[r][g][0]);
    float den = 0.f, o = 0.f;
    if (M != minillm::neg_inf()) {
      for (int r = 0; r < NG; ++r) {
        const float w = exp2f(s_ml[r][g][0] - M);
        den = fmaf(w, s_ml[r][g][1], den);
        o = fmaf(w, s_acc[r][g][d], o);
      }
    }
    const int h = kh * G + g;
    if (n_active == 1 && n_active > defer_max) {  // the whole context in one CTA: no partials, no merge
      out[(i64)t * o_tok + (i64)h * o_head + d] = minillm::merge_result<T>(o, den);
    } else {  // every active split writes its partial: the merge reads all of them
      const i64 p = ((i64)t * H + h) * n_splits + split;
      part_o[p * D + d] = o;
      if (d == 0) {
        part_ml[2 * p] = M;
        part_ml[2 * p + 1] = den;
      }
    }
  }
  // a row of at most defer_max splits is merged by the next kernel (gemv.cu's gemv1_merge_*, the
  // batch-1 o product): no fence, counter or merge here, and even one split leaves its partial
  if (n_active == 1 || n_active <= defer_max) return;

  // ---- the last split of this (token, KV head) to finish merges the partials. Its chain after the
  // release (fence, counter, then the partials' loads) is the o product's wait (see the header), so
  // the loads are batched: each lane's (m, l) pairs in one 8-byte load, and every partial of FL
  // splits x a thread's elements loaded before any is added. The fences: the partials before the
  // arrival (release), the arrival before the merge's loads (acquire); fence.acq_rel.gpu in place
  // of __threadfence measured the same (part167).
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(counters + (i64)t * KH + kh, 1);
    s_last = prev == n_active - 1;
#if !DEC_TL_PHASES
    minillm::timeline_stamp(6);  // arrived (scripts/step_timeline.py: the tail's phases)
#endif
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if constexpr (ONE_TRIP) {  // G = 1: thread tid merges element tid of the head (D <= THREADS)
    static_assert(D <= THREADS, "one element a thread");
    const int lane = tid & 31, warp = tid >> 5;
    const i64 p0 = ((i64)t * H + kh) * n_splits;
    const minillm::SplitPairs pairs = minillm::split_pairs(reinterpret_cast<const float2*>(part_ml) + p0, n_active, lane);
    float x[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = i < n_active && tid < D ? __ldcg(part_o + (p0 + i) * D + tid) : 0.f;
    const float den = minillm::split_weights(pairs, n_active, lane, s_w_warp[warp]);
    __syncwarp();
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) o = minillm::merge_add(o, s_w_warp[warp][i], x[i]);
    for (int i = 32; i < n_active; ++i)  // past 32 splits (long contexts): one at a time
      o = minillm::merge_add(o, s_w_warp[warp][i], tid < D ? __ldcg(part_o + (p0 + i) * D + tid) : 0.f);
    if (tid < D) out[(i64)t * o_tok + (i64)kh * o_head + tid] = minillm::merge_result<T>(o, den);
    if (tid == 0) {
      counters[(i64)t * KH + kh] = 0;  // ready for the next step (or graph replay)
#if !DEC_TL_PHASES
      minillm::timeline_stamp(7);
#endif
    }
    return;
  }
  constexpr int EPT = (G * D + THREADS - 1) / THREADS, FL = ROPE ? DEC_MERGE_FLIGHT_ROPE : DEC_MERGE_FLIGHT;
  for (int g = tid >> 5; g < G; g += THREADS / 32) {  // warp per head: split weights
    const i64 p0 = ((i64)t * H + kh * G + g) * n_splits;
    const minillm::SplitPairs pairs = minillm::split_pairs(reinterpret_cast<const float2*>(part_ml) + p0, n_active, tid & 31);
    const float den = minillm::split_weights(pairs, n_active, tid & 31, s_w[g]);
    if ((tid & 31) == 0) s_den[g] = den;
  }
  __syncthreads();
  float o[EPT];
#pragma unroll
  for (int k = 0; k < EPT; ++k) o[k] = 0.f;
  for (int s0 = 0; s0 < n_active; s0 += FL) {
    float x[FL][EPT];  // the partials of splits [s0, s0 + FL) for this thread's elements
    load_partials<D, G, FL, EPT, THREADS>(x, part_o, (i64)t * H + kh * G, n_splits, s0, n_active, tid);
    // The weights of the batch into registers first, 4 splits a load, then the adds as selects: when
    // each add read its own weight from shared memory behind a branch, the merge (last arrival to
    // its end) took 2.7 (0.6B) / 4.1 us (8B) in part166's timeline; this is 2.1% / 1.1% off the
    // batch-1 steps (part167). Splits past n_active read weight 0 (zeroed above), and the select skips
    // every zero weight as the branch did.
    static_assert(FL % 4 == 0 && 64 % FL == 0, "the weights are read 4 splits at a time, within s_w's 64");
    float w[FL][EPT];
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const int g = min((tid + k * THREADS) / D, G - 1);
#pragma unroll
      for (int q = 0; q < FL / 4; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(&s_w[g][s0 + 4 * q]);
        w[4 * q][k] = v.x, w[4 * q + 1][k] = v.y, w[4 * q + 2][k] = v.z, w[4 * q + 3][k] = v.w;
      }
    }
#pragma unroll
    for (int i = 0; i < FL; ++i)
#pragma unroll
      for (int k = 0; k < EPT; ++k) o[k] = minillm::merge_add(o[k], w[i][k], x[i][k]);
  }
#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    const int e = tid + k * THREADS, g = e / D, d = e - g * D;
    if (e < G * D) {
      out[(i64)t * o_tok + (i64)(kh * G + g) * o_head + d] = minillm::merge_result<T>(o[k], s_den[g]);
    }
  }
  if (tid == 0) {
    counters[(i64)t * KH + kh] = 0;  // ready for the next step (or graph replay)
#if !DEC_TL_PHASES
    minillm::timeline_stamp(7);  // merged (thread 0's stores issued)
#endif
  }
}

}  // namespace

// paged_decode_<dtype>_d<D>_g<G>: a 1-D grid of tokens x KH x n_splits CTAs, DEC_THREADS threads.
#define MINILLM_DECODE(SUFFIX, T, D, G)                                                           \
  extern "C" __global__ void __launch_bounds__(DEC_THREADS, (G) <= 2 ? DEC_MIN_BLOCKS_SMALL_G : (G) <= 4 ? DEC_MIN_BLOCKS_MID_G : DEC_MIN_BLOCKS) paged_decode_##SUFFIX##_d##D##_g##G( \
      const T* q, i64 q_tok, i64 q_head, const T* kc, const T* vc, const int* block_tables,       \
      int bt_stride, const int* seq_lens, const int* query_start, int B, int n_tokens, T* out,    \
      i64 o_tok, i64 o_head, float* part_o, float* part_ml, int* counters, const int* order,      \
      int KH, int block_size, int num_blocks, float scale_log2, int causal, int n_splits,         \
      int min_part, int max_nq, int short_max_ctx) {                                              \
    decode_attention_impl<T, D, G, false>(q, q_tok, q_head, kc, vc, block_tables, bt_stride, seq_lens,   \
                                   query_start, B, n_tokens, out, o_tok, o_head, part_o, part_ml, \
                                   counters, order, KH, block_size, num_blocks, scale_log2, causal, \
                                   n_splits, min_part, max_nq, short_max_ctx, RopeArgs<T>(), 0);  \
  }

// paged_decode_rope_<dtype>_d<D>_g<G>: the same grid, on a decode step (one new token a
// sequence): q is the raw q rows; the q/k norm + RoPE and the KV store of norm.cu's
// qk_norm_rope_store_kv happen inside (its k rows are not updated in place). kv_div: 1.
// paged_decode_rope_kvd_<dtype>_d<D>_g1: the same with one query head a CTA, kv_div = query heads a KV
// head (MINILLM_DECODE_HEAD_CTAS, one-row steps): a grid of tokens x (KV heads x kv_div) x n_splits
// CTAs, KH = KV heads x kv_div; twice (G = 2) the CTAs, each half the q heads and merge elements.
#define MINILLM_DECODE_ROPE_KERNEL(NAME, T, D, G, MIN_BLOCKS, KVD, THREADS, U)                    \
  extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(                         \
      const T* q, i64 q_tok, i64 q_head, T* kc, T* vc, const int* block_tables, int bt_stride,   \
      const int* seq_lens, const int* query_start, int B, int n_tokens, T* out, i64 o_tok,       \
      i64 o_head, float* part_o, float* part_ml, int* counters, const int* order, int KH,         \
      int block_size, int num_blocks, float scale_log2, int n_splits, int min_part, const T* k,   \
      i64 k_tok, i64 k_head, const T* v, i64 v_tok, i64 v_head, const T* q_w, const T* k_w, float eps, \
      const int* positions, const float* cos_sin, int max_pos, const int* slots, i64 n_slots,    \
      int defer_max, int kv_div) {                                                                \
    RopeArgs<T> ra;                                                                               \
    ra.k = k; ra.k_tok = k_tok; ra.k_head = k_head;                                               \
    ra.v = v; ra.v_tok = v_tok; ra.v_head = v_head;                                               \
    ra.q_w = q_w; ra.k_w = k_w; ra.eps = eps;                                                     \
    ra.positions = positions; ra.cos_sin = cos_sin; ra.max_pos = max_pos;                         \
    ra.slots = slots; ra.n_slots = n_slots; ra.k_cache = kc; ra.v_cache = vc;                     \
    ra.kv_div = kv_div;                                                                           \
    decode_attention_impl<T, D, G, true, KVD, THREADS, U>(q, q_tok, q_head, kc, vc, block_tables,  \
                                              bt_stride,                                          \
                                              seq_lens, query_start, B, n_tokens, out, o_tok,     \
                                              o_head, part_o, part_ml, counters, order, KH,       \
                                              block_size, num_blocks, scale_log2, 1, n_splits,    \
                                              min_part, 1 << 30, 0, ra, defer_max);               \
  }
#define MINILLM_DECODE_ROPE(SUFFIX, T, D, G)                                                      \
  MINILLM_DECODE_ROPE_KERNEL(paged_decode_rope_##SUFFIX##_d##D##_g##G, T, D, G,                  \
                             (G) <= 2 ? DEC_MIN_BLOCKS_SMALL_G : (G) <= 4 ? DEC_MIN_BLOCKS_MID_G : DEC_MIN_BLOCKS, false, \
                             DEC_THREADS, DEC_U)
#define MINILLM_DECODE_ROPE_KVD(SUFFIX, T, D)                                                     \
  MINILLM_DECODE_ROPE_KERNEL(paged_decode_rope_kvd_##SUFFIX##_d##D##_g1, T, D, 1, DEC_KVD_MIN_BLOCKS, true, \
                             DEC_KVD_THREADS, DEC_KVD_U)

#define MINILLM_DECODE_G(SUFFIX, T, D)                                                   \
  MINILLM_DECODE(SUFFIX, T, D, 1) MINILLM_DECODE(SUFFIX, T, D, 2)                       \
  MINILLM_DECODE(SUFFIX, T, D, 3) MINILLM_DECODE(SUFFIX, T, D, 4)                       \
  MINILLM_DECODE(SUFFIX, T, D, 5) MINILLM_DECODE(SUFFIX, T, D, 6)                       \
  MINILLM_DECODE(SUFFIX, T, D, 7) MINILLM_DECODE(SUFFIX, T, D, 8)                       \
  MINILLM_DECODE_ROPE(SUFFIX, T, D, 1) MINILLM_DECODE_ROPE(SUFFIX, T, D, 2)             \
  MINILLM_DECODE_ROPE(SUFFIX, T, D, 3) MINILLM_DECODE_ROPE(SUFFIX, T, D, 4)             \
  MINILLM_DECODE_ROPE(SUFFIX, T, D, 5) MINILLM_DECODE_ROPE(SUFFIX, T, D, 6)             \
  MINILLM_DECODE_ROPE(SUFFIX, T, D, 7) MINILLM_DECODE_ROPE(SUFFIX, T, D, 8)             \
  MINILLM_DECODE_ROPE_KVD(SUFFIX, T, D)

// A module per (storage type, head dim): the backend defines DEC_ONLY_T (1: bf16, 2: f32) and DEC_ONLY_D
// (64, 128) and compiles the pair its model asks for, a quarter of this file, which otherwise takes more
// than half of a cold start's kernel compile (nvcc: ~34 of ~58 s, session 54). Undefined: every pair.
#ifndef DEC_ONLY_T
#define DEC_ONLY_T 0
#endif
#ifndef DEC_ONLY_D
#define DEC_ONLY_D 0
#endif
#define DEC_WANT(TT, DD) ((DEC_ONLY_T == 0 || DEC_ONLY_T == (TT)) && (DEC_ONLY_D == 0 || DEC_ONLY_D == (DD)))
#if DEC_WANT(1, 64)
MINILLM_DECODE_G(bf16, bf16, 64)
#endif
#if DEC_WANT(1, 128)
MINILLM_DECODE_G(bf16, bf16, 128)
#endif
#if DEC_WANT(2, 64)
MINILLM_DECODE_G(f32, float, 64)
#endif
#if DEC_WANT(2, 128)
MINILLM_DECODE_G(f32, float, 128)
#endif
