# SPDX-License-Identifier: Apache-2.0
"""Artifact identity, the on-disk cache and prebuilt bundles (``manifest.json``).

An artifact is keyed by kernel name, canonical compile params, arch, kernel-source fingerprint and
the TVM and nvcc versions. The cache (``$TIRX_KERNELS_CACHE``, default ``~/.cache/tirx-kernels``) is
written atomically under a per-key file lock, so ``pytest -n 16`` builds each artifact once.
A bundle (``python -m tirx_kernels.build --out DIR``) is a folder of ``.so`` files plus
``manifest.json``; ``$TIRX_KERNELS_ARTIFACTS=DIR`` makes the runtime load from it, with no compiler.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import json
import os

from . import build

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2  # 2: entries name their tvm-ffi "function" (batched .so files)


def canonical_params(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _module_file(dotted: str) -> str | None:
    """The source file of module ``dotted`` (``tirx_kernels.x.y``), found on the namespace package's paths
    without importing anything (so this works on a GPU host without the compiler)."""
    import importlib.util

    spec = importlib.util.find_spec("tirx_kernels")
    parts = dotted.split(".")[1:]
    for root in spec.submodule_search_locations if spec else []:
        base = os.path.join(root, *parts)
        for cand in (base + ".py", os.path.join(base, "__init__.py")):
            if parts and os.path.isfile(cand):
                return cand
    return None


def _package_of(path: str) -> str:
    """The dotted package a file under some ``.../tirx_kernels/...`` directory belongs to."""
    parts = os.path.abspath(path).split(os.sep)
    if "tirx_kernels" not in parts:
        return ""
    i = len(parts) - 1 - parts[::-1].index("tirx_kernels")
    return ".".join(parts[i:-1])


@functools.lru_cache(maxsize=256)
def _imports_of(path: str, mtime_ns: int) -> tuple[str, ...]:
    """Files of the ``tirx_kernels`` modules that ``path`` imports anywhere in its body (lazy imports in functions
    too), read from its AST."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    pkg = _package_of(path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1] + ([node.module] if node.module
                                                                                        else []))
            else:
                base = node.module or ""
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    files = {_module_file(n) for n in names if n.startswith("tirx_kernels.")}
    return tuple(sorted(f for f in files if f))


# tirx-core's host-side modules: a kernel module imports them (its op checks inputs, loads and launches; its
# tests and bench run through them), but none of them takes part in generating its code.
_HOST_ONLY = {"__init__.py", "arch.py", "artifacts.py", "bench.py", "checks.py", "harness.py", "model_dims.py",
              "reference_lock.py", "references.py", "runtime.py", "testing.py"}
_HOST_ONLY_PATHS = {f"core/{name}" for name in _HOST_ONLY}


def source_closure(path: str) -> list[str]:
    """``path`` and every ``tirx_kernels`` source file it imports, transitively, less tirx-core's host-side
    modules (``_HOST_ONLY``): what decides a kernel's generated code."""
    # Keyed by the path inside the tirx_kernels namespace, not the absolute path: where one module sits under two
    # roots (wheels in site-packages, and a checkout's src/ prepended to sys.path later in the process, as a test
    # loading tools/sweep_variants.py did), each is counted once, and tirx-core's host-side modules are left out
    # under either root (2026-12-06, H200: pytest workers read flashinfer_rmsnorm's bundle as stale, 82791fdd vs
    # 0a1ea9aa, because the checkout's core/runtime.py etc. entered the closure).
    seen: dict[str, str] = {}
    stack = [os.path.abspath(path)]
    while stack:
        p = stack.pop()
        key = _namespace_path(p)
        if key in seen or key in _HOST_ONLY_PATHS:
            continue
        seen[key] = p
        stack += [os.path.abspath(f) for f in _imports_of(p, os.stat(p).st_mtime_ns)]
    return sorted(seen.values())


def _namespace_path(path: str) -> str:
    """``path`` relative to its ``tirx_kernels`` directory (``core/lang/tma.py``); the basename elsewhere."""
    parts = os.path.abspath(path).split(os.sep)
    if "tirx_kernels" not in parts:
        return os.path.basename(path)
    i = len(parts) - 1 - parts[::-1].index("tirx_kernels")
    return "/".join(parts[i + 1:])


