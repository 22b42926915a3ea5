//! The arguments of `strata store` and `strata obj`.

use super::*;

/// Where the cluster's orchestrator listens.
#[derive(Args, Clone)]
pub struct ClusterArg {
    /// The orchestrator's UDP endpoint.
    #[arg(long, env = "STRATA_CLUSTER", default_value = "127.0.0.1:10890")]
    pub(super) cluster: SocketAddr,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
}

/// Most bytes of a credential read from standard input (it is 3 lines).
pub(super) const MAX_CREDENTIAL_BYTES: u64 = 4096;

/// The tenant credential that seals a client's metadata requests.
#[derive(Args, Clone)]
pub struct TenantArg {
    /// The tenant's credential file (`strata store tenant add` writes
    /// one; `strata store up --dir DIR` writes DIR/admin.credential); `-`:
    /// read it from standard input.
    #[arg(long, env = CREDENTIAL_ENV, value_name = "FILE")]
    pub(super) credential: Option<Input>,
    /// The directory of `strata store up`: without --credential (or
    /// STRATA_CREDENTIAL), its admin.credential is used.
    #[arg(long, value_name = "DIR", value_parser = crate::stdio::directory())]
    pub(super) dir: Option<PathBuf>,
}

impl TenantArg {
    /// The credential of `--credential` (or the environment), else the
    /// admin credential in `--dir`.
    pub(super) fn load(&self) -> Result<TenantCredential> {
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
    pub(super) path: Option<PathBuf>,
}

impl KeyArg {
    /// The key in `--key`, else in the first of `defaults` that exists.
    pub(super) fn load(&self, defaults: &[PathBuf]) -> Result<ClusterKey> {
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
    Up(Box<UpArgs>),
    /// Add or remove nodes.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Show the prefix table: nodes, groups, capacity, state; or, with
    /// --client, a client's view of the storage nodes (NAMI's latency
    /// estimates and weights).
    Status(StatusArgs),
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
    /// Show or change RS3's settings on the running storage nodes
    /// (sealed with the cluster key): on or off, the batch budget, class
    /// weights and tenants' classes; prints each node's settings and
    /// per-class counters.
    Schedule(Box<super::schedule::ScheduleCommandArgs>),
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
    pub(super) cluster: ClusterArg,
    #[command(flatten)]
    pub(super) key: KeyArg,
    /// The tenant id whose credentials to revoke (not '*': rotate the
    /// cluster key to revoke the admin credential).
    #[arg(long)]
    pub(super) tenant: String,
}

/// `strata store tenant add` arguments.
#[derive(Args)]
pub struct TenantAddArgs {
    /// The cluster key: DIR/cluster.key with --dir, or --key FILE.
    #[command(flatten)]
    pub(super) file: KeyFileArg,
    /// The tenant id: 1 to 64 ASCII letters, digits, '.', '_' or '-' (its
    /// names are those under 'ID/'), or '*' for every name.
    #[arg(long)]
    pub(super) tenant: String,
    /// Where to write the credential (`-`: standard output, and the
    /// report goes to standard error). Default: ID.credential next to the
    /// key file (admin.credential for '*').
    #[arg(long = "out", value_name = "FILE")]
    pub(super) out: Option<StdOutput>,
    /// The orchestrator's UDP endpoint: issue the tenant's current
    /// minimum generation, read from its table.
    #[arg(long, env = "STRATA_CLUSTER", value_name = "ADDR")]
    pub(super) cluster: Option<SocketAddr>,
    /// Without --cluster: the generation to issue (default 0). A
    /// generation below the tenant's minimum is refused by every
    /// metadata node.
    #[arg(long, conflicts_with = "cluster", value_name = "N")]
    pub(super) generation: Option<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
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
    pub(super) dir: Option<PathBuf>,
    /// The key file itself (the files of a rotation are next to it).
    #[arg(long, value_name = "FILE", value_parser = crate::stdio::file(crate::stdio::KEY_WHY))]
    pub(super) key: Option<PathBuf>,
}

impl KeyFileArg {
    pub(super) fn path(&self) -> PathBuf {
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
    pub(super) file: KeyFileArg,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    pub(super) output: Output,
}

/// `strata store status` arguments.
#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(super) cluster: ClusterArg,
    /// Show a client's view instead of the table: per storage node, the
    /// latency estimate, the weight NAMI gives it, its chance of taking
    /// a Get and the reads sent, after probing each node.
    #[arg(long)]
    pub(super) client: bool,
    /// With --client: probes of each node (TCP connections, timed) to
    /// make the estimates from.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(super) probes: u16,
    #[command(flatten)]
    pub(super) tenant: TenantArg,
    /// Also show each metadata node's repair since it started: replica
    /// copies and fragment rebuilds started, committed, failed, under way,
    /// and damaged replicas waiting. Needs the cluster key (--key FILE or
    /// STRATA_CLUSTER_KEY).
    #[arg(long)]
    pub(super) repair: bool,
    /// The cluster key, for --repair.
    #[command(flatten)]
    pub(super) key: KeyArg,
}

/// `strata store bench` arguments.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub(super) cluster: ClusterArg,
    #[command(flatten)]
    pub(super) tenant: TenantArg,
    /// post, get (objects a post run made), or http (GET /PREFIX/<size>/<client>/<i>).
    #[arg(long, default_value = "post", value_parser = ["post", "get", "http"])]
    pub(super) workload: String,
    /// HTTP server for --workload http.
    #[arg(long)]
    pub(super) http: Option<SocketAddr>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 5)]
    pub(super) threads: usize,
    /// Operations per client.
    #[arg(long, default_value_t = 100)]
    pub(super) ops: usize,
    /// For get and http: read each client's objects this many times (runs
    /// long enough to measure when Posts are slow to make objects).
    #[arg(long, default_value_t = 1)]
    pub(super) passes: usize,
    /// Object size (e.g. 2600, 306k, 2.3M).
    #[arg(long, default_value = "2600")]
    pub(super) size: String,
    /// Objects are named PREFIX/<size>/<client>/<i>: a post run under a new
    /// prefix makes new objects instead of replacing the last run's.
    #[arg(long, default_value = "bench")]
    pub(super) prefix: String,
    /// tasks: one task per client, each call as `strata obj` makes it;
    /// batched: zero-byte Gets only, every client driven from one thread
    /// and one socket with batched sends and receives (a generator that
    /// leaves the CPU to the server, as one on machines of its own would).
    #[arg(long, default_value = "tasks", value_parser = ["tasks", "batched"])]
    pub(super) engine: String,
    /// Which replica a Get reads first: nami (weighted by measured
    /// latency ranks), primary (the record's first) or uniform (at
    /// random). The report counts the reads sent to each storage node.
    #[arg(long, default_value = "nami", value_parser = ["nami", "primary", "uniform"])]
    pub(super) replica_choice: String,
}

