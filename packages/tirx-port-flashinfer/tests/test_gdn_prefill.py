# SPDX-License-Identifier: Apache-2.0
"""gdn_prefill_sm90 (FlashInfer's chunk_gated_delta_rule on wgmma): the generated module run on the CPU
(``core.emulate``: its host code encodes the 3-D tensor maps, TMA / wgmma / mbarrier rings as modelled) with the op's
own argument plumbing (``_op.kernel_args``) against the fp32 oracle through the module's checks (tolerances,
state-pool comparator), with NaN guard bands around the outputs and the inputs checked unchanged; input validation;
on a GPU, graph replay, torch.compile and the references (fla 0.6.0, FlashInfer 0.7.4 where its CuTe-DSL stack is
staged).

CI emulates one bf16 kernel on one ragged GVA batch (empty and 1-token sequences, a chunk-boundary length, 3 chunks,
initial and final states, int64 cu_seqlens, NaN padding tokens after the last sequence): ~25 s of g++ and ~10 s of
run on the 2-core machine. ``TIRX_EMULATE_FULL=1`` adds fp16 GQA with pools and an output index, no gate / beta /
initial state, and a longer multi-chunk row."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import delta_rule_ref, harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.core.lang import gdn_layout as _layout
from tirx_kernels.ported.flashinfer.gdn_prefill import _op
from tirx_kernels.ported.flashinfer.gdn_prefill import gdn_prefill_sm90 as mod

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import emulate

    cache = {}

    def get(io):
        if io not in cache:
            cache[io] = emulate.compile_module(mod.get_kernel(io))
        return cache[io]
    return get


def _guarded(t):
    """``t``'s values in the middle of a NaN slab three times its size: (the slab, the view)."""
    buf = torch.full((3, *t.shape), float("nan"), dtype=t.dtype)
    buf[1] = t
    return buf, buf[1]


def _nan_rows(t, pad):
    return torch.cat([t, torch.full((pad, *t.shape[1:]), float("nan"), dtype=t.dtype)])


def _run_emulated(emulated, cfg, pad=0):
    """One config through the emulated kernel; ``pad`` NaN tokens after the last sequence (a caller's padded token
    buffer, as vLLM's CUDA graphs have): the chunk that reads them must stay finite, their output rows unwritten."""
    cfg = harness.full_config(mod, cfg)
    data = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**data)
    if pad:
        for key in ("q", "k", "v", "g", "beta"):
            if data[key] is not None:
                data[key] = _nan_rows(data[key], pad)
        want["output"] = _nan_rows(want["output"], pad)
        data["output"] = _nan_rows(data["output"], pad)
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor)}
    slabs = {}
    for key in ("output", "output_state"):
        if data[key] is not None:
            slabs[key], data[key] = _guarded(data[key])
    q, k = (_op.normalize_qk(data["q"], data["k"]) if data["l2norm"] else (data["q"], data["k"]))
    args = _op.kernel_args(q, k, data["v"], data["g"], data["beta"], 128 ** -0.5, data["initial_state"],
                           data["cu_seqlens"], data["output"], data["output_state"], data["state_indices"],
                           data["output_state_indices"], data["gate_domain"] == "log",
                           torch.zeros(4, dtype=torch.int32))
    emulated(cfg["dtype"])(*args, hang_timeout=120.0).check()
    for key, v in originals.items():
        if key not in slabs:
            assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    got = {k: data[k] for k in want}
    if pad:
        assert got["output"][-pad:].isnan().all(), "a padding row was written"
        got["output"], want["output"] = got["output"][:-pad], want["output"][:-pad]
    return harness.check_outputs(mod, got, want, "the fp32 oracle", cfg, originals)


def test_ragged_gva_batch_emulated(emulated):
    stats = _run_emulated(emulated, {"Hq": 1, "Hv": 2, "seqs": "70+0+1+64+129", "init": True, "cu_dtype": "int64"},
                          pad=37)
    assert stats["output"]["rel_fro"] < 1e-2 and stats["output_state"]["rel_fro"] < 1e-2, stats


