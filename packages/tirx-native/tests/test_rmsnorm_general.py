# SPDX-License-Identifier: Apache-2.0
"""rmsnorm for every H: which artifact serves which call (specialized where H and the rows allow, else the general
kernel, one per dtype), that a bundle covers every valid H, the inputs the general kernel accepts, and its build
(SASS: 16-byte accesses in the middle of a row, 2-byte ones at its ends, no local memory). The GPU test at the end
checks layouts the CONFIGS rows cannot express (offset views, unaligned weight, > 2**31 elements)."""

import random
import re
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, testing
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.norm import _rmsnorm_general
from tirx_kernels.norm import rmsnorm as mod

bf16 = torch.bfloat16
GENERAL = {"bfloat16": {"dtype": "bfloat16", "schedule": "general"},
           "float16": {"dtype": "float16", "schedule": "general"}}


def _sampled_h():
    rng = random.Random(19)
    return sorted({*range(1, 300), *range(16000, 16800), *rng.sample(range(1, 300001), 3000), 262144, 300000})


def _bundle() -> set:
    """Canonical params of what ``python -m tirx_kernels.build --all`` puts in a bundle for rmsnorm."""
    rows = [mod.compile_params(**{**mod.DEFAULTS, **c}) for c in mod.CONFIGS + mod.BENCH_CONFIGS]
    return {artifacts.canonical_params(p) for p in rows + mod.artifact_params()}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_h_is_served_by_the_bundle(dtype):
    bundle = _bundle()
    for H in _sampled_h():
        p = mod.compile_params(dtype=dtype, H=H)
        assert mod.general_params(p) == GENERAL[dtype]
        if H % 8 == 0 and 16 <= H <= 16384:
            assert p == {"dtype": dtype, "H": H}
        else:
            assert p == GENERAL[dtype], H
        served = [artifacts.canonical_params(c) in bundle for c in (p, mod.general_params(p))]
        assert any(served), H


def test_catalog_sizes_are_specialized_in_the_bundle():
    bundle = _bundle()
    sizes = model_dims.hidden_sizes() + model_dims.head_dims()
    assert all(mod.specialized(H) for H in sizes)  # every catalog size today; the test below holds either way
    for dtype in ("bfloat16", "float16"):
        assert artifacts.canonical_params(GENERAL[dtype]) in bundle
        for H in sizes:
            if mod.specialized(H):
                assert artifacts.canonical_params({"dtype": dtype, "H": H}) in bundle, (dtype, H)


def test_artifact_params_are_few_and_unique():
    params = [artifacts.canonical_params(p) for p in mod.artifact_params()]
    assert len(params) == len(set(params)) == 2 * (1 + len({*model_dims.hidden_sizes(), *model_dims.head_dims()}))


def test_schedule_general_pins_the_general_kernel():
    assert mod.compile_params(dtype="bfloat16", H=4096, schedule="general") == GENERAL["bfloat16"]
    knobs = {"threads_per_row": 128, "vectors_per_thread": 4, "ctas_per_sm": 10}
    p = mod.compile_params(dtype="float16", H=3001, schedule="general", **knobs, x_policy="evict_last")
    assert p == {**GENERAL["float16"], **knobs} and mod.general_params(p) == GENERAL["float16"]
    with pytest.raises(ValueError, match="threads 48"):
        mod.get_kernel(dtype="bfloat16", schedule="general", threads_per_row=48)
    with pytest.raises(ValueError, match="takes H at run time"):
        mod.get_kernel(dtype="bfloat16", H=4096, schedule="general")


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("x, w, out", [
    (_t(4, 1), _t(1), None),
    (_t(4, 7), _t(7), None),
    (_t(3, 3001), _t(3001), None),
    (_t(3, 16392), _t(16392), None),
    (_t(2, 262145), _t(262145), None),
    (_t(4, 133)[:, :111], _t(111), _t(4, 111)),  # odd row stride
    (_t(4, 133)[:, 1:112], _t(112)[1:].clone(), _t(4, 117)[:, 3:114]),  # rows start off 16 bytes
    (_t(4, 4096)[:, 8:], _t(4089)[1:], None),  # an unaligned weight
    (_t(1, 5).t(), _t(1), None),  # H = 1: the last dim's stride is free
])
def test_general_inputs_pass_the_checks(x, w, out):
    """Accepted up to the device check (the last one): odd, tiny and long H, any row strides and offsets."""
    with pytest.raises(TirxInputError, match="argument 'x': expected a CUDA tensor"):
        mod.rmsnorm(x, w, 1e-6, out=out)


