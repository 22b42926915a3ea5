//! `strata f3` (the metadata and locality service, the namespace's
//! files: ls, where, persist, evict, and workflows: run) and `strata
//! node` (the F3 agent that mounts the namespace on a node and runs
//! functions). See docs/f3.md.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use strata_f3::client::{AgentClient, ServiceClient};
use strata_f3::node::sandbox::SandboxConfig;
use strata_f3::node::{Node, NodeConfig};
use strata_f3::path::NamespacePath;
use strata_f3::protocol::{Entry, PathRequest, DEFAULT_SERVICE_ADDRESS};
use strata_f3::runner::schedule::SchedulerKind;
use strata_store_protocol::tenant::{TenantCredential, CREDENTIAL_ENV};

/// Output format.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Text for people.
    Human,
    /// JSON for programs.
    Json,
}

/// Where the F3 metadata service listens.
#[derive(Args, Clone)]
pub struct ServiceArg {
    /// The metadata service's address (`strata f3 serve`).
    #[arg(long, env = "STRATA_F3", default_value = DEFAULT_SERVICE_ADDRESS)]
    meta: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "human")]
    output: Output,
}

/// `strata f3` subcommands.
#[derive(Subcommand)]
pub enum F3Command {
    /// Run the metadata and locality service (also a Kubernetes scheduler
    /// extender) until SIGTERM or SIGINT.
    Serve {
        /// Directory of its catalog (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Address to listen on (port 0: any free port).
        #[arg(long, default_value = DEFAULT_SERVICE_ADDRESS)]
        listen: SocketAddr,
        /// How long a node's lease lasts without a heartbeat: a reader of
        /// a silent node's file gets EIO after it.
        #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(200..=600_000))]
        lease_ms: u64,
    },
    /// A file's record, or a directory's entries.
    Ls {
        #[command(flatten)]
        service: ServiceArg,
        /// The namespace path (default `/`).
        #[arg(default_value = "/")]
        path: String,
    },
    /// The nodes that hold the files' bytes, most first.
    Where {
        #[command(flatten)]
        service: ServiceArg,
        /// Namespace paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Promote an ephemeral file to the durable tier (its holder uploads it).
    Persist {
        #[command(flatten)]
        service: ServiceArg,
        /// The namespace path.
        path: String,
    },
    /// The namespace's events: ephemeral files lost when their holder's
    /// lease lapsed (reads get EIO), and recovered when it came back; each
    /// names the step that wrote the file (`user.strata.producer`).
    Events {
        #[command(flatten)]
        service: ServiceArg,
        /// Only the events after this number.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Drop the copies of a file that nodes other than its holder keep.
    Evict {
        #[command(flatten)]
        service: ServiceArg,
        /// The namespace path.
        path: String,
    },
    /// Mount the namespace here and run this node's agent until SIGTERM
    /// or SIGINT (the same agent as `strata node`), then unmount.
    Mount(MountArgs),
    /// Run a workflow (a YAML DAG of functions) on the nodes' sandboxes.
    Run {
        #[command(flatten)]
        service: ServiceArg,
        /// The workflow file.
        workflow: PathBuf,
        /// How each step's node is chosen.
        #[arg(long, value_enum, default_value = "locality")]
        scheduler: SchedulerArg,
        /// The random scheduler's seed (the same seed, the same choices).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

/// `strata f3 run --scheduler`.
#[derive(Clone, Copy, ValueEnum)]
pub enum SchedulerArg {
    /// The node holding most bytes of the step's inputs (a warm one
    /// first among equals), skipping nodes with no free slot.
    Locality,
    /// A node with a free slot, at random (seeded by --seed).
    Random,
    /// The nodes in turn, by name.
    RoundRobin,
}

/// `strata node`: the F3 agent.
#[derive(Args)]
pub struct NodeArgs {
    /// The node's directory: its ephemeral files, copies, durable cache.
    #[arg(long)]
    dir: PathBuf,
    /// Where to mount the namespace (an empty directory).
    #[arg(long)]
    mount: PathBuf,
    #[command(flatten)]
    agent: AgentOptions,
}

/// `strata f3 mount`: the same agent, named as FUSE file systems are
/// mounted (`strata f3 mount MOUNTPOINT`), with a default directory.
#[derive(Args)]
pub struct MountArgs {
    /// Where to mount the namespace (an empty directory).
    mountpoint: PathBuf,
    /// The node's directory: its ephemeral files, copies, durable cache
    /// (default: `strata-f3/NAME` in the current directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[command(flatten)]
    agent: AgentOptions,
}

/// What a node agent is, whichever command starts it.
#[derive(Args)]
pub struct AgentOptions {
    /// Where its transfer service listens (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The metadata service's address (`strata f3 serve`).
    #[arg(long, env = "STRATA_F3", default_value = DEFAULT_SERVICE_ADDRESS)]
    meta: String,
    /// The node's name, unique among the service's nodes (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// The object store's orchestrator, for durable files (`strata store up`).
    #[arg(long, value_name = "CLUSTER")]
    store: Option<SocketAddr>,
    /// The store tenant's credential file (with --store).
    #[arg(long, env = CREDENTIAL_ENV, value_name = "FILE")]
    credential: Option<PathBuf>,
    /// Make every new file ephemeral, whatever its name or directory.
    #[arg(long)]
    all_ephemeral: bool,
    /// Most bytes the node's local tier may hold (ephemeral files, copies,
    /// local copies of durable files), such as 10G: past it, copies are
    /// evicted and idle ephemeral files spilled to the durable tier, least
    /// recently used first; a write that still does not fit gets ENOSPC.
    #[arg(long, value_parser = crate::units::parse_size)]
    quota: Option<u64>,
    /// Other nodes' files of at least this size (such as 64M), with no
    /// writer open, are fetched by range where they are read (plus a
    /// read-ahead for a sequential reader) rather than pulled whole;
    /// smaller files and files being written are pulled whole.
    #[arg(long, value_parser = crate::units::parse_size, default_value = "64M")]
    range_threshold: u64,
    /// Functions that may run at once on this node (more are refused
    /// with 503).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    slots: u32,
    /// How long a function's sandbox is kept for its next invocation.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    keep_alive_ms: u64,
    /// Most idle sandboxes kept (the oldest go first).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=1024))]
    max_warm: u64,
    /// Run functions without memory cgroups (no limit, no peak): only
    /// where no cgroup is writable and that is acceptable.
    #[arg(long)]
    no_cgroups: bool,
}

/// Runs a `strata f3` subcommand.
pub fn run(command: F3Command) -> Result<i32> {
    match command {
        F3Command::Serve {
            dir,
            listen,
            lease_ms,
        } => serve(dir, listen, lease_ms),
        F3Command::Ls { service, path } => ls(&service, &path),
        F3Command::Where { service, paths } => where_held(&service, &paths),
        F3Command::Persist { service, path } => persist(&service, &path),
        F3Command::Evict { service, path } => evict(&service, &path),
        F3Command::Events { service, after } => events(&service, after),
        F3Command::Mount(args) => run_mount(args),
        F3Command::Run {
            service,
            workflow,
            scheduler,
            seed,
        } => crate::f3_run::run(
            &service.meta,
            service.output == Output::Json,
            &workflow,
            match scheduler {
                SchedulerArg::Locality => SchedulerKind::Locality,
                SchedulerArg::Random => SchedulerKind::Random,
                SchedulerArg::RoundRobin => SchedulerKind::RoundRobin,
            },
            seed,
        ),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")
}

fn serve(dir: PathBuf, listen: SocketAddr, lease_ms: u64) -> Result<i32> {
    crate::serve::init_logging();
    let catalog = strata_f3::catalog::Catalog::open(&dir, Duration::from_millis(lease_ms))?;
    runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let bound = listener.local_addr()?;
        let stop = crate::serve::shutdown_signal();
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "strata f3: serving on {bound} (catalog {}, lease {lease_ms} ms)",
            dir.join(strata_f3::catalog::CATALOG_FILE).display()
        )?;
        out.flush()?;
        drop(out);
        strata_f3::service::serve(Arc::new(catalog), listener, stop).await?;
        anyhow::Ok(0)
    })
}

/// Runs `strata node` until SIGTERM or SIGINT, then unmounts.
pub fn run_node(args: NodeArgs) -> Result<i32> {
    let name = node_name(&args.agent)?;
    run_agent(name, args.dir, args.mount, args.agent)
}

/// Runs `strata f3 mount` until SIGTERM or SIGINT, then unmounts.
fn run_mount(args: MountArgs) -> Result<i32> {
    let name = node_name(&args.agent)?;
    let dir = args
        .dir
        .unwrap_or_else(|| PathBuf::from("strata-f3").join(&name));
    run_agent(name, dir, args.mountpoint, args.agent)
}

/// `--name`, or the host name.
fn node_name(agent: &AgentOptions) -> Result<String> {
    match &agent.name {
        Some(name) => Ok(name.clone()),
        None => hostname(),
    }
}

fn run_agent(name: String, dir: PathBuf, mountpoint: PathBuf, agent: AgentOptions) -> Result<i32> {
    crate::serve::init_logging();
    let store = match (agent.store, agent.credential) {
        (Some(cluster), Some(file)) => Some((cluster, TenantCredential::load(&file)?)),
        (Some(_), None) => bail!(
            "--store needs the store tenant's credential: give --credential FILE (or set \
             {CREDENTIAL_ENV}); `strata store up --dir DIR` writes DIR/admin.credential"
        ),
        (None, _) => None,
    };
    let node = Node::start(NodeConfig {
        name,
        directory: dir,
        listen: agent.listen,
        service: agent.meta.clone(),
        mountpoint: mountpoint.clone(),
        store,
        all_ephemeral: agent.all_ephemeral,
        quota: agent.quota,
        range_threshold: agent.range_threshold,
        sandbox: SandboxConfig {
            slots: agent.slots,
            keep_alive: Duration::from_millis(agent.keep_alive_ms),
            max_warm: agent.max_warm as usize,
            no_cgroups: agent.no_cgroups,
        },
    })?;
    // Before the readiness line: a stop sent as soon as it is read then
    // unmounts instead of killing the node.
    let (runtime, stop) = crate::serve::signal_on_own_runtime()?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "strata node: {} ready, mounted at {}, transfer on {} (service {})",
        node.name(),
        mountpoint.display(),
        node.address(),
        agent.meta
    )?;
    out.flush()?;
    drop(out);
    runtime.block_on(stop);
    node.stop();
    Ok(0)
}

fn hostname() -> Result<String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (give --name)")?;
    Ok(text.trim().to_string())
}

