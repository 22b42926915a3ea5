//! The volume keeper: a background thread that does, for every volume, the
//! work a snapshot leaves for later.
//!
//! - **Index copies.** A snapshot's new top reads its chain index owners
//!   from the layer it froze until it has copied them (see
//!   `strata_disk`'s lazy index): the writer copies a 4 KiB sector the
//!   first time it changes an owner in it, and the keeper copies the rest
//!   in short runs right after the snapshot (a switch kicks it), so the
//!   next snapshot finds the index whole.
//! - **Standby tops** for volumes whose chain index is big. A new top is a
//!   file with room for the index (2 bytes per index unit: 52.8 MB for 50
//!   GiB of 2 KiB subclusters), created and synced outside the I/O pause
//!   but inside the API call. The keeper prepares each big volume's next
//!   top ahead (a *standby*), so a snapshot only switches to it. A standby
//!   is an ordinary layer file with a fresh id that the catalog does not
//!   know yet: if the daemon dies, startup removes it as an orphan. One
//!   that no longer fits the chain (a compaction restarted the writer, a
//!   resize prepared its own top) is dropped, which removes its file, and
//!   the keeper makes a new one. Volumes whose index is smaller than
//!   [`crate::service::ServiceConfig::standby_min_index`] get none: their
//!   file takes a few milliseconds to make.
//! - **Durability.** It makes durable the layers snapshots froze once they
//!   have waited [`crate::service::ServiceConfig::durable_within`] for a
//!   flush from the volume's client (see [`Service::create_snapshot`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use strata_disk::PreparedTop;

use super::{Live, Service};
use crate::error::Result;
use crate::pool::{layer_file, new_id};

/// Index sectors (4 KiB) the keeper copies per hold of a volume's disk:
/// short enough that a switch waiting for the disk is not held up.
const COPY_BATCH: u64 = 256;

/// How often the keeper makes its rounds.
const KEEP_PERIOD: Duration = Duration::from_secs(1);

/// How long a pass waits for a volume's change lock before skipping it.
const LOCK_WAIT: Duration = Duration::from_millis(200);

/// A volume's next top, prepared ahead.
#[derive(Debug)]
pub(crate) struct Standby {
    /// The layer id the file is named after.
    pub(crate) id: String,
    /// The prepared file; dropping it unused removes the file.
    pub(crate) top: PreparedTop,
}

/// The running keeper thread and its stop flag.
#[derive(Debug, Default)]
pub(crate) struct Keeper {
    running: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
}

impl Keeper {
    /// Wakes the thread for a pass now (after a switch used or dropped a
    /// volume's standby), instead of at the next period.
    pub(crate) fn kick(&self) {
        if let Some((_, thread)) = self.running.lock().as_ref() {
            thread.thread().unpark();
        }
    }

