# SPDX-License-Identifier: Apache-2.0
"""flashinfer_qk_rmsnorm: params resolution against the bundle, input validation, both kernels' generated CUDA run
on the CPU (``core.emulate``: every head against the fp32 oracle, nothing outside ``out``'s heads written, every
access inside its allocation, 16-byte accesses aligned), SASS; on a GPU, the harness's checks of every config,
strided views at every alignment, and FlashInfer."""

import random
import re

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import qk_rmsnorm as mod

bf16 = torch.bfloat16


def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    rng = random.Random(0)
    sizes = set(range(1, 1100)) | {rng.randrange(1, 70000) for _ in range(100)} | set(model_dims.head_dims())
    for dtype in ("bfloat16", "float16"):
        for gemma in (False, True):
            for H in sorted(sizes):
                params = mod.compile_params(dtype=dtype, gemma=gemma, H=H)
                cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, params)]
                assert bundled & set(cands), (dtype, gemma, H, cands)


@pytest.mark.parametrize("H", [16, 24, 64, 96, 128, 256, 512, 1000, 1024])
def test_head_plan_covers_the_head(H):
    p = mod.head_plan(H)
    tpr, vpt = p["threads_per_head"], p["vectors_per_thread"]
    assert tpr * vpt * 8 >= H > (tpr * vpt - tpr) * 8 and tpr & (tpr - 1) == 0 and 2 <= tpr <= 32 and vpt <= 4
    assert tpr * p["heads_per_cta"] == mod.CTA_THREADS


def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("args, kw, arg", [
    ((_t(4, 64), _t(64)), {}, "input"),
    ((_t(2, 4, 64, dtype=torch.float32), _t(64)), {}, "input"),
    ((_t(2, 4, 64), _t(32)), {}, "weight"),
    ((_t(2, 4, 64), _t(64, dtype=torch.float16)), {}, "weight"),
    ((_t(2, 64, 4).transpose(1, 2), _t(4)), {}, "input"),
    ((_t(2, 4, 64), _t(64)), {"out": _t(2, 4, 32)}, "out"),
    ((_t(2, 4, 64), _t(64)), {"eps": "x"}, "eps"),
    ((_t(2, 4, 64), _t(64)), {}, "input"),  # CPU tensors
])
def test_rejected_inputs_name_the_argument(args, kw, arg):
    for fn in (mod.qk_rmsnorm, mod.gemma_qk_rmsnorm):
        with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
            fn(*args, **kw)


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_qk_rmsnorm"
    rows = mod.CONFIGS
    assert {1, 19, 99} <= {c["B"] for c in rows} and {4, 7, 16} <= {c["N"] for c in rows}
    assert {64, 128, 256} <= {c["H"] for c in rows}
    assert {(c["dtype"], c.get("gemma", False)) for c in rows} == {
        (t, g) for t in ("bfloat16", "float16") for g in (False, True)}


# ------------------------------------------------------------------------------------------------ CPU emulation

def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a head group of < 32 lanes gets the same butterfly
    inline, over its own width."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate
    from tirx_kernels.core.build import codegen

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    cache = {}

    def get(params):
        key = artifacts.canonical_params(params)
        if key not in cache:
            cache[key] = emulate.compile(_narrow_warp_sums(codegen(mod.get_kernel(**params))))
        return cache[key]
    return get


