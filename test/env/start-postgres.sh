#!/usr/bin/env bash
# Starts a private PostgreSQL on a free loopback port with a throwaway data directory.
# Usage: start-postgres.sh STATE_DIR   (writes STATE_DIR/postgres.env and postgres.pid)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"

find_pg_bin() {
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
  command -v pg_ctl >/dev/null && dirname "$(command -v pg_ctl)"
}
pgbin="$(find_pg_bin || true)"
if [ -z "$pgbin" ]; then
  log "installing postgresql from Debian packages"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib >/dev/null
  pgbin="$(find_pg_bin)"
fi

data="$state/postgres"
mkdir -p "$data"
# PostgreSQL refuses to run as root: run it as the 'postgres' user the Debian package creates.
as_pg=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home "$state" postgres
  chown postgres "$state" "$data"
  as_pg=(runuser -u postgres --)
fi
port="$(free_port)"
"${as_pg[@]}" "$pgbin/initdb" -D "$data/db" -U postgres -A trust -E UTF8 --locale=C.UTF-8 -N >"$state/postgres-initdb.log" 2>&1 \
  || "${as_pg[@]}" "$pgbin/initdb" -D "$data/db" -U postgres -A trust -E UTF8 --locale=C -N >"$state/postgres-initdb.log" 2>&1
cat >>"$data/db/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$data'
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
log_min_messages = warning
CONF
"${as_pg[@]}" "$pgbin/pg_ctl" -D "$data/db" -l "$state/postgres.log" -w -t 60 start >/dev/null
head -1 "$data/db/postmaster.pid" >"$state/postgres.pid"
cat >"$state/postgres.env" <<ENV
DATABASE_URL=postgres://postgres@127.0.0.1:$port/postgres
PGHOST=127.0.0.1
PGPORT=$port
PGUSER=postgres
PG_BIN=$pgbin
PG_DATA=$data/db
ENV
log "postgres ready on 127.0.0.1:$port"
