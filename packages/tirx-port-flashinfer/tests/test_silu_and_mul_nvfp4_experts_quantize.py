# SPDX-License-Identifier: Apache-2.0
"""silu_and_mul_nvfp4_experts_quantize: params and bundle resolution, input validation, the generated CUDA run on
the CPU (``core.emulate``): codes and SF of every valid row bit for bit against the oracle's encoders (silu's exp
taken from the same libm the emulation links), rows past each expert's mask and the SF padding left untouched as
upstream leaves them; SASS; on a GPU, the harness's checks of every config and upstream's output views."""

import contextlib
import ctypes
import ctypes.util
import random

import numpy as np
import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.activation import silu_and_mul_nvfp4_experts_quantize as mod
from tirx_kernels.ported.flashinfer.norm import _fp4_rows

bf16 = torch.bfloat16
SENTINEL = 0x5A


# ------------------------------------------------------------------------------------------------ params

def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "silu_and_mul_nvfp4_experts_quantize"
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels))
    assert {c["label"] for c in mod.BENCH_CONFIGS} == {"fp16_b8_m16_k2048", "bf16_b8_m512_k2048",
                                                        "fp16_b128_m2048_k2048"}


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, arg, what", [
    ((_t(2, 4, 40), _t(2, dtype=torch.int32), _t(2, dtype=torch.float32)), "a", "K=20"),
    ((_t(2, 4, 64, dtype=torch.float32), _t(2, dtype=torch.int32), _t(2, dtype=torch.float32)), "a", "dtype"),
    ((_t(4, 64), _t(2, dtype=torch.int32), _t(2, dtype=torch.float32)), "a", "dimensions"),
    ((_t(2, 4, 64), _t(3, dtype=torch.int32), _t(2, dtype=torch.float32)), "mask", "shape"),
    ((_t(2, 4, 64), _t(2, dtype=torch.int64), _t(2, dtype=torch.float32)), "mask", "dtype"),
    ((_t(2, 4, 64), _t(2, dtype=torch.int32), _t(1, dtype=torch.float32)), "a_global_sf", "shape"),
    ((_t(2, 4, 64), _t(2, dtype=torch.int32), _t(2, dtype=torch.float32)), "a", "CUDA"),
])
def test_rejected_inputs_name_the_argument(args, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        mod.silu_and_mul_scaled_nvfp4_experts_quantize(*args)


# ------------------------------------------------------------------------------------------------ CPU emulation

@contextlib.contextmanager
def _flags(emulate, flags):
    saved, emulate.CXXFLAGS = emulate.CXXFLAGS, flags
    try:
        yield
    finally:
        emulate.CXXFLAGS = saved


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate
    from tirx_kernels.core.lang import quant

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}
    flags = [*emulate.CXXFLAGS, *quant.emulate_cxxflags()]  # core.lang.quant's PTX stand-ins

    def get(dtype):
        if dtype not in cache:
            with _flags(emulate, flags):
                cache[dtype] = emulate.compile(codegen(mod.get_kernel(dtype)))
        return cache[dtype]
    return get


_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.expf.restype = ctypes.c_float
_LIBM.expf.argtypes = [ctypes.c_float]


