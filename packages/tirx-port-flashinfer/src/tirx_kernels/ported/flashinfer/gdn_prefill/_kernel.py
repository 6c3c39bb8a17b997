# SPDX-License-Identifier: Apache-2.0
# Semantics and argument conventions follow FlashInfer's chunk_gated_delta_rule (flashinfer/gdn_prefill.py and the
# sm90 CuTe-DSL kernel flashinfer/gdn_kernels/delta_rule_dsl/delta_rule_sm90.py, flashinfer-python 0.7.4) and fla's
# chunk_gated_delta_rule (fla-core 0.6.0, fla/ops/gated_delta_rule); read, not copied.
"""The kernels of ``gdn_prefill_sm90`` and of ``gdn_cp_prefill_sm90``'s phase 1: tirx-core's chunked GDN forward
generator (``tirx_kernels.core.lang.gdn_chunk``, whose docstring has the schedule and the chunk products), variants
``"prefill"`` and ``"transition"``; cuDNN's GDN-1 port builds on the same generator."""

from __future__ import annotations

from tirx_kernels.core.lang.gdn_chunk import IDENTITY_SLOT, IO_DTYPES, LINEAR_GATE_FLOOR, LOG2E  # noqa: F401


def build_kernel(io: str, transition: bool = False):
    """The prefill kernel; ``transition=True``: the context-parallel phase-1 kernel (``_cp.py``, module docstring
    there), which writes no output and reads run bounds as pairs."""
    from tirx_kernels.core.lang import gdn_chunk

    return gdn_chunk.build_kernel(io, "transition" if transition else "prefill")
