//! The set of exports a server offers. It can change while the server
//! runs: a volume service adds an export when a volume is created and
//! removes it when the volume is deleted.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::export::Export;
use crate::ServerError;

/// The exports of a server, in the order `NBD_OPT_LIST` shows them.
///
/// Lookups clone an `Arc`, so a connection keeps its export even if it is
/// removed from the set meanwhile; removal only stops new clients.
#[derive(Debug, Default)]
pub struct ExportSet {
    list: RwLock<Vec<Arc<Export>>>,
}

impl ExportSet {
    /// A set holding `exports`. Fails if a name is used twice.
    pub fn new(exports: Vec<Export>) -> Result<ExportSet, ServerError> {
        let set = ExportSet::default();
        for e in exports {
            set.insert(e)?;
        }
        Ok(set)
    }

    /// Adds an export. Fails if its name is taken.
    pub fn insert(&self, export: Export) -> Result<(), ServerError> {
        let mut list = self.list.write();
        if list.iter().any(|e| e.name() == export.name()) {
            return Err(ServerError::Config(format!(
                "export name '{}' is used twice",
                export.name()
            )));
        }
        list.push(Arc::new(export));
        Ok(())
    }

    /// Replaces the export of the same name, or adds it. Clients already
    /// connected keep the old one until they reconnect (that is how a
    /// resized volume reaches them).
    pub fn replace(&self, export: Export) {
        let export = Arc::new(export);
        let mut list = self.list.write();
        match list.iter_mut().find(|e| e.name() == export.name()) {
            Some(slot) => *slot = export,
            None => list.push(export),
        }
    }

    /// Removes every export and returns them (for shutdown).
    pub(crate) fn take_all(&self) -> Vec<Arc<Export>> {
        std::mem::take(&mut *self.list.write())
    }

    /// Removes and returns the export called `name`.
    pub fn remove(&self, name: &str) -> Option<Arc<Export>> {
        let mut list = self.list.write();
        let at = list.iter().position(|e| e.name() == name)?;
        Some(list.remove(at))
    }

    /// A snapshot of the exports, in order.
    pub fn list(&self) -> Vec<Arc<Export>> {
        self.list.read().clone()
    }

    /// Number of exports.
    pub fn len(&self) -> usize {
        self.list.read().len()
    }

    /// Whether there is no export.
    pub fn is_empty(&self) -> bool {
        self.list.read().is_empty()
    }

    /// The export called `name`. The empty name is the default export:
    /// the one named "" if any, else the first, so `nbd://host/` works
    /// whatever name a single export was given.
    pub fn get(&self, name: &str) -> Option<Arc<Export>> {
        let list = self.list.read();
        list.iter()
            .find(|e| e.name() == name)
            .or_else(|| if name.is_empty() { list.first() } else { None })
            .cloned()
    }
}
