# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's m_grouped_fp8_gemm_nt_contiguous on SM90 (csrc/apis/gemm.hpp: m_grouped_fp8_fp4_gemm_nt_contiguous;
# csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp: sm90_m_grouped_fp8_gemm_contiguous_1d2d; GemmType::MGroupedContiguous
# of deep_gemm/include/deep_gemm/scheduler/gemm.cuh) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b.
# Written anew in TIRx (kernel: _fp8_gemm_kernel.py with the m_contiguous schedule of _fp8_gemm_sched.py).
"""``m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout)``: the MoE forward GEMM. The rows of
A [M, K] e4m3 (``sfa`` [M, ceil(K/128)] 1x128 fp32 scales) are grouped by expert; ``grouped_layout`` [M] int32 gives
each row's group, -1 for a padding row, and every group starts on a 128-row boundary (DeepGEMM's SM90 alignment,
``get_mk_alignment_for_contiguous_layout() == 128``). ``D[m] = (A[m] * sfa[m]) (B[g] * sfb[g])^T`` in bf16 for
``g = grouped_layout[m]`` with B [G, N, K] e4m3 and sfb [G, ceil(N/128), ceil(K/128)] fp32 128x128 scales; rows of
group -1 are stored as 0 (DeepGEMM stores 0 or the padding row's product, the same for the zero padding its tests
and MoE dispatchers write). The layout stays on the device (no host sync; it is not validated: a group that does not
start on a 128-row boundary reads the first row's group for the whole tile, as DeepGEMM does).

Same mainloop, tiles and heuristic as ``fp8_gemm_nt`` (``choose_tile`` of all M rows); a tile whose first row is -1
loads and computes nothing. Artifacts: one per tile, every size at run time.
"""

from __future__ import annotations

import random

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C
from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O

