//! `strata store` (run and manage a cluster) and `strata obj` (objects).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use strata_store::auth::{
    fmt_fingerprint, sibling, ClusterKey, Fingerprints, KEY_FILE, NEXT_SUFFIX, PREV_SUFFIX,
};
use strata_store::client::{Client, RenameStep};
use strata_store::cluster::{Cluster, ClusterConfig};
use strata_store::table::{Device, Params, Table};
use strata_store::tenant::{
    describe_scope, TenantCredential, ADMIN, ADMIN_CREDENTIAL_FILE, CREDENTIAL_ENV,
};
use strata_store::wire::{Body, Msg, RenameLink};

use crate::img::{progress_bar, Output};
use crate::stdio::{self, Input, Output as StdOutput};
use crate::units::{human, parse_size};

/// Where the cluster's orchestrator listens.
#[derive(Args, Clone)]
pub struct ClusterArg {
    /// The orchestrator's UDP endpoint.
    #[arg(long, env = "STRATA_CLUSTER", default_value = "127.0.0.1:10890")]
    cluster: SocketAddr,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
}

/// Most bytes of a credential read from standard input (it is 3 lines).
const MAX_CREDENTIAL_BYTES: u64 = 4096;

/// The tenant credential that seals a client's metadata requests.
#[derive(Args, Clone)]
pub struct TenantArg {
    /// The tenant's credential file (`strata store tenant add` writes
    /// one; `strata store up --dir DIR` writes DIR/admin.credential); `-`:
    /// read it from standard input.
    #[arg(long, env = CREDENTIAL_ENV, value_name = "FILE")]
    credential: Option<Input>,
    /// The directory of `strata store up`: without --credential (or
    /// STRATA_CREDENTIAL), its admin.credential is used.
    #[arg(long, value_name = "DIR", value_parser = crate::stdio::directory())]
    dir: Option<PathBuf>,
}

impl TenantArg {
    /// The credential of `--credential` (or the environment), else the
    /// admin credential in `--dir`.
    fn load(&self) -> Result<TenantCredential> {
        match (&self.credential, &self.dir) {
            (Some(Input::File(path)), _) => Ok(TenantCredential::load(path)?),
            (Some(Input::Stdin), _) => {
                let text = Input::Stdin.read_text(MAX_CREDENTIAL_BYTES)?;
                Ok(TenantCredential::parse(
                    &text,
                    "standard input (--credential -)",
                )?)
            }
            (None, Some(dir)) => Ok(TenantCredential::load(&dir.join(ADMIN_CREDENTIAL_FILE))?),
            (None, None) => bail!(
                "this command needs a tenant credential: give --credential FILE (or set \
                 {CREDENTIAL_ENV}), or --dir DIR of `strata store up` to use its \
                 {ADMIN_CREDENTIAL_FILE}; `strata store tenant add` makes a tenant's"
            ),
        }
    }
}

/// The cluster key, which nodes and control commands need.
#[derive(Args, Clone)]
pub struct KeyArg {
    /// The cluster key's file: the `cluster.key` that `strata store up`
    /// makes in its directory (32 random bytes, mode 0600). Copy it to
    /// every host of the cluster.
    #[arg(
        long = "key",
        env = "STRATA_CLUSTER_KEY",
        value_name = "FILE",
        value_parser = crate::stdio::file(crate::stdio::KEY_WHY)
    )]
    path: Option<PathBuf>,
}

impl KeyArg {
    /// The key in `--key`, else in the first of `defaults` that exists.
    fn load(&self, defaults: &[PathBuf]) -> Result<ClusterKey> {
        if let Some(path) = &self.path {
            return Ok(ClusterKey::load(path)?);
        }
        match defaults.iter().find(|p| p.exists()) {
            Some(path) => Ok(ClusterKey::load(path)?),
            None => {
                let tried: Vec<String> = defaults
                    .iter()
                    .map(|p| format!("'{}'", p.display()))
                    .collect();
                let tried = if tried.is_empty() {
                    String::new()
                } else {
                    format!(" (no {} either)", tried.join(" or "))
                };
                bail!(
                    "this command needs the cluster key{tried}: give --key FILE or set \
                     STRATA_CLUSTER_KEY to the {KEY_FILE} in the directory of `strata store up`"
                )
            }
        }
    }
}

/// `strata store` subcommands.
#[derive(Subcommand)]
pub enum StoreCommand {
    /// Run a cluster in this process: the orchestrator, metadata and storage
    /// nodes, in mapped mode on loopback. Prints a readiness line, then
    /// serves until SIGTERM or SIGINT, when it stops its nodes and the
    /// nodes `strata store node add` runs with DIR's cluster.key.
    Up(UpArgs),
    /// Add or remove nodes.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Show the prefix table: nodes, groups, capacity, state.
    Status(ClusterArg),
    /// Routed mode: print the `ip -6 route` commands one host needs. Each
    /// storage node's prefix and each metadata group goes through the node
    /// that owns it, and is a local route on that node itself.
    Routes(RoutesArgs),
    /// Make a new cluster key, or swap it in: the steps of a rotation
    /// without downtime (see `docs/store.md`, "The cluster key"). Nodes
    /// re-read their key files on SIGHUP.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Load generator: concurrent clients Post or Get fixed-size objects
    /// (`bench/<size>/<client>/<i>`), or GET them from an HTTP server.
    Bench(BenchArgs),
    /// Issue tenants' credentials: a tenant seals its metadata requests
    /// with one, and may use only the names of its scope.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
}

/// `strata store tenant` subcommands.
#[derive(Subcommand)]
pub enum TenantCommand {
    /// Write tenant ID's credential (mode 0600): its id, its generation
    /// and a secret derived from the cluster key for both. Tenant ID may
    /// use only the names under `ID/`; the tenant `*` may use every name.
    /// With --cluster, the credential is of the tenant's current minimum
    /// generation, asked of the orchestrator (after `tenant revoke`, the
    /// next one); without it, of --generation (default 0). Run it again
    /// after a cluster key rotation (the old credential stops working once
    /// the old key is dropped).
    Add(TenantAddArgs),
    /// Revoke tenant ID's credentials: the orchestrator raises the
    /// tenant's minimum generation by one, and metadata nodes refuse
    /// every credential below it once they fetch the table (about 1 s).
    /// Other tenants are untouched; issue the tenant a new credential
    /// with `strata store tenant add --cluster ADDR --tenant ID`.
    Revoke(TenantRevokeArgs),
}

/// `strata store tenant revoke` arguments.
#[derive(Args)]
pub struct TenantRevokeArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    #[command(flatten)]
    key: KeyArg,
    /// The tenant id whose credentials to revoke (not '*': rotate the
    /// cluster key to revoke the admin credential).
    #[arg(long)]
    tenant: String,
}

/// `strata store tenant add` arguments.
#[derive(Args)]
pub struct TenantAddArgs {
    /// The cluster key: DIR/cluster.key with --dir, or --key FILE.
    #[command(flatten)]
    file: KeyFileArg,
    /// The tenant id: 1 to 64 ASCII letters, digits, '.', '_' or '-' (its
    /// names are those under 'ID/'), or '*' for every name.
    #[arg(long)]
    tenant: String,
    /// Where to write the credential (`-`: standard output, and the
    /// report goes to standard error). Default: ID.credential next to the
    /// key file (admin.credential for '*').
    #[arg(long = "out", value_name = "FILE")]
    out: Option<StdOutput>,
    /// The orchestrator's UDP endpoint: issue the tenant's current
    /// minimum generation, read from its table.
    #[arg(long, env = "STRATA_CLUSTER", value_name = "ADDR")]
    cluster: Option<SocketAddr>,
    /// Without --cluster: the generation to issue (default 0). A
    /// generation below the tenant's minimum is refused by every
    /// metadata node.
    #[arg(long, conflicts_with = "cluster", value_name = "N")]
    generation: Option<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
}

