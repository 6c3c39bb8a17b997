# SPDX-License-Identifier: Apache-2.0
"""deepgemm_sm90_fp8_gemm_1d2d (``fp8_gemm_nt``): protocol literals and bundle resolution, the tile heuristic, input
validation (NT only, dtypes, shapes, alignment), the SFA layout transform; the generated module run on the CPU
(``core.emulate``: wgmma e4m3, TMA with zero fill, mbarrier ring) on small ragged shapes against the fp32 oracle with
DeepGEMM's calc_diff, a persistent grid of fewer CTAs than tiles (the ring wraps across tiles), C accumulation, guard
bands around D; SASS; on a GPU, the harness's configs, DeepGEMM's own fp8_gemm_nt and cuBLASLt blockwise
``torch._scaled_mm``."""

import random
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.deepgemm import _fp8_cast as C
from tirx_kernels.ported.deepgemm import _fp8_gemm_kernel as G
from tirx_kernels.ported.deepgemm import fp8_gemm_1d2d as mod

E4M3 = torch.float8_e4m3fn


def _operands(M, N, K, device="cpu", seed=0):  # noqa: N803
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=device) * torch.logspace(-2, 1, M, device=device)[:, None]
    w = torch.randn(N, K, generator=g, device=device)
    a, sfa = C.per_token_ref(x.to(torch.bfloat16))
    b, sfb = C.per_block_ref(w.to(torch.bfloat16))
    sfa_mn = C.new_mn_major_sf(M, K, device)
    sfa_mn.copy_(sfa)
    return a, sfa_mn, b, sfb


def test_protocol_literals():
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels)) and mod.KERNEL_META["name"] == "deepgemm_sm90_fp8_gemm_1d2d"
    assert all(c["K"] % 16 == 0 and c["N"] % 8 == 0 for c in mod.CONFIGS)
    for tile, (block_n, stages) in mod.TILES.items():
        assert G.smem_bytes(block_n, stages) <= G.SMEM_LIMIT, tile


def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_tile_heuristic():
    assert mod.choose_tile(128, 2112) == "128x64_s8"  # 17 tiles of 128 x 128: under one wave
    assert mod.choose_tile(4096, 7168) == "128x128_s6"


def test_calc_diff():
    x = torch.randn(64, 64)
    assert mod.calc_diff(x, x) == pytest.approx(0.0, abs=1e-12) and mod.calc_diff(x, -x) == pytest.approx(2.0)


