#!/usr/bin/env bash
# Run every suite of one runner label of this repo on this machine, needing only python + torch + triton.
#
#   runner/gpu_smoke.sh [LABEL] [OUT_DIR]
#
# LABEL defaults to this machine's (sm90 on an H100/H200, sm120 on an RTX PRO 6000, cpu without a GPU);
# OUT_DIR defaults to $OUT, else ./.out. Writes plan.json and results.json there and prints a summary.
# Exit status: 0 all passed or skipped, 1 a suite failed, 2 bad input.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
OUT_DIR="${2:-${OUT:-./.out}}"
mkdir -p "$OUT_DIR"
LABEL="${1:-$("$PY" -c 'from runner.device import detect_gpu, label_for; g = detect_gpu(); print(label_for(g.capability if g else None))')}"
HEAD_SHA="$(git rev-parse HEAD 2>/dev/null || true)"

"$PY" -m runner.smoke plan --label "$LABEL" --out "$OUT_DIR/plan.json" --head-sha "$HEAD_SHA"
rc=0
"$PY" -m runner.execute --plan "$OUT_DIR/plan.json" --label "$LABEL" --out "$OUT_DIR/results.json" \
  --repo . --allow-other-head || rc=$?
if [ -f "$OUT_DIR/results.json" ]; then
  "$PY" -m runner.smoke summary "$OUT_DIR/results.json"
fi
exit "$rc"
