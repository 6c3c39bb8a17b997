# SPDX-License-Identifier: Apache-2.0
"""cudnn_sm90_gdn2_prefill_f16 and cudnn_sm90_gdn2_recompute_f16 (cuDNN's GDN-2 forward and checkpoint recompute):
the op's path (``_gdn2_common.run``: tirx-native's KDA chunk kernel (GDN-2 variant) and scan kernel generated and
run on the CPU by ``core.emulate``, the in-chunk checkpoints) against the fp32 chunked oracle of ``core.gdn2_ref``,
with NaN guard bands and inputs unchanged; the same path with a torch scan against the fp64 token recurrence (every
cadence, gate form, GQA / GVA); input validation; on a GPU, the fp64 recurrence and the recompute's bit-identity
with the forward.

CI emulates one forward row (ragged GVA batch with empty and 1-token sequences, cadence 16, safe gate, beta logits,
q/k L2 norm, int64 cu_seqlens, initial state) and one recompute row (cadence 48, bf16 states) on one compiled chunk
kernel and scan."""

import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.cudnn.linear_attention import _gdn2_common, _gdn2_fwd
from tirx_kernels.ported.cudnn.linear_attention import gdn2_prefill_f16 as fwd_mod
from tirx_kernels.ported.cudnn.linear_attention import gdn2_recompute_f16 as rc_mod

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
OUTPUTS = ("output", "final_state", "checkpoints")


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import emulate

    compiled = {}

    class Functions:  # runtime.FunctionCache's interface, answered by the emulated chunk and scan kernels
        def get(self, key, params_of, device=None):
            kernel = params_of()["kernel"]
            if kernel not in compiled:
                compiled[kernel] = emulate.compile_module(fwd_mod.get_kernel(kernel))
            return lambda *args: compiled[kernel](*args, hang_timeout=300.0).check()
    return Functions()


def _torch_scan(with_q):
    def scan(ops, cu, h0, out, ht, ck):
        o, f, k = _gdn2_fwd.scan_torch(ops, cu, h0, with_q)
        if with_q:
            out.copy_(o)
        ht.copy_(f)
        ck[:k.shape[0]].copy_(k)
    return scan


def _guarded(t):
    buf = torch.full((3, *t.shape), float("nan"), dtype=t.dtype)
    buf[1] = t
    return buf, buf[1]


def run_path(mod, with_q, cfg, functions=None, exact=False):
    cfg = harness.full_config(mod, cfg)
    data = mod.prepare_data(device="cpu", **cfg)
    want = _gdn2_common.reference(data, with_q, torch.float64, chunked=False) if exact else mod.reference(**data)
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor) and k not in OUTPUTS}
    slabs = {}
    for key in OUTPUTS:
        if key in data:
            slabs[key], data[key] = _guarded(data[key])
    _gdn2_common.run(functions, data["q"], data["k"], data["v"], data["gate"], data["beta"], data["w"],
                     data.get("output"), data["cu_seqlens"], data["initial_state"], data.get("final_state"),
                     data.get("checkpoints"), data["checkpoint_every_n_tokens"], 128 ** -0.5, data["safe_gate"],
                     data["a_log"], data["dt_bias"], data["use_beta_sigmoid"], data["use_qk_l2norm_in_kernel"],
                     scan=None if functions is not None else _torch_scan(with_q))
    for key, v in originals.items():
        assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the oracle", cfg, originals)


def test_forward_emulated(emulated):
    stats = run_path(fwd_mod, True, {"Hq": 1, "Hk": 1, "Hv": 2, "seqs": "31+0+1+130", "init": True,
                                     "checkpoint": 16, "safe_gate": True, "beta_sigmoid": True, "l2norm": True,
                                     "cu_dtype": "int64"}, emulated)
    assert all(s["rel_fro"] < 1e-2 for s in stats.values()), stats


def test_forward_fp16_emulated(emulated):
    """fp16 I/O: inputs rounded to bf16 for the kernels, the output through a bf16 scratch, fp16 checkpoints."""
    stats = run_path(fwd_mod, True, {"Hq": 2, "Hk": 2, "Hv": 2, "seqs": "40+0+70", "init": True, "checkpoint": 32,
                                     "l2norm": True, "dtype": "float16"}, emulated)
    assert all(s["rel_fro"] < 1e-2 for s in stats.values()), stats


def test_recompute_emulated(emulated):
    stats = run_path(rc_mod, False, {"Hq": 2, "Hv": 1, "seqs": "70+0+49", "init": True, "checkpoint": 48,
                                     "state_dtype": "bfloat16"}, emulated)
    assert all(s["rel_fro"] < 1e-2 for s in stats.values()), stats


