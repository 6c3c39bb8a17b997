# SPDX-License-Identifier: Apache-2.0
"""``promote RUN.json``: a clean, complete, retry-free run with references becomes its card's pinned rows.

Writes ``bench_suite/baseline.json`` (rows per card, ``cards.py``: the run replaces the rows of its own card and
every other card's rows stay), ``bench_suite/baseline.md`` generated from it, and ``bench_suite/baseline.png``
(skipped with a note without matplotlib).

``--partial``: the run need not cover the whole roster; it pins every kernel it holds (each with all of its roster
rows: a kernel is pinned whole or not at all) and keeps the card's other kernels' rows. The whole roster no longer
fits one session's device time (65 kernels took ~35 minutes of H100 time on 2026-12-07, a session has 30), and a
kernel whose source changed needs only its own rows again; every other check (clean commit, references, rounds,
no failed rows or retries, current fingerprints) applies as to a whole run.
"""

from __future__ import annotations

import json
import os

from . import cards, provenance, report
from .roster import load_all, select, validate
from .run import RUN_FORMAT, write_json

BASELINE_DIR = "bench_suite"
MIN_ROUNDS = 5


# Files that record measurements and cannot change one: a tree differing from its commit only in these was measured
# from that commit's sources (2026-12-07e: a call staged with the last call's promotion not yet committed measured
# the KDA forward from the stamped sources and was refused as dirty for bench_suite/baseline.*).
RECORD_PATHS = ("bench_suite/baseline.", "docs/", "README.md")


def source_dirty(git: dict) -> bool:
    """Whether a run's git state leaves its sources in doubt: dirty (or unknown) in any file but a measurement
    record (``RECORD_PATHS``); a list cut at 50 files stays in doubt."""
    if git.get("dirty") is False:
        return False
    files = git.get("dirty_files") or []
    return git.get("dirty") is None or not files or len(files) >= 50 or any(
        not f.startswith(RECORD_PATHS) for f in files)


