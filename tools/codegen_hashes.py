#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Hash the generated CUDA of every kernel a bundle holds (every CONFIGS row of every installed kernel, and every
GEMM tile in both dtypes), to show a refactor of kernel or ``core.lang`` code leaves the generated code as it was
(the artifacts' fingerprints hash the *sources*, so such a refactor stales the pinned bench baseline without
changing what runs):

    python tools/codegen_hashes.py write before.json      # at the old commit
    python tools/codegen_hashes.py write after.json       # at the new one
    python tools/codegen_hashes.py compare before.json after.json
"""

from __future__ import annotations

import hashlib
import json
import sys


def hashes() -> dict[str, str]:
    from tirx_kernels import registry
    from tirx_kernels.build import plan
    from tirx_kernels.core import build
    from tirx_kernels.gemm import fp16_bf16_gemm as gemm

    items = {it["kernel"] + json.dumps(it["params"], sort_keys=True): it
             for it in plan([e.name for e in registry.list_kernels()])}
    for dtype in ("bfloat16", "float16"):
        for tile in gemm.TILE_CONFIGS:
            params = {"dtype": dtype, "tile": tile}
            items["fp16_bf16_gemm" + json.dumps(params, sort_keys=True)] = {"module": gemm, "params": params}
    return {k: hashlib.sha256(build.codegen(it["module"].get_kernel(**it["params"])).encode()).hexdigest()[:16]
            for k, it in sorted(items.items())}


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"] and len(argv) == 2:
        h = hashes()
        with open(argv[1], "w") as f:
            json.dump(h, f, indent=0)
        print(f"{len(h)} kernels hashed -> {argv[1]}")
        return 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        a, b = (json.load(open(p)) for p in argv[1:])
        differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
        only = sorted(a.keys() ^ b.keys())
        print(f"{len(a.keys() & b.keys())} kernels in both: {len(differ)} differ, {len(only)} in one file only")
        for k in differ + only:
            print("  ", k)
        return 1 if differ or only else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
