//! `strata up`: the platform in one directory, for a first hour or a
//! small host. It runs the volume daemon, a one-node object store and (if
//! asked) a mirror as child processes of this same binary, prints where
//! each answers, and stops them all together: on SIGINT, SIGTERM or
//! SIGHUP, or as soon as one of them dies.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::ops::{config_value, read_config};

/// Default NBD port of `strata daemon` (docs: the ports table).
const DAEMON_NBD_PORT: u16 = 10810;
/// Default address of the daemon's HTTP API.
const DAEMON_API: &str = "127.0.0.1:10880";
/// Default address of the store's orchestrator (UDP).
const STORE_CLUSTER: &str = "127.0.0.1:10890";
/// Default NBD port of `strata mirror`.
const MIRROR_NBD_PORT: u16 = 10811;
/// How often the supervisor looks at its children and at signals.
const POLL: Duration = Duration::from_millis(100);

/// The signal that asked `up` to stop (0: none yet).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Arguments of `strata up`.
#[derive(Args)]
pub struct UpArgs {
    /// Directory of everything it runs (created if missing): the volume
    /// pool in DIR/pool, the store in DIR/store, a mirror in DIR/mirror.
    #[arg(default_value = "strata-data", value_parser = crate::stdio::directory())]
    dir: PathBuf,
    /// TOML configuration file: its [up] keys are this command's long
    /// flags; its [daemon], [store] and [mirror] tables go to those
    /// services (keys: their long flags). Flags given here win over the
    /// file; the directories and addresses `up` passes win over the
    /// services' tables. `-`: read it from standard input.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The volume daemon's NBD port [default: 10810, or [daemon] nbd-port].
    #[arg(long = "nbd-port")]
    nbd_port: Option<u16>,
    /// The volume daemon's HTTP API address [default: 127.0.0.1:10880, or
    /// [daemon] listen].
    #[arg(long)]
    api: Option<String>,
    /// The object store's cluster address (UDP) [default: 127.0.0.1:10890,
    /// or [store] listen].
    #[arg(long)]
    cluster: Option<String>,
    /// Do not run the object store.
    #[arg(long = "no-store")]
    no_store: bool,
    /// Also run a mirror of this image (an http:// URL, store://CLUSTER/NAME
    /// or a file, with its IMAGE.digest beside it) [default: [mirror] repo;
    /// without either, no mirror runs].
    #[arg(long, value_name = "IMAGE")]
    mirror: Option<String>,
    /// The mirror's NBD port [default: 10811, or [mirror] port].
    #[arg(long = "mirror-port")]
    mirror_port: Option<u16>,
    /// Seconds each service gets to print its readiness line.
    #[arg(long = "start-timeout", default_value_t = 60.0)]
    start_timeout: f64,
    /// Seconds the services get to stop after SIGTERM before SIGKILL.
    #[arg(long = "stop-timeout", default_value_t = 40.0)]
    stop_timeout: f64,
    /// Run a short demonstration in a fresh temporary directory (on free
    /// ports unless given): create a volume, write and read it over NBD
    /// with qemu-io (if installed), snapshot it, put and get an object;
    /// then stop everything, delete the directory and exit.
    #[arg(long)]
    demo: bool,
}

/// Where everything listens, as resolved from flags, file and defaults.
struct Plan {
    dir: PathBuf,
    config: Option<PathBuf>,
    nbd_port: u16,
    api: String,
    cluster: Option<String>,
    mirror: Option<(String, u16)>,
}

/// Addresses the services reported on their readiness lines.
#[derive(Default)]
struct Addresses {
    nbd: String,
    api: String,
    cluster: Option<String>,
    mirror: Option<String>,
}

/// A service running as a child process.
struct Service {
    /// What it is, as messages name it.
    name: &'static str,
    child: Child,
}

/// Runs `strata up`; returns the exit code.
pub fn run(args: UpArgs) -> Result<i32> {
    let start_timeout = crate::serve::seconds(args.start_timeout, "--start-timeout")?;
    let stop_timeout = crate::serve::seconds(args.stop_timeout, "--stop-timeout")?;
    let plan = plan(&args)?;
    install_signal_handlers();
    let mut services = Vec::new();
    let started = start_all(&plan, start_timeout, &mut services);
    let addresses = match started {
        Ok(addresses) => addresses,
        Err(e) => {
            stop_all(&mut services, stop_timeout);
            remove_demo_dir(&args, &plan);
            return Err(e);
        }
    };
    if args.demo {
        let result = demo(&plan, &addresses);
        let stopped = stop_all(&mut services, stop_timeout);
        remove_demo_dir(&args, &plan);
        result?;
        println!("strata: up: demonstration done; stopped everything and removed its directory");
        return Ok(if stopped { 0 } else { 1 });
    }
    print_addresses(&plan, &addresses)?;
    Ok(supervise(&mut services, stop_timeout))
}

