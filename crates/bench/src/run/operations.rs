//! The control operations of a run: each picks its target from the
//! run's inventory, asks the provider, and becomes a record.

use std::time::Instant;

use super::{action_name, Done, Run};
use crate::inventory;
use crate::provider::{Answer, Stages};
use crate::spec::{Action, ControlOperation};

impl Run<'_> {
    /// Performs one operation and records it; whether it found something
    /// to act on.
    pub(super) fn perform(&self, operation: &ControlOperation) -> bool {
        let start = Instant::now();
        let done = match operation.action {
            Action::Create => self.create(operation),
            Action::Delete => self.delete(operation),
            Action::Attach => self.attach(operation),
            Action::Snapshot => self.snapshot(operation),
            Action::DeleteSnapshot => self.delete_snapshot(operation),
            Action::Clone => self.clone_snapshot(operation),
            Action::Resize => self.resize(operation),
            Action::Compact => self.compact(operation),
            Action::RestoreAndVerify => self.restore_and_verify(operation),
        };
        let acted = !done.skipped;
        self.record(&operation.name, action_name(operation.action), start, done);
        acted
    }

    pub(super) fn scope<'o>(&self, operation: &'o ControlOperation) -> inventory::Scope<'o> {
        inventory::Scope {
            group: &operation.group,
            held_only: operation.workload.is_some(),
            free_only: operation.action == Action::Delete,
        }
    }

    pub(super) fn skipped(target: String, error: String) -> Done {
        Done {
            skipped: true,
            ..Run::failed(target, error)
        }
    }

    pub(super) fn failed(target: String, error: String) -> Done {
        Done {
            target,
            stages: Stages::default(),
            result: Err(error),
            skipped: false,
        }
    }

    fn nothing_to(operation: &ControlOperation, what: &str) -> Done {
        Run::skipped(
            String::new(),
            format!(
                "no {what} in group `{}` to {} yet",
                operation.group,
                action_name(operation.action)
            ),
        )
    }

    fn create(&self, operation: &ControlOperation) -> Done {
        let group = self.spec.volumes.iter().find(|g| g.name == operation.group);
        let (Some(group), true) = (group, self.inventory.lock().volume_room()) else {
            return Run::skipped(
                String::new(),
                format!(
                    "the run holds {} volumes, the most it makes: add a delete or lower the rate",
                    inventory::MAX_VOLUMES
                ),
            );
        };
        let (index, name, stages, result) = self.create_ready(group);
        if result.is_ok() {
            self.inventory
                .lock()
                .add_volume(name.clone(), &group.name, index, group.size, false);
        }
        Done {
            target: name,
            stages,
            result,
            skipped: false,
        }
    }

    fn delete(&self, operation: &ControlOperation) -> Done {
        let taken = self.inventory.lock().take_volume(
            &self.scope(operation),
            operation.select,
            &mut self.rng.lock(),
        );
        let Some(volume) = taken else {
            return Run::nothing_to(operation, "volume");
        };
        let result = self
            .detach(&volume.name)
            .and_then(|()| self.provider.delete_volume(&volume.name));
        Done {
            target: volume.name,
            stages: Stages::default(),
            result,
            skipped: false,
        }
    }

    fn attach(&self, operation: &ControlOperation) -> Done {
        self.on_picked_volume(operation, |volume, stages| {
            self.provider.attach_volume(volume, stages)
        })
    }

    /// Picks a volume as `operation` selects and runs `act` on it, which
    /// marks the stages it reaches.
    fn on_picked_volume(
        &self,
        operation: &ControlOperation,
        act: impl FnOnce(&str, &mut Stages) -> Answer,
    ) -> Done {
        let picked = self.inventory.lock().pick_volume(
            &self.scope(operation),
            operation.select,
            &mut self.rng.lock(),
        );
        let Some(volume) = picked else {
            return Run::nothing_to(operation, "volume");
        };
        let mut stages = Stages::default();
        let result = act(&volume.name, &mut stages);
        Done {
            target: volume.name,
            stages,
            result,
            skipped: false,
        }
    }

    fn snapshot(&self, operation: &ControlOperation) -> Done {
        let (picked, number, room) = {
            let mut inventory = self.inventory.lock();
            let picked = inventory.pick_volume(
                &self.scope(operation),
                operation.select,
                &mut self.rng.lock(),
            );
            (
                picked,
                inventory.next_snapshot_number(),
                inventory.snapshot_room(),
            )
        };
        let Some(volume) = picked else {
            return Run::nothing_to(operation, "volume");
        };
        if !room {
            return Run::skipped(volume.name, format!("the run holds {} snapshots, the most it keeps: add a delete_snapshot or lower the rate", inventory::MAX_SNAPSHOTS));
        }
        let name = format!("{}-s{number}", self.run_id);
        let result = self.provider.snapshot(&volume.name, &name);
        if result.is_ok() {
            self.inventory
                .lock()
                .add_snapshot(&volume.name, name.clone(), volume.size);
        }
        Done {
            target: format!("{}@{name}", volume.name),
            stages: Stages::default(),
            result,
            skipped: false,
        }
    }

    fn delete_snapshot(&self, operation: &ControlOperation) -> Done {
        let taken = self.inventory.lock().take_snapshot(
            &self.scope(operation),
            operation.select,
            &mut self.rng.lock(),
        );
        let Some(snapshot) = taken else {
            return Run::nothing_to(operation, "snapshot without clones");
        };
        let result = self
            .provider
            .delete_snapshot(&snapshot.volume, &snapshot.name);
        Done {
            target: format!("{}@{}", snapshot.volume, snapshot.name),
            stages: Stages::default(),
            result,
            skipped: false,
        }
    }

    fn clone_snapshot(&self, operation: &ControlOperation) -> Done {
        let into = operation.into.as_deref().unwrap_or(&operation.group);
        let (picked, index, room) = {
            let mut inventory = self.inventory.lock();
            let picked = inventory.snapshot_to_clone(
                &self.scope(operation),
                operation.select,
                &mut self.rng.lock(),
            );
            let index = picked.as_ref().map(|_| inventory.reserve_index(into));
            (picked, index, inventory.volume_room())
        };
        let (Some(snapshot), Some(index)) = (picked, index) else {
            return Run::nothing_to(operation, "snapshot");
        };
        let new = self.volume_name(into, index);
        let target = format!("{}@{} -> {new}", snapshot.volume, snapshot.name);
        if !room {
            self.inventory
                .lock()
                .clone_failed(&snapshot.volume, &snapshot.name);
            return Run::skipped(
                target,
                format!(
                    "the run holds {} volumes, the most it makes: add a delete or lower the rate",
                    inventory::MAX_VOLUMES
                ),
            );
        }
        let mut stages = Stages::default();
        let group = self.spec.volumes.iter().find(|g| g.name == into);
        let result = self
            .provider
            .clone_snapshot(&snapshot.volume, &snapshot.name, &new, &mut stages)
            .and_then(|detail| {
                if let Some(group) = group {
                    self.make_ready(&new, group, false, &mut stages)?;
                }
                Ok(detail)
            });
        let mut inventory = self.inventory.lock();
        match &result {
            Ok(_) => inventory.add_volume(new, into, index, snapshot.size, false),
            Err(_) => inventory.clone_failed(&snapshot.volume, &snapshot.name),
        }
        Done {
            target,
            stages,
            result,
            skipped: false,
        }
    }

    fn resize(&self, operation: &ControlOperation) -> Done {
        let picked = self.inventory.lock().pick_volume(
            &self.scope(operation),
            operation.select,
            &mut self.rng.lock(),
        );
        let Some(volume) = picked else {
            return Run::nothing_to(operation, "volume");
        };
        let size = match operation.size {
            Some(crate::units::SizeChange::Grow(by)) => volume.size.saturating_add(by),
            Some(crate::units::SizeChange::To(to)) => to.max(volume.size),
            None => volume.size,
        };
        let result = self.provider.resize(&volume.name, size);
        if result.is_ok() {
            self.inventory.lock().set_size(&volume.name, size);
        }
        Done {
            target: volume.name,
            stages: Stages::default(),
            result,
            skipped: false,
        }
    }

    fn compact(&self, operation: &ControlOperation) -> Done {
        self.on_picked_volume(operation, |volume, stages| {
            self.provider.compact(volume, stages)
        })
    }
}
