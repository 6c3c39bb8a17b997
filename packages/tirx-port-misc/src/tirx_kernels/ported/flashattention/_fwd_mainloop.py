# SPDX-License-Identifier: Apache-2.0
# Design follows flash-attention's Hopper forward (FlashAttention-3, arXiv 2407.08608; hopper/softmax.h,
# hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp of https://github.com/Dao-AILab/flash-attention at the package's pinned
# commit 0251105a2fb19d2957484b7f023cd8c115286ced), re-expressed in TIRx on tirx-core's Hopper layer; no code is copied.
"""The attention mainloop every ``flash_attention4`` kernel shares: the shared-memory tiles and mbarrier rings, the
producer's K/V loop, the consumers' S = Q K^T / online softmax / O += P V loop in its three schedules, and the
epilogue's fragment walk. The kernels (``_fwd_kernel``: batch-padded and varlen prefill; ``_fwd_decode``: paged /
cache decode with split-KV) differ only in how they address Q, K, V and the outputs, and in each row's key limit.

Every method emits TIR while a ``@T.prim_func`` body is parsed (plain Python: loops over Python ints unroll, TIR
loops are ``T.serial`` frames, TIR branches ``T.If``). Per consumer warpgroup: 64 query rows (one m64 wgmma row
block); per key tile: ``block_n`` keys. Key tiles ``n_begin .. n_end - 1`` go through the rings as uses ``0 ..
n_end - n_begin - 1`` (a split-KV CTA starts at its split's first tile).

Masking: each thread holds two rows (row halves r = 0, 1) and knows for each the last key it may see, ``klim[r]``
(the sequence's last key, or less under the causal diagonal); a score is hidden iff its key index > ``klim[r]``. The
kernel also passes ``mask_from``, the smallest ``klim`` of the warpgroup's rows: key tiles ending at or before it need
no mask. A row whose ``klim`` is below every key it is offered ends with sum 0: out 0 and LSE -inf.

Schedules: ``plain`` (each consumer S, softmax, PV in turn), ``pingpong`` (two consumers take turns issuing their
GEMMs through named barriers ``TURN_BAR``, ``TURN_BAR + 1``: one's softmax under the other's GEMM), ``overlap`` (the
default; adds the intra-warpgroup overlap: QK^T of tile n and PV of tile n - 1 issued in one turn, the softmax of
tile n under PV n - 1, O rescaled once PV landed). With one consumer warpgroup there are no turns."""

from __future__ import annotations

import types

CHUNK = 64  # 16-bit elements of one 128-byte SW128 row: the TMA box's inner extent
SMEM_LIMIT = 232448  # 227 KB, what ran on the H200 (HOPPER_TIRX.md)
WG_BAR = 1  # named barriers 1, 2: consumer w's 128 threads
TURN_BAR = 3  # named barriers 3, 4: consumer w's turn to issue a GEMM (ping-pong; 3 consumers: 4, 5, 6)
SCHEDULES = ("plain", "pingpong", "overlap")
FRAGMENT_REGS = 200  # S, O and P fragment registers a consumer may hold (of 216 / 232, the rest for addresses)


def padded(d: int) -> int:
    """Head dim rounded up to whole 128-byte swizzle rows (TMA zero-fills the columns past d)."""
    return (d + CHUNK - 1) // CHUNK * CHUNK


def smem_bytes(head_dim: int, head_dim_v: int, block_n: int, num_stages: int, block_m: int = 128) -> int:
    """The pool: Q tile, the K and V rings, the barriers (1 + 4 x num_stages)."""
    return 2 * (block_m * padded(head_dim) + num_stages * block_n * (padded(head_dim) + padded(head_dim_v))) \
        + 8 * (1 + 4 * num_stages)


