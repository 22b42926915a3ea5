//! A workload instance's process: fio (its job options from the spec, its
//! target from the provider, its per-second logs in the run directory) or
//! any command; and fio's logs read back as one-second samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::record::IoSample;
use crate::spec::WorkloadKind;

/// Values a workload's options and words may use as `{name}`.
pub struct Variables {
    /// `{run}`: the run id.
    pub run: String,
    /// `{workload}`: the workload's name.
    pub workload: String,
    /// `{instance}`: the instance's number.
    pub instance: u32,
    /// `{volume}`: the volume's name.
    pub volume: String,
    /// `{size}`: the volume's size in bytes.
    pub size: u64,
    /// `{uri}`: where the volume is reached (empty if nowhere).
    pub uri: String,
    /// `{mount}`: where its file system is mounted (`attach: fs`; empty
    /// otherwise).
    pub mount: String,
}

impl Variables {
    /// `text` with every variable replaced.
    pub fn fill(&self, text: &str) -> String {
        text.replace("{run}", &self.run)
            .replace("{workload}", &self.workload)
            .replace("{instance}", &self.instance.to_string())
            .replace("{volume}", &self.volume)
            .replace("{size}", &self.size.to_string())
            .replace("{uri}", &self.uri)
            .replace("{mount}", &self.mount)
    }
}

/// fio options that read back what was written, which a provider that
/// stores nothing cannot honour.
fn is_verify_option(key: &str) -> bool {
    key.starts_with("verify") || key == "do_verify"
}

/// The prefix of an instance's files in the run directory.
pub fn file_prefix(dir: &Path, variables: &Variables) -> PathBuf {
    dir.join("workloads")
        .join(format!("{}-{}", variables.workload, variables.instance))
}

/// What an instance runs, and whether fio's logs are expected from it.
pub struct Launch {
    /// The command, ready to spawn.
    pub command: Command,
    /// The fio JSON output file (fio only).
    pub fio_output: Option<PathBuf>,
    /// Whether fio runs for the run's duration (the spec gave no
    /// `runtime`), so that a second it logged nothing for is a stall.
    pub timed_by_run: bool,
}

/// The command for an instance: fio with `target` (the provider's engine
/// options, or the mount point as its directory), the spec's options, a
/// runtime of `duration` unless the spec gives one, and one-second IOPS
/// and bandwidth logs; or the spec's command with its variables and
/// `STRATA_BENCH_*` in its environment. None for pgbench, whose command
/// comes from its server.
pub fn launch(
    kind: &WorkloadKind,
    variables: &Variables,
    target: Vec<String>,
    stores_data: bool,
    duration: Duration,
    prefix: &Path,
) -> Option<Launch> {
    match kind {
        WorkloadKind::Fio(options) => Some(fio(
            options,
            variables,
            target,
            stores_data,
            duration,
            prefix,
        )),
        // Its command is its server's (see `pgbench::Server::run_command`).
        WorkloadKind::Pgbench(_) => None,
        WorkloadKind::Command(words) => {
            let mut command = Command::new(variables.fill(&words[0]));
            command
                .args(words[1..].iter().map(|w| variables.fill(w)))
                .env("STRATA_BENCH_RUN", &variables.run)
                .env("STRATA_BENCH_VOLUME", &variables.volume)
                .env("STRATA_BENCH_URI", &variables.uri)
                .env("STRATA_BENCH_MOUNT", &variables.mount)
                .env("STRATA_BENCH_INSTANCE", variables.instance.to_string());
            Some(Launch {
                command,
                fio_output: None,
                timed_by_run: false,
            })
        }
    }
}

fn fio(
    options: &BTreeMap<String, String>,
    variables: &Variables,
    target: Vec<String>,
    stores_data: bool,
    duration: Duration,
    prefix: &Path,
) -> Launch {
    let mut command = Command::new("fio");
    // fio keeps files of its own there (verify state): in the run
    // directory, never where `strata bench` was started.
    if let Some(dir) = prefix.parent() {
        command.current_dir(dir);
    }
    command.arg(format!(
        "--name={}-{}",
        variables.workload, variables.instance
    ));
    command.args(target);
    for (key, value) in options {
        if stores_data || !is_verify_option(key) {
            command.arg(format!("--{key}={}", variables.fill(value)));
        }
    }
    let timed_by_run = !options.contains_key("runtime");
    if timed_by_run {
        command.arg("--time_based=1");
        command.arg(format!("--runtime={}", duration.as_secs().max(1)));
    }
    let log = prefix.display().to_string();
    let output = prefix.with_extension("fio.json");
    command.args([
        format!("--write_iops_log={log}"),
        format!("--write_bw_log={log}"),
        "--log_avg_msec=1000".to_string(),
        "--output-format=json".to_string(),
        format!("--output={}", output.display()),
    ]);
    Launch {
        command,
        fio_output: Some(output),
        timed_by_run,
    }
}

