# SPDX-License-Identifier: Apache-2.0
"""fast_topk_clusters: the whole generated module (host launch with the cluster attribute, DSMEM histogram sums,
cluster barriers) run on the CPU (``core.emulate``'s module path: a cluster's CTAs at once) against the exact
deterministic oracle of the single-CTA tests (the same result bit for bit) on random rows, heavy ties spread over
the cluster, constant rows, +-inf, NaN, -0.0, both load paths (16-byte vectors; scalars for a ragged row stride);
on a GPU, every config through the harness, top_k's dispatch, CUDA-graph replay and two streams at once."""

import os

import pytest
import torch

from tirx_kernels.core import testing
from tirx_kernels.ported.flashinfer.topk import fast_topk_clusters as mod
from tirx_kernels.ported.flashinfer.topk import radix_topk_single_cta as single

_single_cta_tests = testing.load_sibling("test_topk_single_cta", __file__)
_RAW = _single_cta_tests._RAW
_check = _single_cta_tests._check
_cpu_builtins = _single_cta_tests._cpu_builtins
make_rows = _single_cta_tests.make_rows
oracle = _single_cta_tests.oracle


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(dtype, cluster):
        key = (dtype, cluster)
        if key not in cache:
            cache[key] = emulate.compile_module(_cpu_builtins(codegen(mod.get_kernel(dtype, cluster))))
        return cache[key]
    return get


def run_clusters(module, x: torch.Tensor, k: int, row_pad: int = 0, force_scalar: bool = False):
    """One launch of the module over poisoned outputs; the scores and the row padding must come back unchanged.
    ``row_pad`` makes the row stride N + row_pad (a stride that is not a whole number of vectors: scalar loads)."""
    M, N = x.shape
    buf = torch.full((M, N + row_pad), float("nan"), dtype=x.dtype)
    buf[:, :N] = x
    xs = buf[:, :N]
    vals = torch.full((M, k), 7.0, dtype=x.dtype)
    idx = torch.full((M, k), 12345, dtype=torch.int64)
    vec_ok = 0 if force_scalar else int(mod.vector_ok(xs))
    module(xs, vals, idx, vec_ok, hang_timeout=60.0).check()
    want = torch.cat([x, torch.full((M, row_pad), float("nan"), dtype=x.dtype)], 1)
    assert torch.equal(buf.view(_RAW[x.dtype]), want.view(_RAW[x.dtype]))  # scores and guard band unchanged
    return vals, idx


# Each emulated module costs ~20 s of g++ here: CI compiles one (fp32, 2-CTA cluster) and runs it twice (ties over
# the cluster on the bulk-copy path; edge values on the scalar path); TIRX_EMULATE_FULL=1 runs the rest (16-bit keys,
# 4- and 8-CTA clusters, constant rows).
_FULL = os.environ.get("TIRX_EMULATE_FULL") == "1"
full_only = pytest.mark.skipif(not _FULL, reason="set TIRX_EMULATE_FULL=1 (minutes of CPU on 2 cores)")


def test_emulated_both_load_paths(emulated):
    module = emulated("float32", 2)
    x = make_rows("ties", 1, 6000, torch.float32, seed=1)
    _check(*run_clusters(module, x, 1000), x, 1000)
    x = make_rows("special", 1, 5001, torch.float32, seed=2)
    _check(*run_clusters(module, x, 257, row_pad=1), x, 257)


@pytest.mark.parametrize("kind, M, N, k, cluster, dtype, row_pad", [
    pytest.param("special", 1, 5001, 257, 2, torch.float16, 3, marks=full_only),
    pytest.param("random", 2, 9000, 300, 4, torch.float32, 0, marks=full_only),
    pytest.param("constant", 1, 9000, 4000, 4, torch.float32, 0, marks=full_only),
    pytest.param("special", 1, 9001, 700, 2, torch.float32, 1, marks=full_only),
    pytest.param("ties", 2, 12000, 500, 4, torch.bfloat16, 0, marks=full_only),
    pytest.param("random", 1, 20000, 2048, 8, torch.float32, 0, marks=full_only),
])
def test_emulated(emulated, kind, M, N, k, cluster, dtype, row_pad):
    x = make_rows(kind, M, N, dtype, seed=N + k)
    vals, idx = run_clusters(emulated(str(dtype)[6:], cluster), x, k, row_pad)
    _check(vals, idx, x, k)


