# SPDX-License-Identifier: Apache-2.0
"""Every kernel config codegens and compiles to an sm_90a .so on this CPU machine; SASS and ptxas facts hold."""

import pytest

from tirx_kernels import registry
from tirx_kernels.core import artifacts, harness, testing

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
    sass = testing.build_and_check_sass(registry.load(kernel), kernel, params)
    assert "sm_90a" in sass
