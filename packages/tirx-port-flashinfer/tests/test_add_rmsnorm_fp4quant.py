# SPDX-License-Identifier: Apache-2.0
"""flashinfer_add_rmsnorm_fp4quant: params and bundle resolution, input validation, the generated CUDA run on the
CPU (``core.emulate``): the in-place residual, codes, both SF layouts and the normed output bit for bit against the
oracle where the inputs make rstd exact, within one step elsewhere, nothing written outside the outputs; SASS; on a
GPU, the harness's checks of every config and the dequantized output against the fp32 oracle."""

import contextlib
import random
import re

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import _fp4_rows
from tirx_kernels.ported.flashinfer.norm import add_rmsnorm_fp4quant as mod
from tirx_kernels.ported.flashinfer.norm import rmsnorm_fp4quant as base

bf16 = torch.bfloat16
GUARD = 64


def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_compile_params():
    assert mod.compile_params(dtype="bfloat16", H=4096, both=True) == {
        "dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": True, "both": True,
        "normed": False, "H": 4096}
    assert mod.compile_params(dtype="bfloat16", H=20000)["schedule"] == "general"
    with pytest.raises(ValueError, match="swizzled=True"):
        mod.get_kernel("bfloat16", both=True, H=4096)


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("kwargs, arg, what", [
    ({"input": _t(4, 72), "residual": _t(4, 72), "weight": _t(72)}, "input", "H=72"),
    ({"input": _t(4, 64), "residual": _t(4, 32), "weight": _t(64)}, "residual", "shape"),
    ({"input": _t(4, 64), "residual": _t(4, 64, dtype=torch.float16), "weight": _t(64)}, "residual", "dtype"),
    ({"input": _t(4, 64), "residual": _t(4, 64), "weight": _t(64), "y_out": _t(4, 32)}, "y_out", "shape"),
    ({"input": _t(4, 64), "residual": _t(4, 64), "weight": _t(64), "output_both_sf_layouts": True,
      "block_scale_unswizzled": _t(4, 3, dtype=torch.uint8)}, "block_scale_unswizzled", "shape"),
    ({"input": _t(4, 64), "residual": _t(4, 64), "weight": _t(64)}, "input", "CUDA"),
])
def test_rejected_inputs_name_the_argument(kwargs, arg, what):
    with pytest.raises(TirxInputError, match=f"add_rmsnorm_fp4quant: argument '{arg}'.*{what}"):
        mod.add_rmsnorm_fp4quant(**kwargs)


# ------------------------------------------------------------------------------------------------ CPU emulation

def _narrow_warp_sums(src: str) -> str:
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


@contextlib.contextmanager
def _flags(emulate, flags):
    saved, emulate.CXXFLAGS = emulate.CXXFLAGS, flags
    try:
        yield
    finally:
        emulate.CXXFLAGS = saved


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate
    from tirx_kernels.core.lang import quant

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}
    flags = [*emulate.CXXFLAGS, *quant.emulate_cxxflags()]  # core.lang.quant's PTX stand-ins

    def get(params):
        key = artifacts.canonical_params(params)
        if key not in cache:
            with _flags(emulate, flags):
                cache[key] = emulate.compile(_narrow_warp_sums(codegen(mod.get_kernel(**params))))
        return cache[key]
    return get


def _guarded(n, dtype=torch.uint8, fill=0x5A):
    buf = torch.full((n + 2 * GUARD,), fill, dtype=dtype)
    return buf, buf[GUARD:GUARD + n]


