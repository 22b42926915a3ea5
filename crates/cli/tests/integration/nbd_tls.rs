//! NBD over TLS with real peers: `strata serve` and `strata daemon` with
//! `--tls-creds`, credentials made by the `openssl` command at the start
//! of each test, and QEMU (tls-creds-x509 objects) and libnbd (`nbds://`
//! URIs) as clients.
//!
//! Each server runs as its own process on a loopback port chosen by the
//! kernel (read from its readiness line); a [`Proc`] kills its process
//! when dropped, even when the test panics, and the test's failure
//! message carries the server's stderr.

use crate::common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// Credentials

/// The directories a test's peers use.
struct Creds {
    /// The server's: ca-cert.pem, server-cert.pem, server-key.pem.
    server: PathBuf,
    /// A client with a certificate: ca-cert.pem, client-cert.pem,
    /// client-key.pem (QEMU's and libnbd's layout alike).
    client: PathBuf,
    /// A client without one: ca-cert.pem only.
    anonymous: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command (Debian package openssl) is needed");
    assert!(
        out.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a CA, a server certificate for 127.0.0.1 and localhost, and a
/// client certificate, all signed by the CA (P-256 keys: quick to make).
fn make_creds(root: &Path) -> Creds {
    let work = root.join("pki");
    std::fs::create_dir_all(&work).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2"]);
    ca.extend(["-subj", "/CN=strata-test-ca"]);
    ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(&work, &ca);
    for (who, usage, san) in [
        ("server", "serverAuth", "IP:127.0.0.1,DNS:localhost"),
        ("client", "clientAuth", "DNS:client"),
    ] {
        let key = format!("{who}-key.pem");
        let csr = format!("{who}.csr");
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr]);
        let subject = format!("/CN={who}");
        req.extend(["-subj", &subject]);
        openssl(&work, &req);
        let ext = format!("{who}.ext");
        std::fs::write(
            work.join(&ext),
            format!(
                "basicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\n\
                 extendedKeyUsage={usage}\nsubjectAltName={san}\n"
            ),
        )
        .unwrap();
        let cert = format!("{who}-cert.pem");
        let serial = if who == "server" { "2" } else { "3" };
        openssl(
            &work,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-set_serial",
                serial,
                "-days",
                "2",
                "-out",
                &cert,
                "-extfile",
                &ext,
            ],
        );
    }
    let place = |name: &str, files: &[&str]| {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for f in files {
            std::fs::copy(work.join(f), dir.join(f)).unwrap();
        }
        dir
    };
    Creds {
        server: place(
            "server",
            &["ca-cert.pem", "server-cert.pem", "server-key.pem"],
        ),
        client: place(
            "client",
            &["ca-cert.pem", "client-cert.pem", "client-key.pem"],
        ),
        anonymous: place("anonymous", &["ca-cert.pem"]),
    }
}

// ---------------------------------------------------------------------------
// Processes

/// What a server prints on its readiness line.
impl Proc {
    /// The port of the NBD address on the readiness line.
    fn nbd_port(&self) -> u16 {
        let addr = self
            .line
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:") || w.starts_with("0.0.0.0:"))
            .unwrap_or_else(|| panic!("no address on the readiness line {:?}", self.line));
        let port = addr.trim_end_matches(',').rsplit(':').next().unwrap();
        port.parse().expect("port")
    }
}

/// `strata serve ARGS... IMAGE` on a kernel-chosen loopback port.
fn serve(dir: &Path, image: &Path, args: &[&str]) -> Proc {
    let mut all = vec!["serve", "--bind", "127.0.0.1", "--port", "0"];
    all.extend(args);
    let image = p(image);
    all.push(&image);
    Launch::strata(&all)
        .log(dir.join("serve.log"))
        .try_start()
        .unwrap_or_else(|e| panic!("strata serve: {e}"))
}

