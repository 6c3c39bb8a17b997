# SPDX-License-Identifier: Apache-2.0
"""Build FlashInfer's JIT modules for sm_90a on this CPU machine, packed as FlashInfer AOT modules for a GPU host.

FlashInfer (the bench reference of most FlashInfer ports) compiles each module with nvcc on first use: 1-4 minutes
a module on a GPU host, which a 30-minute device session cannot spend. FlashInfer loads a module without building
it when ``flashinfer/data/aot/<name>/<name>.so`` exists (``jit/env.py: get_aot_artifacts``), so the modules the
bench rows call are built here and unpacked into the staged FlashInfer tree on the GPU host:

    pip install --target /tmp/fi-site --no-deps flashinfer-python==0.7.4      # FlashInfer's tree (857 MB)
    pip install --target /tmp/fi-extra --no-deps nvidia-ml-py cuda-tile torch-c-dlpack-ext tqdm
    pip install --target /tmp/fi-cublas --no-deps nvidia-cublas nvidia-curand  # headers for --include
    PYTHONPATH=/tmp/fi-extra python3 tools/flashinfer_aot.py --site /tmp/fi-site \
        --include /tmp/fi-cublas/nvidia/cu13/include --out fi-aot.tar.xz         # ~8 min on 2 cores, 1.3 MiB
    ../shared/gpu/stage --ref flashinfer ... && cp fi-aot.tar.xz .gpu/trees/   # setup.sh unpacks it there

On the H100 (2026-12-07) the first FlashInfer rmsnorm then took 2.6 s with the import (49 s with a JIT build).

Which modules: the ones without arguments that the norm / activation / cascade / mxfp8 rows use, and, for the Mamba
rows, the ``selective_state_update`` specializations the rosters' configs ask for (found by calling FlashInfer's op
on CPU tensors with the build step intercepted: the module name encodes the dtypes and shapes).

This machine's CUDA toolkit lacks the cuBLAS / cuRAND headers and libcuda: ``--include`` names a directory with them
(e.g. the ``nvidia/cu13/include`` of the nvidia-cublas and nvidia-curand wheels) and a stub ``libcuda.so`` (soname
libcuda.so.1, no symbols) is made for the link; the GPU host's driver provides the real one.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stub_libcuda(tmp: str) -> str:
    src = os.path.join(tmp, "empty.c")
    open(src, "w").close()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", os.path.join(tmp, "libcuda.so"), "-Wl,-soname,libcuda.so.1", src],
                   check=True)
    return tmp


def plain_specs():
    from flashinfer.jit import gen_act_and_mul_module, norm
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.fp8_quantization import gen_mxfp8_quantization_sm100_module

    return [norm.gen_norm_module(), *(gen_act_and_mul_module(a) for a in ("silu", "gelu", "gelu_tanh")),
            gen_cascade_module(), gen_mxfp8_quantization_sm100_module()]


def mamba_specs() -> list:
    """The selective_state_update specs the Mamba rosters' rows call, by running each row's FlashInfer baseline on CPU
    tensors with sm90 reported and ``build_and_load`` intercepted."""
    import flashinfer.mamba.selective_state_update  # noqa: F401
    import flashinfer.utils
    import yaml
    from flashinfer.jit import core

    from tirx_kernels import registry
    from tirx_kernels.core.harness import find_config, full_config

    ssu = sys.modules["flashinfer.mamba.selective_state_update"]
    found = {}

    class Found(Exception):
        pass

    def intercept(spec):
        found[spec.name] = spec
        raise Found

    saved = core.JitSpec.build_and_load, ssu.get_compute_capability, flashinfer.utils.get_compute_capability
    core.JitSpec.build_and_load = intercept
    ssu.get_compute_capability = flashinfer.utils.get_compute_capability = lambda device: (9, 0)
    try:
        for path in sorted(glob.glob(os.path.join(ROOT, "config", "*", "selective_state_update_*.yaml"))):
            roster = yaml.safe_load(open(path))
            mod = registry.load(roster["kernel"])
            for row in roster["rows"]:
                cfg = full_config(mod, find_config(mod, row["config"], bench=True))
                fn = mod.get_baselines(**cfg)["flashinfer"]()
                try:
                    fn(mod.prepare_data(**{**cfg, "device": "cpu"}))
                except Found:
                    pass
    finally:
        core.JitSpec.build_and_load, ssu.get_compute_capability, flashinfer.utils.get_compute_capability = saved
    return list(found.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", required=True, help="directory holding an importable FlashInfer 0.7.4 tree")
    ap.add_argument("--include", help="extra include directory (cuBLAS / cuRAND headers)")
    ap.add_argument("--out", required=True, help="tar.xz to write (paths flashinfer/data/aot/<name>/<name>.so)")
    ap.add_argument("--no-mamba", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fi-aot-")
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", os.path.join(tmp, "ws"))
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    # FlashInfer links with -L$CUDA_HOME/lib64 and guesses CUDA_HOME from `which nvcc`: a wrapper in /usr/local/bin
    # here, so libcudart is not found. LIBRARY_PATH adds the toolkit's lib64 (and the libcuda stub) to ld's search.
    cudart = [d for d in glob.glob("/usr/local/cuda*/lib64") if os.path.exists(os.path.join(d, "libcudart.so"))][:1]
    os.environ["LIBRARY_PATH"] = os.pathsep.join([_stub_libcuda(tmp), *cudart, os.environ.get("LIBRARY_PATH", "")])
    # The link drops the (symbol-less) libcuda stub under --as-needed, and a module calling the driver API
    # (cuTensorMapEncodeTiled: the Mamba modules) then fails on the GPU host with "undefined symbol" (H100 run,
    # 2026-12-07): keep libcuda.so.1 as a needed library, resolved there by the driver's own.
    os.environ.setdefault("FLASHINFER_EXTRA_LDFLAGS", "-Wl,--no-as-needed -lcuda")
    # Host-compiled .cpp files (c++, not nvcc) include cuBLAS headers, which include the toolkit's driver_types.h.
    toolkit_include = [os.path.join(os.path.dirname(d), "include") for d in cudart]
    includes = [*([args.include] if args.include else []), *toolkit_include]
    os.environ["CPLUS_INCLUDE_PATH"] = os.pathsep.join([*includes, os.environ.get("CPLUS_INCLUDE_PATH", "")])
    sys.path.insert(0, args.site)
    specs = plain_specs() + ([] if args.no_mamba else mamba_specs())
    failed = []
    with tarfile.open(args.out, "w:xz") as tar:
        for spec in specs:
            t = time.time()
            try:
                spec.build(verbose=False)
            except Exception as e:  # one module's failure keeps the others (their rows can still run)
                failed.append(spec.name)
                print(f"FAILED {spec.name}: {str(e)[-2000:]}", flush=True)
                continue
            tar.add(str(spec.jit_library_path), arcname=f"flashinfer/data/aot/{spec.name}/{spec.name}.so")
            print(f"built {spec.name} in {time.time() - t:.0f} s", flush=True)
    print(f"{len(specs) - len(failed)} modules -> {args.out} ({os.path.getsize(args.out) / 2**20:.1f} MiB); "
          f"failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
