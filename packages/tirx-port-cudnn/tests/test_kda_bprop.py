# SPDX-License-Identifier: Apache-2.0
"""cudnn_sm90_kda_bprop_f16 (cuDNN's KDA_BWD contract on tirx-native's KDA backward core): the op end to end on the
CPU (its kernels emulated in place of the loaded functions) against autograd through the fp32 oracle in cuDNN's
layout (THD, states [N, H, V, K]), with cuDNN-layout checkpoints passed in (TIRX_EMULATE_FULL=1); the unsupported
options and bad inputs name the argument; on a GPU, every CONFIGS row through the harness."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.cudnn.linear_attention import kda_bprop_f16 as mod

full_only = pytest.mark.skipif(os.environ.get("TIRX_EMULATE_FULL") != "1",
                               reason="set TIRX_EMULATE_FULL=1 (the core's emulated run is test_kda_backward's; ~45 s)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


def _kw(d):
    return dict(q=d["q"], k=d["k"], v=d["v"], g=d["g"], beta=d["beta"], do=d["do"], cu_seqlens=d["cu_seqlens"],
                initial_state=d["initial_state"], d_final_state=d["d_final_state"], a_log=d["a_log"],
                dt_bias=d["dt_bias"], use_qk_l2norm=True, use_beta_sigmoid=True, safe_gate=True)


@pytest.fixture
def on_cpu(monkeypatch):
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import build, checks, emulate, runtime
    from tirx_kernels.kda import kda_backward_packed as core
    from tirx_kernels.kda import kda_forward_portfolio_multishape as fwd

    emulated = emulate.compile_module(build.codegen_many({k: core.get_kernel(k) for k in ("chunk", "scan", "walk")}))
    real_tensor = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda op, name, t, cuda=False, **kw: real_tensor(op, name, t, cuda=False,
                                                                                          **kw))

    def get_function(module, params, device=None):
        def fn(*args):
            emulated(*args, function=params["kernel"], hang_timeout=300.0).check()
        return fn

    monkeypatch.setattr(runtime, "get_function", get_function)
    monkeypatch.setattr(core, "_FUNCTIONS", runtime.FunctionCache(core.__name__))
    monkeypatch.setattr(fwd, "_FUNCTIONS", runtime.FunctionCache(fwd.__name__))


@full_only
def test_ragged_batch_with_checkpoints_emulated(on_cpu):
    """The checkpoints cuDNN's forward would save (every 64 tokens, [V, K]) passed in; gradients vs the oracle."""
    from tirx_kernels.core import kda_ref

    torch.manual_seed(0)
    d = mod.prepare_data(H=1, seqs="70+0+1+130", device="cpu")
    want = mod.reference(**d)
    cu = d["cu_seqlens"].tolist()
    ckpts = []
    for n in range(len(cu) - 1):  # the states entering each chunk, from the fp32 oracle (exact)
        for t0 in range(cu[n], cu[n + 1], 64):
            sub = torch.tensor([cu[n], t0])
            _, s = kda_ref.forward(d["q"][None], d["k"][None], d["v"][None], d["g"][None], d["beta"][None],
                                   d["a_log"], d["dt_bias"], 128 ** -0.5, d["initial_state"][n:n + 1].transpose(-1, -2),
                                   sub)
            ckpts.append(s[0].transpose(-1, -2))
    got = mod.kda_bprop(**_kw(d), state_checkpoints=torch.stack(ckpts), checkpoint_every_n_tokens=64)
    stats = harness.check_outputs(mod, {k: got[k] for k in want}, want, "the fp32 oracle", {"H": 1}, d)
    assert all(s["rel_fro"] < 2e-2 for s in stats.values()), stats


@pytest.mark.parametrize("change, arg", [({"use_qk_l2norm": False}, "use_qk_l2norm"),
                                         ({"safe_gate": False}, "safe_gate"),
                                         ({"use_beta_sigmoid": False}, "use_beta_sigmoid"),
                                         ({"gate_lower_bound": -3.0}, "gate_lower_bound"),
                                         ({"a_log": None}, "a_log"),
                                         ({"state_checkpoints": torch.zeros(3, 2, 128, 128),
                                           "checkpoint_every_n_tokens": 16}, "checkpoint_every_n_tokens")])
def test_unsupported_options_name_the_argument(change, arg):
    d = mod.prepare_data(H=2, seqs="4+6", device="cpu")
    with pytest.raises(NotImplementedError, match=f"argument '{arg}'"):
        mod.kda_bprop(**{**_kw(d), **change})


@pytest.mark.parametrize("change, arg", [({"do": torch.zeros(10, 2, 128)}, "do"),
                                         ({"d_final_state": torch.zeros(2, 2, 128, 64)}, "d_final_state"),
                                         ({}, "q")])
def test_rejected_inputs_name_the_argument(change, arg):
    d = mod.prepare_data(H=2, seqs="4+6", device="cpu")
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        mod.kda_bprop(**{**_kw(d), **change})


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))