@pytest.fixture(scope="module")
def emulated_knobs():
    """Emulated modules of ``_cluster_radix.build_kernel``'s first-histogram knobs (spread bins, sub-histograms)."""
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen
    from tirx_kernels.ported.flashinfer.topk import _cluster_radix as cr

    cache = {}

    def get(dtype, cluster, spread, copies, threads=mod.THREADS, cap=None):
        key = (dtype, cluster, spread, copies, threads, cap)
        if key not in cache:
            fn = cr.build_kernel(dtype, cluster, cap or mod.slice_capacity(dtype), threads, mod.LOAD_UNROLL,
                                 mod.GATHER_ELEMS, spread=spread, copies=copies)
            cache[key] = emulate.compile_module(_cpu_builtins(codegen(fn)))
        return cache[key]
    return get


def test_emulated_spread_bins_and_copies(emulated_knobs):
    """The spread first digit (a bin of sign, exponent and 2 mantissa bits; one digit pass more) with 4 sub-
    histograms: ties over the cluster, +-inf / NaN / -0.0 on the scalar path, and scores past the bins' exponent
    range (2^-15 .. 2^17: the end bins) of both signs, the oracle bit for bit."""
    module = emulated_knobs("float32", 2, True, 4)
    x = make_rows("ties", 1, 6000, torch.float32, seed=3)
    _check(*run_clusters(module, x, 1000), x, 1000)
    x = make_rows("special", 1, 5001, torch.float32, seed=4)
    _check(*run_clusters(module, x, 257, row_pad=1), x, 257)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 7000, generator=g) * torch.pow(10.0, torch.empty(1, 7000).uniform_(-12, 12, generator=g))
    _check(*run_clusters(module, x, 2500), x, 2500)


# The 1024-thread rows use the 192 KB slice (32768 fp32 scores a CTA) of the sweep's "wide" variants, in a 2-CTA
# cluster: an 8-CTA cluster of 1024 threads (8192 emulated threads) outran the emulator's 60 s hang timeout here.
@pytest.mark.parametrize("kind, M, N, k, cluster, dtype, spread, copies, threads, cap", [
    pytest.param("ties", 2, 12000, 500, 4, torch.bfloat16, True, 8, 512, None, marks=full_only),
    pytest.param("special", 1, 9001, 700, 2, torch.bfloat16, True, 1, 512, None, marks=full_only),
    pytest.param("random", 1, 40000, 2048, 2, torch.float32, True, 8, 1024, 32768, marks=full_only),
    pytest.param("constant", 1, 9000, 4000, 4, torch.float32, True, 8, 512, None, marks=full_only),
    pytest.param("special", 1, 5001, 257, 2, torch.float16, True, 8, 512, None, marks=full_only),  # fp16: prefix
])
def test_emulated_knobs(emulated_knobs, kind, M, N, k, cluster, dtype, spread, copies, threads, cap):
    x = make_rows(kind, M, N, dtype, seed=N + k)
    vals, idx = run_clusters(emulated_knobs(str(dtype)[6:], cluster, spread, copies, threads, cap), x, k)
    _check(vals, idx, x, k)


def test_plan():
    assert mod.plan_cluster(1, 131072, "float32", 132) == 8
    assert mod.plan_cluster(64, 131072, "float32", 132) == 8
    assert mod.plan_cluster(64, 65536, "float32", 132) == 4
    assert mod.plan_cluster(16, 4096, "float32", 132) == 2
    assert mod.plan_cluster(1, 131073, "float32", 132) == 0  # past 8 slices: not this kernel
    assert mod.plan_cluster(8, 196608, "bfloat16", 132) == 8
    assert mod.plan_cluster(8, 196609, "bfloat16", 132) == 0
    for c in mod.CONFIGS:
        assert mod.plan_cluster(c["M"], c["N"], c["dtype"], 132) in mod.CLUSTER_SIZES, c["label"]


