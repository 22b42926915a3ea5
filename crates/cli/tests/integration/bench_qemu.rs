//! `strata bench` on the QEMU provider: the spec of the other providers
//! under external snapshots and clones, snapshot deletes that shorten the
//! chain (seen with `qemu-img info --backing-chain`), grows seen over NBD,
//! a grow refused while a workload's NBD client is attached, and a
//! snapshot delete that streams the layer up after a restore.

use std::process::Command;

use serde_json::Value;

use crate::bench::{
    assert_daemon_usage_was_scraped, assert_summary_counts_records, count, records, tally,
    SMALL_SPEC,
};
use crate::common::{at, p, strata, tmp};

/// QEMU as the anchor on the same spec: fio verifies its data under
/// external snapshots and clones; grows are refused with the reason (its
/// NBD export does not share resize), so the run exits 1; nothing is left.
/// The run directory is given relative to the working directory.
#[test]
fn the_qemu_provider_runs_the_same_spec() {
    let dir = tmp();
    let spec = at(&dir, "spec.yaml");
    // QEMU grows a volume by re-exporting it, which needs it to have no
    // NBD client: the grows go to a volume no workload uses. The snapshot
    // delete comes before the first clone, which would pin the layers
    // (see the next test for that refusal).
    let text = SMALL_SPEC
        .replacen(
            "  - {name: copies, count: 0, size: 64M}\n",
            "  - {name: copies, count: 0, size: 64M}\n  - {name: spare, count: 1, size: 16M}\n",
            1,
        )
        .replacen(
            "  - {name: grows, action: resize, workload: writer, size: +16M, rate: second}\n",
            "  - {name: grows, action: resize, volumes: spare, size: +16M, rate: second}\n  \
             - {name: snapshot-deletes, action: delete_snapshot, workload: writer, select: oldest, rate: before-clones}\n",
            1,
        )
        .replacen(
            "  - {name: second, every: 1s}\n",
            "  - {name: second, every: 1s}\n  - {name: before-clones, trace: [0.8]}\n",
            1,
        );
    assert!(text.contains("volumes: spare, size: +16M") && text.contains("trace: [0.8]"));
    std::fs::write(&spec, text).unwrap();
    let out = at(&dir, "run");
    // A relative run directory: the overlays must still find their
    // backing files.
    let result = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "run",
            "spec.yaml",
            "--out",
            "run",
            "--provider",
            "qemu",
        ])
        .current_dir(dir.path())
        .output()
        .expect("run strata bench");
    let stderr = String::from_utf8_lossy(&result.stderr);
    let records = records(&out);
    let counts = tally(&records);
    let failed: Vec<&Value> = records.iter().filter(|r| r["status"] == "error").collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(result.status.code(), Some(0), "{stderr}");
    assert_eq!(count(&counts, "writer", "ok"), 2, "{counts:?}");
    assert_eq!(count(&counts, "checker", "ok"), 1, "{counts:?}");
    assert!(count(&counts, "snapshots", "ok") >= 4, "{counts:?}");
    assert!(count(&counts, "clones", "ok") >= 1, "{counts:?}");
    assert!(count(&counts, "snapshot-deletes", "ok") >= 1, "{counts:?}");
    assert!(count(&counts, "grows", "ok") >= 2, "{counts:?}");
    assert!(count(&counts, "attaches", "ok") >= 4, "{counts:?}");
    for record in records
        .iter()
        .filter(|r| r["operation"] == "snapshot-deletes" && r["status"] == "ok")
    {
        let merge = &record["detail"]["merge"];
        assert!(
            merge == "block-commit" || merge == "block-stream",
            "{record}"
        );
    }
    assert_summary_counts_records(&out, &records);
    // qemu-storage-daemon has no metrics of its own, but its CPU time and
    // memory are read as Strata's daemon's are.
    assert_daemon_usage_was_scraped(&out);
    assert!(count(&counts, "cleanup", "ok") >= 4, "{counts:?}");
    let layers = std::fs::read_dir(out.join("qemu")).unwrap().count();
    assert_eq!(layers, 0, "layer files or the QMP socket left");
}

