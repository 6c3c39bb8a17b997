# SPDX-License-Identifier: Apache-2.0
"""Host side of the distributed GEMMs (``allgather_gemm``, ``gemm_reduce_scatter``): ``tirx_kernels.core.symm`` (process
group, symmetric memory with NVLink multicast off, copy-engine signals, side streams) and the copy chunking."""

from __future__ import annotations

from tirx_kernels.core.symm import (  # noqa: F401 (the GEMMs' names for them)
    NO_MULTICAST_ENV,
    can_signal_without_sms,
    group_rank_size,
    no_multicast,
    side_stream,
    signal,
    symm_workspace,
)


def chunk_rows(shard_rows: int, block_m: int, chunks: int = 4) -> int:
    """Rows a copy (and its flag) moves: a shard in ``chunks`` pieces, each a whole number of M-tiles (at least
    one), so the GEMM starts on a shard's first tiles while the rest is still on its way."""
    per = -(-shard_rows // chunks)
    return max(block_m, -(-per // block_m) * block_m)
