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


def _chain(step, first, bufs):
    """``bufs[0] = step(first)``, ``bufs[i] = step(bufs[i - 1])``: back-to-back launches, each reading the
    previous one's output as soon as it may start."""
    step(first, bufs[0])
    for i in range(1, len(bufs)):
        step(bufs[i - 1], bufs[i])


@pytest.mark.parametrize("graph", [False, True])
def test_rmsnorm_chained_calls_wait_for_their_input(graph):
    """The op is a programmatic dependent launch (core.lang.pdl): each call in a chain of 24 back-to-back calls
    reads the previous call's output, which its griddepcontrol.wait alone orders (the previous call signals
    its dependents after its stores). Every intermediate must be the oracle of the one before: a call that ran
    ahead would read NaN poison or a partial row."""
    testing.load_or_skip("rmsnorm")
    from tirx_kernels.norm.rmsnorm import rmsnorm

    x = torch.randn(64, 128, dtype=torch.bfloat16, device="cuda")
    w = (torch.rand(128, device="cuda") + 0.5).to(torch.bfloat16)
    bufs = [torch.full_like(x, float("nan")) for _ in range(24)]

    def step(src, dst):
        rmsnorm(src, w, 1e-6, out=dst)

    if graph:
        step(x, bufs[0])  # load the artifact outside the capture
        torch.cuda.synchronize()
        for b in bufs:
            b.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            _chain(step, x, bufs)
        g.replay()
    else:
        torch.cuda._sleep(2_000_000)  # queue the whole chain behind a busy GPU: the launches then run back to back
        _chain(step, x, bufs)
    torch.cuda.synchronize()
    prev = x
    for i, b in enumerate(bufs):
        want = torch.nn.functional.rms_norm(prev.float(), (128,), w.float(), 1e-6)
        assert not b.isnan().any(), f"call {i}: NaN in the output"
        torch.testing.assert_close(b.float(), want, atol=2e-2, rtol=2e-2, msg=lambda m, i=i: f"call {i}: {m}")
        prev = b


@pytest.mark.parametrize("M", [1024, 256, 1])  # TILE_TABLE picks a persistent, a 128-row and a 64-row small-M tile
def test_gemm_chained_calls_wait_for_their_input(M):
    """The GEMM kernels are programmatic dependent launches too: in a chain of 16 back-to-back ``gemm_nt`` calls
    each multiplies the previous call's output (C_i = C_{i-1} . B^T, 256 x 256 B scaled to keep the norm), which
    only its griddepcontrol.wait orders. Every link must match the oracle of the link before."""
    testing.load_or_skip("fp16_bf16_gemm")
    from tirx_kernels.gemm.fp16_bf16_gemm import gemm_nt

    n = 256
    x = torch.randn(M, n, dtype=torch.bfloat16, device="cuda")
    b = (torch.randn(n, n, device="cuda") / n**0.5).to(torch.bfloat16)
    bufs = [torch.full_like(x, float("nan")) for _ in range(16)]
    gemm_nt(x, b, out=bufs[0])  # load the artifact before the chain
    torch.cuda.synchronize()
    for t in bufs:
        t.fill_(float("nan"))
    torch.cuda._sleep(2_000_000)  # queue the chain behind a busy GPU: the launches then run back to back
    _chain(lambda src, dst: gemm_nt(src, b, out=dst), x, bufs)
    torch.cuda.synchronize()
    prev = x
    for i, t in enumerate(bufs):
        want = prev.float() @ b.float().T
        assert not t.isnan().any(), f"call {i}: NaN in the output"
        torch.testing.assert_close(t.float(), want, atol=5e-2, rtol=2e-2, msg=lambda m, i=i: f"call {i}: {m}")
        prev = t


def test_eager_direct_path_matches_the_custom_op():
    # Eager calls run the kernel directly (runtime.direct_call); autograd-tracked inputs and torch.compile go
    # through the torch.library custom op. Both must give the same bits, and `out` must count as written.
    testing.load_or_skip("fp16_bf16_gemm")
    testing.load_or_skip("rmsnorm")
    from tirx_kernels.gemm.fp16_bf16_gemm import gemm_nt
    from tirx_kernels.norm.rmsnorm import rmsnorm

    a = torch.randn(300, 520, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(264, 520, dtype=torch.bfloat16, device="cuda")
    out = torch.full((300, 264), float("nan"), dtype=torch.bfloat16, device="cuda")
    v = out._version
    assert gemm_nt(a, b, out=out) is out and out._version > v
    via_op = torch.ops.tirx.gemm_nt(a, b, None, None, 1.0, None)
    assert torch.equal(out, via_op) and torch.equal(gemm_nt(a, b), via_op)
    tracked = a.clone().requires_grad_(True)
    assert torch.equal(gemm_nt(tracked, b), via_op)  # the custom op's path (autograd-tracked input)

    x = torch.randn(37, 2880, dtype=torch.bfloat16, device="cuda")
    w = torch.nn.Parameter(torch.randn(2880, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
    assert torch.equal(rmsnorm(x, w, 1e-6), torch.ops.tirx.rmsnorm(x, w, 1e-6))


@pytest.mark.parametrize("tile, shape", [
    ("persistent_128x128x64_s6_g8_sk", (512, 4096, 1048)),  # 1 wave of 128 tiles split 2-3 ways on 132 CTAs
    ("persistent_128x256x64_s4_e128_g8_sk", (129, 264, 72)),  # 8 CTAs of one K-step: every tile split in two
    ("persistent_128x224x64_s4_g8_sk", (300, 520, 136)),  # 27 CTAs of one step: every tile split in three
])
def test_gemm_stream_k_flags_come_back_to_zero(tile, shape):
    """Stream-K partials are handed over through flags that their one reader puts back to 0, so no call needs a
    memset: eight back-to-back calls on fresh inputs (queued behind a busy GPU, so they run back to back), then
    four on each of two streams at once (each stream has its own workspace), must each match the oracle, and every
    flag must read 0 afterwards."""
    testing.load_or_skip("fp16_bf16_gemm")
    from tirx_kernels.gemm import fp16_bf16_gemm as mod

    M, N, K = shape
    calls = [(torch.randn(M, K, device="cuda").to(torch.bfloat16), torch.randn(N, K, device="cuda").to(torch.bfloat16),
              torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")) for _ in range(16)]
    mod.gemm_nt(*calls[0][:2], tile=tile)  # load the artifact, allocate the default stream's workspace
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000)
    for a, b, c in calls[:8]:
        mod.gemm_nt(a, b, out=c, tile=tile)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for i, (a, b, c) in enumerate(calls[8:]):
        with torch.cuda.stream(streams[i % 2]):
            mod.gemm_nt(a, b, out=c, tile=tile)
    torch.cuda.synchronize()
    for i, (a, b, c) in enumerate(calls):
        assert not c.isnan().any(), f"call {i}: NaN in the output"
        torch.testing.assert_close(c.float(), a.float() @ b.float().T, atol=0.1, rtol=2e-2,
                                   msg=lambda m, i=i: f"call {i}: {m}")
    from tirx_kernels.gemm import _host

    sets = list(_host._WORKSPACE._sets.values())
    assert len(sets) >= 3  # the default stream's and one per side stream
    for _, flags in sets:
        assert int(flags.count_nonzero()) == 0
