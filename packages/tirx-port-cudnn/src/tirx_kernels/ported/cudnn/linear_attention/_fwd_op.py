# SPDX-License-Identifier: Apache-2.0
# The argument contract of cuDNN Frontend's GDN-1 forward and recompute (chunk_gdn_sm100 / chunk_gdn_recompute_sm100
# of python/cudnn/linear_attention/frost/kernel/gdn_prefill_f16.py and gdn_recompute_f16.py,
# https://github.com/NVIDIA/cudnn-frontend v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); read, not copied.
"""What the two GDN-1 ops share: validation (each error names the argument), the gate and beta forms turned into
the kernel's fp32 [T, H] inputs, the checkpoint layout, the launch, and the fp32 / fp64 oracle.

cuDNN's conventions: THD-packed q [T, Hq, 128], k [T, Hk, 128], v [T, Hv, 128] (fp16 / bf16) over ``cu_seqlens``
(int32 / int64); state heads H = max(Hq, Hv) for the forward, max(Hk, Hv) for the recompute, every head count a
divisor of H (state head h reads head h / (H / Hx)); gate and beta [T, H]:

- ``log_gate=True``: the gate is the natural-log decay (fp32); ``log_gate=False``: the raw decay alpha;
  ``safe_gate=True``: the raw gate x gives the log decay -exp(A_log[h]) softplus(x + dt_bias[h]) (softplus linear
  above 20), ``a_log`` and ``dt_bias`` fp32 [H];
- beta fp32 (post-sigmoid), or with ``use_beta_sigmoid`` logits in the I/O dtype (sigmoid taken in fp32);
- states [N, H, V, K] (a row per value, keys contiguous), fp32 or bf16; ``checkpoints`` [count, H, V, K] in the I/O
  dtype, count = sum over sequences of ceil(len / cadence) (``checkpoint_count``), cadence a multiple of 64 (the
  chunk): checkpoint i of a sequence is the state entering token i * cadence, sequences in order.
"""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks, delta_rule_ref
from tirx_kernels.core.lang import gdn_layout as lay

DIM = 128
CHUNK = 64
CADENCES = (0, 64, 128, 192)  # cuDNN's validated checkpoint cadences (0: none)
IO = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
STATE = (torch.float32, torch.bfloat16)
INDEX = (torch.int32, torch.int64)
HAS_CKPT = lay.HAS_CKPT
SOFTPLUS_LINEAR = 20.0
_GRID_Y = 65535
_INT32_MAX = 2**31 - 1


