# SPDX-License-Identifier: Apache-2.0
"""flashinfer_fused_add_rmsnorm_quant: params and bundle coverage, validation, the row kernel with the residual and
FP8 out run on the CPU (emulated: the residual bit-exact, codes against the oracle, input untouched, nothing
outside the rows written, at odd H, misaligned and strided rows, split long rows); on a GPU, every config through
the harness, FlashInfer's residual bit for bit and its codes."""

import importlib.util
from pathlib import Path

import pytest
import torch

from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import fused_add_rmsnorm_quant as mod


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


emu = _load("test_flashinfer_rmsnorm")
qt = _load("test_rmsnorm_quant")

bf16 = torch.bfloat16


# Its params (compile_params, artifact_params, call_samples) are rmsnorm_quant's: tested there for both modules.


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_fused_add_rmsnorm_quant"
    for table in (mod.CONFIGS, mod.BENCH_CONFIGS):
        labels = [c["label"] for c in table]
        assert len(labels) == len(set(labels))
    assert {c["scale"] for c in mod.CONFIGS} == {0.01, 1.0, 10.0}
    assert mod.INPLACE == {"residual": "residual"}


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


_OUT = _t(4, 64, dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("args, arg", [
    ((_OUT, _t(4, 64, dtype=torch.float32), _t(4, 64), _t(64), 1.0), "input"),
    ((_OUT, _t(4, 64), _t(4, 32), _t(64), 1.0), "residual"),
    ((_OUT, _t(4, 64), _t(4, 64, dtype=torch.float16), _t(64), 1.0), "residual"),
    ((_OUT, _t(4, 64), _t(64, 4).t(), _t(64), 1.0), "residual"),
    ((_t(4, 64), _t(4, 64), _t(4, 64), _t(64), 1.0), "out"),
    ((_OUT, _t(4, 64), _t(4, 64), _t(64), None), "scale"),
    ((_OUT, _t(4, 64), _t(4, 64), _t(64), 1.0), "input"),  # CPU tensors
])
def test_rejected_inputs_name_the_argument(args, arg):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.fused_add_rmsnorm_quant(*args)


@pytest.fixture(scope="module")
def emulated():
    return emu.emulated_rows()


@pytest.mark.parametrize("out_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("M, H, x, r, y, w_off, scale", [
    (5, 128, (0, None), (0, None), (0, None), 0, 1.0), (3, 4096, (0, 4608), (0, 4160), (0, 4104), 0, 10.0),
    (19, 111, (3, 113), (0, 111), (0, None), 5, 0.01), (7, 3, (1, 5), (2, 3), (1, 4), 1, 1.0),
    (2, 4096, (0, None), (1, 4097), (0, None), 0, 1.0),  # residual rows off 16 bytes: element-wise
    (3, 4095, (0, None), (0, None), (0, None), 0, 1.0),
    (3, 24576, (0, None), (0, None), (0, None), 0, 1.0), (2, 20001, (1, 20003), (3, 20001), (0, None), 2, 10.0),
])
def test_rows_emulated(emulated, out_dtype, M, H, x, r, y, w_off, scale):
    kern = emulated("bfloat16", False, residual=True, out_dtype=out_dtype)
    res = emu.run_rows_emulated(kern, M, H, residual=True, out_dtype=out_dtype, scale=scale, x=x, r=r, y=y,
                                w_off=w_off)
    qt.check_codes(res, out_dtype, scale)
    torch.testing.assert_close(res["r"].float(), res["want"]["residual"], atol=0, rtol=0)
    emu.check_untouched(res, M, H, True)