/// On QEMU, four snapshots of a volume then two snapshot deletes leave a
/// chain of three layers, and a grown volume's NBD export shows its new
/// size: seen from outside, by `qemu-img info --backing-chain` on the
/// layer files and by nbdinfo on the export, while the run is on.
#[test]
fn on_qemu_snapshot_deletes_shorten_the_chain_and_grows_show_over_nbd() {
    let dir = tmp();
    let base = p(dir.path());
    let spec = format!(
        "\
duration: 3s
volumes:
  - {{name: chain, count: 1, size: 16M}}
  - {{name: spare, count: 1, size: 16M}}
  - {{name: pinned, count: 1, size: 16M}}
  - {{name: copies, count: 0, size: 16M}}
workloads:
  - name: inspector
    volumes: spare
    command: [sh, -c, 'sleep 2 && nbdinfo --size {{uri}} > {base}/size && for f in {base}/run/qemu/*.qcow2; do qemu-img info -U --backing-chain --output=json \"$f\"; done > {base}/chains']
control_operations:
  - {{name: snapshots, action: snapshot, volumes: chain, rate: early}}
  - {{name: snapshot-deletes, action: delete_snapshot, volumes: chain, select: oldest, rate: later}}
  - {{name: grows, action: resize, volumes: spare, size: +16M, rate: once}}
  - {{name: pinned-snapshots, action: snapshot, volumes: pinned, rate: early}}
  - {{name: clones, action: clone, volumes: pinned, into: copies, rate: clone-time}}
  - {{name: pinned-deletes, action: delete_snapshot, volumes: pinned, select: oldest, rate: later}}
rates:
  - {{name: early, trace: [0.1, 0.3, 0.5, 0.7]}}
  - {{name: later, trace: [1.0, 1.3]}}
  - {{name: once, trace: [0.5]}}
  - {{name: clone-time, trace: [0.85]}}
"
    );
    std::fs::write(at(&dir, "spec.yaml"), spec).unwrap();
    let out = at(&dir, "run");
    let result = strata(&[
        "bench",
        "run",
        &p(&at(&dir, "spec.yaml")),
        "--out",
        &p(&out),
        "--provider",
        "qemu",
    ]);
    let output = String::from_utf8_lossy(&result.stderr);
    assert_eq!(
        result.status.code(),
        Some(1),
        "the refused deletes: {output}"
    );
    let records = records(&out);
    let counts = tally(&records);
    assert_eq!(count(&counts, "snapshots", "ok"), 4, "{counts:?} {output}");
    assert_eq!(count(&counts, "snapshot-deletes", "ok"), 2, "{counts:?}");
    assert_eq!(count(&counts, "grows", "ok"), 1, "{counts:?}");
    assert_eq!(count(&counts, "inspector", "ok"), 1, "{counts:?}");
    for record in records
        .iter()
        .filter(|r| r["operation"] == "snapshot-deletes" && r["status"] == "ok")
    {
        // No clone reads the chain: the newer layer is committed down.
        assert_eq!(record["detail"]["merge"], "block-commit", "{record}");
        assert_eq!(record["detail"]["layers_removed"], 1, "{record}");
    }
    // The clone reads all four snapshot layers of `pinned`: QEMU cannot
    // merge them, and each delete is refused saying why.
    assert_eq!(count(&counts, "clones", "ok"), 1, "{counts:?}");
    let pinned_deletes: Vec<&Value> = records
        .iter()
        .filter(|r| r["operation"] == "pinned-deletes")
        .collect();
    assert_eq!(pinned_deletes.len(), 2, "{counts:?}");
    for record in pinned_deletes {
        assert_eq!(record["status"], "error", "{record}");
        let error = record["error"].as_str().unwrap();
        assert!(error.contains("delete the clones first"), "{record}");
    }
    let size = std::fs::read_to_string(at(&dir, "size")).unwrap();
    assert_eq!(size.trim(), (32u64 << 20).to_string(), "nbdinfo --size");
    let chains = std::fs::read_to_string(at(&dir, "chains")).unwrap();
    let chains: Vec<Vec<Value>> = serde_json::Deserializer::from_str(&chains)
        .into_iter::<Vec<Value>>()
        .collect::<Result<_, _>>()
        .expect("qemu-img info's JSON");
    // The chain volume's three layers (the two committed down are gone,
    // files too), the spare volume's one, the pinned volume's five and
    // its clone's; the pinned volume's chain is whole.
    assert_eq!(chains.len(), 10, "{chains:?}");
    let lengths: Vec<usize> = chains.iter().map(Vec::len).collect();
    assert_eq!(
        lengths.iter().filter(|&&l| l == 3).count(),
        2,
        "{lengths:?}"
    );
    assert_eq!(
        lengths.iter().filter(|&&l| l == 5).count(),
        2,
        "{lengths:?}"
    );
    assert!(lengths.iter().all(|&l| l <= 5), "{lengths:?}");
    let grown: Vec<&Vec<Value>> = chains
        .iter()
        .filter(|c| c.len() == 1 && c[0]["virtual-size"] == 32u64 << 20)
        .collect();
    assert_eq!(grown.len(), 1, "the spare volume's file, grown: {chains:?}");
}

