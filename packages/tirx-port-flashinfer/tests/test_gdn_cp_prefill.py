# SPDX-License-Identifier: Apache-2.0
"""gdn_cp_prefill_sm90 (chunk_gated_delta_rule, context-parallel): the three phases of ``_cp.run`` on the CPU with
both generated modules emulated (``core.emulate``: the transition kernel and gdn_prefill_sm90's kernel) against the
fp32 oracle, NaN guard bands around the outputs and the inputs checked unchanged; the plan and the cost model;
the transition kernel's maps against torch; input validation; the build (no spills); on a GPU, the references.

CI emulates one bf16 ragged GVA batch split in 3 segments through the public op (an empty and a 1-token sequence, a
sequence shorter than its segments, an fp16 state pool with indices, int64 cu_seqlens): ~25 s of g++ for the
transition module (gdn_prefill's is shared with test_gdn_prefill.py through the emulator's cache) and ~15 s of run.
``TIRX_EMULATE_FULL=1`` adds the phases called directly (fp32 states; fp16 GQA with pools and an output index in 4
segments; 2 segments without gate / beta / final state), the transition maps against the oracle and the op's
automatic split of a 2048-token head."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import delta_rule_ref, harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.flashinfer.gdn_prefill import _cp, _op
from tirx_kernels.ported.flashinfer.gdn_prefill import gdn_cp_prefill_sm90 as mod
from tirx_kernels.ported.flashinfer.gdn_prefill import gdn_prefill_sm90 as base

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

    def get(which, io):
        if (which, io) not in cache:
            m = emulate.compile_module(mod.get_kernel(io) if which == "transition" else base.get_kernel(io))
            cache[which, io] = lambda *a: m(*a, hang_timeout=120.0).check()
        return cache[which, io]
    return get


def _guarded(t):
    buf = torch.full((3, *t.shape), float("nan"), dtype=t.dtype)
    buf[1] = t
    return buf, buf[1]


def _run_emulated(emulated, cfg):
    """One config through ``_cp.run`` with both kernels emulated (fp32 states, as the op hands the phases)."""
    cfg = harness.full_config(mod, cfg)
    data = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**data)
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor)}
    slabs = {}
    for key in ("output", "output_state"):
        if data[key] is not None:
            slabs[key], data[key] = _guarded(data[key])
    cu = [int(x) for x in data["cu_seqlens"]]
    _cp.run(data["q"], data["k"], data["v"], data["g"], data["beta"], 128 ** -0.5, data["initial_state"],
            data["cu_seqlens"], data["output"], data["output_state"], data["state_indices"],
            data["output_state_indices"], data["gate_domain"] == "log", cfg["segments"], cu,
            emulated("transition", cfg["dtype"]), emulated("prefill", cfg["dtype"]), torch.zeros(4, dtype=torch.int32))
    for key, v in originals.items():
        if key not in slabs:
            assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the fp32 oracle", cfg, originals)


def _run_op_emulated(emulated, monkeypatch, cfg):
    """One config through the public op (validation, 16-bit state conversion, dispatch, the plan) with both kernels
    emulated: the op's device check and kernel lookup patched to the CPU ones."""
    from tirx_kernels.core import checks

    tensor = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda *a, cuda=False, **kw: tensor(*a, cuda=False, **kw))
    monkeypatch.setattr(mod, "_sms", lambda index: 132)
    cfg = harness.full_config(mod, cfg)
    monkeypatch.setattr(mod._FUNCTIONS, "get", lambda *a: emulated("transition", cfg["dtype"]))
    monkeypatch.setattr(_op._FUNCTIONS, "get", lambda *a: emulated("prefill", cfg["dtype"]))
    data = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**data)
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor)}
    mod.launch(cfg, data)
    for key, v in originals.items():
        if key not in want:
            assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the fp32 oracle", cfg, originals)


