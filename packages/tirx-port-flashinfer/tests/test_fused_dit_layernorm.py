# SPDX-License-Identifier: Apache-2.0
"""flashinfer_fused_dit_layernorm: params resolution against the bundle, input validation, both kernels' generated
CUDA run on the CPU for every mode (``core.emulate``: both outputs of every token against the fp32 oracle, WAN's temb
views, per-batch broadcast modulation, no residual, an input scale, odd H, padded and unaligned token rows, residual_out
written over residual; nothing outside the outputs written, every access inside its allocation, 16-byte accesses
aligned), SASS; on a GPU, the harness's checks of every config, FlashInfer and torch.compile."""

import random
import re

import pytest
import torch

from tirx_kernels.core import artifacts, model_dims, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.norm import fused_dit_layernorm as mod
from tirx_kernels.ported.flashinfer.norm import layernorm

bf16 = torch.bfloat16
f32 = torch.float32


# ------------------------------------------------------------------------------------------------ params

def test_every_call_resolves_to_a_bundled_artifact():
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    rng = random.Random(0)
    sizes = set(range(1, 200)) | {rng.randrange(1, 70000) for _ in range(200)} | set(model_dims.hidden_sizes())
    for mode in mod.MODES:
        for H in sorted(sizes | {3072}):
            params = mod.compile_params(mode=mode, H=H)
            cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, params)]
            assert bundled & set(cands), (mode, H, cands)
    assert {"mode": "grss", "H": 3072} in mod.artifact_params()


def test_compile_params():
    assert mod.compile_params(mode="rss", B=2, R=768, H=3072) == {"mode": "rss", "H": 3072}
    assert mod.compile_params(mode="grgb", H=129) == {"mode": "grgb", "schedule": "general"}
    assert mod.compile_params(mode="grss", H=3072, schedule="general") == {"mode": "grss", "schedule": "general"}
    with pytest.raises(ValueError, match="mode"):
        mod.get_kernel("gr", H=3072)
    with pytest.raises(ValueError, match="takes H at run time"):
        mod.get_kernel("rss", H=3072, schedule="general")


def test_uses_general_where_a_token_row_or_vector_is_off_16_bytes():
    temb = torch.zeros(2, 5, 6, 3072, dtype=bf16)
    x = torch.zeros(2, 5, 3072, dtype=bf16)
    v = torch.zeros(3080)
    assert not mod.uses_general(3072, [x, temb[:, :, 2], temb[:, :, 0]], [v[:3072], v[4:3076]])
    assert not mod.uses_general(3072, [temb[:, :1, 1].expand(2, 5, 3072)], [v[:3072]])  # per-batch broadcast
    assert mod.uses_general(3072, [x, torch.zeros(2, 5, 3080, dtype=bf16)[..., 1:3073]], [v[:3072]])
    assert mod.uses_general(3072, [x, torch.zeros(2, 5, 3076, dtype=bf16)[..., :3072]], [v[:3072]])  # row stride
    assert mod.uses_general(3072, [x], [v[2:3074]])
    assert mod.uses_general(3001, [torch.zeros(2, 5, 3001, dtype=bf16)], [v[:3001]])


# ------------------------------------------------------------------------------------------------ validation

def _t(*shape, dtype=bf16):
    return torch.zeros(*shape, dtype=dtype)


X, G, V = _t(2, 4, 64), _t(2, 4, 64), _t(64, dtype=f32)


@pytest.mark.parametrize("fn, args, kw, arg", [
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (_t(8, 64), X, G, V, V), {}, "input"),
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (X.float(), X, G, V, V), {}, "input"),
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (X, _t(2, 4, 32), G, V, V), {}, "residual"),
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (X, X, G.float(), V, V), {}, "gate"),
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (X, X, G, V.to(bf16), V), {}, "gamma"),
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (X, X, G, V, _t(63, dtype=f32)), {}, "beta"),
    (mod.fused_dit_gate_residual_layernorm_gamma_beta, (X, X, G, V, V), {"gate_bias": _t(2, 64, dtype=f32)},
     "gate_bias"),
    (mod.fused_dit_gate_residual_layernorm_scale_shift, (X, X, G, G, G), {"use_nvfp4": True}, "use_nvfp4"),
    (mod.fused_dit_gate_residual_layernorm_scale_shift, (X, X, G, G, G), {"use_mxfp8": True}, "use_mxfp8"),
    (mod.fused_dit_gate_residual_layernorm_scale_shift, (X, X, G, _t(64, 4, 2).permute(2, 1, 0), G), {}, "scale"),
    (mod.fused_dit_residual_layernorm_scale_shift, (X, G, G), {"epsilon": "x"}, "epsilon"),
    (mod.fused_dit_residual_layernorm_scale_shift, (X, G, G), {"norm_out": _t(2, 4, 32)}, "norm_out"),
    (mod.fused_dit_residual_layernorm_scale_shift, (X, G, G), {"input_global_scaling_factor": _t(2, dtype=f32)},
     "input_global_scaling_factor"),
    (mod.fused_dit_residual_layernorm_scale_shift, (X, G, G), {}, "input"),  # CPU tensors
])
def test_rejected_inputs_name_the_argument(fn, args, kw, arg):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        fn(*args, **kw)


