# SPDX-License-Identifier: Apache-2.0
"""On the GPU: every config of the FlashInfer ports against the oracle and FlashInfer; graphs; torch.compile."""

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
CASES = testing.cases("tirx-port-flashinfer")


@pytest.mark.parametrize("kernel, label", CASES)
def test_correctness(kernel, label):
    testing.check_correctness(kernel, label)


@pytest.mark.parametrize("kernel, label", CASES)
def test_matches_flashinfer(kernel, label):
    testing.check_upstream(kernel, label)


def test_cuda_graph_replay_with_new_inputs():
    first = CASES[0].values
    testing.check_graph_replay(*first)


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_act_and_mul_torch_compile_fullgraph(act):
    testing.load_or_skip("act_and_mul")
    from tirx_kernels.ported.flashinfer.activation import act_and_mul as m

    op = {"silu": m.silu_and_mul, "gelu": m.gelu_and_mul, "gelu_tanh": m.gelu_tanh_and_mul}[act]
    ref = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
    # (dtype, d) of a config row, so the prebuilt bundle has the artifact (act_and_mul compiles per d).
    dtype = {"silu": torch.bfloat16, "gelu": torch.bfloat16, "gelu_tanh": torch.float16}[act]
    x = torch.randn(3, 37, 2 * 4096, dtype=dtype, device="cuda")
    f = torch.compile(lambda x: op(x).float() * 3, fullgraph=True)
    got = f(x)
    want = ref(x[..., :4096].float()) * x[..., 4096:].float() * 3
    torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)
