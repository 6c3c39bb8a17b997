# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_varlen's generated module run on the CPU (``core.emulate``'s module path: 3-D tensor maps over
the packed rows, TMA, wgmma SS/RS, mbarrier rings) against the fp32 oracle per sequence, output and LSE, with guard
bands around the outputs and the inputs checked unchanged.

CI emulates one kernel (bf16, hd 64, causal, the default schedule) on one batch that holds every case at once:
ragged lengths across tile edges, an empty sequence, a sequence with queries but no keys, Sq > Sk (rows that see no
key) and Sq < Sk, GQA 2:1, seqused_k shorter than the packed keys (the unused keys hold NaN: they must not reach
the output). ``TIRX_EMULATE_FULL=1`` adds non-causal with
another head-dim pair, fp16 and the plain schedule."""

import os
import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tirx_kernels.core import emulate  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4 as fa  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4_varlen as mod  # noqa: E402

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
_modules = {}


def _kernel(dtype: str, d: int, dv: int, causal: bool, schedule: str = mod.SCHEDULE):
    key = (dtype, d, dv, causal, schedule)
    if key not in _modules:
        _modules[key] = emulate.compile_module(mod.get_kernel(dtype, d, dv, causal, schedule))
    return _modules[key]


def _unchanged(a, b):
    """Bit for bit, NaN where NaN was."""
    return torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())


def _guarded(shape, dtype):
    buf = torch.full((3, *shape), float("nan"), dtype=dtype)
    return buf, buf[1]


def _run(dtype, d, dv, causal, seqlens_q, seqlens_k, hq, hkv, seqused_k=None, seed=0, schedule=mod.SCHEDULE):
    torch.manual_seed(seed)
    data = mod.prepare_data(dtype, seqlens_q, seqlens_k, hq, hkv, d, dv, causal, seqused_k=seqused_k,
                            poison_unused=True, device="cpu")
    inputs = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k") + (("seqused_k",) if seqused_k is not None else ())
    before = {n: data[n].clone() for n in inputs}
    out_buf, out = _guarded(tuple(data["out"].shape), data["out"].dtype)
    lse_buf, lse = _guarded(tuple(data["lse"].shape), torch.float32)
    used = data.get("seqused_k", torch.zeros(1, dtype=torch.int32))
    _kernel(dtype, d, dv, causal, schedule)(
        data["q"], data["k"], data["v"], data["cu_seqlens_q"], data["cu_seqlens_k"], used, out, lse,
        data["max_seqlen_q"], int(seqused_k is not None), data["softmax_scale"], hang_timeout=60.0).check()
    for n in inputs:
        assert _unchanged(data[n], before[n]), f"input {n} was modified"
    for buf in (out_buf, lse_buf):
        assert buf[0].isnan().all() and buf[2].isnan().all(), "written outside the output"
    want = mod.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])
    return out, lse


def test_ragged_batch_with_empty_sequences_gqa_causal_seqused():
    # sequences: 1 query / 1 key; 17 / 17 (within one tile); 0 / 5 (no query); 40 / 0 (no key: out 0, lse -inf);
    # 130 / 200 (two query tiles, Sq < Sk); 150 / 100 (Sq > Sk: the first 50 rows see no key); 64 / 300 used 90.
    seqlens_q = [1, 17, 0, 40, 130, 150, 64]
    seqlens_k = [1, 17, 5, 0, 200, 100, 300]
    seqused_k = [1, 17, 5, 0, 200, 100, 90]
    out, lse = _run("bfloat16", 64, 64, True, seqlens_q, seqlens_k, 2, 1, seqused_k=seqused_k)
    no_key = slice(18, 58)
    assert (out[no_key] == 0).all() and torch.isinf(lse[:, no_key]).all()


@full_only
@pytest.mark.parametrize("dtype, d, dv, causal, seqlens_q, seqlens_k, hq, hkv", [
    ("bfloat16", 128, 128, False, [77, 0, 200, 3], [130, 9, 0, 257], 4, 2),
    ("float16", 64, 64, True, [129, 257, 3], [300, 257, 3], 4, 1),
    ("bfloat16", 192, 128, True, [100, 70], [100, 150], 2, 1),
])
def test_more_varlen_kernels(dtype, d, dv, causal, seqlens_q, seqlens_k, hq, hkv):
    _run(dtype, d, dv, causal, seqlens_q, seqlens_k, hq, hkv, seed=1)


@full_only
def test_plain_schedule():
    _run("bfloat16", 64, 64, True, [1, 17, 130], [1, 60, 130], 2, 1, seed=2, schedule="plain")
