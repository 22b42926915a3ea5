#!/usr/bin/env bash
# Run the Strata vs QEMU backing-chain benchmark (bench/img_bench.py).
#
# Usage: bench/run-img-bench.sh [--quick] [--chains 1,50,100,500,1000] [--repeat 3]
#                               [--no-strata] [--rand-count N] [--no-big] [-v]
#
# --quick: chains 1 and 1000, one run each (a few minutes, most of it
# generating the 1,000-layer chain on first use).
#
# Needs qemu-img (Debian: qemu-utils) and GNU time (Debian: time) for clean
# peak-RSS figures; uses target/release/strata when it exists (build it first
# with `cargo build --release`), otherwise measures QEMU alone.
# Chains are generated once under bench/out/chains/ and reused; results go to
# bench/out/img-bench-<timestamp>.{md,json} and the markdown also to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v qemu-img >/dev/null || { echo "run-img-bench: qemu-img not found (apt-get install qemu-utils)" >&2; exit 1; }
[ -x /usr/bin/time ] || echo "run-img-bench: /usr/bin/time missing (apt-get install time): peak RSS will include python's own" >&2
exec python3 bench/img_bench.py "$@"
