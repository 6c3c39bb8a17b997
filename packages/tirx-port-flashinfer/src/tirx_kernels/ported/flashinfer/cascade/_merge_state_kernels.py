# SPDX-License-Identifier: Apache-2.0
# The TIRx functions of merge_state (FlashInfer's MergeStateKernel, MergeStateInPlaceKernel and MergeStatesKernel,
# include/flashinfer/attention/cascade.cuh, release v0.7.4, commit 77039051b0be921788dc2784ec41423b558878ec),
# written anew; the semantics are in merge_state.py's docstring.
"""``build(op, dtype, pdl)``: the three merge kernels (their launch geometry: ``merge_state.plan``).

Geometry (all run-time, one artifact per (op, dtype)): a row (one position, one head) is ``2**lt`` consecutive
threads of a 128-thread CTA (``lt = log2_tpr``: the power of two >= D / 8), one 16-byte vector of every state a
thread. The CTA's ``128 >> lt`` row slots are ``2**lh`` heads (``lh``: ``log2_hpc``, as many as H fills, up to
all slots) times ``2**lp`` positions (``lp = 7 - lt - lh``); the grid is (position blocks, head blocks), so a
thread finds its row with shifts and masks: ``pos = (bx << (lp + lu)) + (slot >> lh)``,
``head = (by << lh) + (slot & (2**lh - 1))``. The flat grid this replaces divided the row index by H (a signed
32-bit division: 99 SASS instructions before the first load of the fp16 pair kernel). The row offsets
(64-bit: position x stride + head x stride) are computed before the PDL wait, so they overlap the previous kernel.

``lu`` (``log2_rpt``, 0 or 1; the pair and in-place kernels): a thread takes ``2**lu`` rows, the second
``2**lp`` positions after the first, and issues the LSE and 16-byte loads of both before any math
(``vector.after_all``): 4 vectors in flight a thread instead of 2 and half the CTAs (s2048 h32 d128: 4096 CTAs
instead of 8192, ~2 waves of 16 resident CTAs on 132 SMs). ``merge_state.plan`` picks it from the grid size;
merge_states keeps one row a thread (its loop has 4 states in flight a trip). Each ``lu`` has its own
straight-line path (a uniform branch on the argument). SASS of the fp16 pair kernel (nvcc 13): one row a thread,
the first load ~55 instructions in and the fourth ~81 (the flat grid's first came after 99); two rows, the eighth
at 116; 36 registers, no spills.
"""

from __future__ import annotations

from tvm.script import tirx as T

from tirx_kernels.core.lang import pdl as pdl_launch
from tirx_kernels.core.lang import vector

from .merge_state import _NEG_INF as NEG_INF
from .merge_state import _VEC as VEC
from .merge_state import ROWS_PER_THREAD, STATES_PER_TRIP, THREADS

# ---------------------------------------------------------------------------------------------------------
# Row pieces, shared by the three kernels
# ---------------------------------------------------------------------------------------------------------

def _int64(x):
    return T.Cast("int64", x)


def _load_state(sl, vw, k, Vf, voff, Sf, soff, row_ok, ok):
    """Slot ``k``: ``sl[k]`` <- the LSE (-inf where the row is out of range), ``vw[4k:4k+4]`` <- the 16-byte
    vector (0 where the lane is out of range, so that no NaN of a stale register reaches the sums)."""
    T.buffer_store(sl, T.float32(NEG_INF), [k])
    with T.If(row_ok):
        with T.Then():
            T.buffer_store(sl, Sf[soff], [k])
    vector.fill(vw, 4 * k, 4)
    vector.load_v4(vw, 4 * k, Vf.ptr_to([voff]), ok)


