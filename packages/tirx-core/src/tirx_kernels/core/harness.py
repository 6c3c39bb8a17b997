# SPDX-License-Identifier: Apache-2.0
"""``run_test`` and ``run_bench``, written once for every kernel module (see PROTOCOL.md).

A kernel module ends with ``run_test, run_bench = harness.bind(__name__)``. The optional module hooks the
checks honour (``INPLACE``, ``WORKSPACES``, ``TOLERANCE``, ``COMPARATORS``, ``GRADIENTS`` with
``launch_autograd``) are described in PROTOCOL.md; a module that declares none is checked as it always was.
"""

from __future__ import annotations

import importlib
import os

from . import references
from .arch import check_arch

# (atol, rtol) per output dtype; atol is relative to the RMS of the oracle output, so one pair serves any
# scale (a K=8192 GEMM output has RMS ~90, a norm output ~1). bf16 rounds at 2^-9 = 2e-3 relative. An FP8
# output is compared after upcast: one unit in the last place is 2^-3 (e4m3) or 2^-2 (e5m2) of the value, and a
# kernel whose fp32 result lies near a rounding midpoint may round to either neighbour, so rtol is one unit.
# Integer and bool outputs (indices, packed FP4 bytes, codes) have no entry: they must match exactly.
DEFAULT_TOLERANCE = {"bfloat16": (1e-2, 1.6e-2), "float16": (2e-3, 4e-3), "float32": (1e-5, 1e-5),
                     "float8_e4m3fn": (1.6e-2, 1.3e-1), "float8_e5m2": (3.2e-2, 2.6e-1)}
EXACT = (0.0, 0.0)
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


def poison_(t):
    """Fill ``t`` with NaN (or 0x5A bytes for integer dtypes, which have no NaN); returns ``t``."""
    import torch

    if t.is_floating_point():
        return t.fill_(float("nan"))
    t.view(torch.uint8).fill_(0x5A)
    return t


def poison_like(t):
    """Same shape/strides as ``t`` inside a larger buffer poisoned with NaN (or 0x5A bytes for ints)."""
    import torch

    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    base = poison_(torch.empty(span + 2 * GUARD_ELEMS, dtype=t.dtype, device=t.device))
    view = base.as_strided(t.shape, t.stride(), GUARD_ELEMS)
    inside = torch.zeros(base.shape, dtype=torch.bool, device=t.device)
    inside.as_strided(t.shape, t.stride(), GUARD_ELEMS).fill_(True)
    return view, base, inside


def guarded_copy(t):
    """``poison_like(t)`` holding ``t``'s values: for a tensor the kernel reads and writes (an in-place target,
    a workspace), whose guard bands are still checked."""
    view, base, inside = poison_like(t)
    view.copy_(t)
    return view, base, inside


def _bits(t):
    import torch

    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def compare(name: str, out, ref, tol: tuple[float, float], what: str, row: float = 0.0) -> dict:
    """Elementwise ``|out-ref| <= atol*rms(ref) + rtol*|ref| + row*rms(ref's last-dim row)``; returns the error
    statistics. ``row`` serves outputs whose rows differ in scale (attention: a row over few keys vs many).

    Integer and bool outputs are compared in float64, which holds every int32 (and any index) exactly, so the
    ``EXACT`` tolerance means equal values."""
    import torch

    exact_ints = not out.is_floating_point()
    o = out.double() if exact_ints else out.float()
    r = ref.double() if exact_ints else ref.float()
    if o.shape != r.shape:
        raise KernelCheckError(f"{name}: shape {tuple(o.shape)} != {what} shape {tuple(r.shape)}")
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).sum().item()
        raise KernelCheckError(f"{name}: {bad} of {o.numel()} elements are not finite (unwritten or NaN)")
    rms = r.pow(2).mean().sqrt().item() if r.numel() else 0.0
    diff = (o - r).abs()
    atol, rtol = tol
    bound = atol * max(rms, 1e-30) + rtol * r.abs()
    if row:
        bound = bound + row * r.pow(2).mean(-1, keepdim=True).sqrt()
    bad = diff > bound
    rel_fro = (diff.pow(2).sum().sqrt() / max(r.pow(2).sum().sqrt().item(), 1e-30)).item()
    stats = {"max_abs": diff.max().item() if diff.numel() else 0.0, "rel_fro": rel_fro, "rms_ref": rms}
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        row_note = f" row={row}*row rms" if row else ""
        raise KernelCheckError(
            f"{name}: {int(bad.sum())} of {o.numel()} elements differ from {what} beyond atol={atol}*rms "
            f"rtol={rtol}{row_note} (first at {idx}: got {o[idx].item()}, want {r[idx].item()}; rel_fro={rel_fro:.2e})")
    return stats


