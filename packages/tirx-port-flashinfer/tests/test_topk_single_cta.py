# SPDX-License-Identifier: Apache-2.0
"""radix_topk_single_cta: the generated CUDA run on the CPU (``core.emulate``) against an exact oracle (the k
largest by (key, lowest index), in ascending index order: the documented deterministic result) on random rows,
heavy ties, constant rows, +-inf, NaN, -0.0 and rows shorter than k; on a GPU, the harness's checks of every config,
torch.topk's values, and run-to-run bit identity."""

import re

import pytest
import torch

from tirx_kernels.ported.flashinfer.topk import radix_topk_single_cta as mod

_RAW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
_BITS = {torch.float32: 32, torch.float16: 16, torch.bfloat16: 16}


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """The kernel's order-preserving keys (int64): NaN largest, -0.0 equal to +0.0."""
    bits = _BITS[x.dtype]
    u = x.view(_RAW[x.dtype]).long() & ((1 << bits) - 1)
    sign = 1 << (bits - 1)
    key = torch.where(u & sign != 0, ~u & ((1 << bits) - 1), u | sign)
    key = torch.where(u == sign, torch.full_like(u, sign), key)
    return torch.where(x.isnan(), torch.full_like(u, (1 << bits) - 1), key)


def oracle(x: torch.Tensor, k: int):
    """(values, indices) of the deterministic result: ties at the threshold to the lowest indices, ascending index
    order; a row shorter than k padded with index -1 and value 0."""
    M, N = x.shape
    kk = min(k, N)
    comp = order_keys(x) * (1 << 31) + ((1 << 31) - 1 - torch.arange(N))  # < 2**63
    idx = comp.topk(kk, dim=-1).indices.sort(-1).values
    vals = x.gather(-1, idx)
    if kk < k:
        idx = torch.cat([idx, torch.full((M, k - kk), -1, dtype=idx.dtype)], -1)
        vals = torch.cat([vals, torch.zeros(M, k - kk, dtype=x.dtype)], -1)
    return vals, idx