def _fold(dtype, sl, vw, K, acc, st, dep, first, k0=0, r=0):
    """Merge the ``K`` loaded slots ``k0 .. k0 + K - 1`` into row ``r``'s running state: ``st[5r]`` the max LSE
    so far (-inf: nothing yet), ``st[5r + 1]`` the sum of weights relative to ``st[5r + 2]`` (the max, or 0 where
    it is -inf, so that exp2 never sees ``-inf - -inf``), ``acc[8r:8r + 8]`` the unnormalized weighted sum of v;
    ``first``: no state before these slots."""
    neg_inf = T.float32(NEG_INF)
    a, s0 = 8 * r, 5 * r
    mx = sl[k0]
    for k in range(1, K):
        mx = T.max(mx, sl[k0 + k])
    if not first:
        mx = T.max(mx, st[s0])
    T.buffer_store(st, mx, [s0 + 3])
    T.buffer_store(st, T.Select(st[s0 + 3] == neg_inf, T.float32(0), st[s0 + 3]), [s0 + 2])
    for k in range(K):
        T.buffer_store(sl, T.exp2(sl[k0 + k] - st[s0 + 2]), [k0 + k])
    total = sl[k0]
    for k in range(1, K):
        total = total + sl[k0 + k]
    if first:
        T.buffer_store(st, total, [s0 + 1])
    else:
        T.buffer_store(st, T.exp2(st[s0] - st[s0 + 2]), [s0 + 4])  # rescale of the old sums (0 if they were empty)
        T.buffer_store(st, st[s0 + 1] * st[s0 + 4] + total, [s0 + 1])
    T.buffer_store(st, st[s0 + 3], [s0])
    for j in range(vector.WORDS_PER_VECTOR):
        halves = [vector.unpack2(vw[4 * (k0 + k) + j] ^ dep, dtype) for k in range(K)]
        for h in range(2):
            i = 2 * j + h
            s = sl[k0] * halves[0][h]
            for k in range(1, K):
                s = s + sl[k0 + k] * halves[k][h]
            T.buffer_store(acc, s if first else acc[a + i] * st[s0 + 4] + s, [a + i])


def _finish(dtype, acc, st, orr, Vo, vo_off, So, so_off, ok, s_ok, r=0):
    """Normalize and store row ``r``: v = acc / sum (0 for an all-empty row), s = max + log2(sum) (-inf there)."""
    a, s0 = 8 * r, 5 * r
    T.buffer_store(st, T.Select(st[s0 + 1] > T.float32(0), T.float32(1) / st[s0 + 1], T.float32(0)), [s0 + 4])
    for j in range(vector.WORDS_PER_VECTOR):
        vector.pack2(orr, j, acc[a + 2 * j] * st[s0 + 4], acc[a + 2 * j + 1] * st[s0 + 4], dtype)
    vector.store_v4(Vo.ptr_to([vo_off]), orr, 0, ok)
    with T.If(s_ok):
        with T.Then():
            T.buffer_store(So, st[s0 + 2] + T.log2(st[s0 + 1]), [so_off])


def _rows(tid, bx, by, lt, lh, lp, lu, S, H, idx, n_rows):
    """Store the thread's row indices in ``idx`` (int32 locals): ``idx[0]`` its lane, ``idx[1]`` its head,
    ``idx[2 + u]`` the position of its row ``u`` (``2**lp`` positions apart); returns the rows' in-range
    conditions (row u > 0 only where ``lu >= u``). Computed before the PDL wait: no global access."""
    slot = tid >> lt
    T.buffer_store(idx, tid & ((1 << lt) - 1), [0])
    T.buffer_store(idx, (by << lh) + (slot & ((1 << lh) - 1)), [1])
    T.buffer_store(idx, (bx << (lp + lu)) + (slot >> lh), [2])
    for u in range(1, n_rows):
        T.buffer_store(idx, idx[2] + (u << lp), [2 + u])
    oks = [T.And(idx[1] < H, idx[2] < S)]
    for u in range(1, n_rows):
        oks.append(T.And(T.And(lu >= u, idx[1] < H), idx[2 + u] < S))
    return oks


def _offset(idx, u, stride_pos, stride_head):
    """64-bit element offset of row ``u`` (without the lane's column)."""
    return _int64(idx[2 + u]) * _int64(stride_pos) + _int64(idx[1]) * _int64(stride_head)


