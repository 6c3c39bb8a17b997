# SPDX-License-Identifier: Apache-2.0
"""rmsnorm's product schedules against the sweep: the sweep lists the public op's kernel first, the measured L2
policies and PDL launch of the default kernel, and the schedules that left the module stay out of it (the
sweep-only ones: tools/sweeps/rmsnorm_variants.py, test_rmsnorm_sweep_schedules.py)."""

import pytest

from tirx_kernels.core import testing
from tirx_kernels.norm import rmsnorm as mod


def _sweep_variants(kernel):
    """(name, params) of ``kernel``'s variants in tools/sweep_variants.py (the list the GPU host times)."""
    sweep = testing.load_tool("sweep_variants", __file__)
    return [(name, cfg) for name, k, cfg in sweep.VARIANTS if k == kernel]


def test_sweep_lists_the_default_first():
    variants = _sweep_variants("rmsnorm")
    seen = set()
    for name, cfg in variants:
        params = mod.compile_params(**cfg)
        key = (params["dtype"], params["H"])
        if key not in seen:  # each shape's first variant is what the public op runs
            assert params == mod.compile_params(dtype=cfg["dtype"], H=cfg["H"]), name
            seen.add(key)
    assert seen


def test_lost_schedules_left_the_product():
    assert mod.SCHEDULES == ("row", "general") and not hasattr(mod, "build_kernel_bulk")
    with pytest.raises(ValueError, match="schedule 'bulk' is not one of"):
        mod.get_kernel("bfloat16", 8192, schedule="bulk")


@pytest.mark.parametrize("H, two_pass", [(4096, False), (7168, False), (8192, True)])
def test_default_row_access_carries_the_measured_l2_policies(H, two_pass):
    """The public op's kernel: x read with an L2 evict_last policy; above H = 7168 Inductor's two passes (x
    re-read L1+L2 evict_first after the reduction, weight evict_last). A pinned access variant replaces it."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    from tirx_kernels.core import build

    src = build.codegen(mod.get_kernel("bfloat16", H))
    assert "createpolicy.fractional.L2::evict_last.b64" in src
    assert ("ld.global.L1::evict_first.L2::cache_hint.v4.b32" in src) == two_pass
    assert ("createpolicy.fractional.L2::evict_first.b64" in src) == two_pass
    pinned = build.codegen(mod.get_kernel("bfloat16", H, load_cache="evict_last"))
    assert "cache_hint" not in pinned and "createpolicy" not in pinned


def test_default_kernel_is_a_programmatic_dependent_launch():
    """The public op's kernel waits for the previous kernel (griddepcontrol.wait) and is launched with the
    PDL attribute (sweep round 9); ``pdl=None`` pins a plain launch."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    from tirx_kernels.core import build

    src = build.codegen(mod.get_kernel("bfloat16", 128))
    assert "programmaticStreamSerializationAllowed = 1" in src and "griddepcontrol.wait" in src
    plain = build.codegen(mod.get_kernel("bfloat16", 128, pdl=None))
    assert "programmaticStreamSerialization" not in plain and "griddepcontrol" not in plain
    with pytest.raises(ValueError, match="rmsnorm: pdl"):
        mod.get_kernel("bfloat16", 128, pdl="sometimes")
