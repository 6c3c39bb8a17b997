# SPDX-License-Identifier: Apache-2.0
"""gdn_decode_bf16_wide_vec_t1 / _mtp, gdn_decode_bf16_ilp4, gdn_decode_fp32_mtp_warp: the generated CUDA run on
the CPU (``core.emulate``) against the fp32 oracle on the output and the whole pool (unaddressed slots bit-identical,
inputs unchanged) through the harness's own checks; SASS; on a GPU, every config row, graph replay and FlashInfer
0.7.4 on the same calls."""

import os
import re

import pytest
import torch

from tirx_kernels.core import artifacts
from tirx_kernels.ported.flashinfer.gdn_decode import _gdn_decode as gd
from tirx_kernels.ported.flashinfer.gdn_decode import gdn_decode_bf16_ilp4 as ilp4_mod
from tirx_kernels.ported.flashinfer.gdn_decode import gdn_decode_bf16_wide_vec_mtp as mtp_mod
from tirx_kernels.ported.flashinfer.gdn_decode import gdn_decode_bf16_wide_vec_t1 as mod
from tirx_kernels.ported.flashinfer.gdn_decode import gdn_decode_fp32_mtp_warp as fp32_mod

MODULES = {"t1": mod, "mtp": mtp_mod, "ilp4": ilp4_mod, "fp32": fp32_mod}
# The rows emulated on the CPU (each is a g++ build of its kernel and a batch of 4: 17-118 s on the 2-core CI
# machine, the CI's slowest tests on 2026-12-07, ~780 s in all). CI: the rows that cover each kernel's features
# (padding, output indices, int64 indices, intermediates, verify-only, fp32 at ILP 2); TIRX_EMULATE_FULL=1: every
# row of the wide-vector pair and the other ILP4 / fp32 rows too.
EMULATED_CI = [("t1", "b8_h16_hv16_pad"), ("t1", "b33_h8_hv32_out_idx_i64"),
               ("mtp", "b33_h8_hv32_t2_inter_verify"), ("mtp", "b16_h16_hv16_t3_pad_out_idx_i64"),
               ("ilp4", "t4_b33_h8_hv32_inter_pad_out_idx_i64"), ("fp32", "t8_b8_h4_hv8_inter_out_idx")]
EMULATED = EMULATED_CI if os.environ.get("TIRX_EMULATE_FULL") != "1" else (
    [(w, c["label"]) for w in ("t1", "mtp") for c in MODULES[w].CONFIGS]
    + [("ilp4", "t1_b64_h16_hv32"), ("ilp4", "t4_b33_h8_hv32_inter_pad_out_idx_i64"),
       ("fp32", "t2_b4_h16_hv64_inter"), ("fp32", "t8_b8_h4_hv8_inter_out_idx")])


def _route(m) -> str:
    return getattr(m, "ROUTE", "wide_vec")


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(m, params):
        key = (m.KERNEL_META["name"], artifacts.canonical_params(params))
        if key not in cache:
            cache[key] = emulate.compile(_narrow_warp_sums(codegen(m.get_kernel(**params))))
        return cache[key]
    return get


def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a group of < 32 lanes gets the same butterfly inline."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


