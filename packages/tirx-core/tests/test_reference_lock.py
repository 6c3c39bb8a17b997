# SPDX-License-Identifier: Apache-2.0
"""Reference locks (packages/*/reference-dependencies.json): valid, consistent, and what kernels declare."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tirx_kernels import registry
from tirx_kernels.core import reference_lock
from tirx_kernels.core.reference_lock import repo_root

ROOT = repo_root(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "install_reference_dependencies.py")
PACKAGES = sorted(p for p in os.listdir(os.path.join(ROOT, "packages"))
                  if os.path.exists(os.path.join(ROOT, "packages", p, "pyproject.toml")))


def test_every_package_has_a_valid_lock():
    assert reference_lock.packages_with_locks(ROOT) == PACKAGES
    for p in PACKAGES:
        reference_lock.load(ROOT, p)  # validates


def test_a_package_pinned_twice_is_pinned_the_same_way():
    assert reference_lock.cross_lock_disagreements(reference_lock.load_all(ROOT)) == []


def test_kernel_reference_requirements_agree_with_their_packages_lock():
    locks = reference_lock.load_all(ROOT)
    problems = []
    for e in registry.list_kernels():
        problems += reference_lock.kernel_disagreements(e.meta, locks.get(e.distribution), e.distribution)
    assert problems == []


def test_disagreements_are_found():
    lock = {"format": 1, "package": "p", "requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4"},
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://x/DeepGEMM", "commit": "a" * 40}],
        "upstreams": [{"project": "x", "url": "https://x/DeepGEMM", "commit": "a" * 40}]}
    meta = {"name": "k", "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.3"},
        {"package": "deep-gemm", "import": "deep_gemm", "commit": "b" * 40},
        {"package": "liger-kernel", "import": "liger_kernel", "specifier": "==0.8.5"}],
        "upstream": {"project": "x", "url": "https://x/DeepGEMM", "commit": "c" * 40}}
    got = reference_lock.kernel_disagreements(meta, lock, "p")
    assert any("specifier '==0.7.3', lock: '==0.7.4'" in g for g in got)
    assert any("commit 'bbbb" in g for g in got)
    assert any("liger-kernel is not in p's lock" in g for g in got)
    assert any("upstream commit 'cccc" in g for g in got)
    assert reference_lock.kernel_disagreements(meta, None, "p") == ["k: package p has no reference-dependencies.json"]


@pytest.mark.parametrize("req, match", [
    ({"package": "a", "import": "a", "specifier": ">=1"}, "pins exactly"),
    ({"package": "a", "import": "a"}, "needs 'specifier'"),
    ({"package": "a", "import": "a", "git": "https://x", "commit": "v1.0"}, "40 lowercase hex"),
    ({"package": "a", "import": "a", "git": "https://x", "commit": None}, "needs a 'why'"),
    ({"package": "a", "specifier": "==1"}, "string 'import'"),
])
def test_lock_validation(req, match):
    with pytest.raises(reference_lock.LockError, match=match):
        reference_lock.validate({"format": 1, "package": "p", "requirements": [req]})


def test_check_requirement_against_this_environment():
    import importlib.metadata

    v = importlib.metadata.version("packaging")
    assert reference_lock.check_requirement({"package": "packaging", "import": "packaging",
                                             "specifier": f"=={v}"})[0] == "ok"
    state, detail = reference_lock.check_requirement({"package": "packaging", "import": "packaging",
                                                      "specifier": "==0.0.1"})
    assert state == "mismatch" and v in detail
    state, detail = reference_lock.check_requirement({"package": "packaging", "import": "packaging",
                                                      "git": "https://x", "commit": "a" * 40})
    assert state == "mismatch" and "not a git install" in detail
    assert reference_lock.check_requirement({"package": "surely-not-installed-xyz", "import": "x",
                                             "specifier": "==1"})[0] == "missing"


def _tool(*args, root=ROOT):
    return subprocess.run([sys.executable, TOOL, "--root", root, *args], capture_output=True, text=True)


def test_dry_run_prints_the_pip_commands():
    r = _tool("--dry-run", "--python", "PY")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("#")]
    pins = lines[0].split()
    assert pins[:4] == ["PY", "-m", "pip", "install"]
    assert "flashinfer-python==0.7.4" in pins and "nvidia-cutlass-dsl==4.8.1" in pins
    assert "liger-kernel==0.8.5" in pins and "quack-kernels==0.6.5" in pins
    assert "flash-attn-4==4.0.0b36" in pins and "fla-core==0.6.0" in pins
    assert "pytest==9.0.3" in pins and "kcoral==0.1.1" in pins
    assert len(pins) == len(set(pins))  # a pin shared by two locks appears once
    locks = reference_lock.load_all(ROOT)
    sources = [r for lock in locks.values() for r in lock["requirements"] if "git" in r and r.get("commit")]
    assert sources, "DeepGEMM / FlashMLA / FA3 are source installs"
    for req in sources:
        url = f"git+{req['git']}@{req['commit']}" + (f"#subdirectory={req['subdirectory']}"
                                                   if req.get("subdirectory") else "")
        assert f"PY -m pip install --no-build-isolation {url}" in lines


def test_dry_run_of_one_package():
    r = _tool("--dry-run", "--package", "tirx-port-flashinfer", "--python", "PY")
    assert r.stdout.splitlines() == ["PY -m pip install flashinfer-python==0.7.4 nvidia-cutlass-dsl==4.8.1 "
                                     "liger-kernel==0.8.5 fla-core==0.6.0"]
    r = _tool("--dry-run", "--package", "no-such-package")
    assert r.returncode == 2 and "no lock for no-such-package" in r.stderr


def test_check_exit_codes(tmp_path):
    import importlib.metadata

    pkg = tmp_path / "packages" / "tirx-core"
    pkg.mkdir(parents=True)
    v = importlib.metadata.version("packaging")
    lock = {"format": 1, "package": "tirx-core", "requirements": [
        {"package": "packaging", "import": "packaging", "specifier": f"=={v}"}]}
    (pkg / "reference-dependencies.json").write_text(json.dumps(lock))
    assert _tool("--check", root=str(tmp_path)).returncode == 0
    lock["requirements"].append({"package": "surely-not-installed-xyz", "import": "x", "specifier": "==1"})
    (pkg / "reference-dependencies.json").write_text(json.dumps(lock))
    r = _tool("--check", root=str(tmp_path))
    assert r.returncode == 1 and "surely-not-installed-xyz is not installed" in r.stderr
    assert _tool("--check", "--allow-missing", root=str(tmp_path)).returncode == 0
    lock["requirements"][0]["specifier"] = "==0.0.1"
    (pkg / "reference-dependencies.json").write_text(json.dumps(lock))
    r = _tool("--check", "--allow-missing", root=str(tmp_path))
    assert r.returncode == 1 and f"packaging {v} is installed, lock: ==0.0.1" in r.stderr
