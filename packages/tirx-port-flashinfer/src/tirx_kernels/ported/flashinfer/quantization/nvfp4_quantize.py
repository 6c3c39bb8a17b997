# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's nvfp4_quantize (flashinfer/quantization/fp4_quantization.py, CuTe-DSL kernel
# flashinfer/quantization/kernels/nvfp4_quantize.py) at flashinfer-ai/flashinfer
# f2e04400e330fb2debe0bf8730d9424a1d37927f (the semantics; KERNEL_META cites
# the locked v0.7.4, 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx for sm_90a (FlashInfer's FP4 kernels need SM100).
"""NVFP4: ``a`` [M, K] bf16/fp16 and a global fp32 scale ``gs`` -> e2m1 codes [M, K/2] (two a byte, the even
element low) and one e4m3 scale per 16 elements: ``sf = e4m3(amax * (gs * fp32(1/6)))``, codes
``e2m1(x * min(1 / (f32(sf) * (1 / gs)), FLT_MAX))`` -- FlashInfer's IEEE recipe
(FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1; its default path rounds two reciprocals with ``rcp.approx``), bit-exact
with ``core.quant_ref.nvfp4_quantize``. Scales linear ``[M, K/16]`` or swizzled 128x4 / 8x4 (flat, padding 0).

``silu_and_mul_nvfp4_quantize`` (FlashInfer 0.7.4's fused SwiGLU quantizer, flashinfer/quantization/
fp4_quantization.py and kernels/nvfp4_quantize.py ``silu_and_mul=True``): ``a`` [M, 2K] = ``[gate | up]``; each block
quantizes ``h = dtype(silu(gate) * up)`` -- fp32 ``g / (1 + exp(-g)) * u`` rounded to the input's dtype as upstream
packs it into half2 / bfloat2 -- with the same encoder; scales returned 2-D ``[rows, columns]`` as upstream (rows
and columns padded in the swizzled layouts). Its exponential differs from upstream's fast one by an ulp at most, so
an ``h`` at a rounding boundary of the dtype may be one step apart (the GPU comparators allow one step on 1 %).

One artifact per (dtype, layout, fusion), M and K at run time; the driver is ``_block_quant`` (one thread per
block), and the public ops run through its torch.library custom op ``tirx::flashinfer_block_quantize`` (outside
eager mode; its fake comes from register_fake there).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import harness

from ..norm import _fp4_rows
from . import _block_quant as B

KERNEL_META = {
    "name": "nvfp4_quantize",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "NVFP4 quantization (e2m1 + e4m3 scale per 16, global scale), linear / 128x4 / 8x4 scales; "
                   "optionally of silu(gate) * up",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},  # v0.7.4, the package's lock
    "public_ops": ["nvfp4_quantize", "silu_and_mul_nvfp4_quantize"],
}

CONFIGS = [
    {"label": "fp16_128x4_m128_k1024", "dtype": "float16", "layout": "128x4", "M": 128, "K": 1024},
    {"label": "bf16_linear_m128_k1024", "dtype": "bfloat16", "layout": "linear", "M": 128, "K": 1024},
    {"label": "bf16_128x4_m1024_k2048", "dtype": "bfloat16", "layout": "128x4", "M": 1024, "K": 2048},
    {"label": "fp16_linear_m1024_k2048", "dtype": "float16", "layout": "linear", "M": 1024, "K": 2048},
    {"label": "fp16_linear_m4096_k4096", "dtype": "float16", "layout": "linear", "M": 4096, "K": 4096},
    {"label": "bf16_128x4_m4096_k4096", "dtype": "bfloat16", "layout": "128x4", "M": 4096, "K": 4096},
    {"label": "fp16_128x4_m16384_k7168", "dtype": "float16", "layout": "128x4", "M": 16384, "K": 7168},
    {"label": "bf16_linear_m16384_k7168", "dtype": "bfloat16", "layout": "linear", "M": 16384, "K": 7168},
    {"label": "bf16_128x4_m37_k80_ragged", "dtype": "bfloat16", "layout": "128x4", "M": 37, "K": 80},
    {"label": "fp16_8x4_m19_k3584", "dtype": "float16", "layout": "8x4", "M": 19, "K": 3584},
    # silu_and_mul_nvfp4_quantize: [M, 2K] gate | up inputs (K the quantized width)
    {"label": "bf16_128x4_m4096_k3584_silu", "dtype": "bfloat16", "layout": "128x4", "M": 4096, "K": 3584,
     "silu_and_mul": True},
    {"label": "fp16_linear_m128_k14336_silu", "dtype": "float16", "layout": "linear", "M": 128, "K": 14336,
     "silu_and_mul": True},
    {"label": "bf16_8x4_m37_k80_silu_ragged", "dtype": "bfloat16", "layout": "8x4", "M": 37, "K": 80,
     "silu_and_mul": True},
]
BENCH_CONFIGS = [
    {"label": "fp16_128x4_m128_k1024", "dtype": "float16", "layout": "128x4", "M": 128, "K": 1024},
    {"label": "fp16_linear_m4096_k4096", "dtype": "float16", "layout": "linear", "M": 4096, "K": 4096},
    {"label": "fp16_128x4_m16384_k7168", "dtype": "float16", "layout": "128x4", "M": 16384, "K": 7168},
]
DEFAULTS = {"dtype": "float16", "layout": "128x4"}
_FMT = "nvfp4"


def _one_step_if_fused(close):
    """Bit for bit, except for the fused SwiGLU configs: their exponential is not the oracle's (module docstring),
    so an element there may sit one step off (``_fp4_rows``' comparators)."""
    def compare(got, want, cfg, inputs):
        if cfg.get("silu_and_mul"):
            return close(got.view(torch.uint8), want.view(torch.uint8), cfg, inputs)
        return harness.bit_exact(got, want, cfg, inputs)
    return compare


COMPARATORS = {"x_q": _one_step_if_fused(_fp4_rows.codes_close), "sf": _one_step_if_fused(_fp4_rows.scales_close)}


def compile_params(dtype: str, layout: str = "128x4", silu_and_mul: bool = False, **_) -> dict:
    return {"dtype": dtype, "layout": layout, **({"silu_and_mul": True} if silu_and_mul else {})}


def artifact_params() -> list[dict]:
    return [compile_params(t, lay, fused) for fused in (False, True) for t in B.DTYPES for lay in B.LAYOUTS]


def call_samples(rng) -> list[dict]:
    plain = B.call_samples(rng, _FMT)
    return plain + [{**c, "silu_and_mul": True} for c in plain]


def get_kernel(dtype: str, layout: str, silu_and_mul: bool = False):
    name = "silu_and_mul_nvfp4_quantize" if silu_and_mul else "nvfp4_quantize"
    return B.build_kernel(dtype, _FMT, layout, name, silu_and_mul)


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"STG\.E\.U8"]


