#!/usr/bin/env bash
# Builds kube-apiserver, kubectl, etcd and helm from their Go modules into the cache
# (what envtest would download as prebuilt binaries), and the control plane around the API server:
# kube-controller-manager and kube-scheduler from the same k8s.io/kubernetes version, and kwok
# (fake Nodes and Pods without a kubelet). Idempotent: a second run is a no-op.
# Prints the directory holding the binaries (usable as KUBEBUILDER_ASSETS).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

bin="$FLASHSALE_CACHE/bin/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$bin"

# The binaries of k8s.io/kubernetes that the tests run, each built only when missing, all from one
# wrapper module: the controller-manager and the scheduler reuse the API server's compiled packages.
kube_cmds=(kube-apiserver kubectl kube-controller-manager kube-scheduler)

build_kubernetes() {
  local missing=() c
  for c in "${kube_cmds[@]}"; do [ -x "$bin/$c" ] || missing+=("$c"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  local mod="$FLASHSALE_CACHE/src/kubernetes-$KUBE_VERSION"
  mkdir -p "$mod"
  cd "$mod"
  # k8s.io/kubernetes replaces its staging modules with ./staging paths; a wrapper module
  # pins each of them to the published version instead, before tidy resolves anything.
  cat >go.mod <<EOF
module flashsale.local/kubebuild

go 1.24
EOF
  local staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
    cloud-provider cluster-bootstrap code-generator component-base component-helpers
    controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
    endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
    kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission sample-apiserver
    sample-cli-plugin sample-controller)
  for m in "${staging[@]}"; do
    go mod edit "-replace=k8s.io/$m=k8s.io/$m@$KUBE_STAGING_VERSION"
  done
  go mod edit "-require=k8s.io/kubernetes@$KUBE_VERSION"
  cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
  log "resolving k8s.io/kubernetes $KUBE_VERSION modules"
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
  local pkg=k8s.io/component-base/version
  local ldflags
  ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
  for c in "${missing[@]}"; do
    log "building $c $KUBE_VERSION (minutes on 2 cores; shares compiled packages with the others)"
    go build -trimpath -ldflags "$ldflags" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$bin/$c.tmp" "$bin/$c"
  done
}

# kwok's controller plays the kubelet: it keeps fake Nodes Ready and moves the Pods bound to them
# to Running and Ready. Built with the k8s.io libraries kwok itself requires (v0.7.0 uses an
# apimachinery API that 0.34 removed; kwok talks to older and newer API servers alike).
build_kwok() {
  if [ -x "$bin/kwok" ]; then return 0; fi
  local mod="$FLASHSALE_CACHE/src/kwok-$KWOK_VERSION"
  mkdir -p "$mod"
  cd "$mod"
  cat >go.mod <<EOF
module flashsale.local/kwokbuild

go 1.24
EOF
  cat >tools.go <<'EOF'
//go:build tools

package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
EOF
  go mod edit "-require=sigs.k8s.io/kwok@$KWOK_VERSION"
  log "resolving sigs.k8s.io/kwok $KWOK_VERSION"
  go mod tidy -e >/dev/null 2>&1 || true
  log "building kwok $KWOK_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$bin/kwok.tmp" "$bin/kwok"
}

build_etcd() {
  if [ -x "$bin/etcd" ]; then return 0; fi
  local mod="$FLASHSALE_CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  cd "$mod"
  # `go install go.etcd.io/etcd/v3` fails on etcd's replace directives; calling etcdmain works.
  cat >go.mod <<EOF
module flashsale.local/etcdbuild

go 1.24
EOF
  cat >main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
  go mod tidy >/dev/null
  log "building etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" .
  mv "$bin/etcd.tmp" "$bin/etcd"
}

build_helm() {
  local hbin="$FLASHSALE_CACHE/bin/helm-$HELM_VERSION"
  if [ -x "$hbin/helm" ]; then return 0; fi
  mkdir -p "$hbin"
  log "building helm $HELM_VERSION"
  GOBIN="$hbin" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

what="${1:-all}"
case "$what" in
  path) ;; # only print where the binaries are (or will be)
  kube) with_lock kubernetes build_kubernetes ;;
  etcd) with_lock etcd build_etcd ;;
  control-plane)
    with_lock kubernetes build_kubernetes
    with_lock kwok build_kwok
    ;;
  helm)
    with_lock helm build_helm
    echo "$FLASHSALE_CACHE/bin/helm-$HELM_VERSION"
    exit 0
    ;;
  all)
    with_lock etcd build_etcd
    with_lock kubernetes build_kubernetes
    with_lock kwok build_kwok
    ;;
  *) die "usage: build-kube.sh [all|kube|etcd|control-plane|helm|path]" ;;
esac
echo "$bin"
