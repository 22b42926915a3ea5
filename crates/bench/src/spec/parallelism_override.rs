//! `strata bench run --parallelism N`: one spec run at several
//! parallelisms (experiment 1 of docs/bench.md) without a copy of the
//! spec per N. Every closed-loop control operation (`in_flight: M`) gets
//! N in flight instead; the run directory keeps the N in
//! [`OVERRIDES_FILE`] beside the spec's own text, so that a report of the
//! run sees the parallelism it ran at.

use super::{RateLaw, Spec, SpecError, MAX_COUNT};
use std::path::Path;

/// The file in a run directory that records the overrides it ran with.
pub const OVERRIDES_FILE: &str = "overrides.json";

impl Spec {
    /// Runs every closed-loop control operation with `in_flight` of them
    /// at once (raising its `max_in_flight` to at least that). A spec with
    /// no closed-loop operation, or an `in_flight` out of bounds, is
    /// refused: the override would change nothing or break a bound.
    pub fn set_parallelism(&mut self, in_flight: u32) -> Result<(), SpecError> {
        if !(1..=MAX_COUNT).contains(&in_flight) {
            return Err(SpecError {
                line: 0,
                message: format!("--parallelism {in_flight}: write 1 to {MAX_COUNT}"),
            });
        }
        let mut changed = 0;
        for operation in &mut self.control_operations {
            if let RateLaw::ClosedLoop(_) = operation.rate {
                operation.rate = RateLaw::ClosedLoop(in_flight);
                operation.max_in_flight = operation.max_in_flight.max(in_flight);
                changed += 1;
            }
        }
        if changed == 0 {
            return Err(SpecError {
                line: 0,
                message: "--parallelism: no control operation has a closed-loop rate \
                          (`in_flight: N`) for it to set; give one such a rate"
                    .into(),
            });
        }
        Ok(())
    }

    /// Applies the overrides a run directory recorded (none when it has
    /// no [`OVERRIDES_FILE`]).
    pub fn apply_recorded_overrides(&mut self, dir: &Path) -> Result<(), SpecError> {
        let path = dir.join(OVERRIDES_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(SpecError {
                    line: 0,
                    message: format!("cannot read {}: {e}", path.display()),
                })
            }
        };
        let overrides: Overrides = serde_json::from_str(&text).map_err(|e| SpecError {
            line: 0,
            message: format!(
                "{}: {e}; write {{\"parallelism\": N}} or remove it",
                path.display()
            ),
        })?;
        match overrides.parallelism {
            Some(n) => self.set_parallelism(n),
            None => Ok(()),
        }
    }
}

/// What a run changed of its spec, as [`OVERRIDES_FILE`] keeps it.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    /// `--parallelism N`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<u32>,
}

impl Overrides {
    /// Whether the run changed nothing.
    pub fn is_empty(&self) -> bool {
        self.parallelism.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    use crate::spec::tests::GOOD as SPEC;

    #[test]
    fn the_override_sets_every_closed_loop_and_nothing_else() {
        let mut spec = parse(SPEC).expect("the spec parses");
        spec.set_parallelism(16).unwrap();
        let ops = &spec.control_operations;
        assert!(!matches!(ops[0].rate, RateLaw::ClosedLoop(_)));
        assert!(matches!(ops[1].rate, RateLaw::ClosedLoop(16)));
        assert!(ops[1].max_in_flight >= 16);
    }

    #[test]
    fn a_bad_count_or_a_spec_without_a_closed_loop_is_refused() {
        let mut spec = parse(SPEC).expect("the spec parses");
        assert!(spec.set_parallelism(0).is_err());
        assert!(spec.set_parallelism(MAX_COUNT + 1).is_err());
        let open = SPEC.replace("    in_flight: 2\n", "    every: 2s\n");
        let mut spec = parse(&open).expect("the spec parses");
        let e = spec.set_parallelism(4).unwrap_err();
        assert!(e.message.contains("closed-loop"), "{}", e.message);
    }

    #[test]
    fn a_run_directory_s_recorded_override_is_applied_and_a_bad_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = parse(SPEC).expect("the spec parses");
        spec.apply_recorded_overrides(dir.path()).unwrap();
        assert!(matches!(
            spec.control_operations[1].rate,
            RateLaw::ClosedLoop(2)
        ));
        std::fs::write(dir.path().join(OVERRIDES_FILE), r#"{"parallelism": 8}"#).unwrap();
        spec.apply_recorded_overrides(dir.path()).unwrap();
        assert!(matches!(
            spec.control_operations[1].rate,
            RateLaw::ClosedLoop(8)
        ));
        std::fs::write(dir.path().join(OVERRIDES_FILE), r#"{"parallel": 8}"#).unwrap();
        assert!(spec.apply_recorded_overrides(dir.path()).is_err());
    }
}
