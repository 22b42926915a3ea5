//! The object store as real processes: `strata store up` ([`Store`]) and
//! the nodes `strata store node add` starts on their own ([`Node`]).

use crate::common::{p, Launch, Proc};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use strata_store_protocol::tenant::{TenantCredential, ADMIN_CREDENTIAL_FILE, CREDENTIAL_ENV};
use strata_store_protocol::wire::Msg;

/// The directory of each running `strata store up`, by its orchestrator's
/// endpoint: clients in the tests act as its admin tenant.
pub static STORE_DIRS: std::sync::Mutex<Vec<(SocketAddr, PathBuf)>> =
    std::sync::Mutex::new(Vec::new());

/// The admin credential `strata store up` wrote for the cluster at `on`.
pub fn admin(on: SocketAddr) -> TenantCredential {
    let dirs = STORE_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = dirs
        .iter()
        .rev()
        .find(|(o, _)| *o == on)
        .map(|(_, d)| d.clone())
        .unwrap_or_else(|| panic!("no store at {on}"));
    TenantCredential::load(&dir.join(ADMIN_CREDENTIAL_FILE)).unwrap()
}

/// `msg` sealed as the admin tenant of the cluster at `on`.
pub fn as_admin(on: SocketAddr, msg: &Msg) -> Vec<u8> {
    msg.seal_tenant(&admin(on), strata_store_protocol::auth::unix_ms())
        .unwrap()
}

/// A `strata store up` process ([`Proc`]: killed on drop, its stderr
/// shown when the test fails).
pub struct Store {
    process: Option<Proc>,
    /// The orchestrator's endpoint.
    pub on: SocketAddr,
    /// Its `--dir`.
    pub dir: PathBuf,
}

impl Store {
    /// `strata store up --dir DIR EXTRA...` on a loopback port, ready; its
    /// admin credential is then what [`admin`] finds for its endpoint.
    pub fn up(dir: &Path, extra: &[&str]) -> Store {
        Store::up_on(dir, "127.0.0.1:0", None, extra)
    }

    /// [`Store::up`] listening on `listen`, in network namespace `netns`
    /// if given.
    pub fn up_on(dir: &Path, listen: &str, netns: Option<&str>, extra: &[&str]) -> Store {
        let dir_arg = p(dir);
        let mut args = vec!["store", "up", "--dir", &dir_arg, "--listen", listen];
        args.extend_from_slice(extra);
        let mut launch = Launch::strata(&args);
        if let Some(name) = netns {
            launch = launch.netns(name);
        }
        let process = launch.start();
        // "strata store: ready on 127.0.0.1:PORT (...)"
        let on = process
            .word_after("ready on ")
            .parse()
            .unwrap_or_else(|_| panic!("no endpoint on the readiness line {:?}", process.line));
        STORE_DIRS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((on, dir.to_path_buf()));
        Store {
            process: Some(process),
            on,
            dir: dir.to_path_buf(),
        }
    }

