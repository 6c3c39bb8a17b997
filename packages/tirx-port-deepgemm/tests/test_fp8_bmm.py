# SPDX-License-Identifier: Apache-2.0
"""deepgemm_sm90_fp8_bmm (``fp8_einsum('bhr,hdr->bhd', ...)``): protocol literals and bundle resolution, input
validation naming the argument (the SM100-only equations, c, shapes, dtypes); the generated module (1d2d mainloop,
batched schedule, x read in place through a rank-3 TMA map of its strides) run on the CPU (``core.emulate``) against
the fp32 oracle with DeepGEMM's calc_diff: a ragged b (one tile's second slab holds one real row), heads walked by a
persistent grid of fewer CTAs than tiles, z written through its [b, h, d] strides inside a NaN guard band, x and the
scales unchanged; SASS; on a GPU, the harness's configs (oracle, DeepGEMM where installed, cuBLASLt blockwise per head,
bf16 bmm) and torch.compile."""

import random
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.deepgemm import _fp8_cast as C
from tirx_kernels.ported.deepgemm import _fp8_gemm_kernel as G
from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O
from tirx_kernels.ported.deepgemm import fp8_bmm as mod

E4M3 = torch.float8_e4m3fn


def _operands(b, h, r, d, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(b, h, r, generator=g, device=device) * torch.logspace(-2, 1, b, device=device)[:, None, None]
    y = torch.randn(h, d, r, generator=g, device=device)
    return mod.quantized_operands(x.to(torch.bfloat16), y.to(torch.bfloat16))


def test_protocol_literals_and_bundle():
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels)) and mod.KERNEL_META["name"] == "deepgemm_sm90_fp8_bmm"
    assert all(c["r"] % 16 == 0 and c["d"] % 8 == 0 for c in mod.CONFIGS + mod.BENCH_CONFIGS)
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)) + mod.CONFIGS:
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call
    assert mod.compile_params(b=4096, h=8, d=1024)["tile"] == "128x128_s6"
    assert mod.compile_params(b=4, h=8, d=1024)["tile"] == "128x64_s8"


def test_sfx_layout_and_oracle():
    x, sfx, y, sfy = _operands(5, 3, 256, 136)
    assert sfx.shape == (5, 3, 2) and sfx.permute(1, 0, 2).stride() == (16, 1, 8)  # per head, MN-major, align(5, 4)
    flat = O.flat_sf(sfx.permute(1, 0, 2), 256)
    assert flat.data_ptr() == sfx.data_ptr()  # already the kernel's layout: read in place
    want = torch.stack([O.dequantize_a(x[:, i], sfx[:, i]) @ O.dequantize_b(y[i], sfy[i]).T for i in range(3)], 1)
    torch.testing.assert_close(mod.reference(x, sfx, y, sfy)["z"], want, rtol=1e-4, atol=1e-3)  # fp32 sum orders


def _args(b=4, h=2, r=256, d=136):
    x, sfx, y, sfy = _operands(b, h, r, d)
    return (x, sfx), (y, sfy), torch.empty(b, h, d, dtype=torch.bfloat16)


@pytest.mark.parametrize("change, arg, what", [
    (lambda e, a, b, z: ("bhd,bhr->hdr", a, b, z), "equation", "SM100"),
    (lambda e, a, b, z: ("bhd,hdr->bhr", a, b, z), "b\\[0\\]", "d=256, r"),
    (lambda e, a, b, z: ("bmk,bnk->mn", a, b, z), "equation", "bhr,hdr->bhd"),
    (lambda e, a, b, z: (e, (a[0].float(), a[1]), b, z), "a\\[0\\]", "dtype"),
    (lambda e, a, b, z: (e, (a[0].transpose(1, 2).contiguous().transpose(1, 2), a[1]), b, z), "a\\[0\\]",
     "K-major"),
    (lambda e, a, b, z: (e, a, (b[0][:1], b[1][:1]), z), "b\\[0\\]", "h=2"),
    (lambda e, a, b, z: (e, a, (b[0], b[1][:, :1]), z), "b\\[1\\]", "shape"),
    (lambda e, a, b, z: (e, (a[0], a[1][:, :1]), b, z), "a\\[1\\]", "shape"),
    (lambda e, a, b, z: (e, a, b, z.float()), "d", "dtype"),
    (lambda e, a, b, z: (e, a, b, z[:, :, :128]), "d", "shape"),
    (lambda e, a, b, z: (e, a, b, z), "a\\[0\\]", "CUDA"),
])
def test_rejected_inputs_name_the_argument(change, arg, what):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
        mod.fp8_einsum(*change(mod.EQUATION, *_args()))


