//! Providers: what a run's control operations and workloads act on. The
//! same spec runs on each, so their records compare side by side.

pub mod nbd_probe;
pub mod null;
pub mod qemu;
pub mod strata;

use std::time::{Duration, Instant};

/// Longest a compaction is waited for (Strata's default pace copies 32
/// MiB/s: some 19 GiB in this time), so that a stuck job cannot hold a
/// run's end forever.
pub const COMPACT_WITHIN: Duration = Duration::from_secs(600);
/// How often a running compaction is asked how it stands.
pub const COMPACT_POLL: Duration = Duration::from_millis(50);

pub use null::NullProvider;
pub use qemu::QemuProvider;
pub use strata::StrataProvider;

/// The stages an operation went through, each with the time it was
/// reached (the record turns them into seconds since the run's start).
#[derive(Default, Debug)]
pub struct Stages(pub Vec<(&'static str, Instant)>);

impl Stages {
    /// Marks `stage` as reached now.
    pub fn mark(&mut self, stage: &'static str) {
        self.0.push((stage, Instant::now()));
    }
}

/// What a provider said of an operation that succeeded.
pub type Detail = Option<serde_json::Value>;

/// How a provider's operation ended: its detail, or why it failed.
pub type Answer = Result<Detail, String>;

/// A storage system a run acts on.
pub trait Provider: Send + Sync {
    /// Its name in records and reports (`strata`, `null`).
    fn name(&self) -> &'static str;

    /// Creates a volume of `size` bytes and waits until a client can
    /// attach to it (stages: created, attached).
    fn create_volume(
        &self,
        name: &str,
        size: u64,
        cluster_size: Option<u64>,
        stages: &mut Stages,
    ) -> Result<Detail, String>;

    /// Attaches to an existing volume: finds where it is served and
    /// finishes an NBD handshake with it (stage: attached). What a create
    /// costs beyond this is the provider's making of the volume.
    fn attach_volume(&self, volume: &str, stages: &mut Stages) -> Result<Detail, String> {
        let uri = self
            .uri(volume)
            .ok_or_else(|| format!("volume `{volume}` is not served over NBD"))?;
        nbd_probe::attach(&uri)?;
        stages.mark("attached");
        Ok(None)
    }

    /// Deletes a volume and its snapshots.
    fn delete_volume(&self, name: &str) -> Result<Detail, String>;

    /// Takes a snapshot of a volume while it serves I/O.
    fn snapshot(&self, volume: &str, snapshot: &str) -> Result<Detail, String>;

    /// Deletes a snapshot.
    fn delete_snapshot(&self, volume: &str, snapshot: &str) -> Result<Detail, String>;

    /// Makes volume `new` from a snapshot and waits until a client can
    /// attach to it (stages: created, attached).
    fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        new: &str,
        stages: &mut Stages,
    ) -> Result<Detail, String>;

    /// Grows a volume to `size` bytes.
    fn resize(&self, volume: &str, size: u64) -> Result<Detail, String>;

    /// Compacts a volume's chain of layers while it serves I/O, and waits
    /// until that is done (stage: accepted, when the provider took the job).
    fn compact(&self, volume: &str, stages: &mut Stages) -> Result<Detail, String>;

    /// fio's options that send a job's I/O to `volume` of `size` bytes.
    fn fio_target(&self, volume: &str, size: u64) -> Vec<String>;

    /// Where a command reaches `volume` (an `nbd://` address), if anywhere.
    fn uri(&self, volume: &str) -> Option<String>;

    /// Whether written data can be read back (fio's verify needs it).
    fn stores_data(&self) -> bool;

    /// The volumes whose names start with `prefix` (what a run left).
    fn volumes_named(&self, prefix: &str) -> Result<Vec<String>, String>;

    /// The provider's own metrics in Prometheus' text format (at most
    /// [`crate::metrics::MAX_SCRAPE_BYTES`]), or `None` when it has none.
    fn metrics(&self) -> Option<Result<String, String>> {
        None
    }

    /// The process id of the daemon the provider started for the run, if
    /// it started one: its CPU time and memory go with each scrape
    /// ([`crate::daemon_usage`]).
    fn daemon_pid(&self) -> Option<u32> {
        None
    }

    /// Stops what the provider started for the run (a daemon); nothing
    /// for a provider the run only reached.
    fn shutdown(&self) -> Result<(), String> {
        Ok(())
    }
}
