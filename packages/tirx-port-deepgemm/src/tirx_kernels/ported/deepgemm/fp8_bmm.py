# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's fp8_einsum / fp8_bmm on SM90 (csrc/apis/einsum.hpp: fp8_einsum, fp8_bmm;
# tests/test_einsum.py: test_fp8_bhr_hdr_bhd) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b.
# Written anew in TIRx (kernel: _fp8_gemm_kernel.py with the batched schedule of _fp8_gemm_sched.py).
"""``fp8_einsum('bhr,hdr->bhd', (x, sfx), (y, sfy), z)`` (and ``'bhd,hdr->bhr'``, below): a per-head batched FP8
GEMM, ``z[:, h] = (x[:, h] * sfx[:, h]) @ (y[h] * sfy[h]).T`` in bf16 for every head h, with x [b, h, r]
float8_e4m3fn (1x128 per-token fp32 scales ``sfx`` [b, h, ceil(r/128)]), y [h, d, r] float8_e4m3fn (128x128 block
scales ``sfy`` [h, ceil(d/128), ceil(r/128)]) and z [b, h, d] bf16: DeepGEMM's SM90 recipe (1, 128, 128) and its
permutation (batch, m, n, k) = (h, b, d, r). The mainloop is the 1d2d GEMM's; the ``batched`` schedule walks h x
ceil(b/128) x N-tiles, and A is read through a rank-3 tensor map of x's own strides (the heads of x are strided rows:
never copied). z is written through its strides (unit stride along d). ``sfx`` in the layout the kernel reads (per
head, MN-major TMA-aligned: ``[h, b, kb]`` with strides ``(kb * align(b, 4), 1, align(b, 4))``, permuted to ``[b, h,
kb]``) is read in place; any other layout is copied so first (DeepGEMM's ``transform_sf_pair_into_required_layout``
does the same).

Equations: ``bhr,hdr->bhd`` (DeepGEMM's SM90 form), and ``bhd,hdr->bhr`` (SM100-only in DeepGEMM: y [h, d, r] is
contracted over d, its MN dimension, and SM90 FP8 wgmma reads K-major operands only): here through a K-major copy of
the weight, ``y.transpose(1, 2).contiguous()`` [h, r, d] (h d r bytes, once per call: cache it for a fixed weight
by passing it as the first form's y), and its 128x128 block scales transposed alike (a 128x128 block is its own
transpose); x keeps its per-token scales over d. ``bhd,bhr->hdr`` (contracted over b, the outer dimension of both
operands, with 1x128 scales along b: the wgrad form) raises naming the equation. ``c`` is rejected (bf16 D;
DeepGEMM's SM90 1d2d kernel takes no C either).

Artifacts: one per tile (``_fp8_gemm_op.TILES``), b, h, r, d at run time (r % 16 == 0, d % 8 == 0, z's b and h
strides even; x is read in place where its base and b / h strides are 16-byte multiples, else copied contiguous).
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_cast as C
from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O

KERNEL_META = {
    "name": "deepgemm_sm90_fp8_bmm",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM fp8_einsum 'bhr,hdr->bhd' (SM90 fp8_bmm, 1d2d): per-head e4m3 x [b, h, r] (1x128 "
                   "scales, read in place through a rank-3 TMA map) x e4m3 y [h, d, r] (128x128 scales), bf16 out; "
                   "also 'bhd,hdr->bhr' through a K-major copy of y",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["fp8_einsum"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

EQUATION = "bhr,hdr->bhd"
TRANSPOSED_Y = "bhd,hdr->bhr"  # y contracted over its MN dimension: a K-major copy of y first
SM100_EQUATIONS = ("bhd,bhr->hdr",)
# DeepGEMM's test shapes (tests/test_einsum.py: test_fp8_bhr_hdr_bhd: h 8, r 4096, d 1024, b in 4 .. 8192), ragged b,
# and a small ragged case (b, r and d off the tile).
CONFIGS = [
    {"label": "b4_h8_r4096_d1024", "b": 4, "h": 8, "r": 4096, "d": 1024},
    {"label": "b128_h8_r4096_d1024", "b": 128, "h": 8, "r": 4096, "d": 1024},
    {"label": "b4096_h8_r4096_d1024", "b": 4096, "h": 8, "r": 4096, "d": 1024},
    {"label": "b8192_h8_r4096_d1024", "b": 8192, "h": 8, "r": 4096, "d": 1024},
    {"label": "b4097_h8_r4096_d1024_ragged", "b": 4097, "h": 8, "r": 4096, "d": 1024},
    {"label": "b1000_h8_r4096_d1024_ragged", "b": 1000, "h": 8, "r": 4096, "d": 1024},
    {"label": "b17_h3_r1040_d136_ragged", "b": 17, "h": 3, "r": 1040, "d": 136},
]
BENCH_CONFIGS = [
    {"label": "b128_h8_r4096_d1024", "b": 128, "h": 8, "r": 4096, "d": 1024},
    {"label": "b4096_h8_r4096_d1024", "b": 4096, "h": 8, "r": 4096, "d": 1024},
    {"label": "b8192_h8_r4096_d1024", "b": 8192, "h": 8, "r": 4096, "d": 1024},
]
TILES = O.TILES
COMPARATORS = {"z": O.calc_diff_comparator}
_OP = "fp8_einsum"


def compile_params(b: int = 4096, h: int = 8, d: int = 1024, tile: str | None = None, **_) -> dict:
    return {"tile": tile or O.choose_tile(h * b, d)}


def artifact_params() -> list[dict]:
    return O.tile_artifacts()


def call_samples(rng) -> list[dict]:
    return [{"b": rng.choice([1, 4, 128, 8192, rng.randint(1, 20000)]),
             "h": rng.choice([1, 8, 128, rng.randint(1, 64)]), "r": 16 * rng.randint(1, 512),
             "d": 8 * rng.randint(1, 1024)} for _ in range(24)]


def get_kernel(tile: str):
    return O.build(KERNEL_META["name"], tile, "batched")


def sass_expect(**_) -> list[str]:
    return [r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", r"UTMALDG\.3D", r"UTMALDG\.2D", r"SYNCS"]


def quantized_operands(x: torch.Tensor, y: torch.Tensor):
    """DeepGEMM's test inputs: bf16 ``x`` [b, h, r] cast per token (as ``x.view(-1, r)``) and ``y`` [h, d, r] per
    block per head: ``(x_fp8, sfx [b, h, kb] in the kernel's layout, y_fp8, sfy)``."""
    b, h, r = x.shape
    a, sfa = C.per_token_ref(x.reshape(-1, r))
    heads = [C.per_block_ref(y[i]) for i in range(h)]
    y_fp8, sfy = torch.stack([p[0] for p in heads]), torch.stack([p[1] for p in heads])
    sfx = O.new_mn_major_sf((h, b), r, x.device).permute(1, 0, 2)
    sfx.copy_(sfa.view(b, h, -1))
    return a.view(b, h, r), sfx, y_fp8, sfy


def prepare_data(b: int, h: int, r: int, d: int, **_) -> dict:
    """bf16 activations (tokens of magnitudes 1e-2 .. 1e1) and weights cast by DeepGEMM's recipe, ``z`` a fresh
    output."""
    g, _ = F.cuda_generator()
    x = torch.randn(b, h, r, generator=g, device="cuda") * torch.logspace(-2, 1, b, device="cuda")[:, None, None]
    y = torch.randn(h, d, r, generator=g, device="cuda")
    x_fp8, sfx, y_fp8, sfy = quantized_operands(x.to(torch.bfloat16), y.to(torch.bfloat16))
    return {"x": x_fp8, "sfx": sfx, "y": y_fp8, "sfy": sfy, "z": torch.empty(b, h, d, dtype=torch.bfloat16,
                                                                             device="cuda")}


def reference(x, sfx, y, sfy, **_) -> dict:
    """fp32 einsum of the dequantized operands."""
    xf = O.dequantize_a(x, sfx)
    yf = O.dequantize_b(y, sfy)
    return {"z": torch.einsum("bhr,hdr->bhd", xf, yf)}


def launch(cfg: dict, data: dict) -> None:
    fp8_einsum(EQUATION, (data["x"], data["sfx"]), (data["y"], data["sfy"]), data["z"])


def roofline(b: int, h: int, r: int, d: int, **_) -> dict:
    kb, nb = C.ceil_div(r, C.GRAN), C.ceil_div(d, C.GRAN)
    nbytes = b * h * r + h * d * r + 2 * b * h * d + 4 * (b * h * kb + h * nb * kb)
    return {"flops": 2 * b * h * r * d, "bytes": nbytes, "ceiling": "fp8"}


def get_baselines(**cfg) -> dict:
    """torch: the fp32 oracle; deepgemm: ``deep_gemm.fp8_einsum``; cublas: cuBLASLt blockwise (1x128 x 128x128)
    ``torch._scaled_mm``, one call per head (x's heads made contiguous, their scales M-major and an [h, b, d] output,
    laid out once per data and untimed: the layouts ``_scaled_mm`` takes); bf16: the bf16 einsum of the dequantized
    operands through ``torch.bmm`` (cuBLAS; DeepGEMM's own comparison is cuBLASLt bf16)."""
    def deepgemm(dg, d, out):
        dg.fp8_einsum(EQUATION, (d["x"], d["sfx"]), (d["y"], d["sfy"]), out)

    def cublas_plan(d):  # each head of x contiguous, its scales M-major, and an [h, b, d] output (cuBLASLt writes a
        # contiguous [b, d] per head; returned as its [b, h, d] view)
        h = d["x"].shape[1]
        return ([d["x"][:, g].contiguous() for g in range(h)], [F.m_major(d["sfx"][:, g]) for g in range(h)],
                torch.empty(h, d["x"].shape[0], d["y"].shape[1], dtype=torch.bfloat16, device=d["x"].device))

    def cublas(d, plan):
        xs, sfs, out = plan
        for g in range(len(xs)):
            O.scaled_mm_blockwise(xs[g], sfs[g], d["y"][g], d["sfy"][g], out=out[g])
        return {"z": out.transpose(0, 1)}

    def bf16_plan(d):  # the bf16 operands: [h, b, r] and [h, r, d]
        return (O.dequantize_a(d["x"], d["sfx"]).to(torch.bfloat16).transpose(0, 1).contiguous(),
                O.dequantize_b(d["y"], d["sfy"]).to(torch.bfloat16).transpose(1, 2).contiguous())

    def bf16(d, plan):
        xb, yb = plan
        return {"z": torch.bmm(xb, yb).transpose(0, 1)}

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm, out="z"),
            "cublas": F.cublas_baseline(("x", "z"), cublas_plan, cublas),
            "bf16": lambda: F.planned(("x", "y"), bf16_plan, bf16)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(equation, a, b, d, c=None, recipe=(1, 128, 128), cuda: bool = True):
    """Validate the call; returns ``(x, sfx, y, sfy)`` as given."""
    if equation not in (EQUATION, TRANSPOSED_Y):
        why = (" (SM100 only in DeepGEMM: it contracts over b, the outer dimension of both FP8 operands, with 1x128 "
               "scales along b)" if equation in SM100_EQUATIONS else "")
        _fail("equation", f"'{EQUATION}' or '{TRANSPOSED_Y}' on SM90", f"{equation!r}{why}")
    x, sfx, y, sfy = O.operand_pairs(_OP, a, b, 3, None)
    nb, h, r = x.shape  # r: the contracted dimension (d in the second form)
    if equation == EQUATION:
        O.check_operand(_OP, "b[0]", y, 3)
        n = y.shape[1]
        if y.shape[0] != h or y.shape[2] != r:
            _fail("b[0]", f"[h={h}, d, r={r}] (a[0] is {tuple(x.shape)})", f"shape {tuple(y.shape)}")
        sfy_shape = (h, C.ceil_div(n, C.GRAN), C.ceil_div(r, C.GRAN))
    else:
        checks.tensor(_OP, "b[0]", y, dtypes=(O.E4M3,), ndim=3, inner_contiguous=False, cuda=False)
        n = y.shape[2]
        if y.shape[0] != h or y.shape[1] != r:
            _fail("b[0]", f"[h={h}, d={r}, r] (a[0] is {tuple(x.shape)})", f"shape {tuple(y.shape)}")
        sfy_shape = (h, C.ceil_div(r, C.GRAN), C.ceil_div(n, C.GRAN))
    kb = C.ceil_div(r, C.GRAN)
    O.check_scales(_OP, "a[1]", sfx, (nb, h, kb))
    O.check_scales(_OP, "b[1]", sfy, sfy_shape)
    checks.tensor(_OP, "d", d, dtypes=(torch.bfloat16,), shape=(nb, h, n), inner_contiguous=True, cuda=False)
    if c is not None:
        _fail("c", "None (bf16 D; DeepGEMM's SM90 fp8_bmm accumulates no C)", type(c).__name__)
    O.check_recipe(_OP, None if recipe in (None, (1, 128, 128)) else recipe)
    if r == 0:
        _fail("a[0]", "r > 0", f"shape {tuple(x.shape)}")
    O.check_rows(_OP, "a[0].shape[2]", r, "d.shape[2]", n, operands="x and y", pairs="z is written in 4-byte pairs")
    O.check_even_strides(_OP, d, "even b and h strides")
    if cuda:
        O.check_cuda(_OP, **{"a[0]": x, "a[1]": sfx, "b[0]": y, "b[1]": sfy, "d": d})
    return x, sfx, y, sfy


