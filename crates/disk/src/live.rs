//! Changing the chain of a disk that stays open: a new top layer pushed
//! under a running disk, for online snapshots and for growing a disk.
//!
//! The layers below stay open, the chain index is carried forward from
//! the open chain and the resolved-page cache is kept (a new top owns
//! nothing, so every cached owner stays true).
//!
//! The work that grows with the disk stays out of the pause.
//! [`Disk::prepare_top`] creates the new file while I/O goes on, with its
//! index region reserved but not filled, and syncs it. [`Disk::push_top`],
//! with I/O held back, freezes the old top (its index checksum is left for
//! the seal), writes the new region's lineage (whose last record names the
//! frozen layer by the UUID it gets now) and makes the new file the top.
//! Its owners are the frozen layer's until it writes them, so it reads
//! them from there and copies them sector by sector afterwards (see
//! [`crate::lazy_index`]): the pause does not grow with the disk, nor with
//! how much of the index the writes changed. Nothing in the new file is
//! synced by the push: the prepare made it durable with an index marked
//! not valid, and its next flush makes the rest durable.
//!
//! Whatever would make the prepared file wrong (a chain or size change
//! since the prepare) sends the push down the full path, which creates the
//! file again, whole, as before.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use strata_format::index::{ChainIndexExt, ENTRY_BYTES};

use crate::create::{create_on, create_with, Carry, CreateOptions};
use crate::disk::{Disk, Frozen, IndexState};
use crate::error::{DiskError, Place, Result};
use crate::layer::{Format, Layer};
use crate::lazy_index::LazyIndex;
use crate::writer::Writer;

/// A new top layer made ready while the disk keeps serving I/O; hand it to
/// [`Disk::push_top`]. Dropped without a successful push, it removes its
/// file: an abandoned prepare leaves nothing behind.
#[must_use = "a prepared top is removed unless it is pushed"]
pub struct PreparedTop {
    path: PathBuf,
    backing_name: String,
    size: u64,
    /// What the fast push needs (`None`: the push creates the file whole).
    fast: Option<Prepared>,
    /// The file exists and was made by this prepare (or its push).
    created: bool,
    /// The push committed: the file is the disk's top now.
    committed: bool,
}

/// A prepared file with a reserved index region.
struct Prepared {
    /// Chain depth, size and top file at the prepare.
    depth: u32,
    old_size: u64,
    top_path: PathBuf,
    /// The index region in the prepared file.
    index: ChainIndexExt,
}

impl std::fmt::Debug for PreparedTop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTop")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("fast", &self.fast.is_some())
            .finish()
    }
}

impl PreparedTop {
    /// The new top's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the push can switch to this file without creating it (or
    /// its index) inside the pause.
    pub fn is_fast(&self) -> bool {
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
    /// The prepared file was used (`false`: it was created whole inside
    /// the pause).
    pub fast: bool,
    /// Sectors of the new top's index that it reads from the frozen layer
    /// until they are copied (see [`Disk::copy_index_rest`]).
    pub index_sectors_to_copy: u64,
}

impl Disk {
    /// Prepares a new top layer at `path` while I/O goes on: the file is
    /// created backed by the current top (`backing_name` is stored as its
    /// backing file name, relative to the new file's directory) with room
    /// for the chain index, and synced. The push fills in the rest.
    ///
    /// `size` grows the disk (`None` keeps the size; shrinking is refused).
    /// Without a stored index (or with a different index unit), nothing is
    /// created and the push does all the work.
    pub fn prepare_top(
        &self,
        path: &Path,
        backing_name: &str,
        size: Option<u64>,
    ) -> Result<PreparedTop> {
        let size = size.unwrap_or(self.chain.size);
        self.refuse_shrink(size)?;
        let mut prepared = PreparedTop {
            path: path.to_path_buf(),
            backing_name: backing_name.to_string(),
            size,
            fast: None,
            created: false,
            committed: false,
        };
        let indexed = self.writer()?.lock().index().cloned();
        if indexed.is_none_or(|ext| ext.granularity_bits != self.chain.unit_bits) {
            return Ok(prepared);
        }
        let opts = self.top_options(backing_name, size);
        prepared.created = true;
        let created = create_with(path, &opts, Some(self), Carry::Reserved)?;
        if let (Some(_), Some(index)) = (created.header, created.index) {
            prepared.fast = Some(Prepared {
                depth: self.depth(),
                old_size: self.chain.size,
                top_path: self.top().path().to_path_buf(),
                index,
            });
        }
        Ok(prepared)
    }

