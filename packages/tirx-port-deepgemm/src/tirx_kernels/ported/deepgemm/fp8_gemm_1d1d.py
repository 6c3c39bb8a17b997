# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's fp8_gemm_nt on SM90 with the 1D-1D recipe (csrc/apis/gemm.hpp: fp8_fp4_gemm_nt with recipe
# (1, 1, 128); csrc/jit_kernels/impls/sm90_fp8_gemm_1d1d.hpp; deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d1d.cuh)
# at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b. Written anew in TIRx (kernel: _fp8_gemm_kernel.py,
# recipe "1d1d").
"""``fp8_gemm_nt((a, sfa), (b, sfb), d, c=None, recipe=(1, 1, 128))``: the weight-gradient form, ``D[M, N] fp32 (=
C +) (A * sfa) (B * sfb)^T`` with A [M, K] and B [N, K] float8_e4m3fn (K-major: NT only) and 1x128 fp32 scales on
*both* sides (``sfa`` [M, ceil(K/128)], ``sfb`` [N, ceil(K/128)]: per_token_cast_to_fp8 of each operand), fp32
accumulation promoted per 128-K block with ``sfa[m] * sfb[n]``. Both scale tensors in the MN-major TMA-aligned layout
are read in place (any other layout is made so first). ``c`` (fp32 [M, N], may be ``d`` itself) is copied into ``d``
and the kernel adds into it (DeepGEMM's SM90 1d1d requires ``c`` and reduce-adds into D; here ``c=None`` gives the
plain product). ``fp8_gemm_1d2d.fp8_gemm_nt`` sends ``recipe=(1, 1, 128)`` here, as DeepGEMM's entry point does.

Artifacts: one per (tile, accumulate), M, N, K at run time (K % 16 == 0, N % 8 == 0); the tiles and heuristic of the
1d2d kernel, each stage also carrying the tile's ``block_n`` sfb values (one TMA box of the MN-major scale row).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C
from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O

KERNEL_META = {
    "name": "deepgemm_sm90_fp8_gemm_1d1d",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM fp8_gemm_nt recipe (1, 1, 128) (SM90 1d1d, wgrad): e4m3 A and B with 1x128 fp32 scales "
                   "on both, fp32 out, D (+)= C + A B^T; the 1d2d mainloop with per-column promotion",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["fp8_gemm_nt"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

# DeepGEMM's SM90 wgrad shapes (tests/generators.py: enumerate_normal's backward rows with the 1D1D kernel: M = the
# forward N, N = 4096, fp32 out with accumulation) and ragged edges (with and without C).
CONFIGS = [
    {"label": "m2112_n4096_k7168_acc", "M": 2112, "N": 4096, "K": 7168},
    {"label": "m4096_n4096_k7168_acc", "M": 4096, "N": 4096, "K": 7168},
    {"label": "m7168_n4096_k16384_acc", "M": 7168, "N": 4096, "K": 16384},
    {"label": "m24576_n4096_k1536_acc", "M": 24576, "N": 4096, "K": 1536},
    {"label": "m576_n4096_k7168_acc", "M": 576, "N": 4096, "K": 7168},
    {"label": "m17_n136_k1040_acc_ragged", "M": 17, "N": 136, "K": 1040},
    {"label": "m4097_n576_k512_ragged", "M": 4097, "N": 576, "K": 512, "accumulate": False},
]
BENCH_CONFIGS = [
    {"label": "m4096_n4096_k7168_acc", "M": 4096, "N": 4096, "K": 7168},
    {"label": "m7168_n4096_k16384_acc", "M": 7168, "N": 4096, "K": 16384},
    {"label": "m2112_n4096_k7168_acc", "M": 2112, "N": 4096, "K": 7168},
]
DEFAULTS = {"accumulate": True}
TILES = O.TILES
COMPARATORS = {"d": O.calc_diff_comparator}
RECIPE = (1, 1, 128)
_OP = "fp8_gemm_nt"


def compile_params(M: int = 4096, N: int = 4096, accumulate: bool = True, tile: str | None = None, **_) -> dict:  # noqa: N803
    return {"tile": tile or O.choose_tile(M, N), "accumulate": bool(accumulate)}


def artifact_params() -> list[dict]:
    return O.tile_artifacts(accumulate=True)


def call_samples(rng) -> list[dict]:
    return [{"M": rng.choice([1, 17, 128, 4096, rng.randint(1, 30000)]), "N": 8 * rng.randint(1, 4096),
             "K": 16 * rng.randint(1, 1024), "accumulate": acc} for acc in (False, True) for _ in range(12)]


def get_kernel(tile: str, accumulate: bool = True):
    return O.build(KERNEL_META["name"], tile, "dense", accumulate, recipe="1d1d")


sass_expect = O.sass_expect


def prepare_data(M: int, N: int, K: int, accumulate: bool = True, **_) -> dict:  # noqa: N803
    """bf16 operands (rows of A of magnitudes 1e-2 .. 1e1) cast per token (1x128) on both sides by DeepGEMM's
    recipe, the scales MN-major; ``c`` fp32 (DeepGEMM's wgrad test: randn * 32) when accumulating."""
    g, _ = F.cuda_generator()
    x = torch.randn(M, K, generator=g, device="cuda") * torch.logspace(-2, 1, M, device="cuda")[:, None]
    w = torch.randn(N, K, generator=g, device="cuda")
    a, sfa, b, sfb = quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))
    data = {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "d": torch.empty(M, N, dtype=torch.float32, device="cuda")}
    if accumulate:
        data["c"] = torch.randn(M, N, generator=g, device="cuda") * 32
    return data


