//! The volume service end to end: the real `strata daemon`, its HTTP API
//! through the real `strata volume`/`strata snapshot` commands and curl-free
//! raw requests, NBD clients (qemu-io, qemu-img, fio), SIGKILL and restart.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{p, qemu_img, strata, strata_ok, tmp};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A running `strata daemon` on free ports.
struct Daemon {
    child: Child,
    api: String,
    nbd: String,
    pool: PathBuf,
    /// The API token (none with `--insecure-local`).
    token: Option<String>,
}

impl Daemon {
    fn start(pool: &Path) -> Daemon {
        Daemon::start_env(pool, &[])
    }

    /// Starts a daemon with extra environment variables (crash points).
    fn start_env(pool: &Path, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_with(pool, &[], env)
    }

    /// Starts a daemon with extra arguments and environment variables.
    fn start_with(pool: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut command = Command::new(env!("CARGO_BIN_EXE_strata"));
        command.envs(env.iter().copied());
        Daemon::start_command(command, pool, args)
    }

    /// Starts `command` (a `strata` with its environment) as a daemon of
    /// `pool` with `args`.
    fn start_command(mut command: Command, pool: &Path, args: &[&str]) -> Daemon {
        command.args(["daemon", "--pool", &p(pool), "--nbd-port", "0"]);
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        // Tests count layers and compact by hand: the daemon compacts on
        // its own only in the tests that ask for it.
        if !args.iter().any(|a| a.starts_with("--auto-compact")) {
            command.arg("--no-auto-compact");
        }
        let mut child = command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn strata daemon");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("readiness line");
        // "strata: daemon serving N volumes over NBD on ADDR, API on http://ADDR, pool DIR"
        let nbd = line
            .split(" on ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_else(|| panic!("no NBD address in {line:?}"))
            .to_string();
        let api = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_else(|| panic!("no API address in {line:?}"))
            .to_string();
        let token = std::fs::read_to_string(pool.join("api.token"))
            .ok()
            .filter(|_| !args.contains(&"--insecure-local"))
            .map(|t| t.trim().to_string());
        Daemon {
            child,
            api,
            nbd,
            pool: pool.to_path_buf(),
            token,
        }
    }

    /// The client options that reach this daemon: its address, and its
    /// pool, where the CLI finds the token.
    fn client_args(&self) -> Vec<String> {
        vec![
            "--api".into(),
            self.api.clone(),
            "--pool".into(),
            p(&self.pool),
        ]
    }

    fn uri(&self, volume: &str) -> String {
        format!("nbd://{}/{volume}", self.nbd)
    }

    /// `strata ARGS --api ADDR --output json`, parsed; panics on failure.
    fn cli(&self, args: &[&str]) -> Value {
        let client = self.client_args();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(client.iter().map(String::as_str));
        all.extend(["--output", "json"]);
        serde_json::from_str(&strata_ok(&all)).expect("json output")
    }

    /// `strata ARGS` expected to fail; returns stderr.
    fn cli_err(&self, args: &[&str]) -> String {
        let client = self.client_args();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(client.iter().map(String::as_str));
        let out = strata(&all);
        assert!(!out.status.success(), "strata {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// A raw HTTP request with the daemon's token: (status, body).
    fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.http_as(self.token.as_deref(), method, path, body)
    }

    /// A raw HTTP request with `token` (none: no Authorization header).
    fn http_as(&self, token: Option<&str>, method: &str, path: &str, body: &str) -> (u16, String) {
        self.try_http_as(token, method, path, body, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{method} {path} on the API at {}: {e}", self.api))
    }

    /// A raw HTTP request with `token`, each of its connect and reads
    /// bounded by `limit`: (status, body), or what went wrong.
    fn try_http_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: &str,
        limit: Duration,
    ) -> std::io::Result<(u16, String)> {
        let authorization = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let address = std::net::ToSocketAddrs::to_socket_addrs(&self.api)?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("API address {}", self.api)))?;
        let mut s = TcpStream::connect_timeout(&address, limit)?;
        s.set_read_timeout(Some(limit))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             {authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let status = text
            .get(9..12)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no HTTP status in {text:?}")))?;
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        Ok((status, body))
    }

    fn stop(mut self) {
        // SAFETY: sending SIGTERM to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let st = self.child.wait().unwrap();
        assert!(st.success(), "daemon exit {st}");
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Layer files of a pool.
fn layer_files(pool: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(pool.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every layer passes `strata img check` and `qemu-img check` and is clean.
fn check_every_layer(pool: &Path) {
    for f in layer_files(pool) {
        let path = pool.join("layers").join(&f);
        let out = strata(&["img", "check", &p(&path)]);
        assert!(
            out.status.success(),
            "strata img check {f}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(crate::common::qemu_check(&path), 0, "qemu-img check {f}");
        // The daemon stopped cleanly: no layer is left marked dirty.
        let info: Value =
            serde_json::from_str(&strata_ok(&["img", "info", "--output", "json", &p(&path)]))
                .expect("info json");
        assert_eq!(info["dirty-flag"], false, "{f} left dirty");
    }
}

/// The catalog and the files agree: every file is a catalog layer and the
/// daemon reports no problem.
fn assert_catalog_matches_files(d: &Daemon) {
    let pool = d.cli_pool();
    assert_eq!(pool["problems"], serde_json::json!([]), "{pool}");
    assert_eq!(
        pool["layers"].as_u64().unwrap() as usize,
        layer_files(&d.pool).len(),
        "catalog layers vs files"
    );
}

impl Daemon {
    fn cli_pool(&self) -> Value {
        let (status, body) = self.http("GET", "/v1/pool", "");
        assert_eq!(status, 200);
        serde_json::from_str(&body).unwrap()
    }
}

/// An interactive qemu-io on an NBD export: each command's completion
/// is its acknowledgement.
struct QemuIo {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl QemuIo {
    fn open(uri: &str) -> QemuIo {
        let mut child = Command::new("qemu-io")
            .args(["-f", "raw", uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn qemu-io");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        QemuIo {
            child,
            stdin,
            stdout,
        }
    }

    /// Runs one command and waits for its result line ("wrote"/"read"/...).
    fn run(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        // Every command we use prints exactly two lines, or an error line.
        let mut first = String::new();
        self.stdout.read_line(&mut first).unwrap();
        let first = first.trim_start_matches("qemu-io> ").to_string();
        assert!(
            !first.contains("fail") && !first.contains("error") && !first.contains("Pattern"),
            "qemu-io {cmd}: {first}"
        );
        let mut second = String::new();
        self.stdout.read_line(&mut second).unwrap();
        first
    }
}

impl Drop for QemuIo {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

/// fio writing 4 KiB blocks at random over the first 16 MiB of `uri` for
/// `runtime` seconds, verifying each block it wrote (crc32c) as it goes.
fn spawn_fio_verify(
    uri: &str,
    dir: &Path,
    runtime: u32,
) -> std::thread::JoinHandle<std::process::Output> {
    let args: Vec<String> = [
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16M",
        "--iodepth=8",
        "--time_based=1",
        &format!("--runtime={runtime}"),
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_backlog=256",
        "--verify_state_save=0",
        "--do_verify=1",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        Command::new("fio")
            .args(&args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("spawn fio")
    })
}

/// fio exited 0 with no I/O or verify error.
fn assert_fio_verified(fio: std::thread::JoinHandle<std::process::Output>) {
    let out = fio.join().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed:\n{text}");
    assert!(text.contains("err= 0"), "fio reported an error:\n{text}");
}

/// Guest content of a layer file (its chain below included), read by QEMU.
fn read_layer(pool: &Path, layer: &str, dir: &Path) -> Vec<u8> {
    let out = dir.join(format!("{layer}.raw"));
    let src = pool.join("layers").join(format!("{layer}.qcow2"));
    qemu_img(&["convert", "-O", "raw", &p(&src), &p(&out)]);
    let data = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    data
}

#[test]
fn volumes_snapshots_clones_and_restart() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    let v = d.cli(&["volume", "create", "vol-a", "64M"]);
    assert_eq!(v["size"], 64 * MIB);
    assert_eq!(v["chain_length"], 1);
    let mut io = QemuIo::open(&d.uri("vol-a"));
    io.run("write -P 0x11 0 1M");
    let snap = d.cli(&["snapshot", "create", "vol-a", "s1"]);
    assert!(snap["pause_ms"].as_f64().unwrap() > 0.0);
    io.run("write -P 0x22 512K 1M");
    d.cli(&["volume", "clone", "vol-a@s1", "clone-b"]);
    let mut io_b = QemuIo::open(&d.uri("clone-b"));
    // The clone starts as the snapshot and diverges on its own.
    io_b.run("read -P 0x11 0 1M");
    io_b.run("read -P 0 1M 1M");
    io_b.run("write -P 0x33 0 64K");
    io.run("read -P 0x11 0 512K");
    io.run("read -P 0x22 512K 1M");
    io_b.run("read -P 0x33 0 64K");
    io_b.run("read -P 0x11 64K 960K");
    drop((io, io_b));
    let list = d.cli(&["volume", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 2);
    let snaps = d.cli(&["snapshot", "list", "vol-a"]);
    assert_eq!(snaps[0]["clones"], serde_json::json!(["clone-b"]));
    // Grow: clients that connect afterwards see the new size.
    let r = d.cli(&["volume", "resize", "vol-a", "96M"]);
    assert_eq!(r["size"], 96 * MIB);
    let info = qemu_img(&["info", "--output", "json", &d.uri("vol-a")]);
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["virtual-size"], 96 * MIB);
    let mut io = QemuIo::open(&d.uri("vol-a"));
    io.run("read -P 0 95M 1M");
    io.run("write -P 0x44 95M 1M");
    drop(io);
    let metrics = d.http("GET", "/metrics", "").1;
    assert!(metrics.contains("strata_volume_chain_length{volume=\"vol-a\"} 3"));
    assert!(metrics.contains("strata_volume_snapshots_total{volume=\"vol-a\"} 1"));
    // Each 1 MiB write allocated its 16 clusters: the first into a new
    // volume, the second after the snapshot, the third past the old end.
    assert!(metrics
        .contains("strata_volume_cluster_writes_total{volume=\"vol-a\",kind=\"allocating\"} 48"));
    assert!(metrics
        .contains("strata_volume_cluster_writes_total{volume=\"vol-a\",kind=\"in_place\"} 0"));
    assert!(metrics.contains(
        "strata_volume_cluster_write_seconds_total{volume=\"vol-a\",kind=\"allocating\"}"
    ));
    assert!(metrics.contains(
        "strata_volume_op_latency_seconds_bucket{volume=\"vol-a\",op=\"write\",le=\"+Inf\"} 3"
    ));
    d.stop();

    // Restart: every volume, snapshot and export comes back.
    let d = Daemon::start(&pool);
    assert_eq!(d.cli(&["volume", "list"]).as_array().unwrap().len(), 2);
    assert_eq!(
        d.cli(&["volume", "info", "vol-a"])["snapshots"],
        serde_json::json!(["s1"])
    );
    let mut io = QemuIo::open(&d.uri("vol-a"));
    io.run("read -P 0x22 512K 1M");
    io.run("read -P 0x44 95M 1M");
    let mut io_b = QemuIo::open(&d.uri("clone-b"));
    io_b.run("read -P 0x33 0 64K");
    drop((io, io_b));
    // Deleting the origin volume keeps the layers its clone reads.
    let del = d.cli(&["volume", "delete", "vol-a"]);
    assert!(del["layers_kept"].as_u64().unwrap() >= 1, "{del}");
    let mut io_b = QemuIo::open(&d.uri("clone-b"));
    io_b.run("read -P 0x11 64K 960K");
    drop(io_b);
    assert_catalog_matches_files(&d);
    d.stop();
    check_every_layer(&pool);
}

#[test]
fn bad_api_input_is_refused_and_changes_nothing() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "v", "16M"]);
    d.cli(&["snapshot", "create", "v", "s"]);
    d.cli(&["volume", "clone", "v@s", "c"]);
    let before = (d.cli(&["volume", "list"]), layer_files(&pool), d.cli_pool());
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        ("GET", "/v1/volumes/nope", "", 404, "no volume named 'nope'"),
        ("DELETE", "/v1/volumes/nope", "", 404, "no volume"),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"v","size":1048576}"#,
            409,
            "already exists",
        ),
        (
            "POST",
            "/v1/volumes/v/resize",
            r#"{"size":1048576}"#,
            400,
            "cannot shrink",
        ),
        (
            "DELETE",
            "/v1/volumes/v/snapshots/s",
            "",
            409,
            "in use by clone(s) c",
        ),
        (
            "DELETE",
            "/v1/volumes/v/snapshots/zz",
            "",
            404,
            "no snapshot 'zz'",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":"#,
            400,
            "malformed JSON",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x"}"#,
            400,
            "missing field `size`",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":-1}"#,
            400,
            "malformed JSON",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":18446744073709551104}"#,
            400,
            "larger than the limit",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":99999999999999999999999}"#,
            400,
            "malformed JSON",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":1000}"#,
            400,
            "multiple of 512",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":1048576,"cluster_size":3000}"#,
            400,
            "cluster size 3000 must be a power of two",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":1048576,"cluster_size":4194304}"#,
            400,
            "between 512 B and 2 MiB",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":1048576,"cluster_size":4096,"extended_l2":true}"#,
            400,
            "a cluster size of at least 16 KiB (got 4096)",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":17592186044416,"cluster_size":4096}"#,
            400,
            "use a larger cluster size",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"x","size":1048576,"extended_l2":"yes"}"#,
            400,
            "malformed JSON",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"../x","size":1048576}"#,
            400,
            "invalid volume name",
        ),
        (
            "POST",
            "/v1/volumes",
            r#"{"name":"","size":1048576}"#,
            400,
            "invalid volume name",
        ),
        (
            "POST",
            "/v1/volumes/v/snapshots",
            r#"{"name":"s"}"#,
            409,
            "already has a snapshot",
        ),
        (
            "POST",
            "/v1/volumes/v/snapshots",
            r#"{"name":"a b"}"#,
            400,
            "invalid snapshot name",
        ),
        (
            "POST",
            "/v1/volumes/v/snapshots",
            r#"{"name":"s2","sync":"yes"}"#,
            400,
            "expected a boolean",
        ),
        (
            "POST",
            "/v1/volumes/v/snapshots/s/clone",
            r#"{"name":"c"}"#,
            409,
            "already exists",
        ),
        (
            "POST",
            "/v1/volumes/v/resize",
            r#"{"size":1,"x":2}"#,
            400,
            "unknown field",
        ),
        ("GET", "/v1/nothing", "", 404, "no such API route"),
    ];
    for (method, path, body, status, msg) in cases {
        let (got, reply) = d.http(method, path, body);
        assert_eq!(got, *status, "{method} {path} {body}: {reply}");
        let v: Value = serde_json::from_str(&reply).unwrap_or_else(|_| panic!("not JSON: {reply}"));
        let err = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error field: {reply}"));
        assert!(err.contains(msg), "{method} {path}: {err:?} lacks {msg:?}");
    }
    let huge = format!(
        r#"{{"name":"x","size":1048576,"pad":"{}"}}"#,
        "x".repeat(100_000)
    );
    let (got, reply) = d.http("POST", "/v1/volumes", &huge);
    assert_eq!(got, 413, "{reply}");
    assert!(reply.contains("cannot read the request body"), "{reply}");
    // The CLI shows the API's message and fails.
    assert!(d
        .cli_err(&["volume", "resize", "v", "1M"])
        .contains("cannot shrink"));
    assert!(d
        .cli_err(&["volume", "info", "nope"])
        .contains("no volume named"));
    let after = (d.cli(&["volume", "list"]), layer_files(&pool), d.cli_pool());
    assert_eq!(before, after, "a refused request changed the pool");
    d.stop();
}

