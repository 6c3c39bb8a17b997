#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Does the raster decide the mid-M GEMM rows? Each worst-row tile rebuilt with other ``group_m`` values (the grouped
raster's height; every TILE_CONFIGS entry has used 8 so far, never swept), timed against cuBLAS, with the GPU's SM
clock and board power sampled during each shape's rounds.

    python tools/probes/gemm_raster.py build      # CPU machine: build/raster/*.so + index.json
    python tools/probes/gemm_raster.py run        # GPU host: cuBLAS/ours per variant, clocks per shape
    ncu --profile-from-start off ... python tools/probes/gemm_raster.py run --ncu   # one call each, first shape

Why it might: the Nsight Compute counters of 2026-12-03e (``docs/measurements/2026-12-03e-h200/ncu-l2.csv``) show
every kernel at 512x4096x14336 delivering 939.5 MB to the SMs while the L2 serves only 16.8 M sectors (537 MB) of
SM reads for ours unclustered, 18.5 M in 2x1 clusters, 22.9 M in 1x2 clusters and 11.8 M for cuBLAS's 1x2-equivalent
kernel: identical requests from different SMs are merged somewhere before the L2 slices, and how much depends on
which CTAs read the same panel at the same time, i.e. on the raster and on where its CTAs sit. The variants are
built from patched ``TILE_CONFIGS`` entries (the package and the pinned bench baseline stay as they are), each
checked against an fp32 oracle on NaN-poisoned output before it is timed.

The 8192^3 row is timed twice: in a short burst on a GPU that idled first (as ``core.bench.ceilings`` times cuBLAS's
"ceiling") and in the usual 30 calls x 5 rounds, to show how much of the gap to the ceiling is the clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

OUT_DIR = "build/raster"
# (M, N, K): [(tile, [group_m values, or "gpc8"])]; the tile's own group_m (8) is always among them. "gpc8"
# (the 2-CTA cluster tiles at 512x4096x14336 only, where it is a bijection: 64 clusters): cluster tiles ct, ct + 8,
# ct + 16, ... share their B panels (and A through the cluster's own multicast or the same M-tiles), because the
# launch places consecutive clusters on consecutive SM pairs, which lie in different GPCs, eight apart in the same
# one (build/probes/cta_placement of 2026-12-04: SMs 2g, 2g + 1, 2g + 16, ... form GPC g), and the L2 request
# coalescer that merges identical reads works per GPC (ncu's lrc__* counters).
PLAN = {
    (512, 4096, 14336): [("persistent_128x128x64_s6_g8", [1, 2, 8]),
                         ("persistent_128x128x64_s6_c2n_g8_wg", [1, 2, 8, "gpc8"]),
                         ("persistent_128x128x64_s6_c2_g8", [2, 8, "gpc8"])],
    (2048, 7168, 2048): [("pingpong_128x176x64_s5_e64_g8", [1, 2, 4, 8, 16]),
                         ("persistent_128x176x64_s5_c2_g8", [2, 4, 8, 16])],
    (512, 7168, 2048): [("persistent_128x224x64_s4_g8", [1, 2, 8])],
    (512, 6144, 4096): [("persistent_128x192x64_s4_g8", [1, 2, 8])],
    (512, 28672, 8192): [("pingpong_128x176x64_s5_e64_g8", [1, 2, 8])],
    (8192, 8192, 8192): [("persistent_128x256x64_s4_e128_c2_g8", [4, 8, 16])],
    (16384, 16384, 16384): [("persistent_128x256x64_s4_e128_g8", [4, 8, 16, 32])],
}


def variant_name(tile: str, group_m) -> str:
    return tile.replace("_g8", f"_g{group_m}" if isinstance(group_m, int) else f"_{group_m}")


