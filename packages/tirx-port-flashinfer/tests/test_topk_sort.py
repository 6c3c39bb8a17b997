# SPDX-License-Identifier: Apache-2.0
"""stable_sort_topk_by_value: the generated CUDA run on the CPU (``core.emulate``) against an exact oracle (order
keys descending, then position: NaN first, -0.0 equal to +0.0, ties in input order), bit for bit, on random rows,
heavy ties, +-inf / NaN / -0.0, a valid count short of k (padding copied) and in place; top_k(sorted=True) on a GPU."""

import os
import re

import pytest
import torch

from tirx_kernels.core import testing
from tirx_kernels.ported.flashinfer.topk import radix_topk_single_cta as single
from tirx_kernels.ported.flashinfer.topk import stable_sort_topk_by_value as mod

_single_cta_tests = testing.load_sibling("test_topk_single_cta", __file__)
_RAW = _single_cta_tests._RAW
_cpu_builtins = _single_cta_tests._cpu_builtins
make_rows = _single_cta_tests.make_rows
oracle = _single_cta_tests.oracle
order_keys = _single_cta_tests.order_keys

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (CPU time CI keeps for other kernels)")


def sort_oracle(v: torch.Tensor, i: torch.Tensor, valid: int):
    k = v.shape[1]
    comp = order_keys(v[:, :valid]) * 8192 + (8191 - torch.arange(valid))
    order = comp.sort(-1, descending=True).indices
    return (torch.cat([v[:, :valid].gather(-1, order), v[:, valid:]], -1),
            torch.cat([i[:, :valid].gather(-1, order), i[:, valid:]], -1)) if valid < k else (
        v.gather(-1, order), i.gather(-1, order))


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(dtype, index_dtype):
        if (dtype, index_dtype) not in cache:
            src = codegen(mod.get_kernel(dtype, index_dtype))
            cse = {m.group(1): (m.group(2), m.group(3))
                   for m in re.finditer(r"int32_t (cse_v\d+) = \((\w+) \* (\w+)\);", src)}
            cache[(dtype, index_dtype)] = (emulate.compile(_cpu_builtins(src)), cse)
        return cache[(dtype, index_dtype)]
    return get


@pytest.mark.parametrize("kind, M, k, valid, dtype, index_dtype, in_place", [
    ("random", 3, 4096, 4096, torch.float32, torch.int64, False),
    ("ties", 2, 1000, 777, torch.bfloat16, torch.int32, False),
    ("special", 3, 513, 513, torch.float16, torch.int64, True),
    pytest.param("special", 2, 300, 300, torch.float32, torch.int32, True, marks=full_only),
    pytest.param("constant", 1, 64, 64, torch.float32, torch.int64, False, marks=full_only),
    pytest.param("random", 2, 5, 1, torch.float32, torch.int64, False, marks=full_only),
])
def test_emulated(emulated, kind, M, k, valid, dtype, index_dtype, in_place):
    kern, cse = emulated(str(dtype)[6:], str(index_dtype)[6:])
    v = make_rows(kind, M, k, dtype, seed=k + valid)
    i = torch.randperm(1 << 20)[:M * k].view(M, k).to(index_dtype)
    v0, i0 = v.clone(), i.clone()
    ov, oi = (v, i) if in_place else (torch.full_like(v, float("nan")), torch.full_like(i, -5))
    dims = {"M": M, "K": k}
    scalars = {**dims, "valid": valid, **{n: dims[a] * dims[b] for n, (a, b) in cse.items()}}
    tensors = {"V_ptr": v, "Ix_ptr": i, "OV_ptr": ov, "OI_ptr": oi}
    kern(*[tensors[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=(M,), block=(1024,)).check()
    want_v, want_i = sort_oracle(v0, i0, valid)
    assert torch.equal(oi, want_i)
    assert torch.equal(ov.view(_RAW[dtype]), want_v.view(_RAW[dtype]))
    if not in_place:
        assert torch.equal(v.view(_RAW[dtype]), v0.view(_RAW[dtype])) and torch.equal(i, i0)


def test_oracle_agrees_with_reference():
    """The protocol's torch reference (used on the GPU) and the key oracle agree, NaN and ties included."""
    v = make_rows("special", 3, 200, torch.float32, seed=1)
    v[:, 5] = v[:, 9]  # exact ties
    i = torch.arange(600).view(3, 200)
    ref = mod.reference(v, i, 150)
    want_v, want_i = sort_oracle(v, i, 150)
    assert torch.equal(ref["indices"], want_i)
    assert torch.equal(ref["values"].nan_to_num(7.0), want_v.float().nan_to_num(7.0))


@pytest.mark.parametrize("valid", [150, 200])
def test_torch_baseline_agrees_with_reference(valid):
    """The ``torch`` baseline the GPU checks compare with: whole rows, the padding past a short ``valid`` copied (it
    returned the sorted head only, so f16_r8_k1000_v777 'differed from torch's stable sort' on the H200)."""
    from tirx_kernels.core import harness

    v = make_rows("special", 3, 200, torch.float32, seed=2)
    v[:, 5] = v[:, 9]
    d = {"in_values": v, "in_indices": torch.arange(600).view(3, 200), "valid": valid}
    got = mod.get_baselines()["torch"]()(d)
    want = mod.reference(**d)
    harness.check_outputs(mod, got, want, "the oracle", {}, d)


def test_rejected_inputs():
    from tirx_kernels.core.checks import TirxInputError

    v, i = torch.zeros(2, 8), torch.zeros(2, 8, dtype=torch.int64)
    with pytest.raises(TirxInputError, match="argument 'indices'"):
        mod.stable_sort_topk_by_value(v, i[:, :4], 8, v, i)
    with pytest.raises(TirxInputError, match="argument 'valid'"):
        mod.stable_sort_topk_by_value(v, i, 2.0, v, i)
    with pytest.raises(TirxInputError, match="argument 'values'.*CUDA"):
        mod.stable_sort_topk_by_value(v, i, 8, v, i)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("M, N, k", [(64, 131072, 2048), (1, 131072, 2048), (7, 1000, 1500)])
def test_gpu_top_k_sorted(M, N, k):
    """top_k(sorted=True): the deterministic selection sorted stably (ties lowest index first), like torch.topk's
    values; padding past a short row left in place."""
    x = make_rows("ties", M, N, torch.float32, seed=4).cuda()
    v, i = single.top_k(x, k, sorted=True)
    sel_v, sel_i = oracle(x.cpu(), k)
    want_v, want_i = sort_oracle(sel_v, sel_i, min(k, N))
    assert torch.equal(i.cpu(), want_i) and torch.equal(v.cpu(), want_v)
