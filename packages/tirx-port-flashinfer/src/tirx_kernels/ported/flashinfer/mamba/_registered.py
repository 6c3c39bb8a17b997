# SPDX-License-Identifier: Apache-2.0
"""What each of the six registered ``selective_state_update_<schedule>`` modules exposes beyond its literal
KERNEL_META / CONFIGS (which the registry reads without importing): the protocol functions bound to its schedule and
its ``tirx::selective_state_update_<schedule>`` custom op. One definition here instead of six copies."""

from __future__ import annotations

import functools

import torch

from tirx_kernels.ported.flashinfer.mamba import _selective_state_update as _impl


def protocol(schedule: str) -> tuple:
    """``(compile_params, get_kernel, artifact_params, call_samples, prepare_data, reference, launch, roofline,
    get_baselines)`` of the module that pins ``schedule``."""
    return (functools.partial(_impl.compile_params, schedule), _impl.get_kernel,
            functools.partial(_impl.artifact_params, schedule), functools.partial(_impl.call_samples, schedule),
            functools.partial(_impl.prepare_data, schedule), _impl.reference,
            functools.partial(_impl.launch, schedule), functools.partial(_impl.roofline, schedule),
            functools.partial(_impl.get_baselines, schedule))


def register_custom_op(schedule: str):
    """Define ``tirx::selective_state_update_<schedule>`` (the public op's arguments; state, out, the
    intermediate buffer and an int16 state's scales mutated) with a fake that returns nothing."""

    @torch.library.custom_op(f"tirx::selective_state_update_{schedule}",
                             mutates_args=("state", "out", "intermediate_states_buffer", "state_scale"))
    def op(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,  # noqa: N803
           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor | None,  # noqa: N803
           dt_bias: torch.Tensor | None, dt_softplus: bool, state_batch_indices: torch.Tensor | None,
           pad_slot_id: int, out: torch.Tensor, disable_state_update: bool,
           intermediate_states_buffer: torch.Tensor | None, intermediate_state_indices: torch.Tensor | None,
           cache_steps: int, dst_state_batch_indices: torch.Tensor | None,
           state_scale: torch.Tensor | None, rand_seed: torch.Tensor | None, philox_rounds: int) -> None:
        _impl.custom_op_body(schedule, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                             pad_slot_id, out, disable_state_update, intermediate_states_buffer,
                             intermediate_state_indices, cache_steps, dst_state_batch_indices, state_scale,
                             rand_seed, philox_rounds)

    @op.register_fake
    def _(*args) -> None:
        return None

    return op
