//! `strata node`: the F3 agent of one node. It registers with the
//! metadata service and renews its lease, serves the ephemeral files it
//! holds to other nodes ([`transfer`]), pulls other nodes' files
//! ([`copies`]), reaches the durable tier ([`durable`]), and mounts the
//! namespace with FUSE ([`fs`]). It also runs functions in sandboxes
//! ([`sandbox`], with their memory cgroups in [`cgroup`]).

pub mod budget;
pub mod cgroup;
pub mod chunks;
pub mod copies;
pub mod durable;
pub mod fs;
pub mod handles;
pub mod local;
pub mod persist;
pub mod sandbox;
pub mod transfer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_store_protocol::tenant::TenantCredential;

use crate::client::{AgentClient, ServiceClient};
use crate::protocol::check_node_name;
use crate::{F3Error, Result};
use budget::Budget;
use copies::Copies;
use durable::DurableTier;
use local::LocalFiles;
use sandbox::{SandboxConfig, Sandboxes};

/// How a node agent runs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's name (unique among the agents of one service).
    pub name: String,
    /// Its directory: ephemeral files, copies, the durable cache.
    pub directory: PathBuf,
    /// Where its transfer service listens (port 0: any free port).
    pub listen: SocketAddr,
    /// The metadata service's address.
    pub service: String,
    /// Where to mount the namespace.
    pub mountpoint: PathBuf,
    /// The object store (orchestrator and tenant credential), for durable
    /// files; without it only ephemeral files can be made.
    pub store: Option<(SocketAddr, TenantCredential)>,
    /// Every new file is ephemeral, whatever its name or directory.
    pub all_ephemeral: bool,
    /// Most bytes the node's local tier may hold (its ephemeral files,
    /// copies, local copies and staging files); none: the disk's size.
    pub quota: Option<u64>,
    /// How functions run here (slots, keep-alive, cgroups).
    pub sandbox: SandboxConfig,
    /// Other nodes' files of at least this many bytes, closed when
    /// opened, are fetched by range as they are read rather than pulled
    /// whole ([`copies::DEFAULT_RANGE_THRESHOLD`] by default).
    pub range_threshold: u64,
}

/// What the file system, the transfer service and the heartbeat share.
#[derive(Debug)]
pub struct Shared {
    /// This node's name.
    pub name: String,
    /// Its transfer service's address.
    pub address: String,
    /// The metadata service.
    pub service: ServiceClient,
    /// Other nodes' transfer services.
    pub agents: AgentClient,
    /// The ephemeral files held here.
    pub local: LocalFiles,
    /// Copies of other nodes' ephemeral files.
    pub copies: Copies,
    /// The durable tier, if the node has one.
    pub durable: Option<DurableTier>,
    /// Local copies of durable files, by content name.
    pub cache_dir: PathBuf,
    /// Durable files being written here.
    pub staging_dir: PathBuf,
    /// The version of each durable file's local copy.
    pub cached: Mutex<HashMap<String, u64>>,
    /// Every new file is ephemeral.
    pub all_ephemeral: bool,
    /// The service's lease: how long a silent holder is waited for.
    pub lease: Duration,
    /// The local tier's quota and what it evicts and spills.
    pub budget: Budget,
    /// The function sandboxes.
    pub sandboxes: Arc<Sandboxes>,
}

impl Shared {
    /// The durable tier, or the error that says how to get one.
    pub fn durable(&self) -> Result<&DurableTier> {
        self.durable.as_ref().ok_or_else(|| {
            F3Error::invalid(format!(
                "node {} has no durable tier: start `strata node` with --store (and a \
                 credential) to make or read durable files",
                self.name
            ))
        })
    }

    /// Where the local copy of durable file `path` lives.
    pub fn cache_path(&self, path: &str) -> PathBuf {
        self.cache_dir.join(local::content_name(path))
    }

