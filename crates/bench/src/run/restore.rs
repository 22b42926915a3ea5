//! Restore-and-verify: a snapshot picked by the operation's selector is
//! cloned to a volume of the run's own (`RUNID--rvN`), the clone is
//! checked (fio's verify of the workload's blocks, or fsck of its file
//! system and pgbench's balances), and deleted; the check's outcome is
//! the operation's status. Also the fill at setup that fio's verify
//! relies on.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::json;

use super::{Done, Run};
use crate::attach::Attachment;
use crate::inventory::Snapshot;
use crate::pgbench::Server;
use crate::provider::{Detail, Stages};
use crate::spec::{restore_check, Action, ControlOperation, RestoreCheck, VolumeGroup, Workload};
use crate::verify;
use crate::workload::Variables;

impl Run<'_> {
    /// The workload whose data a snapshot of volume `index` of `group`
    /// holds: the operation's, or the first that uses that volume.
    fn workload_of(&self, group: &str, index: u32, named: Option<&str>) -> Option<&Workload> {
        let workloads = &self.spec.workloads;
        match named {
            Some(name) => workloads.iter().find(|w| w.name == name),
            None => workloads
                .iter()
                .find(|w| w.volumes == group && index < w.count),
        }
    }

    /// Fills volume `index` of `group` (just made, named `name`) for every
    /// restore-and-verify operation that checks it with fio's verify, and
    /// records the fill.
    pub(super) fn fill_for_restores(&self, group: &VolumeGroup, index: u32, name: &str) {
        let fio_checks = self.spec.control_operations.iter().filter_map(|op| {
            let workload = self.workload_of(&group.name, index, op.workload.as_deref())?;
            let applies = op.action == Action::RestoreAndVerify
                && op.group == group.name
                && workload.volumes == group.name
                && index < workload.count;
            match restore_check(group, Some(workload)) {
                Some(RestoreCheck::FioVerify(options)) if applies => Some((workload, options)),
                _ => None,
            }
        });
        let fills: Vec<(&Workload, BTreeMap<String, String>)> = fio_checks.collect();
        let Some((workload, options)) = fills.first() else {
            return;
        };
        if !self.provider.stores_data() {
            return; // nothing would be read back
        }
        let start = Instant::now();
        let uri = self.provider.uri(name).unwrap_or_default();
        let options = self.filled(options, workload, index, name, &uri);
        let result = verify::fill(&uri, &options, &self.dir.join("workloads")).map(|()| None);
        self.record(
            "setup",
            "fill",
            start,
            Done {
                target: name.to_string(),
                stages: Stages::default(),
                result,
                skipped: false,
            },
        );
    }

    /// A workload's options with its variables as instance `index` on
    /// volume `name` would have them.
    fn filled(
        &self,
        options: &BTreeMap<String, String>,
        workload: &Workload,
        index: u32,
        name: &str,
        uri: &str,
    ) -> BTreeMap<String, String> {
        let size = self
            .inventory
            .lock()
            .volume_at(&workload.volumes, index)
            .map_or(0, |v| v.size);
        let variables = Variables {
            run: self.run_id.clone(),
            workload: workload.name.clone(),
            instance: index,
            volume: name.to_string(),
            size,
            uri: uri.to_string(),
            mount: String::new(),
        };
        options
            .iter()
            .map(|(k, v)| (k.clone(), variables.fill(v)))
            .collect()
    }

    /// Picks a snapshot, clones it, checks the clone and deletes it.
    pub(super) fn restore_and_verify(&self, operation: &ControlOperation) -> Done {
        let picked = self.inventory.lock().snapshot_to_clone(
            &self.scope(operation),
            operation.select,
            &mut self.rng.lock(),
        );
        let Some(snapshot) = picked else {
            // Not a skip: a restore that finds no snapshot to restore is a
            // failed promise of the storage under test, or of the spec.
            return Run::failed(
                String::new(),
                format!(
                    "no snapshot of group `{}` to restore yet: take one with a `snapshot` operation before this one",
                    operation.group
                ),
            );
        };
        let number = self.numbers.fetch_add(1, Ordering::SeqCst);
        let clone = format!("{}--rv{number}", self.run_id);
        let target = format!("{}@{} -> {clone}", snapshot.volume, snapshot.name);
        if !self.provider.stores_data() {
            self.inventory
                .lock()
                .clone_failed(&snapshot.volume, &snapshot.name);
            return Run::skipped(
                target,
                format!(
                    "the {} provider keeps no data to check",
                    self.provider.name()
                ),
            );
        }
        let mut stages = Stages::default();
        let result = self.restore(operation, &snapshot, &clone, &mut stages);
        // The snapshot may be deleted again: the clone is gone.
        self.inventory
            .lock()
            .clone_failed(&snapshot.volume, &snapshot.name);
        Done {
            target,
            stages,
            result,
            skipped: false,
        }
    }

    fn restore(
        &self,
        operation: &ControlOperation,
        snapshot: &Snapshot,
        clone: &str,
        stages: &mut Stages,
    ) -> Result<Detail, String> {
        let volume = self
            .inventory
            .lock()
            .volume_named(&snapshot.volume)
            .ok_or_else(|| format!("volume {} was deleted meanwhile", snapshot.volume))?;
        let group = self
            .spec
            .volumes
            .iter()
            .find(|g| g.name == volume.group)
            .ok_or("the volume's group is not in the spec")?;
        let workload = self.workload_of(&group.name, volume.index, operation.workload.as_deref());
        let check = restore_check(group, workload)
            .ok_or("nothing to check this snapshot by (see the spec's check)")?;
        self.provider
            .clone_snapshot(&snapshot.volume, &snapshot.name, clone, stages)?;
        let uri = self.provider.uri(clone).unwrap_or_default();
        let checked = match &check {
            RestoreCheck::FioVerify(options) => {
                let workload = workload.ok_or("no workload to verify")?;
                let options = self.filled(options, workload, volume.index, &volume.name, &uri);
                verify::fio_verify(&uri, &options, &self.dir.join("workloads"))
                    .map(|()| json!({"check": "fio verify"}))
            }
            RestoreCheck::Fsck { pgbench } => self.check_file_system(clone, &uri, *pgbench, stages),
        };
        stages.mark("checked");
        let deleted = self.provider.delete_volume(clone);
        stages.mark("deleted");
        match (checked, deleted) {
            (Ok(detail), Ok(_)) => Ok(Some(detail)),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(format!(
                "the check passed, but the clone could not be deleted: {e}"
            )),
        }
    }

    /// fsck of the clone's file system; with `pgbench`, PostgreSQL started
    /// on it (recovering from its WAL) and pgbench's balances checked.
    fn check_file_system(
        &self,
        clone: &str,
        uri: &str,
        pgbench: bool,
        stages: &mut Stages,
    ) -> Result<serde_json::Value, String> {
        let number = self.numbers.fetch_add(1, Ordering::SeqCst);
        let mut attachment = Attachment::serve(&self.run_id, number, clone, uri)?;
        let mut detail = json!({"check": "fsck"});
        let checked = verify::fsck(&attachment.file()).and_then(|()| {
            if !pgbench {
                return Ok(());
            }
            attachment.mount(false, stages)?;
            let mut server = Server::at(&attachment.mount_point(), attachment.dir());
            server.start()?;
            let rows = server.check_balances();
            server.stop()?;
            detail = json!({"check": "fsck, pgbench balances", "history_rows": rows?});
            Ok(())
        });
        let detached = attachment.detach();
        checked?;
        detached?;
        Ok(detail)
    }
}
