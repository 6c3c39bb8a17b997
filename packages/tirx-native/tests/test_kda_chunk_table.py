# SPDX-License-Identifier: Apache-2.0
"""The KDA chunk table kernel (``kda._chunk_table``, kernel ``table`` of kda_forward_portfolio_multishape and of the
modules that reuse it) against its torch oracle (``chunk_table_torch``), bit for bit, on the CPU through
``core.emulate`` (the generated module, its host code included): random ragged batches of 1 to 3000 sequences with
empty, 1-token and 64-multiple lengths, tokens after ``cu_seqlens[-1]``, ``cu_seqlens`` past T, decreasing or
negative (clamped as the scan clamps them), int64 values past 2^31, T = 0, int32 and int64 ``cu_seqlens``. Every
output is poisoned first, so an entry left unwritten fails; the emulator's AddressSanitizer catches a write outside.

Two widths: the artifact's 1024 threads, and 64, whose tiles of 64 entries make a handful of sequences cross tile
boundaries (the scans' running carries) at a fraction of the emulation time."""

import random
import shutil

import pytest
import torch

from tirx_kernels.kda import kda_forward_portfolio_multishape as fwd

POISON = -7_777_777


@pytest.fixture(scope="module")
def emulated():
    pytest.importorskip("tvm", reason="apache-tvm is needed to generate the kernel")
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the emulation")
    from tirx_kernels.core import build, emulate
    from tirx_kernels.kda import _chunk_table

    return emulate.compile_module(build.codegen_many({
        "table": fwd.get_kernel("table"), "table64": _chunk_table.build_chunk_table_kernel(64)}))


