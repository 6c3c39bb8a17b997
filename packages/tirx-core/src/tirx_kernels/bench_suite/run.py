# SPDX-License-Identifier: Apache-2.0
"""Measure roster rows (locally, or through an executor such as ``remote.KcoralExecutor``) into one run JSON.

A row measures our kernel and, with ``--with-references``, every enabled reference, all in the same
``core.bench.time_calls`` rounds (cold L2, warm-up, median, implementations interleaved). A reference
that cannot be imported, built or called fails its row with the reason; nothing is dropped silently.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback

from . import provenance
from .roster import RosterRow

RUN_FORMAT = "tirx-bench-suite-run/1"
STATUSES = ("ok", "failed", "skipped")


def _error(where: str, reason: str) -> dict:
    return {"where": where, "reason": reason}


def measure_row(mod, cfg: dict, with_references: bool, references: list | None, rounds: int) -> dict:
    """Time one config of a kernel module (and its enabled references) on the current GPU."""
    import torch

    from tirx_kernels.core import bench
    from tirx_kernels.core.arch import check_arch

    check_arch(mod.KERNEL_META)
    name = mod.KERNEL_META["name"]
    data = mod.prepare_data(**cfg)
    fns = {"ours": functools.partial(mod.launch, cfg, data)}
    errors = []
    # A reference that is not installed on this host (ImportError, the project's convention for "missing reference",
    # also raised by wrappers that refuse an upstream known to be wrong here) is skipped with its reason: recorded in
    # the row and shown in the tables, never timed and never an error. Anything else it raises fails the row.
    skipped_refs = {}
    if with_references:
        baselines = mod.get_baselines(**cfg) if hasattr(mod, "get_baselines") else {}
        for ref in (list(baselines) if references is None else references):
            if ref not in baselines:
                errors.append(_error(ref, f"reference '{ref}' is enabled in the roster but {name}.get_baselines "
                                          f"has no such entry (it has: {', '.join(baselines) or 'none'})"))
                continue
            try:
                fn = functools.partial(baselines[ref](), data)
                fn()  # probe: imports, JIT builds and a first call, so a failure stays with this reference
                torch.cuda.synchronize()
            except ImportError as e:
                skipped_refs[ref] = f"{type(e).__name__}: {e}"[:400]
                continue
            except Exception as e:
                errors.append(_error(ref, f"reference '{ref}' is missing or failed: {type(e).__name__}: {e}"))
                continue
            fns[ref] = fn
    torch.cuda.synchronize()
    times = bench.time_calls(fns, rounds=rounds)
    # One timer per row: if anything runs under the graph threshold, every implementation is graph-timed.
    if min(t["median_us"] for t in times.values()) < bench.GRAPH_THRESHOLD_US:
        for impl, t in list(times.items()):
            try:
                times[impl] = {**bench.time_graph(fns[impl], rounds=rounds), "cold_l2_us": t["median_us"]}
            except Exception as e:  # keeps its cold-L2 event timing; the row's table shows the timer
                t["graph_error"] = f"{type(e).__name__}: {e}"
    ceil = bench.ceilings()
    us = times["ours"]["median_us"]
    extra = ("cold_l2_us", "graph_error")
    refs = {impl: {"us": t["median_us"], "ref_over_ours": t["median_us"] / us, "timer": t["timer"],
                   "rounds_us": t["rounds_us"], **{k: t[k] for k in extra if k in t}}
            for impl, t in times.items() if impl != "ours"}
    return {"us": us, "timer": times["ours"]["timer"], "rounds_us": times["ours"]["rounds_us"],
            **{k: times["ours"][k] for k in extra if k in times["ours"]},
            **(stats := bench.roofline_stats(mod.roofline(**cfg), us, ceil)),
            # The row's compute ceiling (an FP8 row's is FP8, measured only when a row asks for it) beside the copy
            # and bf16 ones, so the row's provenance holds what its % of roofline was taken against.
            "ceilings": {**ceil, f"{stats['compute_ceiling']}_tflop_s": stats["compute_ceiling_tflop_s"]},
            "references": refs, "skipped_references": skipped_refs, "errors": errors}


def measure_spec(spec: dict) -> dict:
    """One row from a JSON-able spec (``kernel, config, with_references, references, rounds``), never raising.

    ``status`` is ok / failed (a measured row with errors) / skipped (cannot run here) / error (an
    exception: the caller may retry). Also what a kcoral worker runs (``remote_entry.bench_row``).
    """
    from tirx_kernels import registry
    from tirx_kernels.core import artifacts
    from tirx_kernels.core.arch import UnsupportedArchError
    from tirx_kernels.core.harness import find_config, full_config

    t0 = time.time()
    out = {"kernel": spec["kernel"], "config": spec["config"], "status": "error", "errors": []}
    try:
        entries = registry.scan()
        entry = entries.get(spec["kernel"])
        if entry is None:
            broken = [p.message for p in registry.problems() if p.kernel == spec["kernel"]]
            if broken:  # installed but malformed: a fault to fix, not a row this host cannot run
                out.update(status="failed", errors=[_error("ours", "the registry skipped its module: "
                                                           + "; ".join(broken))])
            else:
                out.update(status="skipped", errors=[_error("ours", f"kernel {spec['kernel']} is not installed here")])
            return out
        out.update(module=entry.module, distribution=entry.distribution, fingerprint=artifacts.fingerprint(entry.path))
        mod = registry.load(spec["kernel"])
        cfg = full_config(mod, find_config(mod, spec["config"], bench=True))
        out["params"] = cfg
        res = measure_row(mod, cfg, spec.get("with_references", False), spec.get("references"),
                          int(spec.get("rounds", 5)))
        out.update(res, status="failed" if res["errors"] else "ok")
    except UnsupportedArchError as e:
        out.update(status="skipped", errors=[_error("ours", f"{type(e).__name__}: {e}")])
    except Exception as e:
        tb = traceback.format_exc(limit=8)
        out.update(status="error", errors=[_error("ours", f"{type(e).__name__}: {e}")], traceback=tb[-4000:])
    finally:
        out["device_uuid"] = provenance.device_uuid()
        out["elapsed_s"] = round(time.time() - t0, 3)
    return out


class LocalExecutor:
    """Rows measured in this process, on this machine's current GPU."""

    mode = "local"
    server = None

    def environment(self, root: str) -> dict:
        return provenance.environment(root)

    def measure(self, spec: dict) -> dict:
        return measure_spec(spec)

    def close(self) -> None:
        pass


