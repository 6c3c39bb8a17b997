# SPDX-License-Identifier: Apache-2.0
"""Any M, N, K >= 1 (issue 19, docs/gemm.md "Any M, N, K"), on the CPU: the host plan of ``_run`` (K % 8 zero
padding, NN's padded B, the padded output copied into ``out``, the ``c_store="stg"`` kernel) run against a CPU
stand-in for the kernel; every call form resolves to params a bundle holds (``artifact_params`` / CONFIGS, or their
``general_params``); the "stg" kernel's build (per-element 16-bit stores, no TMA store, no spills)."""

import random

import pytest
import torch

from tirx_kernels.core import artifacts
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.gemm import _host
from tirx_kernels.gemm import fp16_bf16_gemm as mod

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class _CpuKernel:
    """Stands in for ``_host._FUNCTIONS``: records each call's params and arguments and computes the kernel's result
    in fp32 on the CPU (``alpha * a @ op(b) + beta * c + bias``), so the host plan around it is checked end to end."""

    def __init__(self):
        self.calls = []
        self.compute = True

    def get(self, key, params_of, device=None):
        params = params_of()

        def fn(a, b, c, *rest):
            self.calls.append((params, a, b, c, rest))
            if not self.compute:
                return
            bias = rest[0] if len(rest) in (1, 3) else None
            alpha, beta = (rest[-2], rest[-1]) if len(rest) >= 2 else (1.0, 0.0)
            r = a.float() @ (b.float().T if params.get("layout", "nt") == "nt" else b.float()) * alpha
            if beta != 0:
                r = r + beta * c.float()
            if bias is not None:
                r = r + bias.float()
            c.copy_(r.to(c.dtype))

        return fn


@pytest.fixture
def kernel(monkeypatch):
    k = _CpuKernel()
    monkeypatch.setattr(_host, "_FUNCTIONS", k)
    return k


def _bundle() -> set:
    params = mod.artifact_params() + [mod.compile_params(**{**mod.DEFAULTS, **c}) for c in mod.CONFIGS]
    return {artifacts.canonical_params(p) for p in params}


def _served(params: dict, bundle: set) -> bool:
    general = mod.general_params(dict(params))
    return artifacts.canonical_params(params) in bundle or (
        general is not None and artifacts.canonical_params(general) in bundle)


def _call(layout, dtype, M, N, K, out_dtype=None, epilogue="none", bias_dtype=None, out_kind="contiguous",  # noqa: N803
          seed=0):
    """Inputs, the out tensor (contiguous, or rows not 16-byte aligned: a padded stride / an odd base) and the
    fp32 oracle."""
    g = torch.Generator().manual_seed(seed)
    t = DTYPES[dtype]
    ot = DTYPES[out_dtype or dtype]
    a = torch.randn(M, K, generator=g).to(t)
    b = torch.randn(*((N, K) if layout == "nt" else (K, N)), generator=g).to(t)
    if out_kind == "stride":
        out = torch.empty(M, N + 1, dtype=ot)[:, :N]
    elif out_kind == "offset":
        out = torch.empty(M * N + 1, dtype=ot)[1:].view(M, N)
    else:
        out = torch.empty(M, N, dtype=ot)
    kw = {}
    if epilogue in ("bias", "alpha_beta_bias"):
        kw["bias"] = torch.randn(N, generator=g).to(DTYPES[bias_dtype])
    if epilogue in ("alpha_beta", "alpha_beta_bias"):
        kw["alpha"], kw["beta"] = 0.5, -1.5
        out.copy_(torch.randn(M, N, generator=g))
    ref = a.float() @ (b.float().T if layout == "nt" else b.float()) * kw.get("alpha", 1.0)
    if kw.get("beta", 0.0) != 0:
        ref = ref + kw["beta"] * out.float()
    if "bias" in kw:
        ref = ref + kw["bias"].float()
    return a, b, out, kw, ref


SHAPES = [(1, 1, 1), (5, 3, 7), (13, 1001, 72), (129, 1001, 136), (300, 77, 73), (37, 264, 1001), (129, 264, 72),
          (200, 50257, 24), (9, 130, 8)]
