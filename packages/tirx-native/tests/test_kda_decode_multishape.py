# SPDX-License-Identifier: Apache-2.0
"""kda_decode_multishape: the generated CUDA of each schedule run on the CPU (``core.emulate``) against the fp32
oracle on the output and the whole pool (unaddressed slots bit-identical, inputs unchanged, poisoned output)
through the harness's own checks; the schedule table; input validation; SASS; on a GPU, every config row, graph
replay, torch.compile and FlashInfer 0.7.4's recurrent_kda on the same calls."""

import re

import pytest
import torch

from tirx_kernels.core import artifacts
from tirx_kernels.kda import kda_decode_multishape as mod

# Emulation runs one host thread per CUDA thread: small batches and head counts, one row per schedule and gate
# (T = 3 twice: one emulated build serves both).
EMULATED = [
    ({"batch": 2, "T": 1, "n_heads": 2, "n_vheads": 4}, "warp16"),
    ({"batch": 3, "T": 1, "n_heads": 2, "n_vheads": 2, "pad": True}, "cta32x4"),
    ({"batch": 3, "T": 5, "n_heads": 1, "n_vheads": 2, "num_accepted": True, "pad": True}, "cta32x2"),
    ({"batch": 2, "T": 3, "n_heads": 2, "n_vheads": 2, "gate": "lower_bound"}, "cta32x2"),
    ({"batch": 2, "T": 3, "n_heads": 1, "n_vheads": 2, "gate": "softplus", "num_accepted": True}, "cta32x2"),
]


def _narrow_warp_sums(src: str) -> str:
    """cuda_cpu.h has a stand-in for the full-warp sum only: a group of < 32 lanes gets the same butterfly inline
    (the same helper as the flashinfer package's test_gdn_decode.py / test_kda_decode.py)."""
    return re.sub(r"tvm_builtin_cuda_warp_reduce_sum_(2|4|8|16)\(",
                  lambda m: f"([](float v) {{ for (int m = {int(m.group(1)) // 2}; m > 0; m >>= 1) "
                            "v += __shfl_xor_sync(0xffffffffu, v, m); return v; })(", src)


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(params):
        key = artifacts.canonical_params(params)
        if key not in cache:
            cache[key] = emulate.compile(_narrow_warp_sums(codegen(mod.get_kernel(**params))))
        return cache[key]
    return get


@pytest.mark.parametrize("row, schedule", EMULATED, ids=[f"{s}-t{r['T']}-{r.get('gate', 'log')}" for r, s in EMULATED])
def test_harness_rows_emulated(emulated, row, schedule):
    """harness.check_config on the CPU with the schedule forced: guarded in-place pool, poisoned output, inputs
    unchanged, the pool comparator; the launch runs the op's validation into the emulated kernel."""
    import types

    from tirx_kernels.core import harness

    cfg = harness.full_config(mod, row)
    params = {"schedule": schedule, "max_tokens": cfg["T"]}

    def launch(cfg, data):
        n = mod.normalize(**mod.op_kwargs(data))
        ptrs, scalars, grid, block = mod.kernel_args(n, schedule)
        kern = emulated(params)
        named = {f"{k}_ptr": v for k, v in ptrs.items()}
        kern(*[named[p.name] if p.pointer else scalars[p.name] for p in kern.params], grid=grid, block=block).check()

    fake = types.SimpleNamespace(KERNEL_META=mod.KERNEL_META, INPLACE=mod.INPLACE, COMPARATORS=mod.COMPARATORS,
                                 reference=mod.reference, prepare_data=lambda **c: mod.prepare_data(**c, device="cpu"),
                                 launch=launch, get_baselines=lambda **c: {})
    res = harness.check_config(fake, cfg)
    assert res["status"] == "passed"
    stats = res["oracle"]["state"]
    padded = (cfg["T"] if cfg["pad"] else 0) + (1 if cfg["pad"] and cfg["T"] > 1 else 0)
    assert stats["slots_written"] == cfg["batch"] * cfg["T"] - padded
    assert stats["slots_untouched"] >= cfg["batch"] + 3


