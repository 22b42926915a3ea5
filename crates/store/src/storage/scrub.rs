//! The storage node's background scrub: it walks the replica files and
//! re-reads each whole, checking its header, CRC-32C and (layout 2) the
//! CRC-32C of every chunk against the chunk table with
//! [`crate::storage::file`]'s functions, at a bounded rate in bytes per
//! second, with a pause between passes. Damaged replicas (bad header,
//! wrong length, data failing its checksum, a read error) are reported in
//! batches to every metadata node ([`Body::DamagedReplicas`]), which
//! repairs the records naming them from good copies and then frees the
//! damaged replica here; a replica still damaged at the next pass is
//! reported again.
//!
//! Gets never depend on the scrub: a reader checks the checksum itself
//! and falls to another replica. The scrub finds the damage no Get
//! touched, before every copy of an object rots.
//!
//! The scrub reads through the page cache: a replica read recently may be
//! checked from memory rather than from the medium.

use crate::runtime::SharedTable;
use crate::storage::file::{parse_name, verified, ChunkTable, FILE_HEADER};
use crate::storage::reader::{open_checked, Opening};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::table::State;
use strata_store_protocol::wire::{Body, Msg, MAX_DAMAGED};

/// Default of [`ScrubConfig::rate_bytes_per_second`]: 16 MiB/s.
pub const DEFAULT_SCRUB_RATE: u64 = 16 << 20;
/// Default of [`ScrubConfig::pass_pause`]: 10 minutes.
pub const DEFAULT_SCRUB_PAUSE: Duration = Duration::from_secs(600);
/// Bytes read from a replica file in one step; the pacing sleeps between
/// steps.
const SCRUB_CHUNK: usize = 256 * 1024;
/// Most reading time the scrub may catch up after it fell behind its
/// rate (a slow disk, a busy node): it never bursts past its rate for
/// longer than this.
const MAX_BURST: Duration = Duration::from_secs(1);
/// How long a metadata node has to answer a report, and how many times
/// it is sent.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);
const REPORT_ATTEMPTS: u32 = 3;

/// How a storage node scrubs its replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubConfig {
    /// Most bytes of replica files re-read per second.
    pub rate_bytes_per_second: u64,
    /// Pause between the end of one pass over every replica and the
    /// start of the next.
    pub pass_pause: Duration,
    /// Whether the scrub runs at all.
    pub enabled: bool,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig {
            rate_bytes_per_second: DEFAULT_SCRUB_RATE,
            pass_pause: DEFAULT_SCRUB_PAUSE,
            enabled: true,
        }
    }
}

impl ScrubConfig {
    /// The scrub at `rate_bytes_per_second` (0: no scrub), pausing
    /// `pass_pause` between passes.
    pub fn at_rate(rate_bytes_per_second: u64, pass_pause: Duration) -> ScrubConfig {
        ScrubConfig {
            rate_bytes_per_second,
            pass_pause,
            enabled: rate_bytes_per_second > 0,
        }
    }
}

/// What the scrub has done so far on one storage node
/// ([`crate::storage::replicas::SnStore::scrub_stats`]), for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubStats {
    /// Passes over every replica finished.
    pub passes: u64,
    /// Replica files re-read so far in the pass under way (those of the
    /// last pass while the scrub pauses between passes).
    pub pass_replicas: u64,
    /// Bytes of replica files re-read so far in the pass under way (or
    /// the last one, while the scrub pauses).
    pub pass_bytes: u64,
    /// Replica files re-read since the node started.
    pub total_replicas: u64,
    /// Bytes of replica files re-read since the node started.
    pub total_bytes: u64,
    /// Damaged replicas found since the node started (one still damaged
    /// at the next pass, not repaired yet, counts again).
    pub damaged: u64,
    /// Reports of damaged replicas a metadata node acknowledged.
    pub reports_sent: u64,
    /// When the last pass finished, in ms since the Unix epoch (`None`
    /// before the first).
    pub last_pass_unix_ms: Option<u64>,
}

/// The scrub's counters, shared between the scrub's task and whoever
/// reads them.
#[derive(Clone, Debug, Default)]
pub struct ScrubProgress(Arc<Mutex<ScrubStats>>);

