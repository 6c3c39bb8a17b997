# SPDX-License-Identifier: Apache-2.0
# The contract and the chunked algorithm follow fla's chunk_kda (fla-org/flash-linear-attention, fla/ops/kda, commit
# 9c8e42e7: safe gate, beta sigmoid and q/k L2 norm in the kernel, state [N, H, K, V]); read, not copied.
"""KDA (Kimi Delta Attention) chunked forward on Hopper: THD-packed variable-length sequences (B = 1, cu_seqlens),
K = V = 128, bf16 (or fp16: rounded to bf16 first) q, k, v, raw gate g and beta logits, fp32 initial / final states
[N, H, K, V] (fla's layout).

Per sequence and head, token by token (the oracle is :mod:`tirx_kernels.core.kda_ref`)::

    g   = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h]))      (per key channel, <= 0)
    S   = diag(exp(g)) S;   S += k' (sigmoid(beta) (v - S^T k'))^T;   o = scale S^T q'

with q', k' the L2-normalised rows. Three kernels, 64-token chunks:

- ``table`` (``_chunk_table``): one CTA builds the chunk slots' ``(tok0, clen)`` and each sequence's first slot from
  ``cu_seqlens`` on the device (no host sync; one launch where the torch ops took ~25).
- ``chunk`` (``_kda_chunk``): every chunk of every sequence at once, one CTA per (chunk, head): gate and cumulative
  gate, norms, the per-channel-decayed K K^T and Q K^T on wgmma in 16-key strips, the UT transform (I + A)^-1 in
  fp32, and the gated operands Q_g, K_g, K_d, written to global (bf16).
- ``scan`` (``_kda_scan``): one CTA per (head, sequence, value half) walks the chunks with the 64 x 128 state slice
  in registers: five wgmma products per chunk from a two-stage TMA ring.

Status: emulated on the CPU (one ragged batch); not yet run on a GPU.
"""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, harness, kda_ref, runtime

KERNEL_META = {
    "name": "kda_forward_portfolio_multishape",
    "category": "kda",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "KDA chunked forward (safe gate, beta sigmoid, q/k L2 norm in kernel; chunk-local WY pass and a "
                   "wgmma state scan), THD varlen, K = V = 128, bf16/fp16, fp32 states",
    "reference_requirements": [
        {"package": "fla-core", "import": "fla", "specifier": "==0.6.0", "baseline": "fla"},
    ],
    "public_ops": ["chunk_kda"],
}

OP = "chunk_kda"
DIM = 128
CHUNK = 64
LOWER_BOUND = -5.0

# The catalog's rows (section 9.4): H 96 / 64 x {fixed 8192, mixed lengths, uniform 1024 x 8}, ragged tails, 65
# sequences at H 8, and small ragged rows with empty and 1-token sequences.
MIXED = "1300+547+2048+963+271+3063"
CONFIGS = [
    {"label": "h96_fixed8192", "H": 96, "seqs": "8192"},
    {"label": "h96_mixed", "H": 96, "seqs": "1300+547+2048+963+271+3063"},
    {"label": "h96_uniform1024x8", "H": 96, "seqs": "1024x8"},
    {"label": "h64_fixed8192", "H": 64, "seqs": "8192"},
    {"label": "h64_mixed", "H": 64, "seqs": "1300+547+2048+963+271+3063"},
    {"label": "h64_uniform1024x8", "H": 64, "seqs": "1024x8"},
    {"label": "h16_b1_t8192", "H": 16, "seqs": "8192"},
    {"label": "h8_ragged_tails", "H": 8, "seqs": "1+63+64+65+127+129+1000"},
    {"label": "h8_65seqs", "H": 8, "seqs": "100x64+37"},
    {"label": "h2_ragged_empty_one", "H": 2, "seqs": "70+0+1+64+130", "init": True},
    {"label": "h4_noinit", "H": 4, "seqs": "200+3", "init": False},
    {"label": "fp16_h2_ragged", "H": 2, "seqs": "70+1+130", "dtype": "float16"},
]
BENCH_CONFIGS = [
    {"label": "h16_b1_t8192", "H": 16, "seqs": "8192"},
    {"label": "h64_mixed", "H": 64, "seqs": "1300+547+2048+963+271+3063"},
    {"label": "h96_fixed8192", "H": 96, "seqs": "8192"},
    {"label": "h96_uniform1024x8", "H": 96, "seqs": "1024x8"},
]
DEFAULTS = {"init": True, "dtype": "bfloat16"}

