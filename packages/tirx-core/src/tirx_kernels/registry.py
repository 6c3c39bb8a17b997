# SPDX-License-Identifier: Apache-2.0
"""Kernel discovery: entry points of group ``tirx_kernels.kernels``, literal ``KERNEL_META`` read with ``ast``.

Nothing here imports a kernel module: listing the kernels of every installed package costs a parse
of each file, and only ``load(name)`` (or ``discover_kernels()``) imports what was asked for.

A malformed module (bad literal metadata, a file that does not parse, a duplicate kernel name) is a
*problem*: ``scan`` skips it with one ``RegistryWarning`` and lists it in ``problems()``, so one bad file
in one installed package does not take down every other kernel; ``load`` of a skipped kernel raises
``SkippedKernelError`` carrying the problem. ``scan(strict=True)`` and ``--strict`` (CI) raise / exit 1.
Scans are cached on the entry points and the stat (mtime, size) of every module file.

Compatibility is by contract, not by pin: tirx-core speaks the kernel protocol ``PROTOCOL_VERSION`` (what
``KERNEL_META``, ``CONFIGS`` and the op skeleton mean; PROTOCOL.md, "Versions"). An installed kernel package
declares the tirx-core range it works with (``tirx-core>=X,<Y`` in its dependencies) and, in the
``__init__.py`` of each entry-point package, the protocol its modules follow (``TIRX_KERNELS_PROTOCOL = 1``).
A package whose range excludes the installed tirx-core, or whose protocol this core does not speak, is
*refused*: a problem naming the package and both versions, its kernels unlisted, every other package kept.

    python -m tirx_kernels.registry [--format text|json] [--category C] [--arch sm_90a] [--strict]
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
import warnings
from dataclasses import asdict, dataclass, field

ENTRY_POINT_GROUP = "tirx_kernels.kernels"
CORE_DISTRIBUTION = "tirx-core"
PROTOCOL_VERSION = 1  # the protocol this core defines (PROTOCOL.md); bump on a change old modules would misread
SUPPORTED_PROTOCOLS = (1,)  # the protocols whose modules this core still reads correctly
PROTOCOL_ATTR = "TIRX_KERNELS_PROTOCOL"
REQUIRED_META = ("name", "category", "runtime_cuda_archs")
OPTIONAL_META = ("description", "reference_requirements", "upstream", "public_ops")
REQUIRED_REQUIREMENT = ("package", "import")


class RegistryError(ValueError):
    """A kernel module's literal metadata is missing, malformed or conflicting."""


