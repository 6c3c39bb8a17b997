#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Install (or check) the pinned reference dependencies of each package: ``packages/*/reference-dependencies.json``.

    python tools/install_reference_dependencies.py [--package P]... [--dry-run]     # pip pins; git+URL@COMMIT
    python tools/install_reference_dependencies.py --check [--allow-missing]       # exit 1 listing mismatches

Install needs network access (and torch + nvcc for the source installs: DeepGEMM, FlashMLA, FA3).
``--check`` compares installed versions, and the PEP 610 commit of source installs, with the lock.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

try:
    from tirx_kernels.core import reference_lock
except ImportError:  # tirx-core not installed yet: use the checkout's copy
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "packages", "tirx-core", "src"))
    from tirx_kernels.core import reference_lock


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package", action="append", help="only this package's lock (repeatable), e.g. tirx-native")
    ap.add_argument("--check", action="store_true", help="compare what is installed with the lock; install nothing")
    ap.add_argument("--allow-missing", action="store_true", help="with --check: only wrong revisions fail")
    ap.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose pip installs (default: this one)")
    ap.add_argument("--root", help="monorepo root (default: the one holding this script)")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root) if a.root else reference_lock.repo_root(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    available = reference_lock.packages_with_locks(root)
    unknown = sorted(set(a.package or []) - set(available))
    if unknown:
        print(f"error: no lock for {', '.join(unknown)}; locks: {', '.join(available)}", file=sys.stderr)
        return 2
    locks = {p: reference_lock.load(root, p) for p in (a.package or available)}

    if a.check:
        bad = []
        for pkg, lock in locks.items():
            for req in lock["requirements"]:
                state, detail = reference_lock.check_requirement(req)
                print(f"{state:>9}  [{pkg}] {detail}")
                if state == "mismatch" or (state == "missing" and not a.allow_missing):
                    bad.append(f"[{pkg}] {detail}")
        if bad:
            print(f"\n{len(bad)} mismatch(es) against the lock:", file=sys.stderr)
            for b in bad:
                print(f"  {b}", file=sys.stderr)
            return 1
        print("all installed reference dependencies match the lock")
        return 0

    pins, sources, seen = [], [], set()
    for pkg, lock in locks.items():
        for req in lock["requirements"]:
            key = reference_lock.describe(req)
            if key in seen:  # the same pin in two locks: install once
                continue
            seen.add(key)
            if "git" not in req:
                pins.append(req)
            elif req.get("commit"):
                sources.append(req)
            else:
                print(f"# [{pkg}] skip {req['package']}: no commit pinned yet ({req.get('why', '')})")
    # All pins in one pip call (one resolution); then each source install, which builds against them.
    cmds = []
    if pins:
        cmds.append([a.python, "-m", "pip", "install", *(f"{r['package']}{r['specifier']}" for r in pins)])
    cmds += [reference_lock.pip_command(r, python=a.python) for r in sources]
    rc = 0
    for cmd in cmds:
        print(" ".join(cmd), flush=True)
        if not a.dry_run:
            r = subprocess.run(cmd)
            if r.returncode:
                print(f"error: {' '.join(cmd[4:])} failed (exit {r.returncode})", file=sys.stderr)
                rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
