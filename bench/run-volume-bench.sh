#!/usr/bin/env bash
# Run the volume service benchmark (bench/volume_bench.py).
#
# Usage: bench/run-volume-bench.sh [--quick] [--repeat 3] [--runtime 10] [--only compaction|throughput|big] [--compact-rate 32M]
#                                  [--volumes 500] [--snap-volume-gib 50] [--long]
#                                  [--cluster-size 64k] [--extended-l2 on|off] [--no-qemu] [--iodepth 16]
#                                  [--daemon-arg=ARG ...]
#
# --long adds a snapshot every 30 s (65 s runs) next to its own anchor.
# The throughput runs alternate with the same runs against QEMU's block
# layer (qemu-storage-daemon, external snapshots over QMP); --no-qemu skips it.
#
# STRATA_BIN overrides the binary. Needs fio with its nbd engine, qemu-img and
# qemu-storage-daemon (qemu-utils; `scripts/test.sh`, as root, installs them) and target/release/strata (`cargo build --release`).
# Results go to bench/out/volume-bench-<timestamp>.{md,json}, the markdown
# also to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
for t in fio qemu-img qemu-storage-daemon; do
  command -v "$t" >/dev/null || { echo "run-volume-bench: $t not found (run scripts/test.sh)" >&2; exit 1; }
done
exec python3 bench/volume_bench.py "$@"
