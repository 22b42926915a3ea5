//! A run's workload instances: each a process in its own group, waited
//! for and stopped at the run's end, then recorded with its I/O.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::Instant;

use super::{Done, Event, Run, KILL_AFTER, POLL, WORKLOAD_GRACE};
use crate::provider::{Detail, Stages};
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
        let result = self.spawn_and_wait(&mut launch.command, &prefix, deadline, stages);
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
    pub(super) fn append_samples(&self, samples: &[crate::record::IoSample]) {
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
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_copy = log.try_clone().map_err(|e| e.to_string())?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_copy)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
        stages.mark("running");
        let status = self.wait_child(child, deadline + WORKLOAD_GRACE)?;
        if status.success() {
            return Ok(());
        }
        let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
        let last = tail
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        Err(format!(
            "exited with {status}: {last} (log {})",
            log_path.display()
        ))
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