def spec_of(row: RosterRow, with_references: bool, rounds: int) -> dict:
    return {"kernel": row.kernel, "config": row.config, "role": row.role, "with_references": with_references,
            "references": row.references, "rounds": rounds}


class _Progress:
    """tqdm when installed and stderr is a terminal, else one stderr line per row."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.bar = None
        if enabled and total and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="row", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def start(self, row: RosterRow) -> None:
        if self.bar is not None:
            self.bar.set_description(f"{row.kernel} {row.config}")

    def finish(self, row: RosterRow, result: dict) -> None:
        self.done += 1
        us = result.get("us")
        note = f"{result['status']}" + (f" {us:.1f} us" if isinstance(us, (int, float)) else "")
        if self.bar is not None:
            self.bar.set_postfix_str(note)
            self.bar.update(1)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {row.kernel} {row.config} ({row.role}): {note}", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_rows(rows: list[RosterRow], executor, with_references: bool, rounds: int, retries: int = 0,
             progress: bool = True) -> list[dict]:
    """Measure every row; an exception is retried up to ``retries`` times and every retry is recorded."""
    results = []
    bar = _Progress(len(rows), progress)
    try:
        for row in rows:
            bar.start(row)
            attempts = []
            while True:
                try:
                    res = executor.measure(spec_of(row, with_references, rounds))
                except Exception as e:  # transport-level failure of a remote executor
                    res = {"kernel": row.kernel, "config": row.config, "status": "error",
                           "errors": [_error("executor", f"{type(e).__name__}: {e}")]}
                attempts.append(res)
                if res["status"] != "error" or len(attempts) > retries:
                    break
            if res["status"] == "error":
                res["status"] = "failed"
            res.update(role=row.role, package=row.package, rationale=row.rationale,
                       enabled_references=row.references, attempts=len(attempts), retries=len(attempts) - 1)
            if len(attempts) > 1:
                res["retry_reasons"] = [e["reason"] for a in attempts[:-1] for e in a.get("errors", [])]
            results.append(res)
            bar.finish(row, res)
    finally:
        bar.close()
    return results


def summarize(rows: list[dict]) -> dict:
    s = {k: sum(r["status"] == k for r in rows) for k in STATUSES}
    s["retries"] = sum(r.get("retries", 0) for r in rows)
    s["rows"] = len(rows)
    return s


def build_run(root: str, rows_spec: list[RosterRow], results: list[dict], executor, with_references: bool,
              rounds: int, retries: int, selection: dict, env: dict | None, argv: list | None = None) -> dict:
    from .roster import load_all, select

    expected = [r.key for r in select(load_all(root))]
    got = {(r["kernel"], r["config"]) for r in results}
    run = {"format": RUN_FORMAT, "created": provenance.now(), "argv": argv or sys.argv,
           "mode": executor.mode, "server": executor.server, "with_references": with_references,
           "options": {"rounds": rounds, "retries_allowed": retries, "selection": selection},
           "complete": all(k in got for k in expected), "missing_rows": [list(k) for k in expected if k not in got],
           "provenance": provenance.collect(root, rounds, env), "rows": results, "summary": summarize(results)}
    first = next((r for r in results if r.get("ceilings")), None)
    run["provenance"]["ceilings"] = first["ceilings"] if first else None
    return run


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
