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
//! - [`checksums`]: S3's flexible checksums, checked and kept.
//! - `buckets`, `objects`, `attributes`, `copies`, `listing`, `multipart`,
//!   `complete`: the
//!   operations, as methods of [`Gateway`]; `service` hands s3s's calls
//!   to them.
//! - [`metrics`]: the gateway's `/metrics`.
//! - `front`: the HTTP/1.1 connections: GETs and HEADs answered there,
//!   a whole object on this process's disk sent with `sendfile`; the
//!   first request of another kind hands the connection to hyper.
//!
//! The gateway holds the cluster key: for each access key it re-derives
//! the tenant's credential and acts as that tenant, so the store's scope
//! rule (tenant `ID` uses only the names under `ID/`) decides which
//! buckets a key may use. The library never prints and never exits.

pub mod access;
mod attributes;
pub mod bucket_class;
mod buckets;
pub mod checksums;
mod complete;
mod copies;
mod errors;
mod front;
mod listing;
pub mod metrics;
mod multipart;
pub mod names;
mod objects;
mod part_number;
mod parts;
mod posts;
pub mod presigned;
mod service;
mod streams;
mod uploads;

use metrics::Metrics;
use s3s::auth::{S3Auth, SecretKey};
use s3s::service::S3ServiceBuilder;
use s3s::{S3ErrorCode, S3Result};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strata_store_client::client::local::LocalDisk;
use strata_store_client::client::local_metadata::LocalMetadata;
use strata_store_client::client::Client;
use strata_store_protocol::key::ClusterKey;
use strata_store_protocol::tenant::{TenantCredential, ADMIN};
use tokio::net::TcpListener;

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Tenants whose store clients the gateway keeps connected at once.
const MAX_CLIENTS: usize = 256;

/// HTTP connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 1024;

/// How long a multipart upload may stay pending unless told: 7 days.
pub const DEFAULT_UPLOAD_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

/// The gateway's store clients, by access key.
pub(crate) type Clients = Arc<Mutex<HashMap<String, Arc<Client>>>>;

/// The gateway of one cluster: the S3 operations, each acting as the
/// tenant its request's access key names.
pub struct Gateway {
    cluster: SocketAddr,
    key: ClusterKey,
    /// Connected store clients by access key (at most [`MAX_CLIENTS`]);
    /// `/metrics` shows each one's replica choice.
    clients: Clients,
    /// Pending multipart uploads older than this are aborted.
    upload_expiry: Duration,
    /// Replicas on this process's own disk, read directly by every
    /// tenant's client ([`Gateway::with_local_replicas`]).
    local: Option<Arc<LocalDisk>>,
    /// This process's metadata nodes, asked for records by a direct call
    /// ([`Gateway::with_local_metadata`]).
    local_metadata: Option<Arc<dyn LocalMetadata>>,
}

impl Gateway {
    /// A gateway to the cluster whose orchestrator listens on `cluster`,
    /// holding the cluster key `key` (from which it derives each tenant's
    /// credential).
    pub fn new(cluster: SocketAddr, key: ClusterKey) -> Gateway {
        Gateway {
            cluster,
            key,
            clients: Clients::default(),
            upload_expiry: DEFAULT_UPLOAD_EXPIRY,
            local: None,
            local_metadata: None,
        }
    }

    /// The gateway, reading the replicas `local` holds from this
    /// process's disk rather than over TCP: for a gateway started in the
    /// same process as storage nodes (`strata store up`).
    pub fn with_local_replicas(mut self, local: Arc<LocalDisk>) -> Gateway {
        self.local = Some(local);
        self
    }

    /// The gateway, asking `nodes` (metadata nodes of this process) for
    /// an object's record by a direct call rather than over UDP: for a
    /// gateway started in the same process as its metadata nodes.
    pub fn with_local_metadata(mut self, nodes: Arc<dyn LocalMetadata>) -> Gateway {
        self.local_metadata = Some(nodes);
        self
    }

    /// The gateway, aborting multipart uploads still pending `expiry`
    /// after they started (default [`DEFAULT_UPLOAD_EXPIRY`]).
    pub fn with_upload_expiry(mut self, expiry: Duration) -> Gateway {
        self.upload_expiry = expiry;
        self
    }

