# SPDX-License-Identifier: Apache-2.0
"""deepgemm_sm90_k_grouped_fp8_gemm_contiguous (``k_grouped_fp8_gemm_nt_contiguous``, MoE wgrad): protocol literals and
bundle resolution, DeepGEMM's K split, input validation naming the argument; each group's accumulating 1d1d launch
run on the CPU (``core.emulate``) from the op's own per-group arguments (views of the flat K-grouped operands and the
MN-major scales sliced by group) against the fp32 oracle, an empty group leaving C, guard bands around D, inputs
unchanged; SASS; on a GPU, the harness's configs (oracle, DeepGEMM, cuBLASLt per group where they run)."""

import random
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.deepgemm import _fp8_gemm_kernel as G
from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O
from tirx_kernels.ported.deepgemm import k_grouped_fp8_gemm_contiguous as mod

E4M3 = torch.float8_e4m3fn


def _operands(ks, m, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(m, kg, generator=g).to(torch.bfloat16) for kg in ks]
    ws = [torch.randn(n, kg, generator=g).to(torch.bfloat16) for kg in ks]
    return mod.quantized_operands(xs, ws, m, n, "cpu")


def test_protocol_literals_bundle_and_ks():
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels)) and all(c["n"] % 8 == 0 for c in mod.CONFIGS)
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    for call in mod.call_samples(random.Random(0)):
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call
    ks = mod.group_ks(8, 4096, empty=3)
    assert ks[3] == 0 and all(kg % 128 == 0 and 2816 <= kg <= 5376 for i, kg in enumerate(ks) if i != 3)
    assert ks == mod.group_ks(8, 4096, empty=3)  # seeded by the config


def test_rejected_inputs_name_the_argument():
    ks, m, n = [128, 0, 256], 8, 16
    a, sfa, b, sfb = _operands(ks, m, n)
    d = torch.empty(3, m, n)
    layout = torch.tensor(ks, dtype=torch.int32)
    for call, arg, what in [
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, [128, 0], layout), "ks", "G=3"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, [128, 0, 200], layout), "ks",
         "multiples of 128"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a[:-1], sfa), (b, sfb), d, ks, layout), "a\\[0\\]", "shape"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb[:, :1]), d, ks, layout), "b\\[1\\]", "shape"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d.bfloat16(), ks, layout), "d", "float32"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, layout[:2]), "grouped_layout",
         "shape"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, layout, recipe=(1, 128, 128)),
         "recipe", "1d1d"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, layout, use_psum_layout=True),
         "use_psum_layout", "SM90"),
        (lambda: mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, ks, layout), "a\\[0\\]", "CUDA"),
    ]:
        with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
            call()


def test_emulated_groups_against_the_oracle():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import emulate

    # The 1d1d test's module (128 x 128 tiles, 3 stages, 2 CTAs: the ring wraps across tiles): one compile for both.
    kern = emulate.compile_module(G.build_kernel(128, 3, 2, 2, True, "dense", "1d1d"))
    ks, m, n = [128, 0, 384, 256], 200, 136
    a, sfa, b, sfb = _operands(ks, m, n, seed=1)
    before = [t.clone() for t in (a, sfa, b, sfb)]
    c = torch.randn(len(ks), m, n) * 32
    pad = 64
    buf = torch.full((len(ks) * m * n + 2 * pad,), float("nan"))  # D inside a NaN band
    d = buf[pad:pad + len(ks) * m * n].view(len(ks), m, n)
    d.copy_(c)
    calls = mod.group_kernel_args(a, sfa, b, sfb, d, ks)
    assert len(calls) == 3  # the empty group launches nothing
    for args in calls:
        kern(*args).check()
    want = mod.reference(a, sfa, b, sfb, torch.tensor(ks, dtype=torch.int32), c)["d"]
    assert torch.equal(d[1], c[1]), "an empty group must leave C"
    assert O.calc_diff(d, want) < 1e-10
    assert buf[:pad].isnan().all() and buf[-pad:].isnan().all(), "a store outside D"
    assert all(torch.equal(x.view(torch.uint8) if x.dtype == E4M3 else x, y.view(torch.uint8)
                           if y.dtype == E4M3 else y) for x, y in zip((a, sfa, b, sfb), before))


def test_sass():
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"tile": "128x128_s6"})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    res = mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))
    failed = {n: r for n, r in res["references"].items() if r["status"] == "failed"}
    assert not failed, failed


@gpu
def test_gpu_in_place_and_compiled():
    """C aliasing D (DeepGEMM's test passes d = c), and the op under torch.compile."""
    cfg = {"G": 3, "m": 200, "n": 136, "k": 256, "empty": 1}
    data = mod.prepare_data(**cfg)
    ks = mod.group_ks(**cfg)
    want = mod.reference(**data)["d"]
    d = data["c"].clone()
    mod.k_grouped_fp8_gemm_nt_contiguous((data["a"], data["sfa"]), (data["b"], data["sfb"]), d, ks,
                                         data["grouped_layout"], c=d)
    assert O.calc_diff(d, want) < 1e-8

    def f(a, sfa, b, sfb, layout, c):
        out = torch.empty_like(c)
        mod.k_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), out, ks, layout, c=c)
        return out

    got = torch.compile(f, fullgraph=True)(data["a"], data["sfa"], data["b"], data["sfb"], data["grouped_layout"],
                                           data["c"])
    assert O.calc_diff(got, want) < 1e-8