/// A 64 MiB qcow2 image.
fn image(dir: &Path) -> PathBuf {
    let path = dir.join("disk.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &p(&path), "64M"]);
    path
}

/// Runs a tool with a time limit; its output.
fn run(tool: &str, args: &[&str]) -> Output {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {tool}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(tool: &str, args: &[&str]) -> String {
    let out = run(tool, args);
    assert!(out.status.success(), "{tool} {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// QEMU's client object for credentials in `dir`.
fn qemu_object(dir: &Path) -> String {
    format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        dir.display()
    )
}

/// QEMU's --image-opts for the default export at `port` over TLS.
fn qemu_tls_image(port: u16) -> String {
    format!("driver=nbd,host=127.0.0.1,port={port},tls-creds=tls0")
}

/// `qemu-img info` over TLS.
fn qemu_info(dir: &Path, port: u16) -> Output {
    run(
        "qemu-img",
        &[
            "info",
            "--object",
            &qemu_object(dir),
            "--image-opts",
            &qemu_tls_image(port),
        ],
    )
}

/// `qemu-io -c CMD...` over TLS; fails the test on any error.
fn qemu_io_tls(dir: &Path, port: u16, cmds: &[&str]) {
    let object = qemu_object(dir);
    let image = qemu_tls_image(port);
    let mut args = vec!["--object", &object, "--image-opts", &image];
    for c in cmds {
        args.extend(["-c", c]);
    }
    let out = ok("qemu-io", &args);
    assert!(
        !out.contains("failed") && !out.contains("error") && !out.contains("Pattern verification"),
        "qemu-io over TLS: {out}"
    );
}

fn nbds_uri(port: u16, dir: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{port}/?tls-certificates={}",
        dir.display()
    )
}

// ---------------------------------------------------------------------------
// Tests

/// (a) QEMU with tls-creds-x509: info, then writes and reads back over TLS
/// in separate connections; the data is on disk after the server stops.
#[test]
fn qemu_over_tls_reads_and_writes() {
    let dir = tmp();
    let creds = make_creds(dir.path());
    let img = image(dir.path());
    let mut server = serve(dir.path(), &img, &["--tls-creds", &p(&creds.server)]);
    let port = server.nbd_port();
    let info = qemu_info(&creds.anonymous, port);
    assert!(
        info.status.success(),
        "qemu-img info over TLS: {}",
        text(&info)
    );
    assert!(
        text(&info).contains("virtual size: 64 MiB"),
        "{}",
        text(&info)
    );
    // A small write, and 9 MiB crossing many TLS records and relay chunks.
    qemu_io_tls(
        &creds.anonymous,
        port,
        &["write -P 0xa5 0 64k", "write -P 0x3c 1M 9M", "flush"],
    );
    qemu_io_tls(
        &creds.anonymous,
        port,
        &[
            "read -P 0xa5 0 64k",
            "read -P 0x3c 1M 9M",
            "read -P 0 10M 1M",
        ],
    );
    server.assert_running();
    server.stop_ok();
    // What the clients wrote is in the image itself.
    qemu_io(&img, &["read -P 0xa5 0 64k", "read -P 0x3c 1M 9M"]);
}

/// (b) libnbd: nbdinfo over nbds:// reports TLS, and nbdcopy copies a
/// whole 64 MiB export out through the relay intact.
#[test]
fn libnbd_over_tls() {
    let dir = tmp();
    let creds = make_creds(dir.path());
    let img = image(dir.path());
    qemu_io(&img, &["write -P 0x5a 0 32M", "write -P 0xe1 40M 3M"]);
    let server = serve(dir.path(), &img, &["--tls-creds", &p(&creds.server)]);
    let port = server.nbd_port();
    let uri = nbds_uri(port, &creds.anonymous);
    let info = ok("nbdinfo", &[&uri]);
    assert!(info.contains("with TLS"), "{info}");
    assert!(info.contains("export-size: 67108864"), "{info}");
    let raw = dir.path().join("copy.raw");
    let started = Instant::now();
    ok("nbdcopy", &[&uri, &p(&raw)]);
    let elapsed = started.elapsed();
    let data = std::fs::read(&raw).unwrap();
    assert_eq!(data.len() as u64, 64 * MIB);
    let expect = |at: u64| -> u8 {
        match at {
            a if a < 32 * MIB => 0x5a,
            a if (40 * MIB..43 * MIB).contains(&a) => 0xe1,
            _ => 0,
        }
    };
    if let Some(i) = (0..data.len()).find(|&i| data[i] != expect(i as u64)) {
        panic!("byte {i} read over TLS is {:#x}", data[i]);
    }
    eprintln!(
        "nbdcopy of 64 MiB over TLS: {:.0} MiB/s",
        64.0 / elapsed.as_secs_f64()
    );
}

/// (c) A client without TLS is refused with TLS-required, and the server
/// goes on serving TLS clients.
#[test]
fn plain_clients_are_refused() {
    let dir = tmp();
    let creds = make_creds(dir.path());
    let img = image(dir.path());
    let mut server = serve(dir.path(), &img, &["--tls-creds", &p(&creds.server)]);
    let port = server.nbd_port();
    let uri = format!("nbd://127.0.0.1:{port}");
    let qemu = run("qemu-img", &["info", &uri]);
    assert!(!qemu.status.success(), "plain qemu-img was served");
    assert!(
        text(&qemu).contains("TLS negotiation required"),
        "{}",
        text(&qemu)
    );
    let nbdinfo = run("nbdinfo", &[&uri]);
    assert!(!nbdinfo.status.success(), "plain nbdinfo was served");
    // The server's own words reach the client.
    let out = Command::new("nbdinfo")
        .arg(&uri)
        .env("LIBNBD_DEBUG", "1")
        .output()
        .unwrap();
    assert!(
        text(&out).contains("this server requires TLS"),
        "{}",
        text(&out)
    );
    assert!(qemu_info(&creds.anonymous, port).status.success());
    server.assert_running();
}

/// (d) With --tls-verify-peer, a client without a certificate is refused
/// and one with a certificate from the CA is served.
#[test]
fn verify_peer_needs_a_client_certificate() {
    let dir = tmp();
    let creds = make_creds(dir.path());
    let img = image(dir.path());
    let mut server = serve(
        dir.path(),
        &img,
        &["--tls-creds", &p(&creds.server), "--tls-verify-peer"],
    );
    let port = server.nbd_port();
    let anonymous = run("nbdinfo", &["--size", &nbds_uri(port, &creds.anonymous)]);
    assert!(!anonymous.status.success(), "served without a client cert");
    let qemu_anonymous = qemu_info(&creds.anonymous, port);
    assert!(
        !qemu_anonymous.status.success(),
        "qemu served without a cert"
    );
    let size = ok("nbdinfo", &["--size", &nbds_uri(port, &creds.client)]);
    assert_eq!(size.trim(), (64 * MIB).to_string());
    let qemu = qemu_info(&creds.client, port);
    assert!(qemu.status.success(), "{}", text(&qemu));
    qemu_io_tls(
        &creds.client,
        port,
        &["write -P 0x77 0 1M", "read -P 0x77 0 1M"],
    );
    server.assert_running();
}

/// (e) Garbage after STARTTLS, or a TLS client killed in the middle of a
/// transfer, costs only that connection.
#[test]
fn broken_tls_clients_are_dropped() {
    let dir = tmp();
    let creds = make_creds(dir.path());
    let img = image(dir.path());
    // Data, so that a copy has something to read.
    qemu_io(&img, &["write -P 0x66 0 64M"]);
    // One client at a time: a connection whose end was not cleaned up
    // would keep every later client waiting.
    let mut server = serve(
        dir.path(),
        &img,
        &["--tls-creds", &p(&creds.server), "--max-connections", "1"],
    );
    let port = server.nbd_port();
    for _ in 0..3 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        // Client flags (fixed newstyle, no zeroes), then STARTTLS.
        let mut msg = 3u32.to_be_bytes().to_vec();
        msg.extend_from_slice(b"IHAVEOPT");
        msg.extend_from_slice(&5u32.to_be_bytes());
        msg.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&msg).unwrap();
        let mut reply = [0u8; 20];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[8..16], &[0, 0, 0, 5, 0, 0, 0, 1], "STARTTLS ACK");
        // Not a TLS ClientHello.
        s.write_all(&[0x42; 4096]).unwrap();
        let started = Instant::now();
        let mut rest = Vec::new();
        // The server answers with at most a TLS alert, then closes.
        let _ = s.read_to_end(&mut rest);
        assert!(started.elapsed() < Duration::from_secs(5), "not dropped");
        assert!(rest.len() < 64, "{} bytes after garbage", rest.len());
    }
    // A TLS client killed mid-transfer: it copies to a pipe nobody reads,
    // so it stalls with requests in flight, and dies there.
    let uri = nbds_uri(port, &creds.anonymous);
    let mut copy = Command::new("nbdcopy")
        .args(["--connections=1", &uri, "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(copy.try_wait().unwrap().is_none(), "nbdcopy did not stall");
    let _ = copy.kill();
    let _ = copy.wait();
    server.assert_running();
    let info = qemu_info(&creds.anonymous, port);
    assert!(info.status.success(), "{}", text(&info));
    qemu_io_tls(
        &creds.anonymous,
        port,
        &["write -P 0x11 0 1M", "read -P 0x11 0 1M"],
    );
    server.stop_ok();
}

/// (f) NBD beyond loopback without TLS is refused unless forced, for
/// `serve` and `daemon` alike.
#[test]
fn plaintext_beyond_loopback_needs_allow_plaintext() {
    let dir = tmp();
    let img = image(dir.path());
    let out = strata(&["serve", "--bind", "0.0.0.0", "--port", "0", &p(&img)]);
    assert!(!out.status.success(), "plain text on 0.0.0.0 was served");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-creds") && err.contains("--allow-plaintext"),
        "{err}"
    );
    let mut forced = Launch::strata(&[
        "serve",
        "--bind",
        "0.0.0.0",
        "--port",
        "0",
        "--allow-plaintext",
        &p(&img),
    ])
    .log(dir.path().join("forced.log"))
    .try_start()
    .unwrap_or_else(|e| panic!("serve --allow-plaintext: {e}"));
    assert!(forced.line.contains("0.0.0.0:"), "{}", forced.line);
    let port = forced.nbd_port();
    let size = ok("nbdinfo", &["--size", &format!("nbd://127.0.0.1:{port}")]);
    assert_eq!(size.trim(), (64 * MIB).to_string());
    forced.stop_ok();

    let pool = dir.path().join("pool");
    let out = strata(&[
        "daemon",
        "--pool",
        &p(&pool),
        "--listen",
        "127.0.0.1:0",
        "--nbd-bind",
        "0.0.0.0",
        "--nbd-port",
        "0",
    ]);
    assert!(!out.status.success(), "daemon served plain text on 0.0.0.0");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--nbd-bind")
            && err.contains("--tls-creds")
            && err.contains("--allow-plaintext"),
        "{err}"
    );
}