def _pair_rows(dtype, U, idx, row_oks, D, sl, vw, acc, st, orr, dep, zero, a, b, out, mask=None):  # noqa: N803
    """The pair and in-place kernels' body after the PDL wait: the LSE and vector loads of the thread's ``U``
    rows from states ``a`` and ``b`` (each ``(v, s, v pos stride, v head stride, s pos stride, s head
    stride)``), all issued before any math, the folds, and the stores into ``out``. ``mask``:
    ``(mask buffer, its stride, use_mask, keep locals)``: the in-place form, whose stores wait for a barrier
    (lane 0 overwrites a row's s, which every lane of the row, one CTA, reads) and skip the masked positions."""
    col = _int64(idx[0] * VEC)
    lane_ok = idx[0] * VEC < D
    keep = [None] * U
    if mask is not None:
        Mf, m0, use_mask, kp = mask  # noqa: N806
        for u in range(U):
            T.buffer_store(kp, 1, [u])
            with T.If(T.And(use_mask != 0, row_oks[u])):
                with T.Then():
                    T.buffer_store(kp, T.Cast("int32", Mf[_int64(idx[2 + u]) * _int64(m0)]), [u])
            keep[u] = kp[u] != 0
    # (An unconditional LSE load from a clamped row, as an ``ld.global.f32`` in program order with the vector
    # loads, gave straight-line code but no earlier loads: fp16 pair, one row a thread, ~47 SASS instructions to
    # the first load and ~81 to the fourth either way; two rows, the eighth at 123 instead of 116, 44 registers
    # instead of 36.)
    for u in range(U):
        for k, (Vf, Sf, vp, vh, sp, sh) in enumerate((a, b)):  # noqa: N806
            _load_state(sl, vw, 2 * u + k, Vf, _offset(idx, u, vp, vh) + col, Sf, _offset(idx, u, sp, sh),
                        row_oks[u], T.And(row_oks[u], lane_ok))
    T.buffer_store(dep, vector.after_all(vw, 8 * U, zero), [0])
    for u in range(U):
        _fold(dtype, sl, vw, 2, acc, st, dep[0], True, k0=2 * u, r=u)
    if mask is not None:
        T.evaluate(T.cuda.cta_sync())
    Vo, So, vp, vh, sp, sh = out  # noqa: N806
    for u in range(U):
        v_ok, s_ok = T.And(row_oks[u], lane_ok), T.And(row_oks[u], idx[0] == 0)
        if mask is not None:
            v_ok, s_ok = T.And(v_ok, keep[u]), T.And(s_ok, keep[u])
        _finish(dtype, acc, st, orr, Vo, _offset(idx, u, vp, vh) + col, So, _offset(idx, u, sp, sh), v_ok, s_ok, r=u)


# ---------------------------------------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------------------------------------

def build(op: str, dtype: str, pdl):
    pdl_launch.check_trigger("merge_state", pdl)
    return {"merge_state": _build_pair, "merge_state_in_place": _build_in_place,
            "merge_states": _build_states}[op](dtype, pdl)


def _build_pair(dtype: str, pdl):
    U = ROWS_PER_THREAD  # noqa: N806

    @T.prim_func
    def merge_state(va_p: T.handle, sa_p: T.handle, vb_p: T.handle, sb_p: T.handle, vo_p: T.handle,
                    so_p: T.handle, log2_tpr: T.int32, log2_hpc: T.int32, log2_ppc: T.int32, log2_rpt: T.int32,
                    zero: T.int32):
        S = T.int32()
        H = T.int32()
        D = T.int32()
        va0 = T.int32()
        va1 = T.int32()
        vb0 = T.int32()
        vb1 = T.int32()
        vo0 = T.int32()
        vo1 = T.int32()
        sa0 = T.int32()
        sa1 = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        so0 = T.int32()
        so1 = T.int32()
        VA = T.match_buffer(va_p, (S, H, D), dtype, strides=(va0, va1, 1), align=16)
        VB = T.match_buffer(vb_p, (S, H, D), dtype, strides=(vb0, vb1, 1), align=16)
        VO = T.match_buffer(vo_p, (S, H, D), dtype, strides=(vo0, vo1, 1), align=16)
        SA = T.match_buffer(sa_p, (S, H), "float32", strides=(sa0, sa1), align=4)
        SB = T.match_buffer(sb_p, (S, H), "float32", strides=(sb0, sb1), align=4)
        SO = T.match_buffer(so_p, (S, H), "float32", strides=(so0, so1), align=4)
        T.device_entry()
        # Flat views indexed with the strides: TIRx 0.27 binds match_buffer strides on the host but drops them
        # from device indexing.
        VAf = T.decl_buffer((S * H * D,), dtype, data=VA.data)
        VBf = T.decl_buffer((S * H * D,), dtype, data=VB.data)
        VOf = T.decl_buffer((S * H * D,), dtype, data=VO.data)
        SAf = T.decl_buffer((S * H,), "float32", data=SA.data)
        SBf = T.decl_buffer((S * H,), "float32", data=SB.data)
        SOf = T.decl_buffer((S * H,), "float32", data=SO.data)
        bx, by = T.cta_id([(S + (1 << (log2_ppc + log2_rpt)) - 1) >> (log2_ppc + log2_rpt),
                           (H + (1 << log2_hpc) - 1) >> log2_hpc])
        tid = T.thread_id([THREADS])
        idx = T.alloc_local((2 + U,), "int32")
        sl = T.alloc_local((2 * U,), "float32")
        vw = T.alloc_local((8 * U,), "uint32")
        acc = T.alloc_local((8 * U,), "float32")
        st = T.alloc_local((5 * U,), "float32")
        orr = T.alloc_local((4,), "uint32")
        dep = T.alloc_local((1,), "uint32")
        row_oks = _rows(tid, bx, by, log2_tpr, log2_hpc, log2_ppc, log2_rpt, S, H, idx, U)
        pdl_launch.begin(pdl)
        # One row a thread (latency-bound grids) runs its own straight-line code, not the two-row code with
        # the second row predicated off: a uniform branch on a kernel argument.
        if log2_rpt == 0:
            _pair_rows(dtype, 1, idx, row_oks, D, sl, vw, acc, st, orr, dep, zero,
                       (VAf, SAf, va0, va1, sa0, sa1), (VBf, SBf, vb0, vb1, sb0, sb1), (VOf, SOf, vo0, vo1, so0, so1))
        else:
            _pair_rows(dtype, U, idx, row_oks, D, sl, vw, acc, st, orr, dep, zero,
                       (VAf, SAf, va0, va1, sa0, sa1), (VBf, SBf, vb0, vb1, sb0, sb1), (VOf, SOf, vo0, vo1, so0, so1))
        pdl_launch.end(pdl)

    return pdl_launch.launch(merge_state, pdl)


