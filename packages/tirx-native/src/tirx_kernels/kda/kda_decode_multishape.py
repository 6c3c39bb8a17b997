# SPDX-License-Identifier: Apache-2.0
"""KDA (Kimi Delta Attention) recurrent decode over a bf16 state pool, one op for every decode shape: T = 1 and
speculative verification T = 2..8 with a state checkpoint per token and ``num_accepted_tokens`` picking the state
read; q/k L2 norm in the kernel; K = V = 128.

Per request n, value head hv (q/k head h = hv / (HV / H)), state S ``[V, K]`` read from
``state[state_indices[n, clamp(num_accepted_tokens[n] - 1, 0, T - 1)]]`` (column 0 without num_accepted_tokens),
token by token: ``S = S * gate[None, :]; S[v] += beta (v[v] - S[v] . k') k'; out[v] = S[v] . q'``, with
q' = q / |q| * scale, k' = k / |k| (eps 1e-6), and token t's state written to ``state[state_indices[n, t]]``.
The gate is ``exp(g)`` (g the log gate), or with ``A_log`` ``exp(-exp(A_log[h]) * softplus(g + dt_bias))``, or
with ``lower_bound`` as well ``exp(lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias)))``. A negative index is a
padding token: output 0, no state change, nothing written. The same contract as FlashInfer's
``recurrent_kda`` (the bench reference) in its pool form.

Kernel: the delta-rule decode template (``tirx_kernels.core.lang.delta_rule``) with a schedule picked per shape
from the table in ``plan`` and the token count a compile-time bound (one artifact per (schedule, T)): the state
read once with 16-byte vectors and kept in fp32 registers across the tokens, each checkpoint written once. The
schedule table is the upstream FlashInfer dispatch until GPU measurements tune it (not yet measured on Hopper).
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, delta_rule_ref, runtime
from tirx_kernels.core.lang import delta_rule as dr

KERNEL_META = {
    "name": "kda_decode_multishape",
    "category": "kda",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "KDA recurrent decode, T = 1..8 with per-token checkpoints, bf16 state pool in place",
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["kda_decode"],
}

# Shapes of the upstream catalog's official rows: H = 16 q/k heads; T = 1 at HV = 32, speculative T 2..6 at
# HV = 32, T = 3 with the lower-bound gate at HV = 16.
CONFIGS = [
    {"label": "t1_b8_hv32", "batch": 8},
    {"label": "t1_b3_hv32", "batch": 3},
    {"label": "t1_b128_hv32", "batch": 128},
    {"label": "t2_b16_hv32_nacc", "batch": 16, "T": 2, "num_accepted": True},
    {"label": "t4_b32_hv32_nacc", "batch": 32, "T": 4, "num_accepted": True},
    {"label": "t5_b8_hv32_nacc_pad", "batch": 8, "T": 5, "num_accepted": True, "pad": True},
    {"label": "t6_b64_hv32_nacc", "batch": 64, "T": 6, "num_accepted": True},
    {"label": "t3_b1_hv16_lb", "batch": 1, "T": 3, "n_vheads": 16, "gate": "lower_bound"},
    {"label": "t3_b16_hv16_lb", "batch": 16, "T": 3, "n_vheads": 16, "gate": "lower_bound"},
    {"label": "t2_b8_hv32_softplus", "batch": 8, "T": 2, "gate": "softplus", "num_accepted": True},
]

BENCH_CONFIGS = [
    {"label": "t1_b8_hv32", "batch": 8},
    {"label": "t1_b128_hv32", "batch": 128},
    {"label": "t4_b64_hv32_nacc", "batch": 64, "T": 4, "num_accepted": True},
    {"label": "t3_b16_hv16_lb", "batch": 16, "T": 3, "n_vheads": 16, "gate": "lower_bound"},
]

DEFAULTS = {"n_heads": 16, "n_vheads": 32, "T": 1, "gate": "log", "num_accepted": False, "pad": False}
LOWER_BOUND = -5.0

# The pool is updated in place; slots no token addresses are checked bit for bit.
INPLACE = {"state": "state"}
COMPARATORS = {"state": delta_rule_ref.pool_comparator("state")}

# Schedules (rows_per_cta, lanes_per_row, rows_per_thread) of the template.
SCHEDULES = {"warp16": (16, 16, 8), "cta32x4": (32, 4, 1), "cta32x2": (32, 2, 1)}
WARP_MIN_SEQUENCE_HEADS = 128


def plan(batch: int, T: int, n_vheads: int) -> str:  # noqa: N803
    """The schedule of a call: one warp per 16 value rows when T = 1 fills the GPU with B * HV >= 128 warps
    (32 threads, 8 rows a thread); 32-row CTAs otherwise (4 lanes a row at T = 1; 2 lanes, 64 fp32 state
    values a thread, at T > 1, where the token data staged once per CTA serves more rows)."""
    if T == 1:
        return "warp16" if batch * n_vheads >= WARP_MIN_SEQUENCE_HEADS else "cta32x4"
    return "cta32x2"


def compile_params(batch: int = 1, T: int = 1, n_vheads: int = 32, **_) -> dict:  # noqa: N803
    return {"schedule": plan(batch, T, n_vheads), "max_tokens": T}


def get_kernel(schedule: str, max_tokens: int):
    if schedule not in SCHEDULES:
        raise ValueError(f"kda_decode_multishape: schedule {schedule!r} (one of {sorted(SCHEDULES)})")
    return dr.build_decode_kernel(max_tokens, *SCHEDULES[schedule])


def artifact_params() -> list[dict]:
    return [{"schedule": "warp16", "max_tokens": 1}, {"schedule": "cta32x4", "max_tokens": 1}] + \
        [{"schedule": "cta32x2", "max_tokens": t} for t in range(2, dr.MAX_TOKENS + 1)]


def call_samples(rng) -> list[dict]:
    return [{**DEFAULTS, "batch": rng.choice([1, 7, 64, 512, rng.randint(1, 1024)]), "T": t, "n_heads": h,
             "n_vheads": hv} for h, hv in ((16, 32), (16, 16), (8, 32), (32, 64)) for t in (1, 1, 2, 3, 4, 6, 8)]


# ---------------------------------------------------------------------------------------------------------
# The public op
# ---------------------------------------------------------------------------------------------------------

OP = "kda_decode"


def _fail(name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def _check(name, t, shape, dtype=torch.bfloat16):
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
        _fail(name, f"{dtype} {shape}", f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if t.stride(-1) != 1 or (t.dim() == 4 and t.shape[2] > 1 and t.stride(2) != t.shape[3]) or \
            not all(0 <= s < 2**31 for s in t.stride()):
        _fail(name, "unit stride on the last dim, heads contiguous, int32 strides", f"strides {t.stride()}")


def _misaligned(t: torch.Tensor) -> bool:
    """The pool's base off 16 bytes (its 16-byte vector accesses); not checked while torch.compile traces (fake
    tensors have no address: the eager path and the custom op's body, run on real tensors, check it)."""
    return not torch.compiler.is_compiling() and t.data_ptr() % 16 != 0


