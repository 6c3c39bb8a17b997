# SPDX-License-Identifier: Apache-2.0
"""On the GPU: the wgmma micro-kernels of ``test_lang_wgmma_gpu.py`` (SS bf16 SW128/64/32, a runtime
``scale_d`` restart, SS fp16 with an MN-major B, RS bf16, SS fp8 e4m3/e5m2, SS tf32) against a float64 matmul
of the same rounded inputs. The GPU host has no compiler: the kernels come prebuilt from
``$TIRX_LANG_MICRO_DIR`` (default ``build/lang-micro``), made on the CPU machine with
``python packages/tirx-core/tests/test_lang_wgmma_gpu.py build/lang-micro``. Needs only torch + tvm-ffi.
"""

import os

import pytest

from tirx_kernels.core import testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUNDLE, CASES = testing.micro_bundle_cases(ROOT, "cases.json")


def _operand(dtype: str, shape, gen):
    """Random nonzero values exactly representable in ``dtype`` (tf32: low 13 mantissa bits cleared), as
    (fp32 values, raw int32 words of the row-major storage)."""
    import torch

    mag = torch.empty(shape).uniform_(0.5, 2.0, generator=gen)
    sign = torch.randint(0, 2, shape, generator=gen).float() * 2 - 1
    x = mag * sign
    if dtype == "float32":
        stored = (x.view(torch.int32) & ~0x1FFF).view(torch.float32)  # tf32: what the tensor core reads
    else:
        stored = x.to(getattr(torch, dtype))
    vals = stored.float()
    assert bool((vals != 0).all())
    return vals, stored.contiguous().view(torch.uint8).view(torch.int32)


@pytest.mark.skipif(testing.micro_skip_reason() is not None, reason=str(testing.micro_skip_reason()))
@pytest.mark.skipif(not CASES, reason=f"no prebuilt micro-kernels in {BUNDLE} (build them on the CPU machine: "
                                      "python packages/tirx-core/tests/test_lang_wgmma_gpu.py build/lang-micro)")
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_micro_kernel_numerics(case):
    import torch
    import tvm_ffi

    fn = tvm_ffi.load_module(os.path.join(BUNDLE, case["so"]))["main"]
    seed = int.from_bytes(os.urandom(8), "little") >> 1  # fresh inputs every run; printed on failure
    gen = torch.Generator().manual_seed(seed)
    m, n, k = case["m"], case["n"], case["k"]
    a, a_raw = _operand(case["a_dtype"], (m, k), gen)
    if case["b_major"] == "k":
        b, b_raw = _operand(case["b_dtype"], (n, k), gen)
        b_kn = b.T
    else:
        b, b_raw = _operand(case["b_dtype"], (k, n), gen)
        b_kn = b
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    fn(a_raw.cuda(), b_raw.cuda(), out, 0)  # 0: the runtime k0 of the scale_d restart case
    torch.cuda.synchronize()
    out = out.cpu()
    ref = a.double() @ b_kn.double()
    bound = case["tol"] * (a.abs().double() @ b_kn.abs().double())
    assert not out.isnan().any(), f"seed {seed}: {int(out.isnan().sum())} outputs not written (or NaN kept)"
    err = (out.double() - ref).abs()
    bad = err > bound
    assert not bad.any(), (
        f"seed {seed}: {int(bad.sum())}/{bad.numel()} outside tol {case['tol']}: first at "
        f"{bad.nonzero()[0].tolist()}, max err/bound {float((err / bound).max()):.3g}")