def _silu_mul_libm(a: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` in fp32 with the emulation's expf (glibc), rounded to a's dtype: the kernel's values."""
    K = a.shape[-1] // 2
    g = a[..., :K].float().numpy().astype(np.float32)
    u = a[..., K:].float().numpy().astype(np.float32)
    e = np.array([_LIBM.expf(float(v)) for v in (-g).reshape(-1)], dtype=np.float32).reshape(g.shape)
    h = (g / (np.float32(1) + e)) * u
    return torch.from_numpy(h).to(a.dtype).float()


def _run_emulated(kern, a, mask, gs):
    E, M, K2 = a.shape
    K = K2 // 2
    sf_len = mod.sf_bytes_per_expert(M, K)
    y = torch.full((E, M, K // 2), SENTINEL, dtype=torch.uint8)
    s = torch.full((E, sf_len), SENTINEL, dtype=torch.uint8)
    a0 = a.clone()
    tensors = {"Af_ptr": a, "Mask_ptr": mask, "G_ptr": gs, "Y64_ptr": y, "Sf_ptr": s}
    tiles = mod.tiles(M, K)
    scalars = {"E": E, "M": M, "K": K, "sf_len": sf_len, "tiles": tiles, "zero": 0}
    args = [tensors[p.name] if p.pointer else scalars[p.name] for p in kern.params]
    kern(*args, grid=(tiles, E), block=(mod.THREADS,)).check()
    assert torch.equal(a, a0)
    return y, s


def _sf_positions(M, nb):
    k_tiles = -(-nb // 4)
    r = torch.arange(M).view(M, 1)
    c = torch.arange(nb).view(1, nb)
    return (r // 128) * k_tiles * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


@pytest.mark.parametrize("dtype, E, M, K, mask", [
    ("bfloat16", 3, 37, 80, [0, 37, 20]),
    ("float16", 4, 200, 48, [200, 129, 1, 300]),
    ("bfloat16", 2, 130, 1536, [-3, 128]),
    ("float16", 2, 7, 16, [7, 3]),
    ("bfloat16", 1, 16, 2048, [16]),
])
def test_emulated_bit_exact_and_masked_rows_untouched(emulated, dtype, E, M, K, mask):
    g = torch.Generator().manual_seed(M * K + E)
    a = (torch.randn(E, M, 2 * K, generator=g) * 2).to(getattr(torch, dtype))
    mask = torch.tensor(mask, dtype=torch.int32)
    gs = (torch.rand(E, generator=g) * 300 + 0.5).float()
    y, s = _run_emulated(emulated(dtype), a, mask, gs)
    h = _silu_mul_libm(a).reshape(E * M, K)
    codes, sf = _fp4_rows.encode_rows(h, 16, "e4m3", gs.repeat_interleave(M), False, recipe="trtllm")
    codes = codes.view(E, M, K // 2)
    sf = sf.view(torch.uint8).view(E, M, K // 16)
    valid = mod._valid_rows(mask, E, M)
    assert torch.equal(y[valid], codes[valid])
    assert (y[~valid] == SENTINEL).all()  # rows past the mask: not written (upstream breaks out of them)
    pos = _sf_positions(M, K // 16)
    for e in range(E):
        written = torch.zeros(s.shape[1], dtype=torch.bool)
        n = int(valid[e].sum())
        written[pos[:n].reshape(-1)] = True
        assert torch.equal(s[e][pos[:n]], sf[e, :n])
        assert (s[e][~written] == SENTINEL).all()  # masked rows' SF and the padding: untouched


def test_emulated_reference_agrees_off_ties(emulated):
    """The module's oracle (torch's exp) against the kernel: within one step (the harness's comparators)."""
    g = torch.Generator().manual_seed(5)
    E, M, K = 2, 40, 256
    a = torch.randn(E, M, 2 * K, generator=g).to(bf16)
    mask = torch.tensor([40, 17], dtype=torch.int32)
    gs = torch.tensor([100.0, 7.0])
    y, s = _run_emulated(emulated("bfloat16"), a, mask, gs)
    want = mod.reference(a, mask, gs)
    inputs = {"a": a, "mask": mask, "a_global_sf": gs}
    mod.codes_close(y, want["x_q"], {}, inputs)
    mod.scales_close(s, want["sf"], {}, inputs)


# ------------------------------------------------------------------------------------------------ SASS

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sass(dtype):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "silu_and_mul_nvfp4_experts_quantize", {"dtype": dtype})


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
def test_gpu_views_and_masked_rows():
    """Upstream's return views (codes (M, K/2, E), SF (32, 4, M/128, 4, K/64, E) e4m3) over the kernel's buffers;
    the dequantized valid rows against the fp32 oracle."""
    E, M, K = 4, 300, 2048
    a = torch.randn(E, M, 2 * K, device="cuda").to(bf16)
    mask = torch.tensor([300, 0, 129, 5], dtype=torch.int32, device="cuda")
    gs = torch.tensor([50.0, 1.0, 300.0, 2.0], device="cuda")
    x_q, sf = mod.silu_and_mul_scaled_nvfp4_experts_quantize(a, mask, gs)
    assert x_q.shape == (M, K // 2, E) and sf.dtype == torch.float8_e4m3fn
    assert sf.shape == (32, 4, 3, 4, K // 64, E)
    codes = x_q.permute(2, 0, 1).cpu()
    sf_flat = sf.permute(5, 2, 4, 0, 1, 3).reshape(E, -1).view(torch.uint8).cpu()
    from tirx_kernels.core import quant_ref

    h = mod.silu_and_mul_ref(a).cpu()
    pos = _sf_positions(M, K // 16)
    for e in range(E):
        n = int(mask[e].clamp(0, M))
        if n == 0:  # an expert with no tokens (mask 0): no valid rows to compare
            continue
        vals = quant_ref.e2m1_decode(quant_ref.unpack_e2m1(codes[e, :n])).view(n, K // 16, 16)
        scale = quant_ref.fp8_decode(sf_flat[e][pos[:n]]) / gs[e].item()
        deq = (vals * scale.unsqueeze(-1)).view(n, K)
        torch.testing.assert_close(deq, h[e, :n], rtol=0.5, atol=2.0 * max(1e-3, float(h[e, :n].abs().max()) / 6))


def test_harness_wiring_on_cpu():
    """Comparators read only the valid rows: a launch writing the oracle's codes there (garbage elsewhere) passes."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, E, M, K, **_):
        a = torch.randn(E, M, 2 * K).to(getattr(torch, dtype))
        return {"a": a, "mask": torch.tensor([M, M // 2, 0][:E], dtype=torch.int32),
                "a_global_sf": torch.full((E,), 10.0), "x_q": torch.empty(E, M, K // 2, dtype=torch.uint8),
                "sf": torch.empty(E, mod.sf_bytes_per_expert(M, K), dtype=torch.uint8)}

    def launch(cfg, data):
        want = mod.reference(**data)
        data["x_q"].copy_(want["x_q"])
        data["sf"].copy_(want["sf"])
        data["x_q"][1, -1].fill_(0xFF)  # a masked row: not compared

    fake = types.SimpleNamespace(**{k: getattr(mod, k) for k in ("KERNEL_META", "COMPARATORS", "reference")},
                                 prepare_data=prepare_data, launch=launch, get_baselines=lambda **cfg: {})
    assert harness.check_config(fake, {"dtype": "bfloat16", "E": 3, "M": 10, "K": 64})["status"] == "passed"
