# SPDX-License-Identifier: Apache-2.0
"""cudnn_sm90_gdn_prefill_f16 (cuDNN's GDN-1 forward with state checkpoints): the generated kernel run on the CPU
(``core.emulate``) through the op's own launch path (``_fwd_common.run``: the safe gate and beta logits turned into
the kernel's gates, checkpoint offsets, bf16 states through fp32 copies) against the fp32 oracle with the module's
tolerances, NaN guard bands around every output and the inputs checked unchanged; the oracle against the fp64 token
recurrence; input validation; on a GPU, graph replay, torch.compile, the fp64 recurrence on small ragged rows, the
recompute's bit-identical checkpoints, and fla.

CI emulates one bf16 row (a ragged GVA batch: empty and 1-token sequences, a chunk boundary, 3 chunks, two
checkpoints in one sequence, safe gate, beta logits, int64 cu_seqlens, initial and final state). ``TIRX_EMULATE_FULL=1``
adds fp16 GQA with a linear gate, cadence 128 and bf16 states."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.cudnn.linear_attention import _fwd_common, _fwd_op
from tirx_kernels.ported.cudnn.linear_attention import gdn_prefill_f16 as mod

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
OUTPUTS = ("output", "final_state", "checkpoints")


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import emulate

    cache = {}

    class Functions:  # runtime.FunctionCache's interface, answered by the emulated module
        def get(self, key, params_of, device=None):
            io = params_of()["io"]
            if io not in cache:
                cache[io] = emulate.compile_module(mod.get_kernel(io))
            return lambda *args: cache[io](*args, hang_timeout=120.0).check()
    return Functions()


def _guarded(t):
    buf = torch.full((3, *t.shape), float("nan"), dtype=t.dtype)
    buf[1] = t
    return buf, buf[1]


def run_emulated(functions, cfg):
    cfg = harness.full_config(mod, cfg)
    data = mod.prepare_data(device="cpu", **cfg)
    want = mod.reference(**data)
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor) and k not in OUTPUTS}
    slabs = {}
    for key in OUTPUTS:
        if key in data:
            slabs[key], data[key] = _guarded(data[key])
    _fwd_common.run(functions, mod.OP, data["q"], data["k"], data["v"], data["gate"], data["beta"], data["output"],
                    data["cu_seqlens"], data["initial_state"], data.get("final_state"), data.get("checkpoints"),
                    data["checkpoint_every_n_tokens"], 128 ** -0.5, **_fwd_common.gate_kwargs(data))
    for key, v in originals.items():
        assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the fp32 oracle", cfg, originals)


def test_ragged_gva_batch_emulated(emulated):
    stats = run_emulated(emulated, {"Hq": 1, "Hk": 1, "Hv": 2, "seqs": "70+0+1+129", "init": True, "checkpoint": 64,
                                    "gate": "safe", "beta_sigmoid": True, "cu_dtype": "int64"})
    assert all(s["rel_fro"] < 1e-2 for s in stats.values()), stats


@full_only
def test_fp16_gqa_bf16_states_emulated(emulated):
    run_emulated(emulated, {"dtype": "float16", "Hq": 2, "Hk": 1, "Hv": 1, "seqs": "17+130+1", "init": True,
                            "checkpoint": 128, "gate": "linear", "state_dtype": "bfloat16"})


def test_oracle_matches_the_recurrence():
    """The harness oracle (fp32 chunked, per checkpoint segment) against the fp64 token recurrence, checkpoints
    included; a sequence's checkpoint 0 is its initial state, and the counts follow ceil(len / cadence)."""
    cfg = harness.full_config(mod, {"Hq": 1, "Hk": 1, "Hv": 1, "seqs": "70+0+1+129", "init": True,
                                    "checkpoint": 64, "gate": "safe", "beta_sigmoid": True})
    d = mod.prepare_data(device="cpu", **cfg)
    want = mod.reference(**d)
    exact = _fwd_common.reference(d, with_q=True, dtype=torch.float64, chunked=False)
    for key in OUTPUTS:
        torch.testing.assert_close(want[key].double(), exact[key], atol=1e-4, rtol=1e-4)
    assert want["checkpoints"].shape[0] == 2 + 0 + 1 + 3
    torch.testing.assert_close(want["checkpoints"][0], d["initial_state"][0])
    torch.testing.assert_close(want["checkpoints"][2], d["initial_state"][2])


