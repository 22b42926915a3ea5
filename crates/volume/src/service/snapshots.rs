//! Snapshots of a live volume: taken, listed and deleted.

use super::*;

impl Service {
    pub(super) fn snapshot_rec(&self, volume: &str, snapshot: &str) -> Result<SnapshotRec> {
        let state = self.catalog.state();
        if !state.volumes.contains_key(volume) {
            return Err(not_found(volume));
        }
        state
            .snapshots
            .get(&snapshot_key(volume, snapshot))
            .cloned()
            .ok_or_else(|| {
                VolumeError::NotFound(format!(
                    "volume '{volume}' has no snapshot '{snapshot}'; list them with \
                     `strata snapshot list {volume}`"
                ))
            })
    }

    /// Takes a snapshot of a volume while it serves I/O. Writes completed
    /// before the call are in the snapshot; writes after it returns are not.
    ///
    /// Durability follows the volume's: the pause only freezes the old top,
    /// and its writes become durable with the client's next flush (which
    /// covers every write acknowledged before it, wherever it lives), or
    /// when the daemon syncs layers frozen longer than
    /// [`ServiceConfig::durable_within`]. With `sync` (or a zero
    /// `durable_within`) the call makes the layer durable before it
    /// returns, after the pause, while I/O goes on.
    pub fn create_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        sync: bool,
    ) -> Result<SnapshotReport> {
        check_name("snapshot", snapshot)?;
        let started = Instant::now();
        let live = self.live(volume)?;
        let _changes = live.changes.lock();
        let key = snapshot_key(volume, snapshot);
        let state = self.catalog.state();
        if state.snapshots.contains_key(&key) {
            return Err(VolumeError::Conflict(format!(
                "volume '{volume}' already has a snapshot '{snapshot}'"
            )));
        }
        let v = state
            .volumes
            .get(volume)
            .cloned()
            .ok_or_else(|| not_found(volume))?;
        let rec = SnapshotRec {
            volume: volume.to_string(),
            name: snapshot.to_string(),
            layer: v.top.clone(),
            size: v.size,
            created: now(),
        };
        let pause = self.switch_top(&live, &v, None, true, |t| t.put_snapshot(rec.clone()))?;
        let synced = Instant::now();
        let durable = sync || self.config.durable_within.is_zero();
        if durable {
            live.volume.sync_frozen()?;
        }
        Ok(SnapshotReport {
            snapshot: self.snapshot_info(&self.catalog.state(), &rec),
            pause_ms: ms(pause),
            total_ms: ms(started.elapsed()),
            durable,
            sync_ms: if durable { ms(synced.elapsed()) } else { 0.0 },
        })
    }

    /// Snapshots of a volume, oldest first.
    pub fn list_snapshots(&self, volume: &str) -> Result<Vec<SnapshotInfo>> {
        let state = self.catalog.state();
        if !state.volumes.contains_key(volume) {
            return Err(not_found(volume));
        }
        Ok(state
            .snapshots_of(volume)
            .iter()
            .map(|s| self.snapshot_info(&state, s))
            .collect())
    }

    pub(super) fn snapshot_info(&self, state: &State, s: &SnapshotRec) -> SnapshotInfo {
        SnapshotInfo {
            volume: s.volume.clone(),
            name: s.name.clone(),
            layer: s.layer.clone(),
            size: s.size,
            created: s.created,
            clones: state.clones_of(&s.key()),
        }
    }

    /// Deletes a snapshot. Refused while a clone was made from it. Its
    /// layer stays as long as newer layers of the volume read it.
    pub fn delete_snapshot(&self, volume: &str, snapshot: &str) -> Result<DeleteReport> {
        let live = self.live(volume)?;
        let _changes = live.changes.lock();
        self.snapshot_rec(volume, snapshot)?;
        let key = snapshot_key(volume, snapshot);
        let (dead, kept) = self.catalog.update(|t| {
            let clones = t.state().clones_of(&key);
            if !clones.is_empty() {
                return Err(VolumeError::Conflict(format!(
                    "snapshot '{key}' is in use by clone(s) {}; delete them first",
                    clones.join(", ")
                )));
            }
            t.remove_snapshot(&key)?;
            let dead = t.collect_garbage()?;
            Ok((dead.clone(), usize::from(dead.is_empty())))
        })?;
        failpoint("delete-after-commit");
        self.unlink_layers(&dead);
        Ok(DeleteReport {
            deleted: key,
            layers_removed: dead.len(),
            layers_kept: kept,
        })
    }
}
