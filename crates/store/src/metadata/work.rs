//! The work a metadata node's outputs start on storage nodes, off its
//! serving thread: freeing replicas, copying them and rebuilding
//! erasure-coded fragments for repair, each reported back to the node.

use crate::metadata::state::Out;
use std::net::SocketAddr;
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::table::Table;

/// How a repair copy ended, sent back to the metadata node's loop.
pub(super) struct CopyReport {
    pub(super) name: String,
    pub(super) version: u64,
    pub(super) targets: Vec<strata_store_protocol::addr::Addr>,
    pub(super) result: Result<u8, String>,
}

/// What a metadata node's runtime needs to start data-path work: the
/// cluster key (work on storage nodes is sealed with it, and tickets are
/// issued with it), where copies report, and the runtime to spawn on.
pub(super) struct Work<'a> {
    pub(super) key: &'a ClusterKey,
    pub(super) copies: &'a std::sync::mpsc::Sender<CopyReport>,
    pub(super) runtime: &'a tokio::runtime::Handle,
}

/// Starts a core output that is work rather than a datagram: freeing a
/// replica or copying one for repair.
pub(super) fn spawn_work(table: &Table, out: Out<SocketAddr>, work: &Work) {
    match out {
        Out::Free(addr) => {
            if let Some(endpoint) = table.sn_endpoint(addr) {
                let key = work.key.clone();
                work.runtime.spawn(async move {
                    let _ = strata_store_client::client::free_replica(endpoint, addr, &key).await;
                });
            }
        }
        Out::Copy {
            name,
            version,
            sources,
            targets,
            size,
            crc,
        } => {
            let table = table.clone();
            let report = work.copies.clone();
            let key = work.key.clone();
            work.runtime.spawn(async move {
                let result = strata_store_client::client::copy_replica(
                    &table, &key, &sources, &targets, size, crc,
                )
                .await
                .map_err(|e| e.report().to_string());
                if let Err(e) = &result {
                    tracing::warn!("repair copy of {name:?} failed: {e}");
                }
                let _ = report.send(CopyReport {
                    name,
                    version,
                    targets,
                    result,
                });
            });
        }
        Out::Rebuild {
            record,
            slots,
            targets,
        } => {
            let table = table.clone();
            let report = work.copies.clone();
            let key = work.key.clone();
            work.runtime.spawn(async move {
                let result = strata_store_client::client::rebuild_fragments(
                    &table, &key, &record, &slots, &targets,
                )
                .await
                .map_err(|e| e.report().to_string());
                if let Err(e) = &result {
                    tracing::warn!("repair rebuild of {:?} failed: {e}", record.name);
                }
                let _ = report.send(CopyReport {
                    name: record.name,
                    version: record.version,
                    targets,
                    result,
                });
            });
        }
        // Datagrams are sent by `dispatch`.
        Out::ToOn(_) | Out::Reply(..) | Out::ToMeta(_) => {}
    }
}
