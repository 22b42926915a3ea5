//! Changing the chain of a disk that stays open: a new top layer pushed
//! under a running disk, for online snapshots and for growing a disk.
//!
//! The layers below stay open, the chain index is carried forward from
//! the open chain and the resolved-page cache is kept (a new top owns
//! nothing, so every cached owner stays true). The cost is a few syncs and
//! one pass over the index (2 bytes per cluster), whatever the chain length.

use std::path::Path;

use parking_lot::Mutex;

use crate::create::{create_on, CreateOptions};
use crate::disk::{validate_index, Disk, IndexState};
use crate::error::{DiskError, Result};
use crate::layer::{Format, Layer};
use crate::writer::Writer;

impl Disk {
    /// Freezes the top layer and continues on a new one at `path`.
    ///
    /// The current top is synced, its index stored and it is marked clean:
    /// from then on it is a read-only layer holding exactly the writes that
    /// completed before this call. The new top is created backed by it
    /// (`backing_name` is stored as its backing file name, relative to the
    /// new file's directory), made durable, and `before_writing` runs: a
    /// caller commits its catalog there, so a crash never leaves the
    /// catalog pointing at a file that does not exist, nor writes in a file
    /// the catalog does not know. Only then does the disk write to it.
    ///
    /// `size` grows the disk (`None` keeps the size; shrinking is refused).
    /// On any failure the new file is removed and the disk keeps writing to
    /// the old top.
    ///
    /// The caller must exclude I/O for the duration (it takes `&mut self`).
    pub fn push_top(
        &mut self,
        path: &Path,
        backing_name: &str,
        size: Option<u64>,
        before_writing: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let size = size.unwrap_or(self.size);
        if size < self.size {
            return Err(DiskError::Invalid(format!(
                "cannot shrink {} from {} to {size} bytes; only growing is supported",
                self.top().path().display(),
                self.size
            )));
        }
        let writer = self
            .writer
            .take()
            .ok_or_else(|| DiskError::ReadOnly(self.top().path().to_path_buf()))?;
        if let Err(e) = writer.into_inner().close(self) {
            self.restart_writer()?;
            return Err(e);
        }
        let layer = match self
            .create_top(path, backing_name, size)
            .and_then(|layer| before_writing().map(|()| layer))
        {
            Ok(layer) => layer,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                self.restart_writer()?;
                return Err(e);
            }
        };
        // Committed: from here on the new file is the top, whatever happens.
        let (old_size, old_unit_bits) = (self.size, self.unit_bits);
        let unit_bits = layer.unit_bits().unwrap_or(self.unit_bits);
        self.layers.push(layer);
        self.size = size;
        self.unit_bits = self.unit_bits.min(unit_bits);
        if self.size != old_size || self.unit_bits != old_unit_bits {
            // Page lengths follow the disk size; start over.
            self.cache.clear();
        }
        self.reload_index();
        // If this fails the disk stays read-only until it is reopened.
        let w = Writer::start(self)?;
        self.writer = Some(Mutex::new(w));
        Ok(())
    }

    /// Creates the new top layer (durable) and opens it.
    fn create_top(&self, path: &Path, backing_name: &str, size: u64) -> Result<Layer> {
        let defaults = CreateOptions::default();
        let cluster_size = self
            .top()
            .cluster_bits()
            .map_or(defaults.cluster_size, |b| 1u64 << b);
        let opts = CreateOptions {
            size: Some(size),
            cluster_size,
            // A snapshot keeps the L2 format of the layer it freezes, so a
            // chain the engine grows stays extended if it started so.
            extended_l2: self.top().extended_l2(),
            backing: Some(backing_name.to_string()),
            backing_format: Some(self.top().format()),
            ..defaults
        };
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
            let w = Writer::start(self)?;
            self.writer = Some(Mutex::new(w));
        }
        Ok(())
    }
}