/// `strata store routes` arguments.
#[derive(Args)]
pub struct RoutesArgs {
    #[command(flatten)]
    pub(super) cluster: ClusterArg,
    /// The host's own address on the network the nodes share (its nodes
    /// registered with it as their `--listen` address).
    #[arg(long)]
    pub(super) host: std::net::IpAddr,
    /// Print lines for `ip -6 -batch -` instead of whole commands.
    #[arg(long)]
    pub(super) batch: bool,
    /// Install the routes on this host now (`ip -6 route`, needs
    /// CAP_NET_ADMIN) instead of printing them, e.g. on a client's host.
    #[arg(long, conflicts_with = "batch")]
    pub(super) apply: bool,
}

/// Whether nodes leave the host's routes alone.
#[derive(Args)]
pub struct NoRoutesArg {
    /// In a routed cluster, do not install or change this host's routes
    /// (`ip -6 route`); the operator or a routing daemon keeps them, as
    /// `strata store routes` prints them.
    #[arg(long)]
    pub(super) no_routes: bool,
}

/// `strata store up` arguments.
#[derive(Args)]
pub struct UpArgs {
    /// Directory holding every node's state (created if missing).
    #[arg(long, value_parser = crate::stdio::directory())]
    pub(super) dir: PathBuf,
    /// The orchestrator's UDP endpoint.
    #[arg(long, default_value = "127.0.0.1:10890")]
    pub(super) listen: SocketAddr,
    /// Metadata nodes.
    #[arg(long = "mn", default_value_t = 1)]
    pub(super) mns: u16,
    /// Metadata slots of a new cluster, when more metadata nodes will join
    /// with `strata store node add --role mn` (default: --mn). A node added
    /// once every slot is taken gets a new slot and takes over a share of
    /// the metadata groups (their metadata is copied to it).
    #[arg(long)]
    pub(super) mn_slots: Option<u16>,
    /// Storage nodes (more can join with `strata store node add`).
    #[arg(long = "sn", default_value_t = 1)]
    pub(super) sns: u16,
    /// Short-failure timer: a node silent this long is marked down and left
    /// out of placement.
    #[arg(long, default_value_t = 3000)]
    pub(super) short_failure_ms: u64,
    /// Definitive-failure timer: a node silent this long is marked dead. A
    /// dead storage node's replicas are re-created on other nodes; a dead
    /// metadata node's groups are restored on the other metadata nodes.
    #[arg(long, default_value_t = 600_000)]
    pub(super) definitive_failure_ms: u64,
    /// Replication as N_m,W_m,N_d,W_d (a new cluster only).
    #[arg(long, default_value = "1,1,1,1")]
    pub(super) replication: String,
    /// Per-bucket override, NAME=N_m,W_m,N_d,W_d (repeatable; the bucket of
    /// "a/b" is "a").
    #[arg(long = "bucket")]
    pub(super) buckets: Vec<String>,
    /// The data's storage class for the whole cluster: replicated (N_d
    /// replicas, from --replication) or ec(K,M), K data and M parity
    /// fragments on K+M distinct storage nodes (N_d becomes K+M, and
    /// every fragment must be durable before a Post is acknowledged).
    #[arg(long, default_value = "replicated")]
    pub(super) class: String,
    /// Per-bucket storage class, NAME=CLASS, such as photos=ec(4,2) or
    /// logs=replicated(3) (repeatable; on top of the bucket's --bucket
    /// replication, or the cluster's).
    #[arg(long = "bucket-class")]
    pub(super) bucket_classes: Vec<String>,
    /// Capacity each storage node declares (e.g. 100G).
    #[arg(long, default_value = "1T")]
    pub(super) capacity: String,
    /// Device type of the storage nodes.
    #[arg(long, default_value = "ssd", value_parser = ["ssd", "hdd"])]
    pub(super) device: String,
    /// Routed network mode (a new cluster only): clients and nodes send
    /// to object and metadata addresses themselves, and the network routes
    /// each node's prefix to it. Every node keeps its host's routes in step
    /// with the table (a local route for what the host owns, a route via
    /// the owner for the rest); clients' hosts need `strata store routes
    /// --host ADDR --apply`. Default: mapped mode, through the prefix table.
    #[arg(long)]
    pub(super) routed: bool,
    #[command(flatten)]
    pub(super) routes: NoRoutesArg,
    #[command(flatten)]
    pub(super) gc: GcArgs,
    #[command(flatten)]
    pub(super) scrub: ScrubArgs,
    #[command(flatten)]
    pub(super) data: DataArgs,
    #[command(flatten)]
    pub(super) schedule: ScheduleArgs,
    #[command(flatten)]
    pub(super) sync: SyncArgs,
    /// log2 of the number of metadata groups (4 to 16).
    #[arg(long, default_value_t = 8)]
    pub(super) mg_bits: u8,
    /// Default: DIR/cluster.key, made with a new random key if missing.
    #[command(flatten)]
    pub(super) key: KeyArg,
    /// Where the S3 gateway listens (HTTP; port 0: a free port, stated
    /// in the readiness line). `strata s3` runs one on its own.
    #[arg(long = "s3", value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub(super) s3: SocketAddr,
    /// Make the S3 gateway reach this process's nodes over the network,
    /// as a gateway on another host does: every replica over TCP from its
    /// storage node, every metadata lookup by UDP datagram. By default it
    /// reads the replicas of this process's own storage nodes straight
    /// from their files (checked against the object's CRC-32C all the
    /// same), and asks its own metadata nodes for an object's record by a
    /// direct call.
    #[arg(long)]
    pub(super) s3_remote_reads: bool,
    /// Most bytes of local replicas the S3 gateway keeps locked in memory
    /// once checked, so that GETs of hot objects of 1 MiB or more send
    /// them without reading them again (0: none). Default: 1 GiB, or an
    /// eighth of the machine's memory if less.
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub(super) s3_pinned: Option<u64>,
    #[command(flatten)]
    pub(super) s3_expiry: super::UploadExpiryArg,
}

