//! How many guest writes overwrote clusters the top layer owns, how many
//! had to allocate (a cluster or subclusters, with copy-on-write of what
//! the write does not cover), and the time each kind took.
//!
//! A snapshot makes every cluster of the old top shared, so the next
//! write to each one allocates. `bench/cns_snapshots.py` counts the
//! allocating writes of runs with and without snapshots from these: what
//! snapshots add, counted rather than read off a throughput that moves
//! with the machine by more than the loss itself. An allocating write's
//! time includes its waits for the writer lock, so times do not add up
//! to lost throughput when other requests use the cores meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The counters a [`crate::Disk`] keeps; see [`WriteTimes`].
#[derive(Debug, Default)]
pub(crate) struct WriteCounters {
    in_place: AtomicU64,
    in_place_nanos: AtomicU64,
    allocating: AtomicU64,
    allocating_nanos: AtomicU64,
}

impl WriteCounters {
    /// Counts one write piece (within one cluster, or one run of owned
    /// clusters) that took `took`.
    pub(crate) fn record(&self, allocating: bool, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let (count, total) = if allocating {
            (&self.allocating, &self.allocating_nanos)
        } else {
            (&self.in_place, &self.in_place_nanos)
        };
        count.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts and times so far.
    pub(crate) fn read(&self) -> WriteTimes {
        WriteTimes {
            in_place: self.in_place.load(Ordering::Relaxed),
            in_place_time: Duration::from_nanos(self.in_place_nanos.load(Ordering::Relaxed)),
            allocating: self.allocating.load(Ordering::Relaxed),
            allocating_time: Duration::from_nanos(self.allocating_nanos.load(Ordering::Relaxed)),
        }
    }
}

/// Guest writes since the disk was opened, by kind: each write request
/// counts once per cluster it allocates and once per run of clusters it
/// overwrites in place. A write that found its cluster shared, but owned
/// by the top layer once it held the writer lock (another write had just
/// allocated it), counts as in place, its wait for the lock included.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteTimes {
    /// Writes into clusters the top layer owned.
    pub in_place: u64,
    /// Their time, summed.
    pub in_place_time: Duration,
    /// Writes that allocated in the top layer.
    pub allocating: u64,
    /// Their time, summed (waits for the writer lock included).
    pub allocating_time: Duration,
}