def test_op_ragged_gva_three_segments_f16_state_pool_emulated(emulated, monkeypatch):
    """The CI row: bf16, GVA, an empty and a 1-token sequence and one shorter than its segments, int64 cu_seqlens,
    an fp16 state pool read and written through indices (one sequence's write slot -1); no decay, so the middle
    segment's transition M is O(1) (with decays in (0.5, 1) it would vanish and the scan would go unchecked)."""
    stats = _run_op_emulated(emulated, monkeypatch, {"Hq": 1, "Hv": 2, "seqs": "300+0+1+64", "init": True,
                                                     "cu_dtype": "int64", "pool": True, "out_index": True,
                                                     "state_dtype": "float16", "segments": 3, "gate": "none"})
    assert stats["output"]["rel_fro"] < 1e-2 and stats["output_state"]["rel_fro"] < 1e-2, stats


@full_only
def test_ragged_gva_batch_three_segments_emulated(emulated):
    stats = _run_emulated(emulated, {"Hq": 1, "Hv": 2, "seqs": "300+0+1+64", "init": True, "cu_dtype": "int64",
                                     "segments": 3})
    assert stats["output"]["rel_fro"] < 1e-2 and stats["output_state"]["rel_fro"] < 1e-2, stats


@full_only
def test_op_auto_split_emulated(emulated, monkeypatch):
    """use_cp="auto" on one long head: the cost model splits it (11 segments of 3 chunks at 132 SMs)."""
    assert _cp.segments_for([2048], 1, 132) > 2
    _run_op_emulated(emulated, monkeypatch, {"Hq": 1, "Hv": 1, "seqs": "2048", "final": False, "gate": "log"})


@full_only
@pytest.mark.parametrize("cfg", [
    {"dtype": "float16", "Hq": 4, "Hv": 2, "seqs": "400+1+0+130", "gate": "log", "init": True, "pool": True,
     "out_index": True, "segments": 4},
    {"Hq": 2, "Hv": 2, "seqs": "3+200", "gate": "none", "beta": False, "final": False, "segments": 2},
], ids=["fp16_gqa_pool_outidx_p4", "nogate_nobeta_nofinal_p2"])
def test_more_rows_emulated(emulated, cfg):
    _run_emulated(emulated, cfg)


@full_only
def test_transition_maps_emulated(emulated):
    """Phase 1 alone: the identity run of a segment is M, the zero run X, and S0 M + X is the segment run from S0
    (the fp32 chunked oracle) for a random S0 of the state's size; without a decay M is O(1) (checked), so S0 M
    matters."""
    d = mod.prepare_data(**harness.full_config(mod, {"Hq": 1, "Hv": 1, "seqs": "150", "gate": "none"}), device="cpu")
    z = torch.full((3, 1, 128, 128), float("nan"))
    pairs = torch.tensor([0, 150, 0, 150], dtype=torch.int32)
    args = list(_op.kernel_args(d["q"], d["k"], d["v"], d["g"], d["beta"], 128 ** -0.5, z, pairs, d["output"], z,
                                torch.tensor([-1, _cp.IDENTITY_SLOT], dtype=torch.int32),
                                torch.tensor([0, 1], dtype=torch.int32), True, torch.zeros(4, dtype=torch.int32)))
    args[11] = 2
    emulated("transition", "bfloat16")(*args)
    assert z[2].isnan().all() and d["output"].isnan().all(), "the transition kernel wrote outside its rows"
    assert z[1, 0].norm() > 0.3 * z[1, 0].shape[0] ** 0.5, "M vanished: the check below would not see it"
    s0 = torch.randn(1, 1, 128, 128) * z[0, 0].abs().mean() * 3
    _, want = delta_rule_ref.gdn_prefill_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], None, s0,
                                                 d["cu_seqlens"])
    _, m = delta_rule_ref.gdn_prefill_chunked(d["q"], d["k"], torch.zeros_like(d["v"]), d["g"], d["beta"], None,
                                              torch.eye(128)[None, None], d["cu_seqlens"])
    harness.compare("M", z[1, 0], m[0, 0], mod.STATE_TOLERANCE["bfloat16"], "oracle")
    harness.compare("S0 M + X", s0[0, 0] @ z[1, 0] + z[0, 0], want[0, 0], mod.STATE_TOLERANCE["bfloat16"], "oracle")