def normalize(q, k, v, g, beta, state, state_indices, num_accepted_tokens=None, A_log=None,  # noqa: N803, C901
              dt_bias=None, lower_bound=None, scale=None, out=None) -> dict:
    """The op's arguments validated and brought to ``delta_rule.launch_args``'s forms (views only)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[3] != 128 or not 1 <= q.shape[1] <= dr.MAX_TOKENS:
        _fail("q", f"bfloat16 (B, T <= {dr.MAX_TOKENS}, H, 128)", getattr(q, "shape", type(q).__name__))
    batch, ntokens, n_heads, _ = q.shape
    _check("q", q, tuple(q.shape))
    _check("k", k, tuple(q.shape))
    if not isinstance(v, torch.Tensor) or v.dim() != 4 or v.shape[2] % n_heads:
        _fail("v", f"(B, T, HV, 128), HV a multiple of H = {n_heads}", getattr(v, "shape", type(v).__name__))
    n_vheads = v.shape[2]
    _check("v", v, (batch, ntokens, n_vheads, 128))
    _check("g", g, (batch, ntokens, n_vheads, 128))
    _check("beta", beta, (batch, ntokens, n_vheads))
    if out is not None:
        _check("out", out, (batch, ntokens, n_vheads, 128))
    if not isinstance(state, torch.Tensor) or state.dim() != 4 or tuple(state.shape[1:]) != (n_vheads, 128, 128) \
            or state.dtype != torch.bfloat16:
        _fail("state", f"bfloat16 (N, HV, 128, 128) with HV = {n_vheads}", getattr(state, "shape", state))
    if state.stride(3) != 1 or state.stride(2) != 128 or state.stride(1) != 128 * 128 or _misaligned(state) or \
            (state.stride(0) * 2) % 16 or not 0 < state.stride(0) < 2**31:
        _fail("state", "contiguous 16-byte aligned (HV, 128, 128) slots", f"strides {state.stride()}")
    idx_shape = (batch,) if ntokens == 1 and state_indices is not None and state_indices.dim() == 1 \
        else (batch, ntokens)
    if not isinstance(state_indices, torch.Tensor) or state_indices.dtype not in (torch.int32, torch.int64) or \
            tuple(state_indices.shape) != idx_shape:
        _fail("state_indices", f"int32 / int64 (B, T) = {(batch, ntokens)} (or (B,) at T = 1)",
              getattr(state_indices, "shape", state_indices))
    slots = state_indices.to(torch.int32).view(batch, ntokens)
    nacc = None
    if num_accepted_tokens is not None:
        if not isinstance(num_accepted_tokens, torch.Tensor) or tuple(num_accepted_tokens.shape) != (batch,) or \
                num_accepted_tokens.dtype not in (torch.int32, torch.int64):
            _fail("num_accepted_tokens", f"int32 / int64 (B,) = ({batch},)", getattr(num_accepted_tokens, "shape",
                                                                                    num_accepted_tokens))
        nacc = num_accepted_tokens.to(torch.int32).contiguous()
    if A_log is not None and (not isinstance(A_log, torch.Tensor) or tuple(A_log.shape) != (n_heads,) or
                              A_log.dtype != torch.float32 or A_log.stride(0) != 1):
        _fail("A_log", f"contiguous float32 (H,) = ({n_heads},)", getattr(A_log, "shape", A_log))
    if dt_bias is not None and (A_log is None or not isinstance(dt_bias, torch.Tensor) or
                                dt_bias.dtype != torch.float32 or dt_bias.numel() != n_heads * 128 or
                                not dt_bias.is_contiguous()):
        _fail("dt_bias", f"contiguous float32 (H * 128,) = ({n_heads * 128},), with A_log",
              getattr(dt_bias, "shape", dt_bias))
    if lower_bound is not None and (A_log is None or not float(lower_bound) < 0):
        _fail("lower_bound", "a negative number, with A_log", lower_bound)
    gate_mode = "log" if A_log is None else ("softplus" if lower_bound is None else "lower_bound")
    return dict(pool=state, q=q, k=k, v=v, g=g, beta=beta, slots=slots, scale=128 ** -0.5 if scale is None
                else float(scale), use_qk_l2norm=True, gate_mode=gate_mode, A_log=A_log,
                dt_bias=dt_bias, lower_bound=0.0 if lower_bound is None else float(lower_bound),
                beta_is_logit=False, source=None, source_index=None, num_accepted=nacc, out=out)


def kernel_args(n: dict, schedule: str | None = None):
    batch, ntokens = n["q"].shape[:2]
    schedule = schedule or plan(batch, ntokens, n["v"].shape[2])
    return dr.launch_args(**n, **dict(zip(("rows_per_cta", "lanes_per_row", "rows_per_thread"),
                                          SCHEDULES[schedule])))


_LOADED: dict = {}


def _run(n: dict) -> None:
    batch, ntokens = n["q"].shape[:2]
    if batch == 0:
        return
    import sys

    params = compile_params(batch=batch, T=ntokens, n_vheads=n["v"].shape[2])
    key = (params["schedule"], ntokens, n["q"].get_device())
    fn = _LOADED.get(key)
    if fn is None:
        fn = _LOADED[key] = runtime.get_function(sys.modules[__name__], params, n["q"].device)
    ptrs, scalars, _, _ = kernel_args(n, params["schedule"])
    fn(*(ptrs[k] for k in dr.ARG_ORDER), *(scalars[k] for k in dr.SCALAR_ORDER))


def kda_decode(q, k, v, g, beta, state, state_indices, num_accepted_tokens=None, *, A_log=None,  # noqa: N803
               dt_bias=None, lower_bound=None, scale=None, out=None):
    """KDA decode of T = 1..8 tokens per request into ``state`` (in place, a checkpoint per token); returns
    ``out`` ``[B, T, HV, 128]`` bf16."""
    if out is None and isinstance(v, torch.Tensor):
        out = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
    n = normalize(q, k, v, g, beta, state, state_indices, num_accepted_tokens, A_log, dt_bias, lower_bound, scale,
                  out)
    checks.tensor(OP, "q", q, cuda=True)
    checks.same_device(OP, "q", q, k=k, v=v, g=g, beta=beta, state=state, out=out)
    args = (q, k, v, g, beta, state, n["slots"], n["num_accepted"], A_log, dt_bias, out, n["scale"],
            n["lower_bound"], n["gate_mode"])
    if runtime.direct_call(*[t for t in args if isinstance(t, torch.Tensor)]):
        _run(n)
        runtime.mark_written(state)
        runtime.mark_written(out)
    else:
        torch.ops.tirx.kda_decode_multishape(*args)
    return out


@torch.library.custom_op("tirx::kda_decode_multishape", mutates_args=("state", "out"))
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        state: torch.Tensor, slots: torch.Tensor, num_accepted: torch.Tensor | None, A_log: torch.Tensor | None,  # noqa: N803
        dt_bias: torch.Tensor | None, out: torch.Tensor, scale: float, lower_bound: float, gate_mode: str) -> None:
    _run(dict(pool=state, q=q, k=k, v=v, g=g, beta=beta, slots=slots, scale=scale, use_qk_l2norm=True,
              gate_mode=gate_mode, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, beta_is_logit=False,
              source=None, source_index=None, num_accepted=num_accepted, out=out))


@_op.register_fake
def _(*args) -> None:
    return None


# ---------------------------------------------------------------------------------------------------------
# Protocol: data, oracle, byte model, baselines
# ---------------------------------------------------------------------------------------------------------

def _generator(device: str) -> torch.Generator:
    if device != "cuda":
        return torch.Generator().manual_seed(0)
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    return torch.Generator(device="cuda").manual_seed(seed)


def prepare_data(batch: int, T: int, n_heads: int, n_vheads: int, gate: str, num_accepted: bool,  # noqa: N803
                 pad: bool, device: str = "cuda", **_) -> dict:
    """Random inputs; a pool with B + 3 slots no token addresses; ``pad``: request 1 all padding, and at T > 1
    the last token of request 0."""
    gen = _generator(device)
    bf = torch.bfloat16

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, device=device) * scale

    slots_n = batch * T + batch + 3
    idx = torch.randperm(slots_n, generator=gen, device=device)[:batch * T].view(batch, T).to(torch.int32)
    if pad and batch > 1:
        idx[1] = -1
    if pad and T > 1:
        idx[0, -1] = -1
    data = {"q": rn(batch, T, n_heads, 128).to(bf), "k": rn(batch, T, n_heads, 128).to(bf),
            "v": rn(batch, T, n_vheads, 128).to(bf),
            "g": (rn(batch, T, n_vheads, 128, scale=0.05) - 0.02 if gate == "log"
                  else rn(batch, T, n_vheads, 128, scale=2.0)).to(bf),
            "beta": torch.rand(batch, T, n_vheads, generator=gen, device=device).to(bf),
            "state": rn(slots_n, n_vheads, 128, 128, scale=0.3).to(bf),
            "state_indices": idx.view(batch) if T == 1 else idx,
            "num_accepted_tokens": torch.randint(0, T + 2, (batch,), generator=gen, device=device).to(torch.int32)
            if num_accepted else None,
            "A_log": rn(n_heads, scale=0.5) if gate != "log" else None,
            "dt_bias": rn(n_heads * 128, scale=0.5) if gate != "log" else None,
            "lower_bound": LOWER_BOUND if gate == "lower_bound" else None,
            "out": torch.empty(batch, T, n_vheads, 128, dtype=bf, device=device)}
    return data


OP_KEYS = ("q", "k", "v", "g", "beta", "state", "state_indices", "num_accepted_tokens", "A_log", "dt_bias",
           "lower_bound", "out")


def op_kwargs(data: dict) -> dict:
    return {k: data[k] for k in OP_KEYS}


def reference(**data) -> dict:
    n = normalize(**op_kwargs(data))
    out, pool = delta_rule_ref.decode(n["pool"], n["q"], n["k"], n["v"], n["g"], n["beta"], n["slots"], n["scale"],
                                      True, n["gate_mode"], n["A_log"], n["dt_bias"], n["lower_bound"],
                                      num_accepted=n["num_accepted"])
    return {"out": out, "state": pool}


def launch(cfg: dict, data: dict) -> None:
    kda_decode(**op_kwargs(data))


def roofline(batch: int, T: int, n_heads: int, n_vheads: int, **_) -> dict:  # noqa: N803
    """The state read once and a checkpoint written per token; q / k / v / g / beta / out once."""
    state = n_vheads * 128 * 128 * 2
    return {"bytes": batch * (state * (1 + T) + T * (2 * n_heads * 128 + 3 * n_vheads * 128 + n_vheads) * 2),
            "flops": 10 * batch * T * n_vheads * 128 * 128}


def get_baselines(**cfg) -> dict:
    """FlashInfer 0.7.4's recurrent_kda (cute-dsl) on a copy of the pool, in its pool / speculative form."""
    def flashinfer():
        import flashinfer.kda_decode
        from flashinfer.kda_decode import recurrent_kda

        if getattr(flashinfer.kda_decode, "_RECURRENT_KDA_AVAILABLE", True) is False:
            raise ImportError("flashinfer.kda_decode.recurrent_kda: its CuTe-DSL backend cannot target this device")

        def fn(d):
            pool = d["state"]
            T = d["q"].shape[1]  # noqa: N806
            o, _ = recurrent_kda(d["q"], d["k"], d["v"], d["g"], d["beta"], A_log=d["A_log"], dt_bias=d["dt_bias"],
                                 initial_state=pool, use_qk_l2norm_in_kernel=True,
                                 use_gate_in_kernel=d["A_log"] is not None, lower_bound=d["lower_bound"],
                                 ssm_state_indices=d["state_indices"], num_spec_tokens=T - 1 if T > 1 else None,
                                 num_accepted_tokens=d["num_accepted_tokens"], output=torch.empty_like(d["out"]))
            return {"out": o, "state": pool}
        return fn
    return {"flashinfer": flashinfer}


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
