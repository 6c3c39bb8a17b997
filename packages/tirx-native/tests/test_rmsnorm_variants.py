# SPDX-License-Identifier: Apache-2.0
"""rmsnorm's sweep-only schedules (tools/sweep_variants.py) still build clean: the persistent rows and the
cp.async-staged rows ("async", measured slower on the H200: docs/measurements/2026-12-02-h200-b/
sweep-round6.log), with the plans they derive from H."""

import pytest

from tirx_kernels.core import testing
from tirx_kernels.norm import rmsnorm as mod

pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")


@pytest.mark.parametrize("H, tpr, rows, vpt", [(8192, 128, 1, 8), (4096, 64, 2, 8), (2880, 64, 2, 6), (128, 2, 64, 8)])
def test_async_plan(H, tpr, rows, vpt):
    assert mod.async_plan(H) == {"threads_per_row": tpr, "rows_per_cta": rows, "vectors_per_thread": vpt}


@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "H": 8192, "schedule": "async"},
    {"dtype": "float16", "H": 2880, "schedule": "async"},
    {"dtype": "bfloat16", "H": 8192, "schedule": "persistent", "threads_per_row": 512, "ctas_per_sm": 2},
    {"dtype": "bfloat16", "H": 8192, "reload_cache": "evict_first", "load_cache": "evict_last"},
], ids=["async-8192", "async-2880-fp16", "persistent-8192", "two-pass-8192"])
def test_variant_builds(params):
    sass = testing.build_and_check_sass(mod, "rmsnorm", params)
    if params.get("schedule") == "async":
        assert "LDGSTS.E.BYPASS.128" in sass and "LDS.128" in sass
