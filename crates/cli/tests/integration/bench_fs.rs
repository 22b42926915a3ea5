//! `strata bench` with the operations that check data and the volumes
//! that carry file systems: compaction on Strata and QEMU,
//! restore-and-verify that fails on damaged data and passes otherwise
//! (fio's verify over NBD, fsck of ext4, pgbench's balances), volumes
//! attached through nbdfuse and a loop device, pgbench's series, bad
//! specs refused with their line, and nothing left after Ctrl-C.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{at, p, strata, tmp};

/// Two fio writers with verify (filled at setup for the restores); a
/// vandal overwrites 1 MiB of volume 0 through NBD before its snapshot.
/// Volume 1 gets snapshots, two of which are deleted (`DROPS`) so that
/// a compaction has layers to merge. A restore before any snapshot, one
/// of the damaged volume's snapshot and one of the healthy volume's.
const RESTORE_SPEC: &str = "\
duration: 4s
volumes:
  - {name: data, count: 2, size: 32M}
workloads:
  - name: writer
    count: 2
    volumes: data
    fio: {rw: randwrite, bs: 4k, size: 8M, iodepth: 4, rate_iops: 200, verify: crc32c}
  - name: vandal
    volumes: data
    command: [qemu-io, -f, raw, -c, 'write -P 0x55 1M 1M', '{uri}']
control_operations:
  - {name: too-early, action: restore_and_verify, workload: writer, rate: t02}
  - {name: snap-damaged, action: snapshot, workload: writer, select: oldest, rate: t12}
  - {name: snap-good, action: snapshot, workload: writer, select: newest, rate: t16}
  - {name: snap-more, action: snapshot, workload: writer, select: newest, rate: twice}
DROPS  - {name: compact, action: compact, workload: writer, select: newest, rate: t25}
  - {name: verify-damaged, action: restore_and_verify, workload: writer, select: oldest, rate: t3}
  - {name: verify-good, action: restore_and_verify, workload: writer, select: newest, rate: t3}
rates:
  - {name: t02, trace: [0.2]}
  - {name: t12, trace: [1.2]}
  - {name: t16, trace: [1.6]}
  - {name: twice, trace: [1.7, 1.8]}
  - {name: twice-later, trace: [2.0, 2.1]}
  - {name: t25, trace: [2.5]}
  - {name: t3, trace: [3.2]}
";

const DROPS: &str =
    "  - {name: drop, action: delete_snapshot, workload: writer, select: newest, rate: twice-later}\n";

/// pgbench on ext4 with a snapshot and its restore (fsck, then
/// PostgreSQL on the clone and pgbench's balances); fio in a file system;
/// and a vandal that writes a note through the mount point, then
/// overwrites the file system's first 2 MiB through NBD before its
/// snapshot, whose restore must fail fsck.
const FS_SPEC: &str = "\
duration: 6s
volumes:
  - {name: db, count: 1, size: 256M, attach: fs}
  - {name: files, count: 1, size: 64M, attach: fs}
workloads:
  - name: bank
    volumes: db
    pgbench: {scale: 1, clients: 2}
  - name: vandal
    volumes: files
    command: [sh, -c, 'echo hi > {mount}/note && sync && qemu-io -f raw -c \"write -P 0x55 0 2M\" {uri}']
  - name: filer
    volumes: files
    fio: {rw: randwrite, bs: 4k, size: 8M, runtime: 2}
control_operations:
  - {name: snap-files, action: snapshot, workload: vandal, rate: t1}
  - {name: check-files, action: restore_and_verify, workload: vandal, rate: t2}
  - {name: snap-db, action: snapshot, workload: bank, rate: t3}
  - {name: check-db, action: restore_and_verify, workload: bank, rate: t4}
rates:
  - {name: t1, trace: [1.5]}
  - {name: t2, trace: [2.5]}
  - {name: t3, trace: [3]}
  - {name: t4, trace: [4]}
";

/// The records of a run directory, one JSON value per line.
fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("records.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a record is JSON"))
        .collect()
}

/// The records of one operation.
fn of<'a>(records: &'a [Value], operation: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["operation"] == operation)
        .collect()
}

/// The one record of `operation`, which must have `status`.
fn only<'a>(records: &'a [Value], operation: &str, status: &str) -> &'a Value {
    let found = of(records, operation);
    assert_eq!(found.len(), 1, "{operation}: {found:?}");
    assert_eq!(found[0]["status"], status, "{operation}: {}", found[0]);
    found[0]
}

