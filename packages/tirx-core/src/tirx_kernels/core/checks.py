# SPDX-License-Identifier: Apache-2.0
"""Input validation for the public ops: every failure names the op, the argument and what was expected.

Checks run in the order shape/dtype -> layout -> device, so a CPU machine can exercise all of them
except alignment, which needs real data pointers and is checked in the op body (never on fake
tensors under ``torch.compile``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


class TirxInputError(ValueError):
    """A public op was given an argument it does not support."""


def _fail(op: str, name: str, expected: str, got: str) -> None:
    raise TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def tensor(
    op: str,
    name: str,
    t,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
    shape: Sequence[int | None] | None = None,
    inner_contiguous: bool = True,
    contiguous: bool = False,
    cuda: bool = True,
) -> torch.Tensor:
    """Validate one tensor argument; ``None`` entries of ``shape`` match any size."""
    if not isinstance(t, torch.Tensor):
        _fail(op, name, "a torch.Tensor", type(t).__name__)
    if dtypes is not None and t.dtype not in dtypes:
        _fail(op, name, f"dtype {_dtype_names(dtypes)}", str(t.dtype).replace("torch.", ""))
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            _fail(op, name, f"{' or '.join(map(str, allowed))} dimensions", f"shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            _fail(op, name, f"shape {want}", f"shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        _fail(op, name, "a contiguous tensor", f"strides {tuple(t.stride())}")
    if inner_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(op, name, "unit stride in the last dimension", f"strides {tuple(t.stride())}")
    if cuda and t.device.type != "cuda":
        _fail(op, name, "a CUDA tensor", f"device {t.device}")
    return t


def same_dtype(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.dtype != ref.dtype:
            _fail(op, name, f"dtype {_dtype_names([ref.dtype])} (the dtype of '{ref_name}')",
                  str(t.dtype).replace("torch.", ""))


def same_device(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != ref.device:
            _fail(op, name, f"device {ref.device} (the device of '{ref_name}')", f"device {t.device}")


def multiple_of(op: str, name: str, value: int, multiple: int, why: str) -> None:
    if value % multiple:
        _fail(op, name, f"a multiple of {multiple} ({why})", str(value))


def in_range(op: str, name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        _fail(op, name, f"a value in [{lo}, {hi}]", str(value))


def aligned(op: str, name: str, t: torch.Tensor, align_bytes: int = 16) -> None:
    """Data pointer and every non-unit stride a multiple of ``align_bytes`` (16-byte vectors, TMA)."""
    if t.data_ptr() % align_bytes:
        _fail(op, name, f"a data pointer aligned to {align_bytes} bytes", f"address 0x{t.data_ptr():x}")
    esize = t.element_size()
    for d in range(t.dim() - 1):
        if t.shape[d] > 1 and (t.stride(d) * esize) % align_bytes:
            _fail(op, name, f"strides that are multiples of {align_bytes} bytes",
                  f"strides {tuple(t.stride())} (elements of {esize} bytes)")