def test_plan_covers_every_token_once():
    cu = [0, 300, 300, 301, 365]
    p = _cp.plan(cu, 3, [2, -1, 0, 1])
    b = len(cu) - 1
    assert p["cu3"][0] == 0 and p["cu3"][-1] == cu[-1] and p["cu3"] == sorted(p["cu3"])
    for n in range(b):  # segment boundaries inside each sequence, whole chunks but the last
        starts = p["cu3"][n * 3:n * 3 + 4]
        assert starts[0] == cu[n] and starts[-1] == cu[n + 1]
        assert all((e - s) % 64 == 0 for s, e in zip(starts[:-2], starts[1:-1]) if e < cu[n + 1])
    assert p["oidx3"] == [-1, -1, 2, -1, -1, -1, -1, -1, 0, -1, -1, 1]
    assert p["sidx3"][:3] == [0, 4, 8]
    # phase 1: X runs of segments 0, 1 (seg 0 from block 0's initial states), M runs of segment 1
    assert p["sidx1"] == [0, 1, 2, 3] + [-1] * 4 + [_cp.IDENTITY_SLOT] * 4
    assert p["oidx1"] == list(range(4, 12)) + list(range(12, 16)) and p["z_rows"] == 16
    assert p["pairs"][:2] == [0, 128] and p["pairs"][8:10] == [128, 256]


def test_cost_model_splits_only_rows_that_idle_the_machine():
    assert _cp.segments_for([65536], 8, 132) >= 8  # issue 26's row: 8 CTAs of 132 SMs without the split
    assert _cp.segments_for([8192], 16, 132) >= 4
    assert _cp.segments_for([8192] * 16, 32, 132) == 1  # 512 CTAs: the plain kernel
    assert _cp.segments_for([64, 1, 0], 4, 132) == 1  # one chunk: nothing to split
    assert _cp.segments_for([], 4, 132) == 1


def test_scan_composes_affine_maps():
    """Phase 2 on random maps against the sequential composition."""
    P, B, hs = 4, 2, 3  # noqa: N806
    z = torch.randn(2 * P - 2, B, hs, 128, 128, dtype=torch.float64).view((2 * P - 2) * B, hs, 128, 128) * 0.05
    want = z.clone()
    for j in range(1, P - 1):
        want[(j + 1) * B:(j + 2) * B] = (want[j * B:(j + 1) * B] @ want[(P + j - 1) * B:(P + j) * B]
                                         + want[(j + 1) * B:(j + 2) * B])
    _cp.scan(z, P, B)
    torch.testing.assert_close(z, want)


