//! Online chain compaction of a volume.
//!
//! A layer of a volume's chain is *needed* when it is a volume's top, a
//! snapshot's layer, or has more (or fewer) than one layer built on it. A
//! run of two or more consecutive layers that are not needed (layers of
//! deleted snapshots, layers left by grows) is merged into one new layer,
//! one run at a time:
//!
//! 1. the merge copies what the run holds into a new file, paced to the
//!    requested rate, while every volume keeps serving I/O (nothing above
//!    the run is written, so snapshots and clones keep their bytes);
//! 2. under the change locks of every volume that reads the run, the
//!    catalog commits the new layer and the rebase of the layer above the
//!    run, and drops the run's layers;
//! 3. the layer above the run is rebased onto the new file, every open
//!    disk that reads the run splices the new layer in (a pause of a few
//!    syncs), and the run's files are unlinked.
//!
//! A crash before 2 leaves an orphan file that startup removes; after 2,
//! startup rebases any layer whose file still names its old parent
//! ([`crate::service::Service::open`]) and removes the run's files.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strata_disk::{merge_layers, set_backing_file, DiskError, MergeProgress};

use super::{not_found, Service};
use crate::catalog::{LayerRec, State};
use crate::error::{Result, VolumeError};
use crate::failpoint::failpoint;
use crate::pool::{layer_file, new_id};

/// Default pace of a compaction's copy, in bytes per second. On the
/// 2-core test machine, 32 MiB/s kept a saturating random-read load's p99
/// at 1.3x its value without compaction; 64 MiB/s raised it 2.7x
/// (docs/benchmarks.md, section 3).
pub const DEFAULT_RATE: u64 = 32 << 20;

/// Slowest pace accepted, so a typo cannot leave a compaction running for
/// days.
pub const MIN_RATE: u64 = 1 << 20;

/// How to compact.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactOptions {
    /// Bytes per second the merge may copy; [`DEFAULT_RATE`] when absent.
    pub rate: Option<u64>,
}

/// Where a compaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompactionState {
    /// Merging or splicing.
    Running,
    /// Finished: every run found was merged.
    Done,
    /// Stopped by an error (see `error`); the chain is as the last
    /// completed run left it.
    Failed,
    /// Stopped because the daemon is shutting down.
    Cancelled,
}

/// A compaction as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionStatus {
    /// The volume.
    pub volume: String,
    /// Running, done, failed or cancelled.
    pub state: CompactionState,
    /// The pace, bytes per second.
    pub rate: u64,
    /// Layers in the volume's chain when it started.
    pub layers_before: usize,
    /// Layers in the chain now.
    pub layers_now: usize,
    /// Layers removed so far.
    pub layers_removed: usize,
    /// Runs merged so far.
    pub runs_done: usize,
    /// Runs known so far (runs found later, if the chain changed, add up).
    pub runs_total: usize,
    /// Bytes copied into merged layers so far.
    pub bytes_copied: u64,
    /// Fraction done, 0 to 1.
    pub progress: f64,
    /// Seconds since it started.
    pub elapsed_s: f64,
    /// Longest I/O pause of a splice, in ms.
    pub max_pause_ms: f64,
    /// Why it failed.
    pub error: Option<String>,
}

