//! The decisions of an erasure-coded read, without I/O: which sources to
//! ask, in what order, when to hedge, when to replace a fragment that
//! failed, when to read again without a fragment whose bytes were wrong,
//! and when to give up. The async readers (the client's Get in
//! `client/get.rs`, the [`crate::erasure::FragmentReader`] it and a
//! storage node's object gathering use) feed it [`Event`]s and carry out
//! the [`Action`]s it returns; the deterministic simulation
//! (`crates/store/tests/ec_read_sim.rs`) drives this very machine over a
//! simulated network with faults.
//!
//! A read goes in passes. The first may ask the node of fragment 0 for
//! the whole object (from its object cache); if that fails, each pass
//! reads the object stripe by stripe from `k` fragments, in the order
//! given, replacing a fragment that fails by the next one not yet tried
//! (positioned at the current stripe), and, with a hedge, asking for one
//! fragment more if the first stripe is late. A stripe is decoded from
//! exactly `k` shards. After the last stripe every fragment read is
//! checked against its CRC-32C and the object against its own: a
//! fragment that failed is left out of the next pass, while `k`
//! untried-or-good fragments are left; otherwise the read gives up.

use std::collections::VecDeque;

/// Something that happened to the read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The whole object came from fragment 0's node, checked against the
    /// object's size and CRC-32C.
    WholeServed,
    /// The whole-object read failed (an error, a timeout, a bad
    /// checksum): the fragments are read instead.
    WholeFailed,
    /// The current stripe's shard of this fragment arrived.
    ShardArrived(usize),
    /// This fragment failed: `damaged` if its bytes were wrong (its size
    /// or checksum), otherwise it could not be reached or read in time.
    ShardFailed {
        /// The fragment's index.
        index: usize,
        /// Its bytes were wrong (rather than unreachable).
        damaged: bool,
    },
    /// The hedge delay passed (see [`Action::ArmHedge`]).
    HedgeFired,
    /// After [`Action::Verify`]: the fragments read whose checksums
    /// failed, and whether the decoded object matched its own checksum.
    Verified {
        /// Fragments whose bytes failed their CRC-32C.
        bad: Vec<usize>,
        /// The decoded object's size and CRC-32C were right.
        object_ok: bool,
    },
}

/// What the reader is to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ask the node of fragment 0 for the whole object.
    AskWhole,
    /// A new pass over the fragments begins: rewind the output and drop
    /// every fragment stream of the last pass.
    Restart,
    /// Start the hedge timer of this pass (only when the read hedges).
    ArmHedge,
    /// Open fragment `index` and read its shard of stripe `stripe` (the
    /// shards before it are read and counted in its checksum, not used).
    Open {
        /// The fragment's index.
        index: usize,
        /// The stripe to deliver first.
        stripe: u64,
    },
    /// Read the next shard (of stripe `stripe`) of the open fragment
    /// `index`.
    Continue {
        /// The fragment's index.
        index: usize,
        /// The stripe whose shard to read.
        stripe: u64,
    },
    /// Stop reading fragment `index` (a hedge's slowest read): its
    /// stream is dropped.
    Cancel(usize),
    /// The stripe's shards are in: decode it from exactly these
    /// fragments (`k` of them, in the order they arrived).
    Decode(Vec<usize>),
    /// The last stripe is decoded: check every fragment still open
    /// against its CRC-32C and the object against its own, then report
    /// [`Event::Verified`].
    Verify,
    /// The object is read.
    Done,
    /// The read failed: fewer than `k` fragments could be read intact.
    GiveUp(String),
}

/// Where the read is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    NotStarted,
    Whole,
    Stripes,
    Verifying,
    Over,
}

/// The state of an erasure-coded read (see the module).
#[derive(Clone, Debug)]
pub struct ReadPlan {
    data: usize,
    total: usize,
    stripes: u64,
    order: Vec<usize>,
    whole: bool,
    hedge: bool,
    phase: Phase,
    /// Fragments that failed, in any pass, and whether they were damaged.
    failed: Vec<(usize, bool)>,
    /// Fragments not yet asked in this pass, in the order to ask them.
    spares: VecDeque<usize>,
    /// Fragments asked for the current stripe's shard.
    reading: Vec<usize>,
    /// Fragments whose shard of the current stripe arrived.
    arrived: Vec<usize>,
    stripe: u64,
    hedged: bool,
    /// Fragments some stripe of this pass was decoded from.
    used: Vec<usize>,
}

