//! The agent's function sandboxes and its invoke endpoint:
//!
//! - `POST /v1/invoke` ([`InvokeRequest`]): runs an executable with its
//!   working directory at the node's F3 mount, in a process group of its
//!   own (setsid) and a memory cgroup of its own (it joins the cgroup
//!   before it execs), kills the whole group at its timeout, and answers
//!   its exit, peak memory, whether the OOM killer acted, and the tails of
//!   its output ([`InvokeResult`]);
//! - `GET /v1/sandboxes` ([`SandboxStatus`]): slots, busy, warm functions.
//!
//! A sandbox (its cgroup) is kept after an invocation for a keep-alive
//! and reused by the next invocation of the same function (a *warm*
//! start); at most `max_warm` are kept, the oldest dropped first, and all
//! are removed at the agent's exit. At most `slots` invocations run at
//! once; more are refused with 503.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use parking_lot::Mutex;

use super::cgroup::{Cgroup, CgroupRoot};
use super::Shared;
use crate::invoke::*;
use crate::protocol::unix_ms;
use crate::service::{answer, body};
use crate::{F3Error, Result};

/// The `PATH` a function gets unless its request sets one.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// How long the output of a function that has ended is still read (a
/// process that left its group and cgroup may hold the pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How often expired warm sandboxes are looked for.
const REAP_PERIOD: Duration = Duration::from_millis(500);

/// How a node runs functions (`strata node --slots --keep-alive-ms
/// --max-warm --no-cgroups`).
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Invocations that may run at once.
    pub slots: u32,
    /// How long an idle sandbox is kept for its function.
    pub keep_alive: Duration,
    /// Most idle sandboxes kept.
    pub max_warm: usize,
    /// Run functions without cgroups (no memory limit), when asked to
    /// explicitly.
    pub no_cgroups: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            slots: 4,
            keep_alive: Duration::from_secs(60),
            max_warm: 16,
            no_cgroups: false,
        }
    }
}

/// A sandbox kept for its function.
#[derive(Debug)]
struct Idle {
    function: String,
    cgroup: Option<Cgroup>,
    until: Instant,
}

#[derive(Debug, Default)]
struct Pool {
    busy: u32,
    idle: Vec<Idle>,
    made: u64,
    closed: bool,
}

/// A node's sandboxes.
#[derive(Debug)]
pub struct Sandboxes {
    node: String,
    mount: PathBuf,
    config: SandboxConfig,
    /// The cgroups, none with `no_cgroups`, or why there are none.
    root: std::result::Result<Option<CgroupRoot>, String>,
    state: Mutex<Pool>,
}

/// A slot taken; given back when dropped.
struct Slot<'a>(&'a Sandboxes);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.busy = state.busy.saturating_sub(1);
    }
}

impl Sandboxes {
    /// The sandboxes of node `node`, whose mount is `mount`; finds the
    /// cgroups (unless `no_cgroups`) and starts the keep-alive reaper.
    pub fn start(node: &str, mount: &Path, config: SandboxConfig) -> Arc<Sandboxes> {
        let root = if config.no_cgroups {
            Ok(None)
        } else {
            CgroupRoot::create(node).map(Some).map_err(|e| e.message)
        };
        if let Err(reason) = &root {
            tracing::warn!("node {node}: functions cannot run: {reason}");
        }
        let sandboxes = Arc::new(Sandboxes {
            node: node.to_string(),
            // Absolute, so that a function's working directory does not
            // depend on the agent's.
            mount: std::fs::canonicalize(mount).unwrap_or_else(|_| mount.to_path_buf()),
            config,
            root,
            state: Mutex::new(Pool::default()),
        });
        let weak = Arc::downgrade(&sandboxes);
        let _ = std::thread::Builder::new()
            .name("f3-sandbox-reaper".into())
            .spawn(move || reap_until_closed(weak));
        sandboxes
    }

    /// Slots, busy, warm functions.
    pub fn status(&self) -> SandboxStatus {
        let state = self.state.lock();
        let mut status = SandboxStatus {
            node: self.node.clone(),
            slots: self.config.slots,
            busy: state.busy,
            cgroups: match &self.root {
                Ok(Some(root)) => root.flavor().label().to_string(),
                Ok(None) => "none".to_string(),
                Err(_) => "unavailable".to_string(),
            },
            ..SandboxStatus::default()
        };
        for idle in &state.idle {
            *status.warm.entry(idle.function.clone()).or_insert(0) += 1;
        }
        status
    }