/// Which key file a `strata store key` command works on.
#[derive(Args)]
pub struct KeyFileArg {
    /// The cluster's directory: its key file is DIR/cluster.key.
    #[arg(
        long,
        conflicts_with = "key",
        required_unless_present = "key",
        value_parser = crate::stdio::directory()
    )]
    dir: Option<PathBuf>,
    /// The key file itself (the files of a rotation are next to it).
    #[arg(long, value_name = "FILE", value_parser = crate::stdio::file(crate::stdio::KEY_WHY))]
    key: Option<PathBuf>,
}

impl KeyFileArg {
    fn path(&self) -> PathBuf {
        match (&self.key, &self.dir) {
            (Some(key), _) => key.clone(),
            (None, Some(dir)) => dir.join(KEY_FILE),
            // clap requires one of them.
            (None, None) => PathBuf::from(KEY_FILE),
        }
    }
}

/// `strata store key` subcommands.
#[derive(Subcommand)]
pub enum KeyCommand {
    /// Step 1 of a rotation: write a new random key to `cluster.key.next`
    /// (mode 0600) next to the key file. Copy it next to the key file of
    /// every host, then SIGHUP every node: they accept it, and still seal
    /// with the current key.
    New(KeyFileArg),
    /// Step 2, on every host once every node accepts the new key: the key
    /// file's key is copied to `cluster.key.prev` and `cluster.key.next`
    /// becomes the key file; then SIGHUP every node: they seal with the
    /// new key and still accept the old one. Step 3: remove
    /// `cluster.key.prev` on every host and SIGHUP every node.
    Swap(KeyFileArg),
    /// Print the fingerprints of the keyring a node would load from the
    /// key file (the active key, and the `.next` or `.prev` key it also
    /// accepts): compare them with what `strata store status` shows for
    /// every node before the next step of a rotation.
    Fingerprint(KeyFingerprintArgs),
}

/// `strata store key fingerprint` arguments.
#[derive(Args)]
pub struct KeyFingerprintArgs {
    #[command(flatten)]
    file: KeyFileArg,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
}

/// `strata store bench` arguments.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    #[command(flatten)]
    tenant: TenantArg,
    /// post, get (objects a post run made), or http (GET /PREFIX/<size>/<client>/<i>).
    #[arg(long, default_value = "post", value_parser = ["post", "get", "http"])]
    workload: String,
    /// HTTP server for --workload http.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 5)]
    threads: usize,
    /// Operations per client.
    #[arg(long, default_value_t = 100)]
    ops: usize,
    /// For get and http: read each client's objects this many times (runs
    /// long enough to measure when Posts are slow to make objects).
    #[arg(long, default_value_t = 1)]
    passes: usize,
    /// Object size (e.g. 2600, 306k, 2.3M).
    #[arg(long, default_value = "2600")]
    size: String,
    /// Objects are named PREFIX/<size>/<client>/<i>: a post run under a new
    /// prefix makes new objects instead of replacing the last run's.
    #[arg(long, default_value = "bench")]
    prefix: String,
    /// tasks: one task per client, each call as `strata obj` makes it;
    /// batched: zero-byte Gets only, every client driven from one thread
    /// and one socket with batched sends and receives (a generator that
    /// leaves the CPU to the server, as one on machines of its own would).
    #[arg(long, default_value = "tasks", value_parser = ["tasks", "batched"])]
    engine: String,
}

/// `strata store routes` arguments.
#[derive(Args)]
pub struct RoutesArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// The host's own address on the network the nodes share (its nodes
    /// registered with it as their `--listen` address).
    #[arg(long)]
    host: std::net::IpAddr,
    /// Print lines for `ip -6 -batch -` instead of whole commands.
    #[arg(long)]
    batch: bool,
    /// Install the routes on this host now (`ip -6 route`, needs
    /// CAP_NET_ADMIN) instead of printing them, e.g. on a client's host.
    #[arg(long, conflicts_with = "batch")]
    apply: bool,
}

/// Whether nodes leave the host's routes alone.
#[derive(Args)]
pub struct NoRoutesArg {
    /// In a routed cluster, do not install or change this host's routes
    /// (`ip -6 route`); the operator or a routing daemon keeps them, as
    /// `strata store routes` prints them.
    #[arg(long)]
    no_routes: bool,
}

/// Removes a node's registration at its exit (see [`register_added_node`]).
fn unregister(file: Option<PathBuf>) {
    if let Some(file) = file {
        let _ = std::fs::remove_file(file);
    }
}

/// `strata store up` arguments.
#[derive(Args)]
pub struct UpArgs {
    /// Directory holding every node's state (created if missing).
    #[arg(long, value_parser = crate::stdio::directory())]
    dir: PathBuf,
    /// The orchestrator's UDP endpoint.
    #[arg(long, default_value = "127.0.0.1:10890")]
    listen: SocketAddr,
    /// Metadata nodes.
    #[arg(long = "mn", default_value_t = 1)]
    mns: u16,
    /// Metadata slots of a new cluster, when more metadata nodes will join
    /// with `strata store node add --role mn` (default: --mn). A node added
    /// once every slot is taken gets a new slot and takes over a share of
    /// the metadata groups (their metadata is copied to it).
    #[arg(long)]
    mn_slots: Option<u16>,
    /// Storage nodes (more can join with `strata store node add`).
    #[arg(long = "sn", default_value_t = 1)]
    sns: u16,
    /// Short-failure timer: a node silent this long is marked down and left
    /// out of placement.
    #[arg(long, default_value_t = 3000)]
    short_failure_ms: u64,
    /// Definitive-failure timer: a node silent this long is marked dead. A
    /// dead storage node's replicas are re-created on other nodes; a dead
    /// metadata node's groups are restored on the other metadata nodes.
    #[arg(long, default_value_t = 600_000)]
    definitive_failure_ms: u64,
    /// Replication as N_m,W_m,N_d,W_d (a new cluster only).
    #[arg(long, default_value = "1,1,1,1")]
    replication: String,
    /// Per-bucket override, NAME=N_m,W_m,N_d,W_d (repeatable; the bucket of
    /// "a/b" is "a").
    #[arg(long = "bucket")]
    buckets: Vec<String>,
    /// Capacity each storage node declares (e.g. 100G).
    #[arg(long, default_value = "1T")]
    capacity: String,
    /// Device type of the storage nodes.
    #[arg(long, default_value = "ssd", value_parser = ["ssd", "hdd"])]
    device: String,
    /// Routed network mode (a new cluster only): clients and nodes send
    /// to object and metadata addresses themselves, and the network routes
    /// each node's prefix to it. Every node keeps its host's routes in step
    /// with the table (a local route for what the host owns, a route via
    /// the owner for the rest); clients' hosts need `strata store routes
    /// --host ADDR --apply`. Default: mapped mode, through the prefix table.
    #[arg(long)]
    routed: bool,
    #[command(flatten)]
    routes: NoRoutesArg,
    #[command(flatten)]
    gc: GcArgs,
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    sync: SyncArgs,
    /// log2 of the number of metadata groups (4 to 16).
    #[arg(long, default_value_t = 8)]
    mg_bits: u8,
    /// Default: DIR/cluster.key, made with a new random key if missing.
    #[command(flatten)]
    key: KeyArg,
}

/// Collection of replicas that no record names (a storage node back
/// from the dead, a Post whose client vanished).
#[derive(Args)]
pub struct GcArgs {
    /// Milliseconds between collection rounds on each storage node.
    #[arg(long, default_value_t = 600_000)]
    gc_interval_ms: u64,
    /// Replicas younger than this (ms) are never collected.
    #[arg(long, default_value_t = 600_000)]
    gc_grace_ms: u64,
}