fn checked(path: &str) -> Result<NamespacePath> {
    Ok(NamespacePath::parse(path)?)
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn entry_line(entry: &Entry) -> String {
    let tier = if entry.directory {
        if entry.ephemeral {
            "dir(eph)"
        } else {
            "dir"
        }
    } else if entry.ephemeral {
        "ephemeral"
    } else {
        "durable"
    };
    let writers: u32 = entry.writers.values().sum();
    format!(
        "{tier:<10} {:>14} {:<16} {:>3}w  {}",
        entry.size,
        entry.holder.as_deref().unwrap_or("-"),
        writers,
        entry.path
    )
}

fn ls(args: &ServiceArg, path: &str) -> Result<i32> {
    let path = checked(path)?;
    let service = ServiceClient::new(&args.meta);
    let entry = service.stat(path.as_str())?;
    let entries = if entry.directory {
        service.list(path.as_str())?
    } else {
        vec![entry]
    };
    match args.output {
        Output::Json => print_json(&entries)?,
        Output::Human => {
            for entry in &entries {
                println!("{}", entry_line(entry));
            }
        }
    }
    Ok(0)
}

fn events(args: &ServiceArg, after: u64) -> Result<i32> {
    let page = ServiceClient::new(&args.meta).events(after, strata_f3::events::MAX_EVENT_PAGE)?;
    match args.output {
        Output::Json => print_json(&page)?,
        Output::Human => {
            for event in &page.events {
                println!(
                    "{:>6}  {:<9}  {}  (holder {}, {} bytes, producer {})",
                    event.seq,
                    format!("{:?}", event.kind).to_lowercase(),
                    event.path,
                    event.holder,
                    event.size,
                    event.producer.as_deref().unwrap_or("not named")
                );
            }
        }
    }
    Ok(0)
}

fn where_held(args: &ServiceArg, paths: &[String]) -> Result<i32> {
    let paths: Vec<String> = paths
        .iter()
        .map(|p| checked(p).map(|p| p.to_string()))
        .collect::<Result<_>>()?;
    let answer = ServiceClient::new(&args.meta).locality(&paths)?;
    match args.output {
        Output::Json => print_json(&answer)?,
        Output::Human => {
            for node in &answer.nodes {
                let state = if node.alive { "alive" } else { "silent" };
                println!("{:<16} {:>14} {state}", node.node, node.bytes);
            }
            for missing in &answer.missing {
                eprintln!("strata f3: {missing}: no such file in F3");
            }
        }
    }
    Ok(if answer.missing.is_empty() { 0 } else { 1 })
}

fn persist(args: &ServiceArg, path: &str) -> Result<i32> {
    let path = checked(path)?;
    let service = ServiceClient::new(&args.meta);
    let entry = service.stat(path.as_str())?;
    if !entry.ephemeral || entry.directory {
        bail!("{path} is not an ephemeral file: nothing to persist");
    }
    let holder = entry.holder.context("the file has no holder node")?;
    let node = service.node(&holder)?;
    let updated: Entry = AgentClient::new().post(
        &node.address,
        "/v1/persist",
        &PathRequest {
            path: path.to_string(),
        },
    )?;
    match args.output {
        Output::Json => print_json(&updated)?,
        Output::Human => println!(
            "{path}: durable now ({} bytes, was held by {holder})",
            updated.size
        ),
    }
    Ok(0)
}

fn evict(args: &ServiceArg, path: &str) -> Result<i32> {
    let path = checked(path)?;
    let service = ServiceClient::new(&args.meta);
    let entry = service.stat(path.as_str())?;
    if entry.directory {
        bail!("{path} is a directory; evict files");
    }
    let mut nodes: Vec<String> = entry
        .held
        .keys()
        .filter(|n| Some(n.as_str()) != entry.holder.as_deref())
        .cloned()
        .collect();
    if nodes.is_empty() {
        // The holder refuses with the reason (its copy is the only one).
        nodes.extend(entry.holder.clone());
    }
    let agents = AgentClient::new();
    let mut results = Vec::new();
    for name in nodes {
        let node = service.node(&name)?;
        let result: serde_json::Value = agents.post(
            &node.address,
            "/v1/evict",
            &PathRequest {
                path: path.to_string(),
            },
        )?;
        results.push(result);
    }
    match args.output {
        Output::Json => print_json(&results)?,
        Output::Human => {
            for result in &results {
                println!(
                    "{}: dropped on {}",
                    path,
                    result["node"].as_str().unwrap_or("?")
                );
            }
            if results.is_empty() {
                println!("{path}: no node keeps a copy");
            }
        }
    }
    Ok(0)
}