# The kernels round Sb, Y, Delta, P, T beta, Q_g, K_g, K_d and the normalised q / k to bf16 (as fla's kernels do):
# a relative Frobenius error of a few 1e-3 on the fp32 oracle (emulated rows).
# fp16 I/O goes through the same bf16 operands (fp16 inputs rounded to bf16 first: ``_run``).
TOLERANCE = {"bfloat16": (1e-1, 4e-2), "float16": (1e-1, 4e-2), "float32": (1e-1, 4e-2)}


def seq_lens(seqs: str) -> list[int]:
    """``"70+0+1"`` -> [70, 0, 1]; ``"1024x8"`` -> eight 1024s."""
    out = []
    for term in seqs.split("+"):
        length, _, count = term.partition("x")
        out += [int(length)] * int(count or 1)
    return out


# ---------------------------------------------------------------------------------------------------------
# Kernels and artifacts
# ---------------------------------------------------------------------------------------------------------

def compile_params(**_) -> dict:
    """Nothing of a call changes the code (lengths, heads and flags are run-time); ``chunk`` and ``table`` are the
    other artifacts."""
    return {"kernel": "scan"}


def get_kernel(kernel: str = "scan"):
    from tirx_kernels.kda import _chunk_table, _kda_chunk, _kda_scan

    if kernel == "chunk":
        return _kda_chunk.build_chunk_kernel()
    if kernel == "scan":
        return _kda_scan.build_scan_kernel()
    if kernel == "table":
        return _chunk_table.build_chunk_table_kernel()
    raise ValueError(f"{OP}: kernel {kernel!r} is 'chunk', 'scan' or 'table'")


def artifact_params() -> list[dict]:
    return [{"kernel": "chunk"}, {"kernel": "scan"}, {"kernel": "table"}]


def call_samples(rng) -> list[dict]:
    return [{"H": rng.choice([1, 8, 16, 64, 96]), "seqs": rng.choice(["1", "64", "1000+3", MIXED])} for _ in range(24)]


def sass_expect(kernel: str = "scan", **_) -> list[str]:
    """The chunk pass's 16-key strips (m64n16) on the tensor cores; the scan's products and its 3-D TMA loads; the
    table's scans on shuffles."""
    if kernel == "chunk":
        return [r"HGMMA\.64x16x16\.F32\.BF16"]
    if kernel == "table":
        return [r"SHFL\.UP"]
    return [r"HGMMA\.64x64x16\.F32\.BF16", r"HGMMA\.64x128x16\.F32\.BF16", r"UTMALDG\.3D"]


# ---------------------------------------------------------------------------------------------------------
# Data, oracle, baselines
# ---------------------------------------------------------------------------------------------------------

def prepare_data(H: int, seqs: str, init: bool = True, dtype: str = "bfloat16", device: str = "cuda") -> dict:  # noqa: N803
    """Random q, k, v, raw gate (normal), beta logits (in ``dtype``), A_log, dt_bias (as a model's), a small initial
    state; outputs poisoned (NaN)."""
    lens = seq_lens(seqs)
    total, n = sum(lens), len(lens)
    bf = getattr(torch, dtype)
    q, k, v = (torch.randn(1, total, H, DIM, device=device).to(bf) for _ in range(3))
    g = torch.randn(1, total, H, DIM, device=device).to(bf)
    beta = torch.randn(1, total, H, device=device).to(bf)
    a_log = torch.log(torch.rand(H, device=device) * 15 + 1)
    dt_bias = torch.randn(H * DIM, device=device) * 0.5
    h0 = torch.randn(n, H, DIM, DIM, device=device) * 0.05 if init else None
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int64)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": a_log, "dt_bias": dt_bias,
            "initial_state": h0, "cu_seqlens": cu,
            "o": torch.full((1, total, H, DIM), float("nan"), dtype=bf, device=device),
            "final_state": torch.full((n, H, DIM, DIM), float("nan"), device=device)}