def compare_to_low_precision(name: str, out, ref, lowp, what: str, factor: float = 2.0,
                             floor: float = 1e-3) -> dict:
    """FlashAttention's criterion for 16-bit attention: ``out``'s error against ``ref`` at most ``factor`` times the
    error of ``lowp``, the same computation done plainly in the inputs' precision (what that precision costs), in
    the max norm (flash-attn's tests) and in the relative Frobenius norm; ``floor * rms(ref)`` absorbs rounding
    noise where both are exact. For outputs that sum thousands of 16-bit-rounded terms, where a per-element bound
    leaves a few elements of a million past it by chance (the H100 run of 2026-12-06: 1-12 elements at
    rel_fro 2.35e-3, the bf16 level)."""
    import torch

    o, r, lp = out.float(), ref.float(), lowp.float()
    if o.shape != r.shape or lp.shape != r.shape:
        raise KernelCheckError(f"{name}: shapes {tuple(o.shape)} / {tuple(lp.shape)} != {what} shape "
                               f"{tuple(r.shape)}")
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).sum().item()
        raise KernelCheckError(f"{name}: {bad} of {o.numel()} elements are not finite (unwritten or NaN)")
    if not r.numel():
        return {"max_abs": 0.0, "rel_fro": 0.0, "rms_ref": 0.0}
    rms = r.pow(2).mean().sqrt().item()
    norm = max(r.pow(2).sum().sqrt().item(), 1e-30)
    err, err_lp = (o - r).abs(), (lp - r).abs()
    stats = {"max_abs": err.max().item(), "rel_fro": err.pow(2).sum().sqrt().item() / norm, "rms_ref": rms,
             "max_abs_low_precision": err_lp.max().item(),
             "rel_fro_low_precision": err_lp.pow(2).sum().sqrt().item() / norm}
    # floor * rms(ref) per element; in the relative Frobenius norm that is floor itself (norm = rms sqrt(n)).
    for key, noise in (("max_abs", floor * rms), ("rel_fro", floor)):
        if stats[key] > factor * stats[f"{key}_low_precision"] + noise:
            idx = tuple(int(i) for i in (err == err.max()).nonzero()[0])
            raise KernelCheckError(
                f"{name}: {key} {stats[key]:.3e} against {what} exceeds {factor} x the plain low-precision "
                f"computation's {stats[f'{key}_low_precision']:.3e} (+ {floor} rms noise; worst at {idx}: got "
                f"{o[idx].item()}, want {r[idx].item()}, low precision {lp[idx].item()})")
    return stats


def tolerance(mod, t) -> tuple[float, float]:
    """(atol, rtol) for an output of ``t``'s dtype: the module's ``TOLERANCE``, else the default; integer and
    bool outputs are exact unless the module says otherwise."""
    dtype = _dtype_name(t)
    table = {**DEFAULT_TOLERANCE, **getattr(mod, "TOLERANCE", {})}
    if dtype in table:
        return table[dtype]
    if not t.is_floating_point() and not t.is_complex():
        return EXACT
    raise KernelCheckError(f"{mod.KERNEL_META['name']}: no tolerance for {dtype} outputs; give TOLERANCE "
                           f"['{dtype}'] or a COMPARATORS entry")


def bit_exact(got, want, cfg: dict, inputs: dict) -> dict:
    """Comparator: every element equal bit for bit (quantizer codes, packed FP4 bytes, scale factors). ``want``
    is first cast to ``got``'s dtype, so an fp32 oracle of exactly representable codes serves."""
    if got.shape != want.shape:
        raise KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
    w = want.to(got.dtype)
    g_bits, w_bits = _bits(got), _bits(w)
    bad = g_bits != w_bits
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        nbits = 8 * got.element_size()
        mask = (1 << nbits) - 1
        raise KernelCheckError(
            f"{int(bad.sum())} of {got.numel()} elements differ bit for bit (first at {idx}: got "
            f"0x{int(g_bits[idx]) & mask:0{nbits // 4}x}, want 0x{int(w_bits[idx]) & mask:0{nbits // 4}x})")
    return {"mismatches": 0}


