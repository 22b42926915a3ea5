#!/usr/bin/env bash
# Generate a qcow2 backing chain of N layers for the virtual-disk benchmarks.
#
# Usage: bench/gen-chain.sh N DIR [--size 1G] [--cluster-size 64k] [--jobs 2]
#
# Writes DIR/layer-0001.qcow2 (base) .. DIR/layer-NNNN.qcow2 (top) and
# DIR/expected.raw (sparse raw image of the exact guest content), and prints
# the top layer's path last.  Reuses DIR if it already holds the same chain.
# The content layout is documented in bench/gen_chain.py.
set -euo pipefail
exec python3 "$(dirname "$0")/gen_chain.py" "$@"
