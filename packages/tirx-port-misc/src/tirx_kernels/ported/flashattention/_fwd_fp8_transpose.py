# SPDX-License-Identifier: Apache-2.0
"""The TIRx kernel of ``flash_attention4_fp4``'s V pre-pass: V e4m3 [B, Sk, Hkv, D] -> V^T [B, Hkv, D, Sk16], keys
of each 16-group in ``_fwd_fp8_prepass.V_KEY_ORDER`` and zero past Sk (what ``transpose_v`` computes in torch, in one
pass over V: a byte transpose is a strided gather for torch's copy kernel).

One thread per (32 keys, 4 head-dim columns): 32 coalesced 4-byte loads (a warp's lanes cover consecutive columns of
one key row), a 32 x 4 byte transpose in registers (shifts and masks; nvcc makes them byte permutes), and per column
two 16-byte stores (the two 16-key groups: 32 contiguous bytes of the V^T row, whole L2 sectors). CTAs of 128 threads
over (key blocks, heads, batch)."""

from __future__ import annotations

from tirx_kernels.ported.flashattention._fwd_fp8_prepass import KEY_GROUP, V_KEY_ORDER

KEYS = 2 * KEY_GROUP  # keys per thread
THREADS = 128


def _load(Vw, w, first, step, valid):  # noqa: N803
    """``w[k]`` <- the 4 bytes of key ``k`` of the thread's block (word ``first + k step``), 0 for ``k >= valid``."""
    from tvm.script import tirx as T

    for k in range(KEYS):
        T.buffer_store(w, T.if_then_else(k < valid, Vw[first + k * step], T.uint32(0)), [k])


def _store(Vt, w, o, b, h, c, n0, sk16):  # noqa: N803
    """Per column ``4 c + e``: the two 16-key groups in ``V_KEY_ORDER``, one 16-byte store each (groups at or past
    ``sk16`` skipped)."""
    from tvm.script import tirx as T

    from tirx_kernels.core.lang import vector

    for e in range(4):
        for g in range(2):
            for j in range(4):
                word = T.uint32(0)
                for i in range(4):
                    key = g * KEY_GROUP + V_KEY_ORDER[4 * j + i]
                    word = word | (((w[key] >> T.uint32(8 * e)) & T.uint32(255)) << T.uint32(8 * i))
                T.buffer_store(o, word, [j])
            vector.store_v4(Vt.ptr_to([b, h, 4 * c + e, n0 + g * KEY_GROUP]), o, 0, n0 + g * KEY_GROUP < sk16)


def build_transpose_v_kernel(head_dim: int):
    from tvm.script import tirx as T

    if head_dim % 4 or not 16 <= head_dim <= 512 or THREADS % (head_dim // 4):
        raise ValueError(f"flash_attention4_fp4: transpose_v head_dim={head_dim} (a multiple of 4 dividing 512)")
    cols = head_dim // 4  # threads across one key block (4 columns each)
    blocks = THREADS // cols  # key blocks of KEYS keys per CTA
    keys_per_cta = blocks * KEYS

    @T.prim_func
    def flash_attention4_fp8_transpose_v(v_ptr: T.handle, vt_ptr: T.handle):
        B = T.int32()
        Sk = T.int32()
        Sk16 = T.int32()
        H = T.int32()
        v_sb = T.int32()
        v_ss = T.int32()
        v_sh = T.int32()
        V = T.match_buffer(v_ptr, (B, Sk, H, head_dim), "uint8", strides=(v_sb, v_ss, v_sh, 1), align=16)
        Vt = T.match_buffer(vt_ptr, (B, H, head_dim, Sk16), "uint8", align=16)
        T.device_entry()
        kb, h, b = T.cta_id([(Sk16 + keys_per_cta - 1) // keys_per_cta, H, B])
        tid = T.thread_id([THREADS])
        w = T.alloc_local((KEYS,), "uint32")
        o = T.alloc_local((4,), "uint32")
        # 4-byte words of V (the op passes 4-byte-aligned strides), 16-byte words of V^T.
        Vw = T.decl_buffer((B * v_sb // 4,), "uint32", data=V.data)
        c = tid % cols
        n0 = kb * keys_per_cta + (tid // cols) * KEYS
        _load(Vw, w, (b * v_sb + n0 * v_ss + h * v_sh) // 4 + c, v_ss // 4, Sk - n0)
        _store(Vt, w, o, b, h, c, n0, Sk16)

    return flash_attention4_fp8_transpose_v
