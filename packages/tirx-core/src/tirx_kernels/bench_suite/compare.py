# SPDX-License-Identifier: Apache-2.0
"""``ratio_diff BEFORE AFTER`` (the regression gate) and ``status`` (baseline rows missing or stale)."""

from __future__ import annotations

import json

THRESHOLD = 1.01


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _rows(run: dict) -> dict:
    return {(r["kernel"], r["config"]): r for r in run.get("rows", [])}


def _flat_versions(prov: dict) -> dict:
    v = prov.get("versions", {})
    out = {"python": v.get("python"), "nvcc": v.get("nvcc")}
    for group in ("runtime", "references", "tirx"):
        for name, d in (v.get(group) or {}).items():
            out[f"{group}:{name}"] = None if not d else d["version"] + (f"@{d['commit']}" if d.get("commit") else "")
    g = prov.get("gpu", {})
    for k in ("uuid", "driver", "cuda_driver", "cuda_runtime"):
        out[f"gpu:{k}"] = g.get(k)
    art = prov.get("artifacts", {})
    for k in ("tvm", "nvcc"):
        out[f"artifacts:{k}"] = art.get(k)
    return out


def environment_differences(before: dict, after: dict) -> list[str]:
    """Provenance fields that differ between two runs (GPU UUID, driver, CUDA, every version)."""
    b, a = _flat_versions(before.get("provenance", {})), _flat_versions(after.get("provenance", {}))
    return [f"{k}: {b.get(k)} -> {a.get(k)}" for k in sorted(set(b) | set(a)) if b.get(k) != a.get(k)]


def ratio_diff(before: dict, after: dict, threshold: float = THRESHOLD, allow_source_change: bool = False) -> dict:
    """Per row: after/before of our µs; a row fails at ratio >= threshold or on differing provenance.

    A differing kernel-source fingerprint fails its row unless ``allow_source_change`` (comparing the
    kernel before and after an edit is then the point); a differing environment fails every row.
    """
    env = environment_differences(before, after)
    b_rows, a_rows = _rows(before), _rows(after)
    rows = []
    for key in sorted(set(b_rows) | set(a_rows)):
        b, a = b_rows.get(key), a_rows.get(key)
        row = {"kernel": key[0], "config": key[1], "before_us": b and b.get("us"), "after_us": a and a.get("us"),
               "ratio": None, "reasons": [], "notes": []}
        if b is None or a is None:
            row["reasons"].append(f"row only in the {'after' if b is None else 'before'} run")
        elif b.get("status") != "ok" or a.get("status") != "ok":
            row["reasons"].append(f"status before {b.get('status')}, after {a.get('status')}")
        else:
            row["ratio"] = a["us"] / b["us"]
            if row["ratio"] >= threshold:
                row["reasons"].append(f"after/before {row['ratio']:.3f} >= {threshold}")
            if b.get("fingerprint") != a.get("fingerprint"):
                msg = f"kernel source {b.get('fingerprint')} -> {a.get('fingerprint')}"
                (row["notes"] if allow_source_change else row["reasons"]).append(msg)
            for ref in sorted(set(b.get("references", {})) & set(a.get("references", {}))):
                row["notes"].append(f"{ref} after/before {a['references'][ref]['us'] / b['references'][ref]['us']:.3f}")
        if env:
            row["reasons"].append("provenance differs: " + "; ".join(env))
        row["passed"] = not row["reasons"]
        rows.append(row)
    return {"rows": rows, "environment_differences": env, "passed": all(r["passed"] for r in rows) and bool(rows)}


def format_ratio_diff(res: dict) -> str:
    out = [f"{'kernel':<16} {'config':<26} {'before us':>10} {'after us':>10} {'after/before':>12}  verdict"]
    def f(x):
        return "-" if x is None else f"{x:.2f}"

    for r in res["rows"]:
        out.append(f"{r['kernel']:<16} {r['config']:<26} {f(r['before_us']):>10} {f(r['after_us']):>10} "
                   f"{'-' if r['ratio'] is None else format(r['ratio'], '.3f'):>12}  "
                   f"{'ok' if r['passed'] else 'FAIL: ' + '; '.join(r['reasons'])}")
        if r["notes"]:
            out.append(f"{'':<44}({'; '.join(r['notes'])})")
    out.append("ratio_diff: " + ("passed" if res["passed"] else "FAILED"))
    return "\n".join(out)


def status(root: str, baseline: dict | None, entries=None) -> list[dict]:
    """One item per registered kernel: its roster rows whose baseline row is missing, failed or stale."""
    from tirx_kernels import registry
    from tirx_kernels.core import artifacts

    from .roster import load_all

    entries = registry.scan() if entries is None else entries
    rosters = load_all(root)
    base_rows = _rows(baseline) if baseline else {}
    items = []
    for name, e in sorted(entries.items()):
        fp = artifacts.fingerprint(e.path)
        item = {"kernel": name, "distribution": e.distribution, "fingerprint": fp, "missing": [], "stale": [],
                "failed": [], "note": None}
        if name not in rosters:
            item["note"] = f"no roster (config/{e.distribution}/{name}.yaml)"
        else:
            for row in rosters[name].rows:
                b = base_rows.get(row.key)
                if b is None:
                    item["missing"].append(row.config)
                elif b.get("status") != "ok":
                    item["failed"].append(row.config)
                elif b.get("fingerprint") != fp:
                    item["stale"].append(row.config)
        item["up_to_date"] = not (item["missing"] or item["stale"] or item["failed"] or item["note"])
        items.append(item)
    return items


def format_status(items: list[dict], baseline_path: str, have_baseline: bool) -> str:
    out = [f"baseline: {baseline_path}" + ("" if have_baseline else " (absent)")]
    for it in items:
        if it["up_to_date"]:
            out.append(f"  ok     {it['kernel']}")
            continue
        parts = [it["note"]] if it["note"] else []
        parts += [f"missing: {', '.join(it['missing'])}"] if it["missing"] else []
        parts += [f"stale (source is now {it['fingerprint']}): {', '.join(it['stale'])}"] if it["stale"] else []
        parts += [f"failed in the baseline: {', '.join(it['failed'])}"] if it["failed"] else []
        out.append(f"  NEEDS  {it['kernel']}: " + "; ".join(parts))
    return "\n".join(out)
