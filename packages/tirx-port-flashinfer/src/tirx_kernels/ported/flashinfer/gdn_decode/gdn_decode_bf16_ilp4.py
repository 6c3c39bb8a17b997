# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Gated DeltaNet decode, bf16 state pool, the ILP-4 schedule (T = 1, 2, 4, 8).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_decode.py
# (gated_delta_rule_decode_pretranspose) and flashinfer/gdn_kernels/gdn_decode_bf16_state.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the TIRx generator in _gdn_decode.py.
"""gated_delta_rule_decode_pretranspose with a bf16 state pool ``[pool, HV, 128, 128]`` (K-last) on the ILP-4
schedule: a CTA owns 64 state rows of one (request, value head), each thread four independent rows whose 16-byte
state loads all issue before any math (twice the wide-vector schedule's loads in flight, half its CTAs): for the
small-batch, few-head calls where the wide-vector grid leaves the memory pipes idle. fp32 math, q/k L2 norm in the
kernel, T = 1..8 (the catalog's classes 1, 2, 4, 8), intermediate states; negative indices read and write slot 0."""

from __future__ import annotations

import torch

from tirx_kernels.ported.flashinfer.gdn_decode import _gdn_decode as _impl

KERNEL_META = {
    "name": "gdn_decode_bf16_ilp4",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Gated DeltaNet decode, bf16 state pool in place, 4 independent rows a thread, T = 1..8",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["gated_delta_rule_decode_ilp4"],
}

CONFIGS = [
    {"label": "t1_b64_h16_hv32", "batch": 64, "T": 1},
    {"label": "t2_b8_h2_hv4", "batch": 8, "T": 2, "n_heads": 2, "n_vheads": 4},
    {"label": "t4_b33_h8_hv32_inter_pad_out_idx_i64", "batch": 33, "T": 4, "n_heads": 8, "intermediate": True,
     "pad": True, "out_index": True, "index_dtype": "int64"},
    {"label": "t8_b16_h4_hv8_fp16_nol2norm_inter", "batch": 16, "T": 8, "n_heads": 4, "n_vheads": 8,
     "dtype": "float16", "use_qk_l2norm": False, "intermediate": True},
    {"label": "t4_b32_h16_hv32_inter_verify", "batch": 32, "T": 4, "intermediate": True,
     "disable_state_update": True},
]

# The catalog's bench defaults (section 1.7), plus a serving-size batch.
BENCH_CONFIGS = [
    {"label": "t1_b1_h2_hv4", "batch": 1, "T": 1, "n_heads": 2, "n_vheads": 4},
    {"label": "t4_b8_h4_hv8", "batch": 8, "T": 4, "n_heads": 4, "n_vheads": 8},
    {"label": "t8_b4_h8_hv16", "batch": 4, "T": 8, "n_heads": 8, "n_vheads": 16},
    {"label": "t4_b64_h16_hv32", "batch": 64, "T": 4},
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
    "T": 1,
    "intermediate": False,
    "disable_state_update": False,
}

# The pool and the intermediate buffer are updated in place; their untouched slots are checked bit for bit.
INPLACE = {"initial_state": "initial_state", "intermediate_states_buffer": "intermediate_states_buffer"}
COMPARATORS = {
    "initial_state": _impl.pool_comparator("initial_state"),
    "intermediate_states_buffer": _impl.pool_comparator("intermediate_states_buffer"),
}

ROUTE = "ilp4"


def compile_params(dtype: str, **_) -> dict:
    return {"input_dtype": dtype}


def get_kernel(input_dtype: str):
    return _impl.get_kernel(input_dtype, _impl.MAX_TOKENS, "ilp4")


def artifact_params() -> list[dict]:
    return [{"input_dtype": d} for d in _impl.INPUT_DTYPES]


def call_samples(rng) -> list[dict]:
    return [{**DEFAULTS, "dtype": d, "batch": rng.choice([1, 4, 8, 64]), "n_heads": h, "n_vheads": hv,
             "T": rng.choice([1, 2, 4, 8])}
            for d in _impl.INPUT_DTYPES for h, hv in ((2, 4), (4, 8), (8, 16), (16, 32)) for _ in range(3)]


def prepare_data(**cfg) -> dict:
    return _impl.prepare_data(True, **cfg)


def reference(**data) -> dict:
    return _impl.reference(**data)


def launch(cfg: dict, data: dict) -> None:
    _impl.launch(cfg, data, ROUTE)


def roofline(**cfg) -> dict:
    return _impl.roofline(**cfg)


def get_baselines(**cfg) -> dict:
    return _impl.get_baselines(**cfg)


def gated_delta_rule_decode_ilp4(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,  # noqa: N803
                                 use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                                 output_state_indices=None, intermediate_states_buffer=None,
                                 disable_state_update=False):
    """FlashInfer 0.7.4's ``gated_delta_rule_decode_pretranspose`` (bf16 state) on the ILP-4 schedule; returns
    ``(output, state)``, the state updated in place."""
    return _impl.decode(ROUTE, q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
                        initial_state_indices, output_state_indices, intermediate_states_buffer,
                        disable_state_update)


@torch.library.custom_op("tirx::gdn_decode_bf16_ilp4", mutates_args=("pool", "output", "inter"))
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
