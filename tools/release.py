#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Independent per-package releases: the version/CHANGELOG check CI runs, and the sdist + wheel of one package.

    python tools/release.py check                 # exit 1 naming each package that is not releasable as it stands
    python tools/release.py build tirx-native      # sdist + wheel (hatchling) into dist/ (or --out DIR)
    python tools/release.py notes tirx-native      # the CHANGELOG entry of its current version (the tag message)

A release of package P at version V is the annotated git tag ``P-vV`` (docs/releasing.md). ``check``, per
package under packages/: its CHANGELOG.md has an entry (``## V``, then text) for the version in its pyproject.toml;
the version is not below its last release tag; where the package's files changed since that tag (committed,
uncommitted or new), its version is above the tag's. With no tag yet (the first release) the entry is all it
needs. A kernel package declares a tirx-core range (never ``==``) that holds the in-tree core's version.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: hatchling, which builds every package here, depends on tomli
    import tomli as tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = "tirx-core"
# "## 0.2.0", "## 0.2.0 (2026-12-06)", "## [0.2.0] - 2026-12-06": the version is the heading's first word.
HEADING = re.compile(r"^## \[?v?([0-9][^\s\]]*)\]?(?:\s.*)?$")


@dataclass
class Package:
    name: str
    version: str
    directory: str  # relative to the repository root, e.g. packages/tirx-core
    dependencies: list[str]


def packages(root: str = ROOT) -> list[Package]:
    out = []
    base = os.path.join(root, "packages")
    for d in sorted(os.listdir(base)):
        path = os.path.join(base, d, "pyproject.toml")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                project = tomllib.load(f)["project"]
            out.append(Package(project["name"], project["version"], f"packages/{d}", project.get("dependencies", [])))
    return out


def find(name: str, root: str = ROOT) -> Package:
    pkgs = packages(root)
    for p in pkgs:
        if canonicalize_name(p.name) == canonicalize_name(name) or os.path.basename(p.directory) == name:
            return p
    raise SystemExit(f"release.py: no package {name!r} under packages/ (there are: {', '.join(p.name for p in pkgs)})")


