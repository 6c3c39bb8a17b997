# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update, multi-token (MTP, T = 1..8) decode, simple schedule.
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer),
# include/flashinfer/mamba/kernel_selective_state_update_mtp_simple.cuh,
# release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec). The kernel is the shared TIRx generator in
# _selective_state_update.py (one implementation for the six registered names, as issue 25 allows).
"""selective_state_update, T = 1..8 tokens (intermediate states optional) a request, the simple schedule: 64 state rows
a CTA, a row on 8 lanes (its 16-byte vectors interleaved), 4 rows a thread with every load issued first: the default
schedule, bundled for every state dtype, input dtype and dstate."""

from __future__ import annotations

from tirx_kernels.ported.flashinfer.mamba import _registered
from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as _impl
from tirx_kernels.ported.flashinfer.mamba._selective_state_update import selective_state_update  # noqa: F401

KERNEL_META = {
    "name": "selective_state_update_mtp_simple",
    "category": "ported.flashinfer",
    "runtime_cuda_archs": ["sm_90a"],
    "description": "Mamba-2 selective state update, T tokens, simple schedule, state pool in place",
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
    {"label": "b64_h64_d64_s128_t6_r8", "batch": 64, "T": 6},
    {"label": "b64_h64_d64_s128_t6_r8_inter", "batch": 64, "T": 6, "intermediate": True},
    {"label": "b64_h64_d128_s128_t4_r8", "batch": 64, "T": 4, "dim": 128},
    {"label": "b64_h64_d64_s256_t2_r8_state_f32", "batch": 64, "T": 2, "dstate": 256, "state_dtype": "float32"},
    {"label": "b8_h64_d64_s128_t8_r8_z_pad", "batch": 8, "T": 8, "z": True, "pad": True},
    {"label": "b64_h64_d64_s128_t1_r8", "batch": 64, "T": 1},
    {"label": "b64_h64_d64_s64_t3_r8", "batch": 64, "T": 3, "dstate": 64},
    {"label": "b64_h64_d64_s96_t6_r8", "batch": 64, "T": 6, "dstate": 96},
    {"label": "b64_h64_d64_s128_t6_r1", "batch": 64, "T": 6, "ngroups": 64},
    {"label": "b64_h64_d64_s128_t6_r64", "batch": 64, "T": 6, "ngroups": 1},
    {
        "label": "b64_h64_d64_s128_t6_r8_state_f16_f16_io",
        "batch": 64,
        "T": 6,
        "state_dtype": "float16",
        "dtype": "float16",
        "weight_dtype": "float16",
    },
    {
        "label": "b64_h64_d64_s128_t6_r8_inter_f32_i64",
        "batch": 64,
        "T": 6,
        "intermediate": True,
        "state_dtype": "float32",
        "index_dtype": "int64",
    },
    {"label": "b64_h64_d64_s128_t6_r8_dst", "batch": 64, "T": 6, "dst": True},
    {"label": "b64_h64_d64_s128_t4_r8_state_i16", "batch": 64, "T": 4, "state_dtype": "int16"},
    {
        "label": "b64_h64_d64_s128_t6_r8_nosoftplus_dt_bf16",
        "batch": 64,
        "T": 6,
        "dt_softplus": False,
        "weight_dtype": "bfloat16",
    },
    {
        "label": "b19_h32_d128_s256_t5_r4_z",
        "batch": 19,
        "T": 5,
        "nheads": 32,
        "ngroups": 8,
        "dim": 128,
        "dstate": 256,
        "z": True,
    },
]

BENCH_CONFIGS = [
    {"label": "b1_h64_d64_s128_t6_r8_statebf16_official", "batch": 1, "T": 6},
    {"label": "b512_h64_d64_s128_t6_r8_statebf16_official", "batch": 512, "T": 6},
    {"label": "b2048_h64_d64_s128_t6_r8_statebf16_official", "batch": 2048, "T": 6},
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
    "T": 6,
}

# The pool and the intermediate-state buffer are updated in place; their untouched slots are checked bit for
# bit (``state_comparator``).
INPLACE = {"state": "state", "intermediate_states_buffer": "intermediate_states_buffer", "state_scale": "state_scale"}
COMPARATORS = {
    "state": _impl.state_comparator("state", _impl.STATE_TOLERANCE),
    "intermediate_states_buffer": _impl.state_comparator("intermediate_states_buffer", _impl.STATE_TOLERANCE),
    "state_scale": _impl.state_comparator("state_scale", _impl.SCALE_TOLERANCE),
}

SCHEDULE = "mtp_simple"


(compile_params, get_kernel, artifact_params, call_samples, prepare_data, reference, launch, roofline,
 get_baselines) = _registered.protocol(SCHEDULE)
# The torch.library custom op tirx::selective_state_update_<SCHEDULE> and its register_fake (_registered.py).
# The public op dispatches to it.
_op = _registered.register_custom_op(SCHEDULE)

from tirx_kernels.core import harness  # noqa: E402

run_test, run_bench = harness.bind(__name__)
