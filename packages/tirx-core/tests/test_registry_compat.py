# SPDX-License-Identifier: Apache-2.0
"""Compatibility by contract: the registry refuses an installed kernel package whose tirx-core range excludes the
installed core, or whose kernel protocol the core does not speak, naming the package and both versions, and keeps
every other package listed."""

import importlib
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

from tirx_kernels import registry

KERNEL = '''KERNEL_META = {"name": "fakeport_kernel", "category": "ported.fakeport", "runtime_cuda_archs": ["sm_90a"],
               "upstream": {"project": "fake", "url": "https://example.invalid/fake", "commit": COMMIT}}
CONFIGS = [{"label": "a"}]
raise RuntimeError("imported!")
'''.replace("COMMIT", repr(40 * "0"))
CORE = registry.core_version()


def _dist(tmp_path, monkeypatch, requires=f"tirx-core>={CORE}", protocol=registry.PROTOCOL_VERSION,
          version="2.0.0"):
    """An installed fake port (dist-info + package) on sys.path; returns its entry points, bound to the dist."""
    pkg = tmp_path / "tirx_kernels" / "ported" / "fakeport"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("" if protocol is None else f"{registry.PROTOCOL_ATTR} = {protocol!r}\n")
    (pkg / "k.py").write_text(KERNEL)
    info = tmp_path / f"tirx_port_fakeport-{version}.dist-info"
    info.mkdir()
    meta = f"Metadata-Version: 2.1\nName: tirx-port-fakeport\nVersion: {version}\n"
    if requires:
        meta += f"Requires-Dist: {requires}\n"
    (info / "METADATA").write_text(meta)
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nfakeport = tirx_kernels.ported.fakeport\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith("tirx_kernels.ported.fakeport")]:
        monkeypatch.delitem(sys.modules, mod)
    importlib.invalidate_caches()
    return list(importlib.metadata.PathDistribution(pathlib.Path(info)).entry_points)


def _scan_with(eps):
    """The installed packages plus the fake one: (kernels, the fake package's problems). Problems of the other
    packages are test_registry.py's business (a module being written in the shared tree must not fail these)."""
    everything = registry._entry_points()  # the fake dist is on sys.path: installed, as far as discovery goes
    assert {(e.name, e.value) for e in eps} <= {(e.name, e.value) for e in everything}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", registry.RegistryWarning)
        kernels = registry.scan(everything)
    return kernels, [p.message for p in registry.problems(everything) if "fakeport" in p.message]


@pytest.mark.skipif(CORE is None, reason="tirx-core runs from a source tree without metadata: no version to check")
def test_compatible_package_is_listed(tmp_path, monkeypatch):
    kernels, problems = _scan_with(_dist(tmp_path, monkeypatch, requires=f"tirx-core>={CORE},<999"))
    assert problems == [] and "fakeport_kernel" in kernels and "rmsnorm" in kernels


@pytest.mark.skipif(CORE is None, reason="tirx-core runs from a source tree without metadata: no version to check")
def test_core_outside_the_range_is_refused_and_others_kept(tmp_path, monkeypatch):
    eps = _dist(tmp_path, monkeypatch, requires="tirx-core<0.0.1,>=0.0.0")
    kernels, problems = _scan_with(eps)
    assert "fakeport_kernel" not in kernels and "rmsnorm" in kernels and "fp16_bf16_gemm" in kernels
    assert len(problems) == 1
    msg = problems[0]
    assert msg.startswith("refused tirx-port-fakeport 2.0.0 requires tirx-core")
    assert "<0.0.1" in msg and f"installed core is tirx-core {CORE}" in msg
    with pytest.raises(KeyError, match="refused tirx-port-fakeport 2.0.0"):
        registry.load("fakeport_kernel")


def test_unknown_protocol_is_refused(tmp_path, monkeypatch):
    kernels, problems = _scan_with(_dist(tmp_path, monkeypatch, requires="tirx-core>=0", protocol=99))
    assert "fakeport_kernel" not in kernels and "rmsnorm" in kernels
    assert len(problems) == 1 and problems[0].startswith("refused tirx-port-fakeport 2.0.0 follows kernel protocol 99")
    assert f"kernel protocol(s) {', '.join(map(str, registry.SUPPORTED_PROTOCOLS))}" in problems[0]


def test_missing_declarations_are_refused(tmp_path, monkeypatch):
    _, problems = _scan_with(_dist(tmp_path, monkeypatch, requires="tirx-core>=0", protocol=None))
    assert len(problems) == 1 and "declares no kernel protocol" in problems[0]
    assert f"{registry.PROTOCOL_ATTR} = {registry.PROTOCOL_VERSION}" in problems[0]
    _, problems = _scan_with(_dist(tmp_path / "b", monkeypatch, requires=None, version="2.0.1"))
    assert len(problems) == 1 and "tirx-port-fakeport 2.0.1 declares no tirx-core requirement" in problems[0]


def test_extra_only_requirement_does_not_count(tmp_path, monkeypatch):
    # A tirx-core pin behind an extra is not the package's range: the package still declares none.
    eps = _dist(tmp_path, monkeypatch, requires="tirx-core<0.0.1; extra == 'x'")
    assert "declares no tirx-core requirement" in registry.refusal(eps[0])


def test_cli_lists_the_others_and_strict_fails(tmp_path, monkeypatch):
    _dist(tmp_path, monkeypatch, requires="tirx-core>=0", protocol=99)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "tirx_kernels.registry"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "rmsnorm" in out.stdout and "fakeport_kernel" not in out.stdout
    assert "warning: skipped: refused tirx-port-fakeport 2.0.0 follows kernel protocol" in out.stderr
    strict = subprocess.run(cmd + ["--strict"], capture_output=True, text=True, env=env)
    assert strict.returncode == 1 and "error: skipped: refused tirx-port-fakeport" in strict.stderr


def test_installed_packages_declare_the_contract():
    eps = registry._entry_points()
    assert eps, "no kernel package installed"
    for ep in eps:
        assert registry.refusal(ep) is None, ep
        path, declared = registry._declared_protocol(ep.value)
        assert declared == registry.PROTOCOL_VERSION, path
    assert registry.PROTOCOL_VERSION in registry.SUPPORTED_PROTOCOLS
