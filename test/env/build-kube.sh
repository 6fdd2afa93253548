#!/usr/bin/env bash
# Builds kube-apiserver, kubectl, etcd and helm from their Go modules into the cache
# (what envtest would download as prebuilt binaries). Idempotent: a second run is a no-op.
# Prints the directory holding the binaries (usable as KUBEBUILDER_ASSETS).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

bin="$FLASHSALE_CACHE/bin/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$bin"

build_kubernetes() {
  if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kubectl" ]; then return 0; fi
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
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
  log "resolving k8s.io/kubernetes $KUBE_VERSION modules"
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
  local pkg=k8s.io/component-base/version
  local ldflags
  ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
  log "building kube-apiserver and kubectl $KUBE_VERSION (several minutes on 2 cores)"
  go build -trimpath -ldflags "$ldflags" -o "$bin/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  go build -trimpath -ldflags "$ldflags" -o "$bin/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl
  mv "$bin/kube-apiserver.tmp" "$bin/kube-apiserver"
  mv "$bin/kubectl.tmp" "$bin/kubectl"
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
  helm)
    with_lock helm build_helm
    echo "$FLASHSALE_CACHE/bin/helm-$HELM_VERSION"
    exit 0
    ;;
  all)
    with_lock etcd build_etcd
    with_lock kubernetes build_kubernetes
    ;;
  *) die "usage: build-kube.sh [all|kube|etcd|helm|path]" ;;
esac
echo "$bin"
