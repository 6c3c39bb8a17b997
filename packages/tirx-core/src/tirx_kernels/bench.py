# SPDX-License-Identifier: Apache-2.0
"""Benchmark installed kernels on the current GPU (cold L2, median, interleaved rounds).

    python -m tirx_kernels.bench --kernel rmsnorm [--config L ...] [--with-references] [--json]

Prints µs, TFLOP/s or TB/s, % of the measured ceiling (copy bandwidth or cuBLAS bf16), and each
reference's µs with ref/ours (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import sys

from tirx_kernels import registry
from tirx_kernels.core.arch import UnsupportedArchError
from tirx_kernels.core.harness import bench_configs, find_config


def format_row(r: dict) -> str:
    rate = f"{r['tb_s']:.2f} TB/s" if r["bound"] == "memory" else f"{r['tflop_s']:.0f} TFLOP/s"
    refs = "  ".join(f"{n} {v['us']:.1f}us ({v['ref_over_ours']:.2f}x)" for n, v in r["references"].items())
    miss = "  ".join(f"{n}: missing" for n in r.get("missing_references", {}))
    return f"{r['label']:<26} {r['us']:>9.1f}us {rate:>14} {r['pct_of_ceiling']:>5.0f}%  {refs}  {miss}".rstrip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", required=True, help="kernel name (repeatable)")
    ap.add_argument("--config", action="append",
                    help="only this config label (repeatable; with several kernels, each kernel's labels that exist)")
    ap.add_argument("--with-references", action="store_true", help="also time every available reference")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        rows = _bench(a)
    except (KeyError, UnsupportedArchError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rows, indent=2, default=str))
    return 0


def _bench(a) -> list[dict]:
    rows = []
    for name in a.kernel:
        mod = registry.load(name)
        if a.config:
            labels = [c["label"] for c in bench_configs(mod)] + [c["label"] for c in mod.CONFIGS]
            wanted = [lb for lb in a.config if lb in labels] if len(a.kernel) > 1 else a.config
            configs = [find_config(mod, lb, bench=True) for lb in wanted]
        else:
            configs = bench_configs(mod)
        if not a.json:
            print(f"== {name}: label, ours, rate, % of ceiling, references (ref/ours)", flush=True)
        for c in configs:
            r = mod.run_bench(with_references=a.with_references, **c)
            r["label"] = c["label"]
            rows.append(r)
            if not a.json:
                print(format_row(r), flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
