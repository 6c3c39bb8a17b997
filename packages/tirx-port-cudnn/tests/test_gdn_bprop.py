# SPDX-License-Identifier: Apache-2.0
"""cudnn_sm90_gdn_bprop_f16 (cuDNN's chunked GDN-1 backward): the closed-form chunked backward against autograd of the
chunked forward in fp64 (ragged, empty and 1-token sequences, GVA and GQA); the state-walk kernel run on the CPU
(``core.emulate``) inside the op's own path (``gdn_bprop_f16.run``) against the fp32 oracle, outputs in NaN guard
bands, inputs checked unchanged, and against a torch model of its roundings; input validation; on a GPU, every config
through the harness (fla 0.6.0's backward as a reference where it agrees with the oracle).

CI: one bf16 emulated kernel (~10-25 s of g++), one ragged batch with an initial state and a final-state gradient.
``TIRX_EMULATE_FULL=1`` adds the fp16 GQA row, the GVA row and the walk against its rounding model (GDN-2's test runs
that one in CI at 16-token chunks)."""

import os
import shutil

import pytest
import torch

from tirx_kernels.core import harness
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.cudnn.linear_attention import _bwd_chunks as ch
from tirx_kernels.ported.cudnn.linear_attention import _bwd_gates as gates
from tirx_kernels.ported.cudnn.linear_attention import _bwd_oracle as orc
from tirx_kernels.ported.cudnn.linear_attention import _bwd_state_kernel as sk
from tirx_kernels.ported.cudnn.linear_attention import gdn_bprop_f16 as mod

_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "d_initial_state")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The oracles are many small torch ops: one intra-op thread (CI's 2 shared cores) is much faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _inputs(lens, hq, hk, hv, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total, ho = sum(lens), max(hq, hv)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=dtype)
    return dict(q=rnd(total, hq, 128), k=torch.nn.functional.normalize(rnd(total, hk, 128), dim=-1),
                v=rnd(total, hv, 128), g=torch.log(0.5 + 0.5 * torch.rand(total, ho, generator=gen, dtype=dtype)),
                beta=torch.rand(total, ho, generator=gen, dtype=dtype), do=rnd(total, ho, 128),
                cu=torch.tensor([0] + lens).cumsum(0).to(torch.int32),
                h0=0.05 * rnd(len(lens), ho, 128, 128), dfs=0.1 * rnd(len(lens), ho, 128, 128))


@pytest.mark.parametrize("heads", [(2, 2, 4), (4, 2, 2)], ids=["gva", "gqa"])
def test_chunked_backward_matches_autograd_fp64(heads):
    """Every gradient of the closed form (the op's math) equals autograd's to rounding, across chunk boundaries, an
    empty and a 1-token sequence, a 129-token tail chunk, an initial state and a final-state gradient."""
    d = _inputs([70, 0, 1, 129], *heads)
    _, _, ckpt = orc.forward_checkpoints(d["q"], d["k"], d["v"], d["g"], d["beta"], d["cu"], None, d["h0"],
                                         torch.float64)
    assert ckpt.shape[0] == sum(ch.checkpoint_counts([70, 0, 1, 129])) == 2 + 0 + 1 + 3
    want = orc.autograd_grads(d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], d["cu"], None, d["h0"], d["dfs"],
                              torch.float64)
    got = orc.chunked_grads(d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], d["cu"], ckpt, None, None, d["dfs"],
                            torch.float64)
    got_cudnn = orc.chunked_grads(d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], d["cu"],
                                  cudnn_layout(ckpt, d["cu"], 64), None, d["h0"], d["dfs"], torch.float64,
                                  layout="cudnn")
    for name in GRADS:
        for res in (got, got_cudnn):
            err = (res[name] - want[name]).norm() / want[name].norm()
            assert err < 1e-12, (name, float(err))


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


