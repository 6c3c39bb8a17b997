# SPDX-License-Identifier: Apache-2.0
"""tirx_kernels.core.lang.peer on the CPU emulator: a flag chain at system scope (CTA i waits until flag i reaches
i, counted by the ``signal_add`` s of the CTAs before it) and peer addressing by byte offsets (each CTA reads the
word of "rank" i's buffer through its offset from the own buffer, all ranks in one allocation as in the single-process
simulation of several GPUs), plus the instructions the helpers emit."""

import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tvm.script import tirx as T  # noqa: E402

from tirx_kernels.core import build, emulate  # noqa: E402
from tirx_kernels.core.lang import peer  # noqa: E402

CTAS = 3
WORDS = 8  # int32 words of one simulated rank's buffer


@T.prim_func
def chain(buf_ptr: T.handle, delta_ptr: T.handle, flag_ptr: T.handle, seen_ptr: T.handle):
    Buf = T.match_buffer(buf_ptr, (WORDS,), "int32", align=16)  # rank 0's buffer (the others follow it)
    Delta = T.match_buffer(delta_ptr, (CTAS,), "int64", align=8)
    Flag = T.match_buffer(flag_ptr, (CTAS,), "int32", align=16)
    Seen = T.match_buffer(seen_ptr, (CTAS,), "int32", align=16)
    T.device_entry()
    bx = T.cta_id([CTAS])
    tid = T.thread_id([32])
    got = T.alloc_local((1,), "int32")
    if tid == 0:
        peer.wait_geq(Flag.ptr_to([bx]), bx, got)
        Seen[bx] = got[0] * 100 + Buf[peer.peer_elem_offset(Delta[bx], 4) + 1]
        for later in range(bx + 1, CTAS):
            peer.signal_add(Flag.ptr_to([later]))
        peer.async_writes_to_generic()
        peer.system_fence()


def test_flag_chain_and_peer_offsets():
    src = build.codegen(chain)
    for text in ("ld.acquire.sys.global.b32", "fence.acq_rel.sys", "red.relaxed.sys.global.add.s32",
                 "fence.proxy.async.global"):
        assert text in src, text
    mod = emulate.compile_module(src)
    ranks = torch.arange(CTAS * WORDS, dtype=torch.int32).reshape(CTAS, WORDS)  # one allocation, rank i at row i
    delta = torch.tensor([i * WORDS * 4 for i in range(CTAS)], dtype=torch.int64)  # bytes from rank 0's buffer
    flag = torch.zeros(CTAS, dtype=torch.int32)
    seen = torch.full((CTAS,), -1, dtype=torch.int32)
    mod(ranks[0], delta, flag, seen, hang_timeout=60.0).check()
    assert seen.tolist() == [b * 100 + b * WORDS + 1 for b in range(CTAS)]
    assert flag.tolist() == list(range(CTAS))