/// Resolves every address: flag (or [up] key), then the service's own
/// table in the file, then the default (port 0 for a demonstration).
fn plan(args: &UpArgs) -> Result<Plan> {
    let config = match &args.config {
        Some(file) => read_config(file)?,
        None => toml::Table::new(),
    };
    let text = |table: &str, key: &str| -> Result<Option<String>> {
        match config_value(&config, table, key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(toml::Value::Integer(n)) => Ok(Some(n.to_string())),
            Some(_) => bail!("configuration file: [{table}] {key} must be a string or a number"),
        }
    };
    let port = |value: Option<String>, what: &str| -> Result<Option<u16>> {
        value
            .map(|v| v.parse::<u16>())
            .transpose()
            .with_context(|| format!("configuration file: {what} is not a port number"))
    };
    let demo_default = |normal: String| {
        if args.demo {
            with_port_zero(&normal)
        } else {
            normal
        }
    };
    let nbd_port = match args
        .nbd_port
        .or(port(text("daemon", "nbd-port")?, "[daemon] nbd-port")?)
    {
        Some(p) => p,
        None if args.demo => 0,
        None => DAEMON_NBD_PORT,
    };
    let api = args
        .api
        .clone()
        .or(text("daemon", "listen")?)
        .unwrap_or_else(|| demo_default(DAEMON_API.into()));
    let cluster = (!args.no_store).then(|| -> Result<String> {
        Ok(args
            .cluster
            .clone()
            .or(text("store", "listen")?)
            .unwrap_or_else(|| demo_default(STORE_CLUSTER.into())))
    });
    let mirror_port = args
        .mirror_port
        .or(port(text("mirror", "port")?, "[mirror] port")?)
        .unwrap_or(MIRROR_NBD_PORT);
    let mirror = args
        .mirror
        .clone()
        .or(text("mirror", "repo")?)
        .map(|repo| (repo, mirror_port));
    if args.demo && mirror.is_some() {
        bail!("--demo runs no mirror: drop --mirror (and [mirror] repo)");
    }
    let dir = if args.demo {
        std::env::temp_dir().join(format!("strata-demo-{}", std::process::id()))
    } else {
        args.dir.clone()
    };
    Ok(Plan {
        dir,
        config: args.config.clone(),
        nbd_port,
        api,
        cluster: cluster.transpose()?,
        mirror,
    })
}

/// `HOST:PORT` with port 0.
fn with_port_zero(address: &str) -> String {
    match address.rsplit_once(':') {
        Some((host, _)) => format!("{host}:0"),
        None => address.to_string(),
    }
}

/// Starts each service in turn and waits for its readiness line.
fn start_all(plan: &Plan, timeout: Duration, services: &mut Vec<Service>) -> Result<Addresses> {
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("cannot create the directory '{}'", plan.dir.display()))?;
    let mut addresses = Addresses::default();
    let pool = plan.dir.join("pool");
    let mut daemon = vec![
        "daemon".into(),
        "--pool".into(),
        path_text(&pool),
        "--nbd-port".into(),
        plan.nbd_port.to_string(),
        "--listen".into(),
        plan.api.clone(),
    ];
    with_config(&mut daemon, plan);
    let line = start(services, "volume daemon", &daemon, timeout)?;
    addresses.nbd = word_after(&line, "over NBD on ").with_context(|| {
        format!("the volume daemon's readiness line has no NBD address: {line}")
    })?;
    addresses.api = word_after(&line, "API on http://").with_context(|| {
        format!("the volume daemon's readiness line has no API address: {line}")
    })?;
    if let Some(cluster) = &plan.cluster {
        let mut store = vec![
            "store".into(),
            "up".into(),
            "--dir".into(),
            path_text(&plan.dir.join("store")),
            "--listen".into(),
            cluster.clone(),
        ];
        with_config(&mut store, plan);
        let line = start(services, "object store", &store, timeout)?;
        addresses.cluster = Some(word_after(&line, "ready on ").with_context(|| {
            format!("the object store's readiness line has no address: {line}")
        })?);
    }
    if let Some((repo, port)) = &plan.mirror {
        let mut mirror = vec![
            "mirror".into(),
            "--repo".into(),
            repo.clone(),
            "--dir".into(),
            path_text(&plan.dir.join("mirror")),
            "--port".into(),
            port.to_string(),
        ];
        with_config(&mut mirror, plan);
        let line = start(services, "mirror", &mirror, timeout)?;
        addresses.mirror =
            Some(word_after(&line, "nbd://").with_context(|| {
                format!("the mirror's readiness line has no NBD address: {line}")
            })?);
    }
    Ok(addresses)
}