/// fio with verify writes to one region while an interactive writer puts
/// numbered patterns in another, and snapshots are taken every second:
/// no I/O error, no verify failure, and each snapshot holds exactly the
/// numbered writes acknowledged before it.
#[test]
fn snapshots_under_fio_hold_exactly_the_acknowledged_writes() {
    check_snapshots_under_fio(&[]);
}

/// The same with standard L2 entries (`--extended-l2 off`).
#[test]
fn snapshots_under_fio_hold_exactly_the_acknowledged_writes_with_standard_l2() {
    check_snapshots_under_fio(&["--extended-l2", "off"]);
}

fn check_snapshots_under_fio(args: &[&str]) {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, args, &[]);
    d.cli(&["volume", "create", "busy", "64M"]);
    let fio = spawn_fio_verify(&d.uri("busy"), dir.path(), 6);
    // Numbered writes to 32 MiB.. while fio runs: 64 KiB slots, pattern k.
    let base = 32 * MIB;
    let slots = 32u64;
    let mut io = QemuIo::open(&d.uri("busy"));
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    let mut model = vec![0u8; slots as usize];
    let started = Instant::now();
    let mut k = 0u64;
    let mut next_snap = Duration::from_secs(1);
    while started.elapsed() < Duration::from_secs(5) {
        k += 1;
        let slot = (k * 7) % slots;
        let pattern = (k % 250 + 1) as u8;
        io.run(&format!("write -P {pattern} {} 64K", base + slot * 65536));
        model[slot as usize] = pattern;
        if started.elapsed() >= next_snap {
            let name = format!("s{}", expected.len());
            let r = d.cli(&["snapshot", "create", "busy", &name]);
            expected.push((
                r["snapshot"]["layer"].as_str().unwrap().to_string(),
                model.clone(),
            ));
            next_snap += Duration::from_secs(1);
        }
    }
    drop(io);
    assert_fio_verified(fio);
    assert!(expected.len() >= 3, "only {} snapshots", expected.len());
    for (layer, model) in &expected {
        let data = read_layer(&pool, layer, dir.path());
        for (slot, &pattern) in model.iter().enumerate() {
            let at = (base + slot as u64 * 65536) as usize;
            assert!(
                data[at..at + 65536].iter().all(|&b| b == pattern),
                "snapshot layer {layer}, slot {slot}: expected pattern {pattern}, found {}",
                data[at]
            );
        }
    }
    let metrics = d.http("GET", "/metrics", "").1;
    assert!(
        metrics.contains("strata_volume_errors_total{volume=\"busy\"} 0"),
        "{metrics}"
    );
    d.stop();
    check_every_layer(&pool);
}

/// SIGKILL the daemon while writes with flushes go on, at several points
/// (plain writes, in the middle of a snapshot, of a clone, of a delete);
/// after each restart every flushed write reads back, the catalog matches
/// the files, and every layer is clean.
#[test]
fn sigkill_at_any_point_loses_no_flushed_write() {
    check_sigkill_at_any_point(&[]);
}

/// The same with standard L2 entries (`--extended-l2 off`).
#[test]
fn sigkill_at_any_point_loses_no_flushed_write_with_standard_l2() {
    check_sigkill_at_any_point(&["--extended-l2", "off"]);
}

fn check_sigkill_at_any_point(args: &[&str]) {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let mut flushed: Vec<(u64, u8)> = Vec::new();
    let slots = 64u64;
    for round in 0..4u64 {
        let d = Daemon::start_with(&pool, args, &[]);
        if round == 0 {
            d.cli(&["volume", "create", "crash", "32M"]);
        }
        // Everything flushed before the previous kill is there.
        let mut io = QemuIo::open(&d.uri("crash"));
        for &(slot, pattern) in &flushed {
            io.run(&format!("read -P {pattern} {} 64K", slot * 65536));
        }
        flushed.clear();
        // Heavy unflushed writes elsewhere, cut by the kill.
        let mut heavy = Command::new("fio")
            .args([
                "--name=heavy",
                "--ioengine=nbd",
                &format!("--uri={}", d.uri("crash")),
                "--rw=randwrite",
                "--bs=16k",
                "--offset=8M",
                "--size=16M",
                "--iodepth=8",
                "--time_based=1",
                "--runtime=60",
            ])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fio");
        let mut k = 0;
        for _ in 0..30 {
            k += 1;
            let slot = (k * 13 + round * 5) % slots;
            let pattern = ((round * 50 + k) % 250 + 1) as u8;
            // qemu-io exits only once its commands completed: the write is
            // acknowledged, then flushed (or written with FUA).
            let write = format!("write -P {pattern} {} 64K", slot * 65536);
            if k % 2 == 0 {
                crate::common::run_ok(
                    "qemu-io",
                    &["-f", "raw", "-c", &write, "-c", "flush", &d.uri("crash")],
                );
            } else {
                let fua = write.replacen("write", "write -f", 1);
                crate::common::run_ok("qemu-io", &["-f", "raw", "-c", &fua, &d.uri("crash")]);
            }
            flushed.retain(|(s, _)| *s != slot);
            flushed.push((slot, pattern));
        }
        // Unflushed writes in flight at the kill may or may not survive.
        if round == 2 {
            d.cli(&["snapshot", "create", "crash", "base2"]);
        }
        let existing: Vec<String> = d
            .cli(&["volume", "list"])
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| {
                v["name"]
                    .as_str()
                    .filter(|n| n.starts_with("cl"))
                    .map(str::to_string)
            })
            .collect();
        // A stream of operations, so the kill lands in the middle of one.
        let client = d.client_args();
        let action = std::thread::spawn(move || {
            for i in 0..40 {
                let args: Vec<String> = match round {
                    0 => return,
                    1 => vec![
                        "snapshot".into(),
                        "create".into(),
                        "crash".into(),
                        format!("k{i}"),
                    ],
                    2 => vec![
                        "volume".into(),
                        "clone".into(),
                        "crash@base2".into(),
                        format!("cl{i}"),
                    ],
                    _ => match existing.get(i) {
                        Some(name) => vec!["volume".into(), "delete".into(), name.clone()],
                        None => return,
                    },
                };
                let mut all = args.clone();
                all.extend(client.iter().cloned());
                let refs: Vec<&str> = all.iter().map(String::as_str).collect();
                if !strata(&refs).status.success() {
                    return; // the daemon is gone
                }
            }
        });
        std::thread::sleep(Duration::from_millis(60 + round * 23));
        d.kill();
        let _ = heavy.kill();
        let _ = heavy.wait();
        drop(io);
        let _ = action.join();
    }
    let d = Daemon::start_with(&pool, args, &[]);
    let mut io = QemuIo::open(&d.uri("crash"));
    for &(slot, pattern) in &flushed {
        io.run(&format!("read -P {pattern} {} 64K", slot * 65536));
    }
    drop(io);
    assert_catalog_matches_files(&d);
    d.stop();
    check_every_layer(&pool);
}

