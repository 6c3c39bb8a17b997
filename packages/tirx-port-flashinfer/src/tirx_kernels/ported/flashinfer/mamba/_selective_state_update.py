# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Mamba-2 selective_state_update (single-token and multi-token decode).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/mamba/selective_state_update.py
# and include/flashinfer/mamba/kernel_selective_state_update_{stp,mtp_simple}.cuh, release v0.7.4
# (commit 77039051b0be921788dc2784ec41423b558878ec). Read for semantics only; written anew in TIRx.
"""The one implementation behind the six ``selective_state_update_{stp,mtp}_{simple,vertical,horizontal}`` modules.

Math, per batch entry ``b``, head ``h`` (group ``g = h / (nheads / ngroups)``), row ``r`` of ``dim`` and token ``t``
in order (fp32 throughout, as upstream):
    dt' = dt[b,t,h] + dt_bias[h], softplus'ed (thresholded at 20) when ``dt_softplus``
    s[r, :] = s[r, :] * exp(A[h] dt') + (dt' x[b,t,h,r]) B[b,t,g, :]
    out[b,t,h,r] = s[r, :] . C[b,t,g, :] + D[h] x[b,t,h,r], times silu(z[b,t,h,r]) where z is given
``s`` starts as ``state[slot]`` with ``slot = state_batch_indices[b]`` (or ``b``); a slot equal to ``pad_slot_id``
is read as zeros and never written (its output is still computed). The state is stored once after the last token
(rounded once; ``out`` uses the unrounded fp32 state), to ``dst_state_batch_indices`` where given, not at all with
``disable_state_update``; with ``intermediate_states_buffer`` every token's state goes to
``buffer[icache * cache_steps + t]`` instead (``icache = intermediate_state_indices[b]`` or the slot) and the pool is
left alone, as upstream's simple MTP kernel (the only MTP schedule FlashInfer builds for sm90; its sm100 vertical /
horizontal ones also write the final state).

Schedule (one kernel generator, its knobs pinned by the registered modules): a CTA owns ``rows_per_cta`` rows of one
(b, h); a row is spread over ``lanes_per_row`` adjacent lanes, each holding ``dstate / lanes_per_row`` state columns
as 16-byte vectors (interleaved: lane ``m`` holds vectors ``m, m + lanes, ...``, so a warp's accesses are
contiguous), and a thread owns ``rows_per_thread`` rows whose loads all issue before any math. B, C, x, z and the
per-token dt' / exp(A dt') are staged in shared memory as fp32 once per CTA; the state stays in registers across the
tokens. Each state byte is read once and written once (16-byte vectors); a row's output is a ``lanes_per_row``-lane
shuffle sum.

Runtime arguments keep the artifact count down: dim (a multiple of rows_per_cta), the token count (up to
``max_tokens``), strides, the optional tensors (flags plus stand-in pointers), the index dtype (int32 / int64 read
through an int32 view) and the dt / D / dt_bias dtype (fp32 / bf16 / fp16 read through an int16 view). Compile
params: state dtype, input dtype (x, B, C, z, out), dstate, max_tokens and the schedule.
"""

from __future__ import annotations

import os

import torch

from tirx_kernels.core import checks, runtime

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STATE_DTYPES = ("bfloat16", "float16", "float32")
INPUT_DTYPES = ("bfloat16", "float16")
WEIGHT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # dt / D / dt_bias, read at run time
DSTATES = (64, 96, 128, 256)
DIMS = (64, 128)
MAX_TOKENS = 8
SOFTPLUS_THRESHOLD = 20.0  # upstream's thresholded_softplus: x above it is returned as is

# flags (one int32 argument): which optional tensors are real, and the mode bits
(HAS_INDEX, HAS_DST, HAS_BIAS, HAS_Z, SOFTPLUS, UPDATE, INTERMEDIATE, HAS_INTER_INDEX,
 INDEX64) = (1 << i for i in range(9))

# The schedules the registered names pin: rows a CTA owns, lanes a row, rows a thread.
#   simple:     64 rows a CTA, 8 lanes a row (bf16 dstate 128: 2 vectors a lane), 4 rows a thread: 128 threads
#   vertical:   16 rows a CTA (4x the CTAs: small batches fill the SMs), 8 lanes, 2 rows a thread: 64 threads
#   horizontal: 32 rows a CTA, a whole warp on a row's columns (32 lanes), 1 row a thread: 1024 threads max
SCHEDULES = {
    "simple": {"rows_per_cta": 64, "lanes_per_row": 8, "rows_per_thread": 4},
    "vertical": {"rows_per_cta": 16, "lanes_per_row": 8, "rows_per_thread": 2},
    "horizontal": {"rows_per_cta": 32, "lanes_per_row": 16, "rows_per_thread": 1},
}


def _vectors_per_row(state_dtype: str, dstate: int) -> int:
    return dstate * (4 if state_dtype == "float32" else 2) // 16


def plan(state_dtype: str, dstate: int, schedule: str) -> dict:
    """The schedule's knobs fitted to the row: lanes a row is the schedule's, lowered (halved) until it divides the
    row's 16-byte vectors (dstate 96 bf16: 12 vectors -> 4 lanes of 3)."""
    s = dict(SCHEDULES[schedule])
    vpr = _vectors_per_row(state_dtype, dstate)
    lanes = s["lanes_per_row"]
    while vpr % lanes:
        lanes //= 2
    s["lanes_per_row"] = lanes
    return s


def kernel_params(state_dtype: str, input_dtype: str, dstate: int, max_tokens: int, schedule: str) -> dict:
    return {"state_dtype": state_dtype, "input_dtype": input_dtype, "dstate": int(dstate),
            "max_tokens": int(max_tokens), "schedule": schedule}


# ---------------------------------------------------------------------------------------------------------
# The TIRx function
# ---------------------------------------------------------------------------------------------------------

