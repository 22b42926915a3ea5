//! `strata bench s3`, the S3 load generator, against the gateway that
//! `strata store up` starts (and, unsigned, against Python's HTTP file
//! server): its counts and bytes add up, what it writes is what aws-cli
//! reads back, refused requests are counted as errors, and bad options
//! are refused before anything is sent.

use crate::common::store::Store;
use crate::common::{output_text, p, tmp};
use crate::s3::endpoint;
use std::path::Path;
use std::process::{Command, Output};
use strata_bench::s3_load::object_byte;

/// A tenant's S3 keys, from `strata store tenant add --output json`.
fn keys(store: &Store, tenant: &str) -> (String, String) {
    let issued = store.json(&[
        "store",
        "tenant",
        "add",
        "--dir",
        &p(&store.dir),
        "--tenant",
        tenant,
    ]);
    let field = |name: &str| {
        issued[name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {issued}"))
            .to_string()
    };
    (field("s3_access_key"), field("s3_secret_key"))
}

/// `aws ARGS` against `s3` as the tenant of `access`/`secret`, which must
/// succeed; its standard output.
fn aws(s3: &str, access: &str, secret: &str, home: &Path, args: &[&str]) -> String {
    let out = Command::new("aws")
        .arg("--endpoint-url")
        .arg(s3)
        .args(args)
        .env("AWS_ACCESS_KEY_ID", access)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("AWS_CONFIG_FILE", home.join("aws-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("aws-credentials"))
        .env("HOME", home)
        .output()
        .expect("run aws (apt-get install awscli)");
    assert!(
        out.status.success(),
        "aws {args:?} failed: {}",
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `strata bench s3 ARGS --output json`: its exit code and report.
fn bench(args: &[&str]) -> (Option<i32>, serde_json::Value, Output) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["bench", "s3", "--output", "json", "--threads", "2"])
        .args(args)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .expect("run strata");
    let report = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), report, out)
}

fn number(report: &serde_json::Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {report}"))
}

#[test]
fn put_and_get_runs_count_every_request_and_byte_and_store_the_pattern() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let (access, secret) = keys(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    aws(&s3, &access, &secret, home, &["s3", "mb", "s3://acme"]);
    let signed = [
        "--endpoint",
        &s3,
        "--access-key",
        &access,
        "--secret-key",
        &secret,
        "--bucket",
        "acme",
    ];

    let mut put = signed.to_vec();
    put.extend_from_slice(&[
        "--op",
        "put",
        "--size",
        "4KiB",
        "--clients",
        "4",
        "--objects",
        "8",
        "--duration",
        "2s",
    ]);
    let (code, report, out) = bench(&put);
    assert_eq!(code, Some(0), "{}", output_text(&out));
    let requests = number(&report, "requests");
    assert!(requests >= 8, "too few PUTs for 8 objects: {report}");
    assert_eq!(number(&report, "errors"), 0, "{report}");
    assert_eq!(number(&report, "bytes"), requests * 4096, "{report}");
    assert_eq!(
        report["statuses"]["200"].as_u64(),
        Some(requests),
        "{report}"
    );
    assert!(number(&report, "latency_p50_microseconds") > 0, "{report}");

    // Every key the run cycled over holds the run's 4 KiB pattern.
    let listed = aws(&s3, &access, &secret, home, &["s3", "ls", "s3://acme/"]);
    for index in 0..8 {
        assert!(
            listed.contains(&format!(" 4096 bench-{index}\n")),
            "bench-{index} missing from {listed}"
        );
    }
    let copy = home.join("bench-5");
    aws(
        &s3,
        &access,
        &secret,
        home,
        &["s3", "cp", "s3://acme/bench-5", &p(&copy)],
    );
    let expected: Vec<u8> = (0..4096).map(object_byte).collect();
    assert!(
        std::fs::read(&copy).unwrap() == expected,
        "bench-5's bytes differ"
    );

    let mut get = signed.to_vec();
    get.extend_from_slice(&[
        "--op",
        "get",
        "--size",
        "1MiB",
        "--clients",
        "3",
        "--key-prefix",
        "big/",
        "--duration",
        "1s",
        "--prepare",
    ]);
    let (code, report, out) = bench(&get);
    assert_eq!(code, Some(0), "{}", output_text(&out));
    let requests = number(&report, "requests");
    assert!(requests > 0, "{report}");
    assert_eq!(number(&report, "errors"), 0, "{report}");
    assert_eq!(number(&report, "bytes"), requests << 20, "{report}");
    let listed = aws(&s3, &access, &secret, home, &["s3", "ls", "s3://acme/big/"]);
    // aws-cli lists the names under the prefix without it.
    assert_eq!(listed.matches(" 1048576 ").count(), 3, "{listed}");
}

#[test]
fn a_wrong_secret_or_a_missing_key_counts_as_errors_not_successes() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let (access, secret) = keys(&store, "acme");
    let s3 = endpoint(&store);
    aws(
        &s3,
        &access,
        &secret,
        dir.path(),
        &["s3", "mb", "s3://acme"],
    );
    let wrong = format!("{}0", &secret[..secret.len() - 1]);
    let wrong = if wrong == secret {
        format!("{}1", &secret[..secret.len() - 1])
    } else {
        wrong
    };
    let run = |secret: &str, op: &str| {
        bench(&[
            "--endpoint",
            &s3,
            "--access-key",
            &access,
            "--secret-key",
            secret,
            "--bucket",
            "acme",
            "--op",
            op,
            "--size",
            "4KiB",
            "--clients",
            "2",
            "--duration",
            "1s",
        ])
    };

    let (code, report, out) = run(&wrong, "put");
    assert_eq!(code, Some(3), "{}", output_text(&out));
    assert_eq!(number(&report, "requests"), 0, "{report}");
    assert_eq!(number(&report, "bytes"), 0, "{report}");
    let errors = number(&report, "errors");
    assert!(errors > 0, "{report}");
    assert_eq!(report["statuses"]["403"].as_u64(), Some(errors), "{report}");
    assert!(
        report["error_samples"]
            .to_string()
            .contains("SignatureDoesNotMatch"),
        "{report}"
    );

    // GETs of keys nobody wrote: 404 NoSuchKey, each one an error.
    let (code, report, out) = run(&secret, "get");
    assert_eq!(code, Some(3), "{}", output_text(&out));
    assert_eq!(number(&report, "requests"), 0, "{report}");
    assert!(number(&report, "errors") > 0, "{report}");
    assert!(
        report["error_samples"]
            .to_string()
            .contains("404 NoSuchKey"),
        "{report}"
    );

    // --prepare with the wrong secret fails before the clock starts.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "bench",
            "s3",
            "--endpoint",
            &s3,
            "--access-key",
            &access,
            "--secret-key",
            &wrong,
            "--bucket",
            "acme",
            "--op",
            "get",
            "--size",
            "0",
            "--prepare",
            "--duration",
            "1s",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("SignatureDoesNotMatch"),
        "{}",
        output_text(&out)
    );
}