    /// The process id of `strata store up`.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("running").pid()
    }

    /// Its readiness line.
    pub fn line(&self) -> &str {
        &self.process.as_ref().expect("running").line
    }

    /// `strata ARGS --cluster ON`, with the cluster key in the
    /// environment (control commands need it).
    pub fn run(&self, args: &[&str]) -> std::process::Output {
        self.strata(args).output().expect("run strata")
    }

    /// `strata ARGS` against this store, as its operator.
    fn strata(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_strata"));
        command
            .args(args)
            .args(["--cluster", &self.on.to_string()])
            .env("STRATA_CLUSTER_KEY", self.key_path())
            .env(CREDENTIAL_ENV, self.dir.join(ADMIN_CREDENTIAL_FILE));
        command
    }

    /// `strata ARGS` against this store, to run (as often as needed)
    /// with its output thrown away.
    pub fn quiet_command(&self, args: &[&str]) -> Command {
        let mut command = self.strata(args);
        command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    }

    /// Starts `strata ARGS` against this store, its output captured, and
    /// returns at once.
    pub fn command(&self, args: &[&str]) -> std::process::Child {
        self.strata(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run strata")
    }

    /// The cluster key `strata store up` made.
    pub fn key_path(&self) -> PathBuf {
        self.dir.join("cluster.key")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "strata {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["--output", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("json output")
    }

    /// Waits until the status lists `count` nodes of `kind` ("storage" or
    /// "metadata").
    pub fn wait_for_nodes(&self, kind: &str, count: usize) {
        wait_until(&format!("{count} {kind} nodes"), || {
            self.status()[format!("{kind}_nodes")]
                .as_array()
                .unwrap()
                .len()
                == count
        });
    }

    pub fn status(&self) -> serde_json::Value {
        self.json(&["store", "status"])
    }

    /// SIGTERM, then waits (bounded) for it to exit; its status and
    /// stderr. Once stopped, a second call is an error of the test.
    pub fn stop(&mut self) -> (ExitStatus, String) {
        self.process.take().expect("running").stop()
    }

    /// The replica or fragment addresses of `name`'s record, in its
    /// order (`strata obj stat`).
    pub fn addresses_of(&self, name: &str) -> Vec<String> {
        self.json(&["obj", "stat", name])["replicas"]
            .as_array()
            .unwrap_or_else(|| panic!("no replica list in the record of {name}"))
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    }

    /// Every replica file held by the storage nodes.
    pub fn replica_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for k in 0..8 {
            let d = self.dir.join(format!("sn-{k}/replicas"));
            if let Ok(rd) = std::fs::read_dir(&d) {
                out.extend(rd.flatten().map(|e| e.path()));
            }
        }
        out
    }

    /// The sum over every storage node of `metric`'s samples on the
    /// process's `/metrics` (started with `--metrics 127.0.0.1:0`).
    pub fn metric_sum(&self, metric: &str) -> f64 {
        let line = self.line();
        let at = line
            .split("metrics on http://")
            .nth(1)
            .unwrap_or_else(|| panic!("no metrics endpoint on {line:?}"));
        let at = at.split([',', ' ']).next().unwrap_or_default();
        let text = ureq::get(&format!("http://{}", at.trim()))
            .call()
            .expect("GET /metrics")
            .into_string()
            .expect("a text body");
        text.lines()
            .filter(|line| line.starts_with(&format!("{metric}{{")))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn tmp_files(&self) -> usize {
        (0..8)
            .filter_map(|k| std::fs::read_dir(self.dir.join(format!("sn-{k}/tmp"))).ok())
            .map(|rd| rd.count())
            .sum()
    }
}

/// Waits until `f` holds, for at most 30 s: the limit only decides how
/// long a failing test takes, and a loaded machine (the suite runs its
/// tests in parallel, with aws-cli's and Python's start-ups) has taken
/// over 10 s for steps that take one when it is quiet.
pub fn wait_until(what: &str, f: impl FnMut() -> bool) {
    wait_until_long(what, Duration::from_secs(30), f)
}

pub fn wait_until_long(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `strata store node add` process (a node of its own, so it can be
/// killed with SIGKILL), killed on drop; with its readiness line.
pub struct Node(pub Child, pub String);

impl Node {
    pub fn add(store: &Store, dir: &Path, role: &str) -> Node {
        Node::add_with(store, dir, role, &[])
    }

    pub fn add_with(store: &Store, dir: &Path, role: &str, extra: &[&str]) -> Node {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["store", "node", "add", "--cluster", &store.on.to_string()])
            .args(["--role", role, "--dir", &p(dir)])
            .args(extra)
            .env("STRATA_CLUSTER_KEY", store.key_path())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn strata store node add");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("strata store:"), "{line:?}");
        Node(child, line)
    }

    pub fn kill9(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The file holding the replica or fragment at `addr` (as a record lists
/// it), if a storage node under `root` (a cluster's directory, or an
/// added node's) holds it.
pub fn file_of_address(root: &Path, addr: &str) -> Option<PathBuf> {
    let ip: std::net::Ipv6Addr = addr.parse().unwrap();
    let name = format!("{:032x}", u128::from(ip));
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == name.as_str()) {
                return Some(path);
            }
        }
    }
    None
}
