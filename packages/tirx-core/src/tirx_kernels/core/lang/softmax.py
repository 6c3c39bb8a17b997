# SPDX-License-Identifier: Apache-2.0
"""Online softmax on a wgmma m64nN f32 accumulator fragment, for attention-like kernels (FlashAttention-3's
consumer loop; MLA, sparse and flex attention reuse it).

Layout facts (``core.lang.wgmma``): a thread holds two rows of the warpgroup's 64 (row half ``r`` = 0, 1), and in
each row two adjacent columns of every 8 (``acc_index(j, r, e)``); the 4 lanes of a quad hold one row together, so
a row reduction is the thread's own values then two xor shuffles.

Everything runs in the log2 domain (FA3): with ``scale_log2 = softmax_scale * log2(e)`` the exponent of a score is
one FFMA, ``exp2(s * scale_log2 - max * scale_log2)``. A row whose every score so far is -inf (masked) keeps max
-inf; its exponent base is taken as 0 so that exp2 sees -inf (giving 0), never -inf - -inf = NaN. The row sum stays
thread-local until :func:`finalize` (the rescale factors are equal across a quad, so the partial sums commute).

State per thread: ``row_max`` and ``row_sum`` (2 fp32 each, one per row half) and a 2-element fp32 scratch ``red``.
Helpers emit statements (``T.buffer_store`` / ``T.evaluate``) from traced Python, so they can be called inside
``T.unroll`` loops of a kernel body.
"""

from __future__ import annotations

import math

from tvm.script import tirx as T

from tirx_kernels.core.lang import wgmma

LOG2E = 1.4426950408889634
LN2 = math.log(2.0)
_FULL_MASK = 0xFFFFFFFF


def quad_reduce(x, op):
    """``op`` over the 4 lanes of a quad (one accumulator row): two xor shuffles (SHFL.BFLY). Written out rather
    than ``T.cuda.warp_max(x, 4)``, whose generated helper has no stand-in in the CPU emulator's module path."""
    x = op(x, T.cuda.__shfl_xor_sync(T.uint32(_FULL_MASK), x, 2, 32))
    return op(x, T.cuda.__shfl_xor_sync(T.uint32(_FULL_MASK), x, 1, 32))


def _add(a, b):
    return a + b


def init(row_max, row_sum):
    """Before the first key tile: max -inf, sum 0 for both row halves."""
    for r in range(2):
        T.buffer_store(row_max, T.float32(-math.inf), [r])
        T.buffer_store(row_sum, T.float32(0), [r])


def mask(s_acc, n: int, hidden):
    """Set to -inf the scores ``hidden(r, j, e)`` (a TIR predicate of row half, column block, element) names, over
    the ``n`` columns of the fragment."""
    for j in range(n // 8):
        for r in range(2):
            for e in range(2):
                idx = wgmma.acc_index(j, r, e)
                T.buffer_store(s_acc, T.Select(hidden(r, j, e), T.float32(-math.inf), s_acc[idx]), [idx])


def update(s_acc, n: int, r, row_max, row_sum, red, scale_log2, p_offset: int = 0, fast_exp2: bool = False):
    """One key tile for row half ``r``: the new row max (quad-reduced), scores replaced in place by their exp2
    weights, the running sum rescaled and increased. Leaves the rescale factor for the output accumulator in
    ``red[1]`` (``exp2((old max - new max) * scale_log2)``, 0 for a row that had seen nothing) and the exponent base
    in ``red[0]``.

    ``p_offset``: weights scaled by ``2**p_offset`` (in [0, 2**p_offset] instead of [0, 1]; the sum too, so out is
    unchanged and :func:`finalize` takes the same offset off the LSE). FA3's FP8 path uses 8: P rounded to e4m3
    keeps normal precision down to 2^-14 of the row max instead of 2^-6.

    ``fast_exp2``: the weights by ``ex2.approx.ftz.f32`` (one MUFU.EX2) instead of ``exp2f``, which nvcc lowers to
    the non-ftz ``ex2.approx.f32``: ptxas wraps each in a range check and two predicated FMULs for denormal
    results (4 instructions a weight; seen in the SASS of flash_attention4's hd128 kernel, 2026-12-07). Weights
    below 2^-126 of the row max become 0 instead of a denormal: nothing a 16-bit P or the fp32 sum can hold."""
    T.buffer_store(red, row_max[r], [0])
    for j in range(n // 8):
        for e in range(2):
            T.buffer_store(red, T.max(red[0], s_acc[wgmma.acc_index(j, r, e)]), [0])
    T.buffer_store(red, quad_reduce(red[0], T.max), [0])
    new_max = red[0]
    base = T.Select(new_max == T.float32(-math.inf), T.float32(0), new_max * scale_log2)
    T.buffer_store(red, T.exp2(row_max[r] * scale_log2 - base), [1])  # old max -inf: exp2(-inf) = 0
    T.buffer_store(row_max, new_max, [r])
    T.buffer_store(red, base - T.float32(p_offset) if p_offset else base, [0])
    T.buffer_store(row_sum, row_sum[r] * red[1], [r])
    for j in range(n // 8):
        for e in range(2):
            idx = wgmma.acc_index(j, r, e)
            if fast_exp2:
                T.evaluate(T.ptx.ex2.approx.ftz.f32(s_acc[idx], s_acc[idx] * scale_log2 - red[0]))
            else:
                T.buffer_store(s_acc, T.exp2(s_acc[idx] * scale_log2 - red[0]), [idx])
            T.buffer_store(row_sum, row_sum[r] + s_acc[idx], [r])


def rescale(o_acc, n: int, r, factor):
    """Multiply row half ``r`` of an m64nN output accumulator by ``factor`` (``red[1]`` after :func:`update`)."""
    for j in range(n // 8):
        for e in range(2):
            idx = wgmma.acc_index(j, r, e)
            T.buffer_store(o_acc, o_acc[idx] * factor, [idx])


def pack_p(p_frag, s_acc, n: int, cvt_pack):
    """The exp2 weights of an m64nN fragment as the RS A operand of the next wgmma: ``n / 4`` b32 registers, 4 per
    k16 step (:func:`wgmma.acc_as_rs_a`); ``cvt_pack`` is ``T.ptx.cvt.rn.bf16x2.f32`` or its f16 form."""
    for kk in range(n // 16):
        for i in range(4):
            T.evaluate(cvt_pack(p_frag[kk * 4 + i], s_acc[wgmma.acc_as_rs_a(kk, i, 1)],
                                s_acc[wgmma.acc_as_rs_a(kk, i, 0)]))


def finalize(r, row_max, row_sum, red, scale_log2, p_offset: int = 0):
    """After the last key tile, for row half ``r``: the quad's total sum in ``red[0]``; returns ``(inv, lse)``, the
    factor that normalises the output (0 for a row that saw no key) and the natural-log LSE (-inf there);
    ``p_offset`` as given to :func:`update`."""
    T.buffer_store(red, quad_reduce(row_sum[r], _add), [0])
    seen = red[0] > T.float32(0)
    inv = T.Select(seen, T.float32(1) / red[0], T.float32(0))
    log2_sum = T.log2(red[0]) - T.float32(p_offset) if p_offset else T.log2(red[0])
    lse = T.Select(seen, (row_max[r] * scale_log2 + log2_sum) * T.float32(LN2), T.float32(-math.inf))
    return inv, lse