def reference(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, **_) -> dict:  # noqa: N803
    """The fp32 chunked oracle (core.kda_ref)."""
    o, ht = kda_ref.forward(q, k, v, g, beta, A_log, dt_bias, DIM ** -0.5, initial_state, cu_seqlens,
                            LOWER_BOUND, torch.float32)
    return {"o": o, "final_state": ht}


def launch(cfg: dict, data: dict) -> None:
    chunk_kda(data["q"], data["k"], data["v"], data["g"], data["beta"], data["A_log"], data["dt_bias"],
              initial_state=data["initial_state"], output_final_state=True, cu_seqlens=data["cu_seqlens"],
              out=data["o"], final_state=data["final_state"])


def roofline(H: int, seqs: str, init: bool = True, **_) -> dict:  # noqa: N803
    """FLOPs of the chunked algorithm per token and head: the state products (K_g S^T, Q_g S^T, the update)
    3 x 2 d^2, the chunk products (K K^T, Q K^T, T beta Y, P Delta) 4 x 2 C d. Bytes: q, k, v, g read, o written
    (bf16), the states."""
    lens = seq_lens(seqs)
    total, n = sum(lens), len(lens)
    flops = total * H * (6 * DIM * DIM + 8 * CHUNK * DIM)
    nbytes = 2 * total * H * (5 * DIM + 1) + 4 * n * H * DIM * DIM * (1 + int(init))
    return {"bytes": nbytes, "flops": flops}


def fla_chunk_kda(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens):  # noqa: N803
    """fla's chunk_kda on this op's raw inputs: the gate, beta sigmoid and q/k L2 norm in fla's kernels where its
    release takes ``use_gate_in_kernel`` / ``safe_gate`` / ``use_beta_sigmoid_in_kernel``, else the gate and beta
    activated in torch first (differentiable either way). Returns ``(o, final_state)``."""
    from fla.ops.kda import chunk_kda

    common = dict(scale=DIM ** -0.5, initial_state=initial_state, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)
    try:
        return chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                         use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LOWER_BOUND, **common)
    except TypeError:  # a release without the in-kernel gate options
        h = q.shape[2]
        gate = LOWER_BOUND * torch.sigmoid(torch.exp(A_log.float()).view(h, 1)
                                           * (g.float() + dt_bias.float().view(h, DIM)))
        return chunk_kda(q, k, v, gate, torch.sigmoid(beta.float()).to(beta.dtype), **common)


def get_baselines(**cfg) -> dict:
    def fla():
        import fla.ops.kda  # noqa: F401 -- a missing package is a missing reference

        def fn(data):
            o, ht = fla_chunk_kda(data["q"], data["k"], data["v"], data["g"], data["beta"], data["A_log"],
                                  data["dt_bias"], data["initial_state"], data["cu_seqlens"])
            return {"o": o, "final_state": ht}
        return fn

    return {"fla": fla}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

_FUNCTIONS = runtime.FunctionCache(__name__)
_INT32_MAX = 2**31 - 1