def check_shape(head_dim: int, head_dim_v: int, block_n: int, num_stages: int, block_m: int = 128,
                smem_limit: int = SMEM_LIMIT) -> None:
    """Trace-time limits of the generators (the ops check the user-facing ones first)."""
    from tirx_kernels.core.lang import wgmma

    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d % 8 or not 8 <= d <= 256:
            raise ValueError(f"flash_attention4: {name}={d} must be a multiple of 8 in [8, 256]")
    if block_n % 16 or not 16 <= block_n <= 256:
        raise ValueError(f"flash_attention4: block_n={block_n} must be a multiple of 16 in [16, 256]")
    # S (block_n / 2), O (Dv_pad / 2) and P (block_n / 4) accumulator registers of the consumer's.
    regs = wgmma.acc_regs(block_n) + wgmma.acc_regs(padded(head_dim_v)) + block_n // 4
    if regs > FRAGMENT_REGS:
        raise ValueError(f"flash_attention4: block_n={block_n} with head_dim_v={head_dim_v} needs {regs} "
                         f"fragment registers (at most {FRAGMENT_REGS})")
    nbytes = smem_bytes(head_dim, head_dim_v, block_n, num_stages, block_m)
    if num_stages < 1 or nbytes > smem_limit:
        raise ValueError(f"flash_attention4: {num_stages} stages of block_n={block_n} need {nbytes} B of smem "
                         f"(limit {smem_limit})")


