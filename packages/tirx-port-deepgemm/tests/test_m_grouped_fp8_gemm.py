# SPDX-License-Identifier: Apache-2.0
"""deepgemm_sm90_m_grouped_fp8_gemm_contiguous / _masked (``m_grouped_fp8_gemm_nt_contiguous`` / ``_masked``):
protocol literals and bundle resolution, tile heuristics, input validation naming the argument; the generated modules
run on the CPU (``core.emulate``) against the fp32 oracle with DeepGEMM's calc_diff: contiguous with an empty group, a
tile of padding rows and padding rows stored as 0; masked with counts of 0, 1 and max_m, rows past the count untouched,
one launch serving new counts (the grid does not depend on them); guard bands, inputs unchanged; SASS; on a GPU, the
harness's configs (oracle, DeepGEMM where installed, cuBLASLt blockwise per group), graph replay, torch.compile."""

import os
import random
import shutil

import pytest
import torch

from tirx_kernels.core import artifacts, runtime
from tirx_kernels.core.checks import TirxInputError
from tirx_kernels.ported.deepgemm import _fp8_gemm_kernel as G
from tirx_kernels.ported.deepgemm import _fp8_gemm_op as O
from tirx_kernels.ported.deepgemm import m_grouped_fp8_gemm_contiguous as contig
from tirx_kernels.ported.deepgemm import m_grouped_fp8_gemm_masked as masked

E4M3 = torch.float8_e4m3fn
FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"


@pytest.mark.parametrize("mod", [contig, masked], ids=["contiguous", "masked"])
def test_protocol_literals_and_bundle(mod):
    labels = [c["label"] for c in mod.CONFIGS]
    assert len(labels) == len(set(labels))
    assert all(c["K"] % 16 == 0 and c["N"] % 8 == 0 for c in mod.CONFIGS + mod.BENCH_CONFIGS)
    bundled = {artifacts.canonical_params(p) for p in mod.artifact_params()}
    assert bundled == {artifacts.canonical_params({"tile": t}) for t in O.TILES}
    for call in mod.call_samples(random.Random(0)) + mod.CONFIGS + mod.BENCH_CONFIGS:
        cands = [artifacts.canonical_params(p) for p in runtime.candidate_params(mod, mod.compile_params(**call))]
        assert bundled & set(cands), call


def test_group_layouts_and_heuristics():
    rows = contig.group_rows(3, 200, empty=1)
    assert rows[1] == 0 and all(140 <= r <= 260 for r in rows[::2])
    M = contig.total_rows(3, 200, empty=1, pad_tiles=1)  # noqa: N806
    layout = contig.make_layout(rows, M, "cpu")
    assert M % 128 == 0 and (layout >= 0).sum() == sum(rows) and (layout[-128:] == -1).all()
    assert contig.segments(layout, 3) == [(0, 0, 256), (2, 256, 512)]  # rows 140..260 fill two 128-row tiles
    assert contig.compile_params(G=4, m=8192, N=4096)["tile"] == "128x128_s6"
    assert masked.compile_params(G=1, m=64, N=4096)["tile"] == "128x64_s8"  # 32 tiles of 128 x 128: under a wave
    assert masked.counts(4, 384, 200, masked_m=[0, 384, 1, 257]) == [0, 384, 1, 257]
    assert masked.counts(2, 100, 1024, exact=True) == [100, 100]


def _contig_operands(rows, N, K, pad_tiles=0, seed=0):  # noqa: N803
    g = torch.Generator().manual_seed(seed)
    M = sum(-(-r // 128) * 128 for r in rows) + 128 * pad_tiles  # noqa: N806
    layout = contig.make_layout(rows, M, "cpu")
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 1, M)[:, None]
    x[layout < 0] = 0
    w = torch.randn(len(rows), N, K, generator=g)
    a, sfa, b, sfb = O.quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))
    return a, sfa, b, sfb, layout


