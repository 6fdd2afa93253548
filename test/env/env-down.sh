#!/usr/bin/env bash
# Stops every server env-up.sh started in STATE_DIR and removes its throwaway data.
# Servers given through the environment (DATABASE_URL, ...) are never touched.
# Safe to call at any time, also while env-up.sh is still starting servers, and more than once.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="${1:-${FLASHSALE_STATE:-/tmp/flashsale-env}}"
state="${state%/}"
[ -n "$state" ] && [ "$state" != / ] || die "refusing to stop state dir '$state'"
[ -d "$state" ] || { log "nothing to stop in $state"; exit 0; }

# This script and its callers (make, sh -c, run.sh) may mention the state dir on their command
# line: never signal them.
ancestors=" "
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  ancestors+="$p "
  p="$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)"
done
# Processes whose command line names the state dir (as an argument or a path inside it):
# env-up.sh and start-*.sh still running, and every server (redis shows its config path in its
# process title).
state_re="$(printf '%s' "$state" | sed 's/[][\.*^$+?(){}|]/\\&/g')(/| |$)"
by_state() {
  local pid
  for pid in $(pgrep -f -- "$state_re"); do
    case "$ancestors" in *" $pid "*) continue ;; esac
    [ "$pid" = "$BASHPID" ] || echo "$pid"
  done
}
signal() { [ $# -gt 1 ] && kill "$@" 2>/dev/null; return 0; }

# 1. Starters first, so that none launches a server after the sweep below.
starters=()
for pid in $(by_state); do
  case "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" in
    *env-up.sh* | *start-*.sh*) starters+=("$pid") ;;
  esac
done
signal -KILL "${starters[@]}"

# 2. Servers from their pid files. Throwaway data: no clean shutdown needed. PostgreSQL gets
# SIGQUIT (immediate shutdown; SIGTERM would wait for clients to disconnect), Kafka SIGKILL (its
# controlled shutdown takes seconds), the others SIGTERM.
pids=()
for f in "$state"/*.pid; do
  [ -f "$f" ] || continue
  pid="$(head -1 "$f")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || continue
  pids+=("$pid")
  case "$(basename "$f")" in
    postgres.pid) signal -QUIT "$pid" ;;
    kafka*.pid) signal -KILL "$pid" ;;
    *) signal -TERM "$pid" ;;
  esac
done
# Anything else still running from the state dir (a server whose pid file was not written yet).
strays=()
for pid in $(by_state); do
  case " ${pids[*]} " in *" $pid "*) ;; *) strays+=("$pid") ;; esac
done
signal -TERM "${strays[@]}"
all=("${pids[@]}" "${strays[@]}")
alive=()
for _ in $(seq 1 50); do
  alive=()
  for p in "${all[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
  [ ${#alive[@]} -eq 0 ] && break
  sleep 0.1
done
signal -KILL "${alive[@]}"
# 3. Sweep: children a server may have forked (postgres backends die with their postmaster).
signal -KILL $(by_state)
rm -rf "$state"
log "stopped ${#all[@]} server process(es); removed $state"
