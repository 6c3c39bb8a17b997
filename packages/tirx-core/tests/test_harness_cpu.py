# SPDX-License-Identifier: Apache-2.0
"""The harness's checking pieces, exercised on CPU tensors (the GPU run uses the same code)."""

import pytest
import torch

from tirx_kernels.core import harness


def test_poison_like_guards_and_stride_gaps():
    t = torch.empty(4, 8, dtype=torch.bfloat16)[:, :6]  # row stride 8 > 6
    view, base, inside = harness.poison_like(t)
    assert view.stride() == (8, 1) and torch.isnan(view.float()).all()
    assert int(inside.sum()) == 24
    view.fill_(1.0)  # a correct kernel writes exactly the view
    outside = base[~inside]
    assert torch.isnan(outside.float()).all()
    base[harness.GUARD_ELEMS + 6] = 0  # a write into the stride gap is outside the view
    assert not torch.isnan(base[~inside].float()).all()


def test_compare_accepts_rounding_and_rejects_errors():
    ref = torch.randn(256, 256)
    harness.compare("x", ref.bfloat16(), ref, harness.DEFAULT_TOLERANCE["bfloat16"], "oracle")
    bad = ref.clone()
    bad[3, 4] += 1.0
    with pytest.raises(harness.KernelCheckError, match=r"1 of 65536 elements.*\(3, 4\)"):
        harness.compare("x", bad.bfloat16(), ref, harness.DEFAULT_TOLERANCE["bfloat16"], "oracle")


def test_compare_rejects_unwritten_poison():
    ref = torch.randn(8, 8)
    out = ref.clone()
    out[0, 0] = float("nan")
    with pytest.raises(harness.KernelCheckError, match="not finite"):
        harness.compare("x", out, ref, (1e-5, 1e-5), "oracle")


def test_bound_functions_are_marked():
    run_test, run_bench = harness.bind("tirx_kernels.norm.rmsnorm")
    assert run_test.__tirx_harness__ == "tirx_kernels.norm.rmsnorm"
    assert run_bench.__tirx_harness__ == "tirx_kernels.norm.rmsnorm"
