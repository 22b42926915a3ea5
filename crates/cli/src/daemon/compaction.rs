//! `strata daemon`'s automatic compaction flags.

use anyhow::{bail, Result};
use clap::Args;
use strata_volume::service::autocompact::AutoCompact;

use crate::units::parse_size;

/// When the daemon compacts a volume on its own.
#[derive(Args)]
pub struct AutoCompactArgs {
    /// Never compact on its own: deleted snapshots keep their space until
    /// `strata volume compact`.
    #[arg(long = "no-auto-compact")]
    no_auto_compact: bool,
    /// Compact a volume once this many layers of deleted snapshots (and
    /// grows) could be merged away.
    #[arg(long = "auto-compact-layers", default_value_t = AutoCompact::default().dead_layers)]
    dead_layers: usize,
    /// Or once they hold this percentage of the volume's chain bytes...
    #[arg(long = "auto-compact-percent", default_value_t = AutoCompact::default().dead_share * 100.0)]
    dead_percent: f64,
    /// ...and at least this many bytes.
    #[arg(long = "auto-compact-min", default_value = "64M")]
    dead_bytes_min: String,
    /// Pace of an automatic compaction's copy, bytes per second.
    #[arg(long = "auto-compact-rate", default_value = "32M")]
    rate: String,
    /// Seconds between two looks at the volumes.
    #[arg(long = "auto-compact-period", default_value_t = AutoCompact::default().period.as_secs_f64())]
    period: f64,
}

impl AutoCompactArgs {
    /// The policy these flags ask for (`None`: off).
    pub fn policy(&self) -> Result<Option<AutoCompact>> {
        if self.no_auto_compact {
            return Ok(None);
        }
        if self.dead_layers < 2 {
            bail!(
                "--auto-compact-layers {}: at least 2 (a merge needs two layers)",
                self.dead_layers
            );
        }
        if !(self.dead_percent > 0.0 && self.dead_percent <= 100.0) {
            bail!(
                "--auto-compact-percent {}: from above 0 to 100",
                self.dead_percent
            );
        }
        if !(self.period.is_finite() && self.period >= 0.1 && self.period <= 86_400.0) {
            bail!(
                "--auto-compact-period {}: from 0.1 to 86400 seconds",
                self.period
            );
        }
        let bytes = |flag: &str, value: &str| {
            parse_size(value).map_err(|e| anyhow::anyhow!("{flag} {value}: {e}"))
        };
        let rate = bytes("--auto-compact-rate", &self.rate)?;
        if rate < strata_volume::service::compact::MIN_RATE {
            bail!(
                "--auto-compact-rate {}: at least 1M (bytes per second)",
                self.rate
            );
        }
        Ok(Some(AutoCompact {
            dead_layers: self.dead_layers,
            dead_share: self.dead_percent / 100.0,
            dead_bytes_min: bytes("--auto-compact-min", &self.dead_bytes_min)?,
            rate,
            period: std::time::Duration::from_secs_f64(self.period),
        }))
    }
}
