# SPDX-License-Identifier: Apache-2.0
# The training path cudnn-frontend's GDN graph offers (frost/gdn_engine.py, v1.28.0
# 1dbd2c09432dfd6cbf13a0ad85a071446398c082: GDN node forward with checkpoints, GDN_BWD node backward that regenerates
# them with the recompute kernel when they were not kept); read for semantics only.
"""``chunk_gdn_train``: GDN-1 as a differentiable torch op -- this package's forward (``gdn_prefill_f16``, checkpoints
every 64 tokens), optionally its recompute (``gdn_recompute_f16``: checkpoints regenerated in the backward instead of
kept) and the backward ``gdn_bprop`` tied by a ``torch.autograd.Function``, so a model trains through it."""

from __future__ import annotations

import torch

CHUNK = 64


class _ChunkGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, cu_seqlens, scale, output_final_state, recompute):
        from tirx_kernels.ported.cudnn.linear_attention.gdn_prefill_f16 import chunk_gdn_sm90

        o, final, ckpt = chunk_gdn_sm90(q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                                        scale=scale, checkpoint_every_n_tokens=0 if recompute else CHUNK,
                                        log_gate=True, output_final_state=output_final_state)
        ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, None if recompute else ckpt)
        ctx.scale, ctx.recompute = scale, recompute
        return o, final

    @staticmethod
    def backward(ctx, d_out, d_final):
        from tirx_kernels.ported.cudnn.linear_attention.gdn_bprop_f16 import gdn_bprop
        from tirx_kernels.ported.cudnn.linear_attention.gdn_recompute_f16 import chunk_gdn_recompute_sm90

        q, k, v, g, beta, h0, cu, ckpt = ctx.saved_tensors
        if ctx.recompute:
            ckpt, _ = chunk_gdn_recompute_sm90(k, v, g, beta, cu_seqlens=cu, initial_state=h0,
                                               checkpoint_every_n_tokens=CHUNK, log_gate=True)
        hs = max(q.shape[1], v.shape[1])
        if d_out is None:
            d_out = torch.zeros(q.shape[0], hs, q.shape[2], dtype=q.dtype, device=q.device)
        dq, dk, dv, dg, dbeta, d0 = gdn_bprop(q, k, v, g, beta, d_out.to(q.dtype).contiguous(), ckpt, cu,
                                              ctx.scale, h0, None if d_final is None else d_final.float().contiguous())
        d0 = None if h0 is None else d0.to(h0.dtype)
        return dq, dk, dv, dg, dbeta, d0, None, None, None, None


def chunk_gdn_train(q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=False,
                    recompute=False):
    """(o [T, HO, 128], final state [N, HO, V, K] fp32 or None), differentiable in q, k, v, g (natural-log decay
    [T, HO] fp32), beta ([T, HO] fp32) and ``initial_state``; ``recompute`` keeps no checkpoints between forward and
    backward (the recompute kernel regenerates them)."""
    return _ChunkGDN.apply(q, k, v, g, beta, initial_state, cu_seqlens, scale, output_final_state, recompute)