def _masked_operands(Gn, max_m, N, K, seed=0):  # noqa: N803
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(Gn, max_m, K, generator=g) * torch.logspace(-2, 1, max_m)[:, None]
    w = torch.randn(Gn, N, K, generator=g)
    return O.quantized_operands(x.to(torch.bfloat16), w.to(torch.bfloat16))


def test_rejected_inputs_name_the_argument():
    a, sfa, b, sfb, layout = _contig_operands([100, 30], 136, 256)
    d = torch.empty(a.shape[0], 136, dtype=torch.bfloat16)
    cases = [
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b[0], sfb[0]), d, layout), "b\\[0\\]", "3 dim"),
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb[:, :1]), d, layout), "b\\[1\\]", "shape"),
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout.long()), "grouped_layout",
         "int32"),
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout[:-1]), "grouped_layout",
         "shape"),
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout, use_psum_layout=True),
         "use_psum_layout", "not ported"),
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b.transpose(1, 2), sfb), d, layout), "b\\[0\\]",
         "K-major"),
        (lambda: contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout), "a\\[0\\]", "CUDA"),
    ]
    a3, sfa3, b3, sfb3 = _masked_operands(2, 64, 136, 256)
    d3 = torch.empty(2, 64, 136, dtype=torch.bfloat16)
    mm = torch.tensor([3, 64], dtype=torch.int32)
    cases += [
        (lambda: masked.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (b3, sfb3), d3, mm, 0), "expected_m", "positive"),
        (lambda: masked.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (b3[:1], sfb3[:1]), d3, mm, 64), "b\\[0\\]", "G=2"),
        (lambda: masked.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (b3, sfb3), d3[:, :32], mm, 64), "d", "shape"),
        (lambda: masked.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (b3, sfb3), d3, mm[:1], 64), "masked_m", "shape"),
        (lambda: masked.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (b3, sfb3), d3, mm, 64, recipe=(1, 1, 128)),
         "recipe", "SM90"),
        (lambda: masked.m_grouped_fp8_gemm_nt_masked((a3, sfa3), (b3, sfb3), d3, mm, 64), "a\\[0\\]", "CUDA"),
    ]
    for call, arg, what in cases:
        with pytest.raises(TirxInputError, match=f"argument '{arg}'.*{what}"):
            call()


@pytest.fixture(scope="module")
def emulation():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")


_modules = {}


def _emulated(schedule, block_n, num_sms, **knobs):
    from tirx_kernels.core import emulate

    key = (schedule, block_n, num_sms, *sorted(knobs.items()))
    if key not in _modules:
        _modules[key] = emulate.compile_module(G.build_kernel(block_n, 3, 2, num_sms, False, schedule, **knobs))
    return _modules[key]


# Issue 24's candidate knobs: A multicast over 1 x 2 clusters (4 SMs: 2 clusters), scales and slab liveness read ahead.
CLUSTER = {"cluster_n": 2, "prefetch_scales": True}


def _same(x, y):
    return torch.equal(x.view(torch.uint8) if x.dtype == E4M3 else x, y.view(torch.uint8) if y.dtype == E4M3 else y)


# Few CTAs (num_sms 3) for 8-12 tiles: each CTA walks several tiles and the 3-stage ring wraps across them; a group
# of 0 rows, one of 130 (a tile whose second slab holds 2 real rows), a tile of padding rows at the end.
CONTIG_CASES = [(64, [130, 0, 60], 136, 272, 1, 3, {}), (64, [130, 0, 60], 200, 272, 1, 4, CLUSTER),
                (256, [130, 0, 60], 392, 272, 1, 4, CLUSTER)]
if FULL:
    CONTIG_CASES += [(128, [128, 1, 257, 0], 576, 1040, 0, 3, {}), (64, [0, 0, 5], 8, 16, 2, 3, {}),
                     (128, [128, 1, 257, 0], 576, 1040, 0, 4, CLUSTER)]


