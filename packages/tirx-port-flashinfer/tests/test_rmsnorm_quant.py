# SPDX-License-Identifier: Apache-2.0
"""flashinfer_rmsnorm_quant: params and bundle coverage, validation, the FP8 row kernel run on the CPU (emulated, with
exact RNE/satfinite stand-ins for the FP8 cvt: codes against the oracle rounded by torch, at odd H, misaligned and
strided rows, split long rows); on a GPU, every config through the harness, raw bytes against FlashInfer."""

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import fused_add_rmsnorm_quant as fused_mod
from tirx_kernels.ported.flashinfer.norm import rmsnorm_quant as mod

_spec = importlib.util.spec_from_file_location("_rms_emu", Path(__file__).with_name("test_flashinfer_rmsnorm.py"))
emu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(emu)

bf16 = torch.bfloat16
FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


# fused_add_rmsnorm_quant takes rmsnorm_quant's params: both modules answer the same.
BOTH = pytest.mark.parametrize("m", [mod, fused_mod], ids=["rmsnorm_quant", "fused_add_rmsnorm_quant"])


@BOTH
def test_every_call_resolves_to_a_bundled_artifact(m):
    bundled = {artifacts.canonical_params(p) for p in m.artifact_params()}
    for call in m.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(m, m.compile_params(**call))]
        assert bundled & set(cands), call
    for cfg in m.CONFIGS + m.BENCH_CONFIGS:  # build --all adds the configs' own params (e5m2 at 1024 here)
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(m, m.compile_params(**cfg))]
        assert bundled & set(cands), cfg


@BOTH
def test_compile_params(m):
    e4 = "float8_e4m3fn"
    assert m.compile_params(dtype="bfloat16", H=4096) == {"dtype": "bfloat16", "out_dtype": e4, "H": 4096}
    general = {"dtype": "float16", "out_dtype": "float8_e5m2", "schedule": "general"}
    for H in (4095, 8, 16392, 1048576):
        assert m.compile_params(dtype="float16", out_dtype="float8_e5m2", H=H) == general
    assert m.compile_params(dtype="float16", out_dtype="float8_e5m2", H=4096, schedule="general") == general
    assert m.general_params({"dtype": "float16", "out_dtype": "float8_e5m2", "H": 4096}) == general
    # the bundle: e4m3 out specialized at every catalog size, e5m2 through the general kernel
    assert {"dtype": "bfloat16", "out_dtype": e4, "H": 4096} in m.artifact_params()
    assert {"dtype": "bfloat16", "out_dtype": "float8_e5m2", "H": 4096} not in m.artifact_params()
    with pytest.raises(ValueError, match="multiple of 8"):
        m.get_kernel("bfloat16", e4, H=4095)


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_rmsnorm_quant"
    for table in (mod.CONFIGS, mod.BENCH_CONFIGS):
        labels = [c["label"] for c in table]
        assert len(labels) == len(set(labels))
    assert {c["scale"] for c in mod.CONFIGS} == {0.01, 1.0, 10.0}
    assert {c["out_dtype"] for c in mod.CONFIGS} == set(FP8)
    assert max(c["H"] for c in mod.CONFIGS) == 1048576


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, arg", [
    ((_t(4, 64, dtype=torch.float8_e4m3fn), _t(4, 64, dtype=torch.float32), _t(64), 1.0), "input"),
    ((_t(4, 64), _t(4, 64), _t(64), 1.0), "out"),
    ((_t(4, 32, dtype=torch.float8_e5m2), _t(4, 64), _t(64), 1.0), "out"),
    ((_t(4, 64, dtype=torch.float8_e4m3fn), _t(4, 64), _t(32), 1.0), "weight"),
    ((_t(4, 64, dtype=torch.float8_e4m3fn), _t(4, 64), _t(64), "1"), "scale"),
    ((_t(4, 64, dtype=torch.float8_e4m3fn), _t(4, 64), _t(64), 1.0), "input"),  # CPU tensors
])
def test_rejected_inputs_name_the_argument(args, arg):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.rmsnorm_quant(*args)


