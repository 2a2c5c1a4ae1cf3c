#!/usr/bin/env bash
# Regenerates one wrapper module's go.mod and go.sum for a new version (a developer
# step, not part of the install: commit the result). The go command verifies what
# it adds to go.sum against the checksum database here, once; installs afterwards
# only compare downloads with the committed go.sum.
#
#   bash hack/gomod/update.sh kubernetes v1.37.2
#   bash hack/gomod/update.sh etcd v3.6.7
#   bash hack/gomod/update.sh redis-exporter v1.62.0
#   bash hack/gomod/update.sh helm v4.3.2
#   bash hack/gomod/update.sh seaweedfs v0.0.0-20261109003541-7506e5f91cd6
#   bash hack/gomod/update.sh fake-gcs-server v1.56.1
#
# The npm package (Azurite) is pinned by hack/npm/azurite/package-lock.json: change the version
# in its package.json, then `npm install --package-lock-only --ignore-scripts` there (its
# .npmrc keeps registry addresses out of the lockfile).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=${1:?wrapper: kubernetes, etcd, redis-exporter, helm, seaweedfs or fake-gcs-server}
version=${2:?version}
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
cd "$HERE/$name"
case "$name" in
  kubernetes)
    # k8s.io/kubernetes replaces its staging modules with local directories; the
    # wrapper replaces each one listed in its go.mod with the published v0.x release.
    rm -f go.sum
    printf 'module valkey-operator-build/kubernetes\n\ngo 1.26\n' > go.mod
    kmod=$(go mod download -json "k8s.io/kubernetes@$version" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit(d.get("Error")))')
    python3 "$HERE/kube-wrapper-gomod.py" "$kmod" "$version" "v0.${version#v1.}" > go.mod
    printf '\ntool (\n\tk8s.io/kubernetes/cmd/kube-apiserver\n\tk8s.io/kubernetes/cmd/kube-controller-manager\n\tk8s.io/kubernetes/cmd/kube-scheduler\n\tk8s.io/kubernetes/cmd/kubectl\n)\n' >> go.mod
    ;;
  etcd)
    rm -f go.sum; printf 'module valkey-operator-build/etcd\n\ngo 1.26\n' > go.mod
    go get "go.etcd.io/etcd/server/v3@$version"
    ;;
  redis-exporter)
    rm -f go.sum; printf 'module valkey-operator-build/redis-exporter\n\ngo 1.26\n' > go.mod
    go get -tool "github.com/oliver006/redis_exporter@$version"
    ;;
  helm)
    # The major version is part of the module path (helm.sh/helm/v4 for v4.x).
    rm -f go.sum; printf 'module valkey-operator-build/helm\n\ngo 1.26\n' > go.mod
    go get -tool "helm.sh/helm/${version%%.*}/cmd/helm@$version"
    ;;
  seaweedfs)
    # SeaweedFS's release tags (e.g. 4.05) are not Go module versions: the version is
    # a pseudo-version naming one commit. Only the `weed` command is built (the tests'
    # S3 server).
    rm -f go.sum; printf 'module valkey-operator-build/seaweedfs\n\ngo 1.26\n' > go.mod
    go get -tool "github.com/seaweedfs/seaweedfs/weed@$version"
    ;;
  fake-gcs-server)
    rm -f go.sum; printf 'module valkey-operator-build/fake-gcs-server\n\ngo 1.26\n' > go.mod
    go get -tool "github.com/fsouza/fake-gcs-server@$version"
    ;;
  *) echo "unknown wrapper '$name'" >&2; exit 2 ;;
esac
go mod tidy
echo "updated hack/gomod/$name (go.mod, go.sum); commit both"
