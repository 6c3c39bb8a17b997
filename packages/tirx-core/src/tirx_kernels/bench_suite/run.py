# SPDX-License-Identifier: Apache-2.0
"""Measure roster rows (locally, or through an executor such as ``remote.KcoralExecutor``) into one run JSON.

A row measures our kernel and, with ``--with-references``, every enabled reference, all in the same
``core.bench.time_calls`` rounds (cold L2, warm-up, median, implementations interleaved). A reference that is not
installed here (ImportError) is recorded as skipped with its reason; one that cannot be built or called fails its
row with the reason; nothing is dropped silently.

``run_parts`` writes one run JSON per kernel into a directory as it goes, resumable and time-boxed: what a device
call of at most 10 minutes needs (2026-12-07: a single-process run past the call's limit lost every row it had
measured; a kernel whose first reference call took minutes stalled the rest).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
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
    extra = ("cold_l2_us", "graph_error", "calls")
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


def part_path(parts_dir: str, kernel: str) -> str:
    return os.path.join(parts_dir, f"{kernel}.json")


class _Watchdog:
    """After ``seconds`` of one kernel's rows: write ``marker`` (the kernel and its limit) and leave the process at
    once with exit code 124 (a GPU call that does not return cannot be interrupted from Python; the caller starts
    the run again and it goes on after the marked kernel)."""

    def __init__(self, seconds: float, marker: str, kernel: str, exit_fn=os._exit):
        self.marker, self.kernel, self.seconds, self.exit_fn = marker, kernel, seconds, exit_fn
        self.timer = threading.Timer(seconds, self.fire)
        self.timer.daemon = True
        self.timer.start()

    def fire(self) -> None:
        write_json(self.marker, {"kernel": self.kernel, "kernel_timeout_s": self.seconds, "at": provenance.now()})
        print(f"\nbench suite: {self.kernel} ran past its {self.seconds:.0f} s limit; marked {self.marker}",
              file=sys.stderr, flush=True)
        self.exit_fn(124)

    def cancel(self) -> None:
        self.timer.cancel()


def run_parts(root: str, rows: list[RosterRow], executor, with_references: bool, rounds: int, retries: int,
              parts_dir: str, env: dict, time_limit: float | None = None, kernel_timeout: float | None = None,
              argv: list | None = None, progress: bool = True, exit_fn=os._exit) -> dict:
    """Measure ``rows`` kernel by kernel, each kernel's rows into ``parts_dir/<kernel>.json`` (a run of its own,
    written as soon as it is measured; ``promote`` joins the parts). A kernel whose part exists is skipped (the
    run resumes), and so is one with a ``.timeout`` marker (it ran past ``kernel_timeout`` before: the watchdog
    wrote the marker and ended the process). No kernel starts after ``time_limit`` seconds.
    Returns ``{"written": [...], "done_before": [...], "timed_out_before": [...], "not_started": [...]}``."""
    os.makedirs(parts_dir, exist_ok=True)
    by_kernel: dict[str, list[RosterRow]] = {}
    for row in rows:
        by_kernel.setdefault(row.kernel, []).append(row)
    end = None if time_limit is None else time.monotonic() + time_limit
    out: dict = {"written": [], "done_before": [], "timed_out_before": [], "not_started": [], "runs": {}}
    for kernel, krows in by_kernel.items():
        path = part_path(parts_dir, kernel)
        if os.path.exists(path):
            out["done_before"].append(kernel)
            continue
        if os.path.exists(path + ".timeout"):
            out["timed_out_before"].append(kernel)
            continue
        if end is not None and time.monotonic() >= end:
            out["not_started"].append(kernel)
            continue
        dog = _Watchdog(kernel_timeout, path + ".timeout", kernel, exit_fn) if kernel_timeout else None
        try:
            results = run_rows(krows, executor, with_references, rounds, retries, progress)
        finally:
            if dog is not None:
                dog.cancel()
        run = build_run(root, krows, results, executor, with_references, rounds, retries,
                        {"kernel": [kernel], "role": None, "config": None}, env, argv)
        write_json(path, run)
        out["written"].append(kernel)
        out["runs"][kernel] = run
    return out
