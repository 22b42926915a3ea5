//! The client's side of the replica choice ([`super::choice`]): the
//! policy setting, the view of every node, and the idle probes that keep
//! estimates fresh for nodes no Get has read lately.

use super::choice::{Candidate, Choice, NodeView, ReplicaChoice};
use super::replica::Replica;
use super::Client;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use strata_store_protocol::table::{State, Table};
use tokio::net::TcpStream;

/// How often the probe task looks for nodes to probe.
const PROBE_PERIOD_MS: u64 = 500;
/// A client is idle when it has sent no read for this long: only then
/// does it probe, so probes never compete with its Gets.
const IDLE_MS: u64 = 1_000;
/// A node not sampled for this long gets a probe while the client idles.
const STALE_MS: u64 = 2_000;
/// Most nodes probed per round (a bound on connections opened at once).
const PROBES_PER_ROUND: usize = 8;
/// A probe that takes longer counts as a failure.
const PROBE_TIMEOUT_MS: u64 = 1_000;

/// The choice shared by a client and its probe task.
pub(super) type SharedChoice = Arc<Mutex<Choice>>;

/// A new choice by `policy`, seeded from the operating system (or the
/// clock if it has no randomness to give).
pub(super) fn new_choice(policy: ReplicaChoice) -> SharedChoice {
    let mut seed = [0u8; 8];
    let seed = match getrandom::fill(&mut seed) {
        Ok(()) => u64::from_le_bytes(seed),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    Arc::new(Mutex::new(Choice::new(policy, seed)))
}

/// Probes, in the background, the nodes that went unsampled while the
/// client idles; ends when the client is dropped.
pub(super) fn spawn_probes(choice: &SharedChoice) {
    let weak = Arc::downgrade(choice);
    // Outside a runtime (never, as `connect` is async) there is no task.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(probe_loop(weak));
    }
}

async fn probe_loop(choice: Weak<Mutex<Choice>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(PROBE_PERIOD_MS)).await;
        let Some(shared) = choice.upgrade() else {
            return;
        };
        let due = lock(&shared).due_probes(
            Instant::now(),
            Duration::from_millis(IDLE_MS),
            Duration::from_millis(STALE_MS),
            PROBES_PER_ROUND,
        );
        // Not held across the probes: the client keeps its choice.
        drop(shared);
        for candidate in due {
            let latency = probe(candidate).await;
            let Some(shared) = choice.upgrade() else {
                return;
            };
            lock(&shared).probe_sample(candidate.node, latency, Instant::now());
        }
    }
}

/// A light probe: a TCP connection to the node's data endpoint, timed
/// (the node answers the handshake, and closes quietly on the empty
/// connection). `None` if it fails or takes past [`PROBE_TIMEOUT_MS`].
async fn probe(candidate: Candidate) -> Option<Duration> {
    let start = Instant::now();
    let limit = Duration::from_millis(PROBE_TIMEOUT_MS);
    match tokio::time::timeout(limit, TcpStream::connect(candidate.endpoint)).await {
        Ok(Ok(_stream)) => Some(start.elapsed()),
        _ => None,
    }
}

fn lock(choice: &Mutex<Choice>) -> std::sync::MutexGuard<'_, Choice> {
    choice.lock().unwrap_or_else(|e| e.into_inner())
}

impl Client {
    /// How this client picks the replica a Get reads first.
    pub fn replica_choice(&self) -> ReplicaChoice {
        lock(&self.choice).policy()
    }

    /// Picks replicas by `policy` from now on (estimates are kept).
    pub fn set_replica_choice(&self, policy: ReplicaChoice) {
        lock(&self.choice).set_policy(policy);
    }

    /// Every storage node this client has read from or probed: its
    /// latency estimate, weight, share and reads sent.
    pub fn replica_view(&self) -> Vec<NodeView> {
        lock(&self.choice).view()
    }

    /// Probes every storage node of the table that is not dead, `rounds`
    /// times one after another (for `strata store status --client`).
    pub async fn probe_nodes(&self, rounds: usize) {
        let table = self.table();
        let nodes = storage_candidates(&table);
        for candidate in &nodes {
            lock(&self.choice).learn(*candidate);
        }
        for _ in 0..rounds {
            for candidate in &nodes {
                let latency = probe(*candidate).await;
                lock(&self.choice).probe_sample(candidate.node, latency, Instant::now());
            }
        }
    }

    /// The order in which a Get tries `replicas` (record order in, the
    /// policy's first then the rest).
    pub(super) fn replica_order(&self, replicas: &[Replica]) -> Vec<usize> {
        let candidates: Vec<Candidate> = replicas.iter().map(Replica::candidate).collect();
        lock(&self.choice).order(&candidates)
    }

    /// Counts a read sent to `replica`'s node.
    pub(super) fn read_sent(&self, replica: &Replica) {
        lock(&self.choice).read_sent(replica.candidate(), Instant::now());
    }

    /// A latency sample of `replica`'s node from a Get (`None`: it failed).
    pub(super) fn read_sample(&self, replica: &Replica, latency: Option<Duration>) {
        lock(&self.choice).read_sample(replica.node, latency, Instant::now());
    }
}

/// The table's storage nodes that are not dead, as probe targets.
fn storage_candidates(table: &Table) -> Vec<Candidate> {
    table
        .sns
        .iter()
        .filter(|s| s.state != State::Dead)
        .map(|s| Candidate {
            node: s.uuid,
            endpoint: s.endpoint,
        })
        .collect()
}