/// The daemon serves its volumes over TLS and refuses plain clients.
#[test]
fn daemon_serves_volumes_over_tls() {
    let dir = tmp();
    let creds = make_creds(dir.path());
    let pool = dir.path().join("pool");
    let mut daemon = Launch::strata(&[
        "daemon",
        "--pool",
        &p(&pool),
        "--listen",
        "127.0.0.1:0",
        "--nbd-port",
        "0",
        "--tls-creds",
        &p(&creds.server),
    ])
    .log(dir.path().join("daemon.log"))
    .try_start()
    .unwrap_or_else(|e| panic!("strata daemon: {e}"));
    let port = daemon.nbd_port();
    let api = daemon
        .line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split([',', ' ']).next())
        .unwrap_or_else(|| panic!("no API address in {:?}", daemon.line))
        .to_string();
    strata_ok(&[
        "volume",
        "--api",
        &api,
        "--pool",
        &p(&pool),
        "create",
        "vm",
        "16M",
    ]);
    let plain = run(
        "nbdinfo",
        &["--size", &format!("nbd://127.0.0.1:{port}/vm")],
    );
    assert!(!plain.status.success(), "daemon served a plain client");
    let uri = format!(
        "nbds://127.0.0.1:{port}/vm?tls-certificates={}",
        p(&creds.anonymous)
    );
    let size = ok("nbdinfo", &["--size", &uri]);
    assert_eq!(size.trim(), (16 * MIB).to_string());
    let object = qemu_object(&creds.anonymous);
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export=vm,tls-creds=tls0");
    let out = ok(
        "qemu-io",
        &[
            "--object",
            &object,
            "--image-opts",
            &image,
            "-c",
            "write -P 0x9d 0 2M",
            "-c",
            "read -P 0x9d 0 2M",
        ],
    );
    assert!(!out.contains("failed") && !out.contains("error"), "{out}");
    daemon.assert_running();
    daemon.stop_ok();
}

