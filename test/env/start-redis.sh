#!/usr/bin/env bash
# Starts a private Redis on a free loopback port (AOF on, so a restart keeps what was acknowledged;
# maxmemory 2gb with noeviction, as docs/install.md asks of a sale's Redis).
# Usage: start-redis.sh STATE_DIR   (writes STATE_DIR/redis.env and redis.pid)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"

if ! command -v redis-server >/dev/null; then
  log "installing redis-server from Debian packages"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
data="$state/redis"
mkdir -p "$data"
port="$(free_port)"
cat >"$data/redis.conf" <<CONF
bind 127.0.0.1
port $port
dir $data
save ""
appendonly yes
appendfsync always
# As docs/install.md asks of a sale's Redis: a limit, and refusals rather than evictions when full.
maxmemory 2gb
maxmemory-policy noeviction
daemonize yes
pidfile $state/redis.pid
# The config path in the process title lets env-down.sh find this server by its state dir.
proc-title-template "{title} {listen-addr} {server-mode} {config-file}"
logfile $state/redis.log
CONF
redis-server "$data/redis.conf"
wait_for "redis" 20 redis-cli -p "$port" ping
cat >"$state/redis.env" <<ENV
REDIS_URL=redis://127.0.0.1:$port
REDIS_PORT=$port
REDIS_CONF=$data/redis.conf
ENV
log "redis ready on 127.0.0.1:$port"
