# SPDX-License-Identifier: Apache-2.0
"""Registry: discovery without import, and every kind of bad metadata is an error naming file and key."""

import importlib
import importlib.metadata
import json
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
        registry.scan(eps)
    assert "bad.py" in str(e.value)
    assert message in str(e.value)


def test_duplicate_name_is_an_error(tmp_path, monkeypatch):
    eps = _fake_package(tmp_path, monkeypatch, {"one.py": _module(), "two.py": _module()})
    with pytest.raises(registry.RegistryError, match="duplicate kernel name 'fake_kernel'"):
        registry.scan(eps)


def test_non_literal_configs_is_an_error(tmp_path, monkeypatch):
    body = f"KERNEL_META = {GOOD_META!r}\nCONFIGS = [dict(label=str(i)) for i in range(3)]\n"
    eps = _fake_package(tmp_path, monkeypatch, {"k.py": body})
    with pytest.raises(registry.RegistryError, match="CONFIGS must be a literal"):
        registry.scan(eps)


def test_port_needs_upstream(tmp_path, monkeypatch):
    meta = {**GOOD_META, "category": "ported.fakeup"}
    root = tmp_path / "tirx_kernels" / "ported" / "fakeup"
    root.mkdir(parents=True)
    (root / "k.py").write_text(_module(meta))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    eps = [importlib.metadata.EntryPoint("fakeup", "tirx_kernels.ported.fakeup", registry.ENTRY_POINT_GROUP)]
    with pytest.raises(registry.RegistryError, match="'upstream'"):
        registry.scan(eps)


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
    assert [r["name"] for r in rows] == ["act_and_mul"]
    assert rows[0]["config_labels"] and rows[0]["distribution"] == "tirx-port-flashinfer"
    text = subprocess.run([sys.executable, "-m", "tirx_kernels.registry"], capture_output=True, text=True,
                          check=True).stdout
    assert "rmsnorm" in text and "configs:" in text


def test_discover_kernels_imports_only_what_is_asked():
    mods = registry.discover_kernels(category="norm")
    assert list(mods) == ["rmsnorm"] and hasattr(mods["rmsnorm"], "run_test")
