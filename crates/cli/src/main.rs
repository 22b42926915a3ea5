//! `strata`: parse arguments, call the libraries, render the result.

mod bench;
mod daemon;
mod f3;
mod f3_run;
mod humanize;
mod img;
mod mirror;
mod ops;
mod s3_load;
mod serve;
mod stdio;
mod store;
mod tls;
mod units;
mod up;
mod volume;

use clap::{CommandFactory, Parser, Subcommand};

/// Strata: storage virtualization for clouds.
#[derive(Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start here: run the volume daemon, an object store and (if asked) a
    /// mirror from one directory, until Ctrl-C; or `--demo` to try them and exit.
    Up(up::UpArgs),
    /// Disk images and backing chains (qemu-img conventions).
    Img {
        #[command(subcommand)]
        command: img::ImgCommand,
    },
    /// Export images over NBD (qemu-nbd conventions; always persistent).
    Serve(serve::ServeArgs),
    /// Run the volume service: a pool of volumes served over NBD, with an HTTP API.
    Daemon {
        /// TOML configuration file whose [daemon] keys are this command's
        /// long flags (flags given here win; `-`: read it from standard
        /// input); see docs/up.md.
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
        #[command(flatten)]
        args: daemon::DaemonArgs,
    },
    /// Manage volumes of a running daemon.
    Volume {
        #[command(flatten)]
        client: volume::ClientArgs,
        #[command(subcommand)]
        command: volume::VolumeCommand,
    },
    /// Manage snapshots of a running daemon's volumes.
    Snapshot {
        #[command(flatten)]
        client: volume::ClientArgs,
        #[command(subcommand)]
        command: volume::SnapshotCommand,
    },
    /// Mirror a remote image on demand, sharing chunks with peer mirrors; export it over NBD.
    Mirror(mirror::MirrorCmd),
    /// Run and manage an object-store cluster (6Stor design).
    Store {
        #[command(subcommand)]
        command: store::StoreCommand,
    },
    /// Objects in a store cluster: put, get, rm, mv, stat, ls.
    Obj {
        #[command(subcommand)]
        command: store::ObjCommand,
    },
    /// Serve a store cluster over S3 (`strata store up` starts one too).
    S3(store::S3Args),
    /// Declarative benchmarks: I/O workloads mixed with control
    /// operations (create, snapshot, clone, resize, delete) at set rates.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// The F3 serverless file tier: its metadata and locality service
    /// (`serve`), and its files (`ls`, `where`, `persist`, `evict`).
    F3 {
        #[command(subcommand)]
        command: f3::F3Command,
    },
    /// Run an F3 node agent: mount the shared namespace of durable and
    /// ephemeral files, and serve this node's ephemeral files to others.
    Node(f3::NodeArgs),
    /// Print the completion script of a shell (bash, zsh, fish, ...).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write a man page for strata and each of its subcommands into DIR.
    Man {
        /// Directory for the pages (created if missing).
        #[arg(value_parser = stdio::directory())]
        dir: std::path::PathBuf,
    },
}

fn main() {
    raise_fd_limit();
    // Like any Unix filter: `strata img map x | head` ends quietly when the
    // reader goes away, instead of panicking on a failed print.
    // SAFETY: restoring the default disposition of SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let argv = ops::apply_config(std::env::args_os().collect(), Cli::command).unwrap_or_else(|e| {
        eprintln!("strata: {e:#}");
        std::process::exit(2);
    });
    let cli = Cli::parse_from(argv);
    let code = match cli.command {
        Command::Img { command } => img::run(command),
        Command::Serve(args) => serve::run(args),
        Command::Daemon { args, .. } => daemon::run(args),
        Command::Volume { client, command } => volume::run_volume(client, command),
        Command::Snapshot { client, command } => volume::run_snapshot(client, command),
        Command::Mirror(cmd) => mirror::run(cmd),
        Command::Store { command } => store::run_store(command),
        Command::Obj { command } => store::run_obj(command),
        Command::S3(args) => store::run_s3(args),
        Command::Up(args) => up::run(args),
        Command::Bench { command } => bench::run(command),
        Command::F3 { command } => f3::run(command),
        Command::Node(args) => f3::run_node(args),
        Command::Completions { shell } => ops::completions(shell, Cli::command()),
        Command::Man { dir } => ops::man_pages(&dir, Cli::command()),
    };
    match code {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("strata: {}", error_chain(&e));
            std::process::exit(1);
        }
    }
}

/// An error and its causes on one line, each said once: many errors (such
/// as `std::io::Error` wrapped by a library) already include their source
/// in their own message, and printing the chain as well would repeat it
/// ("Address already in use (os error 98): ... (os error 98)").
fn error_chain(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Long chains keep one descriptor per layer open; lift the soft limit to
/// the hard one so a 1,000-layer chain fits under the default of 1,024.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
