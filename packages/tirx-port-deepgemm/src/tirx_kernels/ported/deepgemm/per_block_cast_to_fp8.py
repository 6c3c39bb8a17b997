# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's per_block_cast_to_fp8 (deep_gemm/utils/math.py) with the SFB layout its SM90 GEMMs accept
# (check_sf_layout, csrc/utils/layout.hpp) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b.
# DeepGEMM casts in torch; this is a CUDA-core TIRx kernel for sm_90a.
"""Per-block (128x128) FP8 cast of a weight: ``x`` [N, K] bf16/fp16 -> ``(x_fp8 [N, K] float8_e4m3fn,
sfb [ceil(N/128), ceil(K/128)] fp32 row-major)``, the layout ``fp8_gemm_nt`` takes for B. DeepGEMM's recipe
(``_fp8_cast``): ``sf = max(amax, 1e-4) / 448`` per 128x128 block (``use_ue8m0``: rounded up to a power of two),
codes ``e4m3(x * (1 / sf))``; bit-exact with DeepGEMM's torch formulas.

One artifact per (dtype, use_ue8m0), N and K at run time (K a multiple of 8; ragged edge blocks are allowed).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import harness, runtime

from . import _fp8_cast as C

KERNEL_META = {
    "name": "deepgemm_per_block_cast_to_fp8",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM per-block (128x128) e4m3 cast of a weight, fp32 / UE8M0 block scales",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["per_block_cast_to_fp8"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

CONFIGS = [  # DeepSeek-V3 weight shapes [N, K] (DeepGEMM's test shapes) and ragged edges
    {"label": "bf16_n2112_k7168", "dtype": "bfloat16", "use_ue8m0": False, "N": 2112, "K": 7168},
    {"label": "bf16_ue8m0_n576_k7168", "dtype": "bfloat16", "use_ue8m0": True, "N": 576, "K": 7168},
    {"label": "bf16_n24576_k1536", "dtype": "bfloat16", "use_ue8m0": False, "N": 24576, "K": 1536},
    {"label": "fp16_ue8m0_n7168_k2048", "dtype": "float16", "use_ue8m0": True, "N": 7168, "K": 2048},
    {"label": "bf16_n7168_k16384", "dtype": "bfloat16", "use_ue8m0": False, "N": 7168, "K": 16384},
    {"label": "bf16_n17_k200_ragged", "dtype": "bfloat16", "use_ue8m0": False, "N": 17, "K": 200},
    {"label": "bf16_ue8m0_n136_k584_ragged", "dtype": "bfloat16", "use_ue8m0": True, "N": 136, "K": 584},
]
BENCH_CONFIGS = [
    {"label": "bf16_ue8m0_n576_k7168", "dtype": "bfloat16", "use_ue8m0": True, "N": 576, "K": 7168},
    {"label": "bf16_n2112_k7168", "dtype": "bfloat16", "use_ue8m0": False, "N": 2112, "K": 7168},
    {"label": "bf16_n7168_k16384", "dtype": "bfloat16", "use_ue8m0": False, "N": 7168, "K": 16384},
]
DEFAULTS = {"dtype": "bfloat16", "use_ue8m0": False}
COMPARATORS = {"x_fp8": harness.bit_exact, "sfb": harness.bit_exact}
_OP = "per_block_cast_to_fp8"


def compile_params(dtype: str, use_ue8m0: bool = False, **_) -> dict:
    return {"dtype": dtype, "use_ue8m0": bool(use_ue8m0)}


def artifact_params() -> list[dict]:
    return [{"dtype": t, "use_ue8m0": u} for t in C.DTYPES for u in (False, True)]


def call_samples(rng) -> list[dict]:
    return [{"dtype": t, "use_ue8m0": u, "N": rng.choice([1, 17, 4096, rng.randint(1, 20000)]),
             "K": 8 * rng.randint(1, 2048)} for t in C.DTYPES for u in (False, True) for _ in range(6)]


def get_kernel(dtype: str, use_ue8m0: bool = False):
    return C.build_per_block_kernel(dtype, use_ue8m0, "deepgemm_per_block_cast_to_fp8")


def sass_expect(**_) -> list[str]:
    return [r"LDG\.E(\.[A-Z]+)*\.128", r"STG\.E\.64", r"SHFL\.BFLY", r"BAR\.SYNC"]


def prepare_data(dtype: str, N: int, K: int, use_ue8m0: bool = False, **_) -> dict:  # noqa: N803
    import os

    seed = int(os.environ.get("TIRX_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    x = C.random_input(N, K, C.DTYPES[dtype], seed, device="cuda")
    return {"x": x, "use_ue8m0": bool(use_ue8m0),
            "x_fp8": torch.empty(N, K, dtype=torch.float8_e4m3fn, device="cuda"),
            "sfb": torch.empty(C.ceil_div(N, C.GRAN), C.ceil_div(K, C.GRAN), device="cuda")}


def reference(x, use_ue8m0: bool = False, **_) -> dict:
    """DeepGEMM's formulas in torch."""
    codes, sf = C.per_block_ref(x, use_ue8m0)
    return {"x_fp8": codes, "sfb": sf}


