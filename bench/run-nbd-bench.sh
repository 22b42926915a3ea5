#!/usr/bin/env bash
# Run the strata serve vs qemu-nbd NBD benchmark (bench/nbd_bench.py).
#
# Usage: bench/run-nbd-bench.sh [--quick] [--chains 1,100,500,1000] [--repeat 3]
#                               [--runtime 10] [--servers qemu,strata] [--no-physical] [-v]
#
# --quick: chains 1 and 100, 3 s runs, one repeat (a few minutes).
#
# Needs qemu-nbd and qemu-img (qemu-utils), fio with its nbd engine (fio),
# nbdcopy (libnbd-bin) and nbdkit (nbdkit): `scripts/test.sh`, as root, installs
# them all.  Uses target/release/strata (build it first with
# `cargo build --release`); without a `serve` subcommand there it measures
# qemu-nbd alone.  Chains are generated once under bench/out/chains/ and only
# read; results go to bench/out/nbd-bench-<timestamp>.{md,json} and the
# markdown also to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
for t in qemu-nbd:qemu-utils qemu-img:qemu-utils fio:fio nbdcopy:libnbd-bin nbdkit:nbdkit; do
  command -v "${t%%:*}" >/dev/null || { echo "run-nbd-bench: ${t%%:*} not found (apt-get install ${t##*:})" >&2; exit 1; }
done
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "run-nbd-bench: this fio has no nbd engine" >&2; exit 1; }
exec python3 bench/nbd_bench.py "$@"
