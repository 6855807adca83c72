// common.cuh: what every minillm kernel shares.
//
//  * MINILLM_CHECK(cond): a device assert on every index a kernel reads from the block manager
//    (block tables, slots, token ids, positions). Compiled in only under MINILLM_CUDA_DEBUG=1, so
//    release kernels pay nothing; a failing check traps, which surfaces as a launch error naming
//    the kernel instead of a silent out-of-bounds access somewhere later.
//  * Loads/stores that turn bf16 or fp32 storage into fp32 arithmetic, so each kernel is written
//    once as a template and instantiated for both storage types (fp32 is what the tests use to
//    compare against the NumPy oracle at tight tolerances).
//  * Warp/block reductions.
//
// Written for both nvcc (CI compile test) and NVRTC (CuPy RawModule at run time): no host or
// standard-library headers beyond cuda_bf16.h.
#pragma once

#include <cuda_bf16.h>

#ifndef MINILLM_CUDA_DEBUG
#define MINILLM_CUDA_DEBUG 0
#endif

#if MINILLM_CUDA_DEBUG
#ifndef __CUDACC_RTC__
#include <cstdio>  // device printf under nvcc; NVRTC has it built in
#endif
#define MINILLM_CHECK(cond)                                                                      \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      printf("MINILLM_CHECK failed: %s at %s:%d block (%d,%d,%d) thread %d\n", #cond, __FILE__, \
             __LINE__, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);                         \
      __trap();                                                                                  \
    }                                                                                            \
  } while (0)
#else
#define MINILLM_CHECK(cond) \
  do {                      \
  } while (0)
#endif

typedef __nv_bfloat16 bf16;
typedef long long i64;
typedef unsigned long long u64;

// MINILLM_TIMELINE=1 (diagnostics only: scripts/step_timeline.py builds with it): thread 0 of every
// CTA of a PDL kernel records, in its module's minillm_tl, its grid's launch id (%gridid), grid and
// block size, SM, and the global-timer ns at pdl_entry, when the wait returned and at pdl_release
// (below). From them the script splits a graph's step into each kernel's work (wait returned ->
// released) and the hand-offs between kernels (released -> the next kernel's wait returned). The
// record's slot is taken (an atomic) before the wait, where a chained kernel has slack; it costs a
// few percent. In the global namespace, so unmangled for the host's RawModule.get_global.
#ifndef MINILLM_TIMELINE
#define MINILLM_TIMELINE 0
#endif
#if MINILLM_TIMELINE
#define MINILLM_TL_CAP (1 << 18)  // records a module holds (8 words each); later CTAs are counted, not kept
#define MINILLM_TL_MAGIC 0x7e1a5u
__device__ unsigned long long minillm_tl[MINILLM_TL_CAP][8];
__device__ unsigned minillm_tl_n;  // records asked for (zeroed by the host before the step it reads)
__shared__ unsigned minillm_tl_slot, minillm_tl_mark;  // this CTA's record, and that it took one
__device__ __forceinline__ unsigned long long timeline_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

