# SPDX-License-Identifier: Apache-2.0
"""flashinfer_fused_add_rmsnorm: params resolution against the bundle, input validation, both kernels' generated
CUDA run on the CPU (``core.emulate``: every element of both in-place outputs against the fp32 oracle, nothing
outside the rows written, every access inside its allocation and 16-byte accesses aligned), SASS; on a GPU, the
harness's checks of every config and views at every alignment."""

import random
import re

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import fused_add_rmsnorm as mod

bf16 = torch.bfloat16


# ------------------------------------------------------------------------------------------------ params

def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    rng = random.Random(0)
    sizes = set(range(1, 300)) | {rng.randrange(1, 70000) for _ in range(300)} | set(model_dims.hidden_sizes())
    for dtype in ("bfloat16", "float16"):
        for gemma in (False, True):
            for H in sorted(sizes):
                for general in (False, True):
                    params = mod.compile_params(dtype=dtype, gemma=gemma, H=H,
                                                **({"schedule": "general"} if general else {}))
                    cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, params)]
                    assert bundled & set(cands), (dtype, gemma, H, cands)


def test_compile_params():
    assert mod.compile_params(dtype="bfloat16", H=4096, M=3) == {"dtype": "bfloat16", "gemma": False, "H": 4096}
    general = {"dtype": "float16", "gemma": True, "schedule": "general"}
    assert mod.compile_params(dtype="float16", gemma=True, H=4095) == general
    assert mod.compile_params(dtype="float16", gemma=True, H=8) == general
    assert mod.compile_params(dtype="float16", gemma=True, H=16392) == general
    assert mod.general_params({"dtype": "float16", "gemma": True, "H": 4096}) == general
    with pytest.raises(ValueError, match="takes H at run time"):
        mod.get_kernel("bfloat16", False, 4096, schedule="general")
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.get_kernel("bfloat16", False, 4095)


@pytest.mark.parametrize("H", sorted({16, 24, 128, 256, 264, 500 * 8, 4096, 4104, 5120, 8192, 16384}))
def test_row_plan_covers_the_row(H):
    p = mod.row_plan(H)
    tpr, vpt = p["threads_per_row"], p["vectors_per_thread"]
    assert tpr * vpt * 8 >= H > (tpr * vpt - tpr) * 8  # only the last vector of a thread may fall past H
    assert tpr <= 32 and tpr & (tpr - 1) == 0 or tpr % 32 == 0
    assert tpr * p["rows_per_cta"] <= 1024 and vpt <= 4


# ------------------------------------------------------------------------------------------------ validation

def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, arg, what", [
    ((_t(4, 64, dtype=torch.float32), _t(4, 64), _t(64)), "input", "dtype"),
    ((_t(4, 64), _t(4, 32), _t(64)), "residual", "shape"),
    ((_t(4, 64), _t(4, 64), _t(32)), "weight", "shape"),
    ((_t(4, 64), _t(4, 64, dtype=torch.float16), _t(64)), "residual", "dtype"),
    ((_t(4, 64), _t(64, 4).t(), _t(64)), "residual", "stride"),
    ((_t(4, 6, 64).transpose(0, 1), _t(6, 4, 64), _t(64)), "input", "flatten"),
    ((_t(4, 0), _t(4, 0), _t(0)), "input", "[1,"),
])
def test_rejected_inputs_name_the_argument(args, arg, what):
    for op in (mod.fused_add_rmsnorm, mod.gemma_fused_add_rmsnorm):
        with pytest.raises(TirxInputError, match=f"argument '{arg}'.*"):
            op(*args)


def test_eps_type_and_cpu_tensors():
    with pytest.raises(TirxInputError, match="argument 'eps'"):
        mod.fused_add_rmsnorm(_t(2, 64), _t(2, 64), _t(64), eps="1e-6")
    with pytest.raises(TirxInputError, match="argument 'input'.*CUDA"):
        mod.fused_add_rmsnorm(_t(2, 64), _t(2, 64), _t(64))


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_fused_add_rmsnorm"
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels))
    hs = {c["H"] for c in mod.CONFIGS}
    assert {111, 500, 1024, 3072, 4096, 8192, 16384} <= hs and {1, 19, 99, 989} <= {c["M"] for c in mod.CONFIGS}
    assert {(c["dtype"], c.get("gemma", False)) for c in mod.CONFIGS} == {
        (t, g) for t in ("bfloat16", "float16") for g in (False, True)}


# ------------------------------------------------------------------------------------------------ CPU emulation

def _oracle(x, r, w, eps, gemma):
    return mod.reference(x, r, w, eps, gemma)


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(params):
        key = artifacts.canonical_params(params)
        if key not in cache:
            cache[key] = emulate.compile(_narrow_warp_sums(codegen(mod.get_kernel(**params))))
        return cache[key]
    return get


def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a group of < 32 lanes (rows packed in a warp) gets
    the same butterfly inline, over its own width."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


