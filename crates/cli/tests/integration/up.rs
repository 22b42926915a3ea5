//! `strata up` with real processes: every address it prints answers, a
//! signal stops everything it started, the death of one service stops the
//! rest; `--demo`; `/health`; completions, man pages, the configuration
//! file and the systemd units.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{p, run_ok, strata_ok, tmp};

/// A running `strata up`, killed (with its services, by pid) if a test
/// fails before stopping it.
struct Up {
    child: Child,
    /// The rest of its stdout, drained so it never blocks.
    stdout: Option<BufReader<ChildStdout>>,
    /// The words of its readiness line.
    ready: Vec<String>,
}

impl Up {
    /// Starts `strata up ARGS` and reads its readiness line.
    fn start(args: &[&str]) -> Up {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("up")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn strata up");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the readiness line");
        let mut up = Up {
            child,
            stdout: Some(stdout),
            ready: line.split_whitespace().map(String::from).collect(),
        };
        if !line.starts_with("strata: up: ") {
            let stderr = up.stop_and_stderr();
            panic!("no readiness line from strata up {args:?}: {line:?}\n{stderr}");
        }
        up
    }

    /// The word after `key` on the readiness line.
    fn get(&self, key: &str) -> Option<String> {
        let at = self.ready.iter().position(|w| w == key)?;
        self.ready.get(at + 1).cloned()
    }

    fn address(&self, key: &str) -> String {
        let value = self
            .get(key)
            .unwrap_or_else(|| panic!("no {key} on {:?}", self.ready));
        value
            .trim_start_matches("http://")
            .trim_start_matches("nbd://")
            .to_string()
    }

    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Pids of its services, read from /proc.
    fn services(&self) -> Vec<libc::pid_t> {
        children_of(self.pid())
    }

    /// Waits for it to exit; its status and stderr.
    fn wait(&mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut stderr = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = e.read_to_string(&mut stderr);
                }
                return (status, stderr);
            }
            assert!(
                Instant::now() < deadline,
                "strata up did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills it and its services; its stderr.
    fn stop_and_stderr(&mut self) -> String {
        for pid in self.services() {
            kill(pid, libc::SIGKILL);
        }
        let _ = self.child.kill();
        self.wait(Duration::from_secs(30)).1
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            for pid in self.services() {
                kill(pid, libc::SIGKILL);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        drop(self.stdout.take());
    }
}

fn kill(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill() on a pid this test started (or its child).
    unsafe {
        libc::kill(pid, signal);
    }
}

/// The live children of `pid`, from /proc/PID/task/*/children.
fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return pids;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|w| w.parse::<libc::pid_t>().ok()),
            );
        }
    }
    pids
}

