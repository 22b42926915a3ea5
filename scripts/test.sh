#!/usr/bin/env bash
# Installs every test dependency (as root, through apt-get) and runs all tests.
# This is the README's second Quick start command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for tool in qemu-img:qemu-utils qemu-io:qemu-utils; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing ${need[*]}: run this script as root so it can apt-get install them" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi

echo "== tool versions"
qemu-img --version | head -1
cargo --version

echo "== format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== tests"
# Release mode: the chain tests build and read 1,000-layer chains.
cargo test --workspace --release
