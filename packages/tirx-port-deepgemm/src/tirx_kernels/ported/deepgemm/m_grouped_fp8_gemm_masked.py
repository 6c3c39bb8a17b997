# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's m_grouped_fp8_gemm_nt_masked on SM90 (csrc/apis/gemm.hpp: m_grouped_fp8_fp4_gemm_nt_masked;
# csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp: sm90_m_grouped_fp8_gemm_masked_1d2d; GemmType::MGroupedMasked of
# deep_gemm/include/deep_gemm/scheduler/gemm.cuh) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b.
# Written anew in TIRx (kernel: _fp8_gemm_kernel.py with the m_masked schedule of _fp8_gemm_sched.py).
"""``m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected_m)``: the decode MoE GEMM. For each group
g, ``D[g, :masked_m[g]] = (A[g] * sfa[g]) (B[g] * sfb[g])^T`` in bf16 over the first ``masked_m[g]`` rows, with A
[G, max_m, K] e4m3 (``sfa`` [G, max_m, ceil(K/128)] 1x128 fp32 scales), B [G, N, K] e4m3 (``sfb`` [G, ceil(N/128),
ceil(K/128)] 128x128 fp32), D [G, max_m, N] bf16 and ``masked_m`` [G] int32 **on the device**: the launch (grid
``min(132, G * ceil(max_m/128) * N-tiles)``) does not depend on it, so a CUDA graph captured once replays with new
counts; the kernel reads the counts and walks only the tiles they cover. Rows at or past ``masked_m[g]`` are not
written (DeepGEMM writes the rest of the last tile with values of no meaning); counts are clamped to [0, max_m].

``expected_m`` (DeepGEMM's hint of the typical count) picks the tile (``choose_tile(G * expected_m, N)``); both tiles
are in the bundle. Artifacts: one per tile, every size at run time.
"""

from __future__ import annotations

import random

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C
from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O

