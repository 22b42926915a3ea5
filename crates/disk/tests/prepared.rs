//! A new top prepared while the disk keeps writing, then pushed: the new
//! top reads its index owners from the frozen layer until it copies them
//! (the writer copies a sector when it first changes an owner in it, the
//! rest is copied afterwards), and the chain reads, checks and reopens
//! exactly as if the top had been created whole inside the pause.

use std::path::Path;

mod common;

use common::qemu_check_clean;
use strata_disk::check::{check, Repair};
use strata_disk::disk::IndexState;
use strata_disk::{create, CreateOptions, Disk, DiskError, OpenOptions};

/// Granule of the model: the smallest index unit (a 2 KiB subcluster).
const G: u64 = 2048;

/// A disk and what every granule of it must read as (0 = zeros).
struct Model {
    disk: Disk,
    pattern: Vec<u8>,
}

impl Model {
    fn new(dir: &Path, size: u64, extended: bool) -> Model {
        Model::with_cache(dir, size, extended, OpenOptions::read_write().cache_bytes)
    }

    /// A model whose disk keeps at most `cache_bytes` of resolved pages:
    /// small, so lookups keep going back to the index.
    fn with_cache(dir: &Path, size: u64, extended: bool, cache_bytes: u64) -> Model {
        let base = dir.join("l1.qcow2");
        let opts = CreateOptions {
            size: Some(size),
            extended_l2: extended,
            ..CreateOptions::default()
        };
        create(&base, &opts).unwrap();
        let opts = OpenOptions {
            cache_bytes,
            ..OpenOptions::read_write()
        };
        let disk = Disk::open(&base, &opts).unwrap();
        Model {
            disk,
            pattern: vec![0; (size / G) as usize],
        }
    }

    /// Writes `p` over granules `first..first + count`.
    fn write(&mut self, first: u64, count: u64, p: u8) {
        self.disk
            .write_at(&vec![p; (count * G) as usize], first * G)
            .unwrap();
        for g in first..first + count {
            self.pattern[g as usize] = p;
        }
    }

    fn zero(&mut self, first: u64, count: u64) {
        self.disk.write_zeroes(first * G, count * G).unwrap();
        for g in first..first + count {
            self.pattern[g as usize] = 0;
        }
    }

    /// Writes `p` into granules spread over the whole disk: every
    /// `stride`-th, starting at `offset`, `count` granules each.
    fn scatter(&mut self, offset: u64, stride: u64, count: u64, p: u8) {
        let total = self.pattern.len() as u64;
        let mut g = offset;
        while g + count <= total {
            self.write(g, count, p);
            g += stride;
        }
    }

    fn push(&mut self, dir: &Path, n: u32) -> strata_disk::PushReport {
        let path = dir.join(format!("l{n}.qcow2"));
        let below = format!("l{}.qcow2", n - 1);
        let top = self.disk.prepare_top(&path, &below, None).unwrap();
        assert!(top.is_fast(), "the push can use the prepared file");
        self.disk.push_top(top, || Ok(())).unwrap()
    }
}

/// Every granule of `disk` reads as `pattern` says.
fn assert_reads(disk: &Disk, pattern: &[u8], what: &str) {
    let chunk = 512u64;
    let mut buf = vec![0u8; (chunk * G) as usize];
    for first in (0..pattern.len() as u64).step_by(chunk as usize) {
        let n = chunk.min(pattern.len() as u64 - first);
        let buf = &mut buf[..(n * G) as usize];
        disk.read_at(buf, first * G).unwrap();
        for i in 0..n {
            let want = pattern[(first + i) as usize];
            let got = &buf[(i * G) as usize..((i + 1) * G) as usize];
            assert!(
                got.iter().all(|&b| b == want),
                "{what}: granule {} should read {want}, reads {}",
                first + i,
                got[0]
            );
        }
    }
}

