#!/usr/bin/env bash
# The Drift Audit action's review step (action.yml): review the PR range once, then render that one
# audit as the job summary (markdown) and as SARIF for code scanning, and set the step's outputs.
#
# Inputs come as environment variables (never ${{ }} in a script): DRIFT_AUDIT_PATH, DRIFT_AUDIT_BASE,
# DRIFT_AUDIT_HEAD, DRIFT_AUDIT_CONFIG, DRIFT_AUDIT_RUN (true|false), DRIFT_AUDIT_OUT (a directory).
# Exit status: 0 when the review ran (whatever its verdict, so SARIF can still be uploaded; the action's
# last step fails the job on a failing verdict), 2 when it could not run.
set -euo pipefail

repo=${DRIFT_AUDIT_PATH:-.}
head=${DRIFT_AUDIT_HEAD:-}
base=${DRIFT_AUDIT_BASE:-}
out=${DRIFT_AUDIT_OUT:-${RUNNER_TEMP:-/tmp}/drift-audit}
mkdir -p "$out"

args=(review "$repo" --format json --output "$out/audit.json")
if [ -n "$head" ]; then args+=(--head "$head"); fi
if [ -n "$base" ]; then args+=(--base "$base"); fi
if [ -n "${DRIFT_AUDIT_CONFIG:-}" ]; then args+=(--config "$DRIFT_AUDIT_CONFIG"); fi
case "${DRIFT_AUDIT_RUN:-false}" in
  true) args+=(--run) ;;
  false | "") ;;
  *) echo "::error title=Drift Audit::input 'run' must be true or false, not '${DRIFT_AUDIT_RUN}'"; exit 2 ;;
esac

status=0
drift-audit "${args[@]}" || status=$?
if [ "$status" -ge 2 ]; then
  echo "::error title=Drift Audit::the review could not run (exit $status); the line above says why"
  exit "$status"
fi
verdict=pass
if [ "$status" -eq 1 ]; then verdict=fail; fi

# One audit, two renderings; `report` exits 1 on a failing verdict too, which is not an error here.
drift-audit report "$out/audit.json" --format markdown --output "$out/comment.md" || [ $? -eq 1 ]
drift-audit report "$out/audit.json" --format sarif --output "$out/drift-audit.sarif" || [ $? -eq 1 ]

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  cat "$out/comment.md" >> "$GITHUB_STEP_SUMMARY"
fi
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  {
    echo "verdict=$verdict"
    echo "json=$out/audit.json"
    echo "markdown=$out/comment.md"
    echo "sarif=$out/drift-audit.sarif"
  } >> "$GITHUB_OUTPUT"
fi
echo "drift-audit: verdict $verdict ($out)"