KERNEL_META = {
    "name": "deepgemm_sm90_m_grouped_fp8_gemm_masked",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM m_grouped_fp8_gemm_nt_masked (SM90 1d2d, decode MoE): e4m3 A [G, max_m, K] x e4m3 B "
                   "[G, N, K] over each group's device-side masked_m rows, bf16 out; grid independent of the counts "
                   "(CUDA-graph safe)",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["m_grouped_fp8_gemm_nt_masked"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

# DeepGEMM's test shapes (tests/generators.py: enumerate_m_grouped_masked: G x expected rows in {32 x 192, 6 x 1024,
# 32 x 20, 6 x 20}, counts int(m * uniform(0.7, 1.3)), (N, K) as the contiguous GEMM's), max_m cut to what the
# counts reach (DeepGEMM allocates 4096; rows past the counts are never touched), the goal row 1 x 1024 x
# 4096 x 7168 with exact counts (a fixed FLOP count to time), and counts of 0 and of max_m.
CONFIGS = [
    {"label": "g1_m1024_n4096_k7168", "G": 1, "max_m": 1024, "m": 1024, "N": 4096, "K": 7168, "exact": True},
    {"label": "g6_m1024_n4096_k7168", "G": 6, "max_m": 1408, "m": 1024, "N": 4096, "K": 7168},
    {"label": "g32_m192_n6144_k7168", "G": 32, "max_m": 256, "m": 192, "N": 6144, "K": 7168},
    {"label": "g32_m192_n4096_k2048", "G": 32, "max_m": 256, "m": 192, "N": 4096, "K": 2048},
    {"label": "g32_m20_n7168_k3072", "G": 32, "max_m": 128, "m": 20, "N": 7168, "K": 3072},
    {"label": "g6_m20_n4096_k4096", "G": 6, "max_m": 128, "m": 20, "N": 4096, "K": 4096},
    {"label": "g4_maxm384_n576_k1040_edges", "G": 4, "max_m": 384, "m": 200, "N": 576, "K": 1040,
     "masked_m": [0, 384, 1, 257]},
    {"label": "g3_maxm200_n2112_k512_zero_full", "G": 3, "max_m": 200, "m": 100, "N": 2112, "K": 512,
     "masked_m": [200, 0, 0]},
]
BENCH_CONFIGS = [
    {"label": "g1_m1024_n4096_k7168", "G": 1, "max_m": 1024, "m": 1024, "N": 4096, "K": 7168, "exact": True},
    {"label": "g4_m256_n4096_k7168", "G": 4, "max_m": 256, "m": 256, "N": 4096, "K": 7168, "exact": True},
    {"label": "g32_m192_n6144_k7168", "G": 32, "max_m": 256, "m": 192, "N": 6144, "K": 7168, "exact": True},
]
DEFAULTS = {"exact": False, "masked_m": None}
TILES = O.TILES
_OP = "m_grouped_fp8_gemm_nt_masked"


def counts(G: int, max_m: int, m: int, exact: bool = False, masked_m=None, rng=None, **_) -> list[int]:  # noqa: N803
    """Each group's rows: the config's list, ``m`` each (``exact``), or DeepGEMM's draw ``int(m * uniform(0.7,
    1.3))`` (``rng``: a ``random.Random``), at most ``max_m``."""
    if masked_m is not None:
        return list(masked_m)
    if exact:
        return [min(m, max_m)] * G
    rng = rng or random.Random(0)
    return [min(int(m * rng.uniform(0.7, 1.3)), max_m) for _ in range(G)]


def compile_params(G: int = 1, m: int = 128, N: int = 4096, tile: str | None = None, **_) -> dict:  # noqa: N803
    return {"tile": tile or O.choose_tile(G * m, N)}


def artifact_params() -> list[dict]:
    return O.tile_artifacts()


def call_samples(rng) -> list[dict]:
    out = []
    for _ in range(24):
        max_m = rng.choice([1, 64, 128, 4096, rng.randint(1, 8192)])
        out.append({"G": rng.choice([1, 6, 32, rng.randint(1, 256)]), "max_m": max_m, "m": rng.randint(1, max_m),
                    "N": 8 * rng.randint(1, 4096), "K": 16 * rng.randint(1, 1024)})
    return out


def get_kernel(tile: str):
    return O.build(KERNEL_META["name"], tile, "m_masked")


sass_expect = O.sass_expect


def prepare_data(G: int, max_m: int, m: int, N: int, K: int, exact: bool = False, masked_m=None,  # noqa: N803
                 **_) -> dict:
    """bf16 activations (rows of magnitudes 1e-2 .. 1e1) and per-expert weights cast by DeepGEMM's recipe, fresh
    counts per call (DeepGEMM's draw, unless the config fixes them), ``d`` a fresh output."""
    g, seed = F.cuda_generator()
    rows = counts(G, max_m, m, exact, masked_m, random.Random(seed))
    x = torch.randn(G, max_m, K, generator=g, device="cuda") * torch.logspace(-2, 1, max_m, device="cuda")[:, None]
    w = torch.randn(G, N, K, generator=g, device="cuda")
    a, sfa, b, sfb = O.quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))
    return {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "masked_m": torch.tensor(rows, dtype=torch.int32, device="cuda"),
            "d": torch.empty(G, max_m, N, dtype=torch.bfloat16, device="cuda")}


def reference(a, sfa, b, sfb, masked_m, **_) -> dict:
    """fp32 products of each group's first ``masked_m[g]`` rows; NaN on the rows that are not written."""
    out = torch.full((a.shape[0], a.shape[1], b.shape[1]), float("nan"), dtype=torch.float32, device=a.device)
    for g, rows in enumerate(masked_m.tolist()):
        rows = max(0, min(rows, a.shape[1]))
        if rows:
            out[g, :rows] = O.dequantize_a(a[g, :rows], sfa[g, :rows]) @ O.dequantize_b(b[g], sfb[g]).T
    return {"d": out}


