# SPDX-License-Identifier: Apache-2.0
"""On the GPU: every (kernel, config) of tirx-native against the oracle and references; graphs; torch.compile."""

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
CASES = testing.cases("tirx-native")


@pytest.mark.parametrize("kernel, label", CASES)
def test_correctness(kernel, label):
    testing.check_correctness(kernel, label)


@pytest.mark.parametrize("kernel, label", [c for c in CASES if c.values[0] == "rmsnorm"])
def test_matches_upstream(kernel, label):
    testing.check_upstream(kernel, label)


@pytest.mark.parametrize("kernel, label", [("rmsnorm", "bf16_37x2880_strided"), ("fp16_bf16_gemm", "bf16_129x264x72")])
def test_cuda_graph_replay_with_new_inputs(kernel, label):
    testing.check_graph_replay(kernel, label)


def test_rmsnorm_torch_compile_fullgraph():
    testing.load_or_skip("rmsnorm")
    from tirx_kernels.norm.rmsnorm import rmsnorm

    x = torch.randn(37, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    f = torch.compile(lambda x, w: rmsnorm(x, w, 1e-6).float() * 2, fullgraph=True)
    got = f(x, w)
    want = torch.nn.functional.rms_norm(x.float(), (4096,), w.float(), 1e-6) * 2
    torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)


def test_gemm_torch_compile_fullgraph():
    testing.load_or_skip("fp16_bf16_gemm")
    from tirx_kernels.gemm.fp16_bf16_gemm import gemm_nt

    a = torch.randn(300, 512, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(264, 512, dtype=torch.bfloat16, device="cuda")
    f = torch.compile(lambda a, b: gemm_nt(a, b).float() + 1, fullgraph=True)
    got = f(a, b)
    want = a.float() @ b.float().T + 1
    torch.testing.assert_close(got, want, atol=0.5, rtol=2e-2)


def test_rmsnorm_out_and_current_stream():
    testing.load_or_skip("rmsnorm")
    from tirx_kernels.norm.rmsnorm import rmsnorm

    x = torch.randn(64, 5120, dtype=torch.float16, device="cuda")
    w = torch.randn(5120, dtype=torch.float16, device="cuda")
    out = torch.full_like(x, float("nan"))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(1_000_000)  # the kernel must queue behind this on the same (current) stream
        r = rmsnorm(x, w, 1e-5, out=out)
    s.synchronize()
    assert r is out
    want = torch.nn.functional.rms_norm(x.float(), (5120,), w.float(), 1e-5)
    torch.testing.assert_close(out.float(), want, atol=5e-3, rtol=5e-3)
