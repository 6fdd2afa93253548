#!/usr/bin/env bash
# Builds dockerfile-check (main.go beside this file) against a pinned BuildKit into the project's
# cache; prints the binary's path. Idempotent: a second run with the same sources is a no-op.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../../../env/lib.sh
. "$here/../../../env/lib.sh"

BUILDKIT_VERSION="${BUILDKIT_VERSION:-v0.34.2}"
sum="$(sha256sum "$here/main.go" | cut -c1-12)"
bin="$FLASHSALE_CACHE/bin/dockerfile-check-$BUILDKIT_VERSION-$sum/dockerfile-check"

build() {
  if [ -x "$bin" ]; then return 0; fi
  local mod="$FLASHSALE_CACHE/src/dockerfile-check-$BUILDKIT_VERSION"
  mkdir -p "$mod" "$(dirname "$bin")"
  cp "$here/main.go" "$mod/main.go"
  cd "$mod"
  printf 'module flashsale.local/dockerfilecheck\n\ngo 1.24\n' >go.mod
  log "building dockerfile-check with BuildKit $BUILDKIT_VERSION"
  go get "github.com/moby/buildkit@$BUILDKIT_VERSION" >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1
  go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .
  mv "$bin.tmp" "$bin"
}

with_lock dockerfile-check build
echo "$bin"