/// Limits of the storage nodes' data ports.
#[derive(Args)]
pub struct DataArgs {
    /// Milliseconds a data connection may take to send a whole request
    /// header (idle ones included), and one read of a Put's data may wait;
    /// past it the connection is closed.
    #[arg(long, default_value_t = strata_store::sn::DATA_READ_TIMEOUT.as_millis() as u64)]
    data_timeout_ms: u64,
    /// Most data connections a storage node keeps open at once (more are
    /// closed as soon as accepted).
    #[arg(long, default_value_t = strata_store::sn::DATA_MAX_CONNECTIONS)]
    data_max_connections: usize,
}

impl DataArgs {
    fn limits(&self) -> strata_store::sn::DataLimits {
        strata_store::sn::DataLimits {
            read_timeout: std::time::Duration::from_millis(self.data_timeout_ms.max(1)),
            max_connections: self.data_max_connections.max(1),
        }
    }
}

/// Anti-entropy of metadata copies.
#[derive(Args)]
pub struct SyncArgs {
    /// Milliseconds between two anti-entropy passes of each metadata node
    /// over the metadata copies of the names it coordinates (0: none).
    #[arg(long, default_value_t = strata_store::mn::DEFAULT_SYNC_MS)]
    metadata_sync_ms: u64,
}

impl GcArgs {
    fn config(&self) -> strata_store::sn::GcConfig {
        strata_store::sn::GcConfig {
            interval: std::time::Duration::from_millis(self.gc_interval_ms.max(100)),
            grace: std::time::Duration::from_millis(self.gc_grace_ms),
        }
    }
}

/// `strata store node` subcommands.
#[derive(Subcommand)]
pub enum NodeCommand {
    /// Run a new node that joins a running cluster: a storage node, or a
    /// metadata node with `--role mn`. Serves until SIGTERM or SIGINT;
    /// placement uses it as soon as the table says so. A node whose key is
    /// the cluster.key of a `strata store up` directory is stopped by that
    /// cluster's shutdown too.
    Add {
        #[command(flatten)]
        cluster: ClusterArg,
        /// The node's directory.
        #[arg(long, value_parser = crate::stdio::directory())]
        dir: PathBuf,
        /// sn: a storage node (holds object data); mn: a metadata node
        /// (takes a free metadata slot, else a new slot and a share of the
        /// metadata groups, copied to it).
        #[arg(long, default_value = "sn", value_parser = ["sn", "mn"])]
        role: String,
        /// Endpoint the node listens on (port 0 picks a free one, shown
        /// on its readiness line).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Capacity a storage node declares.
        #[arg(long, default_value = "1T")]
        capacity: String,
        /// Device type of a storage node.
        #[arg(long, default_value = "ssd", value_parser = ["ssd", "hdd"])]
        device: String,
        #[command(flatten)]
        gc: GcArgs,
        /// Used by a storage node.
        #[command(flatten)]
        data: DataArgs,
        /// Used by a metadata node (`--role mn`).
        #[command(flatten)]
        sync: SyncArgs,
        #[command(flatten)]
        routes: NoRoutesArg,
        /// Default: DIR/cluster.key, else the cluster.key of DIR's parent
        /// (a node's directory inside the cluster's).
        #[command(flatten)]
        key: KeyArg,
    },
    /// Retire a storage node by its id (see `strata store status`): it
    /// takes no new object at once, its replicas are re-placed on other
    /// nodes, then it is marked retired and frees its space. Asking again
    /// is harmless. With `--cancel`, stop a removal that has not finished:
    /// the node is up again and takes new objects.
    Remove {
        #[command(flatten)]
        cluster: ClusterArg,
        /// Cancel the node's drain instead: it goes back to taking new
        /// objects and counting toward replication. Replicas already
        /// re-placed stay on their new nodes; the node's own copies that
        /// no record names any more are freed by its collection round. A
        /// node that is not being removed is left as it is (not an error);
        /// a retired node cannot come back (add it again as a new node).
        #[arg(long)]
        cancel: bool,
        #[command(flatten)]
        key: KeyArg,
        /// Node id (16 hex digits).
        id: String,
    },
}

/// `strata obj` subcommands.
#[derive(Subcommand)]
pub enum ObjCommand {
    /// Post a file (or standard input, `-`) as an object.
    Put {
        #[command(flatten)]
        cluster: ClusterArg,
        #[command(flatten)]
        tenant: TenantArg,
        /// Show a progress bar.
        #[arg(short = 'p')]
        progress: bool,
        /// File to upload (`-`: standard input).
        file: Input,
        /// Object name.
        name: String,
    },
    /// Get an object into a file (written whole, then renamed into place),
    /// or to standard output with `-`.
    Get {
        #[command(flatten)]
        cluster: ClusterArg,
        #[command(flatten)]
        tenant: TenantArg,
        /// Show a progress bar.
        #[arg(short = 'p')]
        progress: bool,
        /// Object name.
        name: String,
        /// Destination file (`-`: standard output).
        file: StdOutput,
    },
    /// Delete an object.
    Rm {
        #[command(flatten)]
        cluster: ClusterArg,
        #[command(flatten)]
        tenant: TenantArg,
        /// Object name.
        name: String,
    },
    /// Rename an object (metadata only).
    Mv {
        #[command(flatten)]
        cluster: ClusterArg,
        #[command(flatten)]
        tenant: TenantArg,
        /// Current name.
        from: String,
        /// New name (must not exist).
        to: String,
    },
    /// Show an object's metadata.
    Stat {
        #[command(flatten)]
        cluster: ClusterArg,
        #[command(flatten)]
        tenant: TenantArg,
        /// Object name.
        name: String,
    },
    /// List objects by name prefix, one page at a time.
    Ls {
        #[command(flatten)]
        cluster: ClusterArg,
        #[command(flatten)]
        tenant: TenantArg,
        /// Name prefix.
        #[arg(default_value = "")]
        prefix: String,
        /// Names per page (1 to 1000).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// Start after this name (the cursor a previous page printed).
        #[arg(long, default_value = "")]
        after: String,
        /// Follow cursors until the end.
        #[arg(long)]
        all: bool,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")
}

fn parse_params(s: &str) -> Result<Params> {
    let v: Vec<u8> = s
        .split(',')
        .map(|x| x.trim().parse::<u8>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("invalid replication '{s}': expected N_m,W_m,N_d,W_d"))?;
    let [n_m, w_m, n_d, w_d] = v[..] else {
        bail!("invalid replication '{s}': expected four numbers N_m,W_m,N_d,W_d");
    };
    let p = Params { n_m, w_m, n_d, w_d };
    p.validate().map_err(anyhow::Error::msg)?;
    Ok(p)
}

fn device(s: &str) -> Device {
    if s == "hdd" {
        Device::Hdd
    } else {
        Device::Ssd
    }
}

/// Runs a `strata store` subcommand.
pub fn run_store(cmd: StoreCommand) -> Result<i32> {
    crate::serve::init_logging();
    match cmd {
        StoreCommand::Up(args) => up(args),
        StoreCommand::Status(c) => status(&c),
        StoreCommand::Routes(args) => routes(&args),
        StoreCommand::Node { command } => node(command),
        StoreCommand::Bench(args) => bench(args),
        StoreCommand::Key { command } => key_command(command),
        StoreCommand::Tenant {
            command: TenantCommand::Add(args),
        } => tenant_add(args),
        StoreCommand::Tenant {
            command: TenantCommand::Revoke(args),
        } => tenant_revoke(args),
    }
}

/// `strata store tenant revoke`: asks the orchestrator to raise the
/// tenant's minimum generation to one above the one its table shows.
fn tenant_revoke(args: TenantRevokeArgs) -> Result<i32> {
    strata_store::tenant::check_tenant_id(&args.tenant).map_err(anyhow::Error::msg)?;
    if args.tenant == ADMIN {
        bail!(
            "the admin tenant '{ADMIN}' cannot be revoked alone (`strata store up` issues its \
             credential again at every start): rotate the cluster key instead"
        );
    }
    let key = args.key.load(&[])?;
    let on = args.cluster.cluster;
    let (before, min) = runtime()?.block_on(async {
        let table = strata_store::node::fetch_table(on, Some(&key)).await?;
        let before = table.min_generation(&args.tenant);
        let below = before.checked_add(1).with_context(|| {
            format!(
                "tenant '{}' is at the last generation ({before}): rotate the cluster key",
                args.tenant
            )
        })?;
        let body = Body::RevokeTenant {
            tenant: args.tenant.clone(),
            below,
        };
        let answer = ask_orchestrator_for(on, &key, body).await?;
        match answer {
            Body::Done { version } => anyhow::Ok((before, version)),
            other => bail!("the orchestrator answered {other:?} to a tenant revocation"),
        }
    })?;
    let bound_ms = strata_store::node::REVOCATION_BOUND.as_millis();
    match args.cluster.output {
        Output::Json => println!(
            "{}",
            json!({
                "tenant": args.tenant,
                "revoked_below": min,
                "previous_min_generation": before,
                "takes_effect_within_ms": bound_ms,
            })
        ),
        Output::Human => println!(
            "revoked tenant '{}''s credentials of generations below {min}: metadata nodes \
             refuse them within {bound_ms} ms (their next table refresh; a node that cannot \
             reach the orchestrator keeps its last table until it can); issue a new one with \
             `strata store tenant add --cluster {on} --tenant {}`",
            args.tenant, args.tenant
        ),
    }
    Ok(0)
}

fn tenant_add(args: TenantAddArgs) -> Result<i32> {
    let key_path = args.file.path();
    let key = ClusterKey::load(&key_path)?;
    strata_store::tenant::check_tenant_id(&args.tenant).map_err(anyhow::Error::msg)?;
    let generation = match args.cluster {
        // The table sealed with the key: a forged one cannot make this
        // issue a revoked generation.
        Some(on) => runtime()?
            .block_on(strata_store::node::fetch_table(on, Some(&key)))
            .with_context(|| {
                format!("could not ask the orchestrator at {on} for the tenant's generation")
            })?
            .min_generation(&args.tenant),
        None => args.generation.unwrap_or(0),
    };
    let cred = TenantCredential::issue_generation(&key, &args.tenant, generation)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| StdOutput::File(default_credential_path(&args.tenant, &key_path)));
    let out = match out {
        StdOutput::File(path) => path,
        StdOutput::Stdout => {
            // Standard output carries the credential alone; the report
            // goes to standard error.
            print!("{}", cred.to_file_text());
            std::io::stdout().flush()?;
            let scope = describe_scope(&args.tenant);
            match args.output {
                Output::Json => eprintln!(
                    "{}",
                    json!({"tenant": args.tenant, "scope": scope, "credential": "-",
                           "generation": generation})
                ),
                Output::Human => eprintln!(
                    "strata: wrote tenant '{}''s credential (generation {generation}) to \
                     standard output ({scope}): keep it as secret as the cluster key",
                    args.tenant
                ),
            }
            return Ok(0);
        }
    };
    cred.save(&out)?;
    let scope = describe_scope(&args.tenant);
    match args.output {
        Output::Json => println!(
            "{}",
            json!({"tenant": args.tenant, "scope": scope, "credential": out,
                   "generation": generation})
        ),
        Output::Human => println!(
            "wrote tenant '{}''s credential (generation {generation}) to {} ({scope}): give it \
             to the tenant, who runs `strata obj --credential FILE ...` (or sets \
             {CREDENTIAL_ENV}=FILE){}",
            args.tenant,
            out.display(),
            if args.cluster.is_none() {
                "; issued without asking the orchestrator (no --cluster): if this tenant was \
                 revoked, this generation may be refused"
            } else {
                ""
            }
        ),
    }
    Ok(0)
}

