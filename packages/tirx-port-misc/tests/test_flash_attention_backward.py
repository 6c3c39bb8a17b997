# SPDX-License-Identifier: Apache-2.0
"""flash_attention_backward_sm90 on the CPU: input validation, the fp32 oracle (autograd of the forward's oracle against
the backward's closed form in float64, with the given 16-bit ``out`` and a dLSE), the kernel's schedule facts that the
emulator cannot see at scale (every query block's key blocks add dQ exactly once, in an order that only waits for
CTAs launched earlier; the fragment-order dQ accumulator and its postprocess index map are inverse), the head-split
heuristic, params and bundle coverage, the forward op's autograd wiring (meta tensors), and the sm_90a build
(tensor cores for the five GEMMs, 4-D TMA, the bulk reduction, setmaxnreg, no spills). The GPU runs are in
test_flash_attention_backward_gpu.py; the emulated runs in test_flash_attention_backward_emulated.py."""

from __future__ import annotations

import random
import re

import pytest
import torch

from tirx_kernels.core import checks, harness
from tirx_kernels.ported.flashattention import _bwd_kernel, _bwd_kernel_wide
from tirx_kernels.ported.flashattention import flash_attention4 as fwd
from tirx_kernels.ported.flashattention import flash_attention_backward as mod


def _t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def _args(B=1, Sq=8, Sk=8, Hq=2, Hkv=2, D=64, Dv=64, dtype=torch.bfloat16):  # noqa: N803
    q, k, v = _t(B, Sq, Hq, D, dtype=dtype), _t(B, Sk, Hkv, D, dtype=dtype), _t(B, Sk, Hkv, Dv, dtype=dtype)
    out, dout = _t(B, Sq, Hq, Dv, dtype=dtype), _t(B, Sq, Hq, Dv, dtype=dtype)
    return [q, k, v, out, dout, torch.randn(B, Hq, Sq)]


def _with(i, x):
    a = _args()
    a[i] = x
    return a


# ------------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("args, kwargs, arg", [
    (_with(0, _t(1, 8, 2, 64).float()), {}, "q"),
    (_with(1, _t(1, 8, 2, 64, dtype=torch.float16)), {}, "k"),
    (_with(2, _t(1, 9, 2, 64)), {}, "v"),
    (_args(D=80, Dv=80), {}, "q"),
    (_args(D=128, Dv=64), {}, "v"),
    (_args(Hq=6, Hkv=4), {}, "k"),
    (_with(3, _t(1, 8, 2, 32)), {}, "out"),
    (_with(4, _t(1, 8, 3, 64)), {}, "dout"),
    (_with(5, torch.randn(1, 2, 8).half()), {}, "lse"),
    (_with(5, torch.randn(1, 8, 2)), {}, "lse"),
    (_args(), {"dlse": torch.randn(1, 2, 9)}, "dlse"),
    (_args(), {"dq": _t(1, 8, 2, 32)}, "dq"),
    (_args(), {"dk": _t(1, 8, 2, 64).transpose(1, 2).contiguous().transpose(1, 2)}, "dk"),
    (_args(), {"softmax_scale": float("inf")}, "softmax_scale"),
    (_args(), {}, "q"),  # valid, but on the CPU
])
def test_invalid_inputs_name_the_argument(args, kwargs, arg):
    with pytest.raises(checks.TirxInputError, match=re.escape(f"argument '{arg}'")):
        mod.flash_attn_backward(*args, **kwargs)


@pytest.mark.parametrize("kwargs, arg", [
    ({"window_size": (128, 0)}, "window_size"),
    ({"softcap": 30.0}, "softcap"),
    ({"learnable_sink": torch.zeros(2)}, "learnable_sink"),
])
def test_unimplemented_arguments_raise_naming_them(kwargs, arg):
    with pytest.raises(NotImplementedError, match=re.escape(f"argument '{arg}'")):
        mod.flash_attn_backward(*_args(), **kwargs)