    /// Runs one invocation to its end (see the module's doc).
    pub fn invoke(&self, request: &InvokeRequest) -> Result<InvokeResult> {
        request.check()?;
        let root = self.root.as_ref().map_err(|reason| {
            F3Error::unavailable(format!(
                "node {} cannot limit a function's memory ({reason}): run `strata node` as root \
                 where cgroup v1 memory or cgroup v2 memory.max is writable, or start it with \
                 --no-cgroups to run functions without limits",
                self.node
            ))
        })?;
        let executable = self.executable(request)?;
        let _slot = self.take_slot()?;
        let (cgroup, start) = self.take_sandbox(root.as_ref(), &request.function)?;
        let result = self.run(request, &executable, cgroup.as_ref(), start);
        self.keep(&request.function, cgroup);
        result
    }

    /// Kills what still runs and removes every cgroup (the agent exits).
    pub fn shutdown(&self) {
        let idle = {
            let mut state = self.state.lock();
            state.closed = true;
            std::mem::take(&mut state.idle)
        };
        drop(idle);
        if let Ok(Some(root)) = &self.root {
            root.remove();
        }
    }

    fn take_slot(&self) -> Result<Slot<'_>> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(F3Error::unavailable(format!(
                "node {} is stopping",
                self.node
            )));
        }
        if state.busy >= self.config.slots {
            return Err(F3Error::unavailable(format!(
                "node {} is busy: all {} slots run functions; retry later, choose another \
                 node, or start `strata node` with more --slots",
                self.node, self.config.slots
            )));
        }
        state.busy += 1;
        Ok(Slot(self))
    }

    /// A kept sandbox of `function` (warm), or a new one (cold).
    fn take_sandbox(
        &self,
        root: Option<&CgroupRoot>,
        function: &str,
    ) -> Result<(Option<Cgroup>, Start)> {
        let made = {
            let mut state = self.state.lock();
            let now = Instant::now();
            if let Some(index) = state
                .idle
                .iter()
                .position(|i| i.function == function && i.until > now)
            {
                let mut idle = state.idle.remove(index);
                return Ok((idle.cgroup.take(), Start::Warm));
            }
            state.made += 1;
            state.made
        };
        let cgroup = match root {
            Some(root) => Some(root.make(&format!("{function}.{made}"))?),
            None => None,
        };
        Ok((cgroup, Start::Cold))
    }

    /// Keeps an emptied sandbox for its function, within `max_warm`.
    fn keep(&self, function: &str, cgroup: Option<Cgroup>) {
        if let Some(cgroup) = &cgroup {
            if !cgroup.kill_all() {
                cgroup.remove();
                return;
            }
        }
        let dropped = {
            let mut state = self.state.lock();
            if state.closed || self.config.max_warm == 0 {
                vec![Idle {
                    function: function.to_string(),
                    cgroup,
                    until: Instant::now(),
                }]
            } else {
                state.idle.push(Idle {
                    function: function.to_string(),
                    cgroup,
                    until: Instant::now() + self.config.keep_alive,
                });
                let excess = state.idle.len().saturating_sub(self.config.max_warm);
                state.idle.drain(..excess).collect()
            }
        };
        drop(dropped);
    }

    /// Drops sandboxes past their keep-alive.
    fn reap(&self) {
        let expired: Vec<Idle> = {
            let mut state = self.state.lock();
            let now = Instant::now();
            let (expired, kept) = std::mem::take(&mut state.idle)
                .into_iter()
                .partition(|i| i.until <= now);
            state.idle = kept;
            expired
        };
        drop(expired);
    }

    /// `argv[0]` as a path that exists and is executable.
    fn executable(&self, request: &InvokeRequest) -> Result<PathBuf> {
        let name = &request.argv[0];
        let candidates: Vec<PathBuf> = if name.contains('/') {
            vec![self.mount.join(name)]
        } else {
            let path = request.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
            path.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| Path::new(d).join(name))
                .collect()
        };
        candidates
            .into_iter()
            .find(|c| {
                c.metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .ok_or_else(|| {
                F3Error::not_found(format!(
                    "invoke: executable {name:?} not found on node {} (an absolute path, a path \
                     relative to the F3 mount, or a name in PATH): install it on the node or \
                     give its full path",
                    self.node
                ))
            })
    }

    fn run(
        &self,
        request: &InvokeRequest,
        executable: &Path,
        cgroup: Option<&Cgroup>,
        start: Start,
    ) -> Result<InvokeResult> {
        let before = match cgroup {
            Some(cgroup) => {
                cgroup.set_limit(request.memory_bytes)?;
                cgroup.reset_peak();
                cgroup.counters()
            }
            None => Default::default(),
        };
        let procs = cgroup.map(Cgroup::procs_file).transpose()?;
        let started_ms = unix_ms();
        let mut child = self.spawn(request, executable, procs.as_ref())?;
        drop(procs);
        let stdout = child.stdout.take().map(tail_reader);
        let stderr = child.stderr.take().map(tail_reader);
        let deadline = Instant::now() + Duration::from_millis(request.timeout_ms);
        let (status, timed_out) = wait_until(&mut child, deadline)?;
        // The whole group, and whatever left it but stayed in the cgroup.
        // SAFETY: signalling the process group the child leads.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        if let Some(cgroup) = cgroup {
            cgroup.kill_all();
        }
        let ended_ms = unix_ms();
        let after = cgroup.map(Cgroup::counters).unwrap_or_default();
        let out_of_memory = after.oom_kills > before.oom_kills
            || (after.limit_hits > before.limit_hits && status.signal() == Some(libc::SIGKILL));
        Ok(InvokeResult {
            node: self.node.clone(),
            function: request.function.clone(),
            start,
            exit_code: status.code(),
            signal: status.signal(),
            timed_out,
            out_of_memory,
            memory_limit_bytes: request.memory_bytes,
            peak_memory_bytes: cgroup.and_then(Cgroup::peak),
            started_ms,
            ended_ms,
            stdout_tail: joined(stdout),
            stderr_tail: joined(stderr),
        })
    }

    fn spawn(
        &self,
        request: &InvokeRequest,
        executable: &Path,
        procs: Option<&std::fs::File>,
    ) -> Result<Child> {
        let mut command = Command::new(executable);
        command
            .arg0(&request.argv[0])
            .args(&request.argv[1..])
            .current_dir(&self.mount)
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .env("HOME", "/")
            .env("F3_MOUNT", &self.mount)
            .env("F3_NODE", &self.node)
            .envs(&request.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let procs_fd = procs.map(|f| f.as_raw_fd());
        // SAFETY: between fork and exec the closure calls only setsid and
        // write, both async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = procs_fd {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        command.spawn().map_err(|e| {
            F3Error::io(
                format!(
                    "invoke: starting {} on node {}",
                    executable.display(),
                    self.node
                ),
                e,
            )
        })
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.remove();
        }
    }
}

