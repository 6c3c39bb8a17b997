# SPDX-License-Identifier: Apache-2.0
"""flash_attention_backward_sm90's kernels (preprocess, main, dQ postprocess, group reduce) generated as one module and
run on the CPU (``core.emulate``'s module path: the host code encodes the 4-D tensor maps, TMA zero-fills the tails,
wgmma SS/RS with MN-major operands, the mbarrier rings, named barriers, the bulk reduction of dQ and the order flags
run as modelled), through the op's own launch sequence (``run_kernels``), against the fp32 oracle's autograd (torch on
the CPU); guard bands around dQ, dK, dV and the inputs checked unchanged.

CI emulates one kernel per schedule: bf16 hd 64 causal on GQA 2:1 with ragged blocks, both as one CTA per KV head
(dK / dV stored directly) and as a head split (fp32 partials summed by the reduce kernel), in deterministic mode (the
flag chain) and fast mode; the wide schedule at hd 256 (causal GQA, deterministic). ``TIRX_EMULATE_FULL=1`` adds head
dims 96, 128, 192 and 192/128, fp16, non-causal, Sq != Sk both ways, a one-row query, packed strided inputs and dLSE
(~20-40 s of g++ per kernel on the 2-core machine)."""

import math
import os
import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tirx_kernels.core import build, emulate, harness  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4 as fwd  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention_backward as mod  # noqa: E402

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
_modules = {}
# The CI rows' main kernels, generated into one module with the small kernels: one g++ run (~20 s) for both schedules.
_CI_MAINS = (("bfloat16", 64, 64, True), ("bfloat16", 256, 256, True))


def _main_name(dtype: str, d: int, dv: int, causal: bool) -> str:
    return f"main_{dtype}_{d}_{dv}_{int(causal)}"


def _module(dtype: str, d: int, dv: int, causal: bool, knobs: tuple = ()):
    """The emulated module holding this main kernel and the dtype's preprocess, postprocess and group reduce;
    ``knobs``: (name, value) pairs of ``_bwd_kernel.build_bwd_kernel``'s variant knobs."""
    mains = _CI_MAINS if (dtype, d, dv, causal) in _CI_MAINS and not knobs else ((dtype, d, dv, causal),)
    if (mains, knobs) not in _modules:
        if knobs:
            from tirx_kernels.ported.flashattention import _bwd_kernel

            funcs = {_main_name(dtype, d, dv, causal): _bwd_kernel.build_bwd_kernel(
                dtype, d, dv, causal, _bwd_kernel.block_m_for(d), **dict(knobs))}
        else:
            funcs = {_main_name(*key): mod.get_kernel("main", *key) for key in mains}
        funcs.update({k: mod.get_kernel(k, dtype) for k in ("pre", "post", "reduce")})
        _modules[(mains, knobs)] = emulate.compile_module(build.codegen_many(funcs))
    return _modules[(mains, knobs)]


def _guarded(shape, dtype):
    buf = torch.full((3, *shape), float("nan"), dtype=dtype)
    return buf, buf[1]


def _run(dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv, splits=None, deterministic=False, packed=False,  # noqa: N803
         dlse=False, seed=0, knobs: tuple = ()):
    torch.manual_seed(seed)
    t = getattr(torch, dtype)
    if packed:
        assert Sq == Sk and Hq == Hkv and d == dv
        q, k, v = torch.randn(B, Sq, 3, Hq, d).to(t).unbind(2)
    else:
        q, k, v = torch.randn(B, Sq, Hq, d).to(t), torch.randn(B, Sk, Hkv, d).to(t), torch.randn(B, Sk, Hkv, dv).to(t)
    scale = 1 / math.sqrt(d)
    out, lse = fwd.attention_fp32(q, k, v, scale, causal)
    out = out.to(t)
    dout = torch.randn(B, Sq, Hq, dv).to(t)
    g_lse = torch.randn(B, Hq, Sq) if dlse else None
    inputs = [q, k, v, out, dout, lse] + ([g_lse] if dlse else [])
    before = [x.clone() for x in inputs]
    bufs, grads = zip(*(_guarded(x.shape, t) for x in (q, k, v)))
    emu = _module(dtype, d, dv, causal, knobs)

    def call(kernel, *args):
        name = _main_name(dtype, d, dv, causal) if kernel == "main" else kernel
        emu(*args, function=name, hang_timeout=120.0).check()

    mod.run_kernels(call, q, k, v, out, dout, lse, g_lse, scale, causal, deterministic, *grads, splits=splits)
    for x, x0 in zip(inputs, before):
        assert torch.equal(x, x0), "an input was modified"
    for buf in bufs:
        assert buf[0].isnan().all() and buf[2].isnan().all(), "written outside the output"
    want = mod.attention_grads_fp32(q, k, v, dout, scale, causal, g_lse, out=out)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        harness.compare(name, got, ref, mod.TOLERANCE[dtype], "the fp32 oracle's autograd")
    return grads


