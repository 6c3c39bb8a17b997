#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The persistent 128x128 s6 GEMM, unclustered and in 2x1 clusters (B multicast), with its TMA loads' L2
promotion at 256 B (the package's), 128 B and none: built from patched tracing into stand-alone .so files, so the
package sources (and the pinned bench baseline) stay as they are.

    python tools/probes/gemm_l2_promotion.py build            # CPU machine: build/l2exp/*.so + index.json
    python tools/probes/gemm_l2_promotion.py run [--ncu]      # GPU host (carry build/l2exp): time vs cuBLAS

``run`` checks each variant against an fp32 oracle on NaN-poisoned output, then times all of them and cuBLAS
interleaved with a cold L2 (``bench.time_calls``); ``--ncu`` makes one call each inside the profiler range (run it
under ``ncu --profile-from-start off``). Results of 2026-12-03: ``docs/measurements/2026-12-03e-h200/l2-promotion.log``.
"""

from __future__ import annotations

import json
import sys

OUT_DIR = "build/l2exp"
SHAPES = [(512, 4096, 14336), (512, 28672, 8192), (2048, 7168, 2048), (512, 4096, 4096)]


def build() -> None:
    from tirx_kernels.core import build as kbuild
    from tirx_kernels.core.lang import tma
    from tirx_kernels.gemm import _persistent

    promos = {"p256": tma.L2_PROMOTION_256B, "p128": tma.L2_PROMOTION_128B, "p0": tma.L2_PROMOTION_NONE}
    orig = tma.L2_PROMOTION_256B
    index = {}
    for cluster_m in (1, 2):
        for name, value in promos.items():
            tma.L2_PROMOTION_256B = value  # read while the kernel is traced
            try:
                func = _persistent.build_persistent_kernel("bfloat16", 128, 128, 64, 6, cluster_m, 8, 132, pdl="end")
            finally:
                tma.L2_PROMOTION_256B = orig
            so = f"{OUT_DIR}/c{cluster_m}_{name}.so"
            print(so, kbuild.build_so(func, so).ptxas_info)
            index[f"c{cluster_m}_{name}"] = so
    with open(f"{OUT_DIR}/index.json", "w") as f:
        json.dump(index, f)


def run(ncu: bool) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812
    import tvm_ffi

    from tirx_kernels.core.bench import time_calls

    with open(f"{OUT_DIR}/index.json") as f:
        fns = {k: tvm_ffi.load_module(v)["main"] for k, v in json.load(f).items()}
    for M, N, K in SHAPES[:1] if ncu else SHAPES:  # noqa: N806
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16()
        if ncu:
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                for fn in fns.values():
                    fn(a, b, out)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            for fn in fns.values():
                fn(a, b, out)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            return
        ref = a.float() @ b.float().T
        calls = {}
        for name, fn in fns.items():
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            fn(a, b, out)
            torch.cuda.synchronize()
            err = float((out.float() - ref).norm() / ref.norm())
            if not err < 1e-2:
                raise AssertionError(f"{name}: relative error {err:.3g}")
            calls[name] = lambda fn=fn, out=out, a=a, b=b: fn(a, b, out)
        calls["cublas"] = lambda a=a, b=b: F.linear(a, b)
        t = time_calls(calls, calls=20, rounds=5)
        cb = t["cublas"]["median_us"]
        print(f"{M}x{N}x{K} cuBLAS {cb:.1f} us | " + " ".join(
            f"{k} {v['median_us']:.1f} ({cb / v['median_us']:.3f})" for k, v in t.items() if k != "cublas"), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build()
    elif sys.argv[1:2] == ["run"]:
        run("--ncu" in sys.argv)
    else:
        sys.exit(__doc__)
