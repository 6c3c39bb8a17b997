# SPDX-License-Identifier: Apache-2.0
"""Kernel discovery: entry points of group ``tirx_kernels.kernels``, literal ``KERNEL_META`` read with ``ast``.

Nothing here imports a kernel module: listing the kernels of every installed package costs a parse
of each file, and only ``load(name)`` (or ``discover_kernels()``) imports what was asked for.

    python -m tirx_kernels.registry [--format text|json] [--category C] [--arch sm_90a]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass, field

ENTRY_POINT_GROUP = "tirx_kernels.kernels"
REQUIRED_META = ("name", "category", "runtime_cuda_archs")
OPTIONAL_META = ("description", "reference_requirements", "upstream", "public_ops")
REQUIRED_REQUIREMENT = ("package", "import")


class RegistryError(ValueError):
    """A kernel module's literal metadata is missing, malformed or conflicting."""


@dataclass
class KernelEntry:
    name: str
    category: str
    module: str
    path: str
    distribution: str
    runtime_cuda_archs: list
    configs: list
    meta: dict = field(repr=False)
    bench_configs: list | None = field(default=None, repr=False)

    @property
    def config_labels(self) -> list[str]:
        return [c["label"] for c in self.configs]


def _literal_assignments(path: str, names: tuple[str, ...]) -> dict:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = {}
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            targets = [node.target.id]
            value = node.value
        for t in targets:
            if t in names:
                try:
                    found[t] = ast.literal_eval(value)
                except ValueError as e:
                    raise RegistryError(f"{path}: {t} must be a literal (read without importing): {e}") from None
    return found


