# SPDX-License-Identifier: Apache-2.0
"""cudnn_sm90_gdn_recompute_f16 (cuDNN's GDN-1 checkpoint recompute): the generated kernel run on the CPU
(``core.emulate``) through the op's launch path (``_fwd_common.run``: no q, no output; bf16 states through fp32
copies) against the fp32 oracle, NaN guard bands around the checkpoints and the final state, inputs unchanged; the
oracle against the fp64 token recurrence; input validation; on a GPU, graph replay and the fp64 recurrence. (The
bit-identity with the forward's checkpoints is a GPU test of test_gdn_prefill_f16.py.)

Emulated rows run under ``TIRX_EMULATE_FULL=1`` (CI's time budget: the forward's emulated row in
test_gdn_prefill_f16.py covers the shared generator, and a GPU test checks the recompute bit for bit against it): a
bf16 ragged batch (empty and 1-token sequences, Hv < Hk, linear gate, cadence 64, bf16 states; passes at rel_fro
2-3e-3) and fp16 with the safe gate, beta logits and cadence 192."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.cudnn.linear_attention import _fwd_common
from tirx_kernels.ported.cudnn.linear_attention import gdn_recompute_f16 as mod

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
OUTPUTS = ("final_state", "checkpoints")


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
    _fwd_common.run(functions, mod.OP, None, data["k"], data["v"], data["gate"], data["beta"], None,
                    data["cu_seqlens"], data["initial_state"], data.get("final_state"), data.get("checkpoints"),
                    data["checkpoint_every_n_tokens"], 0.0, **_fwd_common.gate_kwargs(data))
    for key, v in originals.items():
        assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the fp32 oracle", cfg, originals)


@full_only
def test_ragged_batch_bf16_states_emulated(emulated):
    stats = run_emulated(emulated, {"Hq": 2, "Hk": 2, "Hv": 1, "seqs": "70+0+1+129", "init": True, "checkpoint": 64,
                                    "gate": "linear", "state_dtype": "bfloat16"})
    assert all(s["rel_fro"] < 1e-2 for s in stats.values()), stats


@full_only
def test_fp16_safe_gate_cadence192_emulated(emulated):
    run_emulated(emulated, {"dtype": "float16", "Hq": 1, "Hv": 2, "seqs": "200+1+0+64", "init": True,
                            "checkpoint": 192, "gate": "safe", "beta_sigmoid": True, "cu_dtype": "int64"})


def test_oracle_matches_the_recurrence():
    cfg = harness.full_config(mod, {"Hq": 1, "Hv": 1, "seqs": "65+0+1+128", "init": True, "checkpoint": 128,
                                    "gate": "linear"})
    d = mod.prepare_data(device="cpu", **cfg)
    want = mod.reference(**d)
    exact = _fwd_common.reference(d, with_q=False, dtype=torch.float64, chunked=False)
    assert set(want) == {"final_state", "checkpoints"} and want["checkpoints"].shape[0] == 1 + 0 + 1 + 1
    for key in want:
        torch.testing.assert_close(want[key].double(), exact[key], atol=1e-4, rtol=1e-4)


def _cpu_inputs(total=10, hk=2, hv=4):
    return dict(k=torch.randn(total, hk, 128, dtype=torch.bfloat16),
                v=torch.randn(total, hv, 128, dtype=torch.bfloat16),
                gate=-torch.rand(total, max(hk, hv)), beta=torch.rand(total, max(hk, hv)),
                cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


@pytest.mark.parametrize("change, arg", [
    ({"k": torch.randn(10, 2, 64, dtype=torch.bfloat16)}, "k"),
    ({"v": torch.randn(10, 3, 128, dtype=torch.bfloat16)}, "k"),
    ({"gate": torch.rand(10, 2)}, "gate"),
    ({"checkpoint_every_n_tokens": 0}, "output_state"),
    ({"checkpoint_every_n_tokens": 16}, "checkpoint_every_n_tokens"),
    ({"output_state": torch.zeros(2, 4, 128, 64)}, "output_state"),
    ({"output_state_checkpoints": torch.empty(2, 4, 128, 128, dtype=torch.float16)}, "output_state_checkpoints"),
    ({}, "k"),  # everything valid but on the CPU
])
def test_rejected_inputs_name_the_argument(change, arg):
    kw = {**_cpu_inputs(), **change}
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.chunk_gdn_recompute_sm90(**kw)


@gpu
def test_gpu_graph_replay():
    from tirx_kernels.core import testing

    testing.check_graph_replay("cudnn_sm90_gdn_recompute_f16", "ragged_hk4_hv2_ckpt64_safe")


@gpu
@pytest.mark.parametrize("cadence", [64, 128, 192])
def test_gpu_small_rows_match_the_recurrence(cadence):
    cfg = harness.full_config(mod, {"Hq": 4, "Hv": 2, "seqs": "1+0+63+64+65+200+1", "init": True,
                                    "checkpoint": cadence, "gate": "safe"})
    d = mod.prepare_data(**cfg)
    s = torch.empty_like(d["final_state"])
    c, _ = mod.chunk_gdn_recompute_sm90(d["k"], d["v"], d["gate"], d["beta"], d["cu_seqlens"], d["initial_state"], s,
                                        checkpoint_every_n_tokens=cadence, **_fwd_common.gate_kwargs(d))
    want = _fwd_common.reference({**d, "final_state": s, "checkpoints": c}, with_q=False, dtype=torch.float64,
                                 chunked=False)
    tol = mod.TOLERANCE["bfloat16"]
    harness.compare("final_state", s, want["final_state"], tol, "the recurrence")
    harness.compare("checkpoints", c, want["checkpoints"], tol, "the recurrence")
