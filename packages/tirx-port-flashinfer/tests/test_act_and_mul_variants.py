# SPDX-License-Identifier: Apache-2.0
"""act_and_mul's product schedules against the sweep: the sweep lists the public op's kernel first, the default
kernel's L2 policy and PDL launch, and the schedules that left the module stay out of it (the sweep-only ones:
tools/sweeps/act_and_mul_variants.py, test_act_and_mul_sweep_schedules.py)."""

import pytest

from tirx_kernels.core import testing
from tirx_kernels.ported.flashinfer.activation import act_and_mul as mod


def test_sweep_lists_the_default_first():
    """Each act_and_mul shape's first sweep variant is the op's default."""
    sweep = testing.load_tool("sweep_variants", __file__)
    variants = [cfg for _, k, cfg in sweep.VARIANTS if k == "act_and_mul"]
    seen = set()
    for cfg in variants:
        key = (cfg["act"], cfg["dtype"], cfg["d"])
        if key not in seen:  # each shape's first variant is what the public op runs
            assert mod.compile_params(**cfg) == mod.compile_params(act=cfg["act"], dtype=cfg["dtype"], d=cfg["d"])
            seen.add(key)
    assert seen, "the sweep lists no act_and_mul variant: keep the default one beside the references"


def test_lost_schedules_left_the_product():
    assert mod.SCHEDULES == ("tile", "general") and not hasattr(mod, "build_kernel_bulk")
    with pytest.raises(ValueError, match="schedule 'persistent' is not one of"):
        mod.get_kernel("silu", "bfloat16", 4096, schedule="persistent")


def test_default_kernel_reads_evict_last_and_is_a_programmatic_dependent_launch():
    """Sweep round 9's defaults: gate/up loads carry an L2 evict_last policy, the stores none; PDL launch."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    from tirx_kernels.core import build

    src = build.codegen(mod.get_kernel("silu", "bfloat16", 4096))
    assert "createpolicy.fractional.L2::evict_last.b64" in src and "evict_first" not in src
    assert "ld.global.L2::cache_hint.v4.b32" in src and "st.global.v4.b32" in src
    assert "programmaticStreamSerializationAllowed = 1" in src and "griddepcontrol.wait" in src
    plain = build.codegen(mod.get_kernel("silu", "bfloat16", 4096, load_policy=None, pdl=None))
    assert "cache_hint" not in plain and "griddepcontrol" not in plain
