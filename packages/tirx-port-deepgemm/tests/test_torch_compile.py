# SPDX-License-Identifier: Apache-2.0
"""Every DeepGEMM public op traces under ``torch.compile(fullgraph=True)`` into its ``torch.library`` custom op (the
H100 run of 2026-12-06: dynamo stopped at ``data_ptr() % 16`` and ``c.data_ptr() != d.data_ptr()`` in the traced
Python). On CPU tensors, the CUDA check lifted and each module's launch (``_run``) stubbed: dynamo traces the public
op with fake tensors (so nothing it traces may read a pointer), the graph holds the op's custom op, and running the
compiled call reaches the op's eager body with the arguments the eager path passes (pointer-dependent decisions,
C's copy into D included, happen there)."""

import pytest
import torch

from tirx_kernels.core import checks
from tirx_kernels.ported.deepgemm import _fp8_cast as C
from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O


@pytest.fixture
def cpu_ops(monkeypatch):
    """Lift the CUDA-device check (the ops' own validation runs as on a GPU otherwise)."""
    real = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda *a, cuda=False, **k: real(*a, cuda=False, **k))


def _compile(fn):
    """``torch.compile(fn, fullgraph=True)`` with a backend that records the traced graphs' call targets."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend), targets


def _traced(targets, op: str) -> bool:
    """Whether the traced graph calls ``torch.ops.tirx.<op>`` (the packet or an overload of it)."""
    return any(t == f"tirx.{op}" or t.startswith(f"tirx.{op}.") for t in targets)


def _stub(monkeypatch, mod, calls, fill=None):
    def run(*args, **kwargs):
        calls.append(args)
        if fill is not None:
            fill(*args)

    monkeypatch.setattr(mod, "_run", run)


def _operands(M, N, K, G=None):  # noqa: N803
    x = torch.randn(*((G,) if G else ()), M, K).to(torch.bfloat16)
    w = torch.randn(*((G,) if G else ()), N, K).to(torch.bfloat16)
    return O.quantized_operands(x, w)


@pytest.mark.parametrize("with_c", [False, True])
def test_fp8_gemm_nt(cpu_ops, monkeypatch, with_c):
    from tirx_kernels.ported.deepgemm import fp8_gemm_1d2d as mod

    calls = []
    _stub(monkeypatch, mod, calls, lambda a, sfa, b, sfb, d, c: (O.c_into_d(c, d), d.add_(1)))
    a, sfa, b, sfb = _operands(40, 64, 256)
    sfa = sfa.contiguous()  # a layout the op's body transforms (eagerly, never while traced)
    c = torch.randn(40, 64).to(torch.bfloat16) if with_c else None
    fn, targets = _compile(lambda a, sfa, b, sfb, d, c: mod.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c))
    d = torch.zeros(40, 64, dtype=torch.bfloat16)
    fn(a, sfa, b, sfb, d, c)
    assert _traced(targets, "deepgemm_fp8_gemm_nt") and len(calls) == 1 and (calls[0][-1] is not None) is with_c
    assert torch.equal(d, (c if with_c else torch.zeros_like(d)) + 1)
    if with_c:  # c is d (DeepGEMM's in-place accumulate): no copy, the body accumulates onto D
        calls.clear()
        before = d.clone()
        fn(a, sfa, b, sfb, d, d)
        assert len(calls) == 1 and torch.equal(d, before + 1)


def test_fp8_gemm_nt_1d1d(cpu_ops, monkeypatch):
    from tirx_kernels.ported.deepgemm import fp8_gemm_1d1d as mod
    from tirx_kernels.ported.deepgemm import fp8_gemm_1d2d

    calls = []
    _stub(monkeypatch, mod, calls, lambda a, sfa, b, sfb, d, c: (O.c_into_d(c, d), d.add_(1)))
    a, sfa = C.per_token_ref(torch.randn(24, 256).to(torch.bfloat16))
    b, sfb = C.per_token_ref(torch.randn(32, 256).to(torch.bfloat16))
    c = torch.randn(24, 32)
    fn, targets = _compile(lambda a, sfa, b, sfb, d, c: fp8_gemm_1d2d.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c,
                                                                                  recipe=(1, 1, 128)))
    d = torch.zeros(24, 32)
    fn(a, sfa, b, sfb, d, c)
    assert _traced(targets, "deepgemm_fp8_gemm_nt_1d1d") and len(calls) == 1
    assert torch.equal(d, c + 1)


def test_m_grouped_contiguous(cpu_ops, monkeypatch):
    from tirx_kernels.ported.deepgemm import m_grouped_fp8_gemm_contiguous as mod

    calls = []
    _stub(monkeypatch, mod, calls, lambda a, sfa, b, sfb, d, layout: d.fill_(2))
    a, sfa, _, _ = _operands(256, 64, 256)
    _, _, b, sfb = _operands(1, 64, 256, G=2)
    layout = torch.tensor([0] * 128 + [1] * 100 + [-1] * 28, dtype=torch.int32)
    fn, targets = _compile(lambda a, sfa, b, sfb, d, layout: mod.m_grouped_fp8_gemm_nt_contiguous(
        (a, sfa), (b, sfb), d, layout))
    d = torch.zeros(256, 64, dtype=torch.bfloat16)
    fn(a, sfa, b, sfb, d, layout)
    assert _traced(targets, "deepgemm_m_grouped_fp8_gemm_nt_contiguous") and len(calls) == 1
    assert bool((d == 2).all())


def test_m_grouped_masked(cpu_ops, monkeypatch):
    from tirx_kernels.ported.deepgemm import m_grouped_fp8_gemm_masked as mod

    calls = []
    _stub(monkeypatch, mod, calls, lambda a, sfa, b, sfb, d, masked_m, expected_m: d.fill_(3))
    a, sfa, b, sfb = _operands(64, 64, 256, G=2)
    masked_m = torch.tensor([10, 64], dtype=torch.int32)
    fn, targets = _compile(lambda a, sfa, b, sfb, d, m: mod.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, m,
                                                                                           32))
    d = torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    fn(a, sfa, b, sfb, d, masked_m)
    assert _traced(targets, "deepgemm_m_grouped_fp8_gemm_nt_masked") and len(calls) == 1
    assert bool((d == 3).all())


@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped_contiguous(cpu_ops, monkeypatch, with_c):
    from tirx_kernels.ported.deepgemm import k_grouped_fp8_gemm_contiguous as mod

    calls = []
    _stub(monkeypatch, mod, calls,
          lambda a, sfa, b, sfb, d, ks, c: (d.zero_() if c is None else O.c_into_d(c, d), d.add_(1)))
    ks = [128, 256]
    m, n = 24, 32
    a, b = (torch.randn(sum(ks) * rows).to(O.E4M3) for rows in (m, n))  # each group's K-major block, flat
    sfa, sfb = torch.rand(m, sum(ks) // 128), torch.rand(n, sum(ks) // 128)
    layout = torch.tensor(ks, dtype=torch.int32)
    c = torch.randn(2, m, n) if with_c else None
    fn, targets = _compile(lambda a, sfa, b, sfb, d, layout, c: mod.k_grouped_fp8_gemm_nt_contiguous(
        (a, sfa), (b, sfb), d, ks, layout, c=c))
    d = torch.full((2, m, n), 7.0)
    fn(a, sfa, b, sfb, d, layout, c)
    assert _traced(targets, "deepgemm_k_grouped_fp8_gemm_nt_contiguous") and len(calls) == 1
    assert torch.equal(d, (c if with_c else torch.zeros_like(d)) + 1)


@pytest.mark.parametrize("cast", ["per_token", "per_block"])
def test_casts(cpu_ops, monkeypatch, cast):
    import importlib

    mod = importlib.import_module(f"tirx_kernels.ported.deepgemm.{cast}_cast_to_fp8")
    calls = []
    _stub(monkeypatch, mod, calls, lambda x, codes, sf, ue8m0: sf.fill_(0.5))
    fn, targets = _compile(lambda x: getattr(mod, f"{cast}_cast_to_fp8")(x))
    x = torch.randn(40, 256).to(torch.bfloat16)
    codes, sf = fn(x)
    assert _traced(targets, f"deepgemm_{cast}_cast_to_fp8") and len(calls) == 1
    assert codes.shape == (40, 256) and bool((sf == 0.5).all())


def test_fp8_einsum(cpu_ops, monkeypatch):
    from tirx_kernels.ported.deepgemm import fp8_bmm as mod

    calls = []
    _stub(monkeypatch, mod, calls, lambda x, sfx, y, sfy, z: z.fill_(5))
    xb, yb = torch.randn(20, 2, 256).to(torch.bfloat16), torch.randn(2, 64, 256).to(torch.bfloat16)
    x, sfx, y, sfy = mod.quantized_operands(xb, yb)
    sfx = sfx.contiguous()  # a layout the op's body transforms (eagerly)
    fn, targets = _compile(lambda x, sfx, y, sfy, z: mod.fp8_einsum("bhr,hdr->bhd", (x, sfx), (y, sfy), z))
    z = torch.zeros(20, 2, 64, dtype=torch.bfloat16)
    fn(x, sfx, y, sfy, z)
    assert _traced(targets, "deepgemm_fp8_einsum_bhr_hdr_bhd") and len(calls) == 1 and bool((z == 5).all())


@pytest.mark.parametrize("splits", [None, 4])
def test_tf32_hc_prenorm_gemm(cpu_ops, monkeypatch, splits):
    from tirx_kernels.ported.deepgemm import tf32_hc_prenorm_gemm as mod

    calls = []
    _stub(monkeypatch, mod, calls, lambda a, b, d, s, n: (d.fill_(1), s.fill_(2)))
    lead = () if splits is None else (splits,)
    fn, targets = _compile(lambda a, b, d, s: mod.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=splits))
    a, b = torch.randn(13, 128).to(torch.bfloat16), torch.randn(24, 128)
    d, s = torch.zeros(*lead, 13, 24), torch.zeros(*lead, 13)
    fn(a, b, d, s)
    assert _traced(targets, "deepgemm_tf32_hc_prenorm_gemm") and len(calls) == 1 and calls[0][-1] == (splits or 1)
    assert bool((d == 1).all()) and bool((s == 2).all())


def test_opcheck_custom_ops(cpu_ops, monkeypatch):
    """torch.library.opcheck (schema: declared mutations only; fake tensors; AOT dispatch) of the custom ops whose
    signatures changed or are new, their launches stubbed to write their outputs."""
    from tirx_kernels.ported.deepgemm import (
        fp8_bmm,
        fp8_gemm_1d1d,
        fp8_gemm_1d2d,
        k_grouped_fp8_gemm_contiguous,
        tf32_hc_prenorm_gemm,
    )

    monkeypatch.setattr(fp8_gemm_1d2d, "_run", lambda a, sfa, b, sfb, d, c=None: (O.c_into_d(c, d), d.add_(1)))
    monkeypatch.setattr(fp8_gemm_1d1d, "_run", lambda a, sfa, b, sfb, d, c=None: (O.c_into_d(c, d), d.add_(1)))
    monkeypatch.setattr(k_grouped_fp8_gemm_contiguous, "_run",
                        lambda a, sfa, b, sfb, d, ks, c=None: (d.zero_() if c is None else O.c_into_d(c, d), d.add_(1)))
    monkeypatch.setattr(fp8_bmm, "_run", lambda x, sfx, y, sfy, z: z.fill_(2))
    monkeypatch.setattr(tf32_hc_prenorm_gemm, "_run", lambda a, b, d, s, n: (d.fill_(1), s.fill_(2)))
    u8 = torch.uint8  # the codes as bytes: opcheck's comparisons have no CPU float8 kernels (the stubs never read them)
    a, sfa, b, sfb = _operands(40, 64, 256)
    c = torch.randn(40, 64).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.tirx.deepgemm_fp8_gemm_nt,
                          (a.view(u8), sfa, b.view(u8), sfb, torch.zeros(40, 64, dtype=torch.bfloat16), c))
    codes, scales = torch.zeros(24, 256, dtype=u8), torch.rand(24, 2)
    torch.library.opcheck(torch.ops.tirx.deepgemm_fp8_gemm_nt_1d1d,
                          (codes, scales, codes, scales, torch.zeros(24, 24), torch.randn(24, 24)))
    torch.library.opcheck(torch.ops.tirx.deepgemm_k_grouped_fp8_gemm_nt_contiguous,
                          (torch.zeros(24 * 384, dtype=u8), torch.rand(24, 3), torch.zeros(24 * 384, dtype=u8),
                           torch.rand(24, 3), torch.zeros(2, 24, 24), [128, 256], torch.randn(2, 24, 24)))
    x, sfx, y, sfy = fp8_bmm.quantized_operands(torch.randn(6, 2, 256).to(torch.bfloat16),
                                                torch.randn(2, 64, 256).to(torch.bfloat16))
    torch.library.opcheck(torch.ops.tirx.deepgemm_fp8_einsum_bhr_hdr_bhd,
                          (x.view(u8), sfx, y.view(u8), sfy, torch.zeros(6, 2, 64, dtype=torch.bfloat16)))
    torch.library.opcheck(torch.ops.tirx.deepgemm_tf32_hc_prenorm_gemm,
                          (torch.randn(13, 128).to(torch.bfloat16), torch.randn(24, 128), torch.zeros(3, 13, 24),
                           torch.zeros(3, 13), 3))
