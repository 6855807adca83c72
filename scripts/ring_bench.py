"""How fast one CTA per SM can stream weights through a shared-memory ring (the question behind
cuda/decode_layers.cu's weight ring), with no GEMV work in the way.

    PYTHONPATH=. python scripts/ring_bench.py [--mib 1024]

Every CTA (one per SM, 512 threads) streams its contiguous share of a buffer through n slots of
S bytes: it waits for a slot, reads one word of it per thread (so it is consumed), syncs, refills
it with the tile n ahead. Copy engines: 'tma' (thread 0 issues one cp.async.bulk per tile),
'tma4' (four threads each issue a quarter), 'cpasync' (every thread copies 16-byte pieces),
'ldg' (no ring: every thread loads 4 x 16 bytes a round into registers and sums them). Prints
TB/s (CUDA events, median of 10) against a device-to-device copy's read + write bandwidth.
"""

from __future__ import annotations

import argparse

import numpy as np

SRC = r"""
typedef unsigned long long u64;
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void wait_bar(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
template <int MODE>  // 0 tma, 1 tma4, 2 cpasync
__device__ void issue(const char* src, unsigned dst, unsigned bar, int bytes) {
  if (MODE == 0) {
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
    }
  } else if (MODE == 1) {
    if (threadIdx.x == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
    __syncwarp();
    if (threadIdx.x < 4) {
      const int q = bytes / 4;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(dst + q * threadIdx.x), "l"(src + q * threadIdx.x), "r"(q), "r"(bar) : "memory");
    }
  } else {
    for (int i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst + i), "l"(src + i));
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
}
template <int MODE>
__device__ void ring(const char* base, long long per_cta, int n, int S, float* sink) {
  extern __shared__ __align__(128) char ring_mem[];
  __shared__ u64 bars[8];
  const char* src = base + blockIdx.x * per_cta;
  const int tiles = (int)(per_cta / S);
  if (MODE < 2 && threadIdx.x == 0) {
    for (int i = 0; i < n; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sa(bars + i)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  for (int j = 0; j < n; ++j) {
    if (j < tiles) issue<MODE>(src + (long long)j * S, sa(ring_mem) + j * S, sa(bars + j), S);
    else if (MODE == 2) asm volatile("cp.async.commit_group;" ::: "memory");
  }
  float acc = 0.f;
  for (int j = 0; j < tiles; ++j) {
    const int s = j % n;
    if (MODE < 2) {
      wait_bar(sa(bars + s), (unsigned)(j / n) & 1u);
    } else {
      switch (n - 1) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
      }
      __syncthreads();
    }
    acc += reinterpret_cast<const float*>(ring_mem + s * S)[threadIdx.x % (S / 4)];
    __syncthreads();
    if (j + n < tiles) issue<MODE>(src + (long long)(j + n) * S, sa(ring_mem) + s * S, sa(bars + s), S);
    else if (MODE == 2) asm volatile("cp.async.commit_group;" ::: "memory");
  }
  if (acc == 12345.f) sink[0] = acc;
}
#define RING(name, mode)                                                                  \
  extern "C" __global__ void __launch_bounds__(512, 1) name(const char* b, long long p, int n, \
                                                            int S, float* k) {             \
    ring<mode>(b, p, n, S, k);                                                            \
  }
RING(ring_tma, 0)
RING(ring_tma4, 1)
RING(ring_cpasync, 2)
extern "C" __global__ void __launch_bounds__(512, 1) stream_ldg(const uint4* b, long long per_cta, float* k) {
  const uint4* src = b + blockIdx.x * (per_cta / 16);
  unsigned acc = 0;
  for (long long i = threadIdx.x; i < per_cta / 16; i += 4 * 512) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = (i + u * 512 < per_cta / 16) ? __ldg(src + i + u * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345u) k[0] = (float)acc;
}
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024, help="bytes streamed in all (MiB)")
    a = p.parse_args()
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    mod = cp.RawModule(code=SRC, options=("-arch=sm_90a", "-std=c++17"))
    per_cta = (a.mib << 20) // sms // 65536 * 65536
    buf = cp.zeros(per_cta * sms // 4 + 1024, dtype=np.float32)
    sink = cp.zeros(1, dtype=np.float32)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(10):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(cp.cuda.get_elapsed_time(s, e) * 1e-3)
        return float(np.median(ts))

    dst = cp.empty_like(buf)
    t = timed(lambda: dst.__setitem__(slice(None), buf))
    print(f"{sms} SMs, {per_cta * sms / 2**20:.0f} MiB streamed; "
          f"device copy (read + write) {2 * buf.nbytes / t / 1e12:.2f} TB/s")
    k = mod.get_function("stream_ldg")
    t = timed(lambda: k((sms,), (512,), (buf, np.int64(per_cta), sink)))
    print(f"{'ldg (no ring)':28s} {per_cta * sms / t / 1e12:6.2f} TB/s")
    for name in ("tma", "tma4", "cpasync"):
        k = mod.get_function(f"ring_{name}")
        for n, S in ((2, 98304), (4, 49152), (4, 32768), (6, 32768), (8, 24576), (8, 16384), (8, 8192)):
            k.max_dynamic_shared_size_bytes = n * S
            t = timed(lambda k=k, n=n, S=S: k((sms,), (512,), (buf, np.int64(per_cta), np.int32(n), np.int32(S),
                                                            sink), shared_mem=n * S))
            print(f"{name + f' {n} x {S // 1024} KiB':28s} {per_cta * sms / t / 1e12:6.2f} TB/s")


if __name__ == "__main__":
    main()
