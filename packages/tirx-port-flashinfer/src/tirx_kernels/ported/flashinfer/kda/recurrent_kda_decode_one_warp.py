# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's recurrent KDA decode, one-warp schedule (T = 1, B * HV >= 128).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), flashinfer/kda_decode.py (recurrent_kda) and
# flashinfer/kda_kernels/recurrent_kda.py (recurrent_kda_decode_kernel), release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the TIRx template core.lang.delta_rule.
"""recurrent_kda (Kimi Delta Attention decode), one token, bf16 state pool ``[N, HV, 128, 128]`` in place: a warp
owns 16 value rows of one (request, head), 16 lanes x 8 keys a row, the state read and written once with 16-byte
vectors; per-channel gate (precomputed log gate, softplus or the lower-bound sigmoid), q/k L2 norm in the kernel."""

from __future__ import annotations

import torch

from tirx_kernels.ported.flashinfer.kda import _kda_decode as _impl
from tirx_kernels.ported.flashinfer.kda import _protocol as _proto
from tirx_kernels.ported.flashinfer.kda._kda_decode import recurrent_kda  # noqa: F401

KERNEL_META = {
    "name": "recurrent_kda_decode_one_warp",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "KDA recurrent decode, one token, one warp per 16 value rows, bf16 state pool in place",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
        {"package": "fla-core", "import": "fla", "specifier": "==0.6.0", "baseline": "fla"},
    ],
    "public_ops": ["recurrent_kda"],
}

# Every row has B * HV >= 128 (upstream's one-warp rule); the public op dispatches the others to the grouped kernel.
CONFIGS = [
    {"label": "hv16_b8_lb", "batch": 8},
    {"label": "hv12_b64_lb", "batch": 64, "n_heads": 12, "n_vheads": 12},
    {"label": "h8_hv16_b16_log_dense", "batch": 16, "n_heads": 8, "gate": "log", "form": "dense"},
    {"label": "hv16_b32_softplus_logit_src", "batch": 32, "gate": "softplus", "beta_logit": True, "source": True},
    {"label": "hv16_b16_lb_nobias_nol2_pad", "batch": 16, "dt_bias": False, "l2norm": False, "pad": True},
]

BENCH_CONFIGS = [
    {"label": "hv16_b8_lb", "batch": 8},
    {"label": "hv12_b64_lb", "batch": 64, "n_heads": 12, "n_vheads": 12},
    {"label": "hv16_b128_lb", "batch": 128},
    {"label": "hv32_b256_lb", "batch": 256, "n_vheads": 32},
]

DEFAULTS = dict(_proto.DEFAULTS)
INPLACE = _proto.INPLACE
COMPARATORS = _proto.COMPARATORS


def compile_params(**cfg) -> dict:
    return {"schedule": "one_warp", "max_tokens": 1}


def get_kernel(schedule: str = "one_warp", max_tokens: int = 1):
    return _impl.get_kernel(schedule, max_tokens)


def artifact_params() -> list[dict]:
    return [{"schedule": "one_warp", "max_tokens": 1}]


def call_samples(rng) -> list[dict]:
    shapes = ((16, 16), (12, 12), (8, 16), (32, 32), (4, 64))
    return [{**DEFAULTS, "batch": max(b, -(-128 // hv)), "n_heads": h, "n_vheads": hv, "gate": gate}
            for h, hv in shapes for gate in ("log", "softplus", "lower_bound")
            for b in (rng.choice([8, 64, 512]), rng.randint(1, 1024))]


def prepare_data(**cfg) -> dict:
    return _proto.prepare_data(**cfg)


def reference(**data) -> dict:
    return _proto.reference(**data)


def launch(cfg: dict, data: dict) -> None:
    _proto.launch(cfg, data)


def roofline(**cfg) -> dict:
    return _proto.roofline(**cfg)


def get_baselines(**cfg) -> dict:
    return _proto.get_baselines(**cfg)


@torch.library.custom_op("tirx::recurrent_kda_decode_one_warp", mutates_args=("pool", "output"))
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, pool: torch.Tensor,  # noqa: N803
        source: torch.Tensor | None, slots: torch.Tensor, source_index: torch.Tensor | None,
        num_accepted: torch.Tensor | None, output: torch.Tensor, scale: float, lower_bound: float,
        use_qk_l2norm: bool, gate_mode: str, beta_is_logit: bool) -> None:
    _impl.custom_op_body(q, k, v, g, beta, A_log, dt_bias, pool, source, slots, source_index, num_accepted, output,
                         scale, lower_bound, use_qk_l2norm, gate_mode, beta_is_logit)


@_op.register_fake
def _(*args) -> None:
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