def _cpu_inputs(total=10, hq=2, hv=4):
    bf = torch.bfloat16
    return dict(q=torch.randn(total, hq, 128, dtype=bf), k=torch.randn(total, hq, 128, dtype=bf),
                v=torch.randn(total, hv, 128, dtype=bf), g=torch.rand(total, max(hq, hv)),
                beta=torch.rand(total, max(hq, hv)), cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


@pytest.mark.parametrize("change, arg", [
    ({"q": torch.randn(10, 2, 64, dtype=torch.bfloat16)}, "q"),
    ({"initial_state": torch.zeros(2, 4, 128, 128, dtype=torch.float64)}, "initial_state"),
    ({"initial_state": torch.zeros(3, 4, 128, 128, dtype=torch.float16)}, "initial_state"),
    ({"output_state": torch.zeros(2, 4, 128, 128, dtype=torch.int32)}, "output_state"),
    ({"use_cp": "yes"}, "use_cp"),
    ({"segments": 0}, "segments"),
    ({}, "q"),  # everything valid but on the CPU
])
def test_rejected_inputs_name_the_argument(change, arg):
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.chunk_gated_delta_rule(**{**_cpu_inputs(), **change})


def test_build_has_no_spills():
    """The transition kernel (bf16) builds without spills, stack or local memory (CI's representative artifact)."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "gdn_cp_prefill_sm90", {"io": "bfloat16"})


# ---------------------------------------------------------------------------------------------------------
# GPU (every CONFIGS row also runs through tests/test_gpu.py's harness checks, references included)
# ---------------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("label", ["hq16_hv16_s1x8192", "ragged_hq2_hv4_init_final_p3",
                                   "gqa_hq8_hk2_fp16_log_pool_outidx_p4", "fp16_q16_k16_v64_s192+64_initfinal_f16_i64"])
def test_gpu_references(label):
    from tirx_kernels.core import testing

    testing.check_upstream("gdn_cp_prefill_sm90", label)


@gpu
@pytest.mark.parametrize("gate", ["none", "log"])
@pytest.mark.parametrize("segments", [2, 3, 7, 31])
def test_gpu_split_matches_the_plain_kernel(segments, gate):
    """Forced splits of a ragged batch agree with gdn_prefill_sm90 (the same roundings but at segment starts);
    without a decay the transitions stay O(1)."""
    cfg = harness.full_config(mod, {"Hq": 2, "Hv": 4, "seqs": "1000+1+0+65+2000", "init": True, "gate": gate})
    d = mod.prepare_data(**cfg)
    o1, s1 = base.chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"], d["beta"], None, d["initial_state"], True,
                                         d["cu_seqlens"], gate_domain=d["gate_domain"])
    o2, s2 = mod.chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["g"], d["beta"], None, d["initial_state"], True,
                                        d["cu_seqlens"], gate_domain=d["gate_domain"], use_cp=True,
                                        segments=segments)
    harness.compare("output", o2, o1, mod.TOLERANCE["bfloat16"], "gdn_prefill_sm90")
    harness.compare("output_state", s2, s1, mod.STATE_TOLERANCE["bfloat16"], "gdn_prefill_sm90")


@gpu
def test_gpu_torch_compile_runs_the_split():
    d = mod.prepare_data(**harness.full_config(mod, {"Hq": 2, "Hv": 4, "seqs": "700+0+33", "init": True}))

    def call(q):
        return mod.chunk_gated_delta_rule(q, d["k"], d["v"], d["g"], d["beta"], None, d["initial_state"], True,
                                          d["cu_seqlens"], use_cp=True, segments=3)
    o1, s1 = call(d["q"])
    o2, s2 = torch.compile(call, fullgraph=True)(d["q"])
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(s1, s2, atol=0, rtol=0)


@gpu
def test_gpu_graph_capture_falls_back_to_the_plain_kernel():
    """"auto" inside a CUDA graph capture runs gdn_prefill_sm90's kernel (the plan needs the lengths on the host);
    use_cp=True there is refused, naming the argument."""
    d = mod.prepare_data(**harness.full_config(mod, {"Hq": 2, "Hv": 2, "seqs": "4096", "init": True}))
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"], None, d["initial_state"], True, d["cu_seqlens"])
    want_o, want_s = base.chunk_gated_delta_rule(*args)
    out, st = torch.empty_like(want_o), torch.empty_like(want_s)
    mod.chunk_gated_delta_rule(*args, output=out, output_state=st)  # warm-up (loads the kernels)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mod.chunk_gated_delta_rule(*args, output=out, output_state=st)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want_o, atol=0, rtol=0)
    torch.testing.assert_close(st, want_s, atol=0, rtol=0)
    with pytest.raises(TirxInputError, match="argument 'use_cp'"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            mod.chunk_gated_delta_rule(*args, output=out, output_state=st, use_cp=True)


def test_plain_op_hands_use_cp_to_the_split():
    """gdn_prefill_sm90's op with use_cp=True is this op (on the CPU: refused at the device check, naming q)."""
    with pytest.raises(TirxInputError, match="argument 'q'"):
        base.chunk_gated_delta_rule(**_cpu_inputs(), use_cp=True)