def get_kernel(state_dtype: str, input_dtype: str, dstate: int, max_tokens: int, schedule: str):
    if state_dtype not in STATE_DTYPES or input_dtype not in INPUT_DTYPES:
        raise ValueError(f"selective_state_update: state dtype {state_dtype!r} / input dtype {input_dtype!r} not in "
                         f"{STATE_DTYPES} / {INPUT_DTYPES}")
    if dstate not in DSTATES or not 1 <= max_tokens <= MAX_TOKENS or schedule not in SCHEDULES:
        raise ValueError(f"selective_state_update: dstate {dstate} (one of {DSTATES}), max_tokens {max_tokens} "
                         f"(1..{MAX_TOKENS}), schedule {schedule!r} (one of {sorted(SCHEDULES)})")
    return build_kernel(state_dtype, input_dtype, dstate, max_tokens, **plan(state_dtype, dstate, schedule))


def build_kernel(state_dtype: str, input_dtype: str, dstate: int, max_tokens: int, rows_per_cta: int,
                 lanes_per_row: int, rows_per_thread: int):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import reduce, vector

    R, L, RT = rows_per_cta, lanes_per_row, rows_per_thread  # noqa: N806
    fp32_state = state_dtype == "float32"
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

    def unpack_state(regs, base, sf):
        """The fp32 columns of a row from its loaded words ``regs[base:base + words]``."""
        for i in range(words):
            if fp32_state:
                T.buffer_store(sf, T.cuda.uint_as_float(regs[base + i]), [i])
            else:
                lo, hi = vector.unpack2(regs[base + i], state_dtype)
                T.buffer_store(sf, lo, [2 * i])
                T.buffer_store(sf, hi, [2 * i + 1])

    def store_state(buf, row_base, m, sf, packed, pred):
        """The row's columns rounded once to the state dtype, 16-byte stores."""
        for v in range(vpt):
            if fp32_state:
                for w in range(4):
                    T.buffer_store(packed, T.cuda.float_as_uint(sf[v * 4 + w]), [w])
            else:
                for w in range(4):
                    vector.pack2(packed, w, sf[v * 8 + 2 * w], sf[v * 8 + 2 * w + 1], state_dtype)
            vector.store_v4(buf.ptr_to([row_base + i64((v * L + m) * ve)]), packed, 0, pred)

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

    @T.prim_func
    def selective_state_update(state_ptr: T.handle, x_ptr: T.handle, dt_ptr: T.handle, a_ptr: T.handle,
                               b_ptr: T.handle, c_ptr: T.handle, d_ptr: T.handle, bias_ptr: T.handle,
                               z_ptr: T.handle, out_ptr: T.handle, idx_ptr: T.handle, dst_ptr: T.handle,
                               inter_ptr: T.handle, inter_idx_ptr: T.handle,
                               batch: T.int32, nheads: T.int32, dim: T.int32, heads_per_group: T.int32,
                               ntokens: T.int32, state_stride: T.int32, x_sb: T.int32, x_st: T.int32,
                               dt_sb: T.int32, dt_st: T.int32, b_sb: T.int32, b_st: T.int32, c_sb: T.int32,
                               c_st: T.int32, z_sb: T.int32, z_st: T.int32, o_sb: T.int32, o_st: T.int32,
                               idx_s: T.int32, dst_sb: T.int32, dst_st: T.int32, inter_idx_s: T.int32,
                               cache_steps: T.int32, weight_kind: T.int32, flags: T.int32, pad_slot_id: T.int32,
                               zero: T.int32):
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
        T.device_entry()
        b, hc = T.cta_id([batch, nheads * (dim // R)])
        tid = T.thread_id([threads])
        Bs = T.alloc_shared((bc_stage,), "float32", align=16)
        Cs = T.alloc_shared((bc_stage,), "float32", align=16)
        Xs = T.alloc_shared((x_stage,), "float32")
        Zs = T.alloc_shared((x_stage,), "float32")
        Dts = T.alloc_shared((max_tokens,), "float32")
        DAs = T.alloc_shared((max_tokens,), "float32")
        regs = T.alloc_local((RT * words,), "uint32")
        sf = T.alloc_local((ncols,), "float32")
        bc = T.alloc_local((16,), "uint32")
        packed = T.alloc_local((4,), "uint32")
        acc = T.alloc_local((1,), "float32")

        h = hc // (dim // R)
        row0 = (hc % (dim // R)) * R
        grp = h // heads_per_group
        g = tid // L
        m = tid % L
        is64 = (flags & INDEX64) != 0
        slot = T.if_then_else((flags & HAS_INDEX) != 0, index_value(IDX, b * idx_s, is64), i64(b))
        pad = slot == i64(pad_slot_id)
        head_base = i64(h) * i64(dim) * i64(dstate)

        # State loads first (their latency is what the kernel waits on); a pad slot reads as zeros.
        for k in T.unroll(RT):
            vector.fill(regs, k * words, words)
            for v in T.unroll(vpt):
                vector.load_v4(regs, k * words + 4 * v,
                               S.ptr_to([slot * i64(state_stride) + head_base
                                         + i64(row0 + g + k * groups) * i64(dstate) + i64((v * L + m) * ve)]),
                               T.Not(pad))

        # Stage B, C (group g's), x, z and the per-token dt' / exp(A dt') once per CTA, in fp32.
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

        a_zero = T.cuda.uint_as_float(vector.after_all(regs, RT * words, zero))
        d_h = weight_value(Dv, h, weight_kind)
        icache = T.if_then_else((flags & HAS_INTER_INDEX) != 0,
                                index_value(IIDX, b * inter_idx_s, is64), slot)
        for k in T.unroll(RT):
            lr = g + k * groups
            row_base = head_base + i64(row0 + lr) * i64(dstate)
            unpack_state(regs, k * words, sf)
            sf[0] = sf[0] + a_zero
            for t in T.serial(ntokens):
                dA = DAs[t]
                dtx = Dts[t] * Xs[t * R + lr]
                token_step(Bs, Cs, sf, bc, acc, t, m, dA, dtx)
                total = reduce.warp_sum(acc[0], L) if L > 1 else acc[0]
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
                    store_state(INTER, (icache * i64(cache_steps) + i64(t)) * i64(nheads * dim * dstate) + row_base,
                                m, sf, packed, T.Not(pad))
                elif (flags & HAS_DST) != 0:
                    dslot = index_value(DST, b * dst_sb + t * dst_st, is64)
                    store_state(S, dslot * i64(state_stride) + row_base, m, sf, packed,
                                T.And(T.And(T.Not(pad), dslot != i64(pad_slot_id)),
                                      T.And((flags & UPDATE) != 0, T.Or(t == ntokens - 1, dst_st != 0))))
            if (flags & (INTERMEDIATE | HAS_DST)) == 0:
                store_state(S, slot * i64(state_stride) + row_base, m, sf, packed,
                            T.And(T.Not(pad), (flags & UPDATE) != 0))

    return selective_state_update


# ---------------------------------------------------------------------------------------------------------
# Launch arguments (shared by the public op and the CPU emulation tests)
# ---------------------------------------------------------------------------------------------------------

_INT32_MAX = 2**31 - 1
_ONE_INT32: dict = {}


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element over every element it addresses (strides >= 0)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return t.as_strided((span,), (1,))


def _as_u16(t: torch.Tensor) -> torch.Tensor:
    return _flat(t).view(torch.int16)


def _as_i32(t: torch.Tensor) -> torch.Tensor:
    return _flat(t).view(torch.int32)


def _stand_in_index(device) -> torch.Tensor:
    key = str(device)
    if key not in _ONE_INT32:
        _ONE_INT32[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _ONE_INT32[key]


ARG_ORDER = ("S", "X", "DT", "A", "Bm", "Cm", "Dv", "BIAS", "Z", "OUT", "IDX", "DST", "INTER", "IIDX")
SCALAR_ORDER = ("batch", "nheads", "dim", "heads_per_group", "ntokens", "state_stride", "x_sb", "x_st", "dt_sb",
                "dt_st", "b_sb", "b_st", "c_sb", "c_st", "z_sb", "z_st", "o_sb", "o_st", "idx_s", "dst_sb", "dst_st",
                "inter_idx_s", "cache_steps", "weight_kind", "flags", "pad_slot_id", "zero")


def kernel_args(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, out, update,  # noqa: N803
                inter, inter_idx, cache_steps, dst, schedule):
    """(pointers by buffer name, scalars by name, params, grid, block) of one launch. Tensors in the normalized
    forms: state (slots, nheads, dim, dstate); x, z, out (batch, T, nheads, dim); dt (batch, T, nheads) (the head
    column of FlashInfer's broadcast dim); B, C (batch, T, ngroups, dstate); A, D, dt_bias (nheads,); idx (batch,),
    dst (batch, T) with stride 0 on T for one slot a request, inter_idx (batch,)."""
    batch, T_, nheads, dim = x.shape
    dstate = state.shape[3]
    ngroups = B.shape[2]
    index64 = any(t is not None and t.dtype == torch.int64 for t in (idx, dst, inter_idx))
    flags = ((HAS_INDEX if idx is not None else 0) | (HAS_DST if dst is not None else 0)
             | (HAS_BIAS if dt_bias is not None else 0) | (HAS_Z if z is not None else 0)
             | (SOFTPLUS if dt_softplus else 0) | (UPDATE if update else 0)
             | (INTERMEDIATE if inter is not None else 0) | (HAS_INTER_INDEX if inter_idx is not None else 0)
             | (INDEX64 if index64 else 0))
    stand_in = _stand_in_index(x.device)
    ptrs = {"S": _flat(state), "X": _flat(x), "DT": _as_u16(dt), "A": _flat(A), "Bm": _flat(B), "Cm": _flat(C),
            "Dv": _as_u16(D), "BIAS": _as_u16(dt_bias if dt_bias is not None else D),
            "Z": _flat(z if z is not None else x), "OUT": _flat(out),
            "IDX": _as_i32(idx) if idx is not None else stand_in, "DST": _as_i32(dst) if dst is not None else stand_in,
            "INTER": _flat(inter if inter is not None else state),
            "IIDX": _as_i32(inter_idx) if inter_idx is not None else stand_in}
    zt = z if z is not None else x
    scalars = {"batch": batch, "nheads": nheads, "dim": dim, "heads_per_group": nheads // ngroups, "ntokens": T_,
               "state_stride": state.stride(0), "x_sb": x.stride(0), "x_st": x.stride(1), "dt_sb": dt.stride(0),
               "dt_st": dt.stride(1), "b_sb": B.stride(0), "b_st": B.stride(1), "c_sb": C.stride(0),
               "c_st": C.stride(1), "z_sb": zt.stride(0), "z_st": zt.stride(1), "o_sb": out.stride(0),
               "o_st": out.stride(1), "idx_s": idx.stride(0) if idx is not None else 0,
               "dst_sb": dst.stride(0) if dst is not None else 0, "dst_st": dst.stride(1) if dst is not None else 0,
               "inter_idx_s": inter_idx.stride(0) if inter_idx is not None else 0, "cache_steps": cache_steps,
               "weight_kind": WEIGHT_KINDS[dt.dtype], "flags": flags, "pad_slot_id": pad_slot_id, "zero": 0}
    max_tokens = 1 if T_ == 1 and schedule_is_stp(schedule) else MAX_TOKENS
    name = schedule_name(schedule)
    params = kernel_params(str(state.dtype)[6:], str(x.dtype)[6:], dstate, max_tokens, name)
    p = plan(params["state_dtype"], dstate, name)
    grid = (batch, nheads * (dim // p["rows_per_cta"]))
    block = (p["rows_per_cta"] * p["lanes_per_row"] // p["rows_per_thread"],)
    return ptrs, scalars, params, grid, block


def schedule_is_stp(schedule: str) -> bool:
    return schedule.startswith("stp_")


def schedule_name(schedule: str) -> str:
    """``stp_simple`` -> ``simple``."""
    return schedule.split("_", 1)[1]


# ---------------------------------------------------------------------------------------------------------
# The fp32 oracle
# ---------------------------------------------------------------------------------------------------------

def oracle(state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False, idx=None,  # noqa: N803
           pad_slot_id=-1, update=True, inter=None, inter_idx=None, cache_steps=0, dst=None):
    """The recurrence in fp32 on the normalized forms (``kernel_args``): ``(out fp32, state pool, inter)``, the pool
    and inter in their dtypes with only the written rows changed. Vectorized over the batch (source slots distinct,
    destinations apart from the sources, as a serving engine's indices are)."""
    batch, T_, nheads, dim = x.shape
    dstate = state.shape[3]
    hpg = nheads // B.shape[2]
    pool = state.clone()
    inter_out = inter.clone() if inter is not None else None
    slots = idx.long() if idx is not None else torch.arange(batch, device=x.device)
    live = slots != pad_slot_id
    s = torch.zeros(batch, nheads, dim, dstate, device=x.device)
    s[live] = state[slots[live]].float()
    out = torch.empty(batch, T_, nheads, dim, dtype=torch.float32, device=x.device)
    for t in range(T_):
        d = dt[:, t].float() + (dt_bias.float() if dt_bias is not None else 0)  # (batch, nheads)
        if dt_softplus:
            d = torch.where(d <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(d)), d)
        dA = torch.exp(A.float() * d)
        Bh = B[:, t].float().repeat_interleave(hpg, 1)  # (batch, nheads, dstate)
        Ch = C[:, t].float().repeat_interleave(hpg, 1)
        xv = x[:, t].float()  # (batch, nheads, dim)
        s = s * dA[..., None, None] + (d[..., None] * xv)[..., None] * Bh[:, :, None, :]
        y = (s * Ch[:, :, None, :]).sum(-1) + D.float()[:, None] * xv
        if z is not None:
            zv = z[:, t].float()
            y = y * zv * torch.sigmoid(zv)
        out[:, t] = y
        if inter is not None:
            ic = inter_idx.long() if inter_idx is not None else slots
            inter_out.view(-1, nheads, dim, dstate)[ic[live] * cache_steps + t] = s[live].to(inter.dtype)
        elif dst is not None and update and (t == T_ - 1 or dst.stride(1) != 0):
            ds = dst[:, t].long()
            ok = live & (ds != pad_slot_id)
            pool[ds[ok]] = s[ok].to(pool.dtype)
    if inter is None and dst is None and update:
        pool[slots[live]] = s[live].to(pool.dtype)
    return out, pool, inter_out


# ---------------------------------------------------------------------------------------------------------
# The public op (FlashInfer 0.7.4's signature)
# ---------------------------------------------------------------------------------------------------------

OP = "selective_state_update"
_ALGORITHMS = {"auto": "simple", "simple": "simple", "vertical": "vertical", "horizontal": "horizontal",
               "async_horizontal": "simple"}  # upstream folds async_horizontal into simple too
# "auto": the vertical schedule where the simple one leaves SMs idle (fewer than this many 64-row CTAs)
VERTICAL_BELOW_CTAS = 264


def _fail(name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def _head_column(name: str, t: torch.Tensor, lead: int, nheads: int, dim: int) -> torch.Tensor:
    """FlashInfer's broadcast per-head tensors (``(..., nheads, dim)`` with stride 0 on dim, unit stride on heads):
    the head column, ``(..., nheads)``."""
    if t.dim() != lead + 2 or tuple(t.shape[lead:]) != (nheads, dim):
        _fail(name, f"{lead + 2} dims ending in (nheads={nheads}, dim={dim})", f"shape {tuple(t.shape)}")
    if dim > 1 and t.stride(-1) != 0:
        _fail(name, "stride 0 on dim (one value a head, broadcast, as FlashInfer requires)", f"strides {t.stride()}")
    col = t[..., 0]
    if nheads > 1 and col.stride(-1) != 1:
        _fail(name, "unit stride on heads", f"strides {t.stride()}")
    return col


def normalize(state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False,  # noqa: N803, C901
              state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
              intermediate_states_buffer=None, intermediate_state_indices=None, cache_steps=0,
              dst_state_batch_indices=None) -> dict:
    """FlashInfer's argument forms validated and brought to ``kernel_args``'s normalized ones (views, no copies);
    ``out`` must already be the output tensor. Returns kernel_args' keyword arguments plus ``mtp``."""
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D)):
        if not isinstance(t, torch.Tensor):
            _fail(name, "a tensor", type(t).__name__)
    mtp = cache_steps >= 1 or x.dim() == 4
    if state.dim() == 3:
        state = state.unsqueeze(1)
    if A.dim() == 2:
        A = A.unsqueeze(0)  # noqa: N806
    if D.dim() == 1:
        D = D.unsqueeze(0)  # noqa: N806
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias.unsqueeze(0)

    def lift(t):
        """FlashInfer's (batch, dim) -> (batch, 1, dim), then a token dim: (batch, T, nheads, dim) for every call
        (T = 1 for a single-token one)."""
        if t is None:
            return None
        t = t.unsqueeze(1) if t.dim() == 2 else t
        return t.unsqueeze(1) if t.dim() == 3 else t

    x, dt, B, C, z, out = (lift(t) for t in (x, dt, B, C, z, out))  # noqa: N806
    if state.dim() != 4:
        _fail("state", "(slots, nheads, dim, dstate)", f"shape {tuple(state.shape)}")
    slots, nheads, dim, dstate = state.shape
    checks.tensor(OP, "state", state, dtypes=tuple(_DTYPES[d] for d in STATE_DTYPES), cuda=False)
    if dstate not in DSTATES:
        _fail("state", f"dstate (its last dim) one of {DSTATES}", dstate)
    if dim % SCHEDULES["simple"]["rows_per_cta"] or dim == 0:
        _fail("state", f"dim (its third dim) a positive multiple of {SCHEDULES['simple']['rows_per_cta']}", dim)
    if state.stride(3) != 1 or state.stride(2) != dstate or state.stride(1) != dim * dstate:
        _fail("state", "contiguous (nheads, dim, dstate) blocks", f"strides {state.stride()}")
    es = state.element_size()
    if state.data_ptr() % 16 or (state.stride(0) * es) % 16 or not 0 < state.stride(0) <= _INT32_MAX:
        _fail("state", "16-byte aligned slots (base and slot stride) with an int32 slot stride",
              f"data_ptr % 16 = {state.data_ptr() % 16}, strides {state.stride()}")
    lead = 2
    if x.dim() != 4 or tuple(x.shape[2:]) != (nheads, dim):
        _fail("x", f"(batch, [T,] nheads={nheads}, dim={dim})", f"shape {tuple(x.shape)}")
    batch, T_ = x.shape[:2]
    if not 1 <= T_ <= MAX_TOKENS:
        _fail("x", f"1..{MAX_TOKENS} tokens a request", T_)
    checks.tensor(OP, "x", x, dtypes=tuple(_DTYPES[d] for d in INPUT_DTYPES), cuda=False)
    for name, t, width in (("x", x, dim), ("z", z, dim), ("out", out, dim), ("B", B, dstate), ("C", C, dstate)):
        if t is None:
            continue
        groups = B.shape[2] if name in ("B", "C") and B.dim() == 4 else nheads
        if t.dim() != 4 or tuple(t.shape) != (batch, T_, groups, width):
            _fail(name, f"shape {(batch, T_, groups, width)} (as x)", f"shape {tuple(t.shape)}")
        if t.dtype != x.dtype:
            _fail(name, f"dtype {x.dtype} (x's)", t.dtype)
        if width > 1 and (t.stride(3) != 1 or t.stride(2) != width):
            _fail(name, "rows contiguous in their last two dims", f"strides {t.stride()}")
        if not all(0 <= st <= _INT32_MAX for st in t.stride()):
            _fail(name, "non-negative int32 strides", f"strides {t.stride()}")
    ngroups = B.shape[2]
    if ngroups == 0 or nheads % ngroups:
        _fail("B", f"ngroups dividing nheads={nheads}", ngroups)
    dt_col = _head_column("dt", dt, lead, nheads, dim)
    if dt.dtype not in WEIGHT_KINDS:
        _fail("dt", f"one of {sorted(map(str, WEIGHT_KINDS))}", dt.dtype)
    if A.dim() != 3 or tuple(A.shape) != (nheads, dim, dstate) or A.dtype != torch.float32:
        _fail("A", f"float32 (nheads, dim, dstate) = {(nheads, dim, dstate)}", f"{A.dtype} {tuple(A.shape)}")
    if (dim > 1 and A.stride(1) != 0) or (dstate > 1 and A.stride(2) != 0) or (nheads > 1 and A.stride(0) != 1):
        _fail("A", "strides (1, 0, 0) (one value a head, broadcast)", f"strides {A.stride()}")
    A_col = A[:, 0, 0]  # noqa: N806
    D_col = _head_column("D", D, 0, nheads, dim)  # noqa: N806
    bias_col = _head_column("dt_bias", dt_bias, 0, nheads, dim) if dt_bias is not None else None
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None and t.dtype != dt.dtype:
            _fail(name, f"dtype {dt.dtype} (dt's)", t.dtype)

    def index(name, t, two_d_ok):
        if t is None:
            return None
        if t.dtype not in (torch.int32, torch.int64):
            _fail(name, "int32 or int64", t.dtype)
        if t.dim() not in ((1, 2) if two_d_ok else (1,)) or t.shape[0] < batch:
            _fail(name, f"(batch >= {batch},)" + (" or (batch, T)" if two_d_ok else ""), f"shape {tuple(t.shape)}")
        return t

    idx = index("state_batch_indices", state_batch_indices, True)
    if idx is not None:
        idx = idx[:batch, 0] if idx.dim() == 2 else idx[:batch]
    dst = index("dst_state_batch_indices", dst_state_batch_indices, mtp)
    if dst is not None:
        if dst.dim() == 2:
            if dst.shape[1] < T_:
                _fail("dst_state_batch_indices", f"(batch, T >= {T_})", f"shape {tuple(dst.shape)}")
            dst = dst[:batch, :T_]
        else:
            dst = dst[:batch].unsqueeze(1).expand(batch, T_)
    inter = inter_idx = None
    if intermediate_states_buffer is not None and mtp:
        if dst is not None:
            _fail("intermediate_states_buffer", "None with dst_state_batch_indices (mutually exclusive)", "a tensor")
        inter = intermediate_states_buffer
        if inter.dtype != state.dtype or not inter.is_contiguous() or inter.data_ptr() % 16:
            _fail("intermediate_states_buffer", f"a contiguous, 16-byte aligned {state.dtype} tensor",
                  f"{inter.dtype}, strides {inter.stride()}")
        if cache_steps < T_ or inter.numel() % (nheads * dim * dstate):
            _fail("intermediate_states_buffer", f"(entries, cache_steps >= T={T_}, nheads, dim, dstate)",
                  f"shape {tuple(inter.shape)}, cache_steps {cache_steps}")
        inter_idx = index("intermediate_state_indices", intermediate_state_indices, False)
        inter_idx = inter_idx[:batch] if inter_idx is not None else None
    dtypes = {t.dtype for t in (idx, dst, inter_idx) if t is not None}
    if len(dtypes) > 1:
        _fail("dst_state_batch_indices", "the dtype of state_batch_indices (one index dtype a call)", dtypes)
    # upstream: a multi-token call with destination indices writes every step, whatever disable_state_update says
    update = not disable_state_update or (mtp and dst is not None)
    return dict(state=state, x=x, dt=dt_col, A=A_col, B=B, C=C, D=D_col, z=z, dt_bias=bias_col,
                dt_softplus=bool(dt_softplus), idx=idx, pad_slot_id=int(pad_slot_id), out=out, update=update,
                inter=inter, inter_idx=inter_idx, cache_steps=int(cache_steps) if inter is not None else 0, dst=dst,
                mtp=mtp)


def module_of(schedule: str):
    import importlib

    return importlib.import_module(f"{__package__}.selective_state_update_{schedule}")


_FUNCTIONS: dict = {}
_SERVED: dict = {}


def serves(schedule: str, params: dict) -> bool:
    """Whether the schedule's module has ``params`` among its bundled artifacts (artifact_params and its rows)."""
    from tirx_kernels.core import artifacts, harness

    if schedule not in _SERVED:
        mod = module_of(schedule)
        rows = [mod.compile_params(**harness.full_config(mod, c)) for c in mod.CONFIGS + mod.BENCH_CONFIGS]
        _SERVED[schedule] = {artifacts.canonical_params(p) for p in artifact_params(schedule) + rows}
    return artifacts.canonical_params(params) in _SERVED[schedule]


def pick_schedule(algorithm: str, n: dict) -> str:
    """The registered schedule a call runs: ``algorithm`` (``auto``: vertical where simple's CTAs would not fill
    the GPU), falling back to simple where that schedule's module bundles no artifact for the call."""
    stage = "mtp" if n["mtp"] else "stp"
    name = _ALGORITHMS[algorithm]
    batch, _, nheads, dim = n["x"].shape
    if algorithm == "auto" and batch * nheads * (dim // SCHEDULES["simple"]["rows_per_cta"]) < VERTICAL_BELOW_CTAS:
        name = "vertical"
    schedule = f"{stage}_{name}"
    if name != "simple" and not serves(schedule, call_params(schedule, n)):
        schedule = f"{stage}_simple"
    return schedule


def call_params(schedule: str, n: dict) -> dict:
    return kernel_params(str(n["state"].dtype)[6:], str(n["x"].dtype)[6:], n["state"].shape[3],
                         1 if schedule_is_stp(schedule) else MAX_TOKENS, schedule_name(schedule))


_TVM_ORDER = ARG_ORDER + SCALAR_ORDER


def run(schedule: str, n: dict) -> None:
    """Launch the schedule's kernel on normalized arguments (``normalize``)."""
    if n["x"].shape[0] == 0:
        return
    kw = {k: v for k, v in n.items() if k != "mtp"}
    ptrs, scalars, params, _, _ = kernel_args(**kw, schedule=schedule)
    key = (schedule, artifacts_key(params), n["x"].get_device())
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = runtime.get_function(module_of(schedule), params, n["x"].device)
    fn(*(ptrs[k] for k in ARG_ORDER), *(scalars[k] for k in SCALAR_ORDER))


def artifacts_key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _unsupported(**kw) -> None:
    for name, (value, ok) in kw.items():
        if not ok:
            _fail(name, "its default (not supported by this port yet)", repr(value) if value is None
                  or isinstance(value, (int, str)) else type(value).__name__)


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,  # noqa: N803
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, z: torch.Tensor | None = None,
                           dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                           state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                           state_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                           disable_state_update: bool = False,
                           intermediate_states_buffer: torch.Tensor | None = None,
                           intermediate_state_indices: torch.Tensor | None = None,
                           intermediate_state_scales: torch.Tensor | None = None,
                           rand_seed: torch.Tensor | None = None, philox_rounds: int = 10, cache_steps: int = 0,
                           algorithm: str = "auto", dst_state_batch_indices: torch.Tensor | None = None,
                           cu_seqlens: torch.Tensor | None = None, num_accepted_tokens: torch.Tensor | None = None,
                           backend: str = "auto") -> torch.Tensor:
    """Mamba-2 selective state update (FlashInfer 0.7.4's ``flashinfer.mamba.selective_state_update``): updates
    ``state`` in place and returns ``out`` (x's shape). Not supported yet (a ``TirxInputError`` names them): the
    int16 state with ``state_scale``, Philox stochastic rounding (``rand_seed``), ``intermediate_state_scales``,
    varlen ``cu_seqlens`` and ``num_accepted_tokens``."""
    _unsupported(state_scale=(state_scale, state_scale is None), rand_seed=(rand_seed, rand_seed is None),
                 intermediate_state_scales=(intermediate_state_scales, intermediate_state_scales is None),
                 cu_seqlens=(cu_seqlens, cu_seqlens is None),
                 num_accepted_tokens=(num_accepted_tokens, num_accepted_tokens is None),
                 algorithm=(algorithm, algorithm in _ALGORITHMS), backend=(backend, backend in ("auto", "flashinfer")))
    if out is None:
        if not isinstance(x, torch.Tensor):
            _fail("x", "a tensor", type(x).__name__)
        xs = x.unsqueeze(1) if x.dim() == 2 else x
        out = torch.empty_like(xs.unsqueeze(1) if cache_steps >= 1 and xs.dim() == 3 else xs)
    args = (state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), state_batch_indices, int(pad_slot_id), out,
            bool(disable_state_update), intermediate_states_buffer, intermediate_state_indices, int(cache_steps),
            dst_state_batch_indices)
    n = normalize(*args)
    for name, t in (("state", n["state"]), ("x", n["x"])):
        checks.tensor(OP, name, t, cuda=True)
    checks.same_device(OP, "state", n["state"], x=n["x"], B=n["B"], C=n["C"], out=n["out"])
    schedule = pick_schedule(algorithm, n)
    if runtime.direct_call(*[t for t in args if isinstance(t, torch.Tensor)]):
        run(schedule, n)
        runtime.mark_written(state)
        runtime.mark_written(out)
    else:
        getattr(torch.ops.tirx, f"selective_state_update_{schedule}")(*args)
    return out


def custom_op_body(schedule: str, *args) -> None:
    """What a module's ``tirx::selective_state_update_<schedule>`` custom op runs (the public op's arguments)."""
    run(schedule, normalize(*args))


# ---------------------------------------------------------------------------------------------------------
# Protocol pieces the six modules share (each passes its schedule)
# ---------------------------------------------------------------------------------------------------------

DEFAULTS = {"nheads": 64, "dim": 64, "dstate": 128, "ngroups": 8, "state_dtype": "bfloat16", "dtype": "bfloat16",
            "weight_dtype": "float32", "z": False, "dt_bias": True, "dt_softplus": True, "pad": False,
            "index_dtype": "int32", "intermediate": False, "dst": False, "disable_state_update": False}
# The schedules of the vertical / horizontal names bundle the common state dtypes only; other calls of those
# algorithms run the simple schedule (``pick_schedule``).
_PINNED_STATES = ("bfloat16", "float32")
_PINNED_DSTATES = (64, 128, 256)


def compile_params(schedule: str, **cfg) -> dict:
    return kernel_params(cfg["state_dtype"], cfg["dtype"], cfg["dstate"],
                         1 if schedule_is_stp(schedule) else MAX_TOKENS, schedule_name(schedule))


def artifact_params(schedule: str) -> list[dict]:
    """simple: every (state dtype, input dtype, dstate), so every valid call has an artifact; the pinned
    vertical / horizontal schedules: the common ones."""
    if schedule_name(schedule) == "simple":
        forms = [(s, i, d) for s in STATE_DTYPES for i in INPUT_DTYPES for d in DSTATES]
    else:
        forms = [(s, "bfloat16", d) for s in _PINNED_STATES for d in _PINNED_DSTATES]
    return [compile_params(schedule, state_dtype=s, dtype=i, dstate=d) for s, i, d in forms]


def call_samples(schedule: str, rng) -> list[dict]:
    """Calls the public op routes to this schedule: every dtype and dstate (simple), the pinned forms (others)."""
    out = []
    for p in artifact_params(schedule):
        for _ in range(2 if schedule_name(schedule) == "simple" else 4):
            out.append({**DEFAULTS, "state_dtype": p["state_dtype"], "dtype": p["input_dtype"],
                        "dstate": p["dstate"], "batch": rng.choice([1, 7, 64, 256]), "dim": rng.choice(DIMS),
                        "weight_dtype": rng.choice(sorted(WEIGHT_KINDS_NAMES)),
                        **({} if schedule_is_stp(schedule) else {"T": rng.randint(1, MAX_TOKENS)})})
    return out


WEIGHT_KINDS_NAMES = ("float32", "bfloat16", "float16")


def _generator(device: str) -> torch.Generator:
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def prepare_data(schedule: str, batch: int, nheads: int, dim: int, dstate: int, ngroups: int, state_dtype: str,
                 dtype: str, weight_dtype: str, z: bool, dt_bias: bool, dt_softplus: bool, pad: bool,
                 index_dtype: str, intermediate: bool, dst: bool, disable_state_update: bool, T: int = 1,  # noqa: N803
                 slots: int | None = None, device: str = "cuda", **_) -> dict:
    """FlashInfer's call forms: the pool holds ``slots`` (default batch + 3, more with dst) slots, the batch reads
    distinct random ones (entry 1 the pad slot with ``pad``) and writes elsewhere with ``dst``; dt / A / D / dt_bias
    are the broadcast per-head views FlashInfer takes."""
    g = _generator(device)
    mtp = not schedule_is_stp(schedule)
    slots = slots or (batch * (1 + (T if mtp else 1)) if dst else batch) + 3
    it, wt, st = _DTYPES[dtype], _DTYPES[weight_dtype], _DTYPES[state_dtype]
    lead = (batch, T) if mtp else (batch,)

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    order = torch.randperm(slots, generator=g, device=device)
    index_t = getattr(torch, index_dtype)
    idx = order[:batch].clone()
    if pad and batch > 1:
        idx[1] = -1
    data = {
        "state": rn(slots, nheads, dim, dstate).to(st),
        "x": rn(*lead, nheads, dim).to(it),
        "dt": rn(*lead, nheads, scale=0.5).to(wt).unsqueeze(-1).expand(*lead, nheads, dim),
        "A": (-torch.rand(nheads, generator=g, device=device) - 0.5)[:, None, None].expand(nheads, dim, dstate),
        "B": rn(*lead, ngroups, dstate).to(it),
        "C": rn(*lead, ngroups, dstate).to(it),
        "D": rn(nheads).to(wt)[:, None].expand(nheads, dim),
        "z": rn(*lead, nheads, dim).to(it) if z else None,
        "dt_bias": rn(nheads, scale=0.5).to(wt)[:, None].expand(nheads, dim) if dt_bias else None,
        "dt_softplus": bool(dt_softplus),
        "state_batch_indices": idx.to(index_t),
        "pad_slot_id": -1,
        "out": torch.empty(*lead, nheads, dim, dtype=it, device=device),
        "disable_state_update": bool(disable_state_update),
        "dst_state_batch_indices": None,
    }
    if dst:
        d = order[batch:batch + batch * (T if mtp else 1)].to(index_t)
        data["dst_state_batch_indices"] = d.reshape(batch, T) if mtp else d
    if mtp:
        # always present (INPLACE names it): a stand-in of one entry where the config writes no intermediate states
        entries = batch + 2 if intermediate else 1
        steps = T if intermediate else 1
        data["intermediate_states_buffer"] = torch.full((entries, steps, nheads, dim if intermediate else 1,
                                                         dstate if intermediate else 1), 7.0, device=device).to(st)
        data["intermediate_state_indices"] = (torch.randperm(entries, generator=g, device=device)[:batch].to(index_t)
                                              if intermediate else None)
        data["cache_steps"] = T if intermediate else 0
        data["intermediate"] = bool(intermediate)
    return data


_OP_KEYS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "state_batch_indices",
            "pad_slot_id", "out", "disable_state_update", "intermediate_states_buffer",
            "intermediate_state_indices", "cache_steps", "dst_state_batch_indices")


def op_args(data: dict) -> tuple:
    """The public op's arguments of a ``prepare_data`` dict (the stand-in intermediate buffer left out)."""
    a = {k: data.get(k) for k in _OP_KEYS}
    a["cache_steps"] = a["cache_steps"] or 0
    if not data.get("intermediate", False):
        a["intermediate_states_buffer"] = None
    return tuple(a[k] for k in _OP_KEYS)


def reference(**data) -> dict:
    """The fp32 oracle on the whole pool (and intermediate buffer): ``out`` in fp32, the pool and buffer in their
    dtypes (unwritten rows as they were)."""
    args = list(op_args(data))
    args[_OP_KEYS.index("out")] = data["out"]
    n = normalize(*args)
    want_out, pool, inter = oracle(**{k: v for k, v in n.items() if k not in ("out", "mtp")})
    res = {"out": want_out.reshape(data["out"].shape), "state": pool}
    if "intermediate_states_buffer" in data:
        res["intermediate_states_buffer"] = inter if inter is not None else data["intermediate_states_buffer"]
    return res


def launch(schedule: str, cfg: dict, data: dict) -> None:
    selective_state_update(**dict(zip(_OP_KEYS, op_args(data))), algorithm=schedule_name(schedule))


def roofline(schedule: str, batch: int, nheads: int, dim: int, dstate: int, ngroups: int, state_dtype: str,
             dtype: str, z: bool, pad: bool, intermediate: bool, disable_state_update: bool, T: int = 1,  # noqa: N803
             **_) -> dict:
    """State bytes read once and written once (per token into the intermediate buffer), plus x / z / B / C / out."""
    T = T if not schedule_is_stp(schedule) else 1  # noqa: N806
    live = batch - (1 if pad and batch > 1 else 0)
    row = nheads * dim * dstate * _DTYPES[state_dtype].itemsize
    writes = T if intermediate else (0 if disable_state_update else 1)
    es = _DTYPES[dtype].itemsize
    inputs = batch * T * (nheads * dim * (3 if z else 2) + 2 * ngroups * dstate) * es
    return {"bytes": live * row * (1 + writes) + inputs, "flops": 6 * batch * T * nheads * dim * dstate}


def _row_bits(t: torch.Tensor, lead: int) -> torch.Tensor:
    return t.reshape(lead, -1).contiguous().view(torch.uint8)


def state_comparator(key: str, tol: dict):
    """A pool / buffer comparator: slots the oracle does not write bit-identical to the input, written ones within
    the state dtype's tolerance."""
    def compare(got, want, cfg, inputs):
        from tirx_kernels.core import harness

        before = inputs[key]
        lead = before.shape[0]
        got_bits, before_bits = _row_bits(got, lead), _row_bits(before, lead)
        written = (got_bits != before_bits).any(1) | (_row_bits(want.to(before.dtype), lead) != before_bits).any(1)
        if not torch.equal(got_bits[~written], before_bits[~written]):
            raise harness.KernelCheckError(f"{key}: a slot the call does not address changed")
        atol, rtol = tol[str(before.dtype)[6:]]
        try:
            torch.testing.assert_close(got[written].float(), want[written].float(), atol=atol, rtol=rtol)
        except AssertionError as e:
            raise harness.KernelCheckError(f"{key}: {str(e)[:600]}") from None
        return {"slots_written": int(written.sum()), "slots_untouched": int((~written).sum())}
    return compare


# the catalog's test tolerances (flashinfer tests/mamba): 2e-2 on bf16 / fp16 state, 2e-3 on fp32
STATE_TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (2e-2, 2e-2), "float32": (2e-3, 2e-3)}
OUT_TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (2e-2, 2e-2), "float32": (2e-3, 2e-3)}


def get_baselines(schedule: str, **cfg) -> dict:
    """FlashInfer 0.7.4's op on copies of the pool (and intermediate buffer), its own schedule choice: upstream's
    algorithms compute the same thing, and not every one builds for every call on sm90."""
    def flashinfer():
        import flashinfer.mamba

        def fn(d):
            a = dict(zip(_OP_KEYS, op_args(d)))
            st = a["state"] = d["state"].clone()
            if a["intermediate_states_buffer"] is not None:
                a["intermediate_states_buffer"] = a["intermediate_states_buffer"].clone()
            inter = a["intermediate_states_buffer"]
            a["out"] = torch.empty_like(d["out"])
            out = flashinfer.mamba.selective_state_update(**a)
            res = {"out": out, "state": st}
            if "intermediate_states_buffer" in d:
                res["intermediate_states_buffer"] = inter if inter is not None else d["intermediate_states_buffer"]
            return res
        return fn

    return {"flashinfer": flashinfer}
