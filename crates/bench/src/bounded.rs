//! Helper programs run to an end within a time limit, their output kept
//! to a bounded tail: mkfs, losetup, fsck, fio's verify pass, pg_ctl and
//! the like, any of which could hang on a stalled volume or print without
//! end on a damaged one.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most bytes of a helper's output kept (its last ones): enough for the
/// lines that say what went wrong.
const KEPT: usize = 16 << 10;
/// How often a running helper is looked at.
const POLL: Duration = Duration::from_millis(10);

/// How a helper ended: its exit status and the tail of its stdout and
/// stderr.
pub struct Finished {
    /// Whether it exited with status 0.
    pub success: bool,
    /// Its exit status, for messages.
    pub status: String,
    /// The last bytes of its standard output.
    pub stdout: String,
    /// The last bytes of its standard error.
    pub stderr: String,
}

impl Finished {
    /// The last non-empty lines of its output (stderr first), for an
    /// error message.
    pub fn last_lines(&self, count: usize) -> String {
        let text = format!("{}\n{}", self.stderr, self.stdout);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines[lines.len().saturating_sub(count)..].join(" / ")
    }
}

/// Keeps the last [`KEPT`] bytes a pipe gives until it closes.
fn tail_of(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buffer = [0u8; 4096];
        while let Ok(read) = pipe.read(&mut buffer) {
            if read == 0 {
                break;
            }
            kept.extend_from_slice(&buffer[..read]);
            if kept.len() > 2 * KEPT {
                kept.drain(..kept.len() - KEPT);
            }
        }
        let start = kept.len().saturating_sub(KEPT);
        String::from_utf8_lossy(&kept[start..]).into_owned()
    })
}

/// Runs `command` (stdin closed) until it exits or `within` passes (then
/// it is killed and that is the error); what `what` names it in errors.
pub fn run(command: &mut Command, within: Duration, what: &str) -> Result<Finished, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {what} ({:?}): {e}", command.get_program()))?;
    let stdout = child.stdout.take().map(tail_of);
    let stderr = child.stderr.take().map(tail_of);
    let deadline = Instant::now() + within;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{what} did not finish within {within:?}: killed it"
                ));
            }
            Err(e) => return Err(format!("cannot wait for {what}: {e}")),
        }
    };
    // A process it left running (a server it started) may hold its pipes
    // open: their tails are waited for a little, not forever.
    let drained_by = Instant::now() + Duration::from_secs(2);
    let text = |handle: Option<JoinHandle<String>>| {
        let handle = handle?;
        while !handle.is_finished() && Instant::now() < drained_by {
            std::thread::sleep(POLL);
        }
        handle.is_finished().then(|| handle.join().ok()).flatten()
    };
    let (stdout, stderr) = (text(stdout), text(stderr));
    Ok(Finished {
        success: status.success(),
        status: status.to_string(),
        stdout: stdout.unwrap_or_default(),
        stderr: stderr.unwrap_or_default(),
    })
}

/// Runs `command` and asks it to succeed: its stdout, or an error with
/// its status and last lines.
pub fn succeed(command: &mut Command, within: Duration, what: &str) -> Result<String, String> {
    let finished = run(command, within, what)?;
    if finished.success {
        Ok(finished.stdout)
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            finished.status,
            finished.last_lines(3)
        ))
    }
}
