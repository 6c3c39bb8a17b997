# SPDX-License-Identifier: Apache-2.0
"""Host side of the kernels that use peer memory (``tirx_kernels.gemm.allgather_gemm`` / ``gemm_reduce_scatter``,
``tirx_kernels.ported.deepep``): the process group, the peer buffers (torch symmetric memory), copy-engine signals
and side streams. Device side: ``core.lang.peer``.

Peer memory: torch's symmetric memory (``torch.distributed._symmetric_memory``) gives each rank a buffer every peer
maps; ``get_buffer(peer, ...)`` is a tensor of this device that reads and writes the peer's memory over NVLink.
NVLink multicast is never used (no ``multimem`` / NVLS, no multicast objects): :func:`no_multicast` sets
``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` (where the caller has
not set them) before a workspace is made; a process should set them before ``init_process_group`` too, NCCL reads its
variables once.
"""

from __future__ import annotations

import os

import torch

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def no_multicast() -> None:
    """Keep NVLink multicast off (NCCL, torch symmetric memory, NVSHMEM)."""
    for k, v in NO_MULTICAST_ENV.items():
        os.environ.setdefault(k, v)


def group_rank_size(group) -> tuple[str | None, int, int]:
    """``(group name, rank, world size)`` of a ``ProcessGroup`` (None: one rank, no group)."""
    if group is None:
        return None, 0, 1
    import torch.distributed as dist

    return group.group_name, dist.get_rank(group), dist.get_world_size(group)


def symm_workspace(group_name: str, nbytes: int):
    """This group's symmetric-memory workspace of at least ``nbytes`` (torch keeps one per group and grows it)."""
    no_multicast()
    from torch.distributed import _symmetric_memory as symm_mem

    if hasattr(symm_mem, "enable_symm_mem_for_group") and not symm_mem.is_symm_mem_enabled_for_group(group_name):
        symm_mem.enable_symm_mem_for_group(group_name)
    return symm_mem.get_symm_mem_workspace(group_name, nbytes)


def _symm_class():
    try:
        from torch._C._distributed_c10d import _SymmetricMemory
    except ImportError:
        return None
    return _SymmetricMemory


def can_signal_without_sms() -> bool:
    """Whether :func:`signal` writes its flag without a kernel (cuStreamWriteValue32 / a memset node): a flag a
    running persistent kernel spins on may then follow a copy on a side stream, with no SM needed."""
    cls = _symm_class()
    return cls is not None and hasattr(cls, "stream_write_value32") and hasattr(cls, "memset32")


def signal(flags: torch.Tensor, index: int, value: int = 1) -> None:
    """``flags[index] = value`` (int32) on the current stream after the work before it, by the stream's front end
    (``cuStreamWriteValue32``, which fences at system scope first; a memset node under graph capture): no SM, so
    a copy engine's copy and its flag never wait behind a running kernel. Where torch has neither: a fill kernel
    (the caller must then not overlap: :func:`can_signal_without_sms`)."""
    cls = _symm_class()
    if cls is not None and hasattr(cls, "stream_write_value32"):
        # torch's ops take a flat, contiguous uint32 tensor and refuse int32 ("input must be a flat, contiguous
        # uint32 tensor": allgather_gemm's bench rows on the H100, torch 2.11, 2026-12-07): the same bits.
        words = flags.view(torch.uint32) if flags.dtype == torch.int32 else flags
        if not torch.cuda.is_current_stream_capturing():
            cls.stream_write_value32(words, index, value)
            return
        if hasattr(cls, "memset32"):
            cls.memset32(words, offset=index, val=value, count=1)
            return
    flags[index:index + 1].fill_(value)


_STREAMS: dict = {}


def side_stream(device: torch.device, slot: int = 0) -> torch.cuda.Stream:
    """A high-priority side stream of ``device`` (copies and signals run there beside the GEMM); ``slot`` tells
    simulated ranks apart."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), slot)
    s = _STREAMS.get(key)
    if s is None:
        s = _STREAMS[key] = torch.cuda.Stream(device=device, priority=-1)
    return s
