# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_fp4's generated module run on the CPU (``core.emulate``'s module path: host code, 4-D tensor maps
with TMA zero fill, e4m3 wgmma SS/RS, the mbarrier rings, ping-pong turns) on the pre-pass's outputs, against the fp32
oracle with the FP8 bounds of ``_fwd_fp8_check`` (out and LSE), guard bands around the outputs, inputs unchanged.

CI emulates the pre-pass kernels once each (V transpose: hd128, strided, ragged; NVFP4 -> e4m3: hd128; both against
the torch pre-pass byte for byte) and the hd128 attention kernel twice: non-causal with
GQA 2:1 and ragged tiles, and causal with Sq > Sk (rows that see no key: out 0, lse -inf). ``TIRX_EMULATE_FULL=1``
adds hd256 (overlap, and pingpong), hd64 (SW64 Q/K rows), NVFP4 / MXFP8 K/V, the ragged lengths 1, 17, 127, the
plain schedule and the pre-pass kernel's other head dims (each kernel ~10-40 s of g++ on the 2-core machine)."""

import os
import re
import shutil

import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

from tirx_kernels.core import build, emulate  # noqa: E402
from tirx_kernels.core.lang import quant  # noqa: E402
from tirx_kernels.ported.flashattention import _fwd_fp8_check  # noqa: E402
from tirx_kernels.ported.flashattention import _fwd_fp8_prepass as prepass  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4_fp4 as mod  # noqa: E402

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
# The generated wrapper of cvt.rn.satfinite.e4m3x2.f32 (P to e4m3) is dropped: core.lang.quant's CPU stand-in
# (force-included) defines the same function; the module path would otherwise give it a faulting stand-in.
_CVT_WRAPPER = re.compile(r"__forceinline__ __device__ void tvm_builtin_ptx_cvt_f8x2_f32_rn_satfinite_e4m3x2_f32"
                          r"\([^)]*\) \{\n.*?\n\}\n", re.S)
_modules = {}


def _kernel(d: int, causal: bool, schedule=None, params=None):
    params = params or mod.compile_params(D=d, causal=causal, schedule=schedule)
    key = tuple(sorted(params.items()))
    if key not in _modules:
        src, n = _CVT_WRAPPER.subn("", build.codegen(mod.get_kernel(**params)))
        assert n == 1, "the e4m3x2 conversion wrapper was not found in the generated source"
        saved = emulate.CXXFLAGS
        emulate.CXXFLAGS = [*saved, *quant.emulate_cxxflags()]
        try:
            _modules[key] = emulate.compile_module(src)
        finally:
            emulate.CXXFLAGS = saved
    return _modules[key]


def _guarded(shape, dtype):
    buf = torch.full((3, *shape), float("nan"), dtype=dtype)
    return buf, buf[1]


def _run(d, causal, B, Sq, Sk, Hq, Hkv, kv_format="e4m3", schedule=None, seed=0):  # noqa: N803
    torch.manual_seed(seed)
    data = mod.prepare_data(B=B, Sq=Sq, Sk=Sk, Hq=Hq, Hkv=Hkv, D=d, causal=causal, kv_format=kv_format, device="cpu")
    inp = mod.kernel_inputs(**data)
    args = [inp["q"].view(torch.uint8), inp["k"].view(torch.uint8), inp["vt"].view(torch.uint8), inp["q_descale"],
            inp["k_descale"], inp["v_descale"]]
    before = [a.clone() for a in args]
    out_buf, out = _guarded((B, Sq, Hq, d), torch.bfloat16)
    lse_buf, lse = _guarded((B, Hq, Sq), torch.float32)
    _kernel(d, causal, schedule)(*args, out, lse, data["softmax_scale"], hang_timeout=60.0).check()
    for a, a0 in zip(args, before):
        assert torch.equal(a, a0), "an input was modified"
    for buf in (out_buf, lse_buf):
        assert buf[0].isnan().all() and buf[2].isnan().all(), "written outside the output"
    stats = _fwd_fp8_check.check_outputs(out, lse, inp, data["softmax_scale"], causal)
    assert stats["out"]["rel_fro"] < 0.03  # the P rounding's average (~0.014 at these sizes), far inside the bound
    return lse


