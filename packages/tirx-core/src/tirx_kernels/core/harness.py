# SPDX-License-Identifier: Apache-2.0
"""``run_test`` and ``run_bench``, written once for every kernel module (see PROTOCOL.md).

A kernel module ends with ``run_test, run_bench = harness.bind(__name__)``.
"""

from __future__ import annotations

import importlib
import os

from . import references
from .arch import check_arch

# (atol, rtol) per output dtype; atol is relative to the RMS of the oracle output, so one pair serves any
# scale (a K=8192 GEMM output has RMS ~90, a norm output ~1). bf16 rounds at 2^-9 = 2e-3 relative.
DEFAULT_TOLERANCE = {"bfloat16": (1e-2, 1.6e-2), "float16": (2e-3, 4e-3), "float32": (1e-5, 1e-5)}
GUARD_ELEMS = 4096  # guard band on each side of every output (8 KiB of bf16: keeps 16-byte alignment)


class KernelCheckError(AssertionError):
    """Our kernel produced a wrong result, wrote out of bounds, or changed an input."""


def full_config(mod, cfg: dict) -> dict:
    cfg = {**getattr(mod, "DEFAULTS", {}), **cfg}
    cfg.pop("label", None)
    return cfg


def bench_configs(mod) -> list[dict]:
    """The rows a benchmark sweeps by default: ``BENCH_CONFIGS``, or ``CONFIGS`` where there are none."""
    return list(getattr(mod, "BENCH_CONFIGS", None) or mod.CONFIGS)


def all_configs(mod) -> list[dict]:
    """Every row of ``CONFIGS`` and ``BENCH_CONFIGS`` once (by label): what gets built and can be named."""
    rows = list(mod.CONFIGS)
    labels = {c["label"] for c in rows}
    return rows + [c for c in getattr(mod, "BENCH_CONFIGS", None) or [] if c["label"] not in labels]


def find_config(mod, label: str, bench: bool = False) -> dict:
    """The row called ``label`` (in ``CONFIGS``; with ``bench``, also in ``BENCH_CONFIGS``)."""
    rows = all_configs(mod) if bench else mod.CONFIGS
    for c in rows:
        if c["label"] == label:
            return c
    raise KeyError(f"kernel '{mod.KERNEL_META['name']}' has no config '{label}'; "
                   f"configs: {', '.join(c['label'] for c in rows)}")


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def poison_like(t):
    """Same shape/strides as ``t`` inside a larger buffer poisoned with NaN (or 0x5A bytes for ints)."""
    import torch

    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    base = torch.empty(span + 2 * GUARD_ELEMS, dtype=t.dtype, device=t.device)
    if t.is_floating_point():
        base.fill_(float("nan"))
    else:
        base.view(torch.uint8).fill_(0x5A)
    view = base.as_strided(t.shape, t.stride(), GUARD_ELEMS)
    inside = torch.zeros(base.shape, dtype=torch.bool, device=t.device)
    inside.as_strided(t.shape, t.stride(), GUARD_ELEMS).fill_(True)
    return view, base, inside


def _bits(t):
    import torch

    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def compare(name: str, out, ref, tol: tuple[float, float], what: str) -> dict:
    """Elementwise ``|out-ref| <= atol*rms(ref) + rtol*|ref|``; returns the error statistics."""
    import torch

    o = out.float()
    r = ref.float()
    if o.shape != r.shape:
        raise KernelCheckError(f"{name}: shape {tuple(o.shape)} != {what} shape {tuple(r.shape)}")
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).sum().item()
        raise KernelCheckError(f"{name}: {bad} of {o.numel()} elements are not finite (unwritten or NaN)")
    rms = r.pow(2).mean().sqrt().item() if r.numel() else 0.0
    diff = (o - r).abs()
    atol, rtol = tol
    bound = atol * max(rms, 1e-30) + rtol * r.abs()
    bad = diff > bound
    rel_fro = (diff.pow(2).sum().sqrt() / max(r.pow(2).sum().sqrt().item(), 1e-30)).item()
    stats = {"max_abs": diff.max().item() if diff.numel() else 0.0, "rel_fro": rel_fro, "rms_ref": rms}
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise KernelCheckError(
            f"{name}: {int(bad.sum())} of {o.numel()} elements differ from {what} beyond atol={atol}*rms "
            f"rtol={rtol} (first at {idx}: got {o[idx].item()}, want {r[idx].item()}; rel_fro={rel_fro:.2e})")
    return stats


def _seed_note() -> str:
    return f" (TIRX_SEED={os.environ['TIRX_SEED']})" if "TIRX_SEED" in os.environ else ""


