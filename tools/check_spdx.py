#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""License lint: every tracked source file carries an SPDX header; every port cites its upstream commit.

    python tools/check_spdx.py        # exit 1 listing the offenders
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

SOURCE_SUFFIXES = (".py", ".sh", ".c", ".cc", ".cu", ".cuh", ".h", ".hpp")
SOURCE_NAMES = ("run",)
HEAD_LINES = 5


def tracked_files(root: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if os.path.exists(os.path.join(root, p))]


def port_upstream_commit(path: str) -> str | None:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KERNEL_META" for t in node.targets):
            try:
                meta = ast.literal_eval(node.value)
            except ValueError:
                return None
            return (meta.get("upstream") or {}).get("commit")
    return None


def check(root: str) -> list[str]:
    problems = []
    for rel in tracked_files(root):
        if not (rel.endswith(SOURCE_SUFFIXES) or os.path.basename(rel) in SOURCE_NAMES):
            continue
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [next(f, "") for _ in range(HEAD_LINES)]
        if not any("SPDX-License-Identifier:" in line for line in head):
            problems.append(f"{rel}: no SPDX-License-Identifier in the first {HEAD_LINES} lines")
        if "/ported/" in rel and rel.endswith(".py"):
            commit = port_upstream_commit(path)
            if commit is not None:
                with open(path, encoding="utf-8") as f:
                    header = "".join(next(f, "") for _ in range(30))
                if commit not in header:
                    problems.append(f"{rel}: the file header must cite the upstream commit {commit}")
    return problems


def main() -> int:
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    problems = check(root)
    for p in problems:
        print(p)
    print(f"check_spdx: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
