# SPDX-License-Identifier: Apache-2.0
"""The harness's optional protocol hooks (PROTOCOL.md): in-place outputs, FP8 / integer outputs, per-output
comparators, workspaces, ops of several launches, gradients, and the FP8 bench ceiling.

Each hook is exercised through the whole check (``harness.check_config``) by fake kernel modules whose ``launch``
runs torch ops: on CPU tensors here, and on the GPU through ``run_test`` (with its arch gate) where CUDA exists.
"""

import itertools
import types

import pytest
import torch

from tirx_kernels.core import bench, harness
from tirx_kernels.core.arch import UnsupportedArchError
from tirx_kernels.core.harness import KernelCheckError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="needs a CUDA device"))]


def fake(device: str, prepare, reference, launch, **hooks):
    """A kernel module of plain torch ops; ``prepare(g, device)`` makes its tensors from a generator seeded anew
    for every call (a graph replay's second ``prepare_data`` draws other values)."""
    seeds = itertools.count()

    def prepare_data(**cfg):
        return prepare(torch.Generator(device=device).manual_seed(next(seeds)), device)

    return types.SimpleNamespace(
        KERNEL_META={"name": "fake", "category": "test", "runtime_cuda_archs": ["sm_90a"], "description": "fake"},
        CONFIGS=[{"label": "only"}], prepare_data=prepare_data, reference=reference, launch=launch, **hooks)


def run(mod):
    """``run_test`` on the GPU (skips off sm_90a), the same checks without the arch gate on the CPU."""
    device = mod.prepare_data()
    device = next(v.device.type for v in device.values() if isinstance(v, torch.Tensor))
    if device == "cuda":
        try:
            return harness.run_test(mod)
        except UnsupportedArchError as e:
            pytest.skip(str(e))
    return harness.check_config(mod, harness.full_config(mod, {}))


def _randn(g, device, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=g, device=device).to(dtype)


