# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's recurrent KDA decode, grouped-CTA schedule (T = 1 at B * HV < 128; verification T = 2..8).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), flashinfer/kda_decode.py (recurrent_kda) and
# flashinfer/kda_kernels/recurrent_kda.py (_grouped_kda_kernel), release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the TIRx template core.lang.delta_rule.
"""recurrent_kda (Kimi Delta Attention decode), bf16 state pool ``[N, HV, 128, 128]`` in place: small-batch single
tokens and speculative verification (T = 2..8 with a state checkpoint per token and num_accepted_tokens picking the
state read). A CTA owns 32 value rows of one (request, head), 4 lanes a row at T = 1 (128 threads) and 2 at T > 1
(64 threads, 64 fp32 state values a thread); every token's q, k and gate are staged and normalized once per CTA."""

from __future__ import annotations

import torch

from tirx_kernels.ported.flashinfer.kda import _kda_decode as _impl
from tirx_kernels.ported.flashinfer.kda import _protocol as _proto
from tirx_kernels.ported.flashinfer.kda._kda_decode import recurrent_kda  # noqa: F401

KERNEL_META = {
    "name": "recurrent_kda_decode_grouped",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "KDA recurrent decode, small-batch T = 1 and verification T = 2..8, bf16 state pool in place",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["recurrent_kda"],
}

# T = 1 rows have B * HV < 128 (upstream's grouped rule); T > 1 always runs here.
CONFIGS = [
    {"label": "dec_hv16_b1", "batch": 1},
    {"label": "dec_h8_hv16_b4_softplus_logit_pad", "batch": 4, "n_heads": 8, "gate": "softplus", "beta_logit": True,
     "pad": True},
    {"label": "ver_t2_hv16_b16_nacc", "batch": 16, "T": 2, "num_accepted": True},
    {"label": "ver_t4_hv16_b8_nacc_pad", "batch": 8, "T": 4, "num_accepted": True, "pad": True},
    {"label": "ver_t8_hv12_b16", "batch": 16, "T": 8, "n_heads": 12, "n_vheads": 12},
    {"label": "ver_t3_h8_hv16_b4_log_src", "batch": 4, "T": 3, "n_heads": 8, "gate": "log", "source": True},
    {"label": "ver_t4_hv16_b4_dense_nol2", "batch": 4, "T": 4, "form": "dense", "l2norm": False, "dt_bias": False},
]

BENCH_CONFIGS = [
    {"label": "dec_hv16_b1", "batch": 1},
    {"label": "ver_t8_hv12_b16", "batch": 16, "T": 8, "n_heads": 12, "n_vheads": 12},
    {"label": "ver_t4_hv16_b64_nacc", "batch": 64, "T": 4, "num_accepted": True},
    {"label": "ver_t8_hv16_b128", "batch": 128, "T": 8},
]

DEFAULTS = dict(_proto.DEFAULTS)
INPLACE = _proto.INPLACE
COMPARATORS = _proto.COMPARATORS


def compile_params(T: int = 1, **_) -> dict:  # noqa: N803
    return {"schedule": "grouped_t1", "max_tokens": 1} if T == 1 else {"schedule": "grouped_mtp",
                                                                       "max_tokens": _impl.MAX_TOKENS}


def get_kernel(schedule: str = "grouped_mtp", max_tokens: int = _impl.MAX_TOKENS):
    return _impl.get_kernel(schedule, max_tokens)


def artifact_params() -> list[dict]:
    return [compile_params(T=1), compile_params(T=2)]


def call_samples(rng) -> list[dict]:
    shapes = ((16, 16), (12, 12), (8, 16), (32, 32), (4, 64))
    out = [{**DEFAULTS, "batch": rng.randint(1, max(1, 127 // hv)), "n_heads": h, "n_vheads": hv, "T": 1}
           for h, hv in shapes for _ in range(2)]
    return out + [{**DEFAULTS, "batch": rng.choice([1, 16, 128, 512]), "n_heads": h, "n_vheads": hv,
                   "T": rng.randint(2, _impl.MAX_TOKENS), "num_accepted": True} for h, hv in shapes for _ in range(3)]


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


@torch.library.custom_op("tirx::recurrent_kda_decode_grouped", mutates_args=("pool", "output"))
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
