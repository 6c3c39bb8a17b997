# SPDX-License-Identifier: Apache-2.0
"""cudnn_sm90_gdn2_bprop_f16 (cuDNN's chunked GDN-2 backward): the chunked backward against autograd of GDN-2's token
recurrence in fp64 (ragged, empty and 1-token sequences, GVA / GQA); the 16-token state walk run on the CPU
(``core.emulate``) inside the op's path against the fp32 oracle (guard bands, inputs unchanged) and against its
rounding model; input validation; on a GPU, every config through the harness (the oracle is the only reference: fla
has no GDN-2).

CI: one bf16 emulated kernel, one ragged batch. ``TIRX_EMULATE_FULL=1`` adds the fp16 GQA and GVA rows."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.cudnn.linear_attention import _bwd2_chunks as c2
from tirx_kernels.ported.cudnn.linear_attention import _bwd_chunks as ch
from tirx_kernels.ported.cudnn.linear_attention import _bwd_gates as gates
from tirx_kernels.ported.cudnn.linear_attention import _bwd_state_kernel as sk
from tirx_kernels.ported.cudnn.linear_attention import gdn2_bprop_f16 as mod

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dw", "d_initial_state")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The token recurrence is thousands of tiny ops: one intra-op thread (CI's 2 shared cores) is much faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("heads", [(2, 2, 4), (4, 2, 2)], ids=["gva", "gqa"])
def test_chunked_backward_matches_autograd_fp64(heads):
    gen = torch.Generator().manual_seed(0)
    dt = torch.float64
    lens = [20, 0, 1, 17]
    hq, hk, hv = heads
    total, ho = sum(lens), max(hq, hv)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=dt)
    q, k, v = rnd(total, hq, 128), torch.nn.functional.normalize(rnd(total, hk, 128), dim=-1), rnd(total, hv, 128)
    g = torch.log(0.5 + 0.5 * torch.rand(total, ho, 128, generator=gen, dtype=dt))
    beta, w = (torch.rand(total, ho, 128, generator=gen, dtype=dt) for _ in range(2))
    do, h0, dfs = rnd(total, ho, 128), 0.05 * rnd(len(lens), ho, 128, 128), 0.1 * rnd(len(lens), ho, 128, 128)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    ckpt = c2.checkpoints_from_recurrence(q, k, v, g, beta, w, cu, None, h0, dt)
    assert ckpt.shape[0] == 2 + 0 + 1 + 2
    want = c2.autograd_grads(q, k, v, g, beta, w, do, cu, None, h0, dfs, dt)
    ck_cudnn = ckpt[torch.tensor([1, 4])]  # cuDNN's ABI: each sequence's checkpoint 0 (its initial state) apart
    for max_tiles, layout in ((None, "pre_chunk"), (2 * max(hq, hv), "pre_chunk"), (2 * max(hq, hv), "cudnn")):
        got = c2.chunked_grads(q, k, v, g, beta, w, do, cu, ck_cudnn if layout == "cudnn" else ckpt, None, dfs, dt,
                               max_tiles=max_tiles, initial_state=h0, layout=layout)
        for name in GRADS:
            err = (got[name] - want[name]).norm() / want[name].norm()
            assert err < 1e-12, (name, max_tiles, float(err))
    # Below autograd, as in the op's custom-op body (torch.compile's path): the chunk VJPs still record (the H100
    # run of 2026-12-07 failed there with "element 0 of tensors does not require grad").
    with torch._C._AutoDispatchBelowAutograd():
        below = c2.chunked_grads(q, k, v, g, beta, w, do, cu, ckpt, None, dfs, dt, initial_state=h0)
    for name in GRADS:
        assert torch.equal(below[name], got[name]) or (below[name] - want[name]).norm() / want[name].norm() < 1e-12


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
    buf = torch.full((3, *t.shape), float("nan"), dtype=t.dtype)
    buf[1] = t
    return buf, buf[1]


def _run_emulated(emulated, label, layout="pre_chunk"):
    cfg = harness.full_config(mod, harness.find_config(mod, label))
    data = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**data)
    if layout == "cudnn":  # each sequence's checkpoint 0 (its initial state) apart: cuDNN's backward ABI
        keep, row = [], 0
        for n in ch.lengths(data["cu_seqlens"]):
            c = -(-n // c2.CHUNK)
            keep += list(range(row + 1, row + c))
            row += c
        data["state_checkpoints"] = data["state_checkpoints"][torch.tensor(keep, dtype=torch.long)]
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor) and k not in want}
    slabs = {}
    for key in want:
        slabs[key], data[key] = _guarded(data[key])
    mod.run(data["q"], data["k"], data["v"], data["g"], data["beta"], data["w"], data["do"],
            data["state_checkpoints"], data["cu_seqlens"], 128 ** -0.5, data["d_final_state"], data["dq"],
            data["dk"], data["dv"], data["dg"], data["dbeta"], data["dw"], data["d_initial_state"],
            fn=emulated(cfg["dtype"]), initial_state=data["initial_state"], layout=layout)
    for key, v in originals.items():
        assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the fp32 oracle", cfg, originals)


@pytest.mark.parametrize("layout", ["pre_chunk", "cudnn"])
def test_ragged_batch_emulated(emulated, layout):
    stats = _run_emulated(emulated, "ragged_h2_init_dfinal", layout)
    for name in GRADS:
        assert stats[name]["rel_fro"] < 2e-2, (name, stats[name])


@full_only
@pytest.mark.parametrize("label", ["ragged_gva_hq1_hv2_i64", "gqa_hq4_hv2_fp16"])
def test_more_rows_emulated(emulated, label):
    _run_emulated(emulated, label)


def test_state_walk_matches_its_rounding_model(emulated):
    """The 16-token walk alone (per-key-channel decay) against torch with its roundings."""
    gen = torch.Generator().manual_seed(1)
    counts, heads = [3, 0, 1], 2
    nc, n = sum(counts), len(counts)
    kd = (0.1 * torch.randn(nc, heads, 16, 128, generator=gen)).bfloat16()
    w = (0.1 * torch.randn(nc, heads, 16, 128, generator=gen)).bfloat16()
    x = (0.1 * torch.randn(nc, heads, 16, 128, generator=gen)).bfloat16()
    do = torch.randn(nc, heads, 16, 128, generator=gen).bfloat16()
    gc = 0.5 + 0.5 * torch.rand(nc, heads, 128, generator=gen)
    dfs = torch.randn(n, heads, 128, 128, generator=gen)
    cu = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
    dse = torch.full((nc, heads, 128, 128), float("nan"))
    d0 = torch.full((n, heads, 128, 128), float("nan"))
    emulated("bfloat16")(*sk.kernel_args(kd, w, x, do, gc, cu, dfs, dse, d0, torch.zeros(4)),
                         hang_timeout=120.0).check()
    for i in range(n):
        ds = dfs[i].clone()
        for c in range(int(cu[i + 1]) - 1, int(cu[i]) - 1, -1):
            # values O(1); a bf16 rounding of dS or Y that flips with the fp32 summation order moves them ~1e-3
            torch.testing.assert_close(dse[c], ds, atol=1e-2, rtol=1e-3)
            y = ds.bfloat16().float() @ kd[c].float().transpose(-1, -2)
            r = do[c].float().transpose(-1, -2) @ x[c].float()
            ds = ds * gc[c][:, None, :] + r - y.bfloat16().float() @ w[c].float()
        torch.testing.assert_close(d0[i], ds, atol=1e-2, rtol=1e-3)


def _cpu_args(**over):
    d = mod.prepare_data("bfloat16", 2, "3+0", device="cpu")
    args = {k: d[k] for k in ("q", "k", "v", "g", "beta", "w", "do", "state_checkpoints", "cu_seqlens")}
    args.update(over)
    return args


@pytest.mark.parametrize("over, name", [
    ({"q": torch.zeros(3, 2, 64, dtype=torch.bfloat16)}, "q"),
    ({"k": torch.zeros(3, 2, 128, dtype=torch.float16)}, "k"),
    ({"g": torch.zeros(3, 2)}, "g"),
    ({"beta": torch.zeros(3, 2, 128)}, "beta"),
    ({"w": torch.zeros(3, 2, 64, dtype=torch.bfloat16)}, "w"),
    ({"state_checkpoints": torch.zeros(1, 2, 128, 128)}, "state_checkpoints"),
    ({"cu_seqlens": torch.tensor([3], dtype=torch.int32)}, "cu_seqlens"),
    ({"scale": 0.0}, "scale"),
    ({"checkpoint_layout": "post_chunk"}, "checkpoint_layout"),
], ids=["head_size", "dtype_mix", "g_shape", "beta_dtype", "w_shape", "ckpt_dtype", "cu_short", "scale", "layout"])
def test_bad_input_names_the_argument(over, name):
    with pytest.raises(TirxInputError, match=f"argument '{name}'"):
        mod.gdn2_bprop(**_cpu_args(**over))


def test_cpu_tensors_refused():
    with pytest.raises(TirxInputError, match="argument 'q'.*CUDA"):
        mod.gdn2_bprop(**_cpu_args())


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    from tirx_kernels.core import testing

    res = testing.check_correctness("cudnn_sm90_gdn2_bprop_f16", label)
    assert res["status"] == "passed", res


def test_recurrence_and_checkpoints_match_core_gdn2_ref():
    """This module's differentiable recurrence and checkpoints are tirx-core's GDN-2 oracle (the forward kernels'
    contract): same output, final state and 16-token checkpoints (fp64, ragged GVA batch with an initial state)."""
    from tirx_kernels.core import gdn2_ref

    gen = torch.Generator().manual_seed(3)
    dt = torch.float64
    lens = [20, 0, 1, 33]
    total = sum(lens)
    q = torch.randn(total, 1, 128, generator=gen, dtype=dt)
    k = torch.nn.functional.normalize(torch.randn(total, 1, 128, generator=gen, dtype=dt), dim=-1)
    v = torch.randn(total, 2, 128, generator=gen, dtype=dt)
    g = torch.log(0.5 + 0.5 * torch.rand(total, 2, 128, generator=gen, dtype=dt))
    b, w = (torch.rand(total, 2, 128, generator=gen, dtype=dt) for _ in range(2))
    h0 = 0.05 * torch.randn(len(lens), 2, 128, 128, generator=gen, dtype=dt)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    o1, s1 = c2.recurrent_forward(q, k, v, g, b, w, cu, None, h0, dt)
    o2, s2, ck2 = gdn2_ref.gdn2_recurrent(q, k, v, g, b, w, None, h0, cu, dtype=dt, checkpoint_every=c2.CHUNK)
    ck1 = c2.checkpoints_from_recurrence(q, k, v, g, b, w, cu, None, h0, dt)
    for x, y in ((o1, o2), (s1, s2), (ck1, ck2)):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)


def test_channel_safe_gate_post_pass_is_the_chain_rule():
    gen = torch.Generator().manual_seed(2)
    t, ho = 21, 2
    raw = torch.randn(t, ho, 128, generator=gen, dtype=torch.float64)
    a_log = torch.randn(ho, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(ho, 128, generator=gen, dtype=torch.float64)
    d_log = torch.randn(t, ho, 128, generator=gen, dtype=torch.float64)
    leaves = [x.clone().requires_grad_(True) for x in (raw, a_log, dt_bias)]
    want = torch.autograd.grad(gates.channel_log_decay(leaves[0], True, *leaves[1:]).double(), leaves, d_log)
    got = gates.channel_gate_grads(d_log, raw, True, a_log, dt_bias)
    for w, g_ in zip(want, got):
        torch.testing.assert_close(g_.double(), w, atol=1e-5, rtol=1e-5)


@gpu
def test_gpu_safe_gate():
    d = mod.prepare_data("bfloat16", 2, "20+1+16")
    raw = torch.randn_like(d["g"])
    a_log, dt_bias = 0.1 * torch.randn(2, device="cuda"), torch.randn(2, 128, device="cuda")
    g_log = gates.channel_log_decay(raw, True, a_log, dt_bias)
    d["state_checkpoints"] = c2.checkpoints_from_recurrence(d["q"], d["k"], d["v"], g_log, d["beta"], d["w"],
                                                            d["cu_seqlens"], dtype=torch.float32).to(d["q"].dtype)
    want = mod.reference(**{**d, "g": g_log})
    leaves = [x.clone().requires_grad_(True) for x in (raw, a_log, dt_bias)]
    want_raw = torch.autograd.grad(gates.channel_log_decay(leaves[0], True, *leaves[1:]), leaves, want["dg"])
    out = mod.gdn2_bprop(d["q"], d["k"], d["v"], raw, d["beta"], d["w"], d["do"], d["state_checkpoints"],
                         d["cu_seqlens"], safe_gate=True, a_log=a_log, dt_bias=dt_bias)
    assert len(out) == 9
    for got, w in zip((out[3], out[7], out[8]), want_raw):
        rel = float((got - w).norm() / w.norm())
        assert rel < 4e-2, rel


@gpu
def test_gpu_torch_compile_fullgraph():
    d = mod.prepare_data("bfloat16", 2, "20+0+1+16", init=True, dfinal=True)
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"], d["w"], d["do"], d["state_checkpoints"], d["cu_seqlens"])
    eager = mod.gdn2_bprop(*args, initial_state=d["initial_state"], d_final_state=d["d_final_state"])
    compiled = torch.compile(mod.gdn2_bprop, fullgraph=True)(*args, initial_state=d["initial_state"],
                                                              d_final_state=d["d_final_state"])
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)
