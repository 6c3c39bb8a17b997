# SPDX-License-Identifier: Apache-2.0
# Semantics and argument conventions follow cuDNN Frontend's GDN-1 linear-attention kernels
# (python/cudnn/linear_attention/frost/kernel/gdn_prefill_f16.py and gdn_recompute_f16.py,
# https://github.com/NVIDIA/cudnn-frontend, v1.28.0, commit 1dbd2c09432dfd6cbf13a0ad85a071446398c082); read, not
# copied.
"""The kernels of cuDNN's chunked GDN-1 forward (``cudnn_sm90_gdn_prefill_f16``) and of its checkpoint recompute
(``cudnn_sm90_gdn_recompute_f16``): tirx-core's chunked GDN forward generator (``tirx_kernels.core.lang.gdn_chunk``,
variants ``"checkpoint_prefill"`` / ``"checkpoint_recompute"``: gdn_prefill_sm90's schedule plus per-chunk state
checkpoints; its docstring has the contract). States are fp32 here (the op converts a bf16 initial / final state
around the launch); gate and beta are fp32 [T, H] (the op turns cuDNN's safe gate and beta logits into them). A
sequence's CTA without chunks (empty sequence) passes its initial state (or zero) to the final state."""

from __future__ import annotations

from tirx_kernels.core.lang.gdn_chunk import IO_DTYPES  # noqa: F401
from tirx_kernels.core.lang.gdn_layout import HAS_CKPT  # noqa: F401

MODES = ("prefill", "recompute")


def build_kernel(io: str, mode: str = "prefill"):
    from tirx_kernels.core.lang import gdn_chunk

    if mode not in MODES:
        raise ValueError(f"cudnn gdn: mode {mode!r} is not one of {MODES}")
    return gdn_chunk.build_kernel(io, "checkpoint_" + mode)
