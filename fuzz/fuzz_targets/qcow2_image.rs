//! Arbitrary bytes as a whole image file, through the disk engine:
//! open read-only, read a few ranges, run `check`.
//!
//! The input is written to a file in a private directory, so a backing file
//! name in the input can only name that file itself (a loop) or something
//! that does not exist; names with a '/' are skipped so the fuzzer never
//! opens files elsewhere on the host.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use strata_disk::check::{self, Repair};
use strata_disk::layer::Format;
use strata_disk::{Disk, OpenOptions};
use strata_format::header::Header;

/// Larger inputs are skipped to bound the work per run.
const MAX_INPUT: usize = 1 << 20;
/// Bytes read per range.
const READ_LEN: u64 = 64 * 1024;

fn image_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("strata-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create fuzz dir");
        dir.join("img")
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    // Keep the engine inside the private directory.
    if let Ok(h) = Header::parse(data, data.len() as u64) {
        if h.backing_file
            .as_deref()
            .is_some_and(|b| b.contains('/') || b == "..")
        {
            return;
        }
    }
    let path = image_path();
    std::fs::write(path, data).expect("write fuzz image");

    for format in [None, Some(Format::Qcow2)] {
        let opts = OpenOptions {
            format,
            cache_bytes: 1 << 20,
            ..OpenOptions::read_only()
        };
        if let Ok(disk) = Disk::open(path, &opts) {
            read_some(&disk, data);
            let _ = disk.lineage();
            let _ = disk.index_state();
        }
    }
    if let Ok(report) = check::check(path, Repair::None) {
        let _ = report.exit_code();
    }
    // Read-only commands must not have written anything.
    assert!(
        std::fs::read(path).map(|b| b == data).unwrap_or(false),
        "the image changed"
    );
});

/// Reads the start, the end and one place the input chooses.
fn read_some(disk: &Disk, data: &[u8]) {
    let size = disk.size();
    if size == 0 {
        return;
    }
    let pick = data
        .get(data.len().saturating_sub(8)..)
        .and_then(|t| t.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    let mut buf = vec![0u8; READ_LEN as usize];
    for start in [0, size.saturating_sub(READ_LEN), pick % size] {
        let len = READ_LEN.min(size - start) as usize;
        let _ = disk.read_at(&mut buf[..len], start);
        let _ = disk.reads_as_zero(start, len as u64);
        let _ = disk.slot_at(start);
    }
    // Out of range must fail, not panic.
    assert!(disk.read_at(&mut buf[..1], size).is_err());
}
