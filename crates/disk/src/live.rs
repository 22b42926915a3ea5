//! Changing the chain of a disk that stays open: a new top layer pushed
//! under a running disk, for online snapshots and for growing a disk.
//!
//! The layers below stay open, the chain index is carried forward from
//! the open chain and the resolved-page cache is kept (a new top owns
//! nothing, so every cached owner stays true).
//!
//! The work is split so that the part that grows with the disk happens
//! while I/O goes on. [`Disk::prepare_top`] creates the new file with a
//! copy of the current index (2 bytes per index unit: 52.8 MB for 50 GiB
//! of 2 KiB subclusters) and syncs it, while the writer records which 4 KiB
//! sectors of the index change from then on. [`Disk::push_top`], with I/O
//! held back, then copies only those sectors again, rewrites the index
//! tail that depends on the frozen layer's final state (the last owners
//! and the lineage, whose last record names the frozen layer by the UUID
//! it gets when it is closed) and folds the index checksum from per-sector
//! checksums instead of reading the region back. The index copy is not
//! synced: it becomes durable with the top's next flush, and a crash
//! before that only costs a rebuild of the index. Whatever would make the prepared file wrong (another prepare, a
//! chain or size change, a writer restarted meanwhile) sends the push down
//! the full path, which creates the file again as before.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use strata_format::header::{Header, AUTOCLEAR_STRATA_INDEX};
use strata_format::index::{ChainIndexExt, ENTRY_BYTES};

use crate::create::{create_on, create_with, Carry, CreateOptions};
use crate::disk::{validate_index, Disk, Frozen, IndexState};
use crate::error::{DiskError, Place, Result};
use crate::layer::{Format, Layer};
use crate::sector_crc::{fold, sector_crcs, SECTOR};
use crate::writer::{IndexTrack, Writer};

/// Distinguishes prepares, so a push only trusts the change record made
/// for its own prepared top.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Sectors copied per read and write when patching a prepared top.
const PATCH_RUN: u64 = 256;

/// A new top layer made ready while the disk keeps serving I/O; hand it to
/// [`Disk::push_top`]. Dropped without a successful push, it removes its
/// file: an abandoned prepare leaves nothing behind.
#[must_use = "a prepared top is removed unless it is pushed"]
pub struct PreparedTop {
    path: PathBuf,
    backing_name: String,
    size: u64,
    /// What the push may patch instead of creating the file again.
    fast: Option<Prepared>,
    /// The file exists and was made by this prepare (or its push).
    created: bool,
    /// The push committed: the file is the disk's top now.
    committed: bool,
}

/// The state of a prepared file with a copied index.
struct Prepared {
    generation: u64,
    /// The old top's index region the owners were copied from.
    from: ChainIndexExt,
    /// Chain depth, size and top file at the prepare.
    depth: u32,
    old_size: u64,
    top_path: PathBuf,
    /// The prepared file's header and index, as written.
    header: Header,
    index: ChainIndexExt,
    /// CRC-32C of each whole sector of the copied owners.
    sector_crcs: Vec<u32>,
}

impl std::fmt::Debug for PreparedTop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTop")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("index_copied", &self.fast.is_some())
            .finish()
    }
}

impl PreparedTop {
    /// The new top's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file holds a copy of the index that the push can patch
    /// (otherwise the push creates the file whole, inside its pause).
    pub fn index_copied(&self) -> bool {
        self.fast.is_some()
    }