fn key_command(cmd: KeyCommand) -> Result<i32> {
    match cmd {
        KeyCommand::New(arg) => {
            let path = arg.path();
            let next = sibling(&path, NEXT_SUFFIX);
            ClusterKey::create(&next)?;
            println!(
                "wrote a new cluster key to {}: copy it next to the key file of every host \
                 (mode 0600), SIGHUP every node, then run `strata store key swap`",
                next.display()
            );
            Ok(0)
        }
        KeyCommand::Swap(arg) => {
            let path = arg.path();
            swap_keys(&path)?;
            println!(
                "{} now holds the new key and {} the old one: SIGHUP every node; once \
                 every host has swapped, remove {} on every host and SIGHUP every node again",
                path.display(),
                sibling(&path, PREV_SUFFIX).display(),
                sibling(&path, PREV_SUFFIX).display()
            );
            Ok(0)
        }
        KeyCommand::Fingerprint(args) => {
            let prints = ClusterKey::load(&args.file.path())?.fingerprints();
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&prints_json(prints))?),
                Output::Human => {
                    println!("active {}", fmt_fingerprint(prints.active));
                    if let Some(o) = prints.other {
                        println!("also accepted {}", fmt_fingerprint(o));
                    }
                }
            }
            Ok(0)
        }
    }
}

/// A keyring's fingerprints in JSON: `{"active": hex, "other": hex or null}`.
fn prints_json(k: Fingerprints) -> serde_json::Value {
    json!({
        "active": fmt_fingerprint(k.active),
        "other": k.other.map(fmt_fingerprint),
    })
}

/// The fingerprints node `uuid` reported, as shown: `active[+other]`, or
/// `?` if it has not reported any (yet, or it runs an older build).
fn node_keys(t: &Table, uuid: u64) -> String {
    t.keys_of(uuid)
        .map_or_else(|| "?".to_string(), |k| k.to_string())
}

