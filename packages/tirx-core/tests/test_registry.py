# SPDX-License-Identifier: Apache-2.0
"""Registry: discovery without import; every kind of bad metadata names file and key, skipped (or raised if strict)."""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tirx_kernels import registry

GOOD_META = {"name": "fake_kernel", "category": "fakecat", "runtime_cuda_archs": ["sm_90a"]}
GOOD_CONFIGS = [{"label": "a"}, {"label": "b"}]


def _fake_package(tmp_path, monkeypatch, files: dict[str, str], pkg="fakecat"):
    root = tmp_path / "tirx_kernels" / pkg
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for name, body in files.items():
        (root / name).write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m == f"tirx_kernels.{pkg}" or m.startswith(f"tirx_kernels.{pkg}.")]:
        monkeypatch.delitem(sys.modules, mod)  # an earlier test's load(): find_spec would return its package
    importlib.invalidate_caches()
    return [importlib.metadata.EntryPoint(name=pkg, value=f"tirx_kernels.{pkg}", group=registry.ENTRY_POINT_GROUP)]


def _module(meta=GOOD_META, configs=GOOD_CONFIGS, extra=""):
    return f"KERNEL_META = {meta!r}\nCONFIGS = {configs!r}\n{extra}\nraise RuntimeError('imported!')\n"


def test_scan_reads_literals_without_importing(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"k.py": _module()})
    found = registry.scan(eps)
    assert list(found) == ["fake_kernel"]
    assert found["fake_kernel"].config_labels == ["a", "b"]
    assert "tirx_kernels.fakecat.k" not in sys.modules


@pytest.mark.parametrize("meta, configs, message", [
    ({k: v for k, v in GOOD_META.items() if k != "category"}, GOOD_CONFIGS, "missing key 'category'"),
    ({**GOOD_META, "category": "norm"}, GOOD_CONFIGS, "key 'category'"),
    ({**GOOD_META, "runtime_cuda_archs": ["hopper"]}, GOOD_CONFIGS, "malformed arch 'hopper'"),
    ({**GOOD_META, "runtime_cuda_archs": "sm_90a"}, GOOD_CONFIGS, "key 'runtime_cuda_archs'"),
    (GOOD_META, [{"label": "a"}, {"label": "a"}], "duplicate config label 'a'"),
    (GOOD_META, [{"nolabel": 1}], "CONFIGS[0]"),
    ({**GOOD_META, "reference_requirements": [{"package": "x"}]}, GOOD_CONFIGS, "missing 'import'"),
    ({**GOOD_META, "colour": "red"}, GOOD_CONFIGS, "unknown key"),
])
def test_bad_metadata_names_file_and_key(tmp_path, monkeypatch, meta, configs, message):
    eps = _fake_package(tmp_path, monkeypatch, {"bad.py": _module(meta, configs)})
    with pytest.raises(registry.RegistryError) as e:
        registry.scan(eps, strict=True)
    assert "bad.py" in str(e.value)
    assert message in str(e.value)


def test_duplicate_name_is_an_error(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"one.py": _module(), "two.py": _module()})
    with pytest.raises(registry.RegistryError, match="duplicate kernel name 'fake_kernel'"):
        registry.scan(eps, strict=True)
    with pytest.warns(registry.RegistryWarning, match="duplicate kernel name"):
        assert registry.scan(eps) == {}  # neither module is the kernel


def test_non_literal_configs_is_an_error(tmp_path, monkeypatch):
    body = f"KERNEL_META = {GOOD_META!r}\nCONFIGS = [dict(label=str(i)) for i in range(3)]\n"
    eps = _fake_package(tmp_path, monkeypatch, {"k.py": body})
    with pytest.raises(registry.RegistryError, match="CONFIGS must be a literal"):
        registry.scan(eps, strict=True)


def test_port_needs_upstream(tmp_path, monkeypatch):
    meta = {**GOOD_META, "category": "ported.fakeup"}
    root = tmp_path / "tirx_kernels" / "ported" / "fakeup"
    root.mkdir(parents=True)
    (root / "k.py").write_text(_module(meta))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    eps = [importlib.metadata.EntryPoint("fakeup", "tirx_kernels.ported.fakeup", registry.ENTRY_POINT_GROUP)]
    with pytest.raises(registry.RegistryError, match="'upstream'"):
        registry.scan(eps, strict=True)


def test_modules_without_meta_and_private_files_are_ignored(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"helpers.py": "X = 1\n", "_private.py": _module(), "k.py": _module()})
    assert list(registry.scan(eps)) == ["fake_kernel"]


def test_expected_category():
    assert registry.expected_category("tirx_kernels.norm.rmsnorm") == "norm"
    assert registry.expected_category("tirx_kernels.ported.flashinfer.activation.act_and_mul") == "ported.flashinfer"


def test_installed_kernels_are_listed():
    names = {e.name for e in registry.list_kernels()}
    assert {"rmsnorm", "fp16_bf16_gemm", "act_and_mul"} <= names
    assert {e.name for e in registry.list_kernels(category="norm")} == {"rmsnorm"}
    assert registry.list_kernels(arch="sm_100a") == []


