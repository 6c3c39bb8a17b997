# SPDX-License-Identifier: Apache-2.0
"""Every kernel config codegens and compiles to an sm_90a .so on this CPU machine; SASS and ptxas facts hold."""

import re

import pytest

from tirx_kernels import registry
from tirx_kernels.core import artifacts, build, harness

pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")


def _cases():
    out = []
    for e in registry.list_kernels():
        mod = registry.load(e.name)
        seen = {}
        for c in harness.all_configs(mod):
            params = mod.compile_params(**harness.full_config(mod, c))
            seen.setdefault(artifacts.canonical_params(params), (params, c["label"]))
        out += [pytest.param(e.name, p, id=f"{e.name}-{label}") for p, label in seen.values()]
    return out


@pytest.mark.parametrize("kernel, params", _cases())
def test_builds_with_expected_sass(kernel, params):
    mod = registry.load(kernel)
    so, info = artifacts.build_cached(mod, kernel, params)
    for name, k in info["ptxas"]["kernels"].items():
        assert k.get("spill_store_bytes", 0) == 0 and k.get("spill_load_bytes", 0) == 0, (name, k)
        assert k.get("stack_bytes", 0) == 0, f"{name}: {k['stack_bytes']} bytes of stack frame (local memory)"
    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed: pip install nvidia-cuda-cuobjdump==13.2.51")
    sass = build.sass(so)
    assert "sm_90a" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory loads/stores in SASS"
    for pattern in mod.sass_expect(**params) if hasattr(mod, "sass_expect") else []:
        assert re.search(pattern, sass), f"SASS of {kernel} {params} lacks {pattern!r}"
