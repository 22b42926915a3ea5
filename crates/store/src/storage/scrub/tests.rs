//! The scrub on real files in a temporary directory, without a cluster:
//! what a pass counts and finds, and how it is paced.

use super::*;
use crate::storage::file::{file_name, header, table_len, CHECKSUM_OFFSET, VERSION_WHOLE};

/// Writes a whole replica file of `data` at `addr` in `dir`, with its
/// chunk table; its path.
fn replica(dir: &Path, addr: Addr, data: &[u8]) -> std::path::PathBuf {
    let mut bytes = header(data.len() as u64).to_vec();
    let at = CHECKSUM_OFFSET as usize;
    bytes[at..at + 4].copy_from_slice(&crc32c::crc32c(data).to_be_bytes());
    bytes.extend_from_slice(data);
    let mut table = ChunkTable::default();
    table.push(data);
    bytes.extend_from_slice(&table.finish());
    let path = dir.join(file_name(addr));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Bytes of a replica file of `size` bytes of data.
fn file(size: usize) -> u64 {
    (FILE_HEADER + size) as u64 + table_len(size as u64).unwrap()
}

#[test]
fn a_chunk_table_that_disagrees_with_good_data_is_damage_and_layout_1_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
    // The data and its whole CRC are good; one table entry is not.
    let rotten = replica(d, 1, &data);
    let mut bytes = std::fs::read(&rotten).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&rotten, bytes).unwrap();
    // A layout 1 file (no table) is good.
    let old = replica(d, 2, &data);
    let mut bytes = std::fs::read(&old).unwrap();
    bytes[4] = VERSION_WHOLE;
    bytes.truncate(FILE_HEADER + data.len());
    std::fs::write(&old, bytes).unwrap();
    replica(d, 3, &data);
    let progress = ScrubProgress::default();
    assert_eq!(pass(d, &progress, 0).concat(), [1]);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs one pass over `dir` at `rate`; the batches it reported.
fn pass(dir: &Path, progress: &ScrubProgress, rate: u64) -> Vec<Vec<Addr>> {
    let mut batches = Vec::new();
    rt().block_on(scrub_pass(dir, progress, rate, |batch| {
        batches.push(batch);
        async { 2 }
    }));
    batches
}

#[test]
fn a_pass_counts_every_replica_and_finds_the_damaged_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    replica(d, 1, &data);
    replica(d, 2, b"");
    replica(d, 3, b"small");
    // One byte flipped in the data.
    let flipped = replica(d, 4, &data);
    let mut bytes = std::fs::read(&flipped).unwrap();
    bytes[FILE_HEADER + 1000] ^= 0x40;
    std::fs::write(&flipped, bytes).unwrap();
    // Torn: shorter than its header says.
    let torn = replica(d, 5, &data);
    let bytes = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() - 1]).unwrap();
    // A bad magic.
    let bad = replica(d, 6, b"abc");
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[0] = b'X';
    std::fs::write(&bad, bytes).unwrap();
    // Not a replica: skipped.
    std::fs::write(d.join("notes.txt"), b"hello").unwrap();

    let progress = ScrubProgress::default();
    let batches = pass(d, &progress, 0);
    let mut found: Vec<Addr> = batches.concat();
    found.sort_unstable();
    assert_eq!(found, [4, 5, 6]);
    assert_eq!(batches.len(), 1, "one batch for a few damaged replicas");
    let s = progress.stats();
    // Every replica read whole, except the torn one and the bad magic,
    // refused on their header (a length other than it says, a wrong
    // magic): their header only.
    let bytes = file(300_000) * 2 + file(0) + file(5) + 2 * FILE_HEADER as u64;
    assert_eq!((s.passes, s.pass_replicas, s.total_replicas), (1, 6, 6));
    assert_eq!((s.pass_bytes, s.total_bytes), (bytes, bytes));
    assert_eq!((s.damaged, s.reports_sent), (3, 2));
    assert!(s.last_pass_unix_ms.is_some());

    // Once repaired (freed here), the next pass finds nothing more; the
    // pass counters start over and the totals grow.
    for a in [4, 5, 6] {
        std::fs::remove_file(d.join(file_name(a))).unwrap();
    }
    assert!(pass(d, &progress, 0).is_empty());
    let s = progress.stats();
    assert_eq!((s.passes, s.pass_replicas, s.total_replicas), (2, 3, 9));
    assert_eq!(s.pass_bytes, file(300_000) + file(0) + file(5));
    assert_eq!((s.damaged, s.reports_sent), (3, 2));
}

#[test]
fn damaged_replicas_are_reported_in_bounded_batches() {
    let dir = tempfile::tempdir().unwrap();
    let count = MAX_DAMAGED + 3;
    for a in 0..count as Addr {
        let path = replica(dir.path(), a + 1, b"data");
        std::fs::write(&path, b"S6RP").unwrap();
    }
    let progress = ScrubProgress::default();
    let batches = pass(dir.path(), &progress, 0);
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, [MAX_DAMAGED, 3]);
    assert_eq!(progress.stats().damaged, count as u64);
    assert_eq!(progress.stats().reports_sent, 4);
}

#[test]
fn a_missing_directory_or_a_vanished_file_is_no_damage() {
    let dir = tempfile::tempdir().unwrap();
    let progress = ScrubProgress::default();
    assert!(pass(&dir.path().join("none"), &progress, 0).is_empty());
    assert_eq!(progress.stats().passes, 1);
    let mut pacer = Pacer::new(0);
    let mut buf = vec![0u8; 16];
    let gone = rt().block_on(check_replica(&dir.path().join("x"), &mut pacer, &mut buf));
    assert_eq!(gone, Checked::Gone);
}

#[test]
fn the_delay_keeps_reads_within_the_rate() {
    let ms = Duration::from_millis;
    // 1 MiB at 1 MiB/s is due after a second.
    assert_eq!(pace_delay(1 << 20, 1 << 20, ms(0)), ms(1000));
    assert_eq!(pace_delay(1 << 20, 1 << 20, ms(400)), ms(600));
    assert_eq!(pace_delay(1 << 20, 1 << 20, ms(1500)), Duration::ZERO);
    assert_eq!(pace_delay(1 << 20, 0, ms(0)), Duration::ZERO);
    // Unpaced.
    assert_eq!(pace_delay(0, u64::MAX, ms(0)), Duration::ZERO);
}

#[test]
fn a_pass_takes_at_least_its_bytes_over_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let data = vec![7u8; 100_000];
    for a in 1..=3 {
        replica(dir.path(), a, &data);
    }
    let total = 3 * file(data.len());
    let rate = 200_000;
    let progress = ScrubProgress::default();
    let start = Instant::now();
    pass(dir.path(), &progress, rate);
    let took = start.elapsed();
    let floor = Duration::from_secs_f64(total as f64 / rate as f64);
    assert!(took >= floor, "{total} bytes at {rate}/s took {took:?}");
    // Loose: only that the pacing does not stall.
    assert!(took < floor + Duration::from_secs(5), "took {took:?}");
    assert_eq!(progress.stats().pass_bytes, total);
    // Unpaced, the same pass is quick.
    let start = Instant::now();
    pass(dir.path(), &progress, 0);
    assert!(start.elapsed() < floor, "{:?}", start.elapsed());
}
