#!/usr/bin/env bash
# Installs every test dependency (as root, through apt-get) and runs all tests.
# This is the README's second Quick start command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# The NBD tests (crates/cli/tests/integration/nbd.rs) and bench/nbd_bench.py also need
# libnbd's nbdinfo and nbdcopy, its Python module (python3-libnbd, which
# ships nbdsh), fio (whose Debian build has the nbd engine) and nbdkit (the
# benchmark's `nbdkit memory` reference). The volume tests read what the
# page cache holds of a layer file with util-linux's fincore. The NBD TLS
# tests (crates/cli/tests/integration/nbd_tls.rs) make their certificates with openssl;
# img convert's cache-mode test counts syncs with strace. The S3 gateway's
# tests (crates/cli/tests/integration/s3.rs, s3_clients.rs) use aws-cli, boto3, rclone and
# s3fs (which mounts through /dev/fuse and unmounts with umount). `strata
# bench`'s tests (crates/cli/tests/integration/bench.rs) run fio's nbd and
# null engines, and qemu-storage-daemon for the QEMU provider; its HTML
# report is rendered and screenshot in headless Chromium. Its file-system
# volumes (crates/cli/tests/integration/bench_fs.rs) are served as files by
# nbdfuse, put on loop devices with losetup (package mount), formatted and
# checked with e2fsprogs, and carry PostgreSQL (initdb, pg_ctl, psql and
# pgbench from the postgresql package, run as nobody through runuser).
# F3's tests (crates/cli/tests/integration/f3.rs) mount through /dev/fuse as
# root with the mount system call (fuser's own, no fusermount3 or libfuse
# needed) and unmount with umount -l.
for tool in qemu-img:qemu-utils qemu-io:qemu-utils qemu-nbd:qemu-utils qemu-storage-daemon:qemu-utils \
  nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdsh:python3-libnbd fio:fio nbdkit:nbdkit \
  fincore:util-linux-extra openssl:openssl strace:strace aws:awscli \
  rclone:rclone s3fs:s3fs chromium:chromium nbdfuse:nbdfuse losetup:mount \
  mkfs.ext4:e2fsprogs e2fsck:e2fsprogs runuser:util-linux; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
python3 -c "import boto3" 2>/dev/null || need+=(python3-boto3)
# boto3 computes CRC-32C only through the AWS CRT, which Debian packages
# for its own Python: the CRC-32C test (s3_checksums.rs) runs /usr/bin/python3.
/usr/bin/python3 -c "import boto3, awscrt" 2>/dev/null || need+=(python3-boto3 python3-awscrt)
# Debian keeps PostgreSQL's server programs out of PATH, one directory per
# major version (crates/bench/src/pgbench.rs finds the newest).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# NBD TLS with pre-shared keys links OpenSSL (crates/nbd/src/tls.rs).
pkg-config --exists openssl 2>/dev/null || need+=(pkg-config libssl-dev)
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
# scripts/cargo-checked: release optimizations, since the chain tests
# build and read 1,000-layer chains, with debug assertions and overflow
# checks on in the workspace's crates, so every invariant the code asserts
# runs in the tests; the dependencies are the README build's, not
# compiled again.
had_release=no
[ -x target/release/strata ] && had_release=yes
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
# Into a file, not a pipe: a process a failed test left running would
# hold a pipe open and keep this script waiting forever.
# Three test threads on two cores: the tests mostly wait on the processes
# they start (the integration binary used 55% of one core over its run).
# --no-fail-fast: a failing binary does not hide the results of the others.
scripts/cargo-checked test --workspace --no-fail-fast -- --test-threads 3 >"$log" 2>&1 &
tests=$!
tail -n +1 -f --pid="$tests" "$log"
wait "$tests"
status=$?
set -e
# Whatever a failed test left running from this checkout goes too.
pkill -f "^$PWD/target/release/strata " || true
# target/release/strata back to the README's build when there was one
# (still compiled: a link, not a build), not the suite's with its
# assertions, which benchmarks would otherwise measure.
if [ "$had_release" = yes ]; then
  cargo build --release --quiet || true
fi
# Each failed test's own output again, its start and its end (where
# the panic message is), so that the run's last lines say what failed
# and why even when only the end of a long log is read.
awk '/^---- .* stdout ----$/ { name = $2; failed[++n] = name; count[name] = 0; next }
     /^failures:$/ && n > 0 { name = "" }
     name != "" { lines[name, ++count[name]] = $0 }
     END { for (i = 1; i <= n; i++) { name = failed[i]; c = count[name]
             printf "\n== failed: %s (its output, the middle left out)\n", name
             for (j = 1; j <= c; j++) {
               if (j == 16 && c > 60) { print "[...]"; j = c - 40; continue }
               print substr(lines[name, j], 1, 2000) } } }' "$log"
# One closing line for the whole run (cargo's own last line is a doc-test
# summary of whichever crate came last).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
