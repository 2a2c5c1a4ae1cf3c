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
cargo test --workspace --locked --no-fail-fast

phase ""
echo "=== total $(( $(date +%s) - T0 ))s" >&2
