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
