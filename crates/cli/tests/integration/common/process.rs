//! One harness for every long-running `strata` process a test starts: it
//! waits for the readiness line, drains stdout so the process never
//! blocks on a full pipe, keeps stderr in a file, kills the process when
//! the test ends (even by panic) and shows its stderr when the test fails.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a process may take to print its readiness line.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// How long a process may take to exit after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(20);

/// At most this much of a process's stderr is shown in a failure message.
const LOG_SHOWN: usize = 20_000;

/// How a process is started: its arguments, directory and environment,
/// and where its stderr goes.
#[derive(Default)]
pub struct Launch {
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    log: Option<PathBuf>,
    netns: Option<String>,
    /// Whether it keeps the test's mount namespace in `netns`.
    keeps_mounts: bool,
}

impl Launch {
    /// `strata ARGS`.
    pub fn strata(args: &[&str]) -> Launch {
        Launch {
            args: args.iter().map(OsString::from).collect(),
            ..Launch::default()
        }
    }

    /// Runs it in `dir`.
    pub fn cwd(mut self, dir: &Path) -> Launch {
        self.cwd = Some(dir.to_path_buf());
        self
    }

    /// Adds `key=value` to its environment (never to the test's own,
    /// which every test in this binary shares).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Launch {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs it in network namespace `name` (`ip netns exec`, which execs
    /// it: the process is still strata's own).
    pub fn netns(mut self, name: &str) -> Launch {
        self.netns = Some(name.to_string());
        self
    }

    /// Runs it in network namespace `name` but in the test's own mount
    /// namespace (`nsenter --net`, which execs it too), so that a FUSE
    /// mount it makes is visible to the test; `ip netns exec` would give
    /// it a mount namespace of its own.
    pub fn netns_keeping_mounts(mut self, name: &str) -> Launch {
        self.netns = Some(name.to_string());
        self.keeps_mounts = true;
        self
    }

    /// Keeps its stderr in `path` (a temporary file otherwise).
    pub fn log(mut self, path: PathBuf) -> Launch {
        self.log = Some(path);
        self
    }

    /// Starts it and waits for its readiness line; `Err` with its stderr
    /// if it exits or stays silent first.
    pub fn try_start(self) -> Result<Proc, String> {
        let (log, log_dir) = match self.log {
            Some(path) => (path, None),
            None => {
                let dir = tempfile::tempdir().expect("log directory");
                (dir.path().join("stderr.log"), Some(dir))
            }
        };
        let stderr = std::fs::File::create(&log).expect("process log");
        let mut command = match &self.netns {
            Some(name) if self.keeps_mounts => {
                let mut command = Command::new("nsenter");
                command.arg(format!("--net=/var/run/netns/{name}"));
                command.arg(env!("CARGO_BIN_EXE_strata"));
                command
            }
            Some(name) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", name, env!("CARGO_BIN_EXE_strata")]);
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_strata")),
        };
        command
            .args(&self.args)
            .envs(self.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        if let Some(dir) = &self.cwd {
            command.current_dir(dir);
        }
        let mut child = command.spawn().expect("spawn strata");
        let stdout = child.stdout.take().expect("stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = ready_tx.send(line);
            }
            for _ in lines {}
        });
        let mut proc = Proc {
            child: Some(child),
            line: String::new(),
            log,
            _log_dir: log_dir,
        };
        let what = format!("strata {:?}", self.args);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(line) = ready_rx.recv_timeout(Duration::from_millis(50)) {
                proc.line = line;
                return Ok(proc);
            }
            let child = proc.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("try_wait") {
                proc.child = None;
                return Err(format!("{what} exited ({status}):\n{}", proc.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{what}: no readiness line after {READY_WITHIN:?}:\n{}",
                    proc.log_text()
                ));
            }
        }
    }

    /// Starts it; the test fails if it does not get ready.
    pub fn start(self) -> Proc {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A running `strata` process that printed its readiness line.
pub struct Proc {
    child: Option<Child>,
    /// Its readiness line, without the newline.
    pub line: String,
    log: PathBuf,
    _log_dir: Option<tempfile::TempDir>,
}

impl Proc {
    /// `strata ARGS`, ready.
    pub fn start(args: &[&str]) -> Proc {
        Launch::strata(args).start()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Its process id, unless it was stopped.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The word after `key` on the readiness line (up to a space or comma).
    pub fn word_after(&self, key: &str) -> String {
        let at = self
            .line
            .find(key)
            .unwrap_or_else(|| panic!("{key:?} not on the readiness line {:?}", self.line));
        self.line[at + key.len()..]
            .split(|c: char| c.is_whitespace() || c == ',')
            .next()
            .unwrap_or_default()
            .to_string()
    }

    /// What it wrote to stderr so far (bounded).
    pub fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.chars().take(LOG_SHOWN).collect()
    }

    /// Fails the test, with its stderr, if it has exited.
    pub fn assert_running(&mut self) {
        let running = match &mut self.child {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        };
        assert!(running, "the process died:\n{}", self.log_text());
    }

    /// SIGTERM, then waits (bounded) for it to exit; its status and stderr.
    pub fn stop(&mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        // SAFETY: signalling a child we own and have not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_WITHIN;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return (status, self.log_text());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "no exit {STOP_WITHIN:?} after SIGTERM:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; the test fails unless it exits cleanly.
    pub fn stop_ok(&mut self) {
        let (status, log) = self.stop();
        assert!(status.success(), "exit {status}:\n{log}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if std::thread::panicking() {
                eprintln!("stderr of the process:\n{}", self.log_text());
            }
        }
    }
}
