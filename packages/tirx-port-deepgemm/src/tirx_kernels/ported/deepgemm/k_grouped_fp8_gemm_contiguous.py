# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's k_grouped_fp8_gemm_nt_contiguous on SM90 (csrc/apis/gemm.hpp: k_grouped_fp8_gemm_nt_contiguous;
# csrc/jit_kernels/impls/sm90_fp8_gemm_1d1d.hpp: sm90_k_grouped_fp8_gemm_1d1d; tests/generators.py:
# generate_k_grouped_contiguous) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b. Written anew in TIRx
# (kernel: _fp8_gemm_kernel.py, recipe "1d1d", accumulating).
"""``k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, grouped_layout, c=None)``: the MoE weight gradient.
Groups are concatenated along K: group g has ``ks[g]`` (a multiple of 128, 0 allowed) K-columns, its A block
``[m, ks[g]]`` and B block ``[n, ks[g]]`` e4m3 (K-major) stored one after the other in the flat ``a`` [sum(ks) * m]
and ``b`` [sum(ks) * n]; ``sfa`` [m, sum(ks)/128] and ``sfb`` [n, sum(ks)/128] fp32 1x128 scales, each group's
K-blocks consecutive columns. ``D[g] (fp32 [G, m, n]) = C[g] + (A_g * sfa_g) (B_g * sfb_g)^T`` (``c`` may be ``d``;
DeepGEMM requires it, here ``c=None`` gives the plain products; an empty group leaves ``C[g]``). ``ks`` is the
host-side list DeepGEMM's SM90 entry takes; ``grouped_layout`` (int32 [G], the same counts on the device) is checked
for DeepGEMM's API and not read.

NOTES: one accumulating 1d1d GEMM launch per non-empty group (``ks`` is on the host, each group a whole m x n GEMM of
``ks[g]`` K), where DeepGEMM runs all groups in one persistent launch, rewriting the A / B tensor maps on the device
(``tensormap.replace``) when a CTA moves to the next group. The launches fill the SMs alike; the difference is one
partial last wave per group instead of one in all (a speed item). Artifacts: one per tile.
"""

from __future__ import annotations

import random

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C
from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O

