//! The whole-object cache of a storage node (the thesis's chapter 5,
//! `../shared/seeds/004_cc2b285f3162def8.txt`): the node that holds an
//! erasure-coded object's fragment 0 serves the whole object to clients,
//! gathering the other fragments on a miss, and keeps the decoded object
//! in memory, so a hit costs one read from memory instead of k from
//! disks.
//!
//! Eviction is quick_cache's Clock-PRO variant (close to S3-FIFO):
//! a new object enters a cold queue and is promoted only if it is read
//! again before it leaves, and ghost entries remember recent evictions.
//! A one-off Get therefore never pushes out the objects that are read
//! again and again, which LRU lets it do. The module's tests measure
//! the gain over LRU on the thesis's trace. Entries are keyed by the
//! fragment-0 replica address, which names one version of one object
//! and is never reused: an overwrite gets new addresses, so no Get that
//! looked the name up after it can reach the old entry, and freeing the
//! fragment (after a Delete or an overwrite) drops the entry.
//!
//! A miss gathers the object over the network, which takes a while: a
//! Free of its fragment 0 may come and go meanwhile. The gathering is
//! therefore a [`Fill`], begun before the node checks that it still
//! holds fragment 0 and admitted only if no Free of that address came
//! since ([`ObjectCache::remove`] marks the fills in flight), so the
//! cache never keeps, and never serves, an object whose fragment 0 was
//! freed. (Without it, an entry gathered from fragments not yet freed
//! would outlive the Free: memory held for an object no record names.)
//! The deterministic simulation `crates/store/tests/ec_read_sim.rs`
//! checks this with Frees racing gathers.

use quick_cache::unsync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_store_protocol::addr::Addr;

/// A cached object: its bytes and the CRC-32C it was verified against.
#[derive(Clone)]
struct Cached {
    data: Arc<Vec<u8>>,
    crc: u32,
}

/// Weighs an entry by its bytes, so the budget is in bytes.
#[derive(Clone, Copy)]
struct ByBytes;

impl Weighter<Addr, Cached> for ByBytes {
    fn weight(&self, _: &Addr, cached: &Cached) -> u64 {
        // Never 0: quick_cache never evicts entries that weigh nothing.
        (cached.data.len() as u64).max(1)
    }
}

/// Counts the entries the policy evicts, for `/metrics`.
#[derive(Clone, Default)]
struct CountEvictions(Arc<AtomicU64>);

impl Lifecycle<Addr, Cached> for CountEvictions {
    type RequestState = ();

    fn begin_request(&self) {}

    fn on_evict(&self, _: &mut (), _: Addr, _: Cached) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

type Entries = Cache<Addr, Cached, ByBytes, DefaultHashBuilder, CountEvictions>;

/// The counters of an [`ObjectCache`], for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Gets served from memory.
    pub hits: u64,
    /// Gets that had to gather fragments.
    pub misses: u64,
    /// Entries evicted to make room (or refused at admission).
    pub evictions: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Entries held now.
    pub entries: u64,
    /// The byte budget.
    pub budget: u64,
}

/// The fills in flight of one fragment-0 address.
#[derive(Clone, Copy, Debug, Default)]
struct InFlight {
    /// How many.
    fills: usize,
    /// A Free of the address came since the oldest began.
    freed: bool,
}

/// A storage node's whole-object cache (see the module).
pub struct ObjectCache {
    /// Locked before `entries` when both are.
    fills: Mutex<HashMap<Addr, InFlight>>,
    entries: Option<Mutex<Entries>>,
    budget: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: Arc<AtomicU64>,
}

/// Default byte budget of a storage node's object cache.
pub const DEFAULT_OBJECT_CACHE: u64 = 64 << 20;

/// The name of the eviction policy, for `/metrics` and the docs.
pub const POLICY: &str = "clock-pro";

