//! The replicas of the storage nodes that run in this process, offered to
//! a store client of the same process (the S3 gateway of `strata store
//! up`), which reads them from disk instead of over loopback TCP
//! ([`strata_store_client::client::local`]).

use crate::storage::file::{check_header, FILE_HEADER};
use crate::storage::replicas::SnStore;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use strata_store_client::client::local::{LocalReplica, LocalReplicas};
use strata_store_client::client::pinned::FileIdentity;
use strata_store_protocol::addr::Addr;

/// The storage nodes of this process.
pub struct LocalNodes {
    stores: Vec<Arc<SnStore>>,
}

impl LocalNodes {
    /// The replicas of `stores`.
    pub fn new(stores: Vec<Arc<SnStore>>) -> LocalNodes {
        LocalNodes { stores }
    }
}

impl LocalReplicas for LocalNodes {
    /// The replica file at `addr` in the first node that has it, with a
    /// header whose size agrees with the file's length. A missing file
    /// (on another node, or deleted) or a damaged header gives `None`:
    /// the network read then gets the node's own answer, and a damaged
    /// replica is refused and reported there.
    fn open(&self, addr: Addr) -> Option<LocalReplica> {
        self.stores.iter().find_map(|store| {
            let file = std::fs::File::open(store.path(addr)).ok()?;
            let length = file.metadata().ok()?.len();
            let mut start = [0u8; FILE_HEADER];
            file.read_exact_at(&mut start, 0).ok()?;
            let header = check_header(&start, length)?;
            Some(LocalReplica {
                file,
                data_offset: FILE_HEADER as u64,
                size: header.size,
            })
        })
    }

    /// The identity of the replica file at `addr` in the first node that
    /// has it, from its path (one `stat`, no open).
    fn identity(&self, addr: Addr) -> Option<FileIdentity> {
        self.stores
            .iter()
            .find_map(|store| FileIdentity::of_path(&store.path(addr)).ok())
    }
}
