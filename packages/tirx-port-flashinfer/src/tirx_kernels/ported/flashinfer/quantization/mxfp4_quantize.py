# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's mxfp4_quantize (flashinfer/quantization/fp4_quantization.py, CuTe-DSL kernel
# flashinfer/quantization/kernels/mxfp4_quantize.py) at flashinfer-ai/flashinfer
# f2e04400e330fb2debe0bf8730d9424a1d37927f (the semantics; KERNEL_META cites
# the locked v0.7.4, 77039051b0be921788dc2784ec41423b558878ec).
# Written anew in TIRx for sm_90a (FlashInfer's FP4 kernels need SM100).
"""MXFP4: ``a`` [M, K] bf16/fp16 -> e2m1 codes [M, K/2] (two a byte, the even element low) and one ue8m0 scale per
32 elements: ``e = ceil_ue8m0(amax * fp32(1/6))`` (FlashInfer's ``float_to_ue8m0_fast``), codes
``e2m1(x * 2**(127 - e))`` (0 for e == 0), bit-exact with ``core.quant_ref.mxfp4_quantize``. Scales linear
``[M, K/32]`` or swizzled 128x4 / 8x4 (flat, padding 0).

One artifact per (dtype, layout), M and K at run time; the driver is ``_block_quant`` (one thread per block), and
the public op runs through its torch.library custom op ``tirx::flashinfer_block_quantize`` (outside eager mode;
its fake comes from register_fake there).
"""

from __future__ import annotations

from tirx_kernels.core import harness

from . import _block_quant as B

KERNEL_META = {
    "name": "mxfp4_quantize",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "MXFP4 quantization (e2m1 + ue8m0 scale per 32), linear / 128x4 / 8x4 scales",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},  # v0.7.4, the package's lock
    "public_ops": ["mxfp4_quantize"],
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
    {"label": "bf16_128x4_m37_k96_ragged", "dtype": "bfloat16", "layout": "128x4", "M": 37, "K": 96},
    {"label": "fp16_8x4_m19_k3584", "dtype": "float16", "layout": "8x4", "M": 19, "K": 3584},
]
BENCH_CONFIGS = [
    {"label": "fp16_128x4_m128_k1024", "dtype": "float16", "layout": "128x4", "M": 128, "K": 1024},
    {"label": "fp16_linear_m4096_k4096", "dtype": "float16", "layout": "linear", "M": 4096, "K": 4096},
    {"label": "fp16_128x4_m16384_k7168", "dtype": "float16", "layout": "128x4", "M": 16384, "K": 7168},
]
DEFAULTS = {"dtype": "float16", "layout": "128x4"}
COMPARATORS = {"x_q": harness.bit_exact, "sf": harness.bit_exact}
_FMT = "mxfp4"


def compile_params(dtype: str, layout: str = "128x4", **_) -> dict:
    return {"dtype": dtype, "layout": layout}


def artifact_params() -> list[dict]:
    return [{"dtype": t, "layout": lay} for t in B.DTYPES for lay in B.LAYOUTS]


def call_samples(rng) -> list[dict]:
    return B.call_samples(rng, _FMT)


def get_kernel(dtype: str, layout: str):
    return B.build_kernel(dtype, _FMT, layout, "mxfp4_quantize")


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.128", r"STG\.E\.U8"]


def prepare_data(dtype: str, M: int, K: int, layout: str = "128x4", **_) -> dict:  # noqa: N803
    return B.prepare_data(_FMT, dtype, M, K, layout)


def reference(x, sf, **_) -> dict:
    return B.reference(_FMT, x, sf)


def launch(cfg: dict, data: dict) -> None:
    B.run(data["x"], None, data["x_q"], data["sf"], _FMT, cfg.get("layout", "128x4"))


def roofline(M: int, K: int, layout: str = "128x4", **_) -> dict:  # noqa: N803
    return B.roofline(_FMT, M, K, layout)


def get_baselines(**cfg) -> dict:
    """torch: core.quant_ref in torch ops (FlashInfer's FP4 kernels raise below SM100)."""
    def torch_ref():
        return lambda d: reference(**d)

    return {"torch": torch_ref}


def mxfp4_quantize(a, backend: str = "cuda", enable_pdl=None, sfLayout="128x4"):  # noqa: N803
    """FlashInfer's ``mxfp4_quantize``: ``(x_q [M, K/2] uint8, sf uint8)``; ``sf`` is ``[M, K/32]`` for the linear
    layout, flat (padded rows x padded columns, padding 0) for 128x4 / 8x4. ``backend`` / ``enable_pdl`` are
    accepted and ignored (one kernel here)."""
    return B.quantize("mxfp4_quantize", a, None, _FMT, B.layout_name("mxfp4_quantize", sfLayout))


run_test, run_bench = harness.bind(__name__)
