# SPDX-License-Identifier: Apache-2.0
import glob, os, sys, json
os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/indcache"
import torch, torch.nn.functional as F
torch.manual_seed(0)
def rms(x, w, eps): return F.rms_norm(x, (x.shape[-1],), w, eps)
def silu_mul(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
cases = [("rms", (32768, 8192)), ("rms", (8192, 4096)), ("rms", (8192, 7168)), ("act", (32768, 2 * 14336))]
for kind, shape in cases:
    torch._dynamo.reset()
    before = set(glob.glob("/tmp/indcache/**/*.py", recursive=True))
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    if kind == "rms":
        w = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16)
        f = torch.compile(rms, dynamic=False); f(x, w, 1e-6)
    else:
        f = torch.compile(silu_mul, dynamic=False); f(x)
    torch.cuda.synchronize()
    after = set(glob.glob("/tmp/indcache/**/*.py", recursive=True))
    print(f"===== {kind} {shape}")
    for p in sorted(after - before):
        src = open(p).read()
        if "@triton.jit" not in src or "def triton_" not in src:
            continue
        print(f"--- {p}")
        print(src[src.find("@triton_heuristics"):][:6000])
        for b in glob.glob(os.path.join(os.path.dirname(p), "*.best_config")):
            print("best_config", b, open(b).read())

# Collect Triton's artifacts (ptx, cubin, metadata json) of the kernels above into one tarball.
import tarfile, subprocess
out = os.environ.get("OUT", "/tmp")
tcache = os.path.expanduser("~/.triton/cache")
files = [p for p in glob.glob(tcache + "/**/*", recursive=True) if p.endswith((".ptx", ".json", ".cubin", ".ttgir"))]
files += glob.glob("/tmp/indcache/**/*", recursive=True)
with tarfile.open(os.path.join(out, "triton-artifacts.tgz"), "w:gz") as t:
    for p in files:
        if os.path.isfile(p):
            t.add(p, arcname=p.replace("/", "_")[-150:])
for p in files:
    if p.endswith(".cubin"):
        r = subprocess.run(["cuobjdump", "-sass", p], capture_output=True, text=True)
        print("#### SASS", p); print(r.stdout[:20000] if r.returncode == 0 else r.stderr[:500])