def test_cli_json_and_filters():
    out = subprocess.run([sys.executable, "-m", "tirx_kernels.registry", "--format", "json", "--category",
                          "ported.flashinfer", "--arch", "sm_90a"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    assert "act_and_mul" in [r["name"] for r in rows] and "rmsnorm" not in [r["name"] for r in rows]
    assert all(r["config_labels"] and r["distribution"] == "tirx-port-flashinfer" for r in rows)
    text = subprocess.run([sys.executable, "-m", "tirx_kernels.registry"], capture_output=True, text=True,
                          check=True).stdout
    assert "rmsnorm" in text and "configs:" in text


def test_discover_kernels_imports_only_what_is_asked():
    mods = registry.discover_kernels(category="norm")
    assert list(mods) == ["rmsnorm"] and hasattr(mods["rmsnorm"], "run_test")


# A lenient scan: one bad module in a package is skipped and reported; the other kernels keep working.

GOOD_IMPORTABLE = f"KERNEL_META = {dict(GOOD_META, name='good_kernel')!r}\nCONFIGS = {GOOD_CONFIGS!r}\nLOADED = True\n"
BAD = _module({**GOOD_META, "name": "bad_kernel", "runtime_cuda_archs": ["hopper"]})


def test_bad_module_is_skipped_and_reported_with_file_and_key(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"good.py": GOOD_IMPORTABLE, "bad.py": BAD,
                                                "broken.py": "KERNEL_META = {\n"})
    with pytest.warns(registry.RegistryWarning) as caught:
        found = registry.scan(eps)
    assert list(found) == ["good_kernel"]
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert "bad.py: KERNEL_META key 'runtime_cuda_archs' has malformed arch 'hopper'" in messages[0]
    assert "broken.py: does not parse" in messages[1]
    probs = registry.problems(eps)
    assert [(os.path.basename(p.path), p.kernel) for p in probs] == [("bad.py", "bad_kernel"), ("broken.py", None)]
    assert registry.load("good_kernel", eps).LOADED
    with pytest.raises(registry.SkippedKernelError, match="bad_kernel' is installed but was skipped: .*bad.py: "
                       "KERNEL_META key 'runtime_cuda_archs'") as e:
        registry.load("bad_kernel", eps)
    assert isinstance(e.value, KeyError)  # tirx_kernels.test reports it like an unknown name
    with pytest.raises(KeyError, match="no kernel named 'nope'"):
        registry.load("nope", eps)
    with pytest.raises(registry.RegistryError, match="bad.py: .* \\(and 1 more problem"):
        registry.scan(eps, strict=True)


def test_a_problem_is_warned_once(tmp_path, monkeypatch, recwarn):
    eps = _fake_package(tmp_path, monkeypatch, {"good.py": GOOD_IMPORTABLE, "bad.py": BAD})
    registry.scan(eps)
    registry.scan(eps)
    assert len([w for w in recwarn if issubclass(w.category, registry.RegistryWarning)]) <= 1


def test_entry_point_that_is_no_package_is_a_problem(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"good.py": GOOD_IMPORTABLE})
    eps.append(importlib.metadata.EntryPoint("gone", "tirx_kernels.no_such_pkg", registry.ENTRY_POINT_GROUP))
    with pytest.warns(registry.RegistryWarning, match="no_such_pkg, which is not a package"):
        assert list(registry.scan(eps)) == ["good_kernel"]


def test_scans_are_cached_on_the_files_stat(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"good.py": GOOD_IMPORTABLE})
    parsed = []
    real = registry._literal_assignments
    monkeypatch.setattr(registry, "_literal_assignments", lambda path, names: parsed.append(path) or real(path, names))
    assert list(registry.scan(eps)) == ["good_kernel"]
    assert list(registry.scan(eps)) == ["good_kernel"]
    # Once each: the package's protocol declaration and the module; the second scan parses nothing.
    assert [os.path.basename(p) for p in parsed] == ["__init__.py", "good.py"]
    path = tmp_path / "tirx_kernels" / "fakecat" / "good.py"
    path.write_text(GOOD_IMPORTABLE.replace("good_kernel", "renamed_kernel"))  # another size
    assert list(registry.scan(eps)) == ["renamed_kernel"]
    (path.parent / "k2.py").write_text(_module())  # a new file
    assert sorted(registry.scan(eps)) == ["fake_kernel", "renamed_kernel"]


def _installed_fake_dist(tmp_path, files: dict[str, str]) -> dict:
    """A fake distribution on PYTHONPATH (dist-info with an entry point), for the CLI in a subprocess."""
    root = tmp_path / "tirx_kernels" / "fakecat"
    root.mkdir(parents=True)
    for name, body in files.items():
        (root / name).write_text(body)
    info = tmp_path / "tirx_fake-0.0.0.dist-info"
    info.mkdir()
    # A compatible package (test_registry_compat.py covers the refused ones): a tirx-core range and a protocol.
    (root / "__init__.py").write_text(f"{registry.PROTOCOL_ATTR} = {registry.PROTOCOL_VERSION}\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tirx-fake\nVersion: 0.0.0\n"
                                   "Requires-Dist: tirx-core>=0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nfakecat = tirx_kernels.fakecat\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_cli_skips_a_bad_module_and_strict_fails(tmp_path):
    env = _installed_fake_dist(tmp_path, {"good.py": GOOD_IMPORTABLE, "bad.py": BAD})
    cmd = [sys.executable, "-m", "tirx_kernels.registry"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "good_kernel" in out.stdout and "rmsnorm" in out.stdout
    assert "warning: skipped: " in out.stderr and "bad.py: KERNEL_META key 'runtime_cuda_archs'" in out.stderr
    strict = subprocess.run(cmd + ["--strict"], capture_output=True, text=True, env=env)
    assert strict.returncode == 1 and "error: skipped: " in strict.stderr and "bad.py" in strict.stderr


def test_installed_packages_have_no_problems():
    assert registry.problems() == []
    cmd = [sys.executable, "-m", "tirx_kernels.registry", "--strict"]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