KERNEL_META = {
    "name": "deepgemm_sm90_m_grouped_fp8_gemm_contiguous",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM m_grouped_fp8_gemm_nt_contiguous (SM90 1d2d, MoE forward): e4m3 A rows grouped by expert "
                   "(per-row group index, -1 padding) x per-expert e4m3 B [G, N, K], bf16 out; the fp8_gemm_nt "
                   "mainloop with a grouped tile schedule",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["m_grouped_fp8_gemm_nt_contiguous"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

# DeepGEMM's test shapes (tests/generators.py: enumerate_m_grouped_contiguous: G x expected rows per group in
# {4 x 8192, 8 x 4096}, (N, K) in {(6144, 7168), (7168, 3072), (4096, 4096), (4096, 2048)}), the goal row
# 4 x 8192 x 4096 x 7168, and ragged rows (K not a multiple of 128, N not of 128, an empty group, a padding tile).
CONFIGS = [
    {"label": "g4_m8192_n4096_k7168", "G": 4, "m": 8192, "N": 4096, "K": 7168},
    {"label": "g4_m8192_n6144_k7168", "G": 4, "m": 8192, "N": 6144, "K": 7168},
    {"label": "g4_m8192_n7168_k3072", "G": 4, "m": 8192, "N": 7168, "K": 3072},
    {"label": "g8_m4096_n4096_k4096", "G": 8, "m": 4096, "N": 4096, "K": 4096},
    {"label": "g8_m4096_n4096_k2048", "G": 8, "m": 4096, "N": 4096, "K": 2048},
    {"label": "g8_m4096_n7168_k3072", "G": 8, "m": 4096, "N": 7168, "K": 3072},
    {"label": "g3_m200_n576_k1040_empty_ragged", "G": 3, "m": 200, "N": 576, "K": 1040, "empty": 1, "pad_tiles": 1},
    {"label": "g5_m64_n2112_k512_empty_ragged", "G": 5, "m": 64, "N": 2112, "K": 512, "empty": 4},
]
BENCH_CONFIGS = [
    {"label": "g4_m8192_n4096_k7168", "G": 4, "m": 8192, "N": 4096, "K": 7168},
    {"label": "g4_m8192_n6144_k7168", "G": 4, "m": 8192, "N": 6144, "K": 7168},
    {"label": "g8_m4096_n7168_k3072", "G": 8, "m": 4096, "N": 7168, "K": 3072},
]
DEFAULTS = {"empty": None, "pad_tiles": 0}
TILES = O.TILES
ALIGN = 128  # DeepGEMM's SM90 M alignment of a group in the contiguous layout (= BLOCK_M)
_OP = "m_grouped_fp8_gemm_nt_contiguous"


def group_rows(G: int, m: int, empty=None, **_) -> list[int]:  # noqa: N803
    """Rows of each group: DeepGEMM's draw (``int(m * uniform(0.7, 1.3))``), seeded by the config so that the
    roofline and every run of a row see the same layout; group ``empty`` has none."""
    rng = random.Random(G * 1_000_003 + m)
    rows = [int(m * rng.uniform(0.7, 1.3)) for _ in range(G)]
    if empty is not None:
        rows[empty] = 0
    return rows


def total_rows(G: int, m: int, empty=None, pad_tiles: int = 0, **_) -> int:  # noqa: N803
    """M: each group aligned to 128 rows, plus ``pad_tiles`` tiles of padding rows at the end."""
    return sum(C.ceil_div(r, ALIGN) * ALIGN for r in group_rows(G, m, empty)) + pad_tiles * ALIGN


def make_layout(rows: list[int], M: int, device) -> torch.Tensor:  # noqa: N803
    """``grouped_layout``: group g on its rows from its 128-aligned start, -1 on the padding."""
    layout = torch.full((M,), -1, dtype=torch.int32)
    start = 0
    for g, r in enumerate(rows):
        layout[start:start + r] = g
        start += C.ceil_div(r, ALIGN) * ALIGN
    return layout.to(device)


def compile_params(G: int = 4, m: int = 4096, N: int = 4096, tile: str | None = None, **cfg) -> dict:  # noqa: N803
    return {"tile": tile or O.choose_tile(total_rows(G, m, **cfg), N)}


def artifact_params() -> list[dict]:
    return O.tile_artifacts()


def call_samples(rng) -> list[dict]:
    return [{"G": rng.choice([1, 4, 8, rng.randint(1, 64)]), "m": rng.choice([1, 128, 4096, rng.randint(1, 9000)]),
             "N": 8 * rng.randint(1, 4096), "K": 16 * rng.randint(1, 1024)} for _ in range(24)]


def get_kernel(tile: str):
    return O.build(KERNEL_META["name"], tile, "m_contiguous")


sass_expect = O.sass_expect


def prepare_data(G: int, m: int, N: int, K: int, empty=None, pad_tiles: int = 0, **_) -> dict:  # noqa: N803
    """bf16 activations (rows of magnitudes 1e-2 .. 1e1, zero padding rows as DeepGEMM's generator writes) and
    per-expert weights, cast by DeepGEMM's recipe (the torch oracle of the casts); ``d`` a fresh output."""
    g, _ = F.cuda_generator()
    M = total_rows(G, m, empty, pad_tiles)  # noqa: N806
    layout = make_layout(group_rows(G, m, empty), M, "cuda")
    x = torch.randn(M, K, generator=g, device="cuda") * torch.logspace(-2, 1, M, device="cuda")[:, None]
    x[layout < 0] = 0
    w = torch.randn(G, N, K, generator=g, device="cuda")
    a, sfa, b, sfb = O.quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))
    return {"a": a, "sfa": sfa, "b": b, "sfb": sfb, "grouped_layout": layout,
            "d": torch.empty(M, N, dtype=torch.bfloat16, device="cuda")}


def reference(a, sfa, b, sfb, grouped_layout, **_) -> dict:
    """fp32 products of the dequantized operands, group by group; padding rows 0."""
    a32 = O.dequantize_a(a, sfa)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for g in range(b.shape[0]):
        rows = (grouped_layout == g).nonzero().flatten()
        if rows.numel():
            out[rows] = a32[rows] @ O.dequantize_b(b[g], sfb[g]).T
    return {"d": out}