@full_only
@pytest.mark.parametrize("cfg", [
    {"dtype": "float16", "Hq": 4, "Hv": 2, "seqs": "65+0+1+130", "gate": "log", "init": True, "pool": True,
     "out_index": True},
    {"Hq": 2, "Hv": 2, "seqs": "3+200", "gate": "none", "beta": False},
    {"Hq": 1, "Hv": 1, "seqs": "300", "final": False, "l2norm": True},
], ids=["fp16_gqa_pool_outidx", "nogate_nobeta_noinit", "long_l2norm_nofinal"])
def test_more_rows_emulated(emulated, cfg):
    _run_emulated(emulated, cfg)


def test_layout_constants():
    """The descriptor offsets written out in _layout (it imports no TVM) are wgmma's, and the pool fits."""
    pytest.importorskip("tvm", reason="the wgmma layer imports TVM")
    from tirx_kernels.core.lang import wgmma

    assert _layout.KMAJ == wgmma.desc_offsets(wgmma.K_MAJOR, wgmma.SWIZZLE_128B)
    assert _layout.MNMAJ == wgmma.desc_offsets(wgmma.MN_MAJOR, wgmma.SWIZZLE_128B, mn_chunk_bytes=_layout.BOX)
    assert _layout.TILE_BYTES + 4 * _layout.VEC_WORDS + 64 <= _layout.SMEM_LIMIT


def test_oracle_rows_match_the_recurrence():
    """The harness oracle (chunked, fp32, pools gathered and scattered) against the fp64 token recurrence."""
    cfg = harness.full_config(mod, {"Hq": 2, "Hv": 2, "seqs": "70+0+5", "init": True, "pool": True,
                                    "out_index": True, "gate": "log"})
    d = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**d)
    idx = d["state_indices"].long()
    o, s = delta_rule_ref.gdn_prefill_recurrent(d["q"], d["k"], d["v"], d["g"], d["beta"], None,
                                                d["initial_state"][idx], d["cu_seqlens"], "log", torch.float64)
    torch.testing.assert_close(want["output"].double(), o, atol=1e-4, rtol=1e-4)
    dst = d["output_state_indices"].long()
    torch.testing.assert_close(want["output_state"][dst[1:]].double(), s[1:], atol=1e-4, rtol=1e-4)
    assert want["output_state"][dst[0].clamp_min(0)].isnan().all() or dst[0] < 0