fn reap_until_closed(sandboxes: Weak<Sandboxes>) {
    loop {
        std::thread::sleep(REAP_PERIOD);
        let Some(sandboxes) = sandboxes.upgrade() else {
            return;
        };
        if sandboxes.state.lock().closed {
            return;
        }
        sandboxes.reap();
    }
}

/// Waits for `child` until `deadline`; kills its group past it. Its
/// status, and whether it ran out of time.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<(std::process::ExitStatus, bool)> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| F3Error::io("waiting for a function", e))?
        {
            return Ok((status, false));
        }
        if Instant::now() >= deadline {
            // SAFETY: signalling the process group the child leads.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let status = child
                .wait()
                .map_err(|e| F3Error::io("waiting for a killed function", e))?;
            return Ok((status, true));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Reads a pipe to its end on a thread, keeping its last
/// [`OUTPUT_TAIL_BYTES`], which come on the channel.
fn tail_reader(mut pipe: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        while let Ok(n) = pipe.read(&mut buffer) {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buffer[..n]);
            if kept.len() > 2 * OUTPUT_TAIL_BYTES {
                kept.drain(..kept.len() - OUTPUT_TAIL_BYTES);
            }
        }
        let start = kept.len().saturating_sub(OUTPUT_TAIL_BYTES);
        let _ = sender.send(kept.split_off(start));
    });
    receiver
}

/// The tail a reader kept; empty if its pipe is still open after
/// [`OUTPUT_GRACE`] (the reader then ends with the last writer).
fn joined(reader: Option<Receiver<Vec<u8>>>) -> String {
    reader
        .and_then(|r| r.recv_timeout(OUTPUT_GRACE).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// The invoke routes, merged into the transfer service.
pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/invoke", post(invoke))
        .route("/v1/sandboxes", get(status))
}

type Body<T> = std::result::Result<axum::Json<T>, axum::extract::rejection::JsonRejection>;

async fn invoke(State(shared): State<Arc<Shared>>, request: Body<InvokeRequest>) -> Response {
    let request = match body(request) {
        Ok(r) => r,
        Err(e) => return answer::<InvokeResult>(Err(e)),
    };
    let result = tokio::task::spawn_blocking(move || shared.sandboxes.invoke(&request))
        .await
        .unwrap_or_else(|e| Err(F3Error::unavailable(format!("invoke: {e}"))));
    answer(result)
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    answer(Ok(shared.sandboxes.status()))
}
