//! The durable tier: a durable file is the object `f3PATH` (the path with
//! an `f3` prefix, so `/jobs/a` is `f3/jobs/a`) in Strata's object store,
//! read whole into a local copy at open and written back whole when a
//! writer closes it (last close wins when nodes write it at once).

use std::path::Path;

use strata_store_client::client::Client;
use strata_store_protocol::tenant::TenantCredential;
use strata_store_protocol::wire::Code;

use crate::{F3Error, Result};

/// The prefix of durable files' object names.
pub const OBJECT_PREFIX: &str = "f3";

/// A durable file's object name.
pub fn object_name(path: &str) -> String {
    format!("{OBJECT_PREFIX}{path}")
}

/// The object store, reached from synchronous code through the agent's
/// runtime.
pub struct DurableTier {
    runtime: tokio::runtime::Handle,
    client: Client,
    cluster: std::net::SocketAddr,
}

impl std::fmt::Debug for DurableTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTier")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl DurableTier {
    /// Connects to the store whose orchestrator is at `cluster`, as the
    /// tenant of `credential`. Call it from outside the runtime.
    pub fn connect(
        runtime: tokio::runtime::Handle,
        cluster: std::net::SocketAddr,
        credential: TenantCredential,
    ) -> Result<DurableTier> {
        let client = runtime
            .block_on(Client::connect(cluster, credential))
            .map_err(|e| {
                F3Error::unavailable(format!(
                    "cannot reach the object store at {cluster}: {}; is `strata store up` \
                     running there (--store)?",
                    e.report()
                ))
            })?;
        Ok(DurableTier {
            runtime,
            client,
            cluster,
        })
    }

    /// Reads `path`'s object into the file `to` (made or replaced);
    /// returns its size. Not from the runtime's own threads.
    pub fn download(&self, path: &str, to: &Path) -> Result<u64> {
        let name = object_name(path);
        let partial = to.with_extension("partial");
        let record = self.runtime.block_on(async {
            let mut file = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| F3Error::io(format!("creating {}", partial.display()), e))?;
            self.client
                .get(&name, &mut file, &|_| {})
                .await
                .map_err(|e| self.error(path, "reading", e))
        })?;
        std::fs::rename(&partial, to)
            .map_err(|e| F3Error::io(format!("renaming {}", partial.display()), e))?;
        Ok(record.size)
    }

    /// Stores the file `from` as `path`'s object; returns its size.
    pub fn upload(&self, path: &str, from: &Path) -> Result<u64> {
        let name = object_name(path);
        self.runtime.block_on(async {
            let mut file = tokio::fs::File::open(from)
                .await
                .map_err(|e| F3Error::io(format!("opening {}", from.display()), e))?;
            let size = file
                .metadata()
                .await
                .map_err(|e| F3Error::io(format!("reading {}", from.display()), e))?
                .len();
            self.client
                .put(&name, size, &mut file, &|_| {})
                .await
                .map_err(|e| self.error(path, "storing", e))?;
            Ok(size)
        })
    }

    /// Deletes `path`'s object (none is fine).
    pub fn delete(&self, path: &str) -> Result<()> {
        let name = object_name(path);
        match self.runtime.block_on(self.client.delete(&name)) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.code(), Some(Code::NotFound | Code::Deleted)) => Ok(()),
            Err(e) => Err(self.error(path, "deleting", e)),
        }
    }

    fn error(&self, path: &str, doing: &str, e: strata_store_protocol::Error) -> F3Error {
        F3Error::unavailable(format!(
            "{path}: {doing} its object {} in the store at {}: {}",
            object_name(path),
            self.cluster,
            e.report()
        ))
    }
}
