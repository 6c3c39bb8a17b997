# SPDX-License-Identifier: Apache-2.0
"""Host time per call of our public ops against torch's (GPU host). Each row calls the op ``n`` times without a
sync: while the GPU is the faster side, the launch queue absorbs its time and the loop measures the host's;
"with the GPU" adds the final sync. Small shapes, so the kernels are shorter than the host work. The last part
profiles ``gemm_nt`` (cProfile, by own time).

    python3 tools/probes/host_overhead.py [--no-profile]
"""

import cProfile
import io
import pstats
import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812


def per_call(fn, n=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    from tirx_kernels.core import runtime
    from tirx_kernels.gemm import fp16_bf16_gemm as gemm
    from tirx_kernels.norm.rmsnorm import rmsnorm
    from tirx_kernels.ported.flashinfer.activation.act_and_mul import silu_and_mul

    rows = {}
    for M, N, K in [(8, 256, 256), (1, 4096, 4096)]:  # noqa: N806
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(N, K, device="cuda").bfloat16()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fn = runtime.get_function(gemm, gemm.compile_params(dtype="bfloat16", M=M, N=N, K=K))
        rows[f"gemm {M}x{N}x{K}"] = {
            "F.linear": lambda a=a, b=b: F.linear(a, b),
            "torch.mm(out=)": lambda a=a, b=b, out=out: torch.mm(a, b.T, out=out),
            "gemm_nt(out=)": lambda a=a, b=b, out=out: gemm.gemm_nt(a, b, out=out),
            "gemm_nt()": lambda a=a, b=b: gemm.gemm_nt(a, b),
            "custom op": lambda a=a, b=b, out=out: torch.ops.tirx.gemm_nt_out(a, b, out, None, None, 1.0, 0.0),
            "tvm-ffi call": lambda a=a, b=b, out=out, fn=fn: fn(a, b, out),
        }
    x = torch.randn(8, 4096, device="cuda").bfloat16()
    w = torch.randn(4096, device="cuda").bfloat16()
    rows["rmsnorm 8x4096"] = {"F.rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
                              "rmsnorm": lambda: rmsnorm(x, w, 1e-6),
                              "custom op": lambda: torch.ops.tirx.rmsnorm(x, w, 1e-6)}
    g = torch.randn(8, 2 * 4096, device="cuda").bfloat16()
    rows["silu_and_mul 8x4096"] = {"torch (2 ops)": lambda: F.silu(g[:, :4096]) * g[:, 4096:],
                                   "silu_and_mul": lambda: silu_and_mul(g),
                                   "custom op": lambda: torch.ops.tirx.act_and_mul(g, "silu")}
    for case, fns in rows.items():
        for name, f in fns.items():
            host, total = per_call(f)
            print(f"{case:22s} {name:16s} host {host:7.2f} us/call, with the GPU {total:7.2f}", flush=True)
    if "--no-profile" not in sys.argv:
        a = torch.randn(8, 256, device="cuda").bfloat16()
        b = torch.randn(256, 256, device="cuda").bfloat16()
        out = torch.empty(8, 256, device="cuda", dtype=torch.bfloat16)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3000):
            gemm.gemm_nt(a, b, out=out)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(20)
        print(s.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
