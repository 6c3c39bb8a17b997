# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's tf32_hc_prenorm_gemm on SM90 (csrc/apis/hyperconnection.hpp; csrc/jit_kernels/impls/
# sm90_tf32_hc_prenorm_gemm.hpp; deep_gemm/include/deep_gemm/impls/sm90_tf32_hc_prenorm_gemm.cuh; tests/
# test_hyperconnection.py) at deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b. Written anew in TIRx
# (kernel: _tf32_hc_prenorm_kernel.py).
"""``tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)``: the hyper-connection pre-norm GEMM. ``D[M, N] fp32 =
A[M, K] (bf16, as tf32) x B[N, K]^T (fp32, read as tf32)`` and ``sqr_sum[M] = sum_k A^2`` (the RMS statistics of
the same rows), N = 24 (any of 8, 16, 24, 32). With ``num_splits = s`` K is split into s ranges of 64-wide blocks and
``d`` [s, M, N] / ``sqr_sum`` [s, M] receive one partial per range: the caller sums them (``d.sum(0)``), DeepGEMM's
convention (a range with no block gets zeros). ``num_splits=None``: ``d`` [M, N], ``sqr_sum`` [M].

Precision: A is exact in tf32 (bf16 has 8 mantissa bits); B's low 13 mantissa bits are not read by the tensor core
(tf32 wgmma), so the oracle is the fp64 product of A and B truncated to tf32 (calc_diff < 1e-8, DeepGEMM's bound;
the emulated kernel reaches ~1e-15). Against B in full fp32 the truncation alone gives calc_diff ~1e-7. The GPU
comparator falls back to B rounded to nearest and reports which reading matched (``tf32_b``): the card has not run
this kernel yet.

Requirements (DeepGEMM's): A and B K-major, D N-major (unit column stride), sqr_sum contiguous, K a multiple of 64,
K > 0. A's rows or B's rows at a stride TMA cannot read (not 16-byte multiples) are copied first.

Speed: memory-bound on A (2 bytes per 48 FLOP). Goal >= 85 % of the copy bandwidth on A's bytes. Artifacts: one
per N, M / K / num_splits at run time.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime

from . import _fp8_gemm_common as F
from . import _fp8_gemm_op as O
from . import _tf32_hc_prenorm_kernel as H

KERNEL_META = {
    "name": "deepgemm_sm90_tf32_hc_prenorm_gemm",
    "category": "ported.deepgemm",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "DeepGEMM tf32_hc_prenorm_gemm (SM90): D[M, 24] fp32 = A[M, K] bf16 (as tf32) x B[24, K]^T and "
                   "the row sums of squares of A, split-K partials; TMA ring + wgmma m64n24k8 tf32 RS",
    "upstream": {"project": "DeepGEMM", "url": "https://github.com/deepseek-ai/DeepGEMM",
                 "commit": "54e22612409371d6364144b69086735beb54e98b"},
    "public_ops": ["tf32_hc_prenorm_gemm"],
    "reference_requirements": [
        {"package": "deep-gemm", "import": "deep_gemm", "git": "https://github.com/deepseek-ai/DeepGEMM",
         "commit": "54e22612409371d6364144b69086735beb54e98b", "baseline": "deepgemm"},
    ],
}

# DeepGEMM's test shapes (tests/test_hyperconnection.py: m in 13 / 137 / 4096 / 8192, (n, k) in (24, 28672 / 7680 /
# 7168), num_splits None / 16) and the issue's split counts 64 and 112.
CONFIGS = [
    {"label": "m13_k7168_nosplit", "M": 13, "K": 7168, "num_splits": None},
    {"label": "m13_k28672_s112", "M": 13, "K": 28672, "num_splits": 112},
    {"label": "m137_k7168_s1", "M": 137, "K": 7168, "num_splits": 1},
    {"label": "m137_k7680_s16", "M": 137, "K": 7680, "num_splits": 16},
    {"label": "m137_k28672_s64", "M": 137, "K": 28672, "num_splits": 64},
    {"label": "m4096_k7168_nosplit", "M": 4096, "K": 7168, "num_splits": None},
    {"label": "m4096_k28672_s16", "M": 4096, "K": 28672, "num_splits": 16},
    {"label": "m8192_k28672_nosplit", "M": 8192, "K": 28672, "num_splits": None},
    {"label": "m8192_k7680_s16", "M": 8192, "K": 7680, "num_splits": 16},
    {"label": "m8192_k7168_s112", "M": 8192, "K": 7168, "num_splits": 112},
    {"label": "m200_k640_s16_empty_splits", "M": 200, "K": 640, "num_splits": 16},
]
BENCH_CONFIGS = [
    {"label": "m13_k28672_s112", "M": 13, "K": 28672, "num_splits": 112},
    {"label": "m4096_k7168_s16", "M": 4096, "K": 7168, "num_splits": 16},
    {"label": "m8192_k28672_nosplit", "M": 8192, "K": 28672, "num_splits": None},
]
DEFAULTS = {"N": 24, "num_splits": None}
NUM_STAGES = 7  # 7 x 14 KB: two CTAs per SM (one CTA's ring fills while the other's drains at split boundaries)
CALC_DIFF_MAX = 1e-8  # DeepGEMM's bound (tests/test_hyperconnection.py)
_OP = "tf32_hc_prenorm_gemm"


def compile_params(N: int = 24, **_) -> dict:  # noqa: N803
    return {"n": int(N)}


def artifact_params() -> list[dict]:
    return [{"n": n} for n in H.NS]


def call_samples(rng) -> list[dict]:
    return [{"M": rng.choice([1, 13, 137, 8192, rng.randint(1, 20000)]), "K": 64 * rng.randint(1, 512),
             "N": rng.choice(H.NS), "num_splits": rng.choice([None, 1, 16, 64, 112])} for _ in range(24)]


def get_kernel(n: int):
    return H.build_kernel(n, NUM_STAGES).with_attr("global_symbol", KERNEL_META["name"])


def sass_expect(**_) -> list[str]:
    return [r"HGMMA\.64x\d+x8\.F32\.TF32", r"UTMALDG\.2D", r"SYNCS"]


def tf32(x: torch.Tensor, rounding: str = "truncate") -> torch.Tensor:
    """fp32 ``x`` as a tf32 operand: the low 13 mantissa bits dropped (``"truncate"``: what the tf32 wgmma reads, and
    the CPU emulator models), or rounded to nearest even (``"nearest"``: ``cvt.rn.tf32.f32``). Finite inputs."""
    bits = x.float().contiguous().view(torch.int32)
    if rounding == "nearest":
        bits = bits + 0xFFF + ((bits >> 13) & 1)
    elif rounding != "truncate":
        raise ValueError(f"tf32: rounding {rounding!r} is 'truncate' or 'nearest'")
    return (bits & ~0x1FFF).view(torch.float32)


def prepare_data(M: int, K: int, N: int = 24, num_splits: int | None = None, **_) -> dict:  # noqa: N803
    """DeepGEMM's inputs (randn bf16 A, randn fp32 B) and fresh outputs of the split form."""
    g, _ = F.cuda_generator()
    a = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, K, generator=g, device="cuda")
    lead = () if num_splits is None else (num_splits,)
    return {"a": a, "b": b, "num_splits": num_splits,
            "d": torch.empty(*lead, M, N, device="cuda"), "sqr_sum": torch.empty(*lead, M, device="cuda")}


