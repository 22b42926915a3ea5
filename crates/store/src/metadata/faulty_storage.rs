//! A redb storage backend for tests and the simulation only: the file's
//! bytes live in memory, as an image the last sync made durable plus the
//! writes made since, and a simulated crash keeps the durable image and
//! loses the rest, or for a chosen fault tears one unsynced write (keeps
//! only its first sectors) or lets it land with one byte it changes
//! damaged. Bytes a write leaves as they were are never damaged, and a
//! sector is written whole or not at all, as redb assumes (its two
//! commit slots share the header's page).
//!
//! [`Disk`] is the device, shared between the test and every incarnation
//! of the node using it; [`Disk::backend`] opens it for one incarnation.
//! A crash can also be armed to strike in the middle of a write or a
//! sync ([`Disk::arm`]): from then on every call fails, as for a process
//! that died there, until the test resolves it with [`Disk::crash`].
//! Nothing in the servers uses this module.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of a sector: a torn write keeps whole sectors.
const SECTOR_BYTES: usize = 512;

/// Bytes at the start of a redb file that no checksum covers (its magic,
/// god byte and layout), which a `Corrupt` fault leaves alone.
const UNCHECKED_HEADER_BYTES: u64 = 64;

/// What a crash does to the writes not synced yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// They are lost; the durable image is what the last sync left.
    Lose,
    /// They are lost, but one of them (chosen by the seed) reached the
    /// disk in part: its first sectors only.
    Tear(u64),
    /// They are lost, but one of them (chosen by the seed) reached the
    /// disk whole with one of the bytes it changes damaged (neither its
    /// old value nor the new one).
    Corrupt(u64),
}

/// What a crash did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Unsynced writes lost (whole or in part).
    pub lost_writes: usize,
    /// Bytes of a torn write that reached the disk (0: none torn).
    pub torn_bytes: usize,
    /// Offset of the byte corrupted, if one was.
    pub corrupted_at: Option<u64>,
}

/// A change not synced yet.
#[derive(Clone, Debug)]
enum Unsynced {
    Write { offset: u64, data: Vec<u8> },
    SetLength(u64),
}

#[derive(Debug, Default)]
struct Image {
    /// What the last sync made durable.
    synced: Vec<u8>,
    /// What reads see: `synced` with `unsynced` applied.
    current: Vec<u8>,
    unsynced: Vec<Unsynced>,
    /// Bumped by every crash: backends of an older incarnation are dead.
    incarnation: u64,
    /// Mutating calls left before an armed crash strikes.
    armed: Option<u32>,
    /// The armed crash struck: every call fails until [`Disk::crash`].
    failed: bool,
}

/// A simulated device holding one redb file.
#[derive(Clone, Debug, Default)]
pub struct Disk(Arc<Mutex<Image>>);

/// One incarnation's handle on a [`Disk`], given to redb.
#[derive(Debug)]
pub struct DiskBackend {
    disk: Disk,
    incarnation: u64,
}

fn apply(image: &mut Vec<u8>, change: &Unsynced) {
    match change {
        Unsynced::Write { offset, data } => {
            let start = *offset as usize;
            let end = start + data.len();
            if image.len() < end {
                image.resize(end, 0);
            }
            image[start..end].copy_from_slice(data);
        }
        Unsynced::SetLength(length) => image.resize(*length as usize, 0),
    }
}

fn dead() -> io::Error {
    io::Error::other("simulated crash: this disk's process is dead")
}

impl Disk {
    /// An empty device.
    pub fn new() -> Disk {
        Disk::default()
    }

    fn image(&self) -> MutexGuard<'_, Image> {
        // A test that panicked while holding the lock leaves a usable image.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A backend for the node's next incarnation (after [`Disk::crash`],
    /// the earlier ones fail every call).
    pub fn backend(&self) -> DiskBackend {
        DiskBackend {
            disk: self.clone(),
            incarnation: self.image().incarnation,
        }
    }

    /// Arms a crash to strike at the `after`-th next write, length change
    /// or sync (0: the next one), which then fails, as every call after it.
    pub fn arm(&self, after: u32) {
        self.image().armed = Some(after);
    }

    /// Calls off an armed crash that has not struck.
    pub fn disarm(&self) {
        self.image().armed = None;
    }

    /// Whether an armed crash struck: the process using the disk is dead.
    pub fn has_failed(&self) -> bool {
        self.image().failed
    }

