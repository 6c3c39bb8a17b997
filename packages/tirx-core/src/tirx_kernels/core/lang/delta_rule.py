# SPDX-License-Identifier: Apache-2.0
"""The delta-rule decode template: a recurrent state pool streamed once per call, K = V = 128, bf16 state.

Shared by the KDA (Kimi Delta Attention) decode kernels (``tirx_kernels.ported.flashinfer.kda`` and the native
``tirx_kernels.kda``); the fp32 oracle is :mod:`tirx_kernels.core.delta_rule_ref`. Per batch entry ``n`` and value
head ``hv`` (query/key head ``h = hv / (HV / H)``), state ``S`` ``[V, K]`` (a row per value, keys contiguous), token
by token::

    S = S * gate[None, :]                     (per key channel: KDA's gate; GDN's scalar gate is the constant row)
    S[v, :] += beta * (v[v] - S[v, :] . k') k'
    out[v] = S[v, :] . q'

with q' = q * rsqrt(|q|^2 + 1e-6) * scale, k' = k * rsqrt(|k|^2 + 1e-6) (or q * scale, k without the L2 norm).
The gate is ``exp(g)`` (precomputed log gate), ``exp(-exp(A_log[h]) * softplus(g + dt_bias[h, :]))`` or
``exp(lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h, :])))`` (the "lower-bound" gate); beta is taken as
given or through a sigmoid.

State pool addressing (FlashInfer's recurrent_kda contract): token ``t`` of entry ``n`` writes its state (a
checkpoint) to ``pool[slots[n, t]]``; a negative slot marks the token inactive (no state change, output 0, nothing
written). The state is read from ``source[source_index[n]]`` when a source pool is given, else from
``pool[slots[n, c]]`` with ``c = clamp(num_accepted[n] - 1, 0, T - 1)`` (``c = 0`` without ``num_accepted``); a
negative read slot reads slot 0.

Schedule: a CTA owns ``rows_per_cta`` state rows of one (n, hv); a row's 128 bf16 keys (16 vectors of 16 bytes)
spread over ``lanes_per_row`` lanes, ``rows_per_thread`` rows a thread, every state load issued before any math;
q, k, the per-channel gates (exponentiated once per CTA), v and beta staged in shared memory; the q / k norms by
warps, one (token, q-or-k) vector a warp at a time; then tokens outer, a thread's rows inner, every row's fp32
state in registers across the tokens (a thread of several rows copies the token's gate / k / q columns to registers
once and shares them); two lane-group sums a row and token (S k', then S q'). ptxas (nvcc 13.0): one-warp tile
(16 rows, 16 lanes, 8 rows a thread) 119 registers, 32-row CTAs 83 (4 lanes a row) / 168-174 (2 lanes), no spills.
Not yet measured on a GPU.
"""

from __future__ import annotations

from tirx_kernels.core import runtime

K_DIM = V_DIM = 128
MAX_TOKENS = 8
# Runtime flags (one int32 argument): which optional inputs and formulas a call uses.
L2NORM, GATE_SOFTPLUS, GATE_LOWER_BOUND, HAS_DT_BIAS, BETA_LOGIT, HAS_SOURCE, HAS_NUM_ACCEPTED = 1, 2, 4, 8, 16, 32, 64
SOFTPLUS_THRESHOLD = 20.0
L2_EPS = 1e-6

ARG_ORDER = ("S", "SRC", "Q", "Kt", "Vt", "G", "BETA", "ALOG", "BIAS", "OUT", "SLOTS", "SRCIDX", "NACC")
SCALAR_ORDER = ("batch", "ntokens", "n_heads", "n_vheads", "state_stride", "src_stride", "q_sb", "q_st", "k_sb",
                "k_st", "v_sb", "v_st", "g_sb", "g_st", "beta_sb", "beta_st", "o_sb", "o_st", "slot_sb", "slot_st",
                "srcidx_s", "flags", "scale", "lower_bound", "zero")


def threads_of(rows_per_cta: int, lanes_per_row: int, rows_per_thread: int) -> int:
    return rows_per_cta * lanes_per_row // rows_per_thread


