# SPDX-License-Identifier: Apache-2.0
"""tirx_kernels.core.emulate's global atomics (module path): ``red.global.add`` (f32 scalar and .v4, s32), the
bulk reduction ``cp.reduce.async.bulk ... .add.f32`` from shared memory, and a 32-bit flag chain between CTAs
(``ld.acquire.gpu`` spin, ``st.relaxed.gpu`` publish: CTA i waits for flag i, which CTA i - 1 published; the
emulator runs CTAs in index order, so the chain completes as it does on the GPU when every CTA is resident). The
attention backward accumulates dQ with the bulk reduction and orders it with the flags (deterministic mode). One
g++ run (~15 s)."""

import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build, emulate  # noqa: E402
from tirx_kernels.core.lang import grid_flags  # noqa: E402

CTAS = 3


@T.prim_func
def atomics(x_ptr: T.handle, y_ptr: T.handle, i_ptr: T.handle, order_ptr: T.handle, flag_ptr: T.handle):
    X = T.match_buffer(x_ptr, (512,), "float32", align=16)
    Y = T.match_buffer(y_ptr, (512,), "float32", align=16)
    Ints = T.match_buffer(i_ptr, (128,), "int32", align=16)
    Order = T.match_buffer(order_ptr, (CTAS,), "int32", align=16)
    Flag = T.match_buffer(flag_ptr, (1,), "int32", align=16)
    T.device_entry()
    bx = T.cta_id([CTAS])
    tid = T.thread_id([128])
    pool = T.SMEMPool()
    S = pool.alloc((512,), "float32", align=1024)
    pool.commit()
    v = T.alloc_local((4,), "float32")
    seen = T.alloc_local((1,), "int32")
    for i in T.unroll(4):
        v[i] = T.Cast("float32", tid * 4 + i) + T.Cast("float32", bx) * T.float32(0.5)
    T.evaluate(T.ptx["red.global.add.v4.f32"](X.ptr_to([tid * 4]), v[0], v[1], v[2], v[3]))
    T.evaluate(T.ptx["red.global.add.f32"](X.ptr_to([(tid * 7) % 512]), T.float32(1)))
    T.evaluate(T.ptx["red.global.add.s32"](Ints.ptr_to([tid]), bx + 1))
    for i in T.unroll(4):
        S[tid * 4 + i] = v[i]
    T.cuda.cta_sync()
    if tid == 0:
        T.evaluate(T.ptx["cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"](Y.ptr_to([0]), S.ptr_to([0]),
                                                                                      T.uint32(2048)))
        T.evaluate(T.ptx.cp.async_.bulk.commit_group())
        T.evaluate(T.ptx["cp.async.bulk.wait_group.read"](0))
        grid_flags.wait_for(Flag.ptr_to([0]), bx, seen)
        Order[bx] = seen[0] * 10 + bx
        grid_flags.publish(Flag.ptr_to([0]), bx + 1)


def test_red_bulk_reduce_and_flag_chain():
    mod = emulate.compile_module(build.codegen(atomics))
    x, y = torch.randn(512), torch.randn(512)
    ints = torch.arange(128, dtype=torch.int32)
    order = torch.full((CTAS,), -1, dtype=torch.int32)
    flag = torch.zeros(1, dtype=torch.int32)
    x0, y0, i0 = x.clone(), y.clone(), ints.clone()
    mod(x, y, ints, order, flag, hang_timeout=60.0).check()
    per_cta = torch.stack([torch.arange(512, dtype=torch.float32) + 0.5 * b for b in range(CTAS)]).sum(0)
    hits = torch.zeros(512)
    hits.index_add_(0, (torch.arange(128) * 7) % 512, torch.ones(128))
    torch.testing.assert_close(x, x0 + per_cta + CTAS * hits, rtol=1e-6, atol=1e-5)  # fp32 sums in another order
    torch.testing.assert_close(y, y0 + per_cta, rtol=1e-6, atol=1e-5)
    assert torch.equal(ints, i0 + sum(range(1, CTAS + 1)))
    assert order.tolist() == [11 * b for b in range(CTAS)], "CTA b saw flag b (published by CTA b - 1)"
    assert flag.item() == CTAS
