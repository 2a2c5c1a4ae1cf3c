#!/usr/bin/env bash
# The demo: installs the dependencies, builds, starts localkube, installs the CRDs, runs the
# operator, applies a sample 3×1 ValkeyCluster, waits for Ready and prints how to connect.
#
# Usage: bash hack/demo.sh [DIR]   (DIR defaults to /tmp/valkey-demo; needs root)
# Re-running it while the demo runs reuses it; a stopped demo's DIR is wiped and started afresh.
# Stop:  kill the PIDs printed at the end, then `target/debug/localkube down --dir DIR`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(realpath -m "${1:-/tmp/valkey-demo}")"
cd "$ROOT"

echo "==> installing dependencies"
# Every step but the tests' object stores (seaweedfs, fakegcs, azurite: minutes to build).
bin_line=$(bash hack/install-deps.sh apt valkey9 etcd exporter helm kube | tail -n 1)
BIN=${bin_line#BIN_DIR=}
export LOCALKUBE_BIN_DIR="$BIN"
export PATH="$BIN:$HOME/.cargo/bin:$PATH"

echo "==> building"
cargo build -p localkube -p valkey-operator
LOCALKUBE="$ROOT/target/debug/localkube"
OPERATOR="$ROOT/target/debug/valkey-operator"

mkdir -p "$DIR"
if [[ -f "$DIR/localkube.pid" ]] && kill -0 "$(cat "$DIR/localkube.pid")" 2>/dev/null; then
  echo "==> localkube already running in $DIR"
else
  # A stopped demo's state is stale: its pods had no persistence, so starting localkube
  # on the old etcd would bring back a cluster whose every node lost its data at once.
  # Start from an empty directory, but only wipe one that a localkube run owns.
  "$LOCALKUBE" down --dir "$DIR" >/dev/null 2>&1 || true
  if [[ -n "$(ls -A "$DIR")" ]]; then
    if grep -q " $DIR/" /proc/self/mounts; then
      echo "$DIR still has mounts after 'localkube down'; unmount them first" >&2
      exit 1
    elif [[ -e "$DIR/localkube.pid" || -e "$DIR/kubeconfig" || -e "$DIR/kubelet" ]]; then
      echo "==> removing the stopped demo's state in $DIR"
      rm -rf "${DIR:?}"/*
    else
      echo "$DIR is not empty and not a localkube directory; pick another: bash hack/demo.sh DIR" >&2
      exit 1
    fi
  fi
  echo "==> starting localkube in $DIR (log: $DIR/localkube.log)"
  nohup "$LOCALKUBE" up --dir "$DIR" >"$DIR/localkube.log" 2>&1 &
  echo $! >"$DIR/localkube.pid"
fi
for _ in $(seq 1 300); do
  [[ -f "$DIR/ready" ]] && break
  if ! kill -0 "$(cat "$DIR/localkube.pid")" 2>/dev/null; then
    echo "localkube exited; see $DIR/localkube.log" >&2
    tail -n 30 "$DIR/localkube.log" >&2
    exit 1
  fi
  sleep 1
done
[[ -f "$DIR/ready" ]] || { echo "localkube not ready after 300 s" >&2; exit 1; }
export KUBECONFIG="$DIR/kubeconfig"

echo "==> installing CRDs"
"$OPERATOR" crd | kubectl apply --server-side -f -
kubectl wait --for condition=Established --timeout=60s \
  crd/valkeyclusters.valkey.io crd/valkeynodes.valkey.io

if [[ -f "$DIR/operator.pid" ]] && kill -0 "$(cat "$DIR/operator.pid")" 2>/dev/null; then
  kill "$(cat "$DIR/operator.pid")" || true
  sleep 1
fi
echo "==> starting the operator (log: $DIR/operator.log)"
nohup "$OPERATOR" run --metrics-address 127.0.0.1:8080 >"$DIR/operator.log" 2>&1 &
echo $! >"$DIR/operator.pid"

echo "==> applying deploy/examples/valkeycluster-3x1.yaml"
START=$(date +%s)
kubectl apply -f deploy/examples/valkeycluster-3x1.yaml

echo "==> waiting for the ValkeyCluster to be Ready"
for _ in $(seq 1 600); do
  STATE=$(kubectl get valkeycluster demo -o jsonpath='{.status.state}' 2>/dev/null || true)
  [[ "$STATE" == "Ready" ]] && break
  sleep 1
done
if [[ "$STATE" != "Ready" ]]; then
  echo "not Ready after 600 s (state: ${STATE:-none}); operator log: $DIR/operator.log" >&2
  kubectl get valkeycluster demo -o yaml >&2 || true
  exit 1
fi
echo "==> Ready after $(( $(date +%s) - START )) s"

kubectl get valkeycluster,valkeynode,pods -o wide

IP=$(kubectl get pods -l valkey.io/cluster=demo -o jsonpath='{.items[0].status.podIP}')
PASS=$(kubectl get secret demo-app-password -o jsonpath='{.data.password}' | base64 -d)
cat <<MSG

Connect with a cluster-aware client (from this machine, pods are reachable at their IPs):

  export KUBECONFIG=$DIR/kubeconfig
  valkey-cli -c -h $IP -p 6379 --user app --pass '$PASS'

Operator: PID $(cat "$DIR/operator.pid"), log $DIR/operator.log, metrics http://127.0.0.1:8080/metrics
localkube: PID $(cat "$DIR/localkube.pid"), log $DIR/localkube.log
Stop: kill $(cat "$DIR/operator.pid") $(cat "$DIR/localkube.pid"); $LOCALKUBE down --dir $DIR
MSG
