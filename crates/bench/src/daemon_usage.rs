//! What a provider's daemon process spends, read from `/proc/PID/stat`
//! and added to each scrape of the provider's metrics, so that a run's
//! `metrics.jsonl` holds the daemon's CPU time for QEMU as for Strata.
//!
//! CPU time per operation moves far less from run to run than the
//! operations a second do on a shared machine: two runs that differ only
//! in their control operations compare on it where their rates cannot.

/// The daemon's user and system CPU time, in seconds (a counter).
pub const CPU_SERIES: &str = "strata_bench_daemon_cpu_seconds_total";
/// The daemon's resident memory, in bytes (a gauge).
pub const RESIDENT_SERIES: &str = "strata_bench_daemon_resident_bytes";

/// One reading of a process's usage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set, in bytes.
    pub resident_bytes: u64,
}

impl Usage {
    /// The usage of process `pid` now.
    pub fn of(pid: u32) -> Result<Usage, String> {
        let path = format!("/proc/{pid}/stat");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        parse_stat(&text, clock_ticks(), page_size()).map_err(|why| format!("{path}: {why}"))
    }

    /// The usage as Prometheus text, to be parsed with the provider's.
    pub fn exposition(&self) -> String {
        format!(
            "# TYPE {CPU_SERIES} counter\n{CPU_SERIES} {}\n\
             # TYPE {RESIDENT_SERIES} gauge\n{RESIDENT_SERIES} {}\n",
            self.cpu_seconds, self.resident_bytes
        )
    }
}

/// Reads `utime`, `stime` and `rss` from the text of `/proc/PID/stat`.
/// The command name (field 2) is in parentheses and may hold spaces and
/// parentheses itself, so the fields are counted after its last `)`.
fn parse_stat(text: &str, ticks_per_second: u64, page_bytes: u64) -> Result<Usage, String> {
    let after_name = text
        .rfind(')')
        .map(|end| &text[end + 1..])
        .ok_or("no command name in parentheses")?;
    // Fields from 3 (state) on: utime is field 14, stime 15, rss 24.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| -> Result<u64, String> {
        let text = fields
            .get(number - 3)
            .ok_or(format!("only {} fields", fields.len() + 2))?;
        text.parse()
            .map_err(|_| format!("field {number} is '{text}', not a count"))
    };
    if ticks_per_second == 0 {
        return Err("the clock tick rate is unknown".into());
    }
    let ticks = field(14)?.saturating_add(field(15)?);
    Ok(Usage {
        cpu_seconds: ticks as f64 / ticks_per_second as f64,
        resident_bytes: field(24)?.saturating_mul(page_bytes),
    })
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a system value and touches no memory of ours.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(0)
}

fn page_size() -> u64 {
    // SAFETY: as above.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_cpu_and_memory_even_with_parentheses_in_the_name() {
        let line = "4242 (qemu (storage)) S 1 4242 4242 0 -1 4194560 900 0 3 0 \
                    250 150 0 0 20 0 5 0 12345 900000000 2048 18446744073709551615";
        let usage = parse_stat(line, 100, 4096).unwrap();
        assert_eq!(usage.cpu_seconds, 4.0);
        assert_eq!(usage.resident_bytes, 2048 * 4096);
        assert!(parse_stat("4242 (x) S 1 2", 100, 4096)
            .unwrap_err()
            .contains("fields"));
        assert!(parse_stat("no name", 100, 4096).is_err());
        assert!(parse_stat(&line.replace(" 250 ", " x "), 100, 4096)
            .unwrap_err()
            .contains("field 14"));
    }

    #[test]
    fn this_process_is_read_and_its_usage_parses_back_as_metrics() {
        let usage = Usage::of(std::process::id()).unwrap();
        assert!(usage.resident_bytes > 0);
        let samples = crate::metrics::parse_exposition(&usage.exposition(), 1.0);
        let names: Vec<&str> = samples.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(names, [CPU_SERIES, RESIDENT_SERIES]);
        assert_eq!(samples[1].value, usage.resident_bytes as f64);
        assert!(Usage::of(u32::MAX).is_err());
    }
}
