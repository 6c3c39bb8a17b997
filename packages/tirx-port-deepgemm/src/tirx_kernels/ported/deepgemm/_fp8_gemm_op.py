# SPDX-License-Identifier: Apache-2.0
# Host side shared by the ports of DeepGEMM's SM90 FP8 GEMMs (csrc/apis/gemm.hpp: fp8_fp4_gemm_nt,
# m_grouped_fp8_fp4_gemm_nt_contiguous / _masked; csrc/apis/layout.hpp: transform_sf_into_required_layout;
# deep_gemm/testing/numeric.py: calc_diff) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b.
"""What the FP8 GEMM ops share: the tiles and their heuristic, the kernel builder by schedule, DeepGEMM's
``calc_diff`` check, argument checks, and the operand layouts the kernel reads (TMA-aligned bases, MN-major sfa,
flat views of D)."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness

from . import _fp8_cast as C
from . import _fp8_gemm_kernel as G

NUM_SMS = 132  # H100 SXM and H200: a compile parameter (a wrong value costs speed, never correctness)
GROUP_M = 8
TILES = {"128x128_s6": (128, 6), "128x64_s8": (64, 8)}  # tile: (block_n, num_stages)
# Candidate tiles of issue 24 (not in the bundle; tools/sweeps/deepgemm_fp8_variants.py builds and times them beside
# the TILES and cuBLASLt): tile -> (block_n, num_stages, block_m, cluster_n, prefetch_scales). At 4096 x 4096 x 7168
# the unclustered 128 x 128 tile requests 32 KB of L2 per 128-K block of a 128 x 128 tile; DeepGEMM's SM90 L2 model
# (heuristics/sm90.hpp, ~6.2 KB / cycle) puts it at 311k L2 cycles there, above its 226k L1 cycles, while a 1 x 2
# cluster (A multicast) is 234k and 256 x 128 in a 1 x 2 cluster (DeepGEMM's pick) 158k.
CANDIDATE_TILES = {
    "128x128_s6_pf": (128, 6, 128, 1, True),  # scales read before the wgmma, sfb one K block ahead
    "128x128_s6_c2": (128, 6, 128, 2, True),  # + A multicast over a 1 x 2 cluster
    "256x128_s4": (128, 4, 256, 1, True),  # 256-row tiles (two waves a warpgroup), dense / batched
    "256x128_s4_c2": (128, 4, 256, 2, True),  # DeepGEMM's SM90 pick for the large dense rows
    "128x256_s4": (256, 4, 128, 1, True),  # 128 x 256 (two N halves a warpgroup, each its own sfb): every schedule
    "128x256_s4_c2": (256, 4, 128, 2, True),  # + A multicast: the grouped forms' 128-row analogue of 256 x 128 c2
}
CALC_DIFF_MAX = 1e-3  # DeepGEMM's bound for FP8 GEMMs (tests/test_fp8_fp4.py)
E4M3 = torch.float8_e4m3fn


def choose_tile(M: int, N: int) -> str:  # noqa: N803
    """128 x 64 while 128 x 128 tiles would leave SMs idle in the only wave (DeepGEMM's heuristic also widens N
    with the wave count; the fuller table is GPU work still to do). ``M``: the rows of every group together."""
    return "128x64_s8" if C.ceil_div(M, 128) * C.ceil_div(N, 128) < NUM_SMS else "128x128_s6"


def build(kernel_name: str, tile: str, schedule: str, accumulate: bool = False, recipe: str = "1d2d"):
    """The kernel of ``tile`` (a product tile of ``TILES`` or a candidate of ``CANDIDATE_TILES``)."""
    if tile in TILES:
        block_n, stages = TILES[tile]
        knobs = {}
    elif tile in CANDIDATE_TILES:
        block_n, stages, block_m, cluster_n, prefetch = CANDIDATE_TILES[tile]
        knobs = {"block_m": block_m, "cluster_n": cluster_n, "prefetch_scales": prefetch}
    else:
        raise ValueError(f"{kernel_name}: tile {tile!r} is not one of {sorted(TILES)} (candidates: "
                         f"{sorted(CANDIDATE_TILES)})")
    return G.build_kernel(block_n, stages, GROUP_M, NUM_SMS, accumulate, schedule, recipe, **knobs).with_attr(
        "global_symbol", kernel_name)


def sass_expect(**_) -> list[str]:
    return [r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", r"UTMALDG\.2D", r"SYNCS"]


def tile_artifacts(accumulate: bool = False) -> list[dict]:
    """The bundle: one artifact per tile (and per ``accumulate`` where the op takes C)."""
    if accumulate:
        return [{"tile": t, "accumulate": a} for t in TILES for a in (False, True)]
    return [{"tile": t} for t in TILES]


def kernel_function(functions, t: torch.Tensor, **params):
    """The bundle's function of ``params`` from the module's ``runtime.FunctionCache`` on ``t``'s device."""
    return functions.get((*params.values(), t.get_device()), lambda: params, t.device)