def test_wait_fence_variant():
    """``wait_fence`` (the dP^T wait behind a warpgroup barrier that depends on every P^T value): hd128's block_m 64
    path, ragged query and key blocks, a causal diagonal."""
    _run("bfloat16", 128, 128, True, B=1, Sq=130, Sk=200, Hq=2, Hkv=1, seed=5, knobs=(("wait_fence", True),))


@pytest.mark.parametrize("splits, deterministic", [(1, True), (2, False)], ids=["direct_det", "split_fast"])
def test_gqa_ragged_causal(splits, deterministic):
    # 2 query heads on one KV head, 300 keys (3 key blocks, the last ragged), 200 queries (2 blocks of 128, ragged):
    # bottom-right causal skips query blocks per key block; deterministic mode chains the key blocks' dQ adds (here
    # the CTAs run one after another anyway: bit-identity run to run is a GPU test).
    _run("bfloat16", 64, 64, True, B=1, Sq=200, Sk=300, Hq=2, Hkv=1, splits=splits, deterministic=deterministic)


@full_only
@pytest.mark.parametrize("dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv", [
    ("bfloat16", 128, 128, False, 2, 130, 77, 2, 2),
    ("float16", 64, 64, True, 1, 100, 230, 4, 2),
    ("bfloat16", 128, 128, True, 1, 300, 130, 2, 1),  # rows that see no key: dQ 0
    ("bfloat16", 64, 64, True, 1, 1, 17, 2, 1),
    ("bfloat16", 96, 96, True, 1, 150, 150, 2, 1),
    ("float16", 128, 128, True, 1, 200, 200, 2, 2),
])
def test_head_dims_and_shapes(dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv):  # noqa: N803
    _run(dtype, d, dv, causal, B, Sq, Sk, Hq, Hkv)


@pytest.mark.parametrize("d, dv, causal, B, Sq, Sk, Hq, Hkv, splits, deterministic", [
    (256, 256, True, 1, 100, 150, 2, 1, 1, True),  # the CI row of the wide schedule: GQA, ragged, ordered dQ adds
    pytest.param(192, 128, True, 1, 130, 70, 2, 1, 2, False, marks=full_only),  # rows that see no key; head split
    pytest.param(192, 192, False, 2, 70, 100, 2, 2, None, False, marks=full_only),
    pytest.param(256, 256, False, 1, 1, 65, 4, 2, 2, True, marks=full_only),
], ids=["d256_causal_det", "d192_128_causal_split", "d192", "d256_decode_split_det"])
def test_wide_head_dims(d, dv, causal, B, Sq, Sk, Hq, Hkv, splits, deterministic):  # noqa: N803
    """The wide schedule (head dims past 128: the consumers split the head dims, P and dS through shared memory,
    dQ by red.global.add.v4 from registers)."""
    _run("bfloat16", d, dv, causal, B, Sq, Sk, Hq, Hkv, splits=splits, deterministic=deterministic)


@full_only
def test_packed_qkv_views_and_dlse():
    _run("bfloat16", 64, 64, True, B=2, Sq=150, Sk=150, Hq=2, Hkv=2, packed=True, dlse=True, seed=3)


@full_only
def test_deterministic_noncausal_hd128():
    _run("bfloat16", 128, 128, False, B=1, Sq=300, Sk=270, Hq=2, Hkv=1, deterministic=True, seed=4)