def test_protocol_literals():
    assert mod.KERNEL_META["name"] == "flashinfer_fused_dit_layernorm"
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    for mode in mod.MODES:  # b1 / b4 x rows {768, 1920} x 3072 for every mode (a cover)
        rows = [c for c in mod.CONFIGS if c["mode"] == mode and c["H"] == 3072]
        assert {1, 4} <= {c["B"] for c in rows} and {768, 1920} <= {c["R"] for c in rows}
    assert {c["mode"] for c in mod.CONFIGS} == set(mod.MODES)
    labels = [c["label"] for c in mod.BENCH_CONFIGS]
    assert {"rss_b1_r768", "grgb_b1_r1920", "grss_b4_r1920"} <= set(labels)


def test_oracle_matches_upstream_formulas():
    """The oracle against the formulas of FlashInfer's own test (torch.layer_norm on residual + input * gate)."""
    torch.manual_seed(0)
    B, R, H = 2, 3, 64
    x, res = torch.randn(B, R, H).to(bf16), torch.randn(B, R, H).to(bf16)
    g, sc, sh = torch.randn(B, R, H).to(bf16), torch.randn(B, R, H).to(bf16), torch.randn(B, R, H).to(bf16)
    gb, sb, hb, gamma, beta = (torch.randn(H) for _ in range(5))
    s = res.float() + x.float() * (g.float() + gb)
    ln = torch.layer_norm(s, [H], eps=1e-6)
    got = mod.reference("grgb", x, 1e-6, residual=res, gate=g, gate_bias=gb, gamma=gamma, beta=beta)
    torch.testing.assert_close(got["norm_out"], torch.layer_norm(s, [H], gamma, beta, 1e-6))
    torch.testing.assert_close(got["residual_out"], s.to(bf16).float())
    got = mod.reference("grss", x, 1e-6, residual=res, gate=g, gate_bias=gb, scale=sc, shift=sh, scale_bias=sb,
                        shift_bias=hb)
    torch.testing.assert_close(got["norm_out"], ln * (1 + sc.float() + sb) + sh.float() + hb)
    got = mod.reference("rss", x, 1e-6, scale=sc, shift=sh)
    torch.testing.assert_close(got["norm_out"], torch.layer_norm(x.float(), [H], eps=1e-6) * (1 + sc.float()) +
                               sh.float())


# ------------------------------------------------------------------------------------------------ CPU emulation

def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a token group of < 32 lanes gets the same butterfly
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