/// Passes the configuration file on, for the service's own table.
fn with_config(args: &mut Vec<String>, plan: &Plan) {
    if let Some(file) = &plan.config {
        args.push("--config".into());
        args.push(path_text(file));
    }
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The word after `marker` in `line`, up to a space or a comma.
fn word_after(line: &str, marker: &str) -> Option<String> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let word: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// Starts `strata ARGS` as service `name`, adds it to `services` and
/// returns its readiness line (its first line on stdout; later lines go
/// to our stderr).
fn start(
    services: &mut Vec<Service>,
    name: &'static str,
    args: &[String],
    timeout: Duration,
) -> Result<String> {
    let exe = std::env::current_exe().context("cannot find the strata binary to run")?;
    let parent = std::process::id() as libc::pid_t;
    // `--config -`: the service reads the configuration up read from its
    // own standard input.
    let config_stdin = args
        .windows(2)
        .any(|pair| pair[0] == "--config" && pair[1] == crate::stdio::DASH);
    let mut command = Command::new(&exe);
    command
        .args(args)
        .stdin(if config_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // Its own process group: a terminal's Ctrl-C reaches `up` alone,
        // which then stops the services in order.
        .process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls (prctl,
    // getppid) run, on no shared state.
    unsafe {
        command.pre_exec(move || {
            // Should `up` die without stopping it (SIGKILL), the service
            // gets SIGTERM instead of living on unsupervised.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("strata up exited during the start"));
            }
            Ok(())
        });
    }
    let mut child = command.spawn().with_context(|| {
        format!(
            "cannot start the {name} ({} {})",
            exe.display(),
            args.join(" ")
        )
    })?;
    let stdout = child.stdout.take();
    let stdin = child.stdin.take();
    services.push(Service { name, child });
    if let Some(mut stdin) = stdin {
        // A few lines: the pipe holds them, and closing it ends the input.
        stdin
            .write_all(crate::ops::stdin_config()?.as_bytes())
            .with_context(|| format!("cannot give the {name} its configuration"))?;
    }
    let (ready_tx, ready_rx) = mpsc::channel();
    if let Some(stdout) = stdout {
        std::thread::spawn(move || forward_output(stdout, ready_tx));
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(signal) = stop_requested() {
            bail!("stopped by signal {signal} while the {name} was starting");
        }
        match ready_rx.recv_timeout(POLL) {
            Ok(line) => return Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                "the {name} printed no readiness line within {} s (see its messages above; \
                 --start-timeout gives it longer)",
                timeout.as_secs_f64()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let service = services.last_mut().context("no service")?;
                let status = service.child.wait()?;
                services.pop();
                bail!(
                    "the {name} stopped before it was ready ({}); its messages are above",
                    describe(status)
                );
            }
        }
    }
}

/// Sends the first line of `stdout` to `ready`, and copies the rest to
/// our stderr, so a service never blocks on a full pipe.
fn forward_output(stdout: std::process::ChildStdout, ready: mpsc::Sender<String>) {
    let mut lines = BufReader::new(stdout).lines();
    if let Some(Ok(line)) = lines.next() {
        let _ = ready.send(line);
    }
    drop(ready);
    for line in lines.map_while(Result::ok) {
        eprintln!("{line}");
    }
}

/// Prints the readiness line, then where everything is and what to try.
fn print_addresses(plan: &Plan, addresses: &Addresses) -> Result<()> {
    let dir = plan.dir.display();
    let pool = plan.dir.join("pool");
    let store = plan.dir.join("store");
    let mut out = std::io::stdout().lock();
    let mut ready = format!(
        "strata: up: nbd {} api http://{}",
        addresses.nbd, addresses.api
    );
    if let Some(cluster) = &addresses.cluster {
        ready.push_str(&format!(" cluster {cluster}"));
    }
    if let Some(mirror) = &addresses.mirror {
        ready.push_str(&format!(" mirror nbd://{mirror}"));
    }
    writeln!(out, "{ready} dir {dir} pid {}", std::process::id())?;
    writeln!(
        out,
        "  volume daemon: NBD {} (export = volume name), API http://{}",
        addresses.nbd, addresses.api
    )?;
    writeln!(
        out,
        "    pool {}, API token {}",
        pool.display(),
        pool.join("api.token").display()
    )?;
    match &addresses.cluster {
        Some(cluster) => writeln!(
            out,
            "  object store: cluster {cluster} (UDP; all roles in one process), admin credential {}",
            store.join("admin.credential").display()
        )?,
        None => writeln!(out, "  object store: not started (--no-store)")?,
    }
    match (&addresses.mirror, &plan.mirror) {
        (Some(nbd), Some((repo, _))) => writeln!(out, "  mirror: nbd://{nbd} of {repo}")?,
        _ => writeln!(
            out,
            "  mirror: not started (give --mirror IMAGE to run one)"
        )?,
    }
    writeln!(out, "Try:")?;
    let client = format!("--pool {} --api {}", pool.display(), addresses.api);
    writeln!(out, "  strata volume create demo 1G {client}")?;
    writeln!(out, "  qemu-img info nbd://{}/demo", addresses.nbd)?;
    if let Some(cluster) = &addresses.cluster {
        let store = format!("--cluster {cluster} --dir {}", store.display());
        writeln!(
            out,
            "  echo hello > hello.txt && strata obj put {store} hello.txt demo/hello"
        )?;
        writeln!(out, "  strata obj get {store} demo/hello hello.copy")?;
    }
    writeln!(
        out,
        "Ctrl-C (or SIGTERM to pid {}) stops everything; data stays in {dir}",
        std::process::id()
    )?;
    out.flush()?;
    Ok(())
}

/// Watches the services until a signal or the death of one; stops the
/// rest and returns the exit code.
fn supervise(services: &mut Vec<Service>, stop_timeout: Duration) -> i32 {
    loop {
        if let Some(signal) = stop_requested() {
            eprintln!("strata: up: signal {signal}: stopping everything");
            return if stop_all(services, stop_timeout) {
                0
            } else {
                1
            };
        }
        for index in 0..services.len() {
            let service = &mut services[index];
            let status = match service.child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => describe(status),
                Err(e) => format!("cannot be waited for: {e}"),
            };
            eprintln!(
                "strata: up: the {} (pid {}) stopped ({status}); stopping the rest",
                service.name,
                service.child.id()
            );
            services.remove(index);
            stop_all(services, stop_timeout);
            return 1;
        }
        std::thread::sleep(POLL);
    }
}

