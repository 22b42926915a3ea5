//! Volumes: created, cloned from a snapshot, described, grown and
//! deleted; and the switch of a live volume's top that snapshots and
//! grows share.

use super::*;

impl Service {
    /// Creates an empty volume of `size` bytes in the daemon's default
    /// layer format and exports it.
    pub fn create_volume(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        self.create_volume_as(name, size, &VolumeFormat::default())
    }

    /// Creates an empty volume of `size` bytes whose layers have `format`
    /// and exports it.
    pub fn create_volume_as(
        &self,
        name: &str,
        size: u64,
        format: &VolumeFormat,
    ) -> Result<VolumeInfo> {
        check_name("volume", name)?;
        check_size(size)?;
        let (cluster_size, extended_l2) = self.config.volume_format(format);
        let reservation = self.reserve(name)?;
        let id = new_id()?;
        let opts = CreateOptions {
            size: Some(size),
            cluster_size,
            extended_l2,
            ..CreateOptions::default()
        };
        self.add_volume(reservation, &id, &opts, None)
    }

    /// Creates volume `new` from snapshot `snapshot` of `volume`: its chain
    /// shares every layer of the snapshot, and its writes go to a new top.
    ///
    /// A delete of the snapshot or its volume that wins the race makes
    /// this 404 (the source is gone), never a failure of the pool's files.
    pub fn clone_snapshot(&self, volume: &str, snapshot: &str, new: &str) -> Result<VolumeInfo> {
        check_name("volume", new)?;
        let source = self.snapshot_rec(volume, snapshot)?;
        self.clone_from(volume, snapshot, new, &source)
            .map_err(|e| match self.snapshot_rec(volume, snapshot) {
                Err(VolumeError::NotFound(_)) if !matches!(e, VolumeError::Conflict(_)) => {
                    tracing::debug!("clone of {volume}@{snapshot} lost a race with a delete: {e}");
                    VolumeError::NotFound(format!(
                        "snapshot '{volume}@{snapshot}' was deleted while the clone was being \
                         made; nothing was created"
                    ))
                }
                _ => e,
            })
    }

    /// [`Service::clone_snapshot`] once the source is found.
    pub(super) fn clone_from(
        &self,
        volume: &str,
        snapshot: &str,
        new: &str,
        source: &SnapshotRec,
    ) -> Result<VolumeInfo> {
        let key = snapshot_key(volume, snapshot);
        // The clone opens the snapshot's files: they must hold everything.
        if let Some(origin) = self.live_volume(volume) {
            origin.sync_frozen()?;
        }
        // The clone writes in the format of the layers it shares, as a
        // snapshot's new top does.
        let shared =
            strata_disk::info::info(&self.layer_path(&source.layer), Some(Format::Qcow2), false)?;
        let extended_l2 = shared
            .format_specific
            .as_ref()
            .is_some_and(|q| q.extended_l2);
        let reservation = self.reserve(new)?;
        let id = new_id()?;
        let _topology = self.topology.lock();
        let opts = CreateOptions {
            size: Some(source.size),
            backing: Some(layer_file(&source.layer)),
            backing_format: Some(Format::Qcow2),
            cluster_size: shared.cluster_size.unwrap_or(self.config.cluster_size),
            extended_l2,
            ..CreateOptions::default()
        };
        self.add_volume(reservation, &id, &opts, Some((key, source.layer.clone())))
    }