@pytest.mark.parametrize("mod, with_q, cfg", [
    (fwd_mod, True, {"Hq": 2, "Hk": 2, "Hv": 4, "seqs": "17+0+1+80", "init": True, "checkpoint": 16,
                     "safe_gate": True, "beta_sigmoid": True}),
    (fwd_mod, True, {"Hq": 4, "Hk": 2, "Hv": 2, "seqs": "65+3", "checkpoint": 32, "l2norm": True}),
    (rc_mod, False, {"Hq": 1, "Hv": 1, "seqs": "100+1", "init": True, "checkpoint": 48}),
    (rc_mod, False, {"Hq": 1, "Hv": 2, "seqs": "40+0", "init": True, "checkpoint": 0}),
    (fwd_mod, True, {"Hq": 1, "Hv": 2, "seqs": "33+1", "checkpoint": 16, "dtype": "float16"}),
    (rc_mod, False, {"Hq": 2, "Hv": 1, "seqs": "70", "init": True, "checkpoint": 48, "dtype": "float16"}),
], ids=["fwd_gva_c16_safe", "fwd_gqa_c32_l2", "rc_c48", "rc_final_only", "fwd_fp16", "rc_fp16"])
def test_path_matches_the_recurrence(mod, with_q, cfg):
    """The chunk pass, a torch scan of the kernel's chunk steps and the in-chunk checkpoints against the fp64 token
    recurrence (the kernel's own roundings are the emulated tests')."""
    run_path(mod, with_q, cfg, exact=True)


def _cpu_inputs(total=10, hq=2, hv=4):
    hs = max(hq, hv)
    return dict(q=torch.randn(total, hq, 128, dtype=torch.bfloat16),
                k=torch.randn(total, hq, 128, dtype=torch.bfloat16),
                v=torch.randn(total, hv, 128, dtype=torch.bfloat16), gate=-torch.rand(total, hs, 128),
                beta=torch.rand(total, hs, 128).bfloat16(), w=torch.rand(total, hs, 128).bfloat16(),
                cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


@pytest.mark.parametrize("change, arg", [
    ({"q": torch.randn(10, 2, 128)}, "q"),
    ({"beta": torch.rand(10, 4, 128).half()}, "beta"),  # fp16 beta with bf16 q
    ({"gate": torch.rand(10, 4)}, "gate"),
    ({"beta": torch.rand(10, 4, 128)}, "beta"),
    ({"w": torch.rand(10, 4, 64).bfloat16()}, "w"),
    ({"checkpoint_every_n_tokens": 64}, "checkpoint_every_n_tokens"),
    ({"safe_gate": True}, "a_log"),
    ({"initial_state": torch.zeros(2, 4, 128, 64)}, "initial_state"),
    ({"cu_seqlens": torch.tensor([0, 4, 10], dtype=torch.float32)}, "cu_seqlens"),
    ({}, "q"),  # everything valid but on the CPU
])
def test_rejected_inputs_name_the_argument(change, arg):
    kw = {**_cpu_inputs(), **change}
    with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
        fwd_mod.chunk_gdn2_sm90(**kw)


@gpu
@pytest.mark.parametrize("cadence", [16, 32, 48])
def test_gpu_small_rows_match_the_recurrence(cadence):
    cfg = harness.full_config(fwd_mod, {"Hq": 2, "Hk": 2, "Hv": 4, "seqs": "1+0+15+16+17+63+64+65+130+1",
                                        "init": True, "checkpoint": cadence, "safe_gate": True, "l2norm": True})
    d = fwd_mod.prepare_data(**cfg)
    o, s, c = fwd_mod.chunk_gdn2_sm90(d["q"], d["k"], d["v"], d["gate"], d["beta"], d["w"], None, d["cu_seqlens"],
                                      d["initial_state"], output_final_state=True, checkpoint_every_n_tokens=cadence,
                                      **_gdn2_common.option_kwargs(d))
    want = _gdn2_common.reference({**d, "final_state": s, "checkpoints": c}, True, torch.float64, chunked=False)
    tol = fwd_mod.TOLERANCE["bfloat16"]
    for key, got in (("output", o), ("final_state", s), ("checkpoints", c)):
        harness.compare(key, got, want[key], tol, "the recurrence")


@gpu
@pytest.mark.parametrize("label", ["ragged_hq2_hv4_ckpt16_safe_l2", "h4_ckpt48_nofinal", "perf_b1_s8192_h16_l2"])
def test_gpu_recompute_is_bit_identical(label):
    d = fwd_mod.prepare_data(**harness.full_config(fwd_mod, harness.find_config(fwd_mod, label)))
    cadence = d["checkpoint_every_n_tokens"]
    _, s1, c1 = fwd_mod.chunk_gdn2_sm90(d["q"], d["k"], d["v"], d["gate"], d["beta"], d["w"], None, d["cu_seqlens"],
                                        d["initial_state"], output_final_state=True,
                                        checkpoint_every_n_tokens=cadence, **_gdn2_common.option_kwargs(d))
    s2 = torch.empty_like(s1)
    c2, _ = rc_mod.chunk_gdn2_recompute_sm90(d["k"], d["v"], d["gate"], d["beta"], d["w"], d["cu_seqlens"],
                                             d["initial_state"], s2, checkpoint_every_n_tokens=cadence,
                                             **_gdn2_common.option_kwargs(d))
    assert torch.equal(s1, s2)
    assert (c1 is None and c2 is None) or torch.equal(c1, c2)