namespace minillm {

// Records the global timer in word `word` of this CTA's timeline record (5: pdl_release; 6 and 7:
// a kernel's own phases after it, e.g. the decode attention's arrival at its split counter and the
// end of the last split's merge); nothing without MINILLM_TIMELINE. Only after this CTA's
// pdl_entry (rms_norm_vec may release before it; shared memory keeps an earlier CTA's mark, so the
// record's launch id must be this grid's too).
__device__ __forceinline__ void timeline_stamp(int word) {
#if MINILLM_TIMELINE
  if (threadIdx.x == 0 && threadIdx.y == 0 && minillm_tl_mark == MINILLM_TL_MAGIC &&
      minillm_tl_slot < MINILLM_TL_CAP) {
    unsigned long long gid;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
    if (minillm_tl[minillm_tl_slot][0] == gid) minillm_tl[minillm_tl_slot][word] = timeline_ns();
  }
#else
  (void)word;
#endif
}

// Programmatic dependent launch (Hopper). Inside a CUDA graph the backend may launch these kernels
// with the programmatic-serialization attribute (minillm/backends/pdl.py). pdl_entry() waits until
// the previous grid has completed and its writes are visible; every PDL kernel calls it before
// touching anything another kernel writes, and before any early return, so completion stays
// ordered kernel by kernel. Launched without the attribute (eager steps) it returns at once.
// Measured on the H200 (docs/BENCHMARKS.md): where a kernel releases its dependents
// (griddepcontrol.launch_dependents) matters. At entry, before the wait: decode graphs 7-10%
// slower (each kernel released the next at once, down the chain, until every kernel's CTAs sat
// resident, waiting). Right after the wait: 0.6B 0.99 -> 1.07 ms, 8B 4.64 -> 4.72 ms (the next
// grid's CTAs took slots while this grid still had CTAs to place); with the GEMVs' L2 prefetch of
// their weights before the wait on top, slower still (session 13, part93).
__device__ __forceinline__ void pdl_entry() {
#if MINILLM_TIMELINE
  const bool rec = threadIdx.x == 0 && threadIdx.y == 0;
  if (rec) {
    const unsigned long long t0 = timeline_ns();
    unsigned long long gid, smid;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(gid));
    asm volatile("{ .reg .u32 s; mov.u32 s, %%smid; cvt.u64.u32 %0, s; }" : "=l"(smid));
    const unsigned slot = atomicAdd(&minillm_tl_n, 1u);
    minillm_tl_slot = slot;
    minillm_tl_mark = MINILLM_TL_MAGIC;
    if (slot < MINILLM_TL_CAP) {
      unsigned long long* r = minillm_tl[slot];
      r[0] = gid;
      r[1] = ((unsigned long long)(gridDim.x * gridDim.y * gridDim.z) << 32) |
             (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
      r[2] = ((unsigned long long)(blockDim.x * blockDim.y * blockDim.z) << 32) | smid;
      r[3] = t0;
      r[5] = r[6] = r[7] = 0;
    }
  }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if MINILLM_TIMELINE
  if (rec && minillm_tl_slot < MINILLM_TL_CAP) minillm_tl[minillm_tl_slot][4] = timeline_ns();
#endif
}

// ... but after a kernel's main loop (pdl_release, called there by the decode chain's kernels: the
// GEMVs, the skinny GEMM, rms_norm, decode attention), the next grid is placed only while this
// one's CTAs finish (reductions, merges, stores), into slots they give back, and its launch no
// longer waits for this grid's last CTA to exit: batch-1 decode graphs at 512 keys 0.984 -> 0.932
// ms (0.6B) and 4.530 -> 4.490 ms (8B) on one machine (session 15, part105). Still at most two
// grids past their waits: a grid releases only after its own wait, except rms_norm_vec with 2 or
// more rows, which releases before it (cuda/norm.cu), so its product's CTAs may sit in their
// pre-wait work while the kernel before the norm still runs. The same call measured work before
// the wait on top of it: the GEMVs' first 4 MB of weights into L2 (0.6B +0.7%, 8B -0.3%) and
// the decode CTAs' old keys into L2 (0.6B +4.5%: the block-table lookups it needs come before the
// wait, on the critical path); neither was kept. Releasing right after the wait in the batch-1
// qkv GEMV alone, so the decode attention's CTAs could copy their cached keys during it: 0.6B
// 0.88 -> 0.98 ms, 8B 4.42 -> 4.48 (session 23, part158); not kept. PDL_LATE=0 restores release
// at exit.
#ifndef PDL_LATE
#define PDL_LATE 1
#endif
__device__ __forceinline__ void pdl_release() {
  timeline_stamp(5);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && PDL_LATE
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Start moving [p, p + bytes) from HBM into L2 and go on (no registers, nothing to wait for): a
// hint, never a correctness matter. p is 16-byte aligned and bytes a multiple of 16.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// ---- TMA bulk copies into shared memory and the mbarriers that count them (Hopper): a producer
// thread's copies land in a slot while the compute warps work on another (decode_layers.cu's weight
// ring, gemv.cu's gemv1_stage_*). Addresses are shared-memory ones (smem_addr).
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Arrive on the barrier and announce `bytes` more of asynchronous writes before its phase ends.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the
// TMA unit; the barrier's transaction count falls by `bytes` when they have landed.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ uint4 lds128(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// PDL_PREWAIT_INDEX=1: the attention kernels (decode_attention.cu; prefill_attention.cu under
// PF_PDL) find their work before their wait: which sequence, split and keys, from step inputs the
// host uploaded before the step (query_start, seq_lens, positions, slots, block tables), and pull
// the first block-table entries and constants they read after the wait into L1. That index chain
// (3-4 dependent loads) then overlaps the previous kernel's tail instead of following it.
// PDL_PREWAIT_INDEX=0 finds it after the wait, for A/B runs.
#ifndef PDL_PREWAIT_INDEX
#define PDL_PREWAIT_INDEX 1
#endif

// A load of what another kernel of the step wrote (activations: a product's x, q, v, gate_up),
// never through the read-only path: __ldg, or a plain load of a const
// __restrict__ pointer, which nvcc makes ld.global.nc. That path may only read data that stays
// unchanged while the kernel lives, and under PDL a kernel lives beside the one writing its input.
// Measured on the H200 (session 41, part246-part248): the folded norms read the previous product's
// output x through it, and SmolLM2's greedy runs on graphs differed between repeats, some tokens
// thousands of ranks down the prefill's list: ptxas had moved that load above griddepcontrol.wait
// (ACQBULK in the SASS, session 42), free to since the path promises the data never changes;
// read from L2, 8 of 8 repeats agreed. Weights, unchanged for the engine's life, and the step inputs
// the host uploads before a launch keep __ldg (scripts/pdl_load_lint.py checks the PTX in CI).
// Through L1 (ld.global.ca, ACT_LOADS_CA=1, the default since session 44): PTX's default cache
// operator, so what a plain load of a pointer not known read-only compiles to, and the load CUDA's
// PDL pattern has after cudaGridDependencySynchronize; the memory model orders it after the wait as
// it does an L2 load. It pays here because the 9-16-row products' CTAs on one SM all read the
// same x, about half as many bytes as their weights, and L1 serves the later ones. The c = 1 DFlash
// round's graph (8B, 9-row products) 6.449 -> 6.069 ms against L2 loads (ld.global.cg, ACT_LOADS_CA=0),
// the repeat tests passing (session 44, part262); batch-1 graphs 0.6B -0.4%, 8B +0.06% (part263).
// ACT_LOADS_NC=1 restores the read-only path, for A/B runs only.
#ifndef ACT_LOADS_NC
#define ACT_LOADS_NC 0
#endif
#ifndef ACT_LOADS_CA
#define ACT_LOADS_CA 1
#endif
template <typename V>
__device__ __forceinline__ V load_act(const V* p) {
#if ACT_LOADS_NC
  return __ldg(p);
#elif ACT_LOADS_CA
  return __ldca(p);  // ld.global.ca: through L1 (SASS: LDG.E.128.STRONG.SM)
#else
  return __ldcg(p);  // ld.global.cg: L2 only (LDG.E.128.STRONG.GPU)
#endif
}

// Pulls the 128-byte line holding p into L1 without waiting for it (a hint: nothing is returned,
// no register is held). For step inputs a kernel reads right after its PDL wait.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Which attention kernel takes a sequence of nq new queries and L keys of context in a step that
// launches both (decode_attention.cu and prefill_attention.cu, each skipping what the other takes):
// a short run of 2+ queries (speculative verification, a DFlash block) goes to the tensor-core
// kernel while its context is at most short_max_ctx keys (0: never). There one CTA reads each K/V
// tile once for all the run's queries; the decode kernel has a CTA a query, so a 9-query
// verification block read its KV 9 times (8B shape, 16 sequences of 512: 129 us a layer against
// 25 us for a plain decode step, part94). Past short_max_ctx the decode kernel's split KV keeps
// the GPU full where one CTA a KV head would not. One rule for both kernels, depending on the
// sequence alone, so a row's kernel never depends on what shares its step (its split count only
// on the step's size, where the partials would not fit the scratch: steps of thousands of rows).
// A short run has at most MINILLM_SHORT_RUN_MAX_Q queries (cuda_ops.py's _DECODE_MAX_Q): the host
// sizes the short-run launch's grid for runs of at most that many. Without the bound a prefill chunk
// with at most short_max_ctx keys also counted as one there, so the (tile, split) pairs outran the
// grid: the last tile reached could run only some of its splits, leaving its merge counter set, and
// a later launch's merge at that counter then read partials not yet written (session 36: initcheck's
// reports in the load, MINILLM_CHECK_ATT_COUNTERS).
#define MINILLM_SHORT_RUN_MAX_Q 16
__device__ __forceinline__ bool short_run_on_tensor_cores(int nq, int L, int short_max_ctx) {
  return short_max_ctx > 0 && nq >= 2 && nq <= MINILLM_SHORT_RUN_MAX_Q && L <= short_max_ctx;
}

// The sequence owning row t of a step: the last b with query_start[b] <= t (so empty sequences
// are skipped); the caller has checked t < query_start[B].
__device__ __forceinline__ int seq_of_row(const int* query_start, int B, int t) {
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (query_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- flash-decoding splits, shared by decode_attention.cu (which writes them) and gemv.cu's
// gemv1_merge_* (the batch-1 o product, which can merge them itself): both count and weigh the
// splits through these, so the merged rows are the same bits whichever kernel merges.

// Keys a split of a decode row with k_hi keys: ceil(k_hi / n_splits) rounded up to 16, at least
// min_part (n_splits > 1). Splits holding keys: max(1, ceil(k_hi / part)).
__device__ __forceinline__ int decode_split_part(int k_hi, int n_splits, int min_part) {
  const int part = (k_hi + n_splits - 1) / n_splits;
  return max(min_part, (part + 15) / 16 * 16);
}

// One warp's share of a merge: a head's split weights w[s] = 2^(m_s - M) (0 for a split without
// keys, m_s = -inf) into w_row[0, 64) (0 from n_active on), from its (m, l) pairs (two a lane:
// n_active <= 64, loaded by split_pairs); returns sum_s w_s * l_s, the denominator, to every lane.
struct SplitPairs {
  float2 v[2];  // splits lane and lane + 32
};
__device__ __forceinline__ SplitPairs split_pairs(const float2* ml, int n_active, int lane) {
  SplitPairs p;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int sp = lane + 32 * i;
    p.v[i] = sp < n_active ? __ldcg(ml + sp) : make_float2(neg_inf(), 0.f);
  }
  return p;
}
__device__ __forceinline__ float split_weights(const SplitPairs& p, int n_active, int lane, float* w_row) {
  const float M = warp_max(fmaxf(fmaxf(neg_inf(), p.v[0].x), p.v[1].x));
  float den = 0.f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int sp = lane + 32 * i;
    if (sp < n_active) {
      const float w = p.v[i].x == neg_inf() ? 0.f : exp2f(p.v[i].x - M);
      w_row[sp] = w;
      den = fmaf(w, p.v[i].y, den);
    } else {
      w_row[sp] = 0.f;  // read as no weight
    }
  }
  return warp_sum(den);
}

// The merge of one element: sum_s w_s * x_s in split order, zero weights skipped, divided by den
// and rounded to storage (0 without keys).
__device__ __forceinline__ float merge_add(float o, float w, float x) { return w > 0.f ? fmaf(w, x, o) : o; }
template <typename T>
__device__ __forceinline__ T merge_result(float o, float den) { return from_f<T>(den > 0.f ? o / den : 0.f); }

// Eight bf16 values moved as one 16-byte word, converted to and from fp32. The word is taken by
// value: given a reference into global memory (unpack_bf16x8(ptr[c], f)), reinterpreting its
// address as bf16 pairs made nvcc load it as four 4-byte words, so every GEMV's x chunk,
// rms_norm_vec's rows and silu_mul_bf16_vec8's inputs took four load instructions instead of one
// (found in session 19 from the PTX; only those 7 kernels' code changed).
__device__ __forceinline__ void unpack_bf16x8(const uint4 u, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float* f) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return u;
}

// c (16x8 fp32) += a (16x16 bf16, row-major) * b (16x8 bf16, "col": each column's k contiguous),
// one warp's mma.sync. Fragments (g = lane / 4, t = lane % 4): a0 = (row g, k 2t..2t+1), a1 = (row
// g + 8, same k), a2 = (row g, k 2t + 8..), a3 = (row g + 8, k 2t + 8..); b0 = (k 2t..2t+1, col g),
// b1 = (k 2t + 8.., col g); c = (row g, cols 2t, 2t+1), then (row g + 8, the same cols).
__device__ __forceinline__ void mma_bf16_16816(float* c, unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Shared-memory address of a generic pointer into shared memory (for ldmatrix and cp.async).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices from shared memory, lane l giving the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16 bytes global -> shared, asynchronously (cp.async groups); src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// ---- thread-block clusters (Hopper)
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster; shared-memory writes before it are visible after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Shared-memory address addr (this CTA's window) in the cluster's CTA `rank`, for ld.shared::cluster.
__device__ __forceinline__ unsigned cluster_map(unsigned addr, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}

// 16 bytes at shared-memory address addr (this CTA's window) of the cluster's CTA `rank`.
__device__ __forceinline__ uint4 ld_cluster_u4(unsigned addr, unsigned rank) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(cluster_map(addr, rank)));
  return v;
}

// The double at shared-memory address addr (this CTA's window) of the cluster's CTA `rank`.
__device__ __forceinline__ double ld_cluster_f64(unsigned addr, unsigned rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(cluster_map(addr, rank)));
  return v;
}

