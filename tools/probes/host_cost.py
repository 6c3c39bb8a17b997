# SPDX-License-Identifier: Apache-2.0
"""What an eager call costs the host (GPU host): for each ``kernel:config``, the time a call takes to issue (no sync,
warm, the median of 5 batches of ``--calls``) for ours and for each reference the module's ``get_baselines`` offers,
and, for an op on ``runtime.LaunchPlans`` (Mamba's), the split of ours into the recorded launch alone (the tvm-ffi
call on prebuilt views) and the rest (signature, views, version bumps).

    python3 tools/probes/host_cost.py selective_state_update_mtp_simple:b1_h64_d64_s128_t6_r8_statebf16_official

2026-12-07f: Mamba's op issued in 139 us a call on the H100 host with launch plans (8.7 us kernel) while the CPU
machine measured 33 us with the launch stubbed: which part is the launch, and what does FlashInfer's eager op cost?
"""

import argparse
import statistics
import time

import torch


def per_call_us(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def plans_of(mod):
    """The LaunchPlans table the module's op records into, if any (``_PLANS`` of the module or its op module)."""
    import importlib
    import sys

    from tirx_kernels.core import runtime

    for name in [mod.__name__] + [n for n in sys.modules if n.startswith(mod.__name__.rsplit(".", 1)[0])]:
        m = importlib.import_module(name)
        for v in vars(m).values():
            if isinstance(v, runtime.LaunchPlans) and len(v):
                return v
    return None


def probe(kernel: str, label: str, calls: int) -> None:
    from op_breakdown import find_config

    from tirx_kernels import registry
    from tirx_kernels.core import harness

    mod = registry.load(kernel)
    cfg = harness.full_config(mod, find_config(mod, label))
    data = mod.prepare_data(**cfg)
    rows = [("ours", per_call_us(lambda: mod.launch(cfg, data), calls))]
    plans = plans_of(mod)
    if plans is not None:
        fn, recipe, scalars = next(iter(plans._plans.values()))
        ptrs = [torch.empty(max(e, 1), dtype=d, device="cuda") if c is None else c for _, e, d, _, c in recipe]
        rows.append(("  its tvm-ffi launch alone", per_call_us(lambda: fn(*ptrs, *scalars), calls)))
        views = [p.view(-1) for p in ptrs]
        rows.append((f"  {len(views)} tensor views alone", per_call_us(lambda: [p.view(-1) for p in views], calls)))
    for name, make in (mod.get_baselines(**cfg) if hasattr(mod, "get_baselines") else {}).items():
        try:
            ref = make()
            rows.append((name, per_call_us(lambda ref=ref: ref(data), calls)))
        except Exception as e:  # noqa: BLE001 - a reference that does not run here is reported, not fatal
            rows.append((f"{name}: {type(e).__name__}: {str(e)[:80]}", float("nan")))
    x = torch.empty(1, device="cuda")
    rows.append(("torch: x.add_(1) (one aten launch)", per_call_us(lambda: x.add_(1), calls)))
    print(f"\n{kernel} {label}: host us a call issuing (no sync)")
    for name, us in rows:
        print(f"  {us:9.1f}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", help="kernel:config")
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    for row in a.rows:
        kernel, label = row.split(":", 1)
        probe(kernel, label, a.calls)


if __name__ == "__main__":
    main()
