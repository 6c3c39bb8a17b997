# SPDX-License-Identifier: Apache-2.0
"""flash_attention4's generated module run on the CPU (``core.emulate``'s module path: its host code encodes the
4-D tensor maps, TMA zero-fills the tails, wgmma SS/RS and the mbarrier rings run as modelled) against the fp32
oracle, output and LSE, with guard bands around the outputs and the inputs checked unchanged.

CI emulates one kernel (bf16, hd 64, causal, the default schedule) on three shapes: GQA 2:1 with ragged tiles, Sq > Sk
(rows that see no key: out 0, lse -inf), packed-QKV strided views. ``TIRX_EMULATE_FULL=1`` adds every other head-dim
pair, fp16, non-causal, Sq < Sk, one-row decode and the plain and pingpong schedules (each kernel ~20-40 s of g++
on the 2-core machine)."""

import math
import os
import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tirx_kernels.core import emulate  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4 as mod  # noqa: E402

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
_modules = {}


def _kernel(dtype: str, d: int, dv: int, causal: bool, schedule: str = mod.SCHEDULE, variant: str | None = None):
    key = (dtype, d, dv, causal, schedule, variant)
    if key not in _modules:
        _modules[key] = emulate.compile_module(mod.get_kernel(dtype, d, dv, causal, schedule, variant))
    return _modules[key]


def _guarded(shape, dtype):
    """A contiguous output view with a NaN-poisoned slab of the same shape before and after it."""
    buf = torch.full((3, *shape), float("nan"), dtype=dtype)
    return buf, buf[1]


def _run(dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv, packed=False, seed=0, schedule=mod.SCHEDULE,  # noqa: N803
         variant=None):
    torch.manual_seed(seed)
    t = getattr(torch, dtype)
    if packed:  # q, k, v as views of one [B, S, 3, H, D] tensor: batch / sequence strides of the packed layout
        assert Sq == Sk and Hq == Hkv and d == dv
        qkv = torch.randn(B, Sq, 3, Hq, d).to(t)
        q, k, v = qkv.unbind(2)
    else:
        q, k, v = torch.randn(B, Sq, Hq, d).to(t), torch.randn(B, Sk, Hkv, d).to(t), torch.randn(B, Sk, Hkv, dv).to(t)
    before = [x.clone() for x in (q, k, v)]
    out_buf, out = _guarded((B, Sq, Hq, dv), t)
    lse_buf, lse = _guarded((B, Hq, Sq), torch.float32)
    scale = 1 / math.sqrt(d)
    _kernel(dtype, d, dv, causal, schedule, variant)(q, k, v, out, lse, scale, hang_timeout=60.0).check()
    for x, x0 in zip((q, k, v), before):
        assert torch.equal(x, x0), "an input was modified"
    for buf in (out_buf, lse_buf):
        assert buf[0].isnan().all() and buf[2].isnan().all(), "written outside the output"
    want, want_lse = mod.attention_fp32(q, k, v, scale, causal)
    mod.check_outputs_against_oracle(out, lse, want, want_lse)
    return lse


def test_gqa_ragged_causal():
    _run("bfloat16", 64, 64, True, B=1, Sq=200, Sk=200, Hq=2, Hkv=1)


def test_more_queries_than_keys_leaves_rows_empty():
    lse = _run("bfloat16", 64, 64, True, B=1, Sq=300, Sk=130, Hq=2, Hkv=2, seed=1)
    assert torch.isinf(lse[:, :, :170]).all() and torch.isfinite(lse[:, :, 170:]).all()


def test_packed_qkv_views():
    _run("bfloat16", 64, 64, True, B=2, Sq=150, Sk=150, Hq=2, Hkv=2, packed=True, seed=2)


def test_three_consumer_variant_with_split_mask_loop_and_fenced_wait():
    """``ovl3_c3``: three consumer warpgroups taking turns (barriers 4-6), 192-row query tiles, the unmasked tiles in
    their own loop, the PV wait behind a row-sum-dependent warpgroup barrier (1-3) and V released late; causal with
    ragged tiles (700 = 3 x 192 + 124 queries, 6 key tiles)."""
    _run("bfloat16", 64, 64, True, B=1, Sq=700, Sk=700, Hq=2, Hkv=1, seed=3, variant="ovl3_c3")


@full_only
@pytest.mark.parametrize("variant, d, causal, Sq, Sk", [
    ("ovl2", 128, True, 300, 430), ("ovl2_n176", 128, False, 200, 400), ("ovl2_n192", 64, False, 130, 500),
    ("ovl2_c3", 64, True, 400, 400), ("ovl3", 128, True, 300, 430), ("ovl3_n176", 128, False, 200, 400),
    ("ovl3_re", 128, True, 300, 430), ("ovl3_re", 64, False, 200, 333),
    ("base", 128, True, 300, 300), ("pp_exp2", 128, False, 150, 260)])
def test_schedule_variants(variant, d, causal, Sq, Sk):  # noqa: N803
    """The variants tools/sweeps/attn_schedules.py times against the default (flash_attention4.VARIANTS)."""
    _run("bfloat16", d, d, causal, B=1, Sq=Sq, Sk=Sk, Hq=2, Hkv=1, seed=4, variant=variant)


@full_only
@pytest.mark.parametrize("dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv", [
    ("bfloat16", 128, 128, False, 2, 130, 77, 2, 2),
    ("float16", 64, 64, True, 1, 100, 230, 4, 2),
    ("bfloat16", 128, 128, True, 1, 300, 130, 2, 2),
    ("bfloat16", 64, 64, True, 1, 1, 17, 2, 1),
    ("bfloat16", 96, 96, True, 1, 150, 150, 2, 1),
    ("bfloat16", 192, 192, False, 1, 70, 100, 1, 1),
    ("bfloat16", 192, 128, True, 1, 150, 200, 2, 1),
    ("float16", 256, 256, False, 1, 70, 150, 1, 1),
    ("float16", 256, 256, True, 1, 200, 200, 2, 2),
])
def test_every_head_dim_pair(dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv):  # noqa: N803
    _run(dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv)


@full_only
@pytest.mark.parametrize("schedule", ["plain", "pingpong"])
def test_other_schedules(schedule):
    """The variants kept to measure the default against on the GPU: no turns; turns without the overlap."""
    _run("bfloat16", 128, 128, True, B=1, Sq=300, Sk=300, Hq=2, Hkv=1, schedule=schedule)