/// A workload holds an NBD client on its volume for a few seconds: it
/// writes a pattern, keeps a qemu-io connection open (and reads through
/// it once the grow was refused), then checks the size and the data over
/// NBD, and waits until the second grow shows.
const HOLDER: &str = r#"
set -e
uri=$1; out=$2
qemu-io -f raw -c 'write -P 0x5a 0 1M' "$uri" > "$out/written"
(sleep 2.5; echo 'read -P 0x5a 0 4096') | qemu-io -f raw "$uri" > "$out/held"
nbdinfo --size "$uri" > "$out/size-after-refusal"
qemu-io -f raw -c 'read -P 0x5a 0 1M' "$uri" > "$out/read-after-refusal"
for i in $(seq 100); do
  test "$(nbdinfo --size "$uri")" = 33554432 && break
  sleep 0.1
done
nbdinfo --size "$uri" > "$out/size-after-grow"
qemu-io -f raw -c 'read -P 0x5a 0 1M' -c 'read -P 0 16M 16M' "$uri" > "$out/read-after-grow"
"#;

/// On QEMU, a grow of a volume whose workload holds an NBD client fails
/// with the reason and what to do; the run goes on (a snapshot of the
/// volume after it succeeds), the volume keeps its size and data and goes
/// on serving, and a grow after the client left succeeds.
#[test]
fn on_qemu_a_grow_under_a_workloads_client_fails_clearly_and_the_run_goes_on() {
    let dir = tmp();
    let base = p(dir.path());
    std::fs::write(at(&dir, "hold.sh"), HOLDER).unwrap();
    let spec = format!(
        "\
duration: 5s
volumes:
  - {{name: busy, count: 1, size: 16M}}
workloads:
  - name: holder
    volumes: busy
    command: [sh, {base}/hold.sh, '{{uri}}', {base}]
control_operations:
  - {{name: grows, action: resize, volumes: busy, size: +16M, rate: grow-times}}
  - {{name: snapshots, action: snapshot, volumes: busy, rate: snapshot-time}}
rates:
  - {{name: grow-times, trace: [1.5, 4.0]}}
  - {{name: snapshot-time, trace: [2.0]}}
"
    );
    std::fs::write(at(&dir, "spec.yaml"), spec).unwrap();
    let out = at(&dir, "run");
    let result = strata(&[
        "bench",
        "run",
        &p(&at(&dir, "spec.yaml")),
        "--out",
        &p(&out),
        "--provider",
        "qemu",
    ]);
    let output = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "the refused grow: {output}");
    let records = records(&out);
    let counts = tally(&records);
    assert_eq!(count(&counts, "holder", "ok"), 1, "{counts:?} {output}");
    assert_eq!(count(&counts, "snapshots", "ok"), 1, "{counts:?}");
    let grows: Vec<&Value> = records
        .iter()
        .filter(|r| r["operation"] == "grows")
        .collect();
    assert_eq!(grows.len(), 2, "{counts:?}");
    assert_eq!(grows[0]["status"], "error", "{}", grows[0]);
    let error = grows[0]["error"].as_str().unwrap();
    assert!(
        error.contains("cannot grow volume") && error.contains("grow volumes no workload is using"),
        "{error}"
    );
    assert_eq!(grows[1]["status"], "ok", "{}", grows[1]);
    assert_eq!(grows[1]["detail"]["old_size"], 16u64 << 20, "{}", grows[1]);
    assert_eq!(grows[1]["detail"]["new_size"], 32u64 << 20, "{}", grows[1]);
    let file = |name: &str| std::fs::read_to_string(at(&dir, name)).unwrap();
    // The attached client read through the export after the refusal.
    assert!(file("held").contains("read 4096/4096"), "{}", file("held"));
    assert_eq!(file("size-after-refusal").trim(), (16u64 << 20).to_string());
    let read = file("read-after-refusal");
    assert!(
        read.contains("read 1048576/1048576") && !read.contains("fail"),
        "{read}"
    );
    assert_eq!(file("size-after-grow").trim(), (32u64 << 20).to_string());
    let read = file("read-after-grow");
    assert!(
        read.contains("read 1048576/1048576") && read.contains("read 16777216/16777216"),
        "{read}"
    );
    assert!(!read.contains("fail"), "{read}");
    let layers = std::fs::read_dir(out.join("qemu")).unwrap().count();
    assert_eq!(layers, 0, "layer files or the QMP socket left");
}

