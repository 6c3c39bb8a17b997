# SPDX-License-Identifier: Apache-2.0
"""Human-readable views of a run: the end-of-run summary table, ``baseline.md`` and its chart (per card)."""

from __future__ import annotations

import os

from . import cards


def _f(x, fmt: str = "{:.1f}") -> str:
    return "-" if not isinstance(x, (int, float)) else fmt.format(x)


def fastest_reference(row: dict) -> tuple[str | None, dict | None]:
    refs = row.get("references") or {}
    if not refs:
        return None, None
    name = min(refs, key=lambda n: refs[n]["us"])
    return name, refs[name]


def rate(row: dict) -> str:
    if row.get("bound") == "memory" and isinstance(row.get("tb_s"), (int, float)):
        return f"{row['tb_s']:.2f} TB/s"
    if row.get("bound") == "compute" and isinstance(row.get("tflop_s"), (int, float)):
        return f"{row['tflop_s']:.0f} TFLOP/s"
    return "-"


def _reason(row: dict) -> str:
    return "; ".join(e["reason"] for e in row.get("errors", []))


def summary_table(run: dict) -> str:
    """Plain-text table printed at the end of a run."""
    head = ("kernel", "role", "config", "status", "ours us", "rate", "% roof", "fastest ref", "ref us", "ref/ours")
    lines = []
    for r in run["rows"]:
        name, best = fastest_reference(r)
        lines.append((r["kernel"], r.get("role", ""), r["config"], r["status"] + (f" (retries {r['retries']})"
                      if r.get("retries") else ""), _f(r.get("us")), rate(r), _f(r.get("pct_of_roofline"), "{:.0f}"),
                      name or "-", _f(best and best["us"]), _f(best and best["ref_over_ours"], "{:.2f}")))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)] if lines else [len(h) for h in head]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*ln) for ln in lines]
    s = run["summary"]
    out.append(f"\n{s['rows']} rows: {s['ok']} ok, {s['failed']} failed, {s['skipped']} skipped, "
               f"{s['retries']} retries; complete roster: {'yes' if run.get('complete') else 'no'}")
    for r in run["rows"]:
        if r["status"] != "ok":
            out.append(f"  {r['status']}: {r['kernel']} {r['config']}: {_reason(r)}")
    for r in run["rows"]:
        for ref, why in (r.get("skipped_references") or {}).items():
            out.append(f"  reference skipped: {r['kernel']} {r['config']} {ref}: {why[:200]}")
    out.append(f"card: {cards.run_card(run)} ({run['provenance'].get('gpu', {}).get('name')})")
    ceil = run["provenance"].get("ceilings")
    if ceil:
        out.append(f"ceilings: copy {ceil['copy_tb_s']:.2f} TB/s, "
                   f"cuBLAS bf16 8192^3 {ceil['bf16_tflop_s']:.0f} TFLOP/s")
    return "\n".join(out)


def _ver(v) -> str:
    if not v:
        return "not installed"
    return v["version"] + (f" @ {v['commit'][:12]}" if v.get("commit") else "")