def _build_in_place(dtype: str, pdl):
    U = ROWS_PER_THREAD  # noqa: N806

    @T.prim_func
    def merge_state_in_place(v_p: T.handle, s_p: T.handle, vb_p: T.handle, sb_p: T.handle, m_p: T.handle,
                             use_mask: T.int32, log2_tpr: T.int32, log2_hpc: T.int32, log2_ppc: T.int32,
                             log2_rpt: T.int32, zero: T.int32):
        S = T.int32()
        H = T.int32()
        D = T.int32()
        SM = T.int32()
        v0 = T.int32()
        v1 = T.int32()
        vb0 = T.int32()
        vb1 = T.int32()
        s0 = T.int32()
        s1 = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        m0 = T.int32()
        V = T.match_buffer(v_p, (S, H, D), dtype, strides=(v0, v1, 1), align=16)
        VB = T.match_buffer(vb_p, (S, H, D), dtype, strides=(vb0, vb1, 1), align=16)
        SS = T.match_buffer(s_p, (S, H), "float32", strides=(s0, s1), align=4)
        SB = T.match_buffer(sb_p, (S, H), "float32", strides=(sb0, sb1), align=4)
        MK = T.match_buffer(m_p, (SM,), "uint8", strides=(m0,), align=1)
        T.device_entry()
        Vf = T.decl_buffer((S * H * D,), dtype, data=V.data)
        VBf = T.decl_buffer((S * H * D,), dtype, data=VB.data)
        Sf = T.decl_buffer((S * H,), "float32", data=SS.data)
        SBf = T.decl_buffer((S * H,), "float32", data=SB.data)
        Mf = T.decl_buffer((SM,), "uint8", data=MK.data)
        bx, by = T.cta_id([(S + (1 << (log2_ppc + log2_rpt)) - 1) >> (log2_ppc + log2_rpt),
                           (H + (1 << log2_hpc) - 1) >> log2_hpc])
        tid = T.thread_id([THREADS])
        idx = T.alloc_local((2 + U,), "int32")
        sl = T.alloc_local((2 * U,), "float32")
        vw = T.alloc_local((8 * U,), "uint32")
        acc = T.alloc_local((8 * U,), "float32")
        st = T.alloc_local((5 * U,), "float32")
        orr = T.alloc_local((4,), "uint32")
        dep = T.alloc_local((1,), "uint32")
        keep = T.alloc_local((U,), "int32")
        row_oks = _rows(tid, bx, by, log2_tpr, log2_hpc, log2_ppc, log2_rpt, S, H, idx, U)
        pdl_launch.begin(pdl)
        if log2_rpt == 0:  # as the pair kernel
            _pair_rows(dtype, 1, idx, row_oks, D, sl, vw, acc, st, orr, dep, zero,
                       (Vf, Sf, v0, v1, s0, s1), (VBf, SBf, vb0, vb1, sb0, sb1), (Vf, Sf, v0, v1, s0, s1),
                       mask=(Mf, m0, use_mask, keep))
        else:
            _pair_rows(dtype, U, idx, row_oks, D, sl, vw, acc, st, orr, dep, zero,
                       (Vf, Sf, v0, v1, s0, s1), (VBf, SBf, vb0, vb1, sb0, sb1), (Vf, Sf, v0, v1, s0, s1),
                       mask=(Mf, m0, use_mask, keep))
        pdl_launch.end(pdl)

    return pdl_launch.launch(merge_state_in_place, pdl)


