# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update (see _ssu_kernel.py for the upstream files and commit, read for
# semantics only); FlashInfer's sm90 MTP kernel (state rows staged in shared memory) read for design only.
"""Sweep builder of the selective_state_update kernel: ``_ssu_kernel.build_kernel`` (the math, the modes and the
schedule knobs, the same code) plus two knobs the registered forms do not take yet, so that the six registered
kernels' sources, fingerprints and pinned rows stay as they are until the GPU has measured these
(``tools/sweeps/ssu_tma_schedules.py``; issue 25: ours 0.4-0.8x FlashInfer 0.7.4 on the H100, 2026-12-07e):

- ``state_io`` (``STATE_IO``): ``"regs"`` is the registered forms' 16-byte vector loads into registers (its generated
  CUDA identical to ``_ssu_kernel.build_kernel``'s, checked by the tests); ``"bulk"`` has one thread copy the CTA's
  state tile (its ``rows_per_cta`` rows of one head: one contiguous run of the pool) into shared memory as
  ``rows_per_thread`` bulk copies (``cp.async.bulk``) on as many mbarriers, issued before the B / C staging, so the
  whole tile is in flight with no registers held and a thread starts on its first row once that piece has landed;
  ``"bulk_store"`` also writes the final state back through the tile (each thread its rows, one bulk store a CTA)
  where it goes to the source slot (destination slots and the intermediate buffer keep the vector stores).
- ``stage_vectors``: B and C staged with 16-byte loads where their strides allow (the registered forms use 2-byte
  loads: the MTP simple form's 2 x 8 x 128 a CTA are 4x the load instructions of its 8 KB state tile).

When a variant wins on the GPU, its knobs move into ``_ssu_kernel.build_kernel`` (the product switch) and this file
goes.
"""

from __future__ import annotations

from tirx_kernels.ported.flashinfer.mamba._ssu_kernel import (
    HAS_BIAS,
    HAS_DST,
    HAS_INDEX,
    HAS_INTER_INDEX,
    HAS_Z,
    INDEX64,
    INT16_MAX,
    INTERMEDIATE,
    PHILOX_RUNTIME,
    SOFTPLUS,
    SOFTPLUS_THRESHOLD,
    UPDATE,
    _vectors_per_row,
)

# How the state reaches the math: vector loads into registers (every registered form), or a shared-memory tile filled
# by bulk copies (loads only, or loads and the final store).
STATE_IO = ("regs", "bulk", "bulk_store")


