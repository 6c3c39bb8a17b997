# SPDX-License-Identifier: Apache-2.0
# The kernel builders of flashinfer_fused_dit_layernorm (norm/fused_dit_layernorm.py: semantics, upstream
# citation, configs and the public ops): FlashInfer's include/flashinfer/norm/fused_dit_layernorm.cuh at release
# v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec), written anew in TIRx.
"""The TIRx functions of the fused DiT LayerNorm: the specialized kernel (H a compile-time multiple of 8, 16-byte
token vectors held in registers) and the general one (H, strides and alignment at run time), plus the element
formulas both share (``_sum_x``, ``_normalized``) and the quantized-output kernel reuses."""

from __future__ import annotations

from tirx_kernels.ported.flashinfer.norm import layernorm as _ln

_DTYPE = "bfloat16"
_VEC = 8
_WORDS = 4
GENERAL_THREADS = 256
PDL = "end"


def _gated(mode: str) -> bool:
    return mode in ("grgb", "grss")


def _modulated(mode: str) -> bool:
    return mode in ("rss", "grss")


def _token_offset(T, b, r, sb, sr):
    """64-bit element offset of token (b, r) in a tensor of batch / row strides ``sb`` / ``sr``."""
    return T.Cast("int64", b) * T.Cast("int64", sb) + T.Cast("int64", r) * T.Cast("int64", sr)


def _sum_x(T, mode, inp, res, gate, gate_bias, isf):
    """fp32 ``x`` of one element: upstream's ``fma(input, (gate + gate_bias) [* s], residual)`` or
    ``fma(input, s, residual)``."""
    return inp * ((gate + gate_bias) * isf if _gated(mode) else isf) + res


def _normalized(T, mode, x, mean, rs, w1, w2, scale=None, shift=None):
    """fp32 ``norm_out`` of one element: ``w1``/``w2`` are gamma/beta (grgb) or scale_bias/shift_bias."""
    if _gated(mode) and not _modulated(mode):
        return (x - mean) * (rs * w1) + w2
    return (x - mean) * rs * (T.float32(1) + (scale + w1)) + (shift + w2)