def _card_section(card: str, run: dict) -> list[str]:
    """One card's heading, provenance (with the ceilings measured in its run) and its table of rows."""
    p = run["provenance"]
    g, v, git = p["gpu"], p["versions"], p["git"]
    rt, art = v.get("runtime", {}), p.get("artifacts", {})
    refs = ", ".join(f"{n} {_ver(x)}" for n, x in sorted(v.get("references", {}).items()) if x)
    server = f", server {run['server']}" if run.get("server") else ""
    lines = [
        f"## {card}: {g.get('name')}", "",
        f"Promoted {run.get('promoted', {}).get('at', '?')} from a run of {run['created']} "
        f"({run['mode']} mode{server}).", "",
        "| | |", "|---|---|",
        f"| commit | `{git.get('commit')}` (clean: {'yes' if git.get('dirty') is False else 'no'}, "
        f"from {git.get('source')}) |",
        f"| GPU | {g.get('name')} `{g.get('uuid')}`, {g.get('sm_count')} SMs, "
        f"max SM clock {g.get('clocks_max_sm_mhz')} MHz |",
        f"| driver / CUDA | {g.get('driver')} / driver CUDA {g.get('cuda_driver')}, "
        f"torch CUDA {g.get('cuda_runtime')} |",
        f"| torch / TVM / tvm-ffi | {_ver(rt.get('torch'))} / {_ver(rt.get('apache-tvm'))} / "
        f"{_ver(rt.get('apache-tvm-ffi'))} |",
        f"| kernel artifacts | built with TVM {art.get('tvm')}, nvcc {art.get('nvcc')} |",
        f"| references | {refs or 'none installed'} |",
        f"| timer | {p['timer']['description']}; {p['timer']['rounds']} rounds; under "
        f"{p['timer']['graph_threshold_us']:.0f} us the whole row from a CUDA graph |",
    ]
    ceil = p.get("ceilings")
    measured = f"copy {ceil['copy_tb_s']:.2f} TB/s, cuBLAS bf16 8192³ {ceil['bf16_tflop_s']:.0f} TFLOP/s" if ceil \
        else "not measured"
    lines.append(f"| ceilings ({card} run) | {measured} |")
    promotions = run.get("promotions") or []
    if len(promotions) > 1:  # partial promotes: each row's environment is its promotion's
        lines += ["", f"The {card} rows come from {len(promotions)} promotions (the table above is the latest's):", "",
                  "| promoted | from | commit | GPU | ceilings | kernels |", "|---|---|---|---|---|---|"]
        for pr in promotions:
            pp = pr.get("provenance") or {}
            c = pp.get("ceilings")
            lines.append(f"| {pr.get('at', '?')} | {pr.get('from', '?')} | `{(pp.get('git') or {}).get('commit')}` | "
                         f"`{(pp.get('gpu') or {}).get('uuid')}` | "
                         + (f"copy {c['copy_tb_s']:.2f} TB/s, bf16 {c['bf16_tflop_s']:.0f} TFLOP/s" if c else "-")
                         + f" | {', '.join(pr.get('kernels', []))} |")
    lines += ["", f"| kernel | role | config | ours µs ({card}) | rate | % of roofline | fastest reference | µs "
              "| ref/ours | other references (µs, ref/ours) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(run["rows"], key=lambda r: r["kernel"]):  # stable: roster order within a kernel
        name, best = fastest_reference(r)
        others = ", ".join([f"{n} {x['us']:.1f} ({x['ref_over_ours']:.2f}x)"
                            for n, x in sorted(r.get("references", {}).items(), key=lambda kv: kv[1]["us"])
                            if n != name] + [f"{n}: not installed" for n in sorted(r.get("skipped_references") or {})])
        timer = "" if r.get("timer", "").startswith("events") else f" ({r.get('timer')})"
        lines.append(f"| {r['kernel']} | {r.get('role', '')} | `{r['config']}` | {_f(r.get('us'))}{timer} | "
                     f"{rate(r)} | {_f(r.get('pct_of_roofline'), '{:.0f}')} % | {name or '-'} | "
                     f"{_f(best and best['us'])} | {_f(best and best['ref_over_ours'], '{:.2f}')} | {others or '-'} |")
    return lines + [""]


def render_markdown(base: dict, chart_name: str | None, chart_note: str | None = None) -> str:
    """``baseline.md``: per card its provenance, ceilings and one table of rows; then the roster rows' rationales."""
    pinned = cards.by_card(base)
    summary = ", ".join(f"{c} (promoted {run.get('promoted', {}).get('at', '?')})" for c, run in pinned.items())
    lines = [
        "<!-- generated by python -m tirx_kernels.bench_suite promote from baseline.json; do not edit -->",
        "# Pinned bench-suite baseline", "",
        f"Rows are pinned per GPU card: {summary or 'none yet'}. A run is compared (`ratio_diff`, `status`) only "
        "with the rows of its own card, and `promote` replaces only its card's rows.", "",
        "ref/ours > 1: ours is faster. % of roofline: the byte (or FLOP) model's time at the ceiling measured in "
        "that card's run over our time.", "",
    ]
    for card, run in pinned.items():
        lines += _card_section(card, run)
    rationale: dict[str, dict[str, tuple]] = {}
    for run in pinned.values():
        for r in run["rows"]:
            rationale.setdefault(r["kernel"], {}).setdefault(r["config"], (r.get("package", ""), r.get("role", ""),
                                                                          r.get("rationale", "")))
    lines += ["## Roster rows", ""]
    for kernel, rows in sorted(rationale.items()):
        lines.append(f"- **{kernel}** ({next(iter(rows.values()))[0]})")
        lines += [f"  - `{config}` ({role}): {why}" for config, (_, role, why) in rows.items()]
    lines.append("")
    if chart_name:
        lines += [f"![ref/ours and % of roofline per row and card]({chart_name})", ""]
    elif chart_note:
        lines += [f"_Chart skipped: {chart_note}._", ""]
    return "\n".join(lines)


MAX_CHART_ROWS = 60


def _per_kernel(rows: list[dict]) -> list[dict]:
    """One pseudo-row per kernel: geometric means of its rows' fastest-reference ratio and % of roofline."""
    import math

    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["kernel"], []).append(r)

    def gmean(xs):
        xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 0.0

    out = []
    for k, rs in by.items():
        ratio = gmean([(fastest_reference(r)[1] or {}).get("ref_over_ours") for r in rs])
        out.append({"kernel": k, "config": f"{len(rs)} rows (geomean)", "pct_of_roofline":
                    gmean([r.get("pct_of_roofline") for r in rs]),
                    "references": {"fastest": {"us": 1.0, "ref_over_ours": ratio}} if ratio else {}})
    return out