def _grid(params, M):
    if params.get("schedule") == "general":
        return (M,), (mod.GENERAL_THREADS,)
    p = mod.row_plan(params["H"])
    return (-(-M // p["rows_per_cta"]),), (p["threads_per_row"] * p["rows_per_cta"],)


def _run_emulated(kern, params, M, H, x_off, x_stride, r_off, r_stride, w_off, gemma, dtype=bf16):
    """The host code's launch (its grid; scalars by name) on buffers that end with their last element."""
    g = torch.Generator().manual_seed(H * 7 + M)
    xb = torch.randn(x_off + (M - 1) * x_stride + H, generator=g).to(dtype)
    rb = torch.randn(r_off + (M - 1) * r_stride + H, generator=g).to(dtype)
    wb = torch.randn(w_off + H, generator=g).to(dtype)
    x = xb.as_strided((M, H), (x_stride, 1), x_off)
    r = rb.as_strided((M, H), (r_stride, 1), r_off)
    w = wb[w_off:]
    want = _oracle(x.clone(), r.clone(), w, 1e-6, gemma)
    xb0, rb0, wb0 = xb.clone(), rb.clone(), wb.clone()
    scalars = {"M": M, "H": H, "eps": 1e-6, "x_stride": x_stride, "r_stride": r_stride, "zero": 0}
    args = [{"X_ptr": x, "R_ptr": r, "Wt_ptr": w}.get(p.name) if p.pointer else scalars[p.name]
            for p in kern.params]
    grid, block = _grid(params, M)
    kern(*args, grid=grid, block=block).check()
    torch.testing.assert_close(x.float(), want["input"], atol=2e-2, rtol=1.6e-2)
    torch.testing.assert_close(r.float(), want["residual"], atol=0, rtol=0)
    for buf, before, off, stride in ((xb, xb0, x_off, x_stride), (rb, rb0, r_off, r_stride)):
        inside = torch.zeros_like(buf, dtype=torch.bool)
        inside.as_strided((M, H), (stride, 1), off).fill_(True)
        assert torch.equal(buf[~inside], before[~inside])
    assert torch.equal(wb, wb0)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("M, H, x_stride, r_stride", [
    (5, 128, 128, 128), (37, 128, 136, 128), (3, 4096, 4096, 4160), (2, 1024, 1024, 1024), (2, 5120, 5120, 5120),
    (3, 24, 24, 32), (1, 16384, 16384, 16384),
])
def test_specialized_kernel_emulated(emulated, gemma, M, H, x_stride, r_stride):
    params = mod.compile_params(dtype="bfloat16", gemma=gemma, H=H)
    _run_emulated(emulated(params), params, M, H, 0, x_stride, 0, r_stride, 0, gemma)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("M, H, x_off, x_stride, r_off, r_stride, w_off", [
    (5, 1, 0, 1, 0, 1, 0), (7, 3, 1, 5, 2, 3, 1), (19, 111, 3, 113, 0, 111, 5), (2, 500, 0, 503, 7, 500, 0),
    (3, 4096, 1, 4096, 0, 4096, 3), (2, 20001, 0, 20001, 1, 20003, 0), (2, 257, 0, 257, 0, 257, 0),
    # input and residual aligned alike (the chunked 16-byte path): every weight shift, slab edges, long rows
    (3, 4096, 1, 4096, 1, 4096, 3), (2, 20001, 3, 20001, 3, 20001, 5), (4, 8191, 0, 8191, 0, 8191, 1),
    (3, 8193, 7, 8193, 7, 8193, 2), (5, 17, 2, 19, 2, 19, 6), (33, 8, 5, 8, 5, 8, 0), (9, 100, 0, 104, 0, 104, 7),
    (2, 16392, 4, 16400, 4, 16400, 4),
])
def test_general_kernel_emulated(emulated, gemma, M, H, x_off, x_stride, r_off, r_stride, w_off):
    params = mod.general_params({"dtype": "bfloat16", "gemma": gemma})
    _run_emulated(emulated(params), params, M, H, x_off, x_stride, r_off, r_stride, w_off, gemma)


def test_general_kernel_emulated_fp16(emulated):
    params = mod.general_params({"dtype": "float16", "gemma": False})
    _run_emulated(emulated(params), params, 3, 77, 1, 80, 0, 77, 1, False, dtype=torch.float16)


# ------------------------------------------------------------------------------------------------ SASS

@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "gemma": False, "H": 4096},
    {"dtype": "float16", "gemma": True, "H": 16384},
    {"dtype": "bfloat16", "gemma": False, "H": 128},
    {"dtype": "float16", "gemma": True, "schedule": "general"},
])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_fused_add_rmsnorm", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
@pytest.mark.parametrize("H", [1, 7, 8, 16, 111, 128, 500, 4095, 4096, 8192, 16384, 16392])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_any_alignment_and_stride(H, dtype):
    """input and residual as views at element offsets 0..7 in padded rows: both results against the oracle, the
    NaN padding untouched; against FlashInfer where it is installed and takes the shape."""
    torch.manual_seed(H)
    M = 33
    gemma = H % 2 == 1
    op = mod.gemma_fused_add_rmsnorm if gemma else mod.fused_add_rmsnorm
    atol, rtol = (2e-2, 1.6e-2) if dtype == torch.bfloat16 else (2e-3, 4e-3)
    w = torch.randn(H, device="cuda").to(dtype)
    for x_off, x_pad, r_off, r_pad in [(0, 0, 0, 0), (1, 3, 0, 0), (0, 0, 3, 1), (5, 7, 2, 9), (7, 8, 7, 8)]:
        xb = torch.full((M, x_off + H + x_pad), float("nan"), device="cuda", dtype=dtype)
        rb = torch.full((M, r_off + H + r_pad), float("nan"), device="cuda", dtype=dtype)
        x, r = xb[:, x_off:x_off + H], rb[:, r_off:r_off + H]
        x.copy_(torch.randn(M, H, device="cuda"))
        r.copy_(torch.randn(M, H, device="cuda"))
        want = _oracle(x.clone(), r.clone(), w, 1e-6, gemma)
        op(x, r, w, 1e-6)
        torch.cuda.synchronize()
        torch.testing.assert_close(x.float(), want["input"], atol=atol, rtol=rtol)
        torch.testing.assert_close(r.float(), want["residual"], atol=0, rtol=0)
        for buf, off in ((xb, x_off), (rb, r_off)):
            pad = torch.ones_like(buf, dtype=torch.bool)
            pad[:, off:off + H] = False
            assert buf[pad].isnan().all(), (x_off, r_off)