/// Sends SIGTERM to every service (the last started first), waits up to
/// `timeout` for them, then SIGKILLs the rest. True if each stopped by
/// itself and cleanly.
fn stop_all(services: &mut Vec<Service>, timeout: Duration) -> bool {
    for service in services.iter().rev() {
        signal(service, libc::SIGTERM);
    }
    let deadline = Instant::now() + timeout;
    let mut clean = true;
    while !services.is_empty() {
        let mut index = 0;
        while index < services.len() {
            match services[index].child.try_wait() {
                Ok(None) => index += 1,
                result => {
                    let service = services.remove(index);
                    if let Ok(Some(status)) = result {
                        if !status.success() {
                            clean = false;
                            eprintln!(
                                "strata: up: the {} stopped with {}",
                                service.name,
                                describe(status)
                            );
                        }
                    }
                }
            }
        }
        if services.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            for mut service in services.drain(..) {
                eprintln!(
                    "strata: up: the {} (pid {}) did not stop within {} s of SIGTERM: killed",
                    service.name,
                    service.child.id(),
                    timeout.as_secs_f64()
                );
                // Its whole process group, should it have started helpers.
                // SAFETY: kill() with a group id we created.
                unsafe {
                    libc::kill(-(service.child.id() as libc::pid_t), libc::SIGKILL);
                }
                let _ = service.child.wait();
            }
            return false;
        }
        std::thread::sleep(POLL);
    }
    clean
}

/// Sends `signal` to a service that has not been reaped (so its pid is
/// still its own).
fn signal(service: &Service, signal: libc::c_int) {
    // SAFETY: kill() on the pid of a child we have not waited for.
    unsafe {
        libc::kill(service.child.id() as libc::pid_t, signal);
    }
}