def topk_indices(scores: str, dim: int = -1, ordered: bool = False):
    """Comparator for a top-k index output, tolerant of ties: in every row the indices must be in range and
    distinct, and pick the same multiset of ``inputs[scores]`` values as the oracle's indices, so that any of
    several equal scores at the k-th place passes. With ``ordered`` the picked scores must also come in the
    oracle's order. Works for largest and smallest k alike (it compares picked values, not a direction)."""
    def _same(a, b):  # equal values, NaN equal to NaN
        return (a == b) | (a.isnan() & b.isnan())

    def check(got, want, cfg: dict, inputs: dict) -> dict:
        if scores not in inputs:
            raise KernelCheckError(f"the top-k comparator needs the input '{scores}' (got inputs: "
                                   f"{', '.join(inputs) or 'none'})")
        if got.shape != want.shape:
            raise KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
        s = inputs[scores].movedim(dim, -1)
        g = got.long().movedim(dim, -1)
        w = want.long().movedim(dim, -1)
        n = s.shape[-1]
        if ((g < 0) | (g >= n)).any():
            raise KernelCheckError(f"indices out of range [0, {n})")
        gs = g.sort(-1).values
        if (gs[..., 1:] == gs[..., :-1]).any():
            raise KernelCheckError("an index is picked twice in a row")
        gv, wv = s.gather(-1, g), s.gather(-1, w)
        if not ordered:
            gv, wv = gv.sort(-1).values, wv.sort(-1).values
        bad_rows = ~_same(gv, wv).all(-1)
        if bad_rows.any():
            row = tuple(int(i) for i in bad_rows.nonzero()[0])
            raise KernelCheckError(
                f"{int(bad_rows.sum())} of {bad_rows.numel()} rows pick other scores than the oracle's top-k "
                f"(first row {row}: got {gv[row].tolist()}, want {wv[row].tolist()})")
        return {"rows": int(bad_rows.numel()), "ties_tolerated": True}

    check.__name__ = f"topk_indices({scores!r})"
    return check


def _seed_note() -> str:
    return f" (TIRX_SEED={os.environ['TIRX_SEED']})" if "TIRX_SEED" in os.environ else ""


def check_outputs(mod, outputs: dict, expected: dict, what: str, cfg: dict | None = None,
                  inputs: dict | None = None) -> dict:
    """Every output of ``expected`` against ``outputs``: through the module's ``COMPARATORS`` entry (called with
    ``cfg`` and the unmodified ``inputs``), else ``compare`` at ``tolerance``."""
    name = mod.KERNEL_META["name"]
    comparators = getattr(mod, "COMPARATORS", {})
    stats = {}
    for key, ref in expected.items():
        if key in comparators:
            try:
                stats[key] = comparators[key](outputs[key], ref, cfg or {}, inputs or {}) or {}
            except KernelCheckError as e:
                raise KernelCheckError(f"{name}[{key}] against {what}: {e}") from None
        else:
            stats[key] = compare(f"{name}[{key}]", outputs[key], ref, tolerance(mod, outputs[key]), what)
    return stats


def upstream_baselines(mod) -> set[str]:
    """Baseline names of the upstream references (``reference_requirements``: ``baseline`` key, else import)."""
    return {r.get("baseline", r["import"]) for r in mod.KERNEL_META.get("reference_requirements", [])}


def correctness_baselines(mod) -> set[str]:
    """Baselines ``run_test`` compares against: the upstream references and plain ``torch`` / cuBLAS;
    compiled/autotuned variants are only timed."""
    return {"torch", "cublas"} | upstream_baselines(mod)


def _clones(d: dict) -> dict:
    return {k: v.clone() if hasattr(v, "clone") else v for k, v in d.items()}