@gpu
def test_gpu_matches_flashinfer():
    flashinfer = pytest.importorskip("flashinfer")
    for gemma in (False, True):
        for M, H in [(1, 4096), (19, 111), (99, 1024), (989, 8192)]:
            x = torch.randn(M, H, device="cuda").to(bf16)
            r = torch.randn(M, H, device="cuda").to(bf16)
            w = torch.randn(H, device="cuda").to(bf16)
            x2, r2 = x.clone(), r.clone()
            (mod.gemma_fused_add_rmsnorm if gemma else mod.fused_add_rmsnorm)(x, r, w, 1e-6)
            (flashinfer.norm.gemma_fused_add_rmsnorm if gemma else flashinfer.norm.fused_add_rmsnorm)(x2, r2, w, 1e-6)
            torch.cuda.synchronize()
            torch.testing.assert_close(r, r2, atol=0, rtol=0)
            torch.testing.assert_close(x, x2, atol=1e-2, rtol=1e-2)


@gpu
def test_gpu_leading_dims_empty_and_compile():
    x = torch.randn(3, 5, 77, device="cuda").to(torch.float16)
    r = torch.randn(3, 5, 77, device="cuda").to(torch.float16)
    w = torch.randn(77, device="cuda").to(torch.float16)
    want = _oracle(x.clone(), r.clone(), w, 1e-6, False)
    mod.fused_add_rmsnorm(x, r, w)
    torch.testing.assert_close(x.float(), want["input"], atol=2e-3, rtol=4e-3)
    e = torch.empty(0, 64, device="cuda", dtype=bf16)
    mod.fused_add_rmsnorm(e, e.clone(), torch.ones(64, device="cuda", dtype=bf16))
    x = torch.randn(8, 4096, device="cuda").to(bf16)
    r = torch.randn(8, 4096, device="cuda").to(bf16)
    w = torch.randn(4096, device="cuda").to(bf16)
    want = _oracle(x.clone(), r.clone(), w, 1e-6, True)
    torch.compile(lambda a, b, c: mod.gemma_fused_add_rmsnorm(a, b, c), fullgraph=True)(x, r, w)
    torch.testing.assert_close(x.float(), want["input"], atol=2e-2, rtol=1.6e-2)
    torch.testing.assert_close(r.float(), want["residual"], atol=0, rtol=0)


def test_harness_wiring_on_cpu():
    """The protocol pieces the harness combines (INPLACE, reference keys, the in-place launch) on CPU: a launch
    that writes the oracle's values in place, through the harness's guarded copies of input and residual."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, M, H, eps=1e-6, gemma=False, input_row_stride=None, **_):
        t = getattr(torch, dtype)
        x = torch.randn(M, input_row_stride or H).to(t)[:, :H]
        return {"input": x, "residual": torch.randn(M, H).to(t), "weight": torch.randn(H).to(t), "eps": eps,
                "gemma": gemma}

    def launch(cfg, data):
        want = mod.reference(**data)
        data["residual"].copy_(want["residual"])
        data["input"].copy_(want["input"])

    fake = types.SimpleNamespace(**{k: getattr(mod, k) for k in ("KERNEL_META", "INPLACE", "reference")},
                                 prepare_data=prepare_data, launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"dtype": "bfloat16", "M": 5, "H": 64, "gemma": True},
                {"dtype": "float16", "M": 3, "H": 111, "input_row_stride": 120}):
        assert harness.check_config(fake, cfg)["status"] == "passed"
