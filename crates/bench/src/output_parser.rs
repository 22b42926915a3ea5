//! Output parsers for `command` workloads: a regular expression run over
//! each line the command prints, whose named groups say how many
//! operations (and KiB read and written) the line reports. Matches add
//! up per second of the run, which gives a command the same one-second
//! series as fio and pgbench, zero-operation seconds included.

use std::collections::BTreeMap;

use regex::Regex;

/// The named groups a pattern may have; `ops` is required.
pub const GROUPS: [&str; 3] = ["ops", "read_kib", "write_kib"];

/// Longest line read whole; the rest of a longer line is not matched.
pub const MAX_LINE: usize = 64 * 1024;

/// Longest pattern accepted (a spec is small; this bounds what the
/// regex compiler is given).
const MAX_PATTERN: usize = 4096;

/// A compiled output parser.
#[derive(Clone, Debug)]
pub struct OutputParser {
    regex: Regex,
    cumulative: bool,
}

/// What one line reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    /// Operations.
    pub ops: f64,
    /// KiB read.
    pub read_kib: f64,
    /// KiB written.
    pub write_kib: f64,
}

impl OutputParser {
    /// A parser of `pattern`, whose `ops` group gives each matching line's
    /// operations (with `cumulative`, a running total since the command
    /// started). Refuses a pattern that does not compile, has no `ops`
    /// group, or names a group other than [`GROUPS`].
    pub fn new(pattern: &str, cumulative: bool) -> Result<OutputParser, String> {
        if pattern.len() > MAX_PATTERN {
            return Err(format!(
                "the pattern is {} bytes long; write at most {MAX_PATTERN}",
                pattern.len()
            ));
        }
        let regex =
            Regex::new(pattern).map_err(|e| format!("the pattern does not compile: {e}"))?;
        let names: Vec<&str> = regex.capture_names().flatten().collect();
        if let Some(unknown) = names.iter().find(|name| !GROUPS.contains(name)) {
            return Err(format!(
                "the pattern names a group `{unknown}`; name groups only {}",
                GROUPS.join(", ")
            ));
        }
        if !names.contains(&"ops") {
            return Err(
                "the pattern has no group named `ops`: write `(?P<ops>[0-9.]+)` where each line \
                 says its operations"
                    .to_string(),
            );
        }
        Ok(OutputParser { regex, cumulative })
    }

    /// What `line` reports, if it matches and every group it captured is
    /// a finite number of at least zero.
    pub fn read(&self, line: &str) -> Option<Reading> {
        let captures = self.regex.captures(line)?;
        let value = |name: &str| -> Option<f64> {
            match captures.name(name) {
                None => Some(0.0),
                Some(text) => text
                    .as_str()
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0),
            }
        };
        Some(Reading {
            ops: value("ops")?,
            read_kib: value("read_kib")?,
            write_kib: value("write_kib")?,
        })
    }
}

/// The readings of one instance's lines, added up per second.
#[derive(Debug)]
pub struct Tally {
    parser: OutputParser,
    /// The last running total (cumulative parsers).
    total: Reading,
    per_second: BTreeMap<u64, Reading>,
    /// Lines that matched.
    pub matched: u64,
}

impl Tally {
    /// An empty tally for `parser`.
    pub fn new(parser: OutputParser) -> Tally {
        Tally {
            parser,
            total: Reading::default(),
            per_second: BTreeMap::new(),
            matched: 0,
        }
    }

    /// Counts `line`, read in `second` of the run.
    pub fn line(&mut self, second: u64, line: &str) {
        let Some(reading) = self.parser.read(line) else {
            return;
        };
        self.matched += 1;
        let reading = if self.parser.cumulative {
            // A total that went down started again (the command counts
            // from zero once more): all of it is new.
            let since = |now: f64, before: f64| if now >= before { now - before } else { now };
            let delta = Reading {
                ops: since(reading.ops, self.total.ops),
                read_kib: since(reading.read_kib, self.total.read_kib),
                write_kib: since(reading.write_kib, self.total.write_kib),
            };
            self.total = reading;
            delta
        } else {
            reading
        };
        let slot = self.per_second.entry(second).or_default();
        slot.ops += reading.ops;
        slot.read_kib += reading.read_kib;
        slot.write_kib += reading.write_kib;
    }

    /// What each second from `first` to `last` (both included) reported,
    /// zero where no line reported anything, so that silent seconds
    /// count.
    pub fn per_second(&self, first: u64, last: u64) -> Vec<(u64, Reading)> {
        (first..=last.max(first))
            .map(|second| {
                let reading = self.per_second.get(&second).copied().unwrap_or_default();
                (second, reading)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_add_up_per_second_and_silent_seconds_are_zero() {
        let parser =
            OutputParser::new(r"done (?P<ops>\d+) ops, (?P<write_kib>[\d.]+) KiB", false).unwrap();
        let mut tally = Tally::new(parser);
        tally.line(3, "done 10 ops, 40 KiB");
        tally.line(3, "noise");
        tally.line(3, "done 5 ops, 20.5 KiB");
        tally.line(5, "done 7 ops, 28 KiB");
        assert_eq!(tally.matched, 3);
        let seconds = tally.per_second(2, 6);
        let ops: Vec<f64> = seconds.iter().map(|(_, r)| r.ops).collect();
        assert_eq!(ops, [0.0, 15.0, 0.0, 7.0, 0.0]);
        assert_eq!(
            seconds[1],
            (
                3,
                Reading {
                    ops: 15.0,
                    read_kib: 0.0,
                    write_kib: 60.5
                }
            )
        );
    }

    #[test]
    fn running_totals_count_their_differences_and_restarts() {
        let parser = OutputParser::new(r"^total=(?P<ops>\d+)$", true).unwrap();
        let mut tally = Tally::new(parser);
        for (second, line) in [(0, "total=100"), (1, "total=250"), (2, "total=40")] {
            tally.line(second, line);
        }
        let ops: Vec<f64> = tally.per_second(0, 2).iter().map(|(_, r)| r.ops).collect();
        assert_eq!(ops, [100.0, 150.0, 40.0]);
    }

    #[test]
    fn bad_patterns_and_values_are_refused() {
        let missing = OutputParser::new(r"(?P<count>\d+)", false).unwrap_err();
        assert!(missing.contains("group `count`"), "{missing}");
        let no_ops = OutputParser::new(r"(?P<read_kib>\d+)", false).unwrap_err();
        assert!(no_ops.contains("no group named `ops`"), "{no_ops}");
        let broken = OutputParser::new(r"(?P<ops>\d+", false).unwrap_err();
        assert!(broken.contains("does not compile"), "{broken}");
        let long = OutputParser::new(&"a".repeat(MAX_PATTERN + 1), false).unwrap_err();
        assert!(long.contains("at most"), "{long}");
        let parser = OutputParser::new(r"(?P<ops>\S+) ops", false).unwrap();
        for line in ["NaN ops", "inf ops", "-3 ops", "many ops"] {
            assert_eq!(parser.read(line), None, "{line}");
        }
        assert_eq!(parser.read("2.5 ops").map(|r| r.ops), Some(2.5));
    }
}
