# SPDX-License-Identifier: Apache-2.0
"""On the GPU: ``allgather_gemm`` and ``gemm_reduce_scatter`` with world size 1 (bit-exact gathered A, the fp32 oracle
of the unsharded GEMM, 20 back-to-back calls reusing every buffer, CUDA graph replay), W ranks simulated on one GPU,
and real world sizes 2..8 (torch.multiprocessing, NCCL + torch symmetric memory, NVLink multicast off), which skip
where fewer GPUs exist. The multi-GPU test also times each op against cuBLAS + NCCL (printed; -s to see)."""

import os

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _close(got, want, what):
    err = (got.float() - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= 2e-2 * scale + 1e-2, f"{what}: max error {err} against max |want| {scale}"


def test_allgather_gemm_world1_twenty_calls_reuse_buffers():
    testing.load_or_skip("allgather_gemm")
    from tirx_kernels.gemm.allgather_gemm import allgather_gemm

    M, N, K = 1000, 1032, 1048  # noqa: N806
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    gathered = torch.empty(M, K, dtype=torch.bfloat16, device="cuda")
    inputs, results = [], []
    for _ in range(20):  # back to back, no sync between calls; copies of each result on the stream
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16()
        allgather_gemm(a, w, out=out, gathered=gathered)
        inputs.append((a, w))
        results.append((gathered.clone(), out.clone()))
    torch.cuda.synchronize()
    for (a, w), (g, o) in zip(inputs, results):
        assert torch.equal(g, a), "gathered A is not bit-exact"
        _close(o, a.float() @ w.float().T, "allgather_gemm out")
    g, o = allgather_gemm(a, w)  # the functional form
    assert torch.equal(g, a)
    _close(o, a.float() @ w.float().T, "allgather_gemm functional")


def test_gemm_reduce_scatter_world1_twenty_calls_reuse_buffers():
    testing.load_or_skip("gemm_reduce_scatter")
    from tirx_kernels.gemm.gemm_reduce_scatter import gemm_reduce_scatter

    M, N, K = 1000, 1032, 1048  # noqa: N806
    out = torch.empty(M, N, dtype=torch.float16, device="cuda")
    inputs, results = [], []
    for _ in range(20):
        a = torch.randn(M, K, device="cuda").half()
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).half()
        gemm_reduce_scatter(a, w, out=out)
        inputs.append((a, w))
        results.append(out.clone())
    torch.cuda.synchronize()
    for (a, w), o in zip(inputs, results):
        _close(o, a.float() @ w.float().T, "gemm_reduce_scatter out")


@pytest.mark.parametrize("kernel, label", [("allgather_gemm", "tp3sim_m300_n600_k136_bf16"),
                                           ("allgather_gemm", "tp1_m1000_n1032_k1048_bf16"),
                                           ("gemm_reduce_scatter", "tp3sim_m300_n200_k144_bf16")])
def test_cuda_graph_replay(kernel, label):
    testing.check_graph_replay(kernel, label)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_simulated_ranks_small(world):
    """W ranks on one GPU (one stream each): shapes whose shards end inside M-tiles."""
    testing.load_or_skip("allgather_gemm")
    from tirx_kernels.gemm import allgather_gemm as ag
    from tirx_kernels.gemm import gemm_reduce_scatter as rs

    M, N, K = 136 * world, 200 * world, 264  # noqa: N806
    a = torch.randn(M, K, device="cuda").half()
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).half()
    gathered = torch.full((world, M, K), float("nan"), dtype=torch.half, device="cuda")
    out = torch.full((M, N), float("nan"), dtype=torch.half, device="cuda")
    ag.simulate_ranks(a, w, world, gathered, out)
    torch.cuda.synchronize()
    assert torch.equal(gathered, a.expand(world, M, K))
    _close(out, a.float() @ w.float().T, f"allgather_gemm simulated W={world}")
    a3 = torch.randn(world, M, 48, device="cuda").half()
    w3 = (torch.randn(world, 200, 48, device="cuda") / (48 * world) ** 0.5).half()
    out3 = torch.full((M, 200), float("nan"), dtype=torch.half, device="cuda")
    rs.simulate_ranks(a3, w3, out3)
    torch.cuda.synchronize()
    _close(out3, torch.einsum("rmk,rnk->mn", a3.float(), w3.float()), f"gemm_reduce_scatter simulated W={world}")


@pytest.mark.parametrize("world", [2, 4, 8])
def test_real_ranks(world):
    """``world`` processes, one GPU each (torchrun running distributed_gemm_worker.py): both ops against the fp32
    oracle of the unsharded GEMM, 20 back-to-back calls each, and timed against cuBLAS + NCCL (all_gather_into_tensor
    / reduce_scatter_tensor) at the catalog shapes (printed; -s to see)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs (this host has {torch.cuda.device_count()}): multi-GPU runs are blocked here")
    testing.load_or_skip("allgather_gemm")
    import pathlib
    import subprocess
    import sys

    worker = pathlib.Path(__file__).with_name("distributed_gemm_worker.py")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                          str(worker)], env={**os.environ, **ENV}, capture_output=True, text=True, timeout=1800)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stderr[-6000:]
