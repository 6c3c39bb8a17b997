# SPDX-License-Identifier: Apache-2.0
"""TIRx PrimFunc -> CUDA source -> sm_90a ``.so`` loadable with only apache-tvm-ffi.

Runs on a machine with no GPU and no driver: codegen through ``tvm.compile`` (host ``cuda_host``),
``export_cuda_host`` to one translation unit, then an explicit nvcc step (without a GPU,
``tvm.compile`` silently returns a source-only module, so we never rely on it producing a binary).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

ARCH = "sm_90a"

# The exported host code needs the driver only for cuTensorMapEncodeTiled and cuGetErrorString.
# Reaching both through cudart's driver-entry-point query lets the .so link and load with no libcuda
# (the CPU build machines have none; a stub libcuda leaves "symbol lookup error" at the first call).
DRIVER_SHIM = r"""
#include <cuda.h>
#include <cuda_runtime.h>
static CUresult tirx_shim_cuTensorMapEncodeTiled(CUtensorMap* m, CUtensorMapDataType t, cuuint32_t r, void* g,
    const cuuint64_t* d, const cuuint64_t* s, const cuuint32_t* b, const cuuint32_t* e, CUtensorMapInterleave il,
    CUtensorMapSwizzle sw, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill f) {
  typedef CUresult (*Fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
      CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Fn fn = nullptr;
  if (!fn) {
    void* p = nullptr; cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess
        || !p)
      return CUDA_ERROR_NOT_FOUND;
    fn = (Fn)p;
  }
  return fn(m, t, r, g, d, s, b, e, il, sw, l2, f);
}
static CUresult tirx_shim_cuGetErrorString(CUresult e, const char** s) {
  *s = "CUDA driver error"; (void)e; return CUDA_SUCCESS;
}
#define cuTensorMapEncodeTiled tirx_shim_cuTensorMapEncodeTiled
#define cuGetErrorString tirx_shim_cuGetErrorString
"""


class BuildError(RuntimeError):
    """Codegen or nvcc failed; the message carries the tool output."""


@dataclass
class BuildResult:
    so_path: str
    cu_path: str
    ptxas_info: dict = field(default_factory=dict)
    codegen_s: float = 0.0
    nvcc_s: float = 0.0


def _nvcc() -> str:
    nvcc = os.environ.get("TIRX_KERNELS_NVCC") or shutil.which("nvcc")
    if not nvcc:
        for cand in ("/usr/local/cuda/bin/nvcc",):
            if os.path.exists(cand):
                return cand
        raise BuildError("nvcc not found: install the CUDA toolkit (13.0) or set TIRX_KERNELS_NVCC")
    return nvcc


@functools.cache
def nvcc_version() -> str:
    out = subprocess.run([_nvcc(), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else "unknown"


def tvm_version() -> str:
    try:
        import tvm
    except ImportError:
        return "absent"
    return tvm.__version__


def codegen(func) -> str:
    """The single CUDA translation unit (device kernels + tvm-ffi host wrapper) for ``func``."""
    import tvm

    return _export(func if isinstance(func, tvm.IRModule) else tvm.IRModule({"main": func}))


def codegen_many(funcs: dict) -> str:
    """One CUDA translation unit holding every ``{function name: PrimFunc}``: each is exported as the tvm-ffi
    function of that name, and its device kernels are named ``<function name>_kernel...``."""
    import tvm

    return _export(tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()}))


def _export(mod) -> str:
    import tvm
    from tvm.backend.cuda import export_cuda_host

    target = tvm.target.Target({"kind": "cuda", "arch": ARCH, "host": "cuda_host"})
    ex = tvm.compile(mod, target=target, tir_pipeline="tirx")
    return DRIVER_SHIM + export_cuda_host(ex.mod)


def function_name(key: str) -> str:
    """The tvm-ffi function name of artifact ``key`` inside a batched ``.so``."""
    return "f_" + key


def kernels_of(ptxas_info: dict, function: str) -> dict:
    """The ptxas facts of the device kernels that tvm-ffi function ``function`` of a batch launches."""
    return {k: v for k, v in ptxas_info.get("kernels", {}).items() if k.startswith(function + "_")}


_PTXAS_RE = re.compile(
    r"Used (?P<registers>\d+) registers.*?(?:(?P<smem>\d+) bytes smem)?", re.S)


def parse_ptxas(log: str) -> dict:
    """Registers, stack frame, spill bytes from ``-Xptxas -v`` output (first entry of each kernel)."""
    info = {"kernels": {}}
    current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line) or re.search(r"Function properties for (\S+)", line)
        if m:
            current = m.group(1)
            info["kernels"].setdefault(current, {})
        if current is None:
            continue
        k = info["kernels"][current]
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            k.update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)), spill_load_bytes=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            k["registers"] = int(m.group(1))
    return info


def nvcc_so(cu_path: str, so_path: str) -> tuple[dict, str]:
    import tvm_ffi

    cmd = [
        _nvcc(), "-O3", "-std=c++17", "-shared", "-cudart", "shared", "-Xcompiler", "-fPIC",
        "-gencode", f"arch=compute_{ARCH[3:]},code={ARCH}", "-Xptxas", "-v",
        *[f"-I{p}" for p in tvm_ffi.libinfo.include_paths()],
        cu_path, "-o", so_path,
        f"-L{os.path.dirname(tvm_ffi.libinfo.find_libtvm_ffi())}", "-ltvm_ffi",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    if r.returncode:
        raise BuildError(f"nvcc failed ({r.returncode}):\n{' '.join(cmd)}\n{log[-6000:]}")
    if "C7508" in log or "setmaxnreg ignored" in log:
        raise BuildError(f"ptxas ignored setmaxnreg (warning C7508):\n{log[-3000:]}")
    return parse_ptxas(log), log


def build_so(func, so_path: str) -> BuildResult:
    """Build ``func`` (PrimFunc or IRModule) into ``so_path`` atomically; keeps the ``.cu`` beside it."""
    t0 = time.time()
    return _build_source(codegen(func), so_path, t0)


def build_so_many(funcs: dict, so_path: str) -> BuildResult:
    """Build every ``{function name: PrimFunc}`` into one ``.so`` (one translation unit, one nvcc call).

    Compiling the tvm-ffi host headers is most of an artifact's build (2026-12-05, this 2-core machine: nvcc
    5.3 s for one rmsnorm artifact, 4.5 s for two in one unit), so a kernel's artifacts are built together."""
    t0 = time.time()
    return _build_source(codegen_many(funcs), so_path, t0)


