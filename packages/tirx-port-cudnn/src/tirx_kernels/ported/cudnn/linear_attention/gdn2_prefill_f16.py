# SPDX-License-Identifier: Apache-2.0
# Port of cuDNN Frontend's GDN-2 chunked forward (chunk_gdn2_sm100, the "frost" linear-attention kernel
# python/cudnn/linear_attention/frost/kernel/gdn2_prefill_f16.py) to Hopper.
# Upstream: cudnn-frontend (https://github.com/NVIDIA/cudnn-frontend), release v1.28.0, commit
# 1dbd2c09432dfd6cbf13a0ad85a071446398c082 (the seed's port followed aded9909c3c2a897fdbc7b5fd79fa53bc915f4f5); read
# for semantics only. The chunk pass and the state scan are tirx-native's KDA kernels (_kda_chunk's GDN-2 variant,
# _kda_scan).
"""cuDNN's GDN-2 forward on Hopper: o, the final state and state checkpoints (every 16 / 32 / 48 tokens) of Gated
DeltaNet 2 (per-key-channel decay and erase gate, per-value-channel write gate; ``core.gdn2_ref``) over THD-packed
sequences, K = V = 128, bf16 / fp16, GQA / GVA, safe gate, beta logits, q/k L2 norm, fp32 / bf16 states [N, H, V, K].

Registered as ``cudnn_sm90_gdn2_prefill_f16`` (the seed's ``cudnn_sm100_gdn2_prefill_f16``: tcgen05 with
``mma.sync`` 16-token chunks). Here: the gates, norms and head maps are elementwise torch; tirx-native's KDA chunk
kernel (its GDN-2 variant: per-key-channel erase gate) builds the 64-token WY operands of every chunk at once, its
scan kernel (wgmma, state in registers) walks the chunks, and torch advances the checkpoints inside a chunk
(``_gdn2_fwd``; a host read of ``cu_seqlens`` only when checkpoints are asked for). fp16 I/O through bf16 operands
(``_gdn2_common``)."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, harness, runtime
from tirx_kernels.ported.cudnn.linear_attention import _gdn2_common as common

KERNEL_META = {
    "name": "cudnn_sm90_gdn2_prefill_f16",
    "category": "ported.cudnn",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "cuDNN GDN-2 forward (per-key decay and erase gate, per-value write gate): wgmma chunk pass + "
                   "wgmma state scan, checkpoints every 16/32/48 tokens, THD varlen, GQA/GVA, bf16/fp16",
    "upstream": {
        "project": "cudnn-frontend",
        "url": "https://github.com/NVIDIA/cudnn-frontend",
        "commit": "1dbd2c09432dfd6cbf13a0ad85a071446398c082",
    },
    "public_ops": ["chunk_gdn2_sm90"],
}

CONFIGS = [
    {"label": "ragged_hq2_hv4_ckpt16_safe_l2", "Hq": 2, "Hk": 2, "Hv": 4, "seqs": "31+0+63+1+130", "init": True,
     "checkpoint": 16, "safe_gate": True, "beta_sigmoid": True, "l2norm": True, "cu_dtype": "int64"},
    {"label": "gqa_hq4_hk2_ckpt32_bf16state", "Hq": 4, "Hk": 2, "Hv": 2, "seqs": "17+65+200", "init": True,
     "checkpoint": 32, "state_dtype": "bfloat16"},
    {"label": "h4_ckpt48_nofinal", "Hq": 4, "Hv": 4, "seqs": "96+1+300", "final": False, "checkpoint": 48},
    {"label": "perf_b1_s8192_h16_l2", "Hq": 16, "Hv": 16, "seqs": "8192", "l2norm": True},
    {"label": "fp16_gva_hq2_hv4_ckpt16_safe", "dtype": "float16", "Hq": 2, "Hk": 2, "Hv": 4, "seqs": "17+0+1+80",
     "init": True, "checkpoint": 16, "safe_gate": True, "l2norm": True},
]

BENCH_CONFIGS = [
    {"label": "perf_b1_s8192_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "8192x1", "l2norm": True, "final": False},
    {"label": "perf_b4_s8192_h64_nostate", "Hq": 64, "Hv": 64, "seqs": "8192x4", "l2norm": True, "final": False},
    {"label": "perf_b4_s8192_h64_state", "Hq": 64, "Hv": 64, "seqs": "8192x4", "l2norm": True, "checkpoint": 16},
    {"label": "perf_b1_s8192_h16_l2", "Hq": 16, "Hv": 16, "seqs": "8192", "l2norm": True},
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
    return [{**DEFAULTS, "Hq": hq, "Hk": hq, "Hv": hv, "seqs": rng.choice(["1", "64", "0+17", "1000+3", "8192"]),
             "checkpoint": rng.choice([0, 16, 32, 48]), "l2norm": rng.random() < 0.5, "init": rng.random() < 0.5}
            for hq, hv in ((1, 1), (16, 16), (64, 64), (16, 32), (8, 32), (4, 8)) * 4]


def sass_expect(kernel: str = "scan", **_) -> list[str]:
    """The chunk pass's 16-key strips (m64n16) on the tensor cores; the scan's products and its 3-D TMA loads; the
    chunk table's scans on shuffles."""
    if kernel == "chunk":
        return [r"HGMMA\.64x16x16\.F32\.BF16"]
    if kernel == "table":
        return [r"SHFL\.UP"]
    return [r"HGMMA\.64x64x16\.F32\.BF16", r"HGMMA\.64x128x16\.F32\.BF16", r"UTMALDG\.3D"]