def valid_rows(masked_m: torch.Tensor, max_m: int) -> torch.Tensor:
    """[G, max_m] bool: the rows the GEMM writes."""
    return torch.arange(max_m, device=masked_m.device)[None, :] < masked_m.clamp(0, max_m)[:, None]


def _comparator(got, want, cfg: dict, inputs: dict) -> dict:
    """calc_diff over the written rows (DeepGEMM compares those); the others must still hold what D held before
    (the harness's NaN poison: not written)."""
    if got.shape != want.shape:
        raise harness.KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
    valid = valid_rows(inputs["masked_m"].to(got.device), got.shape[1])
    if not got[~valid].isnan().all():
        raise harness.KernelCheckError(f"{int((~got[~valid].isnan()).sum())} outputs written past masked_m")
    if not valid.any():
        return {"calc_diff": 0.0, "rows": 0}
    return {**O.check_calc_diff(got[valid], want[valid]), "rows": int(valid.sum())}


COMPARATORS = {"d": _comparator}


def launch(cfg: dict, data: dict) -> None:
    m_grouped_fp8_gemm_nt_masked((data["a"], data["sfa"]), (data["b"], data["sfb"]), data["d"], data["masked_m"],
                                 cfg["m"])


def roofline(G: int, max_m: int, m: int, N: int, K: int, exact: bool = False, masked_m=None,  # noqa: N803
             **_) -> dict:
    """DeepGEMM's count: the rows of the counts (the expected ``G * m`` where they are drawn per run) times N times K;
    bytes of those rows of A and D, all of B, the scales."""
    rows = sum(counts(G, max_m, m, exact, masked_m)) if exact or masked_m is not None else G * min(m, max_m)
    kb, nb = C.ceil_div(K, C.GRAN), C.ceil_div(N, C.GRAN)
    nbytes = rows * K + G * N * K + 2 * rows * N + 4 * (rows * kb + G * nb * kb) + 4 * G
    return {"flops": 2 * rows * N * K, "bytes": nbytes, "ceiling": "fp8"}


def get_baselines(**cfg) -> dict:
    """torch: the fp32 oracle; deepgemm: ``deep_gemm.m_grouped_fp8_gemm_nt_masked``; cublas: cuBLASLt blockwise
    (1x128 x 128x128) ``torch._scaled_mm`` per group over its counted rows (the counts read once per data, on the
    host: a reference that could not be captured in a graph)."""
    def deepgemm(dg, d, out):
        dg.m_grouped_fp8_gemm_nt_masked((d["a"], d["sfa"]), (d["b"], d["sfb"]), out, d["masked_m"], cfg["m"])

    def plan(d):  # each group's counted rows with their M-major scales
        max_m = d["a"].shape[1]
        return [(g, r, F.m_major(d["sfa"][g, :r])) for g, r in enumerate(d["masked_m"].clamp(0, max_m).tolist()) if r]

    def cublas(d, plan):
        out = d["d"]
        for g, r, sfa_g in plan:
            O.scaled_mm_blockwise(d["a"][g, :r], sfa_g, d["b"][g], d["sfb"][g], out=out[g, :r])
        return {"d": out}

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm),
            "cublas": F.cublas_baseline(("a", "d"), plan, cublas)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(a, b, d, masked_m, expected_m, recipe=None, cuda: bool = True):
    """Validate the call; returns ``(a, sfa, b, sfb, G, max_m, N, K)``."""
    a, sfa, b, sfb = O.operand_pairs(_OP, a, b, 3, 3)
    G, max_m, K = a.shape  # noqa: N806
    N = b.shape[1]  # noqa: N806
    if b.shape[0] != G or b.shape[2] != K:
        _fail("b[0]", f"[G={G}, N, K={K}] (a[0] is {tuple(a.shape)})", f"shape {tuple(b.shape)}")
    if G == 0:
        _fail("a[0]", "at least one group", f"shape {tuple(a.shape)}")
    kb = C.ceil_div(K, C.GRAN)
    O.check_scales(_OP, "a[1]", sfa, (G, max_m, kb))
    O.check_scales(_OP, "b[1]", sfb, (G, C.ceil_div(N, C.GRAN), kb))
    checks.tensor(_OP, "d", d, dtypes=(torch.bfloat16,), shape=(G, max_m, N), cuda=False)
    checks.tensor(_OP, "masked_m", masked_m, dtypes=(torch.int32,), shape=(G,), contiguous=True, cuda=False)
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        _fail("expected_m", "a positive int (the typical rows per group: it picks the tile)", expected_m)
    O.check_recipe(_OP, recipe)
    if K == 0:
        _fail("a[0]", "K > 0 (DeepGEMM's masked GEMM requires it)", f"shape {tuple(a.shape)}")
    O.check_rows(_OP, "a[0].shape[2]", K, "d.shape[2]", N)
    O.check_even_strides(_OP, d, "even row and group strides")
    if cuda:
        O.check_cuda(_OP, **{"a[0]": a, "a[1]": sfa, "b[0]": b, "b[1]": sfb, "d": d, "masked_m": masked_m})
    return a, sfa, b, sfb, G, max_m, N, K