def _cpu_inputs(total=10, hq=2, hv=4):
    q = torch.randn(total, hq, 128, dtype=torch.bfloat16)
    return dict(q=q, k=torch.randn(total, hq, 128, dtype=torch.bfloat16),
                v=torch.randn(total, hv, 128, dtype=torch.bfloat16), g=torch.rand(total, max(hq, hv)),
                beta=torch.rand(total, max(hq, hv)), cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


@pytest.mark.parametrize("change, arg", [
    ({"q": torch.randn(10, 2, 64, dtype=torch.bfloat16)}, "q"),
    ({"v": torch.randn(10, 4, 128, dtype=torch.float16)}, "v"),
    ({"k": torch.randn(10, 3, 128, dtype=torch.bfloat16)}, "v"),
    ({"g": torch.rand(10, 2)}, "g"),
    ({"beta": torch.rand(10, 4, dtype=torch.float64)}, "beta"),
    ({"cu_seqlens": torch.tensor([0, 4, 10], dtype=torch.float32)}, "cu_seqlens"),
    ({"cu_seqlens": torch.tensor([0], dtype=torch.int32)}, "cu_seqlens"),
    ({"initial_state": torch.zeros(3, 4, 128, 128)}, "initial_state"),
    ({"initial_state": torch.zeros(2, 4, 128, 128, dtype=torch.bfloat16)}, "initial_state"),
    ({"output": torch.empty(10, 2, 128, dtype=torch.bfloat16)}, "output"),
    ({"state_indices": torch.tensor([0, 1], dtype=torch.int16)}, "state_indices"),
    ({"output_state_indices": torch.tensor([0, 1])}, "output_state_indices"),
    ({"gate_domain": "exp"}, "gate_domain"),
    ({}, "q"),  # everything valid but on the CPU
])
def test_rejected_inputs_name_the_argument(change, arg):
    kw = {**_cpu_inputs(), **change}
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.chunk_gated_delta_rule(**kw)


def test_gqa_head_map_is_checked():
    kw = _cpu_inputs(hq=4, hv=2)
    kw["k"] = torch.randn(10, 4, 128, dtype=torch.bfloat16)  # GQA needs k heads == v heads
    with pytest.raises(TirxInputError, match="argument 'k'"):
        mod.chunk_gated_delta_rule(**kw)


@pytest.mark.parametrize("kw, arg", [({"checkpoint_every_n_tokens": 64}, "state_checkpoints"),
                                     ({"backend": "cudnn"}, "backend")])
def test_not_implemented_names_the_argument(kw, arg):
    with pytest.raises(NotImplementedError, match=f"argument '{arg}'"):
        mod.chunk_gated_delta_rule(**_cpu_inputs(), **kw)


def test_gate_materialization():
    """use_gate_in_kernel gives the log gate -exp(A_log) softplus(g + dt_bias); beta_is_logit a rounded sigmoid."""
    g, b = torch.randn(5, 2), torch.randn(5, 2, dtype=torch.bfloat16)
    a_log, dt = torch.randn(2), torch.randn(2)
    g2, b2, dom = _op.materialize_gates(g, b, True, a_log, dt, True, "linear")
    assert dom == "log"
    torch.testing.assert_close(g2, -torch.exp(a_log) * torch.nn.functional.softplus(g + dt))
    torch.testing.assert_close(b2, torch.sigmoid(b.float()).bfloat16().float())
    with pytest.raises(TirxInputError, match="argument 'A_log'"):
        _op.materialize_gates(g, b, False, a_log, None, False, "linear")


# ---------------------------------------------------------------------------------------------------------
# GPU (every CONFIGS row also runs through tests/test_gpu.py's harness checks, references included)
# ---------------------------------------------------------------------------------------------------------

@gpu
def test_gpu_graph_replay():
    from tirx_kernels.core import testing

    testing.check_graph_replay("gdn_prefill_sm90", "ragged_hq2_hv4_init_final")


@gpu
def test_gpu_torch_compile():
    d = mod.prepare_data(**harness.full_config(mod, {"Hq": 2, "Hv": 4, "seqs": "100+0+33", "init": True}))
    o1, s1 = mod.chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"], d["beta"], None, d["initial_state"], True,
                                        d["cu_seqlens"])
    fn = torch.compile(lambda q: mod.chunk_gated_delta_rule(q, d["k"], d["v"], d["g"], d["beta"], None,
                                                            d["initial_state"], True, d["cu_seqlens"]),
                       fullgraph=True)
    o2, s2 = fn(d["q"])
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(s1, s2, atol=0, rtol=0)


@gpu
def test_gpu_small_rows_match_the_recurrence():
    """1-token and empty sequences, a single chunk and chunk boundaries against the fp64 token recurrence."""
    cfg = harness.full_config(mod, {"Hq": 2, "Hv": 4, "seqs": "1+0+63+64+65+1", "init": True, "gate": "log"})
    d = mod.prepare_data(**cfg)
    o, s = mod.chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"], d["beta"], None, d["initial_state"], True,
                                      d["cu_seqlens"], gate_domain="log")
    wo, ws = delta_rule_ref.gdn_prefill_recurrent(d["q"], d["k"], d["v"], d["g"], d["beta"], None,
                                                  d["initial_state"], d["cu_seqlens"], "log", torch.float64)
    harness.compare("output", o, wo, mod.TOLERANCE["bfloat16"], "the recurrence")
    harness.compare("output_state", s, ws, mod.STATE_TOLERANCE["bfloat16"], "the recurrence")
    torch.testing.assert_close(s[1], d["initial_state"][1])  # the empty sequence passes its state through


@gpu
@pytest.mark.parametrize("label", ["hq16_hv64_s1x8192", "ragged_hq2_hv4_init_final", "gqa_hq8_hk2_fp16_log_i64"])
def test_gpu_references(label):
    """fla and FlashInfer (where they run) agree with ours; both checked against the oracle too, so a reference that
    is itself off (fla's Triton on some versions) shows as such."""
    from tirx_kernels.core import testing

    testing.check_upstream("gdn_prefill_sm90", label)