// ---------------------------------------------------------------------------
// Pre-shared keys

/// A `keys.psk` directory holding one identity with a random 32-byte key
/// (the format GnuTLS's psktool writes: `IDENTITY:HEXKEY`).
fn make_psk(dir: &Path, name: &str, identity: &str) -> PathBuf {
    let keys = dir.join(name);
    std::fs::create_dir_all(&keys).unwrap();
    let key = ok("openssl", &["rand", "-hex", "32"]);
    std::fs::write(
        keys.join("keys.psk"),
        format!("{identity}:{}\n", key.trim()),
    )
    .unwrap();
    keys
}

/// QEMU's client object for pre-shared keys in `dir`, as `identity`.
fn qemu_psk_object(dir: &Path, identity: &str) -> String {
    format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username={identity}",
        dir.display()
    )
}

/// libnbd's URI for pre-shared keys.
fn nbds_psk_uri(port: u16, identity: &str, dir: &Path) -> String {
    format!(
        "nbds://{identity}@127.0.0.1:{port}/?tls-psk-file={}",
        dir.join("keys.psk").display()
    )
}

/// (h) QEMU's tls-creds-psk and libnbd's tls-psk-file: a client with the
/// right identity and key writes and reads back; a wrong key, an unknown
/// identity and a plain client are refused and change nothing; the
/// server goes on serving.
#[test]
fn pre_shared_keys_with_qemu_and_libnbd() {
    let dir = tmp();
    let keys = make_psk(dir.path(), "psk", "alice");
    let img = image(dir.path());
    let mut server = serve(dir.path(), &img, &["--tls-creds", &p(&keys)]);
    let port = server.nbd_port();
    let object = qemu_psk_object(&keys, "alice");
    let image = qemu_tls_image(port);
    let io = |cmds: &[&str]| {
        let mut args = vec!["--object", object.as_str(), "--image-opts", &image];
        for c in cmds {
            args.extend(["-c", c]);
        }
        let out = ok("qemu-io", &args);
        assert!(
            !out.contains("failed") && !out.contains("error") && !out.contains("Pattern"),
            "qemu-io over TLS-PSK: {out}"
        );
    };
    io(&["write -P 0x6b 0 64k", "write -P 0xd2 2M 5M", "flush"]);
    io(&["read -P 0x6b 0 64k", "read -P 0xd2 2M 5M"]);
    let uri = nbds_psk_uri(port, "alice", &keys);
    let info = ok("nbdinfo", &[&uri]);
    assert!(info.contains("with TLS"), "{info}");
    let raw = dir.path().join("copy.raw");
    ok("nbdcopy", &[&uri, &p(&raw)]);
    let data = std::fs::read(&raw).unwrap();
    assert_eq!(data.len() as u64, 64 * MIB);
    assert!(data[..65536].iter().all(|&b| b == 0x6b));
    assert!(data[2 << 20..7 << 20].iter().all(|&b| b == 0xd2));

    // The same identity with another key, and an identity the server
    // does not know: both refused.
    let wrong = make_psk(dir.path(), "wrong", "alice");
    let stranger = make_psk(dir.path(), "stranger", "mallory");
    for (keys, identity) in [(&wrong, "alice"), (&stranger, "mallory")] {
        let out = run("nbdinfo", &[&nbds_psk_uri(port, identity, keys)]);
        assert!(
            !out.status.success(),
            "{identity} was served: {}",
            text(&out)
        );
        let qemu = run(
            "qemu-io",
            &[
                "--object",
                &qemu_psk_object(keys, identity),
                "--image-opts",
                &image,
                "-c",
                "write -P 0xee 0 64k",
            ],
        );
        assert!(
            !qemu.status.success() || text(&qemu).contains("Could not open"),
            "qemu-io as {identity} was served: {}",
            text(&qemu)
        );
        // A client that expects certificates gets nowhere either.
        assert!(!run("nbdinfo", &[&nbds_uri(port, keys)]).status.success());
    }
    let plain = run("qemu-img", &["info", &format!("nbd://127.0.0.1:{port}")]);
    assert!(!plain.status.success(), "a plain client was served");
    server.assert_running();
    io(&["read -P 0x6b 0 64k"]);
    server.stop_ok();
    // Nothing the refused clients sent reached the image.
    qemu_io(&img, &["read -P 0x6b 0 64k", "read -P 0xd2 2M 5M"]);
}

