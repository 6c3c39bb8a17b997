# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's GDN-2 checkpoint recompute (python/cudnn/linear_attention/frost/kernel/gdn2_recompute_f16.py)
# to Hopper. Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), release v1.28.0, commit
# 1dbd2c09432dfd6cbf13a0ad85a071446398c082 (the seed's port followed aded9909c3c2a897fdbc7b5fd79fa53bc915f4f5); read
# for semantics only. The chunk pass and the state scan are tirx-native's KDA kernels (_kda_chunk's GDN-2 variant,
# _kda_scan).
"""cuDNN's GDN-2 recompute on Hopper: the state checkpoints (every 16 / 32 / 48 tokens) and / or the final state from
k, v and the three gates (no q, no output), what the GDN-2 backward consumes. Registered as
``cudnn_sm90_gdn2_recompute_f16``; the same path as ``cudnn_sm90_gdn2_prefill_f16`` with k standing in for q (the
scan's output goes to a scratch buffer). State heads max(Hk, Hv), bf16 / fp16."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.cudnn.linear_attention import _gdn2_common as common

KERNEL_META = {
    "name": "cudnn_sm90_gdn2_recompute_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "cuDNN GDN-2 checkpoint recompute (no q / o): wgmma chunk pass + wgmma state scan, checkpoints "
                   "every 16/32/48 tokens and final state, THD varlen, bf16/fp16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "public_ops": ["chunk_gdn2_recompute_sm90"],
}

CONFIGS = [
    {"label": "ragged_hk4_hv2_ckpt16_safe_l2", "Hq": 4, "Hk": 4, "Hv": 2, "seqs": "31+0+63+1+130", "init": True,
     "checkpoint": 16, "safe_gate": True, "beta_sigmoid": True, "l2norm": True, "cu_dtype": "int64", "final": False},
    {"label": "h2_ckpt32_bf16state", "Hq": 2, "Hv": 2, "seqs": "17+65+200", "init": True, "checkpoint": 32,
     "state_dtype": "bfloat16"},
    {"label": "final_only_h2", "Hq": 2, "Hv": 2, "seqs": "48+0+1", "init": True, "checkpoint": 0},
    {"label": "fp16_h2_ckpt48", "dtype": "float16", "Hq": 2, "Hv": 2, "seqs": "100+1", "init": True,
     "checkpoint": 48},
]

BENCH_CONFIGS = [
    {"label": "perf_b1_s8192_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "8192x1", "l2norm": True, "checkpoint": 16,
     "final": False},
    {"label": "perf_b4_s8192_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "8192x4", "l2norm": True, "checkpoint": 16,
     "final": False},
    {"label": "perf_b1_s8192_h16_l2", "Hq": 16, "Hv": 16, "seqs": "8192", "l2norm": True, "checkpoint": 16},
]

DEFAULTS = {"Hk": None, "cu_dtype": "int32", "init": False, "final": True, "state_dtype": "float32",
            "checkpoint": 0, "safe_gate": False, "beta_sigmoid": False, "l2norm": False,
            "dtype": "bfloat16"}  # _gdn2_common.DEFAULTS
TOLERANCE = common.TOLERANCE


def compile_params(**_) -> dict:
    """Nothing of a call changes the code (lengths, heads and flags are run-time); ``chunk`` is the other artifact."""
    return {"kernel": "scan"}


def get_kernel(kernel: str = "scan"):
    return common.get_kernel(kernel)


def artifact_params() -> list[dict]:
    return list(common.ARTIFACTS)


def call_samples(rng) -> list[dict]:
    return [{**DEFAULTS, "Hq": hk, "Hv": hv, "seqs": rng.choice(["1", "64", "0+17", "1000+3", "8192"]),
             "checkpoint": rng.choice([16, 32, 48]), "l2norm": rng.random() < 0.5, "init": rng.random() < 0.5}
            for hk, hv in ((1, 1), (16, 16), (64, 64), (16, 32), (8, 32), (4, 8)) * 4]


def sass_expect(kernel: str = "scan", **_) -> list[str]:
    """The chunk pass's 16-key strips (m64n16) on the tensor cores; the scan's products and its 3-D TMA loads; the
    chunk table's scans on shuffles."""
    if kernel == "chunk":
        return [r"HGMMA\.64x16x16\.F32\.BF16"]
    if kernel == "table":
        return [r"SHFL\.UP"]
    return [r"HGMMA\.64x64x16\.F32\.BF16", r"HGMMA\.64x128x16\.F32\.BF16", r"UTMALDG\.3D"]


