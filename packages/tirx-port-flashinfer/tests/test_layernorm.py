# SPDX-License-Identifier: Apache-2.0
"""flashinfer_layernorm: params resolution against the bundle, input validation, both kernels' generated CUDA run on
the CPU (``core.emulate``: every row against the fp32 oracle, a large mean, strided and unaligned views, nothing
outside ``out``'s rows written, every access inside its allocation, 16-byte accesses aligned), SASS; on a GPU, the
harness's checks of every config, views at every alignment, torch.compile and FlashInfer."""

import random
import re

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import layernorm as mod

bf16 = torch.bfloat16
f32 = torch.float32


# ------------------------------------------------------------------------------------------------ params

def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    rng = random.Random(0)
    sizes = set(range(1, 300)) | {rng.randrange(1, 70000) for _ in range(300)} | set(model_dims.hidden_sizes())
    for H in sorted(sizes):
        for general in (False, True):
            params = mod.compile_params(H=H, **({"schedule": "general"} if general else {}))
            cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, params)]
            assert bundled & set(cands), (H, cands)


def test_compile_params():
    assert mod.compile_params(dtype="bfloat16", H=4096, M=3) == {"H": 4096}
    assert mod.compile_params(H=129) == mod.compile_params(H=8) == mod.compile_params(H=16392) == \
        {"schedule": "general"}
    assert mod.compile_params(H=1024, schedule="general") == {"schedule": "general"}
    assert {"H": 3072} in mod.artifact_params()
    with pytest.raises(ValueError, match="takes H at run time"):
        mod.get_kernel(4096, schedule="general")
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.get_kernel(4095)


@pytest.mark.parametrize("H", [16, 24, 128, 256, 264, 1024, 3072, 4096, 4104, 5120, 8192, 16384])
def test_row_plan_covers_the_row(H):
    p = mod.row_plan(H)
    tpr, vpt = p["threads_per_row"], p["vectors_per_thread"]
    assert tpr * vpt * 8 >= H > (tpr * vpt - tpr) * 8  # only the last vector of a thread may fall past H
    assert tpr <= 32 and tpr & (tpr - 1) == 0 or tpr % 32 == 0
    assert tpr * p["rows_per_cta"] <= 1024 and vpt <= 4


def test_uses_general_where_a_row_or_vector_is_off_16_bytes():
    x = torch.zeros(4, 4104 * 2, dtype=bf16)[:, :4096]
    g = torch.zeros(4100)
    out = torch.zeros(4, 4096, dtype=bf16)
    assert not mod.uses_general(x, g[:4096], g[:4096], out)
    assert mod.uses_general(torch.zeros(4, 4104, dtype=bf16)[:, 1:4097], g[:4096], g[:4096], out)  # offset 1
    assert mod.uses_general(x, g[1:4097], g[:4096], out)
    assert mod.uses_general(x, g[:4096], g[2:4098], out)
    assert not mod.uses_general(x, g[:4096], g[4:4100], out)  # 16 bytes in
    assert mod.uses_general(torch.zeros(4, 4100, dtype=bf16)[:, :4096], g[:4096], g[:4096], out)  # row stride 4100
    assert mod.uses_general(torch.zeros(4, 129, dtype=bf16), g[:129], g[:129], torch.zeros(4, 129, dtype=bf16))


# ------------------------------------------------------------------------------------------------ validation

