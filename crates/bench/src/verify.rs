//! The data checks of restore-and-verify, and the fill they rely on:
//! fio's own verify of a workload's blocks over NBD, fsck of an ext4 file
//! system (its journal replayed first, as a mount would), and pgbench's
//! balances on a PostgreSQL server started on a restored file system.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::bounded;

/// How long a fill, a verify pass or an fsck may take.
const CHECK_WITHIN: Duration = Duration::from_secs(600);

/// fio writing or verifying the blocks a workload's `options` (block size,
/// size, offset, verify method) describe, sequentially, at `uri`.
fn fio_pass(uri: &str, options: &BTreeMap<String, String>, work_dir: &Path) -> Command {
    let mut command = Command::new("fio");
    // fio keeps files of its own in its directory (verify state).
    command.current_dir(work_dir);
    command.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=write",
        "--iodepth=8",
    ]);
    for (key, value) in options {
        command.arg(format!("--{key}={value}"));
    }
    command
}

/// Writes every block of the workload's region once with fio's verify
/// headers and checksums, so that from then on every block holds a
/// block fio can check, whichever the workload rewrote since.
pub fn fill(uri: &str, options: &BTreeMap<String, String>, work_dir: &Path) -> Result<(), String> {
    bounded::succeed(
        fio_pass(uri, options, work_dir).arg("--do_verify=0"),
        CHECK_WITHIN,
        "fio's fill",
    )
    .map(|_| ())
}

/// fio's `verify_only` pass over the workload's region at `uri`: every
/// block must hold a valid header for its offset and a matching checksum.
pub fn fio_verify(
    uri: &str,
    options: &BTreeMap<String, String>,
    work_dir: &Path,
) -> Result<(), String> {
    let finished = bounded::run(
        fio_pass(uri, options, work_dir).args(["--verify_only=1", "--verify_fatal=1"]),
        CHECK_WITHIN,
        "fio's verify",
    )?;
    if finished.success {
        return Ok(());
    }
    // fio names the first bad block on a line of its own.
    let text = format!("{}\n{}", finished.stderr, finished.stdout);
    let first = text
        .lines()
        .find(|l| l.contains("verify:"))
        .map_or_else(|| finished.last_lines(2), |l| l.trim().to_string());
    Err(format!(
        "fio's verify failed ({}): {first}",
        finished.status
    ))
}

/// Replays the journal of the ext4 file system in `file` (a restored
/// snapshot is a crash image: its journal holds the last commits), then
/// checks it read-only with `fsck.ext4 -fn`.
pub fn fsck(file: &Path) -> Result<(), String> {
    let replay = bounded::run(
        Command::new("e2fsck")
            .args(["-p", "-E", "journal_only"])
            .arg(file),
        CHECK_WITHIN,
        "e2fsck's journal replay",
    )?;
    if !replay.success {
        return Err(format!(
            "e2fsck could not replay the journal ({}): {}",
            replay.status,
            problems(&replay)
        ));
    }
    let check = bounded::run(
        Command::new("fsck.ext4").arg("-fn").arg(file),
        CHECK_WITHIN,
        "fsck.ext4 -fn",
    )?;
    if check.success {
        return Ok(());
    }
    Err(format!(
        "fsck.ext4 -fn found errors ({}): {}",
        check.status,
        problems(&check)
    ))
}

/// The first lines of e2fsck's output that name a problem (not its
/// banner or its pass headings).
fn problems(finished: &bounded::Finished) -> String {
    let text = format!("{}\n{}", finished.stderr, finished.stdout);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Pass ") && !l.starts_with("e2fsck 1."))
        .take(3)
        .collect();
    lines.join(" / ")
}