def render_chart(base: dict, path: str) -> str | None:
    """ref/ours (fastest reference) and % of roofline per row, one bar per card; returns why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install tirx-core[bench])"
    pinned = cards.by_card(base)
    if len({(r["kernel"], r["config"]) for run in pinned.values() for r in run["rows"]}) > MAX_CHART_ROWS:
        # one bar per kernel (the geometric mean of its rows) past ~60 rows
        pinned = {card: {**run, "rows": _per_kernel(run["rows"])} for card, run in pinned.items()}
    keys = list(dict.fromkeys((r["kernel"], r["config"]) for run in pinned.values()
                              for r in sorted(run["rows"], key=lambda r: r["kernel"])))
    width = 0.8 / max(1, len(pinned))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * len(keys) + 2), 7), sharex=True)
    for i, (card, run) in enumerate(pinned.items()):
        rows = {(r["kernel"], r["config"]): r for r in run["rows"]}
        xs = [k + (i - (len(pinned) - 1) / 2) * width for k in range(len(keys))]
        ratio = [(fastest_reference(rows[k])[1] or {}).get("ref_over_ours", 0.0) if k in rows else 0.0 for k in keys]
        roof = [(rows[k].get("pct_of_roofline") or 0.0) if k in rows else 0.0 for k in keys]
        for bar, q in zip(ax1.bar(xs, ratio, width, color=f"C{i}", label=card), ratio):
            if 0 < q < 1.0:  # ours is slower than the fastest reference on this card
                bar.set_hatch("//")
        ax2.bar(xs, roof, width, color=f"C{i}", label=card)
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("fastest reference / ours")
    ax1.set_title("ref/ours per card (> 1: ours is faster; hatched: slower)")
    ax1.legend()
    ax2.axhline(100.0, color="black", linewidth=0.8)
    ax2.set_ylabel("% of roofline (card's own ceilings)")
    ax2.set_xticks(range(len(keys)))
    ax2.set_xticklabels([f"{k}\n{c}" for k, c in keys], rotation=45, ha="right", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
