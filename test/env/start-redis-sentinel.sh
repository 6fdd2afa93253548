#!/usr/bin/env bash
# Starts a Redis primary, one replica and three Sentinels on free loopback ports, from Debian's
# redis-server and redis-sentinel packages (an HA Redis as docs/install.md recommends it: AOF with
# appendfsync everysec, a replica, Sentinel quorum 2 of 3).
# Usage: start-redis-sentinel.sh STATE_DIR
# Writes STATE_DIR/redis-sentinel.env (REDIS_SENTINELS, REDIS_SENTINEL_MASTER, and the nodes'
# ports and configs) and one pid file per process (redis-sentinel-<node>.pid), so env-down.sh
# stops them all. Failure detection is fast for tests (down-after 1 s, failover timeout 5 s).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"
master="${REDIS_SENTINEL_MASTER:-flashsale}"

if ! command -v redis-server >/dev/null || ! command -v redis-sentinel >/dev/null; then
  log "installing redis-server and redis-sentinel from Debian packages"
  apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-sentinel redis-tools >/dev/null
fi
base="$state/redis-sentinel"
mkdir -p "$base"

# node_conf NAME PORT [EXTRA LINES]: a data node's config (primary or replica).
node_conf() {
  local name="$1" port="$2" extra="${3:-}"
  mkdir -p "$base/$name"
  cat >"$base/$name/redis.conf" <<CONF
bind 127.0.0.1
port $port
dir $base/$name
save ""
appendonly yes
appendfsync everysec
daemonize yes
pidfile $state/redis-sentinel-$name.pid
# The config path in the process title lets env-down.sh find this server by its state dir.
proc-title-template "{title} {listen-addr} {server-mode} {config-file}"
logfile $base/$name/redis.log
# A replica promoted by Sentinel must accept writes at once; its old primary rejoins as replica.
replica-read-only yes
$extra
CONF
}

primary_port="$(free_port)"
node_conf primary "$primary_port"
redis-server "$base/primary/redis.conf"
wait_for "redis primary" 20 redis-cli -p "$primary_port" ping

replica_port="$(free_port)"
node_conf replica "$replica_port" "replicaof 127.0.0.1 $primary_port"
redis-server "$base/replica/redis.conf"
wait_for "redis replica" 20 redis-cli -p "$replica_port" ping
synced() { redis-cli -p "$replica_port" info replication | grep -q '^master_link_status:up'; }
wait_for "redis replica in sync" 30 synced

sentinels=()
for i in 1 2 3; do
  port="$(free_port)"
  mkdir -p "$base/s$i"
  # Sentinel rewrites its own config (state of the monitored set): a file of its own each.
  cat >"$base/s$i/sentinel.conf" <<CONF
bind 127.0.0.1
port $port
dir $base/s$i
daemonize yes
pidfile $state/redis-sentinel-s$i.pid
logfile $base/s$i/sentinel.log
proc-title-template "{title} {listen-addr} {server-mode} {config-file}"
sentinel monitor $master 127.0.0.1 $primary_port 2
sentinel down-after-milliseconds $master 1000
sentinel failover-timeout $master 5000
sentinel parallel-syncs $master 1
CONF
  redis-sentinel "$base/s$i/sentinel.conf"
  wait_for "sentinel $i" 20 redis-cli -p "$port" ping
  sentinels+=("127.0.0.1:$port")
done
knows() { redis-cli -p "${sentinels[0]##*:}" sentinel replicas "$master" | grep -q "$replica_port"; }
wait_for "sentinels to see the replica" 30 knows

cat >"$state/redis-sentinel.env" <<ENV
REDIS_SENTINELS=$(IFS=,; echo "${sentinels[*]}")
REDIS_SENTINEL_MASTER=$master
REDIS_SENTINEL_PRIMARY_PORT=$primary_port
REDIS_SENTINEL_PRIMARY_CONF=$base/primary/redis.conf
REDIS_SENTINEL_REPLICA_PORT=$replica_port
REDIS_SENTINEL_REPLICA_CONF=$base/replica/redis.conf
ENV
log "redis primary 127.0.0.1:$primary_port, replica :$replica_port, sentinels ${sentinels[*]} (master $master)"