def prepare_data(device: str = "cuda", **cfg) -> dict:
    return common.prepare_data(True, device=device, **cfg)


def reference(**data) -> dict:
    return common.reference(data, True)


def launch(cfg: dict, data: dict) -> None:
    chunk_gdn2_sm90(data["q"], data["k"], data["v"], data["gate"], data["beta"], data["w"], data["output"],
                    data["cu_seqlens"], data["initial_state"], data.get("final_state"),
                    checkpoint_every_n_tokens=data["checkpoint_every_n_tokens"],
                    output_state_checkpoints=data.get("checkpoints"), **common.option_kwargs(data))


def roofline(**cfg) -> dict:
    return common.roofline(True, **cfg)


def get_baselines(**cfg) -> dict:
    """None runnable on Hopper: cuDNN Frontend's GDN-2 kernels need sm100 (FlashInfer's chunk_gated_delta_rule2 calls
    them); fla 0.6.0's gdn2 is not in the reference lock."""
    return {}


OP = "chunk_gdn2_sm90"


def chunk_gdn2_sm90(q, k, v, gate, beta, w, output=None, cu_seqlens=None, initial_state=None, final_state=None,
                    scale=None, *, checkpoint_every_n_tokens: int = 0, output_state_checkpoints=None,
                    use_qk_l2norm_in_kernel: bool = False, safe_gate: bool = False, gate_lower_bound: float = -5.0,
                    a_log=None, dt_bias=None, use_beta_sigmoid: bool = False, output_final_state: bool = False):
    """cuDNN's ``chunk_gdn2_sm100`` on Hopper (``_gdn2_common`` spells out the arguments). Returns
    ``(output, final_state, checkpoints)``."""
    if cu_seqlens is None:
        raise checks.TirxInputError(f"{OP}: argument 'cu_seqlens': expected the cumulative sequence lengths, got None")
    cadence = checkpoint_every_n_tokens
    hs = common.check_inputs(OP, q, k, v, gate, beta, w, cu_seqlens, initial_state, final_state,
                             output_state_checkpoints, cadence, safe_gate, a_log, dt_bias, use_beta_sigmoid, output,
                             scale)
    n = cu_seqlens.shape[0] - 1
    if output is None:
        output = torch.empty(q.shape[0], hs, common.DIM, dtype=q.dtype, device=q.device)
    if output_final_state and final_state is None:
        final_state = torch.empty(n, hs, common.DIM, common.DIM, dtype=torch.float32, device=q.device)
    from tirx_kernels.ported.cudnn.linear_attention import _fwd_common

    checkpoints = _fwd_common.checkpoint_buffer(OP, output_state_checkpoints, cu_seqlens, cadence, hs, q.dtype)
    scale = common.DIM ** -0.5 if scale is None else float(scale)
    if runtime.direct_call(q, k, v, gate, beta, w, output, final_state, checkpoints):
        common.run(_FUNCTIONS, q, k, v, gate, beta, w, output, cu_seqlens, initial_state, final_state, checkpoints,
                   cadence, scale, safe_gate, a_log, dt_bias, use_beta_sigmoid, use_qk_l2norm_in_kernel,
                   gate_lower_bound)
        for t in (output, final_state, checkpoints):
            if t is not None:
                runtime.mark_written(t)
    else:
        torch.ops.tirx.cudnn_gdn2_prefill_f16(q, k, v, gate, beta, w, output, cu_seqlens, initial_state, final_state,
                                              checkpoints, cadence, scale, safe_gate, a_log, dt_bias,
                                              use_beta_sigmoid, use_qk_l2norm_in_kernel, gate_lower_bound)
    return output, final_state, checkpoints


_FUNCTIONS = runtime.FunctionCache(__name__)


@torch.library.custom_op("tirx::cudnn_gdn2_prefill_f16", mutates_args=("output", "final_state", "checkpoints"))
def _custom_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, beta: torch.Tensor,
               w: torch.Tensor, output: torch.Tensor, cu_seqlens: torch.Tensor, initial_state: torch.Tensor | None,
               final_state: torch.Tensor | None, checkpoints: torch.Tensor | None, cadence: int, scale: float,
               safe_gate: bool, a_log: torch.Tensor | None, dt_bias: torch.Tensor | None, use_beta_sigmoid: bool,
               use_qk_l2norm: bool, lower_bound: float) -> None:
    common.run(_FUNCTIONS, q, k, v, gate, beta, w, output, cu_seqlens, initial_state, final_state, checkpoints,
               cadence, scale, safe_gate, a_log, dt_bias, use_beta_sigmoid, use_qk_l2norm, lower_bound)


@_custom_op.register_fake
def _(*args) -> None:
    return None


run_test, run_bench = harness.bind(__name__)