# ------------------------------------------------------------------------------------------------ the oracle

def _closed_form(q, k, v, out, dout, dlse, scale, causal):
    """The flash backward in float64 from the op's inputs: P from the exact LSE, delta = rowsum(dO * out) - dLSE,
    dS = P (dP - delta), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO (GQA: summed over the group)."""
    B, Sq, Hq, _ = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    qd = q.double().transpose(1, 2)
    kd = k.double().transpose(1, 2).repeat_interleave(g, 1)
    vd = v.double().transpose(1, 2).repeat_interleave(g, 1)
    od, gd = out.double().transpose(1, 2), dout.double().transpose(1, 2)
    s = qd @ kd.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.arange(Sk)[None, :] > torch.arange(Sq)[:, None] + (Sk - Sq), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num()
    delta = (od * gd).sum(-1, keepdim=True) - (0 if dlse is None else dlse.double()[..., None])
    ds = p * (gd @ vd.transpose(-1, -2) - delta)
    dq = scale * ds @ kd
    dk = (scale * ds.transpose(-1, -2) @ qd).reshape(B, Hkv, g, Sk, -1).sum(2)
    dv = (p.transpose(-1, -2) @ gd).reshape(B, Hkv, g, Sk, -1).sum(2)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


@pytest.mark.parametrize("sq, sk, hq, hkv, causal, with_dlse", [
    (37, 37, 2, 2, False, False), (37, 37, 4, 1, True, True), (20, 50, 4, 2, True, False), (50, 20, 2, 2, True, True),
])
def test_oracle_autograd_matches_the_closed_form(sq, sk, hq, hkv, causal, with_dlse):
    torch.manual_seed(0)
    q, k, v = _t(2, sq, hq, 64), _t(2, sk, hkv, 64), _t(2, sk, hkv, 64)
    scale = 0.125
    out = fwd.attention_fp32(q, k, v, scale, causal)[0].to(torch.bfloat16)  # the 16-bit output a backward is given
    dout = _t(2, sq, hq, 64)
    dlse = torch.randn(2, hq, sq) if with_dlse else None
    got = mod.attention_grads_fp32(q, k, v, dout, scale, causal, dlse, out=out)
    want = _closed_form(q, k, v, out, dout, dlse, scale, causal)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sq, sk, hq, hkv, causal, with_dlse",
                         [(37, 37, 4, 1, True, True), (50, 20, 2, 2, True, False)])
