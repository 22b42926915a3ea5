//! `strata`: parse arguments, call the libraries, render the result.

mod img;
mod serve;
mod store;
mod units;

use clap::{Parser, Subcommand};

/// Strata: storage virtualization for clouds.
#[derive(Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Disk images and backing chains (qemu-img conventions).
    Img {
        #[command(subcommand)]
        command: img::ImgCommand,
    },
    /// Export images over NBD (qemu-nbd conventions; always persistent).
    Serve(serve::ServeArgs),
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
}

fn main() {
    raise_fd_limit();
    // Like any Unix filter: `strata img map x | head` ends quietly when the
    // reader goes away, instead of panicking on a failed print.
    // SAFETY: restoring the default disposition of SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Img { command } => img::run(command),
        Command::Serve(args) => serve::run(args),
        Command::Store { command } => store::run_store(command),
        Command::Obj { command } => store::run_obj(command),
    };
    match code {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("strata: {e:#}");
            std::process::exit(1);
        }
    }
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
