#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Promote suite parts against a clean clone of HEAD while the checkout has uncommitted edits (helpers working in it):
# promote compares each row's measured source fingerprint with the sources it imports, and a helper's half-done
# edit of a kernel made the 2026-12-07f Mamba rows read "stale" although HEAD's sources were the measured ones.
#   bash tools/promote_clean.sh PART.json ...     (then commit bench_suite/baseline.* and README.md)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
parts=(); for p in "$@"; do parts+=("$(realpath "$p")"); done
wt=$(mktemp -d /tmp/promote-clean.XXXXXX)
trap 'rm -rf "$wt"' EXIT
git clone -q --shared "$root" "$wt"
cd "$wt"
# The clone's packages first on the path: an editable install of the checkout would import its dirty files.
PYTHONPATH=$(ls -d "$wt"/packages/*/src | paste -sd:)${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH PATH=${VENV_BIN:-/tmp/dev/bin}:$PATH
python -m tirx_kernels.bench_suite promote --partial "${parts[@]}"
python tools/readme_kernels.py --write
cp bench_suite/baseline.json bench_suite/baseline.md "$root/bench_suite/"
[ -f bench_suite/baseline.png ] && cp bench_suite/baseline.png "$root/bench_suite/"
if git -C "$root" diff --quiet -- README.md; then cp README.md "$root/README.md"
else echo "README.md has uncommitted edits in the checkout: not overwritten (run readme_kernels.py --write)"; fi