def _run(emulated, cu, total, function="table"):
    """The kernel's (tok0, clen, base, ccu) for ``cu`` (CPU) and ``total``, checked bit for bit against the oracle."""
    n = cu.shape[0] - 1
    outs = fwd.table_outputs(n, total // fwd.CHUNK + n + 2, "cpu")
    for t in outs:
        t.fill_(POISON)
    cu_before = cu.clone()
    emulated(*fwd.table_args(cu, total, *outs), function=function, hang_timeout=120.0).check()
    assert torch.equal(cu, cu_before), "cu_seqlens was modified"
    want = (*fwd.chunk_table_torch(cu, total), fwd.clamped_cu(cu, total).to(torch.int32))
    for name, got, ref in zip(("tok0", "clen", "base", "ccu"), outs, want):
        assert got.dtype == ref.dtype and got.shape == ref.shape, (name, got.shape, ref.shape)
        bad = (got != ref).nonzero().flatten().tolist()
        assert not bad, (f"{name} differs at {bad[:8]} (of {len(bad)}): kernel {got[bad[:8]].tolist()}, "
                         f"torch {ref[bad[:8]].tolist()}; N={n}, T={total}, cu={cu[:12].tolist()}...")
    return outs


def _lengths(rng, n):
    """Ragged lengths: empty, 1-token, around and at multiples of 64, and anything up to 300."""
    special = [0, 0, 1, 63, 64, 65, 128, 129, 192]
    return [rng.choice(special) if rng.random() < 0.5 else rng.randrange(301) for _ in range(n)]


def _case(rng, n, kind, dtype):
    """``(cu_seqlens, total)``: ``exact`` (T = cu[-1]), ``tail`` (tokens after the last sequence), ``short`` (cu
    past T: clamped), ``messy`` (decreasing and negative entries), ``huge`` (int64 entries past 2^31 either way)."""
    cu = [0]
    for length in _lengths(rng, n):
        cu.append(cu[-1] + length)
    total = cu[-1]
    if kind == "tail":
        total += rng.randrange(1, 200)
    elif kind == "short":
        total = rng.randrange(0, cu[-1] + 1)
    elif kind == "messy":
        total += rng.randrange(0, 100)
        for _ in range(max(1, n // 10)):
            cu[rng.randrange(n + 1)] = rng.randrange(-50, total + 100)
    elif kind == "huge":
        cu[rng.randrange(1, n + 1)] = rng.choice([2**40, 2**31, 2**32 + 5, -2**40])
    return torch.tensor(cu, dtype=dtype), total


KINDS = ("exact", "tail", "short", "messy")


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000])
def test_random_batches_emulated_small_tiles(emulated, n):
    rng = random.Random(n)
    for i, kind in enumerate(KINDS + ("huge",)):
        dtype = torch.int64 if kind == "huge" or i % 2 else torch.int32
        _run(emulated, *_case(rng, n, kind, dtype), function="table64")


@pytest.mark.parametrize("n, kind, dtype", [
    (1, "exact", torch.int64), (2, "tail", torch.int32), (7, "messy", torch.int64), (1000, "tail", torch.int64),
    (1000, "short", torch.int32), (3000, "exact", torch.int32), (3000, "messy", torch.int64),
    (3000, "huge", torch.int64),
])
def test_random_batches_emulated(emulated, n, kind, dtype):
    _run(emulated, *_case(random.Random(n * 7 + len(kind)), n, kind, dtype))


@pytest.mark.parametrize("cu, total", [
    ([0, 70, 70, 71, 135], 200),  # test_kda_forward's hand-checked table
    ([0, 150, 100, 400], 200),  # decreasing and past T
    ([0, 0], 0),  # T = 0: N + 2 empty slots
    ([0, 5, 9, 12], 0),  # T = 0 with non-empty lengths: everything clamps to 0
    ([0, 0, 0], 5),  # only empty sequences: the 5 tokens are all tail
    ([3, 64, 65], 70),  # the first sequence starts late: tokens before it belong to no slot
    ([0, 64], 64), ([0, 128], 130), ([0, 1], 1), ([0, 1], 63), ([0, 1], 64), ([0, 1], 65), ([0, 1], 129),
    ([-5, 10, 2**31 - 1], 100),
])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_edge_cases_emulated(emulated, cu, total, dtype):
    _run(emulated, torch.tensor(cu, dtype=dtype), total, function="table64")


def test_tiles_and_slots_beyond_one_pass_emulated(emulated):
    """More slots than threads (T large against the 64 threads of a pass) and an entry on each tile boundary."""
    cu = torch.tensor([0] + [64 * i for i in range(1, 130)], dtype=torch.int64)
    tok0, clen, base, _ = _run(emulated, cu, 64 * 129 + 200, function="table64")
    assert base.tolist() == list(range(129)) and clen[:129].eq(64).all()


def test_cpu_tensors_take_the_torch_ops():
    """Off the GPU (the emulated op tests pass CPU tensors) chunk_table is the oracle itself."""
    cu = torch.tensor([0, 70, 70, 71, 135])
    for got, want in zip(fwd.chunk_table(cu, 200), fwd.chunk_table_torch(cu, 200)):
        assert got.device.type == "cpu" and torch.equal(got, want)


def test_kernel_is_an_artifact_of_every_module_that_calls_it():
    """The modules whose ops build the table on the device carry the kernel in their own artifacts (a bundle built for
    one of them alone serves its op)."""
    from tirx_kernels.kda import kda_backward_packed as bwd

    assert {"kernel": "table"} in fwd.artifact_params() and {"kernel": "table"} in bwd.artifact_params()
    cudnn = pytest.importorskip("tirx_kernels.ported.cudnn.linear_attention._gdn2_common")
    assert {"kernel": "table"} in cudnn.ARTIFACTS


def test_table_kernel_builds():
    """No spills or local memory (nvcc + cuobjdump, no GPU); the scans on shuffles; only ``cu_seqlens`` (read-only) may
    be loaded through the non-coherent path: ``base`` and ``ccu`` are read back after the CTA wrote them (phase 2),
    and an ``LDG.CONSTANT`` of them could see stale data."""
    import re

    pytest.importorskip("tvm", reason="apache-tvm is needed to build kernels")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tirx_kernels.core import testing

    sass = testing.build_and_check_sass(fwd, fwd.KERNEL_META["name"], {"kernel": "table"})
    assert len(re.findall(r"LDG\.E(\.64)?\.CONSTANT", sass)) == 2, "cu_seqlens' int32 and int64 loads only"
    assert re.search(r"LDG\.E ", sass) and "BAR.SYNC" in sass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
@pytest.mark.parametrize("n", [1, 7, 1000, 3000])
def test_device_table_matches_torch_gpu(n):
    rng = random.Random(n)
    for i, kind in enumerate(KINDS + ("huge",)):
        cu, total = _case(rng, n, kind, torch.int64 if kind == "huge" or i % 2 else torch.int32)
        cu = cu.cuda()
        for got, want in zip(fwd.chunk_table(cu, total), fwd.chunk_table_torch(cu, total)):
            assert torch.equal(got, want), (n, kind)