def _fail(name: str, expected: str, got: str):
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def check_inputs(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, out, final_state):  # noqa: N803
    checks.tensor(OP, "q", q, dtypes=(torch.bfloat16, torch.float16), ndim=4, contiguous=True, cuda=False)
    b, total, h, d = q.shape
    if b != 1 or d != DIM or h < 1:
        _fail("q", f"[1, T, H, {DIM}] (packed sequences, B = 1)", f"shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v), ("g", g)):
        checks.tensor(OP, name, t, dtypes=(q.dtype,), shape=(1, total, h, DIM), contiguous=True, cuda=False)
    checks.tensor(OP, "beta", beta, dtypes=(q.dtype,), shape=(1, total, h), contiguous=True, cuda=False)
    checks.tensor(OP, "A_log", A_log, dtypes=(torch.float32,), shape=(h,), contiguous=True, cuda=False)
    checks.tensor(OP, "dt_bias", dt_bias, dtypes=(torch.float32,), shape=(h * DIM,), contiguous=True, cuda=False)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        _fail("scale", "None or a finite float", repr(scale))
    if cu_seqlens is None:
        _fail("cu_seqlens", "the cumulative sequence lengths [N + 1]", "None")
    checks.tensor(OP, "cu_seqlens", cu_seqlens, dtypes=(torch.int32, torch.int64), ndim=1, contiguous=True,
                  cuda=False)
    n = cu_seqlens.shape[0] - 1
    if not 1 <= n <= 65535:
        _fail("cu_seqlens", "2 .. 65536 entries", f"shape {tuple(cu_seqlens.shape)}")
    if total * h * DIM > _INT32_MAX:
        _fail("q", "fewer than 2**31 elements", f"shape {tuple(q.shape)}")
    for name, st in (("initial_state", initial_state), ("final_state", final_state)):
        if st is not None:
            checks.tensor(OP, name, st, dtypes=(torch.float32,), shape=(n, h, DIM, DIM), contiguous=True, cuda=False)
    if out is not None:
        checks.tensor(OP, "out", out, dtypes=(q.dtype,), shape=(1, total, h, DIM), contiguous=True, cuda=False)
    checks.tensor(OP, "q", q, cuda=True)
    present = {name: t for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("A_log", A_log),
                                       ("dt_bias", dt_bias), ("cu_seqlens", cu_seqlens),
                                       ("initial_state", initial_state), ("out", out),
                                       ("final_state", final_state)) if t is not None}
    checks.same_device(OP, "q", q, **present)


def clamped_cu(cu_seqlens, total: int):
    """``cu_seqlens`` clamped into [0, T] and made non-decreasing (int64), what both kernels take: a bad one (a
    device tensor, not checked without a host sync) never sends a kernel outside the token or chunk buffers."""
    return torch.cummax(cu_seqlens.to(torch.int64).clamp(0, total), 0).values


# The table kernel keeps ccu[j] + 63 and the slot count in int32 (``_chunk_table``); no caller comes near (q's
# T H 128 elements are < 2^31), a larger T takes the torch ops.
_TABLE_MAX_TOKENS = 2**30


