# SPDX-License-Identifier: Apache-2.0
"""DeepGEMM's FP8 casts (per_token_cast_to_fp8, per_block_cast_to_fp8): the oracles against DeepGEMM's formulas
restated independently, the scale layout, params and bundle resolution, input validation, the generated CUDA run on
the CPU (``core.emulate``) bit for bit against the oracle (ragged M / N / K, an all-zero row, a tiny row, poisoned
outputs whose stride gaps must stay untouched); SASS; on a GPU, the harness's checks and DeepGEMM's own casts."""

import random

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.deepgemm import _fp8_cast as C
from tirx_kernels.ported.deepgemm import per_block_cast_to_fp8 as block_mod
from tirx_kernels.ported.deepgemm import per_token_cast_to_fp8 as token_mod

MODS = [token_mod, block_mod]


_INV_448_FP32 = torch.tensor(1 / 448.0, dtype=torch.float32)


def _literal_per_token(x, use_ue8m0):
    """DeepGEMM's per-token recipe written out element by element (loops, no shared helper with the oracle)."""
    m, k = x.shape
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    sf = torch.empty(m, -(-k // 128))
    for r in range(m):
        for b in range(sf.shape[1]):
            blk = x[r, 128 * b:128 * (b + 1)].float()
            # x_amax / 448.0 as torch computes it on CUDA, where DeepGEMM runs it: times the fp32 reciprocal
            s = torch.tensor(max(blk.abs().max().item(), 1e-4), dtype=torch.float32) * _INV_448_FP32
            if use_ue8m0:
                s = torch.tensor(2.0 ** torch.ceil(torch.log2(s.double())).item(), dtype=torch.float32)
            sf[r, b] = s
            codes[r, 128 * b:128 * (b + 1)] = (blk * (1.0 / s)).to(torch.float8_e4m3fn)
    return codes, sf


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_oracle_matches_the_recipe(use_ue8m0):
    x = C.random_input(5, 328, torch.bfloat16, seed=3)
    codes, sf = C.per_token_ref(x, use_ue8m0)
    want_codes, want_sf = _literal_per_token(x, use_ue8m0)
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)) and torch.equal(sf, want_sf)
    assert sf[1].eq(torch.tensor(1e-4, dtype=torch.float32) * _INV_448_FP32).all() or use_ue8m0  # zero row's clamp
    # per-block = per-token scales of the block's rows, maxed: the same codes where a block is one row high
    bcodes, bsf = C.per_block_ref(x[:1], use_ue8m0)
    assert torch.equal(bcodes.view(torch.uint8), codes[:1].view(torch.uint8)) and torch.equal(bsf, sf[:1])


def test_scale_is_torch_cuda_scalar_divide_not_ieee():
    """torch on CUDA divides by a Python scalar as a multiply by its fp32 reciprocal; DeepGEMM's ``x_amax / 448.0``
    runs there. The oracle (and the kernel) take that form: amaxes where it and an IEEE divide differ by 1 ulp are
    common (on the H200 they flipped 0.1 % of the codes at 16384x7168)."""
    amax = torch.rand(100000, dtype=torch.float32) * 10 + 1e-3
    ieee = amax / torch.tensor(448.0)  # tensor / tensor: a true divide on either device
    want = amax * _INV_448_FP32
    assert (ieee != want).any()
    x = amax.to(torch.bfloat16).float().view(-1, 1).expand(-1, 128).contiguous().to(torch.bfloat16)
    _, sf = C.per_token_ref(x)
    assert torch.equal(sf.view(-1), x[:, 0].float() * _INV_448_FP32)


def test_ue8m0_rounds_up_to_powers_of_two():
    v = torch.tensor([1.0, 1.5, 2.0 ** -20 * 1.01, 3e38, 1e-45])
    got = C.ceil_to_ue8m0_ref(v)
    assert got.tolist() == [1.0, 2.0, 2.0 ** -19, 2.0 ** 127, 2.0 ** -126]  # exponent clamped to 1..254


def test_mn_major_tma_aligned_layout():
    sf = C.new_mn_major_sf(17, 576, "cpu")
    assert sf.shape == (17, 5) and sf.stride() == (1, 20)  # 17 rows padded to 20 (16 bytes of fp32)
    assert C.tma_aligned_size(1) == 4 and C.tma_aligned_size(4096) == 4096


@pytest.mark.parametrize("mod", MODS)
def test_every_call_resolves_to_a_bundled_artifact(mod):
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


