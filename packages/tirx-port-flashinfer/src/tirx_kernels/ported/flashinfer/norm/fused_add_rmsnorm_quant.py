# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's fused_add_rmsnorm_quant.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/norm (fused_add_rmsnorm_quant;
# the CuTe-DSL FusedAddRMSNormQuantKernel in flashinfer/norm/kernels/fused_add_rmsnorm.py), release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx: same arithmetic order, different structure.
"""``residual <- input + residual`` (in place, rounded once to the dtype), then ``out <- sat_fp8(h * rsqrt(mean(h**2)
+ eps) * w * (1 / scale))`` with ``h`` the *unrounded* fp32 sum (as upstream, which normalizes the sum it keeps in
registers, not the stored residual). input is read only; out is FP8 e4m3 or e5m2 (its dtype).

The kernels are ``rmsnorm``'s row kernels with the residual and FP8 out (``rmsnorm_quant`` for the FP8 conventions):
the specialized one per (dtype, H) at the catalog sizes for e4m3 out (rows and weight on 16 bytes, out rows on 8),
the general one for every other call: any H, any row strides of input, residual and out; long rows with few of them
take the split two-phase path, whose second phase writes the residual (the first only reads).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.ported.flashinfer.norm import rmsnorm as rows
from tirx_kernels.ported.flashinfer.norm import rmsnorm_quant as quant

KERNEL_META = {
    "name": "flashinfer_fused_add_rmsnorm_quant",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "In-place residual add + RMSNorm into FP8 e4m3/e5m2 (device scale), bf16/fp16, any H / strides",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["fused_add_rmsnorm_quant"],
}

CONFIGS = [
    {"label": "bf16_e4m3_989x4096", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn",
     "M": 989, "H": 4096, "scale": 1.0},
    {"label": "bf16_e4m3_19x8192_s10", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn",
     "M": 19, "H": 8192, "scale": 10.0},
    {"label": "fp16_e4m3_1x16384_s001", "dtype": "float16", "out_dtype": "float8_e4m3fn",
     "M": 1, "H": 16384, "scale": 0.01},
    {"label": "bf16_e5m2_99x1024", "dtype": "bfloat16", "out_dtype": "float8_e5m2", "M": 99, "H": 1024, "scale": 1.0},
    {"label": "fp16_e5m2_99x3072_s001", "dtype": "float16", "out_dtype": "float8_e5m2",
     "M": 99, "H": 3072, "scale": 0.01},
    {"label": "bf16_e4m3_19x500", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 19, "H": 500, "scale": 1.0},
    {"label": "fp16_e4m3_989x111_s10", "dtype": "float16", "out_dtype": "float8_e4m3fn",
     "M": 989, "H": 111, "scale": 10.0},
    {"label": "bf16_e5m2_989x16384_s10", "dtype": "bfloat16", "out_dtype": "float8_e5m2",
     "M": 989, "H": 16384, "scale": 10.0},
    {"label": "bf16_e4m3_19x4096_strided", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 19, "H": 4096,
     "scale": 1.0, "input_row_stride": 4608, "residual_row_stride": 4160, "out_row_stride": 4104},
    {"label": "bf16_e4m3_3x65536_split", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn",
     "M": 3, "H": 65536, "scale": 1.0},
    {"label": "fp16_e4m3_37x2880", "dtype": "float16", "out_dtype": "float8_e4m3fn", "M": 37, "H": 2880,
     "scale": 10.0},
    {"label": "bf16_e4m3_99x4096_general", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 99, "H": 4096,
     "scale": 1.0, "schedule": "general"},
]

BENCH_CONFIGS = [
    {"label": "bf16_e4m3_32x4096", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 32, "H": 4096, "scale": 1.0},
    {"label": "bf16_e4m3_64x8192", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 64, "H": 8192, "scale": 1.0},
    {"label": "bf16_e4m3_8192x4096", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn",
     "M": 8192, "H": 4096, "scale": 1.0},
    # The general kernel at the same rows (what an H missing from a bundle, or an unaligned row, costs).
    {"label": "bf16_e4m3_32x4096_general", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 32, "H": 4096,
     "scale": 1.0, "schedule": "general"},
    {"label": "bf16_e4m3_64x8192_general", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "M": 64, "H": 8192,
     "scale": 1.0, "schedule": "general"},
    {"label": "bf16_e4m3_8192x4096_general", "dtype": "bfloat16", "out_dtype": "float8_e4m3fn",
     "M": 8192, "H": 4096, "scale": 1.0, "schedule": "general"},
]

DEFAULTS = {"dtype": "bfloat16", "out_dtype": "float8_e4m3fn", "eps": 1e-6, "scale": 1.0}

# residual is overwritten with the sum (PROTOCOL.md, INPLACE); out is an ordinary output.
INPLACE = {"residual": "residual"}

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_FP8_NAMES = {v[0]: k for k, v in rows.FP8.items()}


# The params are rmsnorm_quant's: one general kernel per (dtype, out_dtype), e4m3 specialized at the catalog sizes.
compile_params = quant.compile_params
general_params = quant.general_params
artifact_params = quant.artifact_params
call_samples = quant.call_samples


def sass_expect(schedule: str | None = None, **_) -> list[str]:
    """16-byte loads, 8-byte FP8 stores, the FP8 conversion; the general kernel also a row's byte-wise ends."""
    if schedule == "general":
        return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.128", r"STG\.E\.64", r"STG\.E\.U8", r"F2FP"]
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.128", r"STG\.E\.64", r"F2FP"]