def expected_category(module: str) -> str:
    """``tirx_kernels.norm.rmsnorm`` -> ``norm``; ``tirx_kernels.ported.flashinfer.x.y`` -> ``ported.flashinfer``."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "ported":
        return "ported." + parts[2]
    return parts[1]


def _check_configs(path: str, key: str, configs) -> None:
    if not isinstance(configs, list) or not configs:
        raise RegistryError(f"{path}: {key} must be a non-empty literal list of dicts")
    seen = set()
    for i, c in enumerate(configs):
        if not isinstance(c, dict) or not isinstance(c.get("label"), str):
            raise RegistryError(f"{path}: {key}[{i}] must be a dict with a string 'label'")
        if c["label"] in seen:
            raise RegistryError(f"{path}: {key}: duplicate config label '{c['label']}'")
        seen.add(c["label"])


def validate_meta(path: str, module: str, meta, configs, bench_configs=None) -> None:
    """Raise ``RegistryError`` naming the file and the key for anything malformed."""
    from tirx_kernels.core.arch import ARCH_RE

    if not isinstance(meta, dict):
        raise RegistryError(f"{path}: KERNEL_META must be a dict")
    for key in REQUIRED_META:
        if key not in meta:
            raise RegistryError(f"{path}: KERNEL_META is missing key '{key}'")
    unknown = set(meta) - set(REQUIRED_META) - set(OPTIONAL_META)
    if unknown:
        raise RegistryError(f"{path}: KERNEL_META has unknown key(s) {sorted(unknown)}")
    if not isinstance(meta["name"], str) or not meta["name"].isidentifier():
        raise RegistryError(f"{path}: KERNEL_META key 'name' must be an identifier, got {meta['name']!r}")
    want = expected_category(module)
    if meta["category"] != want:
        raise RegistryError(
            f"{path}: KERNEL_META key 'category' is {meta['category']!r} but the module {module} "
            f"lives in category {want!r}")
    archs = meta["runtime_cuda_archs"]
    if not isinstance(archs, list) or not archs:
        raise RegistryError(f"{path}: KERNEL_META key 'runtime_cuda_archs' must be a non-empty list")
    for a in archs:
        if not isinstance(a, str) or not ARCH_RE.match(a):
            raise RegistryError(f"{path}: KERNEL_META key 'runtime_cuda_archs' has malformed arch {a!r} "
                                "(expected e.g. 'sm_90a')")
    for i, req in enumerate(meta.get("reference_requirements", [])):
        for key in REQUIRED_REQUIREMENT:
            if not isinstance(req, dict) or key not in req:
                raise RegistryError(f"{path}: KERNEL_META key 'reference_requirements'[{i}] is missing '{key}'")
        if "specifier" not in req and "commit" not in req:
            raise RegistryError(f"{path}: KERNEL_META key 'reference_requirements'[{i}] needs 'specifier' "
                                "and/or 'commit'")
    if meta["category"].startswith("ported."):
        up = meta.get("upstream")
        if not isinstance(up, dict) or not all(k in up for k in ("project", "url", "commit")):
            raise RegistryError(f"{path}: KERNEL_META key 'upstream' (project, url, commit) is required for a port")
    _check_configs(path, "CONFIGS", configs)
    if bench_configs is not None:
        _check_configs(path, "BENCH_CONFIGS", bench_configs)


def _entry_points():
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.value, e.name))


def _package_dirs(package: str) -> list[str]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RegistryError(f"entry point of group {ENTRY_POINT_GROUP} names {package}, which is not a package")
    return list(spec.submodule_search_locations)


def _iter_module_files(package: str):
    for root in _package_dirs(package):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")) and d != "tests")
            rel = os.path.relpath(dirpath, root)
            prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            for fn in sorted(filenames):
                if fn.endswith(".py") and not fn.startswith("_"):
                    yield os.path.join(dirpath, fn), prefix + "." + fn[:-3]


def scan(entry_points=None) -> dict[str, KernelEntry]:
    """All kernels of the installed packages, by name; raises ``RegistryError`` on bad metadata."""
    kernels: dict[str, KernelEntry] = {}
    eps = _entry_points() if entry_points is None else entry_points
    for ep in eps:
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else "?"
        for path, module in _iter_module_files(ep.value):
            found = _literal_assignments(path, ("KERNEL_META", "CONFIGS", "BENCH_CONFIGS"))
            if "KERNEL_META" not in found:
                continue
            if "CONFIGS" not in found:
                raise RegistryError(f"{path}: a kernel module needs a literal CONFIGS list")
            meta = found["KERNEL_META"]
            validate_meta(path, module, meta, found["CONFIGS"], found.get("BENCH_CONFIGS"))
            if meta["name"] in kernels:
                other = kernels[meta["name"]]
                raise RegistryError(f"{path}: KERNEL_META key 'name': duplicate kernel name '{meta['name']}' "
                                    f"(also in {other.path})")
            kernels[meta["name"]] = KernelEntry(
                name=meta["name"], category=meta["category"], module=module, path=path, distribution=dist,
                runtime_cuda_archs=list(meta["runtime_cuda_archs"]), configs=found["CONFIGS"], meta=meta,
                bench_configs=found.get("BENCH_CONFIGS"))
    return kernels


def list_kernels(category: str | None = None, arch: str | None = None) -> list[KernelEntry]:
    out = []
    for e in scan().values():
        if category and e.category != category:
            continue
        if arch and arch not in e.runtime_cuda_archs:
            continue
        out.append(e)
    return sorted(out, key=lambda e: (e.category, e.name))


def load(name: str):
    """Import and return the module of kernel ``name``."""
    entries = scan()
    if name not in entries:
        raise KeyError(f"no kernel named '{name}'; installed: {', '.join(sorted(entries)) or 'none'}")
    return importlib.import_module(entries[name].module)


def discover_kernels(category: str | None = None, arch: str | None = None) -> dict:
    """``{name: module}`` for every installed kernel (imports each module)."""
    return {e.name: importlib.import_module(e.module) for e in list_kernels(category, arch)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.registry", description="List installed kernels.")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--category", help="only this category (e.g. norm, gemm, ported.flashinfer)")
    ap.add_argument("--arch", help="only kernels verified on this arch (e.g. sm_90a)")
    a = ap.parse_args(argv)
    try:
        entries = list_kernels(a.category, a.arch)
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.format == "json":
        rows = []
        for e in entries:
            d = asdict(e)
            d.pop("meta")
            d.pop("bench_configs")
            d["config_labels"] = e.config_labels
            d.pop("configs")
            d["description"] = e.meta.get("description", "")
            d["upstream"] = e.meta.get("upstream")
            rows.append(d)
        print(json.dumps(rows, indent=2))
    else:
        for e in entries:
            print(f"{e.name}  [{e.category}]  {','.join(e.runtime_cuda_archs)}  ({e.distribution}: {e.module})")
            print(f"    configs: {', '.join(e.config_labels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
