//! RS3, the storage node's request scheduler (thesis chapter 4, "Request
//! Scheduler for Storage Servers"), as a deterministic core without I/O.
//!
//! Reads are sent in fixed-size *batches*. Each batch's byte budget is
//! shared between the active request *classes* by weighted water-filling
//! ([`allocation`]): every class gets at most its weighted share, and what
//! a class leaves unused goes to the classes still wanting. Inside a class
//! the same allocation runs again over its requests ([`batch`]), so a
//! class's small requests complete in one batch while its big ones are
//! sent in slices. [`config`] holds the operator's settings.
//!
//! The I/O shell that runs it on a node's sockets is
//! [`crate::storage::scheduled`]; see docs/design/rs3.md.

pub mod allocation;
pub mod batch;
pub mod config;

use std::fmt;
use std::sync::Arc;

/// The name of a request class (by default a tenant id). Cheap to clone;
/// ordered by name, which is how ties are broken deterministically.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassId(Arc<str>);

impl ClassId {
    /// The class named `name`.
    pub fn new(name: &str) -> ClassId {
        ClassId(Arc::from(name))
    }

    /// The class's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClassId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}
