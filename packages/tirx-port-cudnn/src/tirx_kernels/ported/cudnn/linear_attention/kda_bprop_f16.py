# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's KDA backward (cudnn_sm100_kda_bprop_f16) to Hopper: the KDA_BWD node's argument contract.
# Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), python/cudnn/linear_attention/frost/
# kda_engine.py and frost/kernel/kda_bprop_f16.py, release v1.28.0 (commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082);
# read for the contract only. The backward itself is tirx-native's KDA backward core (tirx_kernels.kda:
# kda_backward_packed): one core, two public conventions.
"""``kda_bprop``: cuDNN's KDA backward over THD-packed sequences (no batch dim), K = V = 128, bf16 / fp16 (the
kernels' operands bf16): q, k, v [T, H, 128], the raw gate g [T, H, 128], beta logits [T, H], ``a_log`` [H] and
``dt_bias`` [H * 128], dO, optional initial state and final-state gradient in cuDNN's layout [N, H, V, K] -> dq, dk,
dv, dg, dbeta, d_a_log, d_dt_bias, d_initial_state.

Registered as ``cudnn_sm90_kda_bprop_f16`` (the seed's ``cudnn_sm100_kda_bprop_f16``, tcgen05/TMEM, BT = 16).
Supported profile: cuDNN's ``perf_l2_*`` rows -- ``use_qk_l2norm``, ``use_beta_sigmoid`` and ``safe_gate`` with
``gate_lower_bound`` (-5 here), H = Hq = Hk = Hv; other options raise NotImplementedError naming the argument.
Checkpoints: cuDNN saves one every 16 tokens; this core keeps one per 64-token chunk, so ``state_checkpoints`` is
taken with ``checkpoint_every_n_tokens=64`` ([sum ceil(len / 64), H, V, K], fp32 or bf16) and recomputed by the
forward scan when absent.
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, kda_ref, runtime
from tirx_kernels.kda import kda_backward_packed as core
from tirx_kernels.kda import kda_forward_portfolio_multishape as fwd

KERNEL_META = {
    "name": "cudnn_sm90_kda_bprop_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "cuDNN KDA backward (l2norm, safe gate, beta sigmoid): dq, dk, dv, dg, dbeta, d_a_log, d_dt_bias, "
                   "d_initial_state on tirx-native's KDA backward core (wgmma state walks, chunk-parallel gradients "
                   "in torch), THD varlen, bf16/fp16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "reference_requirements": [
        {"package": "fla-core", "import": "fla", "specifier": "==0.6.0", "baseline": "fla"},
    ],
    "public_ops": ["kda_bprop"],
}

OP = "kda_bprop"
DIM = 128

# cuDNN's KDA bprop perf rows (catalog section 2.3) and a ragged correctness row.
CONFIGS = [
    {"label": "ragged_h2_init_dfinal", "H": 2, "seqs": "70+0+1+64+129"},
    {"label": "perf_basic_b1_s2048_h16", "H": 16, "seqs": "2048"},
    {"label": "perf_l2_b1_s8192_h16", "H": 16, "seqs": "8192"},
    {"label": "perf_l2_b4_s8192_h64", "H": 64, "seqs": "8192x4"},
    {"label": "fp16_ragged_h2", "H": 2, "seqs": "70+1+64", "dtype": "float16"},
]
BENCH_CONFIGS = [
    {"label": "perf_basic_b1_s2048_h16", "H": 16, "seqs": "2048"},
    {"label": "perf_l2_b1_s8192_h16", "H": 16, "seqs": "8192"},
    {"label": "perf_l2_b4_s8192_h64", "H": 64, "seqs": "8192x4"},
]
DEFAULTS: dict = {}
TOLERANCE = core.TOLERANCE
COMPARATORS = core.COMPARATORS  # dg in the relative Frobenius norm, as the core's (its bound per input dtype)
GRAD_KEYS = ("dq", "dk", "dv", "dg", "dbeta", "d_a_log", "d_dt_bias", "d_initial_state")


def compile_params(**_) -> dict:
    return {"kernel": "walk"}


def get_kernel(kernel: str = "walk"):
    return core.get_kernel(kernel)


def artifact_params() -> list[dict]:
    return core.artifact_params()


def call_samples(rng) -> list[dict]:
    return core.call_samples(rng)


def sass_expect(kernel: str = "walk", **_) -> list[str]:
    return core.sass_expect(kernel)


def _to_cudnn(name: str) -> str:
    return {"dA_log": "d_a_log", "ddt_bias": "d_dt_bias", "dh0": "d_initial_state"}.get(name, name)


def prepare_data(H: int, seqs: str, dtype: str = "bfloat16", device: str = "cuda") -> dict:  # noqa: N803
    """The core's data in cuDNN's layout: THD tensors, states [N, H, V, K]."""
    d = core.prepare_data(H=H, seqs=seqs, dtype=dtype, device=device)
    out = {k: d[k][0] for k in ("q", "k", "v", "g", "beta", "do")}
    out.update(a_log=d["A_log"], dt_bias=d["dt_bias"], cu_seqlens=d["cu_seqlens"],
               initial_state=d["initial_state"].transpose(-1, -2).contiguous(),
               d_final_state=d["dht"].transpose(-1, -2).contiguous())
    for key in core.GRAD_KEYS:
        like = d[key]
        out[_to_cudnn(key)] = (like.transpose(-1, -2).contiguous() if key == "dh0"
                               else like[0] if like.dim() > 2 and key not in ("dA_log", "ddt_bias") else like)
    return out


def reference(q, k, v, g, beta, do, a_log, dt_bias, cu_seqlens, initial_state, d_final_state, **_) -> dict:
    gr = kda_ref.grads(q[None], k[None], v[None], g[None], beta[None], a_log, dt_bias, DIM ** -0.5,
                       initial_state.transpose(-1, -2), cu_seqlens, do[None], d_final_state.transpose(-1, -2),
                       fwd.LOWER_BOUND, torch.float32)
    return {"dq": gr["q"][0], "dk": gr["k"][0], "dv": gr["v"][0], "dg": gr["g"][0], "dbeta": gr["beta"][0],
            "d_a_log": gr["A_log"], "d_dt_bias": gr["dt_bias"],
            "d_initial_state": gr["initial_state"].transpose(-1, -2)}


def launch(cfg: dict, data: dict) -> None:
    got = kda_bprop(data["q"], data["k"], data["v"], data["g"], data["beta"], data["do"], data["cu_seqlens"],
                    initial_state=data["initial_state"], d_final_state=data["d_final_state"], a_log=data["a_log"],
                    dt_bias=data["dt_bias"], use_qk_l2norm=True, use_beta_sigmoid=True, safe_gate=True)
    for key in GRAD_KEYS:
        data[key].copy_(got[key])


def roofline(H: int, seqs: str, **_) -> dict:  # noqa: N803
    return core.roofline(H, seqs)


def get_baselines(**cfg) -> dict:
    fla_core = core.get_baselines(**cfg)["fla"]

    def fla():
        fn = fla_core()

        def run(data):
            batched = {k: data[k][None] for k in ("q", "k", "v", "g", "beta", "do")}
            batched.update(A_log=data["a_log"], dt_bias=data["dt_bias"], cu_seqlens=data["cu_seqlens"],
                           initial_state=data["initial_state"].transpose(-1, -2).contiguous(),
                           dht=data["d_final_state"].transpose(-1, -2).contiguous())
            gr = fn(batched)
            return {_to_cudnn(k): (v.transpose(-1, -2) if k == "dh0" else v[0] if v.dim() > 2 else v)
                    for k, v in gr.items()}
        return run

    return {"fla": fla}


def kda_bprop(q, k, v, g, beta, do, cu_seqlens, state_checkpoints=None, checkpoint_every_n_tokens=0, scale=None,
              initial_state=None, d_final_state=None, a_log=None, dt_bias=None, use_qk_l2norm=False,
              use_beta_sigmoid=False, safe_gate=False, gate_lower_bound=None, gate_domain="log",
              allow_neg_eigval=False) -> dict:
    """cuDNN's KDA_BWD on Hopper (the supported profile: see the module docstring). Returns ``{dq, dk, dv, dg,
    dbeta, d_a_log, d_dt_bias, d_initial_state}`` (fp32; states [N, H, V, K])."""
    for name, ok, want in (("use_qk_l2norm", use_qk_l2norm, "True"), ("use_beta_sigmoid", use_beta_sigmoid, "True"),
                           ("safe_gate", safe_gate, "True"), ("allow_neg_eigval", not allow_neg_eigval, "False"),
                           ("gate_domain", gate_domain == "log", "'log'"),
                           ("gate_lower_bound", gate_lower_bound in (None, fwd.LOWER_BOUND), "-5"),
                           ("a_log", a_log is not None and dt_bias is not None, "a_log and dt_bias (the safe gate)")):
        if not ok:
            raise NotImplementedError(f"{OP}: argument '{name}': only {want} is implemented on Hopper")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("do", do)):
        checks.tensor(OP, name, t, dtypes=(torch.bfloat16, torch.float16) if name == "q" else (q.dtype,),
                      ndim=3 if name != "beta" else 2, contiguous=True, cuda=False)
    n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else 0
    for name, st in (("initial_state", initial_state), ("d_final_state", d_final_state)):
        if st is not None:
            checks.tensor(OP, name, st, dtypes=(torch.float32,), shape=(n, q.shape[1], DIM, DIM), cuda=False)
    ckpt = None
    if state_checkpoints is not None:
        if checkpoint_every_n_tokens != fwd.CHUNK:
            raise NotImplementedError(f"{OP}: argument 'checkpoint_every_n_tokens': checkpoints every "
                                      f"{fwd.CHUNK} tokens only (cuDNN's BT = 16 series is not kept here)")
        ckpt = _checkpoint_slots(state_checkpoints, cu_seqlens, q.shape[0])
    h0 = None if initial_state is None else initial_state.transpose(-1, -2).contiguous()
    dht = None if d_final_state is None else d_final_state.transpose(-1, -2).contiguous()
    got = _backward(q[None], k[None], v[None], g[None], beta[None], a_log.float(), dt_bias.float(), do[None], dht,
                    scale, h0, cu_seqlens, ckpt)
    out = {_to_cudnn(key): val for key, val in got.items()}
    for key in ("dq", "dk", "dv", "dg", "dbeta"):
        out[key] = out[key][0]
    out["d_initial_state"] = out["d_initial_state"].transpose(-1, -2)
    return out


def _backward(q, k, v, g, beta, A_log, dt_bias, do, dht, scale, h0, cu_seqlens, ckpt):  # noqa: N803
    """The core's backward (its validation, then this op's own custom op outside eager)."""
    fwd.check_inputs(q, k, v, g, beta, A_log, dt_bias, scale, h0, cu_seqlens, None, None)
    scale = DIM ** -0.5 if scale is None else float(scale)
    n, h = cu_seqlens.shape[0] - 1, q.shape[2]
    if dht is None:
        dht = torch.zeros(n, h, DIM, DIM, dtype=torch.float32, device=q.device)
    outs = {key: torch.empty(t.shape, dtype=torch.float32, device=q.device) for key, t in
            (("dq", q), ("dk", k), ("dv", v), ("dg", g), ("dbeta", beta), ("dA_log", A_log), ("ddt_bias", dt_bias),
             ("dh0", dht))}
    args = (q, k, v, g, beta, A_log, dt_bias, do, dht, scale, h0, cu_seqlens, ckpt,
            *(outs[key] for key in core.GRAD_KEYS))
    if runtime.direct_call(*(a for a in args if isinstance(a, torch.Tensor))):
        core._run(*args)
    else:
        torch.ops.tirx.cudnn_sm90_kda_bprop_f16(*args)
    return outs


@torch.library.custom_op("tirx::cudnn_sm90_kda_bprop_f16",
                         mutates_args=("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               A_log: torch.Tensor, dt_bias: torch.Tensor, do: torch.Tensor, dht: torch.Tensor,  # noqa: N803
               scale: float, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor,
               checkpoints: torch.Tensor | None, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
               dg: torch.Tensor, dbeta: torch.Tensor, dA_log: torch.Tensor, ddt_bias: torch.Tensor,  # noqa: N803
               dh0: torch.Tensor) -> None:
    core._run(q, k, v, g, beta, A_log, dt_bias, do, dht, scale, initial_state, cu_seqlens, checkpoints, dq, dk, dv,
              dg, dbeta, dA_log, ddt_bias, dh0)


@_custom_op.register_fake
def _(*args) -> None:
    return None


def _checkpoint_slots(state_checkpoints, cu_seqlens, total: int):
    """cuDNN's packed series (one [V, K] state per 64-token chunk of each sequence, in order) as the core's chunk
    slots ([slots, H, K, V] fp32): sequence n's chunks start at slot ``chunk_base[n]``, exactly the packed order."""
    _, _, base = fwd.chunk_table(cu_seqlens, total, core._FUNCTIONS)
    slots = total // fwd.CHUNK + (cu_seqlens.shape[0] - 1) + 2
    h = state_checkpoints.shape[1]
    if state_checkpoints.dim() != 4 or state_checkpoints.shape[2:] != (DIM, DIM) or \
            state_checkpoints.shape[0] > slots:
        raise checks.TirxInputError(f"{OP}: argument 'state_checkpoints': expected [sum ceil(len / 64), H, 128, 128],"
                                    f" got shape {tuple(state_checkpoints.shape)}")
    out = torch.zeros(slots, h, DIM, DIM, dtype=torch.float32, device=state_checkpoints.device)
    out[:state_checkpoints.shape[0]] = state_checkpoints.float().transpose(-1, -2)
    return out


run_test, run_bench = harness.bind(__name__)
