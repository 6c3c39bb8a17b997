# SPDX-License-Identifier: Apache-2.0
"""The protocol pieces the GDN-1 forward and recompute modules share: config defaults, data, the oracle's outputs,
the byte / FLOP model, call samples, the checkpoint buffer and the launch (``run``) on validated inputs.

Config keys: ``dtype`` (bf16 / fp16), ``Hq`` / ``Hk`` / ``Hv`` (the recompute ignores Hq: its state heads are
max(Hk, Hv)), ``seqs`` (``"63+0+129"``, ``"8192x4"``), ``cu_dtype``, ``init`` / ``final`` (initial / final state),
``state_dtype`` (fp32 / bf16), ``checkpoint`` (the cadence, 0 / 64 / 128 / 192), ``gate`` (``log``, ``linear`` or
``safe``), ``beta_sigmoid`` (beta as logits in the I/O dtype)."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.cudnn.linear_attention import _fwd_op as fop

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
IO_NAMES = tuple(DTYPES)
DEFAULTS = {"dtype": "bfloat16", "Hk": None, "cu_dtype": "int32", "init": False, "final": True,
            "state_dtype": "float32", "checkpoint": 0, "gate": "log", "beta_sigmoid": False}
# The kernel rounds Sb, Y, Delta, P, T beta and K_d to 16 bits (gdn_prefill_sm90's bounds: a relative Frobenius
# error of ~3e-3 in bf16, single elements to ~6e-2 of the RMS); checkpoints are the state rounded to the I/O dtype.
TOLERANCE = {"bfloat16": (1.2e-1, 4e-2), "float16": (2e-2, 8e-3), "float32": (1.2e-1, 4e-2)}


def seq_lens(seqs: str) -> list[int]:
    """``"70+0+1"`` -> [70, 0, 1]; ``"1024x8"`` -> eight 1024s (terms combine: ``"4096x2+17"``)."""
    out = []
    for term in seqs.split("+"):
        length, _, count = term.partition("x")
        out += [int(length)] * int(count or 1)
    return out


def heads(cfg: dict, with_q: bool) -> tuple[int, int, int, int]:
    """(Hq, Hk, Hv, H) of a config (Hk defaults to Hq; the recompute's q is its k)."""
    hk = cfg.get("Hk") or cfg["Hq"]
    hq = cfg["Hq"] if with_q else hk
    return hq, hk, cfg["Hv"], max(hq, cfg["Hv"])


def prepare_data(with_q: bool, device: str = "cuda", **cfg) -> dict:
    """q, v 0.2-scaled normals; k L2-normalised (beta |k|^2 <= 1 keeps the delta rule contractive over 32k tokens);
    the gate as cuDNN's test draws it (log decay in (-0.9, -0.01), alpha in (0.4, 0.99), or a raw safe-gate logit
    with A_log ~ 0.1 N, dt_bias ~ -4 + 0.1 N); beta post-sigmoid or its logits; a small initial state; outputs NaN."""
    cfg = {**DEFAULTS, **cfg}
    t = DTYPES[cfg["dtype"]]
    st = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg["state_dtype"]]
    hq, hk, hv, hs = heads(cfg, with_q)
    lens = seq_lens(cfg["seqs"])
    total, n = sum(lens), len(lens)
    q = (0.2 * torch.randn(total, hq, fop.DIM, device=device)).to(t) if with_q else None
    k = torch.nn.functional.normalize(torch.randn(total, hk, fop.DIM, device=device), dim=-1).to(t)
    v = (0.2 * torch.randn(total, hv, fop.DIM, device=device)).to(t)
    gate = torch.empty(total, hs, device=device)
    if cfg["gate"] == "safe":
        gate.normal_(std=0.2)
    elif cfg["gate"] == "log":
        gate.uniform_(-0.9, -0.01)
    else:
        gate.uniform_(0.4, 0.99)
    logits = 0.3 * torch.randn(total, hs, device=device)
    beta = logits.to(t) if cfg["beta_sigmoid"] else torch.sigmoid(logits)
    safe = cfg["gate"] == "safe"
    cadence = cfg["checkpoint"]
    data = {
        "q": q, "k": k, "v": v, "gate": gate, "beta": beta,
        "cu_seqlens": torch.tensor([0] + lens, device=device).cumsum(0).to(getattr(torch, cfg["cu_dtype"])),
        "initial_state": ((0.01 * torch.randn(n, hs, fop.DIM, fop.DIM, device=device)).to(st) if cfg["init"]
                          else None),
        "a_log": 0.1 * torch.randn(hs, device=device) if safe else None,
        "dt_bias": -4.0 + 0.1 * torch.randn(hs, device=device) if safe else None,
        "log_gate": cfg["gate"] != "linear", "safe_gate": safe, "use_beta_sigmoid": cfg["beta_sigmoid"],
        "checkpoint_every_n_tokens": cadence,
    }
    if with_q:
        data["output"] = torch.full((total, hs, fop.DIM), float("nan"), dtype=t, device=device)
    if cfg["final"]:
        data["final_state"] = torch.full((n, hs, fop.DIM, fop.DIM), float("nan"), dtype=st, device=device)
    if cadence:
        count = fop.checkpoint_count(lens, cadence)
        data["checkpoints"] = torch.full((count, hs, fop.DIM, fop.DIM), float("nan"), dtype=t, device=device)
    return data


def gate_kwargs(data: dict) -> dict:
    return {k: data[k] for k in ("log_gate", "safe_gate", "a_log", "dt_bias", "use_beta_sigmoid")}