/// Closes the disk, then checks every layer (Strata's check, the index
/// against a walk of the chain included, and `qemu-img check`), reopens
/// the chain from disk and checks its stored index is used and reads right.
fn close_and_verify(m: Model, dir: &Path, layers: u32) {
    m.disk.close().unwrap();
    for n in 1..=layers {
        let path = dir.join(format!("l{n}.qcow2"));
        let report = check(&path, Repair::None).unwrap();
        assert_eq!(report.exit_code(), 0, "l{n}: {:?}", report.messages);
        let index = report.chain_index.unwrap_or_default();
        assert!(index.starts_with("valid"), "l{n}: chain index {index}");
        qemu_check_clean(&path);
    }
    let top = dir.join(format!("l{layers}.qcow2"));
    let reopened = Disk::open(&top, &OpenOptions::read_only()).unwrap();
    assert_eq!(
        reopened.index_state(),
        IndexState::Stored { depth: layers },
        "the stored index is valid, not walked around"
    );
    assert_reads(&reopened, &m.pattern, "reopened");
}

/// Writes before the prepare, many writes (new units and overwritten ones,
/// in every sector of the index) and zero writes between the prepare and
/// the push, more writes after; then every granule reads right live, after
/// a reopen from disk, and every layer checks clean.
fn prepared_top_carries_changes_made_after_the_prepare(extended: bool) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // 1 GiB: 16,384 units of 64 KiB (8 index sectors), or 524,288 of
    // 2 KiB subclusters (256 sectors).
    let size = 1u64 << 30;
    let mut m = Model::new(dir, size, extended);
    m.scatter(0, 1021, 3, 0x11);
    let top = dir.join("l2.qcow2");
    let prepared = m.disk.prepare_top(&top, "l1.qcow2", None).unwrap();
    assert!(prepared.is_fast());
    // After the prepare: owners change in every sector of the index.
    m.scatter(5, 1229, 2, 0x22);
    m.scatter(0, 1021 * 3, 1, 0x33);
    m.zero(50, 40);
    m.write(m.pattern.len() as u64 - 1, 1, 0x44);
    // As a restart right after the commit finds it: the new top is
    // durable, and the chain reads every write the last flush covered
    // (the push freezes the old top without syncing it).
    m.disk.flush().unwrap();
    let pattern = m.pattern.clone();
    let report = m
        .disk
        .push_top(prepared, || {
            let fresh = Disk::open(&top, &OpenOptions::read_only())?;
            assert_eq!(fresh.depth(), 2);
            assert_reads(&fresh, &pattern, "new top at the commit");
            Ok(())
        })
        .unwrap();
    assert_eq!(m.disk.sync_frozen().unwrap(), 1);
    assert_eq!(m.disk.frozen_pending().0, 0);
    assert!(report.fast, "{report:?}");
    let sectors = report.index_sectors_to_copy;
    assert!(sectors > 0, "{report:?}");
    assert_eq!(m.disk.index_copy_pending(), sectors, "nothing copied yet");
    assert_reads(&m.disk, &m.pattern, "live after push, owners from below");
    // The new top takes later writes, copying the sectors they change;
    // the chain grows once more right away (the push copies the rest).
    m.write(3, 1, 0x55);
    m.write(100_003, 2, 0x55);
    let left = m.disk.index_copy_pending();
    assert!(left > 0 && left < sectors, "writes copied some: {left}");
    assert_reads(&m.disk, &m.pattern, "live, partly copied");
    let report = m.push(dir, 3);
    assert!(report.fast, "{report:?}");
    m.scatter(7, 1709, 4, 0x66);
    assert_reads(&m.disk, &m.pattern, "live after second push");
    close_and_verify(m, dir, 3);
}

#[test]
fn prepared_top_carries_changes_made_after_the_prepare_standard() {
    prepared_top_carries_changes_made_after_the_prepare(false);
}

#[test]
fn prepared_top_carries_changes_made_after_the_prepare_extended_l2() {
    prepared_top_carries_changes_made_after_the_prepare(true);
}

