# SPDX-License-Identifier: Apache-2.0
"""recurrent_kda_decode_one_warp / _grouped: the generated CUDA run on the CPU (``core.emulate``) against the fp32
oracle on the output and the whole pool (unaddressed slots bit-identical, inputs unchanged, poisoned outputs)
through the harness's own checks; the oracle against a per-row loop; input validation; SASS; on a GPU, every
config row, graph replay, torch.compile and FlashInfer 0.7.4 / fla-core on the same calls."""

import re

import pytest
import torch

from tirx_kernels.core import artifacts
from tirx_kernels.ported.flashinfer.kda import _kda_decode as kd
from tirx_kernels.ported.flashinfer.kda import _protocol as proto
from tirx_kernels.ported.flashinfer.kda import recurrent_kda_decode_grouped as grouped_mod
from tirx_kernels.ported.flashinfer.kda import recurrent_kda_decode_one_warp as one_warp_mod

MODULES = {"one_warp": one_warp_mod, "grouped": grouped_mod}
# Emulation is slow (one host thread per CUDA thread): representative rows, small batch and head counts.
EMULATED = [("one_warp", "hv16_b8_lb"), ("one_warp", "h8_hv16_b16_log_dense"),
            ("one_warp", "hv16_b32_softplus_logit_src"), ("one_warp", "hv16_b16_lb_nobias_nol2_pad"),
            ("grouped", "dec_h8_hv16_b4_softplus_logit_pad"), ("grouped", "ver_t4_hv16_b8_nacc_pad"),
            ("grouped", "ver_t3_h8_hv16_b4_log_src"), ("grouped", "ver_t4_hv16_b4_dense_nol2")]


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
    """cuda_cpu.h has a stand-in for the full-warp sum only: a group of < 32 lanes gets the same butterfly inline
    (the same helper as test_gdn_decode.py's; a candidate for core.emulate)."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


def _small(cfg: dict) -> dict:
    """The row at 2..4 entries and at most 4 value heads (the schedule is forced, so the one-warp rule's
    B * HV >= 128 need not hold)."""
    ratio = cfg["n_vheads"] // cfg["n_heads"]
    hv = min(cfg["n_vheads"], 4)
    return {**cfg, "batch": min(cfg["batch"], 3 if cfg.get("T", 1) > 1 else 4), "n_vheads": hv,
            "n_heads": max(1, hv // ratio)}


@pytest.mark.parametrize("which, label", EMULATED)
def test_harness_rows_emulated(emulated, which, label):
    """Config rows through harness.check_config on the CPU: guarded in-place pool, poisoned output, inputs
    unchanged, the pool comparator; the launch runs the public op's normalization into the emulated kernel."""
    import types

    from tirx_kernels.core import harness

    m = MODULES[which]
    cfg = _small(harness.full_config(m, next(c for c in m.CONFIGS if c["label"] == label)))
    params = m.compile_params(**cfg)

    def launch(cfg, data):
        n = proto.normalized(data)
        ptrs, scalars, grid, block = kd.kernel_args(**n, schedule=params["schedule"])
        kern = emulated(m, params)
        named = {f"{k}_ptr": v for k, v in ptrs.items()}
        kern(*[named[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=grid, block=block).check()

    fake = types.SimpleNamespace(KERNEL_META=m.KERNEL_META, INPLACE=m.INPLACE, COMPARATORS=m.COMPARATORS,
                                 reference=m.reference, prepare_data=lambda **c: m.prepare_data(**c, device="cpu"),
                                 launch=launch, get_baselines=lambda **c: {})
    res = harness.check_config(fake, cfg)
    assert res["status"] == "passed"
    stats = res["oracle"]["initial_state"]
    live = cfg["batch"] - (1 if cfg["pad"] else 0)
    assert stats["slots_written"] >= live * cfg.get("T", 1) - (1 if cfg["pad"] and cfg.get("T", 1) > 1 else 0)
    assert stats["slots_untouched"] >= 1


def test_public_op_end_to_end_emulated(emulated, monkeypatch):
    """recurrent_kda itself on CPU tensors (the CUDA check lifted, the loaded function replaced by the emulated
    kernel called with the op's positional arguments): speculative T = 2 without a pool (zeros, B * T slots),
    no output buffer, the grouped dispatch; against the oracle."""
    from tirx_kernels.core import checks
    from tirx_kernels.core.lang import delta_rule as dr

    real_tensor = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda op, name, t, cuda=False, **kw: real_tensor(op, name, t, cuda=False,
                                                                                          **kw))
    monkeypatch.setattr(kd, "_FUNCTIONS", {})

    def get_function(module, params, device=None):
        kern = emulated(module, params)
        rows, lanes, rpt = kd.SCHEDULES[params["schedule"]]

        def fn(*args):
            a = dict(zip(dr.ARG_ORDER + dr.SCALAR_ORDER, args))
            named = {f"{k}_ptr": a[k] for k in dr.ARG_ORDER}
            kern(*[named[p.name] if p.pointer else a[p.name] for p in kern.params],
                 grid=(a["batch"], a["n_vheads"] * (128 // rows)), block=(dr.threads_of(rows, lanes, rpt),)).check()
        return fn

    monkeypatch.setattr(kd.runtime, "get_function", get_function)
    d = grouped_mod.prepare_data(**{**grouped_mod.DEFAULTS, "batch": 2, "T": 2, "n_heads": 1, "n_vheads": 2,
                                    "gate": "softplus", "form": "dense"}, device="cpu")
    kw = {**proto.op_kwargs(d), "initial_state": None, "output": None, "output_final_state": True}
    out, state = kd.recurrent_kda(**kw)
    zero = torch.zeros(4, 2, 128, 128, dtype=torch.bfloat16)
    want_out, want_state = kd.oracle(**kd.normalize(**{**{k: v for k, v in kw.items() if k not in (
        "output", "output_final_state")}, "initial_state": zero.clone()}))
    torch.testing.assert_close(out.float(), want_out, atol=2e-3, rtol=2e-2)
    torch.testing.assert_close(state.float(), want_state.float(), atol=2e-2, rtol=2e-2)
    assert state.float().abs().sum() > 0


def test_oracle_matches_a_per_row_loop():
    """The oracle against the recurrence written out for one (n, hv), lower-bound gate, two tokens."""
    cfg = {**grouped_mod.DEFAULTS, "batch": 2, "T": 2, "n_heads": 2, "n_vheads": 4}
    data = grouped_mod.prepare_data(**cfg, device="cpu")
    want = grouped_mod.reference(**data)
    n, hv, h = 1, 3, 1
    S = data["initial_state"][int(data["ssm_state_indices"][n, 0]), hv].float()
    for t in range(2):
        q, k = data["q"][n, t, h].float(), data["k"][n, t, h].float()
        q = q / torch.sqrt((q * q).sum() + 1e-6) * 128 ** -0.5
        k = k / torch.sqrt((k * k).sum() + 1e-6)
        x = data["g"][n, t, hv].float() + data["dt_bias"][h * 128:(h + 1) * 128]
        gate = torch.exp(-5.0 * torch.sigmoid(torch.exp(data["A_log"][h]) * x))
        beta = data["beta"][n, t, hv].float()
        S = S * gate[None, :]
        for r in range(128):
            S[r] += beta * (data["v"][n, t, hv, r].float() - S[r] @ k) * k
        torch.testing.assert_close(want["output"][n, t, hv], S @ q, atol=1e-4, rtol=1e-4)
        slot = int(data["ssm_state_indices"][n, t])
        torch.testing.assert_close(want["initial_state"][slot, hv].float(), S, atol=1e-4, rtol=8e-3)


def test_template_oracle_is_gdn_with_a_constant_gate_row():
    """GDN decode is the template with every key channel gated alike: the KDA oracle with g = log(GDN's gate)
    broadcast over K equals the GDN port's oracle (the ground for moving gdn_decode onto core.lang.delta_rule).
    Built from the GDN module's data by FlashInfer's argument names only."""
    from tirx_kernels.core import delta_rule_ref
    from tirx_kernels.ported.flashinfer.gdn_decode import gdn_decode_bf16_wide_vec_t1 as gdn

    d = gdn.prepare_data(**{**gdn.DEFAULTS, "batch": 3, "n_heads": 2, "n_vheads": 4}, device="cpu")
    want = gdn.reference(**d)
    x = d["a"].float() + d["dt_bias"].float()
    log_gate = -torch.exp(d["A_log"]) * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)  # (B, T, HV)
    out, pool = delta_rule_ref.decode(d["initial_state"], d["q"], d["k"], d["v"],
                                      log_gate[..., None].expand(-1, -1, -1, 128), torch.sigmoid(d["b"].float()),
                                      d["initial_state_indices"].view(-1, 1), 128 ** -0.5)
    torch.testing.assert_close(out, want["output"].float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(pool.float(), want["initial_state"].float(), atol=1e-2, rtol=8e-3)


def test_dispatch_follows_upstream():
    assert kd.schedule_of(8, 1, 16)[:2] == ("recurrent_kda_decode_one_warp", "one_warp")
    assert kd.schedule_of(7, 1, 16)[:2] == ("recurrent_kda_decode_grouped", "grouped_t1")
    assert kd.schedule_of(512, 4, 32)[:2] == ("recurrent_kda_decode_grouped", "grouped_mtp")


@pytest.mark.parametrize("which, params", [("one_warp", {"schedule": "one_warp", "max_tokens": 1}),
                                           ("grouped", {"schedule": "grouped_mtp", "max_tokens": 8})])
def test_sass(which, params):
    """No spills or local memory; 16-byte state loads and stores."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    m = MODULES[which]
    sass = testing.build_and_check_sass(m, m.KERNEL_META["name"], params)
    assert re.search(r"LDG\.E(\.[A-Z]+)*\.128", sass) and re.search(r"STG\.E(\.[A-Z]+)*\.128", sass)


def test_launch_argument_order_is_the_primfuncs():
    """The public op calls the tvm-ffi function positionally: ARG_ORDER / SCALAR_ORDER must be the PrimFunc's."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to trace the kernel")
    from tirx_kernels.core.lang import delta_rule as dr

    f = grouped_mod.get_kernel("grouped_t1", 1)
    assert [p.name for p in f.params] == list(dr.ARG_ORDER) + list(dr.SCALAR_ORDER)


def test_rejected_inputs_name_the_argument():
    from tirx_kernels.core.checks import TirxInputError

    d = grouped_mod.prepare_data(**{**grouped_mod.DEFAULTS, "batch": 2, "T": 2, "num_accepted": True},
                                 device="cpu")
    kw = proto.op_kwargs(d)
    cases = [
        ({"q": d["q"][..., :64]}, "q"),
        ({"v": d["v"].float()}, "v"),
        ({"g": d["g"][:, :, :, :64]}, "g"),
        ({"beta": d["beta"].float()}, "beta"),
        ({"initial_state": d["initial_state"].float()}, "initial_state"),
        ({"ssm_state_indices": d["ssm_state_indices"].float()}, "ssm_state_indices"),
        ({"ssm_state_indices": d["ssm_state_indices"][:, :1]}, "ssm_state_indices"),
        ({"num_spec_tokens": None}, "num_spec_tokens"),
        ({"num_spec_tokens": 3}, "num_spec_tokens"),
        ({"num_accepted_tokens": d["num_accepted_tokens"][:1]}, "num_accepted_tokens"),
        ({"A_log": d["A_log"].bfloat16()}, "A_log"),
        ({"dt_bias": d["dt_bias"][:5]}, "dt_bias"),
        ({"lower_bound": 1.0}, "lower_bound"),
        ({"cu_seqlens": torch.tensor([0, 2, 4], dtype=torch.int32)}, "cu_seqlens"),
        ({"initial_state_source": d["initial_state"]}, "initial_state_indices"),
        ({"output": d["output"].float()}, "output"),
    ]
    for change, arg in cases:
        with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
            kd.recurrent_kda(**{**kw, **change})
    with pytest.raises(TirxInputError, match="argument 'q'.*CUDA"):
        kd.recurrent_kda(**kw)


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


def _both(m, cfg, ref_fn):
    d = m.prepare_data(**{**m.DEFAULTS, **cfg})
    ours, ref = proto.op_kwargs(d), proto.op_kwargs(d)
    for x in (ours, ref):
        x["initial_state"] = d["initial_state"].clone()
        x["output"] = torch.empty_like(d["output"])
    kd.recurrent_kda(**ours)
    ref_fn(ref)
    torch.cuda.synchronize()
    torch.testing.assert_close(ours["output"].float(), ref["output"].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours["initial_state"].float(), ref["initial_state"].float(), atol=2e-2, rtol=2e-2)


@gpu
@pytest.mark.parametrize("which, cfg", [
    ("one_warp", {"batch": 64, "n_heads": 12, "n_vheads": 12}),
    ("one_warp", {"batch": 32, "gate": "softplus", "beta_logit": True}),
    ("grouped", {"batch": 3}),
    ("grouped", {"batch": 48, "T": 4, "num_accepted": True}),
    ("grouped", {"batch": 16, "T": 8, "n_heads": 8, "gate": "log", "source": True}),
])
def test_gpu_matches_flashinfer(which, cfg):
    pytest.importorskip("flashinfer")
    kda_decode = pytest.importorskip("flashinfer.kda_decode")
    if getattr(kda_decode, "_RECURRENT_KDA_AVAILABLE", True) is False:
        pytest.skip("FlashInfer's CuTe-DSL recurrent_kda cannot target this device")

    _both(MODULES[which], cfg, lambda kw: kda_decode.recurrent_kda(**kw))


@gpu
def test_gpu_matches_fla():
    pytest.importorskip("fla", reason="fla-core is the second reference")
    fn = proto.get_baselines(T=1, gate="log")["fla"]()
    d = one_warp_mod.prepare_data(**{**one_warp_mod.DEFAULTS, "batch": 16, "gate": "log"})
    want = fn(d)
    got = proto.op_kwargs(d)
    got["initial_state"] = d["initial_state"].clone()
    kd.recurrent_kda(**got)
    torch.testing.assert_close(got["output"].float(), want["output"].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got["initial_state"].float(), want["initial_state"].float(), atol=2e-2, rtol=2e-2)


@gpu
def test_gpu_torch_compile():
    d = grouped_mod.prepare_data(**{**grouped_mod.DEFAULTS, "batch": 5, "T": 3, "num_accepted": True})
    kw = proto.op_kwargs(d)
    p1, p2 = d["initial_state"].clone(), d["initial_state"].clone()
    o1, _ = kd.recurrent_kda(**{**kw, "initial_state": p1, "output": None})
    fn = torch.compile(lambda p: kd.recurrent_kda(**{**kw, "initial_state": p, "output": None})[0], fullgraph=True)
    o2 = fn(p2)
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(p1, p2, atol=0, rtol=0)
