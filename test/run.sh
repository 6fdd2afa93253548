#!/usr/bin/env bash
# The project's test command (npm test, make test, CI): installs what is missing, builds, starts
# PostgreSQL, Redis, Kafka and a Kubernetes API server once, runs every jest project against them
# and stops them again, whatever happens. Arguments go to jest, e.g.
#   bash test/run.sh test/integration/smoke      bash test/run.sh --selectProjects unit
# Servers already given through DATABASE_URL, REDIS_URL, KAFKA_BROKERS, KUBECONFIG are used as is.
# It runs ESLint, Prettier and tsc --noEmit over everything (tests included) before starting servers.
# FLASHSALE_SKIP_BUILD=1 skips the tsc build step and FLASHSALE_SKIP_CHECKS=1 the static checks (for
# quick local iterations; CI never sets either).
# The last line of the output is the summary reporter's "Summary: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="test/env"
t0=$(date +%s)
log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

bash "$env_dir/deps.sh" system
# The project's Node major (installed into the cache when the machine's is older): npm ci, the
# build, jest and every process the tests spawn run on it.
PATH="$(bash "$env_dir/node.sh"):$PATH"
export PATH
log "node $(node --version) ($(command -v node))"
bash "$env_dir/deps.sh" node
# Static checks first: a formatting, lint or type error (tests included) fails the run in seconds,
# before any server starts. FLASHSALE_SKIP_CHECKS=1 skips them for quick local iterations (CI never
# sets it).
if [ -z "${FLASHSALE_SKIP_CHECKS:-}" ]; then
  log "static checks: eslint, prettier --check, tsc --noEmit (tests included)"
  node_modules/.bin/eslint --max-warnings=0 . || { echo "static check failed: eslint"; echo "Summary: 0 passed, 1 failed, 0 skipped"; exit 1; }
  node_modules/.bin/prettier --check --log-level=warn . || { echo "static check failed: prettier"; echo "Summary: 0 passed, 1 failed, 0 skipped"; exit 1; }
  node_modules/.bin/tsc -p tsconfig.json --noEmit || { echo "static check failed: tsc"; echo "Summary: 0 passed, 1 failed, 0 skipped"; exit 1; }
fi
if [ -z "${FLASHSALE_SKIP_BUILD:-}" ]; then
  log "build (tsc)"
  npm run --silent build
fi

state=""
jest_pid=""
helm_pid=""
jest_out="$(mktemp /tmp/flashsale-jest-out.XXXXXX)"
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$helm_pid" ]; then kill -TERM -- "-$helm_pid" 2>/dev/null || true; fi
  if [ -n "$jest_pid" ]; then # jest and its workers
    kill -TERM -- "-$jest_pid" 2>/dev/null || true
    wait "$jest_pid" 2>/dev/null || true
  fi
  # Quiet: nothing may follow the summary line.
  if [ -n "$state" ]; then bash "$env_dir/env-down.sh" "$state" >/dev/null 2>&1 || true; fi
  # jest's stdout (the summary reporter's line; jest itself writes to stderr) comes last.
  cat "$jest_out" 2>/dev/null || true
  rm -f "$jest_out"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# helm (for the chart tests) builds into the cache alongside the servers' start: only a fresh
# machine pays for it, and not inside a test's timeout.
setsid bash "$env_dir/build-kube.sh" helm >/dev/null &
helm_pid=$!

if [ -n "${DATABASE_URL:-}" ] && [ -n "${REDIS_URL:-}" ] && [ -n "${KAFKA_BROKERS:-}" ] && [ -n "${KUBECONFIG:-}" ]; then
  log "using the servers given by DATABASE_URL, REDIS_URL, KAFKA_BROKERS and KUBECONFIG"
else
  state="/tmp/flashsale-test-$$"
  bash "$env_dir/env-down.sh" "$state" >/dev/null 2>&1 || true # leftover of a crashed run
  log "starting the test environment in $state"
  bash "$env_dir/env-up.sh" "$state" >/dev/null &
  wait $! # in the background, like jest below, so that a signal is handled at once
  # shellcheck disable=SC1091
  . "$state/env.sh"
fi
wait "$helm_pid" || log "building helm failed; the chart tests will try again"
helm_pid=""
log "environment ready after $(($(date +%s) - t0))s; running jest"

# jest runs in the background so that INT/TERM reach the traps at once (bash defers traps while
# a foreground child runs); the EXIT trap stops jest, then the servers, then prints jest's stdout.
# jest prints its own summary after custom reporters' output, so its stdout (where the summary
# reporter writes "Summary: N passed, N failed, N skipped") is held back until the very end.
# setsid: jest leads its own process group, so that the trap can stop its workers too (npx would
# not pass the signal on, hence the local binary).
NODE_OPTIONS=--experimental-vm-modules setsid node_modules/.bin/jest --maxWorkers=2 "$@" >"$jest_out" &
jest_pid=$!
rc=0
wait "$jest_pid" || rc=$?
jest_pid=""
exit "$rc"
