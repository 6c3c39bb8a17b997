# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_fp4 on the CPU: input validation, the V^T key order against the PTX ISA's 8-bit A fragment and
the f32 accumulator fragment (the identity that keeps P in registers without shuffles), the pre-pass (transpose,
NVFP4 / MXFP8 decode against core.quant_ref, requantization error), the FP8 error bounds (a twin with the kernel's
roundings passes, a wrong key order does not), params and bundle coverage, and the sm_90a build (QGMMA for both
GEMMs, 4-D TMA, setmaxnreg, no spills). Emulated runs: test_flash_attention4_fp4_emulated.py; GPU runs:
test_flash_attention4_fp4_gpu.py and test_gpu.py."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

pytest.importorskip("tvm", reason="the kernel's modules build TIRx at import: apache-tvm is needed")

from tirx_kernels.core import checks, harness, quant_ref  # noqa: E402
from tirx_kernels.core.lang import wgmma  # noqa: E402
from tirx_kernels.ported.flashattention import _fwd_fp8, _fwd_fp8_check  # noqa: E402
from tirx_kernels.ported.flashattention import _fwd_fp8_prepass as prepass  # noqa: E402
from tirx_kernels.ported.flashattention import flash_attention4_fp4 as mod  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _e(*shape):
    return torch.randn(*shape).to(E4M3)


# ------------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("call, arg", [
    (lambda: mod.flash_attn_fp8_func(torch.randn(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128)), "q"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 96), _e(1, 8, 2, 96), _e(1, 8, 2, 96)), "q"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128).bfloat16(), _e(1, 8, 2, 128)), "k"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 9, 2, 128)), "v"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 6, 128), _e(1, 8, 4, 128), _e(1, 8, 4, 128)), "k"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128),
                                     q_descale=torch.ones(2)), "q_descale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128),
                                     v_descale=torch.ones(1, 2, dtype=torch.float64)), "v_descale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128), kv_format="fp4"),
     "kv_format"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128),
                                     k_scale=torch.ones(1)), "k_scale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), torch.zeros(1, 8, 2, 128, dtype=torch.uint8),
                                     torch.zeros(1, 8, 2, 128, dtype=torch.uint8), kv_format="nvfp4",
                                     k_scale=_e(1, 8, 2, 8), v_scale=_e(1, 8, 2, 8), k_global_scale=1.0,
                                     v_global_scale=1.0), "k"),  # nvfp4 packs two e2m1 a byte: [.., D/2]
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), torch.zeros(1, 8, 2, 64, dtype=torch.uint8),
                                     torch.zeros(1, 8, 2, 64, dtype=torch.uint8), kv_format="nvfp4",
                                     k_scale=_e(1, 8, 2, 4), v_scale=_e(1, 8, 2, 8), k_global_scale=1.0,
                                     v_global_scale=1.0), "k_scale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), torch.zeros(1, 8, 2, 64, dtype=torch.uint8),
                                     torch.zeros(1, 8, 2, 64, dtype=torch.uint8), kv_format="nvfp4",
                                     k_scale=_e(1, 8, 2, 8), v_scale=_e(1, 8, 2, 8), k_global_scale=1.0),
     "v_global_scale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128), kv_format="mxfp8",
                                     k_scale=torch.zeros(1, 8, 2, 4), v_scale=torch.zeros(1, 8, 2, 4)), "k_scale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128), softmax_scale=math.inf),
     "softmax_scale"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128),
                                     out=(torch.empty(1, 8, 2, 128), torch.empty(1, 2, 8))), "out[0]"),
    (lambda: mod.flash_attn_fp8_func(_e(1, 8, 2, 128), _e(1, 8, 2, 128), _e(1, 8, 2, 128)), "q"),  # valid: CPU
])
def test_invalid_inputs_name_the_argument(call, arg):
    with pytest.raises(checks.TirxInputError, match=re.escape(f"argument '{arg}'")):
        call()


# ------------------------------------------------------------------------------------------------ P in registers