/// After a push the new top copies an index sector the first time it
/// changes an owner in it, and nothing else; `copy_index_rest` copies the
/// rest in bounded steps; reads are right at every step, and the closed
/// chain checks clean with a valid index.
#[test]
fn a_pushed_top_copies_its_index_on_first_write_and_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // 1 GiB of 2 KiB subclusters: 524,288 owners, 256 index sectors.
    let mut m = Model::new(dir, 1 << 30, true);
    m.scatter(0, 1000, 1, 0x11);
    let report = m.push(dir, 2);
    assert_eq!(report.index_sectors_to_copy, 256, "{report:?}");
    assert_reads(&m.disk, &m.pattern, "nothing copied");
    // Granules 2048..4096 are index units 2048..4096: sector 1.
    m.write(3000, 8, 0x22);
    assert_eq!(
        m.disk.index_copy_pending(),
        255,
        "the write copied its sector"
    );
    m.write(3100, 8, 0x23);
    assert_eq!(m.disk.index_copy_pending(), 255, "copied once");
    assert_reads(&m.disk, &m.pattern, "one sector copied");
    assert_eq!(m.disk.copy_index_rest(100).unwrap(), 155);
    assert_reads(&m.disk, &m.pattern, "partly copied");
    m.write(500_000, 4, 0x24);
    m.disk.complete_index_copy().unwrap();
    assert_eq!(m.disk.index_copy_pending(), 0);
    assert_eq!(m.disk.copy_index_rest(100).unwrap(), 0);
    assert_reads(&m.disk, &m.pattern, "whole");
    close_and_verify(m, dir, 2);
}

/// A top closed while it still reads owners from below copies them first,
/// so its stored index is whole and valid.
#[test]
fn closing_a_top_with_an_uncopied_index_copies_it_first() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut m = Model::new(dir, 256 << 20, true);
    m.scatter(0, 300, 2, 0x11);
    let report = m.push(dir, 2);
    assert!(report.index_sectors_to_copy > 0);
    m.write(17, 3, 0x22);
    assert!(m.disk.index_copy_pending() > 0);
    close_and_verify(m, dir, 2);
}

/// A prepared top never pushed, or whose commit fails, leaves no file and
/// the disk writing to its old top.
#[test]
fn abandoned_prepared_top_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut m = Model::new(dir, 64 << 20, true);
    m.write(0, 10, 0x11);
    let top = dir.join("l2.qcow2");
    let prepared = m.disk.prepare_top(&top, "l1.qcow2", None).unwrap();
    assert!(top.exists());
    drop(prepared);
    assert!(!top.exists(), "a dropped prepare removes its file");
    m.write(5, 10, 0x22);
    let prepared = m.disk.prepare_top(&top, "l1.qcow2", None).unwrap();
    m.write(100, 10, 0x33);
    let err = m
        .disk
        .push_top(prepared, || {
            Err(DiskError::Invalid("catalog refused".into()))
        })
        .unwrap_err();
    assert!(err.to_string().contains("catalog refused"));
    assert!(!top.exists(), "an uncommitted prepared top is removed");
    assert_eq!(m.disk.depth(), 1);
    m.write(200, 10, 0x44);
    assert_reads(&m.disk, &m.pattern, "old top after the failed push");
    close_and_verify(m, dir, 1);
}

/// A prepare made before another push no longer fits the chain: it is not
/// current, and dropping it removes its file.
#[test]
fn a_prepare_overtaken_by_another_push_is_not_current() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut m = Model::new(dir, 256 << 20, true);
    m.scatter(0, 50, 2, 0x11);
    let first = dir.join("first.qcow2");
    let stale = m.disk.prepare_top(&first, "l1.qcow2", None).unwrap();
    assert!(m.disk.prepared_is_current(&stale));
    m.scatter(1, 70, 1, 0x22);
    assert!(m.disk.prepared_is_current(&stale), "writes do not matter");
    m.push(dir, 2);
    assert!(!m.disk.prepared_is_current(&stale), "the chain changed");
    drop(stale);
    assert!(!first.exists());
    m.scatter(4, 110, 1, 0x44);
    assert_reads(&m.disk, &m.pattern, "after the other push");
    close_and_verify(m, dir, 2);
}

/// Clusters of an extended layer are reserved ahead of its end, several
/// MiB at a time; a layer frozen by a push gives back what it did not use,
/// so a long chain does not keep megabytes of reserved space per layer.
#[test]
fn a_frozen_layer_keeps_no_reserved_space_past_its_end() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut m = Model::new(dir, 64 << 20, true);
    m.write(0, 2, 0x11);
    let on_disk = |n: u32| {
        let meta = std::fs::metadata(dir.join(format!("l{n}.qcow2"))).unwrap();
        (meta.len(), meta.blocks() * 512)
    };
    let (len, used) = on_disk(1);
    assert!(
        used > len + (1 << 20),
        "the writer reserves ahead: {used} of {len}"
    );
    m.push(dir, 2);
    // Frozen, the layer keeps its reservation until it is sealed.
    assert_eq!(m.disk.sync_frozen().unwrap(), 1);
    let (len, used) = on_disk(1);
    assert!(
        used <= len + (64 << 10),
        "frozen layer keeps {used} bytes for {len}"
    );
    assert_reads(&m.disk, &m.pattern, "after the push");
    close_and_verify(m, dir, 2);
}