@pytest.mark.parametrize("op", [token_mod.per_token_cast_to_fp8, block_mod.per_block_cast_to_fp8])
@pytest.mark.parametrize("x, kw, arg, what", [
    (torch.zeros(4, 100, dtype=torch.bfloat16), {}, "x.shape\\[1\\]", "multiple of 8"),
    (torch.zeros(4, 128), {}, "x", "dtype"),
    (torch.zeros(2, 4, 128, dtype=torch.bfloat16), {}, "x", "dimensions"),
    (torch.zeros(4, 128, dtype=torch.bfloat16), {}, "x", "CUDA"),
    (torch.zeros(4, 128, dtype=torch.bfloat16), {"gran_k": 32}, "gran_k", "128"),
])
def test_rejected_inputs_name_the_argument(op, x, kw, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        op(x, **kw)


def test_packed_ue8m0_rejected():
    with pytest.raises(TirxInputError, match="use_packed_ue8m0"):
        token_mod.per_token_cast_to_fp8(torch.zeros(4, 128, dtype=torch.bfloat16), True, use_packed_ue8m0=True)


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


def _emulate(kind, x, use_ue8m0):
    """The kernel's CUDA on the CPU; outputs poisoned (codes 0xAB, scales NaN, the MN-major stride gap too)."""
    from tirx_kernels.core import emulate
    from tirx_kernels.core.lang import quant

    m, k = x.shape
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    codes.view(torch.uint8).fill_(0xAB)
    flags = emulate.CXXFLAGS
    emulate.CXXFLAGS = [*flags, *quant.emulate_cxxflags()]
    try:
        build = C.build_per_token_kernel if kind == "token" else C.build_per_block_kernel
        kern = emulate.compile(build(str(x.dtype)[6:], use_ue8m0, f"per_{kind}_cast"))
    finally:
        emulate.CXXFLAGS = flags
    words = codes.view(-1).view(torch.uint8).view(torch.int32)
    if kind == "token":
        layout = C.new_mn_major_sf(m, k, "cpu")
        store = torch.full((layout.stride(1) * layout.shape[1],), float("nan"))  # padding of the last column too
        sf = store.as_strided(layout.shape, layout.stride())
        tiles = C.per_token_tiles(m, k)
        kern(grid=(tiles,), block=(C.THREADS,), X_ptr=x.view(-1), Y_ptr=words, S_ptr=store, M=m, K=k,
             sf_stride=sf.stride(1), tiles=tiles).check()
        gap = store.view(sf.shape[1], sf.stride(1))[:, m:]
        assert gap.isnan().all(), "the kernel wrote into the TMA-alignment padding of sfa"
    else:
        sf = torch.full((C.ceil_div(m, C.GRAN), C.ceil_div(k, C.GRAN)), float("nan"))
        kern(grid=(sf.shape[1], sf.shape[0]), block=(C.THREADS,), X_ptr=x.view(-1), Y_ptr=words, S_ptr=sf.view(-1),
             N=m, K=k, kb=sf.shape[1], nb=sf.shape[0]).check()
    return codes, sf


@pytest.mark.parametrize("kind, dtype, use_ue8m0, shapes", [
    ("token", torch.bfloat16, False, [(1, 512), (17, 200), (45, 1032)]),
    ("block", torch.float16, True, [(1, 136), (130, 264)]),
])
def test_emulated_bit_exact(emulation, kind, dtype, use_ue8m0, shapes):
    for m, k in shapes:
        x = C.random_input(m, k, dtype, seed=m + k)
        x_before = x.clone()
        codes, sf = _emulate(kind, x, use_ue8m0)
        ref = C.per_token_ref if kind == "token" else C.per_block_ref
        want_codes, want_sf = ref(x, use_ue8m0)
        assert torch.equal(x, x_before)
        assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)), (kind, m, k)
        assert torch.equal(sf, want_sf), (kind, m, k)


@pytest.mark.parametrize("mod", MODS)
def test_sass(mod):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"dtype": "bfloat16", "use_ue8m0": True})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("mod, label", [(m, c["label"]) for m in MODS for c in m.CONFIGS])
def test_gpu_config(mod, label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_gpu_matches_deepgemm(use_ue8m0):
    """DeepGEMM's own torch casts (deep_gemm.utils), bit for bit, and its layout transform of SFA."""
    deep_gemm = pytest.importorskip("deep_gemm")
    from deep_gemm.utils import math as dg_math

    x = C.random_input(4097, 2112, torch.bfloat16, seed=1, device="cuda")
    codes, sfa = token_mod.per_token_cast_to_fp8(x, use_ue8m0)
    want_codes, want_sfa = dg_math.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)) and torch.equal(sfa, want_sfa)
    assert sfa.stride() == deep_gemm.get_mn_major_tma_aligned_tensor(want_sfa).stride()
    codes, sfb = block_mod.per_block_cast_to_fp8(x[:2111, :2104], use_ue8m0)
    want_codes, want_sfb = dg_math.per_block_cast_to_fp8(x[:2111, :2104], use_ue8m0=use_ue8m0)
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)) and torch.equal(sfb, want_sfb)


@gpu
def test_gpu_public_ops_under_compile():
    x = C.random_input(300, 1024, torch.bfloat16, seed=2, device="cuda")
    f = torch.compile(lambda t: (token_mod.per_token_cast_to_fp8(t), block_mod.per_block_cast_to_fp8(t, True)),
                      fullgraph=True)
    (codes, sfa), (bcodes, sfb) = f(x)
    assert torch.equal(codes.view(torch.uint8), C.per_token_ref(x)[0].view(torch.uint8))
    assert torch.equal(sfa, C.per_token_ref(x)[1]) and torch.equal(sfb, C.per_block_ref(x, True)[1])
    assert torch.equal(bcodes.view(torch.uint8), C.per_block_ref(x, True)[0].view(torch.uint8))
