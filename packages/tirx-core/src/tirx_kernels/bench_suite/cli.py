# SPDX-License-Identifier: Apache-2.0
"""Command line of the bench suite (``python -m tirx_kernels.bench_suite [run|promote|ratio_diff|status|stamp]``).

Exit codes: 0 success; 1 a failed row, a refused promote, a failing ratio_diff, ``status --check``
with work to do; 2 a usage or setup error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

COMMANDS = ("run", "promote", "ratio_diff", "status", "stamp")


def _root(a) -> str:
    from tirx_kernels.core.reference_lock import repo_root

    return os.path.abspath(a.root) if a.root else repo_root()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.bench_suite",
                                 description="Bench-suite sweeps, the pinned baseline and the regression gate.")
    sub = ap.add_subparsers(dest="command")

    def add(name, help_):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--root", help="monorepo root (default: found above the current directory)")
        return p

    r = add("run", "measure the roster rows (the default command)")
    r.add_argument("--kernel", action="append", help="only this kernel's roster (repeatable)")
    r.add_argument("--role", action="append", choices=("small", "medium", "large"), help="only rows of this role")
    r.add_argument("--config", action="append", help="only this config label")
    r.add_argument("--with-references", action="store_true",
                   help="also time every enabled reference; one not installed here (ImportError) is skipped with its "
                        "reason, one that raises anything else fails its row")
    r.add_argument("--out", help="run JSON to write (default: build/bench_suite/run-<UTC time>.json)")
    r.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds per row (default 5; a baseline needs >= 5)")
    r.add_argument("--retries", type=int, default=0,
                   help="re-run a row that raised, up to N times (recorded; promote refuses runs with retries)")
    r.add_argument("--server", help="run every row on this kcoral server, e.g. http://127.0.0.1:8000")
    r.add_argument("--timeout", type=float, default=900.0, help="per-row kcoral execution limit in seconds")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--parts", metavar="DIR",
                   help="one run JSON per kernel into DIR as each is measured (instead of --out); kernels whose part "
                        "is there already are skipped, so the same command resumes; promote joins the parts")
    r.add_argument("--time-limit", type=float, help="with --parts: start no kernel after this many seconds")
    r.add_argument("--kernel-timeout", type=float,
                   help="with --parts: a kernel still running after this many seconds is marked (DIR/<kernel>.json"
                        ".timeout, skipped from then on) and the process exits with 124; run the command again")

    p = add("promote", "pin a clean, complete, retry-free run as its card's rows of bench_suite/baseline.{json,md,png}")
    p.add_argument("run_json", nargs="+",
                   help="one run, or the parts of one card's run (same commit; a device call is 10 minutes at most)")
    p.add_argument("--partial", action="store_true",
                   help="pin only the kernels the run holds (each with all its roster rows); keep the card's others")

    d = add("ratio_diff", "compare two runs: fail rows with after/before >= 1.01 or differing provenance")
    d.add_argument("before")
    d.add_argument("after")
    d.add_argument("--threshold", type=float, default=1.01)
    d.add_argument("--allow-source-change", action="store_true",
                   help="a changed kernel fingerprint is a note, not a failure (before/after of a kernel edit)")
    d.add_argument("--card", help="compare only this card's rows (e.g. H100); default: every card both sides hold")
    d.add_argument("--json", action="store_true")

    s = add("status", "registered kernels whose baseline rows are missing or stale, per card")
    s.add_argument("--baseline", help="default: bench_suite/baseline.json")
    s.add_argument("--card", help="only this card (e.g. H100, H200); default: every card the baseline holds")
    s.add_argument("--check", action="store_true", help="exit 1 if anything is missing or stale")
    s.add_argument("--json", action="store_true")
    s.add_argument("--names", action="store_true",
                   help="only the names of the kernels with work to do, one a line, cheapest first (by the longest "
                        "row time any card recorded): a GPU run's `bench_suite run --kernel ...` list")

    t = add("stamp", "write a source stamp (commit, dirty flag, file hashes) for a GPU host without .git")
    t.add_argument("--out", help="default: .gpu/source-stamp.json (found there by the run)")
    return ap


def cmd_run(a) -> int:
    from . import report
    from .roster import RosterError, load_all, select, validate
    from .run import LocalExecutor, build_run, run_rows, write_json

    root = _root(a)
    try:
        from tirx_kernels import registry

        rosters = load_all(root)
        entries = registry.scan()
        for name, ros in rosters.items():
            if name in entries:
                validate(ros, entries[name])
        rows = select(rosters, a.kernel, a.role, a.config)
    except (RosterError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("error: no roster row matches the selection", file=sys.stderr)
        return 2
    if a.rounds < 1 or a.retries < 0:
        print("error: --rounds must be >= 1 and --retries >= 0", file=sys.stderr)
        return 2
    if a.parts and (a.role or a.config or a.out):
        print("error: --parts writes each kernel's whole roster to DIR/<kernel>.json: no --role, --config or --out",
              file=sys.stderr)
        return 2
    if (a.time_limit is not None or a.kernel_timeout is not None) and not a.parts:
        print("error: --time-limit and --kernel-timeout go with --parts", file=sys.stderr)
        return 2
    if a.server:
        from .remote import KcoralExecutor, RemoteError

        try:
            executor = KcoralExecutor(a.server, timeout_s=a.timeout)
        except RemoteError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        executor = LocalExecutor()
    out = a.out or os.path.join(root, "build", "bench_suite", time.strftime("run-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    try:
        try:
            env = executor.environment(root)
        except Exception as e:  # a remote server that cannot run the environment program
            print(f"error: cannot collect the measuring host's provenance: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        if a.parts:
            from .run import run_parts

            res = run_parts(root, rows, executor, a.with_references, a.rounds, a.retries, a.parts, env,
                            a.time_limit, a.kernel_timeout, ["python", "-m", "tirx_kernels.bench_suite",
                                                             *sys.argv[1:]], progress=not a.no_progress)
            failed = 0
            for run in res["runs"].values():
                print(report.summary_table(run))
                failed += run["summary"]["failed"]
            for what in ("done_before", "timed_out_before", "not_started"):
                if res[what]:
                    print(f"{what.replace('_', ' ')}: {', '.join(res[what])}")
            print(f"parts written to {a.parts}: {', '.join(res['written']) or 'none'}")
            return 1 if failed else 0
        results = run_rows(rows, executor, a.with_references, a.rounds, a.retries, progress=not a.no_progress)
    finally:
        executor.close()
    selection = {"kernel": a.kernel, "role": a.role, "config": a.config}
    run = build_run(root, rows, results, executor, a.with_references, a.rounds, a.retries, selection, env,
                    argv=["python", "-m", "tirx_kernels.bench_suite", *sys.argv[1:]])
    write_json(out, run)
    print(report.summary_table(run))
    print(f"run written to {out}")
    return 1 if run["summary"]["failed"] else 0


def cmd_promote(a) -> int:
    from .promote import PromoteError, promote

    root = _root(a)
    try:
        res = promote(a.run_json, root, partial=a.partial)
    except PromoteError as e:
        print(str(e), file=sys.stderr)
        return 1
    chart = f", {res['png']}" if res["png"] else f" (chart skipped: {res['chart_note']})"
    which = f" of {len(res['kernels'])} kernels" if res.get("kernels") is not None else ""
    print(f"{res['card']} rows{which} pinned; baseline written: {res['json']}, {res['md']}{chart}")
    return 0


def cmd_ratio_diff(a) -> int:
    from .compare import format_ratio_diff, load, ratio_diff

    res = ratio_diff(load(a.before), load(a.after), a.threshold, a.allow_source_change, a.card)
    print(json.dumps(res, indent=1) if a.json else format_ratio_diff(res))
    return 0 if res["passed"] else 1


def cmd_status(a) -> int:
    from .compare import format_status, load, status

    root = _root(a)
    path = a.baseline or os.path.join(root, "bench_suite", "baseline.json")
    base = load(path) if os.path.exists(path) else None
    items = status(root, base, card=a.card)
    if a.names:
        from .compare import needing_by_cost

        print("\n".join(needing_by_cost(items, base)))
    else:
        print(json.dumps(items, indent=1) if a.json else format_status(items, path, base))
    return 1 if a.check and not all(i["up_to_date"] for i in items) else 0


def cmd_stamp(a) -> int:
    from .provenance import write_stamp

    root = _root(a)
    out = a.out or os.path.join(root, ".gpu", "source-stamp.json")
    st = write_stamp(root, out)
    print(f"stamp written to {out}: commit {st['commit']}, dirty {st['dirty']}, {len(st['files'])} files")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "run")
    a = _parser().parse_args(argv)
    return {"run": cmd_run, "promote": cmd_promote, "ratio_diff": cmd_ratio_diff, "status": cmd_status,
            "stamp": cmd_stamp}[a.command](a)