def run_reference_checks(mod, cfg: dict, inputs: dict, ours: dict) -> dict:
    """Compare our outputs with every installed baseline (each given fresh copies of the unmodified ``inputs``);
    missing ones are reported with the reason."""
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
        try:
            got = fn(_clones(inputs))
        except ImportError as e:  # the reference exists but refuses this config (cuBLASLt's FP8 shape rules)
            out[name] = {"status": "skipped", "reason": f"{name} not available for this config: {e}"}
            continue
        got = {k: v for k, v in got.items() if k in ours}
        try:
            stats = check_outputs(mod, ours, got, f"reference '{name}'", cfg, inputs)
            out[name] = {"status": "passed", "stats": stats}
        except KernelCheckError as e:
            out[name] = {"status": "failed", "reason": str(e)}
    return out


def inplace_outputs(mod, out_names, data: dict) -> dict:
    """The module's ``INPLACE`` (``{output: the input of data it overwrites}``), checked against the outputs."""
    inplace = getattr(mod, "INPLACE", {})
    for k, src in inplace.items():
        if k not in out_names or src not in data:
            raise KeyError(f"{mod.KERNEL_META['name']}: INPLACE entry {k!r}: {src!r} needs '{k}' among the "
                           f"reference's outputs and '{src}' among prepare_data's tensors")
    return inplace


def _refill(name: str, dst, src) -> None:
    """``dst.copy_(src)`` where ``dst`` may be a broadcast view (stride 0 along some dims, as FlashInfer's per-head
    ``dt`` / ``A`` / ``D`` inputs are): its storage is refilled through one index of each broadcast dim, and ``src``
    must not vary along those dims (it is another ``prepare_data``'s tensor of the same form)."""
    bcast = [d for d in range(dst.dim()) if dst.stride(d) == 0 and dst.shape[d] > 1]
    if not bcast:
        dst.copy_(src)
        return
    core = tuple(slice(0, 1) if d in bcast else slice(None) for d in range(dst.dim()))
    if src.shape != dst.shape or not src.eq(src[core]).logical_or(src.isnan()).all():
        raise ValueError(f"input '{name}' is a broadcast view (stride 0 along dims {bcast}) and the refill values "
                         "vary along them (or differ in shape): prepare_data must return the same form each call")
    dst[core].copy_(src[core])


def refill_for_replay(mod, data: dict, fresh: dict, expected: dict) -> dict:
    """Make the tensors of ``data`` (captured in a CUDA graph) hold the inputs of ``fresh`` (another
    ``prepare_data``), in-place targets and workspaces included, and poison its fresh outputs; returns the
    tensors to check against ``expected`` after the replay."""
    import torch

    inplace = inplace_outputs(mod, list(expected), fresh)
    for k, v in fresh.items():
        if isinstance(v, torch.Tensor) and (k not in expected or k in inplace.values()):
            _refill(k, data[k], v)
    for k in expected:
        if k not in inplace:
            poison_(data[k])
    return {k: data[inplace.get(k, k)] for k in expected}


def check_replay(mod, cfg: dict) -> dict:
    """Capture ``launch`` in a CUDA graph, refill the inputs with new random values, replay, check the outputs."""
    import torch

    data = mod.prepare_data(**cfg)
    mod.launch(cfg, data)  # load the artifacts outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mod.launch(cfg, data)
    fresh = mod.prepare_data(**cfg)
    expected = mod.reference(**fresh)
    outputs = refill_for_replay(mod, data, fresh, expected)
    g.replay()
    torch.cuda.synchronize()
    return check_outputs(mod, outputs, expected, "the fp32 oracle (graph replay)", cfg, fresh)


def check_gradients(mod, cfg: dict, data: dict) -> dict:
    """The gradients of the inputs in ``GRADIENTS``: ours through ``launch_autograd`` (the public op under autograd)
    against the fp32 oracle's autograd (``reference`` on fp32 leaf copies), for the same random output gradients.
    ``data`` holds the unmodified tensors of ``prepare_data``."""
    import torch

    name = mod.KERNEL_META["name"]
    wrt = list(mod.GRADIENTS)
    ours_in = {**_clones(data), **{k: data[k].detach().clone().requires_grad_() for k in wrt}}
    ref_in = {**_clones(data), **{k: data[k].detach().float().requires_grad_() for k in wrt}}
    ours = mod.launch_autograd(cfg, ours_in)
    want = mod.reference(**ref_in)
    keys = [k for k in want if k in ours and ours[k].requires_grad]
    if not keys:
        raise KernelCheckError(f"{name}: no output of launch_autograd is differentiable (GRADIENTS: {wrt})")
    grad_out = {k: torch.randn(ours[k].shape, dtype=torch.float32, device=ours[k].device) for k in keys}
    g_ours = torch.autograd.grad([ours[k] for k in keys], [ours_in[k] for k in wrt],
                                 [grad_out[k].to(ours[k].dtype) for k in keys], allow_unused=True)
    g_want = torch.autograd.grad([want[k] for k in keys], [ref_in[k] for k in wrt],
                                 [grad_out[k].to(want[k].dtype) for k in keys], allow_unused=True)
    stats = {}
    for k, g, r in zip(wrt, g_ours, g_want):
        if g is None:
            raise KernelCheckError(f"{name}: no gradient reaches input '{k}' through launch_autograd")
        if r is None:
            raise ValueError(f"{name}: the oracle's outputs do not depend on '{k}': drop it from GRADIENTS")
        stats[k] = compare(f"{name}[d{k}]", g, r, tolerance(mod, g), "the fp32 oracle's autograd")
    return stats