def prepare_data(dtype: str, M: int, K: int, layout: str = "128x4", silu_and_mul: bool = False,  # noqa: N803
                 device: str = "cuda", **_) -> dict:
    return B.prepare_data(_FMT, dtype, M, K, layout, silu_and_mul, device)


def reference(x, sf, global_scale, silu_and_mul: bool = False, **_) -> dict:
    return B.reference(_FMT, x, sf, global_scale, silu_and_mul)


def launch(cfg: dict, data: dict) -> None:
    B.run(data["x"], data["global_scale"], data["x_q"], data["sf"], _FMT, cfg.get("layout", "128x4"),
          bool(cfg.get("silu_and_mul")))


def roofline(M: int, K: int, layout: str = "128x4", silu_and_mul: bool = False, **_) -> dict:  # noqa: N803
    return B.roofline(_FMT, M, K, layout, silu_and_mul)


def get_baselines(**cfg) -> dict:
    """torch: core.quant_ref in torch ops (FlashInfer's FP4 kernels raise below SM100)."""
    def torch_ref():
        return lambda d: reference(**d)

    return {"torch": torch_ref}


def nvfp4_quantize(a, a_global_sf, sfLayout="128x4", do_shuffle: bool = False, sf_vec_size: int = 16,  # noqa: N803
                   enable_pdl=None, backend: str = "cuda"):
    """FlashInfer's ``nvfp4_quantize``: ``(a_fp4 [M, K/2] uint8, a_sf uint8)``; ``a_sf`` is ``[M, K/16]`` for
    the linear layout, flat (padded rows x padded columns, padding 0) for 128x4 / 8x4. ``enable_pdl`` and
    ``backend`` are accepted and ignored (one kernel here)."""
    if do_shuffle:
        raise NotImplementedError("nvfp4_quantize: do_shuffle=True (the TRT-LLM weight shuffle) is not ported")
    if sf_vec_size != 16:
        raise ValueError(f"nvfp4_quantize: sf_vec_size must be 16, got {sf_vec_size}")
    return B.quantize("nvfp4_quantize", a, a_global_sf, _FMT, B.layout_name("nvfp4_quantize", sfLayout))


def silu_and_mul_nvfp4_quantize(input, global_scale, sf_vec_size: int = 16,  # noqa: A002
                                is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False,
                                enable_pdl=None):
    """FlashInfer's ``silu_and_mul_nvfp4_quantize``: NVFP4 of ``silu(input[:, :K]) * input[:, K:]`` (rounded to the
    input's dtype); ``(fp4 [M, K/2] uint8, sf uint8 [rows, columns])`` -- ``[M, K/16]`` linear, padded rows and
    columns (padding 0) swizzled. ``input`` [M, 2K] fp16 / bf16 (upstream flattens leading dimensions; here 2-D),
    ``global_scale`` fp32 with one element. ``enable_pdl`` is accepted and ignored (one kernel here)."""
    op = "silu_and_mul_nvfp4_quantize"
    if sf_vec_size != 16:
        raise ValueError(f"{op}: sf_vec_size must be 16, got {sf_vec_size}")
    layout = "linear" if not is_sf_swizzled_layout else ("8x4" if is_sf_8x4_layout else "128x4")
    codes, sf = B.quantize(op, input, global_scale, _FMT, layout, silu_and_mul=True)
    return codes, sf.view(-1, B.sf_shape(input.shape[0], codes.shape[1] * 2, _FMT, layout)[1])


run_test, run_bench = harness.bind(__name__)