def _gpc8_coords(tile, num_m, num_n, group_m, cluster_m, rank, cluster_n=1):
    """Cluster tile -> (m_tile, n_tile) with the eight clusters of a GPC on one 4 x 4 block of tiles (see PLAN)."""
    g, j = tile % 8, tile // 8
    if cluster_n == 2:  # 4 M-tiles x 16 N-tile pairs: GPC g gets M-tiles 0-3 x pairs 2g, 2g + 1
        return j % 4, (2 * g + j // 4) * 2 + rank
    return (j % 2) * 2 + rank, 4 * g + j // 2  # 2 M-tile pairs x 32 N-tiles: GPC g gets both pairs x N 4g..4g+3


def build() -> None:
    import os

    from tirx_kernels.core import build as kbuild
    from tirx_kernels.core.lang import scheduler
    from tirx_kernels.gemm import fp16_bf16_gemm

    os.makedirs(OUT_DIR, exist_ok=True)
    index = {}
    for variants in PLAN.values():
        for tile, groups in variants:
            for g in groups:
                name = variant_name(tile, g)
                if name in index:
                    continue
                fp16_bf16_gemm.TILE_CONFIGS[name] = {**fp16_bf16_gemm.TILE_CONFIGS[tile],
                                                     "group_m": g if isinstance(g, int) else 8}
                coords = scheduler.cluster_tile_coords
                if g == "gpc8":
                    scheduler.cluster_tile_coords = _gpc8_coords
                try:
                    func = fp16_bf16_gemm.get_kernel("bfloat16", name)
                finally:
                    scheduler.cluster_tile_coords = coords
                so = f"{OUT_DIR}/{name}.so"
                print(name, kbuild.build_so(func, so).ptxas_info, flush=True)
                index[name] = so
    with open(f"{OUT_DIR}/index.json", "w") as f:
        json.dump(index, f)


class ClockSampler:
    """nvidia-smi's SM clock, power and temperature every 100 ms, read only (the settings stay as they are)."""

    def __init__(self):
        self.samples = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
             "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                clk, pwr, temp = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), clk, pwr, temp))

    def window(self, t0: float, t1: float) -> str:
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return "no clock samples"
        mean = [sum(x[i] for x in s) / len(s) for i in (1, 2, 3)]
        return (f"SM clock {mean[0]:.0f} MHz (min {min(x[1] for x in s):.0f}), power {mean[1]:.0f} W "
                f"(max {max(x[2] for x in s):.0f}), {mean[2]:.0f} C, {len(s)} samples")

    def stop(self):
        self.proc.terminate()


def profile_first_shape(fns: dict) -> None:
    """One call of every variant of the first shape, and cuBLAS's, inside the profiler range (after warm-up)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    (M, N, K), variants = next(iter(PLAN.items()))  # noqa: N806
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(N, K, device="cuda").bfloat16()
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    names = [variant_name(tile, g) for tile, groups in variants for g in groups]
    for _ in range(3):
        for name in names:
            fns[name](a, b, out)
        F.linear(a, b)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name in names:
        print(M, N, K, name, flush=True)
        fns[name](a, b, out)
    F.linear(a, b)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def checked_calls(fns: dict, names: list, a, b) -> dict:
    """``{name: call}`` of the variants ``names`` (each checked against an fp32 oracle on NaN-poisoned output first)
    and cuBLAS (``F.linear``) on ``a`` (M, K) and ``b`` (N, K): one shape's calls for ``time_calls``."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    (M, K), N = a.shape, b.shape[0]  # noqa: N806
    ref = a.float() @ b.float().T
    calls = {}
    for name in names:
        fn = fns[name]
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        fn(a, b, out)
        torch.cuda.synchronize()
        err = float((out.float() - ref).norm() / ref.norm())
        if not err < 1e-2:
            raise AssertionError(f"{name} at {M}x{N}x{K}: relative error {err:.3g}")
        calls[name] = lambda fn=fn, out=out: fn(a, b, out)
    calls["cublas"] = lambda: F.linear(a, b)
    return calls


def report_rows(times: dict, flop: int, shape: str, width: int) -> list:
    """Print each variant's median, TFLOP/s, cuBLAS/ours and rounds; return (shape, name, cuBLAS/ours) rows."""
    cb = times["cublas"]["median_us"]
    rows = []
    for name, t in times.items():
        if name == "cublas":
            continue
        us = t["median_us"]
        rounds_us = " ".join(f"{x:.1f}" for x in t["rounds_us"])
        print(f"  {name:{width}s} {us:9.1f} us {flop / us / 1e6:6.0f} TFLOP/s  cuBLAS/ours {cb / us:.3f}  "
              f"[{rounds_us}]", flush=True)
        rows.append((shape, name, cb / us))
    return rows


def print_summary(summary: list, width: int) -> None:
    print("\nshape / variant / cuBLAS-over-ours (best per shape marked *)")
    best = {}
    for shape, _name, r in summary:
        best[shape] = max(best.get(shape, 0), r)
    for shape, name, r in summary:
        print(f"{shape:28s} {name:{width}s} {r:.3f}{' *' if r == best[shape] else ''}")


def run(ncu: bool = False) -> None:
    import torch
    import tvm_ffi

    from tirx_kernels.core.bench import time_calls

    with open(f"{OUT_DIR}/index.json") as f:
        fns = {k: tvm_ffi.load_module(v)["main"] for k, v in json.load(f).items()}
    if ncu:
        profile_first_shape(fns)
        return
    clocks = ClockSampler()
    time.sleep(1.0)
    summary = []
    for (M, N, K), variants in PLAN.items():  # noqa: N806
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16()
        calls = checked_calls(fns, [variant_name(tile, g) for tile, groups in variants for g in groups], a, b)
        flop = 2 * M * N * K
        modes = [("", 20, 5)]
        if (M, N, K) == (8192, 8192, 8192):
            modes = [(" burst", 5, 3), (" sustained", 30, 5)]
        for label, n_calls, rounds in modes:
            if label == " burst":
                time.sleep(3.0)  # idle first, as the ceiling measurement finds the GPU at the start of a run
            t0 = time.time()
            t = time_calls(calls, calls=n_calls, rounds=rounds)
            t1 = time.time()
            cb = t["cublas"]["median_us"]
            print(f"{M}x{N}x{K}{label}: cuBLAS {cb:.1f} us ({flop / cb / 1e6:.0f} TFLOP/s); "
                  f"{clocks.window(t0, t1)}", flush=True)
            summary += report_rows(t, flop, f"{M}x{N}x{K}{label}", 42)
    clocks.stop()
    print_summary(summary, 42)

if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build()
    elif sys.argv[1:2] == ["run"]:
        run("--ncu" in sys.argv)
    else:
        sys.exit(__doc__)
