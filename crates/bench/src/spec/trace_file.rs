//! Traces read from a CSV file (`trace_file: arrivals.csv`): one arrival
//! time in seconds per line (the first field of each line), an optional
//! header, in order, at most [`MAX_TRACE`] of them.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use super::{RateLaw, Spec, SpecError, MAX_TRACE};

/// Largest trace file read: a million lines of 20-odd characters, with
/// room for extra columns; a bigger file is refused before it is read.
pub const MAX_TRACE_FILE_BYTES: u64 = 64 << 20;

/// Latest arrival time a trace may hold, in seconds (a week, as durations).
const LATEST: f64 = 7.0 * 86_400.0;

/// The arrival times in a trace file's text: the first field of each
/// non-empty line; the first line may be a header (not a number).
pub fn parse_trace(text: &str) -> Result<Vec<Duration>, String> {
    let mut times: Vec<Duration> = Vec::new();
    let mut previous = 0.0;
    let mut first = true;
    for (index, line) in text.lines().enumerate() {
        let field = line.split(',').next().unwrap_or("").trim();
        if field.is_empty() {
            continue;
        }
        let Ok(seconds) = field.parse::<f64>() else {
            if std::mem::take(&mut first) {
                continue; // a header
            }
            return Err(format!(
                "line {}: `{field}` is not a number of seconds: write one arrival time per line, such as 1.25",
                index + 1
            ));
        };
        first = false;
        if !seconds.is_finite() || !(0.0..=LATEST).contains(&seconds) {
            return Err(format!(
                "line {}: {field}: write times from 0 to {LATEST} seconds (a week)",
                index + 1
            ));
        }
        if seconds < previous {
            return Err(format!(
                "line {}: {field} comes before the line above ({previous}): sort the times in order",
                index + 1
            ));
        }
        if times.len() == MAX_TRACE {
            return Err(format!(
                "line {}: more than {MAX_TRACE} arrival times: shorten the trace",
                index + 1
            ));
        }
        previous = seconds;
        times.push(Duration::from_secs_f64(seconds));
    }
    if times.is_empty() {
        return Err("holds no arrival time: write one time in seconds per line".into());
    }
    Ok(times)
}

/// Reads a trace file, refusing one over [`MAX_TRACE_FILE_BYTES`].
pub fn read_trace(path: &Path) -> Result<Vec<Duration>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let mut text = String::new();
    file.take(MAX_TRACE_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read it as text: {e}"))?;
    if text.len() as u64 > MAX_TRACE_FILE_BYTES {
        return Err(format!(
            "is over {} MiB: shorten the trace",
            MAX_TRACE_FILE_BYTES >> 20
        ));
    }
    parse_trace(&text)
}

impl Spec {
    /// Reads every `trace_file` the spec names, relative to `base` (the
    /// spec's directory), so that its rate replays the file's times. A
    /// spec is parsed without touching files; a run needs this first.
    pub fn read_trace_files(&mut self, base: &Path) -> Result<(), SpecError> {
        for operation in &mut self.control_operations {
            let RateLaw::TraceFile { path, line } = &operation.rate else {
                continue;
            };
            let times = read_trace(&base.join(path)).map_err(|message| SpecError {
                line: *line,
                message: format!(
                    "rate `{}`: trace_file {}: {message}",
                    operation.rate_name,
                    base.join(path).display()
                ),
            })?;
            operation.rate = RateLaw::Trace(times);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_files_read_with_a_header_and_bad_ones_are_refused() {
        let ms = Duration::from_millis;
        let times = parse_trace("time,size\n0.5,4096\n\n1.25\n1.25,x\n3\n").expect("a good trace");
        assert_eq!(times, [ms(500), ms(1250), ms(1250), ms(3000)]);
        assert_eq!(parse_trace("2\n").expect("no header"), [ms(2000)]);
        let cases = [
            ("1\n0.5\n", "line 2: 0.5 comes before"),
            ("seconds\n1\nsoon\n", "line 3: `soon` is not a number"),
            ("-1\n", "line 1: -1: write times from 0"),
            ("inf\n", "write times from 0"),
            ("time\n", "holds no arrival time"),
            ("", "holds no arrival time"),
        ];
        for (text, expected) in cases {
            let error = parse_trace(text).expect_err(text);
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        let too_many = "1\n".repeat(MAX_TRACE + 1);
        let error = parse_trace(&too_many).expect_err("too many");
        assert!(error.contains("more than 1000000"), "{error}");
        let missing = read_trace(Path::new("/nonexistent/trace.csv")).expect_err("missing");
        assert!(missing.contains("cannot open it"), "{missing}");
    }
}
