# SPDX-License-Identifier: Apache-2.0
"""The reference lock: ``packages/<package>/reference-dependencies.json``, one per distribution.

A lock names the exact revision of every upstream / reference package a distribution's tests and
bench use: a pip pin (``"specifier": "==0.7.4"``) or a git source install at a commit (``"git"``,
``"commit"``, optional ``"subdirectory"`` and ``"pip_args"``) for projects without wheels. Kernel
``reference_requirements`` must agree with their package's lock (``tests/test_reference_lock.py``);
``tools/install_reference_dependencies.py`` installs a lock and ``--check`` compares what is installed
(version, and the PEP 610 ``direct_url.json`` commit of source installs) against it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .references import installed_commit

LOCK_FILE = "reference-dependencies.json"
LOCK_FORMAT = 1
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class LockError(ValueError):
    """A lock file is missing a field or contradicts itself."""


def repo_root(start: str | None = None) -> str:
    """The monorepo root: the nearest folder above ``start`` (default: cwd, then this file) holding packages/."""
    for base in ([start] if start else []) + [os.getcwd(), os.path.dirname(os.path.abspath(__file__))]:
        d = os.path.abspath(base)
        while True:
            if os.path.isdir(os.path.join(d, "packages", "tirx-core")):
                return d
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    raise FileNotFoundError("no monorepo root (a folder with packages/tirx-core) above the current directory")


def lock_path(root: str, package: str) -> str:
    return os.path.join(root, "packages", package, LOCK_FILE)


def validate(lock: dict, path: str = "<lock>") -> None:
    if lock.get("format") != LOCK_FORMAT:
        raise LockError(f"{path}: 'format' must be {LOCK_FORMAT}")
    if not isinstance(lock.get("package"), str):
        raise LockError(f"{path}: 'package' must name the distribution")
    seen = set()
    for i, r in enumerate(lock.get("requirements", [])):
        where = f"{path}: requirements[{i}]"
        for key in ("package", "import"):
            if not isinstance(r.get(key), str):
                raise LockError(f"{where} needs a string '{key}'")
        if r["package"] in seen:
            raise LockError(f"{where}: duplicate package {r['package']}")
        seen.add(r["package"])
        if "git" in r:
            if r.get("commit") is not None and not COMMIT_RE.match(r["commit"]):
                raise LockError(f"{where}: 'commit' must be 40 lowercase hex digits or null")
            if r.get("commit") is None and not r.get("why", "").strip():
                raise LockError(f"{where}: an unpinned source install needs a 'why' note")
        elif "specifier" in r:
            SpecifierSet(r["specifier"])  # raises InvalidSpecifier
            if not r["specifier"].startswith("=="):
                raise LockError(f"{where}: a lock pins exactly ('==X'), got {r['specifier']!r}")
        else:
            raise LockError(f"{where} needs 'specifier' (pip pin) or 'git' + 'commit' (source install)")


def load(root: str, package: str) -> dict:
    path = lock_path(root, package)
    with open(path, encoding="utf-8") as f:
        lock = json.load(f)
    validate(lock, path)
    if lock["package"] != package:
        raise LockError(f"{path}: 'package' is {lock['package']!r}, the folder says {package!r}")
    return lock


def packages_with_locks(root: str) -> list[str]:
    pk = os.path.join(root, "packages")
    return sorted(p for p in os.listdir(pk) if os.path.exists(os.path.join(pk, p, LOCK_FILE)))


def load_all(root: str) -> dict[str, dict]:
    return {p: load(root, p) for p in packages_with_locks(root)}


def requirement(lock: dict, package: str) -> dict | None:
    for r in lock.get("requirements", []):
        if r["package"] == package:
            return r
    return None


def pip_command(req: dict, python: str = "python3") -> list[str] | None:
    """The pip command installing one lock entry, or None for a source install with no pinned commit."""
    base = [python, "-m", "pip", "install"]
    if "git" in req:
        if not req.get("commit"):
            return None
        url = f"git+{req['git']}@{req['commit']}"
        if req.get("subdirectory"):
            url += f"#subdirectory={req['subdirectory']}"
        return base + list(req.get("pip_args", [])) + [url]
    return base + list(req.get("pip_args", [])) + [f"{req['package']}{req['specifier']}"]


def check_requirement(req: dict) -> tuple[str, str]:
    """``("ok" | "missing" | "mismatch" | "unpinned", detail)`` for one lock entry against this environment."""
    name = req["package"]
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing", f"{name} is not installed (lock: {describe(req)})"
    if "git" in req:
        if not req.get("commit"):
            return "unpinned", f"{name} {dist.version} installed; the lock pins no commit yet ({req.get('why', '')})"
        got = installed_commit(dist)
        if got != req["commit"]:
            return "mismatch", f"{name} is installed from commit {got or '(not a git install)'}, lock: {req['commit']}"
        return "ok", f"{name} {dist.version} @ {got[:12]}"
    if not SpecifierSet(req["specifier"]).contains(Version(dist.version), prereleases=True):
        return "mismatch", f"{name} {dist.version} is installed, lock: {req['specifier']}"
    return "ok", f"{name} {dist.version}"


def describe(req: dict) -> str:
    if "git" in req:
        sub = f"#subdirectory={req['subdirectory']}" if req.get("subdirectory") else ""
        return f"git+{req['git']}@{req.get('commit') or '(unpinned)'}{sub}"
    return f"{req['package']}{req['specifier']}"


def kernel_disagreements(meta: dict, lock: dict | None, distribution: str) -> list[str]:
    """Where a kernel's ``reference_requirements`` / ``upstream`` disagree with its package's lock."""
    name = meta.get("name", "?")
    problems = []
    reqs = meta.get("reference_requirements", [])
    if lock is None:
        if reqs or meta.get("upstream"):
            problems.append(f"{name}: package {distribution} has no {LOCK_FILE}")
        return problems
    for r in reqs:
        locked = requirement(lock, r["package"])
        if locked is None:
            problems.append(f"{name}: reference {r['package']} is not in {distribution}'s lock")
            continue
        if r.get("import") != locked["import"]:
            problems.append(f"{name}: reference {r['package']} imports {r.get('import')!r}, lock: {locked['import']!r}")
        if "specifier" in r and r["specifier"] != locked.get("specifier"):
            problems.append(f"{name}: reference {r['package']} specifier {r['specifier']!r}, "
                            f"lock: {locked.get('specifier')!r}")
        if "commit" in r and r["commit"] != locked.get("commit"):
            problems.append(f"{name}: reference {r['package']} commit {r['commit']!r}, lock: {locked.get('commit')!r}")
    up = meta.get("upstream")
    if up:
        match = [u for u in lock.get("upstreams", []) if u.get("url") == up.get("url")]
        if not match:
            problems.append(f"{name}: upstream {up.get('url')} is not in {distribution}'s lock 'upstreams'")
        elif up.get("commit") not in {match[0].get("commit"), match[0].get("tag")} - {None}:
            problems.append(f"{name}: upstream commit {up.get('commit')!r}, lock: commit "
                            f"{match[0].get('commit')!r} / tag {match[0].get('tag')!r}")
    return problems


def cross_lock_disagreements(locks: dict[str, dict]) -> list[str]:
    """A package pinned by two locks must be pinned the same way in both."""
    seen: dict[str, tuple[str, str]] = {}
    problems = []
    for pkg, lock in sorted(locks.items()):
        for r in lock.get("requirements", []):
            d = describe(r)
            if r["package"] in seen and seen[r["package"]][1] != d:
                problems.append(f"{r['package']}: {seen[r['package']][0]} pins {seen[r['package']][1]}, {pkg} pins {d}")
            seen.setdefault(r["package"], (pkg, d))
    return problems
