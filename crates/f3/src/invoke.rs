//! The JSON messages of an agent's invoke endpoint (`POST /v1/invoke`,
//! `GET /v1/sandboxes`): plain enough that any driver (the workflow runner
//! here, or OpenWhisk or Knative in front of the storage parts) can run a
//! function on a node with its working directory at the node's F3 mount.
//! Every request is checked against the bounds here before it is used.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{F3Error, Result};

/// Most words an invocation's argv has.
pub const MAX_ARGS: usize = 256;

/// Most environment variables an invocation sets.
pub const MAX_ENV: usize = 256;

/// Most bytes of argv, or of the environment, counted together.
pub const MAX_ARGV_BYTES: usize = 64 * 1024;

/// Longest function name.
pub const MAX_FUNCTION_NAME_BYTES: usize = 63;

/// Smallest memory limit (below it even a shell cannot start).
pub const MIN_MEMORY_BYTES: u64 = 4 * 1024 * 1024;

/// Largest memory limit an invocation may ask for.
pub const MAX_MEMORY_BYTES: u64 = 1 << 40;

/// Longest timeout an invocation may ask for: one hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// How much of the end of stdout and of stderr an answer carries.
pub const OUTPUT_TAIL_BYTES: usize = 64 * 1024;

/// `POST /v1/invoke`: run one function on this node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeRequest {
    /// The function's name: invocations of one name reuse its warm
    /// sandbox. Letters, digits, `-`, `_`, `.`.
    pub function: String,
    /// The command: `argv[0]` is the executable (a path, absolute or
    /// relative to the mount, or a name looked up in `PATH`).
    pub argv: Vec<String>,
    /// Environment variables, on top of a minimal `PATH`, `HOME` and
    /// `F3_MOUNT`, `F3_NODE`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The sandbox's memory limit, in bytes.
    pub memory_bytes: u64,
    /// How long it may run before its whole process group is killed.
    pub timeout_ms: u64,
}

impl InvokeRequest {
    /// Checks names and bounds; the message says which and what to send.
    pub fn check(&self) -> Result<()> {
        check_function_name(&self.function)?;
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(F3Error::invalid(
                "invoke: argv is empty: give the executable as argv[0]",
            ));
        }
        check_words("argv", self.argv.iter().map(String::as_str), MAX_ARGS)?;
        check_words(
            "env",
            self.env.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]),
            MAX_ENV * 2,
        )?;
        if let Some(key) = self
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(F3Error::invalid(format!(
                "invoke: environment name {key:?}: give a non-empty name without '=' or NUL"
            )));
        }
        if !(MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(&self.memory_bytes) {
            return Err(F3Error::invalid(format!(
                "invoke: memory_bytes {}: give {MIN_MEMORY_BYTES} to {MAX_MEMORY_BYTES}",
                self.memory_bytes
            )));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(F3Error::invalid(format!(
                "invoke: timeout_ms {}: give 1 to {MAX_TIMEOUT_MS}",
                self.timeout_ms
            )));
        }
        Ok(())
    }
}

/// Checks a function's name: 1 to 63 letters, digits, `-`, `_`, `.`.
pub fn check_function_name(name: &str) -> Result<()> {
    crate::protocol::check_short_name("function name", name, MAX_FUNCTION_NAME_BYTES)
}

fn check_words<'a>(what: &str, words: impl Iterator<Item = &'a str>, most: usize) -> Result<()> {
    let mut count = 0;
    let mut bytes = 0;
    for word in words {
        count += 1;
        bytes += word.len() + 1;
        if word.contains('\0') {
            return Err(F3Error::invalid(format!(
                "invoke: {what} holds a NUL byte: remove it"
            )));
        }
    }
    if count > most || bytes > MAX_ARGV_BYTES {
        return Err(F3Error::invalid(format!(
            "invoke: {what} has {count} words and {bytes} bytes: at most {most} words and \
             {MAX_ARGV_BYTES} bytes; pass bulk data through a file in F3 instead"
        )));
    }
    Ok(())
}

/// Whether an invocation found its function's sandbox ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// A new sandbox (cgroup) was made for it.
    Cold,
    /// A kept sandbox of the same function was reused.
    Warm,
}

/// The answer to an invocation that ran (whatever its exit).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvokeResult {
    /// The node it ran on.
    pub node: String,
    /// The function.
    pub function: String,
    /// Cold or warm.
    pub start: Start,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// It ran past its timeout and its process group was killed.
    pub timed_out: bool,
    /// The kernel's OOM killer acted in its sandbox (over its limit).
    pub out_of_memory: bool,
    /// The limit it ran under.
    pub memory_limit_bytes: u64,
    /// Its sandbox's peak memory use, when cgroups measure it.
    pub peak_memory_bytes: Option<u64>,
    /// Unix milliseconds when it started and ended.
    pub started_ms: u64,
    /// See `started_ms`.
    pub ended_ms: u64,
    /// The last [`OUTPUT_TAIL_BYTES`] of its stdout (lossy UTF-8).
    pub stdout_tail: String,
    /// The last [`OUTPUT_TAIL_BYTES`] of its stderr (lossy UTF-8).
    pub stderr_tail: String,
}

impl InvokeResult {
    /// Exited with code 0, neither killed nor over its memory.
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && !self.out_of_memory
    }

    /// Why it failed, in words (exit code, signal, timeout, memory).
    pub fn failure(&self) -> Option<String> {
        if self.succeeded() {
            return None;
        }
        Some(if self.out_of_memory {
            format!(
                "went over its memory limit of {} bytes ({} MiB) and was killed: raise `memory`",
                self.memory_limit_bytes,
                self.memory_limit_bytes / (1024 * 1024)
            )
        } else if self.timed_out {
            "ran past its timeout and was killed: raise `timeout`".to_string()
        } else if let Some(code) = self.exit_code {
            format!("exited with code {code}")
        } else {
            format!("was killed by signal {}", self.signal.unwrap_or(0))
        })
    }
}

/// `GET /v1/sandboxes`: what a scheduler needs to know about a node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SandboxStatus {
    /// The node.
    pub node: String,
    /// Concurrent invocations it takes (`strata node --slots`).
    pub slots: u32,
    /// Invocations running now.
    pub busy: u32,
    /// Functions with a warm sandbox kept, with how many.
    pub warm: BTreeMap<String, u32>,
    /// How sandboxes are limited: `cgroup v1`, `cgroup v2` or `none`.
    pub cgroups: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> InvokeRequest {
        InvokeRequest {
            function: "f".into(),
            argv: vec!["/bin/true".into()],
            env: BTreeMap::new(),
            memory_bytes: 64 << 20,
            timeout_ms: 1000,
        }
    }

    #[test]
    fn bounds_are_checked() {
        assert!(request().check().is_ok());
        let mut r = request();
        r.argv = vec!["x".repeat(1000); 100];
        assert!(r.check().unwrap_err().message.contains("at most"));
        let mut r = request();
        r.argv.clear();
        assert!(r.check().is_err());
        let mut r = request();
        r.function = "a/b".into();
        assert!(r.check().is_err());
        let mut r = request();
        r.memory_bytes = 1;
        assert!(r.check().unwrap_err().message.contains("memory_bytes"));
        let mut r = request();
        r.env.insert("A=B".into(), "x".into());
        assert!(r.check().is_err());
    }
}