class PromoteError(RuntimeError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("refusing to promote:\n" + "\n".join(f"  - {p}" for p in problems))


def current_fingerprints(entries) -> dict[str, str]:
    from tirx_kernels.core import artifacts

    return {name: artifacts.fingerprint(e.path) for name, e in entries.items()}


def problems(run: dict, root: str, entries=None, partial: bool = False) -> list[str]:
    """Everything that keeps ``run`` from being a baseline (empty: promotable); ``partial``: only the kernels the
    run holds must be complete."""
    from tirx_kernels import registry

    out = []
    if run.get("format") != RUN_FORMAT:
        return [f"not a bench-suite run (format {run.get('format')!r}, want {RUN_FORMAT!r})"]
    if not run.get("with_references"):
        out.append("the run was made without --with-references")
    rounds = run.get("options", {}).get("rounds", 0)
    if rounds < MIN_ROUNDS:
        out.append(f"the run used {rounds} rounds; a baseline needs at least {MIN_ROUNDS}")
    if cards.run_card(run) == cards.UNKNOWN:
        out.append("the run's GPU is unknown (no provenance gpu name): its rows would pin no card")
    git = run.get("provenance", {}).get("git", {})
    if not git.get("commit"):
        out.append(f"the run's source commit is unknown ({git.get('reason', 'no git state')})")
    if source_dirty(git):
        files = ", ".join(git.get("dirty_files", [])[:10])
        out.append(f"the run was made from a dirty tree ({files or 'state unknown'})")
    for r in run.get("rows", []):
        if r.get("retries"):
            out.append(f"{r['kernel']} {r['config']}: {r['retries']} retr{'y' if r['retries'] == 1 else 'ies'} "
                       f"({'; '.join(r.get('retry_reasons', []))[:300]})")
        if r.get("status") != "ok":
            reason = "; ".join(e["reason"] for e in r.get("errors", []))
            out.append(f"{r['kernel']} {r['config']}: status {r.get('status')}: {reason[:400]}")
    # A kernel whose module the registry skipped would silently drop out of the expected rows.
    out += [f"the registry skipped a module: {p.message}" for p in registry.problems()]
    entries = registry.scan() if entries is None else entries
    rosters = load_all(root)
    for name in sorted(entries):
        if name not in rosters:
            out.append(f"registered kernel {name} has no roster (config/<package>/{name}.yaml)")
    for name, ros in rosters.items():
        if name in entries:
            try:
                validate(ros, entries[name])
            except ValueError as e:
                out.append(str(e))
    got = {(r["kernel"], r["config"]): r for r in run.get("rows", [])}
    covered = {k for k, _ in got}
    if partial and not got:
        out.append("the run holds no rows")
    expected = {r.key: r for r in select({k: v for k, v in rosters.items()
                                          if k in entries and (not partial or k in covered)})}
    for key in expected:
        if key not in got:
            out.append(f"{key[0]} {key[1]}: roster row missing from the run")
    for key in got:
        if key not in expected:
            out.append(f"{key[0]} {key[1]}: the run has a row the rosters no longer list")
    fps = current_fingerprints({k: e for k, e in entries.items() if any(key[0] == k for key in got)})
    for key, r in got.items():
        if key[0] in fps and r.get("fingerprint") != fps[key[0]]:
            out.append(f"{key[0]} {key[1]}: measured source {r.get('fingerprint')}, the source now is {fps[key[0]]} "
                       "(stale: run again)")
    return out


def join(runs: list[dict], names: list[str]) -> dict:
    """Several runs of one card and one clean commit as one run (their rows together).

    A device call may run at most 10 minutes and the whole roster takes longer, so a card's baseline is measured
    in parts (``run --kernel ...`` per part). Each part keeps its own ceilings and device UUID per row; the
    joined run takes the first part's provenance and lists every part's under ``parts``. Parts of different
    cards, commits or tree states, or two parts measuring the same row, are refused.
    """
    if len(runs) == 1:
        return runs[0]
    out = []
    card_of = {name: cards.run_card(r) for name, r in zip(names, runs)}
    if len(set(card_of.values())) > 1:
        out.append("the runs were measured on different cards: "
                   + ", ".join(f"{n} {c}" for n, c in card_of.items()))
    commits = {n: (r.get("provenance", {}).get("git", {}).get("commit"),
                   r.get("provenance", {}).get("git", {}).get("dirty")) for n, r in zip(names, runs)}
    if len(set(commits.values())) > 1:
        out.append("the runs come from different source states: "
                   + ", ".join(f"{n} {c[0]} (dirty {c[1]})" for n, c in commits.items()))
    seen = {}
    for name, run in zip(names, runs):
        for key in ((r["kernel"], r["config"]) for r in run.get("rows", [])):
            if key in seen:
                out.append(f"{key[0]} {key[1]}: measured by both {seen[key]} and {name}")
            seen[key] = name
    if out:
        raise PromoteError(out)
    first = runs[0]
    rows = [r for run in runs for r in run.get("rows", [])]
    joined = {**first, "rows": rows, "summary": {k: sum(r.get("summary", {}).get(k, 0) for r in runs)
                                                 for k in first.get("summary", {})},
              "options": {**first.get("options", {}),
                          "rounds": min(r.get("options", {}).get("rounds", 0) for r in runs)},
              "with_references": all(r.get("with_references") for r in runs),
              "parts": [{"from": n, "created": r.get("created"), "rows": len(r.get("rows", [])),
                         "gpu": r.get("provenance", {}).get("gpu"), "ceilings": r.get("provenance", {}).get("ceilings")}
                        for n, r in zip(names, runs)]}
    # Completeness is the rosters' business: ``problems`` checks every expected row against the joined rows.
    joined.pop("complete", None)
    joined.pop("missing_rows", None)
    return joined


def promote(run_path: str | list[str], root: str, entries=None, partial: bool = False) -> dict:
    """Pin the run's card in baseline.json / .md / .png under ``<root>/bench_suite`` (other cards kept);
    several run paths are joined first (``join``); ``partial``: pin only the kernels the run holds (module
    docstring); raises ``PromoteError`` listing problems."""
    paths = [run_path] if isinstance(run_path, str) else list(run_path)
    loaded = []
    for path in paths:
        with open(path) as f:
            loaded.append(json.load(f))
    run = join(loaded, [os.path.basename(p) for p in paths])
    run_path = paths[0] if len(paths) == 1 else " + ".join(os.path.basename(p) for p in paths)
    found = problems(run, root, entries, partial)
    if found:
        raise PromoteError(found)
    kernels = sorted({r["kernel"] for r in run.get("rows", [])}) if partial else None
    out_dir = os.path.join(root, BASELINE_DIR)
    json_path = os.path.join(out_dir, "baseline.json")
    earlier = None
    if os.path.exists(json_path):
        with open(json_path) as f:
            earlier = json.load(f)
    base = cards.pin(earlier, run, {"at": provenance.now(), "from": os.path.basename(run_path)}, kernels)
    paths = write_baseline(base, out_dir)
    return {"baseline": base, "card": cards.run_card(run), "kernels": kernels, **paths}


def write_baseline(base: dict, out_dir: str) -> dict:
    """baseline.json, and baseline.md / .png generated from it, for a baseline of format 2 (``cards.py``)."""
    json_path = os.path.join(out_dir, "baseline.json")
    md_path = os.path.join(out_dir, "baseline.md")
    png_path = os.path.join(out_dir, "baseline.png")
    write_json(json_path, base)
    note = report.render_chart(base, png_path)
    with open(md_path, "w") as f:
        f.write(report.render_markdown(base, None if note else "baseline.png", note))
    return {"json": json_path, "md": md_path, "png": None if note else png_path, "chart_note": note}