@pytest.mark.parametrize("x, w, arg, what", [
    (_t(4, 0), _t(0), "x", r"value in \[1, 1073741824\]"),
    (torch.empty(1, 2**30 + 1, dtype=bf16, device="meta"), torch.empty(2**30 + 1, dtype=bf16, device="meta"), "x",
     r"value in \[1, 1073741824\]"),
    (torch.empty(2**31, 1, dtype=bf16, device="meta"), torch.empty(1, dtype=bf16, device="meta"), "x",
     "at most 2147483647 rows"),
    (torch.empty_strided((2, 8), (2**31, 1), dtype=bf16, device="meta"), torch.empty(8, dtype=bf16, device="meta"),
     "x", "strides of the leading dims"),
])
def test_general_limits_are_named(x, w, arg, what):
    with pytest.raises(TirxInputError, match=f"rmsnorm: argument '{arg}': expected .*{what}"):
        mod.rmsnorm(x, w, 1e-6)


@pytest.mark.parametrize("x, w, out, general", [
    (_t(4, 4096), _t(4096), _t(4, 4096), False),
    (_t(4, 3072)[:, :2880], _t(2880), _t(4, 2944)[:, :2880], False),  # 16-byte row strides: specialized
    (_t(4, 3000), _t(3000), _t(4, 3000), False),
    (_t(4, 3001), _t(3001), _t(4, 3001), True),
    (_t(4, 16392), _t(16392), _t(4, 16392), True),
    (_t(4, 8), _t(8), _t(4, 8), True),  # H < 16
    (_t(4, 2883)[:, :2880], _t(2880), _t(4, 2880), True),  # x rows off 16 bytes
    (_t(4, 2880), _t(2880), _t(4, 2881)[:, :2880], True),  # out rows off 16 bytes
    (_t(4, 2888)[:, 8:], _t(2888)[8:], _t(4, 2880), False),  # 16-byte offsets
    (_t(4, 2880), _t(2881)[1:], _t(4, 2880), True),  # weight off 16 bytes
    (_t(1, 2881)[:, 1:], _t(2880), _t(1, 2880), True),  # one row, its start off 16 bytes
])
def test_routing(x, w, out, general):
    assert mod.uses_general(x, w, out) is general


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_general_build_sass(dtype):
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    params = GENERAL[dtype]
    sass = testing.build_and_check_sass(mod, "rmsnorm", params)  # no spills, no local memory, sass_expect
    so, info = artifacts.build_cached(mod, "rmsnorm", params)
    regs = [k["registers"] for k in info["ptxas"]["kernels"].values()]
    ctas = _rmsnorm_general.MIN_CTAS_PER_SM[dtype]
    assert regs and max(regs) * 128 * ctas <= 65536, regs  # the rows in flight an SM that the launch bounds promise
    # Pass 1 issues every 16-byte load of x before the first FMA of the sum of squares (vector.after_all).
    lines = sass.splitlines()
    first_fma = next(i for i, line in enumerate(lines) if "FFMA" in line or "HFMA2" in line)
    loads = [i for i, line in enumerate(lines) if re.search(r"LDG\.E\.NA\.128", line)]  # x, past L1
    assert len([i for i in loads if i < first_fma]) == 8, (len(loads), first_fma)