    /// Bytes written and not synced yet.
    pub fn unsynced_bytes(&self) -> usize {
        let image = self.image();
        image
            .unsynced
            .iter()
            .map(|u| match u {
                Unsynced::Write { data, .. } => data.len(),
                Unsynced::SetLength(_) => 0,
            })
            .sum()
    }

    /// Crashes the disk's process: every backend opened so far fails from
    /// now on, and the unsynced writes are lost, but for what `fault`
    /// lets through.
    pub fn crash(&self, fault: Fault) -> CrashReport {
        let mut image = self.image();
        let unsynced = std::mem::take(&mut image.unsynced);
        let mut durable = image.synced.clone();
        let writes: Vec<(u64, &Vec<u8>)> = unsynced
            .iter()
            .filter_map(|u| match u {
                Unsynced::Write { offset, data } if !data.is_empty() => Some((*offset, data)),
                _ => None,
            })
            .collect();
        let mut report = CrashReport {
            lost_writes: writes.len(),
            ..CrashReport::default()
        };
        let chosen = |seed: u64| writes[(seed % writes.len() as u64) as usize];
        match fault {
            Fault::Tear(seed) if !writes.is_empty() => {
                let (offset, data) = chosen(seed);
                // Whole sectors, at least one, never the whole write (a
                // write of one sector or less keeps its first half).
                let sectors = data.len().div_ceil(SECTOR_BYTES);
                let keep = 1 + (seed >> 8) as usize % (sectors - 1).max(1);
                let mut bytes = (keep * SECTOR_BYTES).min(data.len());
                if bytes == data.len() {
                    bytes = data.len() / 2;
                }
                let torn = Unsynced::Write {
                    offset,
                    data: data[..bytes].to_vec(),
                };
                apply(&mut durable, &torn);
                report.torn_bytes = bytes;
            }
            Fault::Corrupt(seed) if !writes.is_empty() => {
                let (offset, data) = chosen(seed);
                // Only a byte the write changes: a crash never damages
                // bytes a write leaves as they were (redb relies on this:
                // its two commit slots share the header's page).
                let old = |i: usize| durable.get(offset as usize + i).copied();
                // Nor a byte of redb's header proper: its god byte (which
                // commit slot is live, and whether it was committed in two
                // phases) has no checksum, by design, since a sector is
                // written whole or not at all. A damaged one is a medium
                // failing, which no database detects and this model does
                // not stand for; damage to a commit slot, which has its
                // checksum, stays in.
                let changed: Vec<usize> = (0..data.len())
                    .filter(|&i| old(i) != Some(data[i]))
                    .filter(|&i| offset + i as u64 >= UNCHECKED_HEADER_BYTES)
                    .collect();
                if !changed.is_empty() {
                    let at = changed[(seed >> 8) as usize % changed.len()];
                    let mut data = data.clone();
                    // Neither the old byte nor the new one.
                    data[at] = (0..=255u8)
                        .map(|b| b ^ (seed >> 32) as u8)
                        .find(|&b| b != data[at] && Some(b) != old(at))
                        .unwrap_or(data[at]);
                    apply(&mut durable, &Unsynced::Write { offset, data });
                    report.corrupted_at = Some(offset + at as u64);
                }
            }
            _ => {}
        }
        image.synced = durable.clone();
        image.current = durable;
        image.incarnation += 1;
        image.armed = None;
        image.failed = false;
        report
    }
}

impl DiskBackend {
    /// The image, if this incarnation is alive; counts down an armed
    /// crash when `mutating`.
    fn live(&self, mutating: bool) -> io::Result<MutexGuard<'_, Image>> {
        let mut image = self.disk.image();
        if image.failed || image.incarnation != self.incarnation {
            return Err(dead());
        }
        if mutating {
            match image.armed {
                Some(0) => {
                    image.armed = None;
                    image.failed = true;
                    return Err(dead());
                }
                Some(n) => image.armed = Some(n - 1),
                None => {}
            }
        }
        Ok(image)
    }

    fn change(&self, change: Unsynced) -> io::Result<()> {
        let mut image = self.live(true)?;
        apply(&mut image.current, &change);
        image.unsynced.push(change);
        Ok(())
    }
}

