// prefetch.cu: l2_prefetch pulls byte ranges of the weights into the L2 cache ahead of the GEMV
// that will read them. Twin: NumpyBackend.l2_prefetch (a no-op: there is no cache to warm).
//
// Why: a batch-1 decode step is a chain of kernels, and only its GEMVs stream weights; while the
// chain runs the small ones (norms, q/k norm + RoPE, attention over a short context) HBM sits
// nearly idle. A prefetch issued before them lets the next GEMV find its first bytes in L2.
// cp.async.bulk.prefetch.L2 (sm_90) is fire-and-forget: the thread issues it and moves on, the
// copy engine fills L2 in the background, nothing waits on it and no register or shared memory
// holds the data, so the kernel that issues it (and the chain behind it) is not slowed.
//
// Ranges: up to PF_MAX_RANGES (pointer, bytes) pairs; every thread of the grid issues pieces of
// PF_PIECE bytes, round-robin across the grid (one SM's copy engine alone is too slow to cover tens
// of megabytes in a few microseconds). Pointers and sizes are 16-byte aligned (the host checks).
#include "common.cuh"

#define PF_MAX_RANGES 4
#ifndef PF_PIECE
#define PF_PIECE 16384
#endif

__device__ __forceinline__ void l2_prefetch_bulk(const char* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// grid any, block any: piece i of the concatenated ranges (p0, b0), ..., (p3, b3) goes to global
// thread i mod threads; unused ranges have 0 bytes. The backend launches it on a side stream (a
// branch of the captured graph) so the step's chain of kernels never waits for it: measured on the
// H200, a prefetch launched inside the chain made decode steps 22-44% slower.
extern "C" __global__ void l2_prefetch(const char* p0, i64 b0, const char* p1, i64 b1,
                                       const char* p2, i64 b2, const char* p3, i64 b3) {
  const char* ptr[PF_MAX_RANGES] = {p0, p1, p2, p3};
  const i64 bytes[PF_MAX_RANGES] = {b0, b1, b2, b3};
  const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 threads = (i64)gridDim.x * blockDim.x;
  i64 base = 0;  // index of range j's first piece among all pieces
#pragma unroll
  for (int j = 0; j < PF_MAX_RANGES; ++j) {
    const i64 pieces = (bytes[j] + PF_PIECE - 1) / PF_PIECE;
    // this thread's first piece of range j: the smallest i >= base with i % threads == tid
    for (i64 i = base + ((tid - base) % threads + threads) % threads; i < base + pieces; i += threads) {
      const i64 off = (i - base) * PF_PIECE;
      const i64 left = bytes[j] - off;
      l2_prefetch_bulk(ptr[j] + off, (unsigned)(left < PF_PIECE ? left : PF_PIECE));
    }
    base += pieces;
  }
}