VARIANTS = [("nt", None, "none", None), ("nn", None, "none", None), ("nt", "float32", "none", None),
            ("nt", None, "bias", "bfloat16"), ("nn", "float32", "alpha_beta_bias", "float32"),
            ("nt", None, "alpha_beta", None), ("nn", None, "bias", "float32")]


@pytest.mark.parametrize("M, N, K", SHAPES)
@pytest.mark.parametrize("layout, out_dtype, epilogue, bias_dtype", VARIANTS)
@pytest.mark.parametrize("out_kind", ["contiguous", "stride", "offset"])
def test_host_plan(kernel, M, N, K, layout, out_dtype, epilogue, bias_dtype, out_kind):  # noqa: N803
    """Every call form's result through the host plan equals the oracle; the kernel sees TMA-addressable operands
    (K % 8 == 0, 16-byte rows; C too unless "stg"), a bias of C's width, and params a bundle serves."""
    a, b, out, kw, ref = _call(layout, "bfloat16", M, N, K, out_dtype, epilogue, bias_dtype, out_kind)
    _host._run(a, b, out, None, layout, kw.get("bias"), kw.get("alpha", 1.0), kw.get("beta", 0.0))
    assert len(kernel.calls) == 1
    params, ka, kb, kc, rest = kernel.calls[0]
    assert ka.shape[1] % 8 == 0 and ka.stride(0) % 8 == 0 and kb.stride(0) % 8 == 0
    n_kernel = kb.shape[0] if layout == "nt" else kb.shape[1]
    assert kc.shape == (M, n_kernel)
    if params.get("c_store") == "stg":
        assert kc.data_ptr() == out.data_ptr() and layout == "nt" and epilogue == "none" and out_dtype is None
    else:
        assert _host._tma_rows(kc)
    if "bias" in kw:
        assert rest[0].shape == (n_kernel,)
    assert _served(params, _bundle())
    torch.testing.assert_close(out.float(), ref, atol=0.05 * ref.abs().max().item() + 1e-3, rtol=0.02)


def test_random_shapes_resolve_to_bundle(kernel):
    """Random M, N, K (odd ones included), both layouts, every epilogue / out dtype / bias dtype: the params the op
    loads are in the bundle (``artifact_params`` / CONFIGS) or their general artifact is."""
    rng = random.Random(19)
    bundle = _bundle()
    kernel.compute = False  # the params only
    for _ in range(150):
        M, N, K = (rng.choice([rng.randint(1, 40), rng.randint(1, 3000), 8 * rng.randint(1, 400)]) for _ in range(3))
        dtype = rng.choice(["bfloat16", "float16"])
        layout = rng.choice(mod.LAYOUTS)
        out_dtype = rng.choice([None, "float32"])
        epilogue = rng.choice(mod.EPILOGUES)
        bias_dtype = rng.choice([dtype, "float32"]) if epilogue in ("bias", "alpha_beta_bias") else None
        a, b, out, kw, _ = _call(layout, dtype, M, N, K, out_dtype, epilogue, bias_dtype)
        kernel.calls.clear()
        _host._run(a, b, out, None, layout, kw.get("bias"), kw.get("alpha", 1.0), kw.get("beta", 0.0))
        params = kernel.calls[0][0]
        assert _served(params, bundle), (M, N, K, dtype, layout, out_dtype, epilogue, bias_dtype, params)


def test_configs_rows_are_what_the_op_loads(kernel):
    """The odd-shape CONFIGS rows' compile params (what CI builds) are the params ``_run`` loads for them."""
    rows = [c for c in mod.CONFIGS if c["N"] % 8 or c["K"] % 8]
    assert len(rows) >= 10
    for c in rows:
        a, b, out, kw, _ = _call(c.get("layout", "nt"), c["dtype"], c["M"], c["N"], c["K"], c.get("out_dtype"),
                                 c.get("epilogue", "none"), c.get("bias_dtype"))
        kernel.calls.clear()
        _host._run(a, b, out, c.get("tile"), c.get("layout", "nt"), kw.get("bias"), kw.get("alpha", 1.0),
                   kw.get("beta", 0.0))
        assert kernel.calls[0][0] == mod.compile_params(**c), c["label"]