    /// The disk size the new top will have.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for PreparedTop {
    fn drop(&mut self) {
        if self.created && !self.committed {
            // Never committed: nothing refers to the file.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushReport {
    /// The prepared file was patched (`false`: it was created whole).
    pub patched: bool,
    /// Index sectors ([`SECTOR`] bytes) copied again because their owners
    /// changed after the prepare.
    pub sectors_patched: u64,
}

impl Disk {
    /// Prepares a new top layer at `path` while I/O goes on: the file is
    /// created backed by the current top (`backing_name` is stored as its
    /// backing file name, relative to the new file's directory) with a
    /// copy of the chain index, and synced; from now on the writer records
    /// which parts of the index change, for [`Disk::push_top`] to copy.
    ///
    /// `size` grows the disk (`None` keeps the size; shrinking is refused).
    /// Without a stored index to copy, nothing is created and the push
    /// does all the work. A later prepare supersedes this one (its push
    /// falls back to creating the file whole).
    pub fn prepare_top(
        &self,
        path: &Path,
        backing_name: &str,
        size: Option<u64>,
    ) -> Result<PreparedTop> {
        let size = size.unwrap_or(self.size);
        self.refuse_shrink(size)?;
        let writer = self.writer()?;
        let mut prepared = PreparedTop {
            path: path.to_path_buf(),
            backing_name: backing_name.to_string(),
            size,
            fast: None,
            created: false,
            committed: false,
        };
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let from = {
            let mut w = writer.lock();
            match w.index() {
                // The copy is taken unit for unit: the index unit must stay.
                Some(ext) if ext.granularity_bits == self.unit_bits => w.track_index(generation),
                _ => None,
            }
        };
        let Some(from) = from else {
            return Ok(prepared);
        };
        let opts = self.top_options(backing_name, size);
        let mut crcs = Vec::new();
        prepared.created = true;
        let created = create_with(
            path,
            &opts,
            Some(self),
            Carry::Prepared {
                from: &from,
                sector_crcs: &mut crcs,
            },
        )?;
        if let (Some(header), Some(index)) = (created.header, created.index) {
            prepared.fast = Some(Prepared {
                generation,
                from,
                depth: self.depth(),
                old_size: self.size,
                top_path: self.top().path().to_path_buf(),
                header,
                index,
                sector_crcs: crcs,
            });
        }
        Ok(prepared)
    }

    /// Freezes the top layer and continues on the prepared one.
    ///
    /// The current top becomes a read-only layer holding exactly the writes
    /// that completed before this call. On the fast path (a prepared top
    /// that can be patched) it is only *frozen*: its final header is kept
    /// in memory and the file stays marked dirty until the next
    /// [`Disk::flush`] or [`Disk::sync_frozen`] makes it durable and clean,
    /// outside the pause. Durability thus follows the client's flushes, as
    /// it would have without the push; a crash before the seal loses only
    /// writes no flush covered, and startup repairs the dirty file. On the
    /// full path the old top is synced and closed here. The prepared file
    /// (durable since its prepare, with an index marked not valid) gets
    /// what changed since [`Disk::prepare_top`] and its valid index header,
    /// not synced (a crash before the next flush only costs an index
    /// rebuild); if it cannot be patched it is created whole and durable.
    /// Then `before_writing` runs: a caller commits its catalog there, so
    /// a crash never leaves the catalog pointing at a file that does not
    /// exist, nor writes in a file the catalog does not know. Only then
    /// does the disk write to it.
    ///
    /// On any failure the new file is removed and the disk keeps writing
    /// to the old top.
    ///
    /// The caller must exclude I/O for the duration (it takes `&mut self`).
    pub fn push_top(
        &mut self,
        mut top: PreparedTop,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<PushReport> {
        let size = top.size;
        self.refuse_shrink(size)?;
        let writer = self
            .writer
            .take()
            .ok_or_else(|| DiskError::ReadOnly(self.top().path().to_path_buf()))?;
        let mut w = writer.into_inner();
        let track = w.take_track();
        let fast = top.fast.take();
        match (fast, track) {
            (Some(f), Some(t)) if self.can_patch(&f, &w, &t, size) => {
                self.push_patched(w, &mut top, f, &t, before_writing)
            }
            _ => self.push_whole(w, &mut top, before_writing),
        }
    }

    /// Whether `top` can still be pushed by patching: its index copy was
    /// made from this disk's current top, chain and size, and the writer
    /// still records changes for it (no newer prepare, no restarted
    /// writer). A top kept ready for later, such as a volume's standby
    /// for its next snapshot, is checked with this before it is used.
    pub fn prepared_is_current(&self, top: &PreparedTop) -> bool {
        let Some(f) = &top.fast else {
            return false;
        };
        let Ok(writer) = self.writer() else {
            return false;
        };
        let w = writer.lock();
        w.is_tracking(f.generation)
            && w.index() == Some(&f.from)
            && self.depth() == f.depth
            && self.size == f.old_size
            && self.top().path() == f.top_path
    }

    fn refuse_shrink(&self, size: u64) -> Result<()> {
        if size < self.size {
            return Err(DiskError::Invalid(format!(
                "cannot shrink {} from {} to {size} bytes; only growing is supported",
                self.top().path().display(),
                self.size
            )));
        }
        Ok(())
    }

    /// Whether the prepared file still matches the chain: same top, depth,
    /// size and index, and the change record is the one its prepare began.
    fn can_patch(&self, f: &Prepared, w: &Writer, track: &IndexTrack, size: u64) -> bool {
        track.generation == f.generation
            && w.index() == Some(&f.from)
            && self.depth() == f.depth
            && self.size == f.old_size
            && self.top().path() == f.top_path
            && f.index.virtual_size == size
            && f.index.granularity_bits == self.unit_bits
            && f.sector_crcs.len() as u64 == f.from.entry_count() * ENTRY_BYTES / SECTOR
    }

    /// The full path: closes the old top, then creates the new file whole.
    fn push_whole(
        &mut self,
        w: Writer,
        top: &mut PreparedTop,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<PushReport> {
        if let Err(e) = w.close(self) {
            self.restart_writer()?;
            return Err(e);
        }
        top.created = true;
        let layer = match self
            .create_top(&top.path, &top.backing_name, top.size)
            .and_then(|layer| before_writing().map(|()| layer))
        {
            Ok(layer) => layer,
            Err(e) => {
                // `top` removes the file when the caller drops it.
                self.restart_writer()?;
                return Err(e);
            }
        };
        top.committed = true;
        self.install_top(layer, top.size);
        self.reload_index();
        self.start_writer()?;
        Ok(PushReport {
            patched: false,
            sectors_patched: 0,
        })
    }

    /// The fast path: patches the prepared file with what changed.
    fn push_patched(
        &mut self,
        w: Writer,
        top: &mut PreparedTop,
        f: Prepared,
        track: &IndexTrack,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<PushReport> {
        let started = Instant::now();
        let place = Place {
            depth: f.depth + 1,
            path: top.path.clone(),
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&top.path)
            .map_err(|e| DiskError::io(&place, "open", e))
        {
            Ok(file) => file,
            Err(e) => return self.abandon(w, e),
        };
        // The writer is stopped: the old region is final (its write-back
        // sectors included, which reads see).
        let (prefix, old_tail, sectors_patched) = match self.patch_sectors(&file, &place, &f, track)
        {
            Ok(v) => v,
            Err(e) => return self.abandon(w, e),
        };
        let old_crc = crc32c::crc32c_append(prefix, &old_tail);
        // Frozen, not synced: the old top holds exactly the writes that
        // completed before now, and becomes durable at the next flush (or
        // when the caller calls `sync_frozen`), outside this pause.
        if let Err(e) = w.freeze(self, Some(old_crc)) {
            self.restart_writer()?;
            return Err(e);
        }
        let patched_at = started.elapsed();
        let finished = self.finish_prepared(&file, &place, &f, prefix, &old_tail);
        let finished_at = started.elapsed();
        let layer = match finished.and_then(|(layer, ext)| before_writing().map(|()| (layer, ext)))
        {
            Ok(v) => v,
            Err(e) => {
                // `top` removes the file when the caller drops it.
                self.restart_writer()?;
                return Err(e);
            }
        };
        top.committed = true;
        let (layer, ext) = layer;
        self.frozen.lock().push(Frozen {
            position: self.layers.len() - 1,
            since: Instant::now(),
        });
        self.install_top(layer, top.size);
        // The process just wrote and summed this index: install it without
        // reading the region back (debug builds check it the slow way).
        debug_assert_eq!(
            validate_index(&self.layers, self.unit_bits, self.size),
            Ok(ext.clone()),
            "patched index"
        );
        *self.index.write() = Some(ext);
        *self.index_state.write() = IndexState::Stored {
            depth: self.depth(),
        };
        let committed_at = started.elapsed();
        self.start_writer()?;
        // Where a pause goes, for whoever tunes it (`STRATA_LOG=debug`).
        tracing::debug!(
            sectors_patched,
            patch_ms = patched_at.as_secs_f64() * 1e3,
            finish_ms = (finished_at - patched_at).as_secs_f64() * 1e3,
            commit_ms = (committed_at - finished_at).as_secs_f64() * 1e3,
            writer_ms = (started.elapsed() - committed_at).as_secs_f64() * 1e3,
            "pushed a prepared top"
        );
        Ok(PushReport {
            patched: true,
            sectors_patched,
        })
    }

    /// Copies the changed sectors of the old region into the prepared
    /// file. Returns the CRC of the region's whole sectors, the old
    /// region's bytes after them, and how many sectors were copied.
    fn patch_sectors(
        &self,
        file: &std::fs::File,
        place: &Place,
        f: &Prepared,
        track: &IndexTrack,
    ) -> Result<(u32, Vec<u8>, u64)> {
        let mut crcs = f.sector_crcs.clone();
        let patched = self.copy_changed(file, place, f, track, &mut crcs)?;
        let whole = f.sector_crcs.len() as u64 * SECTOR;
        let mut tail = vec![0u8; (f.from.region_len - whole) as usize];
        self.top()
            .file
            .read_exact_at(&mut tail, f.from.region_offset + whole)?;
        Ok((fold(&crcs), tail, patched))
    }

    /// Copies the whole sectors `track` marks from the old top's region
    /// into the prepared file, in runs, updating their CRCs in `crcs`.
    /// Returns how many sectors were copied.
    fn copy_changed(
        &self,
        file: &std::fs::File,
        place: &Place,
        f: &Prepared,
        track: &IndexTrack,
        crcs: &mut [u32],
    ) -> Result<u64> {
        let old = self.top();
        let sectors = crcs.len() as u64;
        let mut buf = Vec::new();
        let mut patched = 0u64;
        let mut s = 0u64;
        while s < sectors {
            if !track.is_dirty(s) {
                s += 1;
                continue;
            }
            let mut e = s + 1;
            while e < sectors && e - s < PATCH_RUN && track.is_dirty(e) {
                e += 1;
            }
            buf.resize(((e - s) * SECTOR) as usize, 0);
            old.file
                .read_exact_at(&mut buf, f.from.region_offset + s * SECTOR)?;
            file.write_all_at(&buf, f.index.region_offset + s * SECTOR)
                .map_err(|e| DiskError::io(place, "write", e))?;
            for (i, c) in sector_crcs(&buf).enumerate() {
                crcs[s as usize + i] = c;
            }
            patched += e - s;
            s = e;
        }
        Ok(patched)
    }

    /// Brings a prepared top up to date while I/O goes on: copies the index
    /// sectors that changed since the prepare (or the last refresh) into
    /// it. Each pass copies what the previous one took to copy, so a
    /// caller repeats it until little is left, and the push, inside the
    /// pause, copies only the last moment's changes (as live migration
    /// copies memory). Returns the sectors copied; 0 if the prepared top
    /// cannot be patched anyway (its push will create the file whole).
    pub fn refresh_prepared(&self, top: &mut PreparedTop) -> Result<u64> {
        let Some(f) = top.fast.as_mut() else {
            return Ok(0);
        };
        let Some(track) = self.writer()?.lock().drain_track(f.generation) else {
            return Ok(0);
        };
        let place = Place {
            depth: f.depth + 1,
            path: top.path.clone(),
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&top.path)
            .map_err(|e| DiskError::io(&place, "open", e))?;
        let mut crcs = std::mem::take(&mut f.sector_crcs);
        let started = Instant::now();
        // Not synced: the index copy needs no durability of its own (see
        // `finish_prepared`).
        let copied = self.copy_changed(&file, &place, f, &track, &mut crcs);
        if let Ok(n) = copied {
            tracing::debug!(
                sectors = n,
                copy_ms = started.elapsed().as_secs_f64() * 1e3,
                "refreshed a prepared top"
            );
        }
        match copied {
            Ok(copied) => {
                f.sector_crcs = crcs;
                Ok(copied)
            }
            Err(e) => {
                // The record of what this pass took is gone: the file can
                // no longer be trusted, so the push creates it whole.
                top.fast = None;
                Err(e)
            }
        }
    }

    /// After the old top is frozen: writes the prepared file's index tail
    /// (the last owners, zeros for a grown disk, the lineage naming the
    /// frozen top as it is now) and its header with the index checksum
    /// and valid bit, and opens it.
    ///
    /// Nothing is synced. The prepare synced the file whole with its
    /// header saying *no valid index*, which is all a crash needs: the
    /// catalog may name the file, its geometry and backing are durable,
    /// and the index copy made since is only an accelerator. Until the
    /// next flush syncs the top (its write-back begins with `fdatasync`),
    /// a crash leaves either that header or the new one over whatever
    /// index sectors reached the disk; both fail validation (no valid
    /// bit, or a region checksum mismatch) unless the index is whole, and
    /// an index that fails is rebuilt by walking the chain. Syncing here
    /// cost 1–13 ms of the pause, and the refresh syncs before it 10–100
    /// ms of a 50 GiB volume's snapshot call under writes.
    fn finish_prepared(
        &self,
        file: &std::fs::File,
        place: &Place,
        f: &Prepared,
        prefix: u32,
        old_tail: &[u8],
    ) -> Result<(Layer, ChainIndexExt)> {
        let whole = f.sector_crcs.len() as u64 * SECTOR;
        let old_owners = (f.from.entry_count() * ENTRY_BYTES - whole) as usize;
        let new_owners = (f.index.entry_count() * ENTRY_BYTES - whole) as usize;
        let mut tail = old_tail[..old_owners].to_vec();
        tail.resize(new_owners, 0);
        for id in self.lineage()? {
            tail.extend_from_slice(&id.encode());
        }
        if whole + tail.len() as u64 != f.index.region_len {
            return Err(DiskError::Invalid(format!(
                "prepared index of {} bytes, expected {}",
                whole + tail.len() as u64,
                f.index.region_len
            )));
        }
        file.write_all_at(&tail, f.index.region_offset + whole)
            .map_err(|e| DiskError::io(place, "write", e))?;
        let mut ext = f.index.clone();
        ext.crc32c = crc32c::crc32c_append(prefix, &tail);
        let mut h = f.header.clone();
        h.set_chain_index(Some(ext.clone()));
        h.autoclear_features |= AUTOCLEAR_STRATA_INDEX;
        let bytes = h.encode().map_err(|e| DiskError::format(place, e))?;
        file.write_all_at(&bytes, 0)
            .map_err(|e| DiskError::io(place, "write", e))?;
        let layer = Layer::open(&place.path, place.depth, true, Some(Format::Qcow2))?;
        Ok((layer, ext))
    }

    /// Gives up a push before the old top was closed: closes it as usual
    /// and writes to it again.
    fn abandon(&mut self, w: Writer, e: DiskError) -> Result<PushReport> {
        let _ = w.close(self);
        self.restart_writer()?;
        Err(e)
    }

    /// Makes `layer` the top of a disk of `size` bytes.
    fn install_top(&mut self, layer: Layer, size: u64) {
        let (old_size, old_unit_bits) = (self.size, self.unit_bits);
        let unit_bits = layer.unit_bits().unwrap_or(self.unit_bits);
        self.layers.push(layer);
        self.size = size;
        self.unit_bits = self.unit_bits.min(unit_bits);
        if self.size != old_size || self.unit_bits != old_unit_bits {
            // Page lengths follow the disk size; start over.
            self.cache.clear();
        }
    }

    /// Opens the new top for writing. If this fails the disk stays
    /// read-only until it is reopened.
    fn start_writer(&mut self) -> Result<()> {
        let w = Writer::start_on_new_top(self)?;
        self.writer = Some(Mutex::new(w));
        Ok(())
    }

    /// Options of a new top over the current one: its cluster size and
    /// L2 format, so a chain the engine grows stays extended if it started
    /// so.
    fn top_options(&self, backing_name: &str, size: u64) -> CreateOptions {
        let defaults = CreateOptions::default();
        let cluster_size = self
            .top()
            .cluster_bits()
            .map_or(defaults.cluster_size, |b| 1u64 << b);
        CreateOptions {
            size: Some(size),
            cluster_size,
            extended_l2: self.top().extended_l2(),
            backing: Some(backing_name.to_string()),
            backing_format: Some(self.top().format()),
            ..defaults
        }
    }

    /// Creates the new top layer whole (durable) and opens it.
    fn create_top(&self, path: &Path, backing_name: &str, size: u64) -> Result<Layer> {
        let opts = self.top_options(backing_name, size);
        create_on(path, &opts, Some(self))?;
        let depth = self.depth() + 1;
        Layer::open(path, depth, true, Some(Format::Qcow2))
    }

    /// Validates the stored index against the current layers and uses it.
    fn reload_index(&mut self) {
        let (index, state) = match validate_index(&self.layers, self.unit_bits, self.size) {
            Ok(ext) => (
                Some(ext),
                IndexState::Stored {
                    depth: self.depth(),
                },
            ),
            Err(reason) => (None, IndexState::Walk { reason }),
        };
        *self.index.write() = index;
        *self.index_state.write() = state;
    }

    /// Opens the (unchanged) top for writing again after a failed push.
    fn restart_writer(&mut self) -> Result<()> {
        if self.writer.is_none() {
            self.reload_index();
            self.start_writer()?;
        }
        Ok(())
    }
}
