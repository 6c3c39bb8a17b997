# SPDX-License-Identifier: Apache-2.0
"""Build kernel artifacts (``.so`` + ``manifest.json``) on a machine with apache-tvm and nvcc; no GPU needed.

    python -m tirx_kernels.build --kernel rmsnorm [--config L] --out DIR
    python -m tirx_kernels.build --all --out DIR [--jobs N]          # N: default every core
    python -m tirx_kernels.build --package tirx-native --out DIR      # the kernels of installed package(s)
    python -m tirx_kernels.build --kernel rmsnorm --params '{"dtype": "bfloat16", "H": 3072}' --out DIR
    python tools/gemm_sweep.py tiles > tiles.jsonl   # one JSON object of compile params per line
    python -m tirx_kernels.build --kernel fp16_bf16_gemm --params-file tiles.jsonl --jobs 2 --out DIR
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
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


MAX_BATCH = 24  # artifacts per translation unit: enough to amortise the host headers, small enough to spread


def batches(items: list[dict], jobs: int) -> list[list[dict]]:
    """``items`` split into build batches: one kernel per batch (its artifacts share a translation unit), each
    kernel's items in at least ``jobs`` batches where it has that many (so every core has work) and at most
    ``MAX_BATCH`` per batch; largest batches first."""
    by_kernel: dict[str, list[dict]] = {}
    for it in items:
        by_kernel.setdefault(it["kernel"], []).append(it)
    out = []
    for group in by_kernel.values():
        n = max(min(jobs, len(group)), -(-len(group) // MAX_BATCH))
        size = -(-len(group) // n)
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return sorted(out, key=len, reverse=True)


def _build_batch(batch: list[dict]) -> list[dict]:
    t0 = time.time()
    first = batch[0]
    built = artifacts.build_cached_many(first["module"], first["kernel"], [it["params"] for it in batch])
    wall = round(time.time() - t0, 2)
    return [{**info, "so": so, "config_labels": it["labels"], "wall_s": wall} for it, (so, info) in zip(batch, built)]


def select_kernels(all_kernels: bool, kernels: list[str] | None, packages: list[str] | None) -> list[str]:
    """Kernel names from ``--all``, ``--kernel`` and ``--package`` (a distribution name, e.g. tirx-native)."""
    entries = registry.list_kernels()
    if all_kernels:
        return [e.name for e in entries]
    names = list(kernels or [])
    for pkg in packages or []:
        want = pkg.replace("_", "-").lower()
        found = [e.name for e in entries if e.distribution.replace("_", "-").lower() == want]
        if not found:
            have = sorted({e.distribution for e in entries})
            raise SystemExit(f"--package {pkg}: no installed kernel package of that name (installed: {have})")
        names += [n for n in found if n not in names]
    return names


def _bundle_size(out_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", help="kernel name (repeatable)")
    ap.add_argument("--package", action="append", help="every kernel of this installed package (repeatable)")
    ap.add_argument("--config", help="only this config label")
    ap.add_argument("--all", action="store_true", help="every installed kernel")
    ap.add_argument("--params", help="explicit compile params as JSON (with one --kernel)")
    ap.add_argument("--params-file", help="explicit compile params, one JSON object per line (with one --kernel)")
    ap.add_argument("--out", required=True, help="bundle directory (manifest.json + .so files)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc calls (default: every core)")
    a = ap.parse_args(argv)
    if not (a.all or a.kernel or a.package):
        ap.error("give --kernel K, --package P or --all")
    names = select_kernels(a.all, a.kernel, a.package)
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
    t0 = time.time()
    items = plan(names, a.config, extra)
    built = []
    # Threads: each batch's time is nvcc's (a subprocess); codegen holds the GIL for ~0.05 s per kernel.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        for results in ex.map(_build_batch, batches(items, max(1, a.jobs))):
            for res in results:
                k = next(iter(res["ptxas"]["kernels"].values()), {})
                print(f"built {res['kernel']:<20} {artifacts.canonical_params(res['params']):<48} "
                      f"regs={k.get('registers')} spills={k.get('spill_store_bytes')} batch={res.get('batch_size', 1)}",
                      flush=True)
            built += results
    path = artifacts.write_bundle(a.out, built)
    print(f"{len(built)} artifacts ({len(names)} kernels) -> {path}: {_bundle_size(a.out) / 2**20:.1f} MiB, "
          f"{time.time() - t0:.0f} s with {a.jobs} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