@pytest.mark.parametrize("block_n, rows, N, K, pad_tiles, num_sms, knobs", CONTIG_CASES)
def test_emulated_contiguous(emulation, block_n, rows, N, K, pad_tiles, num_sms, knobs):  # noqa: N803
    a, sfa, b, sfb, layout = _contig_operands(rows, N, K, pad_tiles, seed=N + K)
    before = [t.clone() for t in (a, sfa, b, sfb, layout)]
    M = a.shape[0]  # noqa: N806
    buf = torch.full((M + 2, N + 8), float("nan"), dtype=torch.bfloat16)  # D in a NaN band: rows and columns
    d = buf[1:M + 1, :N]
    _emulated("m_contiguous", block_n, num_sms, **knobs)(*contig.kernel_args(a, sfa, b, sfb, d, layout)).check()
    want = contig.reference(a, sfa, b, sfb, layout)["d"]
    assert not d.isnan().any(), f"{int(d.isnan().sum())} outputs not written"
    assert (d[layout < 0] == 0).all(), "padding rows not stored as 0"
    assert O.calc_diff(d, want) < O.CALC_DIFF_MAX / 100  # bf16 rounding only: ~1e-6
    guard = torch.ones_like(buf, dtype=torch.bool)
    guard[1:M + 1, :N] = False
    assert buf[guard].isnan().all(), "a store outside D"
    assert all(_same(x, y) for x, y in zip((a, sfa, b, sfb, layout), before))


MASKED_CASES = [(128, 200, 136, 272, [[0, 200, 1, 130], [129, 0, 64, 0]], 3, {}),
                (64, 200, 136, 272, [[0, 200, 1, 130], [129, 0, 64, 0]], 4, CLUSTER),
                (256, 200, 392, 272, [[0, 200, 1, 130]], 4, CLUSTER)]
if FULL:
    MASKED_CASES += [(64, 130, 576, 1040, [[0, 0, 0], [130, 500, -3]], 3, {}), (128, 8, 8, 16, [[8, 1]], 3, {})]


@pytest.mark.parametrize("block_n, max_m, N, K, count_sets, num_sms, knobs", MASKED_CASES)
def test_emulated_masked(emulation, block_n, max_m, N, K, count_sets, num_sms, knobs):  # noqa: N803
    """One set of operands and one D, launched once per set of counts with the same arguments otherwise (what a CUDA
    graph replays): each launch writes exactly its counted rows."""
    Gn = len(count_sets[0])  # noqa: N806
    a, sfa, b, sfb = _masked_operands(Gn, max_m, N, K, seed=N + K)
    before = [t.clone() for t in (a, sfa, b, sfb)]
    kern = _emulated("m_masked", block_n, num_sms, **knobs)
    for counts in count_sets:
        mm = torch.tensor(counts, dtype=torch.int32)
        buf = torch.full((Gn, max_m + 3, N + 8), float("nan"), dtype=torch.bfloat16)
        d = buf[:, 1:max_m + 1, :N]
        kern(*masked.kernel_args(a, sfa, b, sfb, d, mm)).check()
        want = masked.reference(a, sfa, b, sfb, mm)["d"]
        valid = masked.valid_rows(mm, max_m)
        assert not d[valid].isnan().any(), f"{counts}: {int(d[valid].isnan().sum())} counted outputs not written"
        assert d[~valid].isnan().all(), f"{counts}: a row past masked_m written"
        if valid.any():
            assert O.calc_diff(d[valid], want[valid]) < O.CALC_DIFF_MAX / 100, counts
        guard = torch.ones_like(buf, dtype=torch.bool)
        guard[:, 1:max_m + 1, :N] = False
        assert buf[guard].isnan().all(), "a store outside D"
    assert all(_same(x, y) for x, y in zip((a, sfa, b, sfb), before))


@pytest.mark.parametrize("mod", [contig, masked], ids=["contiguous", "masked"])
def test_sass(mod):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, mod.KERNEL_META["name"], {"tile": "128x128_s6"})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("mod, label", [(m, c["label"]) for m in (contig, masked) for c in m.CONFIGS])
def test_gpu_config(mod, label):
    """The harness: fp32 oracle, guard bands, inputs unchanged; DeepGEMM and cuBLASLt blockwise where they run."""
    res = mod.run_test(**next(c for c in mod.CONFIGS if c["label"] == label))
    failed = {n: r for n, r in res["references"].items() if r["status"] == "failed"}
    assert not failed, failed


