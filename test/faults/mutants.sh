#!/usr/bin/env bash
# `make mutants`: every broken build in test/faults/mutants/*.mutant is applied to a copy of the
# tree and only its named tests run there; each must fail (test/faults/mutants.ts). Writes
# docs/mutants-report.md. `make faults` runs the mutants of its own suite through this script too:
#   bash test/faults/mutants.sh [--suite faults] [--report FILE] [--tsv FILE] [mutant-name...]
# Servers: those given through DATABASE_URL, REDIS_URL, KAFKA_BROKERS and KUBECONFIG, else a private
# set started once for the whole run (and always stopped).
#   MUTANT_TIMEOUT_SECONDS  per test file and mutant (default 600)
#   MUTANT_BASELINE=0       skip the check that the named tests pass on the real code
set -euo pipefail
cd "$(dirname "$0")/../.."
env_dir="test/env"
bash "$env_dir/deps.sh" system
bash "$env_dir/deps.sh" node

state=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$state" ]; then bash "$env_dir/env-down.sh" "$state" >/dev/null 2>&1 || true; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ -z "${DATABASE_URL:-}" ] || [ -z "${REDIS_URL:-}" ] || [ -z "${KAFKA_BROKERS:-}" ] || [ -z "${KUBECONFIG:-}" ]; then
  state="/tmp/flashsale-mutants-$$"
  bash "$env_dir/env-down.sh" "$state" >/dev/null 2>&1 || true
  echo "[mutants] starting the test environment in $state" >&2
  bash "$env_dir/env-up.sh" "$state" >/dev/null
  # shellcheck disable=SC1091
  . "$state/env.sh"
fi
node --import tsx test/faults/mutants.ts run "$@"