    /// Every so often (a tenth of the expiry, between a second and an
    /// hour), aborts the expired uploads of every bucket and deletes the
    /// parts nothing uses ([`Gateway::clean_uploads`]), acting as the
    /// admin tenant. Runs until dropped.
    async fn clean_periodically(self) {
        let pause =
            (self.upload_expiry / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600));
        loop {
            tokio::time::sleep(pause).await;
            if let Err(e) = self.clean_once().await {
                tracing::warn!("cleaning multipart uploads: {e}");
            }
        }
    }

    async fn clean_once(&self) -> Result<(), String> {
        let admin =
            TenantCredential::issue(&self.key, ADMIN).map_err(|e| e.report().to_string())?;
        let client = Client::connect(self.cluster, admin)
            .await
            .map_err(|e| format!("connecting to the cluster: {}", e.report()))?;
        let cleaned = self
            .clean_uploads(&client, self.upload_expiry)
            .await
            .map_err(|e| e.message().unwrap_or_default().to_string())?;
        if cleaned > 0 {
            tracing::info!("cleaned {cleaned} expired or abandoned multipart uploads");
        }
        Ok(())
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
        if let Some(local) = &self.local {
            client.set_local_replicas(local.clone());
        }
        if let Some(nodes) = &self.local_metadata {
            client.set_local_metadata(nodes.clone());
        }
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
    /// Secrets derived already, by access key (at most [`MAX_CLIENTS`]):
    /// otherwise every request would derive a credential and a secret
    /// again. A key's secret never changes, so none is ever stale.
    secrets: Mutex<HashMap<String, SecretKey>>,
}

impl Auth {
    fn new(key: ClusterKey) -> Auth {
        Auth {
            key,
            secrets: Mutex::default(),
        }
    }

    /// The secret derived for `access_key` already, if any.
    fn known(&self, access_key: &str) -> Option<SecretKey> {
        let secrets = self.secrets.lock().unwrap_or_else(|e| e.into_inner());
        secrets.get(access_key).cloned()
    }
}

#[async_trait::async_trait]
impl S3Auth for Auth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if let Some(secret) = self.known(access_key) {
            return Ok(secret);
        }
        let credential = access::credential_for(&self.key, access_key)
            .map_err(|why| errors::s3(S3ErrorCode::InvalidAccessKeyId, why))?;
        let secret = SecretKey::from(access::secret_key(&credential));
        let mut secrets = self.secrets.lock().unwrap_or_else(|e| e.into_inner());
        if secrets.len() >= MAX_CLIENTS {
            // As with the clients: rare, so start afresh.
            secrets.clear();
        }
        secrets.insert(access_key.to_string(), secret.clone());
        Ok(secret)
    }
}

/// The S3 service of `gateway` (signatures checked with the keys
/// [`access`] derives, presigned URLs bounded) and its metrics.
pub(crate) fn service(gateway: Gateway) -> (s3s::service::S3Service, Arc<Metrics>) {
    let key = gateway.key.clone();
    let metrics = Arc::new(Metrics::with_clients(
        gateway.clients.clone(),
        gateway.local.clone(),
        gateway.local_metadata.clone(),
    ));
    let mut builder = S3ServiceBuilder::new(gateway);
    builder.set_auth(Auth::new(key));
    builder.set_access(presigned::Access);
    (builder.build(), metrics)
}

/// Serves S3 on `listener` until the task is dropped: every request must
/// be signed (SigV4, in headers or a presigned URL's query) with a key
/// [`access`] derives; anonymous ones are refused with AccessDenied, but
/// for an unsigned `GET /metrics` ([`metrics`]). Meanwhile, expired and
/// abandoned multipart uploads are cleaned.
pub async fn serve(listener: TcpListener, gateway: Gateway) -> std::io::Result<()> {
    let cleaner = Gateway::new(gateway.cluster, gateway.key.clone())
        .with_upload_expiry(gateway.upload_expiry);
    let _cleaning = AbortOnDrop(tokio::spawn(cleaner.clean_periodically()));
    let (service, metrics) = service(gateway);
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
        let (service, metrics) = (service.clone(), metrics.clone());
        tokio::spawn(async move {
            if let Err(e) = front::serve_connection(stream, service, metrics).await {
                tracing::debug!("S3 connection from {peer}: {e}");
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_secret_is_derived_once_and_a_bad_key_is_refused_without_being_kept() {
        let key = ClusterKey::from_bytes(&[7; 32]);
        let auth = Auth::new(key.clone());
        let credential = access::credential_for(&key, "acme~2").expect("a credential");
        let expected = access::secret_key(&credential);
        for _ in 0..2 {
            let secret = auth.get_secret_key("acme~2").await.expect("a secret");
            assert_eq!(secret.expose(), expected);
        }
        assert!(auth.known("acme~2").is_some());
        let refused = auth.get_secret_key("acme").await.expect_err("refused");
        assert_eq!(*refused.code(), S3ErrorCode::InvalidAccessKeyId);
        assert!(auth.known("acme").is_none());
        assert_eq!(auth.secrets.lock().expect("the lock").len(), 1);
    }
}