def build_decode_kernel(max_tokens: int, rows_per_cta: int, lanes_per_row: int, rows_per_thread: int):
    """The TIRx PrimFunc of the per-channel-gate delta-rule decode for up to ``max_tokens`` tokens; grid
    ``(batch, HV * 128 / rows_per_cta)``, block ``threads_of(...)``, arguments ``ARG_ORDER`` then
    ``SCALAR_ORDER``."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import reduce, vector

    R, L, RT = rows_per_cta, lanes_per_row, rows_per_thread  # noqa: N806
    if not 1 <= max_tokens <= MAX_TOKENS or L not in (2, 4, 8, 16) or R % RT or V_DIM % R:
        raise ValueError(f"delta_rule decode: max_tokens {max_tokens} (1..{MAX_TOKENS}), lanes_per_row {L} "
                         f"(2..16, a power of two), rows_per_cta {R} (divides 128, a multiple of rows_per_thread {RT})")
    vpt = K_DIM // 8 // L  # 16-byte bf16 vectors a lane holds of a row
    ncols = 8 * vpt
    words = 4 * vpt
    threads = threads_of(R, L, RT)
    groups = threads // L
    warps = threads // 32
    if threads % 32 or groups * RT != R:
        raise ValueError(f"delta_rule decode: {threads} threads (a multiple of 32 needed)")
    stage_trips = -(-max_tokens * K_DIM // threads)
    stage_trips_v = -(-max_tokens * R // threads)
    norm_trips = -(-2 * max_tokens // warps)

    def i64(v):
        return T.Cast("int64", v)

    def bf16_value(buf, idx):
        return vector.unpack2(T.Cast("uint32", T.reinterpret("uint16", buf[idx])), "bfloat16")[0]

    def lane_col(v, m, e):
        return (v * L + m) * 8 + e

    # A token's per-lane columns (gate, k, q): read from shared memory at each use when a thread owns one row;
    # with several rows a thread, copied to registers once per token and shared by its rows.
    cached = RT > 1
    ncache = 3 * ncols if cached else 1

    def colval(smem, cols, which, t, m, v, e):
        if cached:
            return cols[which * ncols + v * 8 + e]
        return smem[t * K_DIM + lane_col(v, m, e)]

    def fill_cols(cols, gs, ks, qs, t, m):
        if cached:
            for which, smem in enumerate((gs, ks, qs)):
                for v in range(vpt):
                    for e in range(8):
                        T.buffer_store(cols, smem[t * K_DIM + lane_col(v, m, e)], [which * ncols + v * 8 + e])

    def dot(sf, sbase, smem, cols, which, t, m, acc):
        """``acc[0] =`` this lane's part of ``S[row, :] . column`` (the row at ``sf[sbase:]``)."""
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            for e in range(8):
                T.buffer_store(acc, acc[0] + sf[sbase + v * 8 + e] * colval(smem, cols, which, t, m, v, e), [0])

    def decay(sf, sbase, gs, cols, t, m):
        for v in range(vpt):
            for e in range(8):
                T.buffer_store(sf, sf[sbase + v * 8 + e] * colval(gs, cols, 0, t, m, v, e), [sbase + v * 8 + e])

    def rank1(sf, sbase, ks, cols, t, m, delta):
        for v in range(vpt):
            for e in range(8):
                T.buffer_store(sf, sf[sbase + v * 8 + e] + delta * colval(ks, cols, 1, t, m, v, e),
                               [sbase + v * 8 + e])

    def unpack_state(regs, base, sf, sbase):
        for i in range(words):
            lo, hi = vector.unpack2(regs[base + i], "bfloat16")
            T.buffer_store(sf, lo, [sbase + 2 * i])
            T.buffer_store(sf, hi, [sbase + 2 * i + 1])

    def store_state(buf, row_base, m, sf, sbase, packed):
        for v in range(vpt):
            for w in range(4):
                vector.pack2(packed, w, sf[sbase + v * 8 + 2 * w], sf[sbase + v * 8 + 2 * w + 1], "bfloat16")
            vector.store_v4(buf.ptr_to([row_base + i64(lane_col(v, m, 0))]), packed, 0)

    @T.prim_func
    def delta_rule_decode(state_ptr: T.handle, src_ptr: T.handle, q_ptr: T.handle, k_ptr: T.handle,
                          v_ptr: T.handle, g_ptr: T.handle, beta_ptr: T.handle, alog_ptr: T.handle,
                          bias_ptr: T.handle, out_ptr: T.handle, slots_ptr: T.handle, srcidx_ptr: T.handle,
                          nacc_ptr: T.handle, batch: T.int32, ntokens: T.int32, n_heads: T.int32,
                          n_vheads: T.int32, state_stride: T.int32, src_stride: T.int32, q_sb: T.int32,
                          q_st: T.int32, k_sb: T.int32, k_st: T.int32, v_sb: T.int32, v_st: T.int32,
                          g_sb: T.int32, g_st: T.int32, beta_sb: T.int32, beta_st: T.int32, o_sb: T.int32,
                          o_st: T.int32, slot_sb: T.int32, slot_st: T.int32, srcidx_s: T.int32, flags: T.int32,
                          scale: T.float32, lower_bound: T.float32, zero: T.int32):
        n_state = T.int64()
        n_src = T.int64()
        n_q = T.int32()
        n_k = T.int32()
        n_v = T.int32()
        n_g = T.int32()
        n_beta = T.int32()
        n_alog = T.int32()
        n_bias = T.int32()
        n_out = T.int32()
        n_slots = T.int32()
        n_srcidx = T.int32()
        n_nacc = T.int32()
        S = T.match_buffer(state_ptr, (n_state,), "bfloat16", align=16)
        SRC = T.match_buffer(src_ptr, (n_src,), "bfloat16", align=16)
        Q = T.match_buffer(q_ptr, (n_q,), "bfloat16", align=2)
        Kt = T.match_buffer(k_ptr, (n_k,), "bfloat16", align=2)
        Vt = T.match_buffer(v_ptr, (n_v,), "bfloat16", align=2)
        G = T.match_buffer(g_ptr, (n_g,), "bfloat16", align=2)
        BETA = T.match_buffer(beta_ptr, (n_beta,), "bfloat16", align=2)
        ALOG = T.match_buffer(alog_ptr, (n_alog,), "float32", align=4)
        BIAS = T.match_buffer(bias_ptr, (n_bias,), "float32", align=4)
        OUT = T.match_buffer(out_ptr, (n_out,), "bfloat16", align=2)
        SLOTS = T.match_buffer(slots_ptr, (n_slots,), "int32", align=4)
        SRCIDX = T.match_buffer(srcidx_ptr, (n_srcidx,), "int32", align=4)
        NACC = T.match_buffer(nacc_ptr, (n_nacc,), "int32", align=4)
        T.device_entry()
        nb, hc = T.cta_id([batch, n_vheads * (V_DIM // R)])
        tid = T.thread_id([threads])
        Qs = T.alloc_shared((max_tokens * K_DIM,), "float32", align=16)
        Ks = T.alloc_shared((max_tokens * K_DIM,), "float32", align=16)
        Gs = T.alloc_shared((max_tokens * K_DIM,), "float32", align=16)
        Vs = T.alloc_shared((max_tokens * R,), "float32")
        Betas = T.alloc_shared((max_tokens,), "float32")
        regs = T.alloc_local((RT * words,), "uint32")
        sf = T.alloc_local((RT * ncols,), "float32")
        cols = T.alloc_local((ncache,), "float32")
        packed = T.alloc_local((4,), "uint32")
        acc = T.alloc_local((1,), "float32")
        part = T.alloc_local((1,), "float32")

        hv = hc // (V_DIM // R)
        row0 = (hc % (V_DIM // R)) * R
        h = hv // (n_vheads // n_heads)
        g = tid // L
        m = tid % L
        # The slot the state is read from (a checkpoint chosen by num_accepted, or the source pool's).
        acc_tok = T.if_then_else((flags & HAS_NUM_ACCEPTED) != 0,
                                 T.max(T.min(NACC[nb] - 1, ntokens - 1), 0), 0)
        read_raw = T.if_then_else((flags & HAS_SOURCE) != 0, SRCIDX[nb * srcidx_s],
                                  SLOTS[nb * slot_sb + acc_tok * slot_st])
        read_slot = T.if_then_else(read_raw < 0, T.int64(0), i64(read_raw))
        read_stride = T.if_then_else((flags & HAS_SOURCE) != 0, src_stride, state_stride)
        head_base = i64(hv) * i64(V_DIM * K_DIM)

        # State loads first, past L1 (read once; upstream's NO_ALLOCATE too). SRC is the pool itself when the
        # call has no source pool.
        for k in T.unroll(RT):
            for v in T.unroll(vpt):
                vector.load_v4(regs, k * words + 4 * v,
                               SRC.ptr_to([read_slot * i64(read_stride) + head_base
                                           + i64(row0 + g + k * groups) * i64(K_DIM) + i64(lane_col(v, m, 0))]),
                               l1_no_allocate=True)

        # Stage every token's q, k and exponentiated per-channel gate, v rows and beta.
        a_exp = T.if_then_else((flags & (GATE_SOFTPLUS | GATE_LOWER_BOUND)) != 0, T.exp(ALOG[h]), T.float32(0))
        for i in T.unroll(stage_trips):
            e = i * threads + tid
            t = e // K_DIM
            if t < ntokens:
                c = e % K_DIM
                Qs[e] = bf16_value(Q, i64(nb) * i64(q_sb) + i64(t * q_st + h * K_DIM + c))
                Ks[e] = bf16_value(Kt, i64(nb) * i64(k_sb) + i64(t * k_st + h * K_DIM + c))
                graw = bf16_value(G, i64(nb) * i64(g_sb) + i64(t * g_st + hv * K_DIM + c))
                x = graw + T.if_then_else((flags & HAS_DT_BIAS) != 0, BIAS[h * K_DIM + c], T.float32(0))
                sp = T.if_then_else(x <= T.float32(SOFTPLUS_THRESHOLD), T.log1p(T.exp(x)), x)
                sig = T.float32(1) / (T.float32(1) + T.exp(T.float32(0) - a_exp * x))
                Gs[e] = T.exp(T.if_then_else((flags & GATE_SOFTPLUS) != 0, T.float32(0) - a_exp * sp,
                                             T.if_then_else((flags & GATE_LOWER_BOUND) != 0, lower_bound * sig,
                                                            graw)))
        for i in T.unroll(stage_trips_v):
            e = i * threads + tid
            t = e // R
            if t < ntokens:
                Vs[e] = bf16_value(Vt, i64(nb) * i64(v_sb) + i64(t * v_st + hv * V_DIM + row0 + e % R))
        if tid < ntokens:
            braw = bf16_value(BETA, i64(nb) * i64(beta_sb) + i64(tid * beta_st + hv))
            Betas[tid] = T.if_then_else((flags & BETA_LOGIT) != 0,
                                        T.float32(1) / (T.float32(1) + T.exp(T.float32(0) - braw)), braw)
        T.cuda.cta_sync()
        # q / k norms: job j = 2 t + (0 for q, 1 for k), one warp a job, 4 elements a lane; scale folded into q.
        warp = tid // 32
        lane = tid % 32
        for j in T.unroll(norm_trips):
            job = j * warps + warp
            if job < 2 * ntokens:
                base = (job // 2) * K_DIM + lane * 4
                is_q = job % 2 == 0
                part[0] = T.float32(0)
                for e in T.unroll(4):
                    xv = T.if_then_else(is_q, Qs[base + e], Ks[base + e])
                    part[0] = part[0] + xv * xv
                total = reduce.warp_sum(part[0])
                inv = T.if_then_else((flags & L2NORM) != 0, T.rsqrt(total + T.float32(L2_EPS)), T.float32(1))
                for e in T.unroll(4):
                    if is_q:
                        Qs[base + e] = Qs[base + e] * (inv * scale)
                    else:
                        Ks[base + e] = Ks[base + e] * inv
        T.cuda.cta_sync()

        a_zero = T.cuda.uint_as_float(vector.after_all(regs, RT * words, zero))
        for k in T.unroll(RT):
            unpack_state(regs, k * words, sf, k * ncols)
        sf[0] = sf[0] + a_zero
        # Tokens outer, a thread's rows inner: every row's fp32 state stays in registers across the tokens.
        for t in T.serial(ntokens):
            slot = SLOTS[nb * slot_sb + t * slot_st]
            if slot >= 0:  # uniform over the CTA: the shuffles below see every lane
                fill_cols(cols, Gs, Ks, Qs, t, m)
                for k in T.unroll(RT):
                    lr = g + k * groups
                    decay(sf, k * ncols, Gs, cols, t, m)
                    dot(sf, k * ncols, Ks, cols, 1, t, m, acc)
                    kv = reduce.warp_sum(acc[0], L)
                    delta = Betas[t] * (Vs[t * R + lr] - kv)
                    rank1(sf, k * ncols, Ks, cols, t, m, delta)
                    dot(sf, k * ncols, Qs, cols, 2, t, m, acc)
                    o = reduce.warp_sum(acc[0], L)
                    if m == 0:
                        vector.pack2(packed, 0, o, o, "bfloat16")
                        OUT[i64(nb) * i64(o_sb) + i64(t * o_st + hv * V_DIM + row0 + lr)] = T.reinterpret(
                            "bfloat16", T.Cast("uint16", packed[0]))
                    store_state(S, i64(slot) * i64(state_stride) + head_base + i64(row0 + lr) * i64(K_DIM), m, sf,
                                k * ncols, packed)
            else:
                for k in T.unroll(RT):
                    if m == 0:
                        OUT[i64(nb) * i64(o_sb) + i64(t * o_st + hv * V_DIM + row0 + g + k * groups)] = \
                            T.reinterpret("bfloat16", T.uint16(0))

    return delta_rule_decode


# ---------------------------------------------------------------------------------------------------------
# Host side: launch arguments of a call already validated by the op (torch tensors)
# ---------------------------------------------------------------------------------------------------------

_flat = runtime.flat_view  # the 1-D view over every element a strided tensor addresses


_DUMMIES: dict = {}


def _f32_dummy(device):
    """One fp32 element per device standing in for an absent A_log / dt_bias (allocated once: no allocation per
    call, none inside a CUDA-graph capture)."""
    import torch

    key = str(device)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


def launch_args(pool, q, k, v, g, beta, slots, scale, use_qk_l2norm, gate_mode, A_log, dt_bias,  # noqa: N803
                lower_bound, beta_is_logit, source, source_index, num_accepted, out, rows_per_cta, lanes_per_row,
                rows_per_thread):
    """(pointers by buffer name, scalars by name, grid, block). pool / source ``(N, HV, V, K)``; q, k ``(B, T, H,
    K)``; v, g, out ``(B, T, HV, 128)``; beta ``(B, T, HV)``; slots ``(B, T)`` int32; source_index,
    num_accepted ``(B,)`` int32 or None; A_log ``(H,)`` / dt_bias ``(H * K,)`` fp32 or None; gate_mode one of
    ``log``, ``softplus``, ``lower_bound``. Missing optional tensors are replaced by ones the kernel never reads
    (its flags say so)."""
    batch, ntokens, n_heads, _ = q.shape
    n_vheads = v.shape[2]
    flags = (L2NORM if use_qk_l2norm else 0) | (GATE_SOFTPLUS if gate_mode == "softplus" else 0) | \
        (GATE_LOWER_BOUND if gate_mode == "lower_bound" else 0) | (HAS_DT_BIAS if dt_bias is not None else 0) | \
        (BETA_LOGIT if beta_is_logit else 0) | (HAS_SOURCE if source is not None else 0) | \
        (HAS_NUM_ACCEPTED if num_accepted is not None else 0)
    f32_dummy = A_log if A_log is not None else (dt_bias if dt_bias is not None else _f32_dummy(q.device))
    src = source if source is not None else pool
    ptrs = {"S": _flat(pool), "SRC": _flat(src), "Q": _flat(q), "Kt": _flat(k), "Vt": _flat(v), "G": _flat(g),
            "BETA": _flat(beta), "ALOG": _flat(A_log if A_log is not None else f32_dummy),
            "BIAS": _flat(dt_bias if dt_bias is not None else f32_dummy), "OUT": _flat(out), "SLOTS": _flat(slots),
            "SRCIDX": _flat(source_index if source_index is not None else slots),
            "NACC": _flat(num_accepted if num_accepted is not None else slots)}
    scalars = {"batch": batch, "ntokens": ntokens, "n_heads": n_heads, "n_vheads": n_vheads,
               "state_stride": pool.stride(0), "src_stride": src.stride(0), "q_sb": q.stride(0), "q_st": q.stride(1),
               "k_sb": k.stride(0), "k_st": k.stride(1), "v_sb": v.stride(0), "v_st": v.stride(1),
               "g_sb": g.stride(0), "g_st": g.stride(1), "beta_sb": beta.stride(0), "beta_st": beta.stride(1),
               "o_sb": out.stride(0), "o_st": out.stride(1), "slot_sb": slots.stride(0), "slot_st": slots.stride(1),
               "srcidx_s": source_index.stride(0) if source_index is not None else 0, "flags": flags,
               "scale": float(scale), "lower_bound": float(lower_bound), "zero": 0}
    grid = (batch, n_vheads * (V_DIM // rows_per_cta))
    block = (threads_of(rows_per_cta, lanes_per_row, rows_per_thread),)
    return ptrs, scalars, grid, block
