//! Whole erasure-coded objects served by the node of their fragment 0
//! ([`Request::GetObject`]): from the node's object cache, or gathered
//! from any k fragments (this node's first), decoded and checked here,
//! then cached (the thesis's chapter 5). A client reads one stream
//! instead of k. The gathering makes the decisions of the client's
//! reads ([`strata_store_client::read_plan`]); what it may keep is the
//! object cache's to say (a Free may race it).
//!
//! [`Request::GetObject`]: strata_store_protocol::data::Request::GetObject

use crate::runtime::{read_table, SharedTable};
use crate::storage::object_cache::ObjectCache;
use crate::storage::reader::reply_err;
use std::path::Path;
use std::sync::Arc;
use strata_store_client::erasure::{gather_object, FragmentSource, StreamPool};
use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::ClusterKey;
use strata_store_protocol::data::{CodedObject, Credential, Request};
use strata_store_protocol::wire::Fragments;
use strata_store_protocol::Error;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Serves the object whose fragment 0 is `addr` (held at `held` on
/// this node's disk): status, size, bytes and the Get trailer (verified,
/// CRC-32C), or an error the client falls back on (it then reads the
/// fragments itself). A miss is gathered only while this node holds
/// fragment 0, and kept only if no Free of it came meanwhile
/// ([`ObjectCache::begin_fill`]).
pub(super) async fn get_object<W: AsyncWrite + Unpin>(
    w: &mut W,
    cache: &ObjectCache,
    key: Option<&ClusterKey>,
    table: &SharedTable,
    (addr, object, held): (Addr, CodedObject, &Path),
) -> Result<(), Error> {
    let data = match cache.get(addr, object.size, object.crc) {
        Some(data) => data,
        None if object.size > cache.max_object() => {
            let why = format!(
                "the object of fragment 0 {} has {} bytes, more than this node's object \
                 cache takes ({}): read its fragments",
                fmt_addr(addr),
                object.size,
                cache.max_object()
            );
            return reply_err(w, &why).await;
        }
        None => {
            let fill = cache.begin_fill(addr);
            if !tokio::fs::try_exists(held).await.unwrap_or(false) {
                let why = format!(
                    "this node does not hold fragment 0 {} (freed, or never stored): \
                     read the object's fragments",
                    fmt_addr(addr)
                );
                return reply_err(w, &why).await;
            }
            match gather(key, table, &object).await {
                Ok(data) => {
                    let data = Arc::new(data);
                    // Refused if the fragment was freed meanwhile: this
                    // Get, which began before the Free, is still served.
                    fill.admit(object.crc, data.clone());
                    data
                }
                Err(e) => return reply_err(w, &e.report().to_string()).await,
            }
        }
    };
    let io = |e| Error::io("sending an object", e);
    w.write_all(&[0]).await.map_err(io)?;
    w.write_all(&object.size.to_be_bytes()).await.map_err(io)?;
    w.write_all(&data).await.map_err(io)?;
    w.write_all(&[0]).await.map_err(io)?;
    w.write_all(&object.crc.to_be_bytes()).await.map_err(io)?;
    w.flush().await.map_err(io)
}

/// The idle connections of the process's storage nodes to the others,
/// for the fragments they gather (shared: keyed by endpoint).
fn fragment_pool() -> Arc<StreamPool> {
    static POOL: std::sync::OnceLock<Arc<StreamPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(Arc::default).clone()
}

/// Reads the object from any k of its fragments, fragment 0 (this
/// node's) first, sealed with the node's key.
async fn gather(
    key: Option<&ClusterKey>,
    table: &SharedTable,
    object: &CodedObject,
) -> Result<Vec<u8>, Error> {
    let Some(key) = key else {
        return Err(Error::config(
            "this storage node holds no cluster key to read the other fragments with",
        ));
    };
    let table = read_table(table);
    let sources: Vec<FragmentSource> = object
        .fragments
        .iter()
        .enumerate()
        .filter_map(|(index, &(addr, _))| {
            Some(FragmentSource {
                index,
                addr,
                endpoint: table.sn_endpoint(addr)?,
                request: Request::Get { addr }.encode(Credential::Seal(key)),
                pool: Some(fragment_pool()),
            })
        })
        .collect();
    let fragments = Fragments {
        data: object.data,
        crcs: object.fragments.iter().map(|f| f.1).collect(),
    };
    let (data, failures) =
        gather_object(object.size, object.crc, &fragments, sources, None).await?;
    // Fragments that failed their CRC are reported for repair, as the
    // scrub reports them (in the background).
    let damaged: Vec<Addr> = failures
        .iter()
        .filter(|f| f.damaged)
        .map(|f| f.addr)
        .collect();
    if !damaged.is_empty() {
        let key = Some(key.clone());
        tokio::spawn(crate::storage::scrub::report_damaged(table, key, damaged));
    }
    Ok(data)
}