// The 4- and 8-byte integers at shared-memory address addr (this CTA's window) of the cluster's CTA `rank`.
__device__ __forceinline__ unsigned ld_cluster_u32(unsigned addr, unsigned rank) {
  unsigned v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_map(addr, rank)));
  return v;
}

__device__ __forceinline__ unsigned long long ld_cluster_u64(unsigned addr, unsigned rank) {
  unsigned long long v;
  asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(cluster_map(addr, rank)));
  return v;
}

// warp_qk_norm_rope for D = 32 N with N even: lane l holds elements l + 32 m (m < N) in
// registers, so element i and its rotation partner i +- D / 2 sit in the same lane, and every load
// (x, w, the cos/sin row) is issued before any arithmetic. The same operations in the same order
// as the general loop below, so the same bits; in an 8,192-token prefill step the general loop (its
// loads spread over three dependent phases, through shared memory) took 110 us a layer (part85).
template <typename T, int N, typename Store>
__device__ __forceinline__ void warp_qk_norm_rope_regs(const T* x, const T* w, float eps, const float* cs,
                                                       int lane, Store store) {
  constexpr int HN = N / 2, D = 32 * N;
  float xv[N], wv[N], c[HN], s[HN];
#pragma unroll
  for (int m = 0; m < N; ++m) {
    xv[m] = to_f(load_act(x + lane + 32 * m));  // the qkv product's rows (the fused decode step read them nc)
    wv[m] = w != nullptr ? to_f(w[lane + 32 * m]) : 0.f;
  }
#pragma unroll
  for (int m = 0; m < HN; ++m) {
    c[m] = cs[lane + 32 * m];
    s[m] = cs[D / 2 + lane + 32 * m];
  }
  if (w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int m = 0; m < N; ++m) ss = __fadd_rn(ss, __fmul_rn(xv[m], xv[m]));
    const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(warp_sum(ss), (float)D), eps));
