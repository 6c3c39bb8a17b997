# SPDX-License-Identifier: Apache-2.0
# Protocol pieces of the recurrent_kda ports (data, oracle, byte model, baselines). Upstream: flashinfer
# (https://github.com/flashinfer-ai/flashinfer) flashinfer.kda_decode.recurrent_kda, release v0.7.4 (commit
# 77039051b0be921788dc2784ec41423b558878ec); fla-core (fla.ops.kda.fused_recurrent_kda) as a second reference.
"""Config -> data -> oracle for the recurrent_kda modules. A config: ``batch``, ``T`` (1, or 2..8 speculative
tokens), ``n_heads`` / ``n_vheads``, ``gate`` (``log``: precomputed; ``softplus``; ``lower_bound``: -5 as in Kimi),
``dt_bias``, ``beta_logit``, ``l2norm``, ``form`` (``pool``: ssm_state_indices into a larger pool; ``dense``: slot n
/ n * T + t without indices), ``num_accepted``, ``source`` (initial_state_source), ``pad`` (padding tokens)."""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import delta_rule_ref
from tirx_kernels.ported.flashinfer.kda import _kda_decode as kd

K_DIM = V_DIM = 128
LOWER_BOUND = -5.0

DEFAULTS = {"n_heads": 16, "n_vheads": 16, "T": 1, "gate": "lower_bound", "dt_bias": True, "beta_logit": False,
            "l2norm": True, "form": "pool", "num_accepted": False, "source": False, "pad": False}

INPLACE = {"initial_state": "initial_state"}
COMPARATORS = {"initial_state": delta_rule_ref.pool_comparator("initial_state")}


def _generator(device: str) -> torch.Generator:
    if device != "cuda":
        return torch.Generator().manual_seed(0)
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def prepare_data(batch: int, T: int, n_heads: int, n_vheads: int, gate: str, dt_bias: bool,  # noqa: N803, C901
                 beta_logit: bool, l2norm: bool, form: str, num_accepted: bool, source: bool, pad: bool,
                 device: str = "cuda", **_) -> dict:
    """Random inputs; the pool has room for slots nobody addresses (checked bit for bit). ``pad`` makes entry 1
    all padding and, at T > 1, the last token of entry 0 a padding token."""
    g = _generator(device)
    bf = torch.bfloat16

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    spec = T > 1
    need = batch * T
    slots_n = need + batch + 3 if form == "pool" else need + 2  # dense: slots past B * T stay untouched
    data = {
        "q": rn(batch, T, n_heads, K_DIM).to(bf), "k": rn(batch, T, n_heads, K_DIM).to(bf),
        "v": rn(batch, T, n_vheads, V_DIM).to(bf),
        # log gates near 0 keep the state alive over T tokens; raw gates span the softplus / sigmoid knees
        "g": (rn(batch, T, n_vheads, K_DIM, scale=0.05) - 0.02 if gate == "log"
              else rn(batch, T, n_vheads, K_DIM, scale=2.0)).to(bf),
        "beta": (rn(batch, T, n_vheads) if beta_logit else torch.rand(batch, T, n_vheads, generator=g, device=device)
                 ).to(bf),
        "initial_state": rn(slots_n, n_vheads, V_DIM, K_DIM, scale=0.3).to(bf),
        "use_qk_l2norm_in_kernel": bool(l2norm), "use_gate_in_kernel": gate != "log",
        "lower_bound": LOWER_BOUND if gate == "lower_bound" else None, "beta_is_logit": bool(beta_logit),
        "num_spec_tokens": T - 1 if spec else None,
        "output": torch.empty(batch, T, n_vheads, V_DIM, dtype=bf, device=device),
    }
    if not l2norm:  # unnormalized q / k: keep |k|^2 well under 1 so the delta rule stays contractive
        data["q"] = (data["q"].float() * 0.08).to(bf)
        data["k"] = (data["k"].float() * 0.08).to(bf)
    if gate != "log":
        data["A_log"] = rn(n_heads, scale=0.5)
        data["dt_bias"] = rn(n_heads * K_DIM, scale=0.5) if dt_bias else None
    if form == "pool":
        order = torch.randperm(slots_n, generator=g, device=device)
        idx = order[:need].view(batch, T).to(torch.int32).clone()
        if pad and batch > 1:
            idx[1] = -1
        if pad and spec:
            idx[0, -1] = -1
        data["ssm_state_indices"] = idx if spec else idx.view(batch)
    if spec and num_accepted:
        data["num_accepted_tokens"] = torch.randint(0, T + 2, (batch,), generator=g, device=device).to(torch.int32)
    if source:
        data["initial_state_source"] = rn(batch + 2, n_vheads, V_DIM, K_DIM, scale=0.3).to(bf)
        data["initial_state_indices"] = torch.randperm(batch + 2, generator=g, device=device)[:batch].to(torch.int32)
    return data


