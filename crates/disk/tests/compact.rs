//! Chain compaction in the engine: a run of layers merged into one new
//! layer and spliced into a disk that keeps writing. Every read is checked
//! against an in-memory model, the result is checked by `strata img check`
//! and QEMU, and the index is valid again after a clean close.

use std::path::{Path, PathBuf};

mod common;

use common::{qemu_check_clean, qemu_read};
use strata_disk::check::{check, Repair};
use strata_disk::disk::IndexState;
use strata_disk::{
    create, merge_layers, set_backing_file, CreateOptions, Disk, DiskError, OpenOptions,
};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 8 * MIB;

/// A disk built as a chain of `layers` files, with its model.
struct Chain {
    dir: tempfile::TempDir,
    disk: Disk,
    model: Vec<u8>,
    rng: u64,
}

impl Chain {
    fn new(layers: u32) -> Chain {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("l1.qcow2");
        create(
            &base,
            &CreateOptions {
                size: Some(SIZE),
                ..CreateOptions::default()
            },
        )
        .unwrap();
        let disk = Disk::open(&base, &OpenOptions::read_write()).unwrap();
        let mut chain = Chain {
            dir,
            disk,
            model: vec![0; SIZE as usize],
            rng: 0x9e37_79b9_7f4a_7c15,
        };
        for n in 2..=layers {
            chain.scribble(6);
            let path = chain.layer_path(n);
            let below = format!("l{}.qcow2", n - 1);
            let top = chain.disk.prepare_top(&path, &below, None).unwrap();
            chain.disk.push_top(top, || Ok(())).unwrap();
        }
        chain.scribble(6);
        chain
    }

    fn layer_path(&self, n: u32) -> PathBuf {
        self.dir.path().join(format!("l{n}.qcow2"))
    }

    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic, no dependency.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Random data writes, zero writes and discards, mirrored in the model.
    fn scribble(&mut self, ops: u32) {
        for _ in 0..ops {
            let len = 512 * (1 + self.next() % 300);
            let offset = (self.next() % (SIZE - len)) & !511;
            let (o, l) = (offset as usize, len as usize);
            match self.next() % 6 {
                0 => {
                    self.disk.write_zeroes(offset, len).unwrap();
                    self.model[o..o + l].fill(0);
                }
                _ => {
                    let byte = (self.next() % 251) as u8 + 1;
                    self.disk.write_at(&vec![byte; l], offset).unwrap();
                    self.model[o..o + l].fill(byte);
                }
            }
        }
    }

    fn assert_reads_model(&self, disk: &Disk, what: &str) {
        let mut buf = vec![0u8; SIZE as usize];
        disk.read_at(&mut buf, 0).unwrap();
        let first_diff = buf.iter().zip(&self.model).position(|(a, b)| a != b);
        assert!(
            first_diff.is_none(),
            "{what}: first difference at byte {first_diff:?}"
        );
    }