#[test]
fn gets_after_the_node_closed_the_gateways_idle_connections_do_not_fail() {
    let dir = tmp();
    // The storage node closes data connections idle for a second. The
    // gateway reads over TCP (not its own node's files), and the objects
    // are too big to be kept inside their records.
    let store = Store::up(
        &dir.path().join("store"),
        &["--data-timeout-ms", "1000", "--s3-remote-reads"],
    );
    let (access, secret) = keys(&store, "acme");
    let s3 = endpoint(&store);
    aws(
        &s3,
        &access,
        &secret,
        dir.path(),
        &["s3", "mb", "s3://acme"],
    );
    let run = |clients: &str, prepare: bool| {
        let mut args = vec![
            "--endpoint",
            &s3,
            "--access-key",
            &access,
            "--secret-key",
            &secret,
            "--bucket",
            "acme",
            "--op",
            "get",
            "--size",
            "64KiB",
            "--objects",
            "8",
            "--clients",
            clients,
            "--duration",
            "1s",
        ];
        if prepare {
            args.push("--prepare");
        }
        bench(&args)
    };
    // Eight clients leave about eight idle connections to the node in the
    // gateway's pool; the node then closes them all.
    let (code, report, out) = run("8", true);
    assert_eq!(code, Some(0), "{}", output_text(&out));
    assert!(number(&report, "requests") > 0, "{report}");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // Every Get that finds a closed connection connects afresh: none fails
    // (each stale connection used to cost a failed Get, an S3 500).
    let (code, report, out) = run("1", false);
    assert_eq!(code, Some(0), "{}", output_text(&out));
    assert_eq!(number(&report, "errors"), 0, "{report}");
    assert!(number(&report, "requests") > 0, "{report}");
}

/// A Python server on a loopback port (its process and port), killed
/// when dropped.
struct FileServer(std::process::Child, u16);