def cudnn_layout(ckpt, cu_seqlens, chunk):
    """The pre-chunk checkpoint series without each sequence's checkpoint 0 (cuDNN's backward ABI)."""
    keep, row = [], 0
    for n in ch.lengths(cu_seqlens):
        c = -(-n // chunk)
        keep += list(range(row + 1, row + c))
        row += c
    return ckpt[torch.tensor(keep, dtype=torch.long)]


def _run_emulated(emulated, label, layout="pre_chunk"):
    """A config row on the CPU: the op's path with the emulated kernel, guard bands, inputs unchanged, the oracle."""
    cfg = harness.full_config(mod, harness.find_config(mod, label))
    data = mod.prepare_data(**cfg, device="cpu")
    want = mod.reference(**data)
    if layout == "cudnn":
        data["state_checkpoints"] = cudnn_layout(data["state_checkpoints"], data["cu_seqlens"], 64)
    originals = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor) and k not in want}
    slabs = {}
    for key in want:
        slabs[key], data[key] = _guarded(data[key])
    mod.run(data["q"], data["k"], data["v"], data["g"], data["beta"], data["do"], data["state_checkpoints"],
            data["cu_seqlens"], 128 ** -0.5, data["initial_state"], data["d_final_state"], data["dq"], data["dk"],
            data["dv"], data["dg"], data["dbeta"], data["d_initial_state"], fn=emulated(cfg["dtype"]), layout=layout)
    for key, v in originals.items():
        assert torch.equal(v.view(torch.uint8), data[key].view(torch.uint8)), f"input {key} was modified"
    for key, slab in slabs.items():
        assert slab[0].isnan().all() and slab[2].isnan().all(), f"written outside {key}"
    return harness.check_outputs(mod, {k: data[k] for k in want}, want, "the fp32 oracle", cfg, originals)


@pytest.mark.parametrize("layout", ["pre_chunk", "cudnn"])
def test_ragged_batch_emulated(emulated, layout):
    """Both checkpoint layouts: this package's (checkpoint 0 = the initial state) and cuDNN's backward ABI (the
    initial state apart, the states entering chunks 1 ..)."""
    stats = _run_emulated(emulated, "ragged_h2_init_dfinal", layout)
    for name in GRADS:
        assert stats[name]["rel_fro"] < 2e-2, (name, stats[name])


def test_all_empty_batch_passes_the_state_gradient():
    """No token at all: the kernel is not launched, dstate0 is d_final_state, the token gradients are empty."""
    data = mod.prepare_data("bfloat16", 2, "0+0", init=True, dfinal=True, device="cpu")
    want = mod.reference(**data)
    mod.run(data["q"], data["k"], data["v"], data["g"], data["beta"], data["do"], data["state_checkpoints"],
            data["cu_seqlens"], 128 ** -0.5, data["initial_state"], data["d_final_state"], data["dq"], data["dk"],
            data["dv"], data["dg"], data["dbeta"], data["d_initial_state"], fn=lambda *a: pytest.fail("launched"))
    assert torch.equal(data["d_initial_state"], data["d_final_state"])
    torch.testing.assert_close(want["d_initial_state"], data["d_final_state"])


@full_only
@pytest.mark.parametrize("label", ["ragged_gva_hq1_hv2", "gqa_hq4_hv2_fp16_i64"])
def test_more_rows_emulated(emulated, label):
    _run_emulated(emulated, label)


@full_only
def test_state_walk_matches_its_rounding_model(emulated):
    """The kernel alone against torch with its roundings (dS and Y to bf16): sequences of 2, 0 and 1 chunks."""
    gen = torch.Generator().manual_seed(1)
    counts, heads = [2, 0, 1], 2
    nc, n = sum(counts), len(counts)
    kd = (0.1 * torch.randn(nc, heads, 64, 128, generator=gen)).bfloat16()
    w = (0.1 * torch.randn(nc, heads, 64, 128, generator=gen)).bfloat16()
    x = (0.1 * torch.randn(nc, heads, 64, 128, generator=gen)).bfloat16()
    do = torch.randn(nc, heads, 64, 128, generator=gen).bfloat16()
    gc = 0.5 + 0.5 * torch.rand(nc, heads, 128, generator=gen)  # per key channel (GDN-1 repeats its scalar)
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
    args = dict(q=d["q"], k=d["k"], v=d["v"], g=d["g"], beta=d["beta"], do=d["do"],
                state_checkpoints=d["state_checkpoints"], cu_seqlens=d["cu_seqlens"])
    args.update(over)
    return args


