# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_kvcache's decode and combine kernels run on the CPU (``core.emulate``'s module path) through the
op's own launch path (``_launch_args`` and ``_run``: page table, box height, split count, partial buffers, the
combine), against the fp32 oracle on the gathered cache, output and LSE, with guard bands around the outputs and the
inputs checked unchanged; every cache slot no sequence uses holds NaN (it must not reach the output).

CI compiles one decode kernel (bf16, hd 64) with the bf16 combine and runs two calls: a paged cache (pages of 16
rows in a random order, GQA 4:1 packed into the M tile, 2 queries, causal, an empty sequence, 3 splits through the
combine) and a contiguous cache through ``cache_batch_idx`` (1 query, no split: out and LSE written directly).
``TIRX_EMULATE_FULL=1`` adds hd 128 with pages of 48 rows, more splits than key tiles, MQA 16:1 with 4 queries, a
query block past 64 packed rows, an int cache_seqlens and fp16."""

import os
import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tirx_kernels.core import build, emulate  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4 as fa  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4_kvcache as mod  # noqa: E402

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
_modules = {}


def _kernels(dtype: str, d: int, dv: int):
    """The decode kernel and the combine kernel of ``dtype``, compiled together (one g++ run)."""
    key = (dtype, d, dv)
    if key not in _modules:
        funcs = {"decode": mod.get_kernel("decode", dtype, d, dv), "combine": mod.get_kernel("combine", dtype)}
        _modules[key] = emulate.compile_module(build.codegen_many(funcs))
    return _modules[key]


class _Emulated:
    """Stands in for the op's function cache: each launch runs the emulated kernel and must come back clean."""

    def __init__(self, kernels):
        self.kernels = kernels
        self.launches = []

    def get(self, key, params_of, device=None):
        name = key[0]

        def call(*args):
            self.launches.append(name)
            self.kernels(*args, function=name, hang_timeout=60.0).check()
        return call


def _guarded(shape, dtype):
    buf = torch.full((3, *shape), float("nan"), dtype=dtype)
    return buf, buf[1]


def _run(monkeypatch, dtype, d, dv, B, Sq, Hq, Hkv, seqlens_k, page_size=None, causal=False, num_splits=1,  # noqa: N803
         cache_batch_idx=False, int_seqlens=False, seed=0):
    torch.manual_seed(seed)
    data = mod.prepare_data(dtype, B, Sq, Hq, Hkv, d, seqlens_k, Dv=dv, causal=causal, page_size=page_size,
                            num_splits=num_splits, cache_batch_idx=cache_batch_idx, poison_tail=True, device="cpu")
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "cache_batch_idx")
    before = {n: data[n].clone() for n in names if n in data}
    out_buf, out = _guarded(tuple(data["out"].shape), data["out"].dtype)
    lse_buf, lse = _guarded(tuple(data["lse"].shape), torch.float32)
    table = data.get("block_table")
    capacity = table.shape[1] * page_size if table is not None else data["k_cache"].shape[1]
    seqlens = int(seqlens_k[0]) if int_seqlens else data["cache_seqlens"]
    emulated = _Emulated(_kernels(dtype, d, dv))
    monkeypatch.setattr(mod, "_FUNCTIONS", emulated)
    args = mod._launch_args(data["q"], data["k_cache"], data["v_cache"], seqlens, data.get("cache_batch_idx"), table,
                            num_splits, capacity)
    mod._run(data["q"], data["k_cache"], data["v_cache"], *args, data["softmax_scale"], causal, out, lse)
    assert emulated.launches == (["decode"] if args[-1] == 1 else ["decode", "combine"])
    for n, t in before.items():
        assert torch.equal(data[n].nan_to_num(), t.nan_to_num()) and torch.equal(data[n].isnan(), t.isnan()), \
            f"input {n} was modified"
    for buf in (out_buf, lse_buf):
        assert buf[0].isnan().all() and buf[2].isnan().all(), "written outside the output"
    if int_seqlens:
        data["cache_seqlens"].fill_(seqlens)
    want = mod.reference(**data)
    fa.check_outputs_against_oracle(out, lse, want["out"], want["lse"])
    return out, lse


def test_paged_out_of_order_gqa_causal_split(monkeypatch):
    out, lse = _run(monkeypatch, "bfloat16", 64, 64, B=3, Sq=2, Hq=8, Hkv=2, seqlens_k=[300, 0, 17], page_size=16,
                    causal=True, num_splits=3)
    assert (out[1] == 0).all() and torch.isinf(lse[1]).all()


def test_contiguous_cache_batch_idx_direct(monkeypatch):
    _run(monkeypatch, "bfloat16", 64, 64, B=3, Sq=1, Hq=4, Hkv=4, seqlens_k=[130, 1, 64], cache_batch_idx=True)


@full_only
@pytest.mark.parametrize("case", [
    dict(dtype="bfloat16", d=128, dv=128, B=2, Sq=3, Hq=6, Hkv=2, seqlens_k=[200, 97], page_size=48, causal=True,
         num_splits=9),
    dict(dtype="bfloat16", d=128, dv=128, B=1, Sq=4, Hq=16, Hkv=1, seqlens_k=[150], page_size=16, num_splits=2),
    dict(dtype="bfloat16", d=64, dv=64, B=1, Sq=20, Hq=8, Hkv=2, seqlens_k=[90], page_size=32, causal=True,
         num_splits=2),
    dict(dtype="bfloat16", d=64, dv=64, B=2, Sq=1, Hq=2, Hkv=1, seqlens_k=[100, 100], int_seqlens=True,
         num_splits=2),
    dict(dtype="float16", d=64, dv=64, B=2, Sq=2, Hq=4, Hkv=2, seqlens_k=[5, 260], page_size=64, causal=True),
])
def test_more_kvcache_calls(monkeypatch, case):
    _run(monkeypatch, **case, seed=1)
