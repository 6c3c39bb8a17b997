# SPDX-License-Identifier: Apache-2.0
"""``fp16_bf16_gemm``'s argument checks: every bad argument of ``gemm_nt`` / ``gemm_nn`` is a
``TirxInputError`` naming it (shape/dtype, then layout, then device)."""

from __future__ import annotations

import math

import torch

from tirx_kernels.core import checks
from tirx_kernels.gemm._select import _epilogue
from tirx_kernels.gemm._tiles import _DTYPES, TILE_CONFIGS

_OP = "gemm_nt"


def _fail(op: str, name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{op}: argument '{name}': expected {expected}, got {got}")


def _scalar(op: str, name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        _fail(op, name, "a finite Python float", repr(v))
    return float(v)


def _check_inputs(a, b, out, op: str = _OP, layout: str = "nt", bias=None, alpha=1.0, beta=0.0,
                  out_dtype=None, tile=None) -> tuple[float, float]:
    """Validate every argument (shape/dtype -> layout -> device); returns (alpha, beta) as floats."""
    checks.tensor(op, "a", a, dtypes=tuple(_DTYPES.values()), ndim=2, contiguous=True, cuda=False)
    checks.tensor(op, "b", b, ndim=2, cuda=False)
    checks.same_dtype(op, "a", a, b=b)
    if layout == "nt":
        checks.tensor(op, "b", b, shape=(None, a.shape[1]), contiguous=True, cuda=False)
        n = b.shape[0]
    else:
        checks.tensor(op, "b", b, shape=(a.shape[1], None), contiguous=True, cuda=False)
        n = b.shape[1]
    if out_dtype is not None and out_dtype not in (a.dtype, torch.float32):
        _fail(op, "out_dtype", f"None, {str(a.dtype).replace('torch.', '')} (the dtype of 'a') or float32",
              out_dtype)
    alpha = _scalar(op, "alpha", alpha)
    beta = _scalar(op, "beta", beta)
    if out is not None:
        checks.tensor(op, "out", out, shape=(a.shape[0], n), cuda=False)
        if out_dtype is None:
            checks.same_dtype(op, "a", a, out=out)
        elif out.dtype != out_dtype:
            _fail(op, "out", f"dtype {str(out_dtype).replace('torch.', '')} (out_dtype)",
                  str(out.dtype).replace("torch.", ""))
    elif beta != 0:
        _fail(op, "beta", "0 when 'out' is not given (beta != 0 reads out as C_in)", beta)
    if bias is not None:
        checks.tensor(op, "bias", bias, dtypes=(a.dtype, torch.float32), cuda=False)
        checks.tensor(op, "bias", bias, shape=(n,), cuda=False)
    if tile is not None and TILE_CONFIGS[tile].get("kind") == "gemv" and a.shape[0] > TILE_CONFIGS[tile]["tokens"]:
        _fail(op, "tile", f"a tile serving M = {a.shape[0]} rows of 'a' (a gemv tile serves M <= its "
              f"{TILE_CONFIGS[tile]['tokens']} tokens)", repr(tile))
    if tile is not None and TILE_CONFIGS[tile].get("kind") == "small_m" and n % 8:
        # (its reduction stores 4-column units: the last 1-7 columns of an odd N would be lost)
        _fail(op, "tile", f"a tile serving N = {n} (small-M tiles need N % 8 == 0)", repr(tile))
    if tile is not None and (TILE_CONFIGS[tile].get("kind") != "persistent" or TILE_CONFIGS[tile].get("stream_k")):
        od = out.dtype if out is not None else (out_dtype or a.dtype)
        if layout != "nt" or od != a.dtype or _epilogue(bias, alpha, beta) != "none":
            _fail(op, "tile", "a persistent tile without stream-K (layout nn, out_dtype float32, bias, alpha and "
                  "beta need the persistent kernel's epilogue)", repr(tile))
    checks.tensor(op, "a", a, cuda=True)
    others = {k: v for k, v in (("b", b), ("out", out), ("bias", bias)) if v is not None}
    checks.same_device(op, "a", a, **others)
    return alpha, beta