@pytest.mark.parametrize("over, name", [
    ({"q": torch.zeros(3, 2, 64, dtype=torch.bfloat16)}, "q"),
    ({"k": torch.zeros(3, 2, 128, dtype=torch.float16)}, "k"),
    ({"v": torch.zeros(3, 3, 128, dtype=torch.bfloat16)}, "q"),
    ({"g": torch.zeros(3, 2, dtype=torch.bfloat16)}, "g"),
    ({"beta": torch.zeros(4, 2)}, "beta"),
    ({"do": torch.zeros(3, 1, 128, dtype=torch.bfloat16)}, "do"),
    ({"state_checkpoints": torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16)}, "state_checkpoints"),
    ({"cu_seqlens": torch.tensor([0.0, 3.0])}, "cu_seqlens"),
    ({"scale": float("nan")}, "scale"),
    ({"checkpoint_layout": "post_chunk"}, "checkpoint_layout"),
    ({"d_final_state": torch.zeros(1, 2, 128, 128)}, "d_final_state"),
], ids=["head_size", "dtype_mix", "heads", "g_dtype", "beta_shape", "do_heads", "ckpt_shape", "cu_dtype", "scale",
        "dfinal_rows", "layout"])
def test_bad_input_names_the_argument(over, name):
    with pytest.raises(TirxInputError, match=f"argument '{name}'"):
        mod.gdn_bprop(**_cpu_args(**over))


def test_cpu_tensors_refused():
    with pytest.raises(TirxInputError, match="argument 'q'.*CUDA"):
        mod.gdn_bprop(**_cpu_args())


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    from tirx_kernels.core import testing

    res = testing.check_correctness("cudnn_sm90_gdn_bprop_f16", label)
    assert res["status"] == "passed", res


@gpu
def test_gpu_checkpoint_count_checked():
    d = mod.prepare_data("bfloat16", 2, "65")
    with pytest.raises(TirxInputError, match="argument 'state_checkpoints'"):
        mod.gdn_bprop(d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], d["state_checkpoints"][:1],
                      d["cu_seqlens"])


