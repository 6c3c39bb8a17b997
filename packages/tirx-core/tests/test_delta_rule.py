# SPDX-License-Identifier: Apache-2.0
"""The delta-rule decode template's oracle (core.delta_rule_ref): gate forms, pool addressing (padding tokens,
num_accepted clamping, a source pool), written out by hand; the template's schedule validation. The kernels built
on it (KDA decode: flashinfer.kda, native kda) are emulated against this oracle in their packages' tests."""

import pytest
import torch

from tirx_kernels.core import delta_rule_ref as ref


def _inputs(batch=2, T=3, H=1, HV=2, slots=12, seed=0):  # noqa: N803
    g = torch.Generator().manual_seed(seed)

    def rn(*s, scale=1.0):
        return torch.randn(*s, generator=g) * scale
    return dict(pool=rn(slots, HV, 128, 128, scale=0.3).bfloat16(), q=rn(batch, T, H, 128).bfloat16(),
                k=rn(batch, T, H, 128).bfloat16(), v=rn(batch, T, HV, 128).bfloat16(),
                g=(rn(batch, T, HV, 128, scale=0.05) - 0.02).bfloat16(),
                beta=torch.rand(batch, T, HV, generator=g).bfloat16(), scale=128 ** -0.5)


def _step(S, q, k, v, gate, beta, scale):
    q = q / torch.sqrt((q * q).sum() + 1e-6) * scale
    k = k / torch.sqrt((k * k).sum() + 1e-6)
    S = S * gate[None, :]
    S = S + beta * torch.outer(v - S @ k, k)
    return S, S @ q


def test_gate_forms():
    g = torch.linspace(-30, 30, 128).repeat(1, 1, 2, 1).bfloat16()  # (1, 1, HV=2, 128)
    a_log, bias = torch.tensor([0.3]), torch.linspace(-1, 1, 128)
    x = g.float() + bias
    torch.testing.assert_close(ref.gate(g, "log"), torch.exp(g.float()))
    sp = torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    torch.testing.assert_close(ref.gate(g, "softplus", a_log, bias), torch.exp(-torch.exp(a_log) * sp))
    torch.testing.assert_close(ref.gate(g, "lower_bound", a_log, bias, -5.0),
                               torch.exp(-5.0 * torch.sigmoid(torch.exp(a_log) * x)))
    with pytest.raises(ValueError, match="gate_mode"):
        ref.gate(g, "scalar", a_log)


def test_checkpoints_padding_and_num_accepted():
    d = _inputs()
    slots = torch.tensor([[3, -1, 5], [7, 8, 9]], dtype=torch.int32)
    nacc = torch.tensor([0, 9])  # entry 0 reads column 0 (clamped up), entry 1 column 2 (clamped down)
    out, pool = ref.decode(d["pool"], d["q"], d["k"], d["v"], d["g"], d["beta"], slots, d["scale"],
                           num_accepted=nacc)
    for n, col in ((0, 0), (1, 2)):
        for hv in range(2):
            S = d["pool"][int(slots[n, col]), hv].float()
            for t in range(3):
                if slots[n, t] < 0:
                    assert out[n, t, hv].abs().max() == 0
                    continue
                S, o = _step(S, d["q"][n, t, 0].float(), d["k"][n, t, 0].float(), d["v"][n, t, hv].float(),
                             torch.exp(d["g"][n, t, hv].float()), d["beta"][n, t, hv].float(), d["scale"])
                torch.testing.assert_close(out[n, t, hv], o, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(pool[int(slots[n, t]), hv].float(), S, atol=1e-4, rtol=8e-3)
    untouched = [s for s in range(12) if s not in (3, 5, 7, 8, 9)]
    assert torch.equal(pool[untouched], d["pool"][untouched])


def test_source_pool_and_negative_read_slot():
    d = _inputs(T=1)
    source = torch.randn(3, 2, 128, 128).bfloat16()
    slots = torch.tensor([[4], [6]], dtype=torch.int32)
    out, pool = ref.decode(d["pool"], d["q"], d["k"], d["v"], d["g"], d["beta"], slots, d["scale"],
                           source=source, source_index=torch.tensor([2, -1]))
    for n, src in ((0, 2), (1, 0)):  # a negative source index reads slot 0
        S, o = _step(source[src, 1].float(), d["q"][n, 0, 0].float(), d["k"][n, 0, 0].float(),
                     d["v"][n, 0, 1].float(), torch.exp(d["g"][n, 0, 1].float()), d["beta"][n, 0, 1].float(),
                     d["scale"])
        torch.testing.assert_close(out[n, 0, 1], o, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(pool[int(slots[n, 0]), 1].float(), S, atol=1e-4, rtol=8e-3)


def test_schedule_validation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to trace the template")
    from tirx_kernels.core.lang import delta_rule as dr

    for bad in ((9, 32, 2, 1), (1, 32, 3, 1), (1, 24, 4, 1), (1, 8, 2, 1)):
        with pytest.raises(ValueError, match="delta_rule decode"):
            dr.build_decode_kernel(*bad)
