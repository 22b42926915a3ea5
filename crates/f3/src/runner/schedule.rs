//! Where a step runs: the three schedulers, over what the runner knows
//! of each live node at that moment (free slots, a warm sandbox for the
//! step's function, bytes of the step's inputs held there). Pure: the
//! runner gathers the candidates, these choose.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerKind {
    /// The node holding most bytes of the inputs, a warm one first among
    /// equals, skipping full nodes.
    Locality,
    /// A node with a free slot, chosen by a seeded random generator.
    Random,
    /// The nodes in turn (by name), skipping full ones.
    RoundRobin,
}

impl SchedulerKind {
    /// `locality`, `random` or `round-robin`.
    pub fn label(self) -> &'static str {
        match self {
            SchedulerKind::Locality => "locality",
            SchedulerKind::Random => "random",
            SchedulerKind::RoundRobin => "round-robin",
        }
    }
}

/// One live node as a scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The node's name.
    pub node: String,
    /// Invocations it could start now.
    pub free_slots: u32,
    /// It keeps a warm sandbox of the step's function.
    pub warm: bool,
    /// Bytes of the step's inputs it holds.
    pub input_bytes: u64,
    /// It holds an input that a running step still writes there (whose
    /// bytes are still to come), which the step streams.
    pub producing: bool,
}

/// A scheduler's choice and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The node.
    pub node: String,
    /// Why it, in words.
    pub reason: String,
}

/// A scheduler with its state (the random generator, the next turn).
#[derive(Debug)]
pub struct Scheduler {
    kind: SchedulerKind,
    seed: u64,
    random: StdRng,
    turn: usize,
}

impl Scheduler {
    /// A scheduler of `kind`; `seed` drives the random one.
    pub fn new(kind: SchedulerKind, seed: u64) -> Scheduler {
        Scheduler {
            kind,
            seed,
            random: StdRng::seed_from_u64(seed),
            turn: 0,
        }
    }

    /// A node for a step whose inputs total `input_bytes`, among
    /// `candidates` (sorted by name); none when no node has a free slot.
    pub fn choose(&mut self, candidates: &[Candidate], input_bytes: u64) -> Option<Choice> {
        match self.kind {
            SchedulerKind::Locality => locality(candidates, input_bytes),
            SchedulerKind::Random => {
                let free: Vec<&Candidate> =
                    candidates.iter().filter(|c| c.free_slots > 0).collect();
                if free.is_empty() {
                    return None;
                }
                let pick = free[self.random.random_range(0..free.len())];
                Some(Choice {
                    node: pick.node.clone(),
                    reason: format!(
                        "random (seed {}) among {} free nodes",
                        self.seed,
                        free.len()
                    ),
                })
            }
            SchedulerKind::RoundRobin => {
                let count = candidates.len();
                let pick = (0..count)
                    .map(|k| (self.turn + k) % count)
                    .find(|&i| candidates[i].free_slots > 0)?;
                self.turn = pick + 1;
                Some(Choice {
                    node: candidates[pick].node.clone(),
                    reason: format!("round-robin: node {} of {count}", pick + 1),
                })
            }
        }
    }
}

/// Most input bytes first, then a node still writing a streamed input,
/// then a warm sandbox, then most free slots, then name; the first with
/// a free slot.
fn locality(candidates: &[Candidate], input_bytes: u64) -> Option<Choice> {
    let mut ranked: Vec<&Candidate> = candidates.iter().collect();
    ranked.sort_by(|a, b| {
        b.input_bytes
            .cmp(&a.input_bytes)
            .then(b.producing.cmp(&a.producing))
            .then(b.warm.cmp(&a.warm))
            .then(b.free_slots.cmp(&a.free_slots))
            .then(a.node.cmp(&b.node))
    });
    let position = ranked.iter().position(|c| c.free_slots > 0)?;
    let pick = ranked[position];
    let mut reason = if input_bytes == 0 {
        "no input bytes to be near".to_string()
    } else {
        format!("holds {} of {input_bytes} input bytes", pick.input_bytes)
    };
    if pick.producing {
        reason.push_str("; writes a streamed input");
    }
    if pick.warm {
        reason.push_str("; warm sandbox");
    }
    if position > 0 {
        let full: Vec<&str> = ranked[..position].iter().map(|c| c.node.as_str()).collect();
        reason.push_str(&format!("; {} had no free slot", full.join(", ")));
    }
    Some(Choice {
        node: pick.node.clone(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, free_slots: u32, warm: bool, input_bytes: u64) -> Candidate {
        Candidate {
            node: name.into(),
            free_slots,
            warm,
            input_bytes,
            producing: false,
        }
    }

    fn pick(scheduler: &mut Scheduler, candidates: &[Candidate]) -> String {
        scheduler.choose(candidates, 100).unwrap().node
    }

    #[test]
    fn locality_prefers_bytes_then_warm_and_skips_full_nodes() {
        let mut s = Scheduler::new(SchedulerKind::Locality, 0);
        let nodes = [
            node("a", 1, true, 10),
            node("b", 1, false, 90),
            node("c", 1, false, 0),
        ];
        assert_eq!(pick(&mut s, &nodes), "b");
        let tie = [node("a", 1, false, 50), node("b", 1, true, 50)];
        let choice = s.choose(&tie, 100).unwrap();
        assert_eq!(choice.node, "b");
        assert!(choice.reason.contains("warm"), "{}", choice.reason);
        let full = [node("a", 1, false, 10), node("b", 0, false, 90)];
        let choice = s.choose(&full, 100).unwrap();
        assert_eq!(choice.node, "a");
        assert!(
            choice.reason.contains("b had no free slot"),
            "{}",
            choice.reason
        );
        assert!(s.choose(&[node("a", 0, true, 5)], 5).is_none());
        let mut writer = node("b", 1, false, 0);
        writer.producing = true;
        let streaming = [node("a", 4, true, 0), writer];
        let choice = s.choose(&streaming, 0).unwrap();
        assert_eq!(choice.node, "b");
        assert!(choice.reason.contains("streamed"), "{}", choice.reason);
    }

    #[test]
    fn round_robin_takes_turns_and_skips_full_nodes() {
        let mut s = Scheduler::new(SchedulerKind::RoundRobin, 0);
        let nodes = [
            node("a", 1, false, 0),
            node("b", 1, false, 0),
            node("c", 1, false, 0),
        ];
        let picks: Vec<String> = (0..4).map(|_| pick(&mut s, &nodes)).collect();
        assert_eq!(picks, ["a", "b", "c", "a"]);
        let b_full = [
            node("a", 1, false, 0),
            node("b", 0, false, 0),
            node("c", 1, false, 0),
        ];
        assert_eq!(pick(&mut s, &b_full), "c");
    }

    #[test]
    fn random_is_repeatable_by_seed_and_uses_every_node() {
        let nodes = [
            node("a", 1, false, 0),
            node("b", 1, false, 0),
            node("c", 1, false, 0),
        ];
        let run = |seed| {
            let mut s = Scheduler::new(SchedulerKind::Random, seed);
            (0..32).map(|_| pick(&mut s, &nodes)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        for name in ["a", "b", "c"] {
            assert!(run(7).iter().any(|n| n == name));
        }
        let mut s = Scheduler::new(SchedulerKind::Random, 1);
        assert_eq!(
            pick(&mut s, &[node("a", 0, false, 0), node("b", 1, false, 0)]),
            "b"
        );
    }
}
