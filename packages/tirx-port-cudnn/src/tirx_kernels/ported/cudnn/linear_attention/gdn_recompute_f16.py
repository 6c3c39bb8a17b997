# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's GDN-1 checkpoint recompute (chunk_gdn_recompute_sm100, the "frost" linear-attention kernel
# python/cudnn/linear_attention/frost/kernel/gdn_recompute_f16.py) to Hopper.
# Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), release v1.28.0, commit
# 1dbd2c09432dfd6cbf13a0ad85a071446398c082 (the seed's port followed aded9909c3c2a897fdbc7b5fd79fa53bc915f4f5); read
# for semantics only. The kernel is the TIRx generator in _fwd_kernel.py, mode "recompute".
"""cuDNN's GDN-1 state recompute on Hopper: re-runs the chunked Gated DeltaNet recurrence over k, v, gate and beta
(no q, no output) to regenerate the per-chunk state checkpoints the backward consumes ([count, H, V, K] in the I/O
dtype, checkpoint i of a sequence = the state entering token i * cadence) and / or the final state.

Registered as ``cudnn_sm90_gdn_recompute_f16`` (the seed's ``cudnn_sm100_gdn_recompute_f16``). The same generator as
``cudnn_sm90_gdn_prefill_f16`` without the Q loads, the aux's P tile and the output products: the state path is the
same arithmetic, so its checkpoints and final state equal the forward's bit for bit (a GPU test checks it). State
heads are max(Hk, Hv), as upstream."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.cudnn.linear_attention import _fwd_common as common
from tirx_kernels.ported.cudnn.linear_attention import _fwd_op as fop

KERNEL_META = {
    "name": "cudnn_sm90_gdn_recompute_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "cuDNN GDN-1 checkpoint recompute (the chunked forward's state path on wgmma, no q / o): per-chunk "
                   "state checkpoints and final state, THD varlen, fp16/bf16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "public_ops": ["chunk_gdn_recompute_sm90"],
}

# Correctness rows as the seed's pairwise cover: ragged batches with empty / 1-token sequences, the three cadences,
# the final state alone (cadence 0), every gate form, beta logits, bf16 states, int64 cu_seqlens, k / v head maps.
CONFIGS = [
    {"label": "ragged_hk4_hv2_ckpt64_safe", "Hq": 4, "Hk": 4, "Hv": 2, "seqs": "63+0+129+1", "init": True,
     "checkpoint": 64, "gate": "safe", "beta_sigmoid": True, "cu_dtype": "int64", "final": False},
    {"label": "fp16_hk2_hv4_ckpt128_linear_bf16state", "dtype": "float16", "Hq": 2, "Hk": 2, "Hv": 4,
     "seqs": "17+65+300", "init": True, "checkpoint": 128, "gate": "linear", "state_dtype": "bfloat16"},
    {"label": "h1_ckpt192", "Hq": 1, "Hv": 1, "seqs": "192+1+500+0", "checkpoint": 192, "final": False},
    {"label": "final_only_h2", "Hq": 2, "Hv": 2, "seqs": "63+0+129+1", "init": True, "checkpoint": 0},
    {"label": "perf_b1_s8192_h16_nostate", "Hq": 16, "Hv": 16, "seqs": "8192", "checkpoint": 64, "final": False},
]

# The seed's production sweep (the backward's regen call: h64, cadence 64; "state" seeds the recurrence and stores the
# final state too).
BENCH_CONFIGS = [
    {"label": "perf_b1_s8192_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "8192x1", "checkpoint": 64, "final": False},
    {"label": "perf_b4_s8192_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "8192x4", "checkpoint": 64, "final": False},
    {"label": "perf_b4_s32768_h64_state", "Hq": 64, "Hv": 64, "seqs": "32768x4", "checkpoint": 64, "init": True},
    {"label": "perf_b4_s2048_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "2048x4", "checkpoint": 64, "final": False},
]

DEFAULTS = {"dtype": "bfloat16", "Hk": None, "cu_dtype": "int32", "init": False, "final": True,
            "state_dtype": "float32", "checkpoint": 0, "gate": "log", "beta_sigmoid": False}  # _fwd_common.DEFAULTS
TOLERANCE = common.TOLERANCE


def compile_params(dtype: str = "bfloat16", **_) -> dict:
    return {"io": dtype}


def get_kernel(io: str):
    from tirx_kernels.ported.cudnn.linear_attention import _fwd_kernel

    return _fwd_kernel.build_kernel(io, "recompute")


def artifact_params() -> list[dict]:
    return [{"io": d} for d in common.IO_NAMES]


def call_samples(rng) -> list[dict]:
    return common.call_samples(rng, with_q=False)


def sass_expect(io: str, **_) -> list[str]:
    return [r"HGMMA\.64x64x16\.F32", r"HGMMA\.64x128x16\.F32", r"UTMALDG\.3D", r"USETMAXREG"]


def prepare_data(device: str = "cuda", **cfg) -> dict:
    return common.prepare_data(with_q=False, device=device, **cfg)


def reference(**data) -> dict:
    return common.reference(data, with_q=False)


def launch(cfg: dict, data: dict) -> None:
    chunk_gdn_recompute_sm90(data["k"], data["v"], data["gate"], data["beta"], data["cu_seqlens"],
                             data["initial_state"], data.get("final_state"),
                             checkpoint_every_n_tokens=data["checkpoint_every_n_tokens"],
                             output_state_checkpoints=data.get("checkpoints"), **common.gate_kwargs(data))


def roofline(**cfg) -> dict:
    return common.roofline(with_q=False, **cfg)


def get_baselines(**cfg) -> dict:
    """None runnable on Hopper: cuDNN Frontend's recompute needs sm100, fla has no checkpoint-only forward."""
    return {}