def launch(cfg: dict, data: dict) -> None:
    _run(data["x"], data["x_fp8"], data["sfb"], data["use_ue8m0"])


def roofline(N: int, K: int, dtype: str = "bfloat16", **_) -> dict:  # noqa: N803
    """The input read once; codes and scales written once."""
    return {"bytes": N * K * 2 + N * K + 4 * C.ceil_div(N, C.GRAN) * C.ceil_div(K, C.GRAN), "flops": 3 * N * K}


def get_baselines(**cfg) -> dict:
    """torch: DeepGEMM's formulas (``_fp8_cast.per_block_ref``); deepgemm: ``deep_gemm.utils.per_block_cast_to_fp8``
    (DeepGEMM's own torch code, from the installed package)."""
    use_ue8m0 = bool(cfg.get("use_ue8m0", False))

    def torch_ref():
        return lambda d: reference(d["x"], use_ue8m0)

    def deepgemm_ref():
        from deep_gemm.utils import math as dg_math

        def run(d):
            codes, sf = dg_math.per_block_cast_to_fp8(d["x"], use_ue8m0=use_ue8m0)
            return {"x_fp8": codes, "sfb": sf}

        return run

    return {"torch": torch_ref, "deepgemm": deepgemm_ref}


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(x, codes, sfb, use_ue8m0: bool) -> None:
    dtype = str(x.dtype)[6:]
    fn = _FUNCTIONS.get((x.dtype, use_ue8m0, x.get_device()), lambda: {"dtype": dtype, "use_ue8m0": use_ue8m0},
                        x.device)
    C.run_per_block(fn, x, codes, sfb)


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False,
                          gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's ``per_block_cast_to_fp8``: ``(x_fp8 [N, K] float8_e4m3fn, sfb [ceil(N/128), ceil(K/128)] fp32)``,
    row-major scales (the SM90 GEMM reads them as they are). ``gran_k`` must be 128 (the SM90 recipe)."""
    C.check_gran_k(_OP, gran_k)
    C.check_input(_OP, x)
    n, k = x.shape
    codes = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=x.device)
    sfb = torch.empty(C.ceil_div(n, C.GRAN), C.ceil_div(k, C.GRAN), dtype=torch.float32, device=x.device)
    if runtime.direct_call(x):
        _run(x, codes, sfb, bool(use_ue8m0))
    else:
        torch.ops.tirx.deepgemm_per_block_cast_to_fp8(x, codes, sfb, bool(use_ue8m0))
    return codes, sfb


@torch.library.custom_op("tirx::deepgemm_per_block_cast_to_fp8", mutates_args=("codes", "sfb"))
def _per_block_op(x: torch.Tensor, codes: torch.Tensor, sfb: torch.Tensor, use_ue8m0: bool) -> None:
    _run(x, codes, sfb, use_ue8m0)


@_per_block_op.register_fake
def _(x, codes, sfb, use_ue8m0):
    return None


run_test, run_bench = harness.bind(__name__)