    /// Drops the local copy of durable file `path`, if this node keeps
    /// one; the bytes it held.
    pub fn drop_cached(&self, path: &str) -> Option<u64> {
        self.cached.lock().remove(path)?;
        let cache = self.cache_path(path);
        let bytes = std::fs::metadata(&cache).map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&cache).ok()?;
        Some(bytes)
    }
}

/// A running agent: mounted, serving, heartbeating. [`Node::stop`] (or
/// dropping it) unmounts.
pub struct Node {
    shared: Arc<Shared>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
    runtime: tokio::runtime::Runtime,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.shared.name)
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts the agent: transfer service, registration, durable tier,
    /// heartbeat, then the mount.
    pub fn start(config: NodeConfig) -> Result<Node> {
        check_node_name(&config.name)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("f3-node")
            .enable_all()
            .build()
            .map_err(|e| F3Error::io("starting the agent's runtime", e))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(config.listen))
            .map_err(|e| F3Error::io(format!("listening on {}", config.listen), e))?;
        let address = listener
            .local_addr()
            .map_err(|e| F3Error::io("reading the transfer address", e))?
            .to_string();
        let service = ServiceClient::new(&config.service);
        let lease = service.heartbeat(&config.name, &address)?;
        let durable = match config.store.clone() {
            Some((cluster, credential)) => Some(DurableTier::connect(
                runtime.handle().clone(),
                cluster,
                credential,
            )?),
            None => None,
        };
        let agents = AgentClient::new();
        let budget = Budget::new(config.quota);
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            address,
            local: LocalFiles::new(config.directory.join("files"))?,
            copies: Copies::new(
                config.directory.join("copies"),
                agents.clone(),
                service.clone(),
                budget.growth_counter(),
                config.range_threshold,
            )?,
            cache_dir: make_dir(config.directory.join("cache"))?,
            staging_dir: make_dir(config.directory.join("staging"))?,
            cached: Mutex::new(HashMap::new()),
            service,
            agents,
            durable,
            all_ephemeral: config.all_ephemeral,
            lease: Duration::from_millis(lease.lease_ms.clamp(100, 600_000)),
            budget,
            sandboxes: Sandboxes::start(&config.name, &config.mountpoint, config.sandbox.clone()),
        });
        shared.budget.remeasure(&shared);
        let app = transfer::router(shared.clone());
        runtime.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("the transfer service stopped: {e}");
            }
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        spawn_heartbeat(shared.clone(), stop.clone())?;
        let session = fs::mount(shared.clone(), &config.mountpoint)?;
        Ok(Node {
            shared,
            session: Some(session),
            mountpoint: config.mountpoint,
            runtime,
            stop,
        })
    }

    /// The transfer service's address.
    pub fn address(&self) -> &str {
        &self.shared.address
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Unmounts (lazily if files are still open) and stops.
    pub fn stop(mut self) {
        self.unmount();
    }

    fn unmount(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // A lazy unmount first: a plain one fails while a reader or
        // writer still has a file open, and the agent must go anyway.
        if let Ok(point) = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2 reads the NUL-terminated path it is given.
            unsafe { libc::umount2(point.as_ptr(), libc::MNT_DETACH) };
        }
        if let Some(session) = self.session.take() {
            drop(session);
        }
        self.shared.sandboxes.shutdown();
        let _ = &self.runtime;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.unmount();
    }
}

fn make_dir(path: PathBuf) -> Result<PathBuf> {
    std::fs::create_dir_all(&path)
        .map_err(|e| F3Error::io(format!("creating {}", path.display()), e))?;
    Ok(path)
}

/// Renews the lease four times per lease, until `stop`.
fn spawn_heartbeat(shared: Arc<Shared>, stop: Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
    let period = shared.lease / 4;
    std::thread::Builder::new()
        .name("f3-heartbeat".into())
        .spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(period);
                if let Err(e) = shared.service.heartbeat(&shared.name, &shared.address) {
                    tracing::warn!("node {}: heartbeat: {e}", shared.name);
                }
            }
        })
        .map_err(|e| F3Error::io("starting the heartbeat thread", e))?;
    Ok(())
}
