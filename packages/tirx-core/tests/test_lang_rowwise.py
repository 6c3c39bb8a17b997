# SPDX-License-Identifier: Apache-2.0
"""``core.lang.rowwise``: a copy between rows of any alignment built from its helpers (chunks aligned to out,
x's two aligned vectors shifted down, the head and tail element by element), run on the CPU through
``core.emulate`` for every pair of alignments: each element copied, nothing else written, every 16-byte access
aligned and inside its allocation."""

import shutil

import pytest

pytest.importorskip("tvm")

import torch  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build, emulate  # noqa: E402
from tirx_kernels.core.lang import rowwise, vector  # noqa: E402

THREADS = 32


def _shifted_copy():
    """out[r, :] = x[r, :] for runtime n, strides and alignments: one CTA a row, a chunk a thread per trip."""

    @T.prim_func
    def shifted_copy(x_ptr: T.handle, y_ptr: T.handle):
        M = T.int32()
        n = T.int32()
        xs = T.int32()
        ys = T.int32()
        X = T.match_buffer(x_ptr, (M, n), "bfloat16", strides=(xs, 1), align=2)
        Y = T.match_buffer(y_ptr, (M, n), "bfloat16", strides=(ys, 1), align=2)
        T.device_entry()
        Xf = T.decl_buffer((M * xs,), "bfloat16", data=X.data)
        Yf = T.decl_buffer((M * ys,), "bfloat16", data=Y.data)
        row = T.cta_id([M])
        tid = T.thread_id([THREADS])
        xw = T.alloc_local((8,), "uint32")
        xr = T.alloc_local((4,), "uint32")
        tmp = T.alloc_local((6,), "uint32")
        x_base = T.Cast("int64", row) * T.Cast("int64", xs)
        y_base = T.Cast("int64", row) * T.Cast("int64", ys)
        ax = rowwise.row_misalign(X.data, x_base)
        ao = rowwise.row_misalign(Y.data, y_base)
        s = (ax - ao) & 7
        chunks = (ao + n + 7) >> 3
        for k in T.serial((chunks + THREADS - 1) // THREADS):
            with T.If(k * THREADS + tid < chunks):
                with T.Then():
                    c0 = ((k * THREADS + tid) << 3) - ao
                    start = x_base + T.Cast("int64", c0 - s)
                    vector.load_v4(xw, 0, Xf.ptr_to([start]), c0 + 8 - s > 0)
                    vector.load_v4(xw, 4, Xf.ptr_to([start + 8]), T.And(s > 0, c0 + 8 - s < n))
                    rowwise.shift_down(xr, xw, tmp, s)
                    with T.If(rowwise.chunk_inside(c0, n)):
                        with T.Then():
                            vector.store_v4(Yf.ptr_to([y_base + T.Cast("int64", c0)]), xr, 0)
                        with T.Else():
                            rowwise.store_elements(Yf, y_base, c0, n, xr, "bfloat16")

    return shifted_copy


def test_codegen_uses_vectors_in_the_middle():
    src = build.codegen(_shifted_copy())
    assert "ld_vec_global_v4_b32" in src and "st_vec_global_v4_b32" in src and "uint64_t)" in src


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("n", [1, 7, 8, 9, 23, 64, 300])
def test_every_alignment_pair_emulated(n):
    kern = emulate.compile(_shifted_copy())
    names = [p.name for p in kern.params]
    M = 3
    for x_off in range(8):
        for y_off in range(8):
            xs, ys = n + (x_off % 3), n + (y_off % 2)  # row strides that move the alignment row by row
            x = torch.randn(x_off + (M - 1) * xs + n).to(torch.bfloat16).as_strided((M, n), (xs, 1), x_off)
            yb = torch.full((y_off + (M - 1) * ys + n,), float("nan"), dtype=torch.bfloat16)
            y = yb.as_strided((M, n), (ys, 1), y_off)
            values = {"X_ptr": x, "Y_ptr": y, "M": M, "n": n, "xs": xs, "ys": ys}
            kern(*[values[name] for name in names], grid=(M,), block=(THREADS,)).check()
            assert torch.equal(y, x), (n, x_off, y_off)
            written = torch.zeros_like(yb, dtype=torch.bool)
            written.as_strided((M, n), (ys, 1), y_off).fill_(True)
            assert yb[~written].isnan().all(), (n, x_off, y_off)
