//! Automatic compaction: deleted snapshots give their space back without
//! a manual `strata volume compact`.
//!
//! The keeper (see [`super::standby`]) asks every
//! [`AutoCompact::period`] whether a volume's chain holds too much that no
//! one can name any more: layers in runs that [`compaction_runs`] would
//! merge (layers of deleted snapshots, layers left by grows). When their
//! count reaches [`AutoCompact::dead_layers`], or their bytes reach
//! [`AutoCompact::dead_share`] of the chain's bytes, it starts the same
//! compaction an operator would, paced at [`AutoCompact::rate`]. A volume
//! already being compacted is left alone; one whose last compaction
//! failed waits [`FAILED_BACKOFF`] before the next try, so a full disk is
//! not hammered.

use std::sync::Arc;
use std::time::Duration;

use super::compact::{compaction_runs, CompactOptions, CompactionState, DEFAULT_RATE};
use super::Service;
use crate::catalog::State;

/// How long after a failed compaction the keeper tries that volume again.
pub const FAILED_BACKOFF: Duration = Duration::from_secs(300);

/// When the daemon compacts a volume on its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoCompact {
    /// Compact once this many layers could be merged away.
    pub dead_layers: usize,
    /// Or once the layers that could be merged hold this share (0 to 1)
    /// of the bytes of the volume's chain...
    pub dead_share: f64,
    /// ...and at least this many bytes (small volumes are not churned).
    pub dead_bytes_min: u64,
    /// Pace of the compaction's copy, in bytes per second.
    pub rate: u64,
    /// How often volumes are looked at.
    pub period: Duration,
}

impl Default for AutoCompact {
    /// 16 dead layers, or a quarter of the bytes (64 MiB at least), paced
    /// at the manual default, looked at every 10 s.
    fn default() -> Self {
        AutoCompact {
            dead_layers: 16,
            dead_share: 0.25,
            dead_bytes_min: 64 << 20,
            rate: DEFAULT_RATE,
            period: Duration::from_secs(10),
        }
    }
}

/// What could be merged away in one volume's chain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLayers {
    /// Layers in mergeable runs.
    pub layers: usize,
    /// Their file bytes.
    pub bytes: u64,
    /// File bytes of the whole chain.
    pub chain_bytes: u64,
}

impl AutoCompact {
    /// Whether `dead` calls for a compaction.
    pub fn wants(&self, dead: &DeadLayers) -> bool {
        if dead.layers < 2 {
            return false; // nothing to merge
        }
        let by_count = dead.layers >= self.dead_layers;
        let share = dead.bytes as f64 / dead.chain_bytes.max(1) as f64;
        let by_bytes = dead.bytes >= self.dead_bytes_min && share >= self.dead_share;
        by_count || by_bytes
    }
}

impl Service {
    /// What could be merged away in the chain of `volume`.
    pub fn dead_layers(&self, state: &State, volume: &str) -> Option<DeadLayers> {
        let top = &state.volumes.get(volume)?.top;
        let file_bytes = |id: &String| {
            std::fs::metadata(self.layer_path(id))
                .map(|m| m.len())
                .unwrap_or(0)
        };
        let runs = compaction_runs(state, top);
        if runs.is_empty() {
            // Nothing to merge: skip stat-ing every layer of a long chain
            // on every pass.
            return Some(DeadLayers::default());
        }
        Some(DeadLayers {
            layers: runs.iter().map(Vec::len).sum(),
            bytes: runs.iter().flatten().map(file_bytes).sum(),
            chain_bytes: state.chain(top).iter().map(file_bytes).sum(),
        })
    }

    /// One pass: starts a compaction of every volume that wants one.
    pub fn auto_compact(self: &Arc<Self>, policy: &AutoCompact) {
        let state = self.catalog.state();
        for volume in state.volumes.keys() {
            if self.compaction_busy_or_backing_off(volume) {
                continue;
            }
            let Some(dead) = self.dead_layers(&state, volume) else {
                continue;
            };
            if !policy.wants(&dead) {
                continue;
            }
            tracing::info!(
                "volume '{volume}': compacting on its own ({} layers, {} bytes could be merged away)",
                dead.layers,
                dead.bytes
            );
            let options = CompactOptions {
                rate: Some(policy.rate),
            };
            if let Err(e) = self.start_compaction(volume, options) {
                tracing::warn!("volume '{volume}': automatic compaction not started: {e}");
            }
        }
    }

    /// Whether `volume` is being compacted, or its last compaction failed
    /// and began less than [`FAILED_BACKOFF`] ago.
    fn compaction_busy_or_backing_off(&self, volume: &str) -> bool {
        match self.compaction_status(volume) {
            Ok(status) => match status.state {
                CompactionState::Running => true,
                CompactionState::Failed => status.elapsed_s < FAILED_BACKOFF.as_secs_f64(),
                _ => false,
            },
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_or_a_share_of_bytes_triggers_and_a_lone_layer_never_does() {
        let policy = AutoCompact::default();
        let dead = |layers, bytes, chain_bytes| DeadLayers {
            layers,
            bytes,
            chain_bytes,
        };
        assert!(policy.wants(&dead(16, 0, 1 << 30)));
        assert!(!policy.wants(&dead(15, 1 << 20, 1 << 30)));
        assert!(policy.wants(&dead(3, 512 << 20, 1 << 30)), "half the bytes");
        assert!(
            !policy.wants(&dead(3, 32 << 20, 64 << 20)),
            "under the minimum"
        );
        assert!(
            !policy.wants(&dead(1, 1 << 30, 1 << 30)),
            "nothing to merge"
        );
    }
}
