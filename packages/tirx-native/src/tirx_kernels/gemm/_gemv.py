# SPDX-License-Identifier: Apache-2.0
"""Skinny C = A·Bᵀ (bf16/fp16, M <= 16) for ``fp16_bf16_gemm``: B streamed from DRAM by plain 16-byte loads
straight into ``mma.sync`` fragments, no shared-memory ring, no TMA. Same calling convention as the other
kernels (``fn(a, b, c)``, A (M, K), B (N, K), C (M, N) with row stride ``ldc``; M, N, K dynamic; K % 8 == 0).

Why: at M <= 16 the GEMM is a stream of B (N·K·2 bytes) with ~nothing to compute, and what decides its time
is how soon and how evenly every SM has enough bytes of B in flight. The wgmma kernels go through a TMA
ring of 64-element (128-byte) row pieces; here every thread keeps several 16-byte loads of B in flight in
registers, the warps of a CTA read long contiguous runs of each B row, and the whole grid is one wave.

Design (transposed: the B rows are mma's M dimension, the tokens its N):
- ``mma.sync.m16n8k16.row.col`` computes D (16 B-rows x 8 tokens) += Bt (16 x 16 K) · Xᵀ (16 K x 8 tokens).
  A dot product may visit K in any order as long as both operands use the same one, so the fragments are
  loaded whole: lane (g = lane / 4, q = lane % 4) reads 8 consecutive K-elements (16 bytes) of B rows g and
  g + 8 and of token row g, at K offset ``32 * step + 8 * q``; those 32 K-columns feed two mmas (k16 each):
  mma ``s`` takes words ``2s, 2s + 1`` of every load (``fragment_words``). One load instruction per row
  and lane, no shuffles, no shared memory.
- CTA = ``row_groups`` x ``k_lanes`` warps. Warp (r, l) owns B rows ``16 r .. 16 r + 15`` of the CTA's
  ``16 * row_groups`` rows and K-chunks ``l, l + k_lanes, ...`` of ``32 * unroll`` columns each; per chunk
  it issues all its loads (``unroll`` steps: 2 B rows + ``tokens / 8`` token rows each) before the first
  mma. B loads skip L1 and are L2 evict_first (read once; ``b_cache="stream_l2_256"`` also has L2 fetch
  256-byte blocks, 4 steps of a row); token loads stay in L1 (the CTA's other row groups read the same
  ones) and are L2 evict_last.
- The ``k_lanes`` partial sums of a row are added in shared memory (fixed order: deterministic), then one
  thread per (token, row) rounds and stores.
- Ragged shapes: loads past N, M or K are predicated off (their registers zeroed first), stores past M / N
  skipped. ``tokens`` (8 or 16) is the mma N extent: the kernel serves M <= tokens.
"""

from __future__ import annotations

TOKEN_TILES = (8, 16)  # tokens: one or two m16n8 tiles per step
K_STEP = 32  # K-columns per load step: 4 lanes x 8 elements (two k16 mmas)
VEC = 8  # 16-bit elements per 16-byte load
MMA_ROWS = 16  # B rows per warp (mma M)


def fragment_words(s: int) -> tuple[int, int]:
    """The two 32-bit words (element pairs) of a lane's 16-byte load that mma ``s`` (0 or 1) of the step takes:
    lane q's K-columns ``8q + 4s .. 8q + 4s + 3``. As A (B rows) they are a[0:2] of row g (and a[2:4] of row
    g + 8); as B (tokens) b[0:2]. Every K-column of the 32-column step is taken exactly once."""
    return 2 * s, 2 * s + 1


B_CACHE = ("stream", "stream_l2_256")  # B loads: skip L1; optionally L2 fetches 256-byte blocks (4 load steps)


def check_params(dtype: str, tokens: int, row_groups: int, k_lanes: int, unroll: int,
                 b_cache: str = "stream") -> None:
    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"gemv: dtype {dtype!r} is not bfloat16/float16")
    if tokens not in TOKEN_TILES:
        raise ValueError(f"gemv: tokens={tokens} must be one of {TOKEN_TILES}")
    if not 1 <= row_groups <= 16 or k_lanes not in (1, 2, 4, 8, 16) or row_groups * k_lanes > 16:
        raise ValueError(f"gemv: row_groups={row_groups} (1 .. 16) x k_lanes={k_lanes} (a power of two) must be "
                         "at most 16 warps")
    if unroll not in (1, 2, 4, 8):
        raise ValueError(f"gemv: unroll={unroll} must be 1, 2, 4 or 8")
    if b_cache not in B_CACHE:
        raise ValueError(f"gemv: b_cache={b_cache!r} must be one of {B_CACHE}")


def sass_expect(dtype: str, tokens: int, row_groups: int, k_lanes: int, unroll: int,
                b_cache: str = "stream") -> list[str]:
    """SASS the CPU build test asserts: the mma.sync (HMMA.16816 with an fp32 accumulator), 16-byte B loads
    that skip L1 (``.NA``; ``.LTC256B`` with ``b_cache="stream_l2_256"``), 16-bit stores."""
    kind = r"\.BF16" if dtype == "bfloat16" else r"(\.F16)?\b"
    b_load = r"LDG\.E\.NA\.LTC256B\.128" if b_cache == "stream_l2_256" else r"LDG\.E\.NA\.128"
    return [rf"HMMA\.16816\.F32{kind}", b_load, r"STG\.E\.U16"]


