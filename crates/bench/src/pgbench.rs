//! PostgreSQL and pgbench on a volume's file system: a cluster made with
//! `initdb` on the mount, a server on a unix socket only, pgbench's tables
//! loaded with `pgbench -i`, its timed run's per-second progress read back
//! as the workload's one-second series, and pgbench's own invariant (every
//! balance equals the sum of the history's deltas) as the check of a
//! restored snapshot.
//!
//! PostgreSQL refuses to run as root: the server runs as [`USER`]
//! (`nobody`), through `runuser`, with its data directory, socket
//! directory and log owned by that user. The clients (pgbench, psql) run
//! as the harness, through the socket, with trust authentication; nothing
//! listens on TCP.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bounded;
use crate::record::IoSample;

/// The unprivileged user PostgreSQL runs as.
pub const USER: &str = "nobody";
/// The server's port: only names its socket (`.s.PGSQL.5432`), each
/// server has a socket directory of its own.
const PORT: &str = "5432";
/// The database user initdb makes, which the clients connect as.
const DATABASE_USER: &str = "postgres";
/// How long initdb, a server's start or stop, or a query may take.
const SERVER_WITHIN: Duration = Duration::from_secs(120);
/// How long `pgbench -i` may take (scale 100 is some 1.5 GiB).
const LOAD_WITHIN: Duration = Duration::from_secs(1800);

/// A PostgreSQL program: Debian keeps the server's out of PATH, in one
/// directory per major version; the newest is taken.
pub fn binary(name: &str) -> PathBuf {
    let mut newest: Option<(u32, PathBuf)> = None;
    for entry in std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
    {
        let version = entry.file_name().to_string_lossy().parse::<u32>();
        let path = entry.path().join("bin").join(name);
        if let Ok(version) = version {
            if path.exists() && newest.as_ref().is_none_or(|(v, _)| version > *v) {
                newest = Some((version, path));
            }
        }
    }
    newest.map_or_else(|| PathBuf::from(name), |(_, path)| path)
}

/// The user id and group id of [`USER`].
fn user_ids() -> Result<(u32, u32), String> {
    let name = CString::new(USER).map_err(|e| e.to_string())?;
    // SAFETY: getpwnam reads the user database; the result is copied out
    // at once, before any other call could overwrite it.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Err(format!(
            "no user `{USER}` on this host to run PostgreSQL as"
        ));
    }
    // SAFETY: not null, checked above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Ok((uid, gid))
}

/// Makes `path` (a directory, or a file if `file`) owned by [`USER`].
fn owned_by_user(path: &Path, file: bool) -> Result<(), String> {
    let made = if file {
        std::fs::write(path, b"")
    } else {
        std::fs::create_dir_all(path)
    };
    made.map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let (uid, gid) = user_ids()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| format!("cannot give {} to `{USER}`: {e}", path.display()))
}

/// A PostgreSQL cluster on a mounted file system.
pub struct Server {
    data: PathBuf,
    sockets: PathBuf,
    log: PathBuf,
    running: bool,
}

impl Server {
    /// The cluster in `mount/pgdata`, its socket in `dir/sock` and its log
    /// in `dir/postgres.log` (`dir` is the attachment's own directory).
    pub fn at(mount: &Path, dir: &Path) -> Server {
        Server {
            data: mount.join("pgdata"),
            sockets: dir.join("sock"),
            log: dir.join("postgres.log"),
            running: false,
        }
    }

    /// The server's log, for error messages.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Runs a server program as [`USER`].
    fn as_user(&self, program: &str) -> Command {
        let mut command = Command::new("runuser");
        command.args(["-u", USER, "--"]).arg(binary(program));
        // Somewhere the user may enter (initdb and pg_ctl look at it).
        if let Some(dir) = self.log.parent() {
            command.current_dir(dir);
        }
        command
    }

