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
python3 -m tirx_kernels.registry --strict >/dev/null
python3 -m pytest -n "${TIRX_TEST_JOBS:-2}" -q -rs packages/*/tests "$@"
echo "test.sh: $(( $(date +%s) - start )) s"