def kernel_args(a, sfa, b, sfb, d, masked_m) -> tuple:
    """The kernel's arguments ``(a, sfa, b, sfb, d, masked_m, ldd, ldg)``: A and B as contiguous ``[G, rows, K]``, sfa
    as its flat MN-major buffer (each group's ``ceil(K/128)`` columns of ``align(max_m, 4)``), d as 32-bit words of
    bf16 pairs with its row and group strides."""
    K = a.shape[2]  # noqa: N806
    return (O.tma_aligned(a), O.flat_sf(sfa, K), O.tma_aligned(b), sfb.contiguous(), O.d_words(d), masked_m,
            d.stride(1), d.stride(0))


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(a, sfa, b, sfb, d, masked_m, expected_m: int, tile: str | None = None) -> None:
    fn = O.kernel_function(_FUNCTIONS, a, tile=tile or O.choose_tile(a.shape[0] * expected_m, b.shape[1]))
    fn(*kernel_args(a, sfa, b, sfb, d, masked_m))


def m_grouped_fp8_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int, recipe=None,
                                 recipe_a=None, recipe_b=None, compiled_dims: str = "nk",
                                 disable_ue8m0_cast: bool = False) -> None:
    """DeepGEMM's ``m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, ...)``: ``d[g, :masked_m[g]] =
    (a[0][g] * a[1][g])[:masked_m[g]] @ (b[0][g] * b[1][g]).T`` in place, the other rows untouched. SM90's recipe only
    (``recipe`` None or (1, 128, 128)); ``recipe_a`` / ``recipe_b`` are SM100's and raise; ``compiled_dims`` and
    ``disable_ue8m0_cast`` are accepted and ignored."""
    O.check_sm100_recipes(_OP, recipe_a, recipe_b)
    a_, sfa, b_, sfb, G, max_m, N, K = check_inputs(a, b, d, masked_m, expected_m, recipe)  # noqa: N806
    if max_m == 0 or N == 0:
        return
    if runtime.direct_call(a_, sfa, b_, sfb, d, masked_m):
        _run(a_, sfa, b_, sfb, d, masked_m, expected_m)
    else:
        torch.ops.tirx.deepgemm_m_grouped_fp8_gemm_nt_masked(a_, sfa, b_, sfb, d, masked_m, expected_m)


@torch.library.custom_op("tirx::deepgemm_m_grouped_fp8_gemm_nt_masked", mutates_args=("d",))
def _op(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
        masked_m: torch.Tensor, expected_m: int) -> None:
    _run(a, sfa, b, sfb, d, masked_m, expected_m)


@_op.register_fake
def _(a, sfa, b, sfb, d, masked_m, expected_m):
    return None


run_test, run_bench = harness.bind(__name__)
