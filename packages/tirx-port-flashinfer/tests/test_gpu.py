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
    # (dtype, d) of a config row (any d runs from the bundle now: the general kernel serves the rest).
    dtype = {"silu": torch.bfloat16, "gelu": torch.bfloat16, "gelu_tanh": torch.float16}[act]
    x = torch.randn(3, 37, 2 * 4096, dtype=dtype, device="cuda")
    f = torch.compile(lambda x: op(x).float() * 3, fullgraph=True)
    got = f(x)
    want = ref(x[..., :4096].float()) * x[..., 4096:].float() * 3
    torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("graph", [False, True])
def test_chained_calls_wait_for_their_input(graph):
    """The ops are programmatic dependent launches (core.lang.pdl): in a chain of 24 back-to-back
    ``silu_and_mul`` calls each writes the gate half of the next call's input (a strided ``out``), so only the
    next call's griddepcontrol.wait orders the two. Every link must be the oracle of the one before: a call that
    ran ahead would read NaN poison."""
    testing.load_or_skip("act_and_mul")
    from tirx_kernels.ported.flashinfer.activation.act_and_mul import silu_and_mul

    d = 128
    x = torch.randn(64, 2 * d, dtype=torch.bfloat16, device="cuda")
    bufs = [torch.randn_like(x) for _ in range(24)]  # up halves random, gate halves poisoned below

    def poison():
        for b in bufs:
            b[:, :d].fill_(float("nan"))

    def chain():
        silu_and_mul(x, out=bufs[0][:, :d])
        for i in range(1, len(bufs)):
            silu_and_mul(bufs[i - 1], out=bufs[i][:, :d])

    if graph:
        silu_and_mul(x, out=bufs[0][:, :d])  # load the artifact outside the capture
        torch.cuda.synchronize()
        poison()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain()
        g.replay()
    else:
        poison()
        torch.cuda._sleep(2_000_000)  # queue the whole chain behind a busy GPU: the launches then run back to back
        chain()
    torch.cuda.synchronize()
    prev = x
    for i, b in enumerate(bufs):
        pf = prev.float()
        want = torch.nn.functional.silu(pf[:, :d]) * pf[:, d:]
        assert not b[:, :d].isnan().any(), f"call {i}: NaN in the output"
        torch.testing.assert_close(b[:, :d].float(), want, atol=2e-2, rtol=2e-2, msg=lambda m, i=i: f"call {i}: {m}")
        prev = b


def test_eager_direct_path_matches_the_custom_op():
    # Eager calls run the kernel directly (runtime.direct_call), torch.compile and autograd through the custom op:
    # the same bits, and `out` counts as written.
    testing.load_or_skip("act_and_mul")
    from tirx_kernels.ported.flashinfer.activation.act_and_mul import silu_and_mul

    x = torch.randn(37, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    out = torch.full((37, 4096), float("nan"), dtype=torch.bfloat16, device="cuda")
    v = out._version
    assert silu_and_mul(x, out=out) is out and out._version > v
    via_op = torch.ops.tirx.act_and_mul(x, "silu")
    assert torch.equal(out, via_op) and torch.equal(silu_and_mul(x), via_op)
    assert torch.equal(silu_and_mul(x.clone().requires_grad_(True)), via_op)
