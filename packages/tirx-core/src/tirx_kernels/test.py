# SPDX-License-Identifier: Apache-2.0
"""Correctness of installed kernels on the current GPU.

    python -m tirx_kernels.test --kernel rmsnorm [--config L] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from tirx_kernels import registry
from tirx_kernels.core.arch import UnsupportedArchError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tirx_kernels.test", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", required=True, help="kernel name (repeatable)")
    ap.add_argument("--config", help="only this config label")
    ap.add_argument("--json", action="store_true", help="print one JSON list of results")
    a = ap.parse_args(argv)
    results = []
    for name in a.kernel:
        try:
            mod = registry.load(name)
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        rows = [c for c in mod.CONFIGS if a.config is None or c["label"] == a.config]
        if not rows:
            print(f"error: kernel '{name}' has no config '{a.config}'", file=sys.stderr)
            return 2
        for c in rows:
            row = {"kernel": name, "label": c["label"]}
            try:
                res = mod.run_test(**c)
                row.update(status="passed", oracle=res["oracle"],
                           references={k: v["status"] if v["status"] != "skipped" else "skipped: " + v["reason"]
                                       for k, v in res["references"].items()})
            except UnsupportedArchError as e:
                row.update(status="skipped", reason=str(e))
            except Exception as e:  # report every config, then fail
                row.update(status="failed", reason=f"{type(e).__name__}: {e}", trace=traceback.format_exc(limit=3))
            results.append(row)
            if not a.json:
                extra = row.get("reason", "") or ", ".join(f"{k}={v}" for k, v in row.get("references", {}).items())
                print(f"{row['status']:<8} {name:<20} {c['label']:<28} {extra}", flush=True)
    if a.json:
        print(json.dumps(results, indent=2, default=str))
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