def quantized_operands(x: torch.Tensor, w: torch.Tensor):
    """Per-token casts (the torch oracle) of both operands, the scales in the MN-major TMA-aligned layout."""
    a, sfa = C.per_token_ref(x)
    b, sfb = C.per_token_ref(w)
    return a, O.sf_in_layout(sfa, x.shape[1]), b, O.sf_in_layout(sfb, w.shape[1])


def reference(a, sfa, b, sfb, c=None, **_) -> dict:
    out = O.dequantize_a(a, sfa) @ O.dequantize_a(b, sfb).T
    return {"d": out if c is None else out + c}


def launch(cfg: dict, data: dict) -> None:
    fp8_gemm_nt((data["a"], data["sfa"]), (data["b"], data["sfb"]), data["d"], c=data.get("c"), recipe=RECIPE)


def roofline(M: int, N: int, K: int, accumulate: bool = True, **_) -> dict:  # noqa: N803
    kb = C.ceil_div(K, C.GRAN)
    nbytes = M * K + N * K + 4 * M * N * (2 if accumulate else 1) + 4 * kb * (M + N)
    return {"flops": 2 * M * N * K, "bytes": nbytes, "ceiling": "fp8"}


def get_baselines(**cfg) -> dict:
    """torch: the fp32 oracle; deepgemm: ``deep_gemm.fp8_gemm_nt(..., recipe=(1, 1, 128))`` (it needs ``c``: zeros
    stand in without one); cublas: cuBLASLt blockwise 1x128 x 1x128 ``torch._scaled_mm`` with fp32 out, then ``+= c``
    (one elementwise pass more than a fused accumulation)."""
    def deepgemm(dg, d, out):
        O.c_or_zero(d.get("c"), out)
        dg.fp8_gemm_nt((d["a"], d["sfa"]), (d["b"], d["sfb"]), out, c=out, recipe=RECIPE)

    def cublas(d, _):
        out = d["d"]
        O.scaled_mm_blockwise(d["a"], d["sfa"], d["b"], d["sfb"], out=out, out_dtype=torch.float32)
        if d.get("c") is not None:
            out += d["c"]
        return {"d": out}

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm),
            "cublas": F.cublas_baseline((), lambda d: None, cublas, one_by_one=True)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(a, b, d, c=None, recipe=RECIPE, cuda: bool = True):
    """Validate the call; returns ``(a, sfa, b, sfb, M, N, K)``."""
    a, sfa, b, sfb = O.operand_pairs(_OP, a, b, 2, 2)
    M, K = a.shape  # noqa: N806
    N = b.shape[0]  # noqa: N806
    if b.shape[1] != K:
        _fail("b[0]", f"K={K} columns (a[0] is {tuple(a.shape)})", f"shape {tuple(b.shape)}")
    kb = C.ceil_div(K, C.GRAN)
    O.check_scales(_OP, "a[1]", sfa, (M, kb))
    O.check_scales(_OP, "b[1]", sfb, (N, kb))
    checks.tensor(_OP, "d", d, dtypes=(torch.float32,), shape=(M, N), cuda=False)
    if c is not None:
        checks.tensor(_OP, "c", c, dtypes=(torch.float32,), shape=(M, N), cuda=False)
    if recipe not in (None, RECIPE):
        _fail("recipe", f"{RECIPE} (1x128 scales on both operands; fp8_gemm_1d2d takes (1, 128, 128))", recipe)
    O.check_rows(_OP, "a[0].shape[1]", K, "d.shape[1]", N, pairs="D is written in pairs")
    if cuda:
        O.check_cuda(_OP, **{"a[0]": a, "a[1]": sfa, "b[0]": b, "b[1]": sfb, "d": d, "c": c})
    return a, sfa, b, sfb, M, N, K