def _build_states(dtype: str, pdl):
    K = STATES_PER_TRIP  # noqa: N806

    def load_trip(sl, vw, Vf, Sf, vbase, sbase, t, N, vn, sn, row_ok, ok):  # noqa: N803
        for k in range(K):
            n = t * K + k
            _load_state(sl, vw, k, Vf, vbase + _int64(n) * _int64(vn), Sf, sbase + _int64(n) * _int64(sn),
                        T.And(row_ok, n < N), T.And(ok, n < N))

    @T.prim_func
    def merge_states(v_p: T.handle, s_p: T.handle, vo_p: T.handle, so_p: T.handle, log2_tpr: T.int32,
                     log2_hpc: T.int32, log2_ppc: T.int32, zero: T.int32):
        S = T.int32()
        N = T.int32()
        H = T.int32()
        D = T.int32()
        v0 = T.int32()
        v1 = T.int32()
        v2 = T.int32()
        s0 = T.int32()
        s1 = T.int32()
        s2 = T.int32()
        vo0 = T.int32()
        vo1 = T.int32()
        so0 = T.int32()
        so1 = T.int32()
        V = T.match_buffer(v_p, (S, N, H, D), dtype, strides=(v0, v1, v2, 1), align=16)
        SS = T.match_buffer(s_p, (S, N, H), "float32", strides=(s0, s1, s2), align=4)
        VO = T.match_buffer(vo_p, (S, H, D), dtype, strides=(vo0, vo1, 1), align=16)
        SO = T.match_buffer(so_p, (S, H), "float32", strides=(so0, so1), align=4)
        T.device_entry()
        Vf = T.decl_buffer((S * N * H * D,), dtype, data=V.data)
        Sf = T.decl_buffer((S * N * H,), "float32", data=SS.data)
        VOf = T.decl_buffer((S * H * D,), dtype, data=VO.data)
        SOf = T.decl_buffer((S * H,), "float32", data=SO.data)
        bx, by = T.cta_id([(S + (1 << log2_ppc) - 1) >> log2_ppc, (H + (1 << log2_hpc) - 1) >> log2_hpc])
        tid = T.thread_id([THREADS])
        idx = T.alloc_local((3,), "int32")
        sl = T.alloc_local((K,), "float32")
        vw = T.alloc_local((4 * K,), "uint32")
        acc = T.alloc_local((8,), "float32")
        st = T.alloc_local((5,), "float32")
        orr = T.alloc_local((4,), "uint32")
        dep = T.alloc_local((1,), "uint32")
        row_ok = _rows(tid, bx, by, log2_tpr, log2_hpc, log2_ppc, 0, S, H, idx, 1)[0]
        pdl_launch.begin(pdl)
        col = _int64(idx[0] * VEC)
        ok = T.And(row_ok, idx[0] * VEC < D)
        st[0] = T.float32(NEG_INF)
        st[1] = T.float32(0)
        st[2] = T.float32(0)
        for i in range(8):
            acc[i] = T.float32(0)
        for t in T.serial((N + K - 1) // K):
            load_trip(sl, vw, Vf, Sf, _offset(idx, 0, v0, v2) + col, _offset(idx, 0, s0, s2), t, N, v1, s1,
                      row_ok, ok)
            dep[0] = vector.after_all(vw, 4 * K, zero)
            _fold(dtype, sl, vw, K, acc, st, dep[0], False)
        _finish(dtype, acc, st, orr, VOf, _offset(idx, 0, vo0, vo1) + col, SOf, _offset(idx, 0, so0, so1), ok,
                T.And(row_ok, idx[0] == 0))
        pdl_launch.end(pdl)

    return pdl_launch.launch(merge_states, pdl)