def _args(M=64, N=128, K=256):  # noqa: N803
    a, sfa, b, sfb = _operands(M, N, K)
    return (a, sfa), (b, sfb), torch.empty(M, N, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate, arg, what", [
    (lambda a, b, d: ((a[0].t().contiguous().t(), a[1]), b, d), "a\\[0\\]", "K-major"),
    (lambda a, b, d: ((a[0].float(), a[1]), b, d), "a\\[0\\]", "dtype"),
    (lambda a, b, d: (a, (b[0][:, :128], b[1]), d), "b\\[0\\]", "K=256"),
    (lambda a, b, d: (a, (b[0], b[1][:, :1]), d), "b\\[1\\]", "shape"),
    (lambda a, b, d: ((a[0], a[1].double()), b, d), "a\\[1\\]", "dtype"),
    (lambda a, b, d: (a, b, d.float()), "d", "dtype"),
    (lambda a, b, d: (a[0], b, d), "a", "pair"),
    (lambda a, b, d: (a, b, d), "a\\[0\\]", "CUDA"),
])
def test_rejected_inputs_name_the_argument(mutate, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        mod.fp8_gemm_nt(*mutate(*_args()))


def test_rejected_alignment_and_recipe():
    a, sfa, b, sfb = _operands(4, 136, 272)
    with pytest.raises(TirxInputError, match="argument 'a\\[0\\].shape\\[1\\]'.*multiple of 16"):
        mod.fp8_gemm_nt((a[:, :264], sfa), (b[:, :264], sfb), torch.empty(4, 136, dtype=torch.bfloat16))
    with pytest.raises(TirxInputError, match="argument 'd.shape\\[1\\]'.*multiple of 8"):
        mod.fp8_gemm_nt((a, sfa), (b[:130], sfb[:2]), torch.empty(4, 130, dtype=torch.bfloat16))
    with pytest.raises(TirxInputError, match="argument 'recipe'"):
        mod.fp8_gemm_nt((a, sfa), (b, sfb), torch.empty(4, 136, dtype=torch.bfloat16), recipe=(1, 1, 64))


def test_sfa_layout_transform():
    """A contiguous sfa (DeepGEMM's cast output) is made MN-major TMA-aligned; the right layout is used in place."""
    sfa = torch.rand(17, 5)
    got = mod._sfa_in_layout(sfa, 17, 576)
    assert got.stride() == (1, 20) and torch.equal(got, sfa)
    assert mod._sfa_in_layout(got, 17, 576) is got


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


_modules = {}


def _emulated(block_n, accumulate, num_sms, **knobs):
    from tirx_kernels.core import emulate

    key = (block_n, accumulate, num_sms, *sorted(knobs.items()))
    if key not in _modules:
        _modules[key] = emulate.compile_module(G.build_kernel(block_n, 3, 2, num_sms, accumulate, **knobs))
    return _modules[key]


# Few CTAs (num_sms 2 / 3) for 2-8 tiles: each CTA loops over several tiles and the 3-stage ring wraps across them.
# The candidate knobs of issue 24 (``build_kernel``): 1 x 2 clusters multicasting A (2 clusters of 4 SMs; N = 264 is
# 3 N-tiles of 128, so one cluster has a CTA past N), 256-row tiles (two waves a warpgroup; M = 300 a ragged second
# tile), scales read ahead.
@pytest.mark.parametrize("block_n, accumulate, num_sms, shapes, knobs", [
    (128, False, 2, [(17, 136, 256), (200, 256, 384)], {}),
    (64, True, 3, [(1, 136, 384), (200, 256, 272)], {}),
    (128, False, 4, [(200, 264, 384), (17, 136, 256)], {"cluster_n": 2, "prefetch_scales": True}),
    (128, True, 4, [(300, 264, 272), (1, 136, 128)], {"block_m": 256, "cluster_n": 2, "prefetch_scales": True}),
    (64, False, 2, [(300, 136, 384)], {"block_m": 256, "prefetch_scales": True}),
    (256, False, 4, [(200, 264, 384), (17, 520, 256)], {"cluster_n": 2, "prefetch_scales": True}),
    (256, False, 2, [(130, 392, 272)], {}),
], ids=["128", "64_c", "128_cluster", "256x128_cluster_c", "256x64", "128x256_cluster", "128x256"])
def test_emulated_against_the_oracle(emulation, block_n, accumulate, num_sms, shapes, knobs):
    kern = _emulated(block_n, accumulate, num_sms, **knobs)
    for M, N, K in shapes:  # noqa: N806
        a, sfa, b, sfb = _operands(M, N, K, seed=M + N + K)
        before = [t.clone() for t in (a, sfa, b, sfb)]
        ldd = N + 8  # D inside a NaN band: guard rows above and below, guard columns on the right
        buf = torch.full((M + 2, ldd), float("nan"), dtype=torch.bfloat16)
        d = buf[1:M + 1, :N]
        c = torch.randn(M, N).to(torch.bfloat16) if accumulate else None
        if accumulate:
            d.copy_(c)
        kern(*mod.kernel_args(a, sfa, b, sfb, d)).check()
        want = mod.reference(a, sfa, b, sfb, c)["d"]
        assert not d.isnan().any(), f"{int(d.isnan().sum())} outputs not written"
        assert mod.calc_diff(d, want) < mod.CALC_DIFF_MAX / 100, (M, N, K)  # bf16 rounding only: ~1e-6
        guard = torch.ones_like(buf, dtype=torch.bool)
        guard[1:M + 1, :N] = False
        assert buf[guard].isnan().all(), "a store outside D"
        assert all(torch.equal(x.view(torch.uint8) if x.dtype == E4M3 else x, y.view(torch.uint8)
                               if y.dtype == E4M3 else y) for x, y in zip((a, sfa, b, sfb), before))


def test_sass():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"tile": "128x128_s6", "accumulate": False})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("M, N, K", [(1, 576, 512), (17, 2112, 7168), (4097, 576, 16384)])
def test_gpu_end_to_end_from_bf16(M, N, K):  # noqa: N803
    """The casts then the GEMM, against the bf16 inputs' fp32 product (DeepGEMM's test: calc_diff < 1e-3)."""
    from tirx_kernels.ported.deepgemm import per_block_cast_to_fp8, per_token_cast_to_fp8

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    d = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    mod.fp8_gemm_nt(per_token_cast_to_fp8.per_token_cast_to_fp8(x), per_block_cast_to_fp8.per_block_cast_to_fp8(w),
                    d)
    assert mod.calc_diff(d, x.float() @ w.float().T) < mod.CALC_DIFF_MAX


@gpu
@pytest.mark.parametrize("M, N, K", [(128, 2112, 7168), (4096, 7168, 2048)])
def test_gpu_matches_deepgemm(M, N, K):  # noqa: N803
    deep_gemm = pytest.importorskip("deep_gemm")
    a, sfa, b, sfb = _operands(M, N, K, device="cuda")
    ours, theirs = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mod.fp8_gemm_nt((a, sfa), (b, sfb), ours)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), theirs)
    assert mod.calc_diff(ours, theirs) < 1e-5


@gpu
def test_gpu_matches_scaled_mm_blockwise():
    """cuBLASLt blockwise (1x128 x 128x128) through torch._scaled_mm, where this torch build has it."""
    M, N, K = 256, 2112, 7168  # noqa: N806
    a, sfa, b, sfb = _operands(M, N, K, device="cuda")
    ours = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    mod.fp8_gemm_nt((a, sfa), (b, sfb), ours)
    try:
        ref = torch._scaled_mm(a, b.t(), scale_a=sfa, scale_b=sfb.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError) as e:
        pytest.skip(f"torch._scaled_mm blockwise not available here: {e}")
    assert mod.calc_diff(ours, ref) < 1e-5


@gpu
def test_gpu_public_op_under_compile_and_accumulate():
    M, N, K = 300, 576, 1024  # noqa: N806
    a, sfa, b, sfb = _operands(M, N, K, device="cuda")
    c = torch.randn(M, N, device="cuda").to(torch.bfloat16)

    def f(a, sfa, b, sfb, c):
        d = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        mod.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)
        return d

    d = torch.compile(f, fullgraph=True)(a, sfa, b, sfb, c)
    assert mod.calc_diff(d, mod.reference(a, sfa, b, sfb, c)["d"]) < 1e-5
