//! Memory cgroups for the agent's sandboxes, v1 (`memory.limit_in_bytes`)
//! or v2 (`memory.max`), whichever this host lets the agent use.
//!
//! The agent makes one directory of its own, `strata-f3.NODE.PID`, under
//! the cgroup it runs in (so the host's limits on the agent still hold
//! for its functions), and one cgroup per sandbox inside it. A directory
//! left by an agent that died without cleaning up (its PID gone) is
//! swept at the next agent's start.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{F3Error, Result};

/// Where the v1 memory hierarchy and the v2 hierarchy are mounted, in
/// the order they are tried.
const V1_MEMORY: &str = "/sys/fs/cgroup/memory";
const V2_MOUNTS: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];

/// The prefix of an agent's own cgroup directory.
const AGENT_PREFIX: &str = "strata-f3.";

/// How long emptying a cgroup (SIGKILL to every member) may take.
const EMPTY_WITHIN: Duration = Duration::from_secs(5);

/// Which cgroup version limits the sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// cgroup v1's memory controller.
    V1,
    /// cgroup v2 with its memory controller.
    V2,
}

impl Flavor {
    /// `cgroup v1` or `cgroup v2`.
    pub fn label(self) -> &'static str {
        match self {
            Flavor::V1 => "cgroup v1",
            Flavor::V2 => "cgroup v2",
        }
    }
}

/// The agent's own cgroup directory, parent of its sandboxes' cgroups.
#[derive(Debug)]
pub struct CgroupRoot {
    flavor: Flavor,
    dir: PathBuf,
}

/// One sandbox's cgroup.
#[derive(Debug)]
pub struct Cgroup {
    flavor: Flavor,
    dir: PathBuf,
}

/// The counters read before and after an invocation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// OOM kills in the cgroup so far.
    pub oom_kills: u64,
    /// Times the limit was hit (v1 `memory.failcnt`; v2 `max` events).
    pub limit_hits: u64,
}

impl CgroupRoot {
    /// Finds a writable memory cgroup hierarchy (v2 first, then v1) and
    /// makes the agent's directory in it; the error says why neither works.
    pub fn create(node: &str) -> Result<CgroupRoot> {
        let v2 = v2_parent().and_then(|parent| make_root(Flavor::V2, &parent, node));
        if let Ok(root) = v2 {
            return Ok(root);
        }
        let v1 = own_cgroup("memory")
            .map(|own| Path::new(V1_MEMORY).join(own.trim_start_matches('/')))
            .and_then(|parent| make_root(Flavor::V1, &parent, node));
        v1.map_err(|v1| {
            let v2 = v2.err().map(|e| e.message).unwrap_or_default();
            F3Error::unavailable(format!(
                "no writable memory cgroup: cgroup v2: {v2}; cgroup v1: {}",
                v1.message
            ))
        })
    }

    /// `cgroup v1` or `cgroup v2`.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Makes sandbox cgroup `name`.
    pub fn make(&self, name: &str) -> Result<Cgroup> {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| F3Error::io(format!("creating cgroup {}", dir.display()), e))?;
        Ok(Cgroup {
            flavor: self.flavor,
            dir,
        })
    }

    /// Kills whatever still runs in any sandbox and removes every cgroup
    /// and the agent's directory.
    pub fn remove(&self) {
        remove_tree(&self.dir);
    }
}

/// The v2 cgroup the agent runs in, if it has the memory controller and
/// can hand it down.
fn v2_parent() -> Result<PathBuf> {
    let mount = V2_MOUNTS
        .iter()
        .map(Path::new)
        .find(|m| m.join("cgroup.controllers").is_file())
        .ok_or_else(|| F3Error::unavailable("no cgroup2 hierarchy is mounted"))?;
    let own = own_cgroup("")?;
    let parent = mount.join(own.trim_start_matches('/'));
    let controllers = std::fs::read_to_string(parent.join("cgroup.controllers")).map_err(|e| {
        F3Error::io(
            format!("reading {}/cgroup.controllers", parent.display()),
            e,
        )
    })?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(F3Error::unavailable(format!(
            "{} has no memory controller",
            parent.display()
        )));
    }
    enable_memory(&parent)?;
    Ok(parent)
}

/// Hands the memory controller down to `dir`'s children.
fn enable_memory(dir: &Path) -> Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&control).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    std::fs::write(&control, "+memory")
        .map_err(|e| F3Error::io(format!("enabling memory in {}", control.display()), e))
}

/// The agent's own cgroup path in the hierarchy of `controller` (`""`:
/// the v2 hierarchy), from /proc/self/cgroup.
fn own_cgroup(controller: &str) -> Result<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| F3Error::io("reading /proc/self/cgroup", e))?;
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = if controller.is_empty() {
                names.is_empty()
            } else {
                names.split(',').any(|n| n == controller)
            };
            matches.then(|| path.to_string())
        })
        .next()
        .ok_or_else(|| {
            F3Error::unavailable(format!(
                "/proc/self/cgroup names no {} hierarchy",
                if controller.is_empty() {
                    "v2"
                } else {
                    controller
                }
            ))
        })
}

