# SPDX-License-Identifier: Apache-2.0
"""Shared test bodies for kernel packages: every (kernel, config) of a distribution, checked the same way.

A kernel package's ``tests/test_gpu.py`` parametrizes over ``cases("tirx-native")`` and calls
``check_correctness`` / ``check_graph_replay``; without a GPU or on another arch they skip with the
reason, never pass silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

import pytest

from tirx_kernels import registry
from tirx_kernels.core.arch import UnsupportedArchError, check_arch


def cases(distribution: str) -> list:
    """``pytest.param(kernel, label)`` for every config of every kernel shipped by ``distribution``."""
    out = []
    for e in registry.list_kernels():
        if e.distribution == distribution:
            out += [pytest.param(e.name, c["label"], id=f"{e.name}-{c['label']}") for c in e.configs]
    return out


def load_or_skip(kernel: str):
    mod = registry.load(kernel)
    try:
        check_arch(mod.KERNEL_META)
    except UnsupportedArchError as e:
        pytest.skip(str(e))
    return mod


# Configs whose roofline bytes reach this (their fp32 oracles take several times more) run one at a time across
# pytest-xdist workers: with 8 workers on an 80 GB H100, the large KDA backward / GDN context-parallel rows and their
# oracles ran out of memory side by side (2026-12-07, docs/measurements/2026-12-07-h100).
EXCLUSIVE_FROM_BYTES = 256 << 20


@contextlib.contextmanager
def exclusive_if_large(mod, cfg: dict):
    """Hold a host-wide file lock while a large config runs (no-op for small ones)."""
    try:
        large = mod.roofline(**cfg).get("bytes", 0) >= EXCLUSIVE_FROM_BYTES
    except Exception:  # a roofline that needs data or a GPU: treated as small
        large = False
    if not large:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "tirx-kernels-large-config.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


def check_correctness(kernel: str, label: str) -> dict:
    from tirx_kernels.core.harness import find_config, full_config

    mod = load_or_skip(kernel)
    cfg = find_config(mod, label)
    with exclusive_if_large(mod, full_config(mod, cfg)):
        return mod.run_test(**cfg)


def check_upstream(kernel: str, label: str) -> None:
    """Our outputs against the upstream reference(s) of ``reference_requirements``; skips with the reason."""
    from tirx_kernels.core import references
    from tirx_kernels.core.harness import find_config, upstream_baselines

    mod = load_or_skip(kernel)
    if not mod.KERNEL_META.get("reference_requirements"):
        pytest.skip(f"{kernel} declares no upstream reference")
    missing = [d for ok, d in references.resolve_all(mod.KERNEL_META).values() if not ok]
    res = mod.run_test(**find_config(mod, label))
    upstream = upstream_baselines(mod)
    checked = {n: r for n, r in res["references"].items() if n in upstream}
    passed = [n for n, r in checked.items() if r["status"] == "passed"]
    if not passed:
        reasons = missing + [r.get("reason", "") for r in checked.values()]
        pytest.skip("; ".join(x for x in reasons if x) or "no upstream reference ran")


def check_graph_replay(kernel: str, label: str) -> None:
    """Capture ``launch`` in a CUDA graph, refill the inputs with new random values, replay, check."""
    from tirx_kernels.core.harness import check_replay, find_config, full_config

    mod = load_or_skip(kernel)
    check_replay(mod, full_config(mod, find_config(mod, label)))


def build_and_check_sass(mod, kernel: str, params: dict) -> str:
    """Build ``params`` of ``kernel`` (CPU: TVM + nvcc, cached) and assert what every build promises: no
    register spills, no stack frame, no local-memory loads/stores, and ``mod.sass_expect(**params)``.

    Returns the SASS for further kernel-specific checks; skips when cuobjdump is missing.
    """
    import re

    from tirx_kernels.core import artifacts, build

    so, info = artifacts.build_cached(mod, kernel, params)
    for name, k in info["ptxas"]["kernels"].items():
        assert k.get("spill_store_bytes", 0) == 0 and k.get("spill_load_bytes", 0) == 0, (name, k)
        assert k.get("stack_bytes", 0) == 0, f"{name}: {k['stack_bytes']} bytes of stack frame (local memory)"
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed: pip install nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.86")
    sass = build.sass(so, info.get("function"))  # its own kernels only: a batch's .so holds several
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory loads/stores in SASS"
    for pattern in mod.sass_expect(**params) if hasattr(mod, "sass_expect") else []:
        assert re.search(pattern, sass), f"SASS of {kernel} {params} lacks {pattern!r}"
    return sass


def load_tool(name: str, near: str):
    """The repository script ``tools/<name>.py`` as a module, found in the first directory above ``near`` (a test's
    ``__file__``) that has it; skips where the checkout has no tools/ (an installed package's tests)."""
    import pathlib

    for d in pathlib.Path(near).resolve().parents:
        path = d / "tools" / f"{name}.py"
        if path.exists():
            return _load_path(name, path)
    pytest.skip(f"tools/{name}.py is not in this checkout")


def load_sibling(name: str, near: str):
    """The test module ``<name>.py`` beside ``near`` (a test's ``__file__``), loaded by path and cached: pytest runs
    with ``--import-mode=importlib`` (test basenames repeat across packages), so ``from test_x import ...`` does not
    resolve. The module gets a name of its own, so pytest's import of the same file stays separate."""
    import pathlib
    import sys

    path = pathlib.Path(near).resolve().parent / f"{name}.py"
    key = f"_tirx_sibling_{abs(hash(str(path))):x}_{name}"
    if key not in sys.modules:
        sys.modules[key] = _load_path(key, path)
    return sys.modules[key]


def _load_path(name: str, path):
    """The Python file ``path`` executed as a module named ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------------------
# Layer micro-kernel bundles: built on the CPU machine by a test module's ``build_bundle``, run on the GPU host
# (which has no compiler) by its numerics test from ``$TIRX_LANG_MICRO_DIR`` (default ``<repo>/build/lang-micro``)
# ---------------------------------------------------------------------------------------------------------

MICRO_BUNDLE_ENV = "TIRX_LANG_MICRO_DIR"


def write_micro_bundle(out_dir: str, cases_file: str, items) -> str:
    """Build ``(file name, kernel builder, record)`` items into ``out_dir``: each ``.so`` and a ``cases_file``
    listing the records (with their ``so``); returns the path of ``cases_file``."""
    import json
    import os

    from tirx_kernels.core import build

    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for so_name, make_kernel, record in items:
        build.build_so(make_kernel(), os.path.join(out_dir, so_name))
        cases.append({**record, "so": so_name})
    path = os.path.join(out_dir, cases_file)
    with open(path, "w") as f:
        json.dump({"cases": cases}, f, indent=1)
    return path


def micro_bundle_cases(repo_root: str, cases_file: str) -> tuple[str, list[dict]]:
    """(bundle folder, its cases) — no cases when the bundle was not built or carried."""
    import json
    import os

    bundle = os.environ.get(MICRO_BUNDLE_ENV) or os.path.join(repo_root, "build", "lang-micro")
    path = os.path.join(bundle, cases_file)
    return bundle, (json.load(open(path))["cases"] if os.path.exists(path) else [])


def micro_skip_reason() -> str | None:
    """Why the sm_90a micro-kernels cannot run here (the arch gate of every kernel), or None."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed"
    try:
        check_arch({"name": "layer micro-kernels", "runtime_cuda_archs": ["sm_90a"]})
    except UnsupportedArchError as e:
        return str(e)
    return None