def build_gemv_kernel(dtype: str, tokens: int, row_groups: int, k_lanes: int, unroll: int,
                      b_cache: str = "stream", pdl: str | None = None):
    check_params(dtype, tokens, row_groups, k_lanes, unroll, b_cache)

    from tvm.script import tirx as T

    from tirx_kernels.core.lang import pdl as pdl_launch
    from tirx_kernels.core.lang import vector

    rows = MMA_ROWS * row_groups  # B rows (output columns) per CTA
    threads = 32 * row_groups * k_lanes
    tiles = tokens // 8  # m16n8 tiles per step
    chunk = K_STEP * unroll  # K-columns per warp iteration
    b_words = 8 * unroll  # 2 rows x 4 words per step
    x_words = 4 * tiles * unroll
    outputs = rows * tokens
    ptx = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx}.{ptx}.f32"
    access = vector.AccessPolicies("gemv", {"b": "evict_first", "x": "evict_last"})

    def mma_step(acc, bw, xw, u, s, t):
        """mma ``s`` of load step ``u`` for token tile ``t``: acc[4t:4t+4] += B rows (g, g+8) x tokens."""
        w0, w1 = fragment_words(s)
        xb = 4 * (tiles * u + t)
        T.evaluate(T.ptx[mma](
            acc[4 * t], acc[4 * t + 1], acc[4 * t + 2], acc[4 * t + 3],
            bw[8 * u + w0], bw[8 * u + 4 + w0], bw[8 * u + w1], bw[8 * u + 4 + w1], xw[xb + w0], xw[xb + w1],
            acc[4 * t], acc[4 * t + 1], acc[4 * t + 2], acc[4 * t + 3]))

    def lane_sum(red, idx):
        """Output ``idx``'s k_lanes partial sums, added in lane order (deterministic)."""
        total = red[idx]
        for lane in range(1, k_lanes):
            total = total + red[lane * outputs + idx]
        return total

    @T.prim_func
    def fp16_bf16_gemm_gemv(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), dtype, strides=(ldc, 1), align=16)
        T.device_entry()
        # Flat views, 64-bit offsets (N * K may pass 2^31); C row * ldc + col (TIRx 0.27 drops match_buffer
        # strides from device indexing).
        Af = T.decl_buffer((M * K,), dtype, data=A.data)
        Bf = T.decl_buffer((N * K,), dtype, data=B.data)
        Cf = T.decl_buffer((M * ldc,), dtype, data=C.data)
        cta = T.cta_id([(N + rows - 1) // rows])
        tid = T.thread_id([threads])
        bw = T.alloc_local((b_words,), "uint32")
        xw = T.alloc_local((x_words,), "uint32")
        acc = T.alloc_local((4 * tiles,), "float32")
        red = T.alloc_shared((k_lanes * outputs,), "float32")
        pol = T.alloc_local((access.count,), "uint64")
        access.create(pol)
        pdl_launch.begin(pdl)  # nothing global before this: the previous kernel may still write A or read C

        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        q = lane % 4
        group = warp % row_groups
        klane = warp // row_groups
        row_lo = cta * rows + group * MMA_ROWS + g
        row_hi = row_lo + 8
        base_lo = T.Cast("int64", row_lo) * T.Cast("int64", K)
        base_hi = T.Cast("int64", row_hi) * T.Cast("int64", K)
        for i in T.unroll(4 * tiles):
            acc[i] = T.float32(0)
        chunks = (K + chunk - 1) // chunk
        for it in range((chunks - klane + k_lanes - 1) // k_lanes):
            k0 = (klane + it * k_lanes) * chunk + q * VEC
            for u in T.unroll(unroll):
                k = k0 + u * K_STEP
                vector.fill(bw, 8 * u, 8)
                vector.fill(xw, 4 * tiles * u, 4 * tiles)
                vector.load_v4(bw, 8 * u, Bf.ptr_to([base_lo + k]), T.And(k < K, row_lo < N), cache=b_cache,
                               policy=access.operand(pol, "b"))
                vector.load_v4(bw, 8 * u + 4, Bf.ptr_to([base_hi + k]), T.And(k < K, row_hi < N),
                               cache=b_cache, policy=access.operand(pol, "b"))
                for t in T.unroll(tiles):
                    vector.load_v4(xw, 4 * (tiles * u + t), Af.ptr_to([T.Cast("int64", t * 8 + g) * K + k]),
                                   T.And(k < K, t * 8 + g < M), policy=access.operand(pol, "x"))
            for u in T.unroll(unroll):
                for s in T.unroll(2):
                    for t in T.unroll(tiles):
                        mma_step(acc, bw, xw, u, s, t)

        # D fragment: acc[4t + h] is row g (h < 2) or g + 8 (h >= 2) of the warp's 16, token 8t + 2q + h % 2.
        # red[klane][token][row]: the k_lanes partial sums of each output, added below in klane order.
        for t in T.unroll(tiles):
            for h in T.unroll(4):
                red[(klane * tokens + t * 8 + 2 * q + h % 2) * rows + group * MMA_ROWS + g + 8 * (h // 2)] = \
                    acc[4 * t + h]
        T.cuda.cta_sync()
        for o in T.unroll((outputs + threads - 1) // threads):
            idx = o * threads + tid
            token = idx // rows
            col = cta * rows + idx % rows
            if idx < outputs and token < M and col < N:
                Cf[T.Cast("int64", token) * T.Cast("int64", ldc) + col] = T.Cast(dtype, lane_sum(red, idx))
        pdl_launch.end(pdl)

    return pdl_launch.launch(fp16_bf16_gemm_gemv, pdl)