/// A Clock-PRO cache of `budget` weight, with `lifecycle` told of
/// evictions; `None` for a budget of 0 (nothing is kept).
fn clock_pro<K, V, W, L>(
    budget: u64,
    weigher: W,
    lifecycle: L,
) -> Option<Cache<K, V, W, DefaultHashBuilder, L>>
where
    K: Eq + std::hash::Hash,
    V: Clone,
    W: Weighter<K, V> + Clone,
    L: Lifecycle<K, V> + Clone,
{
    let options = OptionsBuilder::new()
        .weight_capacity(budget)
        // A guess that only sizes the first table; it grows as needed.
        .estimated_items_capacity(1024)
        .build()
        .ok()?;
    Some(Cache::with_options(
        options,
        weigher,
        DefaultHashBuilder::default(),
        lifecycle,
    ))
}

impl ObjectCache {
    /// A cache of `budget` bytes (0: none is kept).
    pub fn new(budget: u64) -> ObjectCache {
        let evictions = Arc::new(AtomicU64::new(0));
        let entries = if budget == 0 {
            None
        } else {
            clock_pro(budget, ByBytes, CountEvictions(evictions.clone())).map(Mutex::new)
        };
        ObjectCache {
            fills: Mutex::new(HashMap::new()),
            entries,
            budget,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions,
        }
    }

    /// The largest object the cache takes: an eighth of its budget, so
    /// one object never empties it.
    pub fn max_object(&self) -> u64 {
        self.budget / 8
    }

    fn entries(&self) -> Option<std::sync::MutexGuard<'_, Entries>> {
        let entries = self.entries.as_ref()?;
        Some(entries.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The object whose fragment 0 is `addr`, if it is held with this
    /// size and CRC-32C (counted as a hit or a miss).
    pub fn get(&self, addr: Addr, size: u64, crc: u32) -> Option<Arc<Vec<u8>>> {
        let found = self.entries().and_then(|entries| {
            entries
                .get(&addr)
                .filter(|c| c.crc == crc && c.data.len() as u64 == size)
                .map(|c| c.data.clone())
        });
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    fn fills(&self) -> std::sync::MutexGuard<'_, HashMap<Addr, InFlight>> {
        self.fills.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Begins gathering the object whose fragment 0 is `addr` for a
    /// miss. The caller must then check that it still holds fragment 0
    /// (a Free before this call removed it; one after marks the fill),
    /// and keep the gathered object with [`Fill::admit`].
    pub fn begin_fill(&self, addr: Addr) -> Fill<'_> {
        self.fills().entry(addr).or_default().fills += 1;
        Fill { cache: self, addr }
    }

    /// Whether an entry for `addr` is held (whatever its size and CRC;
    /// not counted as a hit or a miss).
    pub fn holds(&self, addr: Addr) -> bool {
        self.entries()
            .is_some_and(|entries| entries.peek(&addr).is_some())
    }

    /// Keeps the object whose fragment 0 is `addr`, verified against
    /// `crc`. A caller that gathered it over time uses [`Fill::admit`]
    /// instead, which refuses it if the fragment was freed meanwhile.
    pub fn insert(&self, addr: Addr, crc: u32, data: Arc<Vec<u8>>) {
        if data.len() as u64 > self.max_object() {
            return;
        }
        if let Some(mut entries) = self.entries() {
            entries.insert(addr, Cached { data, crc });
            debug_assert!(
                entries.weight() <= self.budget,
                "the cache holds more than its budget"
            );
        }
    }

    /// Drops the entry of fragment-0 address `addr` (its fragment was
    /// freed: call this after the fragment is gone from the disk), and
    /// marks the fills of it in flight, which will not be admitted.
    pub fn remove(&self, addr: Addr) {
        let mut fills = self.fills();
        if let Some(in_flight) = fills.get_mut(&addr) {
            in_flight.freed = true;
        }
        if let Some(mut entries) = self.entries() {
            entries.remove(&addr);
        }
    }

    /// The counters now.
    pub fn stats(&self) -> CacheStats {
        let (bytes, entries) = self
            .entries()
            .map_or((0, 0), |entries| (entries.weight(), entries.len() as u64));
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes,
            entries,
            budget: self.budget,
        }
    }
}

/// The gathering of one object for a miss ([`ObjectCache::begin_fill`]):
/// dropped without [`Fill::admit`] (the gathering failed), it is
/// forgotten.
pub struct Fill<'a> {
    cache: &'a ObjectCache,
    addr: Addr,
}