/// Sweeps directories of dead agents under `parent`, then makes this
/// agent's own.
fn make_root(flavor: Flavor, parent: &Path, node: &str) -> Result<CgroupRoot> {
    sweep_dead(parent);
    let dir = parent.join(format!("{AGENT_PREFIX}{node}.{}", std::process::id()));
    if !dir.is_dir() {
        std::fs::create_dir(&dir)
            .map_err(|e| F3Error::io(format!("creating cgroup {}", dir.display()), e))?;
    }
    if flavor == Flavor::V2 {
        if let Err(e) = enable_memory(&dir) {
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
    }
    Ok(CgroupRoot { flavor, dir })
}

/// Removes `strata-f3.NODE.PID` directories whose agent is gone.
fn sweep_dead(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(AGENT_PREFIX) else {
            continue;
        };
        let pid = rest.rsplit('.').next().and_then(|p| p.parse::<i32>().ok());
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid.is_some_and(|pid| unsafe { libc::kill(pid, 0) } != 0);
        if gone {
            remove_tree(&entry.path());
        }
    }
}

/// Empties and removes `dir`'s child cgroups, then `dir`.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                let child = Cgroup {
                    flavor: Flavor::V1,
                    dir: entry.path(),
                };
                child.remove();
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Cgroup {
    /// Sets the memory limit (and, on v1 with swap accounting, the same
    /// limit on memory plus swap, so a function cannot swap past it).
    pub fn set_limit(&self, bytes: u64) -> Result<()> {
        match self.flavor {
            Flavor::V2 => self.write("memory.max", &bytes.to_string()),
            Flavor::V1 => {
                let swap = self.dir.join("memory.memsw.limit_in_bytes");
                // The memory limit may never exceed the memory+swap one:
                // lower the first first, raise the second first.
                if self
                    .write("memory.limit_in_bytes", &bytes.to_string())
                    .is_err()
                {
                    self.write("memory.memsw.limit_in_bytes", &bytes.to_string())?;
                    self.write("memory.limit_in_bytes", &bytes.to_string())?;
                } else if swap.exists() {
                    self.write("memory.memsw.limit_in_bytes", &bytes.to_string())?;
                }
                Ok(())
            }
        }
    }

    /// Starts a new peak measurement (v2 kernels before 6.12 cannot: the
    /// peak is then the sandbox's since it was made).
    pub fn reset_peak(&self) {
        let _ = match self.flavor {
            Flavor::V1 => self.write("memory.max_usage_in_bytes", "0"),
            Flavor::V2 => self.write("memory.peak", "reset"),
        };
    }

    /// The peak memory use.
    pub fn peak(&self) -> Option<u64> {
        let file = match self.flavor {
            Flavor::V1 => "memory.max_usage_in_bytes",
            Flavor::V2 => "memory.peak",
        };
        self.read(file)?.trim().parse().ok()
    }

    /// The OOM and limit counters now.
    pub fn counters(&self) -> Counters {
        match self.flavor {
            Flavor::V1 => Counters {
                oom_kills: self.field("memory.oom_control", "oom_kill"),
                limit_hits: self
                    .read("memory.failcnt")
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0),
            },
            Flavor::V2 => Counters {
                oom_kills: self.field("memory.events", "oom_kill"),
                limit_hits: self.field("memory.events", "max"),
            },
        }
    }

    /// `cgroup.procs` opened for writing: a child writes `0` to it
    /// before it execs, so that it runs in the cgroup from its first
    /// instruction.
    pub fn procs_file(&self) -> Result<File> {
        let path = self.dir.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| F3Error::io(format!("opening {}", path.display()), e))
    }

    /// SIGKILLs every process in the cgroup until none is left (bounded);
    /// whether it is empty.
    pub fn kill_all(&self) -> bool {
        let deadline = Instant::now() + EMPTY_WITHIN;
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            for pid in pids {
                // SAFETY: signalling a process id read from our cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Empties and removes the cgroup.
    pub fn remove(&self) {
        self.kill_all();
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::warn!("removing cgroup {}: {e}", self.dir.display());
        }
    }

    fn pids(&self) -> Vec<i32> {
        self.read("cgroup.procs")
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// `key N` from a flat keyed file (0 when absent).
    fn field(&self, file: &str, key: &str) -> u64 {
        self.read(file)
            .and_then(|text| {
                text.lines().find_map(|line| {
                    let (k, v) = line.split_once(' ')?;
                    (k == key).then(|| v.trim().parse().ok())?
                })
            })
            .unwrap_or(0)
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .map_err(|e| F3Error::io(format!("writing {value} to {}", path.display()), e))
    }
}
