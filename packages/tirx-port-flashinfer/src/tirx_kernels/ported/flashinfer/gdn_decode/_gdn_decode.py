# SPDX-License-Identifier: Apache-2.0
# Port of FlashInfer's Gated DeltaNet decode with a bf16 state pool (gated_delta_rule_decode_pretranspose, T = 1).
# Upstream: flashinfer (https://github.com/flashinfer-ai/flashinfer), python/flashinfer/gdn_decode.py and
# flashinfer/gdn_kernels/gdn_decode_bf16_state.py, release v0.7.4 (commit 77039051b0be921788dc2784ec41423b558878ec).
# Read for semantics only; written anew in TIRx on the row layout of mamba/_selective_state_update.py.
"""Gated DeltaNet decode, one token, bf16 state pool ``[pool, HV, V, K]`` (K-last), K = V = 128.

Per batch entry ``n`` and value head ``hv`` (query/key head ``h = hv / (HV / H)``), in fp32 as upstream:
    g = exp(-exp(A_log[hv]) * softplus(a[n, hv] + dt_bias[hv]))   (softplus thresholded at 20)
    beta = sigmoid(b[n, hv])
    q' = q[n, h] * rsqrt(|q|^2 + 1e-6) * scale, k' = k[n, h] * rsqrt(|k|^2 + 1e-6) (``use_qk_l2norm``; else
    q' = q * scale, k' = k)
    S = g S;  S[v, :] += beta (v[n, hv, v] - S[v, :] . k') k';  out[n, hv, v] = S[v, :] . q'
``S`` is read from ``pool[idx[n]]`` and written (rounded once to bf16; ``out`` from the fp32 state) to
``pool[out_idx[n]]`` (default the same slot). A negative index is upstream's null buffer: slot 0 is read and written.

Schedule (the mamba kernel's): a CTA owns ``rows_per_cta`` state rows (values) of one (n, hv); a row's 128 bf16 keys
(16 vectors of 16 bytes) spread over ``lanes_per_row`` lanes, ``rows_per_thread`` rows a thread, every state load
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
HAS_OUT_INDEX, L2NORM, INDEX64 = 1, 2, 4
ROWS_PER_CTA, LANES_PER_ROW, ROWS_PER_THREAD = 32, 8, 2
_INT32_MAX = 2**31 - 1


def get_kernel(input_dtype: str, rows_per_cta: int = ROWS_PER_CTA, lanes_per_row: int = LANES_PER_ROW,
               rows_per_thread: int = ROWS_PER_THREAD):
    if input_dtype not in INPUT_DTYPES:
        raise ValueError(f"gdn_decode: input dtype {input_dtype!r} is not one of {INPUT_DTYPES}")
    return build_kernel(input_dtype, rows_per_cta, lanes_per_row, rows_per_thread)


def build_kernel(input_dtype: str, rows_per_cta: int, lanes_per_row: int, rows_per_thread: int):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import reduce, vector

    R, L, RT = rows_per_cta, lanes_per_row, rows_per_thread  # noqa: N806
    vpt = K_DIM // 8 // L  # 16-byte bf16 vectors a lane holds of a row
    ncols = 8 * vpt
    words = 4 * vpt
    threads = R * L // RT
    groups = threads // L
    assert threads % 32 == 0 and threads >= 64 and vpt >= 1
    stage_trips = -(-K_DIM // threads)

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

    def dot(sf, vecs, m, acc):
        """``acc[0] =`` this lane's part of ``S[row, :] . vecs`` (vecs: 128 fp32 in shared memory)."""
        T.buffer_store(acc, T.float32(0), [0])
        for v in range(vpt):
            for e in range(8):
                T.buffer_store(acc, acc[0] + sf[v * 8 + e] * vecs[(v * L + m) * 8 + e], [0])

    def decay(sf, g):
        for i in range(ncols):
            T.buffer_store(sf, sf[i] * g, [i])

    def rank1(sf, ks, m, delta):
        for v in range(vpt):
            for e in range(8):
                T.buffer_store(sf, sf[v * 8 + e] + delta * ks[(v * L + m) * 8 + e], [v * 8 + e])

    def unpack_state(regs, base, sf):
        for i in range(words):
            lo, hi = vector.unpack2(regs[base + i], "bfloat16")
            T.buffer_store(sf, lo, [2 * i])
            T.buffer_store(sf, hi, [2 * i + 1])

    def store_state(buf, row_base, m, sf, packed):
        for v in range(vpt):
            for w in range(4):
                vector.pack2(packed, w, sf[v * 8 + 2 * w], sf[v * 8 + 2 * w + 1], "bfloat16")
            vector.store_v4(buf.ptr_to([row_base + i64((v * L + m) * 8)]), packed, 0)

    @T.prim_func
    def gdn_decode(state_ptr: T.handle, q_ptr: T.handle, k_ptr: T.handle, v_ptr: T.handle, alog_ptr: T.handle,
                   a_ptr: T.handle, bias_ptr: T.handle, b_ptr: T.handle, out_ptr: T.handle, idx_ptr: T.handle,
                   oidx_ptr: T.handle, batch: T.int32, n_heads: T.int32, n_vheads: T.int32, state_stride: T.int32,
                   q_sb: T.int32, k_sb: T.int32, v_sb: T.int32, a_sb: T.int32, b_sb: T.int32, o_sb: T.int32,
                   idx_s: T.int32, oidx_s: T.int32, a_kind: T.int32, bias_kind: T.int32, flags: T.int32,
                   scale: T.float32, zero: T.int32):
        n_state = T.int64()
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
        S = T.match_buffer(state_ptr, (n_state,), "bfloat16", align=16)
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
        T.device_entry()
        nb, hc = T.cta_id([batch, n_vheads * (V_DIM // R)])
        tid = T.thread_id([threads])
        Qs = T.alloc_shared((K_DIM,), "float32", align=16)
        Ks = T.alloc_shared((K_DIM,), "float32", align=16)
        Vs = T.alloc_shared((R,), "float32")
        GB = T.alloc_shared((4,), "float32")  # g, beta, 1/|q| * scale, 1/|k|
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
        dst = T.if_then_else(dst_raw < T.int64(0), T.int64(0), dst_raw)
        head_base = i64(hv) * i64(V_DIM * K_DIM)

        # State loads first.
        for k in T.unroll(RT):
            for v in T.unroll(vpt):
                vector.load_v4(regs, k * words + 4 * v,
                               S.ptr_to([slot * i64(state_stride) + head_base
                                         + i64(row0 + g + k * groups) * i64(K_DIM) + i64((v * L + m) * 8)]))

        # Stage q, k, v and the gates.
        for i in T.unroll(stage_trips):
            c = i * threads + tid
            if c < K_DIM:
                Qs[c] = half_value(Q, i64(nb) * i64(q_sb) + i64(h * K_DIM + c), input_dtype)
                Ks[c] = half_value(Kt, i64(nb) * i64(k_sb) + i64(h * K_DIM + c), input_dtype)
        if tid < R:
            Vs[tid] = half_value(Vt, i64(nb) * i64(v_sb) + i64(hv * V_DIM + row0 + tid), input_dtype)
        if tid == 0:
            x = weight_value(Aw, nb * a_sb + hv, a_kind) + weight_value(BIAS, hv, bias_kind)
            sp = T.if_then_else(x <= T.float32(SOFTPLUS_THRESHOLD), T.log1p(T.exp(x)), x)
            GB[0] = T.exp(T.float32(0) - T.exp(ALOG[hv]) * sp)
            GB[1] = T.float32(1) / (T.float32(1) + T.exp(T.float32(0) - weight_value(Bw, nb * b_sb + hv, a_kind)))
        T.cuda.cta_sync()
        # Warp 0 normalizes q (and folds in scale), warp 1 k: 4 elements a lane, one warp sum each.
        if tid < 64:
            vec = T.if_then_else(tid < 32, T.int32(0), T.int32(1))
            lane = tid % 32
            part[0] = T.float32(0)
            for e in T.unroll(4):
                xv = T.if_then_else(vec == 0, Qs[lane * 4 + e], Ks[lane * 4 + e])
                part[0] = part[0] + xv * xv
            total = reduce.warp_sum(part[0])
            inv = T.if_then_else((flags & L2NORM) != 0, T.rsqrt(total + T.float32(L2_EPS)), T.float32(1))
            mul = T.if_then_else(vec == 0, inv * scale, inv)
            for e in T.unroll(4):
                if vec == 0:
                    Qs[lane * 4 + e] = Qs[lane * 4 + e] * mul
                else:
                    Ks[lane * 4 + e] = Ks[lane * 4 + e] * mul
        T.cuda.cta_sync()

        a_zero = T.cuda.uint_as_float(vector.after_all(regs, RT * words, zero))
        gate = GB[0]
        beta = GB[1]
        for k in T.unroll(RT):
            lr = g + k * groups
            unpack_state(regs, k * words, sf)
            sf[0] = sf[0] + a_zero
            decay(sf, gate)
            dot(sf, Ks, m, acc)
            kv = reduce.warp_sum(acc[0], L)
            delta = beta * (Vs[lr] - kv)
            rank1(sf, Ks, m, delta)
            dot(sf, Qs, m, acc)
            o = reduce.warp_sum(acc[0], L)
            if m == 0:
                vector.pack2(packed, 0, o, o, input_dtype)
                OUT[i64(nb) * i64(o_sb) + i64(hv * V_DIM + row0 + lr)] = T.reinterpret(
                    input_dtype, T.Cast("uint16", packed[0]))
            store_state(S, dst * i64(state_stride) + head_base + i64(row0 + lr) * i64(K_DIM), m, sf, packed)

    return gdn_decode


# ---------------------------------------------------------------------------------------------------------
# Launch arguments, oracle
# ---------------------------------------------------------------------------------------------------------

ARG_ORDER = ("S", "Q", "Kt", "Vt", "ALOG", "Aw", "BIAS", "Bw", "OUT", "IDX", "OIDX")
SCALAR_ORDER = ("batch", "n_heads", "n_vheads", "state_stride", "q_sb", "k_sb", "v_sb", "a_sb", "b_sb", "o_sb",
                "idx_s", "oidx_s", "a_kind", "bias_kind", "flags", "scale", "zero")


def _flat(t: torch.Tensor) -> torch.Tensor:
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return t.as_strided((span,), (1,))


def kernel_args(pool, q, k, v, A_log, a, dt_bias, b, out, idx, out_idx, scale, use_qk_l2norm):  # noqa: N803
    """(pointers by buffer name, scalars by name, grid, block) on the normalized forms: pool (slots, HV, V, K), q, k
    (B, H, K), v, out (B, HV, V), a, b (B, HV), A_log, dt_bias (HV,), idx, out_idx (B,) or None."""
    batch, n_heads, _ = q.shape
    n_vheads = v.shape[1]
    index64 = any(t is not None and t.dtype == torch.int64 for t in (idx, out_idx))
    flags = (HAS_OUT_INDEX if out_idx is not None else 0) | (L2NORM if use_qk_l2norm else 0) | \
        (INDEX64 if index64 else 0)
    ptrs = {"S": _flat(pool), "Q": _flat(q), "Kt": _flat(k), "Vt": _flat(v), "ALOG": _flat(A_log),
            "Aw": _flat(a).view(torch.int16), "BIAS": _flat(dt_bias).view(torch.int16),
            "Bw": _flat(b).view(torch.int16), "OUT": _flat(out), "IDX": _flat(idx).view(torch.int32),
            "OIDX": _flat(out_idx if out_idx is not None else idx).view(torch.int32)}
    scalars = {"batch": batch, "n_heads": n_heads, "n_vheads": n_vheads, "state_stride": pool.stride(0),
               "q_sb": q.stride(0), "k_sb": k.stride(0), "v_sb": v.stride(0), "a_sb": a.stride(0),
               "b_sb": b.stride(0), "o_sb": out.stride(0), "idx_s": idx.stride(0),
               "oidx_s": out_idx.stride(0) if out_idx is not None else 0, "a_kind": WEIGHT_KINDS[a.dtype],
               "bias_kind": WEIGHT_KINDS[dt_bias.dtype], "flags": flags, "scale": float(scale), "zero": 0}
    grid = (batch, n_vheads * (V_DIM // ROWS_PER_CTA))
    block = (ROWS_PER_CTA * LANES_PER_ROW // ROWS_PER_THREAD,)
    return ptrs, scalars, grid, block


def oracle(pool, q, k, v, A_log, a, dt_bias, b, idx, out_idx, scale, use_qk_l2norm):  # noqa: N803
    """fp32 recurrence on the normalized forms: ``(out fp32 (B, HV, V), new pool)``."""
    batch, n_heads, _ = q.shape
    n_vheads = v.shape[1]
    new = pool.clone()
    src = idx.long().clamp(min=0)
    dst = out_idx.long().clamp(min=0) if out_idx is not None else src
    qf = q.float().repeat_interleave(n_vheads // n_heads, 1)
    kf = k.float().repeat_interleave(n_vheads // n_heads, 1)
    if use_qk_l2norm:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + L2_EPS)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + L2_EPS)
    qf = qf * scale
    x = a.float() + dt_bias.float()
    sp = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
    g = torch.exp(-torch.exp(A_log.float()) * sp)  # (B, HV)
    beta = torch.sigmoid(b.float())
    S = pool[src].float() * g[..., None, None]  # (B, HV, V, K)
    kv = (S * kf[:, :, None, :]).sum(-1)
    S = S + (beta[..., None] * (v.float() - kv))[..., None] * kf[:, :, None, :]
    out = (S * qf[:, :, None, :]).sum(-1)
    new[dst] = S.to(pool.dtype)
    return out, new


# ---------------------------------------------------------------------------------------------------------
# The public op (FlashInfer 0.7.4's gated_delta_rule_decode_pretranspose, bf16 state, T = 1)
# ---------------------------------------------------------------------------------------------------------

OP = "gated_delta_rule_decode_pretranspose"


def _fail(name: str, expected: str, got) -> None:
    raise checks.TirxInputError(f"{OP}: argument '{name}': expected {expected}, got {got}")


def normalize(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,  # noqa: N803, C901
              initial_state_indices, output_state_indices) -> dict:
    """FlashInfer's forms validated and brought to ``kernel_args``'s (views only); ``output`` already allocated."""
    for name, t in (("q", q), ("k", k), ("v", v), ("A_log", A_log), ("a", a), ("dt_bias", dt_bias), ("b", b)):
        if not isinstance(t, torch.Tensor):
            _fail(name, "a tensor", type(t).__name__)
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[3] != K_DIM:
        _fail("q", f"(B, 1, H, {K_DIM}) (one token; K = {K_DIM})", f"shape {tuple(q.shape)}")
    batch, _, n_heads, _ = q.shape
    checks.tensor(OP, "q", q, dtypes=(torch.bfloat16, torch.float16), cuda=False)
    if tuple(k.shape) != tuple(q.shape) or k.dtype != q.dtype:
        _fail("k", f"q's shape {tuple(q.shape)} and dtype {q.dtype}", f"{k.dtype} {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:2] != (batch, 1) or v.shape[3] != V_DIM or v.dtype != q.dtype:
        _fail("v", f"(B, 1, HV, {V_DIM}) of q's dtype", f"{v.dtype} {tuple(v.shape)}")
    n_vheads = v.shape[2]
    if n_vheads % n_heads:
        _fail("v", f"HV a multiple of H={n_heads}", n_vheads)
    for name, t in (("q", q), ("k", k), ("v", v), ("output", output)):
        if t.stride(3) != 1 or (t.shape[2] > 1 and t.stride(2) != t.shape[3]):
            _fail(name, "heads contiguous in the last two dims", f"strides {t.stride()}")
    if tuple(output.shape) != (batch, 1, n_vheads, V_DIM) or output.dtype != q.dtype:
        _fail("output", f"{q.dtype} (B, 1, HV, V) = {(batch, 1, n_vheads, V_DIM)}", f"{output.dtype} {output.shape}")
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != (batch, 1, n_vheads) or t.dtype not in (torch.float16, torch.bfloat16) \
                or (n_vheads > 1 and t.stride(2) != 1):
            _fail(name, f"float16 / bfloat16 (B, 1, HV) = {(batch, 1, n_vheads)}, unit stride on heads",
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
    if pool.dim() != 4 or tuple(pool.shape[1:]) != (n_vheads, V_DIM, K_DIM) or pool.dtype != torch.bfloat16:
        _fail("initial_state" if pool_mode else "state", f"bfloat16 (slots, HV, V, K) = (*, {n_vheads}, 128, 128)",
              f"{pool.dtype} {tuple(pool.shape)}")
    if pool.stride(3) != 1 or pool.stride(2) != K_DIM or pool.stride(1) != V_DIM * K_DIM or pool.data_ptr() % 16 \
            or (pool.stride(0) * 2) % 16 or not 0 < pool.stride(0) <= _INT32_MAX:
        _fail("initial_state" if pool_mode else "state", "contiguous 16-byte aligned (HV, V, K) slots",
              f"strides {pool.stride()}")
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
    scale = K_DIM ** -0.5 if scale is None else float(scale)
    return dict(pool=pool, q=q[:, 0], k=k[:, 0], v=v[:, 0], A_log=A_log, a=a[:, 0], dt_bias=dt_bias, b=b[:, 0],
                out=output[:, 0], idx=idx, out_idx=out_idx, scale=scale, use_qk_l2norm=bool(use_qk_l2norm))


_FUNCTIONS: dict = {}


def run(module, n: dict) -> None:
    if n["q"].shape[0] == 0:
        return
    ptrs, scalars, _, _ = kernel_args(**n)
    key = (str(n["q"].dtype), n["q"].get_device())
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = runtime.get_function(module, {"input_dtype": str(n["q"].dtype)[6:]}, n["q"].device)
    fn(*(ptrs[k] for k in ARG_ORDER), *(scalars[k] for k in SCALAR_ORDER))


def gated_delta_rule_decode_pretranspose(module, q, k, v, state, A_log, a, dt_bias, b, scale=None,  # noqa: N803
                                         output=None, use_qk_l2norm=True, initial_state=None,
                                         initial_state_indices=None, output_state_indices=None,
                                         intermediate_states_buffer=None, disable_state_update=False,
                                         backend="auto"):
    """FlashInfer's T = 1 bf16-state decode; returns ``(output, state pool)``, the pool updated in place."""
    if intermediate_states_buffer is not None or disable_state_update:
        _fail("intermediate_states_buffer", "None and disable_state_update False (T > 1 only, as upstream)", "set")
    if backend not in ("auto", "flashinfer"):
        _fail("backend", "'auto' or 'flashinfer'", repr(backend))
    if output is None:
        if not isinstance(q, torch.Tensor) or not isinstance(v, torch.Tensor):
            _fail("q", "a tensor", type(q).__name__)
        output = torch.empty(q.shape[0], 1, v.shape[2], V_DIM, dtype=q.dtype, device=q.device)
    n = normalize(q, k, v, state, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, initial_state,
                  initial_state_indices, output_state_indices)
    checks.tensor(OP, "q", q, cuda=True)
    checks.same_device(OP, "q", q, k=k, v=v, state=n["pool"], output=output)
    args = (q, k, v, n["pool"], A_log, a, dt_bias, b, n["idx"], output_state_indices, output, n["scale"],
            n["use_qk_l2norm"])
    if runtime.direct_call(*[t for t in args if isinstance(t, torch.Tensor)]):
        run(module, n)
        runtime.mark_written(n["pool"])
        runtime.mark_written(output)
    else:
        torch.ops.tirx.gdn_decode_bf16_wide_vec_t1(*args)
    return output, n["pool"]


def custom_op_body(module, q, k, v, pool, A_log, a, dt_bias, b, idx, out_idx, output, scale,  # noqa: N803
                   use_qk_l2norm) -> None:
    run(module, normalize(q, k, v, None, A_log, a, dt_bias, b, scale, output, use_qk_l2norm, pool, idx, out_idx))
