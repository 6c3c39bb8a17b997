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

One artifact per (dtype, layout), M and K at run time; the driver is ``_block_quant`` (one thread per block), and
the public op runs through its torch.library custom op ``tirx::flashinfer_block_quantize`` (outside eager mode;
its fake comes from register_fake there).
"""

from __future__ import annotations

from tirx_kernels.core import harness

from . import _block_quant as B

KERNEL_META = {
    "name": "nvfp4_quantize",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "NVFP4 quantization (e2m1 + e4m3 scale per 16, global scale), linear / 128x4 / 8x4 scales",
    "upstream": {"project": "flashinfer", "url": "https://github.com/flashinfer-ai/flashinfer",
                 "commit": "77039051b0be921788dc2784ec41423b558878ec"},  # v0.7.4, the package's lock
    "public_ops": ["nvfp4_quantize"],
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
]
BENCH_CONFIGS = [
    {"label": "fp16_128x4_m128_k1024", "dtype": "float16", "layout": "128x4", "M": 128, "K": 1024},
    {"label": "fp16_linear_m4096_k4096", "dtype": "float16", "layout": "linear", "M": 4096, "K": 4096},
    {"label": "fp16_128x4_m16384_k7168", "dtype": "float16", "layout": "128x4", "M": 16384, "K": 7168},
]
DEFAULTS = {"dtype": "float16", "layout": "128x4"}
COMPARATORS = {"x_q": harness.bit_exact, "sf": harness.bit_exact}
_FMT = "nvfp4"


def compile_params(dtype: str, layout: str = "128x4", **_) -> dict:
    return {"dtype": dtype, "layout": layout}


def artifact_params() -> list[dict]:
    return [{"dtype": t, "layout": lay} for t in B.DTYPES for lay in B.LAYOUTS]


def call_samples(rng) -> list[dict]:
    return B.call_samples(rng, _FMT)


def get_kernel(dtype: str, layout: str):
    return B.build_kernel(dtype, _FMT, layout, "nvfp4_quantize")


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"STG\.E\.U8"]


def prepare_data(dtype: str, M: int, K: int, layout: str = "128x4", **_) -> dict:  # noqa: N803
    return B.prepare_data(_FMT, dtype, M, K, layout)


def reference(x, sf, global_scale, **_) -> dict:
    return B.reference(_FMT, x, sf, global_scale)


def launch(cfg: dict, data: dict) -> None:
    B.run(data["x"], data["global_scale"], data["x_q"], data["sf"], _FMT, cfg.get("layout", "128x4"))


def roofline(M: int, K: int, layout: str = "128x4", **_) -> dict:  # noqa: N803
    return B.roofline(_FMT, M, K, layout)


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


run_test, run_bench = harness.bind(__name__)
