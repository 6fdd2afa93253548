#!/usr/bin/env bash
# Starts a Redis Cluster on free loopback ports from Debian's redis-server: three primaries with
# one replica each (`redis-cli --cluster create --cluster-replicas 1`), AOF on (everysec), fast
# failure detection for tests (cluster-node-timeout 2 s), so a SIGKILLed primary's replica is
# promoted within seconds.
# Usage: start-redis-cluster.sh STATE_DIR
# Writes STATE_DIR/redis-cluster.env (REDIS_CLUSTER_NODES = the three primaries, and each node's
# port and config) and one pid file per node (redis-cluster-<n>.pid), so env-down.sh stops them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"

if ! command -v redis-server >/dev/null; then
  log "installing redis-server from Debian packages"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
base="$state/redis-cluster"
mkdir -p "$base"

ports=()
for n in 1 2 3 4 5 6; do
  port="$(free_port 10000)"
  # The cluster bus uses port + 10000: pick again until that one is free too.
  while [ "$port" -gt 55535 ] || ! node -e 'const s=require("net").createServer();s.once("error",()=>process.exit(1));s.listen(+process.argv[1],"127.0.0.1",()=>s.close())' "$((port + 10000))"; do
    port="$(free_port 10000)"
  done
  mkdir -p "$base/n$n"
  cat >"$base/n$n/redis.conf" <<CONF
bind 127.0.0.1
port $port
dir $base/n$n
save ""
appendonly yes
appendfsync everysec
daemonize yes
pidfile $state/redis-cluster-$n.pid
# The config path in the process title lets env-down.sh find this server by its state dir.
proc-title-template "{title} {listen-addr} {server-mode} {config-file}"
logfile $base/n$n/redis.log
cluster-enabled yes
cluster-config-file $base/n$n/nodes.conf
cluster-node-timeout 2000
# A replica promoted after its primary died must take writes at once, whatever its lag.
cluster-replica-validity-factor 0
CONF
  redis-server "$base/n$n/redis.conf"
  wait_for "redis cluster node $n" 20 redis-cli -p "$port" ping
  ports+=("$port")
done

# The first three become primaries, the next three their replicas (redis-cli's assignment).
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 --cluster-yes >"$base/create.log" 2>&1 ||
  { tail -n 20 "$base/create.log" >&2; die "redis-cli --cluster create failed"; }
ok() {
  for p in "${ports[@]}"; do
    redis-cli -p "$p" cluster info | grep -q '^cluster_state:ok' || return 1
  done
  # Every replica has finished its first sync.
  [ "$(for p in "${ports[@]}"; do redis-cli -p "$p" info replication; done | grep -c '^master_link_status:up')" -eq 3 ]
}
wait_for "redis cluster state ok" 60 ok

primaries=()
for p in "${ports[@]}"; do
  if redis-cli -p "$p" info replication | grep -q '^role:master'; then primaries+=("127.0.0.1:$p"); fi
done
{
  echo "REDIS_CLUSTER_NODES=$(IFS=,; echo "${primaries[*]}")"
  echo "REDIS_CLUSTER_PORTS=$(IFS=,; echo "${ports[*]}")"
  for n in 1 2 3 4 5 6; do
    echo "REDIS_CLUSTER_CONF_$n=$base/n$n/redis.conf"
  done
} >"$state/redis-cluster.env"
log "redis cluster on 127.0.0.1 ports ${ports[*]} (primaries ${primaries[*]})"
