//! Which replica a Get reads first: NAMI's load-aware choice (thesis
//! `seeds/000_4f38b2951dc955a2.txt`, chapter 4, section 4.3), or the
//! record's order (`primary`, the choice before NAMI), or uniform random.
//!
//! Pure and deterministic: the caller passes the clock and the latencies
//! it measured, and the randomness is a seeded generator, so a test
//! replays a choice exactly.
//!
//! What comes from the thesis and what is ours:
//! - The ranking rule, latencies to weights, is the thesis's Algorithm 1,
//!   "Latency-ordered weighting" (§4.3.3.1): the node with the lowest
//!   latency gets the highest weight. [`latency_ordered_weights`].
//! - The draw is the thesis's Object Requester (§4.3.4.1): a node at
//!   random in proportion to the weights; if it holds no replica of the
//!   object, the replica on the node of highest weight.
//! - Ours (the thesis has a periodic collector with no figures for it):
//!   the per-node latency estimate is an EWMA of passive round trips
//!   ([`EWMA_ALPHA`]); a floor keeps every node's chance at no less than
//!   half its uniform share ([`FLOOR_OF_UNIFORM`]), so no node starves of
//!   samples; a failed read counts as a sample of [`MAX_LATENCY_MS`].
//!
//! The thesis's Algorithm 2 (participatory weighting) needs the latencies
//! other clients measured, from a shared weight database this client does
//! not have; it is not implemented.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Weight of a new sample in a node's latency estimate (ours: the thesis
/// gives none). 0.3 follows a step in latency within a few Gets.
pub const EWMA_ALPHA: f64 = 0.3;
/// Largest latency a sample may have (ms): larger ones, and failed reads,
/// count as this much, so one sample cannot overflow an estimate.
pub const MAX_LATENCY_MS: f64 = 60_000.0;
/// Every node's chance of being drawn is at least this fraction of its
/// uniform share (1/m of m nodes), so even the slowest keeps getting
/// samples and is seen when it recovers.
pub const FLOOR_OF_UNIFORM: f64 = 0.5;
/// Most storage nodes a client keeps estimates for (a bound on memory
/// however many nodes the table lists over time).
pub const MAX_NODES: usize = 4096;

/// How a client picks the replica a Get reads first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicaChoice {
    /// NAMI: at random, weighted by the ranks of measured latencies.
    #[default]
    Nami,
    /// The record's order: its first replica, the others on failure.
    Primary,
    /// Uniform random among the record's replicas.
    Uniform,
}

impl ReplicaChoice {
    /// Every choice, by name.
    pub const ALL: [ReplicaChoice; 3] = [
        ReplicaChoice::Nami,
        ReplicaChoice::Primary,
        ReplicaChoice::Uniform,
    ];

    /// Its name: `nami`, `primary` or `uniform`.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaChoice::Nami => "nami",
            ReplicaChoice::Primary => "primary",
            ReplicaChoice::Uniform => "uniform",
        }
    }
}

impl std::str::FromStr for ReplicaChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<ReplicaChoice, String> {
        ReplicaChoice::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!("unknown replica choice '{s}': expected nami, primary or uniform")
            })
    }
}

/// How much higher than another a latency estimate must be to rank as
/// slower (ours): estimates of equally fast nodes differ by noise, and
/// ranking by noise would give them weights m, m-1, ... 1 by chance and
/// skew their load. The thesis leaves the "acceptable latency threshold"
/// to the system (§4.3.3.1). Relative part.
pub const TIE_RELATIVE: f64 = 0.25;
/// Absolute part of [`TIE_RELATIVE`], in ms: sub-millisecond estimates on
/// a quiet network differ by tens of microseconds for nothing.
pub const TIE_ABSOLUTE_MS: f64 = 0.05;

/// The thesis's Algorithm 1 (§4.3.3.1), latencies to weights: a node's
/// weight is 1 plus the number of nodes with a higher latency, so of m
/// nodes the fastest gets m and the slowest 1. Ties share a weight, as in
/// the thesis's Table 4.2 (latencies 1, 1, 2 give 2, 2, 1); a latency
/// counts as higher only beyond [`TIE_RELATIVE`] and [`TIE_ABSOLUTE_MS`].
/// A node with no estimate yet (`None`) ranks as the fastest, so that it
/// gets sampled.
pub fn latency_ordered_weights(latencies_ms: &[Option<f64>]) -> Vec<u32> {
    let key = |l: &Option<f64>| l.map_or(0.0, clamp_latency);
    latencies_ms
        .iter()
        .map(|mine| {
            let beyond = key(mine) * (1.0 + TIE_RELATIVE) + TIE_ABSOLUTE_MS;
            let slower = latencies_ms.iter().filter(|l| key(l) > beyond).count();
            1 + u32::try_from(slower).unwrap_or(u32::MAX - 1)
        })
        .collect()
}

/// Probabilities in proportion to `weights`, none below
/// [`FLOOR_OF_UNIFORM`] of the uniform share: nodes under the floor are
/// raised to it and the rest share what is left in proportion to their
/// weights. Sums to 1 (an empty input gives an empty output, weights
/// all 0 give uniform shares).
pub fn floored_shares(weights: &[u32]) -> Vec<f64> {
    let count = weights.len();
    if weights.iter().all(|&w| w == 0) {
        return vec![1.0 / count as f64; count];
    }
    let floor = FLOOR_OF_UNIFORM / count as f64;
    let mut floored = vec![false; count];
    // Each pass floors at least one more node or stops: at most `count`.
    for _ in 0..count {
        let free_mass = 1.0 - floor * floored.iter().filter(|&&f| f).count() as f64;
        let free_weight: f64 = (0..count)
            .filter(|&i| !floored[i])
            .map(|i| f64::from(weights[i]))
            .sum();
        let mut changed = false;
        for i in 0..count {
            let share = if free_weight > 0.0 {
                free_mass * f64::from(weights[i]) / free_weight
            } else {
                0.0
            };
            if !floored[i] && share < floor {
                floored[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let free_mass = 1.0 - floor * floored.iter().filter(|&&f| f).count() as f64;
    let free_weight: f64 = (0..count)
        .filter(|&i| !floored[i])
        .map(|i| f64::from(weights[i]))
        .sum();
    (0..count)
        .map(|i| {
            if floored[i] || free_weight <= 0.0 {
                floor
            } else {
                free_mass * f64::from(weights[i]) / free_weight
            }
        })
        .collect()
}

/// A latency fit for an estimate: NaN and negative values as 0, infinite
/// and huge ones as [`MAX_LATENCY_MS`].
fn clamp_latency(ms: f64) -> f64 {
    if ms.is_nan() || ms < 0.0 {
        0.0
    } else {
        ms.min(MAX_LATENCY_MS)
    }
}

/// A small seeded generator (SplitMix64): deterministic for tests, and
/// good enough to spread reads (nothing secret depends on it).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What a client knows of one storage node.
#[derive(Clone, Debug)]
struct NodeState {
    endpoint: SocketAddr,
    estimate_ms: Option<f64>,
    last_sample: Option<Instant>,
    reads: u64,
    samples: u64,
    probes: u64,
}

/// One storage node as the client sees it ([`Choice::view`]).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// The node's persistent identity.
    pub node: u64,
    /// Its data endpoint.
    pub endpoint: SocketAddr,
    /// The latency estimate (ms), if sampled yet.
    pub latency_ms: Option<f64>,
    /// Its weight by the thesis's Algorithm 1 among the nodes listed.
    pub weight: u32,
    /// Its chance of being drawn first under NAMI (after the floor).
    pub share: f64,
    /// Reads sent to it (each replica a Get tried).
    pub reads: u64,
    /// Latency samples taken from its reads.
    pub samples: u64,
    /// Latency samples taken by idle probes.
    pub probes: u64,
}

/// A replica a Get may read: its storage node and that node's endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The storage node's identity.
    pub node: u64,
    /// The node's data endpoint (for probes).
    pub endpoint: SocketAddr,
}

/// The client's replica choice: the policy, the generator and each
/// storage node's latency estimate and counters.
#[derive(Debug)]
pub struct Choice {
    policy: ReplicaChoice,
    rng: Rng,
    nodes: HashMap<u64, NodeState>,
    last_read: Option<Instant>,
}

impl Choice {
    /// A choice by `policy`, drawing from a generator seeded with `seed`.
    pub fn new(policy: ReplicaChoice, seed: u64) -> Choice {
        Choice {
            policy,
            rng: Rng::new(seed),
            nodes: HashMap::new(),
            last_read: None,
        }
    }

    /// The policy in use.
    pub fn policy(&self) -> ReplicaChoice {
        self.policy
    }

    /// Uses `policy` from now on (estimates and counters are kept).
    pub fn set_policy(&mut self, policy: ReplicaChoice) {
        self.policy = policy;
    }

    /// The order in which to try `replicas` (given in record order, each
    /// the index of a replica and its node): the first by the policy, the
    /// rest in record order as fallbacks. Nodes are ranked among the
    /// replicas' nodes and every node the client has measured.
    pub fn order(&mut self, replicas: &[Candidate]) -> Vec<usize> {
        for r in replicas {
            self.learn(*r);
        }
        let first = match self.policy {
            ReplicaChoice::Primary => None,
            ReplicaChoice::Uniform if replicas.is_empty() => None,
            ReplicaChoice::Uniform => {
                let pick = (self.rng.unit() * replicas.len() as f64) as usize;
                Some(pick.min(replicas.len() - 1))
            }
            ReplicaChoice::Nami => self.nami_first(replicas),
        };
        let mut order: Vec<usize> = first.into_iter().collect();
        order.extend((0..replicas.len()).filter(|i| Some(*i) != first));
        order
    }

    /// The thesis's request routing (§4.3.4.1 "Node Selection" and
    /// "Request Redirection"): a node drawn in proportion to the floored
    /// weights; if it holds none of `replicas`, the replica whose node
    /// has the highest weight.
    fn nami_first(&mut self, replicas: &[Candidate]) -> Option<usize> {
        if replicas.is_empty() {
            return None;
        }
        let (ids, weights, shares) = self.ranked();
        let mut point = self.rng.unit();
        let mut drawn = ids.last().copied();
        for (id, share) in ids.iter().zip(&shares) {
            if point < *share {
                drawn = Some(*id);
                break;
            }
            point -= share;
        }
        if let Some(i) = replicas.iter().position(|r| Some(r.node) == drawn) {
            return Some(i);
        }
        let weight_of = |node: u64| {
            ids.iter()
                .position(|&id| id == node)
                .map_or(0, |k| weights[k])
        };
        // The first replica of the highest weight: ties keep record order.
        (0..replicas.len())
            .rev()
            .max_by_key(|&i| weight_of(replicas[i].node))
    }

    /// The nodes known, by identity, with their weights and shares.
    fn ranked(&self) -> (Vec<u64>, Vec<u32>, Vec<f64>) {
        let mut ids: Vec<u64> = self.nodes.keys().copied().collect();
        ids.sort_unstable();
        let latencies: Vec<Option<f64>> = ids.iter().map(|id| self.nodes[id].estimate_ms).collect();
        let weights = latency_ordered_weights(&latencies);
        let shares = floored_shares(&weights);
        (ids, weights, shares)
    }

    /// Remembers `candidate`'s node (within [`MAX_NODES`]; a node past the
    /// bound is chosen among but not remembered).
    pub fn learn(&mut self, candidate: Candidate) {
        if let Some(state) = self.nodes.get_mut(&candidate.node) {
            state.endpoint = candidate.endpoint;
        } else if self.nodes.len() < MAX_NODES {
            self.nodes.insert(
                candidate.node,
                NodeState {
                    endpoint: candidate.endpoint,
                    estimate_ms: None,
                    last_sample: None,
                    reads: 0,
                    samples: 0,
                    probes: 0,
                },
            );
        }
    }

    /// Counts a read sent to `candidate`'s node at `now`.
    pub fn read_sent(&mut self, candidate: Candidate, now: Instant) {
        self.learn(candidate);
        self.last_read = Some(now);
        if let Some(state) = self.nodes.get_mut(&candidate.node) {
            state.reads += 1;
        }
    }

    /// Takes a latency sample of `node` from one of its reads (`None`:
    /// the read failed, which counts as [`MAX_LATENCY_MS`]).
    pub fn read_sample(&mut self, node: u64, latency: Option<Duration>, now: Instant) {
        self.sample(node, latency, now, false);
    }

    /// Takes a latency sample of `node` from an idle probe (`None`: the
    /// probe failed or timed out).
    pub fn probe_sample(&mut self, node: u64, latency: Option<Duration>, now: Instant) {
        self.sample(node, latency, now, true);
    }

    fn sample(&mut self, node: u64, latency: Option<Duration>, now: Instant, probe: bool) {
        let Some(state) = self.nodes.get_mut(&node) else {
            return;
        };
        let ms = latency.map_or(MAX_LATENCY_MS, |d| clamp_latency(d.as_secs_f64() * 1e3));
        let estimate = match state.estimate_ms {
            Some(old) => old + EWMA_ALPHA * (ms - old),
            None => ms,
        };
        debug_assert!(estimate.is_finite() && (0.0..=MAX_LATENCY_MS).contains(&estimate));
        state.estimate_ms = Some(estimate);
        state.last_sample = Some(now);
        if probe {
            state.probes += 1;
        } else {
            state.samples += 1;
        }
    }

    /// The nodes to probe at `now`: when no read was sent for `idle`,
    /// those not sampled for `stale`, at most `most` of them (the longest
    /// unsampled first).
    pub fn due_probes(
        &self,
        now: Instant,
        idle: Duration,
        stale: Duration,
        most: usize,
    ) -> Vec<Candidate> {
        let older = |t: Option<Instant>, bound: Duration| {
            t.is_none_or(|t| now.saturating_duration_since(t) >= bound)
        };
        if !older(self.last_read, idle) {
            return Vec::new();
        }
        let mut due: Vec<(Option<Instant>, Candidate)> = self
            .nodes
            .iter()
            .filter(|(_, s)| older(s.last_sample, stale))
            .map(|(&node, s)| {
                let candidate = Candidate {
                    node,
                    endpoint: s.endpoint,
                };
                (s.last_sample, candidate)
            })
            .collect();
        due.sort_by_key(|(t, c)| (*t, c.node));
        due.into_iter().take(most).map(|(_, c)| c).collect()
    }

    /// Every known node's estimate, weight, share and counters, by identity.
    pub fn view(&self) -> Vec<NodeView> {
        let (ids, weights, shares) = self.ranked();
        ids.iter()
            .zip(weights)
            .zip(shares)
            .map(|((id, weight), share)| {
                let s = &self.nodes[id];
                NodeView {
                    node: *id,
                    endpoint: s.endpoint,
                    latency_ms: s.estimate_ms,
                    weight,
                    share,
                    reads: s.reads,
                    samples: s.samples,
                    probes: s.probes,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(count: u64) -> Vec<Candidate> {
        (0..count)
            .map(|node| Candidate {
                node,
                endpoint: SocketAddr::from(([127, 0, 0, 1], 9000 + node as u16)),
            })
            .collect()
    }

    fn ms(value: f64) -> Option<Duration> {
        Some(Duration::from_secs_f64(value / 1e3))
    }

    /// A choice whose nodes 0..latencies.len() have these estimates.
    fn measured(policy: ReplicaChoice, latencies: &[f64]) -> (Choice, Vec<Candidate>) {
        let mut choice = Choice::new(policy, 7);
        let nodes = candidates(latencies.len() as u64);
        let now = Instant::now();
        for (c, &l) in nodes.iter().zip(latencies) {
            choice.read_sent(*c, now);
            choice.read_sample(c.node, ms(l), now);
        }
        (choice, nodes)
    }

    /// How often each replica is tried first over `draws` Gets.
    fn first_counts(choice: &mut Choice, replicas: &[Candidate], draws: usize) -> Vec<usize> {
        let mut counts = vec![0; replicas.len()];
        for _ in 0..draws {
            counts[choice.order(replicas)[0]] += 1;
        }
        counts
    }

    #[test]
    fn weights_follow_the_thesis_table_4_2() {
        // Table 4.1's latencies per client, Table 4.2's weights.
        let some = |v: [f64; 3]| v.map(Some).to_vec();
        assert_eq!(latency_ordered_weights(&some([1.0, 2.0, 3.0])), [3, 2, 1]);
        assert_eq!(latency_ordered_weights(&some([1.0, 1.0, 2.0])), [2, 2, 1]);
        assert_eq!(latency_ordered_weights(&some([3.0, 2.0, 1.0])), [1, 2, 3]);
    }

    #[test]
    fn estimates_that_differ_by_noise_tie() {
        let some = |v: [f64; 3]| v.map(Some).to_vec();
        // Three equally fast nodes measured a little apart: one weight.
        assert_eq!(
            latency_ordered_weights(&some([0.30, 0.33, 0.36])),
            [1, 1, 1]
        );
        assert_eq!(latency_ordered_weights(&some([1.0, 1.2, 1.1])), [1, 1, 1]);
        // One clearly slower node ranks below the others, which tie.
        assert_eq!(
            latency_ordered_weights(&some([0.30, 0.32, 0.90])),
            [2, 2, 1]
        );
    }

    #[test]
    fn an_unmeasured_node_ranks_first_and_bad_values_do_not_panic() {
        let w = latency_ordered_weights(&[Some(5.0), None, Some(f64::NAN), Some(f64::INFINITY)]);
        // None and NaN count as 0 ms, infinity as the maximum.
        assert_eq!(w, [2, 3, 3, 1]);
        assert!(latency_ordered_weights(&[]).is_empty());
        let mut choice = Choice::new(ReplicaChoice::Nami, 1);
        let nodes = candidates(2);
        let now = Instant::now();
        choice.read_sent(nodes[0], now);
        choice.read_sample(0, Some(Duration::MAX), now);
        choice.read_sample(0, Some(Duration::ZERO), now);
        choice.read_sample(0, None, now);
        choice.read_sample(99, ms(1.0), now); // unknown node: ignored
        let view = choice.view();
        let estimate = view[0].latency_ms.unwrap();
        assert!(estimate.is_finite() && (0.0..=MAX_LATENCY_MS).contains(&estimate));
        assert_eq!(view.len(), 1);
    }

    #[test]
    fn shares_keep_the_floor_and_sum_to_one() {
        for count in 1..40u32 {
            let weights: Vec<u32> = (1..=count).collect();
            let shares = floored_shares(&weights);
            let floor = FLOOR_OF_UNIFORM / f64::from(count);
            assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{count}");
            assert!(
                shares.iter().all(|&s| s >= floor - 1e-12),
                "{count}: {shares:?}"
            );
            // Still ordered by weight.
            assert!(shares.windows(2).all(|w| w[0] <= w[1] + 1e-12));
        }
        // Three nodes: the thesis's 3, 2, 1 are above the floor, untouched.
        let shares = floored_shares(&[3, 2, 1]);
        for (got, want) in shares.iter().zip([0.5, 1.0 / 3.0, 1.0 / 6.0]) {
            assert!((got - want).abs() < 1e-9, "{shares:?}");
        }
        // Ten nodes: weight 1 of 55 (1.8%) is raised to the floor (5%).
        let weights: Vec<u32> = (1..=10).collect();
        assert!((floored_shares(&weights)[0] - 0.05).abs() < 1e-9);
        assert!(floored_shares(&[]).is_empty());
        assert!((floored_shares(&[0, 0])[0] - 0.5).abs() < 1e-9);
    }

    #[test]
    fn nami_draws_in_proportion_to_the_weights() {
        let (mut choice, nodes) = measured(ReplicaChoice::Nami, &[1.0, 2.0, 9.0]);
        let draws = 60_000;
        let counts = first_counts(&mut choice, &nodes, draws);
        for (count, want) in counts.iter().zip([0.5, 1.0 / 3.0, 1.0 / 6.0]) {
            let got = *count as f64 / draws as f64;
            assert!((got - want).abs() < 0.01, "{counts:?}");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let (mut a, nodes) = measured(ReplicaChoice::Nami, &[1.0, 2.0, 3.0]);
        let (mut b, _) = measured(ReplicaChoice::Nami, &[1.0, 2.0, 3.0]);
        let orders = |c: &mut Choice| (0..100).map(|_| c.order(&nodes)).collect::<Vec<_>>();
        assert_eq!(orders(&mut a), orders(&mut b));
    }

    #[test]
    fn a_node_without_the_replica_sends_the_read_to_the_best_holder() {
        // Four nodes measured; the object is on nodes 1, 2 and 3 only. A
        // draw of node 0 (the fastest) goes to node 1, the best holder.
        let (mut choice, nodes) = measured(ReplicaChoice::Nami, &[1.0, 2.0, 3.0, 4.0]);
        let replicas = &nodes[1..];
        let draws = 40_000;
        let counts = first_counts(&mut choice, replicas, draws);
        // Weights 4, 3, 2, 1: node 3's 0.1 is raised to the floor (1/8),
        // the rest share 7/8 as 4:3:2; node 1 gets its own and node 0's.
        let rest = 7.0 / 8.0 / 9.0;
        for (count, want) in counts.iter().zip([7.0 * rest, 2.0 * rest, 0.125]) {
            let got = *count as f64 / draws as f64;
            assert!((got - want).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn the_slowest_node_is_not_starved() {
        let (mut choice, nodes) = measured(ReplicaChoice::Nami, &[1.0, 1.1, 1.2, 1.3, 1e9]);
        let draws = 50_000;
        let counts = first_counts(&mut choice, &nodes, draws);
        let floor = FLOOR_OF_UNIFORM / 5.0;
        assert!(counts[4] as f64 / draws as f64 > floor - 0.01, "{counts:?}");
    }

    #[test]
    fn primary_keeps_the_record_order() {
        let (mut choice, nodes) = measured(ReplicaChoice::Primary, &[9.0, 1.0, 2.0]);
        for _ in 0..1000 {
            assert_eq!(choice.order(&nodes), [0, 1, 2]);
        }
        assert!(choice.order(&[]).is_empty());
    }

    #[test]
    fn uniform_spreads_evenly_and_keeps_the_rest_in_order() {
        let (mut choice, nodes) = measured(ReplicaChoice::Uniform, &[1.0, 2.0, 9.0]);
        let draws = 30_000;
        let counts = first_counts(&mut choice, &nodes, draws);
        for count in &counts {
            assert!(
                (*count as f64 / draws as f64 - 1.0 / 3.0).abs() < 0.015,
                "{counts:?}"
            );
        }
        for _ in 0..100 {
            let order = choice.order(&nodes);
            let rest: Vec<usize> = (0..3).filter(|i| *i != order[0]).collect();
            assert_eq!(order[1..], rest[..]);
        }
    }

    #[test]
    fn the_estimate_follows_a_change_in_latency() {
        let (mut choice, nodes) = measured(ReplicaChoice::Nami, &[1.0, 2.0]);
        let now = Instant::now();
        for _ in 0..20 {
            choice.read_sample(0, ms(10.0), now);
        }
        let view = choice.view();
        assert!(view[0].latency_ms.unwrap() > 9.0);
        assert_eq!((view[0].weight, view[1].weight), (1, 2));
        assert_eq!(view[0].reads, 1);
        assert_eq!(nodes.len(), 2);
    }

    #[test]
    fn probes_go_to_stale_nodes_only_while_idle() {
        let (mut choice, nodes) = measured(ReplicaChoice::Nami, &[1.0, 2.0, 3.0]);
        let start = Instant::now();
        let (idle, stale) = (Duration::from_secs(1), Duration::from_secs(2));
        // Just read: not idle.
        assert!(choice.due_probes(start, idle, stale, 8).is_empty());
        let later = start + Duration::from_secs(3);
        choice.read_sample(1, ms(2.0), later);
        let due = choice.due_probes(later, idle, stale, 8);
        let due: Vec<u64> = due.iter().map(|c| c.node).collect();
        assert_eq!(due, [0, 2]);
        assert_eq!(choice.due_probes(later, idle, stale, 1).len(), 1);
        choice.probe_sample(0, ms(0.5), later);
        assert_eq!(choice.view()[0].probes, 1);
        choice.read_sent(nodes[0], later);
        assert!(choice.due_probes(later, idle, stale, 8).is_empty());
    }

    #[test]
    fn names_parse_and_an_unknown_one_is_refused() {
        for c in ReplicaChoice::ALL {
            assert_eq!(c.name().parse::<ReplicaChoice>(), Ok(c));
        }
        let e = "fastest".parse::<ReplicaChoice>().unwrap_err();
        assert!(e.contains("nami, primary or uniform"), "{e}");
        assert_eq!(ReplicaChoice::default(), ReplicaChoice::Nami);
    }
}
