# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's fp8_gemm_nt on SM90 with the 1D-2D recipe (csrc/apis/gemm.hpp: fp8_fp4_gemm_nt;
# csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp; deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh) at
# deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b. Written anew in TIRx (kernel: _fp8_gemm_kernel.py).
"""``fp8_gemm_nt((a, sfa), (b, sfb), d, c=None)``: ``D[M, N] bf16 = (A * sfa) (B * sfb)^T (+ C)`` with A [M, K]
and B [N, K] float8_e4m3fn (K-major: NT only), ``sfa`` [M, ceil(K/128)] fp32 per-token 1x128 scales and ``sfb``
[ceil(N/128), ceil(K/128)] fp32 128x128 block scales (DeepGEMM's SM90 default recipe (1, 128, 128)), fp32
accumulation promoted per 128-K block (``_fp8_gemm_kernel``). ``sfa`` in the MN-major TMA-aligned layout
(``per_token_cast_to_fp8``'s output) is read in place; any other layout is made so first, as DeepGEMM's
``transform_sf_into_required_layout`` does. ``c`` (bf16 [M, N]) is copied into ``d`` and accumulated into
(DeepGEMM's convention; its SM90 1d2d kernel itself rejects ``c``, this one adds it in the epilogue).

Artifacts: one per (tile, accumulate), M, N, K at run time (K % 16 == 0 and N % 8 == 0: 16-byte TMA rows of
A / B and 4-byte pairs of D). The tile heuristic (``choose_tile``): 128 x 64 tiles while 128 x 128 ones would not
fill the 132 SMs once, else 128 x 128.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C
from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O

KERNEL_META = {
    "name": "deepgemm_sm90_fp8_gemm_1d2d",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM fp8_gemm_nt (SM90 1d2d): e4m3 A (1x128 fp32 scales) x e4m3 B (128x128 fp32 scales), "
                   "bf16 out, promoted fp32 accumulation, optional C; warp-specialized TMA + wgmma k32",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["fp8_gemm_nt"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

# DeepGEMM's test shapes (tests/generators.py: DeepSeek-V3 projections, M = 128 / 4096) and ragged edges.
CONFIGS = [
    {"label": "m128_n2112_k7168", "M": 128, "N": 2112, "K": 7168},
    {"label": "m4096_n2112_k7168", "M": 4096, "N": 2112, "K": 7168},
    {"label": "m4096_n24576_k1536", "M": 4096, "N": 24576, "K": 1536},
    {"label": "m4096_n32768_k512", "M": 4096, "N": 32768, "K": 512},
    {"label": "m4096_n7168_k16384", "M": 4096, "N": 7168, "K": 16384},
    {"label": "m4096_n4096_k7168", "M": 4096, "N": 4096, "K": 7168},
    {"label": "m4096_n7168_k2048", "M": 4096, "N": 7168, "K": 2048},
    {"label": "m4096_n576_k7168", "M": 4096, "N": 576, "K": 7168},
    {"label": "m1_n2112_k7168", "M": 1, "N": 2112, "K": 7168},
    {"label": "m17_n576_k512_ragged", "M": 17, "N": 576, "K": 512},
    {"label": "m4097_n2112_k1040_ragged", "M": 4097, "N": 2112, "K": 1040},
    {"label": "m200_n136_k384_accumulate", "M": 200, "N": 136, "K": 384, "accumulate": True},
]
BENCH_CONFIGS = [
    {"label": "m128_n2112_k7168", "M": 128, "N": 2112, "K": 7168},
    {"label": "m4096_n4096_k7168", "M": 4096, "N": 4096, "K": 7168},
    {"label": "m4096_n7168_k16384", "M": 4096, "N": 7168, "K": 16384},
]
DEFAULTS = {"accumulate": False}
NUM_SMS, GROUP_M, TILES, CALC_DIFF_MAX = O.NUM_SMS, O.GROUP_M, O.TILES, O.CALC_DIFF_MAX
calc_diff, choose_tile, sass_expect = O.calc_diff, O.choose_tile, O.sass_expect
COMPARATORS = {"d": O.calc_diff_comparator}
_OP = "fp8_gemm_nt"


def compile_params(M: int = 4096, N: int = 4096, accumulate: bool = False, tile: str | None = None, **_) -> dict:  # noqa: N803
    return {"tile": tile or choose_tile(M, N), "accumulate": bool(accumulate)}


def artifact_params() -> list[dict]:
    return O.tile_artifacts(accumulate=True)


def call_samples(rng) -> list[dict]:
    return [{"M": rng.choice([1, 17, 128, 4096, rng.randint(1, 20000)]), "N": 8 * rng.randint(1, 4096),
             "K": 16 * rng.randint(1, 1024), "accumulate": acc} for acc in (False, True) for _ in range(12)]


def get_kernel(tile: str, accumulate: bool = False):
    return O.build(KERNEL_META["name"], tile, "dense", accumulate)


def dequantize(a, sfa, b, sfb):
    """The fp32 operands the oracle multiplies: codes times their (broadcast) scales."""
    return O.dequantize_a(a, sfa), O.dequantize_b(b, sfb)


def prepare_data(M: int, N: int, K: int, accumulate: bool = False, **_) -> dict:  # noqa: N803
    """bf16 activations and weights (rows of magnitudes 1e-2 .. 1e1) cast by DeepGEMM's recipe (the torch oracle of
    the casts), ``sfa`` in the MN-major TMA-aligned layout, ``d`` a fresh output; ``c`` random bf16 when
    accumulating."""
    g, _ = F.cuda_generator()
    x = (torch.randn(M, K, generator=g, device="cuda") * torch.logspace(-2, 1, M, device="cuda")[:, None])
    w = torch.randn(N, K, generator=g, device="cuda")
    a, sfa, b, sfb = O.quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))
    data = {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": torch.empty(M, N, dtype=torch.bfloat16, device="cuda")}
    if accumulate:
        data["c"] = torch.randn(M, N, generator=g, device="cuda").to(torch.bfloat16)
    return data


def reference(a, sfa, b, sfb, c=None, **_) -> dict:
    a32, b32 = dequantize(a, sfa, b, sfb)
    out = a32 @ b32.T
    return {"d": out if c is None else out + c.float()}


def launch(cfg: dict, data: dict) -> None:
    fp8_gemm_nt((data["a"], data["sfa"]), (data["b"], data["sfb"]), data["d"], c=data.get("c"))


def roofline(M: int, N: int, K: int, accumulate: bool = False, **_) -> dict:  # noqa: N803
    kb = C.ceil_div(K, C.GRAN)
    nbytes = M * K + N * K + 2 * M * N * (2 if accumulate else 1) + 4 * (M * kb + C.ceil_div(N, C.GRAN) * kb)
    return {"flops": 2 * M * N * K, "bytes": nbytes}


def get_baselines(**cfg) -> dict:
    """torch: the fp32 oracle (dequantized operands, fp32 matmul); deepgemm: ``deep_gemm.fp8_gemm_nt`` (SM90 1d2d,
    no ``c``); cublas: cuBLASLt blockwise (1x128 x 128x128) ``torch._scaled_mm``, the issue's speed reference (``+ c``
    in one elementwise pass more where accumulating)."""
    def deepgemm(dg, d, out):
        dg.fp8_gemm_nt((d["a"], d["sfa"]), (d["b"], d["sfb"]), out)
        if d.get("c") is not None:  # DeepGEMM's SM90 1d2d has no C: accumulate on the host side
            return (d["c"].float() + out.float()).to(torch.bfloat16)

    def cublas(d, sfa):  # sfa: the M-major scale copy cuBLASLt takes, made once per data
        out = d["d"]
        O.scaled_mm_blockwise(d["a"], sfa, d["b"], d["sfb"], out=out)
        if d.get("c") is not None:
            out += d["c"]
        return {"d": out}

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm),
            "cublas": F.cublas_baseline(("sfa",), lambda d: F.m_major(d["sfa"]), cublas)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(a, b, d, c=None, recipe=None, cuda: bool = True):
    """Validate the call; returns ``(a, sfa, b, sfb, M, N, K)``."""
    a, sfa, b, sfb = O.operand_pairs(_OP, a, b, 2, 2)
    M, K = a.shape  # noqa: N806
    N = b.shape[0]  # noqa: N806
    if b.shape[1] != K:
        _fail("b[0]", f"K={K} columns (a[0] is {tuple(a.shape)})", f"shape {tuple(b.shape)}")
    kb = C.ceil_div(K, C.GRAN)
    O.check_scales(_OP, "a[1]", sfa, (M, kb))
    O.check_scales(_OP, "b[1]", sfb, (C.ceil_div(N, C.GRAN), kb))
    checks.tensor(_OP, "d", d, dtypes=(torch.bfloat16,), shape=(M, N), cuda=False)
    if c is not None:
        checks.tensor(_OP, "c", c, dtypes=(torch.bfloat16,), shape=(M, N), cuda=False)
    O.check_recipe(_OP, recipe, also="; (1, 1, 128) is the 1d1d GEMM")
    O.check_rows(_OP, "a[0].shape[1]", K, "d.shape[1]", N)
    O.check_even_strides(_OP, d)
    if cuda:
        O.check_cuda(_OP, **{"a[0]": a, "a[1]": sfa, "b[0]": b, "b[1]": sfb, "d": d, "c": c})
    return a, sfa, b, sfb, M, N, K


def _sfa_in_layout(sfa: torch.Tensor, M: int, K: int) -> torch.Tensor:  # noqa: N803
    """``sfa`` as the kernel reads it: the MN-major TMA-aligned tensor itself, else a copy made so."""
    return O.sf_in_layout(sfa, K)


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(a, sfa, b, sfb, d, c=None, tile: str | None = None) -> None:
    """The launch (eager body of the custom op too): C into D, then the kernel, accumulating where ``c`` is given."""
    O.run_dense(_FUNCTIONS, kernel_args, a, sfa, b, sfb, d, c, tile)


def kernel_args(a, sfa, b, sfb, d) -> tuple:
    """The kernel's arguments ``(a, sfa, b, sfb, d, ldd)``: sfa as its flat MN-major buffer (exactly the span the
    tensor covers), d as 32-bit words of bf16 pairs with its row stride."""
    K = a.shape[1]  # noqa: N806
    return (O.tma_aligned(a), O.flat_sf(sfa, K), O.tma_aligned(b), sfb.contiguous(), O.d_words(d), d.stride(0))


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor | None = None, recipe=None, compiled_dims: str = "nk",
                disable_ue8m0_cast: bool = False) -> None:
    """DeepGEMM's ``fp8_gemm_nt(a, b, d, c=None, recipe=None, compiled_dims='nk', disable_ue8m0_cast=False)``:
    ``d = (a[0] * a[1]) @ (b[0] * b[1]).T (+ c)`` in place, ``a = (A [M, K] e4m3, sfa [M, ceil(K/128)] fp32)``,
    ``b = (B [N, K] e4m3, sfb [ceil(N/128), ceil(K/128)] fp32)``, ``d`` / ``c`` bf16 [M, N]. ``compiled_dims`` and
    ``disable_ue8m0_cast`` (JIT specialization and SM100 scale packing in DeepGEMM) are accepted and ignored.
    ``recipe=(1, 1, 128)`` (1x128 scales on B too, fp32 ``d``) goes to ``fp8_gemm_1d1d.fp8_gemm_nt``, as DeepGEMM's
    entry point dispatches."""
    if recipe == (1, 1, 128):
        from . import fp8_gemm_1d1d

        return fp8_gemm_1d1d.fp8_gemm_nt(a, b, d, c=c, recipe=recipe, compiled_dims=compiled_dims,
                                         disable_ue8m0_cast=disable_ue8m0_cast)
    a_, sfa, b_, sfb, M, N, K = check_inputs(a, b, d, c, recipe)  # noqa: N806
    if M == 0 or N == 0:
        return
    if K == 0:
        O.c_or_zero(c, d)
        return
    if runtime.direct_call(a_, sfa, b_, sfb, d, c):
        _run(a_, sfa, b_, sfb, d, c)
    else:
        torch.ops.tirx.deepgemm_fp8_gemm_nt(a_, sfa, b_, sfb, d, c)


@torch.library.custom_op("tirx::deepgemm_fp8_gemm_nt", mutates_args=("d",))
def _fp8_gemm_op(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                 c: torch.Tensor | None) -> None:
    _run(a, sfa, b, sfb, d, c)


@_fp8_gemm_op.register_fake
def _(a, sfa, b, sfb, d, c):
    return None


run_test, run_bench = harness.bind(__name__)
