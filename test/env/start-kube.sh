#!/usr/bin/env bash
# Starts etcd and kube-apiserver (RBAC on) on free loopback ports, with a generated CA, serving
# certificate, admin client certificate and kubeconfig, then the control plane around it
# (start-control-plane.sh: controller-manager, scheduler, kwok). Binaries come from KUBEBUILDER_ASSETS
# when set, otherwise they are built from Go modules by build-kube.sh (cached).
# Usage: start-kube.sh STATE_DIR   (writes STATE_DIR/kube.env, etcd.pid, kube-apiserver.pid)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then bin="$KUBEBUILDER_ASSETS"; else bin="$(bash "$here/build-kube.sh" all)"; fi
for b in etcd kube-apiserver; do [ -x "$bin/$b" ] || die "$bin/$b is missing"; done
kubectl="$bin/kubectl"
[ -x "$kubectl" ] || kubectl="$(command -v kubectl || true)"

dir="$state/kube"
certs="$dir/certs"
mkdir -p "$certs" "$dir/etcd"
(
  cd "$certs"
  ossl() { openssl "$@" >/dev/null 2>&1; }
  # One CA signs the serving certificate and the client certificates.
  ossl req -x509 -newkey rsa:2048 -nodes -days 365 -keyout ca.key -out ca.crt -subj "/CN=flashsale-test-ca"
  cat >san.cnf <<CNF
[req]
distinguished_name=dn
[dn]
[ext]
subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default
extendedKeyUsage=serverAuth
CNF
  ossl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
  ossl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile san.cnf -extensions ext -out apiserver.crt
  printf '[ext]\nextendedKeyUsage=clientAuth\n' >client.cnf
  ossl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/CN=admin/O=system:masters"
  ossl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -extfile client.cnf -extensions ext -out admin.crt
  ossl genrsa -out sa.key 2048
  ossl rsa -in sa.key -pubout -out sa.pub
)

etcd_port="$(free_port)"; peer_port="$(free_port)"; secure_port="$(free_port)"
nohup "$bin/etcd" --data-dir "$dir/etcd" --name flashsale-test \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "flashsale-test=http://127.0.0.1:$peer_port" \
  --unsafe-no-fsync --log-level error >"$state/etcd.log" 2>&1 &
echo $! >"$state/etcd.pid"
wait_up "etcd" 30 "$(cat "$state/etcd.pid")" "$state/etcd.log" curl -fsS "http://127.0.0.1:$etcd_port/health"

nohup "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" --cert-dir "$certs" \
  --tls-cert-file "$certs/apiserver.crt" --tls-private-key-file "$certs/apiserver.key" \
  --secure-port "$secure_port" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
  --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
  --disable-admission-plugins ServiceAccount --authorization-mode RBAC \
  --service-account-issuer "https://127.0.0.1:$secure_port/" \
  --service-account-key-file "$certs/sa.pub" --service-account-signing-key-file "$certs/sa.key" \
  --client-ca-file "$certs/ca.crt" --endpoint-reconciler-type none --v=0 \
  >"$state/kube-apiserver.log" 2>&1 &
echo $! >"$state/kube-apiserver.pid"
wait_up "kube-apiserver" 90 "$(cat "$state/kube-apiserver.pid")" "$state/kube-apiserver.log" curl -fsS --cacert "$certs/ca.crt" --cert "$certs/admin.crt" --key "$certs/admin.key" \
  "https://127.0.0.1:$secure_port/readyz"

kubeconfig="$dir/kubeconfig"
cat >"$kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
  - name: flashsale-test
    cluster:
      server: https://127.0.0.1:$secure_port
      certificate-authority: $certs/ca.crt
users:
  - name: admin
    user:
      client-certificate: $certs/admin.crt
      client-key: $certs/admin.key
contexts:
  - name: flashsale-test
    context: { cluster: flashsale-test, user: admin, namespace: default }
current-context: flashsale-test
YAML
# The default namespace is created by a controller that runs inside the apiserver; wait for it.
wait_for "default namespace" 30 curl -fsS --cacert "$certs/ca.crt" --cert "$certs/admin.crt" \
  --key "$certs/admin.key" "https://127.0.0.1:$secure_port/api/v1/namespaces/default"
cat >"$state/kube.env" <<ENV
KUBECONFIG=$kubeconfig
KUBE_BIN=$bin
KUBECTL=$kubectl
KUBE_API=https://127.0.0.1:$secure_port
ENV
log "kube-apiserver ready on 127.0.0.1:$secure_port"
# The controllers, the scheduler and kwok's fake kubelet (FLASHSALE_CONTROL_PLANE=0: the API
# server alone, as before; nothing then rolls Deployments out or collects garbage).
if [ "${FLASHSALE_CONTROL_PLANE:-1}" != 0 ]; then bash "$here/start-control-plane.sh" "$state"; fi
