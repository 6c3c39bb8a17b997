# SPDX-License-Identifier: Apache-2.0
"""A bundle built by ``python -m tirx_kernels.build --all`` serves every valid call of every kernel it holds.

For each installed kernel, the calls its public ops can see (``call_samples``: catalog model dims, random and
odd dims, every call form) resolve to the params the op would load (``compile_params``, as the op computes
them) and from there, through the runtime's own lookup (specialized artifact, else the general one), to an
artifact of the bundle. The bundle here is the real ``build --all`` plan written as a manifest over empty files:
resolution needs the manifest, not the binaries (CI builds the binaries themselves in its main job).
"""

import os
import random

import pytest

from tirx_kernels import build, registry
from tirx_kernels.core import artifacts, harness, runtime


def _kernels():
    return [e.name for e in registry.list_kernels()]


@pytest.fixture(scope="module")
def planned_bundle(tmp_path_factory):
    """A bundle directory whose manifest lists exactly what ``build --all`` builds (empty ``.so`` files)."""
    out = tmp_path_factory.mktemp("bundle")
    items = []
    blank = out / "blank.so"
    blank.write_bytes(b"")
    for it in build.plan(_kernels()):
        items.append({"kernel": it["kernel"], "params": it["params"], "so": str(blank), "function": "f_test",
                      "fingerprint": artifacts.fingerprint(it["module"]), "config_labels": it["labels"]})
    artifacts.write_bundle(str(out), items)
    return str(out)


def _samples(mod, seed: int = 0) -> list[dict]:
    return list(mod.call_samples(random.Random(seed)))


@pytest.mark.parametrize("kernel", _kernels())
def test_kernel_declares_its_call_space(kernel):
    mod = registry.load(kernel)
    assert hasattr(mod, "call_samples"), f"{kernel}: define call_samples(rng) (PROTOCOL.md) so CI can check its bundle"
    samples = _samples(mod)
    assert len(samples) >= 20, f"{kernel}: call_samples gave {len(samples)} calls; sample the call space wider"


@pytest.mark.parametrize("kernel", _kernels())
def test_every_sampled_call_finds_its_artifact_in_the_bundle(kernel, planned_bundle, monkeypatch):
    mod = registry.load(kernel)
    monkeypatch.setenv("TIRX_KERNELS_ARTIFACTS", planned_bundle)
    monkeypatch.setattr(runtime, "compiler_available", lambda: False)
    missing = []
    for seed in range(3):
        for call in _samples(mod, seed):
            params = mod.compile_params(**harness.full_config(mod, call))
            try:
                path, function = runtime.artifact_location(mod, params)
            except runtime.ArtifactNotFoundError as e:
                missing.append(f"{call}: {e}")
                continue
            assert os.path.dirname(path) == planned_bundle and function == "f_test"
    assert not missing, f"{len(missing)} calls of {kernel} have no artifact in a build --all bundle:\n" + \
        "\n".join(missing[:10])


def test_a_call_served_only_by_the_general_artifact_resolves_to_it(tmp_path, monkeypatch):
    """The runtime takes the specialized artifact when the bundle has it and the general one otherwise."""

    class Mod:
        __name__ = "fake_general"
        KERNEL_META = {"name": "fake_general", "runtime_cuda_archs": ["sm_90a"]}

        @staticmethod
        def general_params(params):
            return {"dtype": params["dtype"], "schedule": "general"}

    monkeypatch.setattr(artifacts, "fingerprint", lambda m: "c" * 16)
    for name in ("spec.so", "gen.so"):
        (tmp_path / name).write_bytes(b"x")
    items = [{"kernel": "fake_general", "params": {"dtype": "bfloat16", "H": 4096}, "fingerprint": "c" * 16,
              "so": str(tmp_path / "spec.so"), "function": "f_spec"},
             {"kernel": "fake_general", "params": {"dtype": "bfloat16", "schedule": "general"}, "fingerprint": "c" * 16,
              "so": str(tmp_path / "gen.so"), "function": "f_gen"}]
    bundle = tmp_path / "bundle"
    artifacts.write_bundle(str(bundle), items)
    monkeypatch.setenv("TIRX_KERNELS_ARTIFACTS", str(bundle))
    monkeypatch.setattr(runtime, "compiler_available", lambda: False)
    assert runtime.artifact_location(Mod, {"dtype": "bfloat16", "H": 4096})[1] == "f_spec"
    assert runtime.artifact_location(Mod, {"dtype": "bfloat16", "H": 3001})[1] == "f_gen"
    with pytest.raises(runtime.ArtifactNotFoundError, match="float16"):
        runtime.artifact_location(Mod, {"dtype": "float16", "H": 3001})


def test_batches_spread_a_kernel_over_the_jobs_and_cap_their_size():
    items = [{"kernel": "a", "i": i} for i in range(100)] + [{"kernel": "b", "i": i} for i in range(3)]
    out = build.batches(items, jobs=2)
    assert sorted(it["i"] for b in out if b[0]["kernel"] == "a" for it in b) == list(range(100))
    assert all(len({it["kernel"] for it in b}) == 1 for b in out)
    assert max(len(b) for b in out) <= build.MAX_BATCH
    assert len([b for b in out if b[0]["kernel"] == "b"]) == 2  # 3 items, 2 jobs: both cores work


def test_fingerprint_does_not_depend_on_where_the_sources_are_installed(tmp_path, monkeypatch):
    """The same sources give the same fingerprint whether the closure's files sit under one root or two (a wheel
    in site-packages and a checkout on sys.path at once): the bundle a GPU host loads must not read as stale."""
    import shutil

    entry = registry.scan()["act_and_mul"]
    files = artifacts.source_closure(entry.path)
    want = artifacts.fingerprint(entry.path)
    moved = []
    for i, f in enumerate(files):  # every other file copied under another root, keeping its namespace path
        if i % 2 and f != os.path.abspath(entry.path):
            rel = f[f.rindex("tirx_kernels"):]
            dst = tmp_path / "zzz-other-root" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst)
            moved.append(str(dst))
        else:
            moved.append(f)
    monkeypatch.setattr(artifacts, "source_closure", lambda path: sorted(moved))
    assert artifacts.fingerprint(entry.path) == want


def test_fingerprint_ignores_a_second_root_of_core_prepended_later(tmp_path, monkeypatch):
    """A checkout's tirx-core/src prepended to sys.path after the wheels were imported (a test loading a tools/
    script did this on the H200, 2026-12-06) must not change a kernel's fingerprint: its copies of core's host-side
    modules stay out of the closure, and no module counts twice."""
    import importlib
    import shutil

    import tirx_kernels

    entry = registry.scan()["act_and_mul"]  # its closure reaches core/op.py, which imports host-side modules
    want = artifacts.fingerprint(entry.path)
    core_dir = os.path.dirname(os.path.abspath(artifacts.__file__))
    second = tmp_path / "checkout" / "src"
    shutil.copytree(core_dir, second / "tirx_kernels" / "core", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(second))
    importlib.invalidate_caches()
    assert str(second / "tirx_kernels") in list(tirx_kernels.__path__)
    artifacts._imports_of.cache_clear()
    closure = artifacts.source_closure(entry.path)
    assert any(str(second) in f for f in closure)  # the second root is really the one resolved now
    names = [artifacts._namespace_path(f) for f in closure]
    assert len(names) == len(set(names)) and not any(n in artifacts._HOST_ONLY_PATHS for n in names)
    assert artifacts.fingerprint(entry.path) == want
