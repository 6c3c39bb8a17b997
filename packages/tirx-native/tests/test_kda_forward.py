# SPDX-License-Identifier: Apache-2.0
"""kda_forward_portfolio_multishape (KDA chunked forward): both kernels (chunk pass, wgmma scan) run on the CPU
(``core.emulate``: the generated module with its host code, TMA / wgmma / mbarriers as modelled) through the op's own
argument plumbing, against the fp32 oracle with the module's tolerances, NaN guard bands around every output and
intermediate, the inputs checked unchanged; the device-side chunk table; input validation; on a GPU, every CONFIGS
row through the harness (oracle + fla 0.6.0's chunk_kda where installed), graph replay and torch.compile.

CI emulates one ragged batch (a 3-chunk sequence crossing two chunk boundaries -- the ring's stage reuse --, an
empty and a 1-token sequence, an initial state, NaN tokens after the last sequence). ``TIRX_EMULATE_FULL=1`` adds two
heads without an initial state, a longer sequence and a five-sequence ragged batch."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.kda import kda_forward_portfolio_multishape as mod

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import build, emulate
    from tirx_kernels.kda import kda_backward_packed as bwd

    # The backward's three kernels (this module's two and the walk): one g++ build shared with its tests.
    return emulate.compile_module(build.codegen_many({k: bwd.get_kernel(k) for k in ("chunk", "scan", "walk")}))


def _guarded(t):
    buf = torch.full((3, *t.shape), float("nan"), dtype=t.dtype)
    buf[1] = t
    return buf, buf[1]


def _pad(t, pad):
    """``pad`` NaN tokens appended along dim 1 (a caller's padded token buffer)."""
    return torch.cat([t, torch.full((t.shape[0], pad, *t.shape[2:]), float("nan"), dtype=t.dtype)], 1)


def _run_emulated(emulated, cfg, pad=0):
    cfg = harness.full_config(mod, cfg)
    torch.manual_seed(0)
    d = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**d)
    if pad:
        for key in ("q", "k", "v", "g", "beta", "o"):
            d[key] = _pad(d[key], pad)
    originals = {k: v.clone() for k, v in d.items() if isinstance(v, torch.Tensor) and k not in ("o", "final_state")}
    total, h = d["q"].shape[1], d["q"].shape[2]
    tok0, clen, base = mod.chunk_table(d["cu_seqlens"], total)
    slabs = {}
    bufs = {}
    for name, shape, dt in (("qg", (total, h, 128), torch.bfloat16), ("kg", (total, h, 128), torch.bfloat16),
                            ("kd", (total, h, 128), torch.bfloat16), ("pm", (total, h, 64), torch.bfloat16),
                            ("tb", (total, h, 64), torch.bfloat16), ("gam", (tok0.shape[0], h, 128), torch.float32),
                            ("o", d["o"].shape, torch.bfloat16), ("final_state", d["final_state"].shape,
                                                                  torch.float32)):
        slabs[name], bufs[name] = _guarded(torch.full(shape, float("nan"), dtype=dt))
    b = bufs
    emulated(*mod.chunk_args(d["q"], d["k"], d["g"], d["beta"], d["A_log"], d["dt_bias"], tok0, clen, b["qg"],
                             b["kg"], b["kd"], b["pm"], b["tb"], b["gam"], 128 ** -0.5),
             function="chunk", hang_timeout=300.0).check()
    emulated(*mod.scan_args(b["qg"], b["kg"], b["kd"], d["v"], b["tb"], b["pm"], b["gam"],
                            mod.clamped_cu(d["cu_seqlens"], total), base,
                            b["o"], d["initial_state"], b["final_state"], torch.zeros(4, dtype=torch.int32)),
             function="scan", hang_timeout=300.0).check()
    for key, v in originals.items():
        assert torch.equal(v.view(torch.uint8), d[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    for key in ("qg", "kg", "kd", "pm", "tb"):
        assert not b[key].isnan().any(), f"{key}: a row the scan may read was left unwritten"
    got = {"o": b["o"], "final_state": b["final_state"]}
    if pad:
        assert got["o"][:, -pad:].isnan().all(), "a padding token's output was written"
        got["o"] = got["o"][:, :-pad]
    return harness.check_outputs(mod, got, want, "the fp32 oracle", cfg, originals)


def test_ragged_batch_emulated(emulated):
    stats = _run_emulated(emulated, {"H": 1, "seqs": "130+0+1", "init": True}, pad=37)
    assert stats["o"]["rel_fro"] < 1e-2 and stats["final_state"]["rel_fro"] < 1e-2, stats


@full_only
@pytest.mark.parametrize("cfg", [{"H": 2, "seqs": "3+200", "init": False}, {"H": 1, "seqs": "400+63"},
                                 {"H": 1, "seqs": "70+0+1+64+130"}], ids=["h2_noinit", "long", "ragged5"])
def test_more_rows_emulated(emulated, cfg):
    stats = _run_emulated(emulated, cfg)
    assert stats["o"]["rel_fro"] < 1e-2 and stats["final_state"]["rel_fro"] < 1e-2, stats


def test_chunk_table():
    """Every sequence's chunks in order, then the tail after cu_seqlens[-1] (negative lengths), then empty slots;
    each sequence's first slot."""
    cu = torch.tensor([0, 70, 70, 71, 135], dtype=torch.int64)
    tok0, clen, base = mod.chunk_table(cu, 200)
    assert tok0.tolist()[:6] == [0, 64, 70, 71, 135, 199]
    assert clen.tolist()[:6] == [64, 6, 1, 64, -64, -1]
    assert all(c == 0 for c in clen.tolist()[6:]) and len(clen) == 200 // 64 + 4 + 2
    assert base.tolist() == [0, 2, 2, 3]
    # a cu_seqlens past the tokens or decreasing is clamped as the scan clamps it: no chunk leaves [0, T)
    tok0, clen, _ = mod.chunk_table(torch.tensor([0, 150, 100, 400]), 200)
    assert all(t + max(c, -c) <= 200 for t, c in zip(tok0.tolist(), clen.tolist()))


def _cpu_inputs(t=10, h=2):
    bf = torch.bfloat16
    return dict(q=torch.randn(1, t, h, 128, dtype=bf), k=torch.randn(1, t, h, 128, dtype=bf),
                v=torch.randn(1, t, h, 128, dtype=bf), g=torch.randn(1, t, h, 128, dtype=bf),
                beta=torch.randn(1, t, h, dtype=bf), A_log=torch.zeros(h), dt_bias=torch.zeros(h * 128),
                cu_seqlens=torch.tensor([0, 4, 10]))


@pytest.mark.parametrize("change, arg", [
    ({"q": torch.randn(1, 10, 2, 64, dtype=torch.bfloat16)}, "q"),
    ({"q": torch.randn(2, 10, 2, 128, dtype=torch.bfloat16)}, "q"),
    ({"k": torch.randn(1, 10, 2, 128, dtype=torch.float16)}, "k"),
    ({"v": torch.randn(1, 10, 3, 128, dtype=torch.bfloat16)}, "v"),
    ({"g": torch.randn(1, 10, 2, 128)}, "g"),
    ({"beta": torch.randn(1, 10, 2)}, "beta"),
    ({"A_log": torch.zeros(3)}, "A_log"),
    ({"dt_bias": torch.zeros(2, 128)}, "dt_bias"),
    ({"cu_seqlens": None}, "cu_seqlens"),
    ({"cu_seqlens": torch.tensor([0.0, 10.0])}, "cu_seqlens"),
    ({"initial_state": torch.zeros(3, 2, 128, 128)}, "initial_state"),
    ({"scale": float("nan")}, "scale"),
    ({}, "q"),  # everything valid but on the CPU
])
def test_rejected_inputs_name_the_argument(change, arg):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.chunk_kda(**{**_cpu_inputs(), **change})


def test_fp16_inputs_reach_the_kernels_as_bf16_and_the_output_comes_back_fp16(monkeypatch):
    """fp16 I/O: the kernels' operands are bf16 (their strips' gating needs its range), so ``_run`` rounds q, k, v, g
    and beta to bf16, runs the scan into a bf16 scratch and copies it into the fp16 output."""
    d = {k: (v.half() if v.dtype == torch.bfloat16 else v) for k, v in _cpu_inputs().items()}
    seen = {}

    def fake_chunk_pass(q, k, g, beta, *rest):
        seen["chunk"] = {t.dtype for t in (q, k, g, beta)}
        return "chunks"

    def fake_scan_pass(chunks, v, cu, out, *rest):
        seen["scan"] = (v.dtype, out.dtype)
        out.copy_(torch.arange(out.numel()).reshape(out.shape).to(out.dtype))

    monkeypatch.setattr(mod, "chunk_pass", fake_chunk_pass)
    monkeypatch.setattr(mod, "scan_pass", fake_scan_pass)
    out = torch.full_like(d["v"], float("nan"))
    mod._run(d["q"], d["k"], d["v"], d["g"], d["beta"], d["A_log"], d["dt_bias"], 0.1, None, d["cu_seqlens"], out,
             None)
    assert seen == {"chunk": {torch.bfloat16}, "scan": (torch.bfloat16, torch.bfloat16)}
    assert out.dtype == torch.float16
    assert torch.equal(out, torch.arange(out.numel()).reshape(out.shape).to(torch.bfloat16).half())


def test_sass():
    """Both kernels build without spills or local memory; the strips and the scan on HGMMA, the scan's TMA."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    for kernel in ("chunk", "scan"):
        testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"kernel": kernel})


# ---------------------------------------------------------------------------------------------------------
# GPU (the lead runs these; every CONFIGS row also runs through tests/test_gpu.py's harness checks)
# ---------------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
def test_gpu_graph_replay():
    from tirx_kernels.core import testing

    testing.check_graph_replay(mod.KERNEL_META["name"], "h2_ragged_empty_one")


@gpu
def test_gpu_repeatable():
    """Bitwise repeatable (no atomics, a fixed order)."""
    d = mod.prepare_data(H=8, seqs="1+63+64+65+127+129+1000")
    kw = {k: d[k] for k in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens")}
    o1, s1 = mod.chunk_kda(**kw, output_final_state=True)
    o2, s2 = mod.chunk_kda(**kw, output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
