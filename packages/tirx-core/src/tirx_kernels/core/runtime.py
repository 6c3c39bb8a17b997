# SPDX-License-Identifier: Apache-2.0
"""Load compiled kernels: bundle (``$TIRX_KERNELS_ARTIFACTS``) -> cache -> build where the compiler exists.

Needs only torch and apache-tvm-ffi at run time. The loaded function takes torch tensors (DLPack)
and launches on torch's current CUDA stream (tvm-ffi reads it per call), so CUDA-graph capture works.
"""

from __future__ import annotations

import importlib.util
import os
import threading

from . import artifacts
from .arch import check_arch

_lock = threading.Lock()
_loaded: dict[tuple[str, str], object] = {}
_modules: list = []  # keep tvm-ffi modules alive for the life of the process


class ArtifactNotFoundError(RuntimeError):
    """No prebuilt artifact matches, and this machine cannot build one."""


def compiler_available() -> bool:
    return importlib.util.find_spec("tvm") is not None


def artifact_path(module, params: dict) -> str:
    """Where the ``.so`` for (module's kernel, params) comes from; builds into the cache if it must."""
    name = module.KERNEL_META["name"]
    fp = artifacts.fingerprint(module)
    why = "TIRX_KERNELS_ARTIFACTS is not set"
    bundle = os.environ.get("TIRX_KERNELS_ARTIFACTS")
    if bundle:
        path, why = artifacts.find_in_bundle(bundle, name, params, fp)
        if path:
            return path
    if not compiler_available():
        raise ArtifactNotFoundError(
            f"no artifact for kernel '{name}' with params {artifacts.canonical_params(params)} "
            f"(fingerprint {fp}): {why}, and apache-tvm is not installed to build one. On a machine with "
            f"apache-tvm and nvcc run: python -m tirx_kernels.build --kernel {name} --out DIR, then set "
            "TIRX_KERNELS_ARTIFACTS=DIR here")
    return artifacts.build_cached(module, name, params)[0]


def get_function(module, params: dict):
    """The callable kernel for ``params`` (checks the device arch first, loads once per process)."""
    check_arch(module.KERNEL_META)
    key = (module.__name__, artifacts.canonical_params(params))
    fn = _loaded.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _loaded.get(key)
        if fn is None:
            import tvm_ffi

            lib = tvm_ffi.load_module(artifact_path(module, params))
            _modules.append(lib)
            fn = lib["main"]
            _loaded[key] = fn
    return fn