/// Runs `spec` on `provider`; the run exits 1 (some operations are meant
/// to fail); its directory and records.
fn run_failing(spec: &str, provider: &str) -> (tempfile::TempDir, std::path::PathBuf, Vec<Value>) {
    let dir = tmp();
    let file = at(&dir, "spec.yaml");
    std::fs::write(&file, spec).unwrap();
    let out = at(&dir, "run");
    let result = strata(&[
        "bench",
        "run",
        &p(&file),
        "--out",
        &p(&out),
        "--seed",
        "5",
        "--provider",
        provider,
    ]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed"), "{stderr}");
    let records = records(&out);
    (dir, out, records)
}

/// What the restores of `RESTORE_SPEC` recorded, on either provider.
fn assert_restores(records: &[Value]) {
    let early = only(records, "too-early", "error");
    assert!(
        early["error"]
            .as_str()
            .unwrap()
            .contains("no snapshot of group `data` to restore yet"),
        "{early}"
    );
    let damaged = only(records, "verify-damaged", "error");
    let error = damaged["error"].as_str().unwrap();
    assert!(
        error.contains("fio's verify failed") && error.contains("bad magic header"),
        "{damaged}"
    );
    let good = only(records, "verify-good", "ok");
    assert_eq!(good["detail"]["check"], "fio verify", "{good}");
    for restore in [damaged, good] {
        for stage in ["created", "attached", "checked", "deleted"] {
            assert!(restore["stages"][stage].is_number(), "{stage}: {restore}");
        }
    }
    // Both volumes were filled for fio's verify before the workloads began.
    let fills = records
        .iter()
        .filter(|r| r["action"] == "fill" && r["status"] == "ok");
    assert_eq!(fills.count(), 2, "{records:?}");
    // The clones were deleted with the run's volumes: the cleanup found
    // only the two it made at setup.
    let cleanup = of(records, "cleanup");
    assert_eq!(cleanup.len(), 2, "{cleanup:?}");
    assert!(cleanup.iter().all(|r| r["status"] == "ok"), "{cleanup:?}");
}

/// On Strata's daemon: a compaction merges the two deleted snapshots'
/// layers; a restore of the damaged volume's snapshot fails fio's verify
/// at the damaged offset, the healthy one's passes, and one before any
/// snapshot is a failed operation.
#[test]
fn restore_and_verify_fails_on_damaged_data_passes_otherwise_and_compact_merges_on_strata() {
    let spec = RESTORE_SPEC.replacen("DROPS", DROPS, 1);
    let (_dir, _out, records) = run_failing(&spec, "strata");
    assert_restores(&records);
    let compact = only(&records, "compact", "ok");
    assert_eq!(compact["detail"]["layers_removed"], 1, "{compact}");
    assert!(compact["stages"]["accepted"].is_number(), "{compact}");
    assert_eq!(of(&records, "drop").len(), 2);
    let failed: Vec<&Value> = records.iter().filter(|r| r["status"] == "error").collect();
    assert_eq!(
        failed.len(),
        2,
        "only the two restores meant to fail: {failed:?}"
    );
}

/// On QEMU: the compaction is a block-stream of the volume's chain into
/// its top (the layers below it closed), waited for; the restores behave
/// as on Strata.
#[test]
fn restore_and_verify_and_compact_on_qemu() {
    let spec = RESTORE_SPEC.replacen("DROPS", "", 1);
    let (_dir, out, records) = run_failing(&spec, "qemu");
    assert_restores(&records);
    let compact = only(&records, "compact", "ok");
    // Its chain: the base, the first snapshot's overlay and the second's
    // under the top.
    assert_eq!(compact["detail"]["layers_removed"], 3, "{compact}");
    assert_eq!(compact["detail"]["bytes_copied"], 32 << 20, "{compact}");
    let layers = std::fs::read_dir(out.join("qemu")).unwrap().count();
    assert_eq!(layers, 0, "layer files or the QMP socket left");
}

/// On the null provider, which keeps no data, restores are skipped with
/// the reason and compactions succeed at once; a restore before any
/// snapshot is still a failed operation.
#[test]
fn the_null_provider_skips_restores_and_compacts_at_once() {
    let spec = RESTORE_SPEC.replacen("DROPS", DROPS, 1);
    let (_dir, _out, records) = run_failing(&spec, "null");
    only(&records, "too-early", "error");
    for name in ["verify-damaged", "verify-good"] {
        let restore = only(&records, name, "skipped");
        assert!(
            restore["error"]
                .as_str()
                .unwrap()
                .contains("keeps no data to check"),
            "{restore}"
        );
    }
    only(&records, "compact", "ok");
    assert!(records.iter().all(|r| r["action"] != "fill"), "{records:?}");
}

/// What of a run is still attached on this host: mounts, loop devices
/// backed by its files, processes (nbdfuse, PostgreSQL) naming it.
fn attached_leftovers(run_id: &str) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(run_id))
        .map(|l| format!("mount {l}"))
        .collect();
    let loops = Command::new("losetup")
        .args([
            "--list",
            "--noheadings",
            "--raw",
            "--output",
            "NAME,BACK-FILE",
        ])
        .output()
        .unwrap();
    left.extend(
        String::from_utf8_lossy(&loops.stdout)
            .lines()
            .filter(|l| l.contains(run_id))
            .map(|l| format!("loop device {l}")),
    );
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(run_id) {
            left.push(format!(
                "process {}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    if Path::new("/tmp/strata-bench").join(run_id).exists() {
        left.push(format!("directory /tmp/strata-bench/{run_id}"));
    }
    left
}

fn run_id(out: &Path) -> String {
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    info["run_id"].as_str().unwrap().to_string()
}

/// File systems on volumes: ext4 made and mounted at setup (stages),
/// pgbench's transactions as the one-second series and its figures in
/// its record, fio writing in the mount, a restore of pgbench's volume
/// that passes fsck and pgbench's balances, and one of a volume whose
/// file system was overwritten that fails fsck. Nothing stays attached.
#[test]
fn file_systems_carry_pgbench_and_fio_and_their_restores_are_checked() {
    let (_dir, out, records) = run_failing(FS_SPEC, "strata");
    for record in records
        .iter()
        .filter(|r| r["operation"] == "setup" && r["action"] == "create")
    {
        assert_eq!(record["status"], "ok", "{record}");
        for stage in ["created", "attached", "formatted", "mounted"] {
            assert!(record["stages"][stage].is_number(), "{stage}: {record}");
        }
    }
    let init = records
        .iter()
        .find(|r| r["action"] == "pgbench_init")
        .unwrap();
    assert_eq!(init["status"], "ok", "{init}");
    let bank = only(&records, "bank", "ok");
    assert!(bank["detail"]["tps"].as_f64().unwrap() > 0.0, "{bank}");
    assert_eq!(bank["detail"]["failed"], 0.0, "{bank}");
    let io = std::fs::read_to_string(out.join("io.jsonl")).unwrap();
    let seconds: Vec<Value> = io
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|s| s["workload"] == "bank")
        .collect();
    assert!(seconds.len() >= 4, "{io}");
    let busy = seconds
        .iter()
        .filter(|s| s["transactions"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(busy.count() >= 3, "{io}");
    only(&records, "filer", "ok");
    assert!(out.join("workloads/filer-0.fio.json").exists());
    only(&records, "vandal", "ok");
    let db = only(&records, "check-db", "ok");
    assert_eq!(db["detail"]["check"], "fsck, pgbench balances", "{db}");
    assert!(db["detail"]["history_rows"].as_u64().unwrap() > 0, "{db}");
    let files = only(&records, "check-files", "error");
    // Its superblock is gone: the journal cannot even be found.
    let error = files["error"].as_str().unwrap();
    assert!(
        error.contains("e2fsck could not replay the journal") && error.contains("super"),
        "{files}"
    );
    let detaches = records
        .iter()
        .filter(|r| r["action"] == "detach" && r["status"] == "ok");
    assert_eq!(detaches.count(), 2, "{records:?}");
    let left = attached_leftovers(&run_id(&out));
    assert!(left.is_empty(), "{left:?}");
}

/// Specs whose workloads cannot use their volumes as attached, or whose
/// restores have nothing to check by, are refused with the line and the
/// fix, and nothing starts.
#[test]
fn bad_file_system_and_restore_specs_are_refused_with_their_line() {
    let restore = RESTORE_SPEC.replacen("DROPS", "", 1);
    let cases = [
        (
            FS_SPEC.replacen("size: 256M, attach: fs}", "size: 256M}", 1),
            "- name: bank",
            "pgbench needs a file system: add `attach: fs` to volume group `db`",
        ),
        (
            FS_SPEC.replacen("bs: 4k, size: 8M, runtime: 2", "bs: 4k, runtime: 2", 1),
            "- name: filer",
            "writes a file and needs its size: add `size:`",
        ),
        (
            restore.replacen("rate_iops: 200,", "rate_iops: 200, directory: /tmp,", 1),
            "- name: writer",
            "fio option `directory` needs a mounted file system, and volume group `data` is reached over NBD: add `attach: fs`",
        ),
        (
            restore.replacen(", verify: crc32c", "", 1),
            "name: too-early",
            "with nothing to check them by: name a fio workload that writes with `verify: crc32c`",
        ),
    ];
    let dir = tmp();
    for (text, line_with, hint) in cases {
        let line = text.lines().position(|l| l.contains(line_with)).unwrap() + 1;
        crate::bench::assert_refused_at_line(&dir, &text, line, hint);
    }
}

/// Ctrl-C while pgbench runs on a mounted file system: the run stops
/// PostgreSQL, unmounts, detaches the loop device and stops nbdfuse
/// before it deletes the volume; nothing of it is left on the host.
#[test]
fn cleanup_after_sigint_leaves_no_mount_loop_device_or_nbdfuse() {
    let dir = tmp();
    let spec = at(&dir, "spec.yaml");
    let text = "duration: 60s\nvolumes:\n  - {name: db, count: 1, size: 256M, attach: fs}\n\
                workloads:\n  - {name: bank, volumes: db, pgbench: {scale: 1, clients: 1}}\n";
    std::fs::write(&spec, text).unwrap();
    let out = at(&dir, "run");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", "run", &p(&spec), "--out", &p(&out)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata bench run");
    // Wait until pgbench runs: its first second is in the series.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(out.join("records.jsonl"))
        .unwrap_or_default()
        .contains("pgbench_init")
    {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL not set up within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let run_id = run_id(&out);
    assert!(
        attached_leftovers(&run_id).len() >= 3,
        "a mount, a loop device and nbdfuse while it runs: {:?}",
        attached_leftovers(&run_id)
    );
    crate::bench::interrupt(&mut bench);
    let left = attached_leftovers(&run_id);
    assert!(left.is_empty(), "{left:?}");
    let records = records(&out);
    let cleanup = of(&records, "cleanup");
    let actions: Vec<&Value> = cleanup.iter().map(|r| &r["action"]).collect();
    assert_eq!(actions, ["detach", "delete"], "{cleanup:?}");
    assert!(cleanup.iter().all(|r| r["status"] == "ok"), "{cleanup:?}");
}

/// A run killed outright (SIGKILL: no cleanup of its own) while pgbench
/// writes on a mounted volume of the QEMU provider: `strata bench clean`
/// stops PostgreSQL, unmounts, detaches the loop device and ends nbdfuse.
#[test]
fn clean_after_a_kill_leaves_no_mount_loop_device_or_nbdfuse() {
    let dir = tmp();
    let spec = at(&dir, "spec.yaml");
    let text = "duration: 60s\nvolumes:\n  - {name: db, count: 1, size: 256M, attach: fs}\n\
                workloads:\n  - {name: bank, volumes: db, pgbench: {scale: 1, clients: 1}}\n";
    std::fs::write(&spec, text).unwrap();
    let out = at(&dir, "run");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "run",
            &p(&spec),
            "--out",
            &p(&out),
            "--provider",
            "qemu",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strata bench run");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(out.join("records.jsonl"))
        .unwrap_or_default()
        .contains("pgbench_init")
    {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL not set up within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    bench.kill().unwrap();
    bench.wait().unwrap();
    let run_id = run_id(&out);
    let before = attached_leftovers(&run_id);
    assert!(
        before.len() >= 3,
        "the kill left its file system: {before:?}"
    );
    let result = strata(&["bench", "clean", &p(&out)]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(0), "{stderr}");
    let left = attached_leftovers(&run_id);
    // qemu-storage-daemon, which the killed run started in a process group
    // of its own, still serves; it is this test's to stop.
    let qemu = out.join("qemu").display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&qemu) {
            if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() {
                // SAFETY: signalling the daemon the run this test started made.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    assert!(left.is_empty(), "{left:?}");
}
