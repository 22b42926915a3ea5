//! A run's workload instances: each a process in its own group, waited
//! for and stopped at the run's end, then recorded with its I/O.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::Instant;

use super::{Done, Event, Run, KILL_AFTER, POLL, WORKLOAD_GRACE};
use crate::provider::Stages;
use crate::spec::Workload;
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
        if let Some(barrier) = barrier {
            barrier.wait();
        }
        let start = Instant::now();
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
        };
        let prefix = workload::file_prefix(&self.dir, &variables);
        let target = self.provider.fio_target(&volume.name, volume.size);
        let mut launch = workload::launch(
            &workload.kind,
            &variables,
            target,
            self.provider.stores_data(),
            self.spec.duration,
            &prefix,
        );
        let mut stages = Stages::default();
        let result = self.spawn_and_wait(&mut launch, &prefix, deadline, &mut stages);
        let result = result.and_then(|()| match &launch.fio_output {
            Some(output) => workload::fio_error(output).map_or(Ok(None), Err),
            None => Ok(None),
        });
        if launch.fio_output.is_some() {
            let first = self.seconds(start) as u64;
            // fio logs a window as it closes, and its run ends as the last
            // one would: that one is never logged, so it is not expected.
            let windows = if self.stop.load(Ordering::SeqCst) || !launch.timed_by_run {
                0
            } else {
                self.spec.duration.as_secs().saturating_sub(1)
            };
            for sample in workload::samples(&prefix, &variables, first, windows) {
                if let Err(e) = self.io.append(&sample) {
                    (self.events)(Event::Warning(e.to_string()));
                    break;
                }
            }
        }
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

    /// Spawns an instance in its own process group (so that Ctrl-C reaches
    /// the run, which stops it), with its output in the run directory.
    fn spawn_and_wait(
        &self,
        launch: &mut workload::Launch,
        prefix: &Path,
        deadline: Instant,
        stages: &mut Stages,
    ) -> std::result::Result<(), String> {
        let log_path = prefix.with_extension("log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_copy = log.try_clone().map_err(|e| e.to_string())?;
        let child = launch
            .command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_copy)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", launch.command.get_program()))?;
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