/// Collection of replicas that no record names (a storage node back
/// from the dead, a Post whose client vanished).
#[derive(Args)]
pub struct GcArgs {
    /// Milliseconds between collection rounds on each storage node.
    #[arg(long, default_value_t = 600_000)]
    pub(super) gc_interval_ms: u64,
    /// Replicas younger than this (ms) are never collected.
    #[arg(long, default_value_t = 600_000)]
    pub(super) gc_grace_ms: u64,
}

/// The storage nodes' background scrub: each re-reads its replicas,
/// checks their CRC-32C, and reports damaged ones to the metadata nodes,
/// which repair them from good copies.
#[derive(Args)]
pub struct ScrubArgs {
    /// Bytes of replicas each storage node re-reads per second (e.g. 16M,
    /// 512k; 0 disables the scrub).
    #[arg(long, default_value = "16M", value_parser = crate::units::parse_size)]
    pub(super) scrub_rate: u64,
    /// Milliseconds each storage node pauses between two passes over all
    /// its replicas.
    #[arg(long, default_value_t = strata_store::storage::scrub::DEFAULT_SCRUB_PAUSE.as_millis() as u64)]
    pub(super) scrub_pause_ms: u64,
}

impl ScrubArgs {
    pub(super) fn config(&self) -> strata_store::storage::scrub::ScrubConfig {
        strata_store::storage::scrub::ScrubConfig::at_rate(
            self.scrub_rate,
            std::time::Duration::from_millis(self.scrub_pause_ms),
        )
    }
}

