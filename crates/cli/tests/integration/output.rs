//! A new user's first hour: default ports that do not collide, errors said
//! once, no colour codes off a terminal, sizes and times for people, the
//! NBD URI of a volume, labels and help texts that say what they mean,
//! `-` for stdin/stdout, and a `strata store up` that stops every node of
//! its cluster. Every test runs the real binary against real peers.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::store::Store;
use crate::common::{p, qemu_create, run_ok, tmp, Launch, Proc};
use serde_json::Value;

/// Starts `strata ARGS` in `cwd` with `env`, and waits for its readiness
/// line.
fn start_in(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Proc {
    let mut launch = Launch::strata(args).cwd(cwd);
    for (key, value) in env {
        launch = launch.env(key, value);
    }
    launch.start()
}

/// Runs `strata ARGS` in `cwd` with `env`; returns (success, stdout, stderr).
fn run_in(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().copied())
        .output()
        .expect("run strata");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `strata ARGS` must succeed; its stdout.
fn ok_in(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> String {
    let (ok, out, err) = run_in(args, cwd, env);
    assert!(ok, "strata {args:?} failed:\n{out}{err}");
    out
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every default port of the table in the README, in one place.
const SERVE_NBD: u16 = 10809;
const DAEMON_NBD: u16 = 10810;
const MIRROR_NBD: u16 = 10811;
const DAEMON_API: u16 = 10880;
const REPO_HTTP: u16 = 10881;
const STORE_ORCHESTRATOR: u16 = 10890;

/// `strata serve IMG`, `strata daemon`, `strata mirror` (and its
/// repository), and `strata store up` all start with their default ports
/// at the same time, and each answers on its own.
#[test]
fn services_run_side_by_side_with_default_ports() {
    let _host_ports = crate::common::host_ports();
    for port in [SERVE_NBD, DAEMON_NBD, MIRROR_NBD, DAEMON_API, REPO_HTTP] {
        assert!(
            TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is taken on this host: this test needs every default port free"
        );
    }
    assert!(
        UdpSocket::bind(("127.0.0.1", STORE_ORCHESTRATOR)).is_ok(),
        "UDP port {STORE_ORCHESTRATOR} is taken on this host: this test needs it free"
    );
    let home = tmp();
    let dir = home.path();
    let env = [("HOME", p(dir)), ("STRATA_POOL", p(&dir.join("pool")))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let img = dir.join("disk.qcow2");
    qemu_create(&img, "", "16M");
    let raw = dir.join("base.raw");
    std::fs::write(&raw, crate::common::pattern(4 << 20, 7)).unwrap();
    ok_in(&["mirror", "digest", &p(&raw)], dir, &env);

    let serve = start_in(&["serve", "disk.qcow2"], dir, &env);
    assert!(
        serve.line.contains(&format!("127.0.0.1:{SERVE_NBD}")),
        "{}",
        serve.line
    );
    let daemon = start_in(&["daemon", "--pool", "pool"], dir, &env);
    assert!(
        daemon.line.contains(&format!("127.0.0.1:{DAEMON_NBD}"))
            && daemon
                .line
                .contains(&format!("http://127.0.0.1:{DAEMON_API}")),
        "{}",
        daemon.line
    );
    let repo = start_in(&["mirror", "repo-serve", "base.raw"], dir, &env);
    assert!(
        repo.line.contains(&format!(":{REPO_HTTP}/")),
        "{}",
        repo.line
    );
    let url = format!("http://{}", repo.word_after("http://"));
    let mirror = start_in(&["mirror", "--repo", &url, "--dir", "m1"], dir, &env);
    assert!(
        mirror
            .line
            .contains(&format!("nbd://127.0.0.1:{MIRROR_NBD}")),
        "{}",
        mirror.line
    );
    let store = start_in(&["store", "up", "--dir", "cluster"], dir, &env);
    assert!(
        store
            .line
            .contains(&format!("127.0.0.1:{STORE_ORCHESTRATOR}")),
        "{}",
        store.line
    );

    // Each one answers, on its default port.
    let info = run_ok(
        "qemu-img",
        &["info", &format!("nbd://127.0.0.1:{SERVE_NBD}")],
    );
    assert!(info.contains("16 MiB"), "{info}");
    ok_in(&["volume", "create", "db", "8M"], dir, &env);
    let info = run_ok(
        "qemu-img",
        &["info", &format!("nbd://127.0.0.1:{DAEMON_NBD}/db")],
    );
    assert!(info.contains("8 MiB"), "{info}");
    let info = run_ok(
        "qemu-img",
        &["info", &format!("nbd://127.0.0.1:{MIRROR_NBD}")],
    );
    assert!(info.contains("4 MiB"), "{info}");
    let status = ok_in(&["store", "status", "--output", "json"], dir, &env);
    let status: Value = serde_json::from_str(&status).expect("store status json");
    assert_eq!(status["storage_nodes"].as_array().map(Vec::len), Some(1));
    for mut proc in [store, mirror, repo, daemon, serve] {
        let (code, err) = proc.stop();
        assert!(code.success(), "exit {code}: {err}");
    }
}

/// An OS error reaches the user once, with its cause chain, not once per
/// layer that wraps it.
#[test]
fn an_error_is_printed_once() {
    let dir = tmp();
    let img = dir.path().join("a.qcow2");
    qemu_create(&img, "", "1M");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let (ok, _, err) = run_in(&["serve", "--port", &port, "a.qcow2"], dir.path(), &[]);
    assert!(!ok);
    assert_eq!(err.matches("os error 98").count(), 1, "{err}");
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");
    assert!(err.starts_with("strata: ") && err.contains(&port), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A server that logs to a pipe writes no escape sequences; on a terminal
/// it colours its log unless NO_COLOR is set.
#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let dir = tmp();
    let img = dir.path().join("a.qcow2");
    qemu_create(&img, "", "1M");
    let socket = dir.path().join("s.sock");
    let uri = format!("nbd+unix:///?socket={}", p(&socket));
    // Not a terminal: stderr is a pipe.
    let mut server = start_in(
        &["serve", "-k", &p(&socket), &p(&img)],
        dir.path(),
        &[("STRATA_LOG", "debug")],
    );
    run_ok("qemu-img", &["info", &uri]);
    let (_, err) = server.stop();
    assert!(err.contains("client connected"), "no log to check: {err}");
    assert!(!err.contains('\x1b'), "escape bytes in a pipe: {err:?}");

    // A terminal (script(1) gives the server a pty), with and without NO_COLOR.
    let on_terminal = |no_color: bool| {
        let socket = dir.path().join(format!("tty-{no_color}.sock"));
        let uri = format!("nbd+unix:///?socket={}", p(&socket));
        let shell = format!(
            "{} {} serve -k {sock} {} & \
             for i in $(seq 300); do [ -S {sock} ] && break; sleep 0.1; done; \
             qemu-img info '{uri}' >/dev/null; kill $!; wait",
            if no_color { "NO_COLOR=1" } else { "" },
            env!("CARGO_BIN_EXE_strata"),
            p(&img),
            sock = p(&socket),
        );
        let out = Command::new("script")
            .args(["-qec", &shell, "/dev/null"])
            .env("STRATA_LOG", "debug")
            .env_remove("NO_COLOR")
            .output()
            .expect("run script(1)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let coloured = on_terminal(false);
    assert!(coloured.contains("client connected"), "{coloured}");
    assert!(
        coloured.contains('\x1b'),
        "no colour on a terminal: {coloured:?}"
    );
    let plain = on_terminal(true);
    assert!(plain.contains("client connected"), "{plain}");
    assert!(
        !plain.contains('\x1b'),
        "colour despite NO_COLOR: {plain:?}"
    );
}

/// A daemon on free ports, with `--insecure-local` so clients need no
/// token.
fn daemon(dir: &Path) -> (Proc, String, String) {
    let pool = dir.join("pool");
    let d = start_in(
        &[
            "daemon",
            "--pool",
            &p(&pool),
            "--nbd-port",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--insecure-local",
        ],
        dir,
        &[],
    );
    let nbd = d.word_after("over NBD on ");
    let api = d.word_after("http://");
    (d, nbd, api)
}

/// `volume info`, `volume list` and `snapshot list` show sizes and times
/// for people; `--output json` keeps the exact numbers.
#[test]
fn human_output_is_humanized_and_json_exact() {
    let dir = tmp();
    let (_daemon, _, api) = daemon(dir.path());
    let cli = |args: &[&str]| ok_in(&[args, &["--api", &api]].concat(), dir.path(), &[]);
    cli(&["volume", "create", "db", "1536M"]);
    cli(&["snapshot", "create", "db", "s1"]);
    let info = cli(&["volume", "info", "db"]);
    assert!(
        info.contains("size: 1.5 GiB (1610612736 bytes)\n"),
        "{info}"
    );
    let created = info
        .lines()
        .find_map(|l| l.strip_prefix("created: "))
        .unwrap_or_else(|| panic!("no created line: {info}"));
    assert_utc_time(created);
    assert!(
        info.contains("cluster_size: 64 KiB (65536 bytes)"),
        "{info}"
    );
    assert!(info.contains("snapshots: s1\n"), "{info}");
    let list = cli(&["volume", "list"]);
    let line = list.lines().next().unwrap_or_default();
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields[..2], ["db", "1.5 GiB"], "{list}");
    assert_utc_time(fields[2].trim_start_matches("created "));
    let snapshots = cli(&["snapshot", "list", "db"]);
    assert!(
        snapshots.starts_with("s1\t1.5 GiB\tcreated "),
        "{snapshots}"
    );

    let json: Value =
        serde_json::from_str(&cli(&["volume", "info", "db", "--output", "json"])).expect("json");
    assert_eq!(json["size"], 1_610_612_736u64);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let seconds = json["created"].as_u64().expect("created is epoch seconds");
    assert!(now.abs_diff(seconds) < 600, "{json}");
}

/// `YYYY-MM-DD HH:MM:SS UTC` of today (UTC; or of ten minutes ago, for a
/// test that runs over midnight).
fn assert_utc_time(text: &str) {
    let parts: Vec<&str> = text.split(' ').collect();
    assert!(parts.len() == 3 && parts[2] == "UTC", "{text:?}");
    let today = run_ok("date", &["-u", "+%Y-%m-%d"]);
    let before = run_ok("date", &["-u", "-d", "10 minutes ago", "+%Y-%m-%d"]);
    assert!(
        parts[0] == today.trim() || parts[0] == before.trim(),
        "{text:?} is not today (UTC)"
    );
    let clock: Vec<&str> = parts[1].split(':').collect();
    assert!(
        clock.len() == 3 && clock.iter().all(|c| c.len() == 2),
        "{text:?}"
    );
}

/// `volume info` names the URI NBD clients reach the volume at, in both
/// outputs, and a real client opens it.
#[test]
fn volume_info_shows_its_nbd_uri() {
    let dir = tmp();
    let (_daemon, nbd, api) = daemon(dir.path());
    let cli = |args: &[&str]| ok_in(&[args, &["--api", &api]].concat(), dir.path(), &[]);
    cli(&["volume", "create", "web", "4M"]);
    let uri = format!("nbd://{nbd}/web");
    let human = cli(&["volume", "info", "web"]);
    assert!(human.contains(&format!("nbd_uri: {uri}\n")), "{human}");
    let json: Value =
        serde_json::from_str(&cli(&["volume", "info", "web", "--output", "json"])).unwrap();
    assert_eq!(json["nbd_uri"], uri.as_str());
    let info = run_ok("qemu-img", &["info", &uri]);
    assert!(info.contains("4 MiB"), "{info}");
}

/// The mirror's readiness line labels its peer listen address as such,
/// and that address takes peer links.
#[test]
fn mirror_readiness_line_labels_the_peer_listen_address() {
    let dir = tmp();
    let raw = dir.path().join("base.raw");
    std::fs::write(&raw, crate::common::pattern(1 << 20, 3)).unwrap();
    ok_in(&["mirror", "digest", &p(&raw)], dir.path(), &[]);
    let repo = start_in(
        &["mirror", "repo-serve", "-p", "0", &p(&raw)],
        dir.path(),
        &[],
    );
    let url = format!("http://{}", repo.word_after("http://"));
    let mirror = start_in(
        &["mirror", "--repo", &url, "--dir", "m", "-p", "0"],
        dir.path(),
        &[],
    );
    assert!(!mirror.line.contains(" peers "), "{}", mirror.line);
    let peer: SocketAddr = mirror
        .word_after("with peer listen address ")
        .parse()
        .unwrap_or_else(|_| panic!("{}", mirror.line));
    TcpStream::connect(peer).expect("the peer listen address accepts connections");
    let alone = start_in(
        &[
            "mirror",
            "--repo",
            &url,
            "--dir",
            "m2",
            "-p",
            "0",
            "--no-peers",
        ],
        dir.path(),
        &[],
    );
    assert!(alone.line.contains(" without peers "), "{}", alone.line);
}

/// The subcommands listed under `strata ... --help`, recursively, as
/// (path, description).
fn subcommands(path: &[String], into: &mut Vec<(String, String)>) {
    let args: Vec<&str> = path.iter().map(String::as_str).chain(["--help"]).collect();
    let help = crate::common::strata_ok(&args);
    let Some(list) = help.split("Commands:\n").nth(1) else {
        return;
    };
    for line in list.lines().take_while(|l| l.starts_with("  ")) {
        let line = line.trim();
        let (name, about) = line.split_once(' ').unwrap_or((line, ""));
        if name == "help" {
            continue;
        }
        let mut sub = path.to_vec();
        sub.push(name.to_string());
        into.push((sub.join(" "), about.trim().to_string()));
        subcommands(&sub, into);
    }
}

/// Help texts say what each command does: no "(later)" in the top-level
/// one, `store node add` covers both roles it runs, and no two commands
/// share a description (a copy-pasted doc comment).
#[test]
fn help_texts_describe_their_own_command() {
    let top = crate::common::strata_ok(&["--help"]);
    assert!(!top.contains("(later)"), "{top}");
    assert!(top.contains("object store"), "{top}");
    let add = crate::common::strata_ok(&["store", "node", "add", "--help"]);
    assert!(!add.contains("only storage nodes can join"), "{add}");
    assert!(add.contains("metadata node"), "{add}");
    let mut all = Vec::new();
    subcommands(&[], &mut all);
    assert!(all.len() > 30, "{all:?}");
    for (i, (path, about)) in all.iter().enumerate() {
        assert!(!about.is_empty(), "`strata {path}` has no description");
        if let Some((other, _)) = all[..i].iter().find(|(_, a)| a == about) {
            panic!("`strata {path}` and `strata {other}` share the description {about:?}");
        }
    }
}

/// `obj put -` reads standard input and `obj get NAME -` writes standard
/// output; no file named `-` appears.
#[test]
fn obj_put_and_get_use_dash_for_stdin_and_stdout() {
    let home = tmp();
    let cluster = home.path().join("cluster");
    let store = Store::up(&cluster, &[]);
    let on = store.on;
    let data = crate::common::pattern(307_200, 11);
    let env = [
        ("STRATA_CLUSTER", on.to_string()),
        ("STRATA_CREDENTIAL", p(&cluster.join("admin.credential"))),
    ];
    let command = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
        c.args(args)
            .current_dir(home.path())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        c
    };
    let mut put = command(&["obj", "put", "-", "piped/object"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    put.stdin.take().unwrap().write_all(&data).unwrap();
    let put = put.wait_with_output().unwrap();
    assert!(put.status.success(), "{put:?}");
    let stat = command(&["obj", "stat", "piped/object", "--output", "json"])
        .output()
        .unwrap();
    let stat: Value = serde_json::from_slice(&stat.stdout).expect("stat json");
    assert_eq!(stat["size"], data.len());
    let got = command(&["obj", "get", "piped/object", "-"])
        .output()
        .unwrap();
    assert!(got.status.success(), "{got:?}");
    assert!(
        got.stdout == data,
        "stdout is not the object ({} bytes)",
        got.stdout.len()
    );
    assert!(
        !home.path().join("-").exists(),
        "a file named '-' was written"
    );
    let human = command(&["obj", "stat", "piped/object"]).output().unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("size: 300 KiB (307200 bytes)"), "{human}");
}

/// Command lines of running processes that mention `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        let line = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !zombie && line.contains(needle) && line.contains("strata") {
            found.push(line);
        }
    }
    found
}

/// The endpoint on a node's readiness line (its last word).
fn endpoint(line: &str) -> SocketAddr {
    line.split_whitespace()
        .last()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no endpoint in {line:?}"))
}

/// SIGTERM to `strata store up` stops the nodes it runs and those
/// `strata store node add` added with its key: no process of the cluster
/// is left, and every port it used is free again.
#[test]
fn store_up_stops_every_node_of_its_cluster() {
    let home = tmp();
    let cluster = home.path().join("cluster");
    let mut store = Store::up(&cluster, &[]);
    let on = store.on;
    let add = |name: &str, role: &str| {
        let node_dir: PathBuf = cluster.join(name);
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["store", "node", "add", "--cluster", &on.to_string()])
            .args(["--dir", &p(&node_dir), "--role", role])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        (child, endpoint(&line))
    };
    let (mut sn, sn_at) = add("sn2", "sn");
    let (mut mn, mn_at) = add("mn2", "mn");
    assert!(!processes_mentioning(&p(&cluster)).is_empty());
    let (status, err) = store.stop();
    assert!(status.success(), "store up exited with {status}: {err}");
    for (child, what) in [(&mut sn, "storage"), (&mut mn, "metadata")] {
        let start = Instant::now();
        let exit = loop {
            if let Some(exit) = child.try_wait().unwrap() {
                break exit;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the added {what} node outlived `strata store up`"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(exit.success(), "the added {what} node exited with {exit}");
    }
    let left = processes_mentioning(&p(&cluster));
    assert!(left.is_empty(), "processes of the cluster remain: {left:?}");
    for addr in [on, sn_at, mn_at] {
        wait_until(
            &format!("{addr} to be free"),
            Duration::from_secs(5),
            || UdpSocket::bind(addr).is_ok(),
        );
    }
    assert!(
        std::fs::read_dir(cluster.join("added-nodes"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "registrations were left behind"
    );
}

/// Runs `strata ARGS` in `cwd` with `input` on standard input (written
/// from a thread, so a large input cannot dead-lock against the output);
/// returns what it printed.
fn strata_piped(args: &[&str], cwd: &Path, input: Vec<u8>) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata");
    let mut stdin = child.stdin.take().expect("stdin");
    // A refused command may exit before reading: a broken pipe is fine.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("wait for strata");
    writer.join().expect("stdin writer");
    out
}

/// A qcow2 overlay on a qcow2 base with data in both, a zero cluster, a
/// hole and a size that is not a multiple of the 2 MiB copy step.
fn streamed_chain(dir: &Path) -> PathBuf {
    let base = dir.join("base.qcow2");
    let top = dir.join("top.qcow2");
    qemu_create(&base, "", "7M");
    crate::common::qemu_io(
        &base,
        &[
            "write -P 0x11 0 1M",
            "write -P 0x22 3M 1M",
            "write -P 0x55 6M 64k",
        ],
    );
    crate::common::qemu_overlay(&top, "base.qcow2", Some("7680k"));
    crate::common::qemu_io(
        &top,
        &[
            "write -P 0x33 512k 1M",
            "write -z 3M 64k",
            "write -P 0x44 7M 4k",
        ],
    );
    top
}

/// `img convert SRC -` writes the whole disk, zeros too, to standard
/// output, byte for byte what `qemu-img convert -O raw` writes to a file;
/// the progress report goes to standard error.
#[test]
fn convert_to_dash_writes_raw_to_stdout_like_qemu_img() {
    let dir = tmp();
    let top = streamed_chain(dir.path());
    let expected = dir.path().join("expected.raw");
    run_ok(
        "qemu-img",
        &["convert", "-O", "raw", &p(&top), &p(&expected)],
    );
    let expected = std::fs::read(&expected).unwrap();
    let out = strata_piped(
        &["img", "convert", "-p", "-O", "raw", &p(&top), "-"],
        dir.path(),
        Vec::new(),
    );
    assert!(out.status.success(), "{}", crate::common::output_text(&out));
    assert_eq!(
        out.stdout.len(),
        expected.len(),
        "length of standard output"
    );
    assert!(
        out.stdout == expected,
        "standard output differs from qemu-img's raw image"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Converted 7.5 MiB"), "{err}");
    assert!(
        !dir.path().join("-").exists(),
        "a file named '-' was written"
    );
}

/// `img convert -f raw - DST` reads a raw image of unknown length from
/// standard input: into qcow2 (longer than a step, not a multiple of
/// 512 bytes: the size is rounded up as qemu-img does) and into raw; both
/// compare equal with `qemu-img compare` and pass `qemu-img check`, and
/// `- -` passes the bytes through.
#[test]
fn convert_from_dash_reads_raw_from_stdin() {
    let dir = tmp();
    let d = dir.path();
    let mut data = crate::common::pattern(5 * 1024 * 1024 + 1000, 3);
    // Zero runs the target leaves unallocated.
    data[1 << 20..3 << 20].fill(0);
    let source = d.join("source.raw");
    std::fs::write(&source, &data).unwrap();
    for (format, name) in [("qcow2", "in.qcow2"), ("raw", "in.raw")] {
        let out = strata_piped(
            &["img", "convert", "-f", "raw", "-O", format, "-", name],
            d,
            data.clone(),
        );
        assert!(out.status.success(), "{}", crate::common::output_text(&out));
        let target = d.join(name);
        let compare = crate::common::run_tool(
            "qemu-img",
            &[
                "compare",
                "-f",
                "raw",
                "-F",
                format,
                &p(&source),
                &p(&target),
            ],
        );
        assert!(
            compare.status.success(),
            "{format}: {}",
            crate::common::output_text(&compare)
        );
    }
    assert_eq!(crate::common::qemu_check(&d.join("in.qcow2")), 0);
    let info: Value = serde_json::from_str(&run_ok(
        "qemu-img",
        &["info", "--output", "json", &p(&d.join("in.qcow2"))],
    ))
    .unwrap();
    assert_eq!(
        info["virtual-size"],
        (data.len() as u64).next_multiple_of(512)
    );
    assert!(
        info["actual-size"].as_u64().unwrap() < data.len() as u64,
        "the zero run was written: {info}"
    );
    assert_eq!(std::fs::read(d.join("in.raw")).unwrap(), data);
    let through = strata_piped(&["img", "convert", "-", "-"], d, data.clone());
    assert!(
        through.status.success(),
        "{}",
        crate::common::output_text(&through)
    );
    assert!(through.stdout == data, "`- -` changed the bytes");
    assert!(!d.join("-").exists(), "a file named '-' was written");
}

/// A stream longer than the first provisional size of a qcow2 target
/// (1 GiB) grows it, and the end is cut to the stream's length.
#[test]
fn convert_from_stdin_grows_a_qcow2_target_past_its_first_size() {
    let dir = tmp();
    let d = dir.path();
    let source = d.join("long.raw");
    let length: u64 = (1 << 30) + (3 << 20) + 512;
    let file = std::fs::File::create(&source).unwrap();
    file.set_len(length).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&crate::common::pattern(4096, 5), 4096)
        .unwrap();
    file.write_all_at(&crate::common::pattern(65536, 6), length - 65536)
        .unwrap();
    drop(file);
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["img", "convert", "-O", "qcow2", "-", "long.qcow2"])
        .current_dir(d)
        .stdin(std::fs::File::open(&source).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", crate::common::output_text(&out));
    let target = d.join("long.qcow2");
    let compare = crate::common::run_tool(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "qcow2",
            &p(&source),
            &p(&target),
        ],
    );
    assert!(
        compare.status.success(),
        "{}",
        crate::common::output_text(&compare)
    );
    assert_eq!(crate::common::qemu_check(&target), 0);
    let info: Value = serde_json::from_str(&run_ok(
        "qemu-img",
        &["info", "--output", "json", &p(&target)],
    ))
    .unwrap();
    assert_eq!(info["virtual-size"], length);
}

/// Where a file must be random access (an image opened, created or
/// served, a qcow2 stream) or is a directory, `-` is refused with a
/// message that names the argument and says why, and no file named `-`
/// appears.
#[test]
fn dash_is_refused_where_a_file_is_needed() {
    let dir = tmp();
    let d = dir.path();
    let image = d.join("disk.qcow2");
    qemu_create(&image, "", "1M");
    let image = p(&image);
    let qcow2 = std::fs::read(&image).unwrap();
    let cases: Vec<(Vec<&str>, Vec<u8>, &str)> = vec![
        (vec!["img", "info", "-"], vec![], "img info <FILENAME>: '-'"),
        (
            vec!["img", "check", "-"],
            vec![],
            "img check <FILENAME>: '-'",
        ),
        (vec!["img", "map", "-"], vec![], "img map <FILENAME>: '-'"),
        (
            vec!["img", "create", "-f", "qcow2", "-", "1M"],
            vec![],
            "img create <FILENAME>: '-'",
        ),
        (
            vec!["img", "create", "-b", "-", "new.qcow2"],
            vec![],
            "img create -b: '-'",
        ),
        (
            vec!["img", "compare", &image, "-"],
            vec![],
            "img compare <SECOND>: '-'",
        ),
        (
            vec!["img", "resize", "-", "2M"],
            vec![],
            "img resize <FILENAME>: '-'",
        ),
        (vec!["serve", "-"], vec![], "serve <IMAGE>: '-'"),
        (
            vec!["serve", "--pid-file", "-", &image],
            vec![],
            "--pid-file <PID_FILE>: '-'",
        ),
        (
            vec!["mirror", "digest", "-"],
            vec![],
            "mirror digest <IMAGE>: '-'",
        ),
        (vec!["man", "-"], vec![], "man <DIR>: '-'"),
        (
            vec!["daemon", "--pool", "-"],
            vec![],
            "daemon --pool <POOL>: '-'",
        ),
        (
            vec!["img", "convert", "-O", "qcow2", &image, "-"],
            vec![],
            "-O qcow2 cannot write to target '-' (standard output)",
        ),
        (
            vec!["img", "convert", "-f", "qcow2", "-", "out.raw"],
            qcow2.clone(),
            "cannot be read with -f qcow2",
        ),
        (
            vec!["img", "convert", "-", "out.raw"],
            qcow2,
            "standard input) holds a qcow2 image",
        ),
    ];
    for (args, input, needle) in cases {
        let out = strata_piped(&args, d, input);
        let text = crate::common::output_text(&out);
        assert!(!out.status.success(), "strata {args:?} succeeded: {text}");
        assert!(
            out.stdout.is_empty(),
            "strata {args:?} wrote to stdout: {text}"
        );
        assert!(
            text.contains(needle),
            "strata {args:?}: {text:?} lacks {needle:?}"
        );
        assert!(
            text.contains("random access")
                || text.contains("directory")
                || text.contains("pid file"),
            "strata {args:?} does not say why: {text}"
        );
        assert!(
            !d.join("-").exists(),
            "strata {args:?} made a file named '-'"
        );
        assert!(
            !d.join("out.raw").exists(),
            "strata {args:?} made its target"
        );
    }
}

/// `--config -` reads the configuration from standard input (and names
/// it so in errors); `store tenant add --out -` writes the credential to
/// standard output alone, and `obj --credential -` reads it back.
#[test]
fn configuration_and_credentials_come_through_standard_streams() {
    let home = tmp();
    let bad = strata_piped(
        &["daemon", "--config", "-", "--pool", "pool"],
        home.path(),
        b"[nonsense]\nx = 1\n".to_vec(),
    );
    let text = crate::common::output_text(&bad);
    assert!(!bad.status.success(), "{text}");
    assert!(
        text.contains("configuration from standard input (--config -): 'nonsense'"),
        "{text}"
    );
    // A valid one takes effect: [daemon] listen on a free port.
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "daemon",
            "--config",
            "-",
            "--pool",
            "pool",
            "--nbd-port",
            "0",
        ])
        .current_dir(home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    daemon
        .stdin
        .take()
        .unwrap()
        .write_all(b"[daemon]\nlisten = \"127.0.0.1:0\"\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(daemon.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(line.contains("API on http://127.0.0.1:"), "{line}");
    assert!(
        !line.contains(":10880"),
        "the configuration was ignored: {line}"
    );

    let cluster = home.path().join("cluster");
    let store = Store::up(&cluster, &[]);
    let on = store.on;
    let issued = strata_piped(
        &[
            "store",
            "tenant",
            "add",
            "--dir",
            &p(&cluster),
            "--tenant",
            "alice",
            "--out",
            "-",
        ],
        home.path(),
        Vec::new(),
    );
    assert!(
        issued.status.success(),
        "{}",
        crate::common::output_text(&issued)
    );
    let credential = String::from_utf8(issued.stdout).unwrap();
    assert!(
        credential.starts_with("# strata store tenant credential"),
        "{credential}"
    );
    assert!(credential.contains("tenant alice\n"), "{credential}");
    assert!(
        String::from_utf8_lossy(&issued.stderr).contains("to standard output"),
        "the report is not on stderr"
    );
    assert!(
        !home.path().join("-").exists(),
        "a file named '-' was written"
    );
    let data = crate::common::pattern(70_000, 9);
    let file = home.path().join("object.bin");
    std::fs::write(&file, &data).unwrap();
    let cluster_arg = on.to_string();
    let with_credential = |extra: &[&str]| -> Vec<String> {
        ["obj"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .chain([
                "--cluster".into(),
                cluster_arg.clone(),
                "--credential".into(),
                "-".into(),
            ])
            .collect()
    };
    let put = with_credential(&["put", &p(&file), "alice/object"]);
    let put: Vec<&str> = put.iter().map(String::as_str).collect();
    let posted = strata_piped(&put, home.path(), credential.clone().into_bytes());
    assert!(
        posted.status.success(),
        "{}",
        crate::common::output_text(&posted)
    );
    let get = with_credential(&["get", "alice/object", "-"]);
    let get: Vec<&str> = get.iter().map(String::as_str).collect();
    let got = strata_piped(&get, home.path(), credential.into_bytes());
    assert!(got.status.success(), "{}", crate::common::output_text(&got));
    assert!(got.stdout == data, "the object read back differs");
    let both = with_credential(&["put", "-", "alice/other"]);
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let refused = strata_piped(&both, home.path(), data);
    let text = crate::common::output_text(&refused);
    assert!(!refused.status.success(), "{text}");
    assert!(text.contains("both read standard input"), "{text}");
}
