# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's GDN-1 chunked forward (chunk_gdn_sm100, the "frost" linear-attention kernel
# python/cudnn/linear_attention/frost/kernel/gdn_prefill_f16.py) to Hopper.
# Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), release v1.28.0, commit
# 1dbd2c09432dfd6cbf13a0ad85a071446398c082 (the seed's port followed aded9909c3c2a897fdbc7b5fd79fa53bc915f4f5); read
# for semantics only. The kernel is the TIRx generator in _fwd_kernel.py (gdn_prefill_sm90's schedule + checkpoints).
"""cuDNN's GDN-1 forward on Hopper: o, the final state and per-chunk state checkpoints of the Gated DeltaNet over
THD-packed sequences (K = V = 128, fp16 / bf16), cuDNN's gate forms (log, raw alpha, safe gate) and beta (post-sigmoid
fp32 or logits), fp32 / bf16 states [N, H, V, K], checkpoints every 64 / 128 / 192 tokens in the I/O dtype.

Registered as ``cudnn_sm90_gdn_prefill_f16``: the seed's ``cudnn_sm100_gdn_prefill_f16`` (tcgen05 / TMEM,
``tensormap.replace`` per sequence) redesigned for sm_90a on wgmma: one CTA per (state head, sequence), the state in
registers, chunk products on wgmma (gdn_prefill_sm90's schedule, ``_fwd_kernel``). Per-sequence tensor maps are not
needed: the 3-D maps over the packed tensors address any token. Its recompute twin is
``cudnn_sm90_gdn_recompute_f16``; the backward (another module) consumes the checkpoints."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.cudnn.linear_attention import _fwd_common as common
from tirx_kernels.ported.cudnn.linear_attention import _fwd_op as fop

KERNEL_META = {
    "name": "cudnn_sm90_gdn_prefill_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "cuDNN GDN-1 chunked forward (64-token WY chunks on wgmma, fp32 state in registers) with per-chunk "
                   "state checkpoints, THD varlen, GQA/GVA, fp16/bf16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "reference_requirements": [
        {"package": "fla-core", "import": "fla", "specifier": "==0.6.0", "baseline": "fla"},
    ],
    "public_ops": ["chunk_gdn_sm90"],
}

# Correctness rows: ragged batches (empty and 1-token sequences, chunk and cadence boundaries), every gate form, beta
# logits, GQA / GVA, int64 cu_seqlens, bf16 states, the three cadences; and one upstream perf shape.
CONFIGS = [
    {"label": "ragged_hq2_hv4_ckpt64_safe", "Hq": 2, "Hk": 2, "Hv": 4, "seqs": "63+0+129+1", "init": True,
     "checkpoint": 64, "gate": "safe", "beta_sigmoid": True, "cu_dtype": "int64"},
    {"label": "gqa_fp16_ckpt128_linear_bf16state", "dtype": "float16", "Hq": 4, "Hk": 2, "Hv": 2,
     "seqs": "17+65+300", "init": True, "checkpoint": 128, "gate": "linear", "state_dtype": "bfloat16"},
    {"label": "h4_ckpt192_nofinal", "Hq": 4, "Hk": 4, "Hv": 4, "seqs": "192+1+500+0", "final": False,
     "checkpoint": 192},
    {"label": "h6_kv2_nockpt", "Hq": 6, "Hk": 6, "Hv": 2, "seqs": "64+320", "init": True},
    {"label": "perf_b1_s8192_h16_state", "Hq": 16, "Hk": 16, "Hv": 16, "seqs": "8192", "init": True,
     "checkpoint": 64},
]

# The upstream perf rows (catalog section 2.3: perf_b{1,4}_s{8192,32768}_h64_{nostate,state}; "state": initial and
# final state and checkpoints every 64 tokens) and issue 26's anchor, B1 T8192 H16.
BENCH_CONFIGS = [
    {"label": "perf_b1_s8192_h64_nostate", "Hq": 64, "Hk": 64, "Hv": 64, "seqs": "8192x1", "final": False},
    {"label": "perf_b4_s8192_h64_nostate", "Hq": 64, "Hk": 64, "Hv": 64, "seqs": "8192x4", "final": False},
    {"label": "perf_b4_s32768_h64_state", "Hq": 64, "Hk": 64, "Hv": 64, "seqs": "32768x4", "init": True,
     "checkpoint": 64},
    {"label": "perf_b1_s8192_h64_state", "Hq": 64, "Hk": 64, "Hv": 64, "seqs": "8192x1", "init": True,
     "checkpoint": 64},
    {"label": "perf_b1_s8192_h16_nostate", "Hq": 16, "Hk": 16, "Hv": 16, "seqs": "8192x1", "final": False},
]

DEFAULTS = {"dtype": "bfloat16", "Hk": None, "cu_dtype": "int32", "init": False, "final": True,
            "state_dtype": "float32", "checkpoint": 0, "gate": "log", "beta_sigmoid": False}  # _fwd_common.DEFAULTS
TOLERANCE = common.TOLERANCE


def compile_params(dtype: str = "bfloat16", **_) -> dict:
    """Only the I/O dtype changes the code: lengths, heads, gates, states and the cadence are run-time arguments."""
    return {"io": dtype}


def get_kernel(io: str):
    from tirx_kernels.ported.cudnn.linear_attention import _fwd_kernel

    return _fwd_kernel.build_kernel(io, "prefill")


def artifact_params() -> list[dict]:
    return [{"io": d} for d in common.IO_NAMES]


def call_samples(rng) -> list[dict]:
    return common.call_samples(rng, with_q=True)


def sass_expect(io: str, **_) -> list[str]:
    """The chunk GEMMs on the tensor cores (K-major SS, MN-major B, the inverse's RS), 3-D TMA loads, the register
    split."""
    return [r"HGMMA\.64x64x16\.F32", r"HGMMA\.64x128x16\.F32", r"UTMALDG\.3D", r"USETMAXREG"]


def prepare_data(device: str = "cuda", **cfg) -> dict:
    return common.prepare_data(with_q=True, device=device, **cfg)


def reference(**data) -> dict:
    return common.reference(data, with_q=True)


def launch(cfg: dict, data: dict) -> None:
    chunk_gdn_sm90(data["q"], data["k"], data["v"], data["gate"], data["beta"], data["output"], data["cu_seqlens"],
                   data["initial_state"], data.get("final_state"),
                   checkpoint_every_n_tokens=data["checkpoint_every_n_tokens"],
                   output_state_checkpoints=data.get("checkpoints"), **common.gate_kwargs(data))


def roofline(**cfg) -> dict:
    return common.roofline(with_q=True, **cfg)


def get_baselines(**cfg) -> dict:
    def fla():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn

        if cfg["Hq"] != cfg.get("Hk", cfg["Hq"]):
            raise ImportError("fla's chunk_gated_delta_rule needs as many k heads as q heads")

        def fn(data):
            g = fop.log_decay(data["gate"], data["log_gate"], data["safe_gate"], data["a_log"], data["dt_bias"])
            b = torch.sigmoid(data["beta"].float()) if data["use_beta_sigmoid"] else data["beta"]
            h0 = data["initial_state"]
            o, ht = fla_gdn(data["q"][None], data["k"][None], data["v"][None], g[None], b[None], scale=128 ** -0.5,
                            initial_state=None if h0 is None else h0.float(), output_final_state=True,
                            state_v_first=True, cu_seqlens=data["cu_seqlens"].long())
            res = {"output": o[0]}
            if data.get("final_state") is not None:
                res["final_state"] = ht.to(data["final_state"].dtype)
            return res
        return fn

    return {"fla": fla}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

OP = "chunk_gdn_sm90"


def chunk_gdn_sm90(q, k, v, gate, beta, output=None, cu_seqlens=None, initial_state=None, final_state=None,
                   scale=None, *, checkpoint_every_n_tokens: int = 0, output_state_checkpoints=None,
                   log_gate: bool = True, safe_gate: bool = False, a_log=None, dt_bias=None,
                   use_beta_sigmoid: bool = False, output_final_state: bool = False):
    """cuDNN's ``chunk_gdn_sm100`` on Hopper (argument order and meaning as upstream, ``_fwd_op`` spells them out).
    Writes ``output`` [T, H, 128] and, where given (or requested: ``output_final_state`` allocates an fp32 one,
    a cadence without ``output_state_checkpoints`` allocates them, which reads ``cu_seqlens`` on the host), the
    final state and the checkpoints. Returns ``(output, final_state, checkpoints)``."""
    if cu_seqlens is None:
        raise checks.TirxInputError(f"{OP}: argument 'cu_seqlens': expected the cumulative sequence lengths, got None")
    cadence = checkpoint_every_n_tokens
    hs = fop.check_inputs(OP, q, k, v, gate, beta, cu_seqlens, initial_state, final_state, output_state_checkpoints,
                          cadence, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid, output, scale)
    n = cu_seqlens.shape[0] - 1
    if output is None:
        output = torch.empty(q.shape[0], hs, fop.DIM, dtype=q.dtype, device=q.device)
    if output_final_state and final_state is None:
        final_state = torch.empty(n, hs, fop.DIM, fop.DIM, dtype=torch.float32, device=q.device)
    checkpoints = common.checkpoint_buffer(OP, output_state_checkpoints, cu_seqlens, cadence, hs, q.dtype)
    scale = fop.DIM ** -0.5 if scale is None else float(scale)
    args = (q, k, v, gate, beta, output, cu_seqlens, initial_state, final_state, checkpoints, cadence, scale,
            log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid)
    if runtime.direct_call(q, k, v, gate, beta, output, cu_seqlens, initial_state, final_state, checkpoints, a_log,
                           dt_bias):
        common.run(_FUNCTIONS, OP, *args)
        for t in (output, final_state, checkpoints):
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.cudnn_gdn_prefill_f16(*args)
    return output, final_state, checkpoints


_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::cudnn_gdn_prefill_f16", mutates_args=("output", "final_state", "checkpoints"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, beta: torch.Tensor,
               output: torch.Tensor, cu_seqlens: torch.Tensor, initial_state: torch.Tensor | None,
               final_state: torch.Tensor | None, checkpoints: torch.Tensor | None, cadence: int, scale: float,
               log_gate: bool, safe_gate: bool, a_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
               use_beta_sigmoid: bool) -> None:
    common.run(_FUNCTIONS, OP, q, k, v, gate, beta, output, cu_seqlens, initial_state, final_state, checkpoints,
               cadence, scale, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