OP_KEYS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "use_qk_l2norm_in_kernel",
           "use_gate_in_kernel", "lower_bound", "ssm_state_indices", "num_spec_tokens", "num_accepted_tokens",
           "output", "initial_state_source", "initial_state_indices", "beta_is_logit")


_PER_ROW = ("q", "k", "v", "g", "beta", "ssm_state_indices", "initial_state_indices")


def op_kwargs(data: dict) -> dict:
    return {k: data[k] for k in OP_KEYS if k in data}


def normalized(data: dict) -> dict:
    kw = op_kwargs(data)
    out = kw.pop("output")
    n = kd.normalize(**kw)
    n["out"] = out
    return n


def reference(**data) -> dict:
    out, pool = kd.oracle(**normalized(data))
    return {"output": out, "initial_state": pool}


def launch(cfg: dict, data: dict) -> None:
    kd.recurrent_kda(**op_kwargs(data))


def roofline(batch: int, T: int, n_heads: int, n_vheads: int, **_) -> dict:  # noqa: N803
    """The state read once and written once per token (the checkpoints), q / k / v / g / out / beta once."""
    state = n_vheads * V_DIM * K_DIM * 2
    return {"bytes": batch * (state * (1 + T) + T * (2 * n_heads * K_DIM + 3 * n_vheads * K_DIM + n_vheads) * 2),
            "flops": 10 * batch * T * n_vheads * V_DIM * K_DIM}


def _ref_outputs(d: dict, fn) -> dict:
    kw = op_kwargs(d)
    pool = kw["initial_state"]
    kw["output"] = torch.empty_like(d["output"])
    out = fn(kw)
    return {"output": out, "initial_state": pool}


def get_baselines(**cfg) -> dict:
    """FlashInfer 0.7.4's cute-dsl op; fla-core's fused_recurrent_kda on gathered states (T = 1, log gate, H = HV:
    fla has no state pool and no in-kernel gate)."""
    def flashinfer():
        import flashinfer.kda_decode

        if getattr(flashinfer.kda_decode, "_RECURRENT_KDA_AVAILABLE", True) is False:
            raise ImportError("flashinfer.kda_decode.recurrent_kda: its CuTe-DSL backend cannot target this device")

        def call(kw):
            idx = kw.get("ssm_state_indices")
            # the config says whether rows pad (no per-call host sync in the timed reference)
            if kw["q"].shape[1] > 1 or idx is None or not (cfg.get("pad") and kw["q"].shape[0] > 1):
                return flashinfer.kda_decode.recurrent_kda(**kw)[0]
            # T = 1 upstream gathers a negative index with torch indexing (the last slot); padding rows are ours
            # to define (output 0, nothing written): run upstream on the live rows only.
            live = idx >= 0
            sub = {k: (v[live] if isinstance(v, torch.Tensor) and k in _PER_ROW else v) for k, v in kw.items()}
            sub["output"] = torch.empty_like(kw["output"][live])
            out = torch.zeros_like(kw["output"])
            out[live] = flashinfer.kda_decode.recurrent_kda(**sub)[0]
            return out

        return lambda d: _ref_outputs(d, call)

    out = {"flashinfer": flashinfer}
    if cfg.get("T", 1) == 1 and cfg.get("gate") == "log" and not cfg.get("source") and not cfg.get("pad") and \
            cfg.get("n_heads") == cfg.get("n_vheads"):
        def fla():
            from fla.ops.kda import fused_recurrent_kda

            def fn(kw):
                n = kd.normalize(**{k: v for k, v in kw.items() if k != "output"})
                slots = n["slots"][:, 0].long()
                h0 = kw["initial_state"][slots].float().transpose(-1, -2)  # fla keeps [K, V]
                o, ht = fused_recurrent_kda(q=kw["q"], k=kw["k"], v=kw["v"], g=kw["g"], beta=kw["beta"],
                                            scale=n["scale"], initial_state=h0, output_final_state=True,
                                            use_qk_l2norm_in_kernel=n["use_qk_l2norm"])
                kw["initial_state"][slots] = ht.transpose(-1, -2).to(torch.bfloat16)
                return o
            return lambda d: _ref_outputs(d, fn)
        out["fla"] = fla
    return out