def kernel_args(a, sfa, b, sfb, d) -> tuple:
    """The kernel's arguments ``(a, sfa, b, sfb, d, ldd)``: both scale tensors as their flat MN-major buffers, d as
    the fp32 span it covers with its row stride."""
    K = a.shape[1]  # noqa: N806
    span = d.stride(0) * (d.shape[0] - 1) + d.shape[1]
    return (O.tma_aligned(a), O.flat_sf(sfa, K), O.tma_aligned(b), O.flat_sf(sfb, K), d.as_strided((span,), (1,)),
            d.stride(0))


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(a, sfa, b, sfb, d, c=None, tile: str | None = None) -> None:
    """The launch (eager body of the custom op too): C into D, then the kernel, accumulating where ``c`` is given."""
    O.run_dense(_FUNCTIONS, kernel_args, a, sfa, b, sfb, d, c, tile)


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor | None = None, recipe=RECIPE, compiled_dims: str = "nk",
                disable_ue8m0_cast: bool = False) -> None:
    """DeepGEMM's ``fp8_gemm_nt(a, b, d, c, recipe=(1, 1, 128))`` on SM90: ``d = (c +) (a[0] * a[1]) @ (b[0] *
    b[1]).T`` in fp32, in place; ``a = (A [M, K] e4m3, sfa [M, ceil(K/128)])``, ``b = (B [N, K] e4m3, sfb [N,
    ceil(K/128)])``. ``compiled_dims`` and ``disable_ue8m0_cast`` are accepted and ignored."""
    a_, sfa, b_, sfb, M, N, K = check_inputs(a, b, d, c, recipe)  # noqa: N806
    if M == 0 or N == 0:
        return
    if K == 0:
        O.c_or_zero(c, d)
        return
    if runtime.direct_call(a_, sfa, b_, sfb, d, c):
        _run(a_, sfa, b_, sfb, d, c)
    else:
        torch.ops.tirx.deepgemm_fp8_gemm_nt_1d1d(a_, sfa, b_, sfb, d, c)


@torch.library.custom_op("tirx::deepgemm_fp8_gemm_nt_1d1d", mutates_args=("d",))
def _fp8_gemm_op(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                 c: torch.Tensor | None) -> None:
    _run(a, sfa, b, sfb, d, c)


@_fp8_gemm_op.register_fake
def _(a, sfa, b, sfb, d, c):
    return None


run_test, run_bench = harness.bind(__name__)
