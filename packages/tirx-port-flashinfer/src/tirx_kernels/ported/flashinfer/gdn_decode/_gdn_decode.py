# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Gated DeltaNet decode with a bf16 state pool (gated_delta_rule_decode_pretranspose, T = 1).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_decode.py and
# flashinfer/gdn_kernels/gdn_decode_bf16_state.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Read for semantics only; written anew in TIRx on the row layout of mamba/_selective_state_update.py.
"""Gated DeltaNet decode, T = 1..8 tokens, bf16 or fp32 state pool ``[pool, HV, V, K]`` (K-last), K = V = 128.

Per batch entry ``n`` and value head ``hv`` (query/key head ``h = hv / (HV / H)``), in fp32 as upstream:
    g = exp(-exp(A_log[hv]) * softplus(a[n, hv] + dt_bias[hv]))   (softplus thresholded at 20)
    beta = sigmoid(b[n, hv])
    q' = q[n, h] * rsqrt(|q|^2 + 1e-6) * scale, k' = k[n, h] * rsqrt(|k|^2 + 1e-6) (``use_qk_l2norm``; else
    q' = q * scale, k' = k)
    S = g S;  S[v, :] += beta (v[n, hv, v] - S[v, :] . k') k';  out[n, hv, v] = S[v, :] . q'
token by token. ``S`` is read from ``pool[idx[n]]`` and written after the last token (rounded once to bf16; ``out``
from the fp32 state) to ``pool[out_idx[n]]`` (default the same slot), not with ``disable_state_update``; with an
intermediate buffer every token's state goes to ``buffer[n, t]`` too. A negative index is the bf16 API's null
buffer: slot 0 is read and written. With an fp32 pool (``gated_delta_rule_mtp``) the state is kept in fp32 and a
negative read index skips its request (no state, buffer or output write; ``NEG_SKIPS``), a negative write index
writes back to the read slot.

Schedule (the mamba kernel's; ``SCHEDULES`` gives the knobs each registered name pins): a CTA owns
``rows_per_cta`` state rows (values) of one (n, hv); a row's 128 keys (16 bf16 or 32 fp32 vectors of 16 bytes)
spread over ``lanes_per_row`` lanes, ``rows_per_thread`` rows a thread, every state load
issued before any math; q', k' (normalized once per CTA by two warps), v, g and beta staged in shared memory; two
lane-group sums a row (S k', then S q').
"""

from __future__ import annotations

import torch

from tirx_kernels.core import checks, runtime

K_DIM = V_DIM = 128
INPUT_DTYPES = ("bfloat16", "float16")
WEIGHT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # a / b (16-bit), dt_bias: at run time
SOFTPLUS_THRESHOLD = 20.0
L2_EPS = 1e-6
STATE_DTYPES = ("bfloat16", "float32")
# NEG_SKIPS: a negative index skips the entry (no state or output write), the fp32-state MTP API's convention;
# without it a negative index is the bf16 API's null buffer (slot 0).
HAS_OUT_INDEX, L2NORM, INDEX64, UPDATE, INTERMEDIATE, NEG_SKIPS = 1, 2, 4, 8, 16, 32
MAX_TOKENS = 8
_INT32_MAX = 2**31 - 1

# The schedules the registered names pin: state rows a CTA owns, lanes a row, rows a thread (loads in flight).
#   wide_vec:  32 rows, a bf16 row on 8 lanes (two 16-byte vectors a lane), 2 rows a thread: 128 threads
#   ilp4:      64 rows, 8 lanes a row, 4 independent rows a thread, every load issued first: 128 threads
#   warp_ilp2 / warp_ilp4 (fp32 state): a warp on each row (one 16-byte fp32 vector a lane, the dot products
#              full-warp sums), 2 or 4 rows a warp in flight, 4 warps a CTA: 8 or 16 rows a CTA, 128 threads
SCHEDULES = {
    "wide_vec": {"rows_per_cta": 32, "lanes_per_row": 8, "rows_per_thread": 2},
    "ilp4": {"rows_per_cta": 64, "lanes_per_row": 8, "rows_per_thread": 4},
    "warp_ilp2": {"rows_per_cta": 8, "lanes_per_row": 32, "rows_per_thread": 2},
    "warp_ilp4": {"rows_per_cta": 16, "lanes_per_row": 32, "rows_per_thread": 4},
}
ROWS_PER_CTA, LANES_PER_ROW, ROWS_PER_THREAD = (SCHEDULES["wide_vec"][k] for k in
                                                ("rows_per_cta", "lanes_per_row", "rows_per_thread"))


def get_kernel(input_dtype: str, max_tokens: int, schedule: str = "wide_vec", state_dtype: str = "bfloat16"):
    if input_dtype not in INPUT_DTYPES or not 1 <= max_tokens <= MAX_TOKENS or schedule not in SCHEDULES \
            or state_dtype not in STATE_DTYPES:
        raise ValueError(f"gdn_decode: input dtype {input_dtype!r} (one of {INPUT_DTYPES}), max_tokens {max_tokens} "
                         f"(1..{MAX_TOKENS}), schedule {schedule!r} (one of {sorted(SCHEDULES)}), state dtype "
                         f"{state_dtype!r} (one of {STATE_DTYPES})")
    return build_kernel(input_dtype, max_tokens, state_dtype=state_dtype, **SCHEDULES[schedule])


