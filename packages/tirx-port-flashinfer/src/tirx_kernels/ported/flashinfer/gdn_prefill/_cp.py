# SPDX-License-Identifier: Apache-2.0
# The context-parallel split of FlashInfer's chunk_gated_delta_rule (its cp_delta_rule_dsl path, flashinfer-python
# 0.7.4, commit 77039051b0be921788dc2784ec41423b558878ec); read for semantics, not copied. Written anew on this
# package's TIRx kernels (_kernel.py) and torch.
"""The context-parallel form of the chunked GDN prefill (``gdn_cp_prefill_sm90``): each sequence is cut into ``P``
segments of whole chunks processed by different CTAs.

A chunk's state update S <- gamma_last S + Delta^T K_d, Delta = (T beta)(V - diag(gamma) K S^T), is affine in S,
so a segment maps its start state to S_end = S_start M + X (M the 128 x 128 key transition, X the result from a
zero state). As K = V = 128, M is the state the same recurrence reaches from the identity with V taken as 0.

- Phase 1 (``_kernel.build_kernel(io, transition=True)``, one launch): for segments 0 .. P-2 of each sequence the
  X run (segment 0: from the true initial state, so its result is already S_end), for segments 1 .. P-2 the M run;
  no output, run bounds as int32 pairs, every result a row of the workspace ``Z`` (fp32, [rows, Hs, 128, 128]).
- Phase 2 (torch, fp32): S_start of segment j + 1 = S_start_j M_j + X_j, one batched matmul per segment over all
  sequences and heads, in place over X_j's rows of Z.
- Phase 3 (gdn_prefill_sm90's kernel): every segment as a sequence from its S_start (``state_indices`` into Z);
  it writes the output, and the last segment of each sequence the final state (``output_state_indices``).

Z's rows: block j (rows j B .. j B + B - 1, B sequences) holds S_start of segment j for j < P (block 0: the
initial states, gathered), then the M of segments 1 .. P-2 (block P + j - 1).
"""

from __future__ import annotations

import math

import torch

from tirx_kernels.core.lang import gdn_layout as lay

# A transition chunk's time in chunks of the prefill kernel: it skips Q, QK^T, Q S^T and the output (12 of the
# consumers' 28 k16 steps) but not the aux warpgroup's inverse; a guess between the two bounds until measured (the
# bench's forced-split rows, ``_p<P>``, time the candidates).
PHASE1_COST = 0.85
FIXED_COST = 2.0  # the form's fixed cost (two more launches, the plan's host copy), in chunk times (~10 us each)
SCAN_COST = 0.5  # one scan step (a batched 128 x 128 x 128 fp32 matmul launch), in chunk times
MAX_SEGMENTS = 128
MIN_GAIN = 0.9  # split only where the model gains at least 10 % (its constants are estimates)
IDENTITY_SLOT = -2  # _kernel.IDENTITY_SLOT (this module imports no TVM)


def cost(P: int, chunks: int, units: int, sms: int) -> float:  # noqa: N803
    """Modelled time, in chunk times, of ``P`` segments per sequence for ``units`` = sequences x state heads whose
    longest sequence has ``chunks`` chunks (one CTA per SM: the kernels take 213 KB of shared memory)."""
    if P <= 1:
        return math.ceil(units / sms) * chunks
    seg = math.ceil(chunks / P)
    phase1 = math.ceil((2 * P - 3) * units / sms) * seg * PHASE1_COST
    phase3 = math.ceil(P * units / sms) * seg
    return phase1 + phase3 + FIXED_COST + SCAN_COST * (P - 2)


