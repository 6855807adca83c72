"""How fast one CTA per SM can stream weights through a shared-memory ring (the question behind
cuda/decode_layers.cu's weight ring), with no GEMV work in the way, and then with it.

    PYTHONPATH=. python scripts/ring_bench.py [--mib 1024] [--gemv-only]

Every CTA (one per SM, 512 threads) streams its contiguous share of a buffer through n slots of
S bytes: it waits for a slot, reads one word of it per thread (so it is consumed), syncs, refills
it with the tile n ahead. Copy engines: 'tma' (thread 0 issues one cp.async.bulk per tile),
'tma4' (four threads each issue a quarter), 'cpasync' (every thread copies 16-byte pieces),
'ldg' (no ring: every thread loads 4 x 16 bytes a round into registers and sums them). Prints
TB/s (CUDA events, median of 10) against a device-to-device copy's read + write bandwidth.

Then 'gemv': the decoder's own arrangement outside the decoder: 15 compute warps and a producer
warp whose lane 0 issues one bulk copy per tile once every compute thread has arrived on the slot's
empty barrier; the compute warps run decode_layers.cu's GEMV loop on each tile (row pairs over K
parts, bf16 unpacked to fp32 FMAs, warp sums) against an x of K = 4096, or skip it. Inside the
decoder a computed tile cost ~1.2-1.4 us whatever it held (docs/BENCHMARKS.md, session 6): if
the same loop here streams near the ring's bandwidth, the cost comes from the decoder around it.
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
// The decoder's ring and GEMV loop, alone: 480 compute threads + a producer warp.
__device__ __forceinline__ uint4 lds128(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ float wsum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
extern "C" __global__ void __launch_bounds__(512, 1) ring_gemv(const char* base, long long per_cta, int n, int S,
                                                               int K, int compute, const uint4* x, float* sink) {
  extern __shared__ __align__(128) char ring_mem[];
  __shared__ u64 full[8], empty[8];
  __shared__ __align__(16) uint4 xh[1024];  // K <= 8192
  __shared__ float red[2048];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* src = base + blockIdx.x * per_cta;
  const int tiles = (int)(per_cta / S), rt = S / (2 * K), chunks = K / 8;
  const int ks = max(1, min(15 / ((rt + 1) / 2), chunks));
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sa(full + i)));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 480;" :: "r"(sa(empty + i)));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = threadIdx.x; i < chunks; i += 512) xh[i] = x[i];
  __syncthreads();
  if (warp == 15) {  // the producer
    if (lane == 0)
      for (int j = 0; j < tiles; ++j) {
        if (j >= n) wait_bar(sa(empty + j % n), (unsigned)(j / n - 1) & 1u);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(full + j % n)), "r"(S)
                     : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(sa(ring_mem) + (j % n) * S), "l"(src + (long long)j * S), "r"(S), "r"(sa(full + j % n))
                     : "memory");
      }
    return;
  }
  float keep = 0.f;
  const unsigned xsa = sa(xh);
  for (int j = 0; j < tiles; ++j) {
    wait_bar(sa(full + j % n), (unsigned)(j / n) & 1u);
    const unsigned tile = sa(ring_mem) + (j % n) * S;
    const int units = compute ? (rt + 1) / 2 * ks : 0;
    for (int u = warp; u < units; u += 15) {
      const int pr = u / ks, part = u % ks;
      const int ra = 2 * pr, rb = min(ra + 1, rt - 1);
      const int c0 = part * chunks / ks, c1 = (part + 1) * chunks / ks;
      const unsigned wa_sa = tile + 16u * (ra * chunks), wb_sa = tile + 16u * (rb * chunks);
      float acc0 = 0.f, acc1 = 0.f;
#pragma unroll 2
      for (int c = c0 + lane; c < c1; c += 32) {
        float xf[8], wa[8], wb[8];
        unpack8(lds128(xsa + 16u * c), xf);
        unpack8(lds128(wa_sa + 16u * c), wa);
        unpack8(lds128(wb_sa + 16u * c), wb);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          acc0 = fmaf(xf[k], wa[k], acc0);
          acc1 = fmaf(xf[k], wb[k], acc1);
        }
      }
      acc0 = wsum(acc0);
      acc1 = wsum(acc1);
      if (lane == 0) {
        red[(ra * ks + part) & 2047] = acc0;
        red[((ra + 1) * ks + part) & 2047] = acc1;
      }
    }
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(sa(empty + j % n)) : "memory");
    keep += red[threadIdx.x & 2047];
  }
  if (keep == 12345.f) sink[0] = keep;
}
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
    p.add_argument("--gemv-only", action="store_true", help="only the decoder's ring + GEMV loop")
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
    if not a.gemv_only:
        k = mod.get_function("stream_ldg")
        t = timed(lambda: k((sms,), (512,), (buf, np.int64(per_cta), sink)))
        print(f"{'ldg (no ring)':28s} {per_cta * sms / t / 1e12:6.2f} TB/s")
        for name in ("tma", "tma4", "cpasync"):
            k = mod.get_function(f"ring_{name}")
            for n, S in ((2, 98304), (4, 49152), (4, 32768), (6, 32768), (8, 24576), (8, 16384), (8, 8192)):
                k.max_dynamic_shared_size_bytes = n * S
                t = timed(lambda k=k, n=n, S=S: k((sms,), (512,), (buf, np.int64(per_cta), np.int32(n),
                                                                np.int32(S), sink), shared_mem=n * S))
                print(f"{name + f' {n} x {S // 1024} KiB':28s} {per_cta * sms / t / 1e12:6.2f} TB/s")
    K = 4096
    x = cp.asarray(np.random.default_rng(0).integers(0, 2**31, K // 2, dtype=np.int64).astype(np.uint32))
    k = mod.get_function("ring_gemv")
    print(f"{'gemv (K = 4096)':28s} {'TB/s':>6s} {'us a tile':>10s}   {'no GEMV work: TB/s':>18s} {'us a tile':>10s}")
    for n, rows in ((2, 11), (3, 5), (4, 5), (5, 3), (8, 2)):
        S = rows * 2 * K
        k.max_dynamic_shared_size_bytes = n * S
        tiles = per_cta // S
        cols = []
        for compute in (1, 0):
            t = timed(lambda n=n, S=S, compute=compute, tiles=tiles: k(
                (sms,), (512,), (buf, np.int64(tiles * S), np.int32(n), np.int32(S), np.int32(K), np.int32(compute),
                                 x, sink), shared_mem=n * S))
            cols.append(f"{tiles * S * sms / t / 1e12:6.2f} {t / tiles * 1e6:10.2f}")
        print(f"{f'gemv {n} x {S // 1024} KiB ({rows} rows)':28s} {cols[0]}   {cols[1]:>29s}")


if __name__ == "__main__":
    main()