def test_public_op_end_to_end_emulated(emulated, monkeypatch):
    """kda_decode itself on CPU tensors (the CUDA check lifted, the loaded function replaced by the emulated kernel
    called with the op's positional arguments), T = 3 with the lower-bound gate, no out buffer; against the
    oracle, the pool bit-identical outside the checkpoint slots."""
    from tirx_kernels.core import checks
    from tirx_kernels.core.lang import delta_rule as dr

    real_tensor = checks.tensor
    monkeypatch.setattr(checks, "tensor", lambda op, name, t, cuda=False, **kw: real_tensor(op, name, t, cuda=False,
                                                                                          **kw))
    monkeypatch.setattr(mod, "_LOADED", {})

    def get_function(module, params, device=None):
        kern = emulated(params)
        rows, lanes, rpt = mod.SCHEDULES[params["schedule"]]

        def fn(*args):
            a = dict(zip(dr.ARG_ORDER + dr.SCALAR_ORDER, args))
            named = {f"{k}_ptr": a[k] for k in dr.ARG_ORDER}
            kern(*[named[p.name] if p.pointer else a[p.name] for p in kern.params],
                 grid=(a["batch"], a["n_vheads"] * (128 // rows)), block=(dr.threads_of(rows, lanes, rpt),)).check()
        return fn

    monkeypatch.setattr(mod.runtime, "get_function", get_function)
    d = mod.prepare_data(**{**mod.DEFAULTS, "batch": 2, "T": 3, "n_heads": 1, "n_vheads": 2, "gate": "lower_bound",
                            "num_accepted": True}, device="cpu")
    want = mod.reference(**d)
    before = d["state"].clone()
    out = mod.kda_decode(**{**mod.op_kwargs(d), "out": None})
    torch.testing.assert_close(out.float(), want["out"], atol=2e-3, rtol=2e-2)
    written = d["state_indices"].reshape(-1).long()
    keep = torch.ones(d["state"].shape[0], dtype=torch.bool)
    keep[written] = False
    assert torch.equal(d["state"][keep], before[keep])
    torch.testing.assert_close(d["state"][written].float(), want["state"][written].float(), atol=2e-2, rtol=2e-2)


def test_plan_covers_every_call_with_a_built_artifact():
    built = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for b in (1, 4, 7, 8, 64, 1024):
        for t in range(1, 9):
            for hv in (8, 16, 32, 64):
                assert artifacts.canonical_params(mod.compile_params(batch=b, T=t, n_vheads=hv)) in built
    assert mod.plan(4, 1, 32) == "warp16" and mod.plan(3, 1, 32) == "cta32x4" and mod.plan(512, 2, 32) == "cta32x2"


def test_rejected_inputs_name_the_argument():
    from tirx_kernels.core.checks import TirxInputError

    d = mod.prepare_data(**{**mod.DEFAULTS, "batch": 2, "T": 3, "gate": "lower_bound", "num_accepted": True},
                         device="cpu")
    kw = mod.op_kwargs(d)
    cases = [
        ({"q": d["q"][..., :64]}, "q"),
        ({"k": d["k"].float()}, "k"),
        ({"v": d["v"][:, :, :3]}, "v"),
        ({"g": d["g"][:, :2]}, "g"),
        ({"beta": d["beta"].float()}, "beta"),
        ({"state": d["state"].float()}, "state"),
        ({"state_indices": d["state_indices"][:, :2]}, "state_indices"),
        ({"state_indices": d["state_indices"].float()}, "state_indices"),
        ({"num_accepted_tokens": d["num_accepted_tokens"][:1]}, "num_accepted_tokens"),
        ({"A_log": d["A_log"].double()}, "A_log"),
        ({"dt_bias": d["dt_bias"][:7]}, "dt_bias"),
        ({"lower_bound": 2.0}, "lower_bound"),
        ({"out": d["out"][:1]}, "out"),
    ]
    for change, arg in cases:
        with pytest.raises(TirxInputError, match=f"argument '{arg}'"):
            mod.kda_decode(**{**kw, **change})
    with pytest.raises(TirxInputError, match="argument 'q'.*CUDA"):
        mod.kda_decode(**kw)


def test_sass():
    """No spills or local memory; 16-byte state loads and stores (the 64-values-a-thread schedule at T = 6)."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    sass = testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"schedule": "cta32x2", "max_tokens": 6})
    assert re.search(r"LDG\.E(\.[A-Z]+)*\.128", sass) and re.search(r"STG\.E(\.[A-Z]+)*\.128", sass)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))


@gpu
def test_gpu_graph_replay():
    from tirx_kernels.core import testing

    testing.check_graph_replay(mod.KERNEL_META["name"], "t4_b32_hv32_nacc")


@gpu
@pytest.mark.parametrize("label", ["t1_b128_hv32", "t1_b3_hv32", "t4_b32_hv32_nacc", "t3_b16_hv16_lb"])
def test_gpu_matches_flashinfer(label):
    pytest.importorskip("flashinfer")
    pytest.importorskip("flashinfer.kda_decode")
    from tirx_kernels.core import harness

    cfg = harness.full_config(mod, next(c for c in mod.CONFIGS if c["label"] == label))
    d = mod.prepare_data(**cfg)
    try:
        fn = mod.get_baselines(**cfg)["flashinfer"]()
    except ImportError as e:
        pytest.skip(str(e))
    want = fn(d)
    got = mod.op_kwargs(d)
    got["state"] = d["state"].clone()
    mod.kda_decode(**got)
    torch.cuda.synchronize()
    torch.testing.assert_close(got["out"].float(), want["out"].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got["state"].float(), want["state"].float(), atol=2e-2, rtol=2e-2)


@gpu
def test_gpu_torch_compile():
    d = mod.prepare_data(**{**mod.DEFAULTS, "batch": 5, "T": 4, "num_accepted": True})
    kw = mod.op_kwargs(d)
    p1, p2 = d["state"].clone(), d["state"].clone()
    o1 = mod.kda_decode(**{**kw, "state": p1, "out": None})
    fn = torch.compile(lambda p: mod.kda_decode(**{**kw, "state": p, "out": None}), fullgraph=True)
    o2 = fn(p2)
    torch.testing.assert_close(o1, o2, atol=0, rtol=0)
    torch.testing.assert_close(p1, p2, atol=0, rtol=0)
