"""How many clusters of each split sampling kernel (cuda/sampling.cu) an idle GPU runs at once.

    python scripts/cluster_occupancy.py

The split sampler and split verification give a row a cluster of 8, 4 or 2 CTAs; a batch of more rows than the
GPU holds clusters at once runs in two waves, which measured slower (H100, 132 SMs: clusters of 8 faster up to
15 rows and slower at 16, part354-356; clusters of 4 faster up to 30 and slower at 31, part359). The driver's
count (cuOccupancyMaxActiveClusters) is exactly that edge, 15 and 30 there where the SM count says 16 and 33, and
is the default of MINILLM_SAMPLE_CLUSTER_ROWS / MINILLM_VERIFY_CLUSTER_ROWS, the *_CLUSTER4_ROWS tiers and
MINILLM_VERIFY_PAIR_ROWS, and two pairs fewer that of MINILLM_SAMPLE_CLUSTER2_ROWS (part362: the pairs' full wave
was mixed); _clusters_at_once in minillm/backends/cuda_ops.py. This prints it beside the SM count for each kernel.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the cluster kernels and their CTAs a cluster (cuda/sampling.cu's __cluster_dims__)
KERNELS = {"sample_tokens_cl8": 8, "sample_tokens_cl4": 4, "sample_tokens_cl2": 2, "verify_drawn_drafts_cl8": 8,
           "verify_drawn_drafts_cl4": 4, "verify_drawn_drafts_pair": 2}
THREADS = 512  # the cluster kernels are built at 512 threads only


def main() -> int:
    import cupy

    from minillm.backends.compile import get_kernel
    from minillm.backends.pdl import max_active_clusters

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    print(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: {sms} SMs")
    print(f"{'kernel':28s} {'CTAs':>4s} {'clusters at once':>16s} {'SM count // CTAs':>16s}")
    for name, ctas in KERNELS.items():
        fn = get_kernel("sampling", name)
        n = max_active_clusters(fn.kernel.ptr, ctas * 64, THREADS)
        print(f"{name:28s} {ctas:4d} {n:16d} {sms // ctas:16d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
