# SPDX-License-Identifier: Apache-2.0
"""The stand-alone warp-specialized C = A·Bᵀ (bf16/fp16) kernel of ``fp16_bf16_gemm``'s ``ws_*`` tiles: one CTA per
output tile, one launch per call, M, N, K dynamic (the design: ``fp16_bf16_gemm``'s module docstring). The persistent
form of the same design: ``_persistent.py``."""

from __future__ import annotations


def build_ws_kernel(dtype: str, block_m: int, block_n: int, block_k: int, num_stages: int):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import mbarrier, tma, wgmma

    elem = tma.elem_bytes(dtype)
    assert block_m == 2 * wgmma.M and block_k * elem == 128 and block_n % 64 == 0
    a_tile = block_m * block_k  # elements per stage
    b_tile = block_n * block_k
    stage_bytes = (a_tile + b_tile) * elem  # full boxes, also when they reach past M/N/K
    k_steps = block_k // 16
    nacc = wgmma.acc_regs(block_n)
    store_cols = 128 // elem  # one SW128 store box is 64 rows x 128 bytes
    store_rows = wgmma.M
    num_consumer_warps = 8
    cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]

    @T.prim_func
    def fp16_bf16_gemm(a_ptr: T.handle, b_ptr: T.handle, c_ptr: T.handle):
        M = T.int32()
        N = T.int32()
        K = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a_ptr, (M, K), dtype, align=16)
        B = T.match_buffer(b_ptr, (N, K), dtype, align=16)
        C = T.match_buffer(c_ptr, (M, N), dtype, strides=(ldc, 1), align=16)
        # Host: tensor maps with this call's dims (rows/cols past the edge: zero-fill on load, clip on store).
        a_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        b_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        c_map = T.Bind(T.tvm_stack_alloca("tensormap", 1))
        tma.encode_2d(a_map, A.data, M, K, K, block_m, block_k, dtype)
        tma.encode_2d(b_map, B.data, N, K, K, block_n, block_k, dtype)
        tma.encode_2d(c_map, C.data, M, N, ldc, store_rows, store_cols, dtype)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        # M tiles along x (fastest): neighbouring CTAs share one B tile (256 rows of B) in L2.
        mt, nt = T.cta_id([(M + block_m - 1) // block_m, (N + block_n - 1) // block_n])
        wg = T.warpgroup_id([3])
        tid = T.thread_id([384])
        k_tiles = (K + block_k - 1) // block_k

        # Shared memory: one pool, 1024-aligned tiles first, barriers last.
        pool = T.SMEMPool()
        As = pool.alloc((num_stages * a_tile,), dtype, align=1024)
        Bs = pool.alloc((num_stages * b_tile,), dtype, align=1024)
        Cs = pool.alloc((block_m * block_n * elem // 4,), "uint32", align=1024)  # packed pairs, SW128
        full = pool.alloc((num_stages,), "uint64", align=8)
        empty = pool.alloc((num_stages,), "uint64", align=8)
        pool.commit()
        acc = T.alloc_local((nacc,), "float32")
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")
        packed = T.alloc_local((1,), "uint32")

        if tid == 0:
            for s in range(num_stages):
                mbarrier.init(full.ptr_to([s]), 1)  # the producer's arrive.expect_tx
                mbarrier.init(empty.ptr_to([s]), num_consumer_warps)  # lane 0 of each consumer warp
            mbarrier.fence_init()
        T.cuda.cta_sync()

        if wg == 0:
            # TMA warpgroup: decrease registers for the consumers.
            T.ptx["setmaxnreg.dec.sync.aligned.u32"](40)
            if tid == 0:
                for k in range(k_tiles):
                    s = mbarrier.stage(k, num_stages)
                    mbarrier.wait(empty.ptr_to([s]), mbarrier.phase(k, num_stages) ^ 1)
                    mbarrier.arrive_expect_tx(full.ptr_to([s]), stage_bytes)
                    tma.load_2d(As.ptr_to([s * a_tile]), a_map, k * block_k, mt * block_m, full.ptr_to([s]))
                    tma.load_2d(Bs.ptr_to([s * b_tile]), b_map, k * block_k, nt * block_n, full.ptr_to([s]))
        else:
            # Math warpgroups: each owns rows [64*cw, 64*cw + 64) of the CTA tile.
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
            cw = wg - 1
            ct = tid - 128 * wg
            warp = ct // 32
            lane = ct % 32
            for i in T.unroll(nacc):
                acc[i] = T.float32(0)
            for k in range(k_tiles):
                s = mbarrier.stage(k, num_stages)
                mbarrier.wait(full.ptr_to([s]), mbarrier.phase(k, num_stages))
                wgmma.fence()
                for kk in T.unroll(k_steps):
                    wgmma.encode_desc_kmajor_sw128(desc_a.ptr_to([0]),
                                                   As.ptr_to([s * a_tile + cw * wgmma.M * block_k + kk * 16]))
                    wgmma.encode_desc_kmajor_sw128(desc_b.ptr_to([0]), Bs.ptr_to([s * b_tile + kk * 16]))
                    wgmma.mma_ss(block_n, dtype, acc, desc_a[0], desc_b[0])
                wgmma.commit()
                # NOTES: keep one group in flight; once it is down to one, tile k-1's wgmmas have read
                # their smem, so release that stage (the last stage is never released: nothing waits).
                wgmma.wait(1)
                if k > 0 and lane == 0:
                    mbarrier.arrive(empty.ptr_to([mbarrier.stage(k + num_stages - 1, num_stages)]))
            wgmma.wait(0)

            # Epilogue: this warpgroup's 64 x block_n slab as block_n/64 SW128 boxes of 64 x 64.
            cs_base = cw * wgmma.M * block_n
            for j in T.unroll(block_n // 8):
                for r in T.unroll(2):
                    T.evaluate(cvt_pack(packed[0], acc[wgmma.acc_index(j, r, 1)], acc[wgmma.acc_index(j, r, 0)]))
                    row = wgmma.acc_row(warp, lane, r)
                    col = wgmma.acc_col(lane, j)
                    box = j * 8 // store_cols
                    Cs[(cs_base + box * store_rows * store_cols
                        + tma.sw128_offset(row, col % store_cols, dtype)) // 2] = packed[0]
            tma.fence_proxy_async()
            T.cuda.warpgroup_sync(1 + cw)
            row0 = mt * block_m + cw * wgmma.M
            if ct == 0 and row0 < M:
                for box in range(block_n // store_cols):
                    # Boxes wholly past N are skipped rather than relying on a fully clipped store.
                    if nt * block_n + box * store_cols < N:
                        tma.store_2d(c_map, nt * block_n + box * store_cols, row0,
                                     Cs.ptr_to([(cs_base + box * store_rows * store_cols) // 2]))
                tma.store_commit()
                tma.store_wait(0)

    return fp16_bf16_gemm