def build_kernel(mode: str, H: int, threads_per_row: int, vectors_per_thread: int, rows_per_cta: int,
                 pdl: str | None = PDL):
    """The specialized kernel (H a compile-time multiple of 8; every token tensor and vector on 16 bytes)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce, vector

    pdl_launch.check_trigger("fused_dit_layernorm", pdl)
    tpr, vpt = threads_per_row, vectors_per_thread
    threads = tpr * rows_per_cta
    words = reduce.scratch_words(tpr, rows_per_cta)
    inv_h = 1.0 / H
    gated, modulated = _gated(mode), _modulated(mode)
    nw = vpt * _WORDS

    def col_pred(v, lane):
        return (v * tpr + lane) * _VEC < H if (v + 1) * tpr * _VEC > H else None

    def both(a, b):
        if a is None or b is None:
            return b if a is None else a
        return T.And(a, b)

    def load(regs, buf, base, lane, pred_row):
        for v in range(vpt):
            pred = both(pred_row, col_pred(v, lane))
            if pred is not None:
                vector.fill(regs, v * _WORDS, _WORDS)  # masked vectors are 0: x is 0 there
            vector.load_v4(regs, v * _WORDS, buf.ptr_to([base + (v * tpr + lane) * _VEC]), pred, cache=_ln.X_CACHE)

    def all_loaded(xw, rw, gw, scw, shw, zero):
        """A uint32 that is 0 at run time but depends on every token load (``vector.after_all``). OR-ed into the
        input scale and the gate bias, which every x uses, it keeps all math behind the last load's issue; with a
        dependency on the residual alone ptxas issued the first vector's loads, its math, then the second's (SASS,
        grss 3072), and grgb's gate + gate_bias waited on the gate before the last loads were issued."""
        held = [xw, rw] + ([gw] if gated else []) + ([scw, shw] if modulated else [])
        pending = vector.after_all(held[0], nw, zero)
        for regs in held[1:]:
            pending = pending | vector.after_all(regs, nw, zero)
        return pending

    def form_x(xf, xw, rw, gw, GB, lane, isf, pend, bw, orr, ROf, ro_base, row_ok, acc):  # noqa: N803
        """``xf`` <- fp32 x of every held element; residual_out <- bf16(x); ``acc[0] +=`` the sum of x."""
        for v in range(vpt):
            c0 = (v * tpr + lane) * _VEC
            if gated:
                _ln.load_fp32_chunk(T, bw, GB, c0, col_pred(v, lane))
            for j in range(_WORDS):
                i = v * _WORDS + j
                in_lo, in_hi = vector.unpack2(xw[i], _DTYPE)
                r_lo, r_hi = vector.unpack2(rw[i], _DTYPE)
                g_lo, g_hi = vector.unpack2(gw[i], _DTYPE) if gated else (None, None)
                b_lo, b_hi = (T.cuda.uint_as_float(bw[2 * j] | pend[0]),
                              T.cuda.uint_as_float(bw[2 * j + 1] | pend[0])) if gated else (None, None)
                T.buffer_store(xf, _sum_x(T, mode, in_lo, r_lo, g_lo, b_lo, isf), [2 * i])
                T.buffer_store(xf, _sum_x(T, mode, in_hi, r_hi, g_hi, b_hi, isf), [2 * i + 1])
                vector.pack2(orr, j, xf[2 * i], xf[2 * i + 1], _DTYPE)
                T.buffer_store(acc, acc[0] + xf[2 * i] + xf[2 * i + 1], [0])
            vector.store_v4(ROf.ptr_to([ro_base + c0]), orr, 0, both(row_ok, col_pred(v, lane)))

    def squared_deviations(xf, lane, mean, acc, part):
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            T.buffer_store(part, T.float32(0), [0])
            for e in range(_VEC):
                d = xf[v * _VEC + e] - mean
                T.buffer_store(part, part[0] + d * d, [0])
            pred = col_pred(v, lane)
            T.buffer_store(acc, acc[0] + (part[0] if pred is None else T.Select(pred, part[0], T.float32(0))), [0])

    def scale_store(xf, scw, shw, W1, W2, lane, w1w, w2w, orr, NOf, no_base, row_ok, mean, rs):  # noqa: N803
        for v in range(vpt):
            c0 = (v * tpr + lane) * _VEC
            _ln.load_fp32_chunk(T, w1w, W1, c0, col_pred(v, lane))
            _ln.load_fp32_chunk(T, w2w, W2, c0, col_pred(v, lane))
            for j in range(_WORDS):
                i = v * _WORDS + j
                w1_lo, w1_hi = _ln.fp32_pair(T, w1w, 2 * j)
                w2_lo, w2_hi = _ln.fp32_pair(T, w2w, 2 * j)
                sc_lo, sc_hi = vector.unpack2(scw[i], _DTYPE) if modulated else (None, None)
                sh_lo, sh_hi = vector.unpack2(shw[i], _DTYPE) if modulated else (None, None)
                vector.pack2(orr, j, _normalized(T, mode, xf[2 * i], mean, rs, w1_lo, w2_lo, sc_lo, sh_lo),
                             _normalized(T, mode, xf[2 * i + 1], mean, rs, w1_hi, w2_hi, sc_hi, sh_hi), _DTYPE)
            vector.store_v4(NOf.ptr_to([no_base + c0]), orr, 0, both(row_ok, col_pred(v, lane)))

    @T.prim_func
    def fused_dit_layernorm(x_ptr: T.handle, r_ptr: T.handle, g_ptr: T.handle, sc_ptr: T.handle, sh_ptr: T.handle,
                            gb_ptr: T.handle, w1_ptr: T.handle, w2_ptr: T.handle, isf_ptr: T.handle,
                            ro_ptr: T.handle, no_ptr: T.handle, eps: T.float32, has_residual: T.int32,
                            zero: T.int32):
        B = T.int32()
        R = T.int32()
        xb = T.int32()
        xr = T.int32()
        rb = T.int32()
        rr = T.int32()
        gbs = T.int32()
        grs = T.int32()
        scb = T.int32()
        scr = T.int32()
        shb = T.int32()
        shr = T.int32()
        rob = T.int32()
        ror = T.int32()
        nob = T.int32()
        nor = T.int32()
        X = T.match_buffer(x_ptr, (B, R, H), _DTYPE, strides=(xb, xr, 1), align=16)
        Rs = T.match_buffer(r_ptr, (B, R, H), _DTYPE, strides=(rb, rr, 1), align=16)
        Gt = T.match_buffer(g_ptr, (B, R, H), _DTYPE, strides=(gbs, grs, 1), align=16)
        Sc = T.match_buffer(sc_ptr, (B, R, H), _DTYPE, strides=(scb, scr, 1), align=16)
        Sh = T.match_buffer(sh_ptr, (B, R, H), _DTYPE, strides=(shb, shr, 1), align=16)
        GB = T.match_buffer(gb_ptr, (H,), "float32", align=16)
        W1 = T.match_buffer(w1_ptr, (H,), "float32", align=16)
        W2 = T.match_buffer(w2_ptr, (H,), "float32", align=16)
        Isf = T.match_buffer(isf_ptr, (1,), "float32", align=4)
        RO = T.match_buffer(ro_ptr, (B, R, H), _DTYPE, strides=(rob, ror, 1), align=16)
        NO = T.match_buffer(no_ptr, (B, R, H), _DTYPE, strides=(nob, nor, 1), align=16)
        T.device_entry()
        # Flat views indexed b * batch_stride + r * row_stride + col (TIRx drops match_buffer strides from device
        # indexing); their extent only names the buffer.
        Xf = T.decl_buffer((1,), _DTYPE, data=X.data)
        Rf = T.decl_buffer((1,), _DTYPE, data=Rs.data)
        Gf = T.decl_buffer((1,), _DTYPE, data=Gt.data)
        Scf = T.decl_buffer((1,), _DTYPE, data=Sc.data)
        Shf = T.decl_buffer((1,), _DTYPE, data=Sh.data)
        ROf = T.decl_buffer((1,), _DTYPE, data=RO.data)
        NOf = T.decl_buffer((1,), _DTYPE, data=NO.data)
        cta = T.cta_id([(B * R + rows_per_cta - 1) // rows_per_cta])
        tid = T.thread_id([threads])
        xw = T.alloc_local((nw,), "uint32")
        rw = T.alloc_local((nw,), "uint32")
        gw = T.alloc_local((nw if gated else _WORDS,), "uint32")
        scw = T.alloc_local((nw if modulated else _WORDS,), "uint32")
        shw = T.alloc_local((nw if modulated else _WORDS,), "uint32")
        xf = T.alloc_local((vpt * _VEC,), "float32")
        bw = T.alloc_local((2 * _WORDS,), "uint32")
        w2w = T.alloc_local((2 * _WORDS,), "uint32")
        orr = T.alloc_local((_WORDS,), "uint32")
        pend = T.alloc_local((1,), "uint32")
        acc = T.alloc_local((1,), "float32")
        part = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        scratch = T.alloc_shared((max(1, 2 * words),), "float32")
        pdl_launch.begin(pdl)

        tok = cta * rows_per_cta + tid // tpr
        lane = tid % tpr
        row_ok = T.bool(True) if rows_per_cta == 1 else tok < B * R
        t = T.min(tok, B * R - 1)  # a group past the last token (tail CTA) only joins the reductions
        b = T.truncdiv(t, R)
        r = T.truncmod(t, R)
        load(xw, Xf, _token_offset(T, b, r, xb, xr), lane, row_ok)
        load(rw, Rf, _token_offset(T, b, r, rb, rr), lane, T.And(row_ok, has_residual != 0))
        if gated:
            load(gw, Gf, _token_offset(T, b, r, gbs, grs), lane, row_ok)
        if modulated:
            load(scw, Scf, _token_offset(T, b, r, scb, scr), lane, row_ok)
            load(shw, Shf, _token_offset(T, b, r, shb, shr), lane, row_ok)
        pend[0] = all_loaded(xw, rw, gw, scw, shw, zero)
        isf = T.cuda.uint_as_float(T.reinterpret("uint32", Isf[0]) | pend[0])
        acc[0] = T.float32(0)
        form_x(xf, xw, rw, gw, GB, lane, isf, pend, bw, orr, ROf, _token_offset(T, b, r, rob, ror), row_ok, acc)
        stat[0] = reduce.group_sum(acc[0], tid, tpr, scratch) * T.float32(inv_h)  # the mean
        squared_deviations(xf, lane, stat[0], acc, part)
        stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, tpr, scratch, words) * T.float32(inv_h) + eps)
        scale_store(xf, scw, shw, W1, W2, lane, bw, w2w, orr, NOf, _token_offset(T, b, r, nob, nor), row_ok,
                    stat[0], stat[1])
        pdl_launch.end(pdl)

    return pdl_launch.launch(fused_dit_layernorm, pdl)