/// Writes 64 KiB slot `slot` with `pattern` through `io` and records it.
fn write_slot(io: &mut QemuIo, model: &mut [u8], base: u64, slot: usize, pattern: u8) {
    io.run(&format!(
        "write -P {pattern} {} 64K",
        base + slot as u64 * 65536
    ));
    model[slot] = pattern;
}

/// Checks that every 64 KiB slot of `data` from `base` holds its pattern.
fn assert_slots(data: &[u8], base: u64, model: &[u8], what: &str) {
    for (slot, &pattern) in model.iter().enumerate() {
        let at = (base + slot as u64 * 65536) as usize;
        let found = data[at..at + 65536].iter().find(|&&b| b != pattern);
        assert!(
            found.is_none(),
            "{what}: slot {slot} should hold {pattern}, found {found:?}"
        );
    }
}

/// Guest content of an exported volume, read by QEMU over NBD.
fn read_export(d: &Daemon, volume: &str, dir: &Path) -> Vec<u8> {
    let out = dir.join(format!("{volume}.export.raw"));
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &d.uri(volume),
        &p(&out),
    ]);
    let data = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    data
}

impl Daemon {
    /// Writes `len` bytes of `pattern` at `offset` into `volume` with
    /// qemu-io over NBD (offsets and lengths as qemu-io takes them).
    fn qemu_write(&self, volume: &str, pattern: u8, offset: &str, len: &str) {
        let cmd = format!("write -P {pattern} {offset} {len}");
        crate::common::run_ok("qemu-io", &["-f", "raw", "-c", &cmd, &self.uri(volume)]);
    }

    /// Takes snapshot `name` of `volume` through the API.
    fn snapshot(&self, volume: &str, name: &str) {
        let (status, body) = self.http(
            "POST",
            &format!("/v1/volumes/{volume}/snapshots"),
            &format!("{{\"name\":\"{name}\"}}"),
        );
        assert_eq!(status, 201, "snapshot {volume}@{name}: {body}");
    }

    /// Deletes snapshot `name` of `volume` through the API.
    fn delete_snapshot(&self, volume: &str, name: &str) {
        let (status, body) = self.http(
            "DELETE",
            &format!("/v1/volumes/{volume}/snapshots/{name}"),
            "",
        );
        assert_eq!(status, 200, "delete {volume}@{name}: {body}");
    }

    /// Polls a compaction until it is no longer running.
    fn wait_compaction(&self, volume: &str, limit: Duration) -> Value {
        let started = Instant::now();
        loop {
            let (status, body) = self.http("GET", &format!("/v1/volumes/{volume}/compact"), "");
            assert_eq!(status, 200, "{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            if v["state"] != "running" {
                return v;
            }
            assert!(started.elapsed() < limit, "compaction still running: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn chain_length(&self, volume: &str) -> u64 {
        self.cli(&["volume", "info", volume])["chain_length"]
            .as_u64()
            .unwrap()
    }
}

/// Builds a chain of `layers` layers on `volume`: before each snapshot one
/// 64 KiB slot of the region at `base` is written. Keeps the snapshots in
/// `keep`, deletes the rest. Returns the model of the region.
fn build_history(d: &Daemon, volume: &str, layers: usize, base: u64, keep: &[usize]) -> Vec<u8> {
    let slots = 256usize;
    let mut model = vec![0u8; slots];
    let mut io = QemuIo::open(&d.uri(volume));
    for k in 1..layers {
        let slot = (k * 37) % slots;
        write_slot(&mut io, &mut model, base, slot, (k % 250 + 1) as u8);
        // The snapshot syncs the layer it freezes: every write so far is
        // durable once it returns.
        d.snapshot(volume, &format!("s{k}"));
    }
    drop(io);
    for k in 1..layers {
        if !keep.contains(&k) {
            d.delete_snapshot(volume, &format!("s{k}"));
        }
    }
    model
}

/// Compaction of a 200-layer chain while fio writes and verifies: the data
/// is identical before and after, the chain is shorter, a clone that shares
/// the merged layers reads as before, metrics report it, and every layer
/// passes both checks.
#[test]
fn compaction_of_200_layers_under_fio_keeps_data_and_clones() {
    check_compaction_of_200_layers(&[]);
}

/// The same with standard L2 entries (`--extended-l2 off`).
#[test]
fn compaction_of_200_layers_under_fio_keeps_data_and_clones_with_standard_l2() {
    check_compaction_of_200_layers(&["--extended-l2", "off"]);
}

fn check_compaction_of_200_layers(args: &[&str]) {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, args, &[]);
    d.cli(&["volume", "create", "vm", "64M"]);
    let base = 32 * MIB;
    let model = build_history(&d, "vm", 200, base, &[100, 150]);
    d.cli(&["volume", "clone", "vm@s100", "vmclone"]);
    d.qemu_write("vmclone", 222, "0", "1M");
    let clone_before = read_export(&d, "vmclone", dir.path());
    let info = d.cli(&["volume", "info", "vm"]);
    assert_eq!(info["chain_length"], 200, "{info}");
    assert!(
        info["reclaimable_layers"].as_u64().unwrap() >= 190,
        "{info}"
    );

    // fio writes and verifies the first 16 MiB for the whole compaction.
    let fio = spawn_fio_verify(&d.uri("vm"), dir.path(), 8);
    std::thread::sleep(Duration::from_millis(1500));
    let started = d.cli(&["volume", "compact", "vm", "--rate", "4M", "--no-wait"]);
    assert_eq!(started["state"], "running", "{started}");
    // A second compaction of the same volume is refused while one runs.
    let (status, body) = d.http("POST", "/v1/volumes/vm/compact", "{}");
    assert_eq!(status, 409, "{body}");
    let done = d.wait_compaction("vm", Duration::from_secs(60));
    assert_fio_verified(fio);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["runs_done"], 3, "{done}");
    assert!(done["layers_removed"].as_u64().unwrap() >= 190, "{done}");
    // Base run, s100, run, s150, run, top.
    assert_eq!(d.chain_length("vm"), 6);
    assert_eq!(d.cli(&["volume", "info", "vm"])["reclaimable_layers"], 0);

    assert_slots(
        &read_export(&d, "vm", dir.path()),
        base,
        &model,
        "volume after compaction",
    );
    assert_eq!(
        read_export(&d, "vmclone", dir.path()),
        clone_before,
        "the clone reads as before"
    );
    let metrics = d.http("GET", "/metrics", "").1;
    assert!(
        metrics.contains("strata_volume_compaction_progress_ratio{volume=\"vm\"} 1"),
        "{metrics}"
    );
    let removed: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("strata_volume_compaction_layers_removed_total{volume=\"vm\"} ")
        })
        .and_then(|v| v.parse().ok())
        .expect("layers removed metric");
    assert!(removed >= 190, "{removed}");
    assert!(metrics.contains("strata_volume_errors_total{volume=\"vm\"} 0"));
    assert_catalog_matches_files(&d);
    d.stop();
    check_every_layer(&pool);

    // After a restart the chain is the short one, with the same data.
    let d = Daemon::start_with(&pool, args, &[]);
    assert_eq!(d.chain_length("vm"), 6);
    assert_slots(
        &read_export(&d, "vm", dir.path()),
        base,
        &model,
        "after restart",
    );
    assert_eq!(read_export(&d, "vmclone", dir.path()), clone_before);
    d.stop();
}

/// The daemon killed at every step of a compaction (mid-copy, after the
/// merge, after the catalog commit, after the splice): after a restart the
/// volume and its clone read as before, the catalog matches the files,
/// compaction can run again, and every layer is clean.
#[test]
fn sigkill_during_compaction_loses_nothing() {
    let points = [
        "mid-copy",
        "compact-before-commit",
        "compact-after-commit",
        "compact-after-splice",
    ];
    for point in points {
        let dir = tmp();
        let pool = dir.path().join("pool");
        let env: Vec<(&str, &str)> = if point == "mid-copy" {
            vec![]
        } else {
            vec![("STRATA_FAILPOINT", point)]
        };
        let mut d = Daemon::start_env(&pool, &env);
        d.cli(&["volume", "create", "vm", "16M"]);
        let model = build_history(&d, "vm", 24, 0, &[12]);
        d.cli(&["volume", "clone", "vm@s12", "c"]);
        let clone_before = read_export(&d, "c", dir.path());
        let (status, body) = d.http("POST", "/v1/volumes/vm/compact", "{\"rate\":1048576}");
        assert_eq!(status, 202, "{point}: {body}");
        if point == "mid-copy" {
            std::thread::sleep(Duration::from_millis(300));
            d.child.kill().unwrap();
        }
        let st = d.child.wait().unwrap();
        assert!(!st.success(), "{point}: the daemon should have died");
        drop(d);

        let d = Daemon::start(&pool);
        assert_catalog_matches_files(&d);
        assert_slots(&read_export(&d, "vm", dir.path()), 0, &model, point);
        assert_eq!(
            read_export(&d, "c", dir.path()),
            clone_before,
            "{point}: clone"
        );
        // Runs committed before the kill stay merged; the rest merge now.
        d.cli(&["volume", "compact", "vm"]);
        assert_eq!(d.chain_length("vm"), 4, "{point}");
        assert_slots(&read_export(&d, "vm", dir.path()), 0, &model, point);
        assert_eq!(
            read_export(&d, "c", dir.path()),
            clone_before,
            "{point}: clone"
        );
        assert_catalog_matches_files(&d);
        d.stop();
        check_every_layer(&pool);
    }
}

