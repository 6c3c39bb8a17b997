#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CPU test job (what CI runs): lints, core unit tests, protocol conformance, every kernel config
# built to an sm_90a .so with SASS assertions, input validation. GPU tests skip here with their reason.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
ruff check .
python3 tools/check_spdx.py
python3 tools/readme_kernels.py --check
python3 tools/release.py check  # every package's version has a CHANGELOG entry, bumped if it changed since its tag
python3 -m tirx_kernels.registry --strict >/dev/null
# The main job first: every artifact of every installed kernel, batched per kernel on every core (2026-12-05, this
# 2-core machine: 311 artifacts, 8.3 MiB, 172 s cold). The build tests below then find their artifacts in the cache.
python3 -m tirx_kernels.build --all --out build/artifacts
python3 -m pytest -n "${TIRX_TEST_JOBS:-2}" -q -rs --durations=40 packages/*/tests "$@"
echo "test.sh: $(( $(date +%s) - start )) s"
