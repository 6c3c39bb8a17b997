# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Gated DeltaNet decode, bf16 state pool, one token (the wide-vector T = 1 kernel).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_decode.py
# (gated_delta_rule_decode_pretranspose) and flashinfer/gdn_kernels/gdn_decode_bf16_state.py, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the TIRx generator in _gdn_decode.py.
"""gated_delta_rule_decode_pretranspose with a bf16 state pool ``[pool, HV, 128, 128]`` (K-last), T = 1: the
state read once and written once with 16-byte vectors, fp32 math, q/k L2 norm in the kernel; negative
indices read and write slot 0 (upstream's null buffer)."""

from __future__ import annotations

import torch

from tirx_kernels.ported.flashinfer.gdn_decode import _gdn_decode as _impl
from tirx_kernels.ported.flashinfer.gdn_decode._gdn_decode import gated_delta_rule_decode_pretranspose  # noqa: F401

KERNEL_META = {
    "name": "gdn_decode_bf16_wide_vec_t1",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Gated DeltaNet decode, one token, bf16 state pool in place, fp32 math",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["gated_delta_rule_decode_pretranspose"],
}

CONFIGS = [
    {"label": "b64_h16_hv32", "batch": 64},
    {"label": "b1_h16_hv32", "batch": 1},
    {"label": "b8_h16_hv16_pad", "batch": 8, "n_vheads": 16, "pad": True},
    {"label": "b33_h8_hv32_out_idx_i64", "batch": 33, "n_heads": 8, "out_index": True, "index_dtype": "int64"},
    {"label": "b64_h16_hv32_fp16", "batch": 64, "dtype": "float16"},
    {"label": "b64_h16_hv32_nol2norm_bias_bf16", "batch": 64, "use_qk_l2norm": False, "bias_dtype": "bfloat16"},
    {"label": "b19_h4_hv32_ab_f16", "batch": 19, "n_heads": 4, "ab_dtype": "float16"},
]

BENCH_CONFIGS = [
    {"label": "b1_h16_hv32", "batch": 1},
    {"label": "b64_h16_hv32", "batch": 64},
    {"label": "b256_h16_hv32", "batch": 256},
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
}

# The pool is updated in place; its untouched slots are checked bit for bit.
INPLACE = {"initial_state": "initial_state"}
COMPARATORS = {"initial_state": _impl.pool_comparator("initial_state")}

MTP = False


def compile_params(dtype: str, **_) -> dict:
    return {"input_dtype": dtype}


def get_kernel(input_dtype: str):
    return _impl.get_kernel(input_dtype, _impl.MAX_TOKENS if MTP else 1)


def artifact_params() -> list[dict]:
    return [{"input_dtype": d} for d in _impl.INPUT_DTYPES]


def call_samples(rng) -> list[dict]:
    return [{**DEFAULTS, "dtype": d, "batch": rng.choice([1, 3, 64, 512]), "n_heads": h, "n_vheads": hv,
             **({"T": rng.randint(2, _impl.MAX_TOKENS)} if MTP else {})}
            for d in _impl.INPUT_DTYPES for h, hv in ((16, 32), (8, 32), (16, 16), (4, 8), (32, 64)) for _ in range(2)]


def prepare_data(**cfg) -> dict:
    return _impl.prepare_data(MTP, **cfg)


def reference(**data) -> dict:
    return _impl.reference(**data)


def launch(cfg: dict, data: dict) -> None:
    _impl.launch(cfg, data)


def roofline(**cfg) -> dict:
    return _impl.roofline(**cfg)


def get_baselines(**cfg) -> dict:
    return _impl.get_baselines(**cfg)


@torch.library.custom_op("tirx::gdn_decode_bf16_wide_vec_t1", mutates_args=("pool", "output", "inter"))
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
        a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor, idx: torch.Tensor, out_idx: torch.Tensor | None,
        output: torch.Tensor, scale: float, use_qk_l2norm: bool, inter: torch.Tensor | None, update: bool) -> None:
    _impl.custom_op_body(q, k, v, pool, A_log, a, dt_bias, b, idx, out_idx, output, scale, use_qk_l2norm, inter,
                         update)


@_op.register_fake
def _(*args) -> None:
    return None


from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
