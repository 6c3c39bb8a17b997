# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's per_token_cast_to_fp8 (deep_gemm/utils/math.py) with the SFA layout of its SM90 GEMMs
# (get_mn_major_tma_aligned_tensor, csrc/jit_kernels/impls/smxx_layout.hpp) at deepseek-ai/DeepGEMM
# 54e22612409371d6364144b69086735beb54e98b. DeepGEMM casts in torch; this is a CUDA-core TIRx kernel for sm_90a.
"""Per-token (1x128) FP8 cast: ``x`` [M, K] bf16/fp16 -> ``(x_fp8 [M, K] float8_e4m3fn, sfa [M, ceil(K/128)]
fp32)``, ``sfa`` already in the layout ``fp8_gemm_nt`` takes (MN-major, TMA-aligned: strides ``(1, align(M, 4))``).
DeepGEMM's recipe (``_fp8_cast``): ``sf = max(amax, 1e-4) / 448`` per 128 elements of a row (``use_ue8m0``:
rounded up to a power of two), codes ``e4m3(x * (1 / sf))``; bit-exact with DeepGEMM's torch formulas.

One artifact per (dtype, use_ue8m0), M and K at run time (K a multiple of 8; a ragged last block is allowed).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C

KERNEL_META = {
    "name": "deepgemm_per_token_cast_to_fp8",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM per-token (1x128) e4m3 cast, fp32 / UE8M0 scales in the SM90 GEMM's MN-major layout",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["per_token_cast_to_fp8"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

CONFIGS = [
    {"label": "bf16_m128_k7168", "dtype": "bfloat16", "use_ue8m0": False, "M": 128, "K": 7168},
    {"label": "bf16_ue8m0_m128_k7168", "dtype": "bfloat16", "use_ue8m0": True, "M": 128, "K": 7168},
    {"label": "bf16_m4096_k7168", "dtype": "bfloat16", "use_ue8m0": False, "M": 4096, "K": 7168},
    {"label": "fp16_ue8m0_m4096_k2048", "dtype": "float16", "use_ue8m0": True, "M": 4096, "K": 2048},
    {"label": "bf16_m16384_k7168", "dtype": "bfloat16", "use_ue8m0": False, "M": 16384, "K": 7168},
    {"label": "bf16_m17_k576_ragged", "dtype": "bfloat16", "use_ue8m0": False, "M": 17, "K": 576},
    {"label": "bf16_ue8m0_m1_k200_ragged", "dtype": "bfloat16", "use_ue8m0": True, "M": 1, "K": 200},
]
BENCH_CONFIGS = [
    {"label": "bf16_m128_k7168", "dtype": "bfloat16", "use_ue8m0": False, "M": 128, "K": 7168},
    {"label": "bf16_m4096_k7168", "dtype": "bfloat16", "use_ue8m0": False, "M": 4096, "K": 7168},
    {"label": "bf16_m16384_k7168", "dtype": "bfloat16", "use_ue8m0": False, "M": 16384, "K": 7168},
]
DEFAULTS = {"dtype": "bfloat16", "use_ue8m0": False}
COMPARATORS = {"x_fp8": harness.bit_exact, "sfa": harness.bit_exact}
_OP = "per_token_cast_to_fp8"


def compile_params(dtype: str, use_ue8m0: bool = False, **_) -> dict:
    return {"dtype": dtype, "use_ue8m0": bool(use_ue8m0)}


def artifact_params() -> list[dict]:
    return [{"dtype": t, "use_ue8m0": u} for t in C.DTYPES for u in (False, True)]


def call_samples(rng) -> list[dict]:
    return [{"dtype": t, "use_ue8m0": u, "M": rng.choice([1, 17, 4096, rng.randint(1, 20000)]),
             "K": 8 * rng.randint(1, 2048)} for t in C.DTYPES for u in (False, True) for _ in range(6)]


def get_kernel(dtype: str, use_ue8m0: bool = False):
    return C.build_per_token_kernel(dtype, use_ue8m0, "deepgemm_per_token_cast_to_fp8")


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"SHFL\.BFLY"]


def prepare_data(dtype: str, M: int, K: int, use_ue8m0: bool = False, **_) -> dict:  # noqa: N803
    import os

    seed = int(os.environ.get("TIRX_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    x = C.random_input(M, K, C.DTYPES[dtype], seed, device="cuda")
    return {"x": x, "use_ue8m0": bool(use_ue8m0),
            "x_fp8": torch.empty(M, K, dtype=torch.float8_e4m3fn, device="cuda"),
            "sfa": C.new_mn_major_sf(M, K, "cuda")}


def reference(x, use_ue8m0: bool = False, **_) -> dict:
    """DeepGEMM's formulas in torch."""
    codes, sf = C.per_token_ref(x, use_ue8m0)
    return {"x_fp8": codes, "sfa": sf}