@gpu
@pytest.mark.parametrize("recompute", [False, True], ids=["kept_checkpoints", "recomputed"])
def test_gpu_training_step_through_forward_and_backward(recompute):
    """chunk_gdn_train: this package's forward kernel writes the checkpoints (or its recompute kernel regenerates
    them in the backward) and gdn_bprop consumes them; every gradient against the fp32 oracle."""
    from tirx_kernels.ported.cudnn.linear_attention._bwd_autograd import chunk_gdn_train

    cfg = harness.full_config(mod, harness.find_config(mod, "ragged_h2_init_dfinal"))
    data = mod.prepare_data(**cfg)
    want = mod.reference(**data)
    leaves = {n: data[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta", "initial_state")}
    o, final = chunk_gdn_train(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                               data["cu_seqlens"], initial_state=leaves["initial_state"], output_final_state=True,
                               recompute=recompute)
    loss = (o.float() * data["do"].float()).sum() + (final * data["d_final_state"]).sum()
    loss.backward()
    got = {"d" + n if n != "initial_state" else "d_initial_state": leaves[n].grad for n in leaves}
    harness.check_outputs(mod, got, want, "the fp32 oracle", cfg, data)


@pytest.mark.parametrize("form", ["linear", "safe"])
def test_gate_post_pass_is_the_chain_rule(form):
    """The raw gate's gradient and the safe gate's parameter gradients from d / d log-decay (autograd of the
    transform in fp64)."""
    gen = torch.Generator().manual_seed(2)
    t, ho = 37, 3
    raw = (0.5 + 0.5 * torch.rand(t, ho, generator=gen, dtype=torch.float64)) if form == "linear" else \
        torch.randn(t, ho, generator=gen, dtype=torch.float64)
    a_log, dt_bias = torch.randn(ho, generator=gen, dtype=torch.float64), torch.randn(ho, generator=gen,
                                                                                          dtype=torch.float64)
    d_log = torch.randn(t, ho, generator=gen, dtype=torch.float64)
    leaves = [x.clone().requires_grad_(True) for x in (raw, a_log, dt_bias)]
    safe = form == "safe"
    g_log = gates.scalar_log_decay(*leaves[:1], False, safe, *(leaves[1:] if safe else (None, None))).double()
    want = torch.autograd.grad(g_log, leaves if safe else leaves[:1], d_log)
    got = gates.scalar_gate_grads(d_log, raw, False, safe, a_log if safe else None, dt_bias if safe else None)
    for w, g_ in zip(want, got):
        torch.testing.assert_close(g_.double(), w, atol=1e-5, rtol=1e-5)


@gpu
def test_gpu_safe_gate():
    """safe_gate: dg, d_a_log, d_dt_bias against the oracle's log-decay gradient through the transform."""
    d = mod.prepare_data("bfloat16", 2, "70+1+64")
    ho = 2
    raw = torch.randn_like(d["g"])
    a_log, dt_bias = 0.1 * torch.randn(ho, device="cuda"), torch.randn(ho, device="cuda")
    g_log = gates.scalar_log_decay(raw, False, True, a_log, dt_bias)
    d["state_checkpoints"] = orc.forward_checkpoints(d["q"], d["k"], d["v"], g_log, d["beta"], d["cu_seqlens"])[2].to(
        d["q"].dtype)  # the forward of this gate
    want = mod.reference(**{**d, "g": g_log})
    leaves = [x.clone().requires_grad_(True) for x in (raw, a_log, dt_bias)]
    want_raw = torch.autograd.grad(gates.scalar_log_decay(leaves[0], False, True, *leaves[1:]), leaves, want["dg"])
    out = mod.gdn_bprop(d["q"], d["k"], d["v"], raw, d["beta"], d["do"], d["state_checkpoints"], d["cu_seqlens"],
                        safe_gate=True, a_log=a_log, dt_bias=dt_bias)
    assert len(out) == 8
    for got, w in zip((out[3], out[6], out[7]), want_raw):
        rel = float((got - w).norm() / w.norm())
        assert rel < 4e-2, rel


@gpu
def test_gpu_torch_compile_fullgraph():
    """The op traces whole under torch.compile (its body is the custom op) and matches the eager call."""
    d = mod.prepare_data("bfloat16", 2, "70+0+1+64", init=True, dfinal=True)
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], d["state_checkpoints"], d["cu_seqlens"])
    eager = mod.gdn_bprop(*args, initial_state=d["initial_state"], d_final_state=d["d_final_state"])
    compiled = torch.compile(mod.gdn_bprop, fullgraph=True)(*args, initial_state=d["initial_state"],
                                                             d_final_state=d["d_final_state"])
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)


@gpu
def test_gpu_stage_breakdown(monkeypatch, capsys):
    """Where the op's time goes at the issue's anchor shape (B1 T8192 H16): the whole call against its state walk
    (printed; run with -s). The torch steps around the walk are what a fused kernel replaces next."""
    d = mod.prepare_data("bfloat16", 16, "8192")
    args = (d["q"], d["k"], d["v"], d["g"], d["beta"], d["do"], d["state_checkpoints"], d["cu_seqlens"])
    walk_ms = []
    real = mod.kernel_scan

    def timed_scan(io, fn=None, functions=None):
        inner = real(io, fn, functions)

        def scan(*a):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = inner(*a)
            end.record()
            torch.cuda.synchronize()
            walk_ms.append(start.elapsed_time(end))
            return out
        return scan

    mod.gdn_bprop(*args)  # build / load, warm up
    monkeypatch.setattr(mod, "kernel_scan", timed_scan)
    totals = []
    for _ in range(5):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        mod.gdn_bprop(*args)
        end.record()
        torch.cuda.synchronize()
        totals.append(start.elapsed_time(end))
    total, walk = sorted(totals)[2], sorted(walk_ms)[2]
    with capsys.disabled():
        print(f"\ngdn_bprop B1 T8192 H16 bf16: whole call {total * 1e3:.0f} us, state walk {walk * 1e3:.0f} us "
              f"(incl. its tile casts), torch steps {(total - walk) * 1e3:.0f} us")
    assert 0 < walk < total
