# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's add_rmsnorm_fp4quant (residual add, RMSNorm and NVFP4 / MXFP4 quantization in one pass).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), flashinfer/cute_dsl/add_rmsnorm_fp4quant.py
# (AddRMSNormFP4QuantKernel, add_rmsnorm_fp4quant) and flashinfer/cute_dsl/fp4_common.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). Written anew in TIRx for sm_90a on rmsnorm_fp4quant's row
# kernel (``rmsnorm_fp4quant.build_kernel(add=True)``).
"""``residual <- input + residual`` (in place, rounded once), then ``y = rmsnorm(residual) * w`` quantized as
``rmsnorm_fp4quant`` does (NVFP4 e4m3 / 16 with the optional global scale, or MXFP4 ue8m0 / 32; SF linear or
128x4 swizzled, the padding zero). Upstream's order: ``h = x + r`` in fp32 gives the sum of squares; the quantized
values are ``(h rounded to the dtype * rstd) * w`` in fp32 (no rounding of the product, unlike rmsnorm_fp4quant).

FlashInfer's extra outputs: ``output_both_sf_layouts`` writes the SF swizzled into ``block_scale`` and linear into
``block_scale_unswizzled`` (and returns both); ``y_out`` receives ``y`` rounded to the dtype. Each is a compile-time
specialization, as upstream. Input ``(M, H)`` or ``(B, S, H)``; residual the same shape, any 16-byte row strides.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime

from . import _fp4_rows
from . import rmsnorm_fp4quant as base

KERNEL_META = {
    "name": "flashinfer_add_rmsnorm_fp4quant",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Residual add + RMSNorm fused with NVFP4 / MXFP4 quantization (in-place residual, optional both SF "
                   "layouts and the normed bf16/fp16 output)",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},
    "public_ops": ["add_rmsnorm_fp4quant"],
}

CONFIGS = [
    {"label": "nv_bf16_m1_h4096", "dtype": "bfloat16", "M": 1, "H": 4096},
    {"label": "nv_bf16_m989_h8192_swz_gs", "dtype": "bfloat16", "M": 989, "H": 8192, "swizzled": True,
     "global_scale": 0.5},
    {"label": "nv_fp16_m19_h3072_both", "dtype": "float16", "M": 19, "H": 3072, "both": True},
    {"label": "nv_bf16_m99_h1024_yn", "dtype": "bfloat16", "M": 99, "H": 1024, "normed": True},
    {"label": "mx_bf16_m99_h4096_swz", "dtype": "bfloat16", "M": 99, "H": 4096, "block_size": 32, "swizzled": True},
    {"label": "mx_fp16_m19_h16384_both_yn", "dtype": "float16", "M": 19, "H": 16384, "block_size": 32,
     "both": True, "normed": True},
    {"label": "nv_3d_bf16_b4_s37_h2048_swz", "dtype": "bfloat16", "B": 4, "S": 37, "H": 2048, "swizzled": True},
    {"label": "nv_bf16_m37_h80_swz_yn", "dtype": "bfloat16", "M": 37, "H": 80, "swizzled": True, "normed": True},
    {"label": "nv_bf16_m19_h4096_strided", "dtype": "bfloat16", "M": 19, "H": 4096, "x_row_stride": 4160,
     "residual_row_stride": 4608},
    {"label": "nv_bf16_m3_h20000_both_yn", "dtype": "bfloat16", "M": 3, "H": 20000, "both": True, "normed": True},
    {"label": "nv_bf16_m130_h4096_general", "dtype": "bfloat16", "M": 130, "H": 4096, "swizzled": True,
     "schedule": "general"},
]

BENCH_CONFIGS = [
    {"label": "bench_nv_3d_b32_s32_h128", "dtype": "bfloat16", "B": 32, "S": 32, "H": 128},
    {"label": "bench_nv_m32_h4096", "dtype": "bfloat16", "M": 32, "H": 4096},
    {"label": "bench_nv_large_m64_h8192", "dtype": "bfloat16", "M": 64, "H": 8192},
    {"label": "bench_nv_m8192_h4096_swz", "dtype": "bfloat16", "M": 8192, "H": 4096, "swizzled": True},
    {"label": "bench_nv_m32768_h8192_swz", "dtype": "bfloat16", "M": 32768, "H": 8192, "swizzled": True},
]

DEFAULTS = {"dtype": "bfloat16", "eps": 1e-6, "block_size": 16, "scale_format": None, "swizzled": False,
            "global_scale": None, "both": False, "normed": False}

INPLACE = {"residual": "residual"}

_DTYPES = base._DTYPES


def _key(cfg) -> dict:
    both = bool(cfg.get("both", False))
    return {**base._key({**cfg, "swizzled": bool(cfg.get("swizzled", False)) or both}), "both": both,
            "normed": bool(cfg.get("normed", False))}


def compile_params(**cfg) -> dict:
    params = _key(cfg)
    H = int(cfg["H"])
    if cfg.get("schedule") == "general" or not base.specialized(H, params["block_size"]):
        return {**params, "schedule": "general"}
    return {**params, "H": H}


def general_params(params: dict) -> dict:
    return {**_key(params), "schedule": "general"}


def artifact_params() -> list[dict]:
    """The general kernel of every (dtype, format, layout, extra outputs); NVFP4 without extra outputs specialized
    at every catalog hidden size (both dtypes and layouts)."""
    from tirx_kernels.core import model_dims

    out = [general_params({"dtype": t, "block_size": bs, "scale_format": f, "swizzled": s, "both": both,
                           "normed": n})
           for t in _DTYPES for bs, f in ((16, "e4m3"), (32, "e4m3"), (32, "ue8m0")) for s in (False, True)
           for both in (False, True) for n in (False, True) if s or not both]
    out += [compile_params(dtype=t, H=H, swizzled=s) for t in _DTYPES for s in (False, True)
            for H in model_dims.hidden_sizes() if base.specialized(H, 16)]
    return out


def call_samples(rng) -> list[dict]:
    return [{**c, "both": rng.random() < 0.3, "normed": rng.random() < 0.3} for c in base.call_samples(rng)]


def sass_expect(**params) -> list[str]:
    return base.sass_expect(**params) + [r"STG\.E\.128"]


def get_kernel(dtype: str, block_size: int = 16, scale_format: str = "e4m3", swizzled: bool = False,
               both: bool = False, normed: bool = False, H: int | None = None, schedule: str | None = None,
               pdl: str | None = base.PDL):
    if both and not swizzled:
        raise ValueError("add_rmsnorm_fp4quant: both SF layouts need swizzled=True (the first is the swizzled one)")
    if dtype not in _DTYPES or block_size not in base.BLOCK_SIZES or scale_format not in base.SCALE_FORMATS or (
            scale_format == "ue8m0" and block_size != 32):
        raise ValueError(f"add_rmsnorm_fp4quant: unsupported dtype / block / format {dtype, block_size, scale_format}")
    opts = {"pdl": pdl, "add": True, "normed": normed, "both_layouts": both}
    if schedule == "general":
        if H is not None:
            raise ValueError(f"add_rmsnorm_fp4quant: the general kernel takes H at run time, got H={H}")
        bpt = max(1, base.VECTORS_PER_THREAD * base._VEC // block_size)
        return base.build_kernel(dtype, block_size, scale_format, swizzled, None, base.GENERAL_THREADS, bpt, 1, **opts)
    if schedule is not None or H is None or not base.specialized(H, block_size):
        raise ValueError(f"add_rmsnorm_fp4quant: H={H} must be a multiple of block_size {block_size} in "
                         f"[{block_size}, {base.MAX_H}] (or schedule='general')")
    plan = base.row_plan(H, block_size)
    return base.build_kernel(dtype, block_size, scale_format, swizzled, H, plan["threads_per_row"],
                             plan["blocks_per_thread"], plan["rows_per_cta"], **opts)


# ---------------------------------------------------------------------------------------------------------
# Protocol
# ---------------------------------------------------------------------------------------------------------

def prepare_data(dtype: str, H: int, eps: float = 1e-6, block_size: int = 16, scale_format: str | None = None,
                 swizzled: bool = False, global_scale: float | None = None, both: bool = False, normed: bool = False,
                 x_row_stride: int | None = None, residual_row_stride: int | None = None, **cfg) -> dict:
    g = base._generator()
    t = _DTYPES[dtype]
    lead = base._rows_shape(cfg)
    x = torch.randn(*lead, x_row_stride or H, generator=g, device="cuda", dtype=torch.float32).to(t)[..., :H]
    r = torch.randn(*lead, residual_row_stride or H, generator=g, device="cuda", dtype=torch.float32).to(t)[..., :H]
    fmt = scale_format or base.default_format(block_size)
    rows = x.numel() // H
    swz = bool(swizzled) or bool(both)
    y, sf = _fp4_rows.new_outputs(lead, H, rows, block_size, fmt, swz, x.device)
    data = {"input": x, "residual": r, "weight": torch.randn(H, generator=g, device="cuda").to(t),
            "global_scale": None if global_scale is None else torch.tensor([global_scale], device="cuda"),
            "eps": eps, "block_size": block_size, "scale_format": fmt, "is_sf_swizzled_layout": swz,
            "output_both_sf_layouts": bool(both), "y_fp4": y, "block_scale": sf}
    if both:
        data["block_scale_unswizzled"] = _fp4_rows.new_outputs(lead, H, rows, block_size, fmt, False, x.device)[1]
    if normed:
        data["y_out"] = torch.empty(*lead, H, dtype=t, device="cuda")
    return data


def normalized(input, residual, weight, eps):  # noqa: A002
    """(the new residual, the fp32 values the kernel encodes): ``h = x + r`` in fp32, ``rstd`` from h, then
    ``(h rounded * rstd) * w``."""
    h = input.float() + residual.float()
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    hr = h.to(input.dtype)
    return hr, hr.float() * rstd * weight.float()


def reference(input, residual, weight, global_scale=None, eps=1e-6, block_size=16, scale_format=None,  # noqa: A002
              is_sf_swizzled_layout=False, output_both_sf_layouts=False, **data) -> dict:
    fmt = scale_format or base.default_format(block_size)
    hr, y = normalized(input, residual, weight, eps)
    codes, sf = _fp4_rows.encode_rows(y, block_size, fmt, global_scale, is_sf_swizzled_layout)
    out = {"y_fp4": codes, "block_scale": sf, "residual": hr.float()}
    if output_both_sf_layouts:
        out["block_scale_unswizzled"] = _fp4_rows.encode_rows(y, block_size, fmt, global_scale, False)[1]
    if "y_out" in data:
        out["y_out"] = y
    return out


def launch(cfg: dict, data: dict) -> None:
    kwargs = {k: data[k] for k in ("y_fp4", "block_scale", "global_scale", "eps", "block_size", "scale_format",
                                   "is_sf_swizzled_layout", "output_both_sf_layouts")}
    kwargs["block_scale_unswizzled"] = data.get("block_scale_unswizzled")
    kwargs["y_out"] = data.get("y_out")
    if cfg.get("schedule") == "general":
        kwargs["_general"] = True
    _add_rmsnorm_fp4quant(data["input"], data["residual"], data["weight"], **kwargs)


def roofline(dtype: str, H: int, block_size: int = 16, swizzled: bool = False, both: bool = False,
             normed: bool = False, **cfg) -> dict:
    rows = 1
    for d in base._rows_shape(cfg):
        rows *= d
    nb = H // block_size
    swz = swizzled or both
    sf = _fp4_rows.sf_rows(rows, swz) * _fp4_rows.sf_cols(nb, swz) + (rows * nb if both else 0)
    return {"bytes": rows * H * 2 * (3 + int(normed)) + H * 2 + rows * H // 2 + sf, "flops": 7 * rows * H}


def get_baselines(**cfg) -> dict:
    """torch: the oracle's arithmetic in torch ops (FlashInfer's FP4 kernels need SM100)."""
    def torch_eager():
        def fn(d):
            out = reference(**d)
            return {k: v for k, v in out.items()}
        return fn

    return {"torch": torch_eager}


def _residual_exact(got, want, cfg, inputs) -> dict:
    from tirx_kernels.core import harness

    return harness.bit_exact(got, want, cfg, inputs)


COMPARATORS = {"y_fp4": _fp4_rows.codes_close, "block_scale": _fp4_rows.scales_close,
               "block_scale_unswizzled": _fp4_rows.scales_close, "residual": _residual_exact}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_OP = "add_rmsnorm_fp4quant"


def _fail(name: str, expected: str, got: str) -> None:
    raise checks.TirxInputError(f"{_OP}: argument '{name}': expected {expected}, got {got}")


def add_rmsnorm_fp4quant(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,  # noqa: A002
                         y_fp4: torch.Tensor | None = None, block_scale: torch.Tensor | None = None,
                         global_scale: torch.Tensor | None = None, eps: float = 1e-6, block_size: int = 16,
                         scale_format: str | None = None, is_sf_swizzled_layout: bool = False,
                         output_both_sf_layouts: bool = False, block_scale_unswizzled: torch.Tensor | None = None,
                         enable_pdl: bool | None = None, y_out: torch.Tensor | None = None):
    """FlashInfer's ``add_rmsnorm_fp4quant``: ``residual <- input + residual`` in place; returns ``(y_fp4,
    block_scale)``, or ``(y_fp4, block_scale, block_scale_unswizzled)`` with ``output_both_sf_layouts`` (then
    ``block_scale`` is swizzled whatever ``is_sf_swizzled_layout`` says); ``y_out`` (optional, the input's shape
    and dtype, contiguous) receives ``rmsnorm(residual) * weight`` rounded to the dtype. ``enable_pdl``: accepted;
    the kernels always launch as programmatic dependents."""
    return _add_rmsnorm_fp4quant(input, residual, weight, y_fp4, block_scale, global_scale, eps, block_size,
                                 scale_format, is_sf_swizzled_layout, output_both_sf_layouts, block_scale_unswizzled,
                                 y_out)


def _add_rmsnorm_fp4quant(input, residual, weight, y_fp4=None, block_scale=None, global_scale=None,  # noqa: A002
                          eps=1e-6, block_size=16, scale_format=None, is_sf_swizzled_layout=False,
                          output_both_sf_layouts=False, block_scale_unswizzled=None, y_out=None, _general=False):
    both = bool(output_both_sf_layouts)
    swizzled = bool(is_sf_swizzled_layout) or both
    checks.tensor(_OP, "input", input, ndim=(2, 3), cuda=False)
    checks.tensor(_OP, "residual", residual, shape=tuple(input.shape), cuda=False)
    checks.same_dtype(_OP, "input", input, residual=residual)
    H = input.shape[-1]
    rows = input.numel() // max(1, H)
    if y_out is not None:
        checks.tensor(_OP, "y_out", y_out, dtypes=(input.dtype,), shape=tuple(input.shape), contiguous=True,
                      cuda=False)
    if both and block_size in base.BLOCK_SIZES and H % block_size == 0:
        fmt = scale_format or base.default_format(block_size)
        _fp4_rows.check_outputs(_OP, input.shape, H, rows, block_size, fmt, False, None, block_scale_unswizzled,
                                sf_name="block_scale_unswizzled")
    fmt = base._check_inputs(input, weight, y_fp4, block_scale, global_scale, eps, block_size, scale_format,
                             swizzled, op=_OP)
    checks.same_device(_OP, "input", input, residual=residual,
                       **{k: v for k, v in (("y_out", y_out), ("block_scale_unswizzled", block_scale_unswizzled))
                          if v is not None})
    lead = tuple(input.shape[:-1])
    if y_fp4 is None or block_scale is None:
        y_new, sf_new = _fp4_rows.new_outputs(lead, H, rows, block_size, fmt, swizzled, input.device)
        y_fp4 = y_new if y_fp4 is None else y_fp4
        block_scale = sf_new if block_scale is None else block_scale
    if both and block_scale_unswizzled is None:
        block_scale_unswizzled = _fp4_rows.new_outputs(lead, H, rows, block_size, fmt, False, input.device)[1]
    if global_scale is None:
        global_scale = _fp4_rows.unit_scale(input.device)
    spare = _spare(input.device) if not both or y_out is None else None
    args = (input, residual, weight, y_fp4, block_scale, block_scale_unswizzled if both else spare[0],
            y_out if y_out is not None else spare[1], global_scale, float(eps), block_size, fmt, swizzled, both,
            y_out is not None)
    if runtime.direct_call(input, residual, weight, y_fp4, block_scale, global_scale, block_scale_unswizzled, y_out):
        _run(*args, general=_general)
        for t in (residual, y_fp4, block_scale, block_scale_unswizzled, y_out):
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.flashinfer_add_rmsnorm_fp4quant(*args)
    return (y_fp4, block_scale, block_scale_unswizzled) if both else (y_fp4, block_scale)


_SPARE = {}


def _spare(device):
    """Placeholders for the kernel arguments of outputs a call does not ask for (never written); fresh ones while
    torch.compile traces."""
    if torch.compiler.is_compiling():
        return (torch.empty(16, dtype=torch.uint8, device=device), torch.empty(16, dtype=torch.uint8, device=device))
    key = (device.type, device.index)
    if key not in _SPARE:
        _SPARE[key] = (torch.zeros(16, dtype=torch.uint8, device=device),
                       torch.zeros(16, dtype=torch.uint8, device=device))
    return _SPARE[key]


def _run(input, residual, weight, y_fp4, block_scale, sf_linear, normed, global_scale, eps: float,  # noqa: A002
         block_size: int, fmt: str, swizzled: bool, both: bool, has_normed: bool, general: bool = False) -> None:
    H = input.shape[-1]
    x2d = _fp4_rows.rows_on_16_bytes(input)
    if x2d.shape[0] == 0:
        return
    r2d = _fp4_rows.rows_on_16_bytes(residual)  # a copy (written back below) where its rows are off 16 bytes
    _fp4_rows.check_alignment(_OP, y_fp4=y_fp4)
    weight = _fp4_rows.on_16_bytes(weight)
    dtype = str(input.dtype)[6:]
    general = general or not base.specialized(H, block_size)
    fn = _FUNCTIONS.get((input.dtype, H, block_size, fmt, swizzled, both, has_normed, general, input.get_device()),
                        lambda: (general_params if general else lambda p: p)(compile_params(
                            dtype=dtype, H=H, block_size=block_size, scale_format=fmt, swizzled=swizzled, both=both,
                            normed=has_normed)), input.device)
    fn(x2d, r2d, weight, y_fp4.view(torch.uint8).view(-1, H // 2), block_scale.view(torch.uint8).view(-1),
       sf_linear.view(torch.uint8).view(-1), normed.view(-1).view(input.dtype), global_scale, eps,
       0)  # zero: see vector.after_all
    if r2d.untyped_storage().data_ptr() != residual.untyped_storage().data_ptr():
        residual.copy_(r2d.view(residual.shape))


_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::flashinfer_add_rmsnorm_fp4quant",
                         mutates_args=("residual", "y_fp4", "block_scale", "sf_linear", "normed"))
def _add_rmsnorm_fp4quant_op(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,  # noqa: A002
                             y_fp4: torch.Tensor, block_scale: torch.Tensor, sf_linear: torch.Tensor,
                             normed: torch.Tensor, global_scale: torch.Tensor, eps: float, block_size: int,
                             fmt: str, swizzled: bool, both: bool, has_normed: bool) -> None:
    _run(input, residual, weight, y_fp4, block_scale, sf_linear, normed, global_scale, eps, block_size, fmt,
         swizzled, both, has_normed)


@_add_rmsnorm_fp4quant_op.register_fake
def _(input, residual, weight, y_fp4, block_scale, sf_linear, normed, global_scale, eps, block_size, fmt,  # noqa: A002
      swizzled, both, has_normed):
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