def launch(cfg: dict, data: dict) -> None:
    _run(data["x"], data["x_fp8"], data["sfa"], data["use_ue8m0"])


def roofline(M: int, K: int, dtype: str = "bfloat16", **_) -> dict:  # noqa: N803
    """The input read once; codes and scales written once."""
    return {"bytes": M * K * 2 + M * K + 4 * M * C.ceil_div(K, C.GRAN), "flops": 3 * M * K}


def get_baselines(**cfg) -> dict:
    """torch: DeepGEMM's formulas (``_fp8_cast.per_token_ref``); deepgemm: ``deep_gemm.utils.per_token_cast_to_fp8``
    (the same torch code, from the installed package) with its scales made MN-major."""
    use_ue8m0 = bool(cfg.get("use_ue8m0", False))

    def torch_ref():
        return lambda d: reference(d["x"], use_ue8m0)

    def deepgemm_ref():
        from deep_gemm.utils import math as dg_math

        def run(d):
            codes, sf = dg_math.per_token_cast_to_fp8(d["x"], use_ue8m0=use_ue8m0)
            return {"x_fp8": codes, "sfa": sf}

        return run

    return {"torch": torch_ref, "deepgemm": deepgemm_ref}


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(x, codes, sfa, use_ue8m0: bool) -> None:
    dtype = str(x.dtype)[6:]
    fn = _FUNCTIONS.get((x.dtype, use_ue8m0, x.get_device()), lambda: {"dtype": dtype, "use_ue8m0": use_ue8m0},
                        x.device)
    C.run_per_token(fn, x, codes, sfa)


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's ``per_token_cast_to_fp8``: ``(x_fp8 [M, K] float8_e4m3fn, sfa [M, ceil(K/128)] fp32)``. The
    values are DeepGEMM's; ``sfa`` comes MN-major and TMA-aligned (strides ``(1, align(M, 4))``), the layout
    ``fp8_gemm_nt`` reads without a transposing copy. ``gran_k`` must be 128 (the SM90 recipe); the packed UE8M0
    format (``use_packed_ue8m0``) is SM100's and is rejected."""
    C.check_gran_k(_OP, gran_k)
    if use_packed_ue8m0:
        raise checks.TirxInputError(f"{_OP}: argument 'use_packed_ue8m0': packed UE8M0 scales are SM100's format; "
                                    f"the SM90 GEMM takes fp32 scales (use_ue8m0=True gives power-of-two ones)")
    C.check_input(_OP, x)
    m, k = x.shape
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    sfa = C.new_mn_major_sf(m, k, x.device)
    if runtime.direct_call(x):
        _run(x, codes, sfa, bool(use_ue8m0))
    else:
        torch.ops.tirx.deepgemm_per_token_cast_to_fp8(x, codes, sfa, bool(use_ue8m0))
    return codes, sfa


@torch.library.custom_op("tirx::deepgemm_per_token_cast_to_fp8", mutates_args=("codes", "sfa"))
def _per_token_op(x: torch.Tensor, codes: torch.Tensor, sfa: torch.Tensor, use_ue8m0: bool) -> None:
    _run(x, codes, sfa, use_ue8m0)


@_per_token_op.register_fake
def _(x, codes, sfa, use_ue8m0):
    return None


run_test, run_bench = harness.bind(__name__)
