//! pgbench workload instances: PostgreSQL made and loaded on the volume's
//! file system before the barrier, pgbench's timed run, its progress as
//! the one-second series and its closing figures as the record's detail.

use std::io::Read;
use std::path::Path;
use std::time::Instant;

use std::sync::atomic::Ordering;

use super::{Done, Run};
use crate::pgbench::{self, Server};
use crate::provider::{Detail, Stages};
use crate::spec::WorkloadKind;
use crate::workload::{self, Variables};

/// Most bytes of a pgbench or PostgreSQL log read or kept (a line a
/// second for a day is far less).
const MAX_LOG: u64 = 16 << 20;

/// The first [`MAX_LOG`] bytes of a file, as text.
fn read_bounded(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(MAX_LOG).read_to_string(&mut text);
    }
    text
}

impl Run<'_> {
    /// Makes and loads the PostgreSQL server of every pgbench workload
    /// instance, at setup (so that the timed runs start together, when
    /// the control operations do), and records each.
    pub(super) fn prepare_servers(&self) {
        for workload in &self.spec.workloads {
            let WorkloadKind::Pgbench(options) = workload.kind else {
                continue;
            };
            for instance in 0..workload.count {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                let start = Instant::now();
                let volume = self.inventory.lock().volume_at(&workload.volumes, instance);
                let Some(volume) = volume else {
                    continue; // its setup record says why
                };
                let server = self.prepare_pgbench(&volume.name, options.scale);
                let result = server.as_ref().map(|_| None).map_err(String::clone);
                self.servers
                    .lock()
                    .insert((workload.name.clone(), instance), server);
                self.record(
                    "setup",
                    "pgbench_init",
                    start,
                    Done {
                        target: volume.name,
                        stages: Stages::default(),
                        result,
                        skipped: false,
                    },
                );
            }
        }
    }

    /// Makes a PostgreSQL cluster on the volume's file system, starts it
    /// and loads pgbench's tables at `scale`.
    pub(super) fn prepare_pgbench(&self, volume: &str, scale: u32) -> Result<Server, String> {
        let (mount, dir) = {
            let attachments = self.attachments.lock();
            let attachment = attachments.get(volume).ok_or_else(|| {
                format!("volume {volume} has no file system (see its setup record)")
            })?;
            (attachment.mount_point(), attachment.dir().to_path_buf())
        };
        let mut server = Server::at(&mount, &dir);
        server.initialize()?;
        server.start()?;
        server.load(scale)?;
        Ok(server)
    }

    /// Runs pgbench for the run's duration against a prepared server, then
    /// stops the server; pgbench's figures, or why it failed.
    pub(super) fn run_pgbench(
        &self,
        server: Result<Server, String>,
        clients: u32,
        variables: &Variables,
        deadline: Instant,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        let mut server = server.map_err(|e| format!("PostgreSQL could not be prepared: {e}"))?;
        let prefix = workload::file_prefix(&self.dir, variables);
        let first = self.seconds(Instant::now()) as u64;
        let mut command = server.run_command(clients, self.spec.duration.as_secs());
        let ran = self.spawn_and_wait(&mut command, &prefix, deadline, stages);
        let log = read_bounded(&prefix.with_extension("log"));
        let samples = pgbench::samples(
            &log,
            &variables.workload,
            variables.instance,
            first,
            self.expected_windows(),
        );
        self.append_samples(&samples);
        let stopped = server.stop();
        // The server's log is in the attachment's directory, which goes
        // when the volume is detached: a copy stays with the run.
        let kept = prefix.with_extension("postgres.log");
        let _ = std::fs::write(&kept, read_bounded(server.log()));
        ran?;
        stopped.map_err(|e| format!("{e} (log {})", kept.display()))?;
        Ok(Some(pgbench::summary(&log)))
    }
}
