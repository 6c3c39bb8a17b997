# SPDX-License-Identifier: Apache-2.0
"""Timing: cold L2, warm-up, median of many calls, rounds with implementations interleaved.

Cold L2 (the default): a 512 MiB buffer (8x the H200's 60 MB L2) is overwritten before every timed
call, and only the call itself sits between the two events. Kernels whose median falls under 10 µs
are timed again from a CUDA graph of back-to-back calls, which removes the launch gaps that events
cannot (host cost per call here is 8-9 µs); the row then says ``timer: graph``.
"""

from __future__ import annotations

import functools
import statistics

FLUSH_BYTES = 512 * 2**20
GRAPH_THRESHOLD_US = 10.0


@functools.cache
def _flush_buffer():
    import torch

    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")


# A round's calls of one implementation take about this long at most: slow implementations get fewer calls (at least
# MIN_CALLS). 30 calls x 5 rounds of a 170 ms call (the GDN-2 forward at b4 s8192 h64 with checkpoints) took 26 s of
# a 10-minute device call on 2026-12-07c, and three kernels' rows ran past a 100 s limit; a median of 3-8 calls of
# a call that long is as steady as one of 30 short ones.
ROUND_BUDGET_US = 250_000.0
MIN_CALLS = 3


def calls_for(us_per_call: float, calls: int) -> int:
    """Calls per round for an implementation taking ``us_per_call``: ``calls``, fewer past the round budget."""
    return max(MIN_CALLS, min(calls, int(ROUND_BUDGET_US // max(us_per_call, 1e-3))))


def time_calls(fns: dict, calls: int = 30, rounds: int = 5, warmup: int = 3, cold_l2: bool = True) -> dict:
    """``{name: {"median_us", "rounds_us": [...], "calls"}}``; every round runs each implementation in turn, ``calls``
    times (fewer for a slow one: ``calls_for`` of its last warm-up call)."""
    import torch

    flush = _flush_buffer()
    per_round = {}
    for name, fn in fns.items():
        for _ in range(max(warmup, 1) - 1):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        per_round[name] = calls_for(start.elapsed_time(end) * 1e3, calls)
    torch.cuda.synchronize()
    samples = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n_calls = per_round[name]
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_calls)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_calls)]
            for i in range(n_calls):
                if cold_l2:
                    flush.fill_(i & 0xFF)
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize()
            samples[name].append(statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)))
    return {n: {"median_us": statistics.median(v), "rounds_us": v, "calls": per_round[n],
                "timer": "events-cold-l2" if cold_l2 else "events"} for n, v in samples.items()}


