# SPDX-License-Identifier: Apache-2.0
"""flashinfer_rmsnorm_fp4quant: params and bundle resolution, input validation, both kernels' generated CUDA run on
the CPU (``core.emulate``): codes and scale factors bit for bit against the oracle's encoders where the inputs make
rstd exact, within one step elsewhere, nothing written outside the outputs, the swizzled padding zero; SASS; on a
GPU, the harness's checks of every config and the dequantized output against the fp32 oracle."""

import contextlib
import random
import re

import pytest
import torch

from tirx_kernels.core import artifacts, quant_ref, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import _fp4_rows
from tirx_kernels.ported.flashinfer.norm import rmsnorm_fp4quant as mod

bf16 = torch.bfloat16


# ------------------------------------------------------------------------------------------------ params

def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    rng = random.Random(0)
    for call in mod.call_samples(rng):
        params = mod.compile_params(**call)
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, params)]
        assert bundled & set(cands), (call, cands)


def test_compile_params():
    assert mod.compile_params(dtype="bfloat16", H=4096, M=3) == {
        "dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": False, "H": 4096}
    assert mod.compile_params(dtype="float16", H=4096, block_size=32, swizzled=True) == {
        "dtype": "float16", "block_size": 32, "scale_format": "ue8m0", "swizzled": True, "H": 4096}
    general = {"dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": False,
               "schedule": "general"}
    assert mod.compile_params(dtype="bfloat16", H=20000) == general
    assert mod.general_params(mod.compile_params(dtype="bfloat16", H=4096)) == general
    with pytest.raises(ValueError, match="takes H at run time"):
        mod.get_kernel("bfloat16", H=4096, schedule="general")
    with pytest.raises(ValueError, match="ue8m0"):
        mod.get_kernel("bfloat16", 16, "ue8m0", H=4096)


@pytest.mark.parametrize("H, bs", [(16, 16), (64, 16), (80, 16), (128, 16), (4096, 16), (16384, 16), (32, 32),
                                   (96, 32), (4096, 32), (16384, 32), (3584, 16), (7168, 32)])
def test_row_plan_covers_the_row(H, bs):
    p = mod.row_plan(H, bs)
    tpr, bpt = p["threads_per_row"], p["blocks_per_thread"]
    nb = H // bs
    assert tpr * bpt >= nb > tpr * (bpt - 1)
    assert (tpr <= 32 and tpr & (tpr - 1) == 0) or tpr % 32 == 0
    assert tpr * p["rows_per_cta"] <= 1024 and bpt * bs // 8 <= mod.VECTORS_PER_THREAD
    assert 128 % p["rows_per_cta"] == 0  # the swizzled grid covers the rows padded to 128 exactly


# ------------------------------------------------------------------------------------------------ validation

