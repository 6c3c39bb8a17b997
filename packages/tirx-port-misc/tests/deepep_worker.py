# SPDX-License-Identifier: Apache-2.0
"""One rank of test_deepep_gpu.py's multi-GPU test (run by ``torch.distributed.run``): dispatch and combine over
NCCL + torch symmetric memory (NVLink multicast off) against a torch.distributed all-to-all implementation, 20 calls,
then timed against all_to_all_single, with the NVLink bandwidth of a peer copy measured in the same run. Exits
non-zero on a mismatch."""

import os
import sys

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def timed(fn, iters=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def all_to_all_dispatch(x, idx, w, e, world, group):
    """The torch all-to-all oracle: every rank's rows for each destination, in token order, by all_to_all_single."""
    from tirx_kernels.ported.deepep import _layout

    per_rank, _, in_rank = _layout.layout(idx, e, world)
    rows = [torch.nonzero(in_rank[:, j]).flatten() for j in range(world)]
    send = torch.cat([x[r] for r in rows])
    send_counts = per_rank.tolist()
    recv_counts = torch.empty(world, dtype=torch.int32, device=x.device)
    dist.all_to_all_single(recv_counts, per_rank, group=group)
    recv = torch.empty(int(recv_counts.sum()), x.shape[1], dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv, send, recv_counts.tolist(), send_counts, group=group)
    return recv, rows, send_counts, recv_counts.tolist()


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    group = dist.group.WORLD
    from tirx_kernels.ported.deepep.combine import combine
    from tirx_kernels.ported.deepep.dispatch import dispatch, routing

    t, h, e, k = 4096, 7168, 256, 6
    torch.manual_seed(rank)
    x = torch.randn(t, h, device="cuda").bfloat16()
    idx, w = routing(1, t, e, k, masked=0.1)
    idx, w = idx[0], w[0]
    for _ in range(20):
        recv_x, recv_idx, recv_w, counts, handle = dispatch(x, idx, w, e, group, expert_alignment=128)
        y = recv_x
        cx, cw = combine(y, handle, recv_w, group)
    torch.cuda.synchronize()
    ref_recv, rows, send_counts, recv_counts = all_to_all_dispatch(x, idx, w, e, world, group)
    if not torch.equal(recv_x, ref_recv):
        raise AssertionError(f"rank {rank}: dispatch rows differ from the all-to-all")
    sent = handle.is_token_in_rank.sum(1, keepdim=True)
    want = torch.where(sent > 0, (x.float() * sent).bfloat16(), torch.zeros_like(x))
    if not torch.equal(cx, want):  # every rank returned the rows unchanged: the sum is copies x rows
        raise AssertionError(f"rank {rank}: combine differs from copies x the source rows")

    def ref_a2a():
        recv = torch.empty(sum(recv_counts), h, dtype=x.dtype, device="cuda")
        dist.all_to_all_single(recv, torch.cat([x[r] for r in rows]), recv_counts, send_counts, group=group)
        return recv

    def ref_back():
        back = torch.empty(sum(send_counts), h, dtype=x.dtype, device="cuda")
        dist.all_to_all_single(back, ref_recv, send_counts, recv_counts, group=group)
        return back

    # NVLink ceiling of this run: one peer copy (copy engine) of a 256 MiB buffer from the next rank.
    from tirx_kernels.core import symm

    ws = symm.symm_workspace(group.group_name, 256 << 20)
    src = ws.get_buffer((rank + 1) % world, (128 << 20,), torch.bfloat16)
    dst = torch.empty(128 << 20, dtype=torch.bfloat16, device="cuda")
    nvlink = (256 << 20) / timed(lambda: dst.copy_(src)) / 1e3  # GB/s
    nbytes = recv_x.numel() * 2
    t_d = timed(lambda: dispatch(x, idx, w, e, group))
    t_c = timed(lambda: combine(y, handle, recv_w, group))
    t_a, t_b = timed(ref_a2a), timed(ref_back)
    if rank == 0:
        print(f"W={world} t={t} h={h}: dispatch {t_d:.1f} us ({nbytes / t_d / 1e3:.1f} GB/s), combine {t_c:.1f} us "
              f"({nbytes / t_c / 1e3:.1f} GB/s); torch all_to_all {t_a:.1f} / {t_b:.1f} us; peer copy {nvlink:.1f} "
              f"GB/s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