def build_kernel(input_dtype: str, max_tokens: int, rows_per_cta: int, lanes_per_row: int, rows_per_thread: int,
                 state_dtype: str = "bfloat16"):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import reduce, vector

    R, L, RT = rows_per_cta, lanes_per_row, rows_per_thread  # noqa: N806
    fp32_state = state_dtype == "float32"
    ve = 4 if fp32_state else 8  # state elements a 16-byte vector
    vpt = K_DIM // ve // L  # 16-byte vectors a lane holds of a row
    ncols = ve * vpt
    words = 4 * vpt
    threads = R * L // RT
    groups = threads // L
    assert threads % 32 == 0 and threads >= 64 and vpt >= 1
    stage_trips = -(-max_tokens * K_DIM // threads)
    stage_trips_v = -(-max_tokens * R // threads)

    def i64(v):
        return T.Cast("int64", v)

    def half_value(buf, idx, dtype):
        return vector.unpack2(T.Cast("uint32", T.reinterpret("uint16", buf[idx])), dtype)[0]

    def _u32(h):
        """The 16 bits of an int16 element, zero-extended."""
        return T.Cast("uint32", T.reinterpret("uint16", h))

    def weight_value(W, e, kind):  # noqa: N803
        """fp32 value of element ``e`` of an a / b / dt_bias tensor seen as int16 (fp32, bf16 or fp16)."""
        f32 = T.reinterpret("float32", (_u32(W[e + e + 1]) << T.uint32(16)) | _u32(W[e + e]))
        return T.if_then_else(kind == 0, f32, T.if_then_else(
            kind == 1, T.reinterpret("float32", _u32(W[e]) << T.uint32(16)),
            T.Cast("float32", T.reinterpret("float16", W[e]))))

    def index_value(Ix, i, is64):  # noqa: N803
        lo = Ix[T.if_then_else(is64, i + i, i)]
        wide = (i64(Ix[i + i + 1]) << T.int64(32)) | i64(T.Cast("uint32", lo))
        return T.if_then_else(is64, wide, i64(lo))

    def dot(sf, vecs, base, m, acc):
        """``acc[0] =`` this lane's part of ``S[row, :] . vecs[base:base + 128]`` (fp32 in shared memory)."""
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            for e in range(ve):
                T.buffer_store(acc, acc[0] + sf[v * ve + e] * vecs[base + (v * L + m) * ve + e], [0])

    def decay(sf, g):
        for i in range(ncols):
            T.buffer_store(sf, sf[i] * g, [i])

    def rank1(sf, ks, base, m, delta):
        for v in range(vpt):
            for e in range(ve):
                T.buffer_store(sf, sf[v * ve + e] + delta * ks[base + (v * L + m) * ve + e], [v * ve + e])

    def unpack_state(regs, base, sf):
        for i in range(words):
            if fp32_state:
                T.buffer_store(sf, T.cuda.uint_as_float(regs[base + i]), [i])
            else:
                lo, hi = vector.unpack2(regs[base + i], "bfloat16")
                T.buffer_store(sf, lo, [2 * i])
                T.buffer_store(sf, hi, [2 * i + 1])

    def store_state(buf, row_base, m, sf, packed, pred=None):
        for v in range(vpt):
            for w in range(4):
                if fp32_state:
                    T.buffer_store(packed, T.cuda.float_as_uint(sf[v * 4 + w]), [w])
                else:
                    vector.pack2(packed, w, sf[v * 8 + 2 * w], sf[v * 8 + 2 * w + 1], "bfloat16")
            vector.store_v4(buf.ptr_to([row_base + i64((v * L + m) * ve)]), packed, 0, pred)

    @T.prim_func
    def gdn_decode(state_ptr: T.handle, q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, alog_ptr: T.handle,
                   a_ptr: T.handle, bias_ptr: T.handle, b_ptr: T.handle, out_ptr: T.handle, idx_ptr: T.handle,
                   oidx_ptr: T.handle, inter_ptr: T.handle, batch: T.int32, ntokens: T.int32, n_heads: T.int32,
                   n_vheads: T.int32, state_stride: T.int32, q_sb: T.int32, q_st: T.int32, k_sb: T.int32,
                   k_st: T.int32, v_sb: T.int32, v_st: T.int32, a_sb: T.int32, a_st: T.int32, b_sb: T.int32,
                   b_st: T.int32, o_sb: T.int32, o_st: T.int32, idx_s: T.int32, oidx_s: T.int32,
                   inter_sb: T.int32, a_kind: T.int32, bias_kind: T.int32, flags: T.int32, scale: T.float32,
                   zero: T.int32):
        n_state = T.int64()
        n_inter = T.int64()
        n_q = T.int32()
        n_k = T.int32()
        n_v = T.int32()
        n_alog = T.int32()
        n_a = T.int32()
        n_bias = T.int32()
        n_b = T.int32()
        n_out = T.int32()
        n_idx = T.int32()
        n_oidx = T.int32()
        S = T.match_buffer(state_ptr, (n_state,), state_dtype, align=16)
        Q = T.match_buffer(q_ptr, (n_q,), input_dtype, align=2)
        Kt = T.match_buffer(k_ptr, (n_k,), input_dtype, align=2)
        Vt = T.match_buffer(v_ptr, (n_v,), input_dtype, align=2)
        ALOG = T.match_buffer(alog_ptr, (n_alog,), "float32", align=4)
        Aw = T.match_buffer(a_ptr, (n_a,), "int16", align=2)
        BIAS = T.match_buffer(bias_ptr, (n_bias,), "int16", align=2)
        Bw = T.match_buffer(b_ptr, (n_b,), "int16", align=2)
        OUT = T.match_buffer(out_ptr, (n_out,), input_dtype, align=2)
        IDX = T.match_buffer(idx_ptr, (n_idx,), "int32", align=4)
        OIDX = T.match_buffer(oidx_ptr, (n_oidx,), "int32", align=4)
        INTER = T.match_buffer(inter_ptr, (n_inter,), state_dtype, align=16)
        T.device_entry()
        nb, hc = T.cta_id([batch, n_vheads * (V_DIM // R)])
        tid = T.thread_id([threads])
        Qs = T.alloc_shared((max_tokens * K_DIM,), "float32", align=16)
        Ks = T.alloc_shared((max_tokens * K_DIM,), "float32", align=16)
        Vs = T.alloc_shared((max_tokens * R,), "float32")
        Gs = T.alloc_shared((max_tokens,), "float32")
        Betas = T.alloc_shared((max_tokens,), "float32")
        regs = T.alloc_local((RT * words,), "uint32")
        sf = T.alloc_local((ncols,), "float32")
        packed = T.alloc_local((4,), "uint32")
        acc = T.alloc_local((1,), "float32")
        part = T.alloc_local((1,), "float32")

        hv = hc // (V_DIM // R)
        row0 = (hc % (V_DIM // R)) * R
        h = hv // (n_vheads // n_heads)
        g = tid // L
        m = tid % L
        is64 = (flags & INDEX64) != 0
        src = index_value(IDX, nb * idx_s, is64)
        slot = T.if_then_else(src < T.int64(0), T.int64(0), src)  # upstream's null buffer: slot 0
        dst_raw = T.if_then_else((flags & HAS_OUT_INDEX) != 0, index_value(OIDX, nb * oidx_s, is64), slot)
        skips = (flags & NEG_SKIPS) != 0
        live = T.Or(T.Not(skips), src >= T.int64(0))
        # a negative destination: upstream's null buffer (slot 0), or with NEG_SKIPS the source slot
        dst = T.if_then_else(dst_raw < T.int64(0), T.if_then_else(skips, slot, T.int64(0)), dst_raw)
        head_base = i64(hv) * i64(V_DIM * K_DIM)

        # State loads first.
        for k in T.unroll(RT):
            for v in T.unroll(vpt):
                vector.load_v4(regs, k * words + 4 * v,
                               S.ptr_to([slot * i64(state_stride) + head_base
                                         + i64(row0 + g + k * groups) * i64(K_DIM) + i64((v * L + m) * ve)]))

        # Stage every token's q, k, v rows and gates.
        for i in T.unroll(stage_trips):
            e = i * threads + tid
            t = e // K_DIM
            if t < ntokens:
                c = e % K_DIM
                Qs[e] = half_value(Q, i64(nb) * i64(q_sb) + i64(t * q_st + h * K_DIM + c), input_dtype)
                Ks[e] = half_value(Kt, i64(nb) * i64(k_sb) + i64(t * k_st + h * K_DIM + c), input_dtype)
        for i in T.unroll(stage_trips_v):
            e = i * threads + tid
            t = e // R
            if t < ntokens:
                Vs[e] = half_value(Vt, i64(nb) * i64(v_sb) + i64(t * v_st + hv * V_DIM + row0 + e % R), input_dtype)
        if tid < ntokens:
            x = weight_value(Aw, nb * a_sb + tid * a_st + hv, a_kind) + weight_value(BIAS, hv, bias_kind)
            sp = T.if_then_else(x <= T.float32(SOFTPLUS_THRESHOLD), T.log1p(T.exp(x)), x)
            Gs[tid] = T.exp(T.float32(0) - T.exp(ALOG[hv]) * sp)
            Betas[tid] = T.float32(1) / (T.float32(1) + T.exp(
                T.float32(0) - weight_value(Bw, nb * b_sb + tid * b_st + hv, a_kind)))
        T.cuda.cta_sync()
        # Warp 0 normalizes each token's q (and folds in scale), warp 1 its k: 4 elements a lane, one warp sum.
        if tid < 64:
            vec = T.if_then_else(tid < 32, T.int32(0), T.int32(1))
            lane = tid % 32
            for t in T.serial(ntokens):
                part[0] = T.float32(0)
                for e in T.unroll(4):
                    c = t * K_DIM + lane * 4 + e
                    xv = T.if_then_else(vec == 0, Qs[c], Ks[c])
                    part[0] = part[0] + xv * xv
                total = reduce.warp_sum(part[0])
                inv = T.if_then_else((flags & L2NORM) != 0, T.rsqrt(total + T.float32(L2_EPS)), T.float32(1))
                mul = T.if_then_else(vec == 0, inv * scale, inv)
                for e in T.unroll(4):
                    c = t * K_DIM + lane * 4 + e
                    if vec == 0:
                        Qs[c] = Qs[c] * mul
                    else:
                        Ks[c] = Ks[c] * mul
        T.cuda.cta_sync()

        a_zero = T.cuda.uint_as_float(vector.after_all(regs, RT * words, zero))
        for k in T.unroll(RT):
            lr = g + k * groups
            row_off = head_base + i64(row0 + lr) * i64(K_DIM)
            unpack_state(regs, k * words, sf)
            sf[0] = sf[0] + a_zero
            for t in T.serial(ntokens):
                decay(sf, Gs[t])
                dot(sf, Ks, t * K_DIM, m, acc)
                kv = reduce.warp_sum(acc[0], L)
                delta = Betas[t] * (Vs[t * R + lr] - kv)
                rank1(sf, Ks, t * K_DIM, m, delta)
                dot(sf, Qs, t * K_DIM, m, acc)
                o = reduce.warp_sum(acc[0], L)
                if T.And(m == 0, live):
                    vector.pack2(packed, 0, o, o, input_dtype)
                    OUT[i64(nb) * i64(o_sb) + i64(t * o_st + hv * V_DIM + row0 + lr)] = T.reinterpret(
                        input_dtype, T.Cast("uint16", packed[0]))
                if (flags & INTERMEDIATE) != 0:
                    store_state(INTER, i64(nb) * i64(inter_sb) + i64(t) * i64(n_vheads * V_DIM * K_DIM) + row_off,
                                m, sf, packed, live)
            if (flags & UPDATE) != 0:
                store_state(S, dst * i64(state_stride) + row_off, m, sf, packed, live)

    return gdn_decode


# ---------------------------------------------------------------------------------------------------------
# Launch arguments, oracle
# ---------------------------------------------------------------------------------------------------------

ARG_ORDER = ("S", "Q", "Kt", "Vt", "ALOG", "Aw", "BIAS", "Bw", "OUT", "IDX", "OIDX", "INTER")
SCALAR_ORDER = ("batch", "ntokens", "n_heads", "n_vheads", "state_stride", "q_sb", "q_st", "k_sb", "k_st", "v_sb",
                "v_st", "a_sb", "a_st", "b_sb", "b_st", "o_sb", "o_st", "idx_s", "oidx_s", "inter_sb", "a_kind",
                "bias_kind", "flags", "scale", "zero")


_flat = runtime.flat_view  # the 1-D view over every element a strided tensor addresses


def kernel_args(pool, q, k, v, A_log, a, dt_bias, b, out, idx, out_idx, scale, use_qk_l2norm,  # noqa: N803
                inter=None, update=True, schedule="wide_vec"):
    """(pointers by buffer name, scalars by name, grid, block) on the normalized forms: pool (slots, HV, V, K), q, k
    (B, T, H, K), v, out (B, T, HV, V), a, b (B, T, HV), A_log, dt_bias (HV,), idx, out_idx (B,) or None, inter
    (B, >= T, HV, V, K) or None."""
    batch, ntokens, n_heads, _ = q.shape
    n_vheads = v.shape[2]
    index64 = any(t is not None and t.dtype == torch.int64 for t in (idx, out_idx))
    flags = (HAS_OUT_INDEX if out_idx is not None else 0) | (L2NORM if use_qk_l2norm else 0) | \
        (INDEX64 if index64 else 0) | (UPDATE if update else 0) | (INTERMEDIATE if inter is not None else 0) | \
        (NEG_SKIPS if pool.dtype == torch.float32 else 0)
    ptrs = {"S": _flat(pool), "Q": _flat(q), "Kt": _flat(k), "Vt": _flat(v), "ALOG": _flat(A_log),
            "Aw": _flat(a).view(torch.int16), "BIAS": _flat(dt_bias).view(torch.int16),
            "Bw": _flat(b).view(torch.int16), "OUT": _flat(out), "IDX": _flat(idx).view(torch.int32),
            "OIDX": _flat(out_idx if out_idx is not None else idx).view(torch.int32),
            "INTER": _flat(inter if inter is not None else pool)}
    scalars = {"batch": batch, "ntokens": ntokens, "n_heads": n_heads, "n_vheads": n_vheads,
               "state_stride": pool.stride(0), "q_sb": q.stride(0), "q_st": q.stride(1), "k_sb": k.stride(0),
               "k_st": k.stride(1), "v_sb": v.stride(0), "v_st": v.stride(1), "a_sb": a.stride(0),
               "a_st": a.stride(1), "b_sb": b.stride(0), "b_st": b.stride(1), "o_sb": out.stride(0),
               "o_st": out.stride(1), "idx_s": idx.stride(0),
               "oidx_s": out_idx.stride(0) if out_idx is not None else 0,
               "inter_sb": inter.stride(0) if inter is not None else 0, "a_kind": WEIGHT_KINDS[a.dtype],
               "bias_kind": WEIGHT_KINDS[dt_bias.dtype], "flags": flags, "scale": float(scale), "zero": 0}
    sch = SCHEDULES[schedule]
    grid = (batch, n_vheads * (V_DIM // sch["rows_per_cta"]))
    block = (sch["rows_per_cta"] * sch["lanes_per_row"] // sch["rows_per_thread"],)
    return ptrs, scalars, grid, block


def oracle(pool, q, k, v, A_log, a, dt_bias, b, idx, out_idx, scale, use_qk_l2norm, inter=None,  # noqa: N803
           update=True, out=None):
    """fp32 recurrence on the normalized forms: ``(out fp32 (B, T, HV, V), new pool, new inter)``. An fp32 pool
    follows the fp32 MTP API: a negative index skips its entry (``out`` keeps the given tensor's rows there, the pool
    and buffer are not written) and a negative destination is the source slot."""
    batch, ntokens, n_heads, _ = q.shape
    n_vheads = v.shape[2]
    new = pool.clone()
    new_inter = inter.clone() if inter is not None else None
    src = idx.long().clamp(min=0)
    skips = pool.dtype == torch.float32
    live = idx.long() >= 0 if skips else torch.ones_like(src, dtype=torch.bool)
    dst = out_idx.long() if out_idx is not None else src
    dst = torch.where(dst < 0, src if skips else torch.zeros_like(dst), dst)
    qf = q.float().repeat_interleave(n_vheads // n_heads, 2)
    kf = k.float().repeat_interleave(n_vheads // n_heads, 2)
    if use_qk_l2norm:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + L2_EPS)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + L2_EPS)
    qf = qf * scale
    x = a.float() + dt_bias.float()
    sp = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
    g = torch.exp(-torch.exp(A_log.float()) * sp)  # (B, T, HV)
    beta = torch.sigmoid(b.float())
    S = pool[src].float()  # (B, HV, V, K)
    out_given = out
    out = torch.empty(batch, ntokens, n_vheads, V_DIM, device=q.device)
    for t in range(ntokens):
        S = S * g[:, t, :, None, None]
        kt = kf[:, t, :, None, :]
        kv = (S * kt).sum(-1)
        S = S + (beta[:, t, :, None] * (v[:, t].float() - kv))[..., None] * kt
        out[:, t] = (S * qf[:, t, :, None, :]).sum(-1)
        if inter is not None:
            new_inter[:batch, t][live] = S[live].to(inter.dtype)
    if update:
        new[dst[live]] = S[live].to(pool.dtype)
    if out is not None and not bool(live.all()):
        out[~live] = out_given[~live].float()
    return out, new, new_inter


# ---------------------------------------------------------------------------------------------------------
# The public op (FlashInfer 0.7.4's gated_delta_rule_decode_pretranspose with a bf16 state, T = 1..8)
# ---------------------------------------------------------------------------------------------------------

OP = "gated_delta_rule_decode_pretranspose"


def _fail(name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def _misaligned(t: torch.Tensor) -> bool:
    """``t.data_ptr() % 16 != 0``; False while torch.compile traces (dynamo cannot trace ``data_ptr() % 16``): the
    custom op's eager body runs ``normalize`` again on the real tensors and checks it there."""
    return not torch.compiler.is_compiling() and t.data_ptr() % 16 != 0


def normalize(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,  # noqa: N803, C901
              initial_state_indices, output_state_indices, intermediate_states_buffer=None,
              disable_state_update=False, state_dtype=torch.bfloat16) -> dict:
    """FlashInfer's forms validated and brought to ``kernel_args``'s (views only); ``output`` already allocated.
    ``state_dtype``: the pool's (and intermediate buffer's) dtype the calling API takes."""
    sname = str(state_dtype)[6:]
    for name, t in (("q", q), ("k", k), ("v", v), ("A_log", A_log), ("a", a), ("dt_bias", dt_bias), ("b", b)):
        if not isinstance(t, torch.Tensor):
            _fail(name, "a tensor", type(t).__name__)
    if q.dim() != 4 or not 1 <= q.shape[1] <= MAX_TOKENS or q.shape[3] != K_DIM:
        _fail("q", f"(B, T <= {MAX_TOKENS}, H, {K_DIM})", f"shape {tuple(q.shape)}")
    batch, ntokens, n_heads, _ = q.shape
    checks.tensor(OP, "q", q, dtypes=(torch.bfloat16, torch.float16), cuda=False)
    if tuple(k.shape) != tuple(q.shape) or k.dtype != q.dtype:
        _fail("k", f"q's shape {tuple(q.shape)} and dtype {q.dtype}", f"{k.dtype} {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:2] != (batch, ntokens) or v.shape[3] != V_DIM or v.dtype != q.dtype:
        _fail("v", f"(B, T, HV, {V_DIM}) of q's dtype", f"{v.dtype} {tuple(v.shape)}")
    n_vheads = v.shape[2]
    if n_vheads % n_heads:
        _fail("v", f"HV a multiple of H={n_heads}", n_vheads)
    if tuple(output.shape) != (batch, ntokens, n_vheads, V_DIM) or output.dtype != q.dtype:
        _fail("output", f"{q.dtype} (B, T, HV, V) = {(batch, ntokens, n_vheads, V_DIM)}",
              f"{output.dtype} {tuple(output.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("output", output)):
        if t.stride(3) != 1 or (t.shape[2] > 1 and t.stride(2) != t.shape[3]) or \
                not all(0 <= st <= _INT32_MAX for st in t.stride()):
            _fail(name, "heads contiguous in the last two dims, int32 strides", f"strides {t.stride()}")
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != (batch, ntokens, n_vheads) or t.dtype not in (torch.float16, torch.bfloat16) \
                or (n_vheads > 1 and t.stride(2) != 1):
            _fail(name, f"float16 / bfloat16 (B, T, HV) = {(batch, ntokens, n_vheads)}, unit stride on heads",
                  f"{t.dtype} {tuple(t.shape)} strides {t.stride()}")
    if a.dtype != b.dtype:
        _fail("b", f"a's dtype {a.dtype}", b.dtype)
    if tuple(A_log.shape) != (n_vheads,) or A_log.dtype != torch.float32 or A_log.stride(0) != 1:
        _fail("A_log", f"contiguous float32 (HV,) = ({n_vheads},)", f"{A_log.dtype} {tuple(A_log.shape)}")
    if tuple(dt_bias.shape) != (n_vheads,) or dt_bias.dtype not in (torch.float32, torch.bfloat16) \
            or dt_bias.stride(0) != 1:
        _fail("dt_bias", f"contiguous float32 / bfloat16 (HV,) = ({n_vheads},)", f"{dt_bias.dtype} {dt_bias.shape}")
    pool_mode = initial_state is not None
    if pool_mode == (state is not None):
        _fail("state", "exactly one of state and initial_state (with initial_state_indices)",
              "both" if pool_mode else "neither")
    pool = initial_state if pool_mode else state
    pname = "initial_state" if pool_mode else "state"
    if pool.dim() != 4 or tuple(pool.shape[1:]) != (n_vheads, V_DIM, K_DIM) or pool.dtype != state_dtype:
        _fail(pname, f"{sname} (slots, HV, V, K) = (*, {n_vheads}, 128, 128)", f"{pool.dtype} {tuple(pool.shape)}")
    es = pool.element_size()
    if pool.stride(3) != 1 or pool.stride(2) != K_DIM or pool.stride(1) != V_DIM * K_DIM or _misaligned(pool) \
            or (pool.stride(0) * es) % 16 or not 0 < pool.stride(0) <= _INT32_MAX:
        _fail(pname, "contiguous 16-byte aligned (HV, V, K) slots", f"strides {pool.stride()}")
    if pool_mode:
        idx = initial_state_indices
        if idx is None or idx.dim() != 1 or idx.shape[0] != batch or idx.dtype not in (torch.int32, torch.int64):
            _fail("initial_state_indices", f"int32/int64 (B,) = ({batch},)", None if idx is None else idx.shape)
    else:
        if initial_state_indices is not None or pool.shape[0] != batch:
            _fail("state", f"(B={batch}, HV, V, K) without indices", f"shape {tuple(pool.shape)}")
        idx = torch.arange(batch, dtype=torch.int32, device=q.device)
    out_idx = output_state_indices
    if out_idx is not None:
        if not pool_mode or out_idx.dim() != 1 or out_idx.shape[0] != batch or out_idx.dtype != idx.dtype:
            _fail("output_state_indices", f"({batch},) of initial_state_indices' dtype, with initial_state",
                  f"{out_idx.dtype} {tuple(out_idx.shape)}")
    inter = intermediate_states_buffer
    if ntokens == 1 and (inter is not None or disable_state_update):
        _fail("intermediate_states_buffer", "None and disable_state_update False at T = 1 (as upstream)", "set")
    if inter is not None:
        step = n_vheads * V_DIM * K_DIM
        if inter.dim() != 5 or inter.shape[0] < batch or inter.shape[1] < ntokens or \
                tuple(inter.shape[2:]) != (n_vheads, V_DIM, K_DIM) or inter.dtype != state_dtype or \
                inter.stride(1) != step or inter.stride(2) != V_DIM * K_DIM or inter.stride(3) != K_DIM or \
                inter.stride(4) != 1 or _misaligned(inter) or (inter.stride(0) * es) % 16 or \
                not 0 < inter.stride(0) <= _INT32_MAX:
            _fail("intermediate_states_buffer", f"{sname} (B, >= T, HV, V, K) with contiguous steps",
                  f"{inter.dtype} {tuple(inter.shape)} strides {inter.stride()}")
    scale = K_DIM ** -0.5 if scale is None else float(scale)
    return dict(pool=pool, q=q, k=k, v=v, A_log=A_log, a=a, dt_bias=dt_bias, b=b, out=output, idx=idx,
                out_idx=out_idx, scale=scale, use_qk_l2norm=bool(use_qk_l2norm), inter=inter,
                update=not disable_state_update)


_FUNCTIONS: dict = {}
# The registered modules' routes: the wide-vector pair (T = 1 / T > 1), ILP4 (bf16) and the fp32-state warp kernel.
ROUTES = ("wide_vec", "ilp4", "fp32_warp")
# fp32_warp: 4 rows a warp in flight where the grid has enough CTAs to fill the GPU at 2 rows (upstream's MTP
# config table also raises its ILP with the work units), else 2 (twice the CTAs for small batches).
WARP_ILP4_FROM_CTAS = 2048


def module_for(route: str, ntokens: int = 1):
    import importlib

    name = {"ilp4": "gdn_decode_bf16_ilp4", "fp32_warp": "gdn_decode_fp32_mtp_warp"}.get(route) or (
        "gdn_decode_bf16_wide_vec_t1" if ntokens == 1 else "gdn_decode_bf16_wide_vec_mtp")
    return importlib.import_module(f"{__package__}.{name}")


@torch.compiler.assume_constant_result
def op_name(route: str, ntokens: int) -> str:
    """The custom op serving the route's calls of ``ntokens`` tokens; imports its module (which registers it).
    torch.compile runs it rather than traces it (importlib); ``ntokens`` must be a Python int there."""
    return module_for(route, ntokens).KERNEL_META["name"]


def warp_ilp(batch: int, n_vheads: int) -> int:
    return 4 if batch * n_vheads * (V_DIM // SCHEDULES["warp_ilp2"]["rows_per_cta"]) >= WARP_ILP4_FROM_CTAS else 2


def schedule_of(route: str, batch: int, n_vheads: int) -> str:
    return f"warp_ilp{warp_ilp(batch, n_vheads)}" if route == "fp32_warp" else route


def call_params(route: str, input_dtype: str, batch: int, n_vheads: int) -> dict:
    """The compile params of the route's module for a call."""
    if route == "fp32_warp":
        return {"input_dtype": input_dtype, "ilp": warp_ilp(batch, n_vheads)}
    return {"input_dtype": input_dtype}


def run(n: dict, route: str = "wide_vec") -> None:
    batch, ntokens = n["q"].shape[:2]
    if batch == 0:
        return
    n_vheads = n["v"].shape[2]
    ptrs, scalars, _, _ = kernel_args(**n, schedule=schedule_of(route, batch, n_vheads))
    params = call_params(route, str(n["q"].dtype)[6:], batch, n_vheads)
    mod = module_for(route, ntokens)
    key = (mod.__name__, tuple(sorted(params.items())), n["q"].get_device())
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = runtime.get_function(mod, params, n["q"].device)
    fn(*(ptrs[k] for k in ARG_ORDER), *(scalars[k] for k in SCALAR_ORDER))


def state_dtype_of(route: str) -> torch.dtype:
    return torch.float32 if route == "fp32_warp" else torch.bfloat16


def decode(route, q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,  # noqa: N803
           use_qk_l2norm=True, initial_state=None, initial_state_indices=None, output_state_indices=None,
           intermediate_states_buffer=None, disable_state_update=False):
    """The public ops' body on a route: validate, then launch directly or through the route module's custom op."""
    if output is None:
        if not isinstance(q, torch.Tensor) or not isinstance(v, torch.Tensor) or q.dim() != 4 or v.dim() != 4:
            _fail("q", "a (B, T, H, K) tensor", type(q).__name__)
        output = torch.empty(q.shape[0], q.shape[1], v.shape[2], V_DIM, dtype=q.dtype, device=q.device)
    n = normalize(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
                  initial_state_indices, output_state_indices, intermediate_states_buffer, disable_state_update,
                  state_dtype_of(route))
    checks.tensor(OP, "q", q, cuda=True)
    checks.same_device(OP, "q", q, k=k, v=v, state=n["pool"], output=output)
    args = (q, k, v, n["pool"], A_log, a, dt_bias, b, n["idx"], output_state_indices, output, n["scale"],
            n["use_qk_l2norm"], intermediate_states_buffer, n["update"])
    if runtime.direct_call(*[t for t in args if isinstance(t, torch.Tensor)]):
        run(n, route)
        runtime.mark_written(n["pool"])
        runtime.mark_written(output)
        if intermediate_states_buffer is not None:
            runtime.mark_written(intermediate_states_buffer)
    else:
        # the token count as a constant (a branch dynamo guards on): a recompile may make the shape symbolic
        getattr(torch.ops.tirx, op_name(route, 1 if q.shape[1] == 1 else MAX_TOKENS))(*args)
    return output, n["pool"]


def gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,  # noqa: N803
                                         use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                                         output_state_indices=None, intermediate_states_buffer=None,
                                         disable_state_update=False, backend="auto"):
    """FlashInfer 0.7.4's GDN decode with a bf16 state (``state`` [B, HV, V, K], or the pool ``initial_state`` with
    ``initial_state_indices``), T = 1..8 tokens (``intermediate_states_buffer`` and ``disable_state_update`` for
    T > 1); returns ``(output, state)``, the state updated in place. A negative index reads and writes slot 0."""
    if backend not in ("auto", "flashinfer"):
        _fail("backend", "'auto' or 'flashinfer'", repr(backend))
    return decode("wide_vec", q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
                  initial_state_indices, output_state_indices, intermediate_states_buffer, disable_state_update)


def custom_op_body(q, k, v, pool, A_log, a, dt_bias, b, idx, out_idx, output, scale, use_qk_l2norm,  # noqa: N803
                   inter, update, route="wide_vec") -> None:
    run(normalize(q, k, v, None, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, pool, idx, out_idx, inter,
                  not update, state_dtype_of(route)), route)


# ---------------------------------------------------------------------------------------------------------
# Protocol pieces the registered modules share (``mtp``: the multi-token module)
# ---------------------------------------------------------------------------------------------------------

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _generator(device: str) -> torch.Generator:
    import os

    if device != "cuda":
        return torch.Generator().manual_seed(0)
    seed = int(os.environ["TIRX_SEED"]) if "TIRX_SEED" in os.environ else int.from_bytes(os.urandom(8), "little") >> 1
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


# Without the kernel's L2 norm, q / k come as a model passes them (normalized before the call, as FLA's
# use_qk_l2norm_in_kernel=False callers do) at norms other than 1, so that a kernel normalizing anyway is caught:
# |k| = 1.3 keeps the delta rule's step I - beta k k^T contracting (beta |k|^2 < 2); raw randn k (|k|^2 ~ 128) makes
# it grow ~(beta |k|^2)^t, past fp16's 65504 by token 6-8 in the fp32 oracle itself (H200 run 1: 19 / 82 inf outputs,
# exactly where the oracle exceeds 65504 -- FlashInfer's fp16 output overflows there too).
NOL2NORM_Q, NOL2NORM_K = 2.0, 1.3


def _prenormalized(q: torch.Tensor, k: torch.Tensor) -> tuple:
    def unit(x):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True))
    return unit(q) * NOL2NORM_Q, unit(k) * NOL2NORM_K


def prepare_data(mtp: bool, batch: int, n_heads: int, n_vheads: int, dtype: str, ab_dtype: str, bias_dtype: str,
                 use_qk_l2norm: bool, pad: bool, out_index: bool, index_dtype: str, T: int = 1,  # noqa: N803
                 intermediate: bool = False, disable_state_update: bool = False, device: str = "cuda",
                 state_dtype: str = "bfloat16", **_) -> dict:
    """A pool of 2 batch + 2 slots (slot 0 the null buffer); distinct source slots, destinations apart from them.
    The multi-token module always carries ``intermediate_states_buffer`` (INPLACE names it): a one-entry stand-in
    where the config writes none. ``state_dtype``: the pool's and buffer's (float32 for the fp32-state route)."""
    g = _generator(device)
    st = _DTYPES[state_dtype]
    t, it = _DTYPES[dtype], getattr(torch, index_dtype)
    slots = 2 * batch + 2

    def rn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    order = torch.randperm(slots - 1, generator=g, device=device) + 1
    idx = order[:batch].clone()
    if pad and batch > 1:
        idx[1] = -1
    q, k = rn(batch, T, n_heads, K_DIM), rn(batch, T, n_heads, K_DIM)
    if not use_qk_l2norm:
        q, k = _prenormalized(q, k)
    data = {
        "q": q.to(t), "k": k.to(t),
        "v": rn(batch, T, n_vheads, V_DIM).to(t), "A_log": rn(n_vheads, scale=0.5),
        "a": rn(batch, T, n_vheads).to(_DTYPES[ab_dtype]), "dt_bias": rn(n_vheads, scale=0.5).to(_DTYPES[bias_dtype]),
        "b": rn(batch, T, n_vheads).to(_DTYPES[ab_dtype]),
        "initial_state": rn(slots, n_vheads, V_DIM, K_DIM, scale=0.3).to(st),
        "initial_state_indices": idx.to(it),
        "output_state_indices": order[batch:2 * batch].to(it) if out_index else None,
        "use_qk_l2norm": bool(use_qk_l2norm),
        "output": torch.empty(batch, T, n_vheads, V_DIM, dtype=t, device=device),
    }
    if mtp:
        shape = (batch, T + 1, n_vheads, V_DIM, K_DIM) if intermediate else (1, 1, 1, 1, 1)
        data["intermediate_states_buffer"] = torch.full(shape, 7.0, device=device).to(st)
        data["intermediate"] = bool(intermediate)
        data["disable_state_update"] = bool(disable_state_update)
    return data


def op_kwargs(data: dict) -> dict:
    """The public op's keyword arguments of a ``prepare_data`` dict (the stand-in buffer left out)."""
    kw = {k: data[k] for k in ("q", "k", "v", "A_log", "a", "dt_bias", "b", "output", "use_qk_l2norm",
                               "initial_state", "initial_state_indices", "output_state_indices")}
    kw["state"] = None
    if data.get("intermediate", False):
        kw["intermediate_states_buffer"] = data["intermediate_states_buffer"]
    kw["disable_state_update"] = data.get("disable_state_update", False)
    return kw


def normalized(data: dict) -> dict:
    kw = op_kwargs(data)
    return normalize(kw["q"], kw["k"], kw["v"], None, kw["A_log"], kw["a"], kw["dt_bias"], kw["b"], None,
                     kw["output"], kw["use_qk_l2norm"], kw["initial_state"], kw["initial_state_indices"],
                     kw["output_state_indices"], kw.get("intermediate_states_buffer"), kw["disable_state_update"],
                     kw["initial_state"].dtype)


def reference(**data) -> dict:
    n = normalized(data)
    out, pool, inter = oracle(**{k: v for k, v in n.items() if k != "out"})
    res = {"output": out, "initial_state": pool}
    if "intermediate_states_buffer" in data:
        res["intermediate_states_buffer"] = inter if inter is not None else data["intermediate_states_buffer"]
    return res


def launch(cfg: dict, data: dict, route: str = "wide_vec") -> None:
    kw = op_kwargs(data)
    kw.pop("state")
    decode(route, state=None, **kw)


def roofline(batch: int, n_heads: int, n_vheads: int, dtype: str, T: int = 1, intermediate: bool = False,  # noqa: N803
             disable_state_update: bool = False, state_dtype: str = "bfloat16", **_) -> dict:
    """The state read once and written once (per token into the intermediate buffer), q / k / v / out once."""
    es = _DTYPES[dtype].itemsize
    ss = _DTYPES[state_dtype].itemsize
    writes = (0 if disable_state_update else 1) + (T if intermediate else 0)
    return {"bytes": batch * (n_vheads * V_DIM * K_DIM * ss * (1 + writes)
                              + T * (2 * n_heads + 2 * n_vheads) * K_DIM * es),
            "flops": 8 * batch * T * n_vheads * V_DIM * K_DIM}


def pool_comparator(key: str):
    """Slots (entries) the oracle does not write bit-identical to the input, written ones within the state dtype's
    tolerance (bf16 2e-2; fp32 1e-4: the oracle sums in another order)."""
    def compare(got, want, cfg, inputs):
        from tirx_kernels.core import harness

        before = inputs[key]
        lead = before.shape[0]

        def bits(t):
            return t.reshape(lead, -1).contiguous().view(torch.uint8)

        gb, bb = bits(got), bits(before)
        written = (gb != bb).any(1) | (bits(want.to(before.dtype)) != bb).any(1)
        if not torch.equal(gb[~written], bb[~written]):
            raise harness.KernelCheckError(f"{key}: a slot the call does not address changed")
        try:
            tol = 1e-4 if before.dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got[written].float(), want[written].float(), atol=tol, rtol=tol)
        except AssertionError as e:
            raise harness.KernelCheckError(f"{key}: {str(e)[:600]}") from None
        return {"slots_written": int(written.sum()), "slots_untouched": int((~written).sum())}
    return compare


def get_baselines(route: str = "wide_vec", **cfg) -> dict:
    """FlashInfer 0.7.4's op on copies of the pool (and intermediate buffer): ``gated_delta_rule_mtp`` for the fp32
    state, ``gated_delta_rule_decode_pretranspose`` for the bf16 one."""
    def flashinfer():
        import importlib.util

        import flashinfer.gdn_decode

        # FlashInfer's bf16-state and MTP decode kernels are CuTe-DSL kernels: without the stack its module imports,
        # then falls back to a legacy path that asserts an fp32 pool or calls None (H100, 2026-12-07 bench).
        if importlib.util.find_spec("cutlass") is None:
            raise ImportError("FlashInfer's GDN decode kernels need the CuTe-DSL stack (nvidia-cutlass-dsl: "
                              "`stage --cutedsl`), not installed here")

        def fn(d):
            kw = op_kwargs(d)
            pool = kw["initial_state"]
            kw["output"] = torch.empty_like(d["output"])
            if route == "fp32_warp":
                kw.pop("state")
                if kw["output_state_indices"] is None:  # an argument of later releases only
                    kw.pop("output_state_indices")
                out, _ = flashinfer.gdn_decode.gated_delta_rule_mtp(**kw)
            else:
                out, _ = flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(**kw)
            res = {"output": out, "initial_state": pool}
            if "intermediate_states_buffer" in d:
                res["intermediate_states_buffer"] = kw.get("intermediate_states_buffer",
                                                           d["intermediate_states_buffer"])
            return res
        return fn

    return {"flashinfer": flashinfer}
