# SPDX-License-Identifier: Apache-2.0
"""Build kernel artifacts (``.so`` + ``manifest.json``) on a machine with apache-tvm and nvcc; no GPU needed.

    python -m tirx_kernels.build --kernel rmsnorm [--config L] --out DIR
    python -m tirx_kernels.build --all --out DIR [--jobs 2]
    python -m tirx_kernels.build --kernel rmsnorm --params '{"dtype": "bfloat16", "H": 3072}' --out DIR
    python tools/gemm_sweep.py tiles > tiles.jsonl   # one JSON object of compile params per line
    python -m tirx_kernels.build --kernel fp16_bf16_gemm --params-file tiles.jsonl --jobs 2 --out DIR
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time

from tirx_kernels import registry
from tirx_kernels.core import artifacts


def plan(names: list[str], label: str | None = None, extra_params: list[dict] | None = None) -> list[tuple]:
    """Unique (kernel, module, params, labels) to build, from CONFIGS (+ BENCH_CONFIGS), or from a list of
    explicit compile params."""
    from tirx_kernels.core.harness import all_configs, full_config

    out: dict[tuple, dict] = {}
    for name in names:
        mod = registry.load(name)
        if extra_params is not None:
            rows = [{"label": "custom", "_params": p} for p in extra_params]
        else:
            rows = all_configs(mod)
            if label:
                rows = [c for c in rows if c["label"] == label]
                if not rows:
                    raise SystemExit(f"kernel '{name}' has no config '{label}'")
        if extra_params is None and not label and hasattr(mod, "artifact_params"):
            # Params the public op picks at run time for shapes no config names (e.g. GEMM heuristic tiles).
            rows += [{"label": "artifact_params", "_params": p} for p in mod.artifact_params()]
        for c in rows:
            params = c.get("_params") or mod.compile_params(**full_config(mod, c))
            key = (name, artifacts.canonical_params(params))
            out.setdefault(key, {"kernel": name, "module": mod, "params": params, "labels": []})["labels"].append(
                c["label"])
    return list(out.values())


def _build_one(item: dict) -> dict:
    t0 = time.time()
    so, info = artifacts.build_cached(item["module"], item["kernel"], item["params"])
    return {**info, "so": so, "config_labels": item["labels"], "wall_s": round(time.time() - t0, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", help="kernel name (repeatable)")
    ap.add_argument("--config", help="only this config label")
    ap.add_argument("--all", action="store_true", help="every installed kernel")
    ap.add_argument("--params", help="explicit compile params as JSON (with one --kernel)")
    ap.add_argument("--params-file", help="explicit compile params, one JSON object per line (with one --kernel)")
    ap.add_argument("--out", required=True, help="bundle directory (manifest.json + .so files)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel builds")
    a = ap.parse_args(argv)
    if a.all:
        names = [e.name for e in registry.list_kernels()]
    elif a.kernel:
        names = a.kernel
    else:
        ap.error("give --kernel K or --all")
    if (a.params or a.params_file) and len(names) != 1:
        ap.error("--params / --params-file need exactly one --kernel")
    if a.params and a.params_file:
        ap.error("give --params or --params-file, not both")
    extra = [json.loads(a.params)] if a.params else None
    if a.params_file:
        with open(a.params_file) as f:
            extra = [json.loads(line) for line in f if line.strip()]
        if not extra:
            ap.error(f"--params-file {a.params_file}: no params in it")
    items = plan(names, a.config, extra)
    built = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        for res in ex.map(_build_one, items):
            k = next(iter(res["ptxas"]["kernels"].values()), {})
            print(f"built {res['kernel']:<20} {artifacts.canonical_params(res['params']):<48} "
                  f"regs={k.get('registers')} spills={k.get('spill_store_bytes')} {res['wall_s']}s", flush=True)
            built.append(res)
    path = artifacts.write_bundle(a.out, built)
    print(f"{len(built)} artifacts -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