    /// Stops the thread and waits for it.
    fn stop(&self) {
        if let Some((stop, thread)) = self.running.lock().take() {
            stop.store(true, Ordering::Relaxed);
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Service {
    /// Starts the thread that keeps big volumes' standby tops ready and
    /// syncs frozen layers when due (see the module documentation). Does
    /// nothing when standbys are off and every snapshot syncs its layer.
    pub fn start_standby_keeper(service: &Arc<Service>) {
        let stop = Arc::new(AtomicBool::new(false));
        let weak: Weak<Service> = Arc::downgrade(service);
        let flag = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("standby-keeper".into())
            .spawn(move || keep_loop(&weak, &flag));
        match spawned {
            Ok(thread) => *service.keeper.running.lock() = Some((stop, thread)),
            Err(e) => tracing::warn!("standby keeper not started: {e}"),
        }
    }

    /// Stops the standby keeper (before the service is closed).
    pub fn stop_standby_keeper(&self) {
        self.keeper.stop();
    }

    /// Copies the index sectors each volume's top still reads from the
    /// layer below, in batches, while I/O goes on.
    pub fn copy_indexes(&self) {
        for name in self.volume_names() {
            let Some(live) = self.live_entry(&name) else {
                continue;
            };
            loop {
                match live.volume.copy_index_rest(COPY_BATCH) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("volume '{name}': index copy failed: {e}");
                        break;
                    }
                }
            }
        }
    }

    /// One pass of the keeper over standbys: makes each big volume's, or
    /// drops one that no longer fits. Volumes being changed are skipped
    /// until the next pass.
    pub fn keep_standbys(&self) {
        let Some(min) = self.config.standby_min_index else {
            return;
        };
        for name in self.volume_names() {
            let Some(live) = self.live_entry(&name) else {
                continue;
            };
            // Most volumes are small: skip them without their lock.
            let small = live.volume.index_bytes().is_none_or(|b| b < min);
            if small && live.standby.lock().is_none() {
                continue;
            }
            // A kick comes from a change still holding the lock: wait for
            // it a little rather than a whole period.
            let Some(_changes) = live.changes.try_lock_for(LOCK_WAIT) else {
                continue;
            };
            if let Err(e) = self.keep_standby(&name, &live, min) {
                tracing::warn!("volume '{name}': standby top not kept: {e}");
            }
        }
    }

    /// Syncs the layers snapshots froze on volumes whose oldest frozen
    /// layer has waited [`crate::service::ServiceConfig::durable_within`].
    /// Volumes being changed are skipped until the next pass.
    pub fn sync_frozen_when_due(&self) {
        let within = self.config.durable_within;
        for name in self.volume_names() {
            let Some(live) = self.live_entry(&name) else {
                continue;
            };
            let (_, oldest) = live.volume.frozen_pending();
            if oldest.is_none_or(|age| age < within) {
                continue;
            }
            let Some(_changes) = live.changes.try_lock_for(LOCK_WAIT) else {
                continue;
            };
            if let Err(e) = live.volume.sync_frozen() {
                tracing::warn!("volume '{name}': frozen layers not synced: {e}");
            }
        }
    }

    /// Keeps or (re)makes one volume's standby; the caller holds the
    /// volume's change lock.
    fn keep_standby(&self, name: &str, live: &Live, min: u64) -> Result<()> {
        let mut slot = live.standby.lock();
        if let Some(s) = slot.as_ref() {
            if live.volume.prepared_is_current(&s.top) {
                return Ok(());
            }
            // Stale: drop it (its file goes) and start over.
            *slot = None;
        }
        if live.volume.index_bytes().is_none_or(|b| b < min) {
            return Ok(());
        }
        let Some(v) = self.catalog.state().volumes.get(name).cloned() else {
            return Ok(());
        };
        let id = new_id()?;
        let top = live
            .volume
            .prepare_top(&self.layer_path(&id), &layer_file(&v.top))?;
        if top.is_fast() {
            *slot = Some(Standby { id, top });
        }
        Ok(())
    }

    /// The standby of `live` if it can serve a switch to `size` (`None`:
    /// same size), else `None`, dropping a stale one. The caller holds the
    /// volume's change lock.
    pub(crate) fn take_standby(&self, live: &Live, size: Option<u64>) -> Option<Standby> {
        let s = live.standby.lock().take()?;
        let fits = size.is_none_or(|size| size == s.top.size());
        (fits && live.volume.prepared_is_current(&s.top)).then_some(s)
    }
}

fn keep_loop(service: &Weak<Service>, stop: &AtomicBool) {
    let mut last_compaction_pass = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(KEEP_PERIOD);
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // Hold the service only for the pass, so it can be closed.
        match service.upgrade() {
            Some(s) => {
                s.copy_indexes();
                s.keep_standbys();
                s.sync_frozen_when_due();
                if let Some(policy) = s.config.auto_compact {
                    if last_compaction_pass.elapsed() >= policy.period {
                        last_compaction_pass = std::time::Instant::now();
                        s.auto_compact(&policy);
                    }
                }
            }
            None => break,
        }
    }
}
