# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Gated DeltaNet multi-token decode with an fp32 state pool (gated_delta_rule_mtp).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_decode.py
# (gated_delta_rule_mtp) and flashinfer/gdn_kernels/gdn_decode_mtp.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the TIRx generator in _gdn_decode.py.
"""gated_delta_rule_mtp: fp32 state pool ``[pool, HV, 128, 128]`` (K-last), T = 2..8 tokens (1 accepted), the
state kept in registers across the tokens, every token's state optionally into an fp32 intermediate buffer
``[B, >= T, HV, V, K]``. Schedule: a warp on each state row (one 16-byte fp32 vector a lane, full-warp dot
products), 2 or 4 rows a warp in flight (ILP 2 below ``WARP_ILP4_FROM_CTAS`` CTAs, else 4; both bundled), 4 warps
a CTA. As upstream's fp32 MTP API, a negative ``initial_state_indices`` entry skips the request (no state, buffer
or output write) and a negative ``output_state_indices`` entry writes back to the read slot."""

from __future__ import annotations

import torch

from tirx_kernels.ported.flashinfer.gdn_decode import _gdn_decode as _impl

KERNEL_META = {
    "name": "gdn_decode_fp32_mtp_warp",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Gated DeltaNet multi-token decode, fp32 state pool in place, a warp a row, ILP 2 / 4",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["gated_delta_rule_mtp"],
}

CONFIGS = [
    {"label": "t2_b4_h16_hv64_inter", "batch": 4, "T": 2, "n_vheads": 64, "intermediate": True},
    {"label": "t4_b64_h8_hv32", "batch": 64, "T": 4, "n_heads": 8},
    {"label": "t8_b8_h4_hv8_inter_out_idx", "batch": 8, "T": 8, "n_heads": 4, "n_vheads": 8, "intermediate": True,
     "out_index": True},
    {"label": "t3_b16_h16_hv32_fp16_nol2norm_inter_verify", "batch": 16, "T": 3, "dtype": "float16",
     "use_qk_l2norm": False, "intermediate": True, "disable_state_update": True},
    {"label": "t6_b5_h2_hv4_i64", "batch": 5, "T": 6, "n_heads": 2, "n_vheads": 4, "index_dtype": "int64"},
]

# The catalog's bench defaults (section 1.7), with the intermediate buffer speculative verification writes.
BENCH_CONFIGS = [
    {"label": "t2_b4_h16_hv64_inter", "batch": 4, "T": 2, "n_vheads": 64, "intermediate": True},
    {"label": "t4_b64_h8_hv32_inter", "batch": 64, "T": 4, "n_heads": 8, "intermediate": True},
    {"label": "t8_b256_h16_hv64_inter", "batch": 256, "T": 8, "n_vheads": 64, "intermediate": True},
]

DEFAULTS = {
    "n_heads": 16,
    "n_vheads": 32,
    "dtype": "bfloat16",
    "ab_dtype": "bfloat16",
    "bias_dtype": "float32",
    "use_qk_l2norm": True,
    "pad": False,
    "out_index": False,
    "index_dtype": "int32",
    "T": 4,
    "intermediate": False,
    "disable_state_update": False,
    "state_dtype": "float32",
}

# The pool and the intermediate buffer are updated in place; their untouched slots are checked bit for bit.
INPLACE = {"initial_state": "initial_state", "intermediate_states_buffer": "intermediate_states_buffer"}
COMPARATORS = {
    "initial_state": _impl.pool_comparator("initial_state"),
    "intermediate_states_buffer": _impl.pool_comparator("intermediate_states_buffer"),
}

ROUTE = "fp32_warp"


def compile_params(dtype: str, batch: int, n_vheads: int, **_) -> dict:
    return _impl.call_params(ROUTE, dtype, batch, n_vheads)


def get_kernel(input_dtype: str, ilp: int):
    return _impl.get_kernel(input_dtype, _impl.MAX_TOKENS, f"warp_ilp{ilp}", "float32")


def artifact_params() -> list[dict]:
    return [{"input_dtype": d, "ilp": i} for d in _impl.INPUT_DTYPES for i in (2, 4)]


def call_samples(rng) -> list[dict]:
    return [{**DEFAULTS, "dtype": d, "batch": rng.choice([1, 4, 64, 256]), "n_heads": h, "n_vheads": hv,
             "T": rng.randint(2, _impl.MAX_TOKENS)}
            for d in _impl.INPUT_DTYPES for h, hv in ((16, 64), (8, 32), (16, 32), (4, 8)) for _ in range(3)]


def prepare_data(**cfg) -> dict:
    return _impl.prepare_data(True, **cfg)


def reference(**data) -> dict:
    return _impl.reference(**data)


def launch(cfg: dict, data: dict) -> None:
    _impl.launch(cfg, data, ROUTE)


def roofline(**cfg) -> dict:
    return _impl.roofline(**cfg)


def get_baselines(**cfg) -> dict:
    return _impl.get_baselines(ROUTE, **cfg)


def gated_delta_rule_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b,  # noqa: N803
                         scale=None, output=None, intermediate_states_buffer=None, disable_state_update=False,
                         use_qk_l2norm=True, output_state_indices=None):
    """FlashInfer 0.7.4's ``gated_delta_rule_mtp`` (fp32 state pool, T tokens): returns ``(output, initial_state)``,
    the pool updated in place unless ``disable_state_update``."""
    return _impl.decode(ROUTE, q, k, v, None, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
                        initial_state_indices, output_state_indices, intermediate_states_buffer,
                        bool(disable_state_update))


@torch.library.custom_op("tirx::gdn_decode_fp32_mtp_warp", mutates_args=("pool", "output", "inter"))
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
        a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor, idx: torch.Tensor, out_idx: torch.Tensor | None,
        output: torch.Tensor, scale: float, use_qk_l2norm: bool, inter: torch.Tensor | None, update: bool) -> None:
    _impl.custom_op_body(q, k, v, pool, A_log, a, dt_bias, b, idx, out_idx, output, scale, use_qk_l2norm, inter,
                         update, ROUTE)


@_op.register_fake
def _(*args) -> None:
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
