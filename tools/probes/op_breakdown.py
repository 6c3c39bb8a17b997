# SPDX-License-Identifier: Apache-2.0
"""Where an op's time goes (GPU host): for each ``kernel:config`` (a CONFIGS or BENCH_CONFIGS label), the op's time
per call (CUDA events, warm) and its GPU kernels by total time over ``--calls`` calls (torch.profiler): our TIRx
kernels by their function names (``kda_chunk``, ``gdn2_chunk``, the scan ...), torch's by aten kernel names. For ops
that are several kernels and torch glue (the linear-attention forwards and backwards), the first question before
tuning one of them.

    python3 tools/probes/op_breakdown.py cudnn_sm90_gdn2_prefill_f16:perf_b1_s8192_h16_l2 \\
        kda_forward_portfolio_multishape:h16_b1_t8192 [--calls 3] [--top 12] [--host]

``--host``: also the host side, where the events time exceeds the kernels' (2026-12-07d: KDA forward h16 1915 us a
call against 1095 us of kernels, back to back): the calls' Python time with no sync, then cProfile by own time.
"""

import argparse
import sys

import torch


def find_config(mod, label: str) -> dict:
    for cfg in list(getattr(mod, "CONFIGS", [])) + list(getattr(mod, "BENCH_CONFIGS", [])):
        if cfg["label"] == label:
            return cfg
    raise SystemExit(f"{mod.__name__}: no config {label!r}")


def host_side(mod, cfg, data, calls: int, top: int) -> None:
    import cProfile
    import io
    import pstats
    import time

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        mod.launch(cfg, data)
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    with_gpu = (time.perf_counter() - t0) / calls * 1e6
    print(f"  host: {host:.1f} us a call issuing (no sync), {with_gpu:.1f} us with the GPU")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        mod.launch(cfg, data)
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print("\n".join("    " + line for line in buf.getvalue().splitlines() if line.strip())[-6000:])


def breakdown(kernel: str, label: str, calls: int, top: int, host: bool = False) -> None:
    from torch.profiler import ProfilerActivity, profile

    from tirx_kernels import registry
    from tirx_kernels.core import harness

    mod = registry.load(kernel)
    cfg = harness.full_config(mod, find_config(mod, label))
    data = mod.prepare_data(**cfg)
    for _ in range(2):
        mod.launch(cfg, data)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        mod.launch(cfg, data)
    end.record()
    end.synchronize()
    per_call = start.elapsed_time(end) * 1e3 / calls
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            mod.launch(cfg, data)
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name[:70]
            t, n = rows.get(name, (0.0, 0))
            rows[name] = (t + ev.time_range.elapsed_us(), n + 1)  # a kernel event: its time on the device
    gpu = sum(t for t, _ in rows.values()) / calls
    print(f"\n{kernel} {label}: {per_call:.1f} us a call (events), GPU kernels {gpu:.1f} us a call "
          f"({100 * gpu / per_call:.0f} %: the rest is host work or gaps between launches)")
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {t / calls:10.1f} us  {100 * t / calls / per_call:5.1f} %  x{n // calls:<4d} {name}")
    if host:
        host_side(mod, cfg, data, calls, top)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+", help="kernel:config label")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--host", action="store_true", help="also the host time and a cProfile of the calls")
    a = ap.parse_args(argv)
    for row in a.rows:
        kernel, _, label = row.partition(":")
        try:
            breakdown(kernel, label, a.calls, a.top, a.host)
        except Exception as e:  # one row's failure (a missing artifact, OOM) does not end the others
            print(f"\n{row}: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