class Mainloop:
    """One kernel's tile geometry and the TIR it emits (see the module docstring).

    Schedule knobs (class defaults: what a subclass that sets its own geometry, ``_fwd_fp8.FP8Mainloop``, gets):
    ``fast_exp2`` (``core.lang.softmax.update``: one MUFU.EX2 a weight), ``split_mask`` (the overlap loop's tiles
    that need no mask in a branch-free loop of their own) and ``late_release`` (V's slot given back after P is
    packed, not right after the PV wait), ``rescale_early`` (FA3's order: O rescaled between the QK^T and PV issues,
    so only P's packing follows the PV wait): see the NOTES in :meth:`consume` for what each changes in the SASS."""

    fast_exp2 = False
    split_mask = False
    late_release = False
    rescale_early = False
    wait_fence = False
    turn_bar = TURN_BAR

    def __init__(self, dtype: str, head_dim: int, head_dim_v: int, block_n: int, num_stages: int,
                 schedule: str = "overlap", num_consumers: int = 2, smem_limit: int = SMEM_LIMIT,
                 fast_exp2: bool = False, split_mask: bool = False, late_release: bool = False,
                 rescale_early: bool = False, wait_fence: bool = False):
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import mbarrier, tma, wgmma

        if schedule not in SCHEDULES:
            raise ValueError(f"flash_attention4: schedule {schedule!r} is not one of {SCHEDULES}")
        if num_consumers not in (1, 2, 3):
            raise ValueError(f"flash_attention4: {num_consumers} consumer warpgroups (1, 2 or 3)")
        self.block_m = 64 * num_consumers
        check_shape(head_dim, head_dim_v, block_n, num_stages, self.block_m, smem_limit)
        self.dtype, self.head_dim, self.head_dim_v = dtype, head_dim, head_dim_v
        self.block_n, self.num_stages, self.num_consumers = block_n, num_stages, num_consumers
        self.pingpong = num_consumers >= 2 and schedule in ("pingpong", "overlap")
        # The turn barriers follow the warpgroup barriers WG_BAR .. WG_BAR + num_consumers - 1.
        self.turn_bar = max(TURN_BAR, WG_BAR + num_consumers)
        self.overlap = schedule == "overlap"
        self.dp, self.dvp = padded(head_dim), padded(head_dim_v)
        self.q_chunks, self.v_chunks = self.dp // CHUNK, self.dvp // CHUNK
        self.elem = tma.elem_bytes(dtype)
        self.q_tile = self.block_m * self.dp  # elements
        self.k_tile = block_n * self.dp
        self.v_tile = block_n * self.dvp
        self.s_regs = wgmma.acc_regs(block_n)
        self.o_regs = wgmma.acc_regs(self.dvp)
        self.p_regs = block_n // 4  # 16-bit pairs: 4 b32 registers per k16 step
        self.qk_steps = self.dp // 16
        self.pv_steps = block_n // 16
        # V is the MN-major B operand of O += P V: 64-column chunks of block_n rows, LBO steps between chunks.
        self.v_lbo, self.v_sbo = wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=block_n * 128)
        self.v_kstep = wgmma.k_step_bytes(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, dtype)
        # One arrival per consumer warpgroup gives a slot back, after a warpgroup barrier (NOTES in release()).
        self.k_ring = mbarrier.Ring.for_warpgroups(num_stages, num_consumers, "warpgroup")
        self.v_ring = mbarrier.Ring.for_warpgroups(num_stages, num_consumers, "warpgroup")
        self.q_box_bytes = tma.check_box(dtype, [CHUNK, 1, self.block_m, 1])
        self.kv_tile_bytes = tma.check_box(dtype, [CHUNK, 1, block_n, 1])  # one 64-column chunk of a key tile
        self.cvt_pack = {"bfloat16": T.ptx.cvt.rn.bf16x2.f32, "float16": T.ptx.cvt.rn.f16x2.f32}[dtype]
        # What an 8-bit subclass (``_fwd_fp8``) changes: the wgmma input type (``dtype`` is the smem tiles'),
        # elements per swizzled Q/K row and that swizzle, the bytes each ring stage completes, and V's swizzle.
        self.mma_dtype = dtype
        self.chunk = CHUNK
        self.qk_swizzle = wgmma.SWIZZLE_128B
        self.p_offset = 0  # P in [0, 2^p_offset] (core.lang.softmax.update)
        self.fast_exp2 = fast_exp2
        self.split_mask = split_mask
        self.late_release = late_release
        self.rescale_early = rescale_early
        self.wait_fence = wait_fence
        self.k_stage_bytes = self.q_chunks * self.kv_tile_bytes
        self.v_stage_bytes = self.v_chunks * self.kv_tile_bytes
        self.v_swizzle = wgmma.SWIZZLE_128B

    # ------------------------------------------------------------------------------------------- storage

    def alloc_smem(self, pool):
        """The pool's tiles (1024-aligned first) and barriers; call before ``pool.commit()``. Returns a parser-time
        value (``T.meta_var``): a kernel body binds it to a name without emitting a variable."""
        from tvm.script import tirx as T

        sm = types.SimpleNamespace()
        sm.q = pool.alloc((self.q_tile,), self.dtype, align=1024)
        sm.k = pool.alloc((self.num_stages * self.k_tile,), self.dtype, align=1024)
        sm.v = pool.alloc((self.num_stages * self.v_tile,), self.dtype, align=1024)
        sm.q_full = pool.alloc((1,), "uint64", align=8)
        sm.k_full = pool.alloc((self.num_stages,), "uint64", align=8)
        sm.k_empty = pool.alloc((self.num_stages,), "uint64", align=8)
        sm.v_full = pool.alloc((self.num_stages,), "uint64", align=8)
        sm.v_empty = pool.alloc((self.num_stages,), "uint64", align=8)
        return T.meta_var(sm)

    def alloc_regs(self):
        """The consumer's fragments and softmax state (``corr``: each row half's O rescale, applied once PV has
        landed; ``klim``: each row half's last visible key)."""
        from tvm.script import tirx as T

        rg = types.SimpleNamespace()
        rg.s_acc = T.alloc_local((self.s_regs,), "float32")
        rg.o_acc = T.alloc_local((self.o_regs,), "float32")
        rg.p_frag = T.alloc_local((self.p_regs,), "uint32")
        rg.row_max = T.alloc_local((2,), "float32")
        rg.row_sum = T.alloc_local((2,), "float32")
        rg.red = T.alloc_local((2,), "float32")
        rg.corr = T.alloc_local((2,), "float32")
        rg.klim = T.alloc_local((2,), "int32")
        rg.desc_q = T.alloc_local((1,), "uint64")
        rg.desc_k = T.alloc_local((1,), "uint64")
        rg.desc_v = T.alloc_local((1,), "uint64")
        rg.packed = T.alloc_local((1,), "uint32")
        rg.zeros = T.alloc_local((4,), "uint32")  # a 16-byte vector of zeros (clear_v_tail)
        return T.meta_var(rg)

    def init_barriers(self, sm, q_arrivals: int = 1):
        """By one thread, before the CTA barrier; ``q_arrivals``: arrivals completing Q (1: a TMA thread)."""
        from tirx_kernels.core.lang import mbarrier

        mbarrier.init(sm.q_full.ptr_to([0]), q_arrivals)
        self.k_ring.init(sm.k_full, sm.k_empty)
        self.v_ring.init(sm.v_full, sm.v_empty)
        mbarrier.fence_init()

    def q_dst(self, sm, c):
        """Where 64-column chunk ``c`` of the Q tile lands (block_m rows of 128 bytes, SW128)."""
        return sm.q.ptr_to([c * self.block_m * self.chunk])

    def k_dst(self, sm, s, c, row=0):
        """Row ``row`` of 64-column chunk ``c`` of K stage ``s`` (``row`` a multiple of 8: a box may start there)."""
        return sm.k.ptr_to([s * self.k_tile + c * self.block_n * self.chunk + row * self.chunk])

    def v_dst(self, sm, s, c, row=0):
        return sm.v.ptr_to([s * self.v_tile + c * self.block_n * self.chunk + row * self.chunk])

    # ------------------------------------------------------------------------------------------- producer

    def load_q_tma(self, sm, q_map, coords):
        """One thread: the Q tile by TMA, ``coords(c)`` the map coordinates of chunk ``c``'s box."""
        from tirx_kernels.core.lang import mbarrier, tma

        mbarrier.arrive_expect_tx(sm.q_full.ptr_to([0]), self.q_chunks * self.q_box_bytes)
        for c in range(self.q_chunks):
            tma.load(self.q_dst(sm, c), q_map, coords(c), sm.q_full.ptr_to([0]))

    def produce_kv(self, sm, n_begin, n_end, load_k, load_v):
        """One thread: K and V of key tiles ``n_begin .. n_end - 1`` through the two rings (separate, so S = Q K^T
        of a tile starts while its V is in flight). ``load_k(n, s, bar)`` / ``load_v(n, s, bar)`` issue the TMA
        boxes of tile ``n`` into stage ``s`` (``k_dst`` / ``v_dst``), completing ``kv_tile_bytes`` per 64-column
        chunk on ``bar``."""
        from tvm.script import tirx as T

        with T.serial(0, T.max(n_end - n_begin, 0)) as it:
            s = self.k_ring.stage(it)
            self.k_ring.producer_acquire(sm.k_empty, it)
            self.k_ring.producer_expect(sm.k_full, it, self.k_stage_bytes)
            load_k(n_begin + it, s, sm.k_full.ptr_to([s]))
            self.v_ring.producer_acquire(sm.v_empty, it)
            self.v_ring.producer_expect(sm.v_full, it, self.v_stage_bytes)
            load_v(n_begin + it, s, sm.v_full.ptr_to([s]))

    # ------------------------------------------------------------------------------------------- consumer

    def _turn_wait(self, cw, first):
        """Ping-pong: wait until the other consumer has issued its previous GEMM (consumer 0's first QK^T has
        no predecessor)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import roles

        if self.pingpong:
            with T.If(T.Or(cw > 0, T.Not(first))):
                with T.Then():
                    roles.wait_turn(self.turn_bar, cw, self.num_consumers)

    def _turn_pass(self, cw, last):
        """Ping-pong: hand the tensor cores to the next consumer (the last consumer's last PV has nobody after it)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import roles

        if self.pingpong:
            with T.If(T.Or(cw != self.num_consumers - 1, T.Not(last))):
                with T.Then():
                    roles.pass_turn(self.turn_bar, cw, self.num_consumers)

    def _issue_qk(self, rg, s, cw):
        """S = Q K^T of the tile in stage ``s`` (SS; the first k16 step overwrites the accumulator), uncommitted."""
        from tirx_kernels.core.lang import wgmma

        wgmma.fence()
        for kk in range(self.qk_steps):
            q_off = ((kk // 4) * self.block_m * self.chunk + cw * 64 * self.chunk) * self.elem + (kk % 4) * 32
            k_off = (s * self.k_tile + (kk // 4) * self.block_n * self.chunk) * self.elem + (kk % 4) * 32
            wgmma.mma(self.block_n, rg.s_acc, wgmma.desc_advance(rg.desc_q[0], q_off),
                      wgmma.desc_advance(rg.desc_k[0], k_off), self.mma_dtype, scale_d=kk > 0)

    def _issue_pv(self, rg, s):
        """O += P V of the tile in stage ``s`` (RS: P from registers; V MN-major), uncommitted."""
        from tirx_kernels.core.lang import wgmma

        for kk in range(self.pv_steps):
            wgmma.mma(self.dvp, rg.o_acc, [rg.p_frag[kk * 4 + i] for i in range(4)],
                      wgmma.desc_advance(rg.desc_v[0], s * self.v_tile * self.elem + kk * self.v_kstep), self.mma_dtype,
                      b_major=wgmma.MN_MAJOR)

    def _release(self, ring, empty, s, cw, warp, lane):
        """Give slot ``s`` back (one arrival for the warpgroup) once all its 128 threads passed their wgmma.wait."""

        # NOTES: the warpgroup's wgmma couples its warps, so one thread's arrival after its wait releases the slot
        # (CUTLASS relies on it). A warpgroup bar.sync was meant to precede it for the CPU emulator, but the call was
        # never emitted (a bare T.cuda.warpgroup_sync in a traced helper is dropped: 2026-12-06, no 128-thread
        # bar.sync in the generated CUDA), and the emulated and H200 runs passed without it, so none is added.
        ring.consumer_release_warpgroup(empty, s, warp, lane)

    def _pack_p(self, rg):
        """The exp2 weights of S as the RS A operand of the PV wgmma (16-bit pairs, no shuffle)."""
        from tirx_kernels.core.lang import softmax

        softmax.pack_p(rg.p_frag, rg.s_acc, self.block_n, self.cvt_pack)

    def _softmax_tile(self, rg, n0, mask_from, lane, scale_log2, masked=None):
        """Mask (edge tiles only) and online softmax of one S tile; each row half's O rescale left in ``corr``.
        ``masked``: None tests whether the tile needs the mask (a branch), False leaves it out (the caller knows)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import softmax, wgmma

        if masked is None:
            with T.If(n0 + self.block_n - 1 > mask_from):
                with T.Then():
                    softmax.mask(rg.s_acc, self.block_n, lambda r, j, e: n0 + wgmma.acc_col(lane, j, e) > rg.klim[r])
        for r in range(2):
            softmax.update(rg.s_acc, self.block_n, r, rg.row_max, rg.row_sum, rg.red, scale_log2, self.p_offset,
                           self.fast_exp2)
            T.buffer_store(rg.corr, rg.red[1], [r])

    def causal_limits(self, rg, first_row, num_q, num_k, causal: bool, warp, lane):
        """``rg.klim`` for a warpgroup whose rows are queries ``first_row ..`` of a sequence with ``num_q`` queries
        and ``num_k`` keys (causal: bottom-right aligned, query i sees keys j <= i + num_k - num_q); returns
        ``mask_from``."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import wgmma

        last = num_k - 1
        diag = first_row + (num_k - num_q)  # key limit of the warpgroup's first row
        for r in range(2):
            lim = T.min(last, diag + wgmma.acc_row(warp, lane, r)) if causal else last
            T.buffer_store(rg.klim, lim, [r])
        return T.min(last, diag) if causal else last

    def _clear_v_tail(self, sm, rg, s, n, num_keys, cw, warp, lane):
        """Zero the rows of V stage ``s`` (key tile ``n``) at and past ``num_keys`` before PV reads them: their P is 0,
        but 0 x NaN is NaN, and a cache's slots past a sequence's length (or a varlen batch's unused keys) may hold
        any bits. Only the tile that reaches past ``num_keys`` (warpgroup-uniform); whole 128-byte rows, so the
        swizzle does not matter; made visible to the async proxy and to the warpgroup before the wgmma."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import tma, vector

        n0 = n * self.block_n
        per_row = self.v_chunks * 8  # 16-byte vectors of one key row over every 64-column chunk
        with T.If(n0 + self.block_n > num_keys):
            with T.Then():
                r0 = T.max(num_keys - n0, 0)
                ct = warp * 32 + lane
                with T.serial(0, (self.block_n * per_row + 127) // 128) as it:
                    v = it * 128 + ct
                    with T.If(v < (self.block_n - r0) * per_row):
                        with T.Then():
                            row = r0 + v // per_row
                            c = (v % per_row) // 8
                            vector.store_shared_v4(sm.v.ptr_to([s * self.v_tile + c * self.block_n * CHUNK + row * CHUNK
                                                                + (v % 8) * 8]), rg.zeros, 0)
                tma.fence_proxy_async()
                # every thread's zeroed rows before the warpgroup's PV wgmma reads them (T.evaluate: a bare call in a
                # traced helper is dropped)
                T.evaluate(T.cuda.warpgroup_sync(WG_BAR + cw))

    def consume(self, sm, rg, n_begin, n_end, mask_from, cw, warp, lane, scale_log2, num_keys=None, wait_q=True):
        """A consumer warpgroup's whole loop over key tiles ``n_begin .. n_end - 1`` (``rg.klim`` set): waits for Q,
        leaves O (unnormalised), the row max and the per-thread row sums in ``rg``. With ``num_keys`` (kernels whose
        loads do not zero-fill past the sequence's keys) the V rows past it are cleared before PV reads them. Without
        ``wait_q`` the warpgroup has put Q in place itself (and synchronised)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import mbarrier, softmax, wgmma

        block_n, k_ring, v_ring = self.block_n, self.k_ring, self.v_ring
        qk_lbo, qk_sbo = wgmma.desc_offsets(wgmma.K_MAJOR, self.qk_swizzle)
        wgmma.encode_desc(rg.desc_q.ptr_to([0]), sm.q.ptr_to([0]), qk_lbo, qk_sbo, self.qk_swizzle)
        wgmma.encode_desc(rg.desc_k.ptr_to([0]), sm.k.ptr_to([0]), qk_lbo, qk_sbo, self.qk_swizzle)
        wgmma.encode_desc(rg.desc_v.ptr_to([0]), sm.v.ptr_to([0]), self.v_lbo, self.v_sbo, self.v_swizzle)
        for i in range(self.o_regs):
            T.buffer_store(rg.o_acc, T.float32(0), [i])
        softmax.init(rg.row_max, rg.row_sum)

        def clear(s, n):
            if num_keys is not None:
                for i in range(4):
                    T.buffer_store(rg.zeros, T.uint32(0), [i])
                self._clear_v_tail(sm, rg, s, n, num_keys, cw, warp, lane)

        if wait_q:
            mbarrier.wait(sm.q_full.ptr_to([0]), 0)
        n_tiles = n_end - n_begin
        if self.overlap:
            # FA3's intra-warpgroup overlap: QK^T of tile n and PV of tile n - 1 are issued together, and the softmax
            # of tile n runs while PV n - 1 is still on the tensor cores; O's rescale waits for it. One turn per tile
            # (ping-pong), around both GEMMs.
            with T.If(n_tiles > 0):
                with T.Then():
                    k_ring.consumer_wait(sm.k_full, 0)
                    self._turn_wait(cw, T.bool(True))
                    self._issue_qk(rg, 0, cw)
                    wgmma.commit()
                    self._turn_pass(cw, T.bool(False))
                    wgmma.wait(0)
                    self._release(k_ring, sm.k_empty, 0, cw, warp, lane)
                    self._softmax_tile(rg, n_begin * block_n, mask_from, lane, scale_log2)
                    self._pack_p(rg)
                    def step(it, masked):
                        s = k_ring.stage(it)
                        sp = v_ring.stage(it - 1)
                        k_ring.consumer_wait(sm.k_full, it)
                        v_ring.consumer_wait(sm.v_full, it - 1)
                        clear(sp, n_begin + it - 1)
                        self._turn_wait(cw, T.bool(False))
                        self._issue_qk(rg, s, cw)
                        wgmma.commit()
                        if self.rescale_early:  # FA3's order: O rescaled under QK^T n, before PV n - 1 adds to it
                            for r in range(2):
                                softmax.rescale(rg.o_acc, self.dvp, r, rg.corr[r])
                            wgmma.fence()
                        self._issue_pv(rg, sp)
                        wgmma.commit()
                        self._turn_pass(cw, T.bool(False))
                        wgmma.wait(1)  # S of tile n (the older group) has landed; PV n - 1 may still run
                        self._release(k_ring, sm.k_empty, s, cw, warp, lane)
                        self._softmax_tile(rg, (n_begin + it) * block_n, mask_from, lane, scale_log2, masked)
                        if self.wait_fence:
                            # NOTES: ptxas schedules the PV wait (and any barrier: a plain warpgroup bar.sync here went
                            # up with it, SASS 2026-12-07) into the first latency bubble after the S wait, i.e. ahead
                            # of the softmax. A warpgroup barrier whose id depends on both row sums (the end of every
                            # exp2 chain: "sum < 0" is 0 for every sum, NaN included, but no compiler can prove it)
                            # cannot rise above them, and the wait stays behind the barrier.
                            dep = T.Select(rg.row_sum[0] + rg.row_sum[1] < T.float32(0), 1, 0)
                            T.evaluate(T.cuda.warpgroup_sync(WG_BAR + cw + dep))
                        wgmma.wait(0)
                        # NOTES: the V release is an mbarrier arrive with no data dependence on the softmax, and
                        # ptxas scheduled it (and so the wait(0) it must follow) ahead of the softmax's exp2 even
                        # in a branch-free body (SASS, 2026-12-07). Released after P is packed, the wait stays below
                        # most of the exp2 (the O rescale, which needs it, is interleaved with the last ones).
                        if not self.late_release:
                            self._release(v_ring, sm.v_empty, sp, cw, warp, lane)
                        if not self.rescale_early:
                            for r in range(2):
                                softmax.rescale(rg.o_acc, self.dvp, r, rg.corr[r])
                        self._pack_p(rg)
                        if self.late_release:
                            self._release(v_ring, sm.v_empty, sp, cw, warp, lane)

                    if self.split_mask:
                        # NOTES: with the mask's branch in the loop body, ptxas put the wait(0) for PV n - 1 at the
                        # branch's merge point, *before* the softmax of tile n (SASS of the hd128 kernel, 2026-12-07:
                        # WARPGROUP.DEPBAR.LE gsb0, 0x0 right after the mask block, ahead of every FMNMX / MUFU.EX2),
                        # so the softmax never ran under PV. FA3 runs the tiles that need no mask in a loop of their
                        # own; so do we: a branch-free body for tiles 1 .. first_masked - 1, then the masked ones.
                        first_masked = T.min(T.max(T.max(mask_from + 1, 0) // block_n - n_begin, 1), n_tiles)
                        with T.serial(1, first_masked) as it:
                            step(it, False)
                        with T.serial(first_masked, n_tiles) as it:
                            step(it, None)
                    else:
                        with T.serial(1, n_tiles) as it:
                            step(it, None)
                    # The last tile's PV.
                    sl = v_ring.stage(n_tiles - 1)
                    v_ring.consumer_wait(sm.v_full, n_tiles - 1)
                    clear(sl, n_end - 1)
                    self._turn_wait(cw, T.bool(False))
                    if self.rescale_early:
                        for r in range(2):
                            softmax.rescale(rg.o_acc, self.dvp, r, rg.corr[r])
                    wgmma.fence()
                    self._issue_pv(rg, sl)
                    wgmma.commit()
                    self._turn_pass(cw, T.bool(True))
                    wgmma.wait(0)
                    self._release(v_ring, sm.v_empty, sl, cw, warp, lane)
        else:
            # plain / pingpong: per tile S = QK^T, softmax, PV, each waited for before the next step.
            with T.serial(0, T.max(n_tiles, 0)) as it:
                s = k_ring.stage(it)
                k_ring.consumer_wait(sm.k_full, it)
                self._turn_wait(cw, it == 0)
                self._issue_qk(rg, s, cw)
                wgmma.commit()
                self._turn_pass(cw, T.bool(False))
                wgmma.wait(0)
                self._release(k_ring, sm.k_empty, s, cw, warp, lane)
                self._softmax_tile(rg, (n_begin + it) * block_n, mask_from, lane, scale_log2)
                for r in range(2):
                    softmax.rescale(rg.o_acc, self.dvp, r, rg.corr[r])
                self._pack_p(rg)
                v_ring.consumer_wait(sm.v_full, it)
                clear(s, n_begin + it)
                self._turn_wait(cw, T.bool(False))
                wgmma.fence()
                self._issue_pv(rg, s)
                wgmma.commit()
                self._turn_pass(cw, it == n_tiles - 1)
                wgmma.wait(0)
                self._release(v_ring, sm.v_empty, s, cw, warp, lane)

    # ------------------------------------------------------------------------------------------- epilogue

    def finalize(self, rg, r, scale_log2):
        """After the loop, row half ``r``: ``(inv, lse)``, the output's normaliser (0 for a row that saw no key) and
        the natural-log LSE (-inf there)."""
        from tirx_kernels.core.lang import softmax

        return softmax.finalize(r, rg.row_max, rg.row_sum, rg.red, scale_log2, self.p_offset)

    def store_o_pairs(self, rg, r, lane, inv, write_pair):
        """For each pair of adjacent output columns the thread holds in row half ``r``: ``write_pair(col, lo, hi)``
        with the normalised fp32 values (columns past ``head_dim_v`` skipped)."""
        from tvm.script import tirx as T

        from tirx_kernels.core.lang import wgmma

        for j in range(self.dvp // 8):
            col = wgmma.acc_col(lane, j)
            lo = rg.o_acc[wgmma.acc_index(j, r, 0)] * inv
            hi = rg.o_acc[wgmma.acc_index(j, r, 1)] * inv
            if self.dvp == self.head_dim_v:
                write_pair(col, lo, hi)
            else:
                with T.If(col < self.head_dim_v):
                    with T.Then():
                        write_pair(col, lo, hi)

    def pack_pair(self, rg, lo, hi):
        """``lo`` and ``hi`` rounded to the input dtype in one 32-bit word (``lo`` in the low half); returns it."""
        from tvm.script import tirx as T

        T.evaluate(self.cvt_pack(rg.packed[0], hi, lo))
        return rg.packed[0]