impl ReadPlan {
    /// A read of an object coded in `data` of `total` fragments, in
    /// `stripes` stripes, from the fragments in `order` (those some node
    /// serves, the one to try first first). With `whole`, fragment 0's
    /// node is asked for the whole object first; with `hedge`, each pass
    /// arms a hedge timer.
    pub fn new(
        data: usize,
        total: usize,
        stripes: u64,
        order: Vec<usize>,
        whole: bool,
        hedge: bool,
    ) -> ReadPlan {
        ReadPlan {
            data,
            total,
            stripes,
            order,
            whole,
            hedge,
            phase: Phase::NotStarted,
            failed: Vec::new(),
            spares: VecDeque::new(),
            reading: Vec::new(),
            arrived: Vec::new(),
            stripe: 0,
            hedged: false,
            used: Vec::new(),
        }
    }

    /// The first actions of the read.
    pub fn start(&mut self) -> Vec<Action> {
        if self.phase != Phase::NotStarted {
            return Vec::new();
        }
        if self.whole {
            self.phase = Phase::Whole;
            return vec![Action::AskWhole];
        }
        self.begin_pass()
    }

    /// The fragments that failed so far, and whether each was damaged.
    pub fn failed(&self) -> &[(usize, bool)] {
        &self.failed
    }

    /// Whether the read is over ([`Action::Done`] or [`Action::GiveUp`]
    /// was returned).
    pub fn is_over(&self) -> bool {
        self.phase == Phase::Over
    }

    /// Whether a shard of fragment `index` is awaited now (news of any
    /// other read is stale: a read cancelled or replaced).
    pub fn is_reading(&self, index: usize) -> bool {
        self.phase == Phase::Stripes && self.reading.contains(&index)
    }

    /// The stripe being read now.
    pub fn stripe(&self) -> u64 {
        self.stripe
    }

    /// What to do after `event`.
    pub fn on(&mut self, event: Event) -> Vec<Action> {
        match (self.phase, event) {
            (Phase::Whole, Event::WholeServed) => self.finish(Action::Done),
            (Phase::Whole, Event::WholeFailed) => self.begin_pass(),
            (Phase::Stripes, Event::ShardArrived(index)) => self.arrived(index),
            (Phase::Stripes, Event::ShardFailed { index, damaged }) => {
                self.shard_failed(index, damaged)
            }
            (Phase::Stripes, Event::HedgeFired) => self.hedge_fired(),
            (Phase::Verifying, Event::Verified { bad, object_ok }) => self.verified(bad, object_ok),
            // Late news of a read already given up or replaced.
            _ => Vec::new(),
        }
    }

    fn finish(&mut self, last: Action) -> Vec<Action> {
        self.phase = Phase::Over;
        vec![last]
    }

    fn record_failure(&mut self, index: usize, damaged: bool) {
        match self.failed.iter_mut().find(|(i, _)| *i == index) {
            Some(entry) => entry.1 |= damaged,
            None => self.failed.push((index, damaged)),
        }
    }

    /// Fragments not known to have failed.
    fn untried_or_good(&self) -> Vec<usize> {
        self.order
            .iter()
            .copied()
            .filter(|i| !self.failed.iter().any(|(f, _)| f == i))
            .collect()
    }

    fn too_few(&mut self) -> Vec<Action> {
        let failed: Vec<String> = self
            .failed
            .iter()
            .map(|&(index, damaged)| match damaged {
                true => format!("{index} (damaged)"),
                false => format!("{index} (unreachable)"),
            })
            .collect();
        let unserved = self.total - self.order.len();
        let why = format!(
            "fewer than {} of the {} fragments could be read: failed {}{}",
            self.data,
            self.total,
            match failed.is_empty() {
                true => "none".to_string(),
                false => failed.join(", "),
            },
            match unserved {
                0 => String::new(),
                n => format!("; {n} served by no known node"),
            }
        );
        self.finish(Action::GiveUp(why))
    }

    fn begin_pass(&mut self) -> Vec<Action> {
        let left = self.untried_or_good();
        if left.len() < self.data {
            return self.too_few();
        }
        self.phase = Phase::Stripes;
        self.spares = left.into();
        self.reading.clear();
        self.arrived.clear();
        self.stripe = 0;
        self.hedged = false;
        self.used.clear();
        let mut actions = vec![Action::Restart];
        if self.hedge {
            actions.push(Action::ArmHedge);
        }
        for _ in 0..self.data {
            if let Some(index) = self.spares.pop_front() {
                self.reading.push(index);
                actions.push(Action::Open { index, stripe: 0 });
            }
        }
        actions
    }

