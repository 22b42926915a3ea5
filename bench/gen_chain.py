#!/usr/bin/env python3
"""Generate a qcow2 backing chain for the virtual-disk benchmarks.

Usage:
    bench/gen-chain.sh N DIR [--size 1G] [--cluster-size 64k] [--jobs 2]
    python3 bench/gen_chain.py N DIR [--size 1G] [--cluster-size 64k] [--jobs 2]

Creates DIR/layer-0001.qcow2 (base) ... DIR/layer-NNNN.qcow2 (top), each
layer backed by the previous one through a *relative* file name, plus
DIR/expected.raw, a sparse raw file holding exactly the guest content the
chain must read as.  The path of the top layer is printed last on stdout.

Content layout (C = disk size / cluster size clusters, layers numbered 1..N):
  * cluster c with c % 10 == 9 is never written (reads as zeros; 10% of the disk);
  * every other cluster c is written in layer (c % N) + 1 with the byte
    pattern(c, layer) over the whole cluster;
  * if c % 7 == 0 and that layer is not the base, c is ALSO written earlier,
    in a lower layer (1 to 254 layers below, see stale_layer()), with that
    layer's different pattern byte.  A reader that does not let the newest
    layer win returns the stale byte.
pattern(c, layer) = 1 + (7*c + 13*layer) % 255 is never 0, differs between
neighbouring clusters, and differs between two layers less than 255 apart,
so reading the wrong cluster or the wrong layer is visible in a compare.

How it stays fast at N=1000: every layer is built STANDALONE (qemu-img create
without a backing file, one qemu-io fed all of the layer's writes on stdin),
and only then attached with `qemu-img rebase -u -b <previous, relative>
-F qcow2`, which does not open the chain.  Layers are built in parallel
(--jobs, default: number of cores).  Opening the chain per layer would cost
O(N^2).

A stamp file DIR/chain.stamp records the parameters; when it matches and all
layers exist, generation is skipped (the benchmark reuses chains).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

GENERATOR_VERSION = 1  # bump when the content layout changes
STAMP_NAME = "chain.stamp"


def parse_size(text):
    """'1G', '64k', '65536' -> bytes (binary suffixes, like qemu-img)."""
    text = text.strip()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    suffix = text[-1:].lower()
    if suffix in units:
        return int(text[:-1]) * units[suffix]
    return int(text)


def layer_name(layer):
    return "layer-%04d.qcow2" % layer


def pattern(cluster, layer):
    return 1 + (7 * cluster + 13 * layer) % 255


def stale_layer(cluster, newest):
    """Lower layer holding the stale copy of a c % 7 == 0 cluster, or None.

    Spread over the (up to 254) layers below the newest one; staying less
    than 255 layers below keeps pattern(c, stale) != pattern(c, newest).
    """
    if newest == 1:
        return None
    depth = 1 + (cluster // 7) % min(newest - 1, 254)
    return newest - depth


def plan_writes(n_layers, n_clusters):
    """Return ({layer: [(cluster, byte), ...]}, {cluster: final byte})."""
    writes = {layer: [] for layer in range(1, n_layers + 1)}
    final = {}
    for c in range(n_clusters):
        if c % 10 == 9:
            continue
        newest = c % n_layers + 1
        writes[newest].append((c, pattern(c, newest)))
        final[c] = pattern(c, newest)
        if c % 7 == 0:
            stale = stale_layer(c, newest)
            if stale is not None:
                writes[stale].append((c, pattern(c, stale)))
    return writes, final


def run(cmd, stdin_text=None):
    result = subprocess.run(cmd, input=stdin_text, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("gen_chain: command failed (%d): %s\n%s%s" % (
            result.returncode, " ".join(cmd), result.stdout[-2000:], result.stderr[-2000:]))
    return result.stdout


def build_layer(directory, layer, layer_writes, size, cluster_size):
    """Create one layer standalone, write its clusters, attach it to layer-1."""
    path = os.path.join(directory, layer_name(layer))
    run(["qemu-img", "create", "-q", "-f", "qcow2",
         "-o", "cluster_size=%d" % cluster_size, path, str(size)])
    if layer_writes:
        commands = "".join("write -P %d %d %d\n" % (byte, c * cluster_size, cluster_size)
                           for c, byte in layer_writes)
        out = run(["qemu-io", "-f", "qcow2", path], stdin_text=commands)
        done = out.count("wrote %d/%d bytes" % (cluster_size, cluster_size))
        if done != len(layer_writes):
            sys.exit("gen_chain: %s: only %d of %d writes succeeded:\n%s"
                     % (path, done, len(layer_writes), out[-2000:]))
    if layer > 1:
        run(["qemu-img", "rebase", "-u", "-b", layer_name(layer - 1), "-F", "qcow2", path])


def write_expected(path, size, cluster_size, final):
    """Sparse raw image: written clusters filled with their final byte, holes elsewhere."""
    with open(path, "wb") as f:
        f.truncate(size)
        for c in sorted(final):
            f.seek(c * cluster_size)
            f.write(bytes([final[c]]) * cluster_size)


def chain_is_complete(directory, stamp):
    try:
        with open(os.path.join(directory, STAMP_NAME)) as f:
            if json.load(f) != stamp:
                return False
    except (OSError, ValueError):
        return False
    names = [layer_name(i) for i in range(1, stamp["layers"] + 1)] + ["expected.raw"]
    return all(os.path.exists(os.path.join(directory, n)) for n in names)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layers", type=int, help="number of layers N (>= 1)")
    ap.add_argument("dir", help="output directory")
    ap.add_argument("--size", default="1G", help="virtual disk size (default 1G)")
    ap.add_argument("--cluster-size", default="64k", help="qcow2 cluster size (default 64k)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                    help="layers built in parallel (default: cores)")
    args = ap.parse_args()

    n, size, cluster_size = args.layers, parse_size(args.size), parse_size(args.cluster_size)
    if n < 1 or n > 9999 or size % cluster_size:
        sys.exit("gen_chain: need 1 <= N <= 9999 and size a multiple of the cluster size")
    directory = args.dir
    top = os.path.join(directory, layer_name(n))
    stamp = {"generator": GENERATOR_VERSION, "layers": n, "size": size,
             "cluster_size": cluster_size}

    if chain_is_complete(directory, stamp):
        print("gen_chain: %s already holds this chain, reusing it" % directory, file=sys.stderr)
        print(top)
        return

    os.makedirs(directory, exist_ok=True)
    # Stale chain (other parameters or interrupted run): start from scratch.
    for name in os.listdir(directory):
        if name == STAMP_NAME or name == "expected.raw" or (
                name.startswith("layer-") and name.endswith(".qcow2")):
            os.unlink(os.path.join(directory, name))

    start = time.monotonic()
    writes, final = plan_writes(n, size // cluster_size)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        jobs = [pool.submit(build_layer, directory, layer, writes[layer], size, cluster_size)
                for layer in range(1, n + 1)]
        for job in jobs:
            job.result()  # re-raises SystemExit from a failed layer
    layers_done = time.monotonic()
    write_expected(os.path.join(directory, "expected.raw"), size, cluster_size, final)

    with open(os.path.join(directory, STAMP_NAME), "w") as f:
        json.dump(stamp, f)
        f.write("\n")
    print("gen_chain: %d layers in %.1f s, expected.raw in %.1f s (%s)" % (
        n, layers_done - start, time.monotonic() - layers_done, directory), file=sys.stderr)
    print(top)


if __name__ == "__main__":
    main()