@gpu
@pytest.mark.parametrize("mod, label", [(contig, "g3_m200_n576_k1040_empty_ragged"),
                                        (masked, "g4_maxm384_n576_k1040_edges"), (masked, "g6_m20_n4096_k4096")])
def test_gpu_graph_replay(mod, label):
    """Captured once, replayed with new inputs (masked: new counts on the device) and checked."""
    from tirx_kernels.core import harness

    harness.check_replay(mod, harness.full_config(mod, next(c for c in mod.CONFIGS if c["label"] == label)))


@gpu
def test_gpu_public_ops_under_compile():
    cfg = {"G": 3, "max_m": 192, "m": 100, "N": 576, "K": 1024, "masked_m": [0, 192, 77]}
    data = masked.prepare_data(**cfg)

    def f(a, sfa, b, sfb, mm):
        d = torch.zeros(3, 192, 576, device="cuda", dtype=torch.bfloat16)
        masked.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, mm, cfg["m"])
        return d

    d = torch.compile(f, fullgraph=True)(data["a"], data["sfa"], data["b"], data["sfb"], data["masked_m"])
    want = masked.reference(**data)["d"]
    valid = masked.valid_rows(data["masked_m"], 192)
    assert O.calc_diff(d[valid], want[valid]) < 1e-5 and (d[~valid] == 0).all()

    cdata = contig.prepare_data(G=3, m=200, N=576, K=1024, empty=1, pad_tiles=1)

    def fc(a, sfa, b, sfb, layout):
        d = torch.empty(a.shape[0], 576, device="cuda", dtype=torch.bfloat16)
        contig.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, layout)
        return d

    d = torch.compile(fc, fullgraph=True)(cdata["a"], cdata["sfa"], cdata["b"], cdata["sfb"], cdata["grouped_layout"])
    assert O.calc_diff(d, contig.reference(**cdata)["d"]) < 1e-5


@gpu
def test_gpu_end_to_end_from_bf16():
    """The casts then the grouped GEMMs, against the bf16 inputs' fp32 products (DeepGEMM's test: calc_diff < 1e-3)."""
    from tirx_kernels.ported.deepgemm import per_block_cast_to_fp8, per_token_cast_to_fp8

    Gn, max_m, N, K = 4, 256, 2112, 7168  # noqa: N806
    x = torch.randn(Gn, max_m, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(Gn, N, K, device="cuda", dtype=torch.bfloat16)
    b = [per_block_cast_to_fp8.per_block_cast_to_fp8(w[g]) for g in range(Gn)]
    b = (torch.stack([t[0] for t in b]), torch.stack([t[1] for t in b]))
    a = [per_token_cast_to_fp8.per_token_cast_to_fp8(x[g]) for g in range(Gn)]
    a = (torch.stack([t[0] for t in a]), torch.stack([t[1] for t in a]))  # sfa contiguous: the op re-lays it out
    mm = torch.tensor([256, 0, 13, 200], dtype=torch.int32, device="cuda")
    d = torch.zeros(Gn, max_m, N, device="cuda", dtype=torch.bfloat16)
    masked.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, 128)
    for g, r in enumerate(mm.tolist()):
        if r:
            assert O.calc_diff(d[g, :r], x[g, :r].float() @ w[g].float().T) < O.CALC_DIFF_MAX
    layout = torch.cat([torch.full((256,), g, dtype=torch.int32, device="cuda") for g in range(Gn)])
    dc = torch.empty(Gn * max_m, N, device="cuda", dtype=torch.bfloat16)
    xc = x.reshape(-1, K)
    ac = per_token_cast_to_fp8.per_token_cast_to_fp8(xc)
    contig.m_grouped_fp8_gemm_nt_contiguous(ac, b, dc, layout)
    want = torch.cat([xc[g * 256:(g + 1) * 256].float() @ w[g].float().T for g in range(Gn)])
    assert O.calc_diff(dc, want) < O.CALC_DIFF_MAX