def _nan(device, *shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# ------------------------------------------------------------------ a module with no hooks: checked as before


@pytest.mark.parametrize("device", DEVICES)
def test_plain_module_is_checked_as_before(device):
    def launch(cfg, data):
        torch.mul(data["x"], data["w"], out=data["out"])

    mod = fake(device, lambda g, d: {"x": _randn(g, d, 64, 32), "w": _randn(g, d, 32), "out": _nan(d, 64, 32)},
               lambda x, w, **_: {"out": x.float() * w.float()}, launch)
    res = run(mod)
    assert res["status"] == "passed" and set(res["oracle"]) == {"out"} and "gradients" not in res

    def scribbles_on_x(cfg, data):
        launch(cfg, data)
        data["x"][0, 0] += 1

    mod.launch = scribbles_on_x
    with pytest.raises(KernelCheckError, match="input 'x' was modified"):
        run(mod)


@pytest.mark.parametrize("device", DEVICES)
def test_baselines_get_fresh_output_buffers_like_the_bench_gives_them(device):
    """An upstream op that writes into a given ``out`` (FlashInfer's convention) reads the buffer from its data
    dict: the correctness check must hand it one (fresh, unpoisoned, the output's shape and dtype)."""
    seen = {}

    def launch(cfg, data):
        torch.mul(data["x"], data["w"], out=data["out"])

    def writes_into_out(d):
        seen["out"] = (tuple(d["out"].shape), d["out"].dtype, bool(torch.isnan(d["out"]).all()))
        torch.mul(d["x"], d["w"], out=d["out"])
        return {"out": d["out"]}

    mod = fake(device, lambda g, d: {"x": _randn(g, d, 64, 32), "w": _randn(g, d, 32), "out": _nan(d, 64, 32)},
               lambda x, w, **_: {"out": x.float() * w.float()}, launch,
               get_baselines=lambda **cfg: {"torch": lambda: writes_into_out})
    res = run(mod)
    assert res["references"]["torch"]["status"] == "passed"
    assert seen["out"][:2] == ((64, 32), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_a_reference_that_refuses_the_config_is_skipped_with_its_reason(device):
    """A reference installed but refusing this config's shape (cuBLASLt's blockwise FP8 at N % 16 != 0 raised from
    the call on the H100) is a missing reference for the config, reported, not an error of our kernel's test."""
    def launch(cfg, data):
        torch.mul(data["x"], data["w"], out=data["out"])

    def refuses(d):
        raise ImportError("cuBLASLt refuses (64, 32)")

    mod = fake(device, lambda g, d: {"x": _randn(g, d, 64, 32), "w": _randn(g, d, 32), "out": _nan(d, 64, 32)},
               lambda x, w, **_: {"out": x.float() * w.float()}, launch,
               get_baselines=lambda **cfg: {"cublas": lambda: refuses})
    res = run(mod)
    ref = res["references"]["cublas"]
    assert ref["status"] == "skipped" and "refuses (64, 32)" in ref["reason"]


# ------------------------------------------------------------------ INPLACE


def _inplace_module(device, launch, out_name="x", **hooks):
    return fake(device, lambda g, d: {"x": _randn(g, d, 64, 32), "w": _randn(g, d, 32)},
                lambda x, w, **_: {out_name: x.float() * w.float()}, launch, INPLACE={out_name: "x"}, **hooks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_name", ["x", "y"])
def test_inplace_output_keeps_its_input_and_is_checked(device, out_name):
    seen = {}

    def baseline():
        def fn(data):
            seen["x"] = data["x"].clone()
            return {out_name: data["x"] * data["w"]}
        return fn

    mod = _inplace_module(device, lambda cfg, data: data["x"].mul_(data["w"]), out_name,
                          get_baselines=lambda **cfg: {"torch": baseline})
    res = run(mod)
    assert res["references"]["torch"]["status"] == "passed"
    assert torch.isfinite(seen["x"].float()).all()  # the baseline saw the input as it was, not the result


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_guard_bands_and_other_inputs_are_still_checked(device):
    def past_the_end(cfg, data):
        x = data["x"]
        x.mul_(data["w"])
        torch.as_strided(x, (1,), (1,), x.storage_offset() + x.numel()).fill_(0)

    with pytest.raises(KernelCheckError, match="outside in-place input 'x'"):
        run(_inplace_module(device, past_the_end))

    def changes_w(cfg, data):
        data["x"].mul_(data["w"])
        data["w"].zero_()

    with pytest.raises(KernelCheckError, match="input 'w' was modified"):
        run(_inplace_module(device, changes_w))
    with pytest.raises(KernelCheckError, match=r"fake\[x\].*differ"):  # the in-place result is compared
        run(_inplace_module(device, lambda cfg, data: data["x"].add_(data["w"])))


def test_inplace_entry_must_name_an_output_and_an_input():
    mod = _inplace_module("cpu", lambda cfg, data: None)
    mod.INPLACE = {"x": "nope"}
    with pytest.raises(KeyError, match="INPLACE entry"):
        run(mod)


# ------------------------------------------------------------------ output dtypes: FP8, integer, packed bytes


def _quant_module(device, dtype, launch, **hooks):
    return fake(device, lambda g, d: {"x": _randn(g, d, 128, 64, dtype=torch.float32),
                                      "q": torch.empty(128, 64, dtype=dtype, device=d)},
                lambda x, **_: {"q": x}, launch, **hooks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_outputs_are_compared_after_upcast(device, dtype):
    run(_quant_module(device, dtype, lambda cfg, data: data["q"].copy_(data["x"].to(dtype))))

    def two_units_off(cfg, data):  # codes of one sign are ordered: +2 is two units in the last place
        data["q"].copy_(data["x"].abs().to(dtype))
        data["q"].view(torch.uint8).add_(2)

    mod = _quant_module(device, dtype, two_units_off)
    mod.reference = lambda x, **_: {"q": x.abs()}
    with pytest.raises(KernelCheckError, match=r"fake\[q\].*differ"):
        run(mod)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_integer_outputs_must_match_exactly(device, dtype):
    def prepare(g, d):
        return {"x": torch.randint(0, 100, (64, 16), generator=g, device=d, dtype=torch.int32),
                "out": torch.empty(64, 16, dtype=dtype, device=d)}

    def launch(cfg, data):
        data["out"].copy_(data["x"] + 1)

    mod = fake(device, prepare, lambda x, **_: {"out": (x + 1).to(dtype)}, launch)
    assert run(mod)["oracle"]["out"]["max_abs"] == 0.0
    mod.launch = lambda cfg, data: data["out"].copy_(data["x"] + 1 + (data["x"] == data["x"][3, 5]).to(dtype))
    with pytest.raises(KernelCheckError, match=r"of 1024 elements differ.*rtol=0.0"):
        run(mod)


def test_unknown_output_dtype_names_the_hooks_instead_of_a_key_error():
    mod = _quant_module("cpu", torch.complex64, lambda cfg, data: data["q"].copy_(data["x"]))
    with pytest.raises(KernelCheckError, match=r"no tolerance for complex64 outputs.*COMPARATORS"):
        run(mod)


# ------------------------------------------------------------------ COMPARATORS


@pytest.mark.parametrize("device", DEVICES)
def test_bit_exact_comparator_rejects_one_unit_that_the_fp8_tolerance_allows(device):
    dtype = torch.float8_e4m3fn

    def one_unit_off(cfg, data):
        data["q"].copy_(data["x"].abs().to(dtype))
        data["q"].view(torch.uint8)[7, 3] += 1

    mod = _quant_module(device, dtype, one_unit_off)
    mod.reference = lambda x, **_: {"q": x.abs().to(dtype)}
    run(mod)  # within the default FP8 tolerance
    mod.COMPARATORS = {"q": harness.bit_exact}
    with pytest.raises(KernelCheckError, match=r"fake\[q\] against the fp32 oracle: 1 of 8192 .*\(7, 3\)"):
        run(mod)
    mod.launch = lambda cfg, data: data["q"].copy_(data["x"].abs().to(dtype))
    assert run(mod)["oracle"]["q"] == {"mismatches": 0}


def _topk_module(device, launch, ordered=False):
    def prepare(g, d):
        scores = torch.randint(0, 6, (32, 40), generator=g, device=d).to(torch.bfloat16)  # many ties
        return {"scores": scores, "idx": torch.empty(32, 4, dtype=torch.int64, device=d)}

    def reference(scores, **_):
        return {"idx": torch.topk(scores.float(), 4, dim=-1).indices}

    return fake(device, prepare, reference, launch,
                COMPARATORS={"idx": harness.topk_indices("scores", ordered=ordered)})


def _stable_topk(scores, k, descending_index):
    """Top-k picking the last (or first) of tied scores: another valid answer than torch.topk's."""
    n = scores.shape[-1]
    order = torch.arange(n, device=scores.device).flip(0) if descending_index else torch.arange(n, device=scores.device)
    picked = torch.sort(scores[:, order].float(), dim=-1, descending=True, stable=True).indices[:, :k]
    return order[picked]


@pytest.mark.parametrize("device", DEVICES)
def test_topk_comparator_accepts_any_tied_choice_and_rejects_wrong_picks(device):
    for last in (False, True):
        mod = _topk_module(device, lambda cfg, data, last=last: data["idx"].copy_(
            _stable_topk(data["scores"], 4, last)))
        run(mod)
    scores = mod.prepare_data()["scores"]
    assert not torch.equal(_stable_topk(scores, 4, True), _stable_topk(scores, 4, False))  # ties really differ
    run(_topk_module(device, lambda cfg, data: data["idx"].copy_(_stable_topk(data["scores"], 4, True)),
                     ordered=True))

    def wrong(cfg, data):
        data["idx"].copy_(torch.topk(data["scores"].float(), 4, dim=-1, largest=False).indices)

    with pytest.raises(KernelCheckError, match="pick other scores"):
        run(_topk_module(device, wrong))

    def twice(cfg, data):
        data["idx"].copy_(torch.topk(data["scores"].float(), 4, dim=-1).indices)
        data["idx"][5, 1] = data["idx"][5, 0]

    with pytest.raises(KernelCheckError, match="picked twice"):
        run(_topk_module(device, twice))

    def reversed_order(cfg, data):
        data["idx"].copy_(torch.topk(data["scores"].float(), 4, dim=-1).indices.flip(-1))

    run(_topk_module(device, reversed_order))
    with pytest.raises(KernelCheckError, match="pick other scores"):
        run(_topk_module(device, reversed_order, ordered=True))


def test_plain_integer_compare_would_reject_a_tied_choice():
    """Why the comparator exists: the default exact comparison of indices fails on a valid tie-break."""
    mod = _topk_module("cpu", lambda cfg, data: data["idx"].copy_(_stable_topk(data["scores"], 4, True)))
    mod.COMPARATORS = {}
    with pytest.raises(KernelCheckError, match="differ"):
        run(mod)


# ------------------------------------------------------------------ WORKSPACES and several launches


def _two_launch_module(device, **hooks):
    """Two launches through a scratch tensor: ws = x * w, then out = ws + x."""
    def prepare(g, d):
        return {"x": _randn(g, d, 64, 32), "w": _randn(g, d, 32), "ws": torch.zeros(64, 32, device=d),
                "out": _nan(d, 64, 32)}

    def launch(cfg, data):
        torch.mul(data["x"].float(), data["w"].float(), out=data["ws"])
        torch.add(data["ws"], data["x"].float(), out=data["out"])

    return fake(device, prepare, lambda x, w, **_: {"out": x.float() * w.float() + x.float()}, launch, **hooks)


@pytest.mark.parametrize("device", DEVICES)
def test_workspace_may_change_but_not_overflow(device):
    with pytest.raises(KernelCheckError, match="input 'ws' was modified"):
        run(_two_launch_module(device))
    mod = _two_launch_module(device, WORKSPACES=("ws",))
    assert set(run(mod)["oracle"]) == {"out"}
    inner = mod.launch

    def overflows(cfg, data):
        inner(cfg, data)
        ws = data["ws"]
        torch.as_strided(ws, (1,), (1,), ws.storage_offset() - 1).fill_(0)

    mod.launch = overflows
    with pytest.raises(KernelCheckError, match="outside workspace 'ws'"):
        run(mod)


# ------------------------------------------------------------------ GRADIENTS


class _WrongBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * 1.1, (g * x).sum(0)  # dx 10 % off


def _grad_module(device, op):
    def prepare(g, d):
        return {"x": _randn(g, d, 256, 64), "w": _randn(g, d, 64), "out": _nan(d, 256, 64)}

    def launch(cfg, data):
        data["out"].copy_(op(data["x"], data["w"]))

    return fake(device, prepare, lambda x, w, **_: {"out": x.float() * w.float()}, launch,
                GRADIENTS=("x", "w"), launch_autograd=lambda cfg, data: {"out": op(data["x"], data["w"])})


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_through_autograd_against_the_fp32_oracle(device):
    res = run(_grad_module(device, torch.mul))
    assert set(res["gradients"]) == {"x", "w"} and res["gradients"]["w"]["rel_fro"] < 1e-2
    with pytest.raises(KernelCheckError, match=r"fake\[dx\].*the fp32 oracle's autograd"):
        run(_grad_module(device, _WrongBackward.apply))
    with pytest.raises(KernelCheckError, match="no output of launch_autograd is differentiable"):
        run(_grad_module(device, lambda x, w: (x * w).detach()))


# ------------------------------------------------------------------ graph replay (testing.check_graph_replay)


def _replay_modules(device):
    """One module per hook the replay must honour: in-place, workspace (two launches), integer output."""
    def prepare_int(g, d):
        return {"x": torch.randint(0, 100, (64, 16), generator=g, device=d, dtype=torch.int32),
                "out": torch.empty(64, 16, dtype=torch.int32, device=d)}

    def prepare_bcast(g, d):  # FlashInfer's per-head inputs: a broadcast (stride-0) view of one value a head
        return {"x": _randn(g, d, 64, 8, 16), "dt": torch.randn(8, generator=g, device=d)[:, None].expand(8, 16),
                "out": _nan(d, 64, 8, 16)}

    return [_inplace_module(device, lambda cfg, data: data["x"].mul_(data["w"])),
            _two_launch_module(device, WORKSPACES=("ws",)),
            fake(device, prepare_int, lambda x, **_: {"out": x + 1},
                 lambda cfg, data: torch.add(data["x"], 1, out=data["out"])),
            fake(device, prepare_bcast, lambda x, dt, **_: {"out": x.float() * dt},
                 lambda cfg, data: torch.mul(data["x"], data["dt"], out=data["out"]))]


def test_refill_for_replay_restores_inputs_and_poisons_fresh_outputs():
    for mod in _replay_modules("cpu"):
        data = mod.prepare_data()
        mod.launch({}, data)  # the captured launch has run once: in-place inputs and workspaces changed
        fresh = mod.prepare_data()
        expected = mod.reference(**fresh)
        outputs = harness.refill_for_replay(mod, data, fresh, expected)
        for k, v in outputs.items():
            if k not in getattr(mod, "INPLACE", {}):
                assert (harness._bits(v) == harness._bits(harness.poison_(v.clone()))).all()
        mod.launch({}, data)  # the replay
        harness.check_outputs(mod, outputs, expected, "oracle", {}, fresh)


def test_refill_of_a_broadcast_input_refuses_values_that_vary_along_its_broadcast_dims():
    dst = torch.zeros(8)[:, None].expand(8, 16)
    harness._refill("dt", dst, torch.arange(8.0)[:, None].expand(8, 16).contiguous())
    assert torch.equal(dst, torch.arange(8.0)[:, None].expand(8, 16))
    with pytest.raises(ValueError, match="input 'dt' is a broadcast view"):
        harness._refill("dt", dst, torch.randn(8, 16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_check_replay_on_the_gpu():
    for mod in _replay_modules("cuda"):
        harness.check_replay(mod, {})


# ------------------------------------------------------------------ bench: the FP8 compute ceiling


CEIL = {"copy_tb_s": 4.0, "bf16_tflop_s": 800.0}


def test_rows_are_judged_against_the_ceiling_their_roofline_names(monkeypatch):
    monkeypatch.setitem(bench.COMPUTE_CEILINGS, "fp8", lambda: 1600.0)
    model = {"bytes": 1000, "flops": 2 * 8192**3}
    bf16 = bench.roofline_stats(model, us=2000.0, ceil=CEIL)
    fp8 = bench.roofline_stats({**model, "ceiling": "fp8"}, us=2000.0, ceil=CEIL)
    assert bf16["compute_ceiling"] == "bf16" and bf16["compute_ceiling_tflop_s"] == 800.0
    assert fp8["compute_ceiling"] == "fp8" and fp8["compute_ceiling_tflop_s"] == 1600.0
    assert fp8["pct_of_roofline"] == pytest.approx(bf16["pct_of_roofline"] / 2)
    assert bench.roofline_stats({**model, "ceiling": "fp8"}, 2000.0, {**CEIL, "fp8_tflop_s": 400.0})[
        "compute_ceiling_tflop_s"] == 400.0  # a ceiling measured in the same run wins
    with pytest.raises(ValueError, match="unknown compute ceiling 'fp4'"):
        bench.roofline_stats({**model, "ceiling": "fp4"}, 2000.0, CEIL)


def test_bench_row_records_the_fp8_ceiling_it_used(monkeypatch):
    from tirx_kernels.core import arch

    monkeypatch.setattr(bench, "ceilings", lambda: dict(CEIL))
    monkeypatch.setitem(bench.COMPUTE_CEILINGS, "fp8", lambda: 1600.0)
    monkeypatch.setattr(bench, "time_calls", lambda fns, **kw: {n: {"median_us": 100.0, "rounds_us": [100.0],
                                                                    "timer": "events-cold-l2"} for n in fns})
    monkeypatch.setattr(arch, "check_arch", lambda meta, device=None: "sm_90a")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    mod = _grad_module("cpu", torch.mul)
    mod.roofline = lambda **cfg: {"bytes": 10, "flops": 16 * 10**10, "ceiling": "fp8"}
    row = bench.bench_config(mod, {})
    assert row["compute_ceiling"] == "fp8" and row["ceilings"]["fp8_tflop_s"] == 1600.0
    assert row["pct_of_ceiling"] == pytest.approx(100.0 * 16e10 / 1600e6 / 100.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp8_ceiling_is_measured_with_scaled_mm():
    try:
        tflops = bench.fp8_tflop_s()
    except RuntimeError as e:  # cuBLASLt FP8 needs sm_89+
        if torch.cuda.get_device_capability() < (8, 9):
            pytest.skip(str(e))
        raise
    assert tflops > bench.ceilings()["bf16_tflop_s"]


def test_compare_to_low_precision_bounds_the_error_by_the_plain_computation():
    """Passes at the low-precision computation's own error; refuses twice past it (max or Frobenius), NaN, shapes."""
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(64, 96, generator=g, dtype=torch.float64).float()
    lowp = ref.bfloat16().float()
    stats = harness.compare_to_low_precision("x", lowp, ref, lowp, "the oracle")
    assert stats["max_abs"] == stats["max_abs_low_precision"] > 0
    spike = lowp.clone()
    spike[5, 7] += 3 * stats["max_abs_low_precision"] + 0.01
    with pytest.raises(KernelCheckError, match="max_abs"):
        harness.compare_to_low_precision("x", spike, ref, lowp, "the oracle")
    with pytest.raises(KernelCheckError, match="max_abs"):  # 2.2x the error everywhere
        harness.compare_to_low_precision("x", ref + 2.2 * (lowp - ref), ref, lowp, "the oracle", floor=0.0)
    flat = ref + 1.9 * stats["max_abs_low_precision"] * torch.sign(lowp - ref)  # within the max, not on the whole
    with pytest.raises(KernelCheckError, match="rel_fro"):
        harness.compare_to_low_precision("x", flat, ref, lowp, "the oracle", floor=0.0)
    nan = lowp.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(KernelCheckError, match="not finite"):
        harness.compare_to_low_precision("x", nan, ref, lowp, "the oracle")
    with pytest.raises(KernelCheckError, match="shapes"):
        harness.compare_to_low_precision("x", lowp[:, :5], ref, lowp, "the oracle")
