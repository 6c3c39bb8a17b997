# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's per-token NVFP4 quantization (nvfp4_quantize(..., per_token_activation=True) in
# flashinfer/quantization/fp4_quantization.py; CuTe-DSL kernel nvfp4_quantize_per_token_cute_dsl in
# flashinfer/quantization/kernels/nvfp4_quantize.py) at flashinfer-ai/flashinfer
# f2e04400e330fb2debe0bf8730d9424a1d37927f (the semantics; KERNEL_META cites
# the locked v0.7.4, 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx for sm_90a (FlashInfer's FP4 kernels need SM100).
"""Per-token NVFP4: ``a`` [M, K] bf16/fp16 and ``a_global_sf`` (the *inverse* global scale ``gsi``, one fp32) ->
e2m1 codes [M, K/2], e4m3 scales per 16 (linear / 128x4 / 8x4) and a per-token fp32 scale [M]. The row's amax is
taken in the kernel; ``enc = min((1 / gsi) / row_amax, FLT_MAX)`` (1 where that is 0, FLT_MAX for an all-zero
row), ``per_token_scale = 1 / enc`` (0 for an all-zero row), and the row's blocks are NVFP4 with global scale
``enc`` -- FlashInfer's IEEE recipe (FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1), bit-exact with
``core.quant_ref.nvfp4_quantize_per_token``.

One artifact per (dtype, layout), M and K at run time: one CTA per row (``_block_quant.build_per_token_kernel``:
an amax pass that keeps up to ``PT_HELD`` blocks a thread in registers -- rows up to 8192 elements -- then the
quantizing pass from those registers, re-reading only the columns past them from L2). The public op runs its
kernel directly in eager mode, else through the torch.library custom op below (with its register_fake).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, quant_ref, runtime

from . import _block_quant as B

KERNEL_META = {
    "name": "nvfp4_quantize_per_token",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "per-token NVFP4 quantization (row amax in the kernel, per-token fp32 scale out)",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},  # v0.7.4, the package's lock
    "public_ops": ["nvfp4_quantize_per_token"],
}

CONFIGS = [
    {"label": "fp16_128x4_m128_k1024", "dtype": "float16", "layout": "128x4", "M": 128, "K": 1024},
    {"label": "bf16_linear_m128_k1024", "dtype": "bfloat16", "layout": "linear", "M": 128, "K": 1024},
    {"label": "bf16_128x4_m1024_k2048", "dtype": "bfloat16", "layout": "128x4", "M": 1024, "K": 2048},
    {"label": "fp16_linear_m4096_k4096", "dtype": "float16", "layout": "linear", "M": 4096, "K": 4096},
    {"label": "bf16_128x4_m4096_k4096", "dtype": "bfloat16", "layout": "128x4", "M": 4096, "K": 4096},
    {"label": "fp16_128x4_m16384_k7168", "dtype": "float16", "layout": "128x4", "M": 16384, "K": 7168},
    {"label": "bf16_128x4_m37_k80_ragged", "dtype": "bfloat16", "layout": "128x4", "M": 37, "K": 80},
    {"label": "fp16_8x4_m19_k3584", "dtype": "float16", "layout": "8x4", "M": 19, "K": 3584},
    # rows past the PT_HELD blocks a thread keeps in registers (8192 elements): the re-read columns
    {"label": "bf16_128x4_m33_k9008_reread", "dtype": "bfloat16", "layout": "128x4", "M": 33, "K": 9008},
    {"label": "fp16_linear_m8_k16384", "dtype": "float16", "layout": "linear", "M": 8, "K": 16384},
]
BENCH_CONFIGS = [
    {"label": "fp16_128x4_m128_k1024", "dtype": "float16", "layout": "128x4", "M": 128, "K": 1024},
    {"label": "fp16_linear_m4096_k4096", "dtype": "float16", "layout": "linear", "M": 4096, "K": 4096},
    {"label": "fp16_128x4_m16384_k7168", "dtype": "float16", "layout": "128x4", "M": 16384, "K": 7168},
]
DEFAULTS = {"dtype": "float16", "layout": "128x4"}
COMPARATORS = {"x_q": harness.bit_exact, "sf": harness.bit_exact, "per_token_scale": harness.bit_exact}
_FMT = "nvfp4"
_OP = "nvfp4_quantize_per_token"


def compile_params(dtype: str, layout: str = "128x4", **_) -> dict:
    return {"dtype": dtype, "layout": layout}


def artifact_params() -> list[dict]:
    return [{"dtype": t, "layout": lay} for t in B.DTYPES for lay in B.LAYOUTS]


def call_samples(rng) -> list[dict]:
    return B.call_samples(rng, _FMT)


def get_kernel(dtype: str, layout: str):
    return B.build_per_token_kernel(dtype, layout, _OP)


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"STG\.E\.U8"]


def prepare_data(dtype: str, M: int, K: int, layout: str = "128x4", **_) -> dict:  # noqa: N803
    data = B.prepare_data(_FMT, dtype, M, K, layout)
    data["global_scale"] = torch.ones(1, device="cuda")  # the inverse global scale (FlashInfer's default use)
    data["per_token_scale"] = torch.full((M,), float("nan"), device="cuda")
    return data


def reference(x, sf, global_scale, **_) -> dict:
    M, K = x.shape  # noqa: N806
    codes, ref_sf, pts = quant_ref.nvfp4_quantize_per_token(x, global_scale, B.layout_of(sf, M, K, _FMT))
    return {"x_q": codes, "sf": ref_sf.reshape(sf.shape), "per_token_scale": pts}


def launch(cfg: dict, data: dict) -> None:
    _run(data["x"], data["global_scale"], data["x_q"], data["sf"], data["per_token_scale"],
         cfg.get("layout", "128x4"))


def roofline(M: int, K: int, layout: str = "128x4", **_) -> dict:  # noqa: N803
    """The input read once (the second pass's re-read is not counted), codes, scales and per-token scales
    written once."""
    r = B.roofline(_FMT, M, K, layout)
    return {"bytes": r["bytes"] + 4 * M, "flops": r["flops"]}


def get_baselines(**cfg) -> dict:
    """torch: core.quant_ref in torch ops (FlashInfer's FP4 kernels raise below SM100)."""
    def torch_ref():
        return lambda d: reference(**d)

    return {"torch": torch_ref}


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(x, global_scale_inv, codes, sf, per_token_scale, layout: str) -> None:
    M, K = x.shape  # noqa: N806
    if M == 0 or K == 0:
        return
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    dtype = str(x.dtype)[6:]
    fn = _FUNCTIONS.get((x.dtype, layout, x.get_device()), lambda: {"dtype": dtype, "layout": layout}, x.device)
    rows, _ = B.sf_shape(M, K, _FMT, layout)
    fn(x.view(-1), global_scale_inv.reshape(1).to(torch.float32), codes.view(-1).view(torch.uint32),
       sf.view(-1).view(torch.uint8), per_token_scale, M, K, rows)


def nvfp4_quantize_per_token(a, a_global_sf, sfLayout="128x4", enable_pdl=None, backend: str = "cuda"):  # noqa: N803
    """FlashInfer's ``nvfp4_quantize(a, a_global_sf, sfLayout, per_token_activation=True)``: ``(a_fp4 [M, K/2]
    uint8, a_sf uint8, per_token_scale [M] fp32)``; ``a_global_sf`` is the inverse global scale (a tensor of one
    element or a float). ``a_sf`` is ``[M, K/16]`` linear, flat (padding 0) swizzled."""
    layout = B.layout_name(_OP, sfLayout)
    B.check_input(_OP, a, _FMT, cuda=False)
    if not isinstance(a_global_sf, torch.Tensor):
        a_global_sf = torch.tensor([float(a_global_sf)], dtype=torch.float32, device=a.device)
    checks.tensor(_OP, "a_global_sf", a_global_sf, dtypes=(torch.float32,), cuda=False)
    if a_global_sf.numel() != 1:
        raise checks.TirxInputError(f"{_OP}: argument 'a_global_sf': expected one element, got "
                                    f"{tuple(a_global_sf.shape)}")
    B.check_cuda(_OP, a)
    codes, sf = B.new_outputs(a, _FMT, layout)
    pts = torch.empty(a.shape[0], dtype=torch.float32, device=a.device)
    if runtime.direct_call(a, a_global_sf):
        _run(a, a_global_sf, codes, sf, pts, layout)
    else:
        torch.ops.tirx.nvfp4_quantize_per_token(a, a_global_sf, codes, sf, pts, layout)
    return codes, sf, pts


@torch.library.custom_op("tirx::nvfp4_quantize_per_token", mutates_args=("codes", "sf", "per_token_scale"))
def _per_token_op(a: torch.Tensor, a_global_sf: torch.Tensor, codes: torch.Tensor, sf: torch.Tensor,
                  per_token_scale: torch.Tensor, layout: str) -> None:
    _run(a, a_global_sf, codes, sf, per_token_scale, layout)


@_per_token_op.register_fake
def _(a, a_global_sf, codes, sf, per_token_scale, layout):
    return None


run_test, run_bench = harness.bind(__name__)