def test_scale_forms():
    like = _t(2, 8)
    assert mod.scale_tensor("op", 2.5, like).tolist() == [2.5]
    assert mod.scale_tensor("op", torch.tensor(3.0), like).shape == (1,)
    with pytest.raises(TirxInputError, match="argument 'scale'"):
        mod.scale_tensor("op", torch.ones(2), like)
    with pytest.raises(TirxInputError, match="argument 'scale'"):
        mod.scale_tensor("op", torch.ones(1, dtype=torch.float16), like)


# ------------------------------------------------------------------------------------------------ CPU emulation

@pytest.fixture(scope="module")
def emulated():
    return emu.emulated_rows()


def check_codes(res, out_dtype: str, scale: float, dtype=bf16):
    """The codes against the oracle rounded by torch: equal but for rare one-ulp differences (products rounded in
    another order than the fp32 oracle's), none past one ulp."""
    t = FP8[out_dtype]
    got = res["y"].view(t).float()
    want = mod.quantized(res["want"]["out"], torch.tensor([scale]), t)
    want_codes = want.to(t).float()
    tol = 0.13 if t == torch.float8_e4m3fn else 0.26
    torch.testing.assert_close(got, want_codes, rtol=tol, atol=2.0**-9 if t == torch.float8_e4m3fn else 2.0**-16)
    assert (got == want_codes).float().mean() > 0.99


@pytest.mark.parametrize("out_dtype", list(FP8))
@pytest.mark.parametrize("M, H, x, y, w_off, scale, sms", [
    (5, 128, (0, None), (0, None), 0, 1.0, 132), (3, 4096, (0, 4608), (0, 4104), 0, 10.0, 132),
    (19, 111, (3, 113), (0, None), 5, 0.01, 132), (2, 500, (0, 503), (1, 500), 0, 1.0, 132),
    (7, 3, (1, 5), (2, 3), 1, 1.0, 132), (3, 4095, (0, None), (0, None), 0, 0.01, 132),
    (2, 4096, (0, None), (4, 4100), 0, 1.0, 132),  # out rows off 8 bytes: bytes one by one
    (3, 24576, (0, None), (0, None), 0, 1.0, 132), (2, 20001, (1, 20003), (0, None), 0, 10.0, 132),
])
def test_rows_emulated(emulated, out_dtype, M, H, x, y, w_off, scale, sms):
    kern = emulated("bfloat16", False, out_dtype=out_dtype)
    res = emu.run_rows_emulated(kern, M, H, out_dtype=out_dtype, scale=scale, x=x, y=y, w_off=w_off, sm_count=sms)
    check_codes(res, out_dtype, scale)
    emu.check_untouched(res, M, H, False)


@pytest.mark.parametrize("out_dtype", list(FP8))
@pytest.mark.parametrize("M, H, x, y, scale", [
    (5, 128, (0, None), (0, None), 1.0), (37, 128, (8, 136), (8, 136), 10.0),
    (3, 4096, (0, 4608), (0, 4104), 0.01), (2, 2880, (0, None), (0, None), 1.0),
    (1, 16384, (0, None), (0, None), 1.0),
])
def test_specialized_rows_emulated(emulated, out_dtype, M, H, x, y, scale):
    kern = emulated("bfloat16", False, out_dtype=out_dtype, H=H)
    res = emu.run_rows_emulated(kern, M, H, out_dtype=out_dtype, scale=scale, x=x, y=y, specialized=True)
    check_codes(res, out_dtype, scale)
    emu.check_untouched(res, M, H, False)


def test_specialized_matches_the_general_bytes(emulated):
    """Same arithmetic, expression for expression: the specialized kernel's codes equal the general one's."""
    args = dict(dtype=torch.float16, out_dtype="float8_e4m3fn", scale=0.5)
    got = emu.run_rows_emulated(emulated("float16", False, out_dtype="float8_e4m3fn", H=3584), 9, 3584,
                                specialized=True, **args)["y"]
    want = emu.run_rows_emulated(emulated("float16", False, out_dtype="float8_e4m3fn"), 9, 3584, **args)["y"]
    assert torch.equal(got, want)


