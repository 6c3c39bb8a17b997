# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update, single-token (STP) decode, simple schedule.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer),
# include/flashinfer/mamba/kernel_selective_state_update_stp.cuh,
# release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the shared TIRx generator in
# _selective_state_update.py (one implementation for the six registered names, as issue 25 allows).
"""selective_state_update, one token a request, the simple schedule: 64 state rows a CTA, a row on 8 lanes (its 16-byte
vectors interleaved), 4 rows a thread with every load issued first: the default schedule, bundled for every state
dtype, input dtype and dstate."""

from __future__ import annotations

from tirx_kernels.ported.flashinfer.mamba import _registered
from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as _impl
from tirx_kernels.ported.flashinfer.mamba._selective_state_update import selective_state_update  # noqa: F401

KERNEL_META = {
    "name": "selective_state_update_stp_simple",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Mamba-2 selective state update, one token, simple schedule, state pool in place",
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
    {"label": "b64_h64_d64_s64_r8", "batch": 64, "dstate": 64},
    {"label": "b64_h64_d64_s96_r8", "batch": 64, "dstate": 96},
    {"label": "b64_h64_d64_s128_r1", "batch": 64, "ngroups": 64},
    {"label": "b64_h64_d64_s128_r16", "batch": 64, "ngroups": 4},
    {"label": "b64_h64_d64_s128_r64", "batch": 64, "ngroups": 1},
    {"label": "b64_h64_d64_s128_r8_state_f16", "batch": 64, "state_dtype": "float16"},
    {
        "label": "b64_h64_d64_s128_r8_f16_io",
        "batch": 64,
        "state_dtype": "float16",
        "dtype": "float16",
        "weight_dtype": "float16",
    },
    {"label": "b64_h64_d64_s128_r8_nosoftplus", "batch": 64, "dt_softplus": False, "dt_bias": False},
    {"label": "b64_h64_d64_s128_r8_dt_bf16", "batch": 64, "weight_dtype": "bfloat16"},
    {"label": "b64_h64_d64_s128_r8_i64_dst", "batch": 64, "index_dtype": "int64", "dst": True},
    {"label": "b64_h64_d64_s128_r8_noupdate", "batch": 64, "disable_state_update": True},
    {"label": "b64_h64_d64_s128_r8_state_i16", "batch": 64, "state_dtype": "int16"},
    {"label": "b64_h64_d64_s128_r8_state_f16_sr", "batch": 64, "state_dtype": "float16", "stochastic": True},
    {"label": "b37_h24_d64_s96_r3_state_i16_z_pad_dst", "batch": 37, "nheads": 24, "dstate": 96,
     "state_dtype": "int16", "z": True, "pad": True, "dst": True},
    {
        "label": "b37_h24_d128_s96_r3_z_pad",
        "batch": 37,
        "nheads": 24,
        "ngroups": 8,
        "dim": 128,
        "dstate": 96,
        "z": True,
        "pad": True,
    },
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
    "stochastic": False,
}

# The pool is updated in place; its untouched slots are checked bit for bit (``state_comparator``).
INPLACE = {"state": "state", "state_scale": "state_scale"}
COMPARATORS = {"state": _impl.state_comparator("state", _impl.STATE_TOLERANCE),
               "state_scale": _impl.state_comparator("state_scale", _impl.SCALE_TOLERANCE)}

SCHEDULE = "stp_simple"


(compile_params, get_kernel, artifact_params, call_samples, prepare_data, reference, launch, roofline,
 get_baselines) = _registered.protocol(SCHEDULE)
# A stochastic-rounding call whose Philox rounds count has no unrolled artifact runs the rounds-as-argument one.
general_params = _impl.general_params
# The torch.library custom op tirx::selective_state_update_<SCHEDULE> and its register_fake (_registered.py).
# The public op dispatches to it.
_op = _registered.register_custom_op(SCHEDULE)

from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