/// An exit status in words.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: all a signal handler may safely do here.
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP ask `up` to stop; it looks every [`POLL`].
fn install_signal_handlers() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores into an atomic.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// The signal that asked to stop, if one did.
fn stop_requested() -> Option<i32> {
    let signal = STOP_SIGNAL.load(Ordering::SeqCst);
    (signal != 0).then_some(signal)
}

/// Deletes the temporary directory of a demonstration.
fn remove_demo_dir(args: &UpArgs, plan: &Plan) {
    if args.demo {
        if let Err(e) = std::fs::remove_dir_all(&plan.dir) {
            eprintln!("strata: up: could not remove {}: {e}", plan.dir.display());
        }
    }
}

/// The demonstration's steps, each printed as it is done.
fn demo(plan: &Plan, addresses: &Addresses) -> Result<()> {
    let pool = path_text(&plan.dir.join("pool"));
    let api = addresses.api.clone();
    println!(
        "strata: up: demonstration in {}: volume daemon on nbd {} api http://{api}, object store on {}",
        plan.dir.display(),
        addresses.nbd,
        addresses.cluster.as_deref().unwrap_or("(none)")
    );
    let client = ["--pool", &pool, "--api", &api];
    step(
        "created volume demo (64 MiB)",
        &strata(&[&["volume", "create", "demo", "64M"], &client[..]].concat())?,
    );
    let uri = format!("nbd://{}/demo", addresses.nbd);
    if tool_exists("qemu-io") {
        let args = [
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 0 1M",
            "-c",
            "read -P 0x5a 0 1M",
            &uri,
        ];
        let out = run_tool("qemu-io", &args)?;
        if out.contains("Pattern verification failed") {
            bail!("the demonstration read back other bytes than it wrote over {uri}: {out}");
        }
        step(
            &format!("wrote 1 MiB of 0x5a over {uri} and read it back (qemu-io)"),
            "",
        );
    } else {
        println!("  skipped: writing over NBD needs qemu-io (install qemu-utils)");
    }
    step(
        "took snapshot demo@first",
        &strata(&[&["snapshot", "create", "demo", "first"], &client[..]].concat())?,
    );
    step(
        "listed volumes",
        &strata(&[&["volume", "list"], &client[..]].concat())?,
    );
    if let Some(cluster) = &addresses.cluster {
        demo_object(plan, cluster)?;
    }
    Ok(())
}

/// Puts a small file into the store and gets it back.
fn demo_object(plan: &Plan, cluster: &str) -> Result<()> {
    let sent = plan.dir.join("hello.txt");
    let back = plan.dir.join("hello.copy");
    let text = b"hello from strata up --demo\n";
    std::fs::write(&sent, text).with_context(|| format!("cannot write {}", sent.display()))?;
    let credential = path_text(&plan.dir.join("store").join("admin.credential"));
    let store = ["--cluster", cluster, "--credential", &credential];
    strata(
        &[
            &["obj", "put"],
            &store[..],
            &[&path_text(&sent), "demo/hello.txt"],
        ]
        .concat(),
    )?;
    strata(
        &[
            &["obj", "get"],
            &store[..],
            &["demo/hello.txt", &path_text(&back)],
        ]
        .concat(),
    )?;
    let got = std::fs::read(&back).with_context(|| format!("cannot read {}", back.display()))?;
    if got != text {
        bail!("the object store gave back other bytes than were put in demo/hello.txt");
    }
    step(
        &format!(
            "put object demo/hello.txt ({} bytes) and got the same bytes back",
            text.len()
        ),
        "",
    );
    Ok(())
}

/// Prints a step done, with the command's output indented.
fn step(what: &str, output: &str) {
    println!("  {what}");
    for line in output.lines() {
        println!("    {line}");
    }
}

/// Runs `strata ARGS`; its stdout, or an error with its messages.
fn strata(args: &[&str]) -> Result<String> {
    let exe = std::env::current_exe().context("cannot find the strata binary to run")?;
    run_program(&exe, args)
}

fn run_tool(tool: &str, args: &[&str]) -> Result<String> {
    run_program(Path::new(tool), args)
}

fn run_program(program: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "`{} {}` failed ({}): {}{}",
            program.display(),
            args.join(" "),
            describe(out.status),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `tool` is an executable on PATH.
fn tool_exists(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