def reference(data: dict, with_q: bool, dtype=torch.float32, chunked: bool = True) -> dict:
    """The oracle's outputs under the keys of ``data`` (fp32 chunked by default)."""
    o, ht, ck = fop.reference(data["q"] if with_q else None, data["k"], data["v"], data["gate"], data["beta"],
                              data["cu_seqlens"], data["initial_state"], None, data["checkpoint_every_n_tokens"],
                              dtype=dtype, chunked=chunked, **gate_kwargs(data))
    res = {}
    if with_q:
        res["output"] = o
    if "final_state" in data:
        res["final_state"] = ht
    if "checkpoints" in data:
        res["checkpoints"] = ck
    return res


def roofline(with_q: bool, **cfg) -> dict:
    """FLOPs of the chunked algorithm per token and state head (C = 64, d = 128): the forward's state products
    (K S^T, Q S^T, the update) 3 x 2 d^2 and chunk products (K K^T, Q K^T, T beta Y, P Delta) 4 x 2 C d; the
    recompute's 2 x 2 d^2 and 2 x 2 C d (the 64 x 64 inverse is not counted). Bytes: every input read once, every
    output written once."""
    cfg = {**DEFAULTS, **cfg}
    hq, hk, hv, hs = heads(cfg, with_q)
    lens = seq_lens(cfg["seqs"])
    total, n = sum(lens), len(lens)
    io = 2
    st = 4 if cfg["state_dtype"] == "float32" else 2
    per_token = (6 * 128 * 128 + 8 * 64 * 128) if with_q else (4 * 128 * 128 + 4 * 64 * 128)
    nbytes = io * total * 128 * (hk + hv + (hq + hs if with_q else 0)) + 4 * total * hs * 2
    nbytes += st * n * hs * 128 * 128 * (int(cfg["init"]) + int(cfg["final"]))
    nbytes += io * fop.checkpoint_count(lens, cfg["checkpoint"]) * hs * 128 * 128
    return {"bytes": nbytes, "flops": total * hs * per_token}


def call_samples(rng, with_q: bool) -> list[dict]:
    out = []
    for d in DTYPES:
        for hq, hv in ((16, 16), (16, 32), (8, 32), (32, 8), (4, 4), (64, 64)) * 2:
            seqs = "+".join(str(rng.choice([0, 1, 63, 64, 65, 1000, 8192])) for _ in range(rng.randint(1, 4)))
            out.append({**DEFAULTS, "dtype": d, "Hq": hq, "Hk": hq if hv >= hq else hv, "Hv": hv, "seqs": seqs,
                        "gate": rng.choice(["log", "linear", "safe"]), "init": rng.random() < 0.5,
                        "checkpoint": rng.choice(fop.CADENCES if with_q else fop.CADENCES[1:])})
    return out


def checkpoint_buffer(op: str, given, cu_seqlens, cadence: int, hs: int, dtype):
    """The checkpoint tensor of a call: ``given`` (its row count checked against ``cu_seqlens`` outside CUDA-graph
    capture and torch.compile: too few rows would be written past), or a new one (a host read of cu_seqlens)."""
    if not cadence:
        return None
    capturing = torch.compiler.is_compiling() or (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing())
    if given is not None and capturing:
        return given
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).clamp_min(0).tolist()
    count = fop.checkpoint_count(lens, cadence)
    if given is None:
        return torch.empty(count, hs, fop.DIM, fop.DIM, dtype=dtype, device=cu_seqlens.device)
    if given.shape[0] != count:
        fop.fail(op, "output_state_checkpoints", f"{count} rows (ceil(len / {cadence}) per sequence)",
                 f"shape {tuple(given.shape)}")
    return given


def run(functions, op: str, q, k, v, gate, beta, output, cu_seqlens, initial_state, final_state, checkpoints,
        cadence, scale, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid) -> None:
    """Launch on validated inputs (``q`` / ``output`` None: the recompute); bf16 states go through fp32 copies."""
    h0 = None if initial_state is None else initial_state.float().contiguous()
    ht = final_state
    if final_state is not None and final_state.dtype != torch.float32:
        ht = torch.empty(final_state.shape, dtype=torch.float32, device=final_state.device)
    if k.shape[0] == 0:  # every sequence is empty (a tensor map cannot have extent 0): states pass through
        if ht is not None:
            ht.copy_(h0 if h0 is not None else torch.zeros_like(ht))
    else:
        for name, t in (("q", q), ("k", k), ("v", v), ("output", output), ("output_state_checkpoints", checkpoints)):
            if t is not None:
                checks.aligned(op, name, t, 16)
        g, b, gate_log = fop.kernel_gates(gate, beta, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid)
        offsets = fop.checkpoint_offsets(cu_seqlens, cadence) if checkpoints is not None else None
        io = fop.IO[k.dtype]
        fn = functions.get((io, k.get_device()), lambda: {"io": io}, k.device)
        fn(*fop.kernel_args(q, k, v, g.contiguous(), b.contiguous(), gate_log, cu_seqlens, h0, ht, offsets,
                            checkpoints, cadence, scale, output))
    if ht is not final_state:
        final_state.copy_(ht)


class tf32_matmuls:  # noqa: N801 -- a context manager, named like torch's
    """TF32 for the fp32 matmuls of the torch steps (the backwards' chunk steps, GDN-2's checkpoint advance),
    restored on exit: the products' inputs are mostly 16-bit values (q, k, v, dO, the checkpoints, the scan's bf16
    operands: exact in TF32's 10-bit mantissa), the rest fp32 intermediates rounded to ~5e-4, below the bf16
    rounding of the outputs; fp32 batched matmuls without it run at a fraction of the tensor cores' rate. Not yet
    measured on a GPU."""

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev
