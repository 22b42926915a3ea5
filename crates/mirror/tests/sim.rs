//! Deterministic simulation of many mirrors' chunk tables exchanging
//! advertisements and chunks over a simulated network with delays,
//! jitter between hosts and lost replies (seeded; no clock, no sockets).
//! It checks the distributed behaviour of the pure state machine: every
//! read completes whatever the network loses, peers carry most chunks
//! when patterns match, and the adaptive policy bounds waste when they
//! diverge.

use std::collections::{BTreeMap, HashSet};

use strata_mirror::chunk::{Access, ChunkState, ChunkTable, PolicyConfig};
use strata_mirror::topology::Rng;

#[derive(Clone, Copy)]
enum Ev {
    /// `to` hears that a peer is fetching chunk `c` from the repository.
    Coming { to: usize, c: u32 },
    /// Mirror `m` looks again for chunk `c` (it was waiting for a peer's fetch).
    Retry { m: usize, c: u32, since: u64 },
    /// `from` tells `to` it holds chunk `c`.
    Advert { to: usize, c: u32 },
    /// A fetch by mirror `m` of chunk `c` ends.
    Done { m: usize, c: u32, peer: bool },
}

struct Sim {
    tables: Vec<ChunkTable>,
    known: Vec<HashSet<u32>>,
    coming: Vec<HashSet<u32>>,
    events: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    rng: Rng,
    loss: u64,
    peers_on: bool,
    repo: u64,
    from_peers: u64,
    /// When the repository (one shared link) is next free.
    repo_free: u64,
}

const PEER_DELAY: u64 = 2;
/// Time the shared repository link needs per chunk.
const REPO_SERVICE: u64 = 3;
const TIMEOUT: u64 = 10;

impl Sim {
    fn new(m: usize, chunks: u32, threshold: Option<u32>, loss: u64, peers_on: bool) -> Sim {
        let config = PolicyConfig {
            unmatched_threshold: threshold,
            resume_hits: 4,
            trace_window: 8,
        };
        Sim {
            tables: (0..m)
                .map(|_| ChunkTable::new(vec![ChunkState::Remote; chunks as usize], config))
                .collect(),
            known: vec![HashSet::new(); m],
            coming: vec![HashSet::new(); m],
            events: BTreeMap::new(),
            seq: 0,
            rng: Rng::new(7),
            loss,
            peers_on,
            repo: 0,
            from_peers: 0,
            repo_free: 0,
        }
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((t, self.seq), ev);
    }

    /// Starts a fetch of `c` by `m` at time `t`: from a peer that
    /// advertised it (a lost reply costs a timeout, then the repository);
    /// if a peer announced it is fetching it, waits for that (up to the
    /// timeout); else from the repository, announcing it.
    fn fetch(&mut self, t: u64, m: usize, c: u32, since: u64) {
        if self.peers_on && self.known[m].contains(&c) {
            if self.rng.below(100) as u64 >= self.loss {
                return self.at(t + PEER_DELAY, Ev::Done { m, c, peer: true });
            }
            let done = self.repo_slot(t + TIMEOUT);
            return self.at(done, Ev::Done { m, c, peer: false });
        }
        if self.peers_on && self.coming[m].contains(&c) && t < since + TIMEOUT {
            return self.at(t + 1, Ev::Retry { m, c, since });
        }
        if self.peers_on {
            for to in (0..self.tables.len()).filter(|to| *to != m) {
                let d = 1 + self.rng.below(2) as u64;
                self.at(t + d, Ev::Coming { to, c });
            }
        }
        let done = self.repo_slot(t);
        self.at(done, Ev::Done { m, c, peer: false });
    }

    /// When a repository read issued at `t` completes (reads queue on one link).
    fn repo_slot(&mut self, t: u64) -> u64 {
        self.repo_free = self.repo_free.max(t) + REPO_SERVICE;
        self.repo_free
    }

