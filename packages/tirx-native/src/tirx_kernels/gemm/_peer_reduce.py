# SPDX-License-Identifier: Apache-2.0
"""The reduce half of ``gemm_reduce_scatter``: rank ``rank`` sums its row shard of every rank's partial product over
NVLink (peer loads), tile by tile as the partial GEMMs publish their tiles.

``fn(p, flags, deltas, out, rank, ctas)``: ``p`` [M, N] is this rank's partial (16-bit, in its symmetric-memory
workspace), ``flags`` the int32 tile flags after it in the same workspace (``gemm/_persistent.py``
``sync="publish_tiles"``: tile (m, n) complete at ``NUM_CONSUMERS``), ``deltas`` [W] int64 the byte offset of each
rank's workspace from this one's (0 for itself; peers' partials and flags sit at the same offsets in their
workspaces), ``out`` [S, N] the result, rows ``rank * S ...`` of the sum (the last shard clipped at M).

Schedule: ``ctas`` CTAs of 256 threads walk the units (GEMM tiles that hold rows of this shard, M-tile fastest) as
``cta, cta + ctas, ...``. Per unit thread 0 waits for the tile's flag of every rank, in the order the ranks produce
this shard (rank - 1 first: rank q's GEMM starts at shard q + 1), the CTA meets at a barrier, then each thread sums
16-byte vectors of the tile's rows in this shard over the ranks in fp32 and stores the rounded sum. The loads
bypass L1 allocation (``L1::no_allocate``: each is read once), and each unit's acquire (thread 0, then the barrier)
invalidates the SM's L1 before them, so no line of a tile read before its flag is ever served. No NVLink
multicast: W plain loads per vector.

The waits only end if the GEMMs of every rank make progress: the GEMMs never wait, but a rank's reduce CTAs must not
keep its own GEMM's CTAs from being resident (the host launches the reduce beside a GEMM with fewer CTAs than SMs
only where both fit, else after it: ``gemm_reduce_scatter``).
"""

from __future__ import annotations

THREADS = 256
VEC = 8  # 16-bit elements per 16-byte vector


def build_peer_reduce_kernel(dtype: str, block_m: int, block_n: int, num_consumers: int = 2):
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import peer, scheduler, vector

    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"peer reduce: dtype {dtype!r} must be bfloat16 or float16")
    if block_n % VEC or (block_m * block_n // VEC) % THREADS:
        raise ValueError(f"peer reduce: a {block_m} x {block_n} tile is not a whole number of vectors per thread")
    vec_per_row = block_n // VEC
    per_thread = block_m * vec_per_row // THREADS

    @T.prim_func
    def peer_reduce(p_ptr: T.handle, flags_ptr: T.handle, deltas_ptr: T.handle, out_ptr: T.handle, rank: T.int32,
                    ctas: T.int32):
        M = T.int32()
        N = T.int32()
        n_flags = T.int32()
        world = T.int32()
        S = T.int32()
        P = T.match_buffer(p_ptr, (M, N), dtype, align=16)
        Flags = T.match_buffer(flags_ptr, (n_flags,), "int32", align=4)
        Deltas = T.match_buffer(deltas_ptr, (world,), "int64", align=8)
        Out = T.match_buffer(out_ptr, (S, N), dtype, align=16)
        T.device_entry()
        # NOTES: without a minimum of 1 block an SM ptxas aims at 8 (32 registers) and spills; 54 registers with it.
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([ctas])
        tid = T.thread_id([THREADS])
        acc = T.alloc_local((VEC,), "float32")
        words = T.alloc_local((4,), "uint32")
        seen = T.alloc_local((1,), "int32")
        span = T.alloc_local((3,), "int32")  # first M-tile, M-tiles of the shard, first row past the shard
        Pf = T.decl_buffer((M * N,), dtype, data=P.data)  # flat: peers are at element offsets from it
        num_n = scheduler.ceil_div(N, block_n)
        span[0] = rank * S // block_m
        span[2] = T.min(rank * S + S, M)
        span[1] = (span[2] - 1) // block_m - span[0] + 1
        units = span[1] * num_n
        for i in range(scheduler.tiles_of_cta(cta, ctas, units)):
            m_tile = span[0] + (cta + i * ctas) % span[1]
            n_tile = (cta + i * ctas) // span[1]
            if tid == 0:
                for j in range(world):
                    # Rank q = rank - 1 - j: the order the ranks' rotated GEMMs produce this shard.
                    peer.wait_geq(Flags.ptr_to([peer.peer_elem_offset(Deltas[(rank + 2 * world - 1 - j) % world], 4)
                                                + m_tile * num_n + n_tile]), num_consumers, seen)
            T.cuda.cta_sync()
            for v in T.unroll(per_thread):
                row = m_tile * block_m + (v * THREADS + tid) // vec_per_row
                col = n_tile * block_n + (v * THREADS + tid) % vec_per_row * VEC
                if row >= rank * S and row < span[2] and col < N:
                    for e in T.unroll(VEC):
                        acc[e] = T.float32(0)
                    for j in range(world):
                        vector.load_v4(words, 0, Pf.ptr_to([peer.peer_elem_offset(Deltas[j], 2)
                                                            + T.Cast("int64", row) * T.Cast("int64", N) + col]),
                                       cache="stream")
                        for e in T.unroll(VEC // 2):
                            acc[2 * e] = acc[2 * e] + vector.unpack2(words[e], dtype)[0]
                            acc[2 * e + 1] = acc[2 * e + 1] + vector.unpack2(words[e], dtype)[1]
                    for e in T.unroll(VEC // 2):
                        vector.pack2(words, e, acc[2 * e], acc[2 * e + 1], dtype)
                    vector.store_v4(Out.ptr_to([row - rank * S, col]), words, 0)

    return peer_reduce
