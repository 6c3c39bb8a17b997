# SPDX-License-Identifier: Apache-2.0
# Port of DeepGEMM's SM90 TF32 hyper-connection pre-norm GEMM (deep_gemm/include/deep_gemm/impls/
# sm90_tf32_hc_prenorm_gemm.cuh, csrc/jit_kernels/impls/sm90_tf32_hc_prenorm_gemm.hpp) at deepseek-ai/DeepGEMM
# 54e22612409371d6364144b69086735beb54e98b: its recipe (64-row blocks, split-K partials, bf16 A widened to tf32 in
# registers for an RS wgmma, the row sums of squares from the same registers), written anew in TIRx on core.lang.
"""The kernel of ``deepgemm_sm90_tf32_hc_prenorm_gemm``: ``D[s, M, N] fp32 = A[M, K-range s] (bf16, as tf32) x B[N,
K-range s]^T (fp32, read as tf32)`` and ``S[s, M] = sum over the range of A^2``, one partial per split s of K (the
caller sums the partials: DeepGEMM's convention), N in {8, 16, 24, 32} (the hyper-connection's 24).

Design (DeepGEMM's SM90 recipe):
- Grid ``ceil(M/64) x num_splits`` CTAs (``cta = m_block * num_splits + split``), split s owning K blocks
  ``[s * q + min(s, r), ...)`` of ``q = kb // num_splits`` (+1 for the first ``r = kb % num_splits``) 64-wide K
  blocks: a split with no block writes zeros. K % 64 == 0 (as DeepGEMM).
- 160 threads: warps 0-3 the math warpgroup, warp 4 the TMA producer (one thread). A ``num_stages`` full/empty ring;
  a stage is the A box 64 x 64 bf16 (128-byte rows, SW128) and two B boxes N x 32 fp32 (128-byte rows, SW128) of the
  K block. Rows past M arrive as zeros (TMA fill) and are not stored.
- Math, per stage: each thread reads its 32 A elements of the 8 wgmma k8 steps from the swizzled tile (the RS
  fragment: row ``16 warp + lane/4 (+8)``, K ``8 kk + lane%4 (+4)``), widens bf16 to fp32 bits (``<< 16``: bf16 is
  exact in tf32), adds their squares to its two row sums, then issues 8 ``wgmma m64nNk8 tf32`` RS (A from those
  registers, B from the stage by descriptor) into the fp32 accumulator. One group stays in flight: the next stage's
  loads run under it (two register buffers, alternating), and a stage goes back once its group has completed.
- NOTES: memory-bound on A (N = 24: 48 FLOP per A element of 2 bytes); B is re-read per stage from L2 (N x 256 bytes
  per 8 KB of A): A's loads carry evict_first, B's evict_last, so the stream of A does not push B out of L2.
  CUDA-core FMA would need 25 FMA per A element: 132 SMs x 128 FMA x 1.98 GHz = 33.5 T FMA/s against 1.5 T A
  elements/s at 3 TB/s (37.5 T FMA/s) leaves no headroom, hence the tensor cores.
- Epilogue: the two row sums reduced over the 4 lanes of a row (shuffles) and stored by lane 0 of the 4; D stored
  straight from the accumulator fragment (``st.global`` fp32), rows below M.
"""

from __future__ import annotations

SMEM_LIMIT = 232448
BLOCK_M = 64
BLOCK_K = 64  # bf16: one 128-byte SW128 row of A; two 32-wide fp32 boxes of B
B_CHUNK = 32  # fp32 elements of one 128-byte B row
THREADS = 160  # math warpgroup + one producer warp
NS = (8, 16, 24, 32)


def stage_bytes(n: int) -> int:
    return BLOCK_M * BLOCK_K * 2 + 2 * n * B_CHUNK * 4


def smem_bytes(n: int, num_stages: int) -> int:
    return num_stages * stage_bytes(n) + 2 * num_stages * 8


def k_range(split, num_splits, k_blocks):
    """``(first K block, K blocks)`` of split ``split`` (host ints or traced values): DeepGEMM's partition.
    The host form runs where apache-tvm is absent (the GPU host: the oracle calls it), so TVM is imported only
    for traced values."""
    per, rem = k_blocks // num_splits, k_blocks % num_splits
    if isinstance(split, int) and isinstance(num_splits, int) and isinstance(k_blocks, int):
        return split * per + min(split, rem), per + (1 if split < rem else 0)
    from tvm.script import tirx as T

    return split * per + T.min(split, rem), per + T.Select(split < rem, 1, 0)