def build_general(mode: str, pdl: str | None = PDL, threads: int = GENERAL_THREADS, held: int = _ln.GENERAL_HELD):
    """The general kernel: H, strides and alignment at run time; one CTA of ``threads`` per token, element-wise
    (coalesced 2-byte accesses). Tokens of up to ``threads * held`` elements keep ``x`` in registers (element
    ``k * threads + tid`` in slot ``k``); longer ones (a CTA-uniform branch) take three passes (sum, squared
    deviations, outputs), each forming ``x`` from the inputs again (the same bits)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import reduce

    pdl_launch.check_trigger("fused_dit_layernorm", pdl)
    words = reduce.scratch_words(threads, 1)
    gated, modulated = _gated(mode), _modulated(mode)

    def x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf):  # noqa: N803
        cc = T.Cast("int64", c)
        res = T.Select(has_residual != 0, _ln.element(T, Rf, r_base + cc), T.float32(0))
        gate = _ln.element(T, Gf, g_base + cc) if gated else None
        return _sum_x(T, mode, _ln.element(T, Xf, x_base + cc), res, gate, GB[c] if gated else None, isf)

    def outputs_at(ROf, NOf, Scf, Shf, W1, W2, bases, c, x, mean, rs, pair):  # noqa: N803
        """residual_out and norm_out of element ``c`` (after this thread's last read of it: in place over residual)."""
        sc_base, sh_base, ro_base, no_base = bases
        cc = T.Cast("int64", c)
        _ln.store_element(T, ROf, ro_base + cc, x, pair)
        y = _normalized(T, mode, x, mean, rs, W1[c], W2[c],
                        _ln.element(T, Scf, sc_base + cc) if modulated else None,
                        _ln.element(T, Shf, sh_base + cc) if modulated else None)
        _ln.store_element(T, NOf, no_base + cc, y, pair)

    def load_held(xv, tid, H, *x_args):  # noqa: N803
        """``xv[k]`` <- x of element ``k * threads + tid`` (0 past the token); returns their sum."""
        for k in range(held):
            T.buffer_store(xv, T.float32(0), [k])
            with T.If(k * threads + tid < H):
                with T.Then():
                    T.buffer_store(xv, x_at(*x_args[:7], k * threads + tid, *x_args[7:]), [k])
        total = xv[0]
        for k in range(1, held):
            total = total + xv[k]
        return total

    def held_deviations(xv, tid, H, mean):  # noqa: N803
        total = T.float32(0)
        for k in range(held):
            total = total + T.Select(k * threads + tid < H, (xv[k] - mean) * (xv[k] - mean), T.float32(0))
        return total

    def store_held(xv, tid, H, out_args, mean, rs, pair):  # noqa: N803
        for k in range(held):
            with T.If(k * threads + tid < H):
                with T.Then():
                    outputs_at(*out_args, k * threads + tid, xv[k], mean, rs, pair)

    @T.prim_func
    def fused_dit_layernorm(x_ptr: T.handle, r_ptr: T.handle, g_ptr: T.handle, sc_ptr: T.handle, sh_ptr: T.handle,
                            gb_ptr: T.handle, w1_ptr: T.handle, w2_ptr: T.handle, isf_ptr: T.handle,
                            ro_ptr: T.handle, no_ptr: T.handle, eps: T.float32, has_residual: T.int32,
                            zero: T.int32):
        B = T.int32()
        R = T.int32()
        H = T.int32()
        xb = T.int32()
        xr = T.int32()
        rb = T.int32()
        rr = T.int32()
        gbs = T.int32()
        grs = T.int32()
        scb = T.int32()
        scr = T.int32()
        shb = T.int32()
        shr = T.int32()
        rob = T.int32()
        ror = T.int32()
        nob = T.int32()
        nor = T.int32()
        X = T.match_buffer(x_ptr, (B, R, H), _DTYPE, strides=(xb, xr, 1), align=2)
        Rs = T.match_buffer(r_ptr, (B, R, H), _DTYPE, strides=(rb, rr, 1), align=2)
        Gt = T.match_buffer(g_ptr, (B, R, H), _DTYPE, strides=(gbs, grs, 1), align=2)
        Sc = T.match_buffer(sc_ptr, (B, R, H), _DTYPE, strides=(scb, scr, 1), align=2)
        Sh = T.match_buffer(sh_ptr, (B, R, H), _DTYPE, strides=(shb, shr, 1), align=2)
        GB = T.match_buffer(gb_ptr, (H,), "float32", align=4)
        W1 = T.match_buffer(w1_ptr, (H,), "float32", align=4)
        W2 = T.match_buffer(w2_ptr, (H,), "float32", align=4)
        Isf = T.match_buffer(isf_ptr, (1,), "float32", align=4)
        RO = T.match_buffer(ro_ptr, (B, R, H), _DTYPE, strides=(rob, ror, 1), align=2)
        NO = T.match_buffer(no_ptr, (B, R, H), _DTYPE, strides=(nob, nor, 1), align=2)
        T.device_entry()
        Xf = T.decl_buffer((1,), _DTYPE, data=X.data)
        Rf = T.decl_buffer((1,), _DTYPE, data=Rs.data)
        Gf = T.decl_buffer((1,), _DTYPE, data=Gt.data)
        Scf = T.decl_buffer((1,), _DTYPE, data=Sc.data)
        Shf = T.decl_buffer((1,), _DTYPE, data=Sh.data)
        ROf = T.decl_buffer((1,), _DTYPE, data=RO.data)
        NOf = T.decl_buffer((1,), _DTYPE, data=NO.data)
        tok = T.cta_id([B * R])
        tid = T.thread_id([threads])
        xv = T.alloc_local((held,), "float32")
        acc = T.alloc_local((1,), "float32")
        stat = T.alloc_local((2,), "float32")
        pair = T.alloc_local((1,), "uint32")
        scratch = T.alloc_shared((2 * words,), "float32")
        pdl_launch.begin(pdl)

        b = T.truncdiv(tok, R)
        r = T.truncmod(tok, R)
        x_base = _token_offset(T, b, r, xb, xr)
        r_base = _token_offset(T, b, r, rb, rr)
        g_base = _token_offset(T, b, r, gbs, grs)
        isf = Isf[0]
        bases = (_token_offset(T, b, r, scb, scr), _token_offset(T, b, r, shb, shr), _token_offset(T, b, r, rob, ror),
                 _token_offset(T, b, r, nob, nor))
        if H <= threads * held:
            acc[0] = load_held(xv, tid, H, Xf, Rf, Gf, GB, x_base, r_base, g_base, has_residual, isf)
            stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
            acc[0] = held_deviations(xv, tid, H, stat[0])
            stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
            store_held(xv, tid, H, (ROf, NOf, Scf, Shf, W1, W2, bases), stat[0], stat[1], pair)
        else:
            trips = (H + (threads - 1)) // threads
            acc[0] = T.float32(0)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    acc[0] = acc[0] + x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf)
            stat[0] = reduce.group_sum(acc[0], tid, threads, scratch) / T.Cast("float32", H)  # the mean
            acc[0] = T.float32(0)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    d = x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf) - stat[0]
                    acc[0] = acc[0] + d * d
            stat[1] = T.rsqrt(reduce.group_sum(acc[0], tid, threads, scratch, words) / T.Cast("float32", H) + eps)
            for i in T.serial(trips):
                c = i * threads + tid
                if c < H:
                    # x bound once: outputs_at uses it after residual_out (maybe residual itself) is written
                    x = x_at(Xf, Rf, Gf, GB, x_base, r_base, g_base, c, has_residual, isf)
                    outputs_at(ROf, NOf, Scf, Shf, W1, W2, bases, c, x, stat[0], stat[1], pair)
        pdl_launch.end(pdl)

    return pdl_launch.launch(fused_dit_layernorm, pdl)
