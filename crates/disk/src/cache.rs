//! The chain's one bounded metadata cache.
//!
//! It holds *resolved pages*: for [`PAGE_UNITS`] consecutive index units,
//! which layer owns each unit and that layer's raw L2 entry. A page answers
//! a lookup without touching any layer's tables, so the cost of a cached
//! lookup does not depend on chain length, and the memory it takes depends
//! on the disk's size, not on how many layers the chain has.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use quick_cache::sync::{Cache, GuardResult};
use quick_cache::Weighter;

/// Index units per resolved page.
pub const PAGE_UNITS: u64 = 256;

/// Who owns one unit of the guest disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slot {
    /// Owning layer, 1 = base; 0 = nobody (reads as zeros).
    pub layer: u16,
    /// The owner's raw L2 entry (unused for raw layers); with extended L2
    /// entries its first word.
    pub entry: u64,
    /// The owner's subcluster bitmap (0 for standard L2 entries). With
    /// extended L2 entries a unit is at most one subcluster, so the owner
    /// is the topmost layer whose entry allocates or zeroes *that*
    /// subcluster: a lookup never needs a second layer.
    pub bitmap: u64,
}

/// A resolved page.
#[derive(Debug)]
pub struct Page {
    /// One slot per unit.
    pub slots: RwLock<Vec<Slot>>,
}

impl Page {
    /// A page of `n` slots.
    pub fn new(slots: Vec<Slot>) -> Arc<Page> {
        Arc::new(Page {
            slots: RwLock::new(slots),
        })
    }
}

#[derive(Clone)]
struct PageWeight;

impl Weighter<u64, Arc<Page>> for PageWeight {
    fn weight(&self, _key: &u64, _val: &Arc<Page>) -> u64 {
        PAGE_BYTES
    }
}

/// Approximate memory one cached page takes, slots plus bookkeeping.
pub const PAGE_BYTES: u64 = PAGE_UNITS * std::mem::size_of::<Slot>() as u64 + 96;

/// Cache statistics.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that filled a page.
    pub misses: u64,
    /// Pages cached now.
    pub pages: u64,
    /// Bytes the cached pages take.
    pub bytes: u64,
    /// The bound.
    pub capacity: u64,
}

/// The bounded cache of resolved pages.
pub struct PageCache {
    pages: Cache<u64, Arc<Page>, PageWeight>,
    capacity: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl PageCache {
    /// A cache bounded to `capacity` bytes (at least one page).
    pub fn new(capacity: u64) -> PageCache {
        let capacity = capacity.max(PAGE_BYTES * 4);
        let items = (capacity / PAGE_BYTES) as usize;
        PageCache {
            pages: Cache::with_weighter(items, capacity, PageWeight),
            capacity,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Returns page `key`, filling it with `fill` on a miss. Concurrent
    /// misses on the same page wait for one fill.
    pub fn get_or_fill<E>(
        &self,
        key: u64,
        fill: impl FnOnce() -> Result<Arc<Page>, E>,
    ) -> Result<Arc<Page>, E> {
        match self.pages.get_value_or_guard(&key, None) {
            GuardResult::Value(v) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Ok(v)
            }
            GuardResult::Guard(g) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                let page = fill()?;
                let _ = g.insert(page.clone());
                Ok(page)
            }
            GuardResult::Timeout => {
                // Unreachable without a timeout; fill without caching.
                fill()
            }
        }
    }

    /// Runs `update` on page `key` if it is cached, waiting for a fill in
    /// progress. Writers call this *after* writing metadata to the file, so
    /// a fill either read the new metadata or is updated here.
    pub fn update_if_cached(&self, key: u64, update: impl FnOnce(&mut [Slot])) {
        match self.pages.get_value_or_guard(&key, None) {
            GuardResult::Value(page) => update(&mut page.slots.write()),
            // Not cached: the next fill reads the file, which is current.
            GuardResult::Guard(_) | GuardResult::Timeout => {}
        }
    }

    /// Drops every cached page.
    pub fn clear(&self) {
        self.pages.clear();
    }

    /// Current statistics.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            pages: self.pages.len() as u64,
            bytes: self.pages.weight(),
            capacity: self.capacity,
        }
    }
}