def check_outputs(mod, outputs: dict, expected: dict, what: str) -> dict:
    tol_table = {**DEFAULT_TOLERANCE, **getattr(mod, "TOLERANCE", {})}
    stats = {}
    for key, ref in expected.items():
        stats[key] = compare(f"{mod.KERNEL_META['name']}[{key}]", outputs[key], ref,
                             tol_table[_dtype_name(outputs[key])], what)
    return stats


def upstream_baselines(mod) -> set[str]:
    """Baseline names of the upstream references (``reference_requirements``: ``baseline`` key, else import)."""
    return {r.get("baseline", r["import"]) for r in mod.KERNEL_META.get("reference_requirements", [])}


def correctness_baselines(mod) -> set[str]:
    """Baselines ``run_test`` compares against: the upstream references and plain ``torch`` / cuBLAS;
    compiled/autotuned variants are only timed."""
    return {"torch", "cublas"} | upstream_baselines(mod)


def run_reference_checks(mod, cfg: dict, inputs: dict, ours: dict) -> dict:
    """Compare our outputs with every installed baseline; missing ones are reported with the reason."""
    out = {}
    baselines = mod.get_baselines(**cfg) if hasattr(mod, "get_baselines") else {}
    wanted = correctness_baselines(mod)
    for name, builder in baselines.items():
        if name not in wanted:
            continue
        try:
            fn = builder()
        except ImportError as e:
            out[name] = {"status": "skipped", "reason": f"{name} not available: {e}"}
            continue
        got = fn({k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.items()})
        got = {k: v for k, v in got.items() if k in ours}
        try:
            stats = check_outputs(mod, ours, got, f"reference '{name}'")
            out[name] = {"status": "passed", "stats": stats}
        except KernelCheckError as e:
            out[name] = {"status": "failed", "reason": str(e)}
    return out


def run_test(mod, **cfg) -> dict:
    """Build, launch and check one config; raises ``KernelCheckError`` on any failure."""
    import torch

    check_arch(mod.KERNEL_META)
    cfg = full_config(mod, cfg)
    data = mod.prepare_data(**cfg)
    expected = mod.reference(**data)
    out_names = list(expected)
    inputs = {k: v for k, v in data.items() if k not in out_names}
    snapshots = {k: v.clone() for k, v in inputs.items() if hasattr(v, "clone")}
    guards = {}
    for k in out_names:
        view, base, inside = poison_like(data[k])
        data[k] = view
        guards[k] = (base, inside)
    mod.launch(cfg, data)
    torch.cuda.synchronize()
    name = mod.KERNEL_META["name"]
    for k, snap in snapshots.items():
        if not torch.equal(_bits(snap), _bits(data[k])):
            raise KernelCheckError(f"{name}: input '{k}' was modified by the kernel{_seed_note()}")
    for k, (base, inside) in guards.items():
        poison = _bits(base[:1])
        outside = _bits(base)[~inside]
        if outside.numel() and not (outside == poison).all():
            n = int((outside != poison).sum())
            raise KernelCheckError(f"{name}: {n} elements written outside output '{k}' (guard band / stride gap)")
    stats = check_outputs(mod, {k: data[k] for k in out_names}, expected, "the fp32 oracle")
    refs = run_reference_checks(mod, cfg, inputs, {k: data[k] for k in out_names})
    failed = {n: r for n, r in refs.items() if r["status"] == "failed"}
    if failed:
        raise KernelCheckError("; ".join(r["reason"] for r in failed.values()))
    required = references.resolve_all(mod.KERNEL_META)
    return {"kernel": name, "config": cfg, "status": "passed", "oracle": stats, "references": refs,
            "requirements": {k: {"ok": ok, "detail": d} for k, (ok, d) in required.items()}}


def run_bench(mod, with_references: bool = False, **cfg) -> dict:
    from . import bench

    return bench.bench_config(mod, full_config(mod, cfg), with_references=with_references)


def bind(module_name: str):
    """``run_test, run_bench`` bound to one kernel module (called at the end of the module)."""
    def _mod():
        return importlib.import_module(module_name)

    def bound_run_test(**cfg):
        return run_test(_mod(), **cfg)

    def bound_run_bench(with_references: bool = False, **cfg):
        return run_bench(_mod(), with_references=with_references, **cfg)

    for f, base in ((bound_run_test, run_test), (bound_run_bench, run_bench)):
        f.__doc__ = base.__doc__
        f.__tirx_harness__ = module_name
    return bound_run_test, bound_run_bench