    /// Freezes the top layer and continues on the prepared one.
    ///
    /// The current top becomes a read-only layer holding exactly the writes
    /// that completed before this call. On the fast path it is only
    /// *frozen*: its final header is kept in memory and the file stays
    /// marked dirty until the next [`Disk::flush`] or [`Disk::sync_frozen`]
    /// makes it durable and clean, outside the pause. Durability thus
    /// follows the client's flushes, as it would have without the push; a
    /// crash before the seal loses only writes no flush covered, and
    /// startup repairs the dirty file. The new top reads its owners from
    /// the frozen layer until it copies them (see [`Disk::copy_index_rest`]).
    /// On the full path the old top is synced and closed here, and the new
    /// file created whole and durable. Then `before_writing` runs: a caller
    /// commits its catalog there, so a crash never leaves the catalog
    /// pointing at a file that does not exist, nor writes in a file the
    /// catalog does not know. Only then does the disk write to it.
    ///
    /// A top still reading owners from below is copied whole first (a
    /// caller does that before holding I/O back, so this finds nothing to
    /// do). On any failure the new file is removed and the disk keeps
    /// writing to the old top.
    ///
    /// The caller must exclude I/O for the duration (it takes `&mut self`).
    pub fn push_top(
        &mut self,
        mut top: PreparedTop,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<PushReport> {
        let size = top.size;
        self.refuse_shrink(size)?;
        self.complete_index_copy()?;
        let writer = self
            .writer
            .take()
            .ok_or_else(|| DiskError::ReadOnly(self.top().path().to_path_buf()))?;
        let w = writer.into_inner();
        match top.fast.take() {
            Some(f) if self.can_push_fast(&f, &w, size) => {
                self.push_fast(w, &mut top, f, before_writing)
            }
            _ => self.push_whole(w, &mut top, before_writing),
        }
    }

    /// Whether a top prepared earlier can still be pushed fast: it was made
    /// over this disk's current top, chain and size. A top kept ready for
    /// later, such as a volume's standby for its next snapshot, is checked
    /// with this before it is used.
    pub fn prepared_is_current(&self, top: &PreparedTop) -> bool {
        let Some(f) = &top.fast else {
            return false;
        };
        let Ok(writer) = self.writer() else {
            return false;
        };
        let w = writer.lock();
        self.can_push_fast(f, &w, top.size)
    }

    fn refuse_shrink(&self, size: u64) -> Result<()> {
        if size < self.chain.size {
            return Err(DiskError::Invalid(format!(
                "cannot shrink {} from {} to {size} bytes; only growing is supported",
                self.top().path().display(),
                self.chain.size
            )));
        }
        Ok(())
    }

    /// Whether the prepared file still fits the chain: same top, depth and
    /// size as at the prepare, an index on the top with the same unit.
    fn can_push_fast(&self, f: &Prepared, w: &Writer, size: u64) -> bool {
        w.index()
            .is_some_and(|ext| ext.granularity_bits == self.chain.unit_bits)
            && self.depth() == f.depth
            && self.chain.size == f.old_size
            && self.top().path() == f.top_path
            && f.index.virtual_size == size
            && f.index.granularity_bits == self.chain.unit_bits
            && f.index.depth == self.depth() + 1
    }

    /// The full path: closes the old top, then creates the new file whole.
    fn push_whole(
        &mut self,
        w: Writer,
        top: &mut PreparedTop,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<PushReport> {
        if let Err(e) = w.close(&self.chain) {
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
        self.chain.push_top(layer, top.size);
        // The old top is sealed: a backing file now, readable by others.
        let below = &self.chain.layers[self.chain.layers.len() - 2];
        if let Err(e) = below.file.downgrade_lock() {
            tracing::warn!("{}: keeping its write lock: {e}", below.path().display());
        }
        self.chain.reload_index();
        self.start_writer()?;
        Ok(PushReport {
            fast: false,
            index_sectors_to_copy: 0,
        })
    }

    /// The fast path: freezes the old top and switches to the prepared
    /// file, whose owners are then copied from the frozen layer lazily.
    fn push_fast(
        &mut self,
        w: Writer,
        top: &mut PreparedTop,
        f: Prepared,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<PushReport> {
        let started = Instant::now();
        let place = Place {
            depth: f.depth + 1,
            path: top.path.clone(),
        };
        // The region the new top reads its owners from until it copies them.
        let Some(from) = w.index().cloned() else {
            return self.abandon(w, DiskError::Invalid("the top has no index".into()));
        };
        // Frozen, not synced: the old top holds exactly the writes that
        // completed before now, and becomes durable at the next flush (or
        // when the caller calls `sync_frozen`), outside this pause. Its
        // index checksum is computed then too.
        if let Err(e) = w.freeze(&self.chain, false) {
            self.restart_writer()?;
            return Err(e);
        }
        let frozen_at = started.elapsed();
        let finished = self.finish_prepared(&place, &f);
        let finished_at = started.elapsed();
        let layer = match finished.and_then(|layer| before_writing().map(|()| layer)) {
            Ok(layer) => layer,
            Err(e) => {
                // `top` removes the file when the caller drops it.
                self.restart_writer()?;
                return Err(e);
            }
        };
        top.committed = true;
        let source = self.chain.layers.len() - 1;
        self.frozen.lock().push(Frozen {
            position: source,
            since: Instant::now(),
            crc_pending: true,
        });
        self.chain.push_top(layer, top.size);
        let lazy = LazyIndex::new(source, from, &f.index);
        let to_copy = lazy.left();
        *self.chain.lazy.write() = Some(Arc::new(lazy));
        *self.chain.index.write() = Some(f.index.clone());
        *self.chain.index_state.write() = IndexState::Stored {
            depth: self.depth(),
        };
        let committed_at = started.elapsed();
        self.start_writer()?;
        // Where a pause goes, for whoever tunes it (`STRATA_LOG=debug`).
        tracing::debug!(
            freeze_ms = frozen_at.as_secs_f64() * 1e3,
            finish_ms = (finished_at - frozen_at).as_secs_f64() * 1e3,
            commit_ms = (committed_at - finished_at).as_secs_f64() * 1e3,
            writer_ms = (started.elapsed() - committed_at).as_secs_f64() * 1e3,
            index_sectors_to_copy = to_copy,
            "pushed a prepared top"
        );
        Ok(PushReport {
            fast: true,
            index_sectors_to_copy: to_copy,
        })
    }

    /// After the old top is frozen: writes the prepared file's lineage
    /// (the chain below as it is now, its last record naming the frozen
    /// top by its new UUID) after its owner bytes, and opens the file.
    ///
    /// Nothing is synced. The prepare synced the file whole with its
    /// header saying *no valid index*, which is all a crash needs: the
    /// catalog may name the file, its geometry and backing are durable, and
    /// the index is only an accelerator, marked valid again only when the
    /// layer is closed with its region whole. Until then an index that
    /// fails validation after a crash is rebuilt by walking the chain.
    fn finish_prepared(&self, place: &Place, f: &Prepared) -> Result<Layer> {
        let lineage: Vec<u8> = self.lineage()?.iter().flat_map(|i| i.encode()).collect();
        let owner_bytes = f.index.entry_count() * ENTRY_BYTES;
        if owner_bytes + lineage.len() as u64 != f.index.region_len {
            return Err(DiskError::Invalid(format!(
                "prepared index of {} bytes, expected {}",
                owner_bytes + lineage.len() as u64,
                f.index.region_len
            )));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&place.path)
            .map_err(|e| DiskError::io(place, "open", e))?;
        file.write_all_at(&lineage, f.index.region_offset + owner_bytes)
            .map_err(|e| DiskError::io(place, "write", e))?;
        drop(file);
        Layer::open(&place.path, place.depth, true, Some(Format::Qcow2))
    }

    /// Gives up a push before the old top was closed: closes it as usual
    /// and writes to it again.
    fn abandon(&mut self, w: Writer, e: DiskError) -> Result<PushReport> {
        let _ = w.close(&self.chain);
        self.restart_writer()?;
        Err(e)
    }

    /// Opens the new top for writing. If this fails the disk stays
    /// read-only until it is reopened.
    fn start_writer(&mut self) -> Result<()> {
        let w = Writer::start_on_new_top(&self.chain)?;
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

    /// Opens the (unchanged) top for writing again after a failed push.
    fn restart_writer(&mut self) -> Result<()> {
        if self.writer.is_none() {
            self.chain.reload_index();
            self.start_writer()?;
        }
        Ok(())
    }
}