def chunk_table(cu_seqlens, total: int, functions=None):
    """On the device, no host sync: ``(tok0, clen, chunk_base)`` int32 of the chunk pass's ``total // 64 + N + 2``
    slots (slot order: every sequence's chunks, then the tokens after ``cu_seqlens[-1]`` with negative lengths, then
    empty slots) and each sequence's first slot (the scan's index into the decays). A CUDA ``cu_seqlens`` takes the
    ``table`` kernel (one launch, ``functions``: the calling module's cache), bit-identical to
    :func:`chunk_table_torch`, which serves the rest (CPU tensors: the emulated tests)."""
    n = cu_seqlens.shape[0] - 1
    if (not cu_seqlens.is_cuda or cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1
            or n < 1 or total > _TABLE_MAX_TOKENS):
        return chunk_table_torch(cu_seqlens, total)
    tok0, clen, base, ccu = table_outputs(n, total // CHUNK + n + 2, cu_seqlens.device)
    fn = (functions or _FUNCTIONS).get(("table", cu_seqlens.get_device()), lambda: {"kernel": "table"},
                                       cu_seqlens.device)
    fn(*table_args(cu_seqlens, total, tok0, clen, base, ccu))
    return tok0, clen, base


def table_outputs(n: int, slots: int, device) -> tuple:
    """The table kernel's outputs: ``tok0, clen`` [slots], ``base`` [N] and its scratch ``ccu`` [N + 1] (the clamped
    ``cu_seqlens``), int32."""
    return tuple(torch.empty(m, dtype=torch.int32, device=device) for m in (slots, slots, n, n + 1))


def table_args(cu_seqlens, total: int, tok0, clen, base, ccu) -> tuple:
    """The table kernel's arguments: ``cu_seqlens`` as int32 words (an int64 one read whole: flag 1)."""
    return (cu_seqlens.contiguous().view(torch.int32), tok0, clen, base, ccu, int(total),
            int(cu_seqlens.dtype == torch.int64))


def chunk_table_torch(cu_seqlens, total: int):
    """:func:`chunk_table` in torch ops (on the tensor's device, no host sync): the table kernel's oracle and its
    stand-in off the GPU."""
    cu = clamped_cu(cu_seqlens, total)
    n = cu.shape[0] - 1
    lens = (cu[1:] - cu[:-1]).clamp_min(0)
    nch = (lens + CHUNK - 1) // CHUNK
    ends = torch.cumsum(nch, 0)
    base = ends - nch
    slots = total // CHUNK + n + 2
    idx = torch.arange(slots, device=cu.device)
    seq = torch.searchsorted(ends, idx, right=True).clamp_max(n - 1)
    tok0 = cu[seq] + CHUNK * (idx - base[seq])
    clen = torch.minimum(cu[seq + 1] - tok0, torch.full_like(tok0, CHUNK))
    real = idx < ends[-1]
    tail = idx - ends[-1]
    tail_tok0 = cu[-1] + CHUNK * tail
    tail_len = torch.minimum(total - tail_tok0, torch.full_like(tail_tok0, CHUNK)).clamp_min(0)
    tok0 = torch.where(real, tok0, tail_tok0.clamp_max(max(total - 1, 0)))
    clen = torch.where(real, clen, -tail_len)
    return tok0.to(torch.int32), clen.to(torch.int32), base.to(torch.int32)


def chunk_pass(q, k, g, beta, A_log, dt_bias, scale, cu_seqlens, functions=None):  # noqa: N803
    """The chunk kernel: ``(qg, kg, kd, pm, tb, gam, chunk_base)`` (``functions``: the calling module's cache)."""
    total, h = q.shape[1], q.shape[2]
    tok0, clen, base = chunk_table(cu_seqlens, total, functions)
    qg, kg, kd, pm, tb, gam = chunk_outputs(total, h, tok0.shape[0], q.device)
    fn = (functions or _FUNCTIONS).get(("chunk", q.get_device()), lambda: {"kernel": "chunk"}, q.device)
    fn(*chunk_args(q, k, g, beta, A_log, dt_bias, tok0, clen, qg, kg, kd, pm, tb, gam, scale))
    return qg, kg, kd, pm, tb, gam, base


def chunk_outputs(total: int, h: int, slots: int, device) -> tuple:
    """The chunk kernel's outputs (the scan's operands): ``qg, kg, kd`` [T, H, 128] and ``pm, tb`` [T, H, 64] bf16,
    ``gam`` [slots, H, 128] fp32."""
    qg, kg, kd = (torch.empty(total, h, DIM, dtype=torch.bfloat16, device=device) for _ in range(3))
    pm, tb = (torch.empty(total, h, CHUNK, dtype=torch.bfloat16, device=device) for _ in range(2))
    return qg, kg, kd, pm, tb, torch.empty(slots, h, DIM, dtype=torch.float32, device=device)


def chunk_args(q, k, g, beta, A_log, dt_bias, tok0, clen, qg, kg, kd, pm, tb, gam, scale):  # noqa: N803
    h = q.shape[2]

    return (q[0], k[0], g[0].view(torch.int16), beta[0].view(torch.int16), A_log, dt_bias.view(h, DIM), tok0, clen,
            qg, kg, kd, pm, tb, gam, float(scale), LOWER_BOUND)


def scan_args(qg, kg, kd, v, tb, pm, gam, cu_seqlens, base, out, initial_state, final_state, dummy, ckpt=None):
    """The scan's arguments (also the backward walk's, with its operands in these slots: ``_kda_scan``)."""
    flags = ((1 if cu_seqlens.dtype == torch.int64 else 0) | (2 if initial_state is not None else 0)
             | (4 if final_state is not None else 0) | (8 if ckpt is not None else 0))
    f32 = dummy.view(torch.float32)

    def flat(t):
        return f32 if t is None else t.view(-1)

    return (qg, kg, kd, v.view(-1, v.shape[-2], DIM), tb, pm, gam.view(-1), cu_seqlens.view(torch.int32), base,
            out.view(-1), flat(initial_state), flat(final_state), flat(ckpt), cu_seqlens.shape[0] - 1, flags)


def scan_pass(chunks, v, cu_seqlens, out, initial_state, final_state, ckpt=None, functions=None):
    """The scan kernel over the chunk pass's ``chunks``; ``ckpt`` [slots, H, K, V] fp32 receives each chunk's
    entering state."""
    qg, kg, kd, pm, tb, gam, base = chunks
    fn = (functions or _FUNCTIONS).get(("scan", v.get_device()), lambda: {"kernel": "scan"}, v.device)
    dummy = torch.zeros(4, dtype=torch.int32, device=v.device)
    cu = clamped_cu(cu_seqlens, v.shape[1])
    fn(*scan_args(qg, kg, kd, v, tb, pm, gam, cu, base, out, initial_state, final_state, dummy, ckpt))


def chunk_kda(q, k, v, g, beta, A_log, dt_bias, scale=None, initial_state=None, output_final_state=False,  # noqa: N803
              cu_seqlens=None, out=None, final_state=None):
    """fla's ``chunk_kda`` with ``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel``, ``safe_gate`` (lower bound
    -5) and ``use_beta_sigmoid_in_kernel``: q, k, v, g [1, T, H, 128] bf16 or fp16, beta [1, T, H] (logits), A_log [H]
    and dt_bias [H * 128] fp32, states fp32 [N, H, K, V]. Returns ``(o, final_state or None)``."""
    check_inputs(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, out, final_state)
    scale = DIM ** -0.5 if scale is None else float(scale)
    h = q.shape[2]
    n = cu_seqlens.shape[0] - 1
    if out is None:
        out = torch.empty_like(v)
    if output_final_state and final_state is None:
        final_state = torch.empty(n, h, DIM, DIM, dtype=torch.float32, device=q.device)
    if runtime.direct_call(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, out, final_state):
        _run(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, out, final_state)
        runtime.mark_written(out)
        if final_state is not None:
            runtime.mark_written(final_state)
    else:
        torch.ops.tirx.kda_forward_portfolio_multishape(q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                                                         cu_seqlens, out, final_state)
    return out, (final_state if output_final_state or final_state is not None else None)


def _run(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, out, final_state):  # noqa: N803
    """Launch both kernels on validated inputs."""
    if q.shape[1] == 0:
        if final_state is not None:
            final_state.copy_(initial_state if initial_state is not None else torch.zeros_like(final_state))
        return
    q, k, v, g, beta = as_kernel_dtype(q, k, v, g, beta)
    target = out if out.dtype == v.dtype else torch.empty_like(v)  # fp16 out: through a bf16 scratch
    chunks = chunk_pass(q, k, g, beta, A_log, dt_bias, scale, cu_seqlens)
    scan_pass(chunks, v, cu_seqlens, target, initial_state, final_state)
    if target is not out:
        out.copy_(target)


def as_kernel_dtype(*ts):
    """The kernels' operand dtype: fp16 tensors rounded to bf16 (the chunk pass's strips gate the key side by up to
    2^108, past fp16's range), bf16 ones as they are."""
    return tuple(t.to(torch.bfloat16) if t.dtype == torch.float16 else t for t in ts)


@torch.library.custom_op("tirx::kda_forward_portfolio_multishape", mutates_args=("out", "final_state"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float, initial_state: torch.Tensor | None,  # noqa: N803
               cu_seqlens: torch.Tensor, out: torch.Tensor, final_state: torch.Tensor | None) -> None:
    _run(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, cu_seqlens, out, final_state)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