# M, H, x offset (elements past a 16-byte boundary), x row stride, weight offset, out offset, out row stride: odd /
# tiny / long H, rows whose alignment changes per row, x and out aligned differently, unaligned weight, aligned H
# with odd strides, one register pass (8184, 8185) and several (8192 + offsets, 16392 ... 262144).
_EMU_CASES = [
    (3, 1, 0, 1, 0, 0, 1), (5, 1, 3, 1, 5, 7, 3), (4, 7, 0, 7, 0, 0, 7), (4, 7, 1, 9, 3, 5, 11),
    (9, 111, 0, 111, 0, 0, 111), (9, 111, 0, 113, 2, 0, 111), (9, 3001, 0, 3001, 0, 0, 3001),
    (9, 3001, 1, 3001, 0, 1, 3001), (9, 3001, 3, 3013, 5, 0, 3002), (3, 3000, 0, 3000, 0, 0, 3000),
    (3, 2880, 1, 2888, 0, 0, 2880), (3, 4096, 0, 4096, 1, 0, 4096), (2, 8184, 0, 8184, 0, 0, 8184),
    (2, 8185, 7, 8185, 0, 7, 8185), (2, 8192, 1, 8193, 0, 1, 8193), (3, 16392, 0, 16397, 0, 0, 16395),
    (2, 20000, 2, 20001, 6, 4, 20003), (3, 65537, 0, 65537, 0, 0, 65537), (1, 262144, 0, 262144, 0, 0, 262144),
    (2, 16, 0, 16, 0, 0, 16), (8, 9, 7, 17, 3, 5, 13),
    (37, 1001, 3, 1001, 0, 3, 1001),  # rows_per_cta: several rows a CTA, a part-filled last group
]