def segments_for(lens: list[int], heads: int, sms: int) -> int:
    """The segment count per sequence (1: the plain kernel) that minimises :func:`cost`, where it gains."""
    chunks = max([(n + lay.CHUNK - 1) // lay.CHUNK for n in lens] + [0])
    units = len(lens) * heads
    if chunks < 2 or units == 0:
        return 1
    best = min(range(2, min(chunks, MAX_SEGMENTS) + 1), key=lambda p: (cost(p, chunks, units, sms), p))
    return best if cost(best, chunks, units, sms) < MIN_GAIN * cost(1, chunks, units, sms) else 1


def plan(cu: list[int], P: int, dst: list[int] | None) -> dict:  # noqa: N803
    """Host int32 arrays of the three phases for ``P`` >= 2 segments per sequence (``cu``: the cumulative lengths,
    ``dst``: each sequence's final-state row, negative: none; None: no final state)."""
    B = len(cu) - 1  # noqa: N806
    bounds = []  # [n][j] = (bos, eos) of segment j
    for n in range(B):
        bos, eos = cu[n], max(cu[n + 1], cu[n])
        seg = (eos - bos + lay.CHUNK - 1) // lay.CHUNK
        seg = (seg + P - 1) // P * lay.CHUNK
        bounds.append([(min(bos + j * seg, eos), min(bos + (j + 1) * seg, eos)) for j in range(P)])
    runs = []  # (bos, eos, read slot, write row)
    for j in range(P - 1):
        for n in range(B):
            runs.append((*bounds[n][j], n if j == 0 else -1, (j + 1) * B + n))
    for j in range(1, P - 1):
        for n in range(B):
            runs.append((*bounds[n][j], IDENTITY_SLOT, (P + j - 1) * B + n))
    cu3 = [0] * (B * P + 1)
    sidx3, oidx3 = [], []
    for n in range(B):
        for j in range(P):
            cu3[n * P + j] = bounds[n][j][0]
            cu3[n * P + j + 1] = bounds[n][j][1]
            sidx3.append(j * B + n)
            oidx3.append(dst[n] if dst is not None and j == P - 1 and dst[n] >= 0 else -1)
    return {"pairs": [x for r in runs for x in r[:2]], "sidx1": [r[2] for r in runs], "oidx1": [r[3] for r in runs],
            "cu3": cu3, "sidx3": sidx3, "oidx3": oidx3, "z_rows": (2 * P - 2) * B if P > 2 else P * B}


_PLANS: dict = {}


def device_plan(cu: list[int], P: int, dst: list[int] | None, device) -> tuple[dict, int]:  # noqa: N803
    """:func:`plan`'s arrays on ``device`` and Z's row count, cached per (lengths, P, final rows, device): a repeated
    batch costs no host work or copy."""
    key = (tuple(cu), P, None if dst is None else tuple(dst), str(device))
    hit = _PLANS.get(key)
    if hit is None:
        p = plan(cu, P, dst)
        if len(_PLANS) >= 64:
            _PLANS.clear()
        hit = _PLANS[key] = (to_device(p, device), p["z_rows"])
    return hit


def to_device(p: dict, device) -> dict:
    """The plan's arrays in one host-to-device copy (int32 views of one buffer)."""
    keys = ("pairs", "sidx1", "oidx1", "cu3", "sidx3", "oidx3")
    flat = torch.tensor([x for k in keys for x in p[k]], dtype=torch.int32)
    dev = flat.to(device, non_blocking=True) if flat.numel() else flat.to(device)
    out, at = {}, 0
    for k in keys:
        out[k] = dev[at:at + len(p[k])]
        at += len(p[k])
    return out


def gather_initial(z, initial_state, state_indices, B):  # noqa: N803
    """Z's block 0: each sequence's initial state (a pool row by ``state_indices``, negative or none: zero)."""
    if initial_state is None:
        z[:B].zero_()
    elif state_indices is None:
        z[:B].copy_(initial_state)
    else:
        idx = state_indices.long()
        z[:B].copy_(torch.where((idx >= 0)[:, None, None, None], initial_state[idx.clamp_min(0)],
                                torch.zeros((), device=z.device)))


def scan(z, P: int, B: int) -> None:  # noqa: N803
    """Phase 2: block j + 1 (X_j) <- block j (S_start_j) @ M_j + X_j, for j = 1 .. P-2."""
    d = lay.DIM
    for j in range(1, P - 1):
        s_j = z[j * B:(j + 1) * B].view(-1, d, d)
        m_j = z[(P + j - 1) * B:(P + j) * B].view(-1, d, d)
        z[(j + 1) * B:(j + 2) * B].view(-1, d, d).baddbmm_(s_j, m_j)


def run(q, k, v, g, beta, scale: float, initial_state, cu_seqlens, output, output_state, state_indices,
        output_state_indices, gate_log: bool, P: int, cu_host: list[int], transition_fn, prefill_fn,  # noqa: N803
        dummy) -> None:
    """The three phases on validated inputs (``P`` >= 2 segments per sequence, ``cu_host`` the cumulative lengths
    on the host); ``transition_fn`` / ``prefill_fn`` call the two kernels with their PrimFuncs' arguments."""
    from tirx_kernels.ported.flashinfer.gdn_prefill import _op

    B = len(cu_host) - 1  # noqa: N806
    hs = _op.state_heads(q, v)
    dst = None
    if output_state is not None:
        rows = output_state_indices if output_state_indices is not None else state_indices
        dst = list(range(B)) if rows is None else [int(x) for x in rows.cpu()]
    dev, z_rows = device_plan(cu_host, P, dst, q.device)
    z = torch.empty(z_rows, hs, lay.DIM, lay.DIM, dtype=torch.float32, device=q.device)
    gather_initial(z, initial_state, state_indices, B)
    args = list(_op.kernel_args(q, k, v, g, beta, scale, z, dev["pairs"], output, z, dev["sidx1"], dev["oidx1"],
                                gate_log, dummy))
    args[11] = dev["sidx1"].shape[0]  # runs, not len(pairs) - 1
    transition_fn(*args)
    scan(z, P, B)
    prefill_fn(*_op.kernel_args(q, k, v, g, beta, scale, z, dev["cu3"], output, output_state, dev["sidx3"],
                                dev["oidx3"] if output_state is not None else None, gate_log, dummy))