def test_v_key_order_is_the_fragment_identity():
    """Byte e of 8-bit A register i of a k32 wgmma sits at K position a_frag_col (PTX ISA); _pack_p puts there the
    thread's accumulator column j = 4 kk + 2 (i // 2) + e // 2, element e % 2; V^T's position must hold that key."""
    for lane in range(4):
        for i in range(4):
            for e in range(4):
                k_pos = wgmma.a_frag_col(lane, i, e, "float8_e4m3fn")
                key = wgmma.acc_col(lane, 2 * (i // 2) + e // 2, e % 2)
                assert k_pos // 16 == key // 16  # the order never crosses a 16-key group
                assert prepass.V_KEY_ORDER[k_pos % 16] == key % 16
    assert sorted(prepass.V_KEY_ORDER) == list(range(16))


def test_transpose_v_permutes_keys_and_zero_pads():
    v = torch.randn(2, 37, 3, 128).to(E4M3)
    vt = prepass.transpose_v(v)
    assert vt.shape == (2, 3, 128, 48) and vt.is_contiguous() and vt.dtype == E4M3
    b = vt.view(torch.uint8)
    for pos in range(48):
        key = pos // 16 * 16 + prepass.V_KEY_ORDER[pos % 16]
        want = v.view(torch.uint8)[:, key] if key < 37 else torch.zeros(2, 3, 128, dtype=torch.uint8)
        assert torch.equal(b[..., pos], want), pos


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_kv_formats_decode_as_quant_ref_and_requantize_within_e4m3(fmt):
    torch.manual_seed(3)
    x = torch.randn(2, 19, 2, 128) * torch.tensor([0.01, 30.0])[None, None, :, None]
    enc = mod.encode_kv(x, fmt)
    rows = enc["data"].reshape(-1, enc["data"].shape[-1])
    if fmt == "nvfp4":
        want = quant_ref.nvfp4_dequantize(rows, enc["scale"].view(torch.uint8).reshape(-1, 8), enc["global_scale"],
                                          rows.shape[0], 128, layout="linear")
        got = prepass.decode_nvfp4(enc["data"], enc["scale"], enc["global_scale"])
    else:
        want = quant_ref.mxfp8_dequantize(rows.view(torch.uint8), enc["scale"].reshape(-1, 4), rows.shape[0], 128,
                                          layout="linear")
        got = prepass.decode_mxfp8(enc["data"], enc["scale"])
    assert torch.equal(got.reshape(-1, 128), want)
    e4m3, descale = prepass.dequantize_kv(enc["data"], fmt, enc["scale"], enc["global_scale"])
    assert e4m3.dtype == E4M3 and descale.shape == (2, 2)
    # Requantization: round to nearest e4m3 of x / descale: 2^-4 relative, or 2^-10 x descale in the subnormals.
    back = e4m3.float() * descale[:, None, :, None]
    bound = 2.0**-4 * got.abs() + 2.0**-10 * descale[:, None, :, None]
    assert ((back - got).abs() <= bound).all()
    if fmt == "mxfp8":  # power-of-two rescaling: exact above e4m3's subnormals
        normal = got.abs() >= 2.0**-6 * descale[:, None, :, None]
        assert torch.equal(back[normal], got[normal])


# ------------------------------------------------------------------------------------------------ error bounds

def _twin_inputs(S, H, D, seed):
    torch.manual_seed(seed)
    data = mod.prepare_data(B=1, Sq=S, Sk=S, Hq=H, Hkv=H, D=D, causal=True, device="cpu")
    return data, mod.kernel_inputs(**data)


def test_bound_admits_the_kernels_roundings_and_not_a_wrong_key_order():
    """A torch twin of the kernel's roundings (2^8 P to e4m3 against the running max of 128-key tiles, the unrounded
    row sum, bf16 out) is inside the bounds; the same with the V^T key order undone (a P register fed to the wrong keys)
    is not."""
    S, H, D = 384, 2, 128
    data, inp = _twin_inputs(S, H, D, 1)
    qf, kf, vf = _fwd_fp8_check._dequantized(inp)
    scale = data["softmax_scale"]
    s = (qf @ kf.transpose(-1, -2) * scale).masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), -math.inf)

    def twin(v):
        o = torch.zeros(1, H, S, D)
        m = torch.full((1, H, S, 1), -math.inf)
        ll = torch.zeros(1, H, S, 1)
        for n0 in range(0, S, 128):
            st = s[..., n0:n0 + 128]
            m_new = torch.maximum(m, st.amax(-1, keepdim=True))
            corr = torch.exp(m - m_new)
            p = torch.exp(st - m_new)
            scaled = (p * 2.0**_fwd_fp8.P_OFFSET).to(E4M3).float() * 2.0**-_fwd_fp8.P_OFFSET
            o = o * corr + scaled @ v[:, :, n0:n0 + 128]
            ll = ll * corr + p.sum(-1, keepdim=True)
            m = m_new
        return (o / ll).transpose(1, 2).to(torch.bfloat16), (m + torch.log(ll)).squeeze(-1)

    out, lse = twin(vf)
    stats = _fwd_fp8_check.check_outputs(out, lse, inp, scale, True)
    assert stats["out"]["max_of_bound"] < 1
    swapped = vf.view(1, H, S // 16, 16, D)[:, :, :, list(prepass.V_KEY_ORDER)].reshape(1, H, S, D)
    bad, _ = twin(swapped)
    with pytest.raises(harness.KernelCheckError, match="beyond the FP8 bound"):
        _fwd_fp8_check.check_outputs(bad, lse, inp, scale, True)
    with pytest.raises(harness.KernelCheckError, match="lse"):
        _fwd_fp8_check.check_outputs(out, lse + 0.01, inp, scale, True)


def test_oracle_matches_torch_attention():
    data, inp = _twin_inputs(70, 2, 128, 2)
    out, lse = _fwd_fp8_check.oracle(inp, data["softmax_scale"], True)
    qf, kf, vf = _fwd_fp8_check._dequantized(inp)
    want = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=data["softmax_scale"])
    assert torch.allclose(out, want.transpose(1, 2), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(lse).all()


# ------------------------------------------------------------------------------------------------ params

def test_check_module_uses_the_kernels_p_offset():
    assert _fwd_fp8_check.P_OFFSET == _fwd_fp8.P_OFFSET


def test_tiles_fit_registers_and_smem():
    for d, (block_n, stages, _, _) in mod.TILES.items():
        _fwd_fp8.FP8Mainloop(d, block_n, stages)  # raises past the register or smem budget
    with pytest.raises(ValueError, match="block_n"):
        _fwd_fp8.FP8Mainloop(128, 96, 2)


def test_call_samples_resolve_to_artifacts():
    params = {tuple(sorted(p.items())) for p in mod.artifact_params()}
    for cfg in mod.call_samples(random.Random(0)):
        assert tuple(sorted(mod.compile_params(**cfg).items())) in params, cfg


def test_roofline():
    r = mod.roofline(B=1, Sq=4, Sk=2, Hq=1, Hkv=1, D=128, causal=True)
    assert r["flops"] == 4 * 128 * 3
    assert mod.roofline(B=1, Sq=4, Sk=4, Hq=1, Hkv=1, D=128, kv_format="nvfp4")["bytes"] < \
        mod.roofline(B=1, Sq=4, Sk=4, Hq=1, Hkv=1, D=128)["bytes"]


# ------------------------------------------------------------------------------------------------ the build

# One representative build in CI; every artifact and bench variant (hd256: 128 x 128 overlap at 24 / 240 registers)
# built spill-free with its sass_expect on 2026-12-06.
@pytest.mark.parametrize("params", [mod.compile_params(D=128, causal=True), mod.transpose_params(128),
                                    mod.requant_params("nvfp4", 128)], ids=["d128_causal", "transpose_v_d128",
                                                                            "requant_nvfp4_d128"])
def test_builds_for_sm90a_with_fp8_tensor_cores_and_tma(params):
    from tirx_kernels.core import build, testing

    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed")
    sass = testing.build_and_check_sass(mod, "flash_attention4_fp4", params)
    if params.get("kind"):  # the pre-pass kernels: sass_expect only
        return
    assert "MUFU.EX2" in sass
    assert "F2FP.SATFINITE.E4M3.F32" in sass  # P to e4m3 by the hardware conversion, two a instruction