# ------------------------------------------------------------------------------------------------- checks
def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's ``calc_diff``: ``1 - 2<x, y> / (|x|^2 + |y|^2)`` in float64 (0 for equal tensors)."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


def check_calc_diff(got, want) -> dict:
    """Finite outputs within DeepGEMM's calc_diff bound of ``want``; raises ``KernelCheckError``."""
    if got.shape != want.shape:
        raise harness.KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
    if not torch.isfinite(got.float()).all():
        raise harness.KernelCheckError(f"{int((~torch.isfinite(got.float())).sum())} outputs not finite (unwritten?)")
    diff = calc_diff(got, want)
    if diff > CALC_DIFF_MAX:
        raise harness.KernelCheckError(f"calc_diff {diff:.3e} > {CALC_DIFF_MAX}")
    return {"calc_diff": diff}


def calc_diff_comparator(got, want, cfg: dict, inputs: dict) -> dict:
    return check_calc_diff(got, want)


def fail(op: str, name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def pair(op: str, name: str, value):
    if not isinstance(value, tuple | list) or len(value) != 2:
        fail(op, name, "a (tensor, scales) pair", type(value).__name__)
    return value


def check_operand(op: str, name: str, t, ndim: int) -> None:
    """An e4m3 operand, K-major (NT only: SM90 FP8 wgmma reads K-major A and B)."""
    checks.tensor(op, name, t, dtypes=(E4M3,), ndim=ndim, inner_contiguous=False, cuda=False)
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        fail(op, name, "a K-major operand (NT only: SM90 FP8 wgmma reads K-major A and B; make the transposed "
             "operand contiguous)", f"strides {tuple(t.stride())}")


def check_recipe(op: str, recipe, also: str = "") -> None:
    if recipe not in (None, (1, 128, 128)):
        fail(op, "recipe", f"None or (1, 128, 128) (SM90's 1x128 / 128x128 scales{also})", recipe)


def check_sm100_recipes(op: str, recipe_a, recipe_b) -> None:
    """DeepGEMM's per-operand recipes (SM100 forms): None only."""
    if recipe_a is not None or recipe_b is not None:
        fail(op, "recipe_a" if recipe_a is not None else "recipe_b", "None (per-operand recipes are SM100's)",
             recipe_a if recipe_a is not None else recipe_b)


def operand_pairs(op: str, a, b, ndim_a: int, ndim_b: int | None):
    """``(a, sfa, b, sfb)`` of the ``(tensor, scales)`` pairs ``a`` and ``b``, the codes checked e4m3 K-major (``b``'s
    only where ``ndim_b`` is given)."""
    (a, sfa), (b, sfb) = pair(op, "a", a), pair(op, "b", b)
    check_operand(op, "a[0]", a, ndim_a)
    if ndim_b is not None:
        check_operand(op, "b[0]", b, ndim_b)
    return a, sfa, b, sfb


def check_scales(op: str, name: str, sf, shape: tuple) -> None:
    """fp32 scales of ``shape``, any strides (the layout is made the kernel's at the launch)."""
    checks.tensor(op, name, sf, dtypes=(torch.float32,), shape=shape, inner_contiguous=False, cuda=False)


def check_rows(op: str, k_name: str, K: int, n_name: str, N: int, operands: str = "A and B",  # noqa: N803
               pairs: str = "D is written in 4-byte pairs") -> None:
    """K a multiple of 16 (16-byte TMA rows of the operands) and N of 8 (D's pairs)."""
    checks.multiple_of(op, k_name, K, 16, f"TMA needs 16-byte rows of {operands}")
    checks.multiple_of(op, n_name, N, 8, f"{pairs}; DeepGEMM needs 16-byte rows")


def check_even_strides(op: str, d, what: str = "an even row stride") -> None:
    """bf16 ``d``'s outer strides even: the kernel stores 4-byte pairs."""
    if any(st % 2 for st in d.stride()[:-1]):
        fail(op, "d", f"{what} (4-byte pairs)", f"strides {tuple(d.stride())}")


def check_cuda(op: str, **tensors) -> None:
    ref_name, ref = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t is not None:
            checks.tensor(op, name, t, inner_contiguous=False, cuda=True)
    checks.same_device(op, ref_name, ref, **{k: v for k, v in tensors.items() if v is not None})


# ------------------------------------------------------------------------------------------------- layouts
def tma_aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous at a 16-byte-aligned address (a TMA map's base must be): a view at an odd offset is
    copied."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def new_mn_major_sf(outer: tuple, k: int, device) -> torch.Tensor:
    """fp32 ``[(G,) mn, ceil(k/128)]`` (``outer`` = ``(mn,)`` or ``(G, mn)``) with DeepGEMM's MN-major TMA-aligned
    strides: each group's K-block columns of ``align(mn, 4)`` scales, one after the other."""
    if len(outer) == 1:
        return C.new_mn_major_sf(outer[0], k, device)
    g, mn = outer
    kb, col = C.ceil_div(k, C.GRAN), C.tma_aligned_size(mn)
    return torch.empty_strided((g, mn, kb), (kb * col, 1, col), dtype=torch.float32, device=device)


def sf_in_layout(sf: torch.Tensor, k: int) -> torch.Tensor:
    """``sf`` (``[(G,) mn, ceil(k/128)]``) as the kernel reads it: the MN-major TMA-aligned tensor itself, else a
    copy made so (DeepGEMM's ``get_mn_major_tma_aligned_tensor``)."""
    mn, kb = sf.shape[-2], sf.shape[-1]
    col = C.tma_aligned_size(mn)
    ok = sf.stride(-2) == 1 and (sf.stride(-1) == col or kb == 1)
    if sf.dim() == 3:
        ok = ok and (sf.stride(0) == kb * col or sf.shape[0] == 1)
    if ok and sf.data_ptr() % 16 == 0:
        return sf
    out = new_mn_major_sf(tuple(sf.shape[:-1]), k, sf.device)
    out.copy_(sf)
    return out


def flat_sf(sf: torch.Tensor, k: int) -> torch.Tensor:
    """The flat fp32 buffer of ``sf`` in the kernel's layout: exactly the span its elements cover."""
    sf = sf_in_layout(sf, k)
    span = 1 + sum((s - 1) * st for s, st in zip(sf.shape, sf.stride()))
    return sf.as_strided((span,), (1,))


def c_into_d(c: torch.Tensor | None, d: torch.Tensor) -> None:
    """DeepGEMM's C-into-D convention: ``d`` takes ``c``'s values first unless ``c`` is ``d``'s own memory (then the
    kernel accumulates onto it in place). A pointer comparison: called only where torch.compile does not trace (the
    eager direct path and the custom op's body), never in the public op's traced Python."""
    if c is not None and c.data_ptr() != d.data_ptr():
        d.copy_(c)


def c_or_zero(c: torch.Tensor | None, d: torch.Tensor) -> None:
    """No kernel to run (an empty K): ``d`` = ``c`` (traced as a copy; ``c`` that is ``d`` itself is left) or 0."""
    if c is None:
        d.zero_()
    elif c is not d:
        d.copy_(c)


def run_dense(functions, kernel_args, a, sfa, b, sfb, d, c=None, tile: str | None = None) -> None:
    """The launch of ``fp8_gemm_nt`` (both recipes; the eager body of their custom ops too): C into D, then the
    kernel, accumulating where ``c`` is given."""
    c_into_d(c, d)
    fn = kernel_function(functions, a, tile=tile or choose_tile(a.shape[0], b.shape[0]), accumulate=c is not None)
    fn(*kernel_args(a, sfa, b, sfb, d))


def d_words(d: torch.Tensor) -> torch.Tensor:
    """``d`` (bf16, unit stride along N, even row and group strides) as the 32-bit words of its span."""
    span = 1 + sum((s - 1) * st for s, st in zip(d.shape, d.stride()))
    return d.as_strided((span,), (1,)).view(torch.uint32)


def dequantize_a(a: torch.Tensor, sfa: torch.Tensor) -> torch.Tensor:
    """fp32 A: codes times their 1x128 scales (``[(G,) M, K]``)."""
    K = a.shape[-1]  # noqa: N806
    return a.float() * sfa.float().repeat_interleave(C.GRAN, -1)[..., :K]


def dequantize_b(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """fp32 B: codes times their 128x128 scales (``[(G,) N, K]``)."""
    N, K = b.shape[-2], b.shape[-1]  # noqa: N806
    return b.float() * sfb.float().repeat_interleave(C.GRAN, -2)[..., :N, :].repeat_interleave(C.GRAN, -1)[..., :K]


def quantized_operands(x: torch.Tensor, w: torch.Tensor):
    """DeepGEMM's casts (the torch oracles) of bf16 activations ``x`` (``[(G,) M, K]``, per token) and weights ``w``
    (``[(G,) N, K]``, per block, per group): ``(a, sfa in the MN-major layout, b, sfb)``."""
    if x.dim() == 2:
        a, sfa = C.per_token_ref(x)
    else:
        pieces = [C.per_token_ref(x[i]) for i in range(x.shape[0])]
        a, sfa = torch.stack([p[0] for p in pieces]), torch.stack([p[1] for p in pieces])
    if w.dim() == 2:
        b, sfb = C.per_block_ref(w)
    else:
        pieces = [C.per_block_ref(w[i]) for i in range(w.shape[0])]
        b, sfb = torch.stack([p[0] for p in pieces]), torch.stack([p[1] for p in pieces])
    sfa_mn = new_mn_major_sf(tuple(sfa.shape[:-1]), x.shape[-1], x.device)
    sfa_mn.copy_(sfa)
    return a, sfa_mn, b, sfb


def scaled_mm_blockwise(a, sfa, b, sfb, out=None, out_dtype=torch.bfloat16):
    """cuBLASLt's blockwise FP8 GEMM through ``torch._scaled_mm``: ``a @ b.T`` (into ``out`` where given). ``sfa``
    [M, ceil(K/128)] M-major (stride (1, M)); ``sfb`` [ceil(N/128), ceil(K/128)] (1x128 x 128x128) or [N,
    ceil(K/128)] N-major (1x128 on both)."""
    kwargs = {"scale_a": sfa, "scale_b": sfb.t(), "out_dtype": out_dtype}
    try:
        if out is None:
            return torch._scaled_mm(a, b.t(), **kwargs)
        return torch._scaled_mm(a, b.t(), **kwargs, out=out)
    except RuntimeError as e:  # shapes cuBLASLt's blockwise FP8 refuses (N or K not a multiple of 16, some small M):
        # a missing reference for this config (H100, 2026-12-06: CUBLAS_STATUS_NOT_SUPPORTED at M = 1, 17, 4097)
        if "CUBLAS_STATUS_NOT_SUPPORTED" in str(e) or "must be divisible by 16" in str(e):
            raise ImportError(f"cuBLASLt refuses {tuple(a.shape)} x {tuple(b.shape)}: {str(e).splitlines()[0]}") \
                from None
        raise


def scaled_mm_probe(one_by_one: bool = False) -> None:
    """Raise ``ImportError`` (a missing reference) where this torch build or card has no blockwise ``_scaled_mm``
    (1x128 x 128x128; ``one_by_one``: 1x128 on both operands, fp32 out)."""
    a = torch.ones(128, 256, device="cuda").to(E4M3)
    sfa = torch.ones(2, 128, device="cuda").t()
    sfb = sfa if one_by_one else torch.ones(1, 2, device="cuda")
    dtype = torch.float32 if one_by_one else torch.bfloat16
    try:
        scaled_mm_blockwise(a, sfa, a, sfb, out=torch.empty(128, 128, device="cuda", dtype=dtype), out_dtype=dtype)
        torch.cuda.synchronize()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        what = "1x128 x 1x128, fp32 out" if one_by_one else "1x128 x 128x128"
        raise ImportError(f"torch._scaled_mm blockwise ({what}) is not available here: {e}") from None