def test_bundle_counts():
    """The general variant artifacts: every (layout, out_dtype, epilogue, bias_dtype) but the plain one, per dtype
    (23 each); 2 "stg"; 10 NT bias (a's dtype) on the table's persistent tiles: 58 beyond the plain tiles."""
    params = mod.artifact_params()
    assert len(params) == len({artifacts.canonical_params(p) for p in params})
    assert len(mod.variant_combinations("bfloat16")) == 23
    assert sum(1 for p in params if "layout" in p or "c_store" in p) == 58
    for d in ("bfloat16", "float16"):
        for v in mod.variant_combinations(d):
            assert {"dtype": d, "tile": mod.VARIANT_TILE, **v} in params


def test_general_params():
    stg = {"dtype": "bfloat16", "tile": "persistent_128x128x64_s6_g8", "c_store": "stg"}
    assert mod.general_params(stg) == {**stg, "tile": mod.STG_TILE}
    v = {"dtype": "float16", "tile": "persistent_128x64x64_s8_g8_ef", "layout": "nn", "out_dtype": "float32",
         "epilogue": "bias", "bias_dtype": "float32"}
    assert mod.general_params(v) == {**v, "tile": mod.VARIANT_TILE}
    assert mod.general_params({"dtype": "bfloat16", "tile": "ws_128x256x64_s3"}) is None


@pytest.mark.parametrize("M, N, K, layout", [(64, 61, 64, "nt"), (64, 64, 61, "nt"), (5, 3, 7, "nn"), (1, 1, 1, "nt")])
def test_odd_shapes_pass_validation(M, N, K, layout):  # noqa: N803
    """Odd N and K are accepted: with CPU tensors the only complaint left is the device."""
    a = torch.zeros(M, K, dtype=torch.bfloat16)
    b = torch.zeros(*((N, K) if layout == "nt" else (K, N)), dtype=torch.bfloat16)
    op = mod.gemm_nt if layout == "nt" else mod.gemm_nn
    with pytest.raises(TirxInputError, match="argument 'a': expected .*CUDA"):
        op(a, b, bias=torch.zeros(N, dtype=torch.bfloat16), out=torch.zeros(M, N, dtype=torch.bfloat16))


def test_small_m_tile_refuses_odd_n():
    a = torch.zeros(16, 64, dtype=torch.bfloat16)
    with pytest.raises(TirxInputError, match="argument 'tile': expected a tile serving N = 61"):
        mod.gemm_nt(a, torch.zeros(61, 64, dtype=torch.bfloat16), tile="smallm_64x128x64_s8_k2")


def test_c_store_choice():
    assert mod.c_store("bfloat16", 4096, 50257, 4096) == "stg"
    assert mod.c_store("bfloat16", 4096, 50264, 4096) == "tma"
    assert mod.c_store("bfloat16", 4096, 50264, 4096, out_aligned=False) == "stg"
    assert mod.c_store("bfloat16", 4, 50257, 4096) == "tma"  # the gemv pick: a padded output
    assert mod.c_store("bfloat16", 4096, 50257, 4096, layout="nn") == "tma"  # variants: a padded output
    assert mod.c_store("bfloat16", 4096, 50257, 4096, tile="pingpong_128x192x64_s4_e64_g8") == "tma"
    assert mod.c_store("bfloat16", 4096, 50257, 4096, tile="persistent_128x128x64_s6_c2_g8") == "stg"


# ---------------------------------------------------------------------------------------------------------
# The "stg" kernel (gemm/_persistent.py c_store)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"layout": "nn"}, {"out_dtype": "float32"}, {"epilogue": "bias", "bias_dtype":
                                "bfloat16"}, {"stream_k": True}, {"block_n": 224, "epi_cols": 64}, {"c_store": "x"}])
def test_stg_builds_only_the_plain_kernel(kw):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    from tirx_kernels.gemm import _persistent

    params = {k: v for k, v in mod.TILE_CONFIGS[mod.STG_TILE].items() if k != "kind"}
    with pytest.raises(ValueError):
        _persistent.build_persistent_kernel("bfloat16", **{**params, "c_store": "stg", **kw})


