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


class refused_upstream:  # noqa: N801 -- used as a context manager, reads as a phrase
    """Turn an upstream's own refusal to run here into a missing reference.

    ``with refused_upstream("Triton", "fla's backward refuses this Triton on Hopper"): ...``: a ``RuntimeError`` whose
    message contains ``marker`` becomes an ``ImportError`` with ``why`` and the message (tests skip a reference that
    raises ImportError, the bench suite records it as not installed); any other error passes through unchanged.
    fla >= 0.6 raises such a RuntimeError for its backward under Triton >= 3.4 on Hopper (fla issues 640, 984).
    """

    def __init__(self, marker: str, why: str):
        self.marker, self.why = marker, why

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if typ is not None and issubclass(typ, RuntimeError) and self.marker in str(e):
            raise ImportError(f"{self.why}: {str(e)[:300]}") from None
        return False