/// Makes `path.next` the key file and the key file's key `path.prev`. The
/// key file exists at every moment (a node restarted meanwhile starts with
/// the old key or the new one, both accepted by every node), and each file
/// is checked before anything changes.
fn swap_keys(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let next = sibling(path, NEXT_SUFFIX);
    let prev = sibling(path, PREV_SUFFIX);
    if !next.exists() {
        bail!(
            "there is no {} to swap in: make it with `strata store key new` (and copy it \
             to every host) first",
            next.display()
        );
    }
    // Both files hold valid keys, and no third key lies around.
    ClusterKey::load(path)?;
    ClusterKey::load(&next)?;
    let old = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let tmp = sibling(&prev, ".tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(&old)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &prev)
        .with_context(|| format!("renaming {} to {}", tmp.display(), prev.display()))?;
    std::fs::rename(&next, path)
        .with_context(|| format!("renaming {} to {}", next.display(), path.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Re-reads the cluster key files on every SIGHUP, for every node holding
/// a clone of `key` (see [`ClusterKey::reload`]); an error keeps the keys
/// in use and is printed.
/// With `admin_credential`, the admin tenant's credential is issued again
/// there after each reload (it follows the active key).
fn reload_on_hangup(key: ClusterKey, admin_credential: Option<PathBuf>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("could not install the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let from = key
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            match key.reload() {
                Ok(n) => {
                    eprintln!(
                        "strata store: reloaded the cluster key {from} ({n} key{} accepted)",
                        if n == 1 { "" } else { "s" }
                    );
                    if let Some(path) = &admin_credential {
                        let issued =
                            TenantCredential::issue(&key, ADMIN).and_then(|c| c.save(path));
                        if let Err(e) = issued {
                            eprintln!(
                                "strata store: could not issue the admin credential again: {e}"
                            );
                        }
                    }
                }
                Err(e) => eprintln!(
                    "strata store: could not reload the cluster key, keeping the keys in use: {e}"
                ),
            }
        }
    });
    Ok(())
}

fn up(args: UpArgs) -> Result<i32> {
    let mut cfg = ClusterConfig::embedded(args.dir.clone());
    cfg.listen = args.listen;
    cfg.mns = args.mns;
    cfg.sns = args.sns;
    cfg.mn_slots = args.mn_slots.unwrap_or(args.mns);
    cfg.short_failure_ms = args.short_failure_ms;
    if args.definitive_failure_ms <= args.short_failure_ms {
        anyhow::bail!(
            "--definitive-failure-ms ({}) must be longer than --short-failure-ms ({})",
            args.definitive_failure_ms,
            args.short_failure_ms
        );
    }
    cfg.definitive_failure_ms = args.definitive_failure_ms;
    cfg.params = parse_params(&args.replication)?;
    for b in &args.buckets {
        let (name, p) = b
            .split_once('=')
            .with_context(|| format!("invalid --bucket '{b}': expected NAME=N_m,W_m,N_d,W_d"))?;
        cfg.buckets.push((name.to_string(), parse_params(p)?));
    }
    cfg.sn_capacity = parse_size(&args.capacity).map_err(anyhow::Error::msg)?;
    cfg.device = device(&args.device);
    cfg.mg_bits = args.mg_bits;
    cfg.routed = args.routed;
    cfg.keep_routes = !args.routes.no_routes;
    cfg.gc = args.gc.config();
    cfg.data_limits = args.data.limits();
    cfg.metadata_sync_ms = args.sync.metadata_sync_ms;
    cfg.key = args.key.path.clone();
    runtime()?.block_on(async {
        let cluster = Cluster::start(cfg)
            .await
            .with_context(|| format!("could not start the cluster in '{}'", args.dir.display()))?;
        // The operator's credential, issued again at every start (and on
        // every reload), so it follows a key rotation.
        let admin = args.dir.join(ADMIN_CREDENTIAL_FILE);
        TenantCredential::issue(&cluster.key, ADMIN)?.save(&admin)?;
        reload_on_hangup(cluster.key.clone(), Some(admin))?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "strata store: ready on {} ({} metadata node{}, {} storage node{})",
            cluster.on,
            cluster.mns.len(),
            if cluster.mns.len() == 1 { "" } else { "s" },
            cluster.sns.len(),
            if cluster.sns.len() == 1 { "" } else { "s" },
        )?;
        out.flush()?;
        drop(out);
        crate::serve::wait_for_signal().await;
        stop_added_nodes(&args.dir, cluster.on).await;
        drop(cluster);
        anyhow::Ok(0)
    })
}

/// Where `strata store node add` processes whose key is the cluster
/// key of a `strata store up` directory register, so that its shutdown
/// stops them too: one file per process, named by its pid.
const ADDED_NODES_DIR: &str = "added-nodes";

/// How long `strata store up` waits for the added nodes it stopped.
const ADDED_NODES_STOP: std::time::Duration = std::time::Duration::from_secs(10);

/// A node process's registration: the orchestrator it joined and its
/// start time (so a pid reused by another process is never signalled).
fn registration_text(on: SocketAddr, start: u64) -> String {
    format!("{on} {start}\n")
}

/// The start time of process `pid` (clock ticks since boot, field 22 of
/// /proc/PID/stat) and whether it is still running (not a zombie).
fn process_start(pid: i32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let running = fields
        .first()
        .is_some_and(|state| *state != "Z" && *state != "X");
    Some((fields.get(19)?.parse().ok()?, running))
}

/// Registers this `node add` process in the `strata store up` directory
/// that holds its key file (a directory with the admin credential), so
/// that the cluster's shutdown stops it. Returns the file to remove at
/// exit; none when the key is not in such a directory (a copied key on
/// another host: that node outlives the cluster, and is stopped by its
/// own signal).
fn register_added_node(key: &ClusterKey, on: SocketAddr) -> Option<PathBuf> {
    let dir = key.path()?.parent()?;
    if !dir.join(ADMIN_CREDENTIAL_FILE).exists() {
        return None;
    }
    let pid = std::process::id();
    let (start, _) = process_start(pid as i32)?;
    let nodes = dir.join(ADDED_NODES_DIR);
    let file = nodes.join(pid.to_string());
    let written = std::fs::create_dir_all(&nodes)
        .and_then(|()| std::fs::write(&file, registration_text(on, start)));
    match written {
        Ok(()) => Some(file),
        Err(e) => {
            eprintln!(
                "strata store: could not register in {} ({e}): `strata store up` will not \
                 stop this node at its shutdown; stop it with SIGTERM",
                nodes.display()
            );
            None
        }
    }
}

/// At `strata store up`'s shutdown: SIGTERM every `node add` process
/// registered in DIR for this orchestrator, and wait (bounded) until they
/// are gone, so no node of the cluster outlives it.
async fn stop_added_nodes(dir: &std::path::Path, on: SocketAddr) {
    let nodes = dir.join(ADDED_NODES_DIR);
    let Ok(entries) = std::fs::read_dir(&nodes) else {
        return;
    };
    let mut stopping = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let pid: Option<i32> = entry.file_name().to_str().and_then(|n| n.parse().ok());
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let Some(pid) = pid else { continue };
        let Some((start, true)) = process_start(pid) else {
            continue;
        };
        if text != registration_text(on, start) {
            continue;
        }
        // SAFETY: kill(2) on a pid checked to be the registered process.
        if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
            stopping.push((pid, start));
        }
    }
    let deadline = tokio::time::Instant::now() + ADDED_NODES_STOP;
    let alive = |&(pid, start): &(i32, u64)| process_start(pid) == Some((start, true));
    while stopping.iter().any(alive) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let left = stopping.iter().filter(|p| alive(p)).count();
    if left > 0 {
        eprintln!(
            "strata store: {left} added node(s) did not stop within {} s of SIGTERM",
            ADDED_NODES_STOP.as_secs()
        );
    }
}

fn bench(args: BenchArgs) -> Result<i32> {
    use strata_store::bench::{run, run_batched_gets, BenchConfig, Workload};
    let size = parse_size(&args.size).map_err(anyhow::Error::msg)?;
    let workload = match (args.workload.as_str(), args.http) {
        ("post", _) => Workload::Post,
        ("get", _) => Workload::Get,
        (_, Some(server)) => Workload::HttpGet(server),
        (_, None) => bail!("--workload http needs --http ADDR"),
    };
    let cfg = BenchConfig {
        threads: args.threads.max(1),
        ops: args.ops.max(1),
        passes: args.passes.max(1),
        size,
        prefix: args.prefix.clone(),
        workload,
    };
    let batched = args.engine == "batched";
    if batched && !matches!(cfg.workload, Workload::Get) {
        bail!("--engine batched runs --workload get only");
    }
    let r = runtime()?.block_on(async {
        let credential = args.tenant.load()?;
        let client = std::sync::Arc::new(Client::connect(args.cluster.cluster, credential).await?);
        if batched {
            let table = client.table();
            let credential = client.credential().clone();
            return anyhow::Ok(tokio::task::block_in_place(|| {
                run_batched_gets(&table, &credential, &cfg)
            })?);
        }
        anyhow::Ok(run(client, cfg).await?)
    })?;
    let secs = r.elapsed.as_secs_f64();
    let v = json!({
        "workload": args.workload,
        "threads": args.threads,
        "size": size,
        "ops": r.ops,
        "errors": r.errors,
        "seconds": secs,
        "ops_per_s": r.ops as f64 / secs,
        "mb_per_s": r.bytes as f64 / secs / 1e6,
        "p50_ms": r.p50.as_secs_f64() * 1e3,
        "p99_ms": r.p99.as_secs_f64() * 1e3,
    });
    if args.cluster.output == Output::Json {
        println!("{v}");
    } else {
        println!(
            "{} x{} {}: {} ops ({} errors) in {secs:.2} s, {:.0} ops/s, {:.1} MB/s, p50 {:.2} ms, p99 {:.2} ms",
            args.workload,
            args.threads,
            human(size),
            r.ops,
            r.errors,
            r.ops as f64 / secs,
            r.bytes as f64 / secs / 1e6,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3
        );
    }
    Ok(if r.errors > 0 { 1 } else { 0 })
}