@pytest.mark.parametrize("which, label", EMULATED)
def test_harness_rows_emulated(emulated, which, label):
    """The emulated config rows (batch cut to 4) through harness.check_config on the CPU: guarded in-place pool, inputs
    unchanged, the pool comparator; the launch runs the public op's normalization into the emulated kernel."""
    import types

    from tirx_kernels.core import harness

    m = MODULES[which]
    cfg = harness.full_config(m, {**next(c for c in m.CONFIGS if c["label"] == label), "batch": 4})

    def launch(cfg, data):
        n = gd.normalized(data)
        ptrs, scalars, grid, block = gd.kernel_args(**n, schedule=gd.schedule_of(_route(m), 4, cfg["n_vheads"]))
        kern = emulated(m, m.compile_params(**cfg))
        named = {f"{k}_ptr": v for k, v in ptrs.items()}
        kern(*[named[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=grid, block=block).check()

    fake = types.SimpleNamespace(KERNEL_META=m.KERNEL_META, INPLACE=m.INPLACE, COMPARATORS=m.COMPARATORS,
                                 reference=m.reference, prepare_data=lambda **c: m.prepare_data(**c, device="cpu"),
                                 launch=launch, get_baselines=lambda **c: {})
    res = harness.check_config(fake, cfg)
    assert res["status"] == "passed"
    assert res["oracle"]["initial_state"]["slots_written"] >= (0 if cfg.get("disable_state_update") else 3)
    if cfg.get("intermediate"):
        assert res["oracle"]["intermediate_states_buffer"]["slots_written"] == 4


def test_oracle_matches_a_per_row_loop():
    """The vectorized oracle against the recurrence written out for one (n, hv)."""
    data = mod.prepare_data(**{**mod.DEFAULTS, "batch": 2, "n_heads": 2, "n_vheads": 4}, device="cpu")
    want = mod.reference(**data)
    n, hv, h = 1, 3, 1
    q, k = data["q"][n, 0, h].float(), data["k"][n, 0, h].float()
    q = q / torch.sqrt((q * q).sum() + 1e-6) * 128 ** -0.5
    k = k / torch.sqrt((k * k).sum() + 1e-6)
    x = data["a"][n, 0, hv].float() + data["dt_bias"][hv].float()
    g = torch.exp(-torch.exp(data["A_log"][hv]) * torch.log1p(torch.exp(x)))
    beta = torch.sigmoid(data["b"][n, 0, hv].float())
    S = data["initial_state"][int(data["initial_state_indices"][n]), hv].float() * g
    for r in range(128):
        S[r] += beta * (data["v"][n, 0, hv, r].float() - S[r] @ k) * k
    torch.testing.assert_close(want["output"][n, 0, hv], S @ q, atol=1e-4, rtol=1e-4)


def test_nol2norm_rows_stay_in_fp16_range_and_the_flag_matters():
    """Rows without the kernel's L2 norm get prenormalized q / k at norms 2 / 1.3 (``_prenormalized``): the fp32
    oracle's outputs stay far inside fp16's range (raw randn k made them grow past 65504 by token 6-8: inf outputs on
    the H200), and normalizing them anyway would change the result (a kernel ignoring the flag fails)."""
    rows = [(m, c) for m in MODULES.values() for c in m.CONFIGS if c.get("use_qk_l2norm") is False]
    assert len(rows) >= 3
    for m, c in rows:
        cfg = {**m.DEFAULTS, **c, "batch": min(c["batch"], 4)}
        d = m.prepare_data(**cfg, device="cpu")
        want = m.reference(**d)["output"]
        assert torch.isfinite(want).all() and want.abs().max() < 100, c["label"]
        flipped = m.reference(**{**d, "use_qk_l2norm": True})["output"]
        assert (flipped - want).norm() > 0.1 * want.norm(), c["label"]


@pytest.mark.parametrize("which, params", [("t1", {"input_dtype": "bfloat16"}), ("t1", {"input_dtype": "float16"}),
                                           ("mtp", {"input_dtype": "bfloat16"}), ("ilp4", {"input_dtype": "bfloat16"}),
                                           ("fp32", {"input_dtype": "bfloat16", "ilp": 4})])
def test_sass(which, params):
    """No spills or local memory; 16-byte state loads and stores."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    m = MODULES[which]
    sass = testing.build_and_check_sass(m, m.KERNEL_META["name"], params)
    assert re.search(r"LDG\.E(\.[A-Z]+)*\.128", sass) and re.search(r"STG\.E(\.[A-Z]+)*\.128", sass)


def test_rejected_inputs_name_the_argument():
    from tirx_kernels.core.checks import TirxInputError

    d = mod.prepare_data(**{**mod.DEFAULTS, "batch": 2}, device="cpu")
    base = (d["q"], d["k"], d["v"], None, d["A_log"], d["a"], d["dt_bias"], d["b"])
    kw = dict(initial_state=d["initial_state"], initial_state_indices=d["initial_state_indices"])
    cases = [
        ((d["q"][..., :64],) + base[1:], kw, "q"),
        (base[:2] + (d["v"].float(),) + base[3:], kw, "v"),
        (base, {**kw, "initial_state": d["initial_state"].float()}, "initial_state"),
        (base, {**kw, "initial_state": torch.zeros(d["initial_state"].numel() + 8, dtype=torch.bfloat16)[
            1:1 + d["initial_state"].numel()].view(d["initial_state"].shape)}, "initial_state"),  # misaligned base
        (base, {**kw, "initial_state_indices": d["initial_state_indices"].float()}, "initial_state_indices"),
        (base, {}, "state"),
        (base, {**kw, "disable_state_update": True}, "intermediate_states_buffer"),
        (base[:4] + (d["A_log"].bfloat16(),) + base[5:], kw, "A_log"),
    ]
    for args, k, arg in cases:
        with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
            mod.gated_delta_rule_decode_pretranspose(*args, **k)
    with pytest.raises(TirxInputError, match="argument 'q'.*CUDA"):
        mod.gated_delta_rule_decode_pretranspose(*base, **kw)


def test_public_op_compiles_fullgraph_to_its_custom_op(monkeypatch):
    """torch.compile (fullgraph) traces the public op into the route module's custom op (H200 run 1: dynamo failed
    on ``pool.data_ptr() % 16``; the op's module is found by importlib): on CPU tensors, the CUDA check lifted and the
    launch stubbed, the compiled call reaches the op's body (which validates again, alignment included) and its
    writes land in the output and pool; a call of another token count recompiles with symbolic sizes."""
    from tirx_kernels.core import checks

    real = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda *a, cuda=False, **k: real(*a, cuda=False, **k))
    calls = []

    def fake_run(n, route="wide_vec"):
        calls.append((route, n["q"].shape[1]))
        n["out"].fill_(3.0)
        n["pool"].add_(1)

    monkeypatch.setattr(gd, "run", fake_run)
    fn = torch.compile(lambda d, p: gd.gated_delta_rule_decode_pretranspose(
        d["q"], d["k"], d["v"], None, d["A_log"], d["a"], d["dt_bias"], d["b"], initial_state=p,
        initial_state_indices=d["initial_state_indices"])[0], fullgraph=True, backend="eager")
    for which, batch in (("t1", 2), ("mtp", 3), ("mtp", 2)):
        m = MODULES[which]
        d = m.prepare_data(**{**m.DEFAULTS, "batch": batch, "n_heads": 2, "n_vheads": 4, "T": 1 if which == "t1"
                              else batch}, device="cpu")
        pool = d["initial_state"].clone()
        out = fn(d, pool)
        assert calls.pop() == ("wide_vec", d["q"].shape[1]) and not calls
        assert bool((out == 3).all()) and bool((pool == d["initial_state"] + 1).all())


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("which, label", [(w, c["label"]) for w, m in MODULES.items() for c in m.CONFIGS])
def test_gpu_config(which, label):
    m = MODULES[which]
    m.run_test(**next(c for c in m.CONFIGS if c["label"] == label))


@gpu
@pytest.mark.parametrize("which", list(MODULES))
def test_gpu_graph_replay(which):
    from tirx_kernels.core import testing

    m = MODULES[which]
    testing.check_graph_replay(m.KERNEL_META["name"], m.CONFIGS[0]["label"])


@gpu
@pytest.mark.parametrize("pool_mode", [True, False])
def test_gpu_matches_flashinfer(pool_mode):
    flashinfer = pytest.importorskip("flashinfer")
    d = mod.prepare_data(**{**mod.DEFAULTS, "batch": 48, "pad": False})
    args = (d["q"], d["k"], d["v"])
    gates = (d["A_log"], d["a"], d["dt_bias"], d["b"])
    if pool_mode:
        p1, p2 = d["initial_state"].clone(), d["initial_state"].clone()
        kw1 = dict(initial_state=p1, initial_state_indices=d["initial_state_indices"])
        kw2 = dict(initial_state=p2, initial_state_indices=d["initial_state_indices"])
        o1, _ = mod.gated_delta_rule_decode_pretranspose(*args, None, *gates, **kw1)
        o2, _ = flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(*args, None, *gates, **kw2)
    else:
        p1 = d["initial_state"][:48].clone()
        p2 = p1.clone()
        o1, _ = mod.gated_delta_rule_decode_pretranspose(*args, p1, *gates)
        o2, _ = flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(*args, p2, *gates)
    torch.cuda.synchronize()
    torch.testing.assert_close(o1.float(), o2.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(p1.float(), p2.float(), atol=2e-2, rtol=2e-2)


@gpu
def test_gpu_torch_compile():
    d = mod.prepare_data(**{**mod.DEFAULTS, "batch": 5})
    p1, p2 = d["initial_state"].clone(), d["initial_state"].clone()
    gates = (d["A_log"], d["a"], d["dt_bias"], d["b"])
    o1, _ = mod.gated_delta_rule_decode_pretranspose(d["q"], d["k"], d["v"], None, *gates, initial_state=p1,
                                                     initial_state_indices=d["initial_state_indices"])
    fn = torch.compile(lambda p: mod.gated_delta_rule_decode_pretranspose(
        d["q"], d["k"], d["v"], None, *gates, initial_state=p, initial_state_indices=d["initial_state_indices"])[0],
        fullgraph=True)
    o2 = fn(p2)
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(p1, p2, atol=0, rtol=0)


def test_launch_argument_order_is_the_primfuncs():
    """The public op calls the tvm-ffi function positionally: ARG_ORDER / SCALAR_ORDER must be the PrimFunc's."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to trace the kernel")
    f = mtp_mod.get_kernel("bfloat16")
    assert [p.name for p in f.params] == list(gd.ARG_ORDER) + list(gd.SCALAR_ORDER)  # buffers by name


@gpu
@pytest.mark.parametrize("verify", [False, True])
def test_gpu_mtp_matches_flashinfer(verify):
    """T = 4 with an intermediate buffer (a leading slice of a longer cache), with and without the final write."""
    flashinfer = pytest.importorskip("flashinfer")
    d = mtp_mod.prepare_data(**{**mtp_mod.DEFAULTS, "batch": 24, "T": 4, "intermediate": True,
                                "disable_state_update": verify, "pad": True})
    kw = gd.op_kwargs(d)
    ours, ref = dict(kw), dict(kw)
    for x in (ours, ref):
        x["initial_state"] = d["initial_state"].clone()
        x["intermediate_states_buffer"] = d["intermediate_states_buffer"].clone()[:24, :4]
        x["output"] = torch.empty_like(d["output"])
    mtp_mod.gated_delta_rule_decode_pretranspose(**ours)
    flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(**ref)
    torch.cuda.synchronize()
    live = d["initial_state_indices"] >= 0  # a pad entry's output is undefined upstream (slot 0, the null buffer)
    torch.testing.assert_close(ours["output"][live].float(), ref["output"][live].float(), atol=2e-2, rtol=2e-2)
    for key in ("initial_state", "intermediate_states_buffer"):
        torch.testing.assert_close(ours[key][1:].float() if key == "initial_state" else ours[key][live].float(),
                                   ref[key][1:].float() if key == "initial_state" else ref[key][live].float(),
                                   atol=2e-2, rtol=2e-2)


def test_fp32_negative_index_skips_the_request_emulated(emulated):
    """fp32 route: a negative read index leaves that request's output rows, the whole pool and its buffer entry
    as they were (upstream's fp32 MTP convention); the other requests match the oracle."""
    cfg = {**fp32_mod.DEFAULTS, "batch": 3, "T": 2, "n_heads": 2, "n_vheads": 4, "intermediate": True, "pad": True}
    data = fp32_mod.prepare_data(**cfg, device="cpu")
    data["output"].fill_(float("nan"))
    before = {k: data[k].clone() for k in ("initial_state", "intermediate_states_buffer")}
    n = gd.normalized(data)
    want_out, want_pool, want_inter = gd.oracle(**{k: v for k, v in n.items() if k != "out"}, out=data["output"])
    ptrs, scalars, grid, block = gd.kernel_args(**n, schedule=gd.schedule_of("fp32_warp", 3, 4))
    kern = emulated(fp32_mod, fp32_mod.compile_params(**cfg))
    named = {f"{k}_ptr": v for k, v in ptrs.items()}
    kern(*[named[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=grid, block=block).check()
    assert bool(torch.isnan(data["output"][1]).all()) and not bool(torch.isnan(data["output"][[0, 2]]).any())
    torch.testing.assert_close(data["output"][[0, 2]].float(), want_out[[0, 2]], atol=2e-2, rtol=2e-2)
    slots = int(before["initial_state"].shape[0])
    assert torch.equal(data["intermediate_states_buffer"][1], before["intermediate_states_buffer"][1])
    torch.testing.assert_close(data["intermediate_states_buffer"], want_inter, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(data["initial_state"], want_pool, atol=1e-4, rtol=1e-4)
    changed = (data["initial_state"] != before["initial_state"]).reshape(slots, -1).any(1)
    assert int(changed.sum()) == 2  # the two live requests' slots only


def test_fp32_rejects_a_bf16_pool():
    from tirx_kernels.core.checks import TirxInputError

    d = fp32_mod.prepare_data(**{**fp32_mod.DEFAULTS, "batch": 2, "state_dtype": "bfloat16"}, device="cpu")
    with pytest.raises(TirxInputError, match="argument 'initial_state'.*float32"):
        fp32_mod.gated_delta_rule_mtp(d["q"], d["k"], d["v"], d["initial_state"], d["initial_state_indices"],
                                      d["A_log"], d["a"], d["dt_bias"], d["b"])


@gpu
@pytest.mark.parametrize("verify", [False, True])
def test_gpu_fp32_mtp_matches_flashinfer(verify):
    """fp32 state, T = 4, intermediate buffer, with and without the final write: FlashInfer 0.7.4's
    gated_delta_rule_mtp on copies (catalog tolerances: output 1e-3 / 5e-3, state and intermediates 2e-5)."""
    flashinfer = pytest.importorskip("flashinfer")
    d = fp32_mod.prepare_data(**{**fp32_mod.DEFAULTS, "batch": 24, "T": 4, "intermediate": True,
                                 "disable_state_update": verify})
    runs = []
    for fn in (fp32_mod.gated_delta_rule_mtp, flashinfer.gdn_decode.gated_delta_rule_mtp):
        # a contiguous (B, T, ...) buffer: upstream reshapes (and would copy) a strided one
        pool, inter = d["initial_state"].clone(), d["intermediate_states_buffer"][:, :4].contiguous()
        out = torch.empty_like(d["output"])
        fn(d["q"], d["k"], d["v"], pool, d["initial_state_indices"], d["A_log"], d["a"], d["dt_bias"], d["b"],
           output=out, intermediate_states_buffer=inter, disable_state_update=verify)
        runs.append((out, pool, inter))
    torch.cuda.synchronize()
    (o1, p1, i1), (o2, p2, i2) = runs
    torch.testing.assert_close(o1.float(), o2.float(), atol=1e-3, rtol=5e-3)
    torch.testing.assert_close(p1, p2, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(i1, i2, atol=2e-5, rtol=2e-5)


@gpu
@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_gpu_ilp4_matches_flashinfer(T):  # noqa: N803
    """The ILP-4 schedule against FlashInfer 0.7.4's bf16 decode at each of its token classes."""
    flashinfer = pytest.importorskip("flashinfer")
    d = ilp4_mod.prepare_data(**{**ilp4_mod.DEFAULTS, "batch": 8, "T": T, "n_heads": 4, "n_vheads": 8})
    kw = gd.op_kwargs(d)
    ours, ref = dict(kw), dict(kw)
    for x in (ours, ref):
        x["initial_state"] = d["initial_state"].clone()
        x["output"] = torch.empty_like(d["output"])
    ilp4_mod.gated_delta_rule_decode_ilp4(**ours)
    flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(**ref)
    torch.cuda.synchronize()
    torch.testing.assert_close(ours["output"].float(), ref["output"].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours["initial_state"].float(), ref["initial_state"].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("m", [mod, ilp4_mod, mtp_mod, fp32_mod], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_flashinfer_reference_without_the_cutedsl_stack_is_a_missing_reference(m, monkeypatch):
    """FlashInfer imports without CuTe-DSL, then its decode asserts an fp32 pool or calls None (H100 bench,
    2026-12-07): the reference must say it is missing (ImportError: tests skip, the bench records it), not fail."""
    import importlib.util
    import sys
    import types

    fake = types.ModuleType("flashinfer")
    fake.gdn_decode = types.ModuleType("flashinfer.gdn_decode")
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_decode", fake.gdn_decode)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cutlass" else real(name, *a))
    with pytest.raises(ImportError, match="CuTe-DSL"):
        m.get_baselines(**m.CONFIGS[0])["flashinfer"]()
