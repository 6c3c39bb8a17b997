# SPDX-License-Identifier: Apache-2.0
"""deepgemm_sm90_fp8_gemm_1d1d (``fp8_gemm_nt`` with recipe (1, 1, 128), the wgrad form): protocol literals and bundle
resolution, input validation naming the argument (and the 1d2d op's dispatch on the recipe); the generated module run
on the CPU (``core.emulate``) against the fp32 oracle with DeepGEMM's calc_diff: per-column promotion with sfb[n], fp32
D (+)= C, ragged M/N/K, a persistent grid of fewer CTAs than tiles, guard bands, inputs unchanged; SASS; on a GPU, the
harness's configs (oracle, DeepGEMM, cuBLASLt 1x128 x 1x128 where they run), C aliasing D, torch.compile."""

import os
import random
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.deepgemm import _fp8_cast as C
from tirx_kernels.ported.deepgemm import _fp8_gemm_kernel as G
from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O
from tirx_kernels.ported.deepgemm import fp8_gemm_1d1d as mod
from tirx_kernels.ported.deepgemm import fp8_gemm_1d2d

E4M3 = torch.float8_e4m3fn
FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"


def _operands(M, N, K, device="cpu", seed=0):  # noqa: N803
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device) * torch.logspace(-2, 1, M, device=device)[:, None]
    w = torch.randn(N, K, generator=g, device=device)
    return mod.quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))


def test_protocol_literals_and_bundle():
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels)) and all(c["K"] % 16 == 0 and c["N"] % 8 == 0 for c in mod.CONFIGS)
    for block_n, stages in O.TILES.values():
        assert G.smem_bytes(block_n, stages, "1d1d") <= G.SMEM_LIMIT
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_rejected_inputs_and_dispatch():
    M, N, K = 4, 136, 272  # noqa: N806
    a, sfa, b, sfb = _operands(M, N, K)
    d = torch.empty(M, N)
    for call, arg, what in [
        (lambda: mod.fp8_gemm_nt((a, sfa), (b, sfb), d.bfloat16()), "d", "float32"),
        (lambda: mod.fp8_gemm_nt((a, sfa), (b, sfb[:2]), d), "b\\[1\\]", "shape"),
        (lambda: mod.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d[:2]), "c", "shape"),
        (lambda: mod.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 128, 128)), "recipe", "1d2d"),
        (lambda: mod.fp8_gemm_nt((a, sfa), (b, sfb), d), "a\\[0\\]", "CUDA"),
        # DeepGEMM's entry point: recipe (1, 1, 128) is this GEMM (its checks, not the 1d2d ones)
        (lambda: fp8_gemm_1d2d.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 1, 128)), "a\\[0\\]", "CUDA"),
        (lambda: fp8_gemm_1d2d.fp8_gemm_nt((a, sfa), (b, sfb), d.bfloat16(), recipe=(1, 1, 128)), "d", "float32"),
    ]:
        with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
            call()


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


CASES = [(128, True, 2, [(17, 136, 272), (200, 256, 384)])]
if FULL:
    CASES += [(64, False, 3, [(1, 8, 16), (130, 200, 1040)])]


# Few CTAs (num_sms 2 / 3) for 2-8 tiles: each CTA loops over several tiles and the 3-stage ring wraps across them.
@pytest.mark.parametrize("block_n, accumulate, num_sms, shapes", CASES)
def test_emulated_against_the_oracle(emulation, block_n, accumulate, num_sms, shapes):
    from tirx_kernels.core import emulate

    kern = emulate.compile_module(G.build_kernel(block_n, 3, 2, num_sms, accumulate, "dense", "1d1d"))
    for M, N, K in shapes:  # noqa: N806
        a, sfa, b, sfb = _operands(M, N, K, seed=M + N + K)
        before = [t.clone() for t in (a, sfa, b, sfb)]
        buf = torch.full((M + 2, N + 4), float("nan"))  # D inside a NaN band: rows above and below, columns right
        d = buf[1:M + 1, :N]
        c = torch.randn(M, N) * 32 if accumulate else None
        if accumulate:
            d.copy_(c)
        kern(*mod.kernel_args(a, sfa, b, sfb, d)).check()
        want = mod.reference(a, sfa, b, sfb, c)["d"]
        assert not d.isnan().any(), f"{int(d.isnan().sum())} outputs not written"
        assert O.calc_diff(d, want) < 1e-10, (M, N, K)  # fp32 out: summation order only
        guard = torch.ones_like(buf, dtype=torch.bool)
        guard[1:M + 1, :N] = False
        assert buf[guard].isnan().all(), "a store outside D"
        assert all(torch.equal(x.view(torch.uint8) if x.dtype == E4M3 else x, y.view(torch.uint8)
                               if y.dtype == E4M3 else y) for x, y in zip((a, sfa, b, sfb), before))


def test_sass():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"tile": "128x128_s6", "accumulate": True})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    res = mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))
    failed = {n: r for n, r in res["references"].items() if r["status"] == "failed"}
    assert not failed, failed


@gpu
def test_gpu_wgrad_in_place_and_compiled():
    """D += A B^T with C aliasing D (the wgrad accumulation), through DeepGEMM's entry point and under torch.compile;
    from bf16 through the per-token cast on both operands (calc_diff < 1e-3 against the bf16 inputs' product)."""
    from tirx_kernels.ported.deepgemm import per_token_cast_to_fp8

    M, N, K = 2112, 4096, 2048  # noqa: N806
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    d0 = torch.randn(M, N, device="cuda") * 32
    d = d0.clone()
    a, b = per_token_cast_to_fp8.per_token_cast_to_fp8(x), per_token_cast_to_fp8.per_token_cast_to_fp8(w)
    fp8_gemm_1d2d.fp8_gemm_nt(a, b, d, c=d, recipe=(1, 1, 128))
    assert O.calc_diff(d, d0 + x.float() @ w.float().T) < O.CALC_DIFF_MAX

    def f(a0, a1, b0, b1, c):
        out = torch.empty_like(c)
        mod.fp8_gemm_nt((a0, a1), (b0, b1), out, c=c)
        return out

    got = torch.compile(f, fullgraph=True)(a[0], a[1], b[0], b[1], d0)
    assert O.calc_diff(got, mod.reference(a[0], a[1], b[0], b[1], d0)["d"]) < 1e-8
    assert C.GRAN == 128
