#!/usr/bin/env bash
# Starts PostgreSQL, Redis, Kafka and a Kubernetes API server on loopback, in parallel, and
# writes STATE_DIR/env.sh (shell exports) and STATE_DIR/env.json (for the tests).
# A server the user already runs is used instead when its variable is set:
#   DATABASE_URL, REDIS_URL, KAFKA_BROKERS, KUBECONFIG (or KUBEBUILDER_ASSETS for binaries).
# Usage: env-up.sh [STATE_DIR]    FLASHSALE_SERVICES="postgres redis kafka kube" limits the set;
# add redis-sentinel for an HA Redis (primary, replica, three Sentinels; start-redis-sentinel.sh),
# or give one through REDIS_SENTINELS (+ REDIS_SENTINEL_MASTER); add redis-cluster for a Redis
# Cluster (three primaries, one replica each; start-redis-cluster.sh), or give one through
# REDIS_CLUSTER_NODES; add kafka-cluster for a three-broker Kafka beside the single one
# (start-kafka-cluster.sh), or give one through KAFKA_CLUSTER_BROKERS.
# KAFKA_BROKERS_COUNT=3 makes the suite's own Kafka (KAFKA_BROKERS) a three-broker cluster instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="${1:-${FLASHSALE_STATE:-/tmp/flashsale-env}}"
services="${FLASHSALE_SERVICES:-postgres redis kafka kube}"

if [ -f "$state/env.sh" ]; then
  log "environment already up in $state (make env-down to stop it)"
  cat "$state/env.sh"
  exit 0
fi
mkdir -p "$state"
chmod 755 "$state"
trap 'rc=$?; if [ $rc -ne 0 ]; then log "start failed; stopping what started"; bash "$here/env-down.sh" "$state" >/dev/null 2>&1 || true; fi' EXIT

declare -A given=(
  [postgres]="${DATABASE_URL:+DATABASE_URL=$DATABASE_URL}"
  [redis]="${REDIS_URL:+REDIS_URL=$REDIS_URL}"
  [kafka]="${KAFKA_BROKERS:+KAFKA_BROKERS=$KAFKA_BROKERS}"
  [kube]="${KUBECONFIG:+KUBECONFIG=$KUBECONFIG}"
  [kafka-cluster]="${KAFKA_CLUSTER_BROKERS:+KAFKA_CLUSTER_BROKERS=$KAFKA_CLUSTER_BROKERS}"
  [redis-sentinel]="${REDIS_SENTINELS:+REDIS_SENTINELS=$REDIS_SENTINELS}${REDIS_SENTINELS:+
REDIS_SENTINEL_MASTER=${REDIS_SENTINEL_MASTER:-flashsale}}"
  [redis-cluster]="${REDIS_CLUSTER_NODES:+REDIS_CLUSTER_NODES=$REDIS_CLUSTER_NODES}"
)
declare -A jobs=()
elapsed() { local d=$(( ($(date +%s%N) - $1) / 100000000 )); echo "$((d / 10)).$((d % 10))"; }
start=$(date +%s%N)
for s in $services; do
  if [ -n "${given[$s]:-}" ]; then
    log "$s: using the server from the environment (${given[$s]%%=*})"
    echo "${given[$s]}" >"$state/$s.env"
    continue
  fi
  (
    t0=$(date +%s%N)
    bash "$here/start-$s.sh" "$state"
    echo "$s $(elapsed "$t0")s" >>"$state/timings"
  ) &
  jobs[$s]=$!
done
failed=()
for s in "${!jobs[@]}"; do
  wait "${jobs[$s]}" || failed+=("$s")
done
[ ${#failed[@]} -eq 0 ] || die "failed to start: ${failed[*]} (logs in $state)"

{
  echo "# flashsale test environment ($state)"
  echo "export FLASHSALE_STATE=$state"
  for s in $services; do sed -e 's/^/export /' "$state/$s.env"; done
} >"$state/env.sh.tmp"
node -e '
  const fs = require("fs"); const out = {};
  for (const line of fs.readFileSync(process.argv[1], "utf8").split("\n")) {
    const m = /^export ([A-Z_]+)=(.*)$/.exec(line); if (m) out[m[1]] = m[2];
  }
  fs.writeFileSync(process.argv[2], JSON.stringify(out, null, 2));
' "$state/env.sh.tmp" "$state/env.json"
mv "$state/env.sh.tmp" "$state/env.sh"
trap - EXIT

total="$(elapsed "$start")"
log "all servers up in ${total}s ($(cat "$state/timings" 2>/dev/null | tr '\n' ' ' || true))"
. "$state/env.sh"
cat <<INFO
Connect with:
  source $state/env.sh
  psql "\$DATABASE_URL"                        ${DATABASE_URL:-}
  redis-cli -u "\$REDIS_URL"                   ${REDIS_URL:-}
  kafkajs: new Kafka({ brokers: ['${KAFKA_BROKERS:-}'] })
  KUBECONFIG=${KUBECONFIG:-} ${KUBECTL:-kubectl} get ns
Stop with: make env-down   (or test/env/env-down.sh $state)
INFO