@pytest.mark.parametrize("out_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("M, H, x, r, y", [
    (5, 128, (0, None), (0, None), (0, None)), (37, 128, (8, 136), (0, 144), (8, 136)),
    (3, 4096, (0, 4608), (0, 4160), (0, 4104)), (2, 2880, (0, None), (0, None), (0, None)),
    (1, 16384, (0, None), (0, None), (0, None)),
])
def test_specialized_rows_emulated(emulated, out_dtype, M, H, x, r, y):
    kern = emulated("bfloat16", False, residual=True, out_dtype=out_dtype, H=H)
    res = emu.run_rows_emulated(kern, M, H, residual=True, out_dtype=out_dtype, scale=10.0, x=x, r=r, y=y,
                                specialized=True)
    qt.check_codes(res, out_dtype, 10.0)
    torch.testing.assert_close(res["r"].float(), res["want"]["residual"], atol=0, rtol=0)
    emu.check_untouched(res, M, H, True)


def test_rows_emulated_fp16(emulated):
    kern = emulated("float16", False, residual=True, out_dtype="float8_e4m3fn")
    res = emu.run_rows_emulated(kern, 3, 77, dtype=torch.float16, residual=True, out_dtype="float8_e4m3fn",
                                x=(1, 80), r=(0, 77))
    qt.check_codes(res, "float8_e4m3fn", 1.0, torch.float16)
    torch.testing.assert_close(res["r"].float(), res["want"]["residual"], atol=0, rtol=0)
    emu.check_untouched(res, 3, 77, True)


@pytest.mark.parametrize("params", [{"dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "schedule": "general"},
                                    {"dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "H": 4096}])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_fused_add_rmsnorm_quant", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("out_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("M, H", [(1, 4096), (19, 111), (99, 1024), (989, 8192)])
def test_gpu_matches_flashinfer(out_dtype, M, H):
    flashinfer = pytest.importorskip("flashinfer")
    x = torch.randn(M, H, device="cuda").to(bf16)
    r = torch.randn(M, H, device="cuda").to(bf16)
    w = torch.randn(H, device="cuda").to(bf16)
    scale = torch.tensor([1.0], device="cuda")
    ours, theirs = torch.empty(M, H, device="cuda", dtype=out_dtype), torch.empty(M, H, device="cuda", dtype=out_dtype)
    r1, r2 = r.clone(), r.clone()
    mod.fused_add_rmsnorm_quant(ours, x, r1, w, scale)
    flashinfer.norm.fused_add_rmsnorm_quant(theirs, x, r2, w, scale)
    torch.testing.assert_close(r1, r2, atol=0, rtol=0)
    diff = (ours.view(torch.uint8).int() - theirs.view(torch.uint8).int()).abs()
    assert (diff == 0).float().mean() > 0.999 and diff.max() <= 1


def test_harness_wiring_on_cpu():
    """The protocol pieces the harness combines (INPLACE, reference keys, FP8 out) on CPU: a launch that writes the
    oracle's values, through the harness's guarded copies of residual and out."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, M, H, out_dtype="float8_e4m3fn", scale=1.0, eps=1e-6, **_):
        t = getattr(torch, dtype)
        return {"out": torch.empty(M, H, dtype=getattr(torch, out_dtype)), "input": torch.randn(M, H).to(t),
                "residual": torch.randn(M, H).to(t), "weight": torch.randn(H).to(t),
                "scale": torch.tensor([scale]), "eps": eps}

    def launch(cfg, data):
        want = mod.reference(**data)
        data["residual"].copy_(want["residual"])
        data["out"].copy_(want["out"])

    fake = types.SimpleNamespace(**{k: getattr(mod, k) for k in ("KERNEL_META", "INPLACE", "reference")},
                                 prepare_data=prepare_data, launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"dtype": "bfloat16", "M": 5, "H": 64, "scale": 10.0},
                {"dtype": "float16", "M": 3, "H": 111, "out_dtype": "float8_e5m2", "scale": 0.01}):
        assert harness.check_config(fake, cfg)["status"] == "passed"


@gpu
@pytest.mark.parametrize("label", ["bf16_e4m3_19x500", "bf16_e4m3_3x65536_split"])
def test_gpu_graph_replay(label):
    """Captured in a CUDA graph (the split rows' two launches and workspace too), replayed on new inputs."""
    from tirx_kernels.core import testing

    testing.check_graph_replay("flashinfer_fused_add_rmsnorm_quant", label)