def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, kw, arg", [
    ((_t(4, 64, dtype=torch.float16), _t(64, dtype=f32), _t(64, dtype=f32)), {}, "input"),
    ((_t(2, 4, 64), _t(64, dtype=f32), _t(64, dtype=f32)), {}, "input"),
    ((_t(4, 64), _t(64), _t(64, dtype=f32)), {}, "gemma"),
    ((_t(4, 64), _t(32, dtype=f32), _t(64, dtype=f32)), {}, "gemma"),
    ((_t(4, 64), _t(64, dtype=f32), _t(65, dtype=f32)), {}, "beta"),
    ((_t(64, 4).t(), _t(4, dtype=f32), _t(4, dtype=f32)), {}, "input"),
    ((_t(4, 0), _t(0, dtype=f32), _t(0, dtype=f32)), {}, "input"),
    ((_t(4, 64), _t(64, dtype=f32), _t(64, dtype=f32)), {"out": _t(4, 32)}, "out"),
    ((_t(4, 64), _t(64, dtype=f32), _t(64, dtype=f32)), {"out": _t(4, 64, dtype=f32)}, "out"),
    ((_t(4, 64), _t(64, dtype=f32), _t(64, dtype=f32)), {"eps": "x"}, "eps"),
    ((_t(4, 64), _t(64, dtype=f32), _t(64, dtype=f32)), {}, "input"),  # CPU tensors
])
def test_rejected_inputs_name_the_argument(args, kw, arg):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.layernorm(*args, **kw)


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_layernorm"
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    labels = [c["label"] for c in mod.CONFIGS + mod.BENCH_CONFIGS]
    assert len(set(c["label"] for c in mod.CONFIGS)) == len(mod.CONFIGS)
    assert {(M, H) for M in (1, 2, 3, 128) for H in (128, 129, 1024, 16384)} & {(c["M"], c["H"]) for c in
                                                                                 mod.CONFIGS}
    assert {128, 129, 1024, 16384} <= {c["H"] for c in mod.CONFIGS}
    assert {1, 2, 3, 128} <= {c["M"] for c in mod.CONFIGS}
    assert "bf16_8192x4096" in labels


# ------------------------------------------------------------------------------------------------ CPU emulation

def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a row group of < 32 lanes gets the same butterfly
    inline, over its own width."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate
    from tirx_kernels.core.build import codegen

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    cache = {}

    def get(params):
        key = artifacts.canonical_params(params)
        if key not in cache:
            cache[key] = emulate.compile(_narrow_warp_sums(codegen(mod.get_kernel(**params))))
        return cache[key]
    return get