    /// Makes the cluster: `initdb` as [`USER`], trust authentication.
    pub fn initialize(&self) -> Result<(), String> {
        owned_by_user(&self.data, false)?;
        bounded::succeed(
            self.as_user("initdb").arg("-D").arg(&self.data).args([
                "-U",
                DATABASE_USER,
                "-A",
                "trust",
                "--no-locale",
                "-E",
                "UTF8",
            ]),
            SERVER_WITHIN,
            "initdb",
        )
        .map(|_| ())
    }

    /// Starts the server on its socket only; waits until it accepts
    /// connections (after recovery, on a restored snapshot).
    pub fn start(&mut self) -> Result<(), String> {
        owned_by_user(&self.sockets, false)?;
        owned_by_user(&self.log, true)?;
        // A restored snapshot holds the lock file of the server that ran
        // on its volume, whose process may well be alive: this copy is not
        // that server's data directory any more.
        let _ = std::fs::remove_file(self.data.join("postmaster.pid"));
        let options = format!("-k {} -h '' -p {PORT}", self.sockets.display());
        bounded::succeed(
            self.as_user("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&self.log)
                .args(["-w", "-t", "110", "-o", &options, "start"]),
            SERVER_WITHIN,
            "pg_ctl start",
        )
        .map_err(|e| format!("{e} (log {})", self.log.display()))?;
        self.running = true;
        Ok(())
    }

    /// Stops the server (fast: sessions are ended, the data is flushed).
    pub fn stop(&mut self) -> Result<(), String> {
        if !std::mem::take(&mut self.running) {
            return Ok(());
        }
        bounded::succeed(
            self.as_user("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "fast", "-w", "-t", "60", "stop"]),
            SERVER_WITHIN,
            "pg_ctl stop",
        )
        .map(|_| ())
    }

    /// A client program with the connection options of this server.
    pub fn client(&self, program: &str) -> Command {
        let mut command = Command::new(binary(program));
        command
            .arg("-h")
            .arg(&self.sockets)
            .args(["-p", PORT, "-U", DATABASE_USER]);
        command
    }

    /// Loads pgbench's tables at `scale`.
    pub fn load(&self, scale: u32) -> Result<(), String> {
        bounded::succeed(
            self.client("pgbench")
                .args(["-i", "-q", "-s", &scale.to_string(), "postgres"]),
            LOAD_WITHIN,
            "pgbench -i",
        )
        .map(|_| ())
    }

    /// The command of a timed pgbench run: `clients` sessions for
    /// `seconds`, with a progress line every second.
    pub fn run_command(&self, clients: u32, seconds: u64) -> Command {
        let mut command = self.client("pgbench");
        command.args([
            "-T",
            &seconds.max(1).to_string(),
            "-c",
            &clients.to_string(),
            "-j",
            &clients.to_string(),
            "-P",
            "1",
            "postgres",
        ]);
        command
    }

    /// One query's result, unaligned.
    fn query(&self, sql: &str) -> Result<String, String> {
        bounded::succeed(
            self.client("psql").args([
                "-d",
                "postgres",
                "-Atq",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ]),
            SERVER_WITHIN,
            "psql",
        )
    }

    /// pgbench's invariant: each transaction adds one delta to an
    /// account, its teller and its branch, and logs it in the history, in
    /// one transaction; so at any committed point the sums of the three
    /// balances equal the sum of the history's deltas. The history's row
    /// count, or what does not add up.
    pub fn check_balances(&self) -> Result<u64, String> {
        let answer = self.query(
            "select (select coalesce(sum(abalance), 0) from pgbench_accounts) || ' ' || \
             (select coalesce(sum(tbalance), 0) from pgbench_tellers) || ' ' || \
             (select coalesce(sum(bbalance), 0) from pgbench_branches) || ' ' || \
             (select coalesce(sum(delta), 0) from pgbench_history) || ' ' || \
             (select count(*) from pgbench_history)",
        )?;
        let numbers: Vec<i64> = answer
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [accounts, tellers, branches, history, rows] = numbers[..] else {
            return Err(format!("pgbench's tables gave {answer:?}, not five sums"));
        };
        if accounts == history && tellers == history && branches == history {
            return Ok(rows as u64);
        }
        Err(format!(
            "pgbench's balances do not add up: accounts {accounts}, tellers {tellers}, branches {branches}, history {history} ({rows} rows)"
        ))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Stopped explicitly where the outcome matters; this is for an
        // error path, so that no server holds a mount.
        let _ = self.stop();
    }
}

/// Stops a server a killed run left on the file system at `mount`, if
/// its lock file says one may be running (immediate: nothing to keep).
pub fn stop_abandoned(mount: &Path) {
    let data = mount.join("pgdata");
    if !data.join("postmaster.pid").exists() {
        return;
    }
    let _ = bounded::run(
        Command::new("runuser")
            .args(["-u", USER, "--"])
            .arg(binary("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .current_dir("/"),
        SERVER_WITHIN,
        "pg_ctl stop",
    );
}

/// Most progress lines read from one pgbench log (one a second).
const MAX_PROGRESS_LINES: usize = 1_000_000;

/// The per-second samples of a pgbench run from its log's progress lines
/// (`progress: 3.0 s, 512.3 tps, lat 1.9 ms stddev 0.4, 0 failed`), from
/// second `first` of the run; transactions count as the workload's
/// operations. Seconds with no line up to `windows` get zeros.
pub fn samples(
    log: &str,
    workload: &str,
    instance: u32,
    first: u64,
    windows: u64,
) -> Vec<IoSample> {
    let mut by_window = std::collections::BTreeMap::new();
    for line in log
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .take(MAX_PROGRESS_LINES)
    {
        let mut fields = line["progress: ".len()..].split(", ");
        let time = fields
            .next()
            .and_then(|f| f.strip_suffix(" s")?.parse::<f64>().ok());
        let tps = fields
            .next()
            .and_then(|f| f.strip_suffix(" tps")?.parse::<f64>().ok());
        if let (Some(time), Some(tps)) = (time, tps) {
            if time >= 1.0 && tps.is_finite() {
                by_window.insert(time.round() as u64 - 1, tps);
            }
        }
    }
    let last = by_window.keys().next_back().map_or(0, |w| w + 1);
    (0..last.max(windows))
        .map(|window| IoSample {
            workload: workload.to_string(),
            instance,
            second: first + window,
            read_iops: 0.0,
            write_iops: 0.0,
            read_kib: 0.0,
            write_kib: 0.0,
            transactions: by_window.get(&window).copied().unwrap_or(0.0),
        })
        .collect()
}

/// pgbench's closing figures from its log: transactions per second,
/// mean latency, transactions done and failed.
pub fn summary(log: &str) -> serde_json::Value {
    let number = |prefix: &str| {
        log.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
    };
    serde_json::json!({
        "tps": number("tps = "),
        "latency_ms": number("latency average = "),
        "transactions": number("number of transactions actually processed: "),
        "failed": number("number of failed transactions: "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
pgbench (15.14)
progress: 1.0 s, 500.5 tps, lat 1.990 ms stddev 0.5, 0 failed
progress: 2.0 s, 410.0 tps, lat 2.400 ms stddev 0.7, 0 failed
progress: 4.0 s, 450.0 tps, lat 2.200 ms stddev 0.7, 0 failed
transaction type: <builtin: TPC-B (sort of)>
number of transactions actually processed: 1400
number of failed transactions: 0 (0.000%)
latency average = 2.130 ms
tps = 466.731 (without initial connection time)
";

    #[test]
    fn progress_lines_become_seconds_and_the_summary_its_figures() {
        let samples = samples(LOG, "db", 1, 10, 5);
        let tps: Vec<f64> = samples.iter().map(|s| s.transactions).collect();
        assert_eq!(tps, [500.5, 410.0, 0.0, 450.0, 0.0]);
        assert_eq!(samples[0].second, 10);
        assert_eq!(samples[0].instance, 1);
        let summary = summary(LOG);
        assert_eq!(summary["tps"], 466.731);
        assert_eq!(summary["latency_ms"], 2.13);
        assert_eq!(summary["transactions"], 1400.0);
        assert_eq!(summary["failed"], 0.0);
    }
}
