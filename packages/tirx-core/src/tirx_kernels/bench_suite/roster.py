# SPDX-License-Identifier: Apache-2.0
"""Rosters: ``config/<package>/<kernel>.yaml`` at the repo root, the rows a bench-suite run measures.

    kernel: rmsnorm                 # must match the file name
    package: tirx-native            # must match the folder and the kernel's distribution
    references: [torch, flashinfer] # optional: the references --with-references times (default: all of
                                    # the kernel's get_baselines); a row may override it
    rows:                           # at most three, roles small / medium / large, each role once
      - role: medium
        config: bf16_8192x4096      # a label of the kernel's BENCH_CONFIGS or CONFIGS
        rationale: one line saying why this row stands for the workload
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ROLES = ("small", "medium", "large")
MAX_ROWS = 3
ROSTER_DIR = "config"


class RosterError(ValueError):
    """A roster file is malformed or names something that does not exist."""


@dataclass
class RosterRow:
    kernel: str
    package: str
    role: str
    config: str
    rationale: str
    references: list | None = None  # None: every reference the kernel's get_baselines offers

    @property
    def key(self) -> tuple[str, str]:
        return (self.kernel, self.config)


@dataclass
class Roster:
    kernel: str
    package: str
    path: str
    rows: list[RosterRow] = field(default_factory=list)
    references: list | None = None


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _scalar(text: str):
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(x) for x in text[1:-1].split(",") if x.strip()]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def mini_yaml(text: str, path: str = "<roster>") -> dict:
    """The roster subset of YAML (top-level keys, flow lists, one list of flat mappings), for hosts without pyyaml."""
    doc: dict = {}
    items = item = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        stripped = line.strip()
        if not line[0].isspace():
            key, colon, value = stripped.partition(":")
            if not colon:
                raise RosterError(f"{path}:{n}: expected 'key: value'")
            items, item = ([], None) if not value.strip() else (None, None)
            doc[key.strip()] = items if items is not None else _scalar(value)
            continue
        if items is None:
            raise RosterError(f"{path}:{n}: indented line outside a list")
        if stripped.startswith("- "):
            item = {}
            items.append(item)
            stripped = stripped[2:]
        key, colon, value = stripped.partition(":")
        if item is None or not colon:
            raise RosterError(f"{path}:{n}: expected '- key: value' or 'key: value' inside a list item")
        item[key.strip()] = _scalar(value)
    return doc


def _load_yaml(text: str, path: str):
    try:
        import yaml
    except ImportError:  # a runtime-only GPU host without pyyaml: the roster subset parser
        return mini_yaml(text, path)
    return yaml.safe_load(text)


def _str_list(path: str, where: str, value) -> list | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RosterError(f"{path}: {where} must be a list of reference names")
    if len(set(value)) != len(value):
        raise RosterError(f"{path}: {where} names a reference twice")
    return list(value)


def parse(path: str, text: str | None = None) -> Roster:
    """Read and check one roster file (shape only; ``validate`` checks it against the registry)."""
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    doc = _load_yaml(text, path)
    if not isinstance(doc, dict):
        raise RosterError(f"{path}: a roster is a mapping with kernel, package and rows")
    unknown = set(doc) - {"kernel", "package", "references", "rows"}
    if unknown:
        raise RosterError(f"{path}: unknown key(s) {sorted(unknown)}")
    kernel, package = doc.get("kernel"), doc.get("package")
    if not isinstance(kernel, str) or not isinstance(package, str):
        raise RosterError(f"{path}: 'kernel' and 'package' must be strings")
    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if stem != kernel:
        raise RosterError(f"{path}: 'kernel' is {kernel!r} but the file is named {stem}.yaml")
    if folder != package:
        raise RosterError(f"{path}: 'package' is {package!r} but the file lives in config/{folder}/")
    refs = _str_list(path, "'references'", doc.get("references"))
    rows_doc = doc.get("rows")
    if not isinstance(rows_doc, list) or not rows_doc:
        raise RosterError(f"{path}: 'rows' must be a non-empty list")
    if len(rows_doc) > MAX_ROWS:
        raise RosterError(f"{path}: {len(rows_doc)} rows; a roster has at most {MAX_ROWS} (small, medium, large)")
    rows, roles, labels = [], set(), set()
    for i, r in enumerate(rows_doc):
        where = f"{path}: rows[{i}]"
        if not isinstance(r, dict):
            raise RosterError(f"{where} must be a mapping with role, config, rationale")
        unknown = set(r) - {"role", "config", "rationale", "references"}
        if unknown:
            raise RosterError(f"{where}: unknown key(s) {sorted(unknown)}")
        role, label, why = r.get("role"), r.get("config"), r.get("rationale")
        if role not in ROLES:
            raise RosterError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        if role in roles:
            raise RosterError(f"{where}: role {role!r} appears twice")
        if not isinstance(label, str) or not label:
            raise RosterError(f"{where}: 'config' must be a config label of {kernel}")
        if label in labels:
            raise RosterError(f"{where}: config {label!r} appears twice")
        if not isinstance(why, str) or not why.strip() or "\n" in why.strip():
            raise RosterError(f"{where}: 'rationale' must be one non-empty line")
        roles.add(role)
        labels.add(label)
        rows.append(RosterRow(kernel=kernel, package=package, role=role, config=label, rationale=why.strip(),
                              references=_str_list(path, f"rows[{i}].references", r.get("references"))
                              if "references" in r else refs))
    rows.sort(key=lambda x: ROLES.index(x.role))
    return Roster(kernel=kernel, package=package, path=path, rows=rows, references=refs)


def roster_files(root: str) -> list[str]:
    base = os.path.join(root, ROSTER_DIR)
    if not os.path.isdir(base):
        return []
    out = []
    for pkg in sorted(os.listdir(base)):
        d = os.path.join(base, pkg)
        if os.path.isdir(d):
            out += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith((".yaml", ".yml"))]
    return out


def load_all(root: str) -> dict[str, Roster]:
    """Every roster under ``<root>/config``, by kernel name."""
    rosters: dict[str, Roster] = {}
    for path in roster_files(root):
        r = parse(path)
        if r.kernel in rosters:
            raise RosterError(f"{path}: a second roster for {r.kernel} (also {rosters[r.kernel].path})")
        rosters[r.kernel] = r
    return rosters


def bench_labels(entry) -> list[str]:
    """Labels a roster row may name: BENCH_CONFIGS first, then CONFIGS (as ``harness.find_config``)."""
    labels = [c["label"] for c in (entry.bench_configs or [])]
    return labels + [c["label"] for c in entry.configs if c["label"] not in labels]


def validate(roster: Roster, entry) -> None:
    """Check a roster against the registered kernel (``registry.KernelEntry``): package and labels exist."""
    if entry.distribution not in ("?", roster.package):
        raise RosterError(f"{roster.path}: package {roster.package!r} but {roster.kernel} is registered by "
                          f"{entry.distribution}")
    labels = bench_labels(entry)
    for row in roster.rows:
        if row.config not in labels:
            raise RosterError(f"{roster.path}: {roster.kernel} has no config {row.config!r}; "
                              f"configs: {', '.join(labels)}")


def select(rosters: dict[str, Roster], kernels=None, roles=None, configs=None) -> list[RosterRow]:
    """Roster rows in run order, filtered: the kernels in the order asked for (a time-boxed GPU call puts the
    fast ones first: sorted by name, 2026-12-07's call spent its 10 min on allgather_gemm and two cuDNN
    backward rows before any top-k kernel), else by name; within a kernel small -> large."""
    if kernels:
        unknown = sorted(set(kernels) - set(rosters))
        if unknown:
            raise RosterError(f"no roster for {', '.join(unknown)} (rosters: {', '.join(sorted(rosters)) or 'none'})")
    rows = []
    for name in dict.fromkeys(kernels) if kernels else sorted(rosters):
        for row in rosters[name].rows:
            if roles and row.role not in roles:
                continue
            if configs and row.config not in configs:
                continue
            rows.append(row)
    return rows