def reference(a, b, num_splits=None, rounding: str = "truncate", **_) -> dict:
    """fp64 partials of each split's K range (``_tf32_hc_prenorm_kernel.k_range``) of A x tf32(B)^T and of A^2."""
    M, K = a.shape  # noqa: N806
    s = num_splits or 1
    a64, b64 = a.double(), tf32(b, rounding).double()
    d = torch.zeros(s, M, b.shape[0], dtype=torch.float64, device=a.device)
    sq = torch.zeros(s, M, dtype=torch.float64, device=a.device)
    for split in range(s):
        first, count = H.k_range(split, s, K // H.BLOCK_K)
        if count:
            cols = slice(first * H.BLOCK_K, (first + count) * H.BLOCK_K)
            d[split] = a64[:, cols] @ b64[:, cols].T
            sq[split] = a64[:, cols].square().sum(-1)
    if num_splits is None:
        d, sq = d[0], sq[0]
    return {"d": d, "sqr_sum": sq}


def _comparator(got, want, cfg: dict, inputs: dict, key: str = "sqr_sum") -> dict:
    """calc_diff < 1e-8 against the oracle of truncated B; for D, where that fails, against the oracle of B rounded to
    nearest (which tf32 reading the card does is reported, ``tf32_b``: the CPU emulator truncates, as the PTX ISA
    describes; a card that rounds would still be correct)."""
    if got.shape != want.shape:
        raise harness.KernelCheckError(f"shape {tuple(got.shape)} != wanted shape {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        raise harness.KernelCheckError(f"{int((~torch.isfinite(got)).sum())} outputs not finite (unwritten?)")
    diff, reading = O.calc_diff(got, want), "truncate"
    if diff > CALC_DIFF_MAX and key == "d" and "a" in inputs and "b" in inputs:
        nearest = reference(inputs["a"], inputs["b"], inputs.get("num_splits"), rounding="nearest")["d"]
        alt = O.calc_diff(got, nearest)
        if alt <= CALC_DIFF_MAX:
            diff, reading = alt, "nearest"
    if diff > CALC_DIFF_MAX:
        raise harness.KernelCheckError(f"calc_diff {diff:.3e} > {CALC_DIFF_MAX}")
    return {"calc_diff": diff, **({"tf32_b": reading} if key == "d" else {})}


COMPARATORS = {"d": lambda *args: _comparator(*args, key="d"), "sqr_sum": _comparator}


def launch(cfg: dict, data: dict) -> None:
    tf32_hc_prenorm_gemm(data["a"], data["b"], data["d"], data["sqr_sum"], num_splits=data["num_splits"])


def roofline(M: int, K: int, N: int = 24, num_splits: int | None = None, **_) -> dict:  # noqa: N803
    s = num_splits or 1
    return {"flops": 2 * M * N * K, "bytes": 2 * M * K + 4 * N * K + 4 * s * M * (N + 1)}


def get_baselines(**cfg) -> dict:
    """torch: the fp64 oracle; deepgemm: ``deep_gemm.tf32_hc_prenorm_gemm`` (same split convention: checked); tf32 /
    fp32 (timed only): torch matmul of A (as fp32) by B^T with TF32 allowed / not, plus ``A.float().square().sum(-1)``
    (the unfused pair, unsplit)."""
    def deepgemm(dg, d, out, sq):
        dg.tf32_hc_prenorm_gemm(d["a"], d["b"], out, sq, num_splits=d["num_splits"])

    def matmul_ref(allow_tf32: bool):
        def build():
            def run(d):
                prev = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = allow_tf32
                try:
                    af = d["a"].float()
                    return {"d": af @ d["b"].T, "sqr_sum": af.square().sum(-1)}
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = prev

            return run

        return build

    return {"torch": F.oracle_baseline(reference), "deepgemm": F.deepgemm_baseline(deepgemm, out=("d", "sqr_sum")),
            "tf32": matmul_ref(True), "fp32": matmul_ref(False)}


# ------------------------------------------------------------------------------------------------- public op
def _fail(name: str, expected: str, got) -> None:
    O.fail(_OP, name, expected, got)


def check_inputs(a, b, d, sqr_sum, num_splits=None, cuda: bool = True):
    """Validate the call; returns ``(M, N, K, splits)``."""
    checks.tensor(_OP, "a", a, dtypes=(torch.bfloat16,), ndim=2, inner_contiguous=False, cuda=False)
    checks.tensor(_OP, "b", b, dtypes=(torch.float32,), ndim=2, inner_contiguous=False, cuda=False)
    for name, t in (("a", a), ("b", b)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            _fail(name, "a K-major operand (unit stride along K, as DeepGEMM)", f"strides {tuple(t.stride())}")
    M, K = a.shape  # noqa: N806
    N = b.shape[0]  # noqa: N806
    if b.shape[1] != K:
        _fail("b", f"K={K} columns (a is {tuple(a.shape)})", f"shape {tuple(b.shape)}")
    if N not in H.NS:
        _fail("b", f"N (rows) in {H.NS} (DeepGEMM: N <= 32, a multiple of 8)", f"shape {tuple(b.shape)}")
    if K == 0 or K % H.BLOCK_K:
        _fail("a", f"K > 0 and a multiple of {H.BLOCK_K} (DeepGEMM's block K)", f"shape {tuple(a.shape)}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        _fail("num_splits", "None or an int >= 1", num_splits)
    lead = () if num_splits is None else (num_splits,)
    checks.tensor(_OP, "d", d, dtypes=(torch.float32,), shape=(*lead, M, N), inner_contiguous=True, cuda=False)
    checks.tensor(_OP, "sqr_sum", sqr_sum, dtypes=(torch.float32,), shape=(*lead, M), contiguous=True, cuda=False)
    if cuda:
        O.check_cuda(_OP, a=a, b=b, d=d, sqr_sum=sqr_sum)
    return M, N, K, num_splits or 1


def _tma_readable(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where TMA can read it (16-byte base and row stride), else a contiguous copy."""
    ok = t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(0) > 0
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def kernel_args(a, b, d, sqr_sum, splits: int) -> tuple:
    """``(a, b, d span, sqr_sum flat, num_splits, ldd, lds)``: d read through its row and split strides."""
    span = 1 + sum((s - 1) * st for s, st in zip(d.shape, d.stride()))
    lds = d.stride(0) if d.dim() == 3 else 0
    return (_tma_readable(a), _tma_readable(b), d.as_strided((span,), (1,)), sqr_sum.view(-1), splits,
            d.stride(-2), lds)


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(a, b, d, sqr_sum, splits: int) -> None:
    fn = O.kernel_function(_FUNCTIONS, a, n=b.shape[0])
    fn(*kernel_args(a, b, d, sqr_sum, splits))


def tf32_hc_prenorm_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
                         num_splits: int | None = None) -> None:
    """DeepGEMM's ``tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)``: ``d = a @ b.T`` (tf32) and ``sqr_sum =
    (a * a).sum(-1)`` in place, or their ``num_splits`` split-K partials (``d`` [s, M, N], ``sqr_sum`` [s, M]) for the
    caller to sum."""
    M, N, K, splits = check_inputs(a, b, d, sqr_sum, num_splits)  # noqa: N806
    if M == 0:
        return
    if runtime.direct_call(a, b, d, sqr_sum):
        _run(a, b, d, sqr_sum, splits)
    else:
        torch.ops.tirx.deepgemm_tf32_hc_prenorm_gemm(a, b, d, sqr_sum, splits)


@torch.library.custom_op("tirx::deepgemm_tf32_hc_prenorm_gemm", mutates_args=("d", "sqr_sum"))
def _op(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor, splits: int) -> None:
    _run(a, b, d, sqr_sum, splits)


@_op.register_fake
def _(a, b, d, sqr_sum, splits):
    return None


run_test, run_bench = harness.bind(__name__)