/// Bad compaction requests get a clear error and change nothing.
#[test]
fn bad_compaction_requests_are_refused() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "vm", "16M"]);
    let cases = [
        (
            "POST",
            "/v1/volumes/nope/compact",
            "{}",
            404,
            "no volume named 'nope'",
        ),
        (
            "GET",
            "/v1/volumes/nope/compact",
            "",
            404,
            "no volume named 'nope'",
        ),
        (
            "GET",
            "/v1/volumes/vm/compact",
            "",
            404,
            "has not been compacted",
        ),
        (
            "POST",
            "/v1/volumes/vm/compact",
            "{\"rate\":10}",
            400,
            "below the minimum",
        ),
        (
            "POST",
            "/v1/volumes/vm/compact",
            "{\"rate\":\"fast\"}",
            400,
            "malformed JSON",
        ),
        (
            "POST",
            "/v1/volumes/vm/compact",
            "{\"speed\":1}",
            400,
            "unknown field",
        ),
        ("POST", "/v1/volumes/vm/compact", "[", 400, "malformed JSON"),
    ];
    let files = layer_files(&pool);
    for (method, path, body, want, text) in cases {
        let (status, reply) = d.http(method, path, body);
        assert_eq!(status, want, "{method} {path} {body}: {reply}");
        let v: Value = serde_json::from_str(&reply).expect("JSON error body");
        assert!(
            v["error"].as_str().unwrap().contains(text),
            "{method} {path} {body}: {reply}"
        );
    }
    assert_eq!(layer_files(&pool), files, "nothing changed");
    let err = d.cli_err(&["volume", "compact", "vm", "--rate", "1k"]);
    assert!(err.contains("below the minimum"), "{err}");
    // Nothing to merge: done at once, chain unchanged.
    let done = d.cli(&["volume", "compact", "vm"]);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["layers_removed"], 0, "{done}");
    assert_eq!(layer_files(&pool), files, "nothing changed");
    d.stop();
}

/// The daemon killed at fixed steps of snapshot, clone and delete (crash
/// points, not timing): after a restart each change is there whole or not
/// at all, data written before it reads back, the catalog matches the
/// files, and every layer is clean.
#[test]
fn sigkill_at_fixed_steps_of_each_change_is_all_or_nothing() {
    // (crash point, command, whether the change survives)
    let cases: [(&str, &[&str], bool); 6] = [
        // The new top is prepared (file written, index copied) but the
        // pause has not begun: the file is an orphan startup removes.
        (
            "switch-after-prepare",
            &["snapshot", "create", "vm", "s2"],
            false,
        ),
        (
            "switch-before-commit",
            &["snapshot", "create", "vm", "s2"],
            false,
        ),
        (
            "switch-after-commit",
            &["snapshot", "create", "vm", "s2"],
            true,
        ),
        (
            "create-before-commit",
            &["volume", "clone", "vm@base", "c2"],
            false,
        ),
        (
            "create-after-commit",
            &["volume", "clone", "vm@base", "c2"],
            true,
        ),
        ("delete-after-commit", &["volume", "delete", "c"], true),
    ];
    for (point, command, survives) in cases {
        let dir = tmp();
        let pool = dir.path().join("pool");
        let d = Daemon::start(&pool);
        d.cli(&["volume", "create", "vm", "16M"]);
        d.qemu_write("vm", 7, "0", "1M");
        d.snapshot("vm", "base");
        d.cli(&["volume", "clone", "vm@base", "c"]);
        d.qemu_write("c", 9, "1M", "1M");
        d.stop();

        let mut d = Daemon::start_env(&pool, &[("STRATA_FAILPOINT", point)]);
        let client = d.client_args();
        let mut all: Vec<&str> = command.to_vec();
        all.extend(client.iter().map(String::as_str));
        let out = strata(&all);
        assert!(
            !out.status.success(),
            "{point}: the command should lose its daemon"
        );
        let st = d.child.wait().unwrap();
        assert!(!st.success(), "{point}: the daemon should have died");
        drop(d);

        let d = Daemon::start(&pool);
        assert_catalog_matches_files(&d);
        let volumes: Vec<String> = d
            .cli(&["volume", "list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect();
        let snapshots = d.cli(&["volume", "info", "vm"])["snapshots"].clone();
        match command[..2] {
            ["snapshot", "create"] => {
                let want = if survives {
                    vec!["base", "s2"]
                } else {
                    vec!["base"]
                };
                assert_eq!(snapshots, serde_json::json!(want), "{point}");
            }
            ["volume", "clone"] => {
                assert_eq!(
                    volumes.contains(&"c2".to_string()),
                    survives,
                    "{point}: {volumes:?}"
                );
            }
            _ => assert_eq!(
                !volumes.contains(&"c".to_string()),
                survives,
                "{point}: {volumes:?}"
            ),
        }
        let mut io = QemuIo::open(&d.uri("vm"));
        io.run("read -P 7 0 1M");
        drop(io);
        if volumes.contains(&"c2".to_string()) {
            let mut io = QemuIo::open(&d.uri("c2"));
            io.run("read -P 7 0 1M");
            io.run("read -P 0 1M 1M");
        }
        if volumes.contains(&"c".to_string()) {
            let mut io = QemuIo::open(&d.uri("c"));
            io.run("read -P 9 1M 1M");
        }
        d.stop();
        check_every_layer(&pool);
    }
}

/// Snapshots, deletes, a grow and a clone while a slow compaction runs:
/// the compaction ends (merging the new runs too), and every volume reads
/// what was written, before and after a restart, with every layer clean.
#[test]
fn changes_during_a_compaction_are_kept() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "vm", "32M"]);
    // 8 MiB in the base layer: merging the lowest run takes about 8 s at
    // the slowest pace, long enough for every change below to land in it.
    d.qemu_write("vm", 9, "16M", "8M");
    let mut model = build_history(&d, "vm", 30, 0, &[10]);
    d.cli(&["volume", "clone", "vm@s10", "c"]);
    let clone_before = read_export(&d, "c", dir.path());
    let (status, body) = d.http("POST", "/v1/volumes/vm/compact", "{\"rate\":1048576}");
    assert_eq!(status, 202, "{body}");
    let mut io = QemuIo::open(&d.uri("vm"));
    write_slot(&mut io, &mut model, 0, 200, 201);
    d.snapshot("vm", "n1");
    write_slot(&mut io, &mut model, 0, 201, 202);
    d.snapshot("vm", "n2");
    write_slot(&mut io, &mut model, 0, 202, 203);
    drop(io);
    let mut at_n2 = model.clone();
    at_n2[202] = 0;
    d.delete_snapshot("vm", "n1");
    d.cli(&["volume", "resize", "vm", "48M"]);
    d.cli(&["volume", "clone", "vm@n2", "c2"]);
    d.qemu_write("c2", 77, "31M", "64K");
    let (_, mid) = d.http("GET", "/v1/volumes/vm/compact", "");
    assert!(
        mid.contains("\"running\""),
        "the changes did not overlap the compaction: {mid}"
    );
    let done = d.wait_compaction("vm", Duration::from_secs(120));
    assert_eq!(done["state"], "done", "{done}");
    let check = |d: &Daemon, what: &str| {
        let vm = read_export(d, "vm", dir.path());
        assert_eq!(vm.len() as u64, 48 * MIB, "{what}: grown size");
        assert_slots(&vm, 0, &model, what);
        let (filler, grown) = ((16 * MIB) as usize, (24 * MIB) as usize);
        assert!(
            vm[filler..grown].iter().all(|&b| b == 9),
            "{what}: base data"
        );
        assert!(vm[grown..].iter().all(|&b| b == 0), "{what}: grown part");
        assert_eq!(
            read_export(d, "c", dir.path()),
            clone_before,
            "{what}: clone c"
        );
        let c2 = read_export(d, "c2", dir.path());
        assert_slots(&c2, 0, &at_n2, what);
        assert!(
            c2[filler..grown].iter().all(|&b| b == 9),
            "{what}: c2 base data"
        );
        let own = (31 * MIB) as usize;
        assert!(
            c2[own..own + 65536].iter().all(|&b| b == 77),
            "{what}: clone c2's own write"
        );
    };
    check(&d, "after the compaction");
    assert_catalog_matches_files(&d);
    // What the compaction could not merge while the changes came in is
    // merged by the next one.
    d.cli(&["volume", "compact", "vm"]);
    assert_eq!(d.cli(&["volume", "info", "vm"])["reclaimable_layers"], 0);
    check(&d, "after a second compaction");
    d.stop();
    check_every_layer(&pool);
    let d = Daemon::start(&pool);
    check(&d, "after a restart");
    d.stop();
}

/// `--cluster-size` sets the cluster size of new volumes; their snapshots
/// and clones keep it; a size qcow2 cannot have is refused at start.
#[test]
fn the_cluster_size_of_new_volumes_is_configurable() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, &["--cluster-size", "16k"], &[]);
    d.cli(&["volume", "create", "vm", "8M"]);
    d.qemu_write("vm", 5, "4096", "4096");
    d.snapshot("vm", "s");
    d.cli(&["volume", "clone", "vm@s", "c"]);
    d.stop();
    let files = layer_files(&pool);
    assert_eq!(files.len(), 3, "{files:?}");
    for f in files {
        let path = pool.join("layers").join(&f);
        let info: Value =
            serde_json::from_str(&strata_ok(&["img", "info", "--output", "json", &p(&path)]))
                .unwrap();
        assert_eq!(info["cluster-size"], 16384, "{f}: {info}");
        // Extended L2 entries by default, in snapshots and clones too.
        assert_eq!(
            info["format-specific"]["data"]["extended-l2"], true,
            "{f}: {info}"
        );
    }
    check_every_layer(&pool);
    let out = strata(&["daemon", "--pool", &p(&pool), "--cluster-size", "3k"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("power of two"), "{err}");
}

/// A volume can ask for its own layer format at creation; its snapshots
/// and clones keep it, whatever the daemon's defaults.
#[test]
fn a_volume_can_ask_for_its_own_cluster_size() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "small", "8M", "--cluster-size", "4k"]);
    d.cli(&["volume", "create", "std", "8M", "--extended-l2", "off"]);
    d.cli(&["volume", "create", "dflt", "8M"]);
    d.qemu_write("small", 7, "8192", "12288");
    d.snapshot("small", "s");
    d.cli(&["volume", "clone", "small@s", "c"]);
    d.qemu_write("c", 9, "0", "4096");
    let info = |v: &str| d.cli(&["volume", "info", v]);
    for (v, cs, ext) in [
        ("small", 4096, false),
        ("c", 4096, false),
        ("std", 65536, false),
        ("dflt", 65536, true),
    ] {
        let i = info(v);
        assert_eq!(i["cluster_size"], cs, "{v}: {i}");
        assert_eq!(i["extended_l2"], ext, "{v}: {i}");
    }
    // The clone reads the snapshot's bytes beside its own write.
    let dump = dir.path().join("c.raw");
    crate::common::run_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &d.uri("c"), &p(&dump)],
    );
    let data = std::fs::read(&dump).unwrap();
    assert!(data[..4096].iter().all(|&b| b == 9));
    assert!(data[4096..8192].iter().all(|&b| b == 0));
    assert!(data[8192..20480].iter().all(|&b| b == 7));
    d.stop();
    // Every layer of small and of its clone has 4 KiB clusters.
    let mut small_layers = 0;
    for f in layer_files(&pool) {
        let path = pool.join("layers").join(&f);
        let i: Value =
            serde_json::from_str(&strata_ok(&["img", "info", "--output", "json", &p(&path)]))
                .unwrap();
        if i["cluster-size"] == 4096 {
            small_layers += 1;
            assert_eq!(
                i["format-specific"]["data"]["extended-l2"], false,
                "{f}: {i}"
            );
        }
    }
    assert_eq!(
        small_layers, 3,
        "small's top, its snapshot and the clone's top"
    );
    check_every_layer(&pool);
}