    fn arrived(&mut self, index: usize) -> Vec<Action> {
        let Some(at) = self.reading.iter().position(|&i| i == index) else {
            return Vec::new();
        };
        self.reading.remove(at);
        self.arrived.push(index);
        if self.arrived.len() < self.data {
            return Vec::new();
        }
        // A hedged read's slowest fragment is dropped, but stays a spare
        // (last): a fragment that fails later may still be replaced by
        // it, rather than the read giving up with a reachable fragment.
        let slowest: Vec<usize> = self.reading.drain(..).collect();
        self.spares.extend(slowest.iter().copied());
        let mut actions: Vec<Action> = slowest.into_iter().map(Action::Cancel).collect();
        let used = std::mem::take(&mut self.arrived);
        for &index in &used {
            if !self.used.contains(&index) {
                self.used.push(index);
            }
        }
        actions.push(Action::Decode(used.clone()));
        self.stripe += 1;
        if self.stripe >= self.stripes {
            self.phase = Phase::Verifying;
            self.reading = used;
            actions.push(Action::Verify);
            return actions;
        }
        for index in used {
            self.reading.push(index);
            actions.push(Action::Continue {
                index,
                stripe: self.stripe,
            });
        }
        actions
    }

    fn shard_failed(&mut self, index: usize, damaged: bool) -> Vec<Action> {
        let Some(at) = self.reading.iter().position(|&i| i == index) else {
            return Vec::new();
        };
        self.reading.remove(at);
        self.record_failure(index, damaged);
        if let Some(spare) = self.spares.pop_front() {
            self.reading.push(spare);
            return vec![Action::Open {
                index: spare,
                stripe: self.stripe,
            }];
        }
        if self.reading.len() + self.arrived.len() < self.data {
            return self.too_few();
        }
        Vec::new()
    }

    fn hedge_fired(&mut self) -> Vec<Action> {
        if self.stripe != 0 || self.hedged {
            return Vec::new();
        }
        self.hedged = true;
        match self.spares.pop_front() {
            Some(index) => {
                self.reading.push(index);
                vec![Action::Open { index, stripe: 0 }]
            }
            None => Vec::new(),
        }
    }