impl ScrubProgress {
    /// The counters now.
    pub fn stats(&self) -> ScrubStats {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScrubStats> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pass_started(&self) {
        let mut s = self.lock();
        s.pass_replicas = 0;
        s.pass_bytes = 0;
    }

    fn checked(&self, bytes: u64, damaged: bool) {
        let mut s = self.lock();
        s.pass_replicas += 1;
        s.total_replicas += 1;
        s.pass_bytes = s.pass_bytes.saturating_add(bytes);
        s.total_bytes = s.total_bytes.saturating_add(bytes);
        s.damaged += u64::from(damaged);
    }

    fn reported(&self, acknowledged: u64) {
        self.lock().reports_sent += acknowledged;
    }

    fn pass_finished(&self) {
        let mut s = self.lock();
        s.passes += 1;
        s.last_pass_unix_ms = Some(strata_store_protocol::auth::unix_ms());
    }
}

/// How long to wait, `elapsed` after a pass began, so that `bytes` read
/// since stay within `rate` bytes per second (0: no wait).
pub fn pace_delay(rate: u64, bytes: u64, elapsed: Duration) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    let due = Duration::from_secs_f64(bytes as f64 / rate as f64);
    due.saturating_sub(elapsed)
}

/// Paces reads to a rate in bytes per second.
pub struct Pacer {
    rate: u64,
    start: Instant,
    bytes: u64,
}

impl Pacer {
    /// A pacer of `rate` bytes per second (0: unpaced), starting now.
    pub fn new(rate: u64) -> Pacer {
        Pacer {
            rate,
            start: Instant::now(),
            bytes: 0,
        }
    }