#[test]
fn extended_l2_can_be_turned_off() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, &["--extended-l2", "off"], &[]);
    d.cli(&["volume", "create", "vm", "8M"]);
    d.snapshot("vm", "s");
    d.stop();
    for f in layer_files(&pool) {
        let path = pool.join("layers").join(&f);
        let info: Value =
            serde_json::from_str(&strata_ok(&["img", "info", "--output", "json", &p(&path)]))
                .unwrap();
        assert_eq!(
            info["format-specific"]["data"]["extended-l2"], false,
            "{f}: {info}"
        );
    }
}

/// Deleting moves layer files into `POOL/trash/` and a background thread
/// unlinks them: a daemon killed before the unlink (crash point
/// `trash-before-unlink`) leaves them in the trash, out of `layers/`, and
/// the next start unlinks them; a plain delete empties the trash by itself.
#[test]
fn deleted_layers_go_through_the_trash() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let trash = pool.join("trash");
    let trash_files = || std::fs::read_dir(&trash).map_or(0, |r| r.count());
    let eventually = |what: &str, done: &dyn Fn() -> bool| {
        let ok = (0..300).any(|_| {
            done() || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                false
            }
        });
        assert!(ok, "{what}");
    };
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "vm", "8M"]);
    d.snapshot("vm", "s1");
    d.snapshot("vm", "s2");
    assert_eq!(layer_files(&pool).len(), 3);
    d.stop();

    let mut d = Daemon::start_env(&pool, &[("STRATA_FAILPOINT", "trash-before-unlink")]);
    // The daemon may die before or after it answers.
    let client = d.client_args();
    let mut delete = vec!["volume", "delete", "vm"];
    delete.extend(client.iter().map(String::as_str));
    let _ = strata(&delete);
    let pid = d.child.id();
    eventually("the crash point kills the daemon", &|| {
        // Gone or a zombie: the crash point fired.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
    });
    let status = d.child.wait().unwrap();
    assert!(!status.success(), "killed by its crash point");
    // The reaper may fire before the delete moved every file: the rest
    // are orphans in `layers/`, which the next start sends to the trash.
    assert!(trash_files() >= 1, "the deleted layers wait in the trash");
    assert_eq!(layer_files(&pool).len() + trash_files(), 3);

    let d = Daemon::start(&pool);
    eventually("the trash is emptied after a restart", &|| {
        trash_files() == 0
    });
    // The counter follows the files once the reaper's pass has ended.
    eventually("the pool counts no trash pending", &|| {
        d.cli_pool()["trash_pending"] == 0
    });
    assert_catalog_matches_files(&d);
    d.cli(&["volume", "create", "db", "8M"]);
    d.snapshot("db", "s1");
    d.cli(&["volume", "delete", "db"]);
    assert!(layer_files(&pool).is_empty());
    eventually("a delete empties the trash", &|| trash_files() == 0);
    d.stop();
}

/// Waits until `volume` has a standby top other than `not`, whose file
/// exists; returns its layer id.
fn wait_standby(d: &Daemon, volume: &str, not: Option<&str>) -> String {
    let started = Instant::now();
    loop {
        let info = d.cli(&["volume", "info", volume]);
        if let Some(id) = info["standby_layer"].as_str() {
            if Some(id) != not {
                assert!(
                    layer_files(&d.pool).contains(&format!("{id}.qcow2")),
                    "standby {id} has no file"
                );
                return id.to_string();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no standby top for '{volume}': {info}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// With `--standby-min-index 0` every volume's next top is prepared ahead
/// and refreshed in the background. A snapshot pushes that file (the new
/// top is the standby), with every write made before the call in the
/// snapshot, including those made after the standby was prepared; the
/// index it carries passes `strata img check`'s comparison with a walk of
/// the chain. A grow does not use it (other size) and drops it. A clean
/// stop removes the standby; after a SIGKILL, startup removes it as an
/// orphan.
#[test]
fn snapshots_push_the_standby_top_prepared_ahead() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let args = ["--standby-min-index", "0"];
    let d = Daemon::start_with(&pool, &args, &[]);
    d.cli(&["volume", "create", "vm", "256M"]);
    let slots = (256 * MIB / 65536) as usize;
    let mut model = vec![0u8; slots];
    let mut io = QemuIo::open(&d.uri("vm"));
    let spread = |i: usize| (i * 97) % slots;
    for i in 0..40 {
        write_slot(&mut io, &mut model, 0, spread(i), 1);
    }
    let standby = wait_standby(&d, "vm", None);
    // Owners change after the prepare: some before a background refresh,
    // some right before the snapshot (left to the snapshot's own passes).
    for i in 40..120 {
        write_slot(&mut io, &mut model, 0, spread(i), 2);
    }
    std::thread::sleep(Duration::from_millis(1500));
    for i in 120..200 {
        write_slot(&mut io, &mut model, 0, spread(i + 7), 3);
    }
    let at_snapshot = model.clone();
    d.snapshot("vm", "s1");
    let info = d.cli(&["volume", "info", "vm"]);
    assert_eq!(
        info["top_layer"],
        standby.as_str(),
        "snapshot used the standby"
    );
    for i in 0..60 {
        write_slot(&mut io, &mut model, 0, spread(i * 3), 4);
    }
    let s1_layer = d.cli(&["snapshot", "list", "vm"])[0]["layer"]
        .as_str()
        .unwrap()
        .to_string();
    assert_slots(
        &read_layer(&pool, &s1_layer, dir.path()),
        0,
        &at_snapshot,
        "s1",
    );
    assert_slots(&read_export(&d, "vm", dir.path()), 0, &model, "vm");

    // The keeper makes the next one; a grow does not take it.
    let next = wait_standby(&d, "vm", Some(&standby));
    d.cli(&["volume", "resize", "vm", "320M"]);
    let info = d.cli(&["volume", "info", "vm"]);
    assert_ne!(
        info["top_layer"],
        next.as_str(),
        "a grow used a standby of the old size"
    );
    assert!(
        !layer_files(&pool).contains(&format!("{next}.qcow2")),
        "stale standby kept"
    );
    write_slot(&mut io, &mut model, 0, 5, 5);
    assert_slots(
        &read_export(&d, "vm", dir.path()),
        0,
        &model,
        "vm after grow",
    );
    drop(io);
    wait_standby(&d, "vm", Some(&next));
    let catalog_layers = d.cli_pool()["layers"].as_u64().unwrap() as usize;
    d.stop();
    assert_eq!(
        layer_files(&pool).len(),
        catalog_layers,
        "standby left after a clean stop"
    );
    check_every_layer(&pool);

    // A standby left by a SIGKILL is an orphan for the next start.
    let d = Daemon::start_with(&pool, &args, &[]);
    wait_standby(&d, "vm", None);
    d.kill();
    let d = Daemon::start_with(&pool, &["--standby-min-index", "off"], &[]);
    assert_catalog_matches_files(&d);
    assert_slots(
        &read_export(&d, "vm", dir.path()),
        0,
        &model,
        "vm after restart",
    );
    d.stop();
}

/// Whether a layer file's header says dirty (written to and not sealed).
/// The daemon has the file open: `-U` reads it without taking its lock.
fn dirty_flag(path: &Path) -> bool {
    let info: Value = serde_json::from_str(&strata_ok(&[
        "img",
        "info",
        "-U",
        "--output",
        "json",
        &p(path),
    ]))
    .expect("info json");
    info["dirty-flag"].as_bool().expect("dirty-flag")
}

/// `strata_volume_frozen_layers` of `volume` in `/metrics`.
fn frozen_layers(d: &Daemon, volume: &str) -> u64 {
    let metrics = d.http("GET", "/metrics", "").1;
    let key = format!("strata_volume_frozen_layers{{volume=\"{volume}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {metrics}"))
}

/// A flush from the client, on a connection of its own.
fn client_flush(d: &Daemon, volume: &str) {
    crate::common::run_ok("qemu-io", &["-f", "raw", "-c", "flush", &d.uri(volume)]);
}

/// A snapshot's pause only freezes the old top. Its layer becomes durable
/// and complete on disk at the volume's next flush, at once with `--sync`,
/// or by the daemon within `--durable-within`; a crash before that leaves
/// it dirty, and the restart repairs it without losing a flushed write.
#[test]
fn snapshots_become_durable_at_the_next_flush_or_when_asked() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let layer_path = |r: &Value| {
        pool.join("layers").join(format!(
            "{}.qcow2",
            r["snapshot"]["layer"].as_str().expect("layer")
        ))
    };
    let first_mib = |r: &Value| {
        let layer = r["snapshot"]["layer"].as_str().unwrap().to_string();
        read_layer(&pool, &layer, dir.path())[..MIB as usize].to_vec()
    };

    // Long enough that the daemon does not seal the layers itself.
    let unhurried = ["--durable-within", "30"];
    let d = Daemon::start_with(&pool, &unhurried, &[]);
    d.cli(&["volume", "create", "lazy", "16M"]);
    let mut io = QemuIo::open(&d.uri("lazy"));
    io.run("write -P 5 0 1M");
    let s1 = d.cli(&["snapshot", "create", "lazy", "s1"]);
    assert_eq!(s1["durable"], false, "{s1}");
    assert!(dirty_flag(&layer_path(&s1)), "frozen, not sealed yet");
    assert_eq!(frozen_layers(&d, "lazy"), 1);
    // The client's flush covers the writes the snapshot froze.
    client_flush(&d, "lazy");
    assert!(!dirty_flag(&layer_path(&s1)), "sealed by the flush");
    assert_eq!(frozen_layers(&d, "lazy"), 0);
    assert!(first_mib(&s1).iter().all(|&b| b == 5));
    // `--sync`: durable and complete when the call returns.
    io.run("write -P 6 0 1M");
    let s2 = d.cli(&["snapshot", "create", "lazy", "s2", "--sync"]);
    assert_eq!(s2["durable"], true, "{s2}");
    assert!(!dirty_flag(&layer_path(&s2)));
    assert!(first_mib(&s2).iter().all(|&b| b == 6));
    drop(io);
    d.stop();
    check_every_layer(&pool);

    // Unflushed, the daemon syncs the layer itself within --durable-within.
    let d = Daemon::start_with(&pool, &["--durable-within", "1"], &[]);
    let mut io = QemuIo::open(&d.uri("lazy"));
    io.run("write -P 7 0 1M");
    let s3 = d.cli(&["snapshot", "create", "lazy", "s3"]);
    assert_eq!(s3["durable"], false, "{s3}");
    let started = Instant::now();
    while frozen_layers(&d, "lazy") > 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "never synced");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!dirty_flag(&layer_path(&s3)));
    assert!(first_mib(&s3).iter().all(|&b| b == 7));
    drop(io);
    d.stop();

    // SIGKILL before the seal: the restart repairs the dirty layer, and
    // what was flushed before the snapshot is in it and in the volume.
    let d = Daemon::start_with(&pool, &unhurried, &[]);
    d.qemu_write("lazy", 8, "0", "1M");
    let mut io = QemuIo::open(&d.uri("lazy"));
    io.run("write -P 9 1M 1M");
    let s4 = d.cli(&["snapshot", "create", "lazy", "s4"]);
    assert!(dirty_flag(&layer_path(&s4)), "still frozen at the kill");
    d.kill();
    drop(io);
    let d = Daemon::start(&pool);
    assert!(!dirty_flag(&layer_path(&s4)), "repaired at startup");
    assert_catalog_matches_files(&d);
    assert!(first_mib(&s4).iter().all(|&b| b == 8));
    let data = read_export(&d, "lazy", dir.path());
    assert!(data[..MIB as usize].iter().all(|&b| b == 8));
    d.stop();
    check_every_layer(&pool);
}