    fn verified(&mut self, bad: Vec<usize>, object_ok: bool) -> Vec<Action> {
        let fresh = bad.iter().filter(|i| self.reading.contains(i)).count();
        for index in bad {
            self.record_failure(index, true);
        }
        if fresh == 0 && object_ok {
            return self.finish(Action::Done);
        }
        // The fragments this pass decoded from that failed, at the end
        // or before it (one that failed part way was never checked
        // whole, and may be the one whose bytes were wrong).
        let suspects: Vec<usize> = self
            .used
            .iter()
            .copied()
            .filter(|i| self.failed.iter().any(|(f, _)| f == i))
            .collect();
        if suspects.is_empty() {
            // Every fragment passed its own check, yet the object fails
            // its: no fragment to leave out, so reading again cannot help.
            let why = format!(
                "the object decoded from fragments {:?} fails its checksum",
                self.used
            );
            return self.finish(Action::GiveUp(why));
        }
        // Read again without the fragments that failed, while enough are
        // left.
        self.begin_pass()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opens(actions: &[Action]) -> Vec<usize> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Open { index, .. } => Some(*index),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_whole_object_first_then_k_fragments_in_order() {
        let mut plan = ReadPlan::new(2, 3, 1, vec![2, 0, 1], true, false);
        assert_eq!(plan.start(), vec![Action::AskWhole]);
        let actions = plan.on(Event::WholeFailed);
        assert_eq!(actions[0], Action::Restart);
        assert_eq!(opens(&actions), vec![2, 0]);
        assert!(plan.on(Event::ShardArrived(0)).is_empty());
        let actions = plan.on(Event::ShardArrived(2));
        assert_eq!(actions, vec![Action::Decode(vec![0, 2]), Action::Verify]);
        let done = plan.on(Event::Verified {
            bad: vec![],
            object_ok: true,
        });
        assert_eq!(done, vec![Action::Done]);
        assert!(plan.is_over());
    }

    #[test]
    fn a_failed_fragment_is_replaced_at_the_current_stripe() {
        let mut plan = ReadPlan::new(2, 3, 3, vec![0, 1, 2], false, false);
        plan.start();
        plan.on(Event::ShardArrived(0));
        plan.on(Event::ShardArrived(1));
        let actions = plan.on(Event::ShardFailed {
            index: 1,
            damaged: false,
        });
        assert_eq!(
            actions,
            vec![Action::Open {
                index: 2,
                stripe: 1
            }]
        );
        let actions = plan.on(Event::ShardFailed {
            index: 0,
            damaged: false,
        });
        assert!(
            matches!(&actions[..], [Action::GiveUp(why)] if why.contains("fewer than 2")),
            "{actions:?}"
        );
    }

    #[test]
    fn a_late_first_stripe_is_hedged_once_and_the_slowest_dropped() {
        let mut plan = ReadPlan::new(2, 4, 2, vec![0, 1, 2, 3], false, true);
        let actions = plan.start();
        assert!(actions.contains(&Action::ArmHedge));
        assert_eq!(
            plan.on(Event::HedgeFired),
            vec![Action::Open {
                index: 2,
                stripe: 0
            }]
        );
        assert!(plan.on(Event::HedgeFired).is_empty());
        plan.on(Event::ShardArrived(2));
        let actions = plan.on(Event::ShardArrived(1));
        assert_eq!(actions[0], Action::Cancel(0));
        assert_eq!(actions[1], Action::Decode(vec![2, 1]));
        // Never decoded from fewer or more than k.
        assert!(plan.on(Event::ShardArrived(0)).is_empty());
        // The dropped one replaces a fragment that fails later.
        let actions = plan.on(Event::ShardFailed {
            index: 2,
            damaged: false,
        });
        assert_eq!(
            actions,
            vec![Action::Open {
                index: 3,
                stripe: 1
            }]
        );
        let actions = plan.on(Event::ShardFailed {
            index: 3,
            damaged: false,
        });
        assert_eq!(
            actions,
            vec![Action::Open {
                index: 0,
                stripe: 1
            }]
        );
    }

    #[test]
    fn a_damaged_fragment_is_left_out_of_the_next_pass_while_k_are_left() {
        let mut plan = ReadPlan::new(2, 3, 1, vec![0, 1, 2], false, false);
        plan.start();
        plan.on(Event::ShardArrived(0));
        plan.on(Event::ShardArrived(1));
        let actions = plan.on(Event::Verified {
            bad: vec![1],
            object_ok: false,
        });
        assert_eq!(actions[0], Action::Restart);
        assert_eq!(opens(&actions), vec![0, 2]);
        plan.on(Event::ShardArrived(0));
        plan.on(Event::ShardArrived(2));
        let actions = plan.on(Event::Verified {
            bad: vec![2],
            object_ok: false,
        });
        assert!(matches!(&actions[..], [Action::GiveUp(why)] if why.contains("1 (damaged)")));
        assert_eq!(plan.failed(), &[(1, true), (2, true)]);
    }

    #[test]
    fn a_fragment_that_failed_part_way_is_left_out_when_the_object_is_wrong() {
        // Fragment 1's first shard was decoded, then it failed: it was
        // never checked whole, so a wrong object is read again without it.
        let mut plan = ReadPlan::new(2, 3, 2, vec![1, 0, 2], false, false);
        plan.start();
        plan.on(Event::ShardArrived(1));
        plan.on(Event::ShardArrived(0));
        let replaced = plan.on(Event::ShardFailed {
            index: 1,
            damaged: false,
        });
        assert_eq!(
            replaced,
            vec![Action::Open {
                index: 2,
                stripe: 1
            }]
        );
        plan.on(Event::ShardArrived(0));
        let actions = plan.on(Event::ShardArrived(2));
        assert_eq!(actions.last(), Some(&Action::Verify));
        let actions = plan.on(Event::Verified {
            bad: vec![],
            object_ok: false,
        });
        assert_eq!(actions[0], Action::Restart);
        assert_eq!(opens(&actions), vec![0, 2]);
    }

    #[test]
    fn an_object_failing_its_checksum_with_good_fragments_is_given_up() {
        let mut plan = ReadPlan::new(1, 2, 1, vec![0, 1], false, false);
        plan.start();
        plan.on(Event::ShardArrived(0));
        let actions = plan.on(Event::Verified {
            bad: vec![],
            object_ok: false,
        });
        assert!(matches!(&actions[..], [Action::GiveUp(_)]));
    }

    #[test]
    fn too_few_served_fragments_give_up_at_once() {
        let mut plan = ReadPlan::new(4, 6, 1, vec![1, 2, 3], false, true);
        let actions = plan.start();
        assert!(
            matches!(&actions[..], [Action::GiveUp(why)] if why.contains("3 served by no known node")),
            "{actions:?}"
        );
    }
}
