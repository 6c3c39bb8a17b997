# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's recurrent KDA decode (Kimi Delta Attention, flashinfer.kda_decode.recurrent_kda, backend
# cute-dsl). Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python flashinfer/kda_decode.py and
# flashinfer/kda_kernels/recurrent_kda.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Read for semantics only; the kernel is the shared TIRx template tirx_kernels.core.lang.delta_rule. The source
# read was the main branch at fb28d7242 (2026-08-22; v0.7.4's commit was not in the mirror at hand): the GPU tests
# against the 0.7.4 wheel are what confirm the contract.
"""recurrent_kda's public op, launch arguments and protocol pieces shared by the one-warp and grouped modules.

Contract (FlashInfer's, K = V = 128, bf16): q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, g ``[B, T, HV, K]`` (the
per-channel log gate, or the raw gate with ``use_gate_in_kernel``: ``-exp(A_log[h]) * softplus(g + dt_bias)``, or
with ``lower_bound`` ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias))``), beta ``[B, T, HV]``
(pre-sigmoided unless ``beta_is_logit``), A_log ``[H]`` and dt_bias ``[H * K]`` fp32, state pool ``[N, HV, V, K]``
bf16 updated in place. T = 1: entry n reads and writes ``initial_state[ssm_state_indices[n]]`` (slot n without
indices). Speculative decode (``num_spec_tokens = T - 1``): token t writes its checkpoint to
``ssm_state_indices[n, t]`` (default ``n * T + t``); the state is read from column
``clamp(num_accepted_tokens[n] - 1, 0, T - 1)``, or from ``initial_state_source[initial_state_indices[n]]``.

Differences from upstream, all on calls upstream leaves loosely defined: a negative ``ssm_state_indices`` entry is a
padding token at every T (output 0, no state read or written; upstream's T = 1 host path gathers it with torch
indexing, i.e. from the last slot); packed ``cu_seqlens`` calls and K = 64 are not ported (rejected, naming the
argument).
"""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, delta_rule_ref, runtime
from tirx_kernels.core.lang import delta_rule as dr

K_DIM = V_DIM = 128
MAX_TOKENS = dr.MAX_TOKENS
ONE_WARP_MIN_SEQUENCE_HEADS = 128  # upstream's rule: one-warp kernel for T = 1 when B * HV >= 128
_INT32_MAX = 2**31 - 1
# Schedules (rows_per_cta, lanes_per_row, rows_per_thread): upstream's one-warp tile (a warp owns 16 value rows,
# 16 lanes x 8 keys a row) and its grouped CTA (32 value rows, 4 lanes a row at T = 1, 2 for verification).
SCHEDULES = {"one_warp": (16, 16, 8), "grouped_t1": (32, 4, 1), "grouped_mtp": (32, 2, 1)}


def get_kernel(schedule: str, max_tokens: int):
    if schedule not in SCHEDULES:
        raise ValueError(f"recurrent_kda: schedule {schedule!r} (one of {sorted(SCHEDULES)})")
    return dr.build_decode_kernel(max_tokens, *SCHEDULES[schedule])


def schedule_of(batch: int, ntokens: int, n_vheads: int) -> tuple[str, str, int]:
    """(registered module, schedule, max_tokens) upstream's dispatch picks for a call."""
    if ntokens == 1 and batch * n_vheads >= ONE_WARP_MIN_SEQUENCE_HEADS:
        return "recurrent_kda_decode_one_warp", "one_warp", 1
    if ntokens == 1:
        return "recurrent_kda_decode_grouped", "grouped_t1", 1
    return "recurrent_kda_decode_grouped", "grouped_mtp", MAX_TOKENS


# ---------------------------------------------------------------------------------------------------------
# Launch arguments
# ---------------------------------------------------------------------------------------------------------

def kernel_args(pool, q, k, v, g, beta, slots, scale, use_qk_l2norm, gate_mode, A_log, dt_bias,  # noqa: N803
                lower_bound, beta_is_logit, source, source_index, num_accepted, out, schedule=None):
    """(pointers by buffer name, scalars by name, grid, block) of the normalized call (``normalize``), for the
    schedule upstream's dispatch picks (or ``schedule``)."""
    schedule = schedule or schedule_of(q.shape[0], q.shape[1], v.shape[2])[1]
    return dr.launch_args(pool, q, k, v, g, beta, slots, scale, use_qk_l2norm, gate_mode, A_log, dt_bias,
                          lower_bound, beta_is_logit, source, source_index, num_accepted, out, *SCHEDULES[schedule])


