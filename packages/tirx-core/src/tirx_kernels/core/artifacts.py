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
MANIFEST_FORMAT = 1


def canonical_params(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


@functools.cache
def _shared_sources_digest() -> str:
    """Digest of what every kernel's code depends on besides its own module: the lang layer and the build."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, "build.py")]
    lang = os.path.join(here, "lang")
    files += sorted(os.path.join(lang, f) for f in os.listdir(lang) if f.endswith(".py"))
    h = hashlib.sha256()
    for p in files:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def fingerprint(module) -> str:
    """Kernel-source fingerprint: the module's file, the private ``_*.py`` modules beside it (a kernel's
    split-out builders, e.g. ``gemm/_persistent.py``), and the shared lang/build sources (16 hex)."""
    path = inspect.getsourcefile(module) if not isinstance(module, str) else module
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    here = os.path.dirname(os.path.abspath(path))
    for name in sorted(os.listdir(here)):
        if name.startswith("_") and not name.startswith("__") and name.endswith(".py"):
            h.update(name.encode())
            with open(os.path.join(here, name), "rb") as f:
                h.update(f.read())
    h.update(_shared_sources_digest().encode())
    return h.hexdigest()[:16]


def artifact_key(name: str, params: dict, fp: str, arch: str = build.ARCH) -> str:
    text = "|".join([name, canonical_params(params), arch, fp, build.tvm_version(), build.nvcc_version()])
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


def build_cached(module, name: str, params: dict, arch: str = build.ARCH) -> tuple[str, dict]:
    """Path of the cached ``.so`` for (kernel, params), building it under a lock if absent."""
    fp = fingerprint(module)
    key = artifact_key(name, params, fp, arch)
    so = os.path.join(cache_dir(), name, key + ".so")
    info_path = os.path.join(cache_dir(), name, key + ".json")
    if os.path.exists(so) and os.path.exists(info_path):
        with open(info_path) as f:
            return so, json.load(f)
    with _locked(so):
        if not (os.path.exists(so) and os.path.exists(info_path)):
            res = build.build_so(module.get_kernel(**params), so)
            info = {"kernel": name, "params": params, "fingerprint": fp, "arch": arch,
                    "tvm": build.tvm_version(), "nvcc": build.nvcc_version(), "ptxas": res.ptxas_info,
                    "codegen_s": round(res.codegen_s, 3), "nvcc_s": round(res.nvcc_s, 3)}
            _write_json_atomic(info_path, info)
    with open(info_path) as f:
        return so, json.load(f)


def read_manifest(bundle_dir: str) -> dict:
    path = os.path.join(bundle_dir, MANIFEST)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: build a bundle with python -m tirx_kernels.build --out DIR")
    with open(path) as f:
        return json.load(f)


def find_in_bundle(bundle_dir: str, name: str, params: dict, fp: str) -> tuple[str | None, str]:
    """``(path, "")`` if the bundle holds this artifact at this fingerprint, else ``(None, why)``."""
    man = read_manifest(bundle_dir)
    want = canonical_params(params)
    stale = None
    for a in man.get("artifacts", []):
        if a["kernel"] == name and canonical_params(a["params"]) == want:
            if a["fingerprint"] == fp:
                return os.path.join(bundle_dir, a["file"]), ""
            stale = a["fingerprint"]
    if stale:
        return None, f"the bundle's artifact has fingerprint {stale}, the installed source {fp} (stale bundle)"
    return None, "the bundle has no artifact for these params"


def write_bundle(out_dir: str, items: list[dict]) -> str:
    """Copy built artifacts into ``out_dir`` and write its manifest (merging an existing one)."""
    import shutil

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, MANIFEST)
    existing = {}
    if os.path.exists(path):
        with open(path) as f:
            for a in json.load(f).get("artifacts", []):
                existing[(a["kernel"], canonical_params(a["params"]))] = a
    for it in items:
        fname = f"{it['kernel']}-{artifact_key(it['kernel'], it['params'], it['fingerprint'])}.so"
        shutil.copyfile(it["so"], os.path.join(out_dir, fname + ".tmp"))
        os.replace(os.path.join(out_dir, fname + ".tmp"), os.path.join(out_dir, fname))
        entry = {k: v for k, v in it.items() if k != "so"}
        entry["file"] = fname
        existing[(it["kernel"], canonical_params(it["params"]))] = entry
    man = {"format": MANIFEST_FORMAT, "arch": build.ARCH, "tvm": build.tvm_version(), "nvcc": build.nvcc_version(),
           "artifacts": sorted(existing.values(), key=lambda a: (a["kernel"], canonical_params(a["params"])))}
    _write_json_atomic(path, man)
    return path