def _run_emulated(kern, params, x, r, w, gs, eps):
    M, H = x.shape
    bs, swz = params["block_size"], params["swizzled"]
    nb = H // bs
    y_buf, y = _guarded(M * (H // 2))
    sf_len = _fp4_rows.sf_rows(M, swz) * _fp4_rows.sf_cols(nb, swz)
    s_buf, s = _guarded(sf_len)
    s2_buf, s2 = _guarded(M * nb if params["both"] else 16)
    n_buf, n = _guarded(M * H if params["normed"] else 8, x.dtype, float("nan"))
    r_buf = torch.full((r.numel() + 2 * GUARD,), float("nan"), dtype=r.dtype)
    rr = r_buf[GUARD:GUARD + r.numel()].view(M, H)
    rr.copy_(r)
    x0, w0 = x.clone(), w.clone()
    g = torch.tensor([1.0 if gs is None else gs], dtype=torch.float32)
    tensors = {"X_ptr": x, "R_ptr": rr, "Wt_ptr": w, "Y_ptr": y.view(M, H // 2), "S_ptr": s, "S2_ptr": s2,
               "Nf_ptr": n, "G_ptr": g}
    scalars = {"M": M, "H": H, "eps": eps, "x_stride": x.stride(0), "r_stride": rr.stride(0), "zero": 0}
    args = [tensors[p.name] if p.pointer else scalars[p.name] for p in kern.params]
    rows = _fp4_rows.sf_rows(M, swz)
    if params.get("schedule") == "general":
        grid, block = (rows,), (base.GENERAL_THREADS,)
    else:
        p = base.row_plan(H, bs)
        grid, block = (-(-rows // p["rows_per_cta"]),), (p["threads_per_row"] * p["rows_per_cta"],)
    kern(*args, grid=grid, block=block).check()
    for buf in (y_buf, s_buf, s2_buf):
        assert (buf[:GUARD] == 0x5A).all() and (buf[-GUARD:] == 0x5A).all()
    for buf in (n_buf, r_buf):
        assert buf[:GUARD].isnan().all() and buf[-GUARD:].isnan().all()
    assert torch.equal(x, x0) and torch.equal(w, w0)
    return {"y_fp4": y.view(M, H // 2).clone(), "block_scale": s.clone(), "residual": rr.clone(),
            "block_scale_unswizzled": s2.clone(), "y_out": n.clone()}


def _exact_inputs(M, H, dtype, seed):
    """x = r = +-2**(j-1): h = x + r = +-2**j exactly, so rstd is 1 / sqrt(fl(H 4**j fl(1 / H))) in any order."""
    g = torch.Generator().manual_seed(seed)
    j = torch.randint(-3, 4, (M, 1), generator=g).float()
    sign = torch.randint(0, 2, (M, H), generator=g).float() * 2 - 1
    x = (sign * torch.pow(2.0, j - 1)).to(dtype)
    w = (torch.randn(H, generator=g) * torch.rand(H, generator=g) * 4).to(dtype)
    total = torch.tensor(H, dtype=torch.float32) * torch.pow(4.0, j)
    rstd = 1.0 / torch.sqrt(total * torch.tensor(1.0 / H, dtype=torch.float32))
    return x, x.clone(), w, rstd


@pytest.mark.parametrize("case", [
    # (dtype, block, format, swizzled, both, normed, M, H, gs, general)
    ("bfloat16", 16, "e4m3", False, False, False, 5, 64, None, False),
    ("bfloat16", 16, "e4m3", True, True, True, 37, 128, 0.37, False),
    ("float16", 16, "e4m3", True, False, True, 3, 4096, 2.5, False),
    ("bfloat16", 32, "ue8m0", False, False, True, 4, 1024, None, False),
    ("float16", 32, "ue8m0", True, True, False, 2, 16384, None, False),
    ("bfloat16", 16, "e4m3", True, True, True, 130, 80, None, True),
    ("bfloat16", 16, "e4m3", False, False, True, 2, 16384, 0.5, True),
    ("float16", 32, "ue8m0", True, True, True, 2, 32768, None, True),
], ids=lambda c: "-".join(map(str, c)))
def test_emulated_bit_exact(emulated, case):
    dtype, bs, fmt, swz, both, normed, M, H, gs, general = case
    params = mod.compile_params(dtype=dtype, H=H, block_size=bs, scale_format=fmt, swizzled=swz, both=both,
                                normed=normed, **({"schedule": "general"} if general else {}))
    x, r, w, rstd = _exact_inputs(M, H, getattr(torch, dtype), M + H)
    got = _run_emulated(emulated(params), params, x, r, w, gs, 0.0)
    hr = (x.float() + r.float()).to(x.dtype)
    y = hr.float() * rstd * w.float()
    g = None if gs is None else torch.tensor([gs])
    codes, sf = _fp4_rows.encode_rows(y, bs, fmt, g, swz or both)
    assert torch.equal(got["residual"], hr)
    assert torch.equal(got["block_scale"], sf.view(torch.uint8).reshape(-1))
    assert torch.equal(got["y_fp4"], codes)
    if both:
        assert torch.equal(got["block_scale_unswizzled"],
                           _fp4_rows.encode_rows(y, bs, fmt, g, False)[1].view(torch.uint8).reshape(-1))
    if normed:
        assert torch.equal(got["y_out"], y.to(x.dtype).reshape(-1))


@pytest.mark.parametrize("case", [
    ("bfloat16", 16, "e4m3", False, 19, 3072, 4160, False),
    ("float16", 32, "ue8m0", True, 3, 7168, 7168, False),
    ("bfloat16", 16, "e4m3", True, 3, 20000, 20000, True),
], ids=lambda c: "-".join(map(str, c)))
def test_emulated_random_rows(emulated, case):
    dtype, bs, fmt, swz, M, H, r_stride, general = case
    params = mod.compile_params(dtype=dtype, H=H, block_size=bs, scale_format=fmt, swizzled=swz, normed=True,
                                **({"schedule": "general"} if general else {}))
    g = torch.Generator().manual_seed(H)
    t = getattr(torch, dtype)
    x = torch.randn(M, H, generator=g).to(t)
    r = torch.randn(M, r_stride, generator=g).to(t)[:, :H]
    w = torch.randn(H, generator=g).to(t)
    got = _run_emulated(emulated(params), params, x, r.contiguous(), w, None, 1e-6)
    want = mod.reference(x, r, w, None, 1e-6, bs, fmt, swz, y_out=True)
    assert torch.equal(got["residual"].float(), want["residual"])
    _fp4_rows.codes_close(got["y_fp4"], want["y_fp4"], {}, {})
    _fp4_rows.scales_close(got["block_scale"], want["block_scale"].view(torch.uint8).reshape(-1), {}, {})
    torch.testing.assert_close(got["y_out"].float().view(M, H), want["y_out"], atol=2e-2, rtol=1.6e-2)


# ------------------------------------------------------------------------------------------------ SASS

@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": True, "both": False,
     "normed": False, "H": 4096},
    {"dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": True, "both": True,
     "normed": True, "schedule": "general"},
])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_add_rmsnorm_fp4quant", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
def test_gpu_return_forms_and_unaligned_residual():
    x = torch.randn(3, 5, 2048, device="cuda").to(bf16)
    rb = torch.randn(3 * 5 * 2048 + 1, device="cuda").to(bf16)
    r = rb[1:].view(3, 5, 2048)  # off 16 bytes: computed on a copy, written back
    w = torch.randn(2048, device="cuda").to(bf16)
    want = mod.reference(x, r.clone(), w, None, 1e-6, 16, "e4m3", True, True)
    out = mod.add_rmsnorm_fp4quant(x, r, w, output_both_sf_layouts=True)
    torch.cuda.synchronize()
    assert len(out) == 3 and out[0].shape == (3, 5, 1024) and out[2].shape == (3, 5, 128)
    torch.testing.assert_close(r.float(), want["residual"], atol=0, rtol=0)
    _fp4_rows.scales_close(out[2].view(torch.uint8).reshape(-1).cpu(),
                           want["block_scale_unswizzled"].view(torch.uint8).reshape(-1).cpu(), {}, {})
