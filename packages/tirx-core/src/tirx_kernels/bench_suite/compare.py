# SPDX-License-Identifier: Apache-2.0
"""``ratio_diff BEFORE AFTER`` (the regression gate) and ``status`` (baseline rows missing or stale).

Both work per card (``cards.py``): a row is only compared with a row measured on the same card.
"""

from __future__ import annotations

import json

from . import cards

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


def _missing_cards(wanted, pinned: dict, side: str, baseline: bool) -> list[str]:
    where = f"pinned in the {side} baseline" if baseline else f"in the {side} run"
    return [f"no {c} rows {where} (it holds {cards.describe(pinned)})" for c in wanted if c not in pinned]


def ratio_diff(before: dict, after: dict, threshold: float = THRESHOLD, allow_source_change: bool = False,
               card: str | None = None) -> dict:
    """Per row: after/before of our µs; a row fails at ratio >= threshold or on differing provenance.

    ``before`` and ``after`` are runs or baselines; only the cards both hold are compared (``card``: only
    that one). With no card in common nothing is compared and the result is ``refused`` ("no H100 rows
    pinned in the baseline ..."): an H100 run is never judged against H200 rows. A differing kernel-source
    fingerprint fails its row unless ``allow_source_change`` (comparing the kernel before and after an edit
    is then the point); a differing environment fails every row of that card.
    """
    b_cards, a_cards = cards.by_card(before), cards.by_card(after)
    card = cards.named_card(card, [*b_cards, *a_cards])
    if card:
        compared = [card] if card in b_cards and card in a_cards else []
        missing = (_missing_cards([card], b_cards, "before", cards.is_baseline(before))
                   + _missing_cards([card], a_cards, "after", cards.is_baseline(after)))
    else:
        compared = sorted(set(b_cards) & set(a_cards))
        missing = (_missing_cards(sorted(a_cards), b_cards, "before", cards.is_baseline(before))
                   + _missing_cards(sorted(b_cards), a_cards, "after", cards.is_baseline(after)))
    rows, env_all = [], []
    for c in compared:
        b_rows, a_rows = _rows(b_cards[c]), _rows(a_cards[c])
        for key in sorted(set(b_rows) | set(a_rows)):
            b, a = b_rows.get(key), a_rows.get(key)
            # Each side's environment is the row's own (a baseline's rows may come from several promotions).
            env = [] if b is None or a is None else environment_differences(
                {"provenance": cards.row_provenance(b_cards[c], b)},
                {"provenance": cards.row_provenance(a_cards[c], a)})
            env_all += [f"{c} {d}" for d in env if f"{c} {d}" not in env_all]
            rows.append(_compare_row(c, key, b, a, env, threshold, allow_source_change))
    refused = None if compared else "nothing compared: " + "; ".join(missing)
    return {"cards": compared, "refused": refused, "not_compared": [] if refused else missing, "rows": rows,
            "environment_differences": env_all,
            "passed": refused is None and all(r["passed"] for r in rows) and bool(rows)}


def _compare_row(card: str, key, b: dict | None, a: dict | None, env: list[str], threshold: float,
                 allow_source_change: bool) -> dict:
    row = {"card": card, "kernel": key[0], "config": key[1], "before_us": b and b.get("us"),
           "after_us": a and a.get("us"), "ratio": None, "reasons": [], "notes": []}
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
    return row


def format_ratio_diff(res: dict) -> str:
    if res["refused"]:
        return f"ratio_diff: REFUSED: {res['refused']}"
    out = [f"{'card':<6} {'kernel':<16} {'config':<26} {'before us':>10} {'after us':>10} {'after/before':>12}"
           "  verdict"]

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    for r in res["rows"]:
        out.append(f"{r['card']:<6} {r['kernel']:<16} {r['config']:<26} {f(r['before_us']):>10} "
                   f"{f(r['after_us']):>10} {'-' if r['ratio'] is None else format(r['ratio'], '.3f'):>12}  "
                   f"{'ok' if r['passed'] else 'FAIL: ' + '; '.join(r['reasons'])}")
        if r["notes"]:
            out.append(f"{'':<51}({'; '.join(r['notes'])})")
    out += [f"not compared: {m}" for m in res["not_compared"]]
    out.append(f"ratio_diff ({', '.join(res['cards'])}): " + ("passed" if res["passed"] else "FAILED"))
    return "\n".join(out)


def status(root: str, baseline: dict | None, entries=None, card: str | None = None) -> list[dict]:
    """One item per (card, registered kernel): its roster rows whose row pinned on that card is missing,
    failed or stale.

    Cards: ``card``, else every card the baseline holds; with none pinned, one item per kernel with card
    None and every row missing.
    """
    from tirx_kernels import registry
    from tirx_kernels.core import artifacts

    from .roster import load_all

    entries = registry.scan() if entries is None else entries
    rosters = load_all(root)
    pinned = cards.by_card(baseline)
    card = cards.named_card(card, pinned)
    fps = {name: artifacts.fingerprint(e.path) for name, e in entries.items()}
    items = []
    for c in [card] if card else (sorted(pinned) or [None]):
        base_rows = _rows(pinned[c]) if c in pinned else {}
        for name, e in sorted(entries.items()):
            fp = fps[name]
            item = {"card": c, "kernel": name, "distribution": e.distribution, "fingerprint": fp, "missing": [],
                    "stale": [], "failed": [], "note": None}
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


def needing_by_cost(items: list[dict], baseline: dict | None) -> list[str]:
    """The kernels of ``items`` with work to do (rows missing, stale or failed; no roster is not work a GPU run
    does), cheapest first: by the longest ``elapsed_s`` any card recorded for the kernel's rows (a kernel never
    measured anywhere goes last), so a device call cut at its time limit has pinned as many kernels as it could."""
    cost: dict = {}
    for run in cards.by_card(baseline).values():
        for r in run.get("rows", []):
            cost[r["kernel"]] = max(cost.get(r["kernel"], 0.0), float(r.get("elapsed_s") or 0.0))
    names = dict.fromkeys(i["kernel"] for i in items if not i["up_to_date"] and not i["note"])
    return sorted(names, key=lambda k: (k not in cost, cost.get(k, 0.0), k))


def format_status(items: list[dict], baseline_path: str, baseline: dict | None) -> str:
    pinned = cards.by_card(baseline)
    out = [f"baseline: {baseline_path}" + (f" (cards: {cards.describe(pinned)})" if baseline else " (absent)")]
    for c in dict.fromkeys(it["card"] for it in items):
        if c is None:
            out.append("no card pinned")
        elif c in pinned:
            run = pinned[c]
            out.append(f"card {c}: {run['provenance']['gpu'].get('name')}, promoted "
                       f"{run.get('promoted', {}).get('at', '?')}")
        else:
            out.append(f"card {c}: no {c} rows pinned (the baseline holds {cards.describe(pinned)})")
        for it in (i for i in items if i["card"] == c):
            if it["up_to_date"]:
                out.append(f"  ok     {it['kernel']}")
                continue
            parts = [it["note"]] if it["note"] else []
            parts += [f"missing: {', '.join(it['missing'])}"] if it["missing"] else []
            parts += [f"stale (source is now {it['fingerprint']}): {', '.join(it['stale'])}"] if it["stale"] else []
            parts += [f"failed in the baseline: {', '.join(it['failed'])}"] if it["failed"] else []
            out.append(f"  NEEDS  {it['kernel']}: " + "; ".join(parts))
    return "\n".join(out)