def test_protocol_literals():
    assert len(set(c["label"] for c in mod.CONFIGS)) == len(mod.CONFIGS)
    assert mod.KERNEL_META["upstream"] == single.KERNEL_META["upstream"]


def test_input_errors():
    with pytest.raises(Exception, match="'input'.*131072"):
        mod.fast_topk_clusters(torch.zeros(2, 131073, device="meta"), 16)
    with pytest.raises(Exception, match="'input'"):
        mod.fast_topk_clusters(torch.zeros(2, 100, device="meta", dtype=torch.int32), 16)
    with pytest.raises(Exception, match="'k'"):
        mod.fast_topk_clusters(torch.zeros(2, 100, device="meta"), 0)


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
@pytest.mark.parametrize("M, N, k, kind, dtype", [
    (1, 131072, 2048, "random", torch.float32), (64, 131072, 2048, "random", torch.float32),
    (3, 100003, 4096, "ties", torch.float32), (2, 77777, 1000, "special", torch.float32),
    (5, 65536, 4095, "constant", torch.float32), (4, 196608, 4096, "ties", torch.bfloat16),
    (7, 50001, 300, "special", torch.float16)])
def test_gpu_exact_and_deterministic(M, N, k, kind, dtype):
    """The cluster kernel directly and through top_k's dispatch (few rows that fit): the oracle bit for bit."""
    x = make_rows(kind, M, N, dtype, seed=7).cuda()
    want_v, want_i = oracle(x.cpu(), k)
    raw = _RAW[dtype]
    assert mod.plan_cluster(M, N, str(dtype)[6:], torch.cuda.get_device_properties(0).multi_processor_count)
    for v, i in (mod.fast_topk_clusters(x, k), single.top_k(x, k), single.top_k(x, k, deterministic=True)):
        assert torch.equal(i.cpu(), want_i) and torch.equal(v.cpu().view(raw), want_v.view(raw))
    # sorted: the single-CTA kernel's sorted result, bit for bit
    sv, si = mod.fast_topk_clusters(x, k, sorted=True)
    tv, ti = torch.empty_like(sv), torch.empty_like(si)
    single._run(x, k, tv, ti, sort=False, dispatch=False)
    from tirx_kernels.ported.flashinfer.topk import stable_sort_topk_by_value as sorter

    sorter.run(tv, ti, k, tv, ti)
    assert torch.equal(si, ti) and torch.equal(sv.view(raw), tv.view(raw))


@gpu
def test_gpu_unaligned_rows():
    """A row stride that is not a whole number of 16-byte vectors, and a base past a vector: the scalar path."""
    base = torch.randn(3, 70001, device="cuda")
    for x in (base[:, :70000], base[:, 1:]):
        v, i = mod.fast_topk_clusters(x, 999)
        want_v, want_i = oracle(x.cpu(), 999)
        assert torch.equal(i.cpu(), want_i) and torch.equal(v.cpu(), want_v)


@gpu
def test_gpu_graph_and_two_streams():
    """Captured in a CUDA graph and replayed on new scores; two streams running it at once."""
    x = torch.randn(2, 131072, device="cuda")
    single.top_k(x, 2048)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gv, gi = single.top_k(x, 2048)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(gi.cpu(), oracle(x.cpu(), 2048)[1])
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    ys = [torch.randn(3, 131072, device="cuda") for _ in streams]
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(20):
        for s, y, o in zip(streams, ys, outs):
            with torch.cuda.stream(s):
                o.append(mod.fast_topk_clusters(y, 1024)[1])
    torch.cuda.synchronize()
    for y, o in zip(ys, outs):
        want = oracle(y.cpu(), 1024)[1]
        assert all(torch.equal(t.cpu(), want) for t in o)
