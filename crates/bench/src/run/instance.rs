//! A run's workload instances: each a process in its own group, waited
//! for and stopped at the run's end, then recorded with its I/O.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::Instant;

use super::{Done, Event, Run, KILL_AFTER, POLL, WORKLOAD_GRACE};
use crate::output_parser::{self, Tally};
use crate::provider::{Detail, Stages};
use crate::record::IoSample;
use crate::spec::{Workload, WorkloadKind};
use crate::workload::{self, Variables};

impl Run<'_> {
    /// Runs one workload instance to its end, stopping it at `stop` or
    /// [`WORKLOAD_GRACE`] after the deadline; records it and its I/O.
    pub(super) fn run_instance(
        &self,
        workload: &Workload,
        instance: u32,
        barrier: Option<&Barrier>,
        deadline: Instant,
    ) {
        let volume = self.inventory.lock().volume_at(&workload.volumes, instance);
        // pgbench's server, made and loaded at setup.
        let server = self
            .servers
            .lock()
            .remove(&(workload.name.clone(), instance));
        if let Some(barrier) = barrier {
            barrier.wait();
        }
        let start = Instant::now();
        let mut stages = Stages::default();
        let Some(volume) = volume else {
            let error = format!(
                "volume {instance} of group `{}` was not made (see its setup record)",
                workload.volumes
            );
            return self.record(
                &workload.name,
                "workload",
                start,
                Run::failed(String::new(), error),
            );
        };
        let variables = Variables {
            run: self.run_id.clone(),
            workload: workload.name.clone(),
            instance,
            uri: self.provider.uri(&volume.name).unwrap_or_default(),
            volume: volume.name.clone(),
            size: volume.size,
            mount: self.mount_point(&volume.name).unwrap_or_default(),
        };
        let result = match &workload.kind {
            WorkloadKind::Pgbench(options) => {
                let server = server.unwrap_or_else(|| Err("PostgreSQL was not set up".into()));
                self.run_pgbench(server, options.clients, &variables, deadline, &mut stages)
            }
            _ => self.run_process(workload, &variables, start, deadline, &mut stages),
        };
        self.record(
            &workload.name,
            "workload",
            start,
            Done {
                target: volume.name,
                stages,
                result,
                skipped: false,
            },
        );
    }

    /// Where the volume's file system is mounted, if it has one.
    fn mount_point(&self, volume: &str) -> Option<String> {
        self.attachments
            .lock()
            .get(volume)
            .map(|a| a.mount_point().display().to_string())
    }

    /// Runs fio or a command to its end; fio's one-second logs go to the
    /// run's I/O series.
    fn run_process(
        &self,
        workload: &Workload,
        variables: &Variables,
        start: Instant,
        deadline: Instant,
        stages: &mut Stages,
    ) -> std::result::Result<Detail, String> {
        let prefix = workload::file_prefix(&self.dir, variables);
        let target = if variables.mount.is_empty() {
            self.provider.fio_target(&variables.volume, variables.size)
        } else {
            vec![format!("--directory={}", variables.mount)]
        };
        let Some(mut launch) = workload::launch(
            &workload.kind,
            variables,
            target,
            self.provider.stores_data(),
            self.spec.duration,
            &prefix,
        ) else {
            return Err("this workload has no process of its own".into());
        };
        let result = match &workload.parser {
            Some(parser) => {
                let tally = Tally::new(parser.clone());
                let (result, tally) =
                    self.spawn_parsed(&mut launch.command, &prefix, deadline, stages, tally);
                let (first, last) = (self.seconds(start), self.seconds(Instant::now()));
                if let Some(tally) = tally {
                    let samples: Vec<IoSample> = tally
                        .per_second(first as u64, last as u64)
                        .into_iter()
                        .map(|(second, reading)| IoSample {
                            workload: workload.name.clone(),
                            instance: variables.instance,
                            second,
                            read_iops: 0.0,
                            write_iops: 0.0,
                            read_kib: reading.read_kib,
                            write_kib: reading.write_kib,
                            transactions: reading.ops,
                        })
                        .collect();
                    self.append_samples(&samples);
                }
                result
            }
            None => self.spawn_and_wait(&mut launch.command, &prefix, deadline, stages),
        };
        let result = result.and_then(|()| match &launch.fio_output {
            Some(output) => workload::fio_error(output).map_or(Ok(None), Err),
            None => Ok(None),
        });
        if launch.fio_output.is_some() {
            let first = self.seconds(start) as u64;
            // fio logs a window as it closes, and its run ends as the last
            // one would: that one is never logged, so it is not expected.
            let windows = if launch.timed_by_run {
                self.expected_windows()
            } else {
                0
            };
            let samples = workload::samples(&prefix, variables, first, windows);
            self.append_samples(&samples);
        }
        result
    }

    /// Seconds a workload timed by the run is expected to log: all but
    /// the last of the duration, none if the run was stopped early.
    pub(super) fn expected_windows(&self) -> u64 {
        if self.stop.load(Ordering::SeqCst) {
            0
        } else {
            self.spec.duration.as_secs().saturating_sub(1)
        }
    }

    /// Appends samples to the run's I/O series.
    pub(super) fn append_samples(&self, samples: &[IoSample]) {
        for sample in samples {
            if let Err(e) = self.io.append(sample) {
                (self.events)(Event::Warning(e.to_string()));
                break;
            }
        }
    }

    /// Spawns an instance in its own process group (so that Ctrl-C reaches
    /// the run, which stops it), with its output in the run directory.
    pub(super) fn spawn_and_wait(
        &self,
        command: &mut std::process::Command,
        prefix: &Path,
        deadline: Instant,
        stages: &mut Stages,
    ) -> std::result::Result<(), String> {
        let log_path = prefix.with_extension("log");
        let (child, _) = spawn_logged(command, &log_path, false)?;
        stages.mark("running");
        let status = self.wait_child(child, deadline + WORKLOAD_GRACE)?;
        if status.success() {
            return Ok(());
        }
        Err(failure(status, &log_path))
    }

    /// [`Run::spawn_and_wait`] for a command with an output parser: its
    /// standard output goes through a thread that copies each line to the
    /// log and counts it in `tally`, timed by the second of the run it was
    /// read in. The tally comes back unless the output stayed open
    /// [`KILL_AFTER`] past the command's end even after its group was
    /// killed (then the run has no series for it, and says so).
    fn spawn_parsed(
        &self,
        command: &mut std::process::Command,
        prefix: &Path,
        deadline: Instant,
        stages: &mut Stages,
        mut tally: Tally,
    ) -> (std::result::Result<(), String>, Option<Tally>) {
        let log_path = prefix.with_extension("log");
        let (mut child, mut log) = match spawn_logged(command, &log_path, true) {
            Ok(started) => started,
            Err(e) => return (Err(e), None),
        };
        let (group, clock) = (child.id() as i32, self.clock);
        let (sender, tallied) = std::sync::mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stdout);
                let mut line = Vec::new();
                while read_line(&mut reader, &mut line) {
                    let second = clock.elapsed().as_secs();
                    tally.line(second, &String::from_utf8_lossy(&line));
                    let _ = log.write_all(&line).and_then(|()| log.write_all(b"\n"));
                }
                let _ = sender.send(tally);
            });
        }
        stages.mark("running");
        let status = self.wait_child(child, deadline + WORKLOAD_GRACE);
        let tally = tallied.recv_timeout(KILL_AFTER).ok().or_else(|| {
            // Something the command started still holds its output open.
            // SAFETY: the process group this run started the command in.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            tallied.recv_timeout(KILL_AFTER).ok()
        });
        if tally.is_none() {
            (self.events)(Event::Warning(format!(
                "{}: the command's output stayed open after it ended; no series for it",
                log_path.display()
            )));
        }
        let result = match status {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(failure(status, &log_path)),
            Err(e) => Err(e),
        };
        (result, tally)
    }

    /// Waits for a child; stops it (its whole group) on `stop` or at `until`.
    fn wait_child(
        &self,
        mut child: Child,
        until: Instant,
    ) -> std::result::Result<std::process::ExitStatus, String> {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) => {}
                Err(e) => return Err(format!("cannot wait for the workload: {e}")),
            }
            let late = Instant::now() >= until;
            if late || self.stop.load(Ordering::SeqCst) {
                terminate(&mut child);
                return Err(if late {
                    format!("still running {WORKLOAD_GRACE:?} after the run's end: stopped")
                } else {
                    "stopped: the run was interrupted".to_string()
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Starts `command` in its own process group (so that Ctrl-C reaches the
/// run, which stops it), its standard error into a new log at `log_path`,
/// and its standard output there too, or into a pipe with `pipe_stdout`;
/// returns the child and the log.
fn spawn_logged(
    command: &mut std::process::Command,
    log_path: &Path,
    pipe_stdout: bool,
) -> std::result::Result<(Child, std::fs::File), String> {
    let cannot = |e: std::io::Error| format!("cannot create {}: {e}", log_path.display());
    let log = std::fs::File::create(log_path).map_err(cannot)?;
    let stdout = if pipe_stdout {
        Stdio::piped()
    } else {
        Stdio::from(log.try_clone().map_err(cannot)?)
    };
    let child = command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log.try_clone().map_err(cannot)?)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
    Ok((child, log))
}

/// A workload's failure: its exit status and the last line of its log.
fn failure(status: std::process::ExitStatus, log_path: &Path) -> String {
    let tail = std::fs::read_to_string(log_path).unwrap_or_default();
    let last = tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    format!("exited with {status}: {last} (log {})", log_path.display())
}

/// Reads one line into `line` (without its end), at most
/// [`output_parser::MAX_LINE`] bytes of it (the rest is skipped); false
/// at the end of the output or on an error.
fn read_line(reader: &mut impl std::io::BufRead, line: &mut Vec<u8>) -> bool {
    line.clear();
    loop {
        let (done, used) = match reader.fill_buf() {
            Ok([]) => return !line.is_empty(),
            Ok(buffer) => match buffer.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    take(line, &buffer[..end]);
                    (true, end + 1)
                }
                None => {
                    take(line, buffer);
                    (false, buffer.len())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        reader.consume(used);
        if done {
            return true;
        }
    }
}

/// Appends `bytes` to `line` up to [`output_parser::MAX_LINE`].
fn take(line: &mut Vec<u8>, bytes: &[u8]) {
    let room = output_parser::MAX_LINE.saturating_sub(line.len());
    line.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// SIGTERM to a child's process group, then SIGKILL after [`KILL_AFTER`].
fn terminate(child: &mut Child) {
    let group = child.id() as i32;
    // SAFETY: signalling the process group of a child this run started
    // in its own group and has not reaped.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let deadline = Instant::now() + KILL_AFTER;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(POLL);
    }
    // SAFETY: as above.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
}
