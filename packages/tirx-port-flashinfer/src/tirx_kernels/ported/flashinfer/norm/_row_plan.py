# SPDX-License-Identifier: Apache-2.0
"""The two-level artifact plan of this folder's RMSNorm row kernels (``fused_add_rmsnorm``, and ``rmsnorm``'s
``build_rows`` family: ``rmsnorm`` / ``gemma_rmsnorm``, ``rmsnorm_quant``, ``fused_add_rmsnorm_quant``).

- specialized: H a compile-time multiple of 8 in [``MIN_H``, ``MAX_H``], every row (and the weight) starting on a
  16-byte boundary (8 bytes for FP8 rows). A row is spread over ``threads_per_row`` threads, each holding
  ``vectors_per_thread`` 16-byte vectors of every row it reads (and of the weight) in registers, all loads issued
  before any math; rows of <= 32 threads are packed several to a CTA (``row_plan``). ``Lanes`` is the kernel side
  of that plan (which vector of which lane covers which columns, the predicates of the last vector and of a CTA's
  tail rows, the loads).
- general: H, strides and alignment as run-time arguments, one per kernel variant without H; it serves every call
  the specialized artifacts do not (odd H, H > ``MAX_H``, unaligned rows, an H a bundle holds no artifact for).

The host-side half (``specialized``, ``row_plan``, ``catalog_sizes``, ``aligned_rows``) imports no TVM: the ops
pick their artifact with it on GPU hosts.
"""

from __future__ import annotations

VEC = 8  # 16-bit elements per 16-byte vector
WORDS = 4  # 32-bit words per 16-byte vector
MIN_H, MAX_H = 16, 16384  # the specialized kernels (H % 8 == 0 too)
MIN_CTA_THREADS = 128  # rows of <= 32 threads are packed into CTAs of at least this many threads
# (max H, 16-byte vectors a thread holds of each row it reads and of the weight): fused_add_rmsnorm holds 3 of them
# (12 words a vector), so 4 vectors (48 words) is the most that keeps a full SM's 2048 threads resident at <= 64
# registers... of which ptxas needs some for addresses: 4 only above 4096, where a row of 2 vectors would need
# > 256 threads.
VECTORS_PER_THREAD = [(256, 1), (4096, 2), (MAX_H, 4)]


def specialized(H: int) -> bool:
    """Whether H has specialized kernels (calls whose rows and weight start on 16 bytes use them)."""
    return H % VEC == 0 and MIN_H <= H <= MAX_H


def row_plan(H: int) -> dict:
    """``threads_per_row`` (a power of two up to 32, else whole warps), ``vectors_per_thread``, ``rows_per_cta``."""
    nvec = H // VEC
    target = next(v for max_h, v in VECTORS_PER_THREAD if H <= max_h)
    want = -(-nvec // target)
    tpr = max(2, 1 << (want - 1).bit_length()) if want <= 32 else 32 * -(-want // 32)
    return {"threads_per_row": tpr, "vectors_per_thread": -(-nvec // tpr),
            "rows_per_cta": max(1, MIN_CTA_THREADS // tpr)}


def catalog_sizes() -> list[int]:
    """The catalog hidden sizes (``core.model_dims``) that have specialized kernels: what a bundle holds."""
    from tirx_kernels.core import model_dims

    return sorted({H for H in model_dims.hidden_sizes() if specialized(H)})


def aligned_rows(t, align: int = 16) -> bool:
    """A 2-D tensor's rows all start on ``align`` bytes (every row is ``stride * element size`` bytes apart)."""
    return t.data_ptr() % align == 0 and (t.shape[0] <= 1 or (t.stride(0) * t.element_size()) % align == 0)


class Lanes:
    """The kernel side of ``row_plan``: vector ``v`` of lane ``lane`` covers columns ``(v * tpr + lane) * 8 ..+8``
    (consecutive lanes, consecutive 16 bytes). Only a thread's last vector may fall past H, so only it is
    predicated; only a CTA of several rows has a tail row to mask. Called while a prim_func is parsed."""

    def __init__(self, H: int, threads_per_row: int, vectors_per_thread: int, rows_per_cta: int):  # noqa: N803
        self.H, self.tpr, self.vpt, self.rows_per_cta = H, threads_per_row, vectors_per_thread, rows_per_cta
        self.threads = threads_per_row * rows_per_cta

    def col(self, v: int, lane):
        return (v * self.tpr + lane) * VEC

    def pred(self, v: int, lane, row_ok):
        """None where vector ``v`` of every lane is inside the row (and the row exists), else the test."""
        from tvm.script import tirx as T

        col_ok = self.col(v, lane) < self.H if (v + 1) * self.tpr * VEC > self.H else None
        if row_ok is None or col_ok is None:
            return col_ok if row_ok is None else row_ok
        return T.And(row_ok, col_ok)

    def row_ok(self, row, M):  # noqa: N803
        """None when every CTA row exists (one row per CTA), else ``row < M`` for the tail CTA."""
        return None if self.rows_per_cta == 1 else row < M

    def load(self, regs, buf, base, lane, row_ok, **kw):
        """``regs[4 v:+4]`` <- vector ``v`` of the row at ``base`` (masked vectors 0: they add 0 to a sum)."""
        from tirx_kernels.core.lang import vector

        for v in range(self.vpt):
            pred = self.pred(v, lane, row_ok)
            if pred is not None:
                vector.fill(regs, v * WORDS, WORDS)
            vector.load_v4(regs, v * WORDS, buf.ptr_to([base + self.col(v, lane)]), pred, **kw)
