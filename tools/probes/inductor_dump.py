# SPDX-License-Identifier: Apache-2.0
"""GPU host: compile torch.compile's RMSNorm / silu-and-mul at the suite's shapes and print Inductor's Triton
kernels with the autotuned config; pack Triton's artifacts (PTX, cubin, metadata) into $OUT/triton-artifacts.tgz
and print each cubin's SASS (cuobjdump)."""

import glob
import os
import subprocess
import tarfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/indcache"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CASES = [("rms", (32768, 8192)), ("rms", (8192, 4096)), ("rms", (8192, 7168)), ("act", (32768, 2 * 14336))]


def rms(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def silu_mul(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def main():
    torch.manual_seed(0)
    for kind, shape in CASES:
        torch._dynamo.reset()
        before = set(glob.glob("/tmp/indcache/**/*.py", recursive=True))
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        if kind == "rms":
            w = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16)
            torch.compile(rms, dynamic=False)(x, w, 1e-6)
        else:
            torch.compile(silu_mul, dynamic=False)(x)
        torch.cuda.synchronize()
        print(f"===== {kind} {shape}")
        for p in sorted(set(glob.glob("/tmp/indcache/**/*.py", recursive=True)) - before):
            src = open(p).read()
            if "@triton.jit" not in src or "def triton_" not in src:
                continue
            print(f"--- {p}")
            print(src[src.find("@triton_heuristics"):][:6000])
            for b in glob.glob(os.path.join(os.path.dirname(p), "*.best_config")):
                print("best_config", b, open(b).read())
    files = [p for p in glob.glob("/tmp/indcache/**/*", recursive=True) if os.path.isfile(p)]
    with tarfile.open(os.path.join(os.environ.get("OUT", "/tmp"), "triton-artifacts.tgz"), "w:gz") as t:
        for p in files:
            t.add(p, arcname=p.replace("/", "_")[-150:])
    for p in files:
        if p.endswith(".cubin"):
            r = subprocess.run(["cuobjdump", "-sass", p], capture_output=True, text=True)
            print("#### SASS", p)
            print(r.stdout if r.returncode == 0 else r.stderr[:500])


if __name__ == "__main__":
    main()
