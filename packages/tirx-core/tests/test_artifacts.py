# SPDX-License-Identifier: Apache-2.0
"""Artifact keys, the cache (parallel-safe), bundles and the runtime's lookup order."""

import concurrent.futures
import json
import os
import types

import pytest

from tirx_kernels.core import artifacts, runtime

pytest.importorskip("tvm", reason="apache-tvm (the compiler) is needed to build artifacts")

SRC = '''
from tvm.script import tirx as T

def get_kernel(n):
    @T.prim_func
    def scale(x_ptr: T.handle, y_ptr: T.handle):
        X = T.match_buffer(x_ptr, (n,), "float32")
        Y = T.match_buffer(y_ptr, (n,), "float32")
        T.device_entry()
        bx = T.cta_id([n // 128])
        tx = T.thread_id([128])
        Y[bx * 128 + tx] = X[bx * 128 + tx] * T.float32(2)
    return scale
'''


@pytest.fixture
def tiny_module(tmp_path):
    path = tmp_path / "tiny_kernel.py"
    path.write_text(SRC)
    ns = {}
    exec(compile(SRC, str(path), "exec"), ns)
    mod = types.SimpleNamespace(__name__="tiny_kernel", __file__=str(path), get_kernel=ns["get_kernel"],
                                KERNEL_META={"name": "tiny", "runtime_cuda_archs": ["sm_90a"]})
    return mod, str(path)


def test_key_depends_on_params_and_source(tiny_module, tmp_path):
    mod, path = tiny_module
    fp = artifacts.fingerprint(path)
    k1 = artifacts.artifact_key("tiny", {"n": 256}, fp)
    assert k1 == artifacts.artifact_key("tiny", {"n": 256}, fp)
    assert k1 != artifacts.artifact_key("tiny", {"n": 512}, fp)
    with open(path, "a") as f:
        f.write("# changed\n")
    assert artifacts.fingerprint(path) != fp


def test_parallel_builds_share_one_artifact(tiny_module, tmp_path, monkeypatch):
    mod, path = tiny_module
    monkeypatch.setenv("TIRX_KERNELS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts, "fingerprint", lambda m: "f" * 16)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        paths = list(ex.map(lambda _: artifacts.build_cached(mod, "tiny", {"n": 256})[0], range(4)))
    assert len(set(paths)) == 1 and os.path.getsize(paths[0]) > 0
    info = json.load(open(paths[0][:-3] + ".json"))
    assert info["params"] == {"n": 256} and info["arch"] == "sm_90a"


def test_bundle_roundtrip_and_stale_detection(tiny_module, tmp_path, monkeypatch):
    mod, _ = tiny_module
    monkeypatch.setenv("TIRX_KERNELS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts, "fingerprint", lambda m: "a" * 16)
    so, info = artifacts.build_cached(mod, "tiny", {"n": 256})
    bundle = tmp_path / "bundle"
    artifacts.write_bundle(str(bundle), [{**info, "so": so, "config_labels": ["x"]}])
    man = artifacts.read_manifest(str(bundle))
    assert man["arch"] == "sm_90a" and len(man["artifacts"]) == 1
    path, why = artifacts.find_in_bundle(str(bundle), "tiny", {"n": 256}, "a" * 16)
    assert path and os.path.exists(path) and why == ""
    path, why = artifacts.find_in_bundle(str(bundle), "tiny", {"n": 256}, "b" * 16)
    assert path is None and "stale" in why
    path, why = artifacts.find_in_bundle(str(bundle), "tiny", {"n": 512}, "a" * 16)
    assert path is None and "no artifact" in why
    # the runtime prefers the bundle and never needs the compiler for it
    monkeypatch.setenv("TIRX_KERNELS_ARTIFACTS", str(bundle))
    monkeypatch.setattr(runtime, "compiler_available", lambda: False)
    assert runtime.artifact_path(mod, {"n": 256}) == os.path.join(str(bundle), man["artifacts"][0]["file"])
    with pytest.raises(runtime.ArtifactNotFoundError, match="python -m tirx_kernels.build --kernel tiny"):
        runtime.artifact_path(mod, {"n": 512})


def test_rebuilt_artifact_replaces_its_file_in_the_bundle(tiny_module, tmp_path, monkeypatch):
    """A rebuild into an existing bundle keeps one file per entry: the superseded .so goes, other entries' stay."""
    mod, _ = tiny_module
    monkeypatch.setenv("TIRX_KERNELS_CACHE", str(tmp_path / "cache"))
    bundle = str(tmp_path / "bundle")
    monkeypatch.setattr(artifacts, "fingerprint", lambda m: "a" * 16)
    first = [artifacts.build_cached(mod, "tiny", {"n": n}) for n in (256, 512)]
    artifacts.write_bundle(bundle, [{**info, "so": so} for so, info in first])
    old = {a["file"] for a in artifacts.read_manifest(bundle)["artifacts"]}
    monkeypatch.setattr(artifacts, "fingerprint", lambda m: "b" * 16)  # the source changed: a new file for n 256
    so, info = artifacts.build_cached(mod, "tiny", {"n": 256})
    artifacts.write_bundle(bundle, [{**info, "so": so}])
    files = {a["file"] for a in artifacts.read_manifest(bundle)["artifacts"]}
    assert len(files) == 2 and len(files & old) == 1
    assert sorted(f for f in os.listdir(bundle) if f.endswith(".so")) == sorted(files)
