#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stage a GPU call from HEAD while the checkout has uncommitted edits (helpers working in it): the measured code,
# its wheels and its source stamp all come from a clean snapshot of HEAD, not from the dirty tree the call carries.
#   bash tools/gpu_stage_clean.sh [stage args...]      (default: --ref liger --ref flashinfer)
# With BUILD=1 the bundle is built first from the same snapshot (`build --all`, incremental, into build/artifacts).
# Packed into .gpu as well: build/artifacts (when its manifest is there) as artifacts.tar.xz, every
# build/gpu-extra/*.tar.xz (the helpers' variant sweeps) into extra/, and $FI_AOT (default /tmp/fi-aot.tar.xz: the
# FlashInfer AOT tree of tools/flashinfer_aot.py) into trees/ when it exists. Caches stay a choice of the call.
# Then start the call script with
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
if [ "${BUILD:-0}" = 1 ]; then
  (cd "$wt" && PYTHONPATH=$(ls -d "$wt"/packages/*/src | paste -sd:) PATH=${VENV_BIN:-/tmp/dev/bin}:$PATH \
    python -m tirx_kernels.build --all --out "$root/build/artifacts" | tail -1)
fi
rm -rf "$root/.gpu" && cp -a "$wt/.gpu" "$root/.gpu"
[ -f "$root/build/artifacts/manifest.json" ] && tar -C "$root/build" -cf - artifacts | xz -T2 > "$root/.gpu/artifacts.tar.xz"
for x in "$root"/build/gpu-extra/*.tar.xz; do [ -e "$x" ] && mkdir -p "$root/.gpu/extra" && cp "$x" "$root/.gpu/extra/"; done
aot=${FI_AOT:-/tmp/fi-aot.tar.xz}; [ -f "$aot" ] && mkdir -p "$root/.gpu/trees" && cp "$aot" "$root/.gpu/trees/flashinfer-aot.tar.xz"
git archive HEAD | xz -T2 -6 > "$root/.gpu/src.tar.xz"
PATH=${VENV_BIN:-/tmp/dev/bin}:$PATH python -m tirx_kernels.bench_suite stamp --root "$wt" --out "$root/.gpu/source-stamp.json"
cat > "$root/.gpu/clean-src.sh" <<'SH'
# source .gpu/clean-src.sh   (on the GPU host, from the carried checkout's root): run from HEAD's snapshot
_g="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf /tmp/src && mkdir -p /tmp/src && xz -dc "$_g/src.tar.xz" | tar -x -C /tmp/src && ln -s "$_g" /tmp/src/.gpu
cd /tmp/src && source .gpu/setup.sh
SH
echo "staged from $(git rev-parse --short HEAD) (clean): $(du -sh "$root/.gpu" | cut -f1)"
