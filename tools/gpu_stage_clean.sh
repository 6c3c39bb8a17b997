#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stage a GPU call from HEAD while the checkout has uncommitted edits (helpers working in it): the measured code,
# its wheels and its source stamp all come from a clean snapshot of HEAD, not from the dirty tree the call carries.
#   bash tools/gpu_stage_clean.sh [stage args...]      (default: --ref liger --ref flashinfer)
# Then: put the bundle / trees / caches into .gpu as usual and start the call script with
#   source .gpu/clean-src.sh    # unpacks .gpu/src.tar.xz into /tmp/src and cd's there (.gpu linked in)
# 2026-12-07f: a helper's half-written _ssu_kernel.py would have been carried (wheels built from it, the stamp dirty,
# promote refusing the Mamba rows); this is what keeps a call's evidence attributable to a commit.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
[ $# -gt 0 ] || set -- --ref liger --ref flashinfer
wt=$(mktemp -d /tmp/stage-clean.XXXXXX); rmdir "$wt"
git clone -q --shared --no-checkout "$root" "$wt" && git -C "$wt" checkout -q --detach "$(git rev-parse HEAD)"
trap 'rm -rf "$wt"' EXIT  # a clone, not a worktree: stage wants a .git directory
stage=${GPU_STAGE:-$root/../shared/gpu/stage}
(cd "$wt" && "$stage" "$@" 2>&1 | grep -v WARNING | tail -2)
rm -rf "$root/.gpu" && cp -a "$wt/.gpu" "$root/.gpu"
git archive HEAD | xz -T2 -6 > "$root/.gpu/src.tar.xz"
PATH=${VENV_BIN:-/tmp/dev/bin}:$PATH python -m tirx_kernels.bench_suite stamp --root "$wt" --out "$root/.gpu/source-stamp.json"
cat > "$root/.gpu/clean-src.sh" <<'SH'
# source .gpu/clean-src.sh   (on the GPU host, from the carried checkout's root): run from HEAD's snapshot
_g="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf /tmp/src && mkdir -p /tmp/src && xz -dc "$_g/src.tar.xz" | tar -x -C /tmp/src && ln -s "$_g" /tmp/src/.gpu
cd /tmp/src && source .gpu/setup.sh
SH
echo "staged from $(git rev-parse --short HEAD) (clean): $(du -sh "$root/.gpu" | cut -f1)"