# ---------------------------------------------------------------------------------------------------------
# Public op
# ---------------------------------------------------------------------------------------------------------

OP = "chunk_gdn_recompute_sm90"


def chunk_gdn_recompute_sm90(k, v, gate, beta, cu_seqlens=None, initial_state=None, output_state=None, *,
                             checkpoint_every_n_tokens: int = 64, output_state_checkpoints=None,
                             log_gate: bool = True, safe_gate: bool = False, a_log=None, dt_bias=None,
                             use_beta_sigmoid: bool = False):
    """cuDNN's ``chunk_gdn_recompute_sm100`` on Hopper: the checkpoints (allocated when not given, which reads
    ``cu_seqlens`` on the host) and, where ``output_state`` is given, the final state. At least one of the two is
    required, as upstream. Returns ``(checkpoints, output_state)``."""
    if cu_seqlens is None:
        raise checks.TirxInputError(f"{OP}: argument 'cu_seqlens': expected the cumulative sequence lengths, got None")
    cadence = checkpoint_every_n_tokens
    if not cadence and output_state is None:
        fop.fail(OP, "output_state", "a final-state tensor when checkpoint_every_n_tokens is 0 (nothing to write)",
                 "None")
    hs = fop.check_inputs(OP, None, k, v, gate, beta, cu_seqlens, initial_state, output_state,
                          output_state_checkpoints, cadence, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid,
                          final_name="output_state")
    checkpoints = common.checkpoint_buffer(OP, output_state_checkpoints, cu_seqlens, cadence, hs, k.dtype)
    args = (k, v, gate, beta, cu_seqlens, initial_state, output_state, checkpoints, cadence, log_gate, safe_gate,
            a_log, dt_bias, use_beta_sigmoid)
    if runtime.direct_call(k, v, gate, beta, cu_seqlens, initial_state, output_state, checkpoints, a_log, dt_bias):
        _run(*args)
        for t in (output_state, checkpoints):
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.cudnn_gdn_recompute_f16(*args)
    return checkpoints, output_state


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(k, v, gate, beta, cu_seqlens, initial_state, output_state, checkpoints, cadence, log_gate, safe_gate, a_log,
         dt_bias, use_beta_sigmoid):
    common.run(_FUNCTIONS, OP, None, k, v, gate, beta, None, cu_seqlens, initial_state, output_state, checkpoints,
               cadence, 0.0, log_gate, safe_gate, a_log, dt_bias, use_beta_sigmoid)


@torch.library.custom_op("tirx::cudnn_gdn_recompute_f16", mutates_args=("output_state", "checkpoints"))
def _custom_op(k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor,
               initial_state: torch.Tensor | None, output_state: torch.Tensor | None,
               checkpoints: torch.Tensor | None, cadence: int, log_gate: bool, safe_gate: bool,
               a_log: torch.Tensor | None, dt_bias: torch.Tensor | None, use_beta_sigmoid: bool) -> None:
    _run(k, v, gate, beta, cu_seqlens, initial_state, output_state, checkpoints, cadence, log_gate, safe_gate, a_log,
         dt_bias, use_beta_sigmoid)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
