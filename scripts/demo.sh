#!/usr/bin/env bash
# `make demo`: one whole flash sale on this machine (docs/demo.md). Installs what is missing, then
# runs scripts/demo/main.ts from source with tsx (as it runs the operator and the roles; nothing
# is built), which starts the servers (unless DATABASE_URL, REDIS_URL, KAFKA_BROKERS and
# KUBECONFIG are all given), the operator and the runtime roles, drives the buyers and prints a
# checked summary. Arguments go to the demo (--buyers 5000, --help, ...).
# Whatever happens (end, failure, Ctrl-C, SIGTERM) nothing it started is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

bash test/env/deps.sh system
# The project's Node major (installed into the cache when the machine's is older).
PATH="$(bash test/env/node.sh):$PATH"
export PATH
echo "[demo] node $(node --version) ($(command -v node))" >&2
bash test/env/deps.sh node

export DEMO_STATE_DIR="${DEMO_STATE_DIR:-/tmp/flashsale-demo}"
own_servers=1
if [ -n "${DATABASE_URL:-}" ] && [ -n "${REDIS_URL:-}" ] && [ -n "${KAFKA_BROKERS:-}" ] && [ -n "${KUBECONFIG:-}" ]; then
  own_servers=0
fi

pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true # the demo stops its processes and servers itself
    wait "$pid" 2>/dev/null || true
  fi
  # Only the demo's own state dir, never servers given through the environment.
  if [ "$own_servers" = 1 ] && [ -d "$DEMO_STATE_DIR" ]; then
    bash test/env/env-down.sh "$DEMO_STATE_DIR" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP # a closed terminal

# In the background so that INT/TERM reach the traps at once (bash defers traps while a
# foreground child runs); the demo handles SIGINT/SIGTERM itself as well.
node --import tsx scripts/demo/main.ts "$@" &
pid=$!
rc=0
wait "$pid" || rc=$?
pid=""
exit "$rc"
