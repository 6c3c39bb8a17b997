#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where the mid-M GEMM rows lose their time: each tile as built, with its data always L2-resident, and with no
loads at all.

    python tools/probes/gemm_mainloop_ceiling.py build        # CPU machine: build/ceiling/*.so + index.json
    python tools/probes/gemm_mainloop_ceiling.py run [--ncu [--only NAME,...] [--first]]  # GPU host: time vs cuBLAS

Three builds of every tile, from patched tracing (the package sources and the pinned bench baseline stay as they
are):

- ``base``: the package's kernel;
- ``l2hot``: every TMA load reads K-columns [0, block_k) of its tile's rows, so after the first touch each CTA's
  operands sit in L2 (a few MB in all): the mainloop fed from L2 with no DRAM traffic and no L2 capacity misses;
- ``nold``: no TMA loads at all; the producer arrives on the full barrier without transaction bytes, so the
  consumers run every wgmma on whatever the ring holds: the ceiling of the consumer loop itself (barriers, wgmma
  issue, the epilogue), with the tensor pipe as the only shared resource.

``l2hot`` and ``nold`` compute wrong products and are only timed; ``base`` is checked against an fp32 oracle on
NaN-poisoned output first. ``--ncu`` makes one call each (and cuBLAS's) inside the profiler range for
``ncu --profile-from-start off``, of the builds in ``--only`` (all by default), at the first shape only with
``--first``.
"""

from __future__ import annotations

import json
import sys

OUT_DIR = "build/ceiling"
SHAPES = [(512, 4096, 14336), (2048, 7168, 2048), (4096, 4096, 4096)]
TILES = ["persistent_128x128x64_s6_g8", "persistent_128x128x64_s6_c2n_g8_wg", "persistent_128x256x64_s4_e128_g8",
         "pingpong_128x128x64_s6_e64_g8", "pingpong_128x176x64_s5_e64_g8"]
MODES = ("base", "l2hot", "nold")


def _patched(mode: str):
    """Context manager: the TMA load / expect-tx helpers as ``mode`` needs them while a kernel is traced."""
    import contextlib

    from tirx_kernels.core.lang import mbarrier, tma

    @contextlib.contextmanager
    def patch():
        load_2d, expect = tma.load_2d, mbarrier.arrive_expect_tx
        if mode == "l2hot":
            # NT operands: col is the K coordinate of both A and B boxes.
            tma.load_2d = lambda dst, tmap, col, row, bar, multicast_mask=None: load_2d(
                dst, tmap, 0, row, bar, multicast_mask=multicast_mask)
        elif mode == "nold":
            tma.load_2d = lambda *args, **kwargs: None
            mbarrier.arrive_expect_tx = lambda bar, nbytes: mbarrier.arrive(bar)
        try:
            yield
        finally:
            tma.load_2d, mbarrier.arrive_expect_tx = load_2d, expect

    return patch()


def build() -> None:
    import os

    from tirx_kernels.core import build as kbuild
    from tirx_kernels.gemm import fp16_bf16_gemm

    os.makedirs(OUT_DIR, exist_ok=True)
    index = {}
    for tile in TILES:
        for mode in MODES:
            with _patched(mode):
                func = fp16_bf16_gemm.get_kernel("bfloat16", tile)
            name = f"{tile}-{mode}"
            so = f"{OUT_DIR}/{name}.so"
            print(name, kbuild.build_so(func, so).ptxas_info, flush=True)
            index[name] = so
    with open(f"{OUT_DIR}/index.json", "w") as f:
        json.dump(index, f)


def run(ncu: bool, only: list[str] | None = None, first: bool = False) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812
    import tvm_ffi

    from tirx_kernels.core.bench import time_calls

    with open(f"{OUT_DIR}/index.json") as f:
        fns = {k: tvm_ffi.load_module(v)["main"] for k, v in json.load(f).items() if not only or k in only}
    for M, N, K in SHAPES[:1 if first else 2] if ncu else SHAPES:  # noqa: N806
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16()
        if ncu:
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                for fn in fns.values():
                    fn(a, b, out)
                F.linear(a, b)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            for name, fn in fns.items():
                print(M, N, K, name, flush=True)
                fn(a, b, out)
            F.linear(a, b)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            continue
        ref = a.float() @ b.float().T
        calls = {}
        for name, fn in fns.items():
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            fn(a, b, out)
            torch.cuda.synchronize()
            if name.endswith("-base"):
                err = float((out.float() - ref).norm() / ref.norm())
                if not err < 1e-2:
                    raise AssertionError(f"{name}: relative error {err:.3g}")
            calls[name] = lambda fn=fn, out=out, a=a, b=b: fn(a, b, out)
        calls["cublas"] = lambda a=a, b=b: F.linear(a, b)
        t = time_calls(calls, calls=20, rounds=5)
        cb = t["cublas"]["median_us"]
        flop = 2 * M * N * K
        print(f"{M}x{N}x{K}: cuBLAS {cb:.1f} us ({flop / cb / 1e6:.0f} TFLOP/s)", flush=True)
        for tile in TILES:
            us = [t[f"{tile}-{m}"]["median_us"] for m in MODES]
            print(f"  {tile:40s} " + "  ".join(f"{m} {u:7.1f} ({cb / u:.3f})" for m, u in zip(MODES, us)), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build()
    elif sys.argv[1:2] == ["run"]:
        names = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
        run("--ncu" in sys.argv, names, "--first" in sys.argv)
    else:
        sys.exit(__doc__)