def oracle(pool, q, k, v, g, beta, slots, scale, use_qk_l2norm, gate_mode, A_log, dt_bias, lower_bound,  # noqa: N803
           beta_is_logit, source, source_index, num_accepted, out=None):
    return delta_rule_ref.decode(pool, q, k, v, g, beta, slots, scale, use_qk_l2norm, gate_mode, A_log, dt_bias,
                                 lower_bound, beta_is_logit, source, source_index, num_accepted)


# ---------------------------------------------------------------------------------------------------------
# The public op (FlashInfer 0.7.4's recurrent_kda, backend cute-dsl)
# ---------------------------------------------------------------------------------------------------------

OP = "recurrent_kda"


def _fail(name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def _check_heads(name, t, shape):
    if not isinstance(t, torch.Tensor):
        _fail(name, "a tensor", type(t).__name__)
    if tuple(t.shape) != shape or t.dtype != torch.bfloat16:
        _fail(name, f"bfloat16 {shape}", f"{t.dtype} {tuple(t.shape)}")
    if t.stride(-1) != 1 or (t.dim() == 4 and t.shape[2] > 1 and t.stride(2) != t.shape[3]) or \
            not all(0 <= st <= _INT32_MAX for st in t.stride()):
        _fail(name, "heads contiguous in the last dims, int32 strides", f"strides {t.stride()}")


def _index(name, t, shape):
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or tuple(t.shape) != shape:
        _fail(name, f"int32 / int64 {shape}", None if t is None else f"{getattr(t, 'dtype', type(t))} "
                                                                      f"{tuple(getattr(t, 'shape', ()))}")
    return t.to(torch.int32)


def _misaligned(t: torch.Tensor) -> bool:
    """The pool's base off 16 bytes (its 16-byte vector accesses); not checked while torch.compile traces (fake
    tensors have no address: the eager path and the custom op's body, run on real tensors, check it)."""
    return not torch.compiler.is_compiling() and t.data_ptr() % 16 != 0


def _pool(name, t, n_vheads):
    if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape[1:]) != (n_vheads, V_DIM, K_DIM) or \
            t.dtype != torch.bfloat16:
        _fail(name, f"bfloat16 (N, HV, V, K) = (*, {n_vheads}, 128, 128)",
              f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
    if t.stride(3) != 1 or t.stride(2) != K_DIM or t.stride(1) != V_DIM * K_DIM or _misaligned(t) or \
            (t.stride(0) * 2) % 16 or not 0 < t.stride(0) <= _INT32_MAX:
        _fail(name, "contiguous 16-byte aligned (HV, V, K) slots", f"strides {t.stride()}")


_SLOT_CACHE: dict = {}


def _identity_slots(batch: int, ntokens: int, device) -> torch.Tensor:
    """n * T + t, cached per shape and device (a CUDA graph captures the same tensor)."""
    key = (batch, ntokens, str(device))
    t = _SLOT_CACHE.get(key)
    if t is None:
        t = _SLOT_CACHE[key] = torch.arange(batch * ntokens, dtype=torch.int32, device=device).view(batch, ntokens)
    return t


def normalize(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,  # noqa: N803, C901
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False, lower_bound=None, cu_seqlens=None,
              ssm_state_indices=None, num_spec_tokens=None, num_accepted_tokens=None, initial_state_source=None,
              initial_state_indices=None, beta_is_logit=False) -> dict:
    """FlashInfer's forms validated and brought to ``kernel_args``'s (``initial_state`` must be given: the op
    allocates the zero pool; ``out`` is added by the caller)."""
    if cu_seqlens is not None:
        _fail("cu_seqlens", "None (packed varlen is not ported: pass [B, T, ...] tensors)", "a tensor")
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[3] != K_DIM or not 1 <= q.shape[1] <= MAX_TOKENS:
        _fail("q", f"bfloat16 (B, T <= {MAX_TOKENS}, H, {K_DIM})", f"{getattr(q, 'shape', type(q))}")
    batch, ntokens, n_heads, _ = q.shape
    _check_heads("q", q, tuple(q.shape))
    _check_heads("k", k, tuple(q.shape))
    if not isinstance(v, torch.Tensor) or v.dim() != 4 or v.shape[2] % n_heads:
        _fail("v", f"(B, T, HV, {V_DIM}) with HV a multiple of H={n_heads}", getattr(v, "shape", type(v)))
    n_vheads = v.shape[2]
    _check_heads("v", v, (batch, ntokens, n_vheads, V_DIM))
    _check_heads("g", g, (batch, ntokens, n_vheads, K_DIM))
    _check_heads("beta", beta, (batch, ntokens, n_vheads))
    if use_gate_in_kernel:
        if not isinstance(A_log, torch.Tensor) or tuple(A_log.shape) != (n_heads,) or A_log.dtype != torch.float32 \
                or A_log.stride(0) != 1:
            _fail("A_log", f"contiguous float32 (H,) = ({n_heads},) with use_gate_in_kernel",
                  getattr(A_log, "shape", A_log))
    if dt_bias is not None and (not isinstance(dt_bias, torch.Tensor) or dt_bias.dtype != torch.float32 or
                                dt_bias.numel() != n_heads * K_DIM or not dt_bias.is_contiguous()):
        _fail("dt_bias", f"contiguous float32 (H * K,) = ({n_heads * K_DIM},)", getattr(dt_bias, "shape", dt_bias))
    if lower_bound is not None and (not use_gate_in_kernel or not lower_bound < 0 or not math.isfinite(lower_bound)):
        _fail("lower_bound", "a finite negative number, with use_gate_in_kernel", lower_bound)
    _pool("initial_state", initial_state, n_vheads)
    if num_spec_tokens is None:
        if ntokens != 1:
            _fail("num_spec_tokens", f"T - 1 = {ntokens - 1} for a multi-token call (q has T = {ntokens})", None)
        if num_accepted_tokens is not None:
            _fail("num_accepted_tokens", "None without num_spec_tokens", "a tensor")
        if ssm_state_indices is None:
            if initial_state.shape[0] < batch:
                _fail("initial_state", f"at least B = {batch} slots without ssm_state_indices", initial_state.shape[0])
            slots = _identity_slots(batch, 1, q.device)
        else:
            slots = _index("ssm_state_indices", ssm_state_indices, (batch,)).view(batch, 1)
    else:
        if num_spec_tokens != ntokens - 1 or num_spec_tokens < 1:
            _fail("num_spec_tokens", f"T - 1 = {ntokens - 1} (>= 1)", num_spec_tokens)
        if ssm_state_indices is None:
            if initial_state.shape[0] < batch * ntokens:
                _fail("initial_state", f"at least B * T = {batch * ntokens} slots without ssm_state_indices",
                      initial_state.shape[0])
            slots = _identity_slots(batch, ntokens, q.device)
        else:
            slots = _index("ssm_state_indices", ssm_state_indices, (batch, ntokens))
    nacc = None if num_accepted_tokens is None else \
        _index("num_accepted_tokens", num_accepted_tokens, (batch,)).contiguous()
    source = source_index = None
    if (initial_state_source is None) != (initial_state_indices is None):
        _fail("initial_state_indices", "given together with initial_state_source", "only one of them")
    if initial_state_source is not None:
        _pool("initial_state_source", initial_state_source, n_vheads)
        source = initial_state_source
        source_index = _index("initial_state_indices", initial_state_indices, (batch,))
    gate_mode = "log" if not use_gate_in_kernel else ("lower_bound" if lower_bound is not None else "softplus")
    return dict(pool=initial_state, q=q, k=k, v=v, g=g, beta=beta, slots=slots,
                scale=K_DIM ** -0.5 if scale is None else float(scale), use_qk_l2norm=bool(use_qk_l2norm_in_kernel),
                gate_mode=gate_mode, A_log=A_log if use_gate_in_kernel else None,
                dt_bias=dt_bias if use_gate_in_kernel else None,
                lower_bound=0.0 if lower_bound is None else float(lower_bound), beta_is_logit=bool(beta_is_logit),
                source=source, source_index=source_index, num_accepted=nacc)


_FUNCTIONS: dict = {}


def module_for(name: str):
    import importlib

    return importlib.import_module(f"{__package__}.{name}")


def run(n: dict) -> None:
    batch, ntokens = n["q"].shape[:2]
    if batch == 0:
        return
    ptrs, scalars, _, _ = kernel_args(**n)
    name, schedule, max_tokens = schedule_of(batch, ntokens, n["v"].shape[2])
    key = (schedule, n["q"].get_device())
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = runtime.get_function(module_for(name), {"schedule": schedule,
                                                                       "max_tokens": max_tokens}, n["q"].device)
    fn(*(ptrs[k] for k in dr.ARG_ORDER), *(scalars[k] for k in dr.SCALAR_ORDER))


def recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,  # noqa: N803
                  output_final_state=False, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False, lower_bound=None,
                  cu_seqlens=None, ssm_state_indices=None, num_spec_tokens=None, num_accepted_tokens=None,
                  output=None, initial_state_source=None, initial_state_indices=None, beta_is_logit=False, *,
                  backend="cute-dsl"):
    """FlashInfer 0.7.4's ``flashinfer.kda_decode.recurrent_kda`` (K = V = 128, bf16, no ``cu_seqlens``): returns
    ``(output [B, T, HV, V], final state or None)``; the state pool is updated in place."""
    if backend != "cute-dsl":
        _fail("backend", "'cute-dsl'", repr(backend))
    if not isinstance(q, torch.Tensor) or not isinstance(v, torch.Tensor) or q.dim() != 4 or v.dim() != 4:
        _fail("q", "(B, T, H, K) and v (B, T, HV, V) tensors", type(q).__name__)
    if initial_state is None:  # upstream's zero state: B slots at T = 1 (indices ignored), else B * T or max index + 1
        slots = q.shape[0]
        if num_spec_tokens is not None:
            slots = q.shape[0] * q.shape[1] if ssm_state_indices is None or ssm_state_indices.numel() == 0 else \
                max(int(ssm_state_indices.max()), 0) + 1
        else:
            ssm_state_indices = None
        initial_state = torch.zeros(slots, v.shape[2], V_DIM, K_DIM, dtype=torch.bfloat16, device=q.device)
    n = normalize(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, use_qk_l2norm_in_kernel,
                  use_gate_in_kernel, lower_bound, cu_seqlens, ssm_state_indices, num_spec_tokens,
                  num_accepted_tokens, initial_state_source, initial_state_indices, beta_is_logit)
    if output is None:
        output = torch.empty(v.shape, dtype=torch.bfloat16, device=q.device)
    _check_heads("output", output, tuple(v.shape))
    checks.tensor(OP, "q", q, cuda=True)
    checks.same_device(OP, "q", q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, output=output)
    n["out"] = output
    args = (q, k, v, g, beta, n["A_log"], n["dt_bias"], n["pool"], n["source"], n["slots"], n["source_index"],
            n["num_accepted"], output, n["scale"], n["lower_bound"], n["use_qk_l2norm"], n["gate_mode"],
            n["beta_is_logit"])
    if runtime.direct_call(*[t for t in args if isinstance(t, torch.Tensor)]):
        run(n)
        runtime.mark_written(n["pool"])
        runtime.mark_written(output)
    else:
        name, _, _ = schedule_of(q.shape[0], q.shape[1], v.shape[2])
        getattr(torch.ops.tirx, name)(*args)
    return output, (initial_state if output_final_state else None)


def custom_op_body(q, k, v, g, beta, A_log, dt_bias, pool, source, slots, source_index, num_accepted,  # noqa: N803
                   output, scale, lower_bound, use_qk_l2norm, gate_mode, beta_is_logit) -> None:
    run(dict(pool=pool, q=q, k=k, v=v, g=g, beta=beta, slots=slots, scale=scale, use_qk_l2norm=use_qk_l2norm,
             gate_mode=gate_mode, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, beta_is_logit=beta_is_logit,
             source=source, source_index=source_index, num_accepted=num_accepted, out=output))