class SkippedKernelError(RegistryError, KeyError):
    """``load`` of a kernel whose module the scan skipped; a ``KeyError`` too, like an unknown name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class RegistryWarning(UserWarning):
    """A kernel module skipped by a lenient scan (``scan(strict=False)``)."""


@dataclass(frozen=True)
class Problem:
    """Why a module (or an entry point) was skipped; ``message`` names the file and the key."""

    path: str
    message: str
    kernel: str | None = None  # the KERNEL_META name, where one could be read

    def __str__(self) -> str:
        return self.message


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


def _read_module(path: str, module: str):
    """``(meta, configs, bench_configs)`` of a kernel module, None for a plain module; raises ``RegistryError``."""
    try:
        found = _literal_assignments(path, ("KERNEL_META", "CONFIGS", "BENCH_CONFIGS"))
    except SyntaxError as e:
        raise RegistryError(f"{path}: does not parse (line {e.lineno}): {e.msg}") from None
    if "KERNEL_META" not in found:
        return None
    meta = found["KERNEL_META"]
    if "CONFIGS" not in found:
        raise RegistryError(f"{path}: a kernel module needs a literal CONFIGS list")
    validate_meta(path, module, meta, found["CONFIGS"], found.get("BENCH_CONFIGS"))
    return meta, found["CONFIGS"], found.get("BENCH_CONFIGS")


def _declared_name(path: str) -> str | None:
    """The kernel name a malformed module declares, so that ``load(name)`` can say why it was skipped."""
    try:
        meta = _literal_assignments(path, ("KERNEL_META",)).get("KERNEL_META")
    except (SyntaxError, RegistryError):
        return None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def core_version() -> str | None:
    """The installed tirx-core's version; None when it runs from a source tree without metadata."""
    try:
        return importlib.metadata.version(CORE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _declared_protocol(package: str):
    """``(path, value)`` of ``TIRX_KERNELS_PROTOCOL`` in the package's ``__init__.py``; value None when absent."""
    inits = [os.path.join(d, "__init__.py") for d in _package_dirs(package)]
    inits = [p for p in inits if os.path.isfile(p)]
    if not inits:
        return os.path.join(_package_dirs(package)[0], "__init__.py"), None
    try:
        return inits[0], _literal_assignments(inits[0], (PROTOCOL_ATTR,)).get(PROTOCOL_ATTR)
    except SyntaxError as e:
        raise RegistryError(f"{inits[0]}: does not parse (line {e.lineno}): {e.msg}") from None


def refusal(ep) -> str | None:
    """Why the registry refuses the distribution of entry point ``ep``, or None when it is compatible.

    A bare entry point with no distribution (one built by a test or a tool) has no range to check; its
    package's protocol declaration is still read when it has one.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    dist = getattr(ep, "dist", None)
    who = f"{dist.name} {dist.version}" if dist is not None else f"entry point {ep.value}"
    core = core_version()
    core_text = f"tirx-core {core or '(source tree)'}, kernel protocol(s) {', '.join(map(str, SUPPORTED_PROTOCOLS))}"
    if dist is not None:
        specs = []
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if canonicalize_name(req.name) == CORE_DISTRIBUTION and (
                    req.marker is None or req.marker.evaluate({"extra": ""})):
                specs.append(req.specifier)
        if not specs:
            return (f"{who} declares no tirx-core requirement: its dependencies need tirx-core>=X,<Y "
                    f"(installed: {core_text})")
        for spec in specs:
            if core is not None and not spec.contains(core, prereleases=True):
                return f"{who} requires tirx-core{spec}, but the installed core is {core_text}"
    path, declared = _declared_protocol(ep.value)
    if declared is None:
        if dist is None:
            return None
        return (f"{who} declares no kernel protocol: add `{PROTOCOL_ATTR} = {PROTOCOL_VERSION}` to {path} "
                f"(PROTOCOL.md, Versions; installed: {core_text})")
    if declared not in SUPPORTED_PROTOCOLS:
        return f"{who} follows kernel protocol {declared!r} ({path}), but the installed core is {core_text}"
    return None


def _layout(eps) -> tuple[list, list[Problem], tuple]:
    """Module files per entry point, entry points that name no package, and the cache key of the scan."""
    layout, problems, key = [], [], [core_version()]
    for ep in eps:
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else "?"
        key.append((ep.name, ep.value, dist, ep.dist.version if dist != "?" else None))
        try:
            inits = [os.path.join(d, "__init__.py") for d in _package_dirs(ep.value)]
            files = list(_iter_module_files(ep.value))
        except RegistryError as e:
            problems.append(Problem(ep.value, str(e)))
            continue
        # The __init__.py files hold the protocol declaration: an edit must re-check the package.
        for path in [p for p in inits if os.path.isfile(p)] + [path for path, _ in files]:
            st = os.stat(path)
            key.append((path, st.st_mtime_ns, st.st_size))
        layout.append((ep, dist, files))
    return layout, problems, tuple(key)


_MAX_SCANS = 8
_SCANS: dict[tuple, tuple[dict, list]] = {}
_WARNED: set[str] = set()


def _scan(eps) -> tuple[dict[str, KernelEntry], list[Problem]]:
    layout, problems, key = _layout(eps)
    if key in _SCANS:
        return _SCANS[key]
    kernels: dict[str, KernelEntry] = {}
    duplicated: dict[str, list[str]] = {}
    for ep, dist, files in layout:
        try:
            refused = refusal(ep)
        except RegistryError as e:
            refused = str(e)
        if refused:
            problems.append(Problem(ep.value, f"refused {refused}"))
            continue
        for path, module in files:
            try:
                found = _read_module(path, module)
            except RegistryError as e:
                problems.append(Problem(path, str(e), _declared_name(path)))
                continue
            if found is None:
                continue
            meta, configs, bench_configs = found
            name = meta["name"]
            if name in kernels or name in duplicated:
                # Neither module is the kernel: which one a caller meant is not knowable.
                first = kernels.pop(name).path if name in kernels else duplicated[name][0]
                duplicated.setdefault(name, [first]).append(path)
                problems.append(Problem(path, f"{path}: KERNEL_META key 'name': duplicate kernel name '{name}' "
                                              f"(also in {first})", name))
                continue
            kernels[name] = KernelEntry(
                name=name, category=meta["category"], module=module, path=path, distribution=dist,
                runtime_cuda_archs=list(meta["runtime_cuda_archs"]), configs=configs, meta=meta,
                bench_configs=bench_configs)
    while len(_SCANS) >= _MAX_SCANS:  # oldest first: a test session's fake packages must not pile up
        _SCANS.pop(next(iter(_SCANS)))
    _SCANS[key] = (kernels, problems)
    return kernels, problems


def scan(entry_points=None, strict: bool = False) -> dict[str, KernelEntry]:
    """All well-formed kernels of the installed packages, by name.

    A malformed module is skipped with one ``RegistryWarning`` (see ``problems()``); with ``strict`` the
    first problem raises ``RegistryError`` instead.
    """
    kernels, found = _scan(_entry_points() if entry_points is None else entry_points)
    if strict and found:
        more = f" (and {len(found) - 1} more problem(s): python -m tirx_kernels.registry --strict)" \
            if len(found) > 1 else ""
        raise RegistryError(found[0].message + more)
    for p in found:
        if p.message not in _WARNED:
            _WARNED.add(p.message)
            warnings.warn(f"tirx_kernels registry skips a module: {p.message}", RegistryWarning, stacklevel=2)
    return dict(kernels)


def problems(entry_points=None) -> list[Problem]:
    """The modules (and entry points) the scan skipped, each naming its file and key; empty when all is well."""
    return list(_scan(_entry_points() if entry_points is None else entry_points)[1])


def list_kernels(category: str | None = None, arch: str | None = None) -> list[KernelEntry]:
    out = []
    for e in scan().values():
        if category and e.category != category:
            continue
        if arch and arch not in e.runtime_cuda_archs:
            continue
        out.append(e)
    return sorted(out, key=lambda e: (e.category, e.name))


def load(name: str, entry_points=None):
    """Import and return the module of kernel ``name``; ``SkippedKernelError`` if its module was skipped."""
    entries = scan(entry_points)
    if name not in entries:
        skipped = [p.message for p in problems(entry_points) if p.kernel == name]
        if skipped:
            raise SkippedKernelError(f"kernel '{name}' is installed but was skipped: " + "; ".join(skipped))
        refused = [p.message for p in problems(entry_points) if p.message.startswith("refused ")]
        raise KeyError(f"no kernel named '{name}'; installed: {', '.join(sorted(entries)) or 'none'}"
                       + (f" (and packages {'; '.join(refused)})" if refused else ""))
    return importlib.import_module(entries[name].module)


def discover_kernels(category: str | None = None, arch: str | None = None) -> dict:
    """``{name: module}`` for every installed kernel (imports each module)."""
    return {e.name: importlib.import_module(e.module) for e in list_kernels(category, arch)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.registry", description="List installed kernels.")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--category", help="only this category (e.g. norm, gemm, ported.flashinfer)")
    ap.add_argument("--arch", help="only kernels verified on this arch (e.g. sm_90a)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any module was skipped (CI)")
    a = ap.parse_args(argv)
    with warnings.catch_warnings():  # the problems are printed below, once, in the CLI's own words
        warnings.simplefilter("ignore", RegistryWarning)
        entries = list_kernels(a.category, a.arch)
    skipped = problems()
    for p in skipped:
        print(f"{'error' if a.strict else 'warning'}: skipped: {p.message}", file=sys.stderr)
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
    return 1 if a.strict and skipped else 0


if __name__ == "__main__":
    sys.exit(main())