    /// Runs until every mirror has read its pattern; returns the end time.
    fn run(&mut self, patterns: &[Vec<u32>], starts: &[u64]) -> u64 {
        let n = self.tables.len();
        let mut pos = vec![0usize; n];
        let mut prefetching: Vec<Option<u32>> = vec![None; n];
        for t in 0..100_000u64 {
            while let Some((&(when, seq), &ev)) = self.events.iter().next() {
                if when > t {
                    break;
                }
                self.events.remove(&(when, seq));
                match ev {
                    Ev::Coming { to, c } => {
                        self.coming[to].insert(c);
                    }
                    Ev::Retry { m, c, since } => self.fetch(t, m, c, since),
                    Ev::Advert { to, c } => {
                        self.known[to].insert(c);
                        self.tables[to].on_advert(c);
                    }
                    Ev::Done { m, c, peer } => {
                        if peer {
                            self.from_peers += 1;
                        } else {
                            self.repo += 1;
                        }
                        let was_demand = self.tables[m].state(c) == ChunkState::Fetching;
                        if prefetching[m] == Some(c) {
                            prefetching[m] = None;
                        }
                        if self.tables[m].may_land(c) && self.tables[m].landed(c).holds_image_data()
                        {
                            let on = self.peers_on;
                            for to in (0..n).filter(|to| *to != m && on) {
                                let d = 1 + self.rng.below(3) as u64;
                                self.at(t + d, Ev::Advert { to, c });
                            }
                        }
                        if peer && was_demand {
                            self.tables[m].demand_from_peer(c);
                        }
                    }
                }
            }
            if (0..n).all(|m| pos[m] == patterns[m].len()) {
                return t;
            }
            for m in 0..n {
                if t < starts[m] {
                    continue;
                }
                if pos[m] < patterns[m].len() {
                    let c = patterns[m][pos[m]];
                    match self.tables[m].begin_read(c) {
                        Access::Ready => pos[m] += 1,
                        Access::Fetch => self.fetch(t, m, c, t),
                        Access::Wait => {}
                    }
                }
                if prefetching[m].is_none() {
                    if let Some((c, _)) = self.tables[m].next_prefetch() {
                        prefetching[m] = Some(c);
                        self.fetch(t, m, c, t);
                    }
                }
            }
        }
        panic!("simulation did not finish");
    }

    fn unread(&self) -> Vec<u64> {
        self.tables
            .iter()
            .map(|t| {
                t.states()
                    .iter()
                    .filter(|s| matches!(s, ChunkState::Local { .. }))
                    .count() as u64
            })
            .collect()
    }
}

#[test]
fn shifted_same_pattern_is_served_mostly_by_peers_despite_losses() {
    let (m, chunks) = (8, 200u32);
    let patterns = vec![(0..chunks).collect::<Vec<_>>(); m];
    let starts: Vec<u64> = (0..m as u64).map(|i| i * 20).collect();
    let mut alone = Sim::new(m, chunks, Some(64), 0, false);
    let t_alone = alone.run(&patterns, &starts);
    assert_eq!(alone.repo, m as u64 * chunks as u64);
    let mut shared = Sim::new(m, chunks, Some(64), 10, true);
    let t_shared = shared.run(&patterns, &starts);
    for t in &shared.tables {
        assert!((0..chunks).all(|c| t.state(c) == ChunkState::Read));
    }
    eprintln!(
        "shifted-same: {} repository and {} peer fetches ({} alone), {t_shared} vs {t_alone} ticks",
        shared.repo, shared.from_peers, alone.repo
    );
    // Announced repository fetches are shared (a waiter gives up after the
    // timeout, and lost replies cost a repository read).
    assert!(
        shared.repo * 3 < alone.repo * 2,
        "{} repository fetches",
        shared.repo
    );
    assert!(t_shared * 3 < t_alone * 2, "{t_shared} vs {t_alone}");
}

#[test]
fn divergent_patterns_waste_at_most_the_threshold() {
    let (m, chunks) = (6, 600u32);
    let patterns: Vec<Vec<u32>> = (0..m as u32)
        .map(|i| (i * 100..i * 100 + 100).collect())
        .collect();
    let starts = vec![0; m];
    let mut adaptive = Sim::new(m, chunks, Some(16), 0, true);
    adaptive.run(&patterns, &starts);
    let mut unlimited = Sim::new(m, chunks, None, 0, true);
    unlimited.run(&patterns, &starts);
    let a: u64 = adaptive.unread().iter().sum();
    let u: u64 = unlimited.unread().iter().sum();
    assert!(
        adaptive.unread().iter().all(|n| *n <= 16),
        "{:?}",
        adaptive.unread()
    );
    assert!(adaptive.tables.iter().all(|t| !t.counters().prefetch_on));
    assert!(
        a as f64 * 4.5 <= u as f64,
        "adaptive {a} unread, unlimited {u}"
    );
}

#[test]
fn converging_patterns_switch_prefetch_back_on() {
    // Mirror 1 first reads elsewhere (prefetch stops), then follows mirror 0.
    let chunks = 400u32;
    let p0: Vec<u32> = (0..300).collect();
    let p1: Vec<u32> = (300..400).chain(0..300).collect();
    let mut sim = Sim::new(2, chunks, Some(16), 0, true);
    sim.run(&[p0, p1], &[0, 0]);
    let k = sim.tables[1].counters();
    assert!(k.switched_off >= 1 && k.switched_on >= 1, "{k:?}");
}