/// On QEMU the run deletes no snapshot with a live clone, so it reaches
/// the `block-stream` path after a restore: the restore's clone read the
/// snapshot's layer (QEMU's provider keeps the layers clones read), so
/// that layer is streamed up into the volume's top rather than written.
/// fio's verify checks the volume's data at the end, and
/// `qemu-img info --backing-chain`, after the delete, sees the volume's
/// top standing alone. (The provider's own tests cover a live clone and
/// a layer above that is a snapshot's.)
#[test]
fn on_qemu_a_snapshot_delete_after_a_restore_streams_the_layer_up() {
    let dir = tmp();
    let base = p(dir.path());
    let spec = format!(
        "\
duration: 5s
volumes:
  - {{name: data, count: 1, size: 32M}}
  - {{name: spare, count: 1, size: 16M}}
workloads:
  - name: writer
    volumes: data
    fio: {{rw: randwrite, bs: 4k, size: 8M, iodepth: 4, rate_iops: 200, verify: crc32c}}
  - name: inspector
    volumes: spare
    command: [sh, -c, 'for i in $(seq 300); do grep -q snapshot-deletes {base}/run/records.jsonl && break; sleep 0.1; done; for f in {base}/run/qemu/*.qcow2; do qemu-img info -U --backing-chain --output=json \"$f\"; done > {base}/chains']
control_operations:
  - {{name: snapshots, action: snapshot, workload: writer, rate: snapshot-times}}
  - {{name: restores, action: restore_and_verify, workload: writer, select: oldest, rate: restore-time}}
  - {{name: snapshot-deletes, action: delete_snapshot, workload: writer, select: oldest, rate: delete-time}}
rates:
  - {{name: snapshot-times, trace: [0.5]}}
  - {{name: restore-time, trace: [1.0]}}
  - {{name: delete-time, trace: [3.5]}}
"
    );
    std::fs::write(at(&dir, "spec.yaml"), spec).unwrap();
    let out = at(&dir, "run");
    let result = strata(&[
        "bench",
        "run",
        &p(&at(&dir, "spec.yaml")),
        "--out",
        &p(&out),
        "--provider",
        "qemu",
    ]);
    let output = String::from_utf8_lossy(&result.stderr);
    let records = records(&out);
    let failed: Vec<&Value> = records.iter().filter(|r| r["status"] != "ok").collect();
    assert!(failed.is_empty(), "{failed:?} {output}");
    assert_eq!(result.status.code(), Some(0), "{output}");
    let counts = tally(&records);
    assert_eq!(count(&counts, "writer", "ok"), 1, "{counts:?}");
    assert_eq!(count(&counts, "inspector", "ok"), 1, "{counts:?}");
    assert_eq!(count(&counts, "snapshots", "ok"), 1, "{counts:?}");
    assert_eq!(count(&counts, "restores", "ok"), 1, "{counts:?}");
    let deletes: Vec<&Value> = records
        .iter()
        .filter(|r| r["operation"] == "snapshot-deletes")
        .collect();
    assert_eq!(deletes.len(), 1, "{counts:?}");
    assert_eq!(
        deletes[0]["detail"]["merge"], "block-stream",
        "{}",
        deletes[0]
    );
    assert_eq!(deletes[0]["detail"]["layers_removed"], 1, "{}", deletes[0]);
    let chains = std::fs::read_to_string(at(&dir, "chains")).unwrap();
    let chains: Vec<Vec<Value>> = serde_json::Deserializer::from_str(&chains)
        .into_iter::<Vec<Value>>()
        .collect::<Result<_, _>>()
        .expect("qemu-img info's JSON");
    // The files: the snapshot's (kept: the restore's clone read it), the
    // restore's clone on it (its file stays until the end), the volume's
    // top, standing alone now (it was on the snapshot's), and the spare
    // volume's.
    let mut lengths: Vec<usize> = chains.iter().map(Vec::len).collect();
    lengths.sort_unstable();
    assert_eq!(lengths, [1, 1, 1, 2], "{chains:?}");
    let on_the_snapshot = chains.iter().find(|c| c.len() == 2).unwrap();
    let snapshot = &on_the_snapshot[1]["filename"];
    assert_eq!(
        chains
            .iter()
            .filter(|c| &c[0]["filename"] == snapshot)
            .count(),
        1,
        "the snapshot's file is there: {chains:?}"
    );
    let layers = std::fs::read_dir(out.join("qemu")).unwrap().count();
    assert_eq!(layers, 0, "layer files or the QMP socket left");
}