def test_rejected_c_and_recipe():
    a, b, z = _args()
    with pytest.raises(TirxInputError, match="argument 'c'"):
        mod.fp8_einsum(mod.EQUATION, a, b, z, c=z)
    with pytest.raises(TirxInputError, match="argument 'recipe'"):
        mod.fp8_einsum(mod.EQUATION, a, b, z, recipe=(1, 1, 128))


def test_transposed_y_form(monkeypatch):
    """'bhd,hdr->bhr': the launch receives y as a K-major [h, r, d] copy and its block scales transposed; the
    product it computes from them is the einsum of the dequantized operands."""
    from tirx_kernels.core import checks

    real = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda *a, cuda=False, **k: real(*a, cuda=False, **k))
    seen = []

    def run(x, sfx, y, sfy, z):
        seen.append((y, sfy))
        z.copy_(mod.reference(x, sfx, y, sfy)["z"])

    monkeypatch.setattr(mod, "_run", run)
    b, h, dd, r = 5, 2, 256, 136
    g = torch.Generator().manual_seed(1)
    x, sfx, _, _ = _operands(b, h, dd, 8, seed=2)  # x [b, h, d], per-token scales over d
    heads = [C.per_block_ref(torch.randn(dd, r, generator=g).to(torch.bfloat16)) for _ in range(h)]
    y, sfy = torch.stack([p[0] for p in heads]), torch.stack([p[1] for p in heads])  # per 128 x 128 block of (d, r)
    z = torch.empty(b, h, r, dtype=torch.bfloat16)
    mod.fp8_einsum("bhd,hdr->bhr", (x, sfx), (y, sfy), z)
    (yt, sfyt), = seen
    assert yt.is_contiguous() and yt.shape == (h, r, dd) and sfyt.shape == (h, 2, 2)
    want = torch.einsum("bhd,hdr->bhr", O.dequantize_a(x, sfx), torch.stack([O.dequantize_b(y[i], sfy[i])
                                                                            for i in range(h)]))
    assert O.calc_diff(z, want) < 1e-5


def test_kernel_args_read_x_in_place():
    (x, sfx), (y, sfy), z = _args(b=3, h=4, r=128, d=64)
    a, sfa, *_ = mod.kernel_args(x, sfx, y, sfy, z)
    assert a.data_ptr() == x.data_ptr() and a.stride() == (128, 512, 1)  # [h, b, r] view of x itself
    wide = torch.zeros(3, 4, 136, dtype=torch.uint8).view(E4M3)[:, :, :128]  # b / h strides of 136 B: copied
    a2 = mod.kernel_args(wide, sfx, y, sfy, z)[0]
    assert a2.is_contiguous() and a2.shape == (4, 3, 128)


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


@pytest.mark.parametrize("block_n, num_sms, d, knobs", [
    (64, 3, 72, {}),
    # issue 24's candidates: 256-row tiles (b = 129: one ragged tile a head) in 1 x 2 clusters multicasting x's rows
    # through the rank-3 map (d = 200: 2 N-tiles of 128, one cluster a head); 128 x 256 halves (d = 392)
    (128, 4, 200, {"block_m": 256, "cluster_n": 2, "prefetch_scales": True}),
    (256, 2, 392, {"cluster_n": 2, "prefetch_scales": True}),
], ids=["128x64", "256x128_cluster", "128x256_cluster"])
def test_emulated_against_the_oracle(emulation, block_n, num_sms, d, knobs):
    """b = 129 (a tile whose second slab holds one real row), 2 heads, r = 272 (a K tail), d = 72 (an N tail), 3
    CTAs for 8 tiles of 128 x 64 (the ring wraps across tiles and heads); x strided inside a wider [b, h, r + 16]
    buffer (the TMA map reads its strides), z inside a NaN band (the [b, h, d] strides, guard columns and rows)."""
    from tirx_kernels.core import emulate

    b, h, r = 129, 2, 272
    x, sfx, y, sfy = _operands(b, h, r, d, seed=7)
    xw = torch.zeros(b, h, r + 16, dtype=torch.uint8).view(E4M3)
    xw[:, :, :r] = x
    x = xw[:, :, :r]
    before = [t.clone() for t in (xw.view(torch.uint8), sfx, y.view(torch.uint8), sfy)]
    buf = torch.full((b + 2, h, d + 8), float("nan"), dtype=torch.bfloat16)
    z = buf[1:b + 1, :, :d]
    kern = emulate.compile_module(G.build_kernel(block_n, 3, 2, num_sms, False, "batched", **knobs))
    args = mod.kernel_args(x, sfx, y, sfy, z)
    assert args[0].data_ptr() == x.data_ptr()
    kern(*args).check()
    want = mod.reference(x, sfx, y, sfy)["z"]
    assert not z.isnan().any(), f"{int(z.isnan().sum())} outputs not written"
    assert O.calc_diff(z, want) < O.CALC_DIFF_MAX / 100  # bf16 rounding only: ~1e-6
    guard = torch.ones_like(buf, dtype=torch.bool)
    guard[1:b + 1, :, :d] = False
    assert buf[guard].isnan().all(), "a store outside z"
    after = (xw.view(torch.uint8), sfx, y.view(torch.uint8), sfy)
    assert all(torch.equal(p, q) for p, q in zip(before, after))


