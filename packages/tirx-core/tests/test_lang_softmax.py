# SPDX-License-Identifier: Apache-2.0
"""core.lang.softmax and wgmma.acc_as_rs_a: the accumulator -> RS A identity that lets attention keep P in registers
(every element of every k16 step's A fragment is, in the same thread, the accumulator element of the same row and
column), and the helpers' tracing. The online softmax itself runs in flash_attention4's emulated tests
(packages/tirx-port-misc/tests/test_flash_attention4_emulated.py) against an fp32 oracle."""

import pytest

pytest.importorskip("tvm", reason="core.lang builds TIRx: apache-tvm is needed")

from tirx_kernels.core.lang import wgmma  # noqa: E402


@pytest.mark.parametrize("n", [16, 64, 96, 128, 256])
def test_accumulator_is_the_rs_a_fragment_lane_for_lane(n):
    seen = set()
    for warp in range(4):
        for lane in range(32):
            for kk in range(n // 16):
                for i in range(4):
                    for e in range(2):
                        reg = wgmma.acc_as_rs_a(kk, i, e)
                        j, rem = divmod(reg, 4)
                        r, e2 = divmod(rem, 2)
                        assert wgmma.acc_index(j, r, e2) == reg
                        assert wgmma.acc_row(warp, lane, r) == wgmma.a_frag_row(warp, lane, i)
                        assert wgmma.acc_col(lane, j, e2) == kk * 16 + wgmma.a_frag_col(lane, i, e, "bfloat16")
                        if warp == 0 and lane == 0:
                            seen.add(reg)
    assert seen == set(range(wgmma.acc_regs(n)))  # every accumulator register feeds exactly one A element


def test_softmax_helpers_trace_into_a_kernel():
    pytest.importorskip("tvm")
    from tvm.script import tirx as T

    from tirx_kernels.core import build
    from tirx_kernels.core.lang import softmax

    @T.prim_func
    def probe(x_ptr: T.handle, y_ptr: T.handle):
        X = T.match_buffer(x_ptr, (128, 64), "float32")
        Y = T.match_buffer(y_ptr, (128, 34), "uint32")
        T.device_entry()
        tid = T.thread_id([128])
        s_acc = T.alloc_local((32,), "float32")
        p = T.alloc_local((16,), "uint32")
        row_max = T.alloc_local((2,), "float32")
        row_sum = T.alloc_local((2,), "float32")
        red = T.alloc_local((2,), "float32")
        for i in T.unroll(32):
            s_acc[i] = X[tid, i]
        softmax.init(row_max, row_sum)
        softmax.mask(s_acc, 64, lambda r, j, e: j * 8 + e > tid % 64)
        for r in T.unroll(2):
            softmax.update(s_acc, 64, r, row_max, row_sum, red, T.float32(0.5))
        softmax.pack_p(p, s_acc, 64, T.ptx.cvt.rn.bf16x2.f32)
        for i in T.unroll(16):
            Y[tid, i] = p[i]
        for r in T.unroll(2):
            inv, lse = softmax.finalize(r, row_max, row_sum, red, T.float32(0.5))
            Y[tid, 32 + r] = T.reinterpret("uint32", inv * lse)

    src = build.codegen(probe)
    assert src.count("__shfl_xor_sync") >= 4  # max and sum, two xor steps each
    assert "exp2f" in src and "log2f" in src


def test_p_offset_scales_the_weights_and_comes_off_the_lse():
    """``p_offset`` (FA3's FP8 Max_offset) lowers the exponent base and raises log2(sum) back by the same amount; 0
    emits exactly the unscaled code. The offset path runs against an fp32 oracle in flash_attention4_fp4's emulated
    tests (packages/tirx-port-misc/tests/test_flash_attention4_fp4_emulated.py)."""
    from tvm.script import tirx as T

    from tirx_kernels.core import build
    from tirx_kernels.core.lang import softmax

    def probe(offset):
        @T.prim_func
        def f(x_ptr: T.handle, y_ptr: T.handle):
            X = T.match_buffer(x_ptr, (128, 16), "float32")
            Y = T.match_buffer(y_ptr, (128, 10), "float32")
            T.device_entry()
            tid = T.thread_id([128])
            s_acc = T.alloc_local((8,), "float32")
            row_max = T.alloc_local((2,), "float32")
            row_sum = T.alloc_local((2,), "float32")
            red = T.alloc_local((2,), "float32")
            for i in T.unroll(8):
                s_acc[i] = X[tid, i]
            softmax.init(row_max, row_sum)
            for r in T.unroll(2):
                softmax.update(s_acc, 16, r, row_max, row_sum, red, T.float32(0.5), p_offset=offset)
            for i in T.unroll(8):
                Y[tid, i] = s_acc[i]
            for r in T.unroll(2):
                inv, lse = softmax.finalize(r, row_max, row_sum, red, T.float32(0.5), p_offset=offset)
                Y[tid, 8 + r] = inv * lse
        return build.codegen(f)

    plain, shifted = probe(0), probe(8)
    assert "log2f(red_ptr[0]) - 0x1p+3f" in shifted and "0x1p+3f" not in plain  # - 8 on the LSE
    assert shifted.count("0x1p+3f") >= 4  # and on the exponent base of both row halves


def test_fast_exp2_takes_each_weight_in_one_ex2_approx_ftz():
    """``fast_exp2`` replaces ``exp2f`` (which ptxas expands to a range check, two predicated FMULs and the MUFU) on
    every weight by one ``ex2.approx.ftz.f32``; the O rescale factor keeps ``exp2f``. Its values run against an fp32
    oracle in flash_attention4's emulated tests."""
    from tvm.script import tirx as T

    from tirx_kernels.core import build
    from tirx_kernels.core.lang import softmax

    def probe(fast):
        @T.prim_func
        def f(x_ptr: T.handle, y_ptr: T.handle):
            X = T.match_buffer(x_ptr, (128, 16), "float32")
            Y = T.match_buffer(y_ptr, (128, 8), "float32")
            T.device_entry()
            tid = T.thread_id([128])
            s_acc = T.alloc_local((8,), "float32")
            row_max = T.alloc_local((2,), "float32")
            row_sum = T.alloc_local((2,), "float32")
            red = T.alloc_local((2,), "float32")
            for i in T.unroll(8):
                s_acc[i] = X[tid, i]
            softmax.init(row_max, row_sum)
            for r in T.unroll(2):
                softmax.update(s_acc, 16, r, row_max, row_sum, red, T.float32(0.5), fast_exp2=fast)
            for i in T.unroll(8):
                Y[tid, i] = s_acc[i] + row_sum[i % 2]
        return build.codegen(f)

    plain, fast = probe(False), probe(True)
    assert "ex2.approx.ftz.f32" not in plain and plain.count("exp2f(") == 2 + 8
    assert "ex2.approx.ftz.f32" in fast and fast.count("exp2f(") == 2  # the two rescale factors
    assert fast.count("tvm_builtin_ptx_ex2_approx_ftz_f32(") == 1 + 8  # the helper and one call a weight
