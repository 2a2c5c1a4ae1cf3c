#!/usr/bin/env bash
# The whole test suite: installs what it needs (idempotent, cached), then
# build, rustfmt, clippy and every test, printing the time of each phase.
# Tests that need root (network namespaces, mounts) are part of it; run as root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

T0=$(date +%s)
phase_start=$T0
phase() { # phase NAME
  local now; now=$(date +%s)
  [ -n "${PHASE:-}" ] && echo "=== phase '$PHASE' took $(( now - phase_start ))s" >&2
  PHASE=$1; phase_start=$now
  [ -n "$PHASE" ] && echo "=== phase '$PHASE'" >&2
  return 0
}

phase "install dependencies"
# Every step: seaweedfs, fakegcs and azurite (the object stores of valkey-testkit's S3Server,
# GcsServer and AzuriteServer) included.
bin_line=$(bash hack/install-deps.sh | tail -n 1)
export LOCALKUBE_BIN_DIR=${bin_line#BIN_DIR=}
export PATH="$LOCALKUBE_BIN_DIR:$PATH"

export CARGO_TERM_COLOR=never
phase "build"
cargo build --workspace --all-targets --locked

phase "rustfmt"
cargo fmt --all --check

phase "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

phase "tests"
# The output is kept so that a failure's reasons can be repeated at the end, where a
# truncated CI log still shows them.
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
set +e
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$test_log"
test_rc=${PIPESTATUS[0]}
set -e
if [ "$test_rc" -ne 0 ]; then
  echo "=== failure digest: the lines that say why, repeated from above" >&2
  grep -E -A 12 '^(FAILED |Error: |thread .* panicked at)' "$test_log" \
    | grep -v -E '^\[[^]]+ [+0-9.]+s\] ' | head -n 300 >&2
  grep -E '^test .* FAILED$|^error: ' "$test_log" >&2
  exit "$test_rc"
fi

phase ""
echo "=== total $(( $(date +%s) - T0 ))s" >&2