def test_low_precision_yardstick_is_the_oracle_in_fp32_and_bf16_sized_in_bf16(sq, sk, hq, hkv, causal, with_dlse):
    """The yardstick the gradient comparators use: in fp32 it is the oracle (dlse, GQA, causal rows that see no key
    included); in bf16 its error is of bf16 size, and the comparator refuses a gradient with one element off."""
    torch.manual_seed(1)
    q, k, v, dout = (_t(*shape).float() for shape in ((2, sq, hq, 64), (2, sk, hkv, 64), (2, sk, hkv, 64),
                                                       (2, sq, hq, 64)))
    dlse = torch.randn(2, hq, sq) if with_dlse else None
    exact = fwd.attention_fp32(q, k, v, 0.125, causal)[0]
    want = mod.attention_grads_fp32(q, k, v, dout, 0.125, causal, dlse, out=exact)
    for g, w in zip(mod.attention_grads_low_precision(q, k, v, dout, 0.125, causal, dlse), want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    qb, kb, vb, db = (x.bfloat16() for x in (q, k, v, dout))
    lowp = mod.attention_grads_low_precision(qb, kb, vb, db, 0.125, causal, dlse)
    want = mod.attention_grads_fp32(qb, kb, vb, db, 0.125, causal, dlse, out=exact.bfloat16())
    for name, lp, w in zip(("dq", "dk", "dv"), lowp, want):
        stats = harness.compare_to_low_precision(name, w.bfloat16(), w, lp, "the oracle")  # the oracle, rounded
        assert 1e-4 < stats["rel_fro_low_precision"] < 2e-2
        bad = w.contiguous().clone()
        bad.view(-1)[7] += 10 * stats["max_abs_low_precision"] + 1.0
        with pytest.raises(harness.KernelCheckError, match="max_abs"):
            harness.compare_to_low_precision(name, bad, w, lp, "the oracle")


# ------------------------------------------------------------------------------------------------ the schedule

@pytest.mark.parametrize("sq, sk, bm, bn, causal", [
    (1000, 1000, 64, 128, True), (300, 700, 128, 128, True), (700, 300, 64, 128, True), (1, 513, 64, 128, True),
    (257, 300, 128, 128, False), (1000, 1000, 64, 64, True), (130, 70, 64, 64, True)])
def test_every_query_block_gets_each_touching_key_block_once_in_launch_order(sq, sk, bm, bn, causal):
    """The main kernels' walk (``m_first``) and their deterministic order (``dq_order``), in Python: for every query
    block, the key blocks that add to it are exactly those whose keys a row of it sees, their turns are 0 .. n - 1,
    and a turn's predecessor is the CTA launched just before it (``first_block``): no CTA waits for a later one."""
    n_blocks, m_blocks = -(-sk // bn), -(-sq // bm)
    launch_of = {}
    adds = {m: {} for m in range(m_blocks)}
    for bx in range(n_blocks):
        n = n_blocks - 1 - bx if causal else bx  # deterministic mapping
        launch_of[n] = bx
        first = max(n * bn - (sk - sq), 0) // bm if causal else 0
        for m in range(first, m_blocks):
            touching = min(n_blocks, ((m + 1) * bm + (sk - sq) + bn - 1) // bn) if causal else n_blocks
            adds[m][n] = touching - 1 - n if causal else n
    for m, turns in adds.items():
        rows = range(m * bm, min(sq, (m + 1) * bm))
        sees = {n for n in range(n_blocks) for i in rows
                if any(j <= i + sk - sq or not causal for j in range(n * bn, min(sk, (n + 1) * bn)))}
        assert sees <= set(turns), (m, sees, turns)
        assert sorted(turns.values()) == list(range(len(turns))), (m, turns)
        by_turn = sorted(turns, key=turns.get)
        assert all(launch_of[a] < launch_of[b] for a, b in zip(by_turn, by_turn[1:])), (m, by_turn)


@pytest.mark.parametrize("block_m, dp", [(128, 64), (64, 128)])
def test_dq_accumulator_layout_round_trips(block_m, dp):
    """Consumer w's wgmma fragment (register 4 i + 2 r + e of thread t: row 16 warp + lane / 4 + 8 r, column 8 i +
    2 (lane % 4) + e of its part) at float ``w * half + (i * 128 + t) * 4 + 2 r + e``, and the postprocess's inverse
    of it: every (row, column) of the query block exactly once."""
    dq_n = dp if block_m == 128 else dp // 2
    half = block_m * dp // 2
    seen = {}
    for w in range(2):
        for t in range(128):
            warp, lane = t // 32, t % 32
            for i in range(dq_n // 8):
                for r in range(2):
                    for e in range(2):
                        row = (64 * w if block_m == 128 else 0) + warp * 16 + lane // 4 + 8 * r
                        col = (0 if block_m == 128 else w * dp // 2) + 8 * i + 2 * (lane % 4) + e
                        seen[(row, col)] = w * half + (i * 128 + t) * 4 + 2 * r + e
    assert len(seen) == block_m * dp and sorted(seen.values()) == list(range(block_m * dp))


def test_head_splits_fill_the_gpu_and_divide_the_group():
    assert mod.head_splits(2, 8192, 16, 16, causal=True) == 1  # MHA: never split
    assert mod.head_splits(2, 65536, 16, 2) == 1  # 512 key blocks x 2 x 2: enough CTAs
    assert mod.head_splits(2, 8192, 16, 2) == 2  # 256 CTAs < 2 per SM
    assert mod.head_splits(2, 8192, 16, 2, causal=True) == 4  # causal: 4 per SM
    assert mod.head_splits(1, 1000, 16, 1) == 16  # 8 key blocks: one CTA per query head
    assert mod.head_splits(1, 1000, 12, 1, block_n=64) == 12
    s = mod.head_splits(1, 4096, 32, 4, sm_count=78)
    assert 8 % s == 0 and 32 * 4 * s >= 2 * 78


def test_every_supported_head_dim_pair_fits_registers_and_smem():
    pytest.importorskip("tvm", reason="the kernel modules build TIRx")
    for d, dv in mod.HEAD_DIMS:
        if max(d, dv) > 128:
            _bwd_kernel_wide.check_shape(d, dv)
        else:
            _bwd_kernel.check_shape(d, dv, _bwd_kernel.block_m_for(d))
    with pytest.raises(ValueError, match="multiple of 16"):
        _bwd_kernel.check_shape(256, 256, 64)
    assert _bwd_kernel_wide.smem_bytes(256, 256) <= _bwd_kernel.SMEM_LIMIT


def test_call_samples_resolve_to_artifacts():
    built = {tuple(sorted(p.items())) for p in mod.artifact_params()}
    rows = [{**mod.DEFAULTS, **c} for c in mod.CONFIGS]
    for cfg in mod.call_samples(random.Random(0)) + rows:
        params = mod.compile_params(**cfg)
        assert tuple(sorted(params.items())) in built, params
    for kernel in ("pre", "post", "reduce"):
        assert tuple(sorted(mod._params(kernel, "float16").items())) in built


def test_roofline_is_two_and_a_half_forwards():
    fwd_flops = fwd.roofline(B=1, Sq=64, Sk=64, Hq=1, Hkv=1, D=128, causal=True)["flops"]
    assert mod.roofline(B=1, Sq=64, Sk=64, Hq=1, Hkv=1, D=128, causal=True)["flops"] == 2.5 * fwd_flops


# ------------------------------------------------------------------------------------------------ autograd wiring

def test_the_forward_op_differentiates_through_the_backward_op():
    """On meta tensors (no GPU needed): the autograd of tirx::flash_attention4 (what flash_attn_func calls under
    autograd) runs tirx::flash_attention_backward, whose shapes reach q, k, v (GQA), the LSE's gradient included."""
    q = torch.empty(2, 33, 8, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k = torch.empty(2, 40, 2, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    v = torch.empty(2, 40, 2, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    out, lse = torch.ops.tirx.flash_attention4(q, k, v, 0.125, True)
    (out.float().sum() + lse.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


# ------------------------------------------------------------------------------------------------ the build

# One representative build per schedule in CI, both in one nvcc call (~30 s of the 2-core machine); `python -m
# tirx_kernels.build --kernel flash_attention_backward_sm90 --all` builds every artifact.
_BUILDS = [mod._params("main", "bfloat16", 128, 128, True), mod._params("main", "bfloat16", 256, 256, True)]


def test_builds_for_sm90a_with_tensor_cores_and_tma():
    pytest.importorskip("tvm")
    from tirx_kernels.core import artifacts, build, testing

    if build.cuobjdump() is None:
        pytest.skip("cuobjdump not installed")
    artifacts.build_cached_many(mod, "flash_attention_backward_sm90", _BUILDS)
    for params in _BUILDS:  # cached now: no spills, the five GEMMs on the tensor cores, TMA, dQ reduction
        sass = testing.build_and_check_sass(mod, "flash_attention_backward_sm90", params)
        assert "MUFU.EX2" in sass  # P = exp2(...): one FFMA + MUFU per score
