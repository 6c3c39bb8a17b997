# SPDX-License-Identifier: Apache-2.0
"""cuBLAS's kernel for every issue-#4 shape with M > 128 (bf16, C = A @ B^T through F.linear), by name: nvjet's
names carry the tile, stages, cluster and raster (``nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN``: a 176 x 128 tile in
cuBLAS's column-major view, i.e. 128 rows of our M x 176 columns of our N; 64-deep k-tiles, 5 stages; a 1 x 2
cluster along our M, so the two CTAs share B). GPU host:

    python3 tools/probes/cublas_kernel_names.py > cublas-names.log
"""

import os
import sys

import torch
import torch.nn.functional as F  # noqa: N812
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gemm_sweep  # noqa: E402


def main() -> int:
    for M, N, K in gemm_sweep.shapes("large"):  # noqa: N806
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16()
        F.linear(a, b)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            F.linear(a, b)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                 and "memset" not in e.name.lower()]
        print(f"{M}x{N}x{K}", " | ".join(n[:70] for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
