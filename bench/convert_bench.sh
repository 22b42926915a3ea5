#!/usr/bin/env bash
# `strata img convert` against `qemu-img convert`, side by side, warm cache.
#
# Builds (in a temporary directory under /tmp, removed at the end):
#   src.qcow2    4 GiB, 64 KiB clusters, ~50% allocated: 1 MiB written every
#                2 MiB over the upper 3.5 GiB, and one 64 KiB cluster every
#                128 KiB over the first 512 MiB (scattered small extents)
#   chain: base.qcow2 <- mid.qcow2 <- top.qcow2, 4 GiB each: base has 1 MiB
#                every 4 MiB, mid 2 MiB at 1 MiB every 8 MiB, top 1 MiB every
#                16 MiB; together 50% of the disk, with overlaps the top wins
#   src.raw      src.qcow2 as a sparse raw file (qemu-img convert)
# and times, for each case, both tools writing the same target path with
# their default cache modes (neither syncs the target, see below):
#   qcow2 -> raw, qcow2 -> qcow2, 3-layer chain -> raw, raw -> qcow2
# Each run starts after `sync`, so no run pays for the previous one's
# writeback. It checks that both outputs compare equal to the source, prints each case's
# median times, the ratio strata/qemu-img and the allocated size (du) of
# both raw outputs.
#
# Usage: bench/convert_bench.sh [STRATA_BINARY] [RUNS]
#   STRATA_BINARY defaults to $CARGO_TARGET_DIR/release/strata, else
#   target/release/strata. RUNS defaults to 5. Needs qemu-img, qemu-io,
#   hyperfine (falls back to an alternating loop of RUNS runs without it).
# Peak temporary data: about 8.5 GiB in /tmp.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
strata=${1:-${CARGO_TARGET_DIR:-$here/target}/release/strata}
runs=${2:-5}
[ -x "$strata" ] || { echo "no strata binary at $strata: build it with cargo build --release -p strata" >&2; exit 2; }
command -v qemu-img >/dev/null || { echo "qemu-img not found (apt-get install qemu-utils)" >&2; exit 2; }

# CONVERT_BENCH_DIR=DIR keeps the images in DIR between runs (for iterating).
if [ -n "${CONVERT_BENCH_DIR:-}" ]; then
    work=$CONVERT_BENCH_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d /tmp/convert-bench.XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi
cd "$work"

mib=$((1 << 20))
gib=$((1 << 30))

# One qemu-io run per image, all writes on stdin.
write_image() { # image, then "offset length pattern" lines on stdin
    { while read -r off len pat; do echo "write -q -P $pat $off $len"; done; } |
        qemu-io -f qcow2 "$1" >/dev/null
}

if [ ! -e "$work/ready" ]; then
qemu-img create -q -f qcow2 src.qcow2 4G
{
    for ((off = 0; off < 512 * mib; off += 128 * 1024)); do
        echo "$off 65536 $(((off / 65536) % 250 + 1))"
    done
    for ((off = 512 * mib; off < 4 * gib; off += 2 * mib)); do
        echo "$off $mib $(((off / mib) % 250 + 1))"
    done
} | write_image src.qcow2

qemu-img create -q -f qcow2 base.qcow2 4G
{ for ((off = 0; off < 4 * gib; off += 4 * mib)); do echo "$off $mib 17"; done; } |
    write_image base.qcow2
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2
{ for ((off = mib; off < 4 * gib; off += 8 * mib)); do echo "$off $((2 * mib)) 34"; done; } |
    write_image mid.qcow2
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2
{ for ((off = 0; off < 4 * gib; off += 16 * mib)); do echo "$off $mib 51"; done; } |
    write_image top.qcow2
qemu-img convert -f qcow2 -O raw src.qcow2 src.raw
touch "$work/ready"
fi
# Warm the cache.
cat src.qcow2 base.qcow2 mid.qcow2 top.qcow2 src.raw >/dev/null

declare -a rows
run_case() { # name, source, source format, out format
    local name=$1 src=$2 sfmt=$3 fmt=$4 out=$work/out.$4
    local q="qemu-img convert -f $sfmt -O $fmt $src $out"
    local s="$strata img convert -f $sfmt -O $fmt $src $out"
    local qmed smed
    if command -v hyperfine >/dev/null; then
        hyperfine -N -w 1 -r "$runs" -p "sh -c 'rm -f $out; sync'" --export-json "$work/times.json" \
            -n qemu-img "$q" -n strata "$s" >&2
        qmed=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['results'][0]['median'])" "$work/times.json")
        smed=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['results'][1]['median'])" "$work/times.json")
    else
        local qs=() ss=()
        for ((i = 0; i < runs; i++)); do
            rm -f "$out"; sync; qs+=("$( { /usr/bin/time -f %e $q >/dev/null; } 2>&1)")
            rm -f "$out"; sync; ss+=("$( { /usr/bin/time -f %e $s >/dev/null; } 2>&1)")
        done
        qmed=$(printf '%s\n' "${qs[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
        smed=$(printf '%s\n' "${ss[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
    fi
    # Check both outputs and their allocated size.
    rm -f "$out"; $q; qemu-img compare -q -f "$sfmt" -F "$fmt" "$src" "$out"; local qdu; qdu=$(du -k "$out" | cut -f1)
    rm -f "$out"; $s; qemu-img compare -q -f "$sfmt" -F "$fmt" "$src" "$out"; local sdu; sdu=$(du -k "$out" | cut -f1)
    rm -f "$out"
    rows+=("$(printf '| %-27s | %8.3f | %8.3f | %5.2f | %8d | %8d |' "$name" "$qmed" "$smed" \
        "$(python3 -c "print($smed/$qmed)")" $((qdu / 1024)) $((sdu / 1024)))")
}

run_case "qcow2 -> raw" src.qcow2 qcow2 raw
run_case "qcow2 -> qcow2" src.qcow2 qcow2 qcow2
run_case "chain(3) -> raw" top.qcow2 qcow2 raw
run_case "raw -> qcow2" src.raw raw qcow2
# Cache modes: qemu-img's default for the output is "unsafe" (it never
# syncs); so is strata's (`strata_disk::convert::ConvertOptions::flush`
# off): both write every byte and the clean header, and neither waits for
# the disk.

echo "strata: $strata; $(qemu-img --version | head -1); runs: $runs"
echo "| case                        | qemu-img s | strata s | ratio | qemu du MiB | strata du MiB |"
echo "|-----------------------------|-----------:|---------:|------:|------------:|--------------:|"
printf '%s\n' "${rows[@]}"
