# SPDX-License-Identifier: Apache-2.0
"""``fp16_bf16_gemm``'s host path from validated arguments to the kernel call: the odd-shape plan (``_run``: K % 8
padding, unaligned C rows), the loaded-function cache keyed by what picks the kernel (``_launch``), and the stream-K
tiles' workspace."""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime
from tirx_kernels.gemm._select import _epilogue, c_store, compile_params
from tirx_kernels.gemm._tiles import TILE_CONFIGS

# Stream-K tiles take a workspace, one partial tile per CTA and one flag per consumer warpgroup and CTA
# (gemm/_persistent.py, stream_k): the function cache appends it to their calls.
_STREAM_K_MAX_CTAS = 132
_WORKSPACE = runtime.StreamWorkspace(n_flags=2 * _STREAM_K_MAX_CTAS)


def workspace_floats(tile: str) -> int:
    """fp32 workspace a stream-K tile's launch needs: one block_m x block_n partial per CTA (0 for other tiles)."""
    cfg = TILE_CONFIGS[tile]
    if not cfg.get("stream_k"):
        return 0
    if cfg["num_sms"] > _STREAM_K_MAX_CTAS:
        raise ValueError(f"fp16_bf16_gemm: tile {tile!r}: the stream-K flags are sized for {_STREAM_K_MAX_CTAS} CTAs")
    return cfg["num_sms"] * cfg["block_m"] * cfg["block_n"]


def check_stream_k_residency(tile: str, sm_count: int) -> None:
    """Stream-K CTAs wait on each other's partials (flags), so all ``num_sms`` of them must be resident at once:
    on a part with fewer SMs (H100 PCIe: 114; H20; a MIG slice) the launch would deadlock. Refuse instead."""
    need = TILE_CONFIGS[tile].get("num_sms", 0)
    if TILE_CONFIGS[tile].get("stream_k") and sm_count < need:
        raise checks.TirxInputError(
            f"gemm: argument 'tile': expected a tile whose CTAs all fit this GPU ({sm_count} SMs), got stream-K tile "
            f"{tile!r}, which needs {need} CTAs resident at once")


def _with_workspace(fn, params: dict):
    """``fn`` itself, or for a stream-K tile ``fn`` with this device and stream's workspace and flags appended
    (after checking, once per device, that the device can hold every CTA of the tile at once)."""
    floats = workspace_floats(params["tile"])
    if not floats:
        return fn
    checked: set = set()

    def call(a, *args):
        if a.device.index not in checked:
            check_stream_k_residency(params["tile"], torch.cuda.get_device_properties(a.device).multi_processor_count)
            checked.add(a.device.index)
        return fn(a, *args, *_WORKSPACE.get(a.device, floats))

    return call


# The loaded artifacts are the registered module's (its compile params, its bundle).
_FUNCTIONS = runtime.FunctionCache("tirx_kernels.gemm.fp16_bf16_gemm", bind=_with_workspace)


def _out_cols(layout: str, b) -> int:
    """N: B's rows for NT, its columns for NN."""
    return b.shape[0] if layout == "nt" else b.shape[1]


def _new_out(layout: str, a: torch.Tensor, b: torch.Tensor, out_dtype) -> torch.Tensor:
    """The (M, N) output a call without ``out`` returns."""
    return torch.empty((a.shape[0], _out_cols(layout, b)), dtype=out_dtype or a.dtype, device=a.device)


def _tma_rows(t: torch.Tensor) -> bool:
    """Whether a TMA tensor map can address ``t``'s rows: base and row stride multiples of 16 bytes."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def _run(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None = None, layout: str = "nt",
         bias: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> None:
    op = "gemm_" + layout
    M, K = a.shape
    N = out.shape[1]
    if M == 0 or N == 0:
        return
    if K == 0:  # a tensor map cannot have a zero extent: out = beta * out + bias
        if beta == 0:
            out.zero_()
        else:
            out.mul_(beta)
        if bias is not None:
            out.add_(bias)
        return
    # The odd-shape plan (docs/gemm.md "Any M, N, K"). TMA needs 16-byte row strides: K % 8 pads A and B along K
    # with zeros (they add nothing; a copy of both operands, for a shape no model has); NN pads B's N columns (its
    # rows), so the kernel's N is then a multiple of 8 and its C the padded output below.
    if K % 8:
        a = torch.nn.functional.pad(a, (0, -K % 8))
        b = torch.nn.functional.pad(b, (0, -K % 8) if layout == "nt" else (0, 0, 0, -K % 8))
    if layout == "nn" and N % 8:
        b = torch.nn.functional.pad(b, (0, -N % 8))
    checks.aligned(op, "a", a)
    checks.aligned(op, "b", b)
    epilogue = _epilogue(bias, alpha, beta)
    name = {t: str(t).replace("torch.", "") for t in (a.dtype, out.dtype)}
    store = c_store(name[a.dtype], M, N, a.shape[1], tile, layout, name[out.dtype], epilogue, _tma_rows(out))
    if store == "tma" and (N % 8 or not _tma_rows(out)):
        # C rows not 16-byte aligned and no "stg" kernel for the call (a variant, or a gemv tile at M <= 8): the
        # kernel writes a 16-byte-aligned padded output (NT: a view of its first N columns, so the kernel's N is
        # N), copied into out after (one extra pass over C).
        n_kernel = _out_cols(layout, b)
        padded = torch.empty((M, -(-N // 8) * 8), dtype=out.dtype, device=out.device)
        dst = padded[:, :n_kernel]
        if beta != 0:
            dst[:, :N].copy_(out)
        if bias is not None and n_kernel != N:
            bias = torch.nn.functional.pad(bias, (0, n_kernel - N))
        _launch(op, a, b, dst, tile, layout, bias, alpha, beta, epilogue, "tma")
        out.copy_(padded[:, :N])
        return
    if store == "tma":
        checks.aligned(op, "out", out)
    _launch(op, a, b, out, tile, layout, bias, alpha, beta, epilogue, store)


def _launch(op: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tile: str | None, layout: str,
            bias: torch.Tensor | None, alpha: float, beta: float, epilogue: str, store: str) -> None:
    """The kernel call on operands the tensor maps can address (K % 8 == 0; C rows 16-byte aligned unless
    ``store`` is "stg")."""
    M, K = a.shape
    N = out.shape[1]
    bias_dtype = None if bias is None else bias.dtype

    def params_of():
        return compile_params(dtype=str(a.dtype).replace("torch.", ""), M=M, N=N, K=K, tile=tile, layout=layout,
                              out_dtype=str(out.dtype).replace("torch.", ""), epilogue=epilogue,
                              bias_dtype=None if bias is None else str(bias_dtype).replace("torch.", ""),
                              c_store=store)

    # What picks the kernel: the tile (choose_tile of M, N, K unless pinned), the variant and the C store; the device
    # for the arch check. One dict lookup per call after the first (runtime.FunctionCache).
    fn = _FUNCTIONS.get((layout, a.dtype, out.dtype, bias_dtype, epilogue, M, N, K, tile, store, a.get_device()),
                        params_of, a.device)
    args = [a, b, out]
    if bias is not None:
        args.append(bias)
    if epilogue in ("alpha_beta", "alpha_beta_bias"):
        args += [alpha, beta]
    fn(*args)