/// Limits of the storage nodes' data ports.
#[derive(Args)]
pub struct DataArgs {
    /// Milliseconds a data connection may take to send a whole request
    /// header (idle ones included), and one read of a Put's data may wait;
    /// past it the connection is closed.
    #[arg(long, default_value_t = strata_store::storage::replicas::DATA_READ_TIMEOUT.as_millis() as u64)]
    pub(super) data_timeout_ms: u64,
    /// Most data connections a storage node keeps open at once (more are
    /// closed as soon as accepted).
    #[arg(long, default_value_t = strata_store::storage::replicas::DATA_MAX_CONNECTIONS)]
    pub(super) data_max_connections: usize,
    /// Memory of each storage node's whole-object cache (e.g. 64M, 1G; 0
    /// for none): erasure-coded objects whose fragment 0 the node holds,
    /// served whole, least recently used evicted first; an object takes
    /// at most an eighth of it.
    #[arg(long, default_value = "64M")]
    pub(super) object_cache: String,
}

impl DataArgs {
    pub(super) fn limits(&self) -> anyhow::Result<strata_store::storage::replicas::DataLimits> {
        Ok(strata_store::storage::replicas::DataLimits {
            read_timeout: std::time::Duration::from_millis(self.data_timeout_ms.max(1)),
            max_connections: self.data_max_connections.max(1),
            object_cache: crate::units::parse_size(&self.object_cache)
                .map_err(|e| anyhow::anyhow!("invalid --object-cache: {e}"))?,
        })
    }
}

/// RS3, the storage nodes' read scheduler (docs/design/rs3.md).
#[derive(Args)]
pub struct ScheduleArgs {
    /// Serve `GET /metrics` (Prometheus text: the storage nodes' scrub
    /// progress and damaged replicas, RS3's per-class bytes, queue depth
    /// and latency, object cache; the metadata nodes' repair counts) on
    /// this TCP endpoint; stated on the readiness line.
    /// Default: not served.
    #[arg(long, value_name = "ADDR")]
    pub(super) metrics: Option<SocketAddr>,
    /// Schedule Gets with RS3: reads are sent in batches whose byte
    /// budget is shared fairly between request classes (tenants by
    /// default), so a small read waits about one batch, not behind big
    /// streams. Meant for nodes whose link is the bottleneck; off by
    /// default.
    #[arg(long)]
    pub(super) rs3: bool,
    /// Each RS3 batch's byte budget (64K to 1G): smaller gives small reads
    /// lower latency, larger keeps more of the link's throughput.
    #[arg(long, default_value = "256K")]
    pub(super) rs3_batch: String,
    /// A class's weight, CLASS=W (1 to 1000; others weigh 1). Repeatable.
    #[arg(long, value_name = "CLASS=W")]
    pub(super) rs3_weight: Vec<String>,
    /// Put a tenant's reads in a class other than its own id,
    /// TENANT=CLASS. Repeatable.
    #[arg(long, value_name = "TENANT=CLASS")]
    pub(super) rs3_class: Vec<String>,
}