fn status(c: &ClusterArg) -> Result<i32> {
    let table = runtime()?
        .block_on(strata_store::node::fetch_table(c.cluster, None))
        .with_context(|| format!("no orchestrator answered at {}", c.cluster))?;
    match c.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&table_json(&table))?),
        Output::Human => print_table(&table),
    }
    Ok(0)
}

fn routes(args: &RoutesArgs) -> Result<i32> {
    let c = &args.cluster;
    let table = runtime()?
        .block_on(strata_store::node::fetch_table(c.cluster, None))
        .with_context(|| format!("no orchestrator answered at {}", c.cluster))?;
    if !table.routed {
        bail!(
            "the cluster at {} runs in mapped mode: it needs no routes",
            c.cluster
        );
    }
    if args.apply {
        // One-shot: the host's routes now (nodes keep theirs themselves).
        let n = strata_store::routes::RouteKeeper::new()
            .sync(&table, args.host)
            .context("could not install the routes")?;
        match c.output {
            Output::Json => println!("{}", json!({"installed": n})),
            Output::Human => println!("{n} routes installed for host {}", args.host),
        }
        return Ok(0);
    }
    let routes = strata_store::routes::host_routes(&table, args.host);
    if c.output == Output::Json {
        let list: Vec<_> = routes
            .iter()
            .map(|r| match r.via {
                Some(v) => json!({"prefix": r.prefix, "via": v.to_string()}),
                None => json!({"prefix": r.prefix, "local": true}),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let lead = if args.batch { "" } else { "ip -6 " };
    for r in &routes {
        println!("{lead}{}", r.install_line());
    }
    Ok(0)
}

fn table_json(t: &Table) -> serde_json::Value {
    let params = |p: &Params| json!({"n_m": p.n_m, "w_m": p.w_m, "n_d": p.n_d, "w_d": p.w_d});
    json!({
        "epoch": t.epoch,
        "cluster_prefix": format!("{}/48", strata_store::addr::fmt_addr(t.layout.cluster)),
        "metadata_groups": t.layout.mg_count(),
        "network_mode": if t.routed { "routed" } else { "mapped" },
        "replication": params(&t.params),
        "buckets": t.buckets.iter().map(|(b, p)| json!({"bucket": b, "replication": params(p)})).collect::<Vec<_>>(),
        "orchestrator_key": t.on_keys.map(prints_json),
        // Tenants with a revoked credential generation (listed by hash).
        "revoked_tenants": t.revoked.len(),
        "metadata_nodes": t.mns.iter().map(|m| json!({
            "id": format!("{:016x}", m.uuid),
            "key": t.keys_of(m.uuid).map(prints_json),
            "slot": m.slot,
            "endpoint": m.endpoint.to_string(),
            "state": m.state.name(),
            "groups": t.groups_of(m.slot),
            "groups_incoming": t.moves.iter().filter(|mv| mv.to == m.slot).count(),
            "group_prefixes": t.mg_owner.iter().enumerate().filter(|(_, &s)| s == m.slot).map(|(mg, _)| {
                let (prefix, len) = t.layout.mg_prefix(mg as u32);
                format!("{}/{len}", strata_store::addr::fmt_addr(prefix))
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "moves": t.moves.iter().map(|mv| json!({
            "group": mv.group,
            "from_slot": if mv.phase == strata_store::table::MovePhase::Restoring {
                // The previous owner is dead; the table names the new one.
                None
            } else {
                t.mg_owner.get(mv.group as usize)
            },
            "to_slot": mv.to,
            "phase": move_phase(mv.phase),
            // The down node the group goes back to, if it stands in for one.
            "home_slot": t.home_of(mv.group),
        })).collect::<Vec<_>>(),
        "stand_ins": t.stand_ins.iter().map(|s| json!({
            "group": s.group,
            "slot": t.mg_owner.get(s.group as usize),
            "home_slot": s.home,
        })).collect::<Vec<_>>(),
        "storage_nodes": t.sns.iter().map(|s| json!({
            "id": format!("{:016x}", s.uuid),
            "key": t.keys_of(s.uuid).map(prints_json),
            "prefix": format!("{}/64", strata_store::addr::fmt_addr(t.layout.sn_prefix(s.index))),
            "endpoint": s.endpoint.to_string(),
            "state": sn_state(t, s),
            "device": s.device.name(),
            "capacity": s.capacity,
            "free": s.free,
            "replicas": s.objects,
            "drain": t.drain_of(s.index).map(|d| json!({
                "replicas_left": d.left,
                "metadata_copies_left": d.copies,
                "unplaceable": d.unplaceable,
                "unreported_metadata_nodes": d.unreported,
                "waiting": drain_waiting(d),
            })),
        })).collect::<Vec<_>>(),
    })
}

/// A storage node's state as shown: "retiring" while it is drained and up
/// (a drained node that is down or dead shows that, as it matters more).
fn sn_state(t: &Table, s: &strata_store::table::SnEntry) -> &'static str {
    if t.retiring(s.index) && s.state == strata_store::table::State::Up {
        "retiring"
    } else {
        s.state.name()
    }
}

/// Why a drain is not progressing, if it is waiting for something.
fn drain_waiting(d: &strata_store::table::Drain) -> Option<String> {
    if d.unplaceable > 0 {
        Some(format!(
            "{} objects have no other storage node up with room for a new replica: add storage nodes or free space",
            d.unplaceable
        ))
    } else if d.unreported > 0 {
        Some(format!(
            "{} metadata nodes have not reported yet (they report after each scan; a down one holds the drain)",
            d.unreported
        ))
    } else {
        None
    }
}

fn move_phase(p: strata_store::table::MovePhase) -> &'static str {
    use strata_store::table::MovePhase;
    match p {
        MovePhase::Copying => "copying",
        MovePhase::Copied => "copied",
        MovePhase::Frozen => "frozen",
        MovePhase::Restoring => "restoring",
    }
}

fn print_table(t: &Table) {
    let p = t.params;
    println!(
        "cluster {}/48, {} metadata groups, replication N_m={} W_m={} N_d={} W_d={}",
        strata_store::addr::fmt_addr(t.layout.cluster),
        t.layout.mg_count(),
        p.n_m,
        p.w_m,
        p.n_d,
        p.w_d
    );
    if let Some(k) = t.on_keys {
        println!("orchestrator key {k}");
    }
    for (b, p) in &t.buckets {
        println!(
            "bucket {b}: N_m={} W_m={} N_d={} W_d={}",
            p.n_m, p.w_m, p.n_d, p.w_d
        );
    }
    for m in &t.mns {
        let groups = t.groups_of(m.slot);
        let incoming = t.moves.iter().filter(|mv| mv.to == m.slot).count();
        let incoming = if incoming > 0 {
            format!(", {incoming} being handed over to it or restored on it")
        } else {
            String::new()
        };
        println!(
            "mn {:016x}  {:<22} {:<7} slot {} {groups} groups{incoming}  key {}",
            m.uuid,
            m.endpoint,
            m.state.name(),
            m.slot,
            node_keys(t, m.uuid)
        );
    }
    if !t.moves.is_empty() {
        let count = |p| t.moves.iter().filter(|mv| mv.phase == p).count();
        use strata_store::table::MovePhase;
        println!(
            "handover of {} metadata groups under way: {} copying, {} copied, {} frozen, {} restoring (owner dead)",
            t.moves.len(),
            count(MovePhase::Copying),
            count(MovePhase::Copied),
            count(MovePhase::Frozen),
            count(MovePhase::Restoring)
        );
    }
    if !t.stand_ins.is_empty() {
        let mut homes: Vec<u16> = t.stand_ins.iter().map(|s| s.home).collect();
        homes.sort_unstable();
        homes.dedup();
        for h in homes {
            let n = t.stand_ins.iter().filter(|s| s.home == h).count();
            println!("{n} metadata groups of slot {h} stand in on other nodes until it is back");
        }
    }
    for s in &t.sns {
        println!(
            "sn {:016x}  {:<22} {:<8} {} {}/64  {} free of {}, {} replicas  key {}",
            s.uuid,
            s.endpoint,
            sn_state(t, s),
            s.device.name(),
            strata_store::addr::fmt_addr(t.layout.sn_prefix(s.index)),
            human(s.free),
            human(s.capacity),
            s.objects,
            node_keys(t, s.uuid)
        );
        if let Some(d) = t.drain_of(s.index) {
            let waiting = drain_waiting(d)
                .map(|w| format!("; waiting: {w}"))
                .unwrap_or_default();
            println!(
                "   draining: {} replicas left to re-place, {} metadata copies left to update{waiting}",
                d.left, d.copies
            );
        }
    }
}

fn node(cmd: NodeCommand) -> Result<i32> {
    match cmd {
        NodeCommand::Add {
            cluster,
            dir,
            role,
            listen,
            capacity,
            device: dev,
            gc,
            data,
            sync,
            routes,
            key,
        } => {
            let parent = dir.parent().map(|d| d.join(KEY_FILE));
            let defaults: Vec<PathBuf> =
                std::iter::once(dir.join(KEY_FILE)).chain(parent).collect();
            let key = key.load(&defaults)?;
            let keep_routes = !routes.no_routes;
            let capacity = parse_size(&capacity).map_err(anyhow::Error::msg)?;
            runtime()?.block_on(async {
                reload_on_hangup(key.clone(), None)?;
                if role == "mn" {
                    let mn = strata_store::node::start_mn(
                        &dir,
                        listen,
                        cluster.cluster,
                        keep_routes,
                        &key,
                        sync.metadata_sync_ms,
                    )
                    .await
                    .context("could not add the metadata node")?;
                    let registered = register_added_node(&key, cluster.cluster);
                    println!(
                        "strata store: metadata node slot {} on {}",
                        mn.slot, mn.endpoint
                    );
                    std::io::stdout().flush()?;
                    crate::serve::wait_for_signal().await;
                    unregister(registered);
                    return anyhow::Ok(0);
                }
                let mut sn = strata_store::node::start_sn(
                    &dir,
                    listen,
                    cluster.cluster,
                    capacity,
                    device(&dev),
                    gc.config(),
                    data.limits(),
                    keep_routes,
                    &key,
                )
                .await
                .context("could not add the storage node")?;
                let registered = register_added_node(&key, cluster.cluster);
                println!(
                    "strata store: storage node {:016x} (prefix index {}) on {}",
                    sn.uuid, sn.index, sn.endpoint
                );
                std::io::stdout().flush()?;
                tokio::select! {
                    _ = crate::serve::wait_for_signal() => {}
                    _ = sn.retired() => eprintln!(
                        "strata store: storage node {:016x} retired (its replicas were \
                         re-placed and freed); exiting",
                        sn.uuid
                    ),
                }
                unregister(registered);
                anyhow::Ok(0)
            })
        }
        NodeCommand::Remove {
            cluster,
            cancel: true,
            key,
            id,
        } => cancel_removal(&cluster, &key.load(&[])?, &id),
        NodeCommand::Remove {
            cluster,
            cancel: false,
            key,
            id,
        } => {
            let uuid = parse_node_id(&id)?;
            let key = key.load(&[])?;
            let table = runtime()?.block_on(async {
                ask_orchestrator(cluster.cluster, &key, Body::Retire { uuid }).await?;
                let t = strata_store::node::fetch_table(cluster.cluster, Some(&key)).await?;
                anyhow::Ok(t)
            })?;
            // Accepted: the node is drained, then retired (or was already).
            let drain = table
                .sns
                .iter()
                .find(|s| s.uuid == uuid)
                .and_then(|s| table.drain_of(s.index));
            match (cluster.output, drain) {
                (Output::Json, Some(d)) => println!(
                    "{}",
                    json!({"id": id, "state": "retiring", "replicas_left": d.left})
                ),
                (Output::Json, None) => println!("{}", json!({"id": id, "state": "retired"})),
                (Output::Human, Some(d)) => println!(
                    "retiring {id}: its {} replicas are being re-placed on other nodes; \
                     `strata store status` shows the progress",
                    d.left
                ),
                (Output::Human, None) => println!("retired {id}"),
            }
            Ok(0)
        }
    }
}

/// Sends one control request, sealed with the cluster `key`, to the
/// orchestrator at `cluster` (resent on loss) and fails unless it is
/// accepted.
async fn ask_orchestrator(
    cluster: std::net::SocketAddr,
    key: &ClusterKey,
    body: Body,
) -> Result<()> {
    ask_orchestrator_for(cluster, key, body).await?;
    Ok(())
}

/// [`ask_orchestrator`], returning the answer's body.
async fn ask_orchestrator_for(
    cluster: std::net::SocketAddr,
    key: &ClusterKey,
    body: Body,
) -> Result<Body> {
    let msg = Msg::new(strata_store::node::request_id(), 0, body);
    let timeout = std::time::Duration::from_millis(500);
    let reply = strata_store::node::udp_call(cluster, &msg, timeout, 4, Some(key)).await?;
    Ok(strata_store::node::ok_body(reply)?)
}

/// A node id as `strata store status` shows it: 16 hex digits.
fn parse_node_id(id: &str) -> Result<u64> {
    u64::from_str_radix(id, 16)
        .with_context(|| format!("invalid node id '{id}': expected 16 hex digits"))
}

/// `strata store node remove --cancel ID`: asks the orchestrator to cancel
/// the node's drain, then prints its state from a fresh table.
fn cancel_removal(cluster: &ClusterArg, key: &ClusterKey, id: &str) -> Result<i32> {
    let uuid = parse_node_id(id)?;
    let (before, after) = runtime()?.block_on(async {
        // Whether it was being drained decides what to print: the answer
        // is the same either way (a resent request must not fail).
        let before = strata_store::node::fetch_table(cluster.cluster, Some(key)).await?;
        ask_orchestrator(cluster.cluster, key, Body::CancelRetire { uuid }).await?;
        let after = strata_store::node::fetch_table(cluster.cluster, Some(key)).await?;
        anyhow::Ok((before, after))
    })?;
    let was_draining = before
        .sns
        .iter()
        .any(|s| s.uuid == uuid && before.retiring(s.index));
    let state = after
        .sns
        .iter()
        .find(|s| s.uuid == uuid)
        .map_or("unknown", |s| sn_state(&after, s));
    match cluster.output {
        Output::Json => println!(
            "{}",
            json!({"id": id, "state": state, "cancelled": was_draining})
        ),
        Output::Human if was_draining => {
            let takes = if state == "up" {
                "it is up and takes new objects again".to_string()
            } else {
                format!("it is {state}, and takes new objects again once it is up")
            };
            println!(
                "cancelled the removal of {id}: {takes}; replicas already re-placed \
                 stay on their new nodes"
            )
        }
        Output::Human => println!("{id} is not being removed ({state}): nothing to cancel"),
    }
    Ok(0)
}

/// Runs a `strata obj` subcommand.
pub fn run_obj(cmd: ObjCommand) -> Result<i32> {
    crate::serve::init_logging();
    runtime()?.block_on(obj(cmd))
}

async fn connect(c: &ClusterArg, tenant: &TenantArg) -> Result<Client> {
    let credential = tenant.load()?;
    Ok(Client::connect(c.cluster, credential).await?)
}

fn record_json(r: &strata_store::wire::Record) -> serde_json::Value {
    json!({
        "name": r.name,
        "size": r.size,
        "crc32c": format!("{:08x}", r.crc),
        "version": r.version,
        "metadata_addresses": r.meta.iter().map(|&a| strata_store::addr::fmt_addr(a)).collect::<Vec<_>>(),
        "replicas": r.replicas.iter().map(|&a| strata_store::addr::fmt_addr(a)).collect::<Vec<_>>(),
        "rename": match &r.rename {
            None => serde_json::Value::Null,
            Some(RenameLink::To(n)) => json!({"to": n}),
            Some(RenameLink::From(n)) => json!({"from": n}),
        },
    })
}

async fn obj(cmd: ObjCommand) -> Result<i32> {
    match cmd {
        ObjCommand::Put {
            cluster,
            tenant,
            progress,
            file,
            name,
        } => {
            if file == Input::Stdin && tenant.credential == Some(Input::Stdin) {
                bail!(
                    "obj put: the object's data and --credential both read standard input \
                     ('-'): give the credential as a file (or in {CREDENTIAL_ENV})"
                );
            }
            let client = connect(&cluster, &tenant).await?;
            let mut f = open_source(&file).await?;
            let size = f.metadata().await?.len();
            let bar = progress_bar(progress, size);
            let r = client
                .put(&name, size, &mut f, &|done| bar.set_position(done))
                .await
                .with_context(|| format!("could not post '{name}'"))?;
            bar.finish_and_clear();
            if cluster.output == Output::Json {
                println!(
                    "{}",
                    json!({"name": name, "size": size, "version": r.version, "crc32c": format!("{:08x}", r.crc), "copies": r.copies})
                );
            } else {
                println!(
                    "posted {name}: {} version {} crc32c {:08x}, {} cop{}",
                    human(size),
                    r.version,
                    r.crc,
                    r.copies,
                    if r.copies == 1 { "y" } else { "ies" }
                );
            }
        }
        ObjCommand::Get {
            cluster,
            tenant,
            progress,
            name,
            file,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let tmp = match &file {
                StdOutput::Stdout => None,
                StdOutput::File(path) => Some(tmp_path(path)),
            };
            let mut f = match &tmp {
                None => tokio::fs::File::from_std(spool_file()?),
                Some(tmp) => tokio::fs::File::create(tmp)
                    .await
                    .with_context(|| format!("could not create '{}'", tmp.display()))?,
            };
            let bar = progress_bar(progress, 0);
            let got = client
                .get(&name, &mut f, &|done| bar.set_position(done))
                .await;
            bar.finish_and_clear();
            let record = match got {
                Ok(r) => r,
                Err(e) => {
                    if let Some(tmp) = &tmp {
                        let _ = std::fs::remove_file(tmp);
                    }
                    return Err(anyhow::Error::new(e).context(format!("could not get '{name}'")));
                }
            };
            f.set_len(record.size).await?;
            let (Some(tmp), StdOutput::File(file)) = (tmp, &file) else {
                // The data goes to stdout, so the record goes nowhere: a
                // pipe is for the object's bytes only.
                let mut spool = f.into_std().await;
                std::io::Seek::rewind(&mut spool)?;
                stdio::copy_to_stdout(&mut spool)
                    .with_context(|| format!("could not write '{name}' to standard output"))?;
                return Ok(0);
            };
            f.sync_all().await?;
            std::fs::rename(&tmp, file)
                .with_context(|| format!("could not rename into '{}'", file.display()))?;
            if cluster.output == Output::Json {
                println!("{}", record_json(&record));
            }
        }
        ObjCommand::Rm {
            cluster,
            tenant,
            name,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let v = client
                .delete(&name)
                .await
                .with_context(|| format!("could not delete '{name}'"))?;
            if cluster.output == Output::Json {
                println!("{}", json!({"deleted": name, "version": v}));
            }
        }
        ObjCommand::Mv {
            cluster,
            tenant,
            from,
            to,
        } => {
            let client = connect(&cluster, &tenant).await?;
            // Tests stop a rename between its steps (STRATA_FAILPOINT=
            // rename-after-marked, -linked or -dropped).
            let r = client
                .rename_with(&from, &to, &|step| {
                    let point = match step {
                        RenameStep::Marked => "rename-after-marked",
                        RenameStep::Linked => "rename-after-linked",
                        RenameStep::Dropped => "rename-after-dropped",
                    };
                    strata_volume::failpoint::failpoint(point);
                })
                .await
                .with_context(|| format!("could not rename '{from}' to '{to}'"))?;
            if cluster.output == Output::Json {
                println!("{}", record_json(&r));
            }
        }
        ObjCommand::Stat {
            cluster,
            tenant,
            name,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let r = client
                .stat(&name)
                .await
                .with_context(|| format!("could not stat '{name}'"))?;
            if cluster.output == Output::Json {
                println!("{}", serde_json::to_string_pretty(&record_json(&r))?);
            } else {
                println!("name: {}", r.name);
                println!("size: {} ({} bytes)", human(r.size), r.size);
                println!("crc32c: {:08x}", r.crc);
                println!("version: {}", r.version);
                match &r.rename {
                    Some(RenameLink::To(n)) => println!("being renamed to: {n} (interrupted?)"),
                    Some(RenameLink::From(n)) => println!("renamed from: {n} (not finished)"),
                    None => {}
                }
                for a in &r.meta {
                    println!("metadata address: {}", strata_store::addr::fmt_addr(*a));
                }
                for a in &r.replicas {
                    println!("replica: {}", strata_store::addr::fmt_addr(*a));
                }
            }
        }
        ObjCommand::Ls {
            cluster,
            tenant,
            prefix,
            limit,
            after,
            all,
        } => {
            let client = connect(&cluster, &tenant).await?;
            let mut after = after;
            let mut entries = Vec::new();
            let cursor = loop {
                let (page, cursor) = client.list(&prefix, &after, limit).await?;
                entries.extend(page);
                match cursor {
                    Some(c) if all => after = c,
                    c => break c,
                }
            };
            if cluster.output == Output::Json {
                let items: Vec<_> = entries
                    .iter()
                    .map(|e| json!({"name": e.name, "size": e.size, "version": e.version}))
                    .collect();
                println!("{}", json!({"objects": items, "next": cursor}));
            } else {
                for e in &entries {
                    println!("{:>10}  {}", human(e.size), e.name);
                }
                if let Some(c) = cursor {
                    println!("(more: --after '{c}')");
                }
            }
        }
    }
    Ok(0)
}

/// The file `obj put` reads: FILE, or with `-` its standard input, copied
/// first to an unlinked spool file (a Post declares its size up front).
async fn open_source(file: &Input) -> Result<tokio::fs::File> {
    if let Input::File(file) = file {
        return tokio::fs::File::open(file)
            .await
            .with_context(|| format!("could not open '{}'", file.display()));
    }
    let mut spool = spool_file()?;
    std::io::copy(&mut std::io::stdin().lock(), &mut spool)
        .context("could not read the object's data from standard input")?;
    let mut f = tokio::fs::File::from_std(spool);
    tokio::io::AsyncSeekExt::rewind(&mut f).await?;
    Ok(f)
}

/// An unlinked read-write file in the temporary directory ($TMPDIR):
/// room for an object on its way from stdin or to stdout, gone with the
/// process.
fn spool_file() -> Result<std::fs::File> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!(".strata-spool-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| {
            format!(
                "could not create a spool file in '{}' (set TMPDIR to a writable directory)",
                dir.display()
            )
        })?;
    std::fs::remove_file(&path)
        .with_context(|| format!("could not unlink the spool file '{}'", path.display()))?;
    Ok(file)
}

/// Where `tenant add` writes a credential without --out: ID.credential
/// (admin.credential for '*') next to the key file.
fn default_credential_path(tenant: &str, key_path: &std::path::Path) -> PathBuf {
    let name = if tenant == ADMIN {
        ADMIN_CREDENTIAL_FILE.to_string()
    } else {
        format!("{tenant}.credential")
    };
    match key_path.parent() {
        Some(dir) => dir.join(name),
        None => PathBuf::from(name),
    }
}

fn tmp_path(file: &std::path::Path) -> PathBuf {
    let mut name = file
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".strata-part-{}", std::process::id()));
    file.with_file_name(name)
}
