# SPDX-License-Identifier: Apache-2.0
"""tirx_kernels.core.symm on the CPU: one rank without a group, NVLink multicast kept off through the environment
(never overriding what the caller set), and the signal fallback's contract."""

from tirx_kernels.core import symm


def test_no_group_is_one_rank():
    assert symm.group_rank_size(None) == (None, 0, 1)


def test_no_multicast_sets_only_unset_variables(monkeypatch):
    for k in symm.NO_MULTICAST_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    symm.no_multicast()
    import os

    assert {k: os.environ[k] for k in symm.NO_MULTICAST_ENV} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_can_signal_without_sms_is_a_bool():
    assert isinstance(symm.can_signal_without_sms(), bool)


def test_signal_hands_torch_a_uint32_view_of_int32_flags(monkeypatch):
    """torch's stream_write_value32 / memset32 refuse anything but a flat uint32 tensor (H100, torch 2.11)."""
    import torch

    seen = []

    class FakeSymm:
        @staticmethod
        def stream_write_value32(t, index, value):
            seen.append(("write", t.dtype, t.is_contiguous(), t.dim(), index, value))

        @staticmethod
        def memset32(t, offset, val, count):
            seen.append(("memset", t.dtype, t.is_contiguous(), t.dim(), offset, val))

    monkeypatch.setattr(symm, "_symm_class", lambda: FakeSymm)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    flags = torch.zeros(8, dtype=torch.int32)
    symm.signal(flags, 3, 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    symm.signal(flags, 5, 2)
    assert seen == [("write", torch.uint32, True, 1, 3, 1), ("memset", torch.uint32, True, 1, 5, 2)]
