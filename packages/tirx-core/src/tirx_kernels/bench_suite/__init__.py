# SPDX-License-Identifier: Apache-2.0
"""The bench suite: roster sweeps with provenance, a pinned baseline, a regression gate.

    python -m tirx_kernels.bench_suite [run] [--kernel K] [--with-references] [--out FILE] [--rounds N]
                                       [--server URL]
    python -m tirx_kernels.bench_suite promote RUN.json
    python -m tirx_kernels.bench_suite ratio_diff BEFORE.json AFTER.json [--card H100]
    python -m tirx_kernels.bench_suite status [--card H100]
    python -m tirx_kernels.bench_suite stamp              # source stamp for a GPU host without .git

Modules: ``roster`` (config/<package>/<kernel>.yaml), ``run`` (measuring rows, the run JSON),
``provenance``, ``remote`` (kcoral), ``cards`` (card keys, the per-card baseline), ``promote``,
``compare`` (ratio_diff, status), ``report``. The baseline holds rows per GPU card, and a run is only
compared with its own card's rows.
See README.md beside this file.
"""