def test_rows_emulated_fp16_saturates(emulated):
    """scale 0.001 pushes most values past e4m3's 448: saturated to +-448, never NaN."""
    kern = emulated("float16", False, out_dtype="float8_e4m3fn")
    res = emu.run_rows_emulated(kern, 3, 77, dtype=torch.float16, out_dtype="float8_e4m3fn", scale=0.001, x=(1, 80))
    check_codes(res, "float8_e4m3fn", 0.001, torch.float16)
    got = res["y"].view(torch.float8_e4m3fn).float()
    assert not got.isnan().any() and (got.abs() == 448).float().mean() > 0.3


@pytest.mark.parametrize("params", [{"dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "schedule": "general"},
                                    {"dtype": "float16", "out_dtype": "float8_e5m2", "schedule": "general"},
                                    {"dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "H": 4096},
                                    {"dtype": "float16", "out_dtype": "float8_e5m2", "H": 2880}])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_rmsnorm_quant", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("out_dtype", list(FP8))
@pytest.mark.parametrize("M, H", [(1, 4096), (19, 111), (99, 1024), (989, 8192), (3, 1048576)])
def test_gpu_bytes_match_flashinfer(out_dtype, M, H):
    """Raw bytes equal to FlashInfer's (same arithmetic order; a rare one-ulp difference from a different sum order
    of the statistics is allowed, none past it)."""
    flashinfer = pytest.importorskip("flashinfer")
    t = FP8[out_dtype]
    x = torch.randn(M, H, device="cuda").to(bf16)
    w = torch.randn(H, device="cuda").to(bf16)
    for s in (0.01, 1.0, 10.0):
        scale = torch.tensor([s], device="cuda")
        ours = torch.empty(M, H, device="cuda", dtype=t)
        theirs = torch.empty(M, H, device="cuda", dtype=t)
        mod.rmsnorm_quant(ours, x, w, scale)
        flashinfer.norm.rmsnorm_quant(theirs, x, w, scale)
        diff = (ours.view(torch.uint8).int() - theirs.view(torch.uint8).int()).abs()
        assert (diff == 0).float().mean() > 0.999 and diff.max() <= 1, (out_dtype, M, H, s)


@gpu
def test_gpu_strided_misaligned_and_float_scale():
    x = torch.randn(33, 4101, device="cuda").to(bf16)[:, 3:4099]
    w = torch.randn(4096, device="cuda").to(bf16)
    ob = torch.full((33, 4105), 0x5A, device="cuda", dtype=torch.uint8)
    out = ob[:, 1:4097].view(torch.float8_e4m3fn)
    mod.rmsnorm_quant(out, x, w, 2.0)
    want = mod.quantized(emu.mod.normalized(x.float(), w, 1e-6, False), torch.tensor([2.0], device="cuda"),
                         torch.float8_e4m3fn)
    torch.testing.assert_close(out.float(), want, rtol=0.13, atol=2.0**-9)
    assert (ob[:, 0] == 0x5A).all() and (ob[:, 4097:] == 0x5A).all()


def test_harness_wiring_on_cpu():
    """reference's keys and FP8 out through the harness's checks on CPU (a launch writing the oracle's values)."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, M, H, out_dtype="float8_e4m3fn", scale=1.0, eps=1e-6, **_):
        t = getattr(torch, dtype)
        return {"out": torch.empty(M, H, dtype=getattr(torch, out_dtype)), "input": torch.randn(M, H).to(t),
                "weight": torch.randn(H).to(t), "scale": torch.tensor([scale]), "eps": eps}

    def launch(cfg, data):
        data["out"].copy_(mod.reference(**data)["out"])

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, reference=mod.reference, prepare_data=prepare_data,
                                 launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"dtype": "bfloat16", "M": 5, "H": 64, "scale": 0.01},
                {"dtype": "float16", "M": 3, "H": 111, "out_dtype": "float8_e5m2", "scale": 10.0}):
        assert harness.check_config(fake, cfg)["status"] == "passed"


@gpu
@pytest.mark.parametrize("label", ["bf16_e4m3_989x4096", "bf16_e5m2_3x1048576"])
def test_gpu_graph_replay(label):
    """Captured in a CUDA graph (the split rows' two launches and workspace too), replayed on new inputs."""
    from tirx_kernels.core import testing

    testing.check_graph_replay("flashinfer_rmsnorm_quant", label)
