# SPDX-License-Identifier: Apache-2.0
# The argument contract of cuDNN Frontend's GDN-2 forward and recompute (chunk_gdn2_sm100 and its recompute,
# python/cudnn/linear_attention/frost/kernel/gdn2_prefill_f16.py / gdn2_recompute_f16.py,
# https://github.com/NVIDIA/cudnn-frontend v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); read, not copied.
"""What the GDN-2 forward and recompute modules share: validation, data, the oracle's outputs, the byte / FLOP
model and the launch (``run``: ``_gdn2_fwd``'s chunk pass, the KDA scan kernel, the checkpoints).

cuDNN's conventions: q [T, Hq, 128], k [T, Hk, 128], v [T, Hv, 128] bf16 or fp16 (the kernels' operands are bf16
either way: the chunk pass gates its key side by up to 2^108, past fp16's range; fp16 inputs are rounded to bf16 on
the way in, the output goes out through a bf16 scratch), H = max(Hq, Hv) state heads (the recompute: max(Hk, Hv));
gate fp32 [T, H, 128] (the natural-log decay, <= 0 as upstream requires, or with ``safe_gate`` the raw gate of
``lower_bound * sigmoid(exp(a_log[h]) (x + dt_bias[h]))``, a_log [H], dt_bias [H, 128]), beta [T, H, 128]
(post-sigmoid, or logits with ``use_beta_sigmoid``) and w [T, H, 128] in the I/O dtype, states [N, H, V, K] fp32 /
bf16, checkpoints [count, H, V, K] in the I/O dtype every 16 / 32 / 48 tokens (checkpoint i of a sequence = the
state entering its token i x cadence); ``use_qk_l2norm_in_kernel``."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, delta_rule_ref, gdn2_ref
from tirx_kernels.ported.cudnn.linear_attention import _fwd_common, _fwd_op
from tirx_kernels.ported.cudnn.linear_attention import _gdn2_fwd as fwd

DIM = 128
DEFAULTS = {"Hk": None, "cu_dtype": "int32", "init": False, "final": True, "state_dtype": "float32",
            "checkpoint": 0, "safe_gate": False, "beta_sigmoid": False, "l2norm": False, "dtype": "bfloat16"}
# The scan rounds Sb, Y, Delta and its bf16 operands (Q_g, K_g, K_d, T, P) as the KDA forward does (a few 1e-3 of
# relative Frobenius error); checkpoints are the state rounded to bf16.
TOLERANCE = {"bfloat16": (1.2e-1, 4e-2), "float16": (1.2e-1, 4e-2), "float32": (1.2e-1, 4e-2)}


def prepare_data(with_q: bool, device: str = "cuda", **cfg) -> dict:
    """cuDNN's test draws: q, k, v 0.2-scaled normals (k L2-normalised unless the op normalises), the log decay in
    (-0.08, -0.01) (a safe-gate logit ~ 0.2 N), beta post-sigmoid (or logits), w = sigmoid(0.3 N)."""
    cfg = {**DEFAULTS, **cfg}
    t = getattr(torch, cfg["dtype"])
    st = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg["state_dtype"]]
    hq, hk, hv, hs = _fwd_common.heads(cfg, with_q)
    lens = _fwd_common.seq_lens(cfg["seqs"])
    total, n = sum(lens), len(lens)
    k = 0.2 * torch.randn(total, hk, DIM, device=device)
    k = (k if cfg["l2norm"] else torch.nn.functional.normalize(k, dim=-1)).to(t)
    safe = cfg["safe_gate"]
    gate = 0.2 * torch.randn(total, hs, DIM, device=device) if safe else \
        torch.empty(total, hs, DIM, device=device).uniform_(-0.08, -0.01)
    logits = 0.3 * torch.randn(total, hs, DIM, device=device)
    cadence = cfg["checkpoint"]
    data = {
        "q": (0.2 * torch.randn(total, hq, DIM, device=device)).to(t) if with_q else None,
        "k": k, "v": (0.2 * torch.randn(total, hv, DIM, device=device)).to(t), "gate": gate,
        "beta": (logits if cfg["beta_sigmoid"] else torch.sigmoid(logits)).to(t),
        "w": torch.sigmoid(0.3 * torch.randn(total, hs, DIM, device=device)).to(t),
        "cu_seqlens": torch.tensor([0] + lens, device=device).cumsum(0).to(getattr(torch, cfg["cu_dtype"])),
        "initial_state": ((0.01 * torch.randn(n, hs, DIM, DIM, device=device)).to(st) if cfg["init"] else None),
        "a_log": 0.1 * torch.randn(hs, device=device) if safe else None,
        "dt_bias": -4.0 + 0.1 * torch.randn(hs, DIM, device=device) if safe else None,
        "safe_gate": safe, "use_beta_sigmoid": cfg["beta_sigmoid"], "use_qk_l2norm_in_kernel": cfg["l2norm"],
        "checkpoint_every_n_tokens": cadence,
    }
    if with_q:
        data["output"] = torch.full((total, hs, DIM), float("nan"), dtype=t, device=device)
    if cfg["final"]:
        data["final_state"] = torch.full((n, hs, DIM, DIM), float("nan"), dtype=st, device=device)
    if cadence:
        count = _fwd_op.checkpoint_count(lens, cadence)
        data["checkpoints"] = torch.full((count, hs, DIM, DIM), float("nan"), dtype=t, device=device)
    return data


def option_kwargs(data: dict) -> dict:
    return {k: data[k] for k in ("safe_gate", "a_log", "dt_bias", "use_beta_sigmoid", "use_qk_l2norm_in_kernel")}


def reference(data: dict, with_q: bool, dtype=torch.float32, chunked: bool = True) -> dict:
    g, b, w = gdn2_ref.gates(data["gate"], data["beta"], data["w"], data["safe_gate"], data["a_log"],
                             data["dt_bias"], gdn2_ref.DEFAULT_LOWER_BOUND, data["use_beta_sigmoid"], dtype)
    fn = gdn2_ref.gdn2_chunked if chunked else gdn2_ref.gdn2_recurrent
    q = data["q"] if with_q else data["k"]
    o, ht, ck = fn(q, data["k"], data["v"], g, b, w, None, data["initial_state"], data["cu_seqlens"],
                   data["use_qk_l2norm_in_kernel"], dtype, data["checkpoint_every_n_tokens"])
    res = {"output": o} if with_q else {}
    if "final_state" in data:
        res["final_state"] = ht
    if "checkpoints" in data:
        res["checkpoints"] = ck
    return res


def roofline(with_q: bool, **cfg) -> dict:
    """The forward's FLOPs per token and head as GDN-1's (state products 3 x 2 d^2, chunk products 4 x 2 C d, C = 64;
    the recompute runs the same scan); bytes: q, k, v, the three gates, states and checkpoints once."""
    cfg = {**DEFAULTS, **cfg}
    hq, hk, hv, hs = _fwd_common.heads(cfg, with_q)
    lens = _fwd_common.seq_lens(cfg["seqs"])
    total, n = sum(lens), len(lens)
    st = 4 if cfg["state_dtype"] == "float32" else 2
    nbytes = 2 * total * DIM * (hk + hv + (hq + hs if with_q else 0)) + total * hs * DIM * (4 + 2 + 2)
    nbytes += st * n * hs * DIM * DIM * (int(cfg["init"]) + int(cfg["final"]))
    nbytes += 2 * _fwd_op.checkpoint_count(lens, cfg["checkpoint"]) * hs * DIM * DIM
    return {"bytes": nbytes, "flops": total * hs * (6 * DIM * DIM + 8 * 64 * DIM)}


def check_inputs(op: str, q, k, v, gate, beta, w, cu_seqlens, initial_state, final_state, checkpoints, cadence,
                 safe_gate, a_log, dt_bias, use_beta_sigmoid, output=None, scale=None, final_name="final_state"):
    """GDN-1's checks (``_fwd_op.check_inputs``, with GDN-2's [T, H, 128] gates). Returns H."""
    lead, ref = ("q", q) if q is not None else ("k", k)
    checks.tensor(op, lead, ref, dtypes=(torch.bfloat16, torch.float16), ndim=3, cuda=False)
    total = ref.shape[0]
    hs = max(ref.shape[1], v.shape[1]) if v.ndim == 3 else 0
    checks.tensor(op, "gate", gate, dtypes=(torch.float32,), shape=(total, hs, DIM), contiguous=True, cuda=False)
    checks.tensor(op, "beta", beta, dtypes=(ref.dtype,), shape=(total, hs, DIM), contiguous=True, cuda=False)
    checks.tensor(op, "w", w, dtypes=(ref.dtype,), shape=(total, hs, DIM), contiguous=True, cuda=False)
    if safe_gate:
        if a_log is None or dt_bias is None:
            _fwd_op.fail(op, "a_log", "a_log [H] and dt_bias [H, 128] (fp32) with safe_gate", "None")
        checks.tensor(op, "a_log", a_log, dtypes=(torch.float32,), shape=(hs,), cuda=False)
        checks.tensor(op, "dt_bias", dt_bias, dtypes=(torch.float32,), shape=(hs, DIM), cuda=False)
    elif a_log is not None or dt_bias is not None:
        _fwd_op.fail(op, "a_log", "None without safe_gate", "a tensor")
    if cadence not in fwd.CADENCES:
        _fwd_op.fail(op, "checkpoint_every_n_tokens", f"one of {fwd.CADENCES}", repr(cadence))
    # The rest as GDN-1 (its gate / beta shapes are [T, H]: pass those views; cadence 0 for its cadence check).
    _fwd_op.check_inputs(op, q, k, v, gate[..., 0].contiguous(), beta[..., 0].float(), cu_seqlens, initial_state,
                         final_state, None, 0, True, False, None, None, False, output, scale, final_name)
    if checkpoints is not None:
        if not cadence:
            _fwd_op.fail(op, "output_state_checkpoints", "None without checkpoint_every_n_tokens", "a tensor")
        checks.tensor(op, "output_state_checkpoints", checkpoints, dtypes=(ref.dtype,),
                      shape=(None, hs, DIM, DIM), contiguous=True)
    return hs


def get_kernel(kernel: str = "scan"):
    """The three artifacts: ``_kda_chunk``'s GDN-2 variant (the chunk pass), tirx-native's KDA scan kernel and its
    chunk table (the slots from ``cu_seqlens``, on the device)."""
    from tirx_kernels.kda import _chunk_table, _kda_chunk, _kda_scan

    if kernel == "chunk":
        return _kda_chunk.build_chunk_kernel("gdn2")
    if kernel == "scan":
        return _kda_scan.build_scan_kernel()
    if kernel == "table":
        return _chunk_table.build_chunk_table_kernel()
    raise ValueError(f"cudnn gdn2: kernel {kernel!r} is 'chunk', 'scan' or 'table'")


ARTIFACTS = [{"kernel": "chunk"}, {"kernel": "scan"}, {"kernel": "table"}]


def run(functions, q, k, v, gate, beta, w, output, cu_seqlens, initial_state, final_state, checkpoints, cadence, scale,
        safe_gate, a_log, dt_bias, use_beta_sigmoid, use_qk_l2norm, lower_bound=gdn2_ref.DEFAULT_LOWER_BOUND,
        scan=None):
    """Chunk pass, scan, checkpoints. ``functions``: the module's cache of the two kernels (the chunk pass and the
    scan: no host read of ``cu_seqlens`` unless checkpoints are asked for); ``scan``: the CPU tests' stand-in, which
    takes the torch chunk pass's result."""
    from tirx_kernels.kda import kda_forward_portfolio_multishape as kda_fwd

    opts = (use_qk_l2norm, safe_gate, a_log, dt_bias, lower_bound, use_beta_sigmoid)
    hs = delta_rule_ref.head_maps((q if q is not None else k).shape[1], k.shape[1], v.shape[1])[0]
    n, total = cu_seqlens.shape[0] - 1, k.shape[0]
    h0 = None if initial_state is None else initial_state.transpose(-1, -2).float().contiguous()  # [N, H, K, V]
    ht = torch.empty(n, hs, DIM, DIM, device=k.device)
    # the scan writes bf16: an fp16 output goes through a bf16 scratch
    out = output if output is not None and output.dtype == torch.bfloat16 else \
        torch.empty(total, hs, DIM, dtype=torch.bfloat16, device=k.device)
    cu = [int(x) for x in cu_seqlens.cpu()] if scan is not None or checkpoints is not None else None
    ck = rows = None
    if scan is not None:
        qf, kf, vf, gf, bf, wf, _ = fwd.expand_inputs(q, k, v, gate, beta, w, *opts)
        ops = fwd.chunk_pass(qf, kf, vf, gf, bf, wf, scale, cu)
        ck = torch.empty(max(len(fwd.chunk_list(cu)[0]), 1), hs, DIM, DIM, device=k.device)
        scan(ops, cu, h0, out, ht, ck)
        rows = fwd.pass_chunk_rows(ops)
    elif total == 0:
        ht.copy_(h0 if h0 is not None else torch.zeros_like(ht))
    else:
        qb, kb, gf, bb, v_in = fwd.kernel_inputs(q, k, v, gate, beta, w, *opts)
        chunks = fwd.kernel_pass(functions, qb, kb, gf, bb, scale, cu_seqlens)
        if checkpoints is not None:
            ck = torch.empty(chunks[5].shape[0], hs, DIM, DIM, device=k.device)  # the state entering each chunk
        kda_fwd.scan_pass(chunks, v_in[None], cu_seqlens, out, h0, ht, ck, functions=functions)
        rows = fwd.kernel_chunk_rows(chunks, v_in, kb, gf, cu) if checkpoints is not None else None
    if output is not None and output is not out:
        output.copy_(out)
    if final_state is not None:
        final_state.copy_(ht.transpose(-1, -2))
    if checkpoints is not None:
        if ck is None:  # no tokens: no checkpoints either
            return
        with _fwd_common.tf32_matmuls():
            fwd.checkpoints(rows, ck, cu, cadence, checkpoints)