impl ScheduleArgs {
    pub(super) fn config(
        &self,
    ) -> anyhow::Result<strata_store::storage::schedule::config::ScheduleConfig> {
        use anyhow::Context;
        let mut config = strata_store::storage::schedule::config::ScheduleConfig {
            enabled: self.rs3,
            batch_bytes: crate::units::parse_size(&self.rs3_batch)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("invalid --rs3-batch '{}'", self.rs3_batch))?,
            ..Default::default()
        };
        for pair in &self.rs3_weight {
            let (class, weight) = pair
                .split_once('=')
                .with_context(|| format!("invalid --rs3-weight '{pair}': expected CLASS=W"))?;
            let weight = weight
                .parse()
                .with_context(|| format!("invalid --rs3-weight '{pair}': W is a number"))?;
            config.weights.insert(class.to_string(), weight);
        }
        for pair in &self.rs3_class {
            let (tenant, class) = pair
                .split_once('=')
                .with_context(|| format!("invalid --rs3-class '{pair}': expected TENANT=CLASS"))?;
            config.classes.insert(tenant.to_string(), class.to_string());
        }
        config.validate()?;
        Ok(config)
    }
}

/// Anti-entropy of metadata copies.
#[derive(Args)]
pub struct SyncArgs {
    /// Milliseconds between two anti-entropy passes of each metadata node
    /// over the metadata copies of the names it coordinates (0: none).
    #[arg(long, default_value_t = strata_store::metadata::state::DEFAULT_SYNC_MS)]
    pub(super) metadata_sync_ms: u64,
}

impl GcArgs {
    pub(super) fn config(&self) -> strata_store::storage::replicas::GcConfig {
        strata_store::storage::replicas::GcConfig {
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
        scrub: ScrubArgs,
        /// Used by a storage node.
        #[command(flatten)]
        data: DataArgs,
        /// Used by a storage node.
        #[command(flatten)]
        schedule: Box<ScheduleArgs>,
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
        /// Storage class of this object, replicated(N) or ec(K,M) (default:
        /// its bucket's, or the cluster's).
        #[arg(long)]
        class: Option<String>,
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
        /// Which replica to read first: nami (weighted by measured latency
        /// ranks), primary (the record's first) or uniform (at random).
        #[arg(long, default_value = "nami", value_parser = ["nami", "primary", "uniform"])]
        replica_choice: String,
        /// Only the bytes FIRST to LAST, both included, counted from 0
        /// (as qemu-img and curl write them): read from the chunks that
        /// cover them, not the whole object.
        #[arg(long, value_name = "FIRST-LAST", value_parser = parse_byte_range)]
        range: Option<std::ops::RangeInclusive<u64>>,
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

/// Parses `--range FIRST-LAST`: two byte offsets, both included, FIRST
/// at most LAST.
pub fn parse_byte_range(text: &str) -> Result<std::ops::RangeInclusive<u64>, String> {
    let bad = || format!("'{text}' is not a byte range: write FIRST-LAST, e.g. 0-1023");
    let (first, last) = text.split_once('-').ok_or_else(bad)?;
    let first: u64 = first.trim().parse().map_err(|_| bad())?;
    let last: u64 = last.trim().parse().map_err(|_| bad())?;
    if first > last {
        return Err(format!(
            "the range {text} ends before it starts: FIRST must be at most LAST"
        ));
    }
    Ok(first..=last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_are_first_dash_last_inclusive() {
        assert_eq!(parse_byte_range("0-0"), Ok(0..=0));
        assert_eq!(parse_byte_range("10-4095"), Ok(10..=4095));
        for bad in ["", "5", "-5", "5-", "a-b", "1-2-3", "-1-4"] {
            assert!(
                parse_byte_range(bad).unwrap_err().contains("FIRST-LAST"),
                "{bad}"
            );
        }
        assert!(parse_byte_range("9-3").unwrap_err().contains("ends before"));
    }
}
