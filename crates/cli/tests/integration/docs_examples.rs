//! The docs' examples run as written.
//!
//! Every fenced ```` ```sh ```` block of README.md and docs/*.md is a
//! runnable example unless its fence line says why it is not:
//! ```` ```sh norun: REASON ```` (several hosts, root, minutes of
//! benchmark...). A `norun` without a reason fails the test, so no example
//! is skipped silently. Synopses and sample output use other fences
//! (```` ```text ````, or none).
//!
//! Each document gets one fresh temporary directory; its runnable blocks run
//! there in order (so a later block may use the files an earlier one made),
//! each as `bash -euo pipefail` in a session of its own, with the debug
//! `strata` first on PATH, HOME and TMPDIR in that directory, and a time
//! limit. When a block ends, every process still in its session (servers
//! it started with `&`) is stopped: SIGTERM, then SIGKILL.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a block may run before it counts as failed.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a block's leftover processes get to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Most bytes of a failed block's output shown (its end).
const OUTPUT_SHOWN: usize = 6000;

/// Documents whose blocks are all left out, and why. They are not ours to
/// mark block by block (another engineer owns them); the reason is printed.
const DOCUMENTS_NOT_RUN: &[(&str, &str)] = &[
    (
        "docs/benchmarks.md",
        "benchmark runs of minutes to hours each (bench/*.sh, bench/*.py)",
    ),
    (
        "docs/benchmarks-log.md",
        "the log of earlier benchmark runs, of minutes to hours each",
    ),
];

/// One fenced shell block of a document.
struct Block {
    /// The document, relative to the workspace root.
    document: String,
    /// Line number of the opening fence (1-based).
    line: usize,
    /// Why it is not run (`sh norun: REASON`), or None to run it.
    norun: Option<String>,
    /// The block's text.
    text: String,
}

/// The workspace root (two levels above this crate).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and docs/*.md, relative to the workspace root, sorted.
fn documents() -> Vec<String> {
    let root = workspace_root();
    let mut names: Vec<String> = fs::read_dir(root.join("docs"))
        .expect("docs/ should be readable")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    names.sort();
    names.insert(0, "README.md".to_string());
    names
}

/// The ```` ```sh ```` blocks of a document, in order. Every fence is
/// paired, whatever its language, so the inside of another block is never
/// taken for shell.
fn document_blocks(document: &str) -> Vec<Block> {
    let path = workspace_root().join(document);
    let markdown = fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("could not read {}: {error}", path.display()));
    let mut blocks = Vec::new();
    let mut inside_other = false;
    let mut open: Option<Block> = None;
    for (index, line) in markdown.lines().enumerate() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            if let Some(block) = open.as_mut() {
                block.text.push_str(line);
                block.text.push('\n');
            }
            continue;
        };
        if inside_other {
            inside_other = false;
        } else if open.is_some() {
            blocks.extend(open.take());
        } else if let Some(rest) = info
            .strip_prefix("sh")
            .filter(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
        {
            let norun = rest
                .trim()
                .strip_prefix("norun")
                .map(|reason| reason.trim_start_matches(':').trim().to_string());
            open = Some(Block {
                document: document.to_string(),
                line: index + 1,
                norun,
                text: String::new(),
            });
        } else {
            inside_other = true;
        }
    }
    blocks
}

/// The directory holding the `strata` binary under test.
fn strata_directory() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_strata"))
        .parent()
        .expect("the strata binary should have a directory")
        .to_path_buf()
}

/// Runs `block` in `directory`; returns its output on failure.
fn run_block(block: &Block, directory: &Path, index: usize) -> Result<(), String> {
    let script = directory.join(format!(".block-{index}.sh"));
    let output = directory.join(format!(".block-{index}.out"));
    fs::write(&script, &block.text).map_err(|error| format!("could not write script: {error}"))?;
    let path = format!(
        "{}:{}",
        strata_directory().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = fs::File::create(&output).map_err(|error| format!("could not make log: {error}"))?;
    let log_err = log
        .try_clone()
        .map_err(|error| format!("could not share log: {error}"))?;
    // setsid: a session of its own, so its servers can all be found and stopped.
    let mut child = Command::new("setsid")
        .args(["bash", "-euo", "pipefail"])
        .arg(&script)
        .current_dir(directory)
        .env("PATH", path)
        .env("TMPDIR", directory)
        .env("HOME", directory)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|error| format!("could not start bash: {error}"))?;
    let session = child.id();
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > BLOCK_TIMEOUT => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(error) => return Err(format!("could not wait for bash: {error}")),
        }
    };
    let leftovers = stop_session(session);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = fs::read_to_string(&output).unwrap_or_default();
    let verdict = match status {
        Some(status) if status.success() => return Ok(()),
        Some(status) => format!("exited with {status}"),
        None => format!("still running after {} s", BLOCK_TIMEOUT.as_secs()),
    };
    let tail_start = text.len().saturating_sub(OUTPUT_SHOWN);
    let tail_start = (tail_start..text.len())
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(text.len());
    Err(format!(
        "{verdict} ({} s; {leftovers} leftover processes stopped); output (end):\n{}",
        started.elapsed().as_secs(),
        &text[tail_start..]
    ))
}

