# SPDX-License-Identifier: Apache-2.0
"""The CLIs: build writes a bundle with no GPU; test and bench say clearly why they cannot run here."""

import json
import os
import subprocess
import sys

import pytest


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_build_writes_a_bundle(tmp_path):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    out = tmp_path / "bundle"
    r = _cli("tirx_kernels.build", "--kernel", "rmsnorm", "--config", "bf16_32x128", "--out", str(out),
             env={"TIRX_KERNELS_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    [art] = man["artifacts"]
    assert art["kernel"] == "rmsnorm" and art["params"]["H"] == 128 and art["config_labels"] == ["bf16_32x128"]
    assert (out / art["file"]).stat().st_size > 0 and man["arch"] == "sm_90a"


def test_build_params_file_builds_every_line(tmp_path):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    out = tmp_path / "bundle"
    lines = [{"dtype": "bfloat16", "H": 128},
             {"dtype": "float16", "H": 256}]
    pf = tmp_path / "params.jsonl"
    pf.write_text("".join(json.dumps(p) + "\n" for p in lines) + "\n")
    r = _cli("tirx_kernels.build", "--kernel", "rmsnorm", "--params-file", str(pf), "--jobs", "2", "--out", str(out),
             env={"TIRX_KERNELS_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    assert sorted((a["params"]["dtype"], a["params"]["H"]) for a in man["artifacts"]) == [("bfloat16", 128),
                                                                                          ("float16", 256)]
    r = _cli("tirx_kernels.build", "--kernel", "rmsnorm", "--params-file", str(tmp_path / "empty"), "--out", str(out))
    assert r.returncode != 0


def test_unknown_kernel_is_a_clear_error():
    for cli in ("tirx_kernels.test", "tirx_kernels.bench"):
        r = _cli(cli, "--kernel", "no_such_kernel")
        assert r.returncode == 2 and "no kernel named 'no_such_kernel'" in r.stderr, (cli, r.stderr)


def test_without_a_gpu_test_skips_and_bench_refuses():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the GPU tests cover these CLIs")
    r = _cli("tirx_kernels.test", "--kernel", "rmsnorm", "--config", "bf16_32x128", "--json")
    assert r.returncode == 0
    [row] = json.loads(r.stdout)
    assert row["status"] == "skipped" and "no CUDA device" in row["reason"]
    r = _cli("tirx_kernels.bench", "--kernel", "rmsnorm", "--config", "bf16_32x128")
    assert r.returncode == 2 and "no CUDA device" in r.stderr