def _grid(params, M):
    if params.get("schedule") == "general":
        return (M,), (mod.GENERAL_THREADS,)
    p = mod.row_plan(params["H"])
    return (-(-M // p["rows_per_cta"]),), (p["threads_per_row"] * p["rows_per_cta"],)


def _check(kern, params, M, H, x_off, xs, y_off, ys, g_off=0, b_off=0, mean=0.0):
    """The host code's launch (its grid; scalars by name) on buffers that end with their last element."""
    g = torch.Generator().manual_seed(M * 1000 + H)
    xb = (torch.randn(x_off + (M - 1) * xs + H, generator=g) * 3 + mean).to(bf16)
    yb = torch.full((y_off + (M - 1) * ys + H,), float("nan")).to(bf16)
    gb = torch.randn(g_off + H, generator=g)
    bb = torch.randn(b_off + H, generator=g)
    x = xb.as_strided((M, H), (xs, 1), x_off)
    y = yb.as_strided((M, H), (ys, 1), y_off)
    gamma, beta = gb[g_off:], bb[b_off:]
    xb0, gb0, bb0 = xb.clone(), gb.clone(), bb.clone()
    scalars = {"M": M, "H": H, "eps": 1e-6, "x_stride": xs, "y_stride": ys, "zero": 0}
    named = {p.name: {"X_ptr": x, "G_ptr": gamma, "Bt_ptr": beta, "Y_ptr": y}[p.name] if p.pointer
             else scalars[p.name] for p in kern.params}
    grid, block = _grid(params, M)
    kern(grid=grid, block=block, **named).check()
    want = mod.reference(x, gamma, beta, 1e-6)["out"]
    torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=1.6e-2)
    inside = torch.zeros_like(yb, dtype=torch.bool)
    inside.as_strided((M, H), (ys, 1), y_off).fill_(True)
    assert yb[~inside].isnan().all()
    assert torch.equal(xb, xb0) and torch.equal(gb, gb0) and torch.equal(bb, bb0)


@pytest.mark.parametrize("params, M, H, xs", [
    ({"H": 1024}, 3, 1024, 1032), ({"H": 128}, 9, 128, 128), ({"schedule": "general"}, 3, 129, 131),
    ({"schedule": "general"}, 2, 4097, 4097),
])
def test_in_place_emulated(emulated, params, M, H, xs):
    """out = input: every element is read by the thread that writes it, before it writes it (both kernels, both
    general paths)."""
    g = torch.Generator().manual_seed(H)
    xb = torch.randn((M - 1) * xs + H, generator=g).to(bf16)
    x = xb.as_strided((M, H), (xs, 1))
    gamma, beta = torch.randn(H, generator=g), torch.randn(H, generator=g)
    want = mod.reference(x.clone(), gamma, beta, 1e-6)["out"]
    xb0 = xb.clone()
    scalars = {"M": M, "H": H, "eps": 1e-6, "x_stride": xs, "y_stride": xs, "zero": 0}
    named = {p.name: {"X_ptr": x, "G_ptr": gamma, "Bt_ptr": beta, "Y_ptr": x}[p.name] if p.pointer
             else scalars[p.name] for p in emulated(params).params}
    grid, block = _grid(params, M)
    emulated(params)(grid=grid, block=block, **named).check()
    torch.testing.assert_close(x.float(), want, atol=2e-2, rtol=1.6e-2)
    gap = torch.ones_like(xb, dtype=torch.bool)
    gap.as_strided((M, H), (xs, 1)).fill_(False)
    assert torch.equal(xb[gap], xb0[gap])


@pytest.mark.parametrize("M, H, xs, ys", [
    (1, 128, 128, 128), (37, 128, 136, 128), (3, 1024, 1024, 1024), (5, 4096, 4608, 4096), (2, 16384, 16384, 16384),
    (3, 24, 24, 32), (9, 3072, 3072, 3080), (2, 5120, 5120, 5120), (17, 16, 16, 16),
])
def test_specialized_kernel_emulated(emulated, M, H, xs, ys):
    params = mod.compile_params(H=H)
    _check(emulated(params), params, M, H, 0, xs, 0, ys)


def test_specialized_kernel_large_mean_emulated(emulated):
    """Rows around 1000 with unit spread: E[x**2] - mean**2 would lose every digit of the variance in fp32."""
    params = mod.compile_params(H=1024)
    _check(emulated(params), params, 5, 1024, 0, 1024, 0, 1024, mean=1000.0)


@pytest.mark.parametrize("M, H, x_off, xs, y_off, ys, g_off, b_off", [
    (2, 1, 0, 1, 0, 1, 0, 0), (3, 129, 0, 129, 0, 129, 0, 0), (2, 129, 1, 131, 3, 129, 1, 3),
    (3, 500, 5, 503, 0, 500, 0, 0), (2, 20001, 0, 20001, 1, 20003, 2, 1), (4, 256, 0, 256, 0, 256, 0, 0),
    (3, 1024, 1, 1024, 0, 1024, 0, 0), (1, 7, 3, 7, 7, 7, 3, 2),
    # the rows held in registers end at 4096: both sides
    (2, 4095, 0, 4095, 0, 4095, 0, 0), (2, 4096, 1, 4097, 0, 4096, 1, 0), (2, 4097, 1, 4100, 0, 4097, 0, 0),
])
def test_general_kernel_emulated(emulated, M, H, x_off, xs, y_off, ys, g_off, b_off):
    params = mod.general_params({})
    _check(emulated(params), params, M, H, x_off, xs, y_off, ys, g_off, b_off)


def test_general_kernel_large_mean_emulated(emulated):
    params = mod.general_params({})
    _check(emulated(params), params, 3, 777, 0, 777, 0, 777, mean=-1000.0)


@pytest.mark.parametrize("params", [{"H": 4096}, {"H": 128}, {"H": 16384}, {"schedule": "general"}])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_layernorm", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("H", [1, 7, 8, 16, 128, 129, 500, 1024, 3072, 4095, 4096, 16384, 16392])
def test_gpu_any_alignment_and_stride(H):
    """input and out as views at element offsets 0..7 in NaN-padded rows, gamma and beta at float offsets: the oracle
    where out is, the padding untouched, the functional form too."""
    torch.manual_seed(H)
    M = 33
    gb = torch.randn(H + 3, device="cuda")
    bb = torch.randn(H + 3, device="cuda")
    for x_off, x_pad, y_off, y_pad, w_off in [(0, 0, 0, 0, 0), (1, 3, 0, 0, 0), (0, 0, 3, 1, 1), (5, 7, 2, 9, 2),
                                              (8, 8, 8, 8, 0), (0, 0, 0, 0, 3)]:
        gamma, beta = gb[w_off:w_off + H], bb[w_off:w_off + H]
        xb = torch.full((M, x_off + H + x_pad), float("nan"), device="cuda", dtype=bf16)
        x = xb[:, x_off:x_off + H]
        x.copy_(torch.randn(M, H, device="cuda") * 2 + 5)
        yb = torch.full((M, y_off + H + y_pad), float("nan"), device="cuda", dtype=bf16)
        y = yb[:, y_off:y_off + H]
        want = mod.reference(x, gamma, beta, 1e-6)["out"]
        assert mod.layernorm(x, gamma, beta, 1e-6, out=y) is y
        torch.cuda.synchronize()
        torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=1.6e-2)
        pad = torch.ones_like(yb, dtype=torch.bool)
        pad[:, y_off:y_off + H] = False
        assert yb[pad].isnan().all(), (x_off, y_off)
        torch.testing.assert_close(mod.layernorm(x, gamma, beta).float(), want, atol=2e-2, rtol=1.6e-2)