def time_graph(fn, calls: int = 100, rounds: int = 5) -> dict:
    """Median per-call time of ``calls`` back-to-back launches captured in one CUDA graph."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / calls)
    return {"median_us": statistics.median(out), "rounds_us": out, "timer": "graph"}


@functools.cache
def ceilings() -> dict:
    """Measured on this device: device-to-device copy bandwidth (read+write) and cuBLAS bf16 8192^3."""
    import torch

    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t_copy = time_calls({"copy": functools.partial(y.copy_, x)}, calls=10, rounds=3, cold_l2=False)["copy"]["median_us"]
    x = y = None  # free 2 GiB before the matmul
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t_mm = time_calls({"mm": lambda: torch.matmul(a, b)}, calls=5, rounds=3)["mm"]["median_us"]
    return {"copy_tb_s": 2 * n / t_copy / 1e6, "bf16_tflop_s": 2 * 8192**3 / t_mm / 1e6}


@functools.cache
def fp8_tflop_s() -> float:
    """cuBLAS FP8 at 8192^3 (e4m3 x e4m3 -> bf16, per-tensor scales, fast accumulation): the compute ceiling
    of rows whose roofline says ``"ceiling": "fp8"``; measured only when such a row is timed."""
    import torch

    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), dtype=torch.float32, device="cuda")
    t_mm = time_calls({"mm": lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)},
                      calls=5, rounds=3)["mm"]["median_us"]
    return 2 * 8192**3 / t_mm / 1e6


# Compute ceilings a roofline may name (TFLOP/s, measured on first use): bf16 is ``ceilings()``'s own.
COMPUTE_CEILINGS = {"bf16": lambda: ceilings()["bf16_tflop_s"], "fp8": fp8_tflop_s}


def compute_ceiling(name: str, ceil: dict) -> float:
    """TFLOP/s of the compute ceiling ``name``: from ``ceil`` where it was measured, else measured now."""
    if name not in COMPUTE_CEILINGS:
        raise ValueError(f"unknown compute ceiling '{name}' (known: {', '.join(COMPUTE_CEILINGS)})")
    return ceil.get(f"{name}_tflop_s") or COMPUTE_CEILINGS[name]()


def roofline_stats(model: dict, us: float, ceil: dict) -> dict:
    """TFLOP/s, TB/s, the bound (whichever model time at the measured ceiling is larger) and % of it. FLOPs are
    judged against the compute ceiling the model names (``"ceiling": "fp8"``; default bf16)."""
    ceiling = model.get("ceiling", "bf16")
    peak = compute_ceiling(ceiling, ceil)
    t_mem = model.get("bytes", 0) / (ceil["copy_tb_s"] * 1e6)
    t_cmp = model.get("flops", 0) / (peak * 1e6)
    bound = "memory" if t_mem >= t_cmp else "compute"
    return {"tflop_s": model.get("flops", 0) / us / 1e6, "tb_s": model.get("bytes", 0) / us / 1e6, "bound": bound,
            "pct_of_roofline": 100.0 * (t_mem if bound == "memory" else t_cmp) / us,
            "model_bytes": model.get("bytes", 0), "model_flops": model.get("flops", 0),
            "compute_ceiling": ceiling, "compute_ceiling_tflop_s": peak}


def bench_config(mod, cfg: dict, with_references: bool = False) -> dict:
    """One bench row: our µs, TFLOP/s or TB/s, % of the measured ceiling, each reference's µs and ref/ours.

    Every implementation is timed on the same ``data``: an in-place op and its references update it in place, call
    after call. A reference must not copy what it updates in place (a pool clone per call was ~1 ms of FlashInfer's
    3.2 ms Mamba b2048 row, 2026-12-07e): the correctness check already hands each reference fresh copies."""
    import torch

    from .arch import check_arch

    check_arch(mod.KERNEL_META)
    data = mod.prepare_data(**cfg)
    fns = {"ours": functools.partial(mod.launch, cfg, data)}
    missing = {}
    if with_references and hasattr(mod, "get_baselines"):
        for name, builder in mod.get_baselines(**cfg).items():
            try:
                ref_fn = builder()
            except ImportError as e:
                missing[name] = str(e)
                continue
            fns[name] = functools.partial(ref_fn, data)
    torch.cuda.synchronize()
    times = time_calls(fns)
    for name in list(times):
        if times[name]["median_us"] < GRAPH_THRESHOLD_US:
            try:
                times[name] = time_graph(fns[name])
            except Exception as e:  # a reference that cannot be captured keeps its event timing
                times[name]["graph_error"] = f"{type(e).__name__}: {e}"
    ceil = ceilings()
    us = times["ours"]["median_us"]
    stats = roofline_stats(mod.roofline(**cfg), us, ceil)
    refs = {n: {"us": t["median_us"], "ref_over_ours": t["median_us"] / us, "timer": t["timer"]}
            for n, t in times.items() if n != "ours"}
    return {"kernel": mod.KERNEL_META["name"], "config": cfg, "us": us, "timer": times["ours"]["timer"],
            "rounds_us": times["ours"]["rounds_us"], **stats, "pct_of_ceiling": stats["pct_of_roofline"],
            "ceilings": {**ceil, f"{stats['compute_ceiling']}_tflop_s": stats["compute_ceiling_tflop_s"]},
            "references": refs, "missing_references": missing}