def fingerprint(module) -> str:
    """Kernel-source fingerprint (16 hex): the module's file and every ``tirx_kernels`` module it imports,
    transitively (its split-out builders such as ``gemm/_persistent.py``, the ``core.lang`` pieces it uses),
    plus the build driver (``core/build.py``: the export and nvcc steps). An edit to a module the kernel does
    not import leaves its artifacts and pinned rows valid; the toolchain is in :func:`artifact_key`."""
    path = inspect.getsourcefile(module) if not isinstance(module, str) else module
    files = source_closure(path)
    build_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.py")
    # Ordered and named by the path inside the tirx_kernels namespace, never the absolute path: an installed wheel, an
    # editable checkout, or both on sys.path at once (a test run from a checkout on a GPU host with the wheels
    # installed) must give the same fingerprint for the same sources (2026-12-05, H100: absolute-path order made a
    # pytest run see every port's bundle as stale while the bench CLI in the same host matched it).
    rest = sorted((f for f in files if f != os.path.abspath(path)), key=_namespace_path)
    h = hashlib.sha256()
    for p in [os.path.abspath(path)] + rest + [build_py]:
        h.update(_namespace_path(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def tvm_ffi_version() -> str:
    """The runtime's version: a ``.so`` links against its ABI."""
    try:
        from importlib.metadata import version

        return version("apache-tvm-ffi")
    except Exception:  # noqa: BLE001 - not installed: artifacts cannot load anyway
        return "absent"


def artifact_key(name: str, params: dict, fp: str, arch: str = build.ARCH) -> str:
    text = "|".join([name, canonical_params(params), arch, fp, build.tvm_version(), build.nvcc_version(),
                     tvm_ffi_version()])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_dir() -> str:
    return os.environ.get("TIRX_KERNELS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tirx-kernels")


@contextlib.contextmanager
def _locked(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_json_atomic(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _cached_info(name: str, key: str) -> dict | None:
    """The cache's record of artifact ``key`` (with ``file``, the ``.so`` holding it, and ``function``, its
    tvm-ffi function), or None. Records from before batched builds name neither: ``<key>.so``, ``main``."""
    d = os.path.join(cache_dir(), name)
    info_path = os.path.join(d, key + ".json")
    if not os.path.exists(info_path):
        return None
    with open(info_path) as f:
        info = json.load(f)
    info.setdefault("file", key + ".so")
    info.setdefault("function", "main")
    return info if os.path.exists(os.path.join(d, info["file"])) else None


def build_cached_many(module, name: str, params_list: list[dict], arch: str = build.ARCH) -> list[tuple[str, dict]]:
    """``(path of the .so, record)`` for each params of ``module``'s kernel, building the missing ones together:
    one translation unit and one nvcc call for all of them (``build.build_so_many``), each its own tvm-ffi
    function. A record's ``ptxas`` holds its own kernels only. Safe under concurrent builders: a batch is
    built under a lock on its keys and written to a fresh file, so a record never points at a file that a
    later build replaces."""
    fp = fingerprint(module)
    keys = [artifact_key(name, p, fp, arch) for p in params_list]
    d = os.path.join(cache_dir(), name)
    missing = {k: p for k, p in zip(keys, params_list) if _cached_info(name, k) is None}
    if missing:
        batch = hashlib.sha256("|".join(sorted(missing)).encode()).hexdigest()[:20]
        with _locked(os.path.join(d, "batch-" + batch)):
            todo = {k: p for k, p in missing.items() if _cached_info(name, k) is None}
            if todo:
                _build_batch(module, name, todo, fp, arch, d)
    out = []
    for k in keys:
        info = _cached_info(name, k)
        out.append((os.path.join(d, info["file"]), info))
    return out


def _build_batch(module, name: str, todo: dict, fp: str, arch: str, d: str) -> None:
    funcs = {build.function_name(k): module.get_kernel(**p) for k, p in todo.items()}
    if len(todo) == 1:
        # One artifact: its own file, as before batches (the function is still named after its key).
        fname = next(iter(todo)) + ".so"
    else:
        fname = f"batch-{hashlib.sha256('|'.join(sorted(todo)).encode()).hexdigest()[:12]}-{os.getpid()}.so"
    res = build.build_so_many(funcs, os.path.join(d, fname))
    for k, p in todo.items():
        fn = build.function_name(k)
        info = {"kernel": name, "params": p, "fingerprint": fp, "arch": arch, "tvm": build.tvm_version(),
                "nvcc": build.nvcc_version(), "ptxas": {"kernels": build.kernels_of(res.ptxas_info, fn)},
                "file": fname, "function": fn, "batch_size": len(todo),
                "codegen_s": round(res.codegen_s / len(todo), 3), "nvcc_s": round(res.nvcc_s / len(todo), 3)}
        _write_json_atomic(os.path.join(d, k + ".json"), info)


def build_cached(module, name: str, params: dict, arch: str = build.ARCH) -> tuple[str, dict]:
    """Path of the cached ``.so`` holding (kernel, params), building it under a lock if absent; the record's
    ``function`` names its tvm-ffi function there."""
    return build_cached_many(module, name, [params], arch)[0]


def read_manifest(bundle_dir: str) -> dict:
    path = os.path.join(bundle_dir, MANIFEST)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: build a bundle with python -m tirx_kernels.build --out DIR")
    with open(path) as f:
        return json.load(f)


@functools.lru_cache(maxsize=8)
def _manifest_cached(path: str, mtime_ns: int, size: int) -> dict:
    with open(path) as f:
        return json.load(f)


def _manifest(bundle_dir: str) -> dict:
    path = os.path.join(bundle_dir, MANIFEST)
    if not os.path.exists(path):
        return read_manifest(bundle_dir)  # raises with the how-to
    st = os.stat(path)
    return _manifest_cached(path, st.st_mtime_ns, st.st_size)


def find_entry_in_bundle(bundle_dir: str, name: str, params: dict, fp: str) -> tuple[dict | None, str]:
    """``(manifest entry, "")`` if the bundle holds this artifact at this fingerprint, else ``(None, why)``.
    The entry's ``file`` is relative to ``bundle_dir``; ``function`` names its tvm-ffi function."""
    man = _manifest(bundle_dir)
    ffi = tvm_ffi_version()
    if man.get("tvm_ffi", ffi) != ffi:
        return None, f"the bundle was built against apache-tvm-ffi {man['tvm_ffi']}, this process has {ffi}"
    want = canonical_params(params)
    stale = None
    for a in man.get("artifacts", []):
        if a["kernel"] == name and canonical_params(a["params"]) == want:
            if a["fingerprint"] == fp:
                return {"function": "main", **a}, ""
            stale = a["fingerprint"]
    if stale:
        return None, f"the bundle's artifact has fingerprint {stale}, the installed source {fp} (stale bundle)"
    return None, "the bundle has no artifact for these params"


def find_in_bundle(bundle_dir: str, name: str, params: dict, fp: str) -> tuple[str | None, str]:
    """``(path, "")`` if the bundle holds this artifact at this fingerprint, else ``(None, why)``."""
    entry, why = find_entry_in_bundle(bundle_dir, name, params, fp)
    return (os.path.join(bundle_dir, entry["file"]), "") if entry else (None, why)


def write_bundle(out_dir: str, items: list[dict]) -> str:
    """Copy built artifacts into ``out_dir`` and write its manifest (merging an existing one). Items of one batch
    share one ``.so``; a file already in the bundle is not copied again (names are content-keyed)."""
    import shutil

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, MANIFEST)
    existing = {}
    if os.path.exists(path):
        with open(path) as f:
            for a in json.load(f).get("artifacts", []):
                existing[(a["kernel"], canonical_params(a["params"]))] = a
    for it in items:
        fname = f"{it['kernel']}-{os.path.basename(it['so'])}"
        dst = os.path.join(out_dir, fname)
        if not (os.path.exists(dst) and os.path.getsize(dst) == os.path.getsize(it["so"])):
            shutil.copyfile(it["so"], dst + ".tmp")
            os.replace(dst + ".tmp", dst)
        entry = {k: v for k, v in it.items() if k != "so"}
        entry["file"] = fname
        entry.setdefault("function", "main")
        existing[(it["kernel"], canonical_params(it["params"]))] = entry
    man = {"format": MANIFEST_FORMAT, "arch": build.ARCH, "tvm": build.tvm_version(), "nvcc": build.nvcc_version(),
           "tvm_ffi": tvm_ffi_version(),
           "artifacts": sorted(existing.values(), key=lambda a: (a["kernel"], canonical_params(a["params"])))}
    _write_json_atomic(path, man)
    # A rebuilt artifact replaces its entry under a new content-keyed file: drop the files no entry names any more
    # (a full bundle rebuilt after a few changes carried 131 such files, 42 of its 89 MiB, 2026-12-07).
    used = {a["file"] for a in man["artifacts"]}
    for f in os.listdir(out_dir):
        if f.endswith(".so") and f not in used:
            os.remove(os.path.join(out_dir, f))
    return path