def kernel_args(x, sfx, y, sfy, z) -> tuple:
    """The kernel's arguments ``(a, sfa, b, sfb, d, ldd, ldg)`` in (batch, m, n, k) = (h, b, d, r) order: x as its
    [h, b, r] view (strided, in place; copied contiguous only where TMA cannot read it: a base or a b / h stride not
    a multiple of 16 bytes), sfx as the flat per-head
    MN-major buffer, y and sfy contiguous, z as 32-bit words of bf16 pairs with its b (row) and h (batch) strides."""
    r = x.shape[2]
    a = x.permute(1, 0, 2)
    if a.data_ptr() % 16 or any(st % 16 or st <= 0 for st in a.stride()[:2]):
        a = a.clone(memory_format=torch.contiguous_format)
    return (a, O.flat_sf(sfx.permute(1, 0, 2), r), O.tma_aligned(y), sfy.contiguous(), O.d_words(z), z.stride(0),
            z.stride(1))


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(x, sfx, y, sfy, z, tile: str | None = None) -> None:
    fn = O.kernel_function(_FUNCTIONS, x, tile=tile or O.choose_tile(x.shape[0] * x.shape[1], y.shape[1]))
    fn(*kernel_args(x, sfx, y, sfy, z))


def fp8_einsum(equation: str, a, b, d: torch.Tensor, c: torch.Tensor | None = None,
               recipe=(1, 128, 128)) -> None:
    """DeepGEMM's ``fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128))`` on SM90: ``d = einsum(expr, a[0] *
    a[1], b[0] * b[1])`` in bf16, in place. ``'bhr,hdr->bhd'``: ``a = (x [b, h, r] e4m3, sfx [b, h, ceil(r/128)]
    fp32)``, ``b = (y [h, d, r] e4m3, sfy [h, ceil(d/128), ceil(r/128)] fp32)``. ``'bhd,hdr->bhr'``: ``a = (x [b, h,
    d], sfx [b, h, ceil(d/128)])``, ``b = (y [h, d, r], sfy [h, ceil(d/128), ceil(r/128)])`` (y copied K-major
    first)."""
    x, sfx, y, sfy = check_inputs(equation, a, b, d, c, recipe)
    if d.numel() == 0:
        return
    if equation == TRANSPOSED_Y:  # y [h, d, r] -> [h, r, d] K-major (SM90 FP8 wgmma), its block scales alike
        y, sfy = y.transpose(1, 2).contiguous(), sfy.transpose(1, 2)
    if runtime.direct_call(x, sfx, y, sfy, d):
        _run(x, sfx, y, sfy, d)
    else:
        torch.ops.tirx.deepgemm_fp8_einsum_bhr_hdr_bhd(x, sfx, y, sfy, d)


@torch.library.custom_op("tirx::deepgemm_fp8_einsum_bhr_hdr_bhd", mutates_args=("z",))
def _op(x: torch.Tensor, sfx: torch.Tensor, y: torch.Tensor, sfy: torch.Tensor, z: torch.Tensor) -> None:
    _run(x, sfx, y, sfy, z)


@_op.register_fake
def _(x, sfx, y, sfy, z):
    return None


run_test, run_bench = harness.bind(__name__)