def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("kwargs, arg, what", [
    ({"input": _t(4, 72), "weight": _t(72)}, "input", "H=72"),
    ({"input": _t(4, 48), "weight": _t(48), "block_size": 32}, "input", "H=48"),
    ({"input": _t(4, 64, dtype=torch.float32), "weight": _t(64)}, "input", "dtype"),
    ({"input": _t(64), "weight": _t(64)}, "input", "dimensions"),
    ({"input": _t(4, 64), "weight": _t(32)}, "weight", "shape"),
    ({"input": _t(4, 64), "weight": _t(64, dtype=torch.float16)}, "weight", "dtype"),
    ({"input": _t(4, 64), "weight": _t(64), "block_size": 8}, "block_size", "16 or 32"),
    ({"input": _t(4, 64), "weight": _t(64), "scale_format": "ue8m0"}, "scale_format", "block_size 32"),
    ({"input": _t(4, 64), "weight": _t(64), "y_fp4": _t(4, 64, dtype=torch.uint8)}, "y_fp4", "shape"),
    ({"input": _t(4, 64), "weight": _t(64), "block_scale": _t(4, 3, dtype=torch.uint8)}, "block_scale", "shape"),
    ({"input": _t(4, 64), "weight": _t(64), "block_scale": _t(100, dtype=torch.uint8),
      "is_sf_swizzled_layout": True}, "block_scale", "512 elements"),
    ({"input": _t(4, 64), "weight": _t(64), "global_scale": _t(2, dtype=torch.float32)}, "global_scale", "shape"),
    ({"input": _t(4, 64), "weight": _t(64), "eps": "x"}, "eps", "float"),
    ({"input": _t(4, 64), "weight": _t(64)}, "input", "CUDA"),
])
def test_rejected_inputs_name_the_argument(kwargs, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        mod.rmsnorm_fp4quant(**kwargs)


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_rmsnorm_fp4quant"
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    labels = [c["label"] for c in mod.CONFIGS + mod.BENCH_CONFIGS]
    assert len(labels) == len(set(labels))
    assert {"bench_nv_3d_b32_s32_h128", "bench_nv_m32_h4096", "bench_nv_large_m64_h8192"} <= set(labels)


# ------------------------------------------------------------------------------------------------ CPU emulation

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


def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a group of < 32 lanes (rows packed in a warp) gets
    the same butterfly inline, over its own width."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


def _launch_shape(params, rows):
    sf_rows = _fp4_rows.sf_rows(rows, params["swizzled"])
    if params.get("schedule") == "general":
        return (sf_rows,), (mod.GENERAL_THREADS,)
    p = mod.row_plan(params["H"], params["block_size"])
    return (-(-sf_rows // p["rows_per_cta"]),), (p["threads_per_row"] * p["rows_per_cta"],)


GUARD = 64


def _run_emulated(kern, params, x, w, gs, eps):
    """The host code's launch on guarded outputs; returns codes and SF (the guards checked untouched)."""
    M, H = x.shape
    bs, swz = params["block_size"], params["swizzled"]
    nb = H // bs
    y_buf = torch.full((M * (H // 2) + 2 * GUARD,), 0x5A, dtype=torch.uint8)
    sf_len = _fp4_rows.sf_rows(M, swz) * _fp4_rows.sf_cols(nb, swz)
    s_buf = torch.full((sf_len + 2 * GUARD,), 0x5A, dtype=torch.uint8)
    y = y_buf[GUARD:GUARD + M * (H // 2)].view(M, H // 2)
    s = s_buf[GUARD:GUARD + sf_len]
    g = torch.tensor([1.0 if gs is None else gs], dtype=torch.float32)
    x0, w0 = x.clone(), w.clone()
    tensors = {"X_ptr": x, "Wt_ptr": w, "Y_ptr": y, "S_ptr": s, "G_ptr": g}
    scalars = {"M": M, "H": H, "eps": eps, "x_stride": x.stride(0), "zero": 0}
    args = [tensors[p.name] if p.pointer else scalars[p.name] for p in kern.params]
    grid, block = _launch_shape(params, M)
    kern(*args, grid=grid, block=block).check()
    for buf in (y_buf, s_buf):
        assert (buf[:GUARD] == 0x5A).all() and (buf[-GUARD:] == 0x5A).all()
    assert torch.equal(x, x0) and torch.equal(w, w0)
    return y.clone(), s.clone()


def _want(x, w, gs, eps, params, rstd=None):
    y = mod.normalized(x, w, eps) if rstd is None else (x.float() * w.float()).to(x.dtype).float() * rstd
    g = None if gs is None else torch.tensor([gs], dtype=torch.float32)
    codes, sf = _fp4_rows.encode_rows(y, params["block_size"], params["scale_format"], g, params["swizzled"])
    return codes, sf.view(torch.uint8).reshape(-1), y


def _exact_inputs(M, H, dtype, seed):
    """Rows of +-2**j (j per row) and eps 0: the sum of squares is exact in any order, so the kernel's rstd is
    ``1 / sqrt(fl(H * 4**j * fl(1 / H)))`` bit for bit (the emulation's rsqrtf is 1 / sqrtf)."""
    g = torch.Generator().manual_seed(seed)
    j = torch.randint(-3, 4, (M, 1), generator=g).float()
    sign = torch.randint(0, 2, (M, H), generator=g).float() * 2 - 1
    x = (sign * torch.pow(2.0, j)).to(dtype)
    w = (torch.randn(H, generator=g) * torch.rand(H, generator=g) * 4).to(dtype)
    total = torch.tensor(H, dtype=torch.float32) * torch.pow(4.0, j)  # exact
    mean = total * torch.tensor(1.0 / H, dtype=torch.float32)
    rstd = 1.0 / torch.sqrt(mean)
    return x, w, rstd


EXACT_CASES = [
    # (dtype, block, format, swizzled, M, H, global scale, general)
    ("bfloat16", 16, "e4m3", False, 5, 64, None, False),
    ("bfloat16", 16, "e4m3", True, 37, 128, 0.37, False),
    ("float16", 16, "e4m3", True, 3, 4096, 2.5, False),
    ("bfloat16", 32, "ue8m0", False, 4, 1024, None, False),
    ("float16", 32, "ue8m0", True, 2, 16384, None, False),
    ("bfloat16", 32, "e4m3", False, 3, 2048, 3.0, False),
    ("bfloat16", 16, "e4m3", True, 2, 80, 1.0, False),
    ("bfloat16", 16, "e4m3", True, 130, 80, None, True),
    ("bfloat16", 16, "e4m3", False, 2, 16384, 0.5, True),
    ("float16", 32, "ue8m0", True, 3, 32768, None, True),
    ("bfloat16", 32, "e4m3", True, 2, 96, 4.0, True),
]


@pytest.mark.parametrize("case", EXACT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_bit_exact(emulated, case):
    dtype, bs, fmt, swz, M, H, gs, general = case
    params = mod.compile_params(dtype=dtype, H=H, block_size=bs, scale_format=fmt, swizzled=swz,
                                **({"schedule": "general"} if general else {}))
    x, w, rstd = _exact_inputs(M, H, getattr(torch, dtype), H + M)
    y, s = _run_emulated(emulated(params), params, x, w, gs, 0.0)
    want_y, want_s, _ = _want(x, w, gs, 0.0, params, rstd)
    assert torch.equal(s, want_s), (s != want_s).nonzero()[:8]
    assert torch.equal(y, want_y), (y != want_y).nonzero()[:8]


def _dequantized(codes, sf, params, rows, H, gs):
    bs = params["block_size"]
    nb = H // bs
    if params["swizzled"]:
        k_tiles = -(-nb // 4)
        r = torch.arange(rows).view(-1, 1)
        c = torch.arange(nb).view(1, -1)
        off = (r // 128) * k_tiles * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        sf = sf.view(torch.uint8)[off]
    sf = sf.view(torch.uint8).view(rows, nb)
    scale = quant_ref.ue8m0_inv_scale(sf).reciprocal() if params["scale_format"] == "ue8m0" else \
        quant_ref.fp8_decode(sf) / (1.0 if gs is None else gs)
    vals = quant_ref.e2m1_decode(quant_ref.unpack_e2m1(codes.view(rows, H // 2))).view(rows, nb, bs)
    return (vals * scale.unsqueeze(-1)).view(rows, H)


@pytest.mark.parametrize("case", [
    ("bfloat16", 16, "e4m3", False, 19, 3072, None, False),
    ("float16", 16, "e4m3", True, 7, 3584, 0.3, False),
    ("bfloat16", 32, "ue8m0", True, 3, 7168, None, False),
    ("bfloat16", 16, "e4m3", True, 3, 20000, None, True),
], ids=lambda c: "-".join(map(str, c)))
def test_emulated_random_rows(emulated, case):
    """Random rows (rstd from another summation order): codes and SF within one step, few off; the dequantized
    output against the fp32 oracle at FlashInfer's tolerance (rtol 0.5, atol 2)."""
    dtype, bs, fmt, swz, M, H, gs, general = case
    params = mod.compile_params(dtype=dtype, H=H, block_size=bs, scale_format=fmt, swizzled=swz,
                                **({"schedule": "general"} if general else {}))
    g = torch.Generator().manual_seed(H)
    x = torch.randn(M, H, generator=g).to(getattr(torch, dtype))
    w = torch.randn(H, generator=g).to(getattr(torch, dtype))
    y, s = _run_emulated(emulated(params), params, x, w, gs, 1e-6)
    want_y, want_s, yf = _want(x, w, gs, 1e-6, params)
    _fp4_rows.codes_close(y, want_y, {}, {})
    _fp4_rows.scales_close(s, want_s, {}, {})
    deq = _dequantized(y, s, params, M, H, gs)
    torch.testing.assert_close(deq, yf, rtol=0.5, atol=2.0)


def test_emulated_strided_rows(emulated):
    """Rows at a 16-byte-multiple stride: the kernel reads only the row's H columns."""
    params = mod.compile_params(dtype="bfloat16", H=128, swizzled=False)
    xb, w, rstd = _exact_inputs(9, 192, bf16, 3)
    x = xb[:, :128]
    w = w[:128].contiguous()
    total = torch.tensor(128.0) * (x.float()[:, :1] ** 2)
    rstd = 1.0 / torch.sqrt(total * torch.tensor(1.0 / 128, dtype=torch.float32))
    y, s = _run_emulated(emulated(params), params, x, w, None, 0.0)
    want_y, want_s, _ = _want(x, w, None, 0.0, params, rstd)
    assert torch.equal(s, want_s) and torch.equal(y, want_y)


# ------------------------------------------------------------------------------------------------ SASS

@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": True, "H": 4096},
    {"dtype": "float16", "block_size": 32, "scale_format": "ue8m0", "swizzled": False, "H": 16384},
    {"dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": False, "H": 128},
    {"dtype": "bfloat16", "block_size": 16, "scale_format": "e4m3", "swizzled": True, "schedule": "general"},
])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_rmsnorm_fp4quant", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
@pytest.mark.parametrize("bs, fmt", [(16, "e4m3"), (32, "ue8m0")])
@pytest.mark.parametrize("swizzled", [False, True])
def test_gpu_dequantized_vs_oracle(bs, fmt, swizzled):
    """FlashInfer's check: the dequantized output against the fp32 oracle (rtol 0.5, atol 2); allocated outputs,
    3-D input, the float4 / float8 dtypes FlashInfer returns."""
    torch.manual_seed(bs)
    for shape in [(1, 4096), (19, 3072), (4, 37, 2048), (99, 16384), (3, 20000 if bs == 16 else 20000 - 32)]:
        H = shape[-1]
        x = torch.randn(*shape, device="cuda").to(bf16)
        w = torch.randn(H, device="cuda").to(bf16)
        gs = torch.tensor([0.7], device="cuda") if fmt == "e4m3" else None
        y, s = mod.rmsnorm_fp4quant(x, w, global_scale=gs, block_size=bs, scale_format=fmt,
                                    is_sf_swizzled_layout=swizzled)
        assert y.shape == (*shape[:-1], H // 2)
        rows = x.numel() // H
        params = {"block_size": bs, "scale_format": fmt, "swizzled": swizzled}
        deq = _dequantized(y.cpu(), s.cpu(), params, rows, H, None if gs is None else 0.7)
        torch.testing.assert_close(deq, mod.normalized(x, w, 1e-6).cpu().view(rows, H), rtol=0.5, atol=2.0)


@gpu
def test_gpu_compile_and_graph():
    x = torch.randn(8, 4096, device="cuda").to(bf16)
    w = torch.randn(4096, device="cuda").to(bf16)
    y0, s0 = mod.rmsnorm_fp4quant(x, w, is_sf_swizzled_layout=True)
    y1, s1 = torch.compile(lambda a, b: mod.rmsnorm_fp4quant(a, b, is_sf_swizzled_layout=True), fullgraph=True)(x, w)
    assert torch.equal(y0, y1) and torch.equal(s0.view(torch.uint8), s1.view(torch.uint8))
    y, s = torch.empty_like(y0), torch.empty_like(s0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.rmsnorm_fp4quant(x, w, y, s, is_sf_swizzled_layout=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y0) and torch.equal(s.view(torch.uint8), s0.view(torch.uint8))


def test_harness_wiring_on_cpu():
    """The comparators and reference keys the harness combines: a launch writing the oracle's own outputs passes."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, M, H, **cfg):
        x = torch.randn(M, H).to(getattr(torch, dtype))
        y, sf = _fp4_rows.new_outputs((M,), H, M, 16, "e4m3", bool(cfg.get("swizzled")), "cpu")
        return {"input": x, "weight": torch.randn(H).to(x.dtype), "global_scale": None, "eps": 1e-6,
                "block_size": 16, "scale_format": "e4m3", "is_sf_swizzled_layout": bool(cfg.get("swizzled")),
                "y_fp4": y, "block_scale": sf}

    def launch(cfg, data):
        want = mod.reference(**data)
        data["y_fp4"].copy_(want["y_fp4"])
        data["block_scale"].copy_(want["block_scale"])

    fake = types.SimpleNamespace(**{k: getattr(mod, k) for k in ("KERNEL_META", "COMPARATORS", "reference")},
                                 prepare_data=prepare_data, launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"dtype": "bfloat16", "M": 5, "H": 64}, {"dtype": "float16", "M": 3, "H": 80, "swizzled": True}):
        assert harness.check_config(fake, cfg)["status"] == "passed"