/// Process ids whose session is `session`.
fn session_members(session: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the command name (in parentheses): state ppid pgrp session.
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            after.split_whitespace().nth(3) == Some(&session.to_string())
        })
        .collect()
}

/// Stops every process of `session`: SIGTERM, then SIGKILL after a grace.
/// Returns how many there were.
fn stop_session(session: u32) -> usize {
    let members = session_members(session);
    signal(&members, "TERM");
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline && !live(&session_members(session)).is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&session_members(session), "KILL");
    members.len()
}

/// The processes of `pids` that are not zombies.
fn live(pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            matches!(state, Some(rest) if !rest.starts_with('Z'))
        })
        .collect()
}

/// Sends SIGNAL to `pids` with kill(1).
fn signal(pids: &[u32], name: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

#[test]
fn every_runnable_shell_block_of_the_docs_succeeds() {
    let _host_ports = crate::common::host_ports();
    let mut failures = Vec::new();
    let (mut ran, mut not_run) = (0, 0);
    for document in documents() {
        let blocks = document_blocks(&document);
        if let Some((_, reason)) = DOCUMENTS_NOT_RUN.iter().find(|(name, _)| *name == document) {
            eprintln!("{document}: {} blocks not run: {reason}", blocks.len());
            not_run += blocks.len();
            continue;
        }
        let directory = tempfile::tempdir().expect("a temporary directory");
        for (index, block) in blocks.iter().enumerate() {
            match &block.norun {
                Some(reason) if reason.is_empty() => failures.push(format!(
                    "{}:{}: `sh norun` needs a reason: `sh norun: WHY`",
                    block.document, block.line
                )),
                Some(reason) => {
                    eprintln!("{}:{}: not run: {reason}", block.document, block.line);
                    not_run += 1;
                }
                None => {
                    let started = Instant::now();
                    let result = run_block(block, directory.path(), index);
                    eprintln!(
                        "{}:{}: {} in {:.1} s",
                        block.document,
                        block.line,
                        if result.is_ok() { "ok" } else { "FAILED" },
                        started.elapsed().as_secs_f64()
                    );
                    ran += 1;
                    if let Err(output) = result {
                        failures.push(format!(
                            "{}:{}: the block\n{}{output}",
                            block.document, block.line, block.text
                        ));
                    }
                }
            }
        }
    }
    eprintln!("{ran} blocks run, {not_run} not run");
    assert!(ran > 0, "no runnable shell blocks were found");
    assert!(
        failures.is_empty(),
        "{} docs example(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The runner itself: a failing command fails its block with its output, a
/// `norun` fence is read with its reason, and a server a block left running
/// is stopped when the block ends.
#[test]
fn the_runner_reports_failures_and_stops_leftover_servers() {
    // No host-wide port is used here (its blocks start only `sleep`), so
    // it does not wait its turn behind the documents' examples.
    let directory = tempfile::tempdir().expect("a temporary directory");
    let block = |text: &str| Block {
        document: "self-test".to_string(),
        line: 1,
        norun: None,
        text: text.to_string(),
    };
    let failed = run_block(
        &block("echo before\nfalse\necho after\n"),
        directory.path(),
        0,
    )
    .expect_err("a failing command should fail its block");
    assert!(
        failed.contains("before") && !failed.contains("after"),
        "{failed}"
    );

    let pid_file = directory.path().join("sleeper.pid");
    run_block(
        &block("sleep 1000 &\necho $! > sleeper.pid\n"),
        directory.path(),
        1,
    )
    .expect("the block itself succeeds");
    let pid = fs::read_to_string(&pid_file).expect("the block wrote the pid");
    assert!(
        live(&[pid.trim().parse().expect("a pid")]).is_empty(),
        "the block's background process {} should have been stopped",
        pid.trim()
    );

    let readme = document_blocks("README.md");
    assert!(readme.iter().any(|block| block.norun.is_none()));
    assert!(readme
        .iter()
        .filter_map(|block| block.norun.as_deref())
        .all(|reason| !reason.is_empty()));
}