def test_checkpoint_layout():
    cu = torch.tensor([0, 63, 63, 64, 65, 257], dtype=torch.int64)
    lens = [63, 0, 1, 1, 192]
    assert _fwd_op.checkpoint_count(lens, 64) == 1 + 0 + 1 + 1 + 3
    assert _fwd_op.checkpoint_count(lens, 128) == 1 + 0 + 1 + 1 + 2
    assert _fwd_op.checkpoint_count(lens, 0) == 0
    assert _fwd_op.checkpoint_offsets(cu, 64).tolist() == [0, 1, 1, 2, 3]
    assert _fwd_op.checkpoint_offsets(cu, 192).tolist() == [0, 1, 1, 2, 3]


def test_safe_gate_is_the_softplus_log_decay():
    x, a_log, dt = torch.randn(6, 3), torch.randn(3), torch.randn(3)
    got = _fwd_op.log_decay(x, True, True, a_log, dt)
    torch.testing.assert_close(got, -torch.exp(a_log) * torch.nn.functional.softplus(x + dt))
    big = _fwd_op.log_decay(torch.full((1, 3), 30.0), True, True, torch.zeros(3), torch.zeros(3))
    torch.testing.assert_close(big, torch.full((1, 3), -30.0))  # the linear tail above 20
    torch.testing.assert_close(_fwd_op.log_decay(torch.full((2, 2), 0.5), False, False), torch.full((2, 2), -0.6931),
                               atol=1e-4, rtol=0)