def changelog_entries(text: str) -> dict[str, str]:
    """``{version: body}`` of a CHANGELOG.md; the body is the text up to the next ``## `` heading."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            m = HEADING.match(line.rstrip())
            current = m.group(1) if m else None
            if current is not None:
                entries[current] = ""
        elif current is not None:
            entries[current] += line + "\n"
    return {v: body.strip() for v, body in entries.items()}


def _git(root: str, *args: str) -> str:
    r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"release.py: git {' '.join(args)} failed in {root}: {r.stderr.strip()}")
    return r.stdout


def last_release(root: str, pkg: Package) -> tuple[str, Version] | None:
    """The highest ``<name>-v<version>`` tag, or None before the first release."""
    tags = []
    for tag in _git(root, "tag", "--list", f"{pkg.name}-v*").split():
        try:
            tags.append((Version(tag[len(pkg.name) + 2:]), tag))
        except InvalidVersion:
            continue  # e.g. tirx-core-vnext: not a release tag
    return (max(tags)[1], max(tags)[0]) if tags else None


def changed_since(root: str, tag: str, directory: str) -> list[str]:
    """Files under ``directory`` that differ from ``tag``: committed since, uncommitted, or new (untracked)."""
    changed = _git(root, "diff", "--name-only", tag, "--", directory).split()
    changed += _git(root, "ls-files", "--others", "--exclude-standard", "--", directory).split()
    return sorted(set(changed))


def check_package(root: str, pkg: Package, core_version: str | None) -> list[str]:
    """Why ``pkg`` is not releasable as it stands (empty: it is)."""
    errors = []
    try:
        version = Version(pkg.version)
    except InvalidVersion:
        return [f"{pkg.name}: version {pkg.version!r} in {pkg.directory}/pyproject.toml is not a PEP 440 version"]
    log_path = os.path.join(root, pkg.directory, "CHANGELOG.md")
    entries = {}
    if not os.path.isfile(log_path):
        errors.append(f"{pkg.name}: {pkg.directory}/CHANGELOG.md is missing")
    else:
        with open(log_path, encoding="utf-8") as f:
            entries = {Version(v): body for v, body in changelog_entries(f.read()).items() if _is_version(v)}
        if not entries.get(version):
            errors.append(f"{pkg.name}: {pkg.directory}/CHANGELOG.md has no entry for its version {pkg.version} "
                          f"(a '## {pkg.version}' heading followed by what changed)")
    last = last_release(root, pkg)
    if last is not None:
        tag, released = last
        if version < released:
            errors.append(f"{pkg.name}: version {pkg.version} is below its last release {tag}")
        elif version == released:
            changed = changed_since(root, tag, pkg.directory)
            if changed:
                more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
                errors.append(f"{pkg.name}: {', '.join(changed[:3])}{more} changed since its release {tag}, but its "
                              f"version is still {pkg.version}: bump it in {pkg.directory}/pyproject.toml and add "
                              "a CHANGELOG.md entry")
    if pkg.name != CORE:
        errors += _check_core_range(pkg, core_version)
    return errors


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _check_core_range(pkg: Package, core_version: str | None) -> list[str]:
    reqs = [Requirement(d) for d in pkg.dependencies]
    core = [r for r in reqs if canonicalize_name(r.name) == CORE and r.marker is None]
    if not core:
        return [f"{pkg.name}: its dependencies declare no tirx-core range (tirx-core>=X,<Y)"]
    errors = []
    for r in core:
        if any(s.operator in ("==", "===") for s in r.specifier):
            errors.append(f"{pkg.name}: pins {r} exactly: declare the range of cores it works with (tirx-core>=X,<Y), "
                          "so that it is released without re-releasing the core")
        elif core_version is not None and not r.specifier.contains(core_version, prereleases=True):
            errors.append(f"{pkg.name}: requires {r}, which excludes the in-tree tirx-core {core_version}")
    return errors


def check(root: str = ROOT) -> list[str]:
    pkgs = packages(root)
    core = next((p.version for p in pkgs if p.name == CORE), None)
    return [e for p in pkgs for e in check_package(root, p, core)]


def build(pkg: Package, out: str, root: str = ROOT) -> list[str]:
    """The sdist and wheel of ``pkg`` (hatchling, no build isolation: no network), their paths."""
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-t", "wheel", "-d",
                        os.path.abspath(out)], cwd=os.path.join(root, pkg.directory), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"release.py: hatchling build of {pkg.name} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    stem = canonicalize_name(pkg.name).replace("-", "_") + "-" + pkg.version
    made = sorted(f for f in os.listdir(out) if f.startswith(stem) and f.endswith((".whl", ".tar.gz")))
    if not any(f.endswith(".whl") for f in made) or not any(f.endswith(".tar.gz") for f in made):
        raise SystemExit(f"release.py: hatchling made no sdist + wheel of {pkg.name} {pkg.version} in {out}: {made}")
    return [os.path.join(out, f) for f in made]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="every package releasable as it stands (CI)")
    c.add_argument("--root", default=ROOT, help="repository root (default: this checkout)")
    b = sub.add_parser("build", help="sdist + wheel of one package")
    b.add_argument("package")
    b.add_argument("--out", default=os.path.join(ROOT, "dist"))
    n = sub.add_parser("notes", help="the CHANGELOG entry of a package's current version")
    n.add_argument("package")
    a = ap.parse_args(argv)
    if a.cmd == "check":
        errors = check(a.root)
        for e in errors:
            print(f"release check: {e}", file=sys.stderr)
        if not errors:
            print(f"release check: {len(packages(a.root))} packages releasable "
                  "(each version has its CHANGELOG entry, none changed since its release tag unbumped)")
        return 1 if errors else 0
    pkg = find(a.package)
    if a.cmd == "build":
        errors = check_package(ROOT, pkg, find(CORE).version)
        if errors:
            raise SystemExit("release.py: not releasable:\n  " + "\n  ".join(errors))
        for path in build(pkg, a.out):
            print(path)
        return 0
    with open(os.path.join(ROOT, pkg.directory, "CHANGELOG.md"), encoding="utf-8") as f:
        body = changelog_entries(f.read()).get(pkg.version)
    if not body:
        raise SystemExit(f"release.py: {pkg.directory}/CHANGELOG.md has no entry for {pkg.version}")
    print(f"{pkg.name} {pkg.version}\n\n{body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
