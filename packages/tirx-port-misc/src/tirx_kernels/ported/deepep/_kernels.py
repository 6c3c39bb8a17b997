# SPDX-License-Identifier: Apache-2.0
# Port of DeepEP's intranode dispatch / combine data movement (csrc/kernels/intranode.cu) from
# https://github.com/deepseek-ai/DeepEP at commit 01dc3aaac82068020353dce2c302e38153c0bfaa: semantics read, not
# copied; DeepEP's channel queues are replaced by direct peer stores at precomputed rows.
"""The TIRx kernels of ``deepep_dispatch`` / ``deepep_combine`` (one CTA of 128 threads per source token).

Both address the ranks' workspaces through ``deltas`` [W] int64: the byte offset of rank j's workspace from this
rank's (``core.lang.peer``; 0 for itself; every workspace has the layout of ``_layout.workspace_offsets``).

- ``dispatch(x, topk_idx, topk_weights, pos, deltas, ws, rank, experts_per_rank, off_idx, off_w, off_src)``: token i
  goes to every rank j with ``pos[i, j] >= 0``: its row (16-byte vectors, peer stores over NVLink), its top-k
  experts made local to j (-1 elsewhere / masked) and their weights (0 there), and its index i. Each thread ends
  with ``fence.acq_rel.sys`` so its peer stores are visible system-wide before the kernel completes (the host's
  barrier after it then publishes them).
- ``combine(pos, deltas, ws, out, out_w, off_w)``: token i's row is the fp32 sum, over ranks j in order with
  ``pos[i, j] >= 0``, of row ``pos[i, j]`` of rank j's workspace (peer loads, ``L1::no_allocate``: each read once),
  rounded to bf16; its weights the sum of the ranks' weight rows.
No waits inside the kernels: the host orders them with barriers, so they cannot deadlock.
"""

from __future__ import annotations

THREADS = 128
VEC = 8  # bf16 per 16-byte vector


def build_dispatch_kernel():
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import peer, vector

    @T.prim_func
    def deepep_dispatch(x_ptr: T.handle, idx_ptr: T.handle, w_ptr: T.handle, pos_ptr: T.handle,
                        deltas_ptr: T.handle, ws_ptr: T.handle, rank: T.int32, experts_per_rank: T.int32,
                        off_idx: T.int64, off_w: T.int64, off_src: T.int64):
        t = T.int32()
        H = T.int32()
        k = T.int32()
        world = T.int32()
        nbytes = T.int32()
        X = T.match_buffer(x_ptr, (t, H), "bfloat16", align=16)
        Idx = T.match_buffer(idx_ptr, (t, k), "int64", align=8)
        Wt = T.match_buffer(w_ptr, (t, k), "float32", align=4)
        Pos = T.match_buffer(pos_ptr, (t, world), "int32", align=4)
        Deltas = T.match_buffer(deltas_ptr, (world,), "int64", align=8)
        WS = T.match_buffer(ws_ptr, (nbytes,), "uint8", align=16)
        T.device_entry()
        i = T.cta_id([t])
        tid = T.thread_id([THREADS])
        words = T.alloc_local((4,), "uint32")
        WSl = T.decl_buffer((nbytes // 8,), "int64", data=WS.data)
        WSf = T.decl_buffer((nbytes // 4,), "float32", data=WS.data)
        WSs = T.decl_buffer((nbytes // 4,), "int32", data=WS.data)
        for j in range(world):
            if Pos[i, j] >= 0:
                for v0 in range((H // VEC + THREADS - 1 - tid) // THREADS):
                    vector.load_v4(words, 0, X.ptr_to([i, (tid + v0 * THREADS) * VEC]))
                    vector.store_v4(WS.ptr_to([Deltas[j] + T.Cast("int64", Pos[i, j]) * T.Cast("int64", H * 2)
                                               + T.Cast("int64", (tid + v0 * THREADS) * VEC * 2)]), words, 0)
                if tid < k:
                    local = Idx[i, tid] - T.Cast("int64", j * experts_per_rank)
                    mine = T.And(Idx[i, tid] >= T.int64(0), T.And(local >= T.int64(0),
                                                                 local < T.Cast("int64", experts_per_rank)))
                    WSl[(Deltas[j] + off_idx) // 8 + T.Cast("int64", Pos[i, j] * k + tid)] = T.Select(
                        mine, local, T.int64(-1))
                    WSf[(Deltas[j] + off_w) // 4 + T.Cast("int64", Pos[i, j] * k + tid)] = T.Select(
                        mine, Wt[i, tid], T.float32(0))
                if tid == 0:
                    WSs[(Deltas[j] + off_src) // 4 + T.Cast("int64", Pos[i, j])] = i
        peer.system_fence()

    return deepep_dispatch


def build_combine_kernel():
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    @T.prim_func
    def deepep_combine(pos_ptr: T.handle, deltas_ptr: T.handle, ws_ptr: T.handle, out_ptr: T.handle,
                       out_w_ptr: T.handle, off_w: T.int64):
        t = T.int32()
        H = T.int32()
        k = T.int32()
        world = T.int32()
        nbytes = T.int32()
        Pos = T.match_buffer(pos_ptr, (t, world), "int32", align=4)
        Deltas = T.match_buffer(deltas_ptr, (world,), "int64", align=8)
        WS = T.match_buffer(ws_ptr, (nbytes,), "uint8", align=16)
        Out = T.match_buffer(out_ptr, (t, H), "bfloat16", align=16)
        OutW = T.match_buffer(out_w_ptr, (t, k), "float32", align=4)
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        i = T.cta_id([t])
        tid = T.thread_id([THREADS])
        words = T.alloc_local((4,), "uint32")
        acc = T.alloc_local((VEC,), "float32")
        accw = T.alloc_local((1,), "float32")
        WSf = T.decl_buffer((nbytes // 4,), "float32", data=WS.data)
        for v0 in range((H // VEC + THREADS - 1 - tid) // THREADS):
            for e in T.unroll(VEC):
                acc[e] = T.float32(0)
            for j in range(world):
                if Pos[i, j] >= 0:
                    vector.load_v4(words, 0, WS.ptr_to([Deltas[j] + T.Cast("int64", Pos[i, j]) * T.Cast("int64", H * 2)
                                                        + T.Cast("int64", (tid + v0 * THREADS) * VEC * 2)]),
                                   cache="stream")
                    for e in T.unroll(VEC // 2):
                        acc[2 * e] = acc[2 * e] + vector.unpack2(words[e], "bfloat16")[0]
                        acc[2 * e + 1] = acc[2 * e + 1] + vector.unpack2(words[e], "bfloat16")[1]
            for e in T.unroll(VEC // 2):
                vector.pack2(words, e, acc[2 * e], acc[2 * e + 1], "bfloat16")
            vector.store_v4(Out.ptr_to([i, (tid + v0 * THREADS) * VEC]), words, 0)
        if tid < k:
            accw[0] = T.float32(0)
            for j in range(world):
                if Pos[i, j] >= 0:
                    accw[0] = accw[0] + WSf[(Deltas[j] + off_w) // 4 + T.Cast("int64", Pos[i, j] * k + tid)]
            OutW[i, tid] = accw[0]

    return deepep_combine
