# SPDX-License-Identifier: Apache-2.0
"""Installing and uninstalling a port package adds and removes exactly its kernels (real wheels, real venv)."""

import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PACKAGES = ["tirx-core", "tirx-native", "tirx-port-flashinfer"]


def _run(*cmd, **kw):
    # Without the caller's PYTHONPATH: on the GPU host it names the staged wheels' directory, so the venv's pip saw
    # tirx-port-flashinfer installed there, and its uninstall deleted the port from under the other tests (every
    # later flashinfer-port test of that pytest worker read its bundle as stale, 2026-12-05 H100 run).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_TARGET")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def test_uninstall_port_removes_exactly_its_kernels(tmp_path):
    pytest.importorskip("hatchling", reason="hatchling builds the wheels")
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         *[os.path.join(ROOT, "packages", p) for p in PACKAGES])
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    py = str(venv / "bin" / "python")
    _run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *glob.glob(str(wheels / "*.whl")))
    # The registry's one third-party import (packaging, a tirx-core dependency: it checks each package's tirx-core
    # range), copied from this interpreter: pip would need the network (test_release.py does the same).
    site = _run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    dist = importlib.metadata.distribution("packaging")
    for f in (f for f in dist.files if "__pycache__" not in f.parts and ".." not in f.parts):
        os.makedirs(os.path.join(site, os.path.dirname(str(f))), exist_ok=True)
        shutil.copy2(dist.locate_file(f), os.path.join(site, str(f)))

    def kernels():
        out = _run(py, "-m", "tirx_kernels.registry", "--format", "json", cwd=str(tmp_path))
        return {r["name"]: r["distribution"] for r in json.loads(out)}

    before = kernels()
    assert "act_and_mul" in before and "rmsnorm" in before
    _run(py, "-m", "pip", "uninstall", "-q", "-y", "tirx-port-flashinfer")
    after = kernels()
    assert after == {k: d for k, d in before.items() if d != "tirx-port-flashinfer"}
