# SPDX-License-Identifier: Apache-2.0
# The gate forms of cudnn-frontend's linear-attention backward (python/cudnn/linear_attention/frost/common/
# gate_bwd.py and kernel/gdn_bprop_f16.py, v1.28.0 1dbd2c09432dfd6cbf13a0ad85a071446398c082): the raw decay alpha,
# the natural-log decay and the safe gates; read for semantics only.
"""Gate pre- and post-passes of the backward ops (torch): the kernels work on the natural-log decay; these turn a
raw gate into it and the log-decay gradient back into the raw gate's, with the gate parameters' gradients.

- GDN-1 (scalar per head): ``log_gate`` (g is the log decay), raw alpha (g = alpha, log decay log(alpha)), or the
  safe gate log decay = -exp(A_log[h]) softplus(g + dt_bias[h]) (A_log, dt_bias [HO]).
- GDN-2 (per key channel): the log decay, or the safe gate lower_bound * sigmoid(exp(A_log[h]) (g + dt_bias[h, d]))
  (A_log [HO], dt_bias [HO, K]).
"""

from __future__ import annotations

import torch

LINEAR_GATE_FLOOR = 1e-30  # a raw decay of 0 (the log decay of -69: the state wiped)
DEFAULT_LOWER_BOUND = -5.0


def scalar_log_decay(g, log_gate: bool, safe_gate: bool, a_log=None, dt_bias=None):
    """GDN-1's log decay [T, HO] fp32 from the gate as given."""
    gf = g.float()
    if safe_gate:
        return -torch.exp(a_log.float())[None, :] * torch.nn.functional.softplus(gf + dt_bias.float()[None, :])
    if log_gate:
        return gf
    return torch.log(gf.clamp_min(LINEAR_GATE_FLOOR))


def scalar_gate_grads(d_log, g, log_gate: bool, safe_gate: bool, a_log=None, dt_bias=None):
    """(d gate as given [T, HO], d_a_log [HO] or None, d_dt_bias [HO] or None) from d loss / d log decay."""
    gf = g.float()
    if safe_gate:
        ea = torch.exp(a_log.float())[None, :]
        y = gf + dt_bias.float()[None, :]
        d_raw = -d_log * ea * torch.sigmoid(y)
        return d_raw, (-d_log * ea * torch.nn.functional.softplus(y)).sum(0), d_raw.sum(0)
    if log_gate:
        return d_log, None, None
    return d_log / gf.clamp_min(LINEAR_GATE_FLOOR), None, None


def channel_log_decay(g, safe_gate: bool, a_log=None, dt_bias=None, lower_bound: float = DEFAULT_LOWER_BOUND):
    """GDN-2's log decay [T, HO, K] fp32 from the gate as given."""
    gf = g.float()
    if not safe_gate:
        return gf
    return lower_bound * torch.sigmoid(torch.exp(a_log.float())[None, :, None] * (gf + dt_bias.float()[None]))


def channel_gate_grads(d_log, g, safe_gate: bool, a_log=None, dt_bias=None,
                       lower_bound: float = DEFAULT_LOWER_BOUND):
    """(d gate as given [T, HO, K], d_a_log [HO] or None, d_dt_bias [HO, K] or None)."""
    if not safe_gate:
        return d_log, None, None
    ea = torch.exp(a_log.float())[None, :, None]
    z = ea * (g.float() + dt_bias.float()[None])
    s = torch.sigmoid(z)
    w = d_log * lower_bound * s * (1 - s)
    d_raw = w * ea
    return d_raw, (w * z).sum((0, 2)), d_raw.sum(0)