impl Fill<'_> {
    /// Keeps the gathered object, verified against `crc`, unless its
    /// fragment 0 was freed since the fill began; whether it was kept
    /// (an object above [`ObjectCache::max_object`] never is).
    pub fn admit(self, crc: u32, data: Arc<Vec<u8>>) -> bool {
        // The fills' lock is held across the insert, so no Free comes
        // between the check and the entry.
        let fills = self.cache.fills();
        if fills.get(&self.addr).is_some_and(|f| f.freed) {
            return false;
        }
        if data.len() as u64 > self.cache.max_object() {
            return false;
        }
        let Some(mut entries) = self.cache.entries() else {
            return false;
        };
        entries.insert(self.addr, Cached { data, crc });
        debug_assert!(
            entries.weight() <= self.cache.budget,
            "the cache holds more than its budget"
        );
        drop(entries);
        drop(fills);
        true
    }
}

impl Drop for Fill<'_> {
    fn drop(&mut self) {
        let mut fills = self.cache.fills();
        if let Some(in_flight) = fills.get_mut(&self.addr) {
            in_flight.fills -= 1;
            if in_flight.fills == 0 {
                fills.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};
    use std::hash::Hash;

    /// The baseline the thesis measured: LRU within a budget, the least
    /// recently used entries going first when a new one needs room.
    struct Lru<K> {
        budget: u64,
        bytes: u64,
        tick: u64,
        map: HashMap<K, (u64, u64)>,
        order: BTreeMap<u64, K>,
    }

    impl<K: Hash + Eq + Clone> Lru<K> {
        fn new(budget: u64) -> Lru<K> {
            Lru {
                budget,
                bytes: 0,
                tick: 0,
                map: HashMap::new(),
                order: BTreeMap::new(),
            }
        }
    }

    /// A cache as the simulation drives it: a hit, or a miss after which
    /// the entry is kept.
    trait Policy<K> {
        fn read(&mut self, key: K, size: u64) -> bool;
    }

    impl<K: Hash + Eq + Clone> Policy<K> for Lru<K> {
        fn read(&mut self, key: K, size: u64) -> bool {
            self.tick += 1;
            if let Some((_, used)) = self.map.get_mut(&key) {
                self.order.remove(used);
                *used = self.tick;
                self.order.insert(self.tick, key);
                return true;
            }
            while self.bytes + size > self.budget {
                let Some((_, oldest)) = self.order.pop_first() else {
                    return false;
                };
                if let Some((bytes, _)) = self.map.remove(&oldest) {
                    self.bytes -= bytes;
                }
            }
            self.order.insert(self.tick, key.clone());
            self.map.insert(key, (size, self.tick));
            self.bytes += size;
            false
        }
    }

    /// Weighs a simulated entry by the size stored as its value.
    #[derive(Clone, Copy)]
    struct Stored;

    impl<K> Weighter<K, u64> for Stored {
        fn weight(&self, _: &K, size: &u64) -> u64 {
            *size
        }
    }

    #[derive(Clone, Copy)]
    struct Quiet;

    impl<K, V> Lifecycle<K, V> for Quiet {
        type RequestState = ();
        fn begin_request(&self) {}
    }

    impl<K: Hash + Eq> Policy<K> for Cache<K, u64, Stored, DefaultHashBuilder, Quiet> {
        fn read(&mut self, key: K, size: u64) -> bool {
            if self.get(&key).is_some() {
                return true;
            }
            self.insert(key, size);
            false
        }
    }

    fn policy<K: Hash + Eq + Clone + 'static>(clock: bool, budget: u64) -> Box<dyn Policy<K>> {
        match clock {
            false => Box::new(Lru::new(budget)),
            true => Box::new(clock_pro(budget, Stored, Quiet).expect("a valid budget")),
        }
    }

    #[test]
    fn the_least_recently_used_go_first_in_the_baseline() {
        let mut lru: Lru<u32> = Lru::new(100);
        assert!(!lru.read(1, 40) && !lru.read(2, 40));
        assert!(lru.read(1, 40));
        assert!(!lru.read(3, 40), "2 makes room");
        assert!(!lru.read(2, 40), "2 was the least recently used");
    }

    #[test]
    fn an_entry_serves_only_the_size_and_crc_it_was_verified_with() {
        let cache = ObjectCache::new(8 << 10);
        cache.insert(7, 0xabcd, Arc::new(vec![1; 1000]));
        assert!(cache.get(7, 1000, 0xabcd).is_some());
        assert!(cache.get(7, 1000, 0xabce).is_none());
        assert!(cache.get(7, 999, 0xabcd).is_none());
        cache.remove(7);
        assert!(cache.get(7, 1000, 0xabcd).is_none());
        cache.insert(8, 1, Arc::new(vec![0; 2000]));
        assert!(
            cache.get(8, 2000, 1).is_none(),
            "above an eighth of the budget"
        );
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses), (1, 4));
        assert_eq!((stats.bytes, stats.entries), (0, 0));
        let none = ObjectCache::new(0);
        none.insert(1, 1, Arc::new(vec![0; 10]));
        assert!(none.get(1, 10, 1).is_none(), "a budget of 0 keeps nothing");
    }

    #[test]
    fn a_fill_whose_fragment_was_freed_meanwhile_is_not_admitted() {
        let cache = ObjectCache::new(8 << 10);
        let early = cache.begin_fill(5);
        let late = cache.begin_fill(5);
        cache.remove(5);
        assert!(!early.admit(1, Arc::new(vec![1; 100])));
        assert!(!cache.holds(5), "the Free came after the fill began");
        // A fill begun after the Free is the caller's to refuse (it no
        // longer holds fragment 0); one still in flight stays marked.
        assert!(!late.admit(1, Arc::new(vec![1; 100])));
        assert!(cache.fills().is_empty(), "fills are forgotten once done");
        let fresh = cache.begin_fill(6);
        assert!(fresh.admit(2, Arc::new(vec![2; 100])));
        assert!(cache.holds(6) && cache.get(6, 100, 2).is_some());
        drop(cache.begin_fill(7));
        assert!(cache.fills().is_empty(), "an abandoned fill is forgotten");
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_counts_evictions() {
        let cache = ObjectCache::new(64 << 10);
        for addr in 0..100u64 {
            cache.insert(addr as Addr, 0, Arc::new(vec![0; 8 << 10]));
            assert!(cache.stats().bytes <= 64 << 10);
        }
        let stats = cache.stats();
        assert!(stats.entries >= 4 && stats.entries <= 8, "{stats:?}");
        assert!(stats.evictions >= 92, "{stats:?}");
    }

    #[test]
    fn objects_read_again_survive_a_scan_of_one_off_reads() {
        // LRU loses a hot set to any longer run of cold reads; the
        // policy kept must not.
        let cache = ObjectCache::new(1 << 20);
        let object = || Arc::new(vec![7u8; 16 << 10]);
        for round in 0..3 {
            for hot in 0..16u64 {
                if cache.get(hot as Addr, 16 << 10, 0).is_none() {
                    assert_eq!(round, 0, "hot object {hot} lost in round {round}");
                    cache.insert(hot as Addr, 0, object());
                }
            }
            for cold in 0..200u64 {
                let addr = (1_000 + round * 1_000 + cold) as Addr;
                assert!(cache.get(addr, 16 << 10, 0).is_none());
                cache.insert(addr, 0, object());
            }
        }
    }

    /// A seeded generator for the trace (splitmix64).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = strata_store_protocol::addr::splitmix64(self.0);
            self.0
        }

        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Hit ratios, one per budget.
    #[derive(Debug)]
    struct Ratios {
        share: f64,
        whole_lru: f64,
        fragments_lru: f64,
        whole_clock: f64,
        fragments_clock: f64,
    }

    /// The thesis's modified Zipf law (its section 5.3.1): four
    /// popularity classes holding 10%, 10%, 40% and 40% of the objects,
    /// class i drawn with weight 1/i^0.9, then an object of it at random.
    fn trace(rng: &mut Rng, objects: usize, requests: usize) -> Vec<usize> {
        let classes = [objects / 10, objects / 10, objects * 2 / 5, objects * 2 / 5];
        let weights: Vec<f64> = (1..=classes.len())
            .map(|i| 1.0 / (i as f64).powf(0.9))
            .collect();
        let total: f64 = weights.iter().sum();
        (0..requests)
            .map(|_| {
                let mut u = rng.unit() * total;
                let mut first = 0;
                for (class, &w) in classes.iter().zip(&weights) {
                    if u < w {
                        return first + (rng.next() % *class as u64) as usize;
                    }
                    u -= w;
                    first += class;
                }
                objects - 1
            })
            .collect()
    }

    /// Hit ratios of whole-object caching at the node of fragment 0
    /// against fragment caching at every node, with caches of the same
    /// total byte budget, each under LRU (as the thesis's section 5.3
    /// measured) and under this module's Clock-PRO: `nodes` nodes,
    /// `objects` objects of k data fragments among n on distinct nodes,
    /// 200,000 Gets reading the k data fragments; a fragment-cached Get
    /// hits only when all k are cached.
    fn hit_ratios(shape: (usize, usize, usize, usize), budgets: &[f64]) -> Vec<Ratios> {
        let (nodes, objects, k, n) = shape;
        let requests = 200_000usize;
        let mut rng = Rng(42);
        let placement: Vec<Vec<usize>> = (0..objects)
            .map(|_| {
                let mut chosen: Vec<usize> = Vec::with_capacity(n);
                while chosen.len() < n {
                    let node = (rng.next() % nodes as u64) as usize;
                    if !chosen.contains(&node) {
                        chosen.push(node);
                    }
                }
                chosen
            })
            .collect();
        let trace = trace(&mut rng, objects, requests);
        let run = |share: f64, clock: bool| {
            // A node's budget, in fragments: `share` of the fragments it
            // holds on average (a whole object costs k of them).
            let per_node = ((objects * n / nodes) as f64 * share) as u64;
            let mut whole: Vec<Box<dyn Policy<usize>>> =
                (0..nodes).map(|_| policy(clock, per_node)).collect();
            let mut parts: Vec<Box<dyn Policy<(usize, usize)>>> =
                (0..nodes).map(|_| policy(clock, per_node)).collect();
            let (mut whole_hits, mut part_hits) = (0usize, 0usize);
            for &object in &trace {
                let at = &placement[object];
                whole_hits += usize::from(whole[at[0]].read(object, k as u64));
                let mut all = true;
                for (index, &node) in at.iter().enumerate().take(k) {
                    all &= parts[node].read((object, index), 1);
                }
                part_hits += usize::from(all);
            }
            let ratio = |hits: usize| hits as f64 / requests as f64;
            (ratio(whole_hits), ratio(part_hits))
        };
        budgets
            .iter()
            .map(|&share| {
                let (whole_lru, fragments_lru) = run(share, false);
                let (whole_clock, fragments_clock) = run(share, true);
                Ratios {
                    share,
                    whole_lru,
                    fragments_lru,
                    whole_clock,
                    fragments_clock,
                }
            })
            .collect()
    }

    #[test]
    fn whole_objects_hit_more_often_than_fragments_in_the_same_budget() {
        for r in hit_ratios(SHAPE, &[0.01, 0.05]) {
            // The thesis reports +4-18% (relative) in its LRU runs.
            assert!(r.whole_lru >= r.fragments_lru * 1.02, "{r:?}");
            // The policy kept must beat the thesis's LRU clearly. (Under
            // it, caching fragments does as well as caching objects on
            // this trace: docs/benchmarks.md says so.)
            assert!(r.whole_clock >= r.whole_lru * 1.1, "{r:?}");
        }
    }

    /// The figures for docs/benchmarks.md: `cargo test --release -p
    /// strata-store --lib object_cache_hit_ratios -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn object_cache_hit_ratios() {
        println!("shape (nodes, objects, k, n) | budget | whole LRU | fragments LRU | whole Clock-PRO | fragments Clock-PRO");
        for shape in [SHAPE, (100, 100_000, 4, 6), (100, 100_000, 10, 12)] {
            for r in hit_ratios(shape, &[0.01, 0.05, 0.1]) {
                println!(
                    "{shape:?} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}%",
                    r.share,
                    r.whole_lru * 100.0,
                    r.fragments_lru * 100.0,
                    r.whole_clock * 100.0,
                    r.fragments_clock * 100.0
                );
            }
        }
    }

    /// The simulated cluster: nodes, objects, data and all fragments.
    const SHAPE: (usize, usize, usize, usize) = (12, 20_000, 4, 6);
}
