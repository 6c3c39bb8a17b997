# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update, single-token (STP) decode, vertical schedule.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer),
# include/flashinfer/mamba/kernel_selective_state_update_stp.cuh,
# release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the shared TIRx generator in
# _selective_state_update.py (one implementation for the six registered names, as issue 25 allows).
"""selective_state_update, one token a request, the vertical schedule: 16 state rows a CTA (4x the CTAs of simple), 8
lanes a row, 2 rows a thread: fills the SMs at small batch (the op's auto choice below 264 simple CTAs)."""

from __future__ import annotations

from tirx_kernels.ported.flashinfer.mamba import _registered
from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as _impl
from tirx_kernels.ported.flashinfer.mamba._selective_state_update import selective_state_update  # noqa: F401

KERNEL_META = {
    "name": "selective_state_update_stp_vertical",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Mamba-2 selective state update, one token, vertical schedule, state pool in place",
    "upstream": {
        "project": "flashinfer",
        "url": "https://github.com/flashinfer-ai/flashinfer",
        "commit": "77039051b0be921788dc2784ec41423b558878ec",
    },
    "reference_requirements": [
        {"package": "flashinfer-python", "import": "flashinfer", "specifier": "==0.7.4", "baseline": "flashinfer"},
    ],
    "public_ops": ["selective_state_update"],
}

CONFIGS = [
    {"label": "b64_h64_d64_s128_r8", "batch": 64},
    {"label": "b64_h64_d128_s128_r8", "batch": 64, "dim": 128},
    {"label": "b64_h64_d64_s256_r8", "batch": 64, "dstate": 256},
    {"label": "b64_h64_d64_s128_r8_state_f32", "batch": 64, "state_dtype": "float32"},
    {"label": "b64_h64_d64_s128_r8_z_pad", "batch": 64, "z": True, "pad": True},
    {"label": "b1_h64_d64_s128_r8", "batch": 1},
]

BENCH_CONFIGS = [
    {"label": "b64_h64_d64_s128_r8", "batch": 64, "dim": 64, "dstate": 128},
    {"label": "b64_h64_d64_s256_r8", "batch": 64, "dim": 64, "dstate": 256},
    {"label": "b64_h64_d128_s128_r8", "batch": 64, "dim": 128, "dstate": 128},
    {"label": "b64_h64_d128_s256_r8", "batch": 64, "dim": 128, "dstate": 256},
]

DEFAULTS = {
    "nheads": 64,
    "dim": 64,
    "dstate": 128,
    "ngroups": 8,
    "state_dtype": "bfloat16",
    "dtype": "bfloat16",
    "weight_dtype": "float32",
    "z": False,
    "dt_bias": True,
    "dt_softplus": True,
    "pad": False,
    "index_dtype": "int32",
    "intermediate": False,
    "dst": False,
    "disable_state_update": False,
}

# The pool is updated in place; its untouched slots are checked bit for bit (``state_comparator``).
INPLACE = {"state": "state"}
COMPARATORS = {"state": _impl.state_comparator("state", _impl.STATE_TOLERANCE)}

SCHEDULE = "stp_vertical"


(compile_params, get_kernel, artifact_params, call_samples, prepare_data, reference, launch, roofline,
 get_baselines) = _registered.protocol(SCHEDULE)
# The torch.library custom op tirx::selective_state_update_<SCHEDULE> and its register_fake (_registered.py).
# The public op dispatches to it.
_op = _registered.register_custom_op(SCHEDULE)

from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
