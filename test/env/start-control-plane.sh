#!/usr/bin/env bash
# Starts the control plane around the API server that start-kube.sh started: kube-controller-manager
# (the controllers the tests rely on: Deployments, ReplicaSets, garbage collection, namespace
# deletion, PodDisruptionBudget status), kube-scheduler, and kwok in place of a kubelet (one fake
# Node; the Pods bound to it become Running and Ready without any container). Deployments then
# roll out to Pods that become Ready, and deleting an owner garbage-collects its dependents.
# Binaries: KUBEBUILDER_ASSETS when it holds them, otherwise build-kube.sh control-plane (cached).
# Usage: start-control-plane.sh STATE_DIR   (needs STATE_DIR/kube.env; appends to it; writes
# kube-controller-manager.pid, kube-scheduler.pid, kwok.pid and their logs)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"
[ -f "$state/kube.env" ] || die "$state/kube.env is missing: start-kube.sh first"
# shellcheck disable=SC1091
. "$state/kube.env"

bin=""
if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-controller-manager" ] \
  && [ -x "$KUBEBUILDER_ASSETS/kube-scheduler" ] && [ -x "$KUBEBUILDER_ASSETS/kwok" ]; then
  bin="$KUBEBUILDER_ASSETS"
else
  bin="$(bash "$here/build-kube.sh" control-plane)"
fi
for b in kube-controller-manager kube-scheduler kwok; do [ -x "$bin/$b" ] || die "$bin/$b is missing"; done

dir="$state/kube"
mkdir -p "$dir/controller-manager" "$dir/scheduler"
# The controllers the tests need, and no more (each costs CPU on a shared machine). No
# serviceaccount-token controller: tests get tokens through the TokenRequest API.
controllers="deployment-controller,replicaset-controller,garbage-collector-controller"
controllers+=",namespace-controller,disruption-controller,pod-garbage-collector-controller"
kcm_port="$(free_port)"
nohup "$bin/kube-controller-manager" --kubeconfig "$KUBECONFIG" --leader-elect=false \
  --controllers "$controllers" --bind-address 127.0.0.1 --secure-port "$kcm_port" \
  --cert-dir "$dir/controller-manager" --concurrent-gc-syncs 5 --v=1 \
  >"$state/kube-controller-manager.log" 2>&1 &
echo $! >"$state/kube-controller-manager.pid"

sched_port="$(free_port)"
nohup "$bin/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port "$sched_port" --cert-dir "$dir/scheduler" --v=1 \
  >"$state/kube-scheduler.log" 2>&1 &
echo $! >"$state/kube-scheduler.pid"

# kwok manages only the Nodes annotated as fake (the default stages: Nodes kept Ready with a
# heartbeat, Pods Running and Ready once bound, deleted Pods removed at once).
kwok_port="$(free_port)"
nohup "$bin/kwok" --kubeconfig "$KUBECONFIG" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --cidr 10.244.0.0/16 --node-ip 127.0.0.1 --server-address "127.0.0.1:$kwok_port" \
  >"$state/kwok.log" 2>&1 &
echo $! >"$state/kwok.pid"

health() { curl -fsSk "https://127.0.0.1:$1/healthz"; }
wait_up "kube-controller-manager" 60 "$(cat "$state/kube-controller-manager.pid")" \
  "$state/kube-controller-manager.log" health "$kcm_port"
wait_up "kube-scheduler" 60 "$(cat "$state/kube-scheduler.pid")" "$state/kube-scheduler.log" \
  health "$sched_port"
wait_up "kwok" 60 "$(cat "$state/kwok.pid")" "$state/kwok.log" \
  curl -fsS "http://127.0.0.1:$kwok_port/healthz"

node="kwok-node-0"
"$KUBECTL" --kubeconfig "$KUBECONFIG" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $node
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $node
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: { cpu: "64", memory: 256Gi, pods: "1000" }
  capacity: { cpu: "64", memory: 256Gi, pods: "1000" }
YAML
node_ready() {
  "$KUBECTL" --kubeconfig "$KUBECONFIG" get node "$node" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}
wait_up "kwok node $node" 60 "$(cat "$state/kwok.pid")" "$state/kwok.log" node_ready
# The API server taints every new Node not-ready (TaintNodesByCondition); the node lifecycle
# controller, which would lift it once the Node is Ready, is not run (it only evicts and taints).
"$KUBECTL" --kubeconfig "$KUBECONFIG" patch node "$node" --type merge -p '{"spec":{"taints":null}}' >/dev/null

cat >>"$state/kube.env" <<ENV
KUBE_CONTROL_PLANE=kube-controller-manager,kube-scheduler,kwok
KWOK_NODE=$node
ENV
log "control plane ready: kube-controller-manager :$kcm_port, kube-scheduler :$sched_port, kwok :$kwok_port, node $node"
