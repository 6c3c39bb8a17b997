# SPDX-License-Identifier: Apache-2.0
"""``core.lang.scan``: a CTA-wide prefix scan over an array of any length (tiles of the CTA's width, a running carry),
run on the CPU through ``core.emulate`` against torch's cumsum / cummax / cummin, bit for bit (integers, and fp32
maxima and minima, which are exact): inclusive, exclusive and total, for 1, 3 (not a power of two) and 32 warps,
lengths below, at and across tile boundaries. The max and min scans alternate between two regions of one scratch
buffer with no barrier of their own, as the KDA chunk table's scans do."""

import shutil

import pytest

pytest.importorskip("tvm", reason="core.lang builds TIRx: apache-tvm is needed")

import torch  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build  # noqa: E402
from tirx_kernels.core.lang import scan  # noqa: E402

WIDTHS = (32, 96, 1024)


def _scan_kernel(threads):
    """Y[0..2][j]: inclusive sum, exclusive sum, final total of X (int32); F[0..2][j]: the same of the running max of
    XF (fp32, carry ``low``); F[3][j]: the inclusive running min."""
    warps = scan.scratch_words(threads)

    @T.prim_func
    def scan_probe(x_ptr: T.handle, xf_ptr: T.handle, y_ptr: T.handle, f_ptr: T.handle, low: T.float32,
                   high: T.float32):
        m = T.int32()
        X = T.match_buffer(x_ptr, (m,), "int32", align=4)
        XF = T.match_buffer(xf_ptr, (m,), "float32", align=4)
        Y = T.match_buffer(y_ptr, (3, m), "int32", align=4)
        F = T.match_buffer(f_ptr, (4, m), "float32", align=4)
        T.device_entry()
        T.cta_id([1])
        tid = T.thread_id([threads])
        si = T.alloc_shared((2 * warps,), "int32")
        sf = T.alloc_shared((2 * warps,), "float32")
        s = T.alloc_local((3,), "int32")
        mx = T.alloc_local((3,), "float32")
        mn = T.alloc_local((3,), "float32")
        s[2] = 0
        mx[2] = low
        mn[2] = high
        for tile in range((m + threads - 1) // threads):
            j = tile * threads + tid
            x = T.if_then_else(j < m, X[T.min(j, m - 1)], 0)
            xf = T.if_then_else(j < m, XF[T.min(j, m - 1)], low)
            scan.cta_scan(x, tid, threads, si, s, "sum", carry=s[2])
            scan.cta_scan(xf, tid, threads, sf, mx, "max", carry=mx[2])
            scan.cta_scan(T.if_then_else(j < m, xf, high), tid, threads, sf, mn, "min", carry=mn[2],
                          scratch_offset=warps)
            if j < m:
                Y[0, j] = s[0]
                Y[1, j] = s[1]
                F[0, j] = mx[0]
                F[1, j] = mx[1]
                F[3, j] = mn[0]
        for j in range(m):
            if tid == 0:
                Y[2, j] = s[2]
                F[2, j] = mx[2]

    return scan_probe


@pytest.fixture(scope="module")
def emulated():
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import emulate

    return emulate.compile_module(build.codegen_many({f"w{t}": _scan_kernel(t) for t in WIDTHS}))


@pytest.mark.parametrize("threads", WIDTHS)
@pytest.mark.parametrize("m", [1, 5, 31, 32, 33, 95, 96, 97, 1024, 1025, 2500])
def test_cta_scan_matches_torch_emulated(emulated, threads, m):
    g = torch.Generator().manual_seed(m * 31 + threads)
    x = torch.randint(-1000, 1000, (m,), generator=g, dtype=torch.int32)
    xf = torch.randn(m, generator=g)
    y = torch.full((3, m), -99, dtype=torch.int32)
    f = torch.full((4, m), float("nan"))
    emulated(x, xf, y, f, -1e30, 1e30, function=f"w{threads}", hang_timeout=120.0).check()
    inc = torch.cumsum(x.long(), 0)
    exc = inc - x.long()
    assert torch.equal(y[0].long(), inc) and torch.equal(y[1].long(), exc)
    assert torch.equal(y[2].long(), torch.full((m,), int(x.long().sum())))
    cmax = torch.cummax(xf, 0).values
    assert torch.equal(f[0], cmax)
    assert torch.equal(f[1], torch.cat([torch.tensor([-1e30]), cmax[:-1]]))
    assert torch.equal(f[2], torch.full((m,), float(xf.max())))
    assert torch.equal(f[3], torch.cummin(xf, 0).values)


def test_cta_scan_rejects_bad_widths_and_ops():
    with pytest.raises(ValueError, match="multiple of 32"):
        scan.cta_scan(0, 0, 48, None, None)
    with pytest.raises(ValueError, match="one of"):
        scan.cta_scan(0, 0, 64, None, None, op="prod")