def _comparator(got, want, cfg: dict, inputs: dict) -> dict:
    stats = O.check_calc_diff(got, want)
    pad = inputs["grouped_layout"] < 0
    if pad.any() and (got[pad] != 0).any():
        raise harness.KernelCheckError(f"{int((got[pad] != 0).sum())} outputs of padding rows (group -1) are not 0")
    return stats


COMPARATORS = {"d": _comparator}


def launch(cfg: dict, data: dict) -> None:
    m_grouped_fp8_gemm_nt_contiguous((data["a"], data["sfa"]), (data["b"], data["sfb"]), data["d"],
                                     data["grouped_layout"])


def roofline(G: int, m: int, N: int, K: int, empty=None, pad_tiles: int = 0, **_) -> dict:  # noqa: N803
    """DeepGEMM's count: every row of M (padding included) times N times K; bytes of A, all of B, D, scales."""
    M = total_rows(G, m, empty, pad_tiles)  # noqa: N806
    kb, nb = C.ceil_div(K, C.GRAN), C.ceil_div(N, C.GRAN)
    nbytes = M * K + G * N * K + 2 * M * N + 4 * (M * kb + G * nb * kb) + 4 * M
    return {"flops": 2 * M * N * K, "bytes": nbytes, "ceiling": "fp8"}


def segments(grouped_layout: torch.Tensor, G: int) -> list[tuple[int, int, int]]:  # noqa: N803
    """``(group, first row, end row)`` of each non-empty group's 128-aligned block of rows (host copy)."""
    layout = grouped_layout.cpu()
    out = []
    for g in range(G):
        rows = (layout == g).nonzero().flatten()
        if rows.numel():
            start = int(rows[0])
            out.append((g, start, min(start + C.ceil_div(int(rows[-1]) + 1 - start, ALIGN) * ALIGN, len(layout))))
    return out


def get_baselines(**cfg) -> dict:
    """torch: the fp32 oracle; deepgemm: ``deep_gemm.m_grouped_fp8_gemm_nt_contiguous``; cublas: cuBLASLt blockwise
    (1x128 x 128x128) ``torch._scaled_mm`` per group over the group's aligned rows (the runnable reference where
    DeepGEMM has no wheel)."""
    def deepgemm(dg, d, out):
        dg.m_grouped_fp8_gemm_nt_contiguous((d["a"], d["sfa"]), (d["b"], d["sfb"]), out, d["grouped_layout"])

    def plan(d):  # each group's aligned rows with their M-major scales, and the rows no group covers
        segs = segments(d["grouped_layout"], d["b"].shape[0])
        covered = torch.zeros(d["d"].shape[0], dtype=torch.bool)
        for _, s, e in segs:
            covered[s:e] = True
        return ([(g, s, e, F.m_major(d["sfa"][s:e])) for g, s, e in segs],
                (~covered).nonzero().flatten().to(d["d"].device))

    def cublas(d, plan):
        segs, uncovered = plan
        out = d["d"]
        for g, s, e, sfa_g in segs:
            O.scaled_mm_blockwise(d["a"][s:e], sfa_g, d["b"][g], d["sfb"][g], out=out[s:e])
        if uncovered.numel():
            out[uncovered] = 0
        return {"d": out}

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm),
            "cublas": F.cublas_baseline(("a", "d"), plan, cublas)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(a, b, d, grouped_layout, recipe=None, cuda: bool = True):
    """Validate the call; returns ``(a, sfa, b, sfb, M, N, K, G)``."""
    a, sfa, b, sfb = O.operand_pairs(_OP, a, b, 2, 3)
    M, K = a.shape  # noqa: N806
    G, N = b.shape[0], b.shape[1]  # noqa: N806
    if b.shape[2] != K:
        _fail("b[0]", f"[G, N, K={K}] (a[0] is {tuple(a.shape)})", f"shape {tuple(b.shape)}")
    if G == 0:
        _fail("b[0]", "at least one group", f"shape {tuple(b.shape)}")
    kb = C.ceil_div(K, C.GRAN)
    O.check_scales(_OP, "a[1]", sfa, (M, kb))
    O.check_scales(_OP, "b[1]", sfb, (G, C.ceil_div(N, C.GRAN), kb))
    checks.tensor(_OP, "d", d, dtypes=(torch.bfloat16,), shape=(M, N), cuda=False)
    checks.tensor(_OP, "grouped_layout", grouped_layout, dtypes=(torch.int32,), shape=(M,), contiguous=True,
                  cuda=False)
    O.check_recipe(_OP, recipe)
    O.check_rows(_OP, "a[0].shape[1]", K, "d.shape[1]", N)
    O.check_even_strides(_OP, d)
    if cuda:
        O.check_cuda(_OP, **{"a[0]": a, "a[1]": sfa, "b[0]": b, "b[1]": sfb, "d": d,
                             "grouped_layout": grouped_layout})
    return a, sfa, b, sfb, M, N, K, G