/// Bytes of `path` in the kernel's page cache (util-linux's fincore).
fn cached_bytes(path: &Path) -> u64 {
    let out = crate::common::run_ok(
        "fincore",
        &["--bytes", "--noheadings", "--output", "RES", &p(path)],
    );
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("fincore output {out:?}: {e}"))
}

/// With `--sealed-layer-cache drop`, once a snapshot's layer is durable
/// the daemon drops its pages from the page cache, so memory does not grow
/// with every snapshot; `keep` (the default) leaves them. Either way the
/// snapshot and the volume read back what was written.
#[test]
fn sealed_layers_leave_the_page_cache_unless_kept() {
    for (policy, dropped) in [("drop", true), ("keep", false)] {
        let dir = tmp();
        let pool = dir.path().join("pool");
        let d = Daemon::start_with(&pool, &["--sealed-layer-cache", policy], &[]);
        d.cli(&["volume", "create", "warm", "64M"]);
        d.qemu_write("warm", 3, "0", "8M");
        let s = d.cli(&["snapshot", "create", "warm", "s", "--sync"]);
        assert_eq!(s["durable"], true, "{s}");
        let layer = s["snapshot"]["layer"].as_str().expect("layer").to_string();
        let cached = cached_bytes(&pool.join("layers").join(format!("{layer}.qcow2")));
        if dropped {
            assert!(cached < 2 * MIB, "{policy}: {cached} bytes still cached");
        } else {
            assert!(cached >= 8 * MIB, "{policy}: only {cached} bytes cached");
        }
        let data = read_export(&d, "warm", dir.path());
        assert!(data[..8 * MIB as usize].iter().all(|&b| b == 3), "{policy}");
        assert!(read_layer(&pool, &layer, dir.path())[..8 * MIB as usize]
            .iter()
            .all(|&b| b == 3));
        d.stop();
    }
}

// ---------------------------------------------------------------------
// The API's security and limits: token, --insecure-local, connection
// cap and timeouts, JSON errors without internal paths, races, ENOSPC.
// ---------------------------------------------------------------------

/// The `error` field of a JSON error body; panics if the body is not one.
fn error_of(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body:?}"));
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field: {body}"))
        .to_string()
}

/// `strata ARGS` run in `cwd` with a clean client environment plus `env`.
fn strata_in(cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .current_dir(cwd)
        .env_remove("STRATA_API")
        .env_remove("STRATA_POOL")
        .env_remove("STRATA_TOKEN")
        .env_remove("STRATA_TOKEN_FILE")
        .envs(env.iter().copied())
        .output()
        .expect("run strata")
}

/// Runs `strata daemon ARGS`, which must exit with an error within 20 s;
/// returns its stderr.
fn daemon_refuses(pool: &Path, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["daemon", "--pool", &p(pool), "--nbd-port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata daemon");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("strata daemon {args:?} kept running: it should have refused");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "strata daemon {args:?} should fail");
    stderr
}