def _grid(params, B, R):  # noqa: N803
    if params.get("schedule") == "general":
        return (B * R,), (mod.GENERAL_THREADS,)
    p = layernorm.row_plan(params["H"])
    return (-(-B * R // p["rows_per_cta"]),), (p["threads_per_row"] * p["rows_per_cta"],)


def _tokens(B, R, H, off, pad, g, fill=None):  # noqa: N803
    """A [B, R, H] view at element ``off`` of a buffer of rows ``H + pad`` that ends with its last element."""
    n = off + B * R * (H + pad)
    buf = (torch.randn(n, generator=g) if fill is None else torch.full((n,), fill)).to(bf16)
    return buf, buf.as_strided((B, R, H), (R * (H + pad), H + pad, 1), off)


def _check(kern, params, mode, B, R, H, *, off=0, pad=0, residual=True, per_batch=False, scale=None,  # noqa: N803
           in_place=False, vec_off=0, no_off=None):
    g = torch.Generator().manual_seed(B * 1000 + R * 10 + H)
    xb, x = _tokens(B, R, H, off, pad, g)
    rb, res = _tokens(B, R, H, off, pad, g)
    temb = torch.randn(B * (1 if per_batch else R) * 6 * H, generator=g).to(bf16)
    chunk = [temb.view(B, -1, 6, H)[:, :, k].expand(B, R, H) for k in range(6)]
    vecs = [torch.randn(vec_off + H, generator=g)[vec_off:] for _ in range(3)]
    isf = torch.full((1,), 1.0 if scale is None else scale)
    if in_place:
        rob, ro = rb, res
    else:
        rob, ro = _tokens(B, R, H, off, pad, g, float("nan"))
    nob, no = _tokens(B, R, H, off if no_off is None else no_off, pad, g, float("nan"))
    kw = {"residual": res if residual else None,
          "input_global_scaling_factor": None if scale is None else isf}
    if mode in ("grgb", "grss"):
        kw.update(gate=chunk[2], gate_bias=vecs[0])
    if mode == "grgb":
        kw.update(gamma=vecs[1], beta=vecs[2])
    else:
        kw.update(scale=chunk[1], shift=chunk[0], scale_bias=vecs[1], shift_bias=vecs[2])
    want = mod.reference(mode, x.clone(), 1e-6, **{k: (v.clone() if v is not None else None) for k, v in kw.items()})
    before = {"x": xb.clone(), "temb": temb.clone(), "r": rb.clone()}
    ptrs = {"X_ptr": x, "Rs_ptr": res if residual else x, "Gt_ptr": kw.get("gate", x), "Sc_ptr": kw.get("scale", x),
            "Sh_ptr": kw.get("shift", x), "GB_ptr": vecs[0], "W1_ptr": vecs[1], "W2_ptr": vecs[2], "Isf_ptr": isf,
            "RO_ptr": ro, "NO_ptr": no}
    ts = {"X": x, "Rs": ptrs["Rs_ptr"], "Gt": ptrs["Gt_ptr"], "Sc": ptrs["Sc_ptr"], "Sh": ptrs["Sh_ptr"], "RO": ro,
          "NO": no}
    names = {"X": ("xb", "xr"), "Rs": ("rb", "rr"), "Gt": ("gbs", "grs"), "Sc": ("scb", "scr"), "Sh": ("shb", "shr"),
             "RO": ("rob", "ror"), "NO": ("nob", "nor")}
    scalars = {"B": B, "R": R, "H": H, "eps": 1e-6, "has_residual": int(residual), "zero": 0, "cse_v1": B * R}
    for k, (sb, sr) in names.items():
        scalars[sb], scalars[sr] = ts[k].stride(0), ts[k].stride(1)
    named = {p.name: ptrs[p.name] if p.pointer else scalars[p.name] for p in kern.params}
    grid, block = _grid(params, B, R)
    kern(grid=grid, block=block, **named).check()
    torch.testing.assert_close(ro.float(), want["residual_out"], atol=0, rtol=0)
    torch.testing.assert_close(no.float(), want["norm_out"], atol=5e-2, rtol=1.6e-2)
    for buf, view in ((rob, ro), (nob, no)):
        inside = torch.zeros_like(buf, dtype=torch.bool)
        inside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
        if not (in_place and buf is rob):
            assert buf[~inside].isnan().all()
        else:
            assert torch.equal(buf[~inside], before["r"][~inside])
    assert torch.equal(xb, before["x"]) and torch.equal(temb, before["temb"])
    if not in_place:
        assert torch.equal(rb, before["r"])


@pytest.mark.parametrize("mode", ["grgb", "rss", "grss"])
@pytest.mark.parametrize("B, R, H, kw", [
    (1, 5, 3072, {}), (2, 3, 3072, {"per_batch": True}), (2, 7, 128, {}), (3, 3, 24, {"pad": 8}),
    (1, 2, 16384, {}), (2, 2, 3072, {"residual": False, "scale": 0.5}), (1, 3, 1024, {"in_place": True}),
])
def test_specialized_kernel_emulated(emulated, mode, B, R, H, kw):
    params = mod.compile_params(mode=mode, H=H)
    assert "schedule" not in params
    _check(emulated(params), params, mode, B, R, H, **kw)


@pytest.mark.parametrize("mode", ["grgb", "rss", "grss"])
@pytest.mark.parametrize("B, R, H, kw", [
    (2, 3, 129, {}), (1, 2, 1, {}), (2, 2, 1000, {"off": 1, "pad": 3, "vec_off": 1, "no_off": 4}),
    (1, 3, 3072, {"per_batch": True, "scale": 2.0}), (2, 2, 257, {"residual": False, "in_place": False}),
    (1, 2, 77, {"in_place": True, "off": 5, "pad": 1, "no_off": 2}),
    # x held in registers up to 4096 elements: both sides
    (1, 2, 4096, {"off": 3, "no_off": 1, "in_place": True}), (2, 1, 4097, {"in_place": True, "off": 1}),
])
def test_general_kernel_emulated(emulated, mode, B, R, H, kw):
    params = mod.general_params({"mode": mode})
    _check(emulated(params), params, mode, B, R, H, **kw)


@pytest.mark.parametrize("params", [{"mode": "grss", "H": 3072}, {"mode": "grgb", "H": 3072},
                                    {"mode": "rss", "H": 16384}, {"mode": "rss", "H": 128},
                                    {"mode": "grss", "schedule": "general"}])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "flashinfer_fused_dit_layernorm", params)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("H", [1, 8, 129, 1000, 3072, 4096])
def test_gpu_views_in_place_and_compile(H):
    """Token rows padded and at element offsets, residual_out over residual, [1, H] biases, torch.compile.
    residual_out within upstream's tolerance: the GPU forms x in one FMA (as upstream), the oracle in two roundings."""
    torch.manual_seed(H)
    B, R = 2, 9
    buf = torch.randn(B, R, H + 5, device="cuda").to(bf16)
    x = buf[..., 1:H + 1]
    res = torch.randn(B, R, H, device="cuda").to(bf16)
    temb = torch.randn(B, R, 6, H, device="cuda").to(bf16)
    sb, hb = torch.randn(1, H, device="cuda"), torch.randn(H, device="cuda")
    want = mod.reference("rss", x, 1e-6, residual=res, scale=temb[:, :, 1], shift=temb[:, :, 0], scale_bias=sb[0],
                         shift_bias=hb)
    ro, no = mod.fused_dit_residual_layernorm_scale_shift(x, temb[:, :, 1], temb[:, :, 0], residual=res,
                                                          scale_bias=sb, shift_bias=hb, residual_out=res)
    torch.cuda.synchronize()
    assert ro is res
    torch.testing.assert_close(ro.float(), want["residual_out"], atol=1e-5, rtol=1.6e-2)
    torch.testing.assert_close(no.float(), want["norm_out"], atol=5e-2, rtol=1.6e-2)
    x2 = torch.randn(B, R, H, device="cuda").to(bf16)
    fn = torch.compile(lambda a, b, c, d, e: mod.fused_dit_gate_residual_layernorm_gamma_beta(a, b, c, d, e),
                       fullgraph=True)
    g, gamma, beta = temb[:, :, 2], torch.randn(H, device="cuda"), torch.randn(H, device="cuda")
    ro, no = fn(x2, res, g, gamma, beta)
    want = mod.reference("grgb", x2, 1e-6, residual=res, gate=g, gamma=gamma, beta=beta)
    torch.testing.assert_close(ro.float(), want["residual_out"], atol=1e-5, rtol=1.6e-2)
    torch.testing.assert_close(no.float(), want["norm_out"], atol=5e-2, rtol=1.6e-2)


@gpu
def test_gpu_matches_flashinfer():
    pytest.importorskip("flashinfer")
    for label in ("grgb_b2_r768", "rss_noresidual_b2_r768", "grss_b2_r1920"):
        cfg = next(c for c in mod.CONFIGS if c["label"] == label)
        res = mod.run_test(**cfg)["references"]["flashinfer"]
        assert res["status"] == "passed", res


def test_harness_wiring_on_cpu():
    """The protocol pieces the harness combines (reference keys, None inputs, two poisoned outputs) on CPU."""
    import types

    from tirx_kernels.core import harness

    def prepare_data(mode, B, R, H, eps=1e-6, residual=True, **_):  # noqa: N803
        temb = torch.randn(B, R, 6, H).to(bf16)
        d = {"mode": mode, "eps": eps, "input": torch.randn(B, R, H).to(bf16),
             "residual": torch.randn(B, R, H).to(bf16) if residual else None, "scale": temb[:, :, 1],
             "shift": temb[:, :, 0], "scale_bias": torch.randn(H), "shift_bias": torch.randn(H)}
        d["residual_out"] = torch.full((B, R, H), float("nan"), dtype=bf16)
        d["norm_out"] = torch.full((B, R, H), float("nan"), dtype=bf16)
        return d

    def launch(cfg, data):
        for k, v in mod.reference(**data).items():
            data[k].copy_(v)

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, reference=mod.reference, prepare_data=prepare_data,
                                 launch=launch, get_baselines=lambda **cfg: {})
    for cfg in ({"mode": "rss", "B": 2, "R": 3, "H": 64}, {"mode": "rss", "B": 1, "R": 5, "H": 33,
                                                            "residual": False}):
        assert harness.check_config(fake, cfg)["status"] == "passed"