def _synchronize():
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def check_config(mod, cfg: dict) -> dict:
    """``run_test``'s checks of one full config, without the arch gate (a torch-only module runs them on CPU).

    Fresh outputs are swapped for NaN-poisoned buffers with guard bands; in-place targets (``INPLACE``) and
    workspaces (``WORKSPACES``) keep their values inside guard bands; every other input must come back bit for
    bit. The oracle, the baselines and the comparators see the inputs as they were before the launch.
    """
    import torch

    data = mod.prepare_data(**cfg)
    expected = mod.reference(**data)
    inplace = inplace_outputs(mod, list(expected), data)
    fresh = [k for k in expected if k not in inplace]
    written = set(inplace.values())
    workspaces = set(getattr(mod, "WORKSPACES", ()))
    inputs = {k: v for k, v in data.items() if k not in fresh}
    originals = _clones(inputs)
    guards = {}
    for k in fresh:
        view, base, inside = poison_like(data[k])
        data[k] = view
        guards[k] = (base, inside, "output")
    for k in sorted(written | (workspaces & set(data))):
        view, base, inside = guarded_copy(data[k])
        data[k] = view
        guards[k] = (base, inside, "workspace" if k in workspaces else "in-place input")
    mod.launch(cfg, data)
    _synchronize()
    name = mod.KERNEL_META["name"]
    for k, snap in originals.items():
        if k in written or k in workspaces or not hasattr(snap, "clone"):
            continue
        if not torch.equal(_bits(snap), _bits(data[k])):
            raise KernelCheckError(f"{name}: input '{k}' was modified by the kernel{_seed_note()}")
    for k, (base, inside, what) in guards.items():
        poison = _bits(base[:1])
        outside = _bits(base)[~inside]
        if outside.numel() and not (outside == poison).all():
            n = int((outside != poison).sum())
            raise KernelCheckError(f"{name}: {n} elements written outside {what} '{k}' (guard band / stride gap)")
    outputs = {k: data[inplace.get(k, k)] for k in expected}
    stats = check_outputs(mod, outputs, expected, "the fp32 oracle", cfg, originals)
    # Baselines get the unmodified inputs plus fresh (unpoisoned) output buffers of the outputs' shapes and dtypes, as
    # the bench hands them: ports whose upstream op writes into given buffers (FlashInfer's out=) read those.
    refs = run_reference_checks(mod, cfg, {**originals, **{k: torch.empty_like(data[k]) for k in fresh}}, outputs)
    failed = {n: r for n, r in refs.items() if r["status"] == "failed"}
    if failed:
        raise KernelCheckError("; ".join(r["reason"] for r in failed.values()))
    result = {"kernel": name, "config": cfg, "status": "passed", "oracle": stats, "references": refs}
    if getattr(mod, "GRADIENTS", None):
        result["gradients"] = check_gradients(mod, cfg, {**originals, **{k: data[k] for k in fresh}})
    return result


def run_test(mod, **cfg) -> dict:
    """Build, launch and check one config; raises ``KernelCheckError`` on any failure."""
    check_arch(mod.KERNEL_META)
    result = check_config(mod, full_config(mod, cfg))
    required = references.resolve_all(mod.KERNEL_META)
    return {**result, "requirements": {k: {"ok": ok, "detail": d} for k, (ok, d) in required.items()}}


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