    /// Merges layers `first..=last` into `merged.qcow2` and splices it in.
    fn compact(&mut self, first: u32, last: u32) -> PathBuf {
        let merged = self.dir.path().join(format!("m{first}-{last}.qcow2"));
        // The merge reads the files: layers a push froze must be on disk.
        self.disk.sync_frozen().unwrap();
        let mut steps = 0;
        let report = merge_layers(&self.layer_path(last), first, &merged, |_| {
            steps += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(report.layers_merged, last - first + 1);
        assert!(steps > 0, "the pacing callback must run");
        if last + 1 < self.disk.depth() {
            // The layer above the run is frozen: rebase its file once.
            set_backing_file(&self.layer_path(last + 1), &file_name(&merged)).unwrap();
        }
        let depth = self.disk.depth();
        self.disk
            .replace_layers(first, last, &merged, &self.layer_path(last))
            .unwrap();
        assert_eq!(self.disk.depth(), depth - (last - first));
        merged
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

fn assert_clean(image: &Path) {
    let report = check(image, Repair::None).unwrap();
    assert_eq!(
        (report.corruptions, report.leaks),
        (0, 0),
        "strata check {}: {:?}",
        image.display(),
        report.messages
    );
    qemu_check_clean(image);
}

#[test]
fn merging_a_middle_run_keeps_every_byte_and_the_disk_writable() {
    let mut chain = Chain::new(24);
    chain.assert_reads_model(&chain.disk, "before");
    // Snapshot layer 6 stays; 7..=20 merge; 21..=23 and the top stay.
    let merged = chain.compact(7, 20);
    assert_eq!(chain.disk.depth(), 11);
    chain.assert_reads_model(&chain.disk, "right after the splice");
    // The frozen layer above the run reads as before, on its own.
    chain.scribble(40);
    chain.assert_reads_model(&chain.disk, "after more writes");
    let top = chain.disk.top().path().to_path_buf();
    let disk = std::mem::replace(
        &mut chain.disk,
        Disk::open(&top, &OpenOptions::read_only()).unwrap(),
    );
    disk.close().unwrap();
    let reopened = Disk::open(&top, &OpenOptions::read_only()).unwrap();
    assert!(
        matches!(reopened.index_state(), IndexState::Stored { depth: 11 }),
        "index stored for the new chain: {:?}",
        reopened.index_state()
    );
    chain.assert_reads_model(&reopened, "reopened");
    assert_eq!(
        qemu_read(&top, chain.dir.path()),
        chain.model,
        "QEMU reads the compacted chain"
    );
    assert_clean(&top);
    assert_clean(&merged);
    // The old run's files are no longer part of the chain.
    let walked = Disk::open(&top, &OpenOptions::read_only()).unwrap();
    assert!(walked
        .layers()
        .iter()
        .all(|l| !l.path().ends_with("l10.qcow2")));
}

#[test]
fn merging_the_run_below_the_top_rebases_the_writable_top() {
    let mut chain = Chain::new(12);
    // Layers 1..=11 under the top 12: the whole history below the top.
    chain.compact(1, 11);
    assert_eq!(chain.disk.depth(), 2);
    chain.scribble(30);
    chain.assert_reads_model(&chain.disk, "after the splice");
    let top = chain.layer_path(12);
    let disk = std::mem::replace(
        &mut chain.disk,
        Disk::open(&top, &OpenOptions::read_only()).unwrap(),
    );
    disk.close().unwrap();
    assert_eq!(
        qemu_read(&top, chain.dir.path()),
        chain.model,
        "QEMU follows the new backing name"
    );
    assert_clean(&top);
}

#[test]
fn a_splice_with_a_stale_view_of_the_chain_is_refused() {
    let mut chain = Chain::new(6);
    let merged = chain.dir.path().join("m.qcow2");
    merge_layers(&chain.layer_path(4), 2, &merged, |_| Ok(())).unwrap();
    // The caller thinks layer 3 ends the run: refused, nothing changes.
    let err = chain
        .disk
        .replace_layers(2, 3, &merged, &chain.layer_path(4))
        .unwrap_err();
    assert!(matches!(err, DiskError::Invalid(_)), "{err}");
    // A merged file of another size is refused too.
    let err = chain
        .disk
        .replace_layers(2, 6, &merged, &chain.layer_path(6))
        .unwrap_err();
    assert!(err.to_string().contains("below the top"), "{err}");
    assert_eq!(chain.disk.depth(), 6);
    chain.scribble(5);
    chain.assert_reads_model(&chain.disk, "after refused splices");
}

#[test]
fn a_cancelled_merge_leaves_no_file() {
    let chain = Chain::new(5);
    chain.disk.sync_frozen().unwrap();
    let merged = chain.dir.path().join("cancelled.qcow2");
    let err = merge_layers(&chain.layer_path(4), 2, &merged, |p| {
        if p.bytes_copied > 0 {
            Err(DiskError::Invalid("cancelled".into()))
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert!(err.to_string().contains("cancelled"));
    assert!(!merged.exists(), "a failed merge removes its file");
}