impl Drop for FileServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn file_server(root: &Path) -> FileServer {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run python3");
    let server = FileServer(child, port);
    crate::common::store::wait_until("python's file server to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    server
}

#[test]
fn unsigned_gets_read_files_from_a_plain_http_server_and_check_their_size() {
    let dir = tmp();
    let bucket = dir.path().join("files");
    std::fs::create_dir(&bucket).unwrap();
    let data: Vec<u8> = (0..65536).map(object_byte).collect();
    for index in 0..2 {
        std::fs::write(bucket.join(format!("bench-{index}")), &data).unwrap();
    }
    // Shorter than the size asked for: counted as errors.
    std::fs::write(bucket.join("short-0"), &data[..1000]).unwrap();
    let server = file_server(dir.path());
    let endpoint = format!("http://127.0.0.1:{}", server.1);
    let run = |prefix: &str| {
        bench(&[
            "--endpoint",
            &endpoint,
            "--unsigned",
            "--bucket",
            "files",
            "--key-prefix",
            prefix,
            "--op",
            "get",
            "--size",
            "64KiB",
            "--clients",
            "2",
            "--duration",
            "1s",
        ])
    };

    let (code, report, out) = run("bench-");
    assert_eq!(code, Some(0), "{}", output_text(&out));
    let requests = number(&report, "requests");
    assert!(requests > 0, "{report}");
    assert_eq!(number(&report, "bytes"), requests * 65536, "{report}");

    let (code, report, out) = run("short-");
    assert_eq!(code, Some(3), "{}", output_text(&out));
    assert_eq!(number(&report, "requests"), 0, "{report}");
    assert!(
        report["error_samples"]
            .to_string()
            .contains("1000 bytes instead of 65536"),
        "{report}"
    );
}

#[test]
fn concurrent_puts_of_one_key_all_succeed_as_in_s3() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let (access, secret) = keys(&store, "acme");
    let s3 = endpoint(&store);
    aws(
        &s3,
        &access,
        &secret,
        dir.path(),
        &["s3", "mb", "s3://acme"],
    );
    // Four clients writing the one key at once for 2 s: the store takes
    // one Post of a name at a time, and the gateway posts again while it
    // is held, so every Put succeeds (S3's last writer wins).
    let (code, report, out) = bench(&[
        "--endpoint",
        &s3,
        "--access-key",
        &access,
        "--secret-key",
        &secret,
        "--bucket",
        "acme",
        "--op",
        "put",
        "--size",
        "8MiB",
        "--objects",
        "1",
        "--clients",
        "4",
        "--duration",
        "2s",
    ]);
    assert_eq!(code, Some(0), "{}", output_text(&out));
    let requests = number(&report, "requests");
    // Every client's Puts overlapped the others' for the 2 s.
    assert!(requests > 4, "{report}");
    assert_eq!(number(&report, "errors"), 0, "{report}");
    assert_eq!(
        report["statuses"]["200"].as_u64(),
        Some(requests),
        "{report}"
    );
}

/// A server that takes each connection, reads a little of the request
/// and closes it: PUTs fail while their bodies are being written.
const CLOSING_SERVER: &str = r#"
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(64)
print(server.getsockname()[1], flush=True)
while True:
    connection, _ = server.accept()
    connection.recv(1024)
    connection.close()
"#;

#[test]
fn a_server_closing_connections_mid_put_costs_errors_not_the_run() {
    use std::io::BufRead;
    let mut child = Command::new("python3")
        .args(["-c", CLOSING_SERVER])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let server = FileServer(child, line.trim().parse().expect("the server's port"));
    let endpoint = format!("http://127.0.0.1:{}", server.1);
    let (code, report, out) = bench(&[
        "--endpoint",
        &endpoint,
        "--access-key",
        "key",
        "--secret-key",
        "secret",
        "--bucket",
        "acme",
        "--op",
        "put",
        "--size",
        "4MiB",
        "--clients",
        "2",
        "--duration",
        "1s",
    ]);
    // Killed by SIGPIPE, the run would have no exit code and no report.
    assert_eq!(code, Some(3), "{}", output_text(&out));
    assert_eq!(number(&report, "requests"), 0, "{report}");
    let errors = number(&report, "errors");
    assert!(errors > 0, "{report}");
    assert_eq!(report["statuses"]["0"].as_u64(), Some(errors), "{report}");
}

#[test]
fn bad_options_are_refused_before_anything_is_sent() {
    let base = [
        "bench",
        "s3",
        "--bucket",
        "acme",
        "--op",
        "get",
        "--duration",
        "1s",
    ];
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--endpoint",
                "https://127.0.0.1:1",
                "--unsigned",
                "--size",
                "0",
            ],
            "only http:// is supported",
        ),
        (
            &[
                "--endpoint",
                "http://127.0.0.1",
                "--unsigned",
                "--size",
                "0",
            ],
            "the port is missing",
        ),
        (
            &["--endpoint", "http://127.0.0.1:1", "--size", "0"],
            "give --access-key and --secret-key",
        ),
        (
            &[
                "--endpoint",
                "http://127.0.0.1:1",
                "--unsigned",
                "--size",
                "4XiB",
            ],
            "unknown suffix",
        ),
        (
            &[
                "--endpoint",
                "http://127.0.0.1:1",
                "--unsigned",
                "--size",
                "2G",
            ],
            "at most 1073741824",
        ),
        (
            &[
                "--endpoint",
                "http://127.0.0.1:1",
                "--unsigned",
                "--size",
                "0",
                "--clients",
                "0",
            ],
            "--clients 0",
        ),
        (
            &[
                "--endpoint",
                "http://127.0.0.1:1",
                "--unsigned",
                "--size",
                "0",
                "--key-prefix",
                "a b",
            ],
            "--key-prefix",
        ),
    ];
    for (args, message) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(base)
            .args(*args)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .output()
            .unwrap();
        let text = output_text(&out);
        assert!(!out.status.success(), "{args:?} was accepted: {text}");
        assert!(
            text.contains(message),
            "{args:?}: {text:?} should say {message:?}"
        );
    }
}
