# SPDX-License-Identifier: Apache-2.0
"""Arch gating: a kernel runs only on the archs it was verified on (``KERNEL_META["runtime_cuda_archs"]``)."""

from __future__ import annotations

import functools
import re

ARCH_RE = re.compile(r"^sm_\d{2,3}[af]?$")

# Compute capabilities whose arch-specific ("a") features our builds use: sm_90a is Hopper's wgmma/setmaxnreg.
_ARCH_SPECIFIC = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a", (12, 0): "sm_120a"}


class UnsupportedArchError(RuntimeError):
    """The current device is not one of the archs the kernel was verified on."""


class NoCudaDeviceError(UnsupportedArchError):
    """No CUDA device is visible: nothing can be launched here."""


def arch_of_capability(major: int, minor: int) -> str:
    return _ARCH_SPECIFIC.get((major, minor), f"sm_{major}{minor}")


@functools.cache
def _device_arch(index: int) -> tuple[str, str]:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return arch_of_capability(major, minor), torch.cuda.get_device_name(index)


def _device_index(device) -> int:
    """The CUDA device index ``device`` names (a bare "cuda" or None: torch's current device)."""
    import torch

    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def current_arch(device=None) -> str:
    """The arch string of ``device`` (default: torch's current CUDA device), e.g. ``"sm_90a"``."""
    import torch

    if not torch.cuda.is_available():
        raise NoCudaDeviceError("no CUDA device is available (torch.cuda.is_available() is False)")
    index = _device_index(device)
    return _device_arch(index)[0]


def check_arch(meta: dict, device=None) -> str:
    """Raise ``UnsupportedArchError`` unless the device's arch is in ``meta["runtime_cuda_archs"]``."""
    arch = current_arch(device)
    allowed = meta["runtime_cuda_archs"]
    if arch not in allowed:
        index = _device_index(device)
        raise UnsupportedArchError(
            f"kernel '{meta['name']}' is verified on {', '.join(allowed)} only; "
            f"device {index} ({_device_arch(index)[1]}) is {arch}")
    return arch