def _cpu_inputs(total=10, hq=2, hv=4):
    return dict(q=torch.randn(total, hq, 128, dtype=torch.bfloat16),
                k=torch.randn(total, hq, 128, dtype=torch.bfloat16),
                v=torch.randn(total, hv, 128, dtype=torch.bfloat16), gate=-torch.rand(total, max(hq, hv)),
                beta=torch.rand(total, max(hq, hv)), cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


@pytest.mark.parametrize("change, arg", [
    ({"q": torch.randn(10, 2, 64, dtype=torch.bfloat16)}, "q"),
    ({"v": torch.randn(10, 4, 128, dtype=torch.float16)}, "v"),
    ({"k": torch.randn(10, 3, 128, dtype=torch.bfloat16)}, "k"),
    ({"gate": torch.rand(10, 2)}, "gate"),
    ({"beta": torch.rand(10, 4, dtype=torch.bfloat16)}, "beta"),
    ({"use_beta_sigmoid": True}, "beta"),
    ({"cu_seqlens": torch.tensor([0, 4, 10], dtype=torch.float32)}, "cu_seqlens"),
    ({"cu_seqlens": torch.tensor([0], dtype=torch.int32)}, "cu_seqlens"),
    ({"initial_state": torch.zeros(3, 4, 128, 128)}, "initial_state"),
    ({"final_state": torch.zeros(2, 4, 128, 128, dtype=torch.float16)}, "final_state"),
    ({"output": torch.empty(10, 2, 128, dtype=torch.bfloat16)}, "output"),
    ({"checkpoint_every_n_tokens": 32}, "checkpoint_every_n_tokens"),
    ({"output_state_checkpoints": torch.empty(2, 4, 128, 128, dtype=torch.bfloat16)}, "output_state_checkpoints"),
    ({"checkpoint_every_n_tokens": 64, "output_state_checkpoints": torch.empty(2, 4, 128, 64,
                                                                               dtype=torch.bfloat16)},
     "output_state_checkpoints"),
    ({"safe_gate": True}, "a_log"),
    ({"a_log": torch.zeros(4)}, "a_log"),
    ({"safe_gate": True, "log_gate": False, "a_log": torch.zeros(4), "dt_bias": torch.zeros(4)}, "log_gate"),
    ({"scale": float("nan")}, "scale"),
    ({}, "q"),  # everything valid but on the CPU
])
def test_rejected_inputs_name_the_argument(change, arg):
    kw = {**_cpu_inputs(), **change}
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.chunk_gdn_sm90(**kw)


# ---------------------------------------------------------------------------------------------------------
# GPU (every CONFIGS row also runs through tests of the harness: python -m tirx_kernels.test --kernel ...)
# ---------------------------------------------------------------------------------------------------------

@gpu
def test_gpu_graph_replay():
    from tirx_kernels.core import testing

    testing.check_graph_replay("cudnn_sm90_gdn_prefill_f16", "ragged_hq2_hv4_ckpt64_safe")


@gpu
def test_gpu_torch_compile():
    cfg = harness.full_config(mod, {"Hq": 2, "Hk": 2, "Hv": 4, "seqs": "100+0+33", "init": True, "checkpoint": 64})
    d = mod.prepare_data(**cfg)
    ck = d["checkpoints"]
    o1, _, c1 = mod.chunk_gdn_sm90(d["q"], d["k"], d["v"], d["gate"], d["beta"], None, d["cu_seqlens"],
                                   d["initial_state"], checkpoint_every_n_tokens=64,
                                   output_state_checkpoints=ck.clone())
    ck2 = ck.clone()
    fn = torch.compile(lambda q: mod.chunk_gdn_sm90(q, d["k"], d["v"], d["gate"], d["beta"], None, d["cu_seqlens"],
                                                    d["initial_state"], checkpoint_every_n_tokens=64,
                                                    output_state_checkpoints=ck2)[0], fullgraph=True)
    o2 = fn(d["q"])
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(c1, ck2, atol=0, rtol=0)


@gpu
@pytest.mark.parametrize("gate", ["log", "linear", "safe"])
def test_gpu_small_rows_match_the_recurrence(gate):
    """1-token and empty sequences, chunk and cadence boundaries, against the fp64 token recurrence."""
    cfg = harness.full_config(mod, {"Hq": 2, "Hk": 2, "Hv": 4, "seqs": "1+0+63+64+65+129+1", "init": True,
                                    "checkpoint": 64, "gate": gate, "beta_sigmoid": gate == "safe"})
    d = mod.prepare_data(**cfg)
    o, s, c = mod.chunk_gdn_sm90(d["q"], d["k"], d["v"], d["gate"], d["beta"], None, d["cu_seqlens"],
                                 d["initial_state"], output_final_state=True, checkpoint_every_n_tokens=64,
                                 **_fwd_common.gate_kwargs(d))
    want = _fwd_common.reference({**d, "final_state": s, "checkpoints": c}, with_q=True, dtype=torch.float64,
                                 chunked=False)
    tol = mod.TOLERANCE["bfloat16"]
    harness.compare("output", o, want["output"], tol, "the recurrence")
    harness.compare("final_state", s, want["final_state"], tol, "the recurrence")
    harness.compare("checkpoints", c, want["checkpoints"], tol, "the recurrence")
    torch.testing.assert_close(s[1], d["initial_state"][1])  # the empty sequence passes its state through


@gpu
@pytest.mark.parametrize("label", ["ragged_hq2_hv4_ckpt64_safe", "h4_ckpt192_nofinal", "perf_b1_s8192_h16_state"])
def test_gpu_recompute_is_bit_identical(label):
    """The recompute kernel runs the forward's state path without q / o: same checkpoints and final state, bit for
    bit (rows whose state heads the recompute also has: Hq <= max(Hk, Hv))."""
    from tirx_kernels.ported.cudnn.linear_attention import gdn_recompute_f16 as rc

    cfg = harness.find_config(mod, label)
    d = mod.prepare_data(**harness.full_config(mod, cfg))
    cadence = d["checkpoint_every_n_tokens"]
    _, s1, c1 = mod.chunk_gdn_sm90(d["q"], d["k"], d["v"], d["gate"], d["beta"], None, d["cu_seqlens"],
                                   d["initial_state"], output_final_state=True, checkpoint_every_n_tokens=cadence,
                                   **_fwd_common.gate_kwargs(d))
    s2 = torch.empty_like(s1)
    c2, _ = rc.chunk_gdn_recompute_sm90(d["k"], d["v"], d["gate"], d["beta"], d["cu_seqlens"], d["initial_state"], s2,
                                        checkpoint_every_n_tokens=cadence, **_fwd_common.gate_kwargs(d))
    assert torch.equal(s1, s2)
    assert (c1 is None and c2 is None) or torch.equal(c1, c2)


@gpu
@pytest.mark.parametrize("label", ["ragged_hq2_hv4_ckpt64_safe", "perf_b1_s8192_h16_state"])
def test_gpu_references(label):
    """fla 0.6.0's chunk_gated_delta_rule agrees with ours on output and final state (and is itself checked against
    the oracle)."""
    from tirx_kernels.core import testing

    testing.check_upstream("cudnn_sm90_gdn_prefill_f16", label)
