#!/usr/bin/env bash
# Run the volume service benchmark (bench/volume_bench.py).
#
# Usage: bench/run-volume-bench.sh [--quick] [--repeat 3] [--runtime 10] [--only compaction|throughput|big] [--compact-rate 32M]
#                                  [--volumes 500] [--snap-volume-gib 50] [--long]
#                                  [--cluster-size 64k] [--extended-l2 on|off]
#
# --long adds a snapshot every 30 s (65 s runs) next to its own anchor.
#
# STRATA_BIN overrides the binary. Needs fio with its nbd engine and qemu-img (`sudo scripts/test.sh`
# installs them) and target/release/strata (`cargo build --release`).
# Results go to bench/out/volume-bench-<timestamp>.{md,json}, the markdown
# also to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
for t in fio qemu-img; do
  command -v "$t" >/dev/null || { echo "run-volume-bench: $t not found (run scripts/test.sh)" >&2; exit 1; }
done
exec python3 bench/volume_bench.py "$@"