KERNEL_META = {
    "name": "deepgemm_sm90_k_grouped_fp8_gemm_contiguous",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM k_grouped_fp8_gemm_nt_contiguous (SM90 1d1d, MoE wgrad): groups concatenated along K, "
                   "1x128 scales on both operands, fp32 D[g] = C[g] + A_g B_g^T; one accumulating 1d1d launch per "
                   "group",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["k_grouped_fp8_gemm_nt_contiguous"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

# DeepGEMM's test shapes (tests/generators.py: enumerate_k_grouped_contiguous: (G, m, n, expected K per group), K per
# group int(k * uniform(0.7, 1.3)) aligned to 128), one of them with an empty group, and a ragged small row.
CONFIGS = [
    {"label": "g4_m4096_n7168_k8192", "G": 4, "m": 4096, "n": 7168, "k": 8192},
    {"label": "g4_m7168_n2048_k8192", "G": 4, "m": 7168, "n": 2048, "k": 8192},
    {"label": "g8_m4096_n7168_k4096", "G": 8, "m": 4096, "n": 7168, "k": 4096},
    {"label": "g8_m7168_n2048_k4096_empty", "G": 8, "m": 7168, "n": 2048, "k": 4096, "empty": 3},
    {"label": "g16_m4096_n7168_k2048", "G": 16, "m": 4096, "n": 7168, "k": 2048},
    {"label": "g16_m7168_n2048_k2048", "G": 16, "m": 7168, "n": 2048, "k": 2048},
    {"label": "g3_m200_n136_k256_ragged", "G": 3, "m": 200, "n": 136, "k": 256, "empty": 1},
]
BENCH_CONFIGS = [
    {"label": "g4_m4096_n7168_k8192", "G": 4, "m": 4096, "n": 7168, "k": 8192},
    {"label": "g8_m4096_n7168_k4096", "G": 8, "m": 4096, "n": 7168, "k": 4096},
    {"label": "g16_m7168_n2048_k2048", "G": 16, "m": 7168, "n": 2048, "k": 2048},
]
DEFAULTS = {"empty": None}
TILES = O.TILES
COMPARATORS = {"d": O.calc_diff_comparator}
RECIPE = (1, 1, 128)
_OP = "k_grouped_fp8_gemm_nt_contiguous"


def group_ks(G: int, k: int, empty=None, seed: int | None = None, **_) -> list[int]:  # noqa: N803
    """K of each group: DeepGEMM's draw ``max(1, int(k * uniform(0.7, 1.3)))`` aligned to 128, seeded by the config
    (the roofline and each run of a row see the same split); group ``empty`` has none."""
    rng = random.Random(G * 1_000_003 + k if seed is None else seed)
    ks = [C.ceil_div(max(1, int(k * rng.uniform(0.7, 1.3))), C.GRAN) * C.GRAN for _ in range(G)]
    if empty is not None:
        ks[empty] = 0
    return ks


def compile_params(m: int = 4096, n: int = 4096, tile: str | None = None, **_) -> dict:
    return {"tile": tile or O.choose_tile(m, n)}


def artifact_params() -> list[dict]:
    return O.tile_artifacts()


def call_samples(rng) -> list[dict]:
    return [{"G": rng.choice([1, 4, 8, 16, rng.randint(1, 64)]), "m": rng.choice([1, 128, 4096, rng.randint(1, 9000)]),
             "n": 8 * rng.randint(1, 2048), "k": rng.choice([128, 2048, 8192])} for _ in range(24)]


def get_kernel(tile: str):
    return O.build(KERNEL_META["name"], tile, "dense", True, recipe="1d1d")


sass_expect = O.sass_expect


def quantized_operands(xs: list[torch.Tensor], ws: list[torch.Tensor], m: int, n: int, device):
    """Per-group per-token casts (the torch oracle) of each group's bf16 ``x_g`` [m, k_g] and ``w_g`` [n, k_g], laid
    out as DeepGEMM's K-major k-grouped operands: flat codes group after group, scales concatenated along K-blocks
    (then MN-major)."""
    def pack(parts, rows):
        codes, sfs = [], []
        for p in parts:
            if p.shape[1]:
                q, sf = C.per_token_ref(p)
                codes.append(q.flatten())
                sfs.append(sf)
        flat = torch.cat(codes) if codes else torch.empty(0, dtype=O.E4M3, device=device)
        sf = torch.cat(sfs, dim=1) if sfs else torch.empty(rows, 0, device=device)
        return flat, O.sf_in_layout(sf, sf.shape[1] * C.GRAN) if sf.shape[1] else sf

    a, sfa = pack(xs, m)
    b, sfb = pack(ws, n)
    return a, sfa, b, sfb


def prepare_data(G: int, m: int, n: int, k: int, empty=None, **_) -> dict:  # noqa: N803
    """Each group's bf16 activation-gradient and input blocks cast per token (DeepGEMM's wgrad operands), ``c``
    fp32 (DeepGEMM's test: randn * 32), ``d`` a fresh output."""
    g, _ = F.cuda_generator()
    ks = group_ks(G, k, empty)
    xs = [torch.randn(m, kg, generator=g, device="cuda").to(torch.bfloat16) for kg in ks]
    ws = [torch.randn(n, kg, generator=g, device="cuda").to(torch.bfloat16) for kg in ks]
    a, sfa, b, sfb = quantized_operands(xs, ws, m, n, "cuda")
    return {"a": a, "sfa": sfa, "b": b, "sfb": sfb,
            "grouped_layout": torch.tensor(ks, dtype=torch.int32, device="cuda"),
            "c": torch.randn(G, m, n, generator=g, device="cuda") * 32,
            "d": torch.empty(G, m, n, dtype=torch.float32, device="cuda")}


def group_blocks(a, sfa, b, sfb, m: int, n: int, ks: list[int]):
    """``(g, A_g [m, k_g], sfa_g, B_g [n, k_g], sfb_g)`` of each non-empty group: views, no copies."""
    out, k0 = [], 0
    for g, kg in enumerate(ks):
        if kg:
            s0, s1 = k0 // C.GRAN, (k0 + kg) // C.GRAN
            out.append((g, a[k0 * m:(k0 + kg) * m].view(m, kg), sfa[:, s0:s1], b[k0 * n:(k0 + kg) * n].view(n, kg),
                        sfb[:, s0:s1]))
        k0 += kg
    return out


def reference(a, sfa, b, sfb, grouped_layout, c=None, **_) -> dict:
    G = grouped_layout.numel()  # noqa: N806
    m, n = sfa.shape[0], sfb.shape[0]
    out = torch.zeros(G, m, n, dtype=torch.float32, device=a.device) if c is None else c.clone().float()
    for g, ag, sag, bg, sbg in group_blocks(a, sfa, b, sfb, m, n, grouped_layout.tolist()):
        out[g] += O.dequantize_a(ag, sag) @ O.dequantize_a(bg, sbg).T
    return {"d": out}


def launch(cfg: dict, data: dict) -> None:
    ks = group_ks(**cfg)
    k_grouped_fp8_gemm_nt_contiguous((data["a"], data["sfa"]), (data["b"], data["sfb"]), data["d"], ks,
                                     data["grouped_layout"], c=data["c"])


def roofline(G: int, m: int, n: int, k: int, empty=None, **_) -> dict:  # noqa: N803
    sum_k = sum(group_ks(G, k, empty))
    nbytes = sum_k * (m + n) + 2 * 4 * G * m * n + 4 * (sum_k // C.GRAN) * (m + n)
    return {"flops": 2 * m * n * sum_k, "bytes": nbytes, "ceiling": "fp8"}


def get_baselines(**cfg) -> dict:
    """torch: the fp32 oracle; deepgemm: ``deep_gemm.k_grouped_fp8_gemm_nt_contiguous``; cublas: cuBLASLt blockwise
    1x128 x 1x128 ``torch._scaled_mm`` per group (fp32 out) then ``+= c[g]``."""
    ks = group_ks(**cfg)

    def deepgemm(dg, d, out):
        out.copy_(d["c"])
        dg.k_grouped_fp8_gemm_nt_contiguous((d["a"], d["sfa"]), (d["b"], d["sfb"]), out, ks, d["grouped_layout"], out)

    def plan(d):  # M-major copies of each group's scales
        m, n = d["d"].shape[1], d["d"].shape[2]
        return [(g, ag, F.m_major(sag), bg, F.m_major(sbg))
                for g, ag, sag, bg, sbg in group_blocks(d["a"], d["sfa"], d["b"], d["sfb"], m, n, ks)]

    def cublas(d, plan):
        out = d["d"]
        out.copy_(d["c"])
        for g, ag, sag, bg, sbg in plan:
            out[g] += O.scaled_mm_blockwise(ag, sag, bg, sbg, out_dtype=torch.float32)
        return {"d": out}

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm),
            "cublas": F.cublas_baseline(("a", "d"), plan, cublas, one_by_one=True)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(a, b, d, ks, grouped_layout, c=None, recipe=RECIPE, cuda: bool = True):
    """Validate the call; returns ``(a, sfa, b, sfb, G, m, n, ks)``."""
    (a, sfa), (b, sfb) = O.pair(_OP, "a", a), O.pair(_OP, "b", b)
    checks.tensor(_OP, "d", d, dtypes=(torch.float32,), ndim=3, contiguous=True, cuda=False)
    G, m, n = d.shape  # noqa: N806
    if ks is None or isinstance(ks, torch.Tensor) or len(ks) != G:
        _fail("ks", f"a host-side list of G={G} K sizes (one per group of d)", ks if ks is None else len(ks))
    ks = [int(kg) for kg in ks]
    if any(kg < 0 or kg % C.GRAN for kg in ks):
        _fail("ks", "sizes >= 0 and multiples of 128 (DeepGEMM's k alignment on SM90)", ks)
    sum_k = sum(ks)
    for name, t, rows in (("a[0]", a, m), ("b[0]", b, n)):
        checks.tensor(_OP, name, t, dtypes=(O.E4M3,), shape=(sum_k * rows,), contiguous=True, cuda=False)
    sf_k = sum_k // C.GRAN
    O.check_scales(_OP, "a[1]", sfa, (m, sf_k))
    O.check_scales(_OP, "b[1]", sfb, (n, sf_k))
    checks.tensor(_OP, "grouped_layout", grouped_layout, dtypes=(torch.int32,), shape=(G,), contiguous=True,
                  cuda=False)
    if c is not None:
        checks.tensor(_OP, "c", c, dtypes=(torch.float32,), shape=(G, m, n), contiguous=True, cuda=False)
    if recipe != RECIPE:
        _fail("recipe", f"{RECIPE} (the 1d1d recipe: 1x128 scales on both operands)", recipe)
    checks.multiple_of(_OP, "d.shape[2]", n, 8, "D is written in pairs")
    if cuda:
        O.check_cuda(_OP, **{"a[0]": a, "a[1]": sfa, "b[0]": b, "b[1]": sfb, "d": d, "grouped_layout": grouped_layout,
                             "c": c})
    return a, sfa, b, sfb, G, m, n, ks


def group_kernel_args(a, sfa, b, sfb, d, ks) -> list[tuple]:
    """The accumulating 1d1d kernel's arguments ``(a_g, sfa_g, b_g, sfb_g, d[g], ldd)`` of each non-empty group
    (the scale tensors laid out MN-major once, then sliced by group)."""
    G, m, n = d.shape  # noqa: N806
    sum_k = sum(ks)
    if sum_k:
        sfa, sfb = O.sf_in_layout(sfa, sum_k), O.sf_in_layout(sfb, sum_k)
    out = []
    for g, ag, sag, bg, sbg in group_blocks(a, sfa, b, sfb, m, n, ks):
        out.append((O.tma_aligned(ag), O.flat_sf(sag, ag.shape[1]), O.tma_aligned(bg), O.flat_sf(sbg, bg.shape[1]),
                    d[g].reshape(-1), n))
    return out


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(a, sfa, b, sfb, d, ks: list[int], c=None, tile: str | None = None) -> None:
    """The launch (eager body of the custom op too): D = C (or 0), then each non-empty group accumulates onto it."""
    if c is None:
        d.zero_()
    else:
        O.c_into_d(c, d)
    fn = O.kernel_function(_FUNCTIONS, a, tile=tile or O.choose_tile(d.shape[1], d.shape[2]))
    for args in group_kernel_args(a, sfa, b, sfb, d, ks):
        fn(*args)


def k_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, ks, grouped_layout: torch.Tensor,
                                     c: torch.Tensor | None = None, recipe=RECIPE, compiled_dims: str = "mn",
                                     use_psum_layout: bool = False) -> None:
    """DeepGEMM's ``k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks_cpu, grouped_layout, c, recipe=(1, 1, 128))`` on
    SM90: ``d[g] = c[g] + (A_g * sfa_g) @ (B_g * sfb_g).T`` in fp32, in place (``c=None``: the products alone). The
    psum layout is SM100's and raises; ``compiled_dims`` is accepted and ignored."""
    if use_psum_layout:
        _fail("use_psum_layout", "False (SM90's k-grouped NT GEMM takes the host-side ks)", use_psum_layout)
    a_, sfa, b_, sfb, G, m, n, ks = check_inputs(a, b, d, ks, grouped_layout, c, recipe)  # noqa: N806
    if m == 0 or n == 0 or sum(ks) == 0:
        O.c_or_zero(c, d)
        return
    if runtime.direct_call(a_, sfa, b_, sfb, d, c):
        _run(a_, sfa, b_, sfb, d, ks, c)
    else:
        torch.ops.tirx.deepgemm_k_grouped_fp8_gemm_nt_contiguous(a_, sfa, b_, sfb, d, ks, c)


@torch.library.custom_op("tirx::deepgemm_k_grouped_fp8_gemm_nt_contiguous", mutates_args=("d",))
def _op(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
        ks: list[int], c: torch.Tensor | None) -> None:
    _run(a, sfa, b, sfb, d, ks, c)


@_op.register_fake
def _(a, sfa, b, sfb, d, ks, c):
    return None


run_test, run_bench = harness.bind(__name__)
