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


def test_integer_outputs_compare_exactly_beyond_float32_precision():
    ref = torch.tensor([2**25, 7], dtype=torch.int64)
    harness.compare("i", ref.clone(), ref, harness.EXACT, "oracle")
    with pytest.raises(harness.KernelCheckError, match=r"1 of 2 elements.*\(0,\): got 33554433"):
        harness.compare("i", ref + torch.tensor([1, 0]), ref, harness.EXACT, "oracle")  # equal in float32


def test_tolerance_by_dtype_and_module_override():
    import types

    mod = types.SimpleNamespace(KERNEL_META={"name": "m"}, TOLERANCE={"uint8": (0.0, 0.5)})
    assert harness.tolerance(mod, torch.empty(1, dtype=torch.float8_e4m3fn)) == harness.DEFAULT_TOLERANCE[
        "float8_e4m3fn"]
    assert harness.tolerance(mod, torch.empty(1, dtype=torch.int32)) == harness.EXACT
    assert harness.tolerance(mod, torch.empty(1, dtype=torch.uint8)) == (0.0, 0.5)


def test_poison_of_integer_outputs_and_guarded_copy():
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert (harness.poison_(t.clone()) == 0x5A5A5A5A).all()
    view, base, inside = harness.guarded_copy(t)
    assert torch.equal(view, t) and (base[~inside] == 0x5A5A5A5A).all()


def test_bit_exact_reports_codes_in_hex():
    want = torch.tensor([1.0, -2.0, 0.5]).to(torch.float8_e4m3fn)
    got = want.clone()
    harness.bit_exact(got, want.float(), {}, {})  # an fp32 oracle of representable codes
    got.view(torch.uint8)[1] ^= 1
    with pytest.raises(harness.KernelCheckError, match=r"1 of 3 .*\(1,\): got 0xc1, want 0xc0"):
        harness.bit_exact(got, want, {}, {})