def get_kernel(dtype: str, out_dtype: str = "float8_e4m3fn", H: int | None = None, schedule: str | None = None,
               pdl: str | None = rows.PDL):
    if dtype not in _DTYPES:
        raise ValueError(f"fused_add_rmsnorm_quant: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    return rows.rows_kernel(dtype, False, residual=True, out_dtype=out_dtype, H=H, schedule=schedule, pdl=pdl)


# ---------------------------------------------------------------------------------------------------------
# Protocol
# ---------------------------------------------------------------------------------------------------------

def prepare_data(dtype: str, M: int, H: int, out_dtype: str = "float8_e4m3fn", scale: float = 1.0,
                 eps: float = 1e-6, input_row_stride: int | None = None, residual_row_stride: int | None = None,
                 out_row_stride: int | None = None, **_) -> dict:
    g = rows.generator()
    t = _DTYPES[dtype]
    out = torch.empty(M, out_row_stride or H, device="cuda", dtype=rows.FP8[out_dtype][0])[:, :H]
    return {"out": out, "input": rows.random_rows(M, H, input_row_stride, t, g),
            "residual": rows.random_rows(M, H, residual_row_stride, t, g),
            "weight": torch.randn(H, generator=g, device="cuda", dtype=torch.float32).to(t),
            "scale": torch.tensor([scale], device="cuda", dtype=torch.float32), "eps": eps}


def reference(out, input, residual, weight, scale, eps, **_) -> dict:  # noqa: A002
    """fp32 oracle: the residual is the sum rounded to the dtype; out normalizes the unrounded sum."""
    h = input.float() + residual.float()
    return {"out": quant.quantized(rows.normalized(h, weight, eps, False), scale, out.dtype),
            "residual": h.to(residual.dtype).float()}


def launch(cfg: dict, data: dict) -> None:
    if cfg.get("schedule") == "general":  # the general kernel where the public op would pick the specialized one
        _run(data["out"], data["input"], data["residual"], data["weight"], data["scale"], float(data["eps"]),
             general=True)
        return
    fused_add_rmsnorm_quant(data["out"], data["input"], data["residual"], data["weight"], data["scale"], data["eps"])


def roofline(dtype: str, M: int, H: int, **_) -> dict:
    return {"bytes": M * H * 2 * 3 + M * H + H * 2, "flops": 6 * M * H}


def get_baselines(**cfg) -> dict:
    """Baselines get a copy of the residual (they work in place too) and return both results."""
    def _torch_fn(out, x, r, w, scale, eps):
        h = x.float() + r.float()
        return quant.quantized(rows.normalized(h, w, eps, False), scale, out.dtype).to(out.dtype), h.to(r.dtype)

    def wrap(fn):
        return lambda d: dict(zip(("out", "residual"), fn(d["out"], d["input"], d["residual"], d["weight"],
                                                          d["scale"], d["eps"])))

    def torch_eager():
        return wrap(_torch_fn)

    def torch_compile():
        return wrap(torch.compile(_torch_fn, dynamic=False))

    def flashinfer():
        import flashinfer.norm

        def fn(d):
            out = torch.empty(d["out"].shape, dtype=d["out"].dtype, device="cuda")
            res = d["residual"].contiguous()
            flashinfer.norm.fused_add_rmsnorm_quant(out, d["input"].contiguous(), res, d["weight"], d["scale"],
                                                    d["eps"])
            return {"out": out, "residual": res}
        return fn

    return {"torch": torch_eager, "torch.compile": torch_compile, "flashinfer": flashinfer}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

def _check_inputs(op: str, out, input, residual, weight, scale, eps) -> None:  # noqa: A002
    checks.tensor(op, "input", input, dtypes=tuple(_DTYPES.values()), ndim=tuple(range(1, 9)), cuda=False)
    H = input.shape[-1]
    checks.in_range(op, "input", H, 1, rows.MAX_H)
    checks.tensor(op, "residual", residual, shape=tuple(input.shape), cuda=False)
    checks.tensor(op, "weight", weight, shape=(H,), cuda=False)
    checks.same_dtype(op, "input", input, residual=residual, weight=weight)
    quant.check_scale(op, scale)
    rows.check_eps(op, eps)
    rows.check_rows(op, "input", input, copy_ok=True)
    rows.check_rows(op, "residual", residual)
    quant.check_out(op, out, input)
    checks.tensor(op, "input", input, cuda=True)
    checks.same_device(op, "input", input, residual=residual, weight=weight, out=out)


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(out, input, residual, weight, scale, eps: float, general: bool = False) -> None:  # noqa: A002
    H = input.shape[-1]
    x2d = rows.unit_columns(input.reshape(-1, H))
    r2d = rows.unit_columns(residual.view(-1, H))
    y2d = rows.unit_columns(out.view(-1, H).view(torch.uint8))
    weight = weight if weight.stride(0) == 1 else weight.as_strided((H,), (1,))
    if x2d.shape[0] == 0:
        return
    dtype, out_dtype = str(input.dtype)[6:], _FP8_NAMES[out.dtype]
    general = general or rows.uses_general(x2d, r2d, weight, y2d)
    fn = _FUNCTIONS.get((input.dtype, out.dtype, None if general else H, input.get_device()),
                        lambda: general_params({"dtype": dtype, "out_dtype": out_dtype}) if general
                        else compile_params(dtype=dtype, out_dtype=out_dtype, H=H), input.device)
    rows.run_rows(fn, x2d, r2d, weight, y2d, scale, eps, general)


@torch.library.custom_op("tirx::flashinfer_fused_add_rmsnorm_quant", mutates_args=("out", "residual"))
def _fused_add_rmsnorm_quant_op(out: torch.Tensor, input: torch.Tensor, residual: torch.Tensor,  # noqa: A002
                                weight: torch.Tensor, scale: torch.Tensor, eps: float) -> None:
    _run(out, input, residual, weight, scale, eps)


@_fused_add_rmsnorm_quant_op.register_fake
def _(out, input, residual, weight, scale, eps):  # noqa: A002
    return None


def fused_add_rmsnorm_quant(out: torch.Tensor, input: torch.Tensor, residual: torch.Tensor,  # noqa: A002
                            weight: torch.Tensor, scale, eps: float = 1e-6, enable_pdl: bool | None = None) -> None:
    """In place: ``residual <- input + residual`` (rounded), ``out <- sat(rmsnorm(input + residual) * weight /
    scale)`` in FP8 (out's dtype, e4m3/e5m2). input, residual (..., H) bf16/fp16 with any row strides, weight (H,),
    scale a (1,) fp32 tensor or a float. ``enable_pdl``: FlashInfer's argument, accepted; the kernel always
    launches as a programmatic dependent."""
    op = "fused_add_rmsnorm_quant"
    _check_inputs(op, out, input, residual, weight, scale, eps)
    scale = quant.scale_tensor(op, scale, input)
    checks.same_device(op, "input", input, scale=scale)
    if runtime.direct_call(out, input, residual, weight, scale):
        _run(out, input, residual, weight, scale, float(eps))
        runtime.mark_written(out)
        runtime.mark_written(residual)
        return
    _fused_add_rmsnorm_quant_op(out, input, residual, weight, scale, float(eps))


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