/// Whether a layer file's header says dirty.
fn dirty_on_disk(path: &Path) -> bool {
    strata_disk::info::info(path, None, false)
        .map(|i| i.dirty_flag)
        .expect("info")
}

/// A push freezes the old top without syncing it: the file still says
/// dirty while reads see every write, a flush makes it clean, and a crash
/// before that (the disk forgotten, nothing written back) leaves a file
/// that `repair_dirty` makes clean and consistent, holding what the last
/// flush covered.
#[test]
fn a_frozen_top_is_durable_at_the_next_flush_and_repairable_before() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut m = Model::new(dir, 64 << 20, true);
    m.write(0, 64, 0x11);
    m.push(dir, 2);
    let l1 = dir.join("l1.qcow2");
    assert!(dirty_on_disk(&l1), "frozen, not synced");
    assert_eq!(m.disk.frozen_pending().0, 1);
    assert_reads(&m.disk, &m.pattern, "frozen layer, live");
    m.disk.flush().unwrap();
    assert!(!dirty_on_disk(&l1), "the flush sealed it");
    assert_eq!(m.disk.frozen_pending().0, 0);
    assert_eq!(check(&l1, Repair::None).unwrap().exit_code(), 0);
    qemu_check_clean(&l1);

    // Flushed writes, then unflushed ones, a push, and a crash.
    m.write(100, 8, 0x22);
    m.disk.flush().unwrap();
    m.write(200, 300, 0x33);
    m.push(dir, 3);
    let l2 = dir.join("l2.qcow2");
    assert!(dirty_on_disk(&l2));
    std::mem::forget(m.disk);
    assert!(strata_disk::check::repair_dirty(&l2).unwrap(), "was dirty");
    assert!(!strata_disk::check::repair_dirty(&l2).unwrap(), "clean now");
    assert_eq!(check(&l2, Repair::None).unwrap().exit_code(), 0);
    qemu_check_clean(&l2);
    let reopened = Disk::open(&l2, &OpenOptions::read_only()).unwrap();
    let got = {
        let mut buf = vec![0u8; (8 * G) as usize];
        reopened.read_at(&mut buf, 100 * G).unwrap();
        buf
    };
    assert!(got.iter().all(|&b| b == 0x22), "a flushed write survives");
}

/// The header of `path`, parsed.
fn header_of(path: &Path) -> strata_format::header::Header {
    let bytes = std::fs::read(path).unwrap();
    let len = bytes.len() as u64;
    strata_format::header::Header::parse(&bytes[..65536.min(bytes.len())], len).unwrap()
}

/// Writes `h` over the header of `path`, as a power loss could leave it.
fn put_header(path: &Path, h: &strata_format::header::Header) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&h.encode().unwrap(), 0).unwrap();
}

