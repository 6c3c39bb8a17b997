# SPDX-License-Identifier: Apache-2.0
"""Where the small-batch decode rows spend their time (GPU host): for each (kernel, bench config), the suite's
cold-L2 event timing, the same call in a CUDA graph, and the host's time per call (``n`` calls without a sync).
If the host time exceeds the cold-L2 flush (a 512 MiB fill, ~200 us on an H100) the event timer sees host
time, not the kernel's.

    python3 tools/probes/decode_latency.py [kernel:config ...]
"""

import functools
import sys

from host_overhead import per_call  # this directory's probe: host time a call, then with the GPU

DEFAULT = ["gdn_decode_bf16_wide_vec_t1:b1_h16_hv32", "gdn_decode_bf16_ilp4:t1_b1_h2_hv4",
           "gdn_decode_bf16_wide_vec_mtp:b1_h16_hv32_t4_inter", "gdn_decode_fp32_mtp_warp:t2_b4_h16_hv64_inter",
           "recurrent_kda_decode_one_warp:hv16_b8_lb", "kda_decode_multishape:t1_b8_hv32",
           "selective_state_update_mtp_simple:b1_h64_d64_s128_t6_r8_statebf16_official",
           "selective_state_update_stp_simple:b64_h64_d64_s128_r8"]


def main() -> int:
    from tirx_kernels import registry
    from tirx_kernels.core import bench
    from tirx_kernels.core.harness import find_config, full_config

    print(f"{'kernel':36s} {'config':44s} {'events':>8s} {'graph':>8s} {'host':>8s}  us")
    for kc in sys.argv[1:] or DEFAULT:
        kernel, label = kc.split(":", 1)
        try:
            mod = registry.load(kernel)
            cfg = full_config(mod, find_config(mod, label, bench=True))
            data = mod.prepare_data(**cfg)
            fn = functools.partial(mod.launch, cfg, data)
            ev = bench.time_calls({"x": fn})["x"]["median_us"]
            gr = bench.time_graph(fn)["median_us"]
            print(f"{kernel:36s} {label:44s} {ev:8.1f} {gr:8.1f} {per_call(fn, n=200)[0]:8.1f}", flush=True)
        except Exception as e:  # a probe: report and go on
            print(f"{kernel:36s} {label:44s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
