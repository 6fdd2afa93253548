#!/usr/bin/env bash
# Builds promtool (Prometheus' rule checker and rule unit-test runner) from its Go module into the
# cache, like build-kube.sh does for kube-apiserver and helm. Idempotent: a second run is a no-op.
# Prints the path of the binary. Used by test/integration/chart/alert-rules.test.ts.
#   PROMETHEUS_VERSION (Go module version, v0.3MM.P = Prometheus v3.MM.P) overrides the pin.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
bin="$FLASHSALE_CACHE/bin/promtool-$PROMETHEUS_VERSION"

build_promtool() {
  if [ -x "$bin/promtool" ]; then return 0; fi
  mkdir -p "$bin"
  local mod="$FLASHSALE_CACHE/src/promtool-$PROMETHEUS_VERSION"
  mkdir -p "$mod"
  cd "$mod"
  # A wrapper module rather than `go install …@version`: that refuses modules whose go.mod has
  # replace or exclude directives, which Prometheus' has had in several releases.
  cat >go.mod <<MOD
module flashsale.local/promtoolbuild

go 1.24
MOD
  cat >tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
GO
  log "resolving github.com/prometheus/prometheus $PROMETHEUS_VERSION"
  go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1 || true
  log "building promtool $PROMETHEUS_VERSION (a few minutes on 2 cores)"
  # remove_all_sd (Prometheus >= 3.10) leaves out the bundled service-discovery providers (cloud
  # SDKs): rule checking and rule unit tests do not need them, and they are most of the build.
  go build -trimpath -tags remove_all_sd -ldflags "-s -w" -o "$bin/promtool.tmp" \
    github.com/prometheus/prometheus/cmd/promtool
  mv "$bin/promtool.tmp" "$bin/promtool"
}

case "${1:-build}" in
  build) with_lock promtool build_promtool ;;
  path) ;;
  *) die "usage: build-promtool.sh [build|path]" ;;
esac
echo "$bin/promtool"
