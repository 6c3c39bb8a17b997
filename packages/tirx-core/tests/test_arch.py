# SPDX-License-Identifier: Apache-2.0
"""Arch gating is checked before any build or launch, with a clear error."""

import pytest

from tirx_kernels.core import arch

META = {"name": "k", "runtime_cuda_archs": ["sm_90a"]}


def _fake_device(monkeypatch, cap, name="Fake GPU"):
    import torch

    arch._device_arch.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: cap)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)


def test_hopper_passes(monkeypatch):
    _fake_device(monkeypatch, (9, 0), "NVIDIA H200")
    assert arch.check_arch(META) == "sm_90a"
    arch._device_arch.cache_clear()


@pytest.mark.parametrize("cap, want", [((10, 0), "sm_100a"), ((8, 0), "sm_80"), ((8, 9), "sm_89")])
def test_other_archs_are_rejected(monkeypatch, cap, want):
    _fake_device(monkeypatch, cap, "NVIDIA Other")
    with pytest.raises(arch.UnsupportedArchError, match=f"verified on sm_90a only.*NVIDIA Other.*{want}"):
        arch.check_arch(META)
    arch._device_arch.cache_clear()


def test_no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(arch.NoCudaDeviceError):
        arch.check_arch(META)


def test_arch_regex():
    assert all(arch.ARCH_RE.match(a) for a in ("sm_90a", "sm_90", "sm_100a", "sm_120f"))
    assert not any(arch.ARCH_RE.match(a) for a in ("sm90a", "hopper", "sm_9", "SM_90A"))
