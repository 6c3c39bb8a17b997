#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""L2 eviction priorities on the GEMM's TMA loads: how much of the gap between the kernel fed from DRAM and the
same kernel with its operands L2-resident (``gemm_mainloop_ceiling.py``'s ``l2hot``: 4.6 % at 512x4096x14336, 3.3 %
at 4096^3, 2 % at 2048x7168x2048 on 2026-12-04) they recover.

    python tools/probes/gemm_l2_hints.py build     # CPU machine: build/l2hints/*.so + index.json
    python tools/probes/gemm_l2_hints.py run       # GPU host: cuBLAS/ours per variant

Why they might: the suite's cold-L2 flush (a 512 MiB write) leaves L2 full of dirty lines, and so does any
producer kernel in a real model; rmsnorm's and act_and_mul's loads gained 1-4 % from evict_last / evict_first
priorities that decide which lines leave L2 first (``docs/perf-notes.md``, 2026-12-03b/c). In the GEMM, an A
row-panel is reused by every N-tile of its raster group (long reuse) and a B panel by the group's M-tiles, which
read it at about the same time (short reuse). Each variant sets one ``.L2::cache_hint`` priority for the A loads
and one for the B loads (CUTLASS's constant ``createpolicy`` encodings of a whole-range policy), patched into the
tracing of the package's kernels (the package and the pinned bench baseline stay as they are); each is checked
against an fp32 oracle on NaN-poisoned output before it is timed.
"""

from __future__ import annotations

import contextlib
import json
import sys

OUT_DIR = "build/l2hints"
# createpolicy.fractional.L2::<priority>.b64 with fraction 1.0 (CUTLASS's TMA::CacheHintSm90 values).
POLICY = {"first": 0x12F0000000000000, "normal": 0x1000000000000000, "last": 0x14F0000000000000}
HINTS = [("first", "first"), ("last", "first"), ("normal", "first"), ("last", "normal")]  # (A, B)
PLAN = {
    (512, 4096, 14336): ["persistent_128x128x64_s6_g8"],
    (512, 7168, 2048): ["persistent_128x224x64_s4_g8"],
    (512, 6144, 4096): ["persistent_128x192x64_s4_g8"],
    (512, 28672, 8192): ["pingpong_128x176x64_s5_e64_g8"],
    (2048, 7168, 2048): ["pingpong_128x176x64_s5_e64_g8"],
    (4096, 4096, 4096): ["persistent_128x256x64_s4_e128_g8"],
    (8192, 8192, 8192): ["persistent_128x256x64_s4_e128_c2_g8"],
    (16384, 16384, 16384): ["persistent_128x256x64_s4_e128_g8"],
}


def variant_name(tile: str, hints) -> str:
    return tile if hints is None else f"{tile}-A{hints[0]}-B{hints[1]}"


@contextlib.contextmanager
def _hinted(hints):
    """The TMA box loads with an L2 priority per operand while a kernel is traced (A / B told apart by their tensor
    map's name, ``a_map`` / ``b_map`` in both kernels)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import tma

    load_2d = tma.load_2d

    def hinted_load_2d(dst, tmap, col, row, bar, multicast_mask=None):
        which = {"a_map": 0, "b_map": 1}[tmap.name]
        tma.load(dst, tmap, [col, row], bar, multicast_mask=multicast_mask,
                 cache_policy=T.uint64(POLICY[hints[which]]))

    if hints is not None:
        tma.load_2d = hinted_load_2d
    try:
        yield
    finally:
        tma.load_2d = load_2d


def build() -> None:
    import os

    from tirx_kernels.core import build as kbuild
    from tirx_kernels.gemm import fp16_bf16_gemm

    os.makedirs(OUT_DIR, exist_ok=True)
    index = {}
    for tiles in PLAN.values():
        for tile in tiles:
            for hints in [None, *HINTS]:
                name = variant_name(tile, hints)
                if name in index:
                    continue
                with _hinted(hints):
                    func = fp16_bf16_gemm.get_kernel("bfloat16", tile)
                so = f"{OUT_DIR}/{name}.so"
                print(name, kbuild.build_so(func, so).ptxas_info, flush=True)
                index[name] = so
    with open(f"{OUT_DIR}/index.json", "w") as f:
        json.dump(index, f)


def run() -> None:
    import torch
    import tvm_ffi
    from gemm_raster import checked_calls, print_summary, report_rows  # the probe beside this one

    from tirx_kernels.core.bench import time_calls

    with open(f"{OUT_DIR}/index.json") as f:
        fns = {k: tvm_ffi.load_module(v)["main"] for k, v in json.load(f).items()}
    summary = []
    for (M, N, K), tiles in PLAN.items():  # noqa: N806
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16()
        calls = checked_calls(fns, [variant_name(tile, h) for tile in tiles for h in [None, *HINTS]], a, b)
        flop = 2 * M * N * K
        t = time_calls(calls, calls=20, rounds=5)
        cb = t["cublas"]["median_us"]
        print(f"{M}x{N}x{K}: cuBLAS {cb:.1f} us ({flop / cb / 1e6:.0f} TFLOP/s)", flush=True)
        summary += report_rows(t, flop, f"{M}x{N}x{K}", 52)
    print_summary(summary, 52)

if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build()
    elif sys.argv[1:2] == ["run"]:
        run()
    else:
        sys.exit(__doc__)