def test_stg_host_encodes_no_c_map():
    """No tensor map of C (it would need 16-byte rows): the A and B maps only; C is addressed as 16-bit words."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    from tirx_kernels.core import build

    src = build.codegen(mod.get_kernel("bfloat16", mod.STG_TILE, c_store="stg"))
    assert src.count("cuTensorMapEncodeTiled(static_cast") == 2
    dev = src[src.index('extern "C" __global__'):]
    assert "((ushort*)C_ptr)[" in dev and "cp_async_bulk_tensor" not in dev.split("tvm_builtin_cuda_warpgroup_sync")[-1]


@pytest.mark.parametrize("params", [
    {"dtype": "bfloat16", "tile": mod.STG_TILE, "c_store": "stg"},
    {"dtype": "float16", "tile": mod.STG_TILE, "c_store": "stg"},
    {"dtype": "bfloat16", "tile": "persistent_128x128x64_s6_c2_g8", "c_store": "stg"},
])
def test_stg_sass(params):
    """16-bit STG stores (128 per thread and tile of 128 x 256 / 64 of 128 x 128), no TMA store, no spills."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    import re

    from tirx_kernels.core import testing

    sass = testing.build_and_check_sass(mod, "fp16_bf16_gemm", params)
    assert "UTMASTG" not in sass
    assert len(re.findall(r"STG\.E\.U16", sass)) == mod.TILE_CONFIGS[params["tile"]]["block_n"] // 2


# ---------------------------------------------------------------------------------------------------------
# GPU: the public ops on odd shapes, with out contiguous / strided (rows not 16-byte aligned) / off 16 bytes / None
# ---------------------------------------------------------------------------------------------------------

GPU_FORMS = [("nt", {}), ("nn", {}), ("nt", {"bias": "bfloat16"}),
             ("nt", {"bias": "float32", "alpha": 0.5, "beta": -1.5, "out_dtype": torch.float32}),
             ("nn", {"alpha": 1.5, "beta": 0.75})]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
@pytest.mark.parametrize("M, N, K", [(129, 1001, 136), (5, 3, 7), (300, 77, 73), (13, 1001, 72), (1, 1, 1),
                                     (257, 50257, 64)])
@pytest.mark.parametrize("layout, form", GPU_FORMS)
@pytest.mark.parametrize("out_kind", ["contiguous", "stride", "offset", "none"])
def test_gpu_odd_shapes(M, N, K, layout, form, out_kind):  # noqa: N803
    """Close to the fp32 oracle; nothing written outside out (the stride gap and the elements around it stay NaN)."""
    if out_kind == "none" and form.get("beta"):
        pytest.skip("beta reads out")
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    dev, t = "cuda", torch.bfloat16
    ot = form.get("out_dtype", t)
    a = torch.randn(M, K, generator=g, device=dev).to(t)
    b = torch.randn(*((N, K) if layout == "nt" else (K, N)), generator=g, device=dev).to(t)
    bias = None
    if "bias" in form:
        bias = (torch.randn(N, generator=g, device=dev) * K ** 0.5).to(DTYPES[form["bias"]])
    alpha, beta = form.get("alpha", 1.0), form.get("beta", 0.0)
    c_in = torch.randn(M, N, generator=g, device=dev) * K ** 0.5
    buf = None
    if out_kind == "stride":
        buf = torch.full((M, N + 3), float("nan"), device=dev, dtype=ot)
        out = buf[:, :N]
    elif out_kind == "offset":
        buf = torch.full((M * N + 2,), float("nan"), device=dev, dtype=ot)
        out = buf[1:1 + M * N].view(M, N)
    elif out_kind == "contiguous":
        out = torch.full((M, N), float("nan"), device=dev, dtype=ot)
    else:
        out = None
    if out is not None and beta != 0:
        out.copy_(c_in)
    op = mod.gemm_nt if layout == "nt" else mod.gemm_nn
    r = op(a, b, out, bias=bias, alpha=alpha, beta=beta, out_dtype=ot if ot != t else None)
    assert r.shape == (M, N) and r.dtype == ot
    ref = a.float() @ (b.float().T if layout == "nt" else b.float()) * alpha
    if beta != 0:
        ref = ref + beta * c_in.to(ot).float()
    if bias is not None:
        ref = ref + bias.float()
    atol, rtol = mod.TOLERANCE[str(ot).replace("torch.", "")]
    torch.testing.assert_close(r.float(), ref, atol=atol * ref.pow(2).mean().sqrt().item() + 1e-6, rtol=rtol)
    if out_kind == "stride":
        assert buf[:, N:].isnan().all()
    elif out_kind == "offset":
        assert buf[0].isnan() and buf[-1].isnan()