    /// Creates the top layer file, commits the volume, opens and exports it.
    pub(super) fn add_volume(
        &self,
        reservation: NameReservation<'_>,
        id: &str,
        opts: &CreateOptions,
        origin: Option<(String, String)>,
    ) -> Result<VolumeInfo> {
        let name = reservation.name.clone();
        let path = self.layer_path(id);
        if let Err(e) = create(&path, opts) {
            // A file system that filled up midway leaves part of a file.
            remove_unused_layer(&path);
            return Err(e.into());
        }
        let size = opts.size.unwrap_or(0);
        failpoint("create-before-commit");
        let committed = self.catalog.update(|t| {
            if let Some((key, _)) = &origin {
                // The snapshot may have gone while the file was made.
                if !t.state().snapshots.contains_key(key) {
                    return Err(VolumeError::NotFound(format!(
                        "snapshot '{key}' does not exist"
                    )));
                }
            }
            t.put_layer(LayerRec {
                id: id.to_string(),
                parent: origin.as_ref().map(|(_, layer)| layer.clone()),
                size,
            })?;
            t.put_volume(VolumeRec {
                name: name.clone(),
                size,
                top: id.to_string(),
                origin: origin.as_ref().map(|(key, _)| key.clone()),
                created: now(),
            })
        });
        if let Err(e) = committed {
            remove_unused_layer(&path);
            return Err(e);
        }
        failpoint("create-after-commit");
        let disk = self.open_created_disk(&path)?;
        let live = Arc::new(Live {
            volume: Arc::new(Volume::new(&name, disk)),
            changes: Mutex::new(()),
            standby: Mutex::new(None),
        });
        self.export(&name, &live)?;
        // A delete that comes in now waits for the answer to be made, so
        // the create reports the volume it made.
        let changes = live.changes.lock();
        self.registry.lock().live.insert(name.clone(), live.clone());
        drop(reservation);
        let info = self.volume_info(&name);
        drop(changes);
        info
    }

    /// Every volume, by name.
    pub fn list_volumes(&self) -> Vec<VolumeInfo> {
        let state = self.catalog.state();
        state
            .volumes
            .values()
            .map(|v| self.describe(&state, v))
            .collect()
    }

    /// One volume.
    pub fn volume_info(&self, name: &str) -> Result<VolumeInfo> {
        let state = self.catalog.state();
        let v = state.volumes.get(name).ok_or_else(|| not_found(name))?;
        Ok(self.describe(&state, v))
    }

    pub(super) fn describe(&self, state: &State, v: &VolumeRec) -> VolumeInfo {
        let live = self.registry.lock().live.get(&v.name).cloned();
        let format = live.as_ref().map(|l| l.volume.top_format());
        VolumeInfo {
            name: v.name.clone(),
            size: v.size,
            chain_length: state.chain(&v.top).len(),
            top_layer: v.top.clone(),
            standby_layer: live
                .as_ref()
                .and_then(|l| l.standby.lock().as_ref().map(|s| s.id.clone())),
            origin: v.origin.clone(),
            snapshots: state
                .snapshots_of(&v.name)
                .into_iter()
                .map(|s| s.name)
                .collect(),
            created: v.created,
            last_pause_ms: live.and_then(|l| l.volume.stats().last_pause()).map(ms),
            reclaimable_layers: compact::compaction_runs(state, &v.top)
                .iter()
                .map(|run| run.len() - 1)
                .sum(),
            cluster_size: format.and_then(|f| f.0),
            extended_l2: format.is_some_and(|f| f.1),
            nbd_uri: self.nbd_base.get().map(|base| format!("{base}/{}", v.name)),
        }
    }

    /// Deletes a volume and its snapshots. Layers that clones still read
    /// are kept; the others are removed after the catalog commit.
    pub fn delete_volume(&self, name: &str) -> Result<DeleteReport> {
        let live = self.live(name)?;
        let _changes = live.changes.lock();
        self.exports.remove(name);
        let top = self
            .catalog
            .state()
            .volumes
            .get(name)
            .map(|v| v.top.clone())
            .ok_or_else(|| not_found(name))?;
        let (dead, kept) = self.catalog.update(|t| {
            let chain = t.state().volumes.get(name).map(|v| t.state().chain(&v.top));
            t.remove_volume(name)?;
            for s in t.state().snapshots_of(name) {
                t.remove_snapshot(&s.key())?;
            }
            let dead = t.collect_garbage()?;
            let kept = chain
                .unwrap_or_default()
                .iter()
                .filter(|id| !dead.contains(id))
                .count();
            Ok((dead, kept))
        })?;
        self.registry.lock().live.remove(name);
        // Its file is not in the catalog: dropping it removes it.
        live.standby.lock().take();
        drop(_changes);
        // Close the disk before its files go; a client still connected
        // keeps it open until it disconnects.
        if let Ok(live) = Arc::try_unwrap(live) {
            if let Ok(volume) = Arc::try_unwrap(live.volume) {
                // Writes about to be removed need no sync (a volume's
                // unsynced layers are its own: a clone syncs what it uses).
                let dead_path = |p: &PathBuf| dead.iter().any(|id| self.layer_path(id) == *p);
                let top_dead = dead.contains(&top);
                if top_dead && volume.frozen_paths().iter().all(dead_path) {
                    volume.close_discarding();
                } else {
                    volume.close()?;
                }
            }
        }
        failpoint("delete-after-commit");
        self.unlink_layers(&dead);
        Ok(DeleteReport {
            deleted: name.to_string(),
            layers_removed: dead.len(),
            layers_kept: kept,
        })
    }