def test_gqa_ragged():
    _run(128, False, B=1, Sq=200, Sk=200, Hq=2, Hkv=1)


def test_causal_more_queries_than_keys_leaves_rows_empty():
    lse = _run(128, True, B=1, Sq=300, Sk=130, Hq=2, Hkv=2, seed=1)
    assert torch.isinf(lse[:, :, :170]).all() and torch.isfinite(lse[:, :, 170:]).all()


@pytest.mark.parametrize("d, sk", [(128, 200), pytest.param(64, 37, marks=full_only),
                                   pytest.param(256, 16, marks=full_only), pytest.param(128, 1, marks=full_only)])
def test_transpose_v_kernel_matches_the_torch_prepass(d, sk):
    """The op's V pre-pass kernel on a strided (packed-KV) V: V^T's bytes as ``prepass.transpose_v``'s, nothing written
    past the output, the input unchanged."""
    torch.manual_seed(d + sk)
    kv = torch.randint(0, 255, (2, sk, 2, 3, d), dtype=torch.uint8)
    v = kv[:, :, 1]
    v0 = v.clone()
    sk16 = (sk + 15) // 16 * 16
    buf = torch.full((3, 2, 3, d, sk16), 0xAB, dtype=torch.uint8)
    emulate.compile_module(mod.get_kernel(**mod.transpose_params(d)))(v, buf[1]).check()
    assert torch.equal(buf[1], prepass.transpose_v(v.view(torch.float8_e4m3fn)).view(torch.uint8))
    assert (buf[0] == 0xAB).all() and (buf[2] == 0xAB).all() and torch.equal(v, v0)


@pytest.mark.parametrize("kv_format, d", [("nvfp4", 128), pytest.param("mxfp8", 64, marks=full_only),
                                         pytest.param("nvfp4", 64, marks=full_only),
                                         pytest.param("mxfp8", 256, marks=full_only)])
def test_requant_kernel_matches_the_torch_prepass(kv_format, d):
    """The op's NVFP4 / MXFP8 -> e4m3 kernel: the bytes of ``prepass.dequantize_kv`` (heads of scales 1e-3 .. 50, a
    zero element), nothing written past the output."""
    torch.manual_seed(d)
    x = torch.randn(2, 37, 3, d) * torch.tensor([1e-3, 1.0, 50.0])[None, None, :, None]
    enc = mod.encode_kv(x, kv_format)
    want, want_descale = prepass.dequantize_kv(enc["data"], kv_format, enc["scale"], enc["global_scale"])
    mult, descale = prepass.head_factors(kv_format, enc["scale"], enc["global_scale"])
    out = torch.full((3, 2, 37, 3, d), 0xAB, dtype=torch.uint8)
    _kernel(d, False, params=mod.requant_params(kv_format, d))(
        enc["data"].view(torch.uint8), enc["scale"].view(torch.uint8).reshape(-1), mult.view(-1), out[1]).check()
    assert torch.equal(out[1], want.view(torch.uint8)) and torch.equal(descale, want_descale)
    assert (out[0] == 0xAB).all() and (out[2] == 0xAB).all()


@full_only
@pytest.mark.parametrize("d, causal, B, Sq, Sk, Hq, Hkv, kv_format, schedule", [
    (256, True, 1, 200, 200, 2, 1, "e4m3", None),
    (256, False, 1, 130, 200, 2, 2, "e4m3", "pingpong"),
    (256, False, 2, 17, 127, 2, 2, "nvfp4", None),
    (128, True, 1, 127, 17, 4, 1, "mxfp8", None),
    (128, False, 2, 1, 127, 2, 2, "nvfp4", None),
    (128, True, 1, 17, 1, 2, 2, "e4m3", None),
    (128, True, 1, 200, 260, 2, 1, "e4m3", "plain"),
    (64, True, 1, 200, 230, 2, 1, "e4m3", None),
    (64, False, 1, 130, 70, 2, 2, "nvfp4", None),
])
def test_more_shapes_formats_and_schedules(d, causal, B, Sq, Sk, Hq, Hkv, kv_format, schedule):  # noqa: N803
    _run(d, causal, B, Sq, Sk, Hq, Hkv, kv_format, schedule)
