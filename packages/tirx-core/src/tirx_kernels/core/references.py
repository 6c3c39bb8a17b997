# SPDX-License-Identifier: Apache-2.0
"""Resolve ``reference_requirements``: is the upstream reference installed at the pinned revision?"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

from packaging.specifiers import SpecifierSet
from packaging.version import Version


def installed_commit(dist: importlib.metadata.Distribution) -> str | None:
    """The git commit a distribution was installed from (PEP 610 ``direct_url.json``), if any."""
    raw = dist.read_text("direct_url.json")
    if not raw:
        return None
    return json.loads(raw).get("vcs_info", {}).get("commit_id")


def resolve(req: dict) -> tuple[bool, str]:
    """``(True, "flashinfer-python 0.7.4")`` or ``(False, reason)`` for one requirement."""
    package = req["package"]
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False, f"reference {package} is not installed (needs {package}{req.get('specifier', '')})"
    version = dist.version
    spec = req.get("specifier")
    if spec and not SpecifierSet(spec).contains(Version(version), prereleases=True):
        return False, f"reference {package} {version} does not satisfy {spec}"
    commit = req.get("commit")
    if commit:
        got = installed_commit(dist)
        if got != commit:
            return False, f"reference {package} is installed from commit {got}, pinned {commit}"
    module = req.get("import")
    if module and importlib.util.find_spec(module) is None:
        return False, f"reference {package} {version} is installed but 'import {module}' finds nothing"
    return True, f"{package} {version}"


def resolve_all(meta: dict) -> dict[str, tuple[bool, str]]:
    return {r["package"]: resolve(r) for r in meta.get("reference_requirements", [])}
