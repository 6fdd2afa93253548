#!/usr/bin/env bash
# Installs what the tests and the local environment need, only when missing.
#   deps.sh system   Debian packages (apt-get update runs only when something is missing)
#   deps.sh node     Node 24 (node.sh) and npm ci when node_modules is missing or older than package*.json
#   deps.sh servers  Kafka jars, etcd, kube-apiserver, kubectl and helm into the cache
#   deps.sh all      all of the above
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

system() {
  local need=()
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-cli >/dev/null || need+=(redis-tools)
  compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || need+=(postgresql)
  command -v openssl >/dev/null || need+=(openssl)
  command -v curl >/dev/null || need+=(curl)
  command -v mvn >/dev/null || need+=(maven)
  command -v java >/dev/null || need+=(default-jre-headless)
  command -v flock >/dev/null || need+=(util-linux)
  command -v pgrep >/dev/null || need+=(procps)
  # Prometheus scrapes the roles in test/e2e/prometheus/ (test/env/start-prometheus.sh).
  command -v prometheus >/dev/null || need+=(prometheus)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing packages: ${need[*]} (run as root, or install them)"
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  command -v go >/dev/null || die "Go (>= 1.24) is needed to build etcd and kube-apiserver"
  command -v node >/dev/null || die "Node.js with npm is needed (node.sh then installs Node $NODE_MAJOR when it is older)"
}

node_modules() {
  cd "$root"
  # npm ci on the project's Node major (installed into the cache when the machine's is older).
  PATH="$(bash "$here/node.sh"):$PATH"
  local stamp="node_modules/.flashsale-deps" sum
  # patches/ is applied by npm ci's postinstall (patch-package): a changed patch reinstalls too.
  sum="$(cat package.json package-lock.json patches/* | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then return 0; fi
  # npm install keeps node_modules/.package-lock.json newer than the lock file.
  if [ -f node_modules/.package-lock.json ] && [ node_modules/.package-lock.json -nt package-lock.json ] \
    && [ node_modules/.package-lock.json -nt package.json ] && [ -z "$(find patches -newer node_modules/.package-lock.json)" ]; then
    echo "$sum" >"$stamp"
    return 0
  fi
  log "npm ci"
  npm ci --no-audit --no-fund --loglevel=error >&2
  echo "$sum" >"$stamp"
}

servers() {
  bash "$here/fetch-kafka.sh" >/dev/null
  bash "$here/build-kube.sh" all >/dev/null
  bash "$here/build-kube.sh" helm >/dev/null
}

case "${1:-all}" in
  system) system ;;
  node) node_modules ;;
  servers) servers ;;
  all) system && node_modules && servers ;;
  *) die "usage: deps.sh [system|node|servers|all]" ;;
esac
