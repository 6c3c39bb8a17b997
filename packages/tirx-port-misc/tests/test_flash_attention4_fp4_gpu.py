# SPDX-License-Identifier: Apache-2.0
"""flash_attention4_fp4 on the GPU (sm_90a): the issue's odd shapes (ragged 1, 17, 127, 8193; GQA ratios 1..16; every
K/V format; both head dims) against the fp32 oracle with the FP8 bounds (``_fwd_fp8_check``), torch SDPA (bf16 on the
dequantized inputs) as a second opinion, empty keys, given outputs, and the pre-pass's cost at s8192 (printed: run with
-s). The registered CONFIGS run through test_gpu.py's harness checks. Skips with the reason elsewhere."""


import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


def _mod():
    testing.load_or_skip("flash_attention4_fp4")
    from tirx_kernels.ported.flashattention import flash_attention4_fp4 as m

    return m


def _call(m, data, **kw):
    keys = ("q_descale", "k_descale", "v_descale", "kv_format", "k_scale", "v_scale", "k_global_scale",
            "v_global_scale")
    return m.flash_attn_fp8_func(data["q"], data["k"], data["v"], causal=data["causal"],
                                 softmax_scale=data["softmax_scale"], **{n: data[n] for n in keys}, **kw)


def _check(m, data, out, lse):
    from tirx_kernels.ported.flashattention import _fwd_fp8_check

    return _fwd_fp8_check.check_outputs(out, lse, m.kernel_inputs(**data), data["softmax_scale"], data["causal"])


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("kv_format", ["e4m3", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 17), (127, 127), (1, 8193), (17, 127), (127, 17), (8193, 8193)])
@pytest.mark.parametrize("causal", [False, True])
def test_odd_lengths_against_the_oracle(d, kv_format, sq, sk, causal):
    m = _mod()
    torch.manual_seed(sq * 31 + sk)
    data = m.prepare_data(B=1, Sq=sq, Sk=sk, Hq=4, Hkv=2, D=d, causal=causal, kv_format=kv_format)
    out, lse = _call(m, data)
    _check(m, data, out, lse)


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_ratios_against_sdpa(ratio, causal):
    """The oracle's bounds, and torch SDPA in bf16 on the same dequantized inputs within the P rounding's average."""
    m = _mod()
    torch.manual_seed(ratio)
    data = m.prepare_data(B=2, Sq=300, Sk=300, Hq=2 * ratio, Hkv=2, D=128, causal=causal)
    out, lse = _call(m, data)
    stats = _check(m, data, out, lse)
    assert stats["out"]["rel_fro"] < 0.03, stats
    fn = m.get_baselines(B=2, Sq=300, Sk=300, Hq=2 * ratio, Hkv=2, D=128, causal=causal)["sdpa_flash"]()
    ref = fn(data)["out"].float()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 0.03


def test_given_outputs_and_empty_keys():
    m = _mod()
    data = m.prepare_data(B=2, Sq=130, Sk=130, Hq=4, Hkv=4, D=128, causal=True)
    out, lse = torch.empty_like(data["out"]), torch.empty_like(data["lse"])
    got = _call(m, data, out=(out, lse))
    assert got[0] is out and got[1] is lse
    _check(m, data, out, lse)
    q, k = data["q"][:1, :5], data["k"][:1, :0]  # no key: out 0, lse -inf, no launch
    o, l_ = m.flash_attn_fp8_func(q, k, k, q_descale=data["q_descale"][:1], k_descale=data["k_descale"][:1],
                                  v_descale=data["v_descale"][:1])
    assert (o == 0).all() and torch.isinf(l_).all() and (l_ < 0).all()


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sk", [1, 17, 8193])
def test_transpose_v_kernel_matches_the_torch_prepass(d, sk):
    m = _mod()
    from tirx_kernels.ported.flashattention import _fwd_fp8_prepass as prepass

    v = torch.randint(0, 255, (2, sk, 2, 3, d), dtype=torch.uint8, device="cuda")[:, :, 1].view(torch.float8_e4m3fn)
    assert torch.equal(m._transpose_v(v), prepass.transpose_v(v).view(torch.uint8))


@pytest.mark.parametrize("label", ["e4m3_b2_h4_s1000_d128_causal", "nvfp4_b2_h4kv2_s1000_d128_causal"])
def test_cuda_graph_replay_with_new_inputs(label):
    """The op (pre-pass and kernels) captured in a CUDA graph, replayed on refilled inputs, checked again."""
    testing.check_graph_replay("flash_attention4_fp4", label)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("kv_format", ["nvfp4", "mxfp8"])
def test_requant_kernel_matches_the_torch_prepass(kv_format, d):
    m = _mod()
    from tirx_kernels.ported.flashattention import _fwd_fp8_prepass as prepass

    torch.manual_seed(d)
    x = torch.randn(2, 8193, 3, d, device="cuda") * torch.tensor([1e-3, 1.0, 50.0], device="cuda")[:, None]
    enc = m.encode_kv(x, kv_format)
    got, got_descale = m._requantize_kv(enc["data"], kv_format, enc["scale"], enc["global_scale"])
    want, want_descale = prepass.dequantize_kv(enc["data"], kv_format, enc["scale"], enc["global_scale"])
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) and torch.equal(got_descale, want_descale)


def test_torch_compile_fullgraph():
    """The pre-pass traces as torch ops, the kernel as the ``tirx::flash_attention4_fp4`` custom op."""
    m = _mod()
    data = m.prepare_data(B=1, Sq=200, Sk=300, Hq=4, Hkv=2, D=128, causal=True, kv_format="nvfp4")
    eager = _call(m, data)
    compiled = torch.compile(lambda d: _call(m, d), fullgraph=True)(data)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_prepass_cost_at_s8192():
    """Times (printed; run with -s) the op's pre-pass at b2 h16 s8192 hd128 against the whole op: the V transpose
    kernel (every format), and the NVFP4 / MXFP8 decode + requantize of K and V before it."""
    m = _mod()

    def ms(fn, reps=10):
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps

    lines = []
    flops = 4 * 2 * 16 * 8192 * 8192 * 128
    for fmt in ("e4m3", "nvfp4", "mxfp8"):
        data = m.prepare_data(B=2, Sq=8192, Sk=8192, Hq=16, Hkv=16, D=128, kv_format=fmt)
        t_all = ms(lambda d=data: _call(m, d))
        t_req = 0.0 if fmt == "e4m3" else ms(lambda d=data: [m._requantize_kv(d[n], d["kv_format"], d[f"{n}_scale"],
                                                                                  d[f"{n}_global_scale"])
                                                              for n in ("k", "v")])
        inp = m.kernel_inputs(**data, with_vt=False)
        t_vt = ms(lambda i=inp: m._transpose_v(i["v"]))
        lines.append(f"{fmt}: op {t_all:.3f} ms ({flops / t_all / 1e9:.0f} TFLOP/s), of which V transpose "
                     f"{t_vt:.3f} ms, K/V requantization {t_req:.3f} ms; kernel alone "
                     f"{flops / (t_all - t_vt - t_req) / 1e9:.0f} TFLOP/s")
    print("\n" + "\n".join(lines))
    assert len(lines) == 3


@pytest.mark.parametrize("kv_format", ["nvfp4", "mxfp8"])
def test_no_keys_in_a_block_scaled_format(kv_format):
    m = _mod()
    data = m.prepare_data(B=1, Sq=5, Sk=1, Hq=2, Hkv=2, D=128, kv_format=kv_format)
    for n in ("k", "v", "k_scale", "v_scale"):
        data[n] = data[n][:, :0]
    out, lse = _call(m, data)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()
