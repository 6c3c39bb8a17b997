#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The bench suite's remote mode, for real: start a kcoral server on loopback on this GPU host, run a
# one-row roster through it (--server), run the same row locally for comparison, stop the server.
#
#   bash tools/kcoral_selftest.sh stage                 # CPU machine, after ../shared/gpu/stage: wheels -> .gpu/kcoral/
#   bash tools/kcoral_selftest.sh [PORT] [KERNEL] [ROLE] # GPU host (default 8765 rmsnorm small); logs in $OUT
#   WITH_REFS=1 bash tools/kcoral_selftest.sh ...         # also time the row's references (each must be staged)
#
# The kcoral server needs kcoral 0.1.1 plus its HTTP front end (fastapi, uvicorn and their deps); not
# kcoral[server], whose pins (torch>=2.14, nvidia-cutlass-dsl==4.7.0) conflict with ours and are not
# needed to run uploaded Python. numpy is left out of the staged wheels (torch hosts have it): set
# KCORAL_STAGE_NUMPY=1 to add it (16 MB).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = stage ]; then
  mkdir -p .gpu/kcoral
  extra=(); [ "${KCORAL_STAGE_NUMPY:-0}" = 1 ] && extra+=(numpy)
  python3 -m pip download -q --no-deps -d .gpu/kcoral --python-version 3.12 --implementation cp --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 kcoral==0.1.1 ml_dtypes httpx httpcore h11 anyio idna certifi \
    fastapi starlette pydantic pydantic-core annotated-types annotated-doc typing-inspection typing-extensions \
    opentelemetry-api uvicorn click "${extra[@]}" || exit 2
  du -sh .gpu/kcoral
  exit 0
fi

PORT=${1:-8765}; KERNEL=${2:-rmsnorm}; ROLE=${3:-small}
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
[ -f .gpu/setup.sh ] && source .gpu/setup.sh
if ls .gpu/kcoral/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/kcoral/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import kcoral, fastapi, uvicorn, numpy, ml_dtypes" || {
  echo "kcoral_selftest: the kcoral server needs kcoral==0.1.1, fastapi, uvicorn and numpy (stage them: see the header)"; exit 2; }

URL="http://127.0.0.1:$PORT"
# --sandbox none: bubblewrap would hide the checkout and /tmp/site from the workers unless every path is
# passed with --sandbox-readonly-path; the server listens on loopback only.
python3 -m kcoral server --host 127.0.0.1 --port "$PORT" --gpus 0 --workers-per-gpu 1 --sandbox none \
  --log-dir "$OUT/kcoral-logs" --disk-cache-dir "" >"$OUT/kcoral-server.log" 2>&1 &
server=$!
stop() {
  kill -TERM "$server" 2>/dev/null
  for _ in $(seq 1 20); do kill -0 "$server" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$server" 2>/dev/null
  wait "$server" 2>/dev/null
}
trap stop EXIT

ready=0
for _ in $(seq 1 180); do
  kill -0 "$server" 2>/dev/null || break
  if python3 -c "import kcoral; h = kcoral.Client('$URL').health(); assert h['gpu_count'] >= 1" 2>/dev/null; then
    ready=1; break
  fi
  sleep 1
done
if [ "$ready" != 1 ]; then
  echo "kcoral_selftest: the server did not become ready on $URL; its log:"; tail -40 "$OUT/kcoral-server.log"; exit 1
fi
python3 -c "import json, kcoral; print('kcoral health:', json.dumps(kcoral.Client('$URL').health()))"

refs=(); [ "${WITH_REFS:-0}" = 1 ] && refs+=(--with-references)
python3 -m tirx_kernels.bench_suite run --kernel "$KERNEL" --role "$ROLE" "${refs[@]}" \
  --server "$URL" --out "$OUT/kcoral-run.json" --no-progress
rc=$?
python3 -m tirx_kernels.bench_suite run --kernel "$KERNEL" --role "$ROLE" "${refs[@]}" \
  --out "$OUT/local-run.json" --no-progress
echo "kcoral_selftest: remote run rc=$rc (row and provenance in $OUT/kcoral-run.json; local in $OUT/local-run.json)"
tail -5 "$OUT/kcoral-server.log"
exit $rc
