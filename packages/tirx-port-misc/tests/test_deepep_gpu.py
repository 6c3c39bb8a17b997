# SPDX-License-Identifier: Apache-2.0
"""On the GPU: ``deepep_dispatch`` / ``deepep_combine`` with one rank (20 back-to-back call pairs, every result exact
against the torch all-to-all oracle), W ranks simulated on one GPU (the CONFIGS' w*sim rows run through test_gpu.py's
harness too), and real world sizes 2..8 (torchrun, NCCL + torch symmetric memory, NVLink multicast off: exactness,
then the time of dispatch / combine against torch.distributed.all_to_all_single and the NVLink bandwidth of a peer
copy measured in the same run), which skip where fewer GPUs exist."""

import os

import pytest
import torch

from tirx_kernels.core import testing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a)")
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_one_rank_twenty_calls_exact():
    testing.load_or_skip("deepep_dispatch")
    from tirx_kernels.ported.deepep import _layout
    from tirx_kernels.ported.deepep.combine import combine
    from tirx_kernels.ported.deepep.dispatch import dispatch, routing

    t, h, e, k = 1000, 7168, 256, 6
    results = []
    for i in range(20):
        x = torch.randn(t, h, device="cuda").bfloat16()
        idx, w = routing(1, t, e, k, masked=0.2 * (i % 2))
        recv_x, recv_idx, recv_w, counts, handle = dispatch(x, idx[0], w[0], e, expert_alignment=128)
        y = (recv_x.float() * 0.5).bfloat16()
        cx, cw = combine(y, handle, recv_w)
        results.append((x, idx[0], w[0], recv_x, recv_idx, recv_w, counts, handle, y, cx, cw))
    torch.cuda.synchronize()
    for x, idx, w, recv_x, recv_idx, recv_w, counts, handle, y, cx, cw in results:
        ref = _layout.reference_dispatch([x], [idx], [w], e, 128)[0]
        assert torch.equal(recv_x, ref[0]) and torch.equal(recv_idx, ref[1]) and torch.equal(recv_w, ref[2])
        assert torch.equal(handle.recv_src_idx, ref[3]) and counts == ref[4]
        want = _layout.reference_combine([y], [recv_w], [handle.is_token_in_rank], [handle.positions])[0]
        assert torch.equal(cx, want[0]) and torch.equal(cw, want[1])


@pytest.mark.parametrize("world", [2, 4, 8])
def test_real_ranks(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs (this host has {torch.cuda.device_count()}): multi-GPU runs are blocked here")
    testing.load_or_skip("deepep_dispatch")
    import pathlib
    import subprocess
    import sys

    worker = pathlib.Path(__file__).with_name("deepep_worker.py")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                          str(worker)], env={**os.environ, **ENV}, capture_output=True, text=True, timeout=1800)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stderr[-6000:]
