# SPDX-License-Identifier: Apache-2.0
"""rmsnorm's sweep-only schedules (tools/sweeps/rmsnorm_variants.py; "bulk": sweep round 7): the plan and input
validation, builds of representative configs with their SASS facts (1-D bulk copies, mbarrier waits, 16-byte smem
accesses, no local memory, registers within the promised residency), and the sweep's variant list. Numerics are
checked on the GPU host by the sweep's fp32 oracle (``sweep_variants.py run``)."""

import importlib.util

import pytest

from tirx_kernels.core import artifacts, testing


@pytest.fixture(scope="module")
def mod():
    """The sweep module (a kernel module: compile_params / get_kernel / sass_expect); skips without tools/, and
    without apache-tvm (a GPU host), which its kernel generators import."""
    pytest.importorskip("tvm", reason="apache-tvm generates the sweep's kernels")
    return testing.load_tool("sweeps/rmsnorm_variants", __file__)


@pytest.mark.parametrize("H, stages, out, x_regs, tpr, vpt, ctas, lag", [
    (8192, 2, "reg", False, 256, 4, 4, 1),
    (8192, 2, "reg", True, 256, 4, 4, 0),
    (7168, 3, "bulk", False, 224, 4, 4, 1),
    (5120, 2, "reg", False, 160, 4, 6, 1),
    (4096, 4, "bulk", True, 128, 4, 6, 1),  # x_regs does not remove the lag of a bulk store
    (2880, 2, "reg", False, 96, 4, 10, 1),  # 360 vectors over 96 threads: the last ones predicated
    (128, 2, "reg", False, 32, 1, 32, 1),
])
def test_bulk_plan(mod, H, stages, out, x_regs, tpr, vpt, ctas, lag):
    plan = mod.bulk_plan(H, stages, out=out, x_regs=x_regs)
    assert (plan["threads_per_row"], plan["vectors_per_thread"], plan["ctas_per_sm"], plan["lag"]) == (tpr, vpt, ctas,
                                                                                                        lag)
    assert plan["row_bytes"] == 2 * H and plan["ctas_per_sm"] * (plan["smem_bytes"] + 1024) <= mod.SMEM_PER_SM


@pytest.mark.parametrize("kw, match", [
    ({"H": 2884, "stages": 2}, "not a positive multiple of 16 B"),  # a row of 5768 B
    ({"H": 16384, "stages": 8}, "exceed the 232448 B a CTA may use"),
    ({"H": 8192, "stages": 4, "ctas_per_sm": 4}, "do not fit one SM"),  # 4 x (64 KB + 1 KB) > 228 KB
    ({"H": 8192, "stages": 2, "ctas_per_sm": 9}, "do not fit one SM"),  # 9 x 256 threads > 2048
    ({"H": 8192, "stages": 1}, "needs at least 2 stage"),
    ({"H": 8192, "stages": 0, "x_regs": True}, "needs at least 1 stage"),
    ({"H": 8192, "stages": 1, "out": "bulk", "x_regs": True}, "needs at least 2 stage"),
    ({"H": 8192, "stages": 2, "threads_per_row": 48}, "multiple of 32"),
    ({"H": 8192, "stages": 2, "out": "tma"}, "out 'tma'"),
])
def test_bulk_plan_rejects(mod, kw, match):
    with pytest.raises(ValueError, match=match):
        mod.bulk_plan(**kw)


def test_bulk_schedule_input_validation(mod):
    assert mod.bulk_plan(8192, 1, x_regs=True)["lag"] == 0  # one stage suffices when x stays in registers
    with pytest.raises(ValueError, match="multiple of 8"):  # H itself, as for every schedule
        mod.get_kernel("bfloat16", 2884, schedule="bulk")
    with pytest.raises(ValueError, match="do not fit one SM"):
        mod.get_kernel("bfloat16", 16384, schedule="bulk", stages=4, ctas_per_sm=2)
    with pytest.raises(ValueError, match="load_hint"):
        mod.get_kernel("bfloat16", 8192, schedule="bulk", load_hint="evict_first")
    params = mod.compile_params(dtype="bfloat16", H=8192, schedule="bulk", stages=3, out="bulk", x_regs=True,
                                load_hint="L2::evict_first", M=4096)
    assert params == {"dtype": "bfloat16", "H": 8192, "schedule": "bulk", "stages": 3, "out": "bulk", "x_regs": True,
                      "load_hint": "L2::evict_first"}


BUILDS = [
    {"dtype": "bfloat16", "H": 8192, "schedule": "bulk", "stages": 2, "ctas_per_sm": 4},
    {"dtype": "bfloat16", "H": 8192, "schedule": "bulk", "stages": 3, "ctas_per_sm": 3, "x_regs": True},
    {"dtype": "bfloat16", "H": 7168, "schedule": "bulk", "stages": 3, "ctas_per_sm": 3, "out": "bulk",
     "load_hint": "L2::evict_first"},
    {"dtype": "float16", "H": 2880, "schedule": "bulk", "stages": 3, "out": "bulk"},  # tail vectors
]


@pytest.mark.parametrize("params", BUILDS, ids=["8192-s2-c4", "8192-s3-c3-xregs", "7168-s3-c3-bulk-hint",
                                                "fp16-2880-s3-bulk"])
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm is needed to build kernels")
def test_bulk_builds(mod, params):
    sass = testing.build_and_check_sass(mod, "rmsnorm", params)  # no spills, no stack, no LDL/STL, sass_expect
    plan = mod.bulk_plan(params["H"], params["stages"], params.get("ctas_per_sm"), params.get("out", "reg"),
                         x_regs=params.get("x_regs", False))
    _, info = artifacts.build_cached(mod, "rmsnorm", params)
    (kernel,) = info["ptxas"]["kernels"].values()
    assert kernel["registers"] * plan["threads_per_row"] * plan["ctas_per_sm"] <= 65536, kernel  # all CTAs resident
    assert "LDG.E.NA" not in sass and "LDG.E.EL" not in sass  # x never travels through LDG
    if params.get("load_hint"):
        assert "desc[" in sass  # UBLKCP.S.G with the L2 cache-policy operand
    if params.get("out") == "bulk":
        assert "BAR.ARV" in sass and "DEPBAR.LE SB0" in sass  # B2 for warps 1..; wait_read before refill/exit
        assert "STG.E" not in sass


def test_sweep_variants_resolve_and_bulk_plans_are_valid(mod):
    """Every rmsnorm variant of tools/sweep_variants.py resolves through this module; a bulk one has a valid plan."""
    sweep = testing.load_tool("sweep_variants", __file__)
    variants = [cfg for _, k, cfg in sweep.VARIANTS if k == "rmsnorm"]
    assert variants
    for cfg in variants:
        params = mod.compile_params(**cfg)
        if params.get("schedule") == "bulk":
            mod.bulk_plan(params["H"], params["stages"], params["ctas_per_sm"], params["out"],
                          x_regs=params.get("x_regs", False))
