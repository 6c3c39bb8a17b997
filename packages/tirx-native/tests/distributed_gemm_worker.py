# SPDX-License-Identifier: Apache-2.0
"""One rank of test_distributed_gemm_gpu.py's multi-GPU test (run by ``torch.distributed.run``, one process per GPU):
``allgather_gemm`` and ``gemm_reduce_scatter`` over NCCL + torch symmetric memory (NVLink multicast off) against the
fp32 oracle of the unsharded GEMM (every rank draws the same full tensors), 20 back-to-back calls each, then timed
against cuBLAS + NCCL. Exits non-zero on a mismatch."""

import os
import sys

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812


def close(got, want, what):
    err = (got.float() - want).abs().max().item()
    scale = want.abs().max().item()
    if err > 2e-2 * scale + 1e-2:
        raise AssertionError(f"{what}: max error {err} against max |want| {scale}")


def timed(fn, iters=10):
    """Mean µs of ``iters`` back-to-back calls after 3 warm-ups (all ranks in step: the ops synchronise them)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    dist.barrier()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    group = dist.group.WORLD
    from tirx_kernels.gemm.allgather_gemm import allgather_gemm
    from tirx_kernels.gemm.gemm_reduce_scatter import gemm_reduce_scatter

    # A small ragged shape, then the catalog's all-gather (Llama-3 8B-class) and reduce-scatter rows at M = 8192.
    ag_shapes = [(136 * world, 200 * world, 64 * world), (8192, 24576, 4096), (8192, 57344, 8192)]
    rs_shapes = [(136 * world, 200, 64 * world), (8192, 4096, 12288), (8192, 8192, 28672)]
    for ag_shape, rs_shape in zip(ag_shapes, rs_shapes):
        check_shape(rank, world, group, allgather_gemm, gemm_reduce_scatter, ag_shape, rs_shape)
    dist.destroy_process_group()
    return 0


def check_shape(rank, world, group, allgather_gemm, gemm_reduce_scatter, ag_shape, rs_shape):
    """Both ops at one shape each: the oracle after 20 calls, then the timings against cuBLAS + NCCL."""
    (M, N, K), (Mr, Nr, Kr) = ag_shape, rs_shape  # noqa: N806
    g = torch.Generator(device="cuda").manual_seed(1234)
    a_full = torch.randn(M, K, device="cuda", generator=g).half()
    w_full = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).half()
    a_shard = a_full.chunk(world)[rank].contiguous()
    w_cols = w_full.chunk(world)[rank].contiguous()
    for _ in range(20):
        gathered, out = allgather_gemm(a_shard, w_cols, group)
    torch.cuda.synchronize()
    if not torch.equal(gathered, a_full):
        raise AssertionError(f"rank {rank}: gathered A is not bit-exact")
    close(out, a_full.float() @ w_cols.float().T, f"allgather_gemm rank {rank} {M}x{N}x{K}")

    ar = torch.randn(Mr, Kr, device="cuda", generator=g).half()
    wr = (torch.randn(Nr, Kr, device="cuda", generator=g) / Kr ** 0.5).half()
    a_k = ar.chunk(world, dim=1)[rank].contiguous()
    w_k = wr.chunk(world, dim=1)[rank].contiguous()
    for _ in range(20):
        rs_out = gemm_reduce_scatter(a_k, w_k, group)
    torch.cuda.synchronize()
    close(rs_out, (ar.float() @ wr.float().T).chunk(world)[rank], f"gemm_reduce_scatter rank {rank} {Mr}x{Nr}x{Kr}")

    def ref_ag():
        full = torch.empty(M, K, dtype=a_shard.dtype, device="cuda")
        dist.all_gather_into_tensor(full, a_shard, group=group)
        return F.linear(full, w_cols)

    def ref_rs():
        part = F.linear(a_k, w_k)
        res = torch.empty(Mr // world, Nr, dtype=part.dtype, device="cuda")
        dist.reduce_scatter_tensor(res, part, group=group)
        return res

    t = {"allgather_gemm": timed(lambda: allgather_gemm(a_shard, w_cols, group)), "cublas+nccl_ag": timed(ref_ag),
         "gemm_reduce_scatter": timed(lambda: gemm_reduce_scatter(a_k, w_k, group)),
         "cublas+nccl_rs": timed(ref_rs)}
    if rank == 0:
        print(f"W={world} AG {M}x{N}x{K} RS {Mr}x{Nr}x{Kr}: " + ", ".join(f"{k} {v:.1f} us" for k, v in t.items())
              + f" | AG ratio {t['cublas+nccl_ag'] / t['allgather_gemm']:.3f}, RS ratio "
              f"{t['cublas+nccl_rs'] / t['gemm_reduce_scatter']:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
