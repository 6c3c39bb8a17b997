# SPDX-License-Identifier: Apache-2.0
"""GPU card keys and the per-card baseline: a run is only ever compared with rows pinned on its own card.

The device is an H100 on most GPU calls and an H200 on some: the same 132 SMs, but memory-bound rows run
about 1.4x faster on the H200 (4.8 vs 3.35 TB/s), so a row pinned on one card is no bar for the other.
``baseline.json`` (format ``tirx-bench-suite-baseline/2``) holds one promoted run per card::

    {"format": "tirx-bench-suite-baseline/2",
     "cards": {"H200": {<the run JSON>, "card": "H200", "promoted": {...}, "rows": [{..., "card": "H200"}]}}}

A plain run, or a baseline of format 1 (one promoted run, before cards), reads as one card: the one its
provenance names.
"""

from __future__ import annotations

BASELINE_FORMAT = "tirx-bench-suite-baseline/2"
UNKNOWN = "unknown"
# Exact device names (torch / nvidia-smi) of the SXM cards the device tool lends. Any other name (H100
# PCIe or NVL: other bandwidth and SM counts) is its own key, the full name, never lumped with these.
CARD_KEYS = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200"}


def card_key(gpu_name: str | None) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``, ``"NVIDIA H200"`` -> ``"H200"``; other names unchanged."""
    if not gpu_name or not gpu_name.strip():
        return UNKNOWN
    return CARD_KEYS.get(gpu_name.strip(), gpu_name.strip())


def named_card(text: str | None, known=()) -> str | None:
    """A card a user named on the command line (``--card h100``): the known key it matches ignoring case
    (``known``: the cards a baseline or run holds, then ``CARD_KEYS``' values), else ``card_key`` of the text
    (a full device name). ``None`` stays ``None`` (every card)."""
    if text is None:
        return None
    for key in [*known, *CARD_KEYS.values()]:
        if key.lower() == text.strip().lower():
            return key
    return card_key(text)


def run_card(run: dict) -> str:
    """The card a run was measured on, from its provenance."""
    return card_key(((run.get("provenance") or {}).get("gpu") or {}).get("name"))


def is_baseline(obj: dict) -> bool:
    return obj.get("format") == BASELINE_FORMAT


def _section(run: dict, card: str) -> dict:
    return {**run, "card": card, "rows": [{**r, "card": card} for r in run.get("rows", [])]}


def by_card(obj: dict | None) -> dict[str, dict]:
    """``{card: run}`` of a baseline; a plain run or a format-1 baseline is one card, its provenance's."""
    if not obj:
        return {}
    if is_baseline(obj):
        return dict(obj.get("cards", {}))
    card = run_card(obj)
    return {card: _section(obj, card)}


def _promotion(run: dict, promoted: dict, kernels) -> dict:
    """What one promote pinned: when, from which run, the run's whole provenance and the kernels it covered."""
    return {**promoted, "created": run.get("created"), "mode": run.get("mode"), "server": run.get("server"),
            "provenance": run.get("provenance"), "kernels": sorted(kernels)}


def pin(baseline: dict | None, run: dict, promoted: dict, kernels=None) -> dict:
    """The baseline with ``run`` as its card's rows; every other card's rows kept.

    ``kernels=None`` (a run of the whole roster): the card's earlier rows are all replaced. ``kernels`` (a partial
    promote): only those kernels' rows are replaced, the card's other rows and the promotions they came from stay.
    Each row names the promotion it came from (``promotion``, an index into the card's ``promotions``), whose
    provenance is the row's environment; the card's top-level fields are the latest promotion's run.
    """
    card = run_card(run)
    pinned = by_card(baseline)
    new_rows = [{**r, "card": card} for r in run.get("rows", [])]
    if kernels is None or card not in pinned:
        promotions = [_promotion(run, promoted, {r["kernel"] for r in new_rows})]
        kept = []
    else:
        earlier = pinned[card]
        promotions = list(earlier.get("promotions") or [_promotion(earlier, earlier.get("promoted", {}),
                                                                   {r["kernel"] for r in earlier.get("rows", [])})])
        kept = [{**r, "promotion": r.get("promotion", 0)} for r in earlier.get("rows", [])
                if r["kernel"] not in kernels]
        promotions.append(_promotion(run, promoted, kernels))
        used = sorted({r["promotion"] for r in kept} | {len(promotions) - 1})  # drop promotions no row uses
        renumber = {old: new for new, old in enumerate(used)}
        promotions = [promotions[i] for i in used]
        kept = [{**r, "promotion": renumber[r["promotion"]]} for r in kept]
    latest = len(promotions) - 1
    rows = kept + [{**r, "promotion": latest} for r in new_rows]
    pinned[card] = {**_section(run, card), "rows": rows, "promoted": promoted, "promotions": promotions}
    return {"format": BASELINE_FORMAT, "cards": dict(sorted(pinned.items()))}


def row_provenance(section: dict, row: dict) -> dict:
    """The provenance a pinned row was measured under: its promotion's, else (a run, or an older baseline) the
    section's own."""
    promotions = section.get("promotions") or []
    i = row.get("promotion")
    if isinstance(i, int) and 0 <= i < len(promotions):
        return promotions[i].get("provenance") or {}
    return section.get("provenance") or {}


def describe(pinned: dict[str, dict]) -> str:
    """``"H100, H200"`` or ``"no card"``: what a baseline (or run) holds, for messages."""
    return ", ".join(sorted(pinned)) or "no card"