/// A compaction job of one volume.
#[derive(Debug)]
pub(crate) struct Job {
    status: Mutex<CompactionStatus>,
    started: Instant,
    cancel: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Job {
    fn snapshot(&self) -> CompactionStatus {
        let mut s = self.status.lock().clone();
        s.elapsed_s = self.started.elapsed().as_secs_f64();
        s
    }

    fn update(&self, f: impl FnOnce(&mut CompactionStatus)) {
        f(&mut self.status.lock());
    }
}

/// Jobs by volume name: the running one or the last one.
pub(crate) type Jobs = Mutex<BTreeMap<String, Arc<Job>>>;

/// The runs of unneeded layers in the chain of `top`, each listed from its
/// lowest layer up, two layers or more.
pub fn compaction_runs(state: &State, top: &str) -> Vec<Vec<String>> {
    let mut children: BTreeMap<&str, usize> = BTreeMap::new();
    for l in state.layers.values() {
        if let Some(p) = &l.parent {
            *children.entry(p.as_str()).or_default() += 1;
        }
    }
    let named: std::collections::BTreeSet<&str> =
        state.snapshots.values().map(|s| s.layer.as_str()).collect();
    let tops: std::collections::BTreeSet<&str> =
        state.volumes.values().map(|v| v.top.as_str()).collect();
    let needed =
        |id: &str| tops.contains(id) || named.contains(id) || children.get(id).copied() != Some(1);
    let mut runs = Vec::new();
    let mut run: Vec<String> = Vec::new();
    for id in state.chain(top).into_iter().rev() {
        if needed(&id) {
            if run.len() >= 2 {
                runs.push(std::mem::take(&mut run));
            }
            run.clear();
        } else {
            run.push(id);
        }
    }
    runs
}

impl Service {
    /// Starts compacting `volume` in the background and returns its status.
    /// Refused (409) while a compaction of the same volume runs.
    pub fn start_compaction(
        self: &Arc<Self>,
        volume: &str,
        opts: CompactOptions,
    ) -> Result<CompactionStatus> {
        let rate = opts.rate.unwrap_or(DEFAULT_RATE);
        if rate < MIN_RATE {
            return Err(VolumeError::Invalid(format!(
                "compaction rate {rate} bytes/s is below the minimum of {MIN_RATE} (1 MiB/s)"
            )));
        }
        let state = self.catalog.state();
        let v = state.volumes.get(volume).ok_or_else(|| not_found(volume))?;
        let mut jobs = self.compactions.lock();
        if let Some(job) = jobs.get(volume) {
            if job.snapshot().state == CompactionState::Running {
                return Err(VolumeError::Conflict(format!(
                    "volume '{volume}' is already being compacted; follow it with \
                     `strata volume compact --status {volume}`"
                )));
            }
        }
        let chain = state.chain(&v.top).len();
        let runs = compaction_runs(&state, &v.top);
        let job = Arc::new(Job {
            status: Mutex::new(CompactionStatus {
                volume: volume.to_string(),
                state: CompactionState::Running,
                rate,
                layers_before: chain,
                layers_now: chain,
                layers_removed: 0,
                runs_done: 0,
                runs_total: runs.len(),
                bytes_copied: 0,
                progress: 0.0,
                elapsed_s: 0.0,
                max_pause_ms: 0.0,
                error: None,
            }),
            started: Instant::now(),
            cancel: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        jobs.insert(volume.to_string(), job.clone());
        drop(jobs);
        if let Some(live) = self.live_volume(volume) {
            live.stats().compaction.start();
        }
        let service = self.clone();
        let name = volume.to_string();
        let worker = job.clone();
        let handle = std::thread::Builder::new()
            .name(format!("compact-{volume}"))
            .spawn(move || service.run_compaction(&name, rate, &worker))
            .map_err(|e| VolumeError::Io(format!("cannot start a compaction thread: {e}")))?;
        *job.thread.lock() = Some(handle);
        Ok(job.snapshot())
    }

    /// The running or last compaction of `volume`.
    pub fn compaction_status(&self, volume: &str) -> Result<CompactionStatus> {
        if !self.catalog.state().volumes.contains_key(volume) {
            return Err(not_found(volume));
        }
        self.compactions
            .lock()
            .get(volume)
            .map(|j| j.snapshot())
            .ok_or_else(|| {
                VolumeError::NotFound(format!(
                    "volume '{volume}' has not been compacted since the daemon started; \
                     start with `strata volume compact {volume}`"
                ))
            })
    }

    /// Cancels every running compaction and waits for it to stop; a run
    /// being merged is abandoned (its file removed), completed runs stay.
    pub fn stop_compactions(&self) {
        let jobs: Vec<Arc<Job>> = self.compactions.lock().values().cloned().collect();
        for job in &jobs {
            job.cancel.store(true, Ordering::SeqCst);
        }
        for job in jobs {
            if let Some(handle) = job.thread.lock().take() {
                let _ = handle.join();
            }
        }
    }

    /// The compaction thread: merges runs until none is left.
    fn run_compaction(&self, volume: &str, rate: u64, job: &Job) {
        lower_thread_priority();
        let outcome = self.compact_runs(volume, rate, job);
        let live = self.live_volume(volume);
        job.update(|s| {
            match outcome {
                Ok(()) => {
                    s.state = CompactionState::Done;
                    s.progress = 1.0;
                }
                Err(e) if job.cancel.load(Ordering::SeqCst) => {
                    s.state = CompactionState::Cancelled;
                    s.error = Some(e.to_string());
                }
                Err(e) => {
                    tracing::warn!("compaction of {volume} failed: {e}");
                    s.state = CompactionState::Failed;
                    s.error = Some(e.to_string());
                }
            }
            if let Some(live) = &live {
                live.stats().compaction.finish(s.progress);
            }
        });
    }

    fn compact_runs(&self, volume: &str, rate: u64, job: &Job) -> Result<()> {
        // Each merge removes at least one layer, so this ends; the bound
        // only guards against a catalog that keeps changing under it.
        for _ in 0..super::MAX_COMPACTION_RUNS {
            let state = self.catalog.state();
            let v = state.volumes.get(volume).ok_or_else(|| not_found(volume))?;
            let runs = compaction_runs(&state, &v.top);
            let Some(run) = runs.into_iter().next() else {
                return Ok(());
            };
            job.update(|s| s.runs_total = s.runs_total.max(s.runs_done + 1));
            self.compact_run(volume, &run, rate, job)?;
            let after = self.catalog.state();
            let now = after.volumes.get(volume).map(|v| after.chain(&v.top).len());
            job.update(|s| {
                s.runs_done += 1;
                s.layers_removed += run.len() - 1;
                if let Some(n) = now {
                    s.layers_now = n;
                }
            });
        }
        Err(VolumeError::Conflict(
            "the chain kept changing while it was compacted; try again".into(),
        ))
    }

    /// Merges one run (lowest layer first) and splices it in everywhere.
    fn compact_run(&self, volume: &str, run: &[String], rate: u64, job: &Job) -> Result<()> {
        let (lowest, highest) = (&run[0], &run[run.len() - 1]);
        let state = self.catalog.state();
        // Depth of the run's lowest layer, counted from the base.
        let first = state.chain(lowest).len() as u32;
        let merged_id = new_id()?;
        let merged_path = self.layer_path(&merged_id);
        let stats = self.live_volume(volume);
        let started = Instant::now();
        let copied_before = job.status.lock().bytes_copied;
        let pace = |p: &MergeProgress| -> strata_disk::Result<()> {
            if job.cancel.load(Ordering::SeqCst) {
                return Err(DiskError::Invalid("compaction cancelled".into()));
            }
            let fraction = p.units_done as f64 / p.units_total.max(1) as f64;
            job.update(|s| {
                s.bytes_copied = copied_before + p.bytes_copied;
                s.progress = (s.runs_done as f64 + fraction) / s.runs_total.max(1) as f64;
            });
            if let Some(v) = &stats {
                v.stats().compaction.progress(fraction, p.bytes_copied);
            }
            // Pace: the bytes copied so far, plus this step, may not run
            // ahead of the rate.
            let due = Duration::from_secs_f64((p.bytes_copied + p.next_bytes) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                sleep_unless_cancelled(wait, &job.cancel);
            }
            Ok(())
        };
        // The merge reads the run's files: a layer a snapshot froze must
        // hold all its writes on disk first.
        self.sync_frozen_of_readers(lowest)?;
        let report = merge_layers(&self.layer_path(highest), first, &merged_path, pace)?;
        if let Some(v) = &stats {
            v.stats()
                .compaction
                .add_bytes(report.bytes_copied + report.bytes_zeroed);
        }
        failpoint("compact-before-commit");
        let pause = self.commit_run(run, first, &merged_id).inspect_err(|_| {
            let _ = std::fs::remove_file(&merged_path);
        })?;
        job.update(|s| s.max_pause_ms = s.max_pause_ms.max(pause.as_secs_f64() * 1e3));
        if let Some(v) = &stats {
            v.stats()
                .compaction
                .add_layers_removed(run.len() as u64 - 1);
        }
        Ok(())
    }

    /// Steps 2 and 3 of a run: commit, rebase, splice, unlink. Returns the
    /// longest I/O pause.
    fn commit_run(&self, run: &[String], first: u32, merged_id: &str) -> Result<Duration> {
        let (lowest, highest) = (&run[0], &run[run.len() - 1]);
        let last = first + run.len() as u32 - 1;
        // Clones are created under the topology lock, so the set of
        // volumes that read the run cannot grow while it is held.
        let _topology = self.topology.lock();
        let state = self.catalog.state();
        let child = run_child(&state, run)?;
        let mut readers: Vec<String> = state
            .volumes
            .values()
            .filter(|v| state.chain(&v.top).contains(&child))
            .map(|v| v.name.clone())
            .collect();
        readers.sort();
        let lives: Vec<_> = readers.iter().filter_map(|n| self.live_entry(n)).collect();
        let _changes: Vec<_> = lives.iter().map(|l| l.changes.lock()).collect();
        // A snapshot taken during the merge may have frozen the child: its
        // final header must be on disk before the rebase rewrites it.
        for live in &lives {
            live.volume.sync_frozen()?;
        }
        let state = self.catalog.state();
        let child = run_child(&state, run)?;
        let below = state.layers.get(lowest).and_then(|l| l.parent.clone());
        let size = state
            .layers
            .get(highest)
            .map(|l| l.size)
            .ok_or_else(|| VolumeError::Catalog(format!("layer {highest} vanished")))?;
        let dead = self.catalog.update(|t| {
            t.put_layer(LayerRec {
                id: merged_id.to_string(),
                parent: below.clone(),
                size,
            })?;
            let mut rec = t.state().layers.get(&child).cloned().ok_or_else(|| {
                VolumeError::Catalog(format!("layer {child} vanished during compaction"))
            })?;
            rec.parent = Some(merged_id.to_string());
            t.put_layer(rec)?;
            t.collect_garbage()
        })?;
        failpoint("compact-after-commit");
        let state = self.catalog.state();
        let child_is_top = state.volumes.values().any(|v| v.top == child);
        if !child_is_top {
            set_backing_file(&self.layer_path(&child), &layer_file(merged_id))?;
        }
        let merged_path = self.layer_path(merged_id);
        let highest_path = self.layer_path(highest);
        let mut longest = Duration::ZERO;
        let mut first_error = None;
        for live in &lives {
            match live
                .volume
                .replace_layers(first, last, &merged_path, &highest_path)
            {
                Ok(pause) => longest = longest.max(pause),
                Err(e) => {
                    // The disk keeps reading the run through its open
                    // files, which hold the same bytes; a restart reopens
                    // it on the new chain.
                    tracing::warn!("volume {}: splice failed: {e}", live.volume.name());
                    first_error.get_or_insert(e);
                }
            }
        }
        failpoint("compact-after-splice");
        self.unlink_layers(&dead);
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(longest),
        }
    }
}

impl Service {
    /// Makes durable the frozen layers of every served volume whose chain
    /// holds `layer`.
    fn sync_frozen_of_readers(&self, layer: &str) -> Result<()> {
        let state = self.catalog.state();
        for v in state.volumes.values() {
            if !state.chain(&v.top).iter().any(|id| id == layer) {
                continue;
            }
            if let Some(live) = self.live_volume(&v.name) {
                live.sync_frozen()?;
            }
        }
        Ok(())
    }
}

/// The layer built on the run's highest layer (exactly one, or the run
/// would not be one).
fn run_child(state: &State, run: &[String]) -> Result<String> {
    let highest = &run[run.len() - 1];
    for pair in run.windows(2) {
        let parent = state.layers.get(&pair[1]).and_then(|l| l.parent.as_deref());
        if parent != Some(pair[0].as_str()) {
            return Err(VolumeError::Conflict(
                "the chain changed during compaction; try again".into(),
            ));
        }
    }
    let children: Vec<&LayerRec> = state
        .layers
        .values()
        .filter(|l| l.parent.as_deref() == Some(highest.as_str()))
        .collect();
    match children.as_slice() {
        [one] if !state.snapshots.values().any(|s| run.contains(&s.layer)) => Ok(one.id.clone()),
        _ => Err(VolumeError::Conflict(
            "the chain changed during compaction; try again".into(),
        )),
    }
}

/// Niceness of compaction threads: the merge is background work, and on
/// a busy host the I/O threads should win the CPU it competes for.
const COMPACTION_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority (Linux nice values are per
/// thread). Best effort: on failure the merge runs at normal priority.
fn lower_thread_priority() {
    // SAFETY: setpriority on our own thread id has no memory-safety
    // conditions; the id comes from gettid.
    let rc = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            COMPACTION_NICE,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "could not lower the compaction thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn sleep_unless_cancelled(wait: Duration, cancel: &AtomicBool) {
    let until = Instant::now() + wait;
    while !cancel.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{SnapshotRec, VolumeRec};

    /// A state with a chain `l1 <- l2 <- ... <- lN` (`lN` the top of `v`).
    fn chain(n: usize) -> State {
        let mut s = State::default();
        for i in 1..=n {
            s.layers.insert(
                format!("l{i}"),
                LayerRec {
                    id: format!("l{i}"),
                    parent: (i > 1).then(|| format!("l{}", i - 1)),
                    size: 1 << 20,
                },
            );
        }
        s.volumes.insert(
            "v".into(),
            VolumeRec {
                name: "v".into(),
                size: 1 << 20,
                top: format!("l{n}"),
                origin: None,
                created: 0,
            },
        );
        s
    }

    fn snapshot(s: &mut State, volume: &str, name: &str, layer: &str) {
        let rec = SnapshotRec {
            volume: volume.into(),
            name: name.into(),
            layer: layer.into(),
            size: 1 << 20,
            created: 0,
        };
        s.snapshots.insert(rec.key(), rec);
    }

    #[test]
    fn runs_lie_between_named_layers_and_need_two_layers() {
        let mut s = chain(10);
        // Named: l3 and l7 (snapshots), l10 (top). Runs: l1-l2, l4-l6, l8-l9.
        snapshot(&mut s, "v", "a", "l3");
        snapshot(&mut s, "v", "b", "l7");
        let runs = compaction_runs(&s, "l10");
        let want: Vec<Vec<String>> = [vec!["l1", "l2"], vec!["l4", "l5", "l6"], vec!["l8", "l9"]]
            .iter()
            .map(|r| r.iter().map(|x| x.to_string()).collect())
            .collect();
        assert_eq!(runs, want);
        // A lone unnamed layer between two named ones is left alone.
        snapshot(&mut s, "v", "c", "l5");
        snapshot(&mut s, "v", "d", "l9");
        let runs = compaction_runs(&s, "l10");
        assert_eq!(runs, vec![vec!["l1".to_string(), "l2".to_string()]]);
    }

    #[test]
    fn a_layer_two_volumes_build_on_is_never_merged() {
        let mut s = chain(6);
        // A clone branches off l3 (its snapshot was deleted here to check
        // that the branching alone protects it).
        s.layers.insert(
            "c1".into(),
            LayerRec {
                id: "c1".into(),
                parent: Some("l3".into()),
                size: 1 << 20,
            },
        );
        s.volumes.insert(
            "c".into(),
            VolumeRec {
                name: "c".into(),
                size: 1 << 20,
                top: "c1".into(),
                origin: None,
                created: 0,
            },
        );
        let runs = compaction_runs(&s, "l6");
        assert_eq!(
            runs,
            vec![
                vec!["l1".to_string(), "l2".to_string()],
                vec!["l4".to_string(), "l5".to_string()]
            ]
        );
        // The clone's chain shares l1-l2, so the same run is found from it.
        assert_eq!(
            compaction_runs(&s, "c1"),
            vec![vec!["l1".to_string(), "l2".to_string()]]
        );
    }
}