def kernel_args(a, sfa, b, sfb, d, grouped_layout) -> tuple:
    """The kernel's arguments ``(a, sfa, b, sfb, d, grouped_layout, ldd)``: sfa as its flat MN-major buffer, B as
    ``[G, N, K]`` contiguous, d as 32-bit words of bf16 pairs with its row stride."""
    K = a.shape[1]  # noqa: N806
    return (O.tma_aligned(a), O.flat_sf(sfa, K), O.tma_aligned(b), sfb.contiguous(), O.d_words(d),
            grouped_layout, d.stride(0))


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(a, sfa, b, sfb, d, grouped_layout, tile: str | None = None) -> None:
    fn = O.kernel_function(_FUNCTIONS, a, tile=tile or O.choose_tile(a.shape[0], b.shape[1]))
    fn(*kernel_args(a, sfa, b, sfb, d, grouped_layout))


def m_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, grouped_layout: torch.Tensor, recipe=None,
                                     recipe_a=None, recipe_b=None, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True, expected_m_for_psum_layout=None) -> None:
    """DeepGEMM's ``m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, ...)``: ``d[m] = (a[0][m] * a[1][m]) @
    (b[0][g] * b[1][g]).T`` for ``g = grouped_layout[m]`` (0 where it is -1), in place. SM90's recipe only
    (``recipe`` None or (1, 128, 128)); ``recipe_a`` / ``recipe_b`` and the psum layout are SM100 forms and raise;
    ``compiled_dims``, ``disable_ue8m0_cast`` and ``ensure_zero_padding`` are accepted and ignored."""
    O.check_sm100_recipes(_OP, recipe_a, recipe_b)
    if use_psum_layout or expected_m_for_psum_layout is not None:
        _fail("use_psum_layout", "False (the psum layout is not ported: one group index per row)", use_psum_layout)
    a_, sfa, b_, sfb, M, N, K, G = check_inputs(a, b, d, grouped_layout, recipe)  # noqa: N806
    if M == 0 or N == 0:
        return
    if K == 0:
        d.zero_()
        return
    if runtime.direct_call(a_, sfa, b_, sfb, d, grouped_layout):
        _run(a_, sfa, b_, sfb, d, grouped_layout)
    else:
        torch.ops.tirx.deepgemm_m_grouped_fp8_gemm_nt_contiguous(a_, sfa, b_, sfb, d, grouped_layout)


@torch.library.custom_op("tirx::deepgemm_m_grouped_fp8_gemm_nt_contiguous", mutates_args=("d",))
def _op(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
        grouped_layout: torch.Tensor) -> None:
    _run(a, sfa, b, sfb, d, grouped_layout)


@_op.register_fake
def _(a, sfa, b, sfb, d, grouped_layout):
    return None


run_test, run_bench = harness.bind(__name__)