/// A push does not sync the new top's index copy nor its header: only
/// the prepare's file (with no valid index) is durable until the next
/// flush. A power loss before that may keep the prepare's header, or the
/// push's header over index sectors that never reached the disk. Both
/// are simulated here on the files a killed process left; either way the
/// chain opens by walking, reads every acknowledged write, and a writer
/// rebuilds a valid index.
#[test]
fn a_new_top_whose_index_copy_was_lost_opens_by_walking_and_is_rebuilt() {
    use std::os::unix::fs::FileExt;
    for lost in ["the push's header", "index sectors"] {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut m = Model::new(dir, 64 << 20, true);
        m.scatter(0, 97, 3, 0x11);
        let l2 = dir.join("l2.qcow2");
        let top = m.disk.prepare_top(&l2, "l1.qcow2", None).unwrap();
        let prepared = header_of(&l2);
        let ext = prepared.chain_index().cloned().expect("prepared index");
        let mut region = vec![0u8; ext.region_len as usize];
        std::fs::File::open(&l2)
            .unwrap()
            .read_exact_at(&mut region, ext.region_offset)
            .unwrap();
        // Changes after the prepare, in many index sectors, flushed: the
        // old top holds them durably, only the new top's copy is at risk.
        m.scatter(5, 2048 * 3, 2, 0x22);
        m.disk.flush().unwrap();
        m.disk.push_top(top, || Ok(())).unwrap();
        // The old top sealed (as the daemon's keeper does), so its identity
        // on disk is the one the new index's lineage names.
        m.disk.sync_frozen().unwrap();
        // The crash: nothing else after the push is synced or written back.
        std::mem::forget(m.disk);

        let f = std::fs::OpenOptions::new().write(true).open(&l2).unwrap();
        if lost == "the push's header" {
            put_header(&l2, &prepared);
        } else {
            // The push's header made it, valid and clean, but its index
            // sectors are still as the prepare wrote them.
            let mut h = header_of(&l2);
            h.autoclear_features |= strata_format::header::AUTOCLEAR_STRATA_INDEX;
            h.incompatible_features &= !strata_format::header::INCOMPAT_DIRTY;
            put_header(&l2, &h);
            f.write_all_at(&region[..ext.lineage_offset() as usize], ext.region_offset)
                .unwrap();
        }
        drop(f);
        strata_disk::check::repair_dirty(&dir.join("l1.qcow2")).unwrap();
        strata_disk::check::repair_dirty(&l2).unwrap();

        let walked = Disk::open(&l2, &OpenOptions::read_only()).unwrap();
        assert!(
            matches!(walked.index_state(), IndexState::Walk { .. }),
            "{lost}: a stale index must not be used, got {:?}",
            walked.index_state()
        );
        assert_reads(&walked, &m.pattern, lost);
        drop(walked);
        let rebuilt = Disk::open(&l2, &OpenOptions::read_write()).unwrap();
        assert_eq!(
            rebuilt.index_state(),
            IndexState::Stored { depth: 2 },
            "{lost}"
        );
        assert_reads(&rebuilt, &m.pattern, lost);
        rebuilt.close().unwrap();
        let reopened = Disk::open(&l2, &OpenOptions::read_only()).unwrap();
        assert_eq!(
            reopened.index_state(),
            IndexState::Stored { depth: 2 },
            "{lost}"
        );
        assert_reads(&reopened, &m.pattern, lost);
        assert_eq!(check(&l2, Repair::None).unwrap().exit_code(), 0, "{lost}");
        qemu_check_clean(&l2);
    }
}

/// One step of the push model.
#[derive(Debug, Clone)]
enum Step {
    Write { first: u64, count: u64, byte: u8 },
    Zero { first: u64, count: u64 },
    Push,
    CopyRest(u64),
    Flush,
}

fn step(granules: u64) -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0..granules, 1..64u64, 1..=255u8).prop_map(move |(first, count, byte)| Step::Write {
            first,
            count: count.min(granules - first),
            byte,
        }),
        1 => (0..granules, 1..256u64).prop_map(move |(first, count)| Step::Zero {
            first,
            count: count.min(granules - first),
        }),
        2 => Just(Step::Push),
        2 => (1..8u64).prop_map(Step::CopyRest),
        1 => Just(Step::Flush),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 16, ..Default::default() })]

    /// Random writes, zero writes, pushes, partial background copies and
    /// flushes: the disk reads as the model says after every step that
    /// changes the chain or the copy, and the closed chain checks clean,
    /// reopens with its stored index and reads right.
    #[test]
    fn pushes_with_lazy_index_copies_match_the_model(
        steps in proptest::collection::vec(step(32 << 10), 1..30),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        // 64 MiB of 2 KiB granules: 32,768 owners, 16 index sectors; a
        // cache of a few pages, so reads go back to the index.
        let mut m = Model::with_cache(dir, 64 << 20, true, 0);
        let mut layers = 1;
        for s in steps {
            match s {
                Step::Write { first, count, byte } => m.write(first, count, byte),
                Step::Zero { first, count } => m.zero(first, count),
                Step::Push => {
                    layers += 1;
                    m.push(dir, layers);
                    assert_reads(&m.disk, &m.pattern, "after a push");
                }
                Step::CopyRest(n) => {
                    m.disk.copy_index_rest(n).unwrap();
                    assert_reads(&m.disk, &m.pattern, "after a partial copy");
                }
                Step::Flush => m.disk.flush().unwrap(),
            }
        }
        assert_reads(&m.disk, &m.pattern, "at the end");
        close_and_verify(m, dir, layers);
    }
}