def prepare_data(device: str = "cuda", **cfg) -> dict:
    return common.prepare_data(False, device=device, **cfg)


def reference(**data) -> dict:
    return common.reference(data, False)


def launch(cfg: dict, data: dict) -> None:
    chunk_gdn2_recompute_sm90(data["k"], data["v"], data["gate"], data["beta"], data["w"], data["cu_seqlens"],
                              data["initial_state"], data.get("final_state"),
                              checkpoint_every_n_tokens=data["checkpoint_every_n_tokens"],
                              output_state_checkpoints=data.get("checkpoints"), **common.option_kwargs(data))


def roofline(**cfg) -> dict:
    return common.roofline(False, **cfg)


def get_baselines(**cfg) -> dict:
    """None runnable on Hopper (cuDNN Frontend's GDN-2 kernels need sm100)."""
    return {}


OP = "chunk_gdn2_recompute_sm90"


def chunk_gdn2_recompute_sm90(k, v, gate, beta, w, cu_seqlens=None, initial_state=None, output_state=None, *,
                              checkpoint_every_n_tokens: int = 16, output_state_checkpoints=None,
                              use_qk_l2norm_in_kernel: bool = False, safe_gate: bool = False,
                              gate_lower_bound: float = -5.0, a_log=None, dt_bias=None,
                              use_beta_sigmoid: bool = False):
    """The checkpoints (allocated when not given) and, where ``output_state`` is given, the final state. Returns
    ``(checkpoints, output_state)``."""
    if cu_seqlens is None:
        raise checks.TirxInputError(f"{OP}: argument 'cu_seqlens': expected the cumulative sequence lengths, got None")
    cadence = checkpoint_every_n_tokens
    if not cadence and output_state is None:
        raise checks.TirxInputError(f"{OP}: argument 'output_state': expected a final-state tensor when "
                                    "checkpoint_every_n_tokens is 0 (nothing to write), got None")
    hs = common.check_inputs(OP, None, k, v, gate, beta, w, cu_seqlens, initial_state, output_state,
                             output_state_checkpoints, cadence, safe_gate, a_log, dt_bias, use_beta_sigmoid,
                             final_name="output_state")
    from tirx_kernels.ported.cudnn.linear_attention import _fwd_common

    checkpoints = _fwd_common.checkpoint_buffer(OP, output_state_checkpoints, cu_seqlens, cadence, hs, k.dtype)
    args = (k, v, gate, beta, w, cu_seqlens, initial_state, output_state, checkpoints, cadence, safe_gate, a_log,
            dt_bias, use_beta_sigmoid, use_qk_l2norm_in_kernel, gate_lower_bound)
    if runtime.direct_call(k, v, gate, beta, w, output_state, checkpoints):
        _run(*args)
        for t in (output_state, checkpoints):
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.cudnn_gdn2_recompute_f16(*args)
    return checkpoints, output_state


_FUNCTIONS = runtime.FunctionCache(__name__)


def _run(k, v, gate, beta, w, cu_seqlens, initial_state, output_state, checkpoints, cadence, safe_gate, a_log, dt_bias,
         use_beta_sigmoid, use_qk_l2norm, lower_bound):
    common.run(_FUNCTIONS, None, k, v, gate, beta, w, None, cu_seqlens, initial_state, output_state, checkpoints,
               cadence, 0.0, safe_gate, a_log, dt_bias, use_beta_sigmoid, use_qk_l2norm, lower_bound)


@torch.library.custom_op("tirx::cudnn_gdn2_recompute_f16", mutates_args=("output_state", "checkpoints"))
def _custom_op(k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, beta: torch.Tensor, w: torch.Tensor,
               cu_seqlens: torch.Tensor, initial_state: torch.Tensor | None, output_state: torch.Tensor | None,
               checkpoints: torch.Tensor | None, cadence: int, safe_gate: bool, a_log: torch.Tensor | None,
               dt_bias: torch.Tensor | None, use_beta_sigmoid: bool, use_qk_l2norm: bool, lower_bound: float) -> None:
    _run(k, v, gate, beta, w, cu_seqlens, initial_state, output_state, checkpoints, cadence, safe_gate, a_log, dt_bias,
         use_beta_sigmoid, use_qk_l2norm, lower_bound)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