/// Every API request but `/metrics` needs the token the daemon made in
/// its pool (mode 0600, kept across restarts); the CLI finds it by
/// itself, from the default pool, `--pool`, `--token-file`,
/// STRATA_TOKEN_FILE or STRATA_TOKEN.
#[test]
fn the_api_needs_the_pool_token_and_the_cli_finds_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp();
    // The daemon's and the CLI's default pool, relative to the working
    // directory.
    let pool = dir.path().join("strata-pool");
    let d = Daemon::start(&pool);
    let token_file = pool.join("api.token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "token file mode {mode:o}");
    let token = d.token.clone().expect("the daemon made a token");
    assert_eq!(token.len(), 64, "{token}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");

    let wrong = "0".repeat(64);
    for (what, presented) in [
        ("no token", None),
        ("a wrong token", Some(wrong.as_str())),
        ("a short token", Some("abc")),
        ("the token with a byte more", Some(&*format!("{token}0"))),
    ] {
        for (method, path, body) in [
            ("GET", "/v1/volumes", ""),
            ("POST", "/v1/volumes", r#"{"name":"x","size":1048576}"#),
            ("GET", "/v1/nothing", ""),
        ] {
            let (status, reply) = d.http_as(presented, method, path, body);
            assert_eq!(status, 401, "{what}: {method} {path}: {reply}");
            let error = error_of(&reply);
            assert!(error.contains("api.token"), "{what}: {error}");
            assert!(!error.contains(&p(&pool)), "{what}: {error}");
        }
    }
    assert_eq!(d.http("GET", "/v1/volumes", "").0, 200);
    // Prometheus scrapers have no token: /metrics stays open.
    let (status, metrics) = d.http_as(None, "GET", "/metrics", "");
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("strata_volumes 0"), "{metrics}");
    assert!(
        layer_files(&pool).is_empty(),
        "a refused request made a layer"
    );

    // No flags at all: the address from STRATA_API, the token from the
    // default pool in the working directory.
    let api = [("STRATA_API", d.api.as_str())];
    let out = strata_in(dir.path(), &api, &["volume", "create", "v", "16M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = strata_in(dir.path(), &api, &["snapshot", "create", "v", "s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = strata_in(dir.path(), &api, &["volume", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("v\t16 MiB\tcreated "));

    // Elsewhere, without a token: 401, and the CLI says where it looked.
    let elsewhere = tmp();
    let out = strata_in(elsewhere.path(), &api, &["volume", "list"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HTTP 401") && stderr.contains("no token was found"),
        "{stderr}"
    );
    // Each other way to give the token.
    let file = p(&token_file);
    let pool_arg = p(&pool);
    // (what, environment, flags)
    type Way<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let ways: [Way; 4] = [
        ("--pool", vec![], vec!["--pool", &pool_arg]),
        ("--token-file", vec![], vec!["--token-file", &file]),
        (
            "STRATA_TOKEN_FILE",
            vec![("STRATA_TOKEN_FILE", &file)],
            vec![],
        ),
        ("STRATA_TOKEN", vec![("STRATA_TOKEN", &token)], vec![]),
    ];
    for (what, env, flags) in ways {
        let mut env = env.clone();
        env.extend(api);
        let mut args = vec!["snapshot", "list", "v"];
        args.extend(flags);
        let out = strata_in(elsewhere.path(), &env, &args);
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = strata_in(
        elsewhere.path(),
        &[("STRATA_API", &d.api), ("STRATA_TOKEN", &wrong)],
        &["volume", "list"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("came from STRATA_TOKEN"),
        "{stderr}"
    );
    d.stop();

    // A restart keeps the token.
    let d = Daemon::start(&pool);
    assert_eq!(d.token.as_deref(), Some(token.as_str()));
    assert_eq!(d.http("GET", "/v1/volumes/v", "").0, 200);
    d.stop();

    // A token file others can read is refused, not used.
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let stderr = daemon_refuses(&pool, &["--listen", "127.0.0.1:0"]);
    assert!(stderr.contains("chmod 600"), "{stderr}");
}

/// `--insecure-local` turns the token off, and is refused unless the API
/// listens on loopback only; without it any address may be given, since
/// the token guards it.
#[test]
fn insecure_local_serves_loopback_only() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, &["--insecure-local"], &[]);
    assert!(
        !pool.join("api.token").exists(),
        "no token is made without a check"
    );
    let (status, reply) = d.http_as(
        None,
        "POST",
        "/v1/volumes",
        r#"{"name":"v","size":1048576}"#,
    );
    assert_eq!(status, 201, "{reply}");
    let elsewhere = tmp();
    let out = strata_in(
        elsewhere.path(),
        &[("STRATA_API", &d.api)],
        &["volume", "info", "v"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.stop();

    for listen in ["0.0.0.0:0", "localhost.invalid:0"] {
        let stderr = daemon_refuses(
            &dir.path().join("other"),
            &["--insecure-local", "--listen", listen],
        );
        assert!(
            stderr.contains("loopback") || stderr.contains("not an address"),
            "{listen}: {stderr}"
        );
    }
    // With the token in force, a wider address is served (and guarded).
    let d = Daemon::start_with(&pool, &["--listen", "0.0.0.0:0"], &[]);
    assert!(d.api.starts_with("0.0.0.0:"), "{}", d.api);
    assert_eq!(d.http_as(None, "GET", "/v1/volumes", "").0, 401);
    assert_eq!(d.http("GET", "/v1/volumes", "").0, 200);
    d.stop();
}

/// Every error is a JSON body: 405s, axum's own rejections, bodies that
/// are too slow; numbers out of range are 400s.
#[test]
fn every_api_error_is_json() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, &["--api-body-timeout", "1"], &[]);
    d.cli(&["volume", "create", "v", "16M"]);
    let above_i64 = (i64::MAX as u64 + 1).to_string();
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("PUT", "/v1/volumes", String::new(), 405, "not allowed"),
        ("PATCH", "/v1/volumes/v", String::new(), 405, "not allowed"),
        ("POST", "/metrics", String::new(), 405, "not allowed"),
        ("POST", "/v1/volumes", "{bad".into(), 400, "malformed JSON"),
        (
            "POST",
            "/v1/volumes/v/snapshots",
            "[]".into(),
            400,
            "malformed JSON",
        ),
        ("GET", "/v1/volumes/%ff", String::new(), 400, "UTF-8"),
        (
            "POST",
            "/v1/volumes/v/compact",
            format!(r#"{{"rate":{above_i64}}}"#),
            400,
            "above the maximum",
        ),
        (
            "POST",
            "/v1/volumes/v/compact",
            r#"{"rate":18446744073709551615}"#.into(),
            400,
            "above the maximum",
        ),
        (
            "POST",
            "/v1/volumes/v/compact",
            r#"{"rate":18446744073709551616}"#.into(),
            400,
            "malformed JSON",
        ),
    ];
    for (method, path, body, status, message) in &cases {
        let (got, reply) = d.http(method, path, body);
        assert_eq!(got, *status, "{method} {path} {body}: {reply}");
        let error = error_of(&reply);
        assert!(
            error.contains(message),
            "{method} {path}: {error:?} lacks {message:?}"
        );
    }
    // The largest rate accepted is i64::MAX.
    let (status, reply) = d.http(
        "POST",
        "/v1/volumes/v/compact",
        &format!(r#"{{"rate":{}}}"#, i64::MAX),
    );
    assert_eq!(status, 202, "{reply}");
    // A body that does not arrive: 408 within the body timeout.
    let mut s = TcpStream::connect(&d.api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let token = d.token.clone().unwrap();
    write!(
        s,
        "POST /v1/volumes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 100\r\n\r\n{{\"name\":"
    )
    .unwrap();
    let started = Instant::now();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    assert!(error_of(body).contains("did not arrive"), "{body}");
    d.stop();
}

/// A daemon started with RLIMIT_NOFILE `soft` and `hard`: it lifts its
/// soft limit to the hard one itself, and cannot go past the hard one.
fn start_with_descriptor_limit(pool: &Path, args: &[&str], soft: u64, hard: u64) -> Daemon {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_strata"));
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft.min(hard),
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Daemon::start_command(command, pool, args)
}

/// This process's hard limit of open files.
fn hard_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct we own.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(status, 0, "getrlimit: {}", std::io::Error::last_os_error());
    limit.rlim_max
}

/// Open file descriptors of a process.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Open sockets of a process, counted by the kernel (`/proc/PID/fd`).
fn open_sockets(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Runs `tool ARGS`, killing it and failing the test if it takes longer
/// than `limit` (a starved NBD server leaves its clients waiting, not
/// failing); returns its stdout.
fn run_within(limit: Duration, tool: &str, args: &[&str]) -> String {
    let child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {tool}: {e}"));
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(out) = finished.recv_timeout(limit) else {
        // SAFETY: the waiting thread has not reaped it yet: the pid is ours.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        panic!("{tool} {args:?} did not finish within {limit:?}");
    };
    let out = out.unwrap_or_else(|e| panic!("wait for {tool}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// What the flood's children last reported, summed.
#[derive(Debug, Default, Clone, Copy)]
struct FloodState {
    /// Sockets held open.
    held: usize,
    /// Connections that completed and sent their partial head.
    connected: usize,
    /// Connects that failed.
    failed: usize,
    /// Connections the server closed.
    closed: usize,
}

/// Half-open connections to one address, held by `tests/integration/half_open.py`
/// children (one process cannot hold more sockets than its descriptor
/// limit). Dropping it kills them all.
struct HalfOpenFlood {
    children: Vec<Child>,
    /// (child index, report line) from every child's stdout.
    reports: std::sync::mpsc::Receiver<(usize, String)>,
    /// Each child's last "state" report.
    states: Vec<FloodState>,
    /// Each child's "opened" count, once it sent it.
    opened: Vec<Option<usize>>,
}

impl HalfOpenFlood {
    /// Starts enough children to open `total` connections to `address`,
    /// at most 5,000 each.
    fn start(address: &str, total: usize) -> HalfOpenFlood {
        let (host, port) = address.rsplit_once(':').expect("host:port");
        // Leave each child room for its own files.
        let per_child = (hard_file_limit() as usize)
            .saturating_sub(64)
            .clamp(1, 5000);
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/integration/half_open.py"
        );
        let (report, reports) = std::sync::mpsc::channel();
        let mut flood = HalfOpenFlood {
            children: Vec::new(),
            reports,
            states: Vec::new(),
            opened: Vec::new(),
        };
        let mut left = total;
        while left > 0 {
            let count = left.min(per_child);
            left -= count;
            let index = flood.children.len();
            let mut child = Command::new("python3")
                .args([script, host, port, &count.to_string(), &index.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn python3 half_open.py");
            let stdout = BufReader::new(child.stdout.take().expect("child stdout"));
            let report = report.clone();
            std::thread::spawn(move || {
                for line in stdout.lines().map_while(Result::ok) {
                    if report.send((index, line)).is_err() {
                        return;
                    }
                }
            });
            flood.children.push(child);
            flood.states.push(FloodState::default());
            flood.opened.push(None);
        }
        flood
    }

    /// Takes one report line into account.
    fn take(&mut self, index: usize, line: &str) {
        let fields: Vec<usize> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        match (line.split_whitespace().next(), fields.as_slice()) {
            (Some("opened"), [n]) => self.opened[index] = Some(*n),
            (Some("state"), [held, connected, failed, closed]) => {
                self.states[index] = FloodState {
                    held: *held,
                    connected: *connected,
                    failed: *failed,
                    closed: *closed,
                }
            }
            _ => panic!("half_open.py {index}: unexpected report {line:?}"),
        }
    }

    /// Waits until every child has created all its sockets and started
    /// their connects; returns how many they hold in all.
    fn wait_opened(&mut self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        while self.opened.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok((index, line)) => self.take(index, &line),
                Err(e) => panic!(
                    "the flood's children did not all open their sockets within {limit:?} \
                     ({e}; opened {:?})",
                    self.opened
                ),
            }
        }
        self.opened.iter().flatten().sum()
    }

    /// Waits until every connect has completed (the kernel's backlog
    /// takes them even while the server does not accept), so NBD is used
    /// under the whole flood; returns the children's reports, summed.
    fn wait_connected(&mut self, limit: Duration) -> FloodState {
        let deadline = Instant::now() + limit;
        let opened: usize = self.opened.iter().flatten().sum();
        loop {
            let state = self.state();
            if state.connected >= opened {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {opened} connections completed within {limit:?}: {state:?}",
                state.connected
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The children's latest reports, summed.
    fn state(&mut self) -> FloodState {
        while let Ok((index, line)) = self.reports.try_recv() {
            self.take(index, &line);
        }
        self.states
            .iter()
            .fold(FloodState::default(), |sum, s| FloodState {
                held: sum.held + s.held,
                connected: sum.connected + s.connected,
                failed: sum.failed + s.failed,
                closed: sum.closed + s.closed,
            })
    }

    /// Sockets the children hold, counted by the kernel.
    fn kernel_sockets(&self) -> usize {
        self.children.iter().map(|c| open_sockets(c.id())).sum()
    }

    /// Closes the children's stdin (their signal to close every socket
    /// and exit) and waits for them, up to `limit`.
    fn release(mut self, limit: Duration) {
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        let deadline = Instant::now() + limit;
        for child in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        assert!(status.success(), "half_open.py exited with {status}");
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    other => panic!("half_open.py did not exit within {limit:?}: {other:?}"),
                }
            }
        }
    }
}

impl Drop for HalfOpenFlood {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes two 1 MiB runs into `volume` over NBD with qemu-io, reads them
/// back on the same connection, then reads the whole export over a second
/// connection with qemu-img and checks it against the model.
fn round_trip_over_nbd(d: &Daemon, volume: &str, pattern: u8, dir: &Path) {
    const LIMIT: Duration = Duration::from_secs(15);
    let uri = d.uri(volume);
    let second = pattern.wrapping_add(1);
    let out = run_within(
        LIMIT,
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -P {pattern} 0 1M"),
            "-c",
            &format!("write -P {second} 40M 1M"),
            "-c",
            &format!("read -P {pattern} 0 1M"),
            "-c",
            &format!("read -P {second} 40M 1M"),
            &uri,
        ],
    );
    assert!(
        !out.contains("fail") && !out.contains("error"),
        "qemu-io on {volume}: {out}"
    );
    let copy = dir.join(format!("{volume}.export.raw"));
    run_within(
        LIMIT,
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, &p(&copy)],
    );
    let data = std::fs::read(&copy).expect("read the export's copy");
    std::fs::remove_file(&copy).expect("remove the export's copy");
    let mut model = vec![0u8; 64 * MIB as usize];
    model[..MIB as usize].fill(pattern);
    model[40 * MIB as usize..41 * MIB as usize].fill(second);
    assert_eq!(data.len(), model.len(), "{volume}: export size");
    // Compared whole first: a byte-by-byte search is slow in a debug build.
    if data != model {
        let i = data.iter().zip(&model).position(|(a, b)| a != b);
        let i = i.expect("different contents of the same size differ somewhere");
        panic!(
            "{volume}: byte {i} read over NBD is {:#x}, written {:#x}",
            data[i], model[i]
        );
    }
}

/// 20,000 half-open API connections (a partial request head, then
/// nothing), held by several processes, against a daemon with at most
/// 16,384 descriptors: every volume is still written and read over
/// NBD while they are held, the API answers while they are held and again
/// once they are gone, and the daemon's descriptors stay near the API's
/// connection cap (256). Without the cap the daemon would run out of
/// descriptors and NBD clients would hang.
#[test]
fn half_open_api_connections_starve_neither_the_api_nor_nbd() {
    const HALF_OPEN: usize = 20_000;
    const VOLUMES: [&str; 3] = ["a", "b", "c"];
    let started = Instant::now();
    let dir = tmp();
    let pool = dir.path().join("pool");
    // Fewer descriptors than half-open connections, so accepting them all
    // would exhaust the daemon and leave NBD clients hanging; 1,024 soft,
    // as most hosts start.
    let mut d = start_with_descriptor_limit(&pool, &[], 1024, hard_file_limit().min(16_384));
    for volume in VOLUMES {
        d.cli(&["volume", "create", volume, "64M"]);
    }
    // What the daemon holds before any flood: its listeners, the pool's
    // files, its runtime's own descriptors.
    let baseline = open_descriptors(d.child.id());

    let mut flood = HalfOpenFlood::start(&d.api, HALF_OPEN);
    let held = flood.wait_opened(Duration::from_secs(20));
    let sockets = flood.kernel_sockets();
    eprintln!(
        "{} processes hold {held} sockets ({sockets} by /proc) after {:?}: {:?}",
        flood.children.len(),
        started.elapsed(),
        flood.state()
    );
    assert!(held >= HALF_OPEN, "only {held} sockets opened");
    assert!(sockets >= HALF_OPEN, "/proc counts only {sockets} sockets");
    let connected = flood.wait_connected(Duration::from_secs(20));
    eprintln!(
        "all connected after {:?}: {connected:?}; daemon holds {} descriptors",
        started.elapsed(),
        open_descriptors(d.child.id())
    );

    let flooded = Instant::now();
    for (volume, pattern) in VOLUMES.iter().zip([0x11u8, 0x22, 0x33]) {
        round_trip_over_nbd(&d, volume, pattern, dir.path());
    }
    let during = flood.state();
    let descriptors = open_descriptors(d.child.id());
    eprintln!(
        "NBD round trips on {} volumes took {:?}; flood {during:?}; daemon holds {descriptors} \
         descriptors",
        VOLUMES.len(),
        flooded.elapsed()
    );
    // The API's 256, plus NBD connections that were just closed and
    // files the round trips opened: far below the thousands an uncapped
    // accept loop reaches.
    assert!(
        descriptors <= baseline + 256 + 96,
        "the daemon holds {descriptors} descriptors ({baseline} before the flood) with a cap \
         of 256 API connections"
    );
    assert!(
        flood.kernel_sockets() >= HALF_OPEN,
        "the flood's sockets were not all held through the NBD round trips"
    );

    let asked = Instant::now();
    let (status, reply) = d.http("GET", "/v1/volumes", "");
    let answered = asked.elapsed();
    eprintln!("API answered in {answered:?} under the flood");
    assert_eq!(status, 200, "{reply}");
    assert!(
        answered < Duration::from_secs(3),
        "the API answered after {answered:?} under the flood"
    );

    flood.release(Duration::from_secs(10));
    let released = Instant::now();
    let answer = loop {
        match d.try_http_as(
            d.token.as_deref(),
            "GET",
            "/v1/volumes",
            "",
            Duration::from_secs(1),
        ) {
            Ok(answer) => break answer,
            Err(e) if released.elapsed() < Duration::from_secs(5) => {
                eprintln!("API not answering yet after the release: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("the API did not answer within 5 s of the release: {e}"),
        }
    };
    eprintln!("API answered {:?} after the release", released.elapsed());
    assert_eq!(answer.0, 200, "{}", answer.1);
    let listed: Value = serde_json::from_str(&answer.1).expect("volume list json");
    let names: Vec<&str> = listed
        .as_array()
        .expect("a list of volumes")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(names, VOLUMES, "{listed}");
    assert!(
        d.child.try_wait().expect("daemon status").is_none(),
        "the daemon died under the flood"
    );
    d.stop();
    eprintln!("whole test took {:?}", started.elapsed());
}

/// A connection that sends no complete request head is closed after the
/// header timeout, even with slots to spare.
#[test]
fn a_connection_that_sends_no_request_head_is_closed() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(&pool, &["--api-header-timeout", "1"], &[]);
    let mut idle = TcpStream::connect(&d.api).unwrap();
    let mut partial = TcpStream::connect(&d.api).unwrap();
    partial.write_all(b"GET /v1/pool HTTP/1.1\r\n").unwrap();
    let started = Instant::now();
    for s in [&mut idle, &mut partial] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buffer = Vec::new();
        // EOF (or a reset), not a read timeout.
        match s.read_to_end(&mut buffer) {
            Ok(_) => {}
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
    }
    let closed = started.elapsed();
    assert!(closed < Duration::from_secs(4), "closed after {closed:?}");
    d.stop();
}

/// The API on a Unix socket: mode 0600, the same token, the same JSON.
#[test]
fn the_api_can_listen_on_a_private_unix_socket() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;
    let dir = tmp();
    let pool = dir.path().join("pool");
    let socket = dir.path().join("api.sock");
    let d = Daemon::start_with(&pool, &["--api-socket", &p(&socket)], &[]);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let ask = |token: Option<&str>| {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let authorization = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "GET /v1/pool HTTP/1.1\r\nHost: x\r\n{authorization}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    assert!(ask(None).starts_with("HTTP/1.1 401"));
    assert!(ask(d.token.as_deref()).starts_with("HTTP/1.1 200"));
    d.stop();
    assert!(!socket.exists(), "the socket file is removed at shutdown");
}

/// Clones racing deletes of their source, creates racing deletes of the
/// same name: each side gets its answer or a clean 404/409, never a 500
/// or a message with a file path, and the pool stays consistent.
#[test]
fn races_between_changes_give_clean_answers() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    let pool_path = p(&pool);
    let clean = |what: &str, status: u16, reply: &str, allowed: &[u16]| {
        assert!(allowed.contains(&status), "{what}: {status} {reply}");
        if status >= 400 {
            let error = error_of(reply);
            assert!(
                !error.contains(&pool_path) && !error.contains(".qcow2"),
                "{what}: {error}"
            );
        }
    };
    // How often each race went each way, for the log.
    let mut clones_gone = 0;
    let mut clones_mid_way = 0;
    let mut deletes_during_create = 0;
    for round in 0..12 {
        let source = format!("src{round}");
        d.cli(&["volume", "create", &source, "16M"]);
        d.cli(&["snapshot", "create", &source, "s"]);
        let clone_path = format!("/v1/volumes/{source}/snapshots/s/clone");
        let delete_path = format!("/v1/volumes/{source}");
        std::thread::scope(|scope| {
            let cloner =
                scope.spawn(|| d.http("POST", &clone_path, &format!(r#"{{"name":"c{round}"}}"#)));
            // Vary who starts first.
            std::thread::sleep(Duration::from_micros(700 * (round % 6)));
            let (status, reply) = d.http("DELETE", &delete_path, "");
            clean("delete of the source", status, &reply, &[200]);
            let (status, reply) = cloner.join().unwrap();
            clean("clone", status, &reply, &[201, 404]);
            clones_gone += usize::from(status == 404);
            clones_mid_way += usize::from(reply.contains("while the clone was being made"));
        });
        let name = format!("new{round}");
        let path = format!("/v1/volumes/{name}");
        std::thread::scope(|scope| {
            let creator = scope.spawn(|| {
                d.http(
                    "POST",
                    "/v1/volumes",
                    &format!(r#"{{"name":"{name}","size":1048576}}"#),
                )
            });
            // Delete until the volume is gone: 404 before it exists, 409
            // while it is being made, 200 once.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, reply) = d.http("DELETE", &path, "");
                clean("delete of a new volume", status, &reply, &[200, 404, 409]);
                deletes_during_create += usize::from(status == 409);
                if status == 200 || Instant::now() > deadline {
                    break;
                }
            }
            let (status, reply) = creator.join().unwrap();
            clean("create", status, &reply, &[201]);
        });
    }
    eprintln!(
        "12 rounds: {clones_gone} clones found their source deleted \
         ({clones_mid_way} of them mid-way), {deletes_during_create} deletes found their \
         volume being created"
    );
    assert_catalog_matches_files(&d);
    d.stop();
    let d = Daemon::start(&pool);
    assert_eq!(d.cli_pool()["problems"], serde_json::json!([]));
    d.stop();
}

/// A pool on a full file system: snapshots, creates and clones are 507
/// with a message naming no file, leave no layer file behind, and work
/// again once there is room.
#[test]
fn a_full_file_system_gives_507_and_leaves_no_file() {
    let dir = tmp();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let Some(_mounted) = crate::common::disk::mount_tmpfs(&small, "24m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root); the ENOSPC case is not tested");
        return;
    };
    let pool = small.join("pool");
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "v", "64M"]);
    d.cli(&["snapshot", "create", "v", "s0", "--sync"]);
    let filler = crate::common::disk::fill(&small);
    let before = layer_files(&pool);
    let cases = [
        ("snapshot", "/v1/volumes/v/snapshots", r#"{"name":"s1"}"#),
        ("create", "/v1/volumes", r#"{"name":"w","size":1048576}"#),
        (
            "clone",
            "/v1/volumes/v/snapshots/s0/clone",
            r#"{"name":"c"}"#,
        ),
    ];
    for (what, path, body) in cases {
        let (status, reply) = d.http("POST", path, body);
        assert_eq!(status, 507, "{what}: {reply}");
        let error = error_of(&reply);
        assert!(error.contains("full"), "{what}: {error}");
        assert!(
            !error.contains(&p(&small)) && !error.contains(".qcow2"),
            "{what}: {error}"
        );
        assert_eq!(layer_files(&pool), before, "a failed {what} left a file");
    }
    let volumes = d.cli(&["volume", "list"]);
    assert_eq!(volumes.as_array().map(Vec::len), Some(1), "{volumes}");
    std::fs::remove_file(&filler).unwrap();
    let (status, reply) = d.http("POST", "/v1/volumes/v/snapshots", r#"{"name":"s1"}"#);
    assert_eq!(status, 201, "{reply}");
    assert_eq!(layer_files(&pool).len(), before.len() + 1);
    assert_catalog_matches_files(&d);
    d.stop();
}

/// A snapshot loop with deletes, and no manual step: the daemon compacts
/// on its own, so the chain stays short while the loop runs and ends with
/// no layer that could be merged away, the catalog and the files agree,
/// and the volume reads exactly what was written.
#[test]
fn deleted_snapshots_give_their_space_back_without_a_manual_step() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start_with(
        &pool,
        &["--auto-compact-layers", "4", "--auto-compact-period", "0.2"],
        &[],
    );
    d.cli(&["volume", "create", "v", "64M"]);
    let rounds = 40;
    let mut model = vec![0u8; 256];
    let mut io = QemuIo::open(&d.uri("v"));
    let mut longest = 0;
    for k in 1..=rounds {
        write_slot(&mut io, &mut model, 0, (k * 37) % 256, (k % 250 + 1) as u8);
        d.snapshot("v", &format!("s{k}"));
        if k > 1 {
            d.delete_snapshot("v", &format!("s{}", k - 1));
        }
        longest = longest.max(d.chain_length("v"));
    }
    drop(io);
    assert!(
        longest < rounds as u64 - 10,
        "the chain grew to {longest} layers of {}: nothing compacted during the loop",
        rounds + 1
    );
    // Left: one merged layer of the deleted snapshots, the kept
    // snapshot's layer and the top.
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.chain_length("v") > 3 {
        assert!(
            Instant::now() < deadline,
            "still {} layers a minute after the loop",
            d.chain_length("v")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    d.wait_compaction("v", Duration::from_secs(60));
    assert_slots(
        &read_export(&d, "v", dir.path()),
        0,
        &model,
        "after compactions",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Merged layers go through the trash in the background.
        let pool_info = d.cli_pool();
        if pool_info["layers"].as_u64() == Some(layer_files(&d.pool).len() as u64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "layer files left behind: {pool_info}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_catalog_matches_files(&d);
    d.stop();
    check_every_layer(&pool);
}

/// QEMU's tools cannot write a layer the daemon holds: the live top is
/// not even readable without -U, a snapshot's sealed layer is readable
/// but not writable, and no refused attempt changes a byte.
#[test]
fn qemu_tools_cannot_write_a_live_volume_s_layers() {
    let dir = tmp();
    let pool = dir.path().join("pool");
    let d = Daemon::start(&pool);
    d.cli(&["volume", "create", "v", "64M"]);
    d.qemu_write("v", 0x3c, "0", "1M");
    let (status, body) = d.http(
        "POST",
        "/v1/volumes/v/snapshots",
        "{\"name\":\"s1\",\"sync\":true}",
    );
    assert_eq!(status, 201, "{body}");
    d.qemu_write("v", 0x4d, "1M", "1M");
    let files = layer_files(&pool);
    assert_eq!(files.len(), 2, "a snapshot's layer and the top: {files:?}");
    let mut readable_without_share = 0;
    for file in &files {
        let path = pool.join("layers").join(file);
        let before = std::fs::read(&path).expect("read layer");
        let write = Command::new("qemu-io")
            .args(["-c", "write -P 0x77 0 4k", &p(&path)])
            .output()
            .expect("qemu-io");
        let said = String::from_utf8_lossy(&write.stderr);
        assert!(
            !write.status.success() && said.contains("lock"),
            "qemu-io wrote {file} while the daemon held it: {said}"
        );
        let info = Command::new("qemu-img")
            .args(["info", &p(&path)])
            .output()
            .expect("qemu-img");
        if info.status.success() {
            readable_without_share += 1;
        }
        let shared = Command::new("qemu-img")
            .args(["info", "-U", &p(&path)])
            .output()
            .expect("qemu-img");
        assert!(shared.status.success(), "qemu-img info -U {file}");
        assert!(
            std::fs::read(&path).expect("read layer") == before,
            "a refused opener changed {file}"
        );
    }
    assert_eq!(
        readable_without_share, 1,
        "only the sealed snapshot layer is open to readers"
    );
    d.stop();
}