def test_sass():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"tile": "128x128_s6"})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    """The harness: fp32 oracle, guard bands, inputs unchanged; DeepGEMM, cuBLASLt blockwise per head and bf16 bmm
    where they run."""
    res = mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))
    failed = {n: r for n, r in res["references"].items() if r["status"] == "failed"}
    assert not failed, failed


@gpu
def test_gpu_graph_replay():
    """Captured once, replayed with new inputs and checked."""
    from tirx_kernels.core import harness

    harness.check_replay(mod, harness.full_config(mod, next(c for c in mod.CONFIGS if c["label"].startswith("b17"))))


@gpu
@pytest.mark.parametrize("b", [4, 4097])
def test_gpu_end_to_end_from_bf16(b):
    """DeepGEMM's test: per-token cast of x.view(-1, r), per-block cast of each head of y, the einsum against the bf16
    inputs' fp32 einsum (calc_diff < 1e-3)."""
    from tirx_kernels.ported.deepgemm import per_block_cast_to_fp8, per_token_cast_to_fp8

    h, r, d = 8, 4096, 1024
    x = torch.randn(b, h, r, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(h, d, r, device="cuda", dtype=torch.bfloat16)
    xq, sx = per_token_cast_to_fp8.per_token_cast_to_fp8(x.view(-1, r))
    heads = [per_block_cast_to_fp8.per_block_cast_to_fp8(y[i]) for i in range(h)]
    yq, sy = torch.stack([p[0] for p in heads]), torch.stack([p[1] for p in heads])
    z = torch.empty(b, h, d, device="cuda", dtype=torch.bfloat16)
    mod.fp8_einsum(mod.EQUATION, (xq.view(b, h, r), sx.view(b, h, -1)), (yq, sy), z)
    assert O.calc_diff(z, torch.einsum("bhr,hdr->bhd", x.float(), y.float())) < O.CALC_DIFF_MAX


@gpu
def test_gpu_transposed_y_form_from_bf16():
    """DeepGEMM's test_fp8_bhd_hdr_bhr (SM100 there): x [b, h, d] per-token cast, y [h, d, r] per-block cast per
    head, against the bf16 inputs' fp32 einsum (calc_diff < 1e-3)."""
    from tirx_kernels.ported.deepgemm import per_block_cast_to_fp8, per_token_cast_to_fp8

    b, h, r, d = 300, 8, 4096, 1024
    x = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(h, d, r, device="cuda", dtype=torch.bfloat16)
    xq, sx = per_token_cast_to_fp8.per_token_cast_to_fp8(x.view(-1, d))
    heads = [per_block_cast_to_fp8.per_block_cast_to_fp8(y[i]) for i in range(h)]
    yq, sy = torch.stack([p[0] for p in heads]), torch.stack([p[1] for p in heads])
    z = torch.empty(b, h, r, device="cuda", dtype=torch.bfloat16)
    mod.fp8_einsum("bhd,hdr->bhr", (xq.view(b, h, d), sx.view(b, h, -1)), (yq, sy), z)
    assert O.calc_diff(z, torch.einsum("bhd,hdr->bhr", x.float(), y.float())) < O.CALC_DIFF_MAX


@gpu
def test_gpu_under_compile():
    data = mod.prepare_data(b=300, h=4, r=1024, d=576)

    def f(x, sfx, y, sfy):
        z = torch.empty(300, 4, 576, device="cuda", dtype=torch.bfloat16)
        mod.fp8_einsum(mod.EQUATION, (x, sfx), (y, sfy), z)
        return z

    z = torch.compile(f, fullgraph=True)(data["x"], data["sfx"], data["y"], data["sfy"])
    assert O.calc_diff(z, mod.reference(**data)["z"]) < 1e-5