def build_kernel(state_dtype: str, input_dtype: str, dstate: int, max_tokens: int, rows_per_cta: int,
                 lanes_per_row: int, rows_per_thread: int, philox_rounds: int = 0, token_major: bool = False,
                 min_blocks_per_sm: int = 0, state_io: str = "regs", stage_vectors: bool = False):
    """``token_major`` (``MTP_SCHEDULES``; swept by ``tools/sweeps/ssu_mtp_schedules.py``): the
    token loop outside the thread's rows, all ``rows_per_thread`` rows' fp32 state in registers, so a token's B / C
    shared-memory loads serve every row and the rows' updates and shuffle sums are independent work; row-major (the
    default) walks one row through every token before the next. Multi-token bf16 / fp16 / fp32 states only.
    ``min_blocks_per_sm`` (0: none, the registered forms): ``__launch_bounds__``' minimum CTAs an SM, which caps the
    registers (the token-major simple form takes 128 registers at 64 threads: 8 CTAs, 16 warps an SM), a sweep knob.
    ``state_io`` (``STATE_IO``; a sweep knob, ``tools/sweeps/ssu_tma_schedules.py``): ``"regs"`` (the registered
    forms) loads the state with 16-byte vector loads into registers; ``"bulk"`` has one thread copy the CTA's state
    tile (its ``rows_per_cta`` rows of one head are one contiguous run of the pool) into shared memory with
    ``rows_per_thread`` bulk copies (``cp.async.bulk``, one mbarrier each: piece ``k`` holds the rows every thread
    takes as its ``k``-th), issued before the B / C staging, so the whole tile is in flight with no registers and a
    thread starts on its first row once that piece has landed; ``"bulk_store"`` also writes the final state back
    through the tile (each thread its rows, then one bulk store of the tile) where it goes to the source slot (no
    destination slots, no intermediate buffer: those modes keep the vector stores).
    ``stage_vectors`` (a sweep knob): B and C staged with 16-byte loads (8 elements each, 2 shared-memory vector
    stores of their fp32 values) where the batch and token strides of both are multiples of 8 elements (else the
    2-byte loads of the registered forms); the base pointers must then be 16-byte aligned, which the op would have
    to route on before a product form takes it. The registered MTP simple form stages 2 x 8 x 128 elements a CTA
    with 2-byte loads: 4x the load instructions of its 8 KB state tile."""
    if state_io not in STATE_IO:
        raise ValueError(f"selective_state_update: state_io {state_io!r} is not one of {STATE_IO}")
    bulk_io = state_io != "regs"
    if bulk_io and (state_dtype == "int16" or philox_rounds):
        raise ValueError("selective_state_update: a bulk-staged state tile takes a bf16 / fp16 / fp32 state (no int16 "
                         "pool, no stochastic rounding)")
    if token_major and (state_dtype == "int16" or philox_rounds or max_tokens == 1):
        raise ValueError("selective_state_update: token_major is a multi-token schedule of a bf16 / fp16 / fp32 "
                         "state (no int16 pool, no stochastic rounding)")
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import bulk, mbarrier, reduce, vector
    from tirx_kernels.ported.flashinfer.mamba import _ssu_philox as philox

    R, L, RT = rows_per_cta, lanes_per_row, rows_per_thread  # noqa: N806
    fp32_state = state_dtype == "float32"
    quant = state_dtype == "int16"
    ve = 4 if fp32_state else 8  # state elements a 16-byte vector
    vpt = _vectors_per_row(state_dtype, dstate) // L  # vectors a lane holds of a row
    ncols = vpt * ve
    threads = R * L // RT
    groups = threads // L  # rows the CTA works on at once
    assert threads % 32 == 0 and threads <= 1024 and vpt >= 1, (R, L, RT, vpt)
    words = 4 * vpt  # 32-bit words a lane holds of a row
    bc_stage = max_tokens * dstate
    x_stage = max_tokens * R
    stage_trips_bc = -(-bc_stage // threads)
    stage_trips_x = -(-x_stage // threads)
    esize = 4 if fp32_state else 2
    stage_trips_bc8 = -(-bc_stage // (8 * threads))  # stage_vectors: 8 elements a load
    piece_bytes = groups * dstate * esize  # one bulk copy: the rows every thread takes as its k-th

    def i64(v):
        return T.Cast("int64", v)

    def half_value(buf, idx):
        """fp32 value of one 2-byte element of x / B / C / z (through its bits, as the vector path unpacks)."""
        return vector.unpack2(T.Cast("uint32", T.reinterpret("uint16", buf[idx])), input_dtype)[0]

    def _u32(h):
        """The 16 bits of an int16 element, zero-extended."""
        return T.Cast("uint32", T.reinterpret("uint16", h))

    def weight_value(W, e, kind):  # noqa: N803
        """fp32 value of element ``e`` of a dt / D / dt_bias tensor seen as int16: fp32 (kind 0, two halves),
        bf16 (1) or fp16 (2)."""
        w = _u32(W[e])
        f32 = T.reinterpret("float32", (_u32(W[e + e + 1]) << T.uint32(16)) | _u32(W[e + e]))
        return T.if_then_else(kind == 0, f32, T.if_then_else(
            kind == 1, T.reinterpret("float32", w << T.uint32(16)),
            T.Cast("float32", T.reinterpret("float16", W[e]))))

    def index_value(Ix, i, is64):  # noqa: N803
        """Element ``i`` (already times the stride) of an int32 or int64 index tensor seen as int32."""
        lo = Ix[T.if_then_else(is64, i + i, i)]
        wide = (i64(Ix[i + i + 1]) << T.int64(32)) | i64(T.Cast("uint32", lo))
        return T.if_then_else(is64, wide, i64(lo))

    def int16_value(word):
        """fp32 value of the int16 in the low 16 bits of ``word``."""
        return T.Cast("float32", T.reinterpret("int16", T.Cast("uint16", word & T.uint32(0xFFFF))))

    def unpack_state(regs, base, sf, dequant, off=0):
        """The fp32 columns of a row from its loaded words ``regs[base:base + words]`` (int16: times the row's
        decode scale ``dequant``) into ``sf[off:off + ncols]``."""
        for i in range(words):
            if quant:
                T.buffer_store(sf, int16_value(regs[base + i]) * dequant, [off + 2 * i])
                T.buffer_store(sf, int16_value(regs[base + i] >> T.uint32(16)) * dequant, [off + 2 * i + 1])
            elif fp32_state:
                T.buffer_store(sf, T.cuda.uint_as_float(regs[base + i]), [off + i])
            else:
                lo, hi = vector.unpack2(regs[base + i], state_dtype)
                T.buffer_store(sf, lo, [off + 2 * i])
                T.buffer_store(sf, hi, [off + 2 * i + 1])

    def quantize_row(sf, m, qscale, off=0):
        """int16 state, FlashInfer's convention: the row's max |s| over its ``L`` lanes, encode = 32767 / max (1 for
        an all-zero row), ``qscale[0] =`` encode, ``qscale[1] =`` the decode scale 1 / encode that is stored."""
        T.buffer_store(qscale, T.float32(0), [0])
        for i in range(ncols):
            T.buffer_store(qscale, T.max(qscale[0], T.fabs(sf[off + i])), [0])
        if L > 1:  # the shuffle into a register first: every lane of the warp takes it, none in a select's branch
            T.buffer_store(qscale, T.cuda.warp_max(qscale[0], L), [0])
        T.buffer_store(qscale, T.if_then_else(qscale[0] == T.float32(0), T.float32(1),
                                              T.float32(INT16_MAX) / qscale[0]), [0])
        T.buffer_store(qscale, T.float32(1) / qscale[0], [1])

    def int16_bits(x, enc):
        """Round-to-nearest-even int16 of ``x * enc`` clipped to +-32767, as the low 16 bits of a uint32."""
        q = T.Cast("int32", T.nearbyint(T.min(T.max(x * enc, T.float32(-INT16_MAX)), T.float32(INT16_MAX))))
        return T.Cast("uint32", q) & T.uint32(0xFFFF)

    def store_state(buf, row_base, m, sf, packed, pred, qscale=None, rng=None, off=0):
        """The row's columns rounded once to the state dtype, 16-byte stores (int16: ``qscale`` from
        ``quantize_row``; ``rng = (ph, seed_lo, seed_hi, row offset)``: fp16 stochastic rounding, one Philox call
        per 4 columns at the group's element offset)."""
        for v in range(vpt):
            if rng is not None:
                ph, seed_lo, seed_hi, row_off, rounds_arg = rng
                rounds = rounds_arg if philox_rounds == PHILOX_RUNTIME else philox_rounds
                for half in range(2):
                    philox.tir_randint4x(T, ph, seed_lo, seed_hi, row_off + i64((v * L + m) * 8 + 4 * half),
                                         rounds)
                    for w in range(2):
                        e = v * 8 + 4 * half + 2 * w
                        T.buffer_store(packed, philox.tir_cvt_rs_f16(T, sf[off + e], ph[2 * w])
                                       | (philox.tir_cvt_rs_f16(T, sf[off + e + 1], ph[2 * w + 1]) << T.uint32(16)),
                                       [2 * half + w])
            elif quant:
                for w in range(4):
                    T.buffer_store(packed, int16_bits(sf[off + v * 8 + 2 * w], qscale[0])
                                   | (int16_bits(sf[off + v * 8 + 2 * w + 1], qscale[0]) << T.uint32(16)), [w])
            elif fp32_state:
                for w in range(4):
                    T.buffer_store(packed, T.cuda.float_as_uint(sf[off + v * 4 + w]), [w])
            else:
                for w in range(4):
                    vector.pack2(packed, w, sf[off + v * 8 + 2 * w], sf[off + v * 8 + 2 * w + 1], state_dtype)
            vector.store_v4(buf.ptr_to([row_base + i64((v * L + m) * ve)]), packed, 0, pred)

    def store_row_tile(tile, lr, m, sf, packed, off=0):
        """``state_io="bulk_store"``: the row's columns rounded once to the state dtype (as ``store_state``) into row
        ``lr`` of the shared tile, at the positions the row was read from."""
        for v in range(vpt):
            for w in range(4):
                if fp32_state:
                    T.buffer_store(packed, T.cuda.float_as_uint(sf[off + v * 4 + w]), [w])
                else:
                    vector.pack2(packed, w, sf[off + v * 8 + 2 * w], sf[off + v * 8 + 2 * w + 1], state_dtype)
            vector.store_shared_v4(tile.ptr_to([lr * dstate + (v * L + m) * ve]), packed, 0)

    def stage_fp32(dst, e, words, base, packed):
        """``stage_vectors``: the 8 input-dtype elements in ``words[base:base + 4]`` as fp32 into ``dst[e:e + 8]``
        (two 16-byte shared-memory stores)."""
        for half in range(2):
            for w in range(2):
                lo, hi = vector.unpack2(words[base + 2 * half + w], input_dtype)
                T.buffer_store(packed, T.cuda.float_as_uint(lo), [2 * w])
                T.buffer_store(packed, T.cuda.float_as_uint(hi), [2 * w + 1])
            vector.store_shared_v4(dst.ptr_to([e + 4 * half]), packed, 0)

    def tile_store(pad, flags):
        """``state_io="bulk_store"``: the final state goes back through the tile (to the source slot, no destination
        slots or intermediate buffer; CTA-uniform)."""
        return T.And(T.Not(pad), (flags & (INTERMEDIATE | HAS_DST | UPDATE)) == UPDATE)

    def rng_of(ph, seed, row_off, rounds_arg):
        """store_state's ``rng`` with stochastic rounding (the seed's two words; the row's offset in the source
        slot, as upstream's counter; the rounds argument the PHILOX_RUNTIME artifact reads), else None."""
        if not philox_rounds:
            return None
        return (ph, T.Cast("uint32", seed[0]), T.Cast("uint32", seed[1]), row_off, rounds_arg)

    def token_step(Bs, Cs, sf, bc, acc, t, m, dA, dtx):  # noqa: N803
        """One token on the row's columns: ``s = s dA + B dtx``, ``acc = s . C`` (this lane's part)."""
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            col0 = (v * L + m) * ve
            for q in range(ve // 4):
                vector.load_shared_v4(bc, 4 * q, Bs.ptr_to([t * dstate + col0 + 4 * q]))
                vector.load_shared_v4(bc, 8 + 4 * q, Cs.ptr_to([t * dstate + col0 + 4 * q]))
            for e in range(ve):
                i = v * ve + e  # B in bc[0:8], C in bc[8:16]
                T.buffer_store(sf, sf[i] * dA + T.cuda.uint_as_float(bc[e]) * dtx, [i])
                T.buffer_store(acc, acc[0] + sf[i] * T.cuda.uint_as_float(bc[8 + e]), [0])

    def token_step_rows(Bs, Cs, sf, bc, acc, t, m, dA, dtx):  # noqa: N803
        """``token_step`` for all ``RT`` rows of the thread at once (``token_major``): row k's columns at ``sf[k *
        ncols:]``, its dt' x in ``dtx[k]``, its partial dot in ``acc[k]``; B / C loaded once for every row."""
        for k in range(RT):
            T.buffer_store(acc, T.float32(0), [k])
        for v in range(vpt):
            col0 = (v * L + m) * ve
            for q in range(ve // 4):
                vector.load_shared_v4(bc, 4 * q, Bs.ptr_to([t * dstate + col0 + 4 * q]))
                vector.load_shared_v4(bc, 8 + 4 * q, Cs.ptr_to([t * dstate + col0 + 4 * q]))
            for k in range(RT):
                for e in range(ve):
                    i = k * ncols + v * ve + e
                    T.buffer_store(sf, sf[i] * dA + T.cuda.uint_as_float(bc[e]) * dtx[k], [i])
                    T.buffer_store(acc, acc[k] + sf[i] * T.cuda.uint_as_float(bc[8 + e]), [k])

    @T.macro
    def pool_row_store(S, SC, SEED, sf, off, packed, qscale, ph, h, lr, row_base, m, to_slot, seed_slot, pred,  # noqa: N803
                       dim, row0, state_stride, scale_sb, philox_rounds_arg):
        """A row's state into pool slot ``to_slot`` where ``pred`` holds (int16: requantized, its decode scale
        beside it), rounded stochastically with the Philox stream of ``seed_slot`` (the row's own slot)."""
        if quant:
            quantize_row(sf, m, qscale, off)
        store_state(S, to_slot * i64(state_stride) + row_base, m, sf, packed, pred, qscale,
                    rng_of(ph, SEED, seed_slot * i64(state_stride) + row_base, philox_rounds_arg), off)
        if quant:
            if T.And(m == 0, pred):
                SC[to_slot * i64(scale_sb) + i64(h * dim + row0 + lr)] = qscale[1]

    @T.macro
    def row_token_out(S, OUT, INTER, DST, SC, SEED, sf, off, packed, qscale, ph, total, b, t, h, lr, row_base, m,  # noqa: N803
                      slot, pad, icache, d_h, Xs, Zs, flags, o_sb, o_st, dim, row0, nheads, cache_steps, dst_sb,
                      dst_st, ntokens, pad_slot_id, state_stride, scale_sb, philox_rounds_arg, is64):
        """Token ``t`` of one row: its output (lane 0 of the row), and its state where the token's state goes (the
        intermediate buffer, or a destination slot)."""
        if m == 0:
            xv = Xs[t * R + lr]
            y = total + d_h * xv
            if (flags & HAS_Z) != 0:
                zv = Zs[t * R + lr]
                y = y * (zv / (T.float32(1) + T.exp(T.float32(0) - zv)))
            vector.pack2(packed, 0, y, y, input_dtype)
            OUT[i64(b) * i64(o_sb) + i64(t * o_st + h * dim + row0 + lr)] = T.reinterpret(
                input_dtype, T.Cast("uint16", packed[0]))
        if (flags & INTERMEDIATE) != 0:
            # (an int16 pool takes no intermediate buffer: the op rejects one, its scales are not ported)
            if quant:
                quantize_row(sf, m, qscale, off)
            store_state(INTER, (icache * i64(cache_steps) + i64(t)) * i64(nheads * dim * dstate) + row_base,
                        m, sf, packed, T.Not(pad), qscale, None, off)
        elif (flags & HAS_DST) != 0:
            dslot = index_value(DST, b * dst_sb + t * dst_st, is64)
            dpred = T.And(T.And(T.Not(pad), dslot != i64(pad_slot_id)),
                          T.And((flags & UPDATE) != 0, T.Or(t == ntokens - 1, dst_st != 0)))
            pool_row_store(S, SC, SEED, sf, off, packed, qscale, ph, h, lr, row_base, m, dslot, slot, dpred, dim,
                           row0, state_stride, scale_sb, philox_rounds_arg)

    @T.macro
    def row_final_store(S, SC, SEED, sf, off, packed, qscale, ph, h, lr, row_base, m, slot, pad, flags, dim, row0,  # noqa: N803
                        state_stride, scale_sb, philox_rounds_arg):
        """A row's state after its last token, back to its own slot, where no token's state went elsewhere (the
        intermediate buffer, a destination slot)."""
        if (flags & (INTERMEDIATE | HAS_DST)) == 0:
            spred = T.And(T.Not(pad), (flags & UPDATE) != 0)
            pool_row_store(S, SC, SEED, sf, off, packed, qscale, ph, h, lr, row_base, m, slot, slot, spred, dim,
                           row0, state_stride, scale_sb, philox_rounds_arg)

    def row_dequant(SC, pad, slot, scale_sb, h, dim, row0, lr):  # noqa: N803
        """int16: the row's decode scale (a pad slot's rows are zeros, its scale never read); else 1."""
        return T.if_then_else(pad, T.float32(0), SC[slot * i64(scale_sb) + i64(h * dim + row0 + lr)]) if quant \
            else T.float32(1)

    @T.prim_func
    def selective_state_update(state_ptr: T.handle, x_ptr: T.handle, dt_ptr: T.handle, a_ptr: T.handle,
                               b_ptr: T.handle, c_ptr: T.handle, d_ptr: T.handle, bias_ptr: T.handle,
                               z_ptr: T.handle, out_ptr: T.handle, idx_ptr: T.handle, dst_ptr: T.handle,
                               inter_ptr: T.handle, inter_idx_ptr: T.handle, scale_ptr: T.handle,
                               seed_ptr: T.handle,
                               batch: T.int32, nheads: T.int32, dim: T.int32, heads_per_group: T.int32,
                               ntokens: T.int32, state_stride: T.int32, x_sb: T.int32, x_st: T.int32,
                               dt_sb: T.int32, dt_st: T.int32, b_sb: T.int32, b_st: T.int32, c_sb: T.int32,
                               c_st: T.int32, z_sb: T.int32, z_st: T.int32, o_sb: T.int32, o_st: T.int32,
                               idx_s: T.int32, dst_sb: T.int32, dst_st: T.int32, inter_idx_s: T.int32,
                               cache_steps: T.int32, weight_kind: T.int32, flags: T.int32, pad_slot_id: T.int32,
                               scale_sb: T.int32, zero: T.int32, philox_rounds_arg: T.int32):
        n_state = T.int64()
        n_inter = T.int64()
        n_x = T.int32()
        n_dt = T.int32()
        n_a = T.int32()
        n_b = T.int32()
        n_c = T.int32()
        n_d = T.int32()
        n_bias = T.int32()
        n_z = T.int32()
        n_out = T.int32()
        n_idx = T.int32()
        n_dst = T.int32()
        n_iidx = T.int32()
        n_sc = T.int64()
        n_seed = T.int32()
        S = T.match_buffer(state_ptr, (n_state,), state_dtype, align=16)
        X = T.match_buffer(x_ptr, (n_x,), input_dtype, align=2)
        DT = T.match_buffer(dt_ptr, (n_dt,), "int16", align=2)
        A = T.match_buffer(a_ptr, (n_a,), "float32", align=4)
        Bm = T.match_buffer(b_ptr, (n_b,), input_dtype, align=2)
        Cm = T.match_buffer(c_ptr, (n_c,), input_dtype, align=2)
        Dv = T.match_buffer(d_ptr, (n_d,), "int16", align=2)
        BIAS = T.match_buffer(bias_ptr, (n_bias,), "int16", align=2)
        Z = T.match_buffer(z_ptr, (n_z,), input_dtype, align=2)
        OUT = T.match_buffer(out_ptr, (n_out,), input_dtype, align=2)
        IDX = T.match_buffer(idx_ptr, (n_idx,), "int32", align=4)
        DST = T.match_buffer(dst_ptr, (n_dst,), "int32", align=4)
        INTER = T.match_buffer(inter_ptr, (n_inter,), state_dtype, align=16)
        IIDX = T.match_buffer(inter_idx_ptr, (n_iidx,), "int32", align=4)
        SC = T.match_buffer(scale_ptr, (n_sc,), "float32", align=4)
        SEED = T.match_buffer(seed_ptr, (n_seed,), "int32", align=4)  # rand_seed (int64) as two words
        T.device_entry()
        if min_blocks_per_sm > 0:
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": min_blocks_per_sm})
        b, hc = T.cta_id([batch, nheads * (dim // R)])
        tid = T.thread_id([threads])
        Bs = T.alloc_shared((bc_stage,), "float32", align=16)
        Cs = T.alloc_shared((bc_stage,), "float32", align=16)
        Xs = T.alloc_shared((x_stage,), "float32")
        Zs = T.alloc_shared((x_stage,), "float32")
        Dts = T.alloc_shared((max_tokens,), "float32")
        DAs = T.alloc_shared((max_tokens,), "float32")
        regs = T.alloc_local((RT * words,), "uint32")
        sf = T.alloc_local(((RT if token_major else 1) * ncols,), "float32")
        bc = T.alloc_local((16,), "uint32")
        packed = T.alloc_local((4,), "uint32")
        acc = T.alloc_local(((RT if token_major else 1),), "float32")
        qscale = T.alloc_local((2,), "float32")
        ph = T.alloc_local((8,), "uint32")

        h = hc // (dim // R)
        row0 = (hc % (dim // R)) * R
        grp = h // heads_per_group
        g = tid // L
        m = tid % L
        is64 = (flags & INDEX64) != 0
        slot = T.if_then_else((flags & HAS_INDEX) != 0, index_value(IDX, b * idx_s, is64), i64(b))
        pad = slot == i64(pad_slot_id)
        head_base = i64(h) * i64(dim) * i64(dstate)

        if bulk_io:
            # The tile in flight first, by one thread, RT pieces on RT mbarriers (the B / C staging's barrier
            # below publishes their initialization to the waiting threads); a pad slot's tile is never loaded.
            tile = T.alloc_shared((R * dstate,), state_dtype, align=128)
            bars = T.alloc_shared((RT,), "uint64", align=8)
            if tid == 0:
                for k in T.unroll(RT):
                    mbarrier.init(bars.ptr_to([k]), 1)
                mbarrier.fence_init()
                if T.Not(pad):
                    for k in T.unroll(RT):
                        mbarrier.arrive_expect_tx(bars.ptr_to([k]), piece_bytes)
                        bulk.load(tile.ptr_to([k * groups * dstate]),
                                  S.ptr_to([slot * i64(state_stride) + head_base
                                            + i64(row0 + k * groups) * i64(dstate)]),
                                  piece_bytes, bars.ptr_to([k]))
        else:
            # State loads first (their latency is what the kernel waits on); a pad slot reads as zeros.
            for k in T.unroll(RT):
                vector.fill(regs, k * words, words)
                for v in T.unroll(vpt):
                    vector.load_v4(regs, k * words + 4 * v,
                                   S.ptr_to([slot * i64(state_stride) + head_base
                                             + i64(row0 + g + k * groups) * i64(dstate) + i64((v * L + m) * ve)]),
                                   T.Not(pad))

        # Stage B, C (group g's), x, z and the per-token dt' / exp(A dt') once per CTA, in fp32.
        if stage_vectors:
            if ((b_sb | b_st | c_sb | c_st) & 7) == 0:
                for i in T.unroll(stage_trips_bc8):
                    e = (i * threads + tid) * 8
                    t = e // dstate
                    if t < ntokens and e < bc_stage:
                        col = e % dstate
                        vector.load_v4(bc, 0, Bm.ptr_to([i64(b) * i64(b_sb) + i64(t * b_st + grp * dstate + col)]))
                        vector.load_v4(bc, 4, Cm.ptr_to([i64(b) * i64(c_sb) + i64(t * c_st + grp * dstate + col)]))
                        stage_fp32(Bs, e, bc, 0, packed)
                        stage_fp32(Cs, e, bc, 4, packed)
            else:
                for i in T.unroll(stage_trips_bc):
                    e = i * threads + tid
                    t = e // dstate
                    if t < ntokens and e < bc_stage:
                        col = e % dstate
                        Bs[e] = half_value(Bm, i64(b) * i64(b_sb) + i64(t * b_st + grp * dstate + col))
                        Cs[e] = half_value(Cm, i64(b) * i64(c_sb) + i64(t * c_st + grp * dstate + col))
        else:
            for i in T.unroll(stage_trips_bc):
                e = i * threads + tid
                t = e // dstate
                if t < ntokens and e < bc_stage:
                    col = e % dstate
                    Bs[e] = half_value(Bm, i64(b) * i64(b_sb) + i64(t * b_st + grp * dstate + col))
                    Cs[e] = half_value(Cm, i64(b) * i64(c_sb) + i64(t * c_st + grp * dstate + col))
        for i in T.unroll(stage_trips_x):
            e = i * threads + tid
            t = e // R
            if t < ntokens and e < x_stage:
                col = h * dim + row0 + e % R
                Xs[e] = half_value(X, i64(b) * i64(x_sb) + i64(t * x_st + col))
                if (flags & HAS_Z) != 0:
                    Zs[e] = half_value(Z, i64(b) * i64(z_sb) + i64(t * z_st + col))
        if tid < ntokens:
            dtv = weight_value(DT, b * dt_sb + tid * dt_st + h, weight_kind)
            if (flags & HAS_BIAS) != 0:
                dtv = dtv + weight_value(BIAS, h, weight_kind)
            if (flags & SOFTPLUS) != 0:
                dtv = T.if_then_else(dtv <= T.float32(SOFTPLUS_THRESHOLD), T.log1p(T.exp(dtv)), dtv)
            Dts[tid] = dtv
            DAs[tid] = T.exp(A[h] * dtv)
        T.cuda.cta_sync()

        a_zero = T.float32(0) if bulk_io else T.cuda.uint_as_float(vector.after_all(regs, RT * words, zero))
        d_h = weight_value(Dv, h, weight_kind)
        icache = T.if_then_else((flags & HAS_INTER_INDEX) != 0,
                                index_value(IIDX, b * inter_idx_s, is64), slot)
        if token_major:
            dtx = T.alloc_local((RT,), "float32")
            for k in T.unroll(RT):
                if bulk_io:
                    vector.fill(regs, k * words, words)
                    if T.Not(pad):
                        mbarrier.wait(bars.ptr_to([k]), 0)
                        for v in T.unroll(vpt):
                            vector.load_shared_v4(regs, k * words + 4 * v,
                                                  tile.ptr_to([(g + k * groups) * dstate + (v * L + m) * ve]))
                dequant = row_dequant(SC, pad, slot, scale_sb, h, dim, row0, g + k * groups)
                unpack_state(regs, k * words, sf, dequant, k * ncols)
                sf[k * ncols] = sf[k * ncols] + a_zero
            for t in T.serial(ntokens):
                for k in T.unroll(RT):
                    dtx[k] = Dts[t] * Xs[t * R + g + k * groups]
                token_step_rows(Bs, Cs, sf, bc, acc, t, m, DAs[t], dtx)
                if L > 1:
                    for k in T.unroll(RT):
                        acc[k] = reduce.warp_sum(acc[k], L)
                for k in T.unroll(RT):
                    row_token_out(S, OUT, INTER, DST, SC, SEED, sf, k * ncols, packed, qscale, ph, acc[k], b, t, h,
                                  g + k * groups, head_base + i64(row0 + g + k * groups) * i64(dstate), m, slot, pad,
                                  icache, d_h, Xs, Zs, flags, o_sb, o_st, dim, row0, nheads, cache_steps, dst_sb,
                                  dst_st, ntokens, pad_slot_id, state_stride, scale_sb, philox_rounds_arg, is64)
            for k in T.unroll(RT):
                lr = g + k * groups
                if state_io == "bulk_store":
                    if tile_store(pad, flags):
                        store_row_tile(tile, lr, m, sf, packed, k * ncols)
                    else:
                        row_final_store(S, SC, SEED, sf, k * ncols, packed, qscale, ph, h, lr,
                                        head_base + i64(row0 + lr) * i64(dstate), m, slot, pad, flags, dim, row0,
                                        state_stride, scale_sb, philox_rounds_arg)
                else:
                    row_final_store(S, SC, SEED, sf, k * ncols, packed, qscale, ph, h, lr,
                                    head_base + i64(row0 + lr) * i64(dstate), m, slot, pad, flags, dim, row0,
                                    state_stride, scale_sb, philox_rounds_arg)
        else:
            for k in T.unroll(RT):
                lr = g + k * groups
                row_base = head_base + i64(row0 + lr) * i64(dstate)
                if bulk_io:
                    vector.fill(regs, k * words, words)
                    if T.Not(pad):
                        mbarrier.wait(bars.ptr_to([k]), 0)
                        for v in T.unroll(vpt):
                            vector.load_shared_v4(regs, k * words + 4 * v,
                                                  tile.ptr_to([lr * dstate + (v * L + m) * ve]))
                dequant = row_dequant(SC, pad, slot, scale_sb, h, dim, row0, lr)
                unpack_state(regs, k * words, sf, dequant)
                sf[0] = sf[0] + a_zero
                for t in T.serial(ntokens):
                    dA = DAs[t]
                    dtx = Dts[t] * Xs[t * R + lr]
                    token_step(Bs, Cs, sf, bc, acc, t, m, dA, dtx)
                    total = reduce.warp_sum(acc[0], L) if L > 1 else acc[0]
                    row_token_out(S, OUT, INTER, DST, SC, SEED, sf, 0, packed, qscale, ph, total, b, t, h, lr,
                                  row_base, m, slot, pad, icache, d_h, Xs, Zs, flags, o_sb, o_st, dim, row0, nheads,
                                  cache_steps, dst_sb, dst_st, ntokens, pad_slot_id, state_stride, scale_sb,
                                  philox_rounds_arg, is64)
                if state_io == "bulk_store":
                    if tile_store(pad, flags):
                        store_row_tile(tile, lr, m, sf, packed)
                    else:
                        row_final_store(S, SC, SEED, sf, 0, packed, qscale, ph, h, lr, row_base, m, slot, pad, flags,
                                        dim, row0, state_stride, scale_sb, philox_rounds_arg)
                else:
                    row_final_store(S, SC, SEED, sf, 0, packed, qscale, ph, h, lr, row_base, m, slot, pad, flags,
                                    dim, row0, state_stride, scale_sb, philox_rounds_arg)
        if state_io == "bulk_store":
            if tile_store(pad, flags):
                # every thread's generic-proxy writes of the tile visible to the bulk engine, then one store
                bulk.fence_proxy_async()
                T.cuda.cta_sync()
                if tid == 0:
                    bulk.store(S.ptr_to([slot * i64(state_stride) + head_base + i64(row0) * i64(dstate)]),
                               tile.ptr_to([0]), R * dstate * esize)
                    bulk.commit()
                    bulk.wait_read()  # the tile is the CTA's shared memory: read out before the CTA exits

    return selective_state_update
