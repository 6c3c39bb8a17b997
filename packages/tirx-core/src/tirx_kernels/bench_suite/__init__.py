# SPDX-License-Identifier: Apache-2.0
"""The bench suite: roster sweeps with provenance, a pinned baseline, a regression gate.

    python -m tirx_kernels.bench_suite [run] [--kernel K] [--with-references] [--out FILE] [--rounds N]
                                       [--server URL]
    python -m tirx_kernels.bench_suite promote RUN.json
    python -m tirx_kernels.bench_suite ratio_diff BEFORE.json AFTER.json
    python -m tirx_kernels.bench_suite status
    python -m tirx_kernels.bench_suite stamp              # source stamp for a GPU host without .git

Modules: ``roster`` (config/<package>/<kernel>.yaml), ``run`` (measuring rows, the run JSON),
``provenance``, ``remote`` (kcoral), ``promote``, ``compare`` (ratio_diff, status), ``report``.
See README.md beside this file.
"""