def _launch(params, B, N):
    if params.get("schedule") == "general":
        return (-(-B * N // mod.GENERAL_HEADS_PER_CTA),), (32 * mod.GENERAL_HEADS_PER_CTA,)
    p = mod.head_plan(params["H"])
    return (-(-B * N // p["heads_per_cta"]),), (mod.CTA_THREADS,)


def _check(kern, params, B, N, H, x_off, xs, y_off, ys, w_off, gemma):
    g = torch.Generator().manual_seed(B * 1000 + N * 10 + H)
    xb = torch.randn(x_off + (B - 1) * xs[0] + (N - 1) * xs[1] + H, generator=g).to(bf16)
    yb = torch.full((y_off + (B - 1) * ys[0] + (N - 1) * ys[1] + H,), float("nan")).to(bf16)
    wb = torch.randn(w_off + H, generator=g).to(bf16)
    x = xb.as_strided((B, N, H), (*xs, 1), x_off)
    y = yb.as_strided((B, N, H), (*ys, 1), y_off)
    w = wb[w_off:]
    xb0 = xb.clone()
    scalars = {"B": B, "N": N, "H": H, "eps": 1e-6, "xb": xs[0], "xn": xs[1], "yb": ys[0], "yn": ys[1], "zero": 0,
               "cse_v1": B * N}  # TIRx hoists B * N into an argument the host wrapper computes
    named = {p.name: {"X_ptr": x, "Wt_ptr": w, "Y_ptr": y}[p.name] if p.pointer else scalars[p.name]
             for p in kern.params}
    grid, block = _launch(params, B, N)
    kern(grid=grid, block=block, **named).check()
    torch.testing.assert_close(y.float(), mod.reference(x, w, 1e-6, gemma)["out"], atol=2e-2, rtol=1.6e-2)
    inside = torch.zeros_like(yb, dtype=torch.bool)
    inside.as_strided((B, N, H), (*ys, 1), y_off).fill_(True)
    assert yb[~inside].isnan().all() and torch.equal(xb, xb0)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("B, N, H, xs, ys", [
    (1, 4, 64, (256, 64), (256, 64)), (19, 7, 128, (896, 128), (896, 128)), (3, 16, 256, (4096, 256), (4096, 256)),
    (5, 4, 512, (2048, 512), (2048, 512)), (3, 7, 24, (200, 24), (168, 24)), (2, 8, 128, (2048, 128), (1024, 128)),
    (3, 5, 1024, (5120, 1024), (5120, 1024)), (2, 3, 96, (1000, 136), (288, 96)),
])
def test_specialized_kernel_emulated(emulated, gemma, B, N, H, xs, ys):
    params = mod.compile_params(dtype="bfloat16", gemma=gemma, H=H)
    _check(emulated(params), params, B, N, H, 0, xs, 0, ys, 0, gemma)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("B, N, H, x_off, xs, y_off, ys, w_off", [
    (2, 3, 1, 0, (3, 1), 0, (3, 1), 0), (3, 7, 111, 1, (800, 113), 3, (777, 111), 1),
    (2, 5, 2001, 0, (10005, 2001), 0, (10005, 2001), 0), (1, 1, 33, 5, (33, 33), 2, (33, 33), 7),
    (3, 2, 128, 1, (300, 130), 0, (256, 128), 0),
])
def test_general_kernel_emulated(emulated, gemma, B, N, H, x_off, xs, y_off, ys, w_off):
    params = mod.general_params({"dtype": "bfloat16", "gemma": gemma})
    _check(emulated(params), params, B, N, H, x_off, xs, y_off, ys, w_off, gemma)


@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "gemma": False, "H": 128},
    {"dtype": "float16", "gemma": True, "H": 512},
    {"dtype": "bfloat16", "gemma": True, "schedule": "general"},
])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_qk_rmsnorm", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("H", [1, 7, 16, 64, 96, 111, 128, 256, 512, 1024, 2001])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_head_slices_at_every_alignment(H, dtype):
    """q as a head slice of a padded qkv row at element offsets 0..7, into a padded out: the oracle where out is,
    the NaN padding untouched."""
    torch.manual_seed(H)
    B, N = 9, 5
    gemma = H % 2 == 0
    fn = mod.gemma_qk_rmsnorm if gemma else mod.qk_rmsnorm
    atol, rtol = (2e-2, 1.6e-2) if dtype == torch.bfloat16 else (2e-3, 4e-3)
    w = torch.randn(H, device="cuda").to(dtype)
    for x_off, y_off in [(0, 0), (1, 0), (0, 3), (5, 7), (8, 8)]:
        qkv = torch.randn(B, x_off + 3 * N * H + 5, device="cuda").to(dtype)
        x = qkv[:, x_off:x_off + N * H].view(B, N, H)
        yb = torch.full((B, y_off + N * (H + 3)), float("nan"), device="cuda", dtype=dtype)
        y = yb[:, y_off:y_off + N * (H + 3)].unflatten(1, (N, H + 3))[:, :, :H]
        fn(x, w, 1e-6, out=y)
        torch.cuda.synchronize()
        torch.testing.assert_close(y.float(), mod.reference(x, w, 1e-6, gemma)["out"], atol=atol, rtol=rtol)
        written = torch.zeros_like(yb, dtype=torch.bool)
        written[:, y_off:y_off + N * (H + 3)].unflatten(1, (N, H + 3))[:, :, :H] = True
        assert yb[~written].isnan().all(), (x_off, y_off)
        torch.testing.assert_close(fn(x, w).float(), mod.reference(x, w, 1e-6, gemma)["out"], atol=atol, rtol=rtol)


@gpu
def test_gpu_matches_flashinfer_and_compile():
    x = torch.randn(19, 16, 128, device="cuda").to(bf16)
    w = torch.randn(128, device="cuda").to(bf16)
    got = torch.compile(lambda a, b: mod.gemma_qk_rmsnorm(a, b), fullgraph=True)(x, w)
    torch.testing.assert_close(got.float(), mod.reference(x, w, 1e-6, True)["out"], atol=2e-2, rtol=1.6e-2)
    assert mod.qk_rmsnorm(torch.empty(0, 4, 64, device="cuda", dtype=bf16), w[:64]).shape == (0, 4, 64)
    flashinfer = pytest.importorskip("flashinfer")
    for gemma in (False, True):
        ours = (mod.gemma_qk_rmsnorm if gemma else mod.qk_rmsnorm)(x, w)
        theirs = (flashinfer.norm.gemma_rmsnorm if gemma else flashinfer.norm.rmsnorm)(x, w, 1e-6)
        torch.testing.assert_close(ours, theirs, atol=1e-2, rtol=1e-2)


def test_harness_wiring_on_cpu():
    """The protocol pieces the harness combines (reference keys, the out= launch into a poisoned view) on CPU."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(dtype, B, N, H, eps=1e-6, gemma=False, **_):
        t = getattr(torch, dtype)
        return {"input": torch.randn(B, N, H).to(t), "weight": torch.randn(H).to(t), "eps": eps, "gemma": gemma,
                "out": torch.full((B, N, H), float("nan"), dtype=t)}

    def launch(cfg, data):
        data["out"].copy_(mod.reference(**data)["out"])

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, reference=mod.reference, prepare_data=prepare_data,
                                 launch=launch, get_baselines=lambda **cfg: {})
    assert harness.check_config(fake, {"dtype": "bfloat16", "B": 3, "N": 4, "H": 64, "gemma": True})["status"] == \
        "passed"