@gpu
def test_gpu_matches_flashinfer_and_compile():
    x = torch.randn(19, 4096, device="cuda").to(bf16)
    g = torch.randn(4096, device="cuda")
    b = torch.randn(4096, device="cuda")
    got = torch.compile(lambda a, c, d: mod.layernorm(a, c, d), fullgraph=True)(x, g, b)
    torch.testing.assert_close(got.float(), mod.reference(x, g, b, 1e-6)["out"], atol=2e-2, rtol=1.6e-2)
    assert mod.layernorm(torch.empty(0, 64, device="cuda", dtype=bf16), g[:64], b[:64]).shape == (0, 64)
    flashinfer = pytest.importorskip("flashinfer")
    for M, H in [(1, 128), (2, 129), (3, 1024), (128, 16384), (99, 4096)]:
        x = torch.randn(M, H, device="cuda").to(bf16)
        g = torch.randn(H, device="cuda")
        b = torch.randn(H, device="cuda")
        torch.testing.assert_close(mod.layernorm(x, g, b), flashinfer.norm.layernorm(x, g, b, 1e-6), atol=1e-2,
                                   rtol=1e-2)


def test_harness_wiring_on_cpu():
    """The protocol pieces the harness combines (reference keys, the out= launch into a poisoned tensor) on CPU."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(M, H, eps=1e-6, input_row_stride=None, **_):
        return {"input": torch.randn(M, input_row_stride or H).to(bf16)[:, :H], "gemma": torch.randn(H),
                "beta": torch.randn(H), "eps": eps, "out": torch.full((M, H), float("nan"), dtype=bf16)}

    def launch(cfg, data):
        data["out"].copy_(mod.reference(**data)["out"])

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, reference=mod.reference, prepare_data=prepare_data,
                                 launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"dtype": "bfloat16", "M": 3, "H": 129}, {"dtype": "bfloat16", "M": 5, "H": 64,
                                                          "input_row_stride": 72}):
        assert harness.check_config(fake, cfg)["status"] == "passed"