    /// Removes layer files after the catalog no longer names them.
    ///
    /// The directory is not synced: the catalog's commit is the durable
    /// record of the delete, and a file whose move to the trash a crash
    /// undid is named by no layer, so the next startup removes it as an
    /// orphan. A sync here would be one more per delete, for nothing.
    pub(crate) fn unlink_layers(&self, ids: &[String]) {
        for id in ids {
            if let Err(e) = self.trash.discard(&self.layer_path(id)) {
                // Harmless: the next startup removes it as an orphan.
                tracing::warn!("could not remove layer {id}: {e}");
            }
        }
    }

    /// Grows a volume. Connected NBD clients see the new size when they
    /// reconnect. Shrinking is refused.
    pub fn resize_volume(&self, name: &str, size: u64) -> Result<ResizeReport> {
        check_size(size)?;
        let live = self.live(name)?;
        let _changes = live.changes.lock();
        let v = self
            .catalog
            .state()
            .volumes
            .get(name)
            .cloned()
            .ok_or_else(|| not_found(name))?;
        if size < v.size {
            return Err(VolumeError::Invalid(format!(
                "cannot shrink volume '{name}' from {} to {size} bytes: only growing is supported",
                v.size
            )));
        }
        let mut pause = Duration::ZERO;
        if size > v.size {
            pause = self.switch_top(&live, &v, Some(size), false, |_| Ok(()))?;
            self.export(name, &live)?;
        }
        Ok(ResizeReport {
            name: name.to_string(),
            old_size: v.size,
            size,
            pause_ms: ms(pause),
        })
    }

    /// Pushes a new layer as the top of a live volume and commits it
    /// (with `extra` changes) inside the I/O pause: the volume's standby
    /// top when it has one that fits, else a new one. Returns the pause.
    pub(super) fn switch_top(
        &self,
        live: &Live,
        v: &VolumeRec,
        size: Option<u64>,
        snapshot: bool,
        extra: impl FnOnce(&mut Txn) -> Result<()>,
    ) -> Result<Duration> {
        let (id, ready) = match self.take_standby(live, size) {
            Some(s) => (s.id, Some(s.top)),
            None => (new_id()?, None),
        };
        let id = id.as_str();
        let new_size = size.unwrap_or(v.size);
        let mut failed: Option<VolumeError> = None;
        let mut committed_ok = false;
        let commit = || {
            failpoint("switch-before-commit");
            let committed = self
                .catalog
                .update(|t| {
                    extra(t)?;
                    t.put_layer(LayerRec {
                        id: id.to_string(),
                        parent: Some(v.top.clone()),
                        size: new_size,
                    })?;
                    t.put_volume(VolumeRec {
                        top: id.to_string(),
                        size: new_size,
                        ..v.clone()
                    })
                })
                .map_err(|e| {
                    let msg = e.to_string();
                    failed = Some(e);
                    DiskError::Invalid(msg)
                });
            committed_ok = committed.is_ok();
            failpoint("switch-after-commit");
            committed
        };
        let result = live.volume.push_top(
            &self.layer_path(id),
            &layer_file(&v.top),
            size,
            snapshot,
            ready,
            commit,
        );
        // The standby was used or dropped, and the new top copies its index
        // from below: have the keeper do both now.
        self.keeper.kick();
        if result.is_err() && !committed_ok {
            // The catalog does not name the new file: it must not stay
            // behind (the file system may have filled up while it was made).
            remove_unused_layer(&self.layer_path(id));
        }
        match (result, failed) {
            (Ok(pause), _) => Ok(pause),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(e.into()),
        }
    }
}