def fail(op: str, name: str, expected: str, got: str):
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def checkpoint_count(lens, cadence: int) -> int:
    """Checkpoints of sequences of ``lens`` tokens at ``cadence``: ceil(len / cadence) each (0 without a cadence)."""
    return 0 if not cadence else sum(-(-int(n) // cadence) for n in lens)


def checkpoint_offsets(cu_seqlens, cadence: int):
    """int32 [N]: each sequence's first checkpoint row (a prefix sum of the counts), computed on the device."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long().clamp_min(0)
    counts = (lens + cadence - 1) // cadence
    return (torch.cumsum(counts, 0) - counts).to(torch.int32)


def check_inputs(op: str, q, k, v, gate, beta, cu_seqlens, initial_state, final_state, checkpoints, cadence: int,
                 log_gate: bool, safe_gate: bool, a_log, dt_bias, use_beta_sigmoid: bool, output=None, scale=None,
                 final_name: str = "final_state"):
    """Shapes, dtypes, layouts and head maps (``q`` None: the recompute, whose final state is ``final_name``); the
    device last. Returns H."""
    io = tuple(IO)
    lead = "q" if q is not None else "k"
    ref = q if q is not None else k
    checks.tensor(op, lead, ref, dtypes=io, ndim=3, contiguous=True, cuda=False)
    total = ref.shape[0]
    if ref.shape[2] != DIM:
        fail(op, lead, f"head size {DIM}", f"shape {tuple(ref.shape)}")
    checks.tensor(op, "k", k, shape=(total, None, DIM), contiguous=True, cuda=False)
    checks.tensor(op, "v", v, shape=(total, None, DIM), contiguous=True, cuda=False)
    checks.same_dtype(op, lead, ref, k=k, v=v)
    hk, hv = k.shape[1], v.shape[1]
    hq = q.shape[1] if q is not None else hk
    if min(hq, hk, hv) < 1:
        fail(op, lead, "at least one head in each of q, k, v", f"heads q {hq}, k {hk}, v {hv}")
    hs = max(hq, hv)
    for name, n in ((("q", hq),) if q is not None else ()) + (("k", hk), ("v", hv)):
        if hs % n:
            fail(op, name, f"a head count dividing the state heads {hs}", f"{n}")
    checks.tensor(op, "cu_seqlens", cu_seqlens, dtypes=INDEX, ndim=1, contiguous=True, cuda=False)
    n = cu_seqlens.shape[0] - 1
    if n < 1:
        fail(op, "cu_seqlens", "at least two entries", f"shape {tuple(cu_seqlens.shape)}")
    if n > _GRID_Y:
        fail(op, "cu_seqlens", f"at most {_GRID_Y} sequences (the grid's y extent)", f"{n}")
    if total * max(hq, hk, hv, hs) * DIM > _INT32_MAX:
        fail(op, lead, "fewer than 2**31 elements per tensor", f"shape {tuple(ref.shape)}")
    checks.tensor(op, "gate", gate, dtypes=(torch.float32,), shape=(total, hs), contiguous=True, cuda=False)
    beta_dtypes = (ref.dtype,) if use_beta_sigmoid else (torch.float32,)
    checks.tensor(op, "beta", beta, dtypes=beta_dtypes, shape=(total, hs), contiguous=True, cuda=False)
    if safe_gate:
        if a_log is None or dt_bias is None:
            fail(op, "a_log", "a_log and dt_bias (fp32 [H]) with safe_gate", "None")
        checks.tensor(op, "a_log", a_log, dtypes=(torch.float32,), shape=(hs,), contiguous=True, cuda=False)
        checks.tensor(op, "dt_bias", dt_bias, dtypes=(torch.float32,), shape=(hs,), contiguous=True, cuda=False)
    elif a_log is not None or dt_bias is not None:
        fail(op, "a_log", "None without safe_gate (a_log and dt_bias belong to the safe gate)", "a tensor")
    if safe_gate and not log_gate:
        fail(op, "log_gate", "True with safe_gate (the safe gate is a log gate)", "False")
    if cadence not in CADENCES:
        fail(op, "checkpoint_every_n_tokens", f"one of {CADENCES}", repr(cadence))
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale != 0):
        fail(op, "scale", "None or a finite nonzero float", repr(scale))
    if output is not None:
        checks.tensor(op, "output", output, shape=(total, hs, DIM), contiguous=True, cuda=False)
        checks.same_dtype(op, lead, ref, output=output)
    for name, st in (("initial_state", initial_state), (final_name, final_state)):
        if st is not None:
            checks.tensor(op, name, st, dtypes=STATE, shape=(n, hs, DIM, DIM), contiguous=True, cuda=False)
    if checkpoints is not None:
        if not cadence:
            fail(op, "output_state_checkpoints", "None without checkpoint_every_n_tokens", "a tensor")
        checks.tensor(op, "output_state_checkpoints", checkpoints, dtypes=(ref.dtype,), ndim=4, contiguous=True,
                      cuda=False)
        if tuple(checkpoints.shape[1:]) != (hs, DIM, DIM):
            fail(op, "output_state_checkpoints", f"shape [count, {hs}, {DIM}, {DIM}]",
                 f"shape {tuple(checkpoints.shape)}")
    checks.tensor(op, lead, ref, cuda=True)
    present = {name: t for name, t in (("k", k), ("v", v), ("gate", gate), ("beta", beta),
                                       ("cu_seqlens", cu_seqlens), ("initial_state", initial_state),
                                       (final_name, final_state), ("output_state_checkpoints", checkpoints),
                                       ("output", output), ("a_log", a_log), ("dt_bias", dt_bias))
               if t is not None}
    checks.same_device(op, lead, ref, **present)
    return hs


def log_decay(gate, log_gate: bool, safe_gate: bool, a_log=None, dt_bias=None):
    """The natural-log decay of cuDNN's three gate forms, fp32 [T, H] (the oracle's and the safe gate's pre-pass)."""
    g = gate.float()
    if safe_gate:
        x = g + dt_bias.float()[None, :]
        sp = torch.where(x < SOFTPLUS_LINEAR, torch.log1p(torch.exp(x.clamp_max(SOFTPLUS_LINEAR))), x)
        return -torch.exp(a_log.float())[None, :] * sp
    return g if log_gate else torch.log(g.clamp_min(delta_rule_ref.LINEAR_GATE_FLOOR))


def kernel_gates(gate, beta, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid):
    """(gate, beta, gate is a log) as the kernel takes them: fp32 [T, H]; the safe gate and beta logits turned into
    the log gate and the post-sigmoid beta by torch (one elementwise pass each, [T, H])."""
    if safe_gate:
        gate, log_gate = log_decay(gate, True, True, a_log, dt_bias), True
    if use_beta_sigmoid:
        beta = torch.sigmoid(beta.float())
    return gate, beta, log_gate


_DUMMY: dict = {}


def dummy(device, dtype):
    key = (str(device), dtype)
    t = _DUMMY.get(key)
    if t is None:
        t = _DUMMY[key] = torch.zeros(DIM * DIM, dtype=dtype, device=device)  # a checkpoint row (its tensor map)
    return t


def kernel_args(q, k, v, gate, beta, gate_log: bool, cu_seqlens, initial_state, final_state, ckpt_offsets,
                checkpoints, cadence: int, scale: float, output) -> tuple:
    """The kernel's arguments in its PrimFunc's order, on fp32 states; ``q`` None (the recompute): k stands in for
    q (never loaded) and a small dummy for the output (never written)."""
    flags = (lay.HAS_G | (lay.GATE_LOG if gate_log else 0) | lay.HAS_BETA
             | (lay.CU64 if cu_seqlens.dtype == torch.int64 else 0)
             | (lay.HAS_INIT if initial_state is not None else 0)
             | (lay.HAS_FINAL if final_state is not None else 0)
             | (HAS_CKPT if checkpoints is not None else 0))
    f32 = dummy(k.device, torch.float32)
    return (k if q is None else q, k, v, gate.view(-1), beta.view(-1), cu_seqlens.view(torch.int32),
            (dummy(k.device, k.dtype) if output is None else output).view(-1),
            f32 if initial_state is None else initial_state.view(-1),
            f32 if final_state is None else final_state.view(-1),
            dummy(k.device, torch.int32) if ckpt_offsets is None else ckpt_offsets,
            (dummy(k.device, k.dtype) if checkpoints is None else checkpoints).view(-1),
            cu_seqlens.shape[0] - 1, flags, float(scale), max(cadence // CHUNK, 1))


# ---------------------------------------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------------------------------------

def reference(q, k, v, gate, beta, cu_seqlens, initial_state=None, scale=None, cadence: int = 0, log_gate=True,
              safe_gate=False, a_log=None, dt_bias=None, use_beta_sigmoid=False, dtype=torch.float32,
              chunked: bool = True):
    """``(out [T, H, V] or None, final state [N, H, V, K], checkpoints [count, H, V, K] or None)`` in ``dtype``: the
    chunked (or, ``chunked=False``, token-by-token) GDN recurrence of ``core.delta_rule_ref`` run one checkpoint
    segment at a time, recording the state entering each segment. ``q`` None: the recompute (k stands in)."""
    g = log_decay(gate, log_gate, safe_gate, a_log, dt_bias)
    b = torch.sigmoid(beta.float()) if use_beta_sigmoid else beta.float()
    qq = k if q is None else q
    fn = delta_rule_ref.gdn_prefill_chunked if chunked else delta_rule_ref.gdn_prefill_recurrent
    cu = [int(x) for x in cu_seqlens.cpu()]
    n = len(cu) - 1
    hs = max(qq.shape[1], v.shape[1])
    out = torch.zeros(qq.shape[0], hs, DIM, dtype=dtype, device=k.device)
    final = torch.zeros(n, hs, DIM, DIM, dtype=dtype, device=k.device)
    ckpts = []
    for i in range(n):
        state = (torch.zeros(hs, DIM, DIM, dtype=dtype, device=k.device) if initial_state is None
                 else initial_state[i].to(dtype))
        step = cadence or max(cu[i + 1] - cu[i], 1)
        for t0 in range(cu[i], cu[i + 1], step):
            t1 = min(t0 + step, cu[i + 1])
            if cadence:
                ckpts.append(state)
            seg = torch.tensor([0, t1 - t0])
            o, st = fn(qq[t0:t1], k[t0:t1], v[t0:t1], g[t0:t1], b[t0:t1], scale, state[None], seg,
                       gate_domain="log", dtype=dtype)
            out[t0:t1] = o
            state = st[0]
        final[i] = state
    ck = torch.stack(ckpts) if ckpts else None
    return (None if q is None else out), final, ck