/// Whether a process `pid` exists (a zombie counts: it was not reaped).
fn alive(pid: libc::pid_t) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The command line of `pid`, words joined by spaces.
fn cmdline(pid: libc::pid_t) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// One HTTP/1.1 GET; the status code and body.
fn http_get(address: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect to the HTTP server");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// `strata up DIR` on free ports.
fn up_on_free_ports(dir: &Path, extra: &[&str]) -> Up {
    let dir = p(dir);
    let mut args = vec![
        dir.as_str(),
        "--nbd-port",
        "0",
        "--api",
        "127.0.0.1:0",
        "--cluster",
        "127.0.0.1:0",
        "--stop-timeout",
        "20",
    ];
    args.extend_from_slice(extra);
    Up::start(&args)
}

#[test]
fn every_printed_address_answers_and_sigterm_stops_everything() {
    let work = tmp();
    let dir = work.path().join("data");
    let mut up = up_on_free_ports(&dir, &[]);
    let nbd = up.address("nbd");
    let api = up.address("api");
    let cluster = up.address("cluster");
    let services = up.services();
    assert_eq!(services.len(), 2, "a daemon and a store: {services:?}");
    let pool = p(&dir.join("pool"));

    // The volume daemon: a volume made through the CLI answers over NBD.
    strata_ok(&[
        "volume", "create", "demo", "64M", "--pool", &pool, "--api", &api,
    ]);
    let info = run_ok("qemu-img", &["info", &format!("nbd://{nbd}/demo")]);
    assert!(info.contains("virtual size: 64 MiB"), "{info}");

    // The API: /health without a token, /v1/pool only with it.
    let (status, body) = http_get(&api, "/health", None);
    assert_eq!((status, body.trim()), (200, r#"{"status":"ok"}"#));
    assert_eq!(http_get(&api, "/v1/pool", None).0, 401);
    let token = std::fs::read_to_string(dir.join("pool/api.token")).expect("the API token");
    let (status, body) = http_get(&api, "/v1/pool", Some(token.trim()));
    assert_eq!(status, 200, "{body}");

    // The object store, with the admin credential `up` printed.
    let sent = work.path().join("hello.txt");
    let back = work.path().join("hello.copy");
    std::fs::write(&sent, b"hello, store\n").expect("write the file");
    let store = p(&dir.join("store"));
    strata_ok(&[
        "obj",
        "put",
        "--cluster",
        &cluster,
        "--dir",
        &store,
        &p(&sent),
        "demo/hello",
    ]);
    strata_ok(&[
        "obj",
        "get",
        "--cluster",
        &cluster,
        "--dir",
        &store,
        "demo/hello",
        &p(&back),
    ]);
    assert_eq!(std::fs::read(&back).expect("the object"), b"hello, store\n");

    kill(up.pid(), libc::SIGTERM);
    let (status, stderr) = up.wait(Duration::from_secs(60));
    assert!(
        status.success(),
        "strata up after SIGTERM: {status}\n{stderr}"
    );
    for pid in services {
        assert!(
            !alive(pid),
            "service {pid} ({}) outlived strata up",
            cmdline(pid)
        );
    }
    TcpListener::bind(&nbd).unwrap_or_else(|e| panic!("NBD port {nbd} still taken: {e}"));
    TcpListener::bind(&api).unwrap_or_else(|e| panic!("API port {api} still taken: {e}"));
    UdpSocket::bind(&cluster).unwrap_or_else(|e| panic!("store port {cluster} still taken: {e}"));
}

#[test]
fn a_killed_service_stops_the_rest_and_up_fails_naming_it() {
    let work = tmp();
    let mut up = up_on_free_ports(&work.path().join("data"), &[]);
    let services = up.services();
    let daemon = *services
        .iter()
        .find(|&&pid| cmdline(pid).contains(" daemon "))
        .unwrap_or_else(|| panic!("no daemon among {services:?}"));
    kill(daemon, libc::SIGKILL);
    let (status, stderr) = up.wait(Duration::from_secs(60));
    assert!(
        !status.success(),
        "strata up exited 0 after its daemon was killed"
    );
    assert!(
        stderr.contains("the volume daemon") && stderr.contains("signal 9"),
        "{stderr}"
    );
    for pid in services {
        assert!(
            !alive(pid),
            "service {pid} ({}) outlived strata up",
            cmdline(pid)
        );
    }
}

#[test]
fn a_mirror_runs_only_when_asked() {
    let work = tmp();
    let image = work.path().join("base.raw");
    std::fs::write(&image, crate::common::pattern(4 << 20, 7)).expect("write the image");
    strata_ok(&["mirror", "digest", &p(&image)]);
    let mut up = up_on_free_ports(
        &work.path().join("data"),
        &["--no-store", "--mirror", &p(&image), "--mirror-port", "0"],
    );
    assert!(
        up.get("cluster").is_none(),
        "--no-store ran a store: {:?}",
        up.ready
    );
    let mirror = up.address("mirror");
    let info = run_ok("qemu-img", &["info", &format!("nbd://{mirror}")]);
    assert!(info.contains("virtual size: 4 MiB"), "{info}");
    kill(up.pid(), libc::SIGTERM);
    let (status, stderr) = up.wait(Duration::from_secs(60));
    assert!(status.success(), "{stderr}");

    let mut up = up_on_free_ports(&work.path().join("other"), &["--no-store"]);
    assert!(
        up.get("mirror").is_none(),
        "a mirror nobody asked for: {:?}",
        up.ready
    );
    assert_eq!(up.services().len(), 1);
    let mut rest = String::new();
    if let Some(mut stdout) = up.stdout.take() {
        kill(up.pid(), libc::SIGTERM);
        let _ = stdout.read_to_string(&mut rest);
    }
    assert!(rest.contains("mirror: not started"), "{rest}");
    assert!(up.wait(Duration::from_secs(60)).0.success());
}

#[test]
fn demo_runs_and_exits_by_itself() {
    let _host_ports = crate::common::host_ports();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["up", "--demo"])
        .stdin(Stdio::null())
        .output()
        .expect("run strata up --demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("created volume demo"), "{stdout}");
    assert!(stdout.contains("read it back (qemu-io)"), "{stdout}");
    assert!(stdout.contains("got the same bytes back"), "{stdout}");
    let dir = stdout
        .split_whitespace()
        .skip_while(|w| *w != "in")
        .nth(1)
        .map(|w| PathBuf::from(w.trim_end_matches(':')))
        .expect("the demonstration's directory");
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

#[test]
fn repo_serve_answers_health() {
    let work = tmp();
    let image = work.path().join("base.raw");
    std::fs::write(&image, b"image").expect("write the image");
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["mirror", "repo-serve", "-p", "0", &p(&image)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn repo-serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("readiness line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL on {line:?}"));
    let address = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("address");
    let health = http_get(address, "/health", None);
    let image_still_served = http_get(address, "/base.raw", None);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!((health.0, health.1.trim()), (200, r#"{"status":"ok"}"#));
    assert_eq!(image_still_served, (200, "image".to_string()));
}

#[test]
fn completions_are_scripts_their_shells_accept() {
    for shell in ["bash", "zsh", "fish"] {
        let script = strata_ok(&["completions", shell]);
        assert!(script.len() > 1000, "{shell}: {} bytes", script.len());
        assert!(
            script.contains("volume") && script.contains("up"),
            "{shell}"
        );
    }
    let work = tmp();
    let file = work.path().join("strata.bash");
    std::fs::write(&file, strata_ok(&["completions", "bash"])).expect("write the script");
    run_ok("bash", &["-n", &p(&file)]);
}

#[test]
fn man_writes_one_page_per_subcommand() {
    let work = tmp();
    let dir = work.path().join("man");
    let said = strata_ok(&["man", &p(&dir)]);
    let pages: Vec<String> = std::fs::read_dir(&dir)
        .expect("the man directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        said.contains(&format!("wrote {} man pages", pages.len())),
        "{said}"
    );
    for page in [
        "strata.1",
        "strata-up.1",
        "strata-daemon.1",
        "strata-volume-create.1",
        "strata-snapshot-create.1",
        "strata-store-up.1",
        "strata-obj-put.1",
        "strata-img-create.1",
        "strata-mirror-repo-serve.1",
        "strata-completions.1",
        "strata-man.1",
    ] {
        assert!(pages.contains(&page.to_string()), "no {page} in {pages:?}");
    }
    // Every subcommand `strata help` lists has its page.
    let help = strata_ok(&["--help"]);
    let commands = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help");
    for command in commands {
        assert!(
            pages.contains(&format!("strata-{command}.1")),
            "no page for {command}"
        );
    }
    let page = std::fs::read_to_string(dir.join("strata-volume-create.1")).expect("a page");
    assert!(
        page.starts_with(".ie") || page.contains(".TH"),
        "not roff: {page:.200}"
    );
}

/// Starts `strata daemon ARGS` on free ports, returns its readiness line
/// and stops it.
fn daemon_ready_line(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("daemon")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata daemon");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("readiness line");
    kill(child.id() as libc::pid_t, libc::SIGTERM);
    let out = child.wait_with_output().expect("wait");
    assert!(
        line.contains("daemon serving"),
        "{line}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    line
}

#[test]
fn a_config_value_applies_and_a_flag_overrides_it() {
    let _host_ports = crate::common::host_ports();
    let work = tmp();
    let file = work.path().join("strata.toml");
    let from_file = work.path().join("pool-from-file");
    let from_flag = work.path().join("pool-from-flag");
    std::fs::write(
        &file,
        format!(
            "[daemon]\npool = \"{}\"\nnbd-port = 0\nlisten = \"127.0.0.1:0\"\n\n\
             [up]\nno-store = true\n",
            p(&from_file)
        ),
    )
    .expect("write the configuration");
    let line = daemon_ready_line(&["--config", &p(&file)]);
    assert!(line.contains(&format!("pool {}", p(&from_file))), "{line}");
    let line = daemon_ready_line(&["--config", &p(&file), "--pool", &p(&from_flag)]);
    assert!(line.contains(&format!("pool {}", p(&from_flag))), "{line}");
    assert!(from_flag.join("api.token").exists());

    // `up` reads [up] (no store) and the daemon's ports from [daemon].
    let mut up = Up::start(&[&p(&work.path().join("data")), "--config", &p(&file)]);
    assert!(
        up.get("cluster").is_none(),
        "[up] no-store ignored: {:?}",
        up.ready
    );
    assert!(!up.address("nbd").ends_with(":10810"), "{:?}", up.ready);
    kill(up.pid(), libc::SIGTERM);
    assert!(up.wait(Duration::from_secs(60)).0.success());

    // A key that is no flag is refused, naming the file and the key.
    std::fs::write(&file, "[daemon]\npoool = \"x\"\n").expect("write");
    let out = crate::common::strata(&["daemon", "--config", &p(&file)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("[daemon] poool") && stderr.contains("strata.toml"),
        "{stderr}"
    );
}

#[test]
fn systemd_units_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let work = tmp();
    let mut names = Vec::new();
    for name in [
        "strata-daemon.service",
        "strata-store.service",
        "strata-up.service",
    ] {
        let text = std::fs::read_to_string(units.join(name)).expect("read the unit");
        assert!(text.contains("NoNewPrivileges=yes") && text.contains("ProtectSystem=strict"));
        // The unit names the installed binary; check it against this one.
        let text = text.replace("/usr/local/bin/strata", env!("CARGO_BIN_EXE_strata"));
        std::fs::write(work.path().join(name), text).expect("write the unit");
        names.push(p(&work.path().join(name)));
    }
    let mut args = vec!["verify".to_string(), "--man=no".to_string()];
    args.extend(names);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = Command::new("systemd-analyze")
        .args(&args)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
}

/// Whether `pid` is gone or a zombie nobody reaped yet (its parent, `up`,
/// is dead: init reaps it, or not, in a container).
fn dead(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

#[test]
fn services_stop_even_if_up_is_killed() {
    let work = tmp();
    let mut up = up_on_free_ports(&work.path().join("data"), &[]);
    let services = up.services();
    assert_eq!(services.len(), 2, "{services:?}");
    kill(up.pid(), libc::SIGKILL);
    let _ = up.wait(Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !services.iter().all(|&pid| dead(pid)) {
        assert!(
            Instant::now() < deadline,
            "services {services:?} outlived a killed strata up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