impl redb::StorageBackend for DiskBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.live(false)?.current.len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let image = self.live(false)?;
        let start = offset as usize;
        image
            .current
            .get(start..start.saturating_add(len))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {len} bytes at {offset} past the end ({} bytes)",
                        image.current.len()
                    ),
                )
            })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.change(Unsynced::SetLength(len))
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        let mut image = self.live(true)?;
        let unsynced = std::mem::take(&mut image.unsynced);
        for change in &unsynced {
            apply(&mut image.synced, change);
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.change(Unsynced::Write {
            offset,
            data: data.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::StorageBackend;

    #[test]
    fn a_crash_keeps_what_was_synced_and_loses_the_rest() {
        let disk = Disk::new();
        let backend = disk.backend();
        backend.write(0, b"synced").unwrap();
        backend.sync_data(false).unwrap();
        backend.write(0, b"lost!!").unwrap();
        assert_eq!(backend.read(0, 6).unwrap(), b"lost!!");
        let report = disk.crash(Fault::Lose);
        assert_eq!(report.lost_writes, 1);
        assert!(backend.read(0, 6).is_err(), "the old incarnation is dead");
        assert_eq!(disk.backend().read(0, 6).unwrap(), b"synced");
    }

    #[test]
    fn a_torn_write_keeps_its_first_sectors_only() {
        let disk = Disk::new();
        let backend = disk.backend();
        backend.write(0, &[1; 4 * SECTOR_BYTES]).unwrap();
        let report = disk.crash(Fault::Tear(7));
        assert!(report.torn_bytes >= SECTOR_BYTES && report.torn_bytes < 4 * SECTOR_BYTES);
        let after = disk.backend();
        assert_eq!(after.len().unwrap() as usize, report.torn_bytes);
        assert!(after
            .read(0, report.torn_bytes)
            .unwrap()
            .iter()
            .all(|&b| b == 1));
    }

    #[test]
    fn a_corrupted_write_lands_whole_but_for_one_damaged_byte() {
        let disk = Disk::new();
        let backend = disk.backend();
        backend.write(100, &[0; 8192]).unwrap();
        backend.sync_data(false).unwrap();
        backend.write(100, &[1; 8192]).unwrap();
        let at = disk.crash(Fault::Corrupt(12345)).corrupted_at.unwrap();
        let bytes = disk.backend().read(100, 8192).unwrap();
        let damaged: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != 1).collect();
        assert_eq!(damaged, vec![(at - 100) as usize]);
        assert_ne!(bytes[damaged[0]], 0, "neither the old byte nor the new one");
    }

    #[test]
    fn a_corrupting_crash_never_damages_redb_s_unchecked_header() {
        for seed in 0..200u64 {
            let disk = Disk::new();
            let backend = disk.backend();
            backend.write(0, &[0; 128]).unwrap();
            backend.sync_data(false).unwrap();
            backend.write(0, &[1; 128]).unwrap();
            let at = disk.crash(Fault::Corrupt(seed << 8)).corrupted_at;
            let at = at.expect("a byte past the header is damaged");
            assert!(at >= UNCHECKED_HEADER_BYTES, "seed {seed}: damaged {at}");
            let bytes = disk.backend().read(0, 128).unwrap();
            assert!(bytes[..UNCHECKED_HEADER_BYTES as usize]
                .iter()
                .all(|&b| b == 1));
        }
    }

    #[test]
    fn an_armed_crash_strikes_mid_write_and_fails_every_call_after() {
        let disk = Disk::new();
        let backend = disk.backend();
        disk.arm(1);
        backend.write(0, b"one").unwrap();
        assert!(backend.write(3, b"two").is_err());
        assert!(disk.has_failed());
        assert!(backend.read(0, 3).is_err());
        disk.crash(Fault::Lose);
        assert_eq!(disk.backend().len().unwrap(), 0);
    }

    /// Commits records, crashing mid-write and at random with every
    /// fault, and checks after each reopen that every acknowledged
    /// record is there (redb's promise for `Durability::Immediate`).
    #[test]
    fn every_acknowledged_commit_survives_crashes_with_torn_and_corrupted_writes() {
        acknowledged_commits_survive_crashes(false);
    }

    /// The same with group commit: records are acknowledged only once the
    /// group's one durable commit ([`MetaDb::flush`]) succeeded.
    ///
    /// [`MetaDb::flush`]: crate::metadata::database::MetaDb::flush
    #[test]
    fn every_acknowledged_group_commit_survives_crashes_with_torn_and_corrupted_writes() {
        acknowledged_commits_survive_crashes(true);
    }

    /// Grouped writes are visible at once, lost in a crash before their
    /// flush, durable after it; a flush the disk fails reports the error.
    #[test]
    fn grouped_writes_are_durable_only_once_flushed_and_a_failed_flush_says_so() {
        use crate::metadata::database::MetaDb;
        let record = |name: &str, version| strata_store_protocol::wire::Record {
            name: name.into(),
            size: 0,
            crc: 0,
            version,
            meta: vec![],
            replicas: vec![],
            rename: None,
            attributes: Vec::new(),
            fragments: None,
            inline: None,
        };
        let disk = Disk::new();
        let db = MetaDb::open_with_backend(disk.backend(), |_| {}).unwrap();
        db.set_grouped(true).unwrap();
        for name in ["a", "b", "c"] {
            assert!(db.apply_record(0, &record(name, 1)).unwrap());
        }
        assert!(db.has_unflushed());
        db.flush().unwrap();
        assert!(!db.has_unflushed());
        assert!(db.apply_record(0, &record("d", 1)).unwrap());
        db.apply_delete(0, "a", 1).unwrap();
        // Visible before the flush, to every read.
        assert_eq!(db.get(0, "d").unwrap().map(|r| r.version), Some(1));
        assert!(db.get(0, "a").unwrap().is_none());
        disk.crash(Fault::Lose);
        drop(db);
        let db = MetaDb::open_with_backend(disk.backend(), |_| {}).unwrap();
        db.set_grouped(true).unwrap();
        // The flushed group is there; what came after it is not.
        for name in ["a", "b", "c"] {
            assert_eq!(
                db.get(0, name).unwrap().map(|r| r.version),
                Some(1),
                "{name}"
            );
        }
        assert!(db.get(0, "d").unwrap().is_none());
        assert!(db.apply_record(0, &record("e", 1)).unwrap());
        // The disk fails at the flush's first write or sync.
        disk.arm(0);
        let err = db.flush().unwrap_err();
        assert!(
            err.report().to_string().contains("durable"),
            "{}",
            err.report()
        );
        disk.crash(Fault::Lose);
        drop(db);
        let db = MetaDb::open_with_backend(disk.backend(), |_| {}).unwrap();
        assert_eq!(db.get(0, "c").unwrap().map(|r| r.version), Some(1));
    }

    fn acknowledged_commits_survive_crashes(grouped: bool) {
        use crate::metadata::database::MetaDb;
        use strata_store_protocol::wire::Record;
        let rounds: u64 = std::env::var("DISK_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        let mut x: u64 = 0x9e37_79b9;
        let mut next = move || {
            x = strata_store_protocol::addr::splitmix64(x);
            x
        };
        let disk = Disk::new();
        let mut acked: std::collections::BTreeMap<String, u64> = Default::default();
        for round in 0..rounds {
            let db = MetaDb::open_with_backend(disk.backend(), |_| {})
                .unwrap_or_else(|e| panic!("round {round}: reopening: {}", e.report()));
            db.set_grouped(grouped).unwrap();
            let mut group = Vec::new();
            for (name, &version) in &acked {
                let found = db.get(0, name).unwrap().map(|r| r.version);
                assert_eq!(found, Some(version), "round {round}: {name} lost");
            }
            if next() % 2 == 0 {
                disk.arm((next() % 40) as u32);
            }
            for i in 0..(next() % 20) {
                // Long names, so that commits span several pages.
                let k = next() % 50;
                let name = format!("n{k}-{}", "x".repeat((k * 37 % 250) as usize));
                let version = round * 100 + i + 1;
                let record = Record {
                    name: name.clone(),
                    size: next() % 1000,
                    crc: 0,
                    version,
                    meta: vec![],
                    replicas: vec![],
                    rename: None,
                    // Some rows with attributes, so torn writes cover them.
                    attributes: vec![7; (k % 3 * 100) as usize],
                    fragments: None,
                    inline: None,
                };
                match db.apply_record(0, &record) {
                    Ok(_) if grouped => group.push((name, version)),
                    Ok(_) => {
                        acked.insert(name, version);
                    }
                    Err(_) => break,
                }
                // Groups of a few records, each acknowledged only once
                // its flush succeeded.
                if grouped && (next() % 4 == 0) && db.flush().is_ok() {
                    acked.extend(group.drain(..));
                }
            }
            if grouped && db.flush().is_ok() {
                acked.extend(group.drain(..));
            }
            let fault = match next() % 3 {
                0 => Fault::Lose,
                1 => Fault::Tear(next()),
                _ => Fault::Corrupt(next()),
            };
            let report = disk.crash(fault);
            eprintln!("round {round}: {fault:?} {report:?}");
            drop(db);
        }
    }
}