#pragma unroll
    for (int m = 0; m < N; ++m) xv[m] = to_f(from_f<T>(__fmul_rn(__fmul_rn(xv[m], rstd), wv[m])));
  }
#pragma unroll
  for (int m = 0; m < N; ++m) {
    const float r = m < HN ? __fsub_rn(__fmul_rn(xv[m], c[m]), __fmul_rn(xv[m + HN], s[m]))
                           : __fadd_rn(__fmul_rn(xv[m], c[m - HN]), __fmul_rn(xv[m - HN], s[m - HN]));
    store(lane + 32 * m, from_f<T>(r));
  }
}

// Qwen3's per-head q/k step for one head of D values, by one warp: RMS-normalised with weights w
// (skipped when w is null; rounded to storage like the NumPy twin, which stores the normalised
// head before rotating it), then rotated (rotate-half RoPE with the position's cos/sin row cs:
// cos in its first half, sin in its second). b is D floats of scratch; store(i, value) gets
// element i of the result, rounded to storage, for i = lane, lane + 32, ... (each lane stores
// only elements it read, so x may be the destination). Shared by norm.cu's qk_norm_rope kernels
// and decode_attention.cu's fused decode step, so both round alike.
template <typename T, typename Store>
__device__ __forceinline__ void warp_qk_norm_rope(const T* x, const T* w, float eps, const float* cs,
                                                  float* b, int D, int lane, Store store) {
  if (D == 128) return warp_qk_norm_rope_regs<T, 4>(x, w, eps, cs, lane, store);
  if (D == 64) return warp_qk_norm_rope_regs<T, 2>(x, w, eps, cs, lane, store);
  if (D == 256) return warp_qk_norm_rope_regs<T, 8>(x, w, eps, cs, lane, store);
  // explicit roundings (no contraction into fma): the same bits whichever kernel inlines it
  float ss = 0.f;
  for (int i = lane; i < D; i += 32) {
    const float xi = to_f(load_act(x + i));
    b[i] = xi;
    ss = __fadd_rn(ss, __fmul_rn(xi, xi));
  }
  if (w != nullptr) {
    const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(warp_sum(ss), (float)D), eps));
    for (int i = lane; i < D; i += 32) b[i] = to_f(from_f<T>(__fmul_rn(__fmul_rn(b[i], rstd), to_f(w[i]))));
  }
  __syncwarp();
  const int half = D / 2;
  for (int i = lane; i < D; i += 32) {
    const int j = i < half ? i : i - half;
    const float c = cs[j], s = cs[half + j];
    const float r = i < half ? __fsub_rn(__fmul_rn(b[i], c), __fmul_rn(b[i + half], s))
                             : __fadd_rn(__fmul_rn(b[i], c), __fmul_rn(b[i - half], s));
    store(i, from_f<T>(r));
  }
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32
// values; every thread gets the result. Ends with a barrier, so scratch can be reused at once.
template <typename F>
__device__ __forceinline__ F block_sum(F v, F* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : F(0);
  v = warp_sum(v);
  __syncthreads();
  return v;
}

}  // namespace minillm