def build_kernel(n: int, num_stages: int):
    """Kernel arguments ``(a, b, d, sqr_sum, num_splits, ldd, lds)``: a (M, K) bf16 with row stride ``lda`` (a
    multiple of 8), b (n, K) fp32 with row stride ``ldb`` (a multiple of 4), d the fp32 span of D with row stride
    ``ldd`` and split stride ``lds`` (unit column stride), sqr_sum fp32 ``[num_splits, M]`` contiguous."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, softmax, tma, vector, wgmma

    if n not in NS:
        raise ValueError(f"tf32 hc prenorm gemm: N={n} must be one of {NS} (DeepGEMM: N <= 32, N % 8 == 0)")
    if num_stages < 2 or smem_bytes(n, num_stages) > SMEM_LIMIT:
        raise ValueError(f"tf32 hc prenorm gemm: {num_stages} stages need {smem_bytes(n, num_stages)} B of shared "
                         f"memory (at most {SMEM_LIMIT}, at least 2 stages)")
    a_elems = BLOCK_M * BLOCK_K  # uint16 per stage
    b_elems = 2 * n * B_CHUNK  # fp32 per stage
    nbytes = stage_bytes(n)
    k_steps = BLOCK_K // wgmma.k_per_instr("float32")  # 8 wgmma k8 per K block
    nacc = wgmma.acc_regs(n)
    ring = mbarrier.Ring.for_warpgroups(num_stages, 1)

    @T.prim_func
    def tf32_hc_prenorm_gemm(a_ptr: T.handle, b_ptr: T.handle, d_ptr: T.handle, s_ptr: T.handle,
                             num_splits: T.int32, ldd: T.int32, lds: T.int32):
        M = T.int32()
        K = T.int32()
        lda = T.int32()
        ldb = T.int32()
        d_len = T.int64()
        s_len = T.int64()
        A = T.match_buffer(a_ptr, (M, K), "bfloat16", strides=(lda, 1), align=16)
        B = T.match_buffer(b_ptr, (n, K), "float32", strides=(ldb, 1), align=16)
        D = T.match_buffer(d_ptr, (d_len,), "float32", align=4)
        S = T.match_buffer(s_ptr, (s_len,), "float32", align=4)
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, lda, BLOCK_M, BLOCK_K, "bfloat16", l2_promotion=tma.L2_PROMOTION_256B)
        tma.encode_2d(b_map, B.data, n, K, ldb, n, B_CHUNK, "float32", l2_promotion=tma.L2_PROMOTION_256B)
        T.device_entry()
        cta = T.cta_id([(M + BLOCK_M - 1) // BLOCK_M * num_splits])
        tid = T.thread_id([THREADS])

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_elems,), "uint16", align=1024)
        Bs = pool.alloc((num_stages * b_elems,), "float32", align=1024)
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        areg = T.alloc_local((2 * k_steps * 4,), "uint32")  # two K blocks' RS A fragments: fp32 bits of bf16
        prev = T.alloc_local((1,), "int32")  # stage of the wgmma group still in flight
        sq = T.alloc_local((2,), "float32")  # sums of squares of this thread's two rows
        tot = T.alloc_local((2,), "float32")
        desc_b = T.alloc_local((1,), "uint64")
        remote = T.alloc_local((1,), "uint32")
        cursor = T.alloc_local((2,), "int32")
        policy = T.alloc_local((2,), "uint64")  # L2 hints: A streamed once (evict_first), B re-read by every CTA

        m0 = cta // num_splits * BLOCK_M
        split = cta % num_splits
        k_first, k_count = k_range(split, num_splits, K // BLOCK_K)
        if tid == 0:
            ring.init(full, empty)
            mbarrier.fence_init()
        T.cuda.cta_sync()
        ring.cursor_init(cursor)

        if tid >= 128:
            # TMA warp: one thread issues the stage loads.
            if tid == 128:
                tma.prefetch_descriptor(a_map)
                tma.prefetch_descriptor(b_map)
                vector.l2_policy(policy[0], "evict_first")
                vector.l2_policy(policy[1], "evict_last")
                for kb in range(k_count):
                    s = cursor[0]
                    mbarrier.wait(empty.ptr_to([s]), cursor[1] ^ 1)
                    mbarrier.arrive_expect_tx(full.ptr_to([s]), nbytes)
                    k0 = (k_first + kb) * BLOCK_K
                    tma.load_2d(As.ptr_to([s * a_elems]), a_map, k0, m0, full.ptr_to([s]), cache_policy=policy[0])
                    tma.load_2d(Bs.ptr_to([s * b_elems]), b_map, k0, 0, full.ptr_to([s]), cache_policy=policy[1])
                    tma.load_2d(Bs.ptr_to([s * b_elems + n * B_CHUNK]), b_map, k0 + B_CHUNK, 0, full.ptr_to([s]),
                                cache_policy=policy[1])
                    ring.cursor_advance(cursor)
        else:
            # Math warpgroup.
            warp = tid // 32
            lane = tid % 32
            wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([0]))
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)
            for r in T.unroll(2):
                sq[r] = T.float32(0)
            # Two K blocks per trip, one A fragment buffer each: a block's A loads and squares run while the previous
            # block's wgmma group is still in flight (wait(1)), whose registers are the other buffer.
            for kb2 in range((k_count + 1) // 2):
                for half in T.unroll(2):
                    if kb2 * 2 + half < k_count:
                        s = cursor[0]
                        ring.consumer_wait_at(full, cursor)
                        for kk in T.unroll(k_steps):
                            for i in T.unroll(4):
                                # RS fragment of k8 step kk: register i at row 16 warp + lane/4 + 8 (i % 2), K 4 (i / 2)
                                # + lane % 4; bf16 widened to fp32 bits (exact in tf32).
                                q = half * (k_steps * 4) + kk * 4 + i
                                areg[q] = T.Cast("uint32", As[s * a_elems + tma.sw128_offset(
                                    wgmma.a_frag_row(warp, lane, i), kk * 8 + wgmma.a_frag_col(lane, i, 0, "float32"),
                                    "bfloat16")]) << T.uint32(16)
                                sq[i % 2] = sq[i % 2] + (T.cuda.uint_as_float(areg[q]) * T.cuda.uint_as_float(areg[q]))
                        wgmma.fence()
                        for kk in T.unroll(k_steps):
                            wgmma.mma(n, acc, [areg[half * (k_steps * 4) + kk * 4 + i] for i in range(4)],
                                      wgmma.desc_advance(desc_b[0], s * (b_elems * 4) + (kk // 4) * (n * B_CHUNK * 4)
                                                         + (kk % 4) * 32), "float32")
                        wgmma.commit()
                        wgmma.wait(1)
                        # The previous block's group has completed: its stage (A read by this warpgroup's loads, B by
                        # that group) goes back to the producer.
                        if kb2 * 2 + half > 0:
                            T.evaluate(T.call_extern("void", "__syncwarp"))
                            ring.release_slot(empty, prev[0], warp, lane, remote[0])
                        prev[0] = s
                        ring.cursor_advance(cursor)
            wgmma.wait(0)
            if k_count > 0:
                T.evaluate(T.call_extern("void", "__syncwarp"))
                ring.release_slot(empty, prev[0], warp, lane, remote[0])
            # Epilogue: row sums over the 4 lanes of a row, then this split's partials.
            for r in T.unroll(2):
                tot[r] = softmax.quad_reduce(sq[r], lambda x, y: x + y)
            for r in T.unroll(2):
                row = m0 + wgmma.acc_row(warp, lane, r)
                if T.And(lane % 4 == 0, row < M):
                    S[T.Cast("int64", split) * M + row] = tot[r]
            for j in T.unroll(n // 8):
                for r in T.unroll(2):
                    row = m0 + wgmma.acc_row(warp, lane, r)
                    if row < M:
                        for e in T.unroll(2):
                            D[T.Cast("int64", split) * lds + T.Cast("int64", row) * ldd + wgmma.acc_col(lane, j, e)] = (
                                acc[wgmma.acc_index(j, r, e)])

    return tf32_hc_prenorm_gemm