    /// `bytes` more were read: waits until the rate allows the next read.
    /// After falling behind, it catches up for at most [`MAX_BURST`].
    pub async fn consumed(&mut self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        self.bytes = self.bytes.saturating_add(bytes);
        let elapsed = self.start.elapsed();
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        if elapsed > due + MAX_BURST {
            // Fell behind (a slow disk, a busy node): forget the time
            // lost, so that at most MAX_BURST of reading runs unpaced.
            self.start += elapsed - due - MAX_BURST;
            return;
        }
        let wait = pace_delay(self.rate, self.bytes, elapsed);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// What re-reading one replica file found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Whole, with the checksum it was written with; `bytes` read.
    Good {
        /// Bytes read.
        bytes: u64,
    },
    /// Damaged: a bad header, a length other than the header says, data
    /// failing its checksum, or a read error; `bytes` read.
    Damaged {
        /// Bytes read.
        bytes: u64,
    },
    /// Gone before it could be read (freed meanwhile).
    Gone,
}

/// Re-reads the replica file at `path` whole, paced by `pacer`, checking
/// its header and checksum. The reads and the checksum run on the
/// blocking pool, a chunk at a time, so the scrub takes no time from the
/// tasks serving requests; `buf` is the chunk buffer, handed back.
pub async fn check_replica(path: &Path, pacer: &mut Pacer, buf: &mut Vec<u8>) -> Checked {
    if buf.is_empty() {
        // Lost with a step the runtime dropped: a new one.
        buf.resize(SCRUB_CHUNK, 0);
    }
    let path = path.to_path_buf();
    let opened = tokio::task::spawn_blocking(move || open_checked(&path)).await;
    let (file, header) = match opened {
        // The runtime is shutting down: nothing was found.
        Err(_) => return Checked::Gone,
        Ok(Opening::NotOpened(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Checked::Gone
        }
        Ok(Opening::NotOpened(_)) => return Checked::Damaged { bytes: 0 },
        Ok(Opening::Damaged { bytes }) => return Checked::Damaged { bytes },
        Ok(Opening::Whole { file, header }) => (file, header),
    };
    pacer.consumed(FILE_HEADER as u64).await;
    let mut reading = Reading {
        file,
        buf: std::mem::take(buf),
        chunks: ChunkTable::default(),
    };
    let mut sent = 0u64;
    while sent < header.size {
        let want = (header.size - sent).min(reading.buf.len() as u64) as usize;
        let step = tokio::task::spawn_blocking(move || {
            let n = reading.step(want);
            (reading, n)
        })
        .await;
        let Ok((back, n)) = step else {
            return Checked::Gone;
        };
        reading = back;
        if n == 0 {
            break;
        }
        sent += n as u64;
        pacer.consumed(n as u64).await;
    }
    let mut bytes = FILE_HEADER as u64 + sent;
    let crc = reading.chunks.data_crc();
    let mut chunks_good = true;
    if header.table_offset().is_some() && sent == header.size {
        // The table as the data read now says it, against the stored one
        // (bounded: 4 bytes per chunk of a replica under the object limit).
        let expected = std::mem::take(&mut reading.chunks).finish();
        let length = expected.len() as u64;
        let step = tokio::task::spawn_blocking(move || {
            let good = reading.table_matches(&expected);
            (reading, good)
        })
        .await;
        let Ok((back, good)) = step else {
            return Checked::Gone;
        };
        reading = back;
        chunks_good = good;
        bytes += length;
        pacer.consumed(length).await;
    }
    *buf = reading.buf;
    if chunks_good && verified(&header, crc, sent) {
        Checked::Good { bytes }
    } else {
        Checked::Damaged { bytes }
    }
}

/// A replica file being re-read, with the chunk table (and the
/// checksum) of what was read.
struct Reading {
    file: std::fs::File,
    buf: Vec<u8>,
    chunks: ChunkTable,
}

impl Reading {
    /// Reads up to `want` bytes (at most the buffer) and adds them to the
    /// checksum (blocking); how many it read, 0 at the end of the file or
    /// on a read error (either fails the length check).
    fn step(&mut self, want: usize) -> usize {
        use std::io::Read;
        let want = want.min(self.buf.len());
        let n = self.file.read(&mut self.buf[..want]).unwrap_or(0);
        self.chunks.push(&self.buf[..n]);
        n
    }

    /// Whether the chunk table stored after the data (where the file is
    /// positioned) is `expected` (blocking); a read error fails it.
    fn table_matches(&mut self, expected: &[u8]) -> bool {
        use std::io::Read;
        for piece in expected.chunks(self.buf.len().max(1)) {
            let stored = &mut self.buf[..piece.len()];
            if self.file.read_exact(stored).is_err() || stored != piece {
                return false;
            }
        }
        true
    }
}

/// One pass over the replica files in `replicas` (a storage node's
/// `replicas/` directory) at `rate` bytes per second, counting in
/// `progress`; damaged replicas go to `report` in batches of at most
/// [`MAX_DAMAGED`], which answers how many reports a metadata node
/// acknowledged. Files whose name is not a replica address are skipped.
pub async fn scrub_pass<F, Fut>(replicas: &Path, progress: &ScrubProgress, rate: u64, mut report: F)
where
    F: FnMut(Vec<Addr>) -> Fut,
    Fut: Future<Output = u64>,
{
    progress.pass_started();
    let mut pacer = Pacer::new(rate);
    let mut buf = vec![0u8; SCRUB_CHUNK];
    let mut damaged = Vec::new();
    // Streamed, not listed first: memory stays bounded however many
    // replicas the node holds.
    if let Ok(mut entries) = tokio::fs::read_dir(replicas).await {
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name();
            let Some(addr) = name.to_str().and_then(parse_name) else {
                continue;
            };
            let (bytes, bad) = match check_replica(&entry.path(), &mut pacer, &mut buf).await {
                Checked::Gone => continue,
                Checked::Good { bytes } => (bytes, false),
                Checked::Damaged { bytes } => (bytes, true),
            };
            progress.checked(bytes, bad);
            if bad {
                tracing::warn!(
                    "scrub: replica {} is damaged; reporting it for repair",
                    fmt_addr(addr)
                );
                damaged.push(addr);
                if damaged.len() == MAX_DAMAGED {
                    progress.reported(report(std::mem::take(&mut damaged)).await);
                }
            }
        }
    }
    if !damaged.is_empty() {
        progress.reported(report(damaged).await);
    }
    progress.pass_finished();
}

/// Reports `damaged` replicas, sealed with `key`, to every metadata node
/// of `table` that is not dead; returns how many acknowledged.
pub async fn report_damaged(
    table: strata_store_protocol::table::Table,
    key: Option<ClusterKey>,
    damaged: Vec<Addr>,
) -> u64 {
    let mut acknowledged = 0;
    let msg = Msg::new(
        strata_store_client::transport::request_id(),
        0,
        Body::DamagedReplicas { addrs: damaged },
    );
    for mn in table.gc_mns().filter(|m| m.state != State::Dead) {
        let reply = strata_store_client::transport::udp_call(
            mn.endpoint,
            &msg,
            REPORT_TIMEOUT,
            REPORT_ATTEMPTS,
            key.as_ref(),
        )
        .await;
        match reply.map(|m| m.body) {
            Ok(Body::Done { .. }) => acknowledged += 1,
            Ok(other) => tracing::info!(
                "metadata node {} answered a damaged-replica report with {other:?}",
                mn.endpoint
            ),
            Err(e) => tracing::info!(
                "could not report damaged replicas to metadata node {}: {}",
                mn.endpoint,
                e.report()
            ),
        }
    }
    acknowledged
}

/// Scrubs the replica files of the storage node stored in `dir` until the
/// task is dropped, as `cfg` says (nothing if it is disabled), counting in
/// `progress` and reporting to the metadata nodes of `table`, sealed with
/// `key`.
pub async fn scrub_loop(
    dir: std::path::PathBuf,
    progress: ScrubProgress,
    table: SharedTable,
    key: Option<ClusterKey>,
    cfg: ScrubConfig,
) {
    if !cfg.enabled || cfg.rate_bytes_per_second == 0 {
        return;
    }
    let replicas = dir.join("replicas");
    loop {
        scrub_pass(&replicas, &progress, cfg.rate_bytes_per_second, |batch| {
            report_damaged(crate::runtime::read_table(&table), key.clone(), batch)
        })
        .await;
        tokio::time::sleep(cfg.pass_pause).await;
    }
}

#[cfg(test)]
mod tests;