def make_rows(kind: str, M: int, N: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g)
    if kind == "ties":
        x = (x * 4).round() / 4
    elif kind == "constant":
        x = torch.full((M, N), 1.5)
    elif kind == "special":
        for v in (float("inf"), float("-inf"), float("nan"), -0.0, 0.0):
            pos = torch.randint(0, N, (M, max(1, N // 10)), generator=g)
            x.scatter_(1, pos, v)
        x[:, ::7] = -x[:, ::7]  # NaN with the sign bit set too
    return x.to(dtype)


# ------------------------------------------------------------------------------------------------ CPU emulation

@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernels")
    import shutil

    from tirx_kernels.core import emulate

    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core.build import codegen

    cache = {}

    def get(dtype, index_dtype="int64", mode="plain"):
        key = (dtype, index_dtype, mode)
        if key not in cache:
            src = codegen(mod.get_kernel(dtype, index_dtype, mode))
            # the host code's products it passes to the kernel (cse_vN = (A * B)), by name
            cse = {m.group(1): (m.group(2), m.group(3))
                   for m in re.finditer(r"int32_t (cse_v\d+) = \((\w+) \* (\w+)\);", src)}
            cache[key] = (emulate.compile(_cpu_builtins(src)), cse)
        return cache[key]
    return get


def _cpu_builtins(src: str) -> str:
    """Stand-ins cuda_cpu.h lacks, inlined: the shared atomic add and the warp ballot (built from shuffles); the
    register cap (``__maxnreg__``, which the emulator's kernel parser does not expect) dropped."""
    src = re.sub(r"__maxnreg__\(\d+\) ", "", src)
    src = src.replace("tvm_builtin_cuda_atomic_add(",
                      "([](auto* p, auto v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); })(")
    return re.sub(r"tvm_builtin_ballot_sync\(",
                  "([](unsigned m, bool pr) { unsigned b = 0; for (int s = 0; s < 32; ++s) "
                  "b |= (__shfl_sync(m, (unsigned)pr, s) & 1u) << s; return b; })(", src)


def _run_emulated(kern, x: torch.Tensor, k: int, index_dtype=torch.int64, row_pad: int = 0, lengths=None, aux=None,
                  aux_stride: int = 1):
    kern, cse = kern
    M, N = x.shape
    buf = torch.full((M, N + row_pad), float("nan"), dtype=x.dtype)
    buf[:, :N] = x
    xs = buf[:, :N]
    vals = torch.full((M, k) if lengths is None else (1, 1), 7.0, dtype=x.dtype)
    idx = torch.full((M, k), 12345, dtype=index_dtype)
    dims = {"M": M, "N": N, "K": k, "VM": vals.shape[0], "VK": vals.shape[1]}
    scalars = {**dims, "x_stride": N + row_pad, "aux_stride": aux_stride,
               **{name: dims[a] * dims[b] for name, (a, b) in cse.items()}}
    tensors = {"X_ptr": xs, "V_ptr": vals, "Ix_ptr": idx, "Lens_ptr": lengths, "Aux_ptr": aux}
    args = [tensors[p.name] if p.pointer else scalars[p.name] for p in kern.params]
    kern(*args, grid=(M,), block=(1024,)).check()
    return vals, idx


def _check(vals, idx, x, k):
    want_v, want_i = oracle(x, k)
    assert torch.equal(idx.long(), want_i)
    assert torch.equal(vals.view(_RAW[x.dtype]), want_v.view(_RAW[x.dtype]))  # bit for bit (NaN, -0.0)
    # torch.topk's values, as multisets (NaN equal to NaN)
    kk = min(k, x.shape[1])
    tv = x.float().topk(kk, -1).values
    gv = vals[:, :kk].float().sort(-1, descending=True).values
    gv = torch.where(gv.isnan(), torch.inf, gv).sort(-1, descending=True).values
    tv = torch.where(tv.isnan(), torch.inf, tv).sort(-1, descending=True).values
    assert torch.equal(gv, tv)


@pytest.mark.parametrize("kind, M, N, k", [
    ("random", 2, 5000, 300), ("random", 3, 1, 1), ("random", 2, 1025, 1), ("random", 2, 4097, 4096),
    ("ties", 3, 3000, 100), ("constant", 2, 2000, 37), ("special", 3, 1500, 200), ("random", 2, 100, 300),
    ("ties", 2, 64, 64),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_emulated(emulated, kind, M, N, k, dtype):
    if dtype != torch.float32 and (kind, N) not in {("random", 5000), ("ties", 3000), ("special", 1500),
                                                    ("constant", 2000), ("random", 100)}:
        pytest.skip("fp32 only for this shape (each emulated run costs seconds)")
    x = make_rows(kind, M, N, dtype, seed=N * 31 + k)
    vals, idx = _run_emulated(emulated(str(dtype)[6:]), x, k, row_pad=3)
    _check(vals, idx, x, k)


def test_emulated_int32_indices(emulated):
    x = make_rows("ties", 2, 2500, torch.float32, seed=5)
    vals, idx = _run_emulated(emulated("float32", "int32"), x, 250, index_dtype=torch.int32)
    _check(vals, idx, x, 250)


@pytest.mark.parametrize("mode", ["page_table", "ragged"])
def test_emulated_transforms(emulated, mode):
    """Per-row lengths (0, shorter than k, longer, past the width: clamped) and the index mapping."""
    M, N, k = 5, 3000, 200
    x = make_rows("ties", M, N, torch.float32, seed=11)
    lengths = torch.tensor([0, 150, 3000, 2100, 5000], dtype=torch.int32)
    stride = N + 5
    table = torch.randint(0, 10**6, (M, stride), dtype=torch.int32)
    offsets = torch.tensor([0, 7, 100000, 3, 42], dtype=torch.int32)
    aux = table.flatten() if mode == "page_table" else offsets
    _, idx = _run_emulated(emulated("float32", "int32", mode), x, k, index_dtype=torch.int32, lengths=lengths,
                           aux=aux, aux_stride=stride)
    for r in range(M):
        n = min(int(lengths[r]), N)
        _, want = oracle(x[r:r + 1, :n], k) if n else (None, torch.full((1, k), -1))
        want = want[0]
        mapped = torch.where(want >= 0, table[r].long()[want.clamp(min=0)] if mode == "page_table"
                             else want + int(offsets[r]), -1)
        assert torch.equal(idx[r].long(), mapped), r


def test_oracle_keys_order_like_torch():
    x = torch.tensor([float("-inf"), -2.0, -0.0, 0.0, 1e-30, 3.0, float("inf"), float("nan"), -float("nan")])
    k = order_keys(x)
    assert (k[1:7] > k[:6]).sum() == 5 and k[2] == k[3] and k[7] == k[8] > k[6]


def test_protocol_literals():
    labels = [c["label"] for c in mod.CONFIGS + mod.BENCH_CONFIGS]
    assert len(mod.KERNEL_META["upstream"]["commit"]) == 40
    assert len(set(c["label"] for c in mod.CONFIGS)) == len(mod.CONFIGS) and labels


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")


@gpu
@pytest.mark.parametrize("label", [c["label"] for c in mod.CONFIGS])
def test_gpu_config(label):
    cfg = next(c for c in mod.CONFIGS if c["label"] == label)
    mod.run_test(**cfg)


@gpu
@pytest.mark.parametrize("M, N, k", [(64, 131072, 2048), (1, 131072, 2048), (256, 262144, 2048)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_issue_shapes_exact(M, N, k, dtype):
    """The issue's shapes: the exact deterministic result (CPU oracle), twice bit-identical, sorted like torch."""
    x = torch.randn(M, N, device="cuda").to(dtype)
    v1, i1 = mod.top_k(x, k)
    v2, i2 = mod.top_k(x, k, deterministic=True)
    assert torch.equal(i1, i2) and torch.equal(v1.view(_RAW[dtype]), v2.view(_RAW[dtype]))
    want_v, want_i = oracle(x.cpu(), k)
    assert torch.equal(i1.cpu(), want_i) and torch.equal(v1.cpu().view(_RAW[dtype]), want_v.view(_RAW[dtype]))
    sv, si = mod.top_k(x, k, sorted=True)
    assert torch.equal(sv.float(), torch.topk(x.float(), k).values)
    assert torch.equal(x.gather(-1, si), sv)


@gpu
@pytest.mark.parametrize("kind", ["ties", "constant", "special"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_edge_rows_exact(kind, dtype):
    x = make_rows(kind, 7, 50000, dtype, seed=3)
    for k in (1, 300, 4096):
        v, i = mod.top_k(x.cuda(), k)
        want_v, want_i = oracle(x, k)
        assert torch.equal(i.cpu(), want_i)
        assert torch.equal(v.cpu().view(_RAW[dtype]), want_v.view(_RAW[dtype]))


@gpu
def test_gpu_k_past_row_strided_graph_and_compile():
    base = torch.randn(5, 130, device="cuda")
    x = base[:, :100]  # row stride 130
    v, i = mod.top_k(x, 120)
    want_v, want_i = oracle(x.cpu(), 120)
    assert torch.equal(i.cpu(), want_i) and torch.equal(v.cpu(), want_v)
    g = torch.cuda.CUDAGraph()
    y = torch.randn(4, 8192, device="cuda")
    mod.top_k(y, 256)
    with torch.cuda.graph(g):
        gv, gi = mod.top_k(y, 256)
    y.copy_(torch.randn(4, 8192, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gi.cpu(), oracle(y.cpu(), 256)[1])
    cv, ci = torch.compile(lambda t: mod.top_k(t, 64), fullgraph=True)(y)
    assert torch.equal(ci.cpu(), oracle(y.cpu(), 64)[1])


def test_rejected_inputs():
    from tirx_kernels.core.checks import TirxInputError

    with pytest.raises(TirxInputError, match="argument 'k'"):
        mod.top_k(torch.zeros(2, 8), 5000)
    with pytest.raises(TirxInputError, match="argument 'input'"):
        mod.top_k(torch.zeros(2, 8, dtype=torch.int32), 2)
    with pytest.raises(TirxInputError, match="argument 'input'.*CUDA"):
        mod.top_k(torch.zeros(2, 8), 2)


@pytest.mark.parametrize("params", [{"dtype": "float32", "index_dtype": "int64"},
                                    {"dtype": "bfloat16", "index_dtype": "int32"}])
def test_sass(params):
    pytest.importorskip("tvm", reason="apache-tvm is needed to build")
    from tirx_kernels.core import testing

    testing.build_and_check_sass(mod, "radix_topk_single_cta", params)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_transforms(dtype):
    """DSA-indexer shapes: per-row lengths (0, < k, full, past the width), a page table with padded rows, offsets."""
    M, N, k = 6, 65536, 2048
    x = torch.randn(M, N, device="cuda").to(dtype)
    lengths = torch.tensor([0, 1000, N, 40000, 2048, 70000], device="cuda", dtype=torch.int32)
    table = torch.randint(0, 2**30, (M, N + 64), device="cuda", dtype=torch.int32)
    offsets = torch.tensor([0, 5, 1 << 20, 3, 9, 77], device="cuda", dtype=torch.int32)
    got_p = mod.top_k_page_table_transform(x, table, lengths, k)
    got_r = mod.top_k_ragged_transform(x, offsets, lengths, k)
    for r in range(M):
        n = min(int(lengths[r]), N)
        want = oracle(x[r:r + 1, :n].cpu(), k)[1][0] if n else torch.full((k,), -1)
        valid = want >= 0
        want_p = torch.where(valid, table[r].cpu().long()[want.clamp(min=0)], -1)
        want_r = torch.where(valid, want + int(offsets[r]), -1)
        assert torch.equal(got_p[r].cpu().long(), want_p), r
        assert torch.equal(got_r[r].cpu().long(), want_r), r
