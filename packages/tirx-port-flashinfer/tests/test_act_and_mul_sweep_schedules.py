# SPDX-License-Identifier: Apache-2.0
"""act_and_mul's sweep-only schedules (tools/sweeps/act_and_mul_variants.py; "bulk": sweep round 7): the plan and input
validation, builds of representative configs with their SASS facts (1-D bulk copies, mbarrier waits, 16-byte smem
accesses, no local memory, registers within the promised residency), and the sweep's variant list. Numerics are
checked on the GPU host by the sweep's fp32 oracle (``sweep_variants.py run``)."""

import importlib.util

import pytest

from tirx_kernels.core import artifacts, testing


@pytest.fixture(scope="module")
def mod():
    """The sweep module (a kernel module: compile_params / get_kernel / sass_expect); skips without tools/."""
    return testing.load_tool("sweeps/act_and_mul_variants", __file__)


@pytest.mark.parametrize("d, kw, chunk, consumers, ctas", [
    (14336, {}, 2048, 128, 6),  # 7 chunks a row, 8 KB a stage
    (14336, {"vectors_per_thread": 1, "stages": 4}, 2048, 256, 3),
    (14336, {"chunk": 3584, "stages": 3}, 3584, 224, 4),
    (14336, {"chunk": 7168, "vectors_per_thread": 4, "stages": 2}, 7168, 224, 3),  # 4 x 57 KB > 228 KB
    (4096, {}, 2048, 128, 6),
    (1536, {}, 1536, 96, 8),
])
def test_bulk_plan(mod, d, kw, chunk, consumers, ctas):
    plan = mod.bulk_plan(d, **kw)
    assert (plan["chunk"], plan["consumers"], plan["ctas_per_sm"]) == (chunk, consumers, ctas)
    assert plan["threads"] == consumers + 32 and plan["stage_bytes"] == 4 * chunk


@pytest.mark.parametrize("d, kw, match", [
    (128, {}, "no column chunk"),  # 16 vectors: not even one warp of 2 vectors a thread
    (14336, {"chunk": 1000}, "must divide d"),
    (14336, {"chunk": 2048, "vectors_per_thread": 3}, "must divide d"),  # 2048 is no multiple of 3 warps' columns
    (14336, {"chunk": 14336, "stages": 5}, "exceed the 232448 B"),
    (14336, {"stages": 8, "ctas_per_sm": 6}, "do not fit one SM"),
    (14336, {"stages": 0}, "stages 0"),
    (14336, {"vectors_per_thread": 0}, "vectors_per_thread 0"),
    (14336, {"out": "tma"}, "out 'tma'"),
])
def test_bulk_plan_rejects(mod, d, kw, match):
    with pytest.raises(ValueError, match=match):
        mod.bulk_plan(d, **kw)


def test_bulk_schedule_input_validation(mod):
    with pytest.raises(ValueError, match="unknown compile params for schedule 'bulk'"):
        mod.get_kernel("silu", "bfloat16", 14336, schedule="bulk", segments=2)
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.get_kernel("silu", "bfloat16", 14340, schedule="bulk")
    params = mod.compile_params(act="silu", dtype="bfloat16", d=14336, schedule="bulk", chunk=2048, stages=4,
                                out="bulk", load_hint="L2::evict_first", M=32768)
    assert params == {"act": "silu", "dtype": "bfloat16", "d": 14336, "schedule": "bulk", "chunk": 2048, "stages": 4,
                      "out": "bulk", "load_hint": "L2::evict_first"}


BUILDS = [
    {"act": "silu", "dtype": "bfloat16", "d": 14336, "schedule": "bulk", "stages": 4, "ctas_per_sm": 6},
    {"act": "silu", "dtype": "bfloat16", "d": 14336, "schedule": "bulk", "stages": 4, "ctas_per_sm": 6, "out": "bulk"},
    {"act": "gelu_tanh", "dtype": "float16", "d": 4096, "schedule": "bulk", "chunk": 1024, "vectors_per_thread": 1,
     "stages": 3, "load_hint": "L2::evict_first"},
]


@pytest.mark.parametrize("params", BUILDS, ids=["silu-14336-reg", "silu-14336-bulk", "gelu_tanh-fp16-4096-hint"])
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm is needed to build kernels")
def test_bulk_builds(mod, params):
    sass = testing.build_and_check_sass(mod, "act_and_mul", params)  # no spills, no stack, no LDL/STL, sass_expect
    kw = {k: params[k] for k in ("chunk", "vectors_per_thread", "stages", "ctas_per_sm", "out") if k in params}
    plan = mod.bulk_plan(params["d"], **kw)
    _, info = artifacts.build_cached(mod, "act_and_mul", params)
    (kernel,) = info["ptxas"]["kernels"].values()
    assert kernel["registers"] * plan["threads"] * plan["ctas_per_sm"] <= 65536, kernel  # all CTAs resident
    assert "LDG.E" not in sass  # gate and up arrive only through the bulk copies
    assert "SYNCS.ARRIVE.TRANS64.A1T0" in sass  # the consumers' plain arrive on an empty barrier
    if params.get("load_hint"):
        assert "desc[" in sass  # UBLKCP.S.G with the L2 cache-policy operand
    if params.get("out") == "bulk":
        assert "DEPBAR.LE SB0" in sass and "STG.E" not in sass


def test_sweep_variants_resolve_and_bulk_plans_are_valid(mod):
    """Every act_and_mul variant of tools/sweep_variants.py resolves here; a bulk one has a valid plan."""
    sweep = testing.load_tool("sweep_variants", __file__)
    variants = [cfg for _, k, cfg in sweep.VARIANTS if k == "act_and_mul"]
    assert variants
    for cfg in variants:
        params = mod.compile_params(**cfg)
        if params.get("schedule") == "bulk":
            mod.bulk_plan(params["d"], params["chunk"], stages=params["stages"], ctas_per_sm=params["ctas_per_sm"],
                          out=params.get("out", "reg"))