@pytest.mark.parametrize("dtype, knobs", [
    ("bfloat16", {}),
    ("float16", {}),
    ("bfloat16", {"threads_per_row": 64, "ctas_per_sm": 16}),  # sweep candidates (BENCH_CONFIGS)
    ("bfloat16", {"vectors_per_thread": 4, "ctas_per_sm": 10}),
    # the odd-H knobs of _rmsnorm_general (tools/sweeps/odd_sizes.py)
    ("bfloat16", {"edge_loads": "vector"}),
    ("float16", {"edge_loads": "vector", "rows_per_cta": 4, "weight_smem": True}),
    ("bfloat16", {"rows_per_cta": 2, "weight_smem": True, "threads_per_row": 64, "vectors_per_thread": 4}),
    ("bfloat16", {"rows_per_cta": 3}),
])
def test_general_kernel_cpu_emulation(dtype, knobs):
    """The generated CUDA of the general kernel and its knobs, run on the CPU (``core.emulate``): 22 layouts against
    an fp32 oracle, nothing outside out's elements written, every access inside its allocation, every 16-byte one
    aligned."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    from tirx_kernels.core import emulate

    threads = knobs.get("threads_per_row", _rmsnorm_general.THREADS)
    rows = knobs.get("rows_per_cta", _rmsnorm_general.ROWS_PER_CTA)
    odd = {k: knobs[k] for k in ("edge_loads", "rows_per_cta", "weight_smem") if k in knobs}
    kern = emulate.compile(_rmsnorm_general.build_general(
        dtype, mod.PDL, threads, knobs.get("vectors_per_thread", _rmsnorm_general.VECTORS), knobs.get("ctas_per_sm"),
        **odd))
    tdtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(19)
    for M, H, x_off, xs, w_off, o_off, os_ in _EMU_CASES:
        # Each buffer ends where its last element does: a read past a row's end is an AddressSanitizer fault.
        x = torch.randn(x_off + (M - 1) * xs + H, generator=g).to(tdtype).as_strided((M, H), (xs, 1), x_off)
        w = torch.randn(w_off + H, generator=g).to(tdtype)[w_off:]
        ob = torch.full((o_off + (M - 1) * os_ + H,), float("nan"), dtype=tdtype)
        out = ob.as_strided((M, H), (os_, 1), o_off)
        grid = M if rows == 1 else ((M - 1) // (8 * rows) + 1) * 8  # the host's grid (CTAs of rows 8 apart)
        kern(w, x, out, H, M, 1e-6, xs, os_, 0, grid=(grid,), block=(threads,)).check()
        torch.testing.assert_close(out.float(), _oracle(x, w, 1e-6), **_tol(tdtype), msg=f"{M, H, x_off, xs}")
        written = torch.zeros_like(ob, dtype=torch.bool)
        written.as_strided((M, H), (os_, 1), o_off).fill_(True)
        assert ob[~written].isnan().all(), (M, H, x_off, xs, w_off, o_off, os_)


@pytest.mark.parametrize("H, skipped", [(4096, set()), (3001, {"quack"}), (65537, {"liger", "quack"}),
                                        (262144, {"liger"})])
def test_library_baselines_skip_shapes_they_cannot_take(H, skipped):
    baselines = mod.get_baselines(dtype="bfloat16", M=3, H=H)
    for name in ("liger", "quack"):
        if name in skipped:
            with pytest.raises(ImportError, match=f"{name} does not take this shape"):
                baselines[name]()


# ---------------------------------------------------------------------------------------------------------
# GPU: layouts the harness rows cannot express (run by the lead on the GPU host)
# ---------------------------------------------------------------------------------------------------------

def _oracle(x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
@pytest.mark.parametrize("H, x_off, x_stride, w_off, out_off, out_stride", [
    (3001, 1, 3001, 0, 1, 3001),  # contiguous-like rows one element off: out aligned like x
    (3001, 3, 3013, 5, 0, 3002),  # x, weight and out all aligned differently (element-wise stores)
    (2880, 1, 2888, 0, 0, 2880),  # a specialized H routed to the general kernel
    (4096, 0, 4096, 1, 0, 4096),  # only the weight off 16 bytes
    (9, 7, 17, 3, 5, 13),
    (20000, 2, 20001, 6, 4, 20003),  # three slabs: pass 2 reads x again
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_general_offset_views(H, x_off, x_stride, w_off, out_off, out_stride, dtype):
    testing.load_or_skip("rmsnorm")
    M = 37
    g = torch.Generator(device="cuda").manual_seed(19)
    xb = torch.randn(M * x_stride + x_off + H, generator=g, device="cuda").to(dtype)
    x = xb.as_strided((M, H), (x_stride, 1), x_off)
    w = torch.randn(H + w_off, generator=g, device="cuda").to(dtype)[w_off:]
    ob = torch.full((M * out_stride + out_off + H + 16,), float("nan"), device="cuda", dtype=dtype)
    out = ob.as_strided((M, H), (out_stride, 1), out_off)
    before = ob.clone()
    mod.rmsnorm(x, w, 1e-6, out=out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), _oracle(x, w, 1e-6), **_tol(dtype))
    written = torch.zeros_like(ob, dtype=torch.bool)
    written.as_strided((M, H), (out_stride, 1), out_off).fill_(True)
    assert torch.equal(ob[~written].isnan(), before[~written].isnan())  # nothing outside out's elements written


def _tol(dtype):
    return {"atol": 1e-2, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {"atol": 2e-3, "rtol": 4e-3}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
def test_general_more_than_2_31_elements():
    """64-bit row offsets: the last rows of x lie past 2**31 elements (8.6 GB for x and out)."""
    testing.load_or_skip("rmsnorm")
    H = 3001
    M = 2**31 // H + 5
    x = torch.randn(M, H, device="cuda", dtype=bf16)
    w = torch.randn(H, device="cuda", dtype=bf16)
    out = torch.full_like(x, float("nan"))
    mod.rmsnorm(x, w, 1e-6, out=out)
    torch.cuda.synchronize()
    for rows in (slice(0, 3), slice(M - 8, M)):
        torch.testing.assert_close(out[rows].float(), _oracle(x[rows], w, 1e-6), **_tol(bf16))
