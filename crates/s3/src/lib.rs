//! Strata's S3 gateway: the S3 REST protocol, signatures and XML from
//! the `s3s` crate, mapped onto the object store through
//! [`strata_store_client`].
//!
//! - [`access`]: S3 access keys and secrets, derived from tenant
//!   credentials (nothing new is stored).
//! - [`names`]: where buckets and objects live in the store, and the S3
//!   metadata an object's record carries as its attributes.
//! - `streams`: bodies moved between HTTP and the store as they come,
//!   never held whole.
//! - `errors`: the store's errors as S3 errors.
//! - [`presigned`]: the bound on a presigned URL's life.
//! - `buckets`, `objects`, `copies`, `listing`: the operations, as methods of
//!   [`Gateway`]; `service` hands s3s's calls to them.
//!
//! The gateway holds the cluster key: for each access key it re-derives
//! the tenant's credential and acts as that tenant, so the store's scope
//! rule (tenant `ID` uses only the names under `ID/`) decides which
//! buckets a key may use. The library never prints and never exits.

pub mod access;
mod buckets;
mod copies;
mod errors;
mod listing;
pub mod names;
mod objects;
pub mod presigned;
mod service;
mod streams;

use s3s::auth::{S3Auth, SecretKey};
use s3s::service::S3ServiceBuilder;
use s3s::{S3ErrorCode, S3Result};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use strata_store_client::client::Client;
use strata_store_protocol::key::ClusterKey;
use tokio::net::TcpListener;

/// Tenants whose store clients the gateway keeps connected at once.
const MAX_CLIENTS: usize = 256;

/// HTTP connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 1024;

/// The gateway of one cluster: the S3 operations, each acting as the
/// tenant its request's access key names.
pub struct Gateway {
    cluster: SocketAddr,
    key: ClusterKey,
    /// Connected store clients by access key (at most [`MAX_CLIENTS`]).
    clients: Mutex<HashMap<String, Arc<Client>>>,
}

impl Gateway {
    /// A gateway to the cluster whose orchestrator listens on `cluster`,
    /// holding the cluster key `key` (from which it derives each tenant's
    /// credential).
    pub fn new(cluster: SocketAddr, key: ClusterKey) -> Gateway {
        Gateway {
            cluster,
            key,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The store client acting as the tenant of `access_key`.
    async fn client(&self, access_key: &str) -> S3Result<Arc<Client>> {
        if let Some(client) = self.cached(access_key) {
            return Ok(client);
        }
        let credential = access::credential_for(&self.key, access_key)
            .map_err(|why| errors::s3(S3ErrorCode::InvalidAccessKeyId, why))?;
        let client = Client::connect(self.cluster, credential)
            .await
            .map_err(|e| errors::from_store("connecting to the cluster", &e))?;
        let client = Arc::new(client);
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if clients.len() >= MAX_CLIENTS {
            // Rare (that many tenants at once): start the cache afresh
            // rather than track use.
            clients.clear();
        }
        clients.insert(access_key.to_string(), client.clone());
        Ok(client)
    }

    fn cached(&self, access_key: &str) -> Option<Arc<Client>> {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients.get(access_key).cloned()
    }
}

/// The secret of each access key, derived from the cluster key.
struct Auth {
    key: ClusterKey,
}

#[async_trait::async_trait]
impl S3Auth for Auth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        let credential = access::credential_for(&self.key, access_key)
            .map_err(|why| errors::s3(S3ErrorCode::InvalidAccessKeyId, why))?;
        Ok(SecretKey::from(access::secret_key(&credential)))
    }
}

/// Serves S3 on `listener` until the task is dropped: every request must
/// be signed (SigV4, in headers or a presigned URL's query) with a key
/// [`access`] derives; anonymous ones are refused with AccessDenied.
pub async fn serve(listener: TcpListener, gateway: Gateway) -> std::io::Result<()> {
    let key = gateway.key.clone();
    let mut builder = S3ServiceBuilder::new(gateway);
    builder.set_auth(Auth { key });
    builder.set_access(presigned::Access);
    let service = builder.build();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors or a connection reset before accept:
                // the listener itself is fine; pause and go on.
                tracing::warn!("accepting an S3 connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let service = service.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
            if let Err(e) = served {
                tracing::debug!("S3 connection from {peer}: {e}");
            }
            drop(permit);
        });
    }
}