def _build_source(src: str, so_path: str, t0: float) -> BuildResult:
    t1 = time.time()
    out_dir = os.path.dirname(os.path.abspath(so_path))
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.splitext(so_path)[0]
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        cu_tmp = os.path.join(tmp, "kernel.cu")
        so_tmp = os.path.join(tmp, "kernel.so")
        with open(cu_tmp, "w") as f:
            f.write(src)
        info, _ = nvcc_so(cu_tmp, so_tmp)
        os.replace(cu_tmp, base + ".cu")
        os.replace(so_tmp, so_path)
    return BuildResult(so_path=so_path, cu_path=base + ".cu", ptxas_info=info, codegen_s=t1 - t0,
                       nvcc_s=time.time() - t1)


def cuobjdump() -> str | None:
    """Path of cuobjdump (CUDA toolkit, or the pip package nvidia-cuda-cuobjdump)."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        cand = os.path.join(root, "cu13", "bin", "cuobjdump")
        if os.path.exists(cand):
            return cand
    return None


def sass(so_path: str, function: str | None = None) -> str:
    """The SASS of ``so_path``; with ``function`` (a batch's tvm-ffi function name), of its kernels only."""
    exe = cuobjdump()
    if exe is None:
        raise BuildError("cuobjdump not found: pip install nvidia-cuda-cuobjdump==13.2.51")
    r = subprocess.run([exe, "-sass", so_path], capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"cuobjdump failed: {r.stderr[-2000:]}")
    if function is None or function == "main":
        return r.stdout
    # cuobjdump prints one "Function : <kernel>" section per kernel.
    sections = re.split(r"(?m)^(?=\s*Function : )", r.stdout)
    own = [sec for sec in sections[1:] if re.match(rf"\s*Function : {re.escape(function)}_", sec)]
    return sections[0] + "".join(own)  # the ELF header (arch line), then its own kernels