/// Most log lines read from one fio log (a line a second for a week is
/// far less): the logs are files a reader should not trust blindly.
const MAX_LOG_LINES: usize = 1_000_000;

/// The per-second samples of an instance from fio's logs (`PREFIX_iops.N.log`
/// and `PREFIX_bw.N.log`, one window a second), from second `first` of the
/// run; seconds with no I/O up to `windows` (or the last logged one) get
/// zero samples, so that stalls show.
pub fn samples(prefix: &Path, variables: &Variables, first: u64, windows: u64) -> Vec<IoSample> {
    // (window) -> [read iops, write iops, read KiB, write KiB]
    let mut by_window: BTreeMap<u64, [f64; 4]> = BTreeMap::new();
    for (kind, column) in [("iops", 0), ("bw", 2)] {
        for path in log_files(prefix, kind) {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            for line in text.lines().take(MAX_LOG_LINES) {
                // "time_ms, value, direction, block size, offset[, priority]"
                let fields: Vec<&str> = line.split(',').map(str::trim).collect();
                let (Some(Ok(time)), Some(Ok(value)), Some(Ok(direction))) = (
                    fields.first().map(|f| f.parse::<u64>()),
                    fields.get(1).map(|f| f.parse::<f64>()),
                    fields.get(2).map(|f| f.parse::<u32>()),
                ) else {
                    continue;
                };
                if direction > 1 {
                    continue; // trims
                }
                // The window ending at `time` covers the second before it.
                let window = ((time + 500) / 1000).saturating_sub(1);
                by_window.entry(window).or_default()[column + direction as usize] += value;
            }
        }
    }
    let last = by_window.keys().next_back().map_or(0, |w| w + 1);
    (0..last.max(windows))
        .map(|window| {
            let [read_iops, write_iops, read_kib, write_kib] =
                by_window.get(&window).copied().unwrap_or_default();
            IoSample {
                workload: variables.workload.clone(),
                instance: variables.instance,
                second: first + window,
                read_iops,
                write_iops,
                read_kib,
                write_kib,
                transactions: 0.0,
            }
        })
        .collect()
}

/// fio's log files of `kind` for the job(s) of `prefix`.
fn log_files(prefix: &Path, kind: &str) -> Vec<PathBuf> {
    let (Some(dir), Some(stem)) = (prefix.parent(), prefix.file_name()) else {
        return Vec::new();
    };
    let head = format!("{}_{kind}.", stem.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy())
                .is_some_and(|n| n.starts_with(&head) && n.ends_with(".log"))
        })
        .collect()
}

/// The error fio reported in its JSON output, if any: a job's `error`
/// code (with its text), or the output missing.
pub fn fio_error(output: &Path) -> Option<String> {
    let text = match std::fs::read_to_string(output) {
        Ok(text) => text,
        Err(e) => return Some(format!("no fio output {}: {e}", output.display())),
    };
    // fio may print notes before its JSON object.
    let json = text.find('{').map_or("", |at| &text[at..]);
    let value: serde_json::Value = match serde_json::from_str(json) {
        Ok(value) => value,
        Err(e) => return Some(format!("fio output {} is not JSON: {e}", output.display())),
    };
    let jobs = value["jobs"].as_array()?;
    jobs.iter().find_map(|job| {
        let code = job["error"].as_i64().unwrap_or(0);
        (code != 0).then(|| {
            format!(
                "fio job {} failed: error {code}",
                job["jobname"].as_str().unwrap_or("?")
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_become_seconds_with_stalls_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("w-0");
        std::fs::write(
            dir.path().join("w-0_iops.1.log"),
            "1000, 10, 1, 4096, 0\n2001, 5, 0, 4096, 0\n2001, 7, 1, 4096, 0\n4000, 3, 1, 4096, 0\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("w-0_bw.1.log"), "1000, 40, 1, 4096, 0\n").unwrap();
        let variables = Variables {
            run: "r".into(),
            workload: "w".into(),
            instance: 0,
            volume: "v".into(),
            size: 1,
            uri: String::new(),
            mount: String::new(),
        };
        let samples = samples(&prefix, &variables, 10, 5);
        let writes: Vec<f64> = samples.iter().map(|s| s.write_iops).collect();
        assert_eq!(writes, [10.0, 7.0, 0.0, 3.0, 0.0]);
        assert_eq!(samples[1].read_iops, 5.0);
        assert_eq!(samples[0].write_kib, 40.0);
        assert_eq!(samples[0].second, 10);
    }
}