/// (i) A malformed keys.psk, and a directory with neither certificates
/// nor keys, stop the server at start with a message naming the file and
/// the line.
#[test]
fn bad_pre_shared_key_files_are_refused_at_start() {
    let dir = tmp();
    let img = image(dir.path());
    let cases = [
        ("alice:0g12\n", "line 1"),
        ("# comment\n", "line 1"),
        ("\nalice:abc\n", "line 2"),
        (":0011\n", "identity"),
        ("", "holds no key"),
    ];
    for (content, expect) in cases {
        let keys = dir.path().join("bad");
        std::fs::create_dir_all(&keys).unwrap();
        std::fs::write(keys.join("keys.psk"), content).unwrap();
        let out = run(
            env!("CARGO_BIN_EXE_strata"),
            &["serve", "--port", "0", "--tls-creds", &p(&keys), &p(&img)],
        );
        let said = text(&out);
        assert!(!out.status.success(), "{content:?} was accepted");
        assert!(
            said.contains("keys.psk") && said.contains(expect),
            "{content:?}: {said}"
        );
    }
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = run(
        env!("CARGO_BIN_EXE_strata"),
        &["serve", "--port", "0", "--tls-creds", &p(&empty), &p(&img)],
    );
    let said = text(&out);
    assert!(!out.status.success());
    assert!(
        said.contains("server-cert.pem") && said.contains("keys.psk"),
        "{said}"
    );
}
