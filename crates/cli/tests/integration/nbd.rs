//! `strata serve` against real NBD clients: qemu-img, qemu-io, nbdinfo,
//! nbdcopy, fio's nbd engine and libnbd (Python bindings), plus hand-made
//! misbehaving clients speaking the protocol over a raw socket.
//!
//! Every test starts its own server (on a Unix socket in a temp dir, or on
//! TCP port 0, the chosen port read from the readiness line) through
//! [`Server`], whose `Drop` kills the process even when the test panics,
//! and prints the server's stderr when it does.
//!
//! The chain used by most tests has three layers (64 MiB, 64 KiB clusters):
//! a base written by qemu-io, then two `strata img snapshot` layers each
//! written by qemu-io (data over data, zero clusters over data, discarded
//! clusters, a partial-cluster write that needs copy-on-write).

use crate::common::*;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

const SIZE: u64 = 64 * MIB;

// ---------------------------------------------------------------------------
// Server process guard
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Addr {
    Unix(PathBuf),
    Tcp(u16),
}

#[derive(Default, Clone)]
struct Opts {
    tcp: bool,
    read_only: bool,
    export_name: Option<String>,
    /// Further exports, `NAME=IMAGE`.
    more: Vec<(String, PathBuf)>,
    handshake_timeout: Option<u32>,
    pid_file: Option<PathBuf>,
    max_connections: Option<u32>,
    /// `--buffer-budget`.
    buffer_budget: Option<String>,
    /// `--idle-timeout` seconds.
    idle_timeout: Option<f64>,
    /// Soft and hard limit on open files of the server process.
    open_files: Option<u64>,
    /// `STRATA_LOG` of the server.
    log_filter: Option<String>,
}

/// A running `strata serve`; killed (SIGKILL) on drop if still running.
struct Server {
    child: Option<Child>,
    addr: Addr,
    log: PathBuf,
    export: String,
}

impl Server {
    fn start(image: &Path, dir: &Path, opts: &Opts) -> Server {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let addr = if opts.tcp {
            Addr::Tcp(0) // the real port is read from the readiness line
        } else {
            Addr::Unix(dir.join(format!("nbd-{n}.sock")))
        };
        let log = dir.join(format!("server-{n}.log"));
        Server::try_start(image, opts, addr, log)
            .unwrap_or_else(|e| panic!("could not start strata serve: {e}"))
    }

    fn try_start(image: &Path, opts: &Opts, addr: Addr, log: PathBuf) -> Result<Server, String> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
        cmd.arg("serve");
        match &addr {
            Addr::Unix(path) => cmd.arg("--socket").arg(path),
            // Port 0: the server picks a free port and names it on its
            // readiness line.
            Addr::Tcp(_) => cmd.args(["--bind", "127.0.0.1", "--port", "0"]),
        };
        if opts.read_only {
            cmd.arg("--read-only");
        }
        if let Some(t) = opts.handshake_timeout {
            cmd.args(["--handshake-timeout", &t.to_string()]);
        }
        if let Some(f) = &opts.pid_file {
            cmd.arg("--pid-file").arg(f);
        }
        if let Some(n) = opts.max_connections {
            cmd.args(["--max-connections", &n.to_string()]);
        }
        if let Some(b) = &opts.buffer_budget {
            cmd.args(["--buffer-budget", b]);
        }
        if let Some(t) = opts.idle_timeout {
            cmd.args(["--idle-timeout", &t.to_string()]);
        }
        if let Some(f) = &opts.log_filter {
            cmd.env("STRATA_LOG", f);
        }
        if let Some(n) = opts.open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe and touches only the
            // child between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        match (&opts.export_name, opts.more.is_empty()) {
            (Some(name), true) => {
                cmd.args(["--export-name", name]).arg(image);
            }
            // With several images each one is named as NAME=IMAGE.
            (Some(name), false) => {
                cmd.arg(format!("{name}={}", image.display()));
            }
            (None, _) => {
                cmd.arg(image);
            }
        }
        for (name, img) in &opts.more {
            cmd.arg(format!("{name}={}", img.display()));
        }
        let errfile = std::fs::File::create(&log).expect("server log");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(errfile));
        let mut child = cmd.spawn().expect("spawn strata serve");
        // Wait for the one readiness line, then keep draining stdout so the
        // server can never block on a full pipe.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut sent = false;
            while let Some(Ok(line)) = lines.next() {
                if !sent {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut server = Server {
            child: Some(child),
            addr,
            log,
            export: opts.export_name.clone().unwrap_or_default(),
        };
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => {
                    if line.starts_with("strata: serving") {
                        if let Addr::Tcp(port) = &mut server.addr {
                            // "... on 127.0.0.1:PORT"
                            let tail = line.rsplit(':').next().unwrap_or("");
                            *port = tail
                                .trim()
                                .parse()
                                .map_err(|_| format!("no port on the readiness line {line:?}"))?;
                        }
                        return Ok(server);
                    }
                    return Err(format!("unexpected first stdout line {line:?}"));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed: the server exited (or closed stdout).
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            if let Some(status) = server.child.as_mut().unwrap().try_wait().unwrap() {
                server.child = None;
                return Err(format!(
                    "server exited ({status}) before it was ready:\n{}",
                    server.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "server not ready after 20 s:\n{}",
                    server.log_text()
                ));
            }
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// NBD URI of an export (the default one when `export` is None).
    fn uri_for(&self, export: &str) -> String {
        match &self.addr {
            Addr::Unix(path) => format!("nbd+unix:///{export}?socket={}", path.display()),
            Addr::Tcp(port) => format!("nbd://127.0.0.1:{port}/{export}"),
        }
    }

    fn uri(&self) -> String {
        self.uri_for(&self.export.clone())
    }

    fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    fn assert_running(&mut self) {
        assert!(self.is_running(), "the server died:\n{}", self.log_text());
    }

    /// Sends a signal and waits for the process to exit.
    fn stop_with(&mut self, signal: i32, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("server running");
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not exit within {timeout:?} of signal {signal}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then asserts a clean exit (status 0) within 20 s.
    fn shutdown(&mut self) {
        let status = self.stop_with(libc::SIGTERM, Duration::from_secs(20));
        assert!(
            status.success(),
            "server exited with {status} after SIGTERM:\n{}",
            self.log_text()
        );
    }

    fn connect(&self) -> Conn {
        Conn::connect(&self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- server stderr ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------

fn run(tool: &str, args: &[&str]) -> Output {
    Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {tool}: {e} (run scripts/test.sh as root to install it)"))
}

fn out_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs qemu-io on an NBD URI (as a raw image) and asserts that every
/// command succeeded and every `read -P` matched.
fn qemu_io_nbd(uri: &str, read_only: bool, cmds: &[&str]) -> String {
    let mut args: Vec<&str> = vec!["-f", "raw"];
    if read_only {
        args.push("-r");
    }
    for c in cmds {
        args.push("-c");
        args.push(c);
    }
    args.push(uri);
    let out = run("qemu-io", &args);
    let text = out_text(&out);
    assert!(out.status.success(), "qemu-io {args:?} failed:\n{text}");
    for bad in ["failed", "error", "Error", "mismatch", "not permitted"] {
        assert!(
            !text.contains(bad),
            "qemu-io {args:?} reported {bad:?}:\n{text}"
        );
    }
    text
}

fn file_digest(path: &Path) -> Vec<u8> {
    // The whole file: the layers are small.
    std::fs::read(path).expect("read file")
}

/// The 3-layer test chain; returns the top layer and its guest content.
fn make_chain(dir: &Path) -> (PathBuf, Vec<u8>) {
    let base = dir.join("base.qcow2");
    let mid = dir.join("mid.qcow2");
    let top = dir.join("top.qcow2");
    qemu_create(&base, "cluster_size=64k", &SIZE.to_string());
    qemu_io(
        &base,
        &[
            "write -P 0x11 0 4M",
            "write -P 0x12 10M 1M",
            "write -z 20M 1M",
            "write -P 0x13 30M 64k",
            "write -P 0x14 44M 2M",
        ],
    );
    strata_ok(&["img", "snapshot", &p(&base), &p(&mid)]);
    qemu_io(
        &mid,
        &[
            "write -P 0x21 1M 1M",
            "write -P 0x22 40M 2M",
            "write -z 10M 512k",
            "discard 30M 64k",
            "write -P 0x23 21M 64k",
        ],
    );
    strata_ok(&["img", "snapshot", &p(&mid), &p(&top)]);
    qemu_io(
        &top,
        &[
            "write -P 0x31 3M 8k",
            "write -P 0x32 50M 1M",
            "write -P 0x33 63M 1M",
            "write -P 0x34 12345 4321",
            "write -z 45M 64k",
        ],
    );
    let expected = qemu_raw(&top, dir);
    assert_eq!(expected.len() as u64, SIZE);
    (top, expected)
}

/// Byte ranges of a buffer that differ from `expected`, for messages.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn assert_same_bytes(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = first_diff(got, want) {
        panic!(
            "{what}: differs at byte {i} (len {} vs {}): got {:#x?}, want {:#x?}",
            got.len(),
            want.len(),
            got.get(i),
            want.get(i)
        );
    }
}

/// The server still answers a fresh, well-behaved client: `qemu-img info`
/// sees the size, and a raw READ of a few ranges returns the image content.
fn assert_serves(server: &mut Server, expected: &[u8]) {
    server.assert_running();
    let info = run("qemu-img", &["info", "--output", "json", &server.uri()]);
    assert!(
        info.status.success(),
        "qemu-img info {} failed:\n{}",
        server.uri(),
        out_text(&info)
    );
    let json: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(json["virtual-size"], expected.len() as u64);
    let mut c = server.connect();
    let (size, _) = c.handshake_go(&server.export.clone());
    assert_eq!(size, expected.len() as u64);
    for (off, len) in [(0u64, 65536u32), (3 * MIB - 512, 8192), (SIZE - 4096, 4096)] {
        let data = c.read(off, len).expect("READ failed");
        assert_same_bytes(
            &format!("READ {off}+{len}"),
            &data,
            &expected[off as usize..off as usize + len as usize],
        );
    }
    c.disc();
}

// ---------------------------------------------------------------------------
// A minimal NBD client over a raw socket
// ---------------------------------------------------------------------------

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

const FLAG_READ_ONLY: u16 = 1 << 1;
const FLAG_SEND_FLUSH: u16 = 1 << 2;
const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;

const EPERM: u32 = 1;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const EOVERFLOW: u32 = 75;

enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    fn set_read_timeout(&self, t: Option<Duration>) {
        match self {
            Sock::Unix(s) => s.set_read_timeout(t).unwrap(),
            Sock::Tcp(s) => s.set_read_timeout(t).unwrap(),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write(buf),
            Sock::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Conn {
    s: Sock,
    structured: bool,
    next_handle: u64,
}

/// A reply to one request: the error field, and the data of a READ.
type Reply = Result<Vec<u8>, u32>;

fn is_closed_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
    )
}

impl Conn {
    fn connect(addr: &Addr) -> Conn {
        let timeout = Some(Duration::from_secs(30));
        let s = match addr {
            Addr::Unix(path) => Sock::Unix(UnixStream::connect(path).expect("connect unix socket")),
            Addr::Tcp(port) => {
                let s = TcpStream::connect(("127.0.0.1", *port)).expect("connect tcp");
                s.set_nodelay(true).unwrap();
                Sock::Tcp(s)
            }
        };
        s.set_read_timeout(timeout);
        Conn {
            s,
            structured: false,
            next_handle: 1,
        }
    }

    fn read_n(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0; n];
        self.s.read_exact(&mut buf)?;
        Ok(buf)
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.read_n(2).expect("read").try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.read_n(4).expect("read").try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.read_n(8).expect("read").try_into().unwrap())
    }

    /// Reads the server greeting, returns the handshake flags.
    fn greeting(&mut self) -> u16 {
        assert_eq!(self.u64(), NBDMAGIC, "greeting magic");
        assert_eq!(self.u64(), IHAVEOPT, "newstyle magic");
        let flags = self.u16();
        assert!(flags & 1 != 0, "server must set NBD_FLAG_FIXED_NEWSTYLE");
        flags
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send");
    }

    fn send_client_flags(&mut self, flags: u32) {
        self.send(&flags.to_be_bytes());
    }

    fn send_opt(&mut self, opt: u32, data: &[u8]) {
        let mut m = Vec::with_capacity(16 + data.len());
        m.extend_from_slice(&IHAVEOPT.to_be_bytes());
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.send(&m);
    }

    /// One option reply: (option, reply type, data).
    fn opt_reply(&mut self) -> (u32, u32, Vec<u8>) {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC, "option reply magic");
        let opt = self.u32();
        let typ = self.u32();
        let len = self.u32();
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        let data = self.read_n(len as usize).expect("option reply data");
        (opt, typ, data)
    }

    fn go_data(name: &str) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes()); // no information requests
        d
    }

    /// Sends NBD_OPT_GO (or INFO) and reads the replies up to the final
    /// one. Returns Ok((size, transmission flags)) or Err(reply type).
    fn go_or_info(&mut self, opt: u32, name: &str) -> Result<(u64, u16), u32> {
        self.send_opt(opt, &Self::go_data(name));
        let mut export = None;
        loop {
            let (o, typ, data) = self.opt_reply();
            assert_eq!(o, opt, "reply to the wrong option");
            match typ {
                REP_INFO => {
                    let kind = u16::from_be_bytes([data[0], data[1]]);
                    if kind == 0 {
                        assert_eq!(data.len(), 12, "NBD_INFO_EXPORT length");
                        let size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                        let flags = u16::from_be_bytes([data[10], data[11]]);
                        export = Some((size, flags));
                    }
                }
                REP_ACK => {
                    return Ok(export.expect("NBD_OPT_GO acked without NBD_INFO_EXPORT"));
                }
                t if t & (1 << 31) != 0 => return Err(t),
                t => panic!("unexpected option reply type {t:#x}"),
            }
        }
    }

    /// Greeting, client flags (fixed newstyle, no zeroes), OPT_GO.
    fn handshake_go(&mut self, name: &str) -> (u64, u16) {
        self.greeting();
        self.send_client_flags(1);
        self.go_or_info(OPT_GO, name)
            .unwrap_or_else(|t| panic!("NBD_OPT_GO {name:?} refused: {t:#x}"))
    }

    fn request(&mut self, flags: u16, typ: u16, off: u64, len: u32, payload: &[u8]) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut m = Vec::with_capacity(28 + payload.len());
        m.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&typ.to_be_bytes());
        m.extend_from_slice(&handle.to_be_bytes());
        m.extend_from_slice(&off.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(payload);
        self.send(&m);
        handle
    }

    /// Reads one complete reply (simple, or all chunks of a structured
    /// one). For a READ, `read` is its (offset, length). Returns (handle,
    /// reply), or the I/O error that ended the connection.
    fn reply(&mut self, read: Option<(u64, u32)>) -> std::io::Result<(u64, Reply)> {
        let magic = u32::from_be_bytes(self.read_n(4)?.try_into().unwrap());
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let rest = self.read_n(12)?;
                let err = u32::from_be_bytes(rest[0..4].try_into().unwrap());
                let handle = u64::from_be_bytes(rest[4..12].try_into().unwrap());
                if err != 0 {
                    return Ok((handle, Err(err)));
                }
                let data = match read {
                    Some((_, n)) => self.read_n(n as usize)?,
                    None => Vec::new(),
                };
                Ok((handle, Ok(data)))
            }
            STRUCTURED_REPLY_MAGIC => {
                assert!(self.structured, "structured reply without negotiation");
                let (base, n) = read.unwrap_or((0, 0));
                let mut data = vec![0xeeu8; n as usize];
                let mut covered = 0u64;
                let mut error = None;
                let mut first = true;
                loop {
                    if !first {
                        let m = u32::from_be_bytes(self.read_n(4)?.try_into().unwrap());
                        assert_eq!(m, STRUCTURED_REPLY_MAGIC, "chunk magic");
                    }
                    first = false;
                    let h = self.read_n(16)?;
                    let flags = u16::from_be_bytes([h[0], h[1]]);
                    let typ = u16::from_be_bytes([h[2], h[3]]);
                    let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                    let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
                    let payload = self.read_n(len as usize)?;
                    let mut place = |off: u64, bytes: &[u8]| {
                        assert!(
                            off >= base && off + bytes.len() as u64 <= base + u64::from(n),
                            "chunk {off}+{} outside the request {base}+{n}",
                            bytes.len()
                        );
                        let at = (off - base) as usize;
                        data[at..at + bytes.len()].copy_from_slice(bytes);
                        covered += bytes.len() as u64;
                    };
                    match typ {
                        0 => {}
                        1 => {
                            let off = u64::from_be_bytes(payload[0..8].try_into().unwrap());
                            place(off, &payload[8..]);
                        }
                        2 => {
                            let off = u64::from_be_bytes(payload[0..8].try_into().unwrap());
                            let hole = u32::from_be_bytes(payload[8..12].try_into().unwrap());
                            place(off, &vec![0; hole as usize]);
                        }
                        t if t & (1 << 15) != 0 => {
                            let e = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                            assert_ne!(e, 0, "error chunk with error 0");
                            error = Some(e);
                        }
                        t => panic!("unexpected structured chunk type {t}"),
                    }
                    if flags & 1 != 0 {
                        if let Some(e) = error {
                            return Ok((handle, Err(e)));
                        }
                        assert_eq!(
                            covered,
                            u64::from(n),
                            "READ chunks do not cover the request"
                        );
                        return Ok((handle, Ok(data)));
                    }
                }
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }

    /// One request, one reply, with the handle checked.
    fn call(&mut self, flags: u16, typ: u16, off: u64, len: u32, payload: &[u8]) -> Reply {
        let handle = self.request(flags, typ, off, len, payload);
        let read = (typ == CMD_READ).then_some((off, len));
        let (h, r) = self
            .reply(read)
            .unwrap_or_else(|e| panic!("no reply to command {typ} at {off}+{len}: {e}"));
        assert_eq!(h, handle, "reply handle");
        r
    }

    fn handle_peek(&self) -> u64 {
        self.next_handle
    }

    fn read(&mut self, off: u64, len: u32) -> Reply {
        self.call(0, CMD_READ, off, len, &[])
    }

    fn write(&mut self, off: u64, data: &[u8]) -> Reply {
        self.call(0, CMD_WRITE, off, data.len() as u32, data)
    }

    /// A WRITE sent as header then payload, without copying the payload
    /// (for large writes from many clients at once).
    fn write_large(&mut self, off: u64, data: &[u8]) -> Reply {
        let handle = self.request(0, CMD_WRITE, off, data.len() as u32, &[]);
        self.send(data);
        let (h, r) = self
            .reply(None)
            .unwrap_or_else(|e| panic!("no reply to WRITE at {off}+{}: {e}", data.len()));
        assert_eq!(h, handle, "reply handle");
        r
    }

    fn disc(mut self) {
        self.request(0, CMD_DISC, 0, 0, &[]);
    }

    /// Asserts the server closes the connection within `within` (reading
    /// and discarding whatever it sends first, e.g. an error reply).
    fn expect_closed(mut self, within: Duration) -> Duration {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            let left = within.saturating_sub(start.elapsed());
            assert!(
                !left.is_zero(),
                "server kept the connection open for {within:?}"
            );
            self.set_timeout(left.max(Duration::from_millis(10)));
            match self.s.read(&mut buf) {
                Ok(0) => return start.elapsed(),
                Ok(_) => {}
                Err(e) if is_closed_error(&e) => return start.elapsed(),
                // Interrupted: a signal reached this test process (another
                // test's handler is installed in it); read again.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn set_timeout(&mut self, t: Duration) {
        self.s.set_read_timeout(Some(t));
    }
}

fn tcp() -> Opts {
    Opts {
        tcp: true,
        ..Opts::default()
    }
}

fn read_only() -> Opts {
    Opts {
        read_only: true,
        ..Opts::default()
    }
}

// ---------------------------------------------------------------------------
// Real clients
// ---------------------------------------------------------------------------

#[test]
fn qemu_img_converts_and_compares_a_chain_over_tcp() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let opts = Opts {
        export_name: Some("chain".into()),
        read_only: true,
        ..tcp()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    let uri = server.uri();

    let info = qemu_img(&["info", "--output", "json", &uri]);
    let json: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(json["virtual-size"], SIZE, "{info}");
    // A name the server does not export is refused (NBD_REP_ERR_UNKNOWN),
    // and the server carries on.
    let wrong = run("qemu-img", &["info", &server.uri_for("nope")]);
    assert!(!wrong.status.success(), "export 'nope' was served");

    let out = at(&dir, "out.raw");
    qemu_img(&["convert", "-O", "raw", &uri, &p(&out)]);
    assert_same_bytes(
        "qemu-img convert nbd:// -> raw",
        &std::fs::read(&out).unwrap(),
        &expected,
    );
    let cmp = run(
        "qemu-img",
        &["compare", "-U", "-f", "raw", "-F", "qcow2", &uri, &p(&top)],
    );
    assert_eq!(
        cmp.status.code(),
        Some(0),
        "qemu-img compare nbd:// top.qcow2:\n{}",
        out_text(&cmp)
    );
    assert_serves(&mut server, &expected);
    server.shutdown();
}

#[test]
fn qemu_io_writes_land_in_the_top_layer() {
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    // The reference: the same writes applied by QEMU to a copy of the top
    // layer (same directory, so the same relative backing file).
    let reference = at(&dir, "reference.qcow2");
    std::fs::copy(&top, &reference).unwrap();
    let base_before = file_digest(&at(&dir, "base.qcow2"));
    let mid_before = file_digest(&at(&dir, "mid.qcow2"));

    let writes = [
        "write -P 0xa1 0 64k",
        "write -P 0xa2 5M 3M",
        "write -P 0xa3 12345 6789",
        "write -f -P 0xa4 20M 64k",
        "write -z 50M 256k",
        "write -z -u 40M 1M",
        "discard 60M 1M",
        "write -P 0xa5 60M 1M",
        "write -P 0xa6 64511k 1k",
        "flush",
    ];
    let reads = [
        "read -P 0xa1 0 12345",
        "read -P 0xa2 5M 3M",
        "read -P 0xa3 12345 6789",
        "read -P 0xa4 20M 64k",
        "read -P 0 50M 256k",
        "read -P 0 40M 1M",
        "read -P 0xa5 60M 1M",
        "read -P 0xa6 64511k 1k",
        "read -P 0x33 63M 511k",
    ];
    let mut server = Server::start(&top, dir.path(), &Opts::default());
    qemu_io_nbd(&server.uri(), false, &writes);
    // Read back on a new connection.
    qemu_io_nbd(&server.uri(), true, &reads);
    server.shutdown();

    qemu_io(&reference, &writes);
    assert_eq!(
        qemu_check(&top),
        0,
        "qemu-img check on the served top layer"
    );
    strata_ok(&["img", "check", &p(&top)]);
    let cmp = run("qemu-img", &["compare", &p(&reference), &p(&top)]);
    assert_eq!(
        cmp.status.code(),
        Some(0),
        "served top vs QEMU reference:\n{}",
        out_text(&cmp)
    );
    // Only the top layer was written.
    assert!(
        file_digest(&at(&dir, "base.qcow2")) == base_before,
        "base layer changed"
    );
    assert!(
        file_digest(&at(&dir, "mid.qcow2")) == mid_before,
        "middle layer changed"
    );
    // The chain index is valid again after the clean close, and reads
    // through it agree with QEMU's walk of the chain.
    let info = strata_ok(&["img", "info", "--output", "json", &p(&top)]);
    let json: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(json["chain-index"]["flag-set"], true, "{info}");
    assert_eq!(json["dirty-flag"], false, "{info}");
    assert_same_view(&top, dir.path());
}

#[test]
fn nbdinfo_reports_size_flags_and_exports() {
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    let other = at(&dir, "other.qcow2");
    qemu_create(&other, "", "8M");
    let pid_file = at(&dir, "serve.pid");
    let opts = Opts {
        export_name: Some("disk".into()),
        more: vec![("other".into(), other.clone())],
        pid_file: Some(pid_file.clone()),
        ..Opts::default()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid file holds a number");
    assert_eq!(pid, server.pid(), "--pid-file");

    let info = run_ok("nbdinfo", &["--json", &server.uri()]);
    let json: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(json["protocol"], "newstyle-fixed", "{info}");
    assert_eq!(json["structured"], true, "{info}");
    let e = &json["exports"][0];
    assert_eq!(e["export-name"], "disk", "{info}");
    assert_eq!(e["export-size"], SIZE, "{info}");
    for (key, want) in [
        ("is_read_only", false),
        ("can_flush", true),
        ("can_fua", true),
        ("can_multi_conn", true),
        ("can_trim", true),
        ("can_zero", true),
        ("can_fast_zero", true),
    ] {
        assert_eq!(e[key], want, "{key} in\n{info}");
    }
    assert!(
        e["contexts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "base:allocation"),
        "base:allocation missing:\n{info}"
    );
    let max = e["block_size_maximum"].as_u64().unwrap_or(0);
    assert!(
        max == 0 || max >= 32 * MIB,
        "block_size_maximum {max}:\n{info}"
    );

    // NBD_OPT_LIST: both exports, with their sizes.
    let list = run_ok("nbdinfo", &["--list", "--json", &server.uri_for("")]);
    let json: serde_json::Value = serde_json::from_str(&list).unwrap();
    let exports = json["exports"].as_array().expect("exports");
    let size_of = |name: &str| {
        exports
            .iter()
            .find(|e| e["export-name"] == name)
            .unwrap_or_else(|| panic!("export {name:?} not listed:\n{list}"))["export-size"]
            .clone()
    };
    assert_eq!(size_of("disk"), SIZE);
    assert_eq!(size_of("other"), 8 * MIB);
    assert_eq!(exports.len(), 2, "{list}");
    let info = run_ok("nbdinfo", &["--size", &server.uri_for("other")]);
    assert_eq!(info.trim(), (8 * MIB).to_string());
    server.shutdown();

    // The same image read-only.
    let mut server = Server::start(&top, dir.path(), &read_only());
    let info = run_ok("nbdinfo", &["--json", &server.uri()]);
    let json: serde_json::Value = serde_json::from_str(&info).unwrap();
    let e = &json["exports"][0];
    assert_eq!(e["export-name"], "", "default export name:\n{info}");
    assert_eq!(e["is_read_only"], true, "{info}");
    assert_eq!(e["can_multi_conn"], true, "{info}");
    assert_eq!(e["export-size"], SIZE, "{info}");
    server.assert_running();
    server.shutdown();
}

/// Per-4 KiB classification: true = data, false = reads as zero (hole).
fn classify(extents: &[(u64, u64, bool)], what: &str) -> Vec<bool> {
    let mut v = vec![None; (SIZE / 4096) as usize];
    let mut pos = 0;
    for &(start, len, data) in extents {
        assert_eq!(start, pos, "{what}: extents not contiguous at {start}");
        assert!(
            start % 4096 == 0 && len % 4096 == 0,
            "{what}: unaligned extent {start}+{len}"
        );
        for b in start / 4096..(start + len) / 4096 {
            v[b as usize] = Some(data);
        }
        pos = start + len;
    }
    assert_eq!(pos, SIZE, "{what}: extents end at {pos}");
    v.into_iter().map(Option::unwrap).collect()
}

#[test]
fn nbdinfo_map_matches_the_allocation() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let mut server = Server::start(&top, dir.path(), &read_only());

    let map = run_ok("nbdinfo", &["--map", "--json", &server.uri()]);
    let json: serde_json::Value = serde_json::from_str(&map).unwrap();
    let mut nbd = Vec::new();
    for e in json.as_array().expect("map array") {
        let typ = e["type"].as_u64().unwrap();
        let (off, len) = (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        // base:allocation: 0 = data, 3 = hole and zero. "zero without
        // hole" (2) would be legal for zero clusters, but the chain has
        // none that a hole does not describe better; "hole without zero"
        // (1) is wrong for a qcow2 chain (unallocated reads as zeros).
        assert!(
            typ == 0 || typ == 3,
            "extent {off}+{len} has type {typ}:\n{map}"
        );
        nbd.push((off, len, typ == 0));
    }
    let nbd = classify(&nbd, "nbdinfo --map");

    let qmap = qemu_img(&["map", "-U", "--output", "json", &p(&top)]);
    let q = map_runs(&qmap);
    let q = classify(&q, "qemu-img map");

    let smap = strata_ok(&["img", "map", "--output", "json", &p(&top)]);
    let s = map_runs(&smap);
    let s = classify(&s, "strata img map");
    assert_eq!(s, q, "strata img map and qemu-img map disagree");

    for (i, (&n, &want)) in nbd.iter().zip(&q).enumerate() {
        assert_eq!(
            n,
            want,
            "block status at {} is {} but the image has {}",
            i as u64 * 4096,
            if n { "data" } else { "hole" },
            if want { "data" } else { "a hole/zeros" }
        );
        if !n {
            let b = &expected[i * 4096..(i + 1) * 4096];
            assert!(
                b.iter().all(|&x| x == 0),
                "a 'hole' at {} has data",
                i * 4096
            );
        }
    }
    // The chain has data, zero clusters and unallocated ranges.
    assert!(q.iter().any(|&d| d) && q.iter().any(|&d| !d));
    server.shutdown();
}

#[test]
fn nbdcopy_both_ways() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());

    // Export -> local file.
    let mut server = Server::start(&top, dir.path(), &read_only());
    let out = at(&dir, "copy.raw");
    run_ok("nbdcopy", &[&server.uri(), &p(&out)]);
    assert_same_bytes(
        "nbdcopy export -> file",
        &std::fs::read(&out).unwrap(),
        &expected,
    );
    server.shutdown();

    // Local file -> export: a fresh snapshot layer on the chain, so zeroes
    // written by nbdcopy (it sends WRITE_ZEROES for zero blocks and holes)
    // must hide the data of the layers below.
    let fresh = at(&dir, "fresh.qcow2");
    strata_ok(&["img", "snapshot", &p(&top), &p(&fresh)]);
    let src = at(&dir, "src.raw");
    let mut data = vec![0u8; SIZE as usize];
    let mut x = 0x1234_5678_9abc_def0u64;
    for (i, chunk) in data.chunks_mut(MIB as usize).enumerate() {
        // Alternate: random MiBs, zero MiBs, and half-and-half.
        match i % 3 {
            0 => chunk.iter_mut().for_each(|b| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }),
            1 => {}
            _ => chunk[..(MIB / 2) as usize].fill(i as u8),
        }
    }
    std::fs::write(&src, &data).unwrap();
    let mut server = Server::start(&fresh, dir.path(), &Opts::default());
    run_ok("nbdcopy", &["--flush", &p(&src), &server.uri()]);
    server.shutdown();
    let cmp = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "qcow2", &p(&src), &p(&fresh)],
    );
    assert_eq!(
        cmp.status.code(),
        Some(0),
        "file -> export -> file:\n{}",
        out_text(&cmp)
    );
    assert_eq!(qemu_check(&fresh), 0);
}

/// Runs fio in `dir` (it may leave state files in its working directory).
fn fio(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new("fio")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("spawn fio (run scripts/test.sh as root to install it)");
    let text = out_text(&out);
    assert!(out.status.success(), "fio {args:?} failed:\n{text}");
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no fio json:\n{text}"));
    let json: serde_json::Value = serde_json::Deserializer::from_str(&text[start..])
        .into_iter()
        .next()
        .unwrap()
        .unwrap_or_else(|e| panic!("fio json: {e}\n{text}"));
    for job in json["jobs"].as_array().unwrap() {
        assert_eq!(job["error"], 0, "fio job error:\n{text}");
    }
    json
}

#[test]
fn fio_random_writes_and_reads_verify_crc32c() {
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    // 4 KiB writes into 64 KiB clusters over a chain: copy-on-write from
    // the layers below for every first write to a cluster.
    let fresh = at(&dir, "fresh.qcow2");
    strata_ok(&["img", "snapshot", &p(&top), &p(&fresh)]);
    let job = |uri: &str, verify_only: bool| -> Vec<String> {
        let mut v: Vec<String> = [
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--size=64M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--randseed=4242",
            "--output-format=json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(format!("--uri={uri}"));
        if verify_only {
            v.push("--verify_only".into());
        }
        v
    };
    let mut server = Server::start(&fresh, dir.path(), &Opts::default());
    // Write every 4 KiB block once in random order, then read all back and
    // check each block's crc32c header.
    let args = job(&server.uri(), false);
    let json = fio(
        dir.path(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let written = json["jobs"][0]["write"]["io_bytes"].as_u64().unwrap();
    assert_eq!(written, SIZE, "fio wrote {written} bytes");
    // Verify again on a new connection.
    let args = job(&server.uri(), true);
    fio(
        dir.path(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    server.shutdown();
    assert_eq!(qemu_check(&fresh), 0);
    // And once more from the file, through a new server process.
    let mut server = Server::start(&fresh, dir.path(), &read_only());
    let args = job(&server.uri(), true);
    fio(
        dir.path(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    server.shutdown();
}

/// libnbd script: writes on h1 (no FUA), FLUSH on h2, reads on h3.
const MULTI_CONN_PY: &str = r#"
import nbd, sys
uri = sys.argv[1]
def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h
h1, h2 = connect(), connect()
assert h1.can_multi_conn() and h2.can_multi_conn(), "no CAN_MULTI_CONN"
assert h1.can_flush(), "no SEND_FLUSH"
writes = [(0, b"\xc1" * 65536), (5 << 20, b"\xc2" * (3 << 20)),
          (100000, b"\xc3" * 777), ((63 << 20) + 4096, b"\xc4" * 4096)]
for off, buf in writes:
    h1.pwrite(buf, off)            # no FUA, not flushed on h1
h1.zero(10 << 20, 20 << 20)        # WRITE_ZEROES, no FUA
h2.flush()                          # FLUSH on the *other* connection
h3 = connect()
for off, buf in writes:
    assert h3.pread(len(buf), off) == buf, "h3 does not see h1's write at %d" % off
assert h3.pread(10 << 20, 20 << 20) == bytes(10 << 20), "h3 does not see the zeroes"
print("ok")
sys.stdout.flush()
# Leave all three connections open: the test kills the server now.
import time
time.sleep(30)
"#;

#[test]
fn multi_conn_flush_on_one_connection_covers_writes_of_another() {
    // What is observable here without cutting power: once FLUSH on h2 has
    // returned, (1) a third connection reads h1's writes, and (2) they are
    // in the image file even when the server then dies by SIGKILL, with no
    // chance to flush on its way out. (2) shows the server keeps no private
    // write-back state (user-space buffers, unwritten qcow2 metadata) that
    // a FLUSH from another connection leaves behind. Whether fsync reached
    // the platter cannot be observed: the page cache survives SIGKILL.
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    let mut server = Server::start(&top, dir.path(), &Opts::default());
    let mut py = Command::new(nbd_python())
        .args(["-c", MULTI_CONN_PY, &server.uri()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(py.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() != "ok" {
        let _ = py.kill();
        let out = py.wait_with_output().unwrap();
        panic!(
            "libnbd script failed: {line}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = server.stop_with(libc::SIGKILL, Duration::from_secs(10));
    assert!(!status.success());
    let _ = py.kill();
    let _ = py.wait();

    // Read the file with QEMU (read-only: the image may carry the dirty bit
    // of a writer that was killed).
    let out = run(
        "qemu-io",
        &[
            "-r",
            "-c",
            "read -P 0xc1 0 64k",
            "-c",
            "read -P 0xc2 5M 3M",
            "-c",
            "read -P 0xc3 100000 777",
            "-c",
            "read -P 0xc4 64516k 4k",
            "-c",
            "read -P 0 20M 10M",
            &p(&top),
        ],
    );
    let text = out_text(&out);
    assert!(
        out.status.success() && !text.contains("failed") && !text.contains("error"),
        "after FLUSH on another connection and SIGKILL, the file lacks the writes:\n{text}"
    );
    // Killed, not closed: leaked clusters are allowed, corruption is not.
    let check = run("qemu-img", &["check", &p(&top)]);
    assert!(
        matches!(check.status.code(), Some(0) | Some(3)),
        "qemu-img check after SIGKILL:\n{}",
        out_text(&check)
    );
}

/// libnbd script: FUA, WRITE_ZEROES with NO_HOLE and FAST_ZERO, TRIM,
/// BLOCK_STATUS, many requests in flight; dumps the whole disk as read.
const ZERO_TRIM_PY: &str = r#"
import errno, nbd, sys
uri, dump = sys.argv[1], sys.argv[2]
M = 1 << 20
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.connect_uri(uri)
for cap in ("can_fua", "can_zero", "can_fast_zero", "can_trim", "can_flush"):
    assert getattr(h, cap)(), cap
assert h.can_meta_context("base:allocation"), "base:allocation not negotiated"

# (libnbd's Python calls take the count first, then the offset.)
h.pwrite(b"\xd1" * 65536, 0, nbd.CMD_FLAG_FUA)        # FUA write
h.zero(2 * M, M, nbd.CMD_FLAG_NO_HOLE)                 # zeroes, keep allocated
h.zero(4 * M, M)                                       # zeroes, holes allowed
h.zero(300000, 100000)                                 # unaligned zeroes
h.zero(44 * M + 512, 65536 - 512, nbd.CMD_FLAG_FUA)   # zeroes + FUA, unaligned start
try:                                                   # FAST_ZERO: done or ENOTSUP
    h.zero(6 * M, 4 * M, nbd.CMD_FLAG_FAST_ZERO)
    fast = "ok"
except nbd.Error as e:
    assert e.errno == errno.ENOTSUP, "FAST_ZERO failed with %r" % (e,)
    fast = "enotsup"
h.trim(2 * M, 50 * M)                                  # contents then undefined
h.pwrite(b"\xd2" * 131072, 50 * M)                     # rewrite part of it

# 64 writes in flight at once, then check them.
for i in range(64):
    h.aio_pwrite(bytes([0x40 + i]) * 4096, 62 * M + i * 4096)
while h.aio_in_flight() > 0:
    h.poll(-1)
for i in range(64):
    assert h.pread(4096, 62 * M + i * 4096) == bytes([0x40 + i]) * 4096, "aio write %d" % i

def expect(off, n, byte):
    for x in range(off, off + n, 16 * M):
        k = min(16 * M, off + n - x)
        got = h.pread(k, x)
        assert got == bytes([byte]) * k, "at %d: %r.. want %#x" % (x, got[:8], byte)
expect(0, 65536 - 512, 0xd1)
expect(65536 - 512, 44 * M + 512, 0)
expect(50 * M, 131072, 0xd2)

# BLOCK_STATUS over the whole disk: contiguous, and every extent that
# claims ZERO reads as zeroes; the FUA data at 0 is not a hole.
size = h.get_size()
extents, off = [], 0
while off < size:
    got = []
    h.block_status(size - off, off, lambda ctx, o, e, err: got.append((ctx, o, list(e))))
    ctx, o, e = got[0]
    assert ctx == "base:allocation" and o == off, (ctx, o, off)
    for i in range(0, len(e), 2):
        extents.append((off, e[i], e[i + 1]))
        off += e[i]
pos = 0
for o, n, flags in extents:
    assert o == pos and n > 0, (o, n, pos)
    pos += n
    if flags & nbd.STATE_ZERO:
        step = min(n, 32 * M)
        for x in range(o, o + n, step):
            assert h.pread(min(step, o + n - x), x) == bytes(min(step, o + n - x)), \
                "extent %d+%d claims zeroes but has data" % (o, n)
assert extents[0][2] & (nbd.STATE_HOLE | nbd.STATE_ZERO) == 0, extents[0]
h.flush()
with open(dump, "wb") as f:
    for x in range(0, size, 32 * M):
        f.write(h.pread(min(32 * M, size - x), x))
h.shutdown()
print(fast)
"#;

#[test]
fn libnbd_zeroes_trim_fua_block_status_and_pipelining() {
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    let mut server = Server::start(&top, dir.path(), &Opts::default());
    let dump = at(&dir, "dump.raw");
    let out = Command::new(nbd_python())
        .args(["-c", ZERO_TRIM_PY, &server.uri(), &p(&dump)])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "libnbd script failed:\n{}",
        out_text(&out)
    );
    server.shutdown();
    assert_eq!(qemu_check(&top), 0);
    // What the clients read before shutdown is what the file holds after.
    assert_same_bytes(
        "disk read over NBD vs the file after shutdown",
        &std::fs::read(&dump).unwrap(),
        &qemu_raw(&top, dir.path()),
    );
    assert_same_view(&top, dir.path());
}

// ---------------------------------------------------------------------------
// Bad clients
// ---------------------------------------------------------------------------

#[test]
fn garbage_handshakes_are_dropped() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let mut server = Server::start(&top, dir.path(), &tcp());

    // Unknown client flags: the server MUST close.
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(0xdead_beef);
    c.expect_closed(Duration::from_secs(10));

    // Valid flags, then garbage instead of an option header.
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(1);
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    c.expect_closed(Duration::from_secs(10));

    // Garbage from the first byte, without reading the greeting.
    let mut c = server.connect();
    c.send(&[0xff; 4096]);
    c.expect_closed(Duration::from_secs(10));

    // An option header claiming a huge payload.
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(1);
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&u32::MAX.to_be_bytes());
    c.send(&m);
    c.expect_closed(Duration::from_secs(10));

    assert_serves(&mut server, &expected);
    server.shutdown();
}

#[test]
fn truncated_handshakes_leave_the_server_up() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let mut server = Server::start(&top, dir.path(), &Opts::default());

    // Connect and close at once.
    drop(server.connect());
    // Close after half the greeting.
    let mut c = server.connect();
    c.read_n(8).unwrap();
    drop(c);
    // Half the client flags.
    let mut c = server.connect();
    c.greeting();
    c.send(&[0, 0]);
    drop(c);
    // Half an option header.
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(1);
    c.send(&IHAVEOPT.to_be_bytes()[..6]);
    drop(c);
    // An OPT_GO announcing 64 bytes, sending 10.
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(1);
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&64u32.to_be_bytes());
    m.extend_from_slice(&[0; 10]);
    c.send(&m);
    drop(c);
    // A request header cut in the middle, after a successful GO.
    let mut c = server.connect();
    c.handshake_go("");
    c.send(&REQUEST_MAGIC.to_be_bytes());
    c.send(&[0, 0, 0]);
    drop(c);
    // A WRITE whose payload never comes.
    let mut c = server.connect();
    c.handshake_go("");
    let mut m = REQUEST_MAGIC.to_be_bytes().to_vec();
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&CMD_WRITE.to_be_bytes());
    m.extend_from_slice(&7u64.to_be_bytes());
    m.extend_from_slice(&(8 * MIB).to_be_bytes());
    m.extend_from_slice(&65536u32.to_be_bytes());
    m.extend_from_slice(&[0x77; 100]);
    c.send(&m);
    drop(c);

    std::thread::sleep(Duration::from_millis(200));
    assert_serves(&mut server, &expected);
    server.shutdown();
    // The truncated WRITE was not applied (not even its first 100 bytes).
    assert_same_bytes(
        "after a truncated WRITE",
        &qemu_raw(&top, dir.path())[(8 * MIB) as usize..(8 * MIB) as usize + 65536],
        &expected[(8 * MIB) as usize..(8 * MIB) as usize + 65536],
    );
}

#[test]
fn unknown_option_gets_err_unsup_then_go_succeeds() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let opts = Opts {
        export_name: Some("disk".into()),
        ..Opts::default()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(1);

    // An unknown option with a payload: NBD_REP_ERR_UNSUP, payload skipped.
    c.send_opt(0x7a5e, b"strata-unknown-option");
    let (opt, typ, _) = c.opt_reply();
    assert_eq!(opt, 0x7a5e);
    assert_eq!(
        typ, REP_ERR_UNSUP,
        "reply type {typ:#x}, want NBD_REP_ERR_UNSUP"
    );

    // NBD_OPT_LIST names the export.
    c.send_opt(OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (opt, typ, data) = c.opt_reply();
        assert_eq!(opt, OPT_LIST);
        match typ {
            REP_SERVER => {
                let n = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
                names.push(String::from_utf8(data[4..4 + n].to_vec()).unwrap());
            }
            REP_ACK => break,
            t => panic!("NBD_OPT_LIST reply {t:#x}"),
        }
    }
    assert_eq!(names, ["disk"]);

    // NBD_OPT_INFO on a name that does not exist: an error, not a hang up.
    let err = c.go_or_info(OPT_INFO, "nope").unwrap_err();
    assert_eq!(err, REP_ERR_UNKNOWN, "NBD_OPT_INFO 'nope': {err:#x}");
    // NBD_OPT_INFO then NBD_OPT_STRUCTURED_REPLY then NBD_OPT_GO.
    let (size, _) = c.go_or_info(OPT_INFO, "disk").expect("NBD_OPT_INFO");
    assert_eq!(size, SIZE);
    c.send_opt(OPT_STRUCTURED_REPLY, &[]);
    let (_, typ, _) = c.opt_reply();
    assert_eq!(typ, REP_ACK, "NBD_OPT_STRUCTURED_REPLY");
    c.structured = true;
    let (size, flags) = c.go_or_info(OPT_GO, "disk").expect("NBD_OPT_GO");
    assert_eq!(size, SIZE);
    assert!(flags & 1 != 0, "NBD_FLAG_HAS_FLAGS");
    assert!(flags & FLAG_READ_ONLY == 0);
    assert!(flags & FLAG_SEND_FLUSH != 0);
    assert!(flags & FLAG_CAN_MULTI_CONN != 0);

    // Reads over data, zero clusters and unallocated ranges, with
    // structured replies (data and hole chunks).
    for (off, len) in [
        (0u64, 65536u32),
        (10 * MIB - 4096, 1 << 20),
        (30 * MIB, 131072),
        (SIZE - 512, 512),
    ] {
        let got = c.read(off, len).expect("READ");
        assert_same_bytes(
            &format!("structured READ {off}+{len}"),
            &got,
            &expected[off as usize..(off + u64::from(len)) as usize],
        );
    }
    c.disc();

    // NBD_OPT_ABORT gets an ACK (or a close) and the server lives on.
    let mut c = server.connect();
    c.greeting();
    c.send_client_flags(1);
    c.send_opt(OPT_ABORT, &[]);
    c.expect_closed(Duration::from_secs(10));
    assert_serves(&mut server, &expected);
    server.shutdown();
}

#[test]
fn oversized_and_out_of_range_requests_get_errors() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let mut server = Server::start(&top, dir.path(), &Opts::default());
    let mut c = server.connect();
    c.handshake_go("");

    // Exactly the maximum (32 MiB) is served.
    let got = c.read(4 * MIB, 32 * MIB as u32).expect("32 MiB READ");
    assert_same_bytes(
        "32 MiB READ",
        &got,
        &expected[(4 * MIB) as usize..(36 * MIB) as usize],
    );

    // Over the maximum: EINVAL or EOVERFLOW, no payload; the connection
    // goes on (the spec also allows a hard disconnect: then reconnect).
    match c.read(0, 32 * MIB as u32 + 4096) {
        Err(e) => assert!(e == EINVAL || e == EOVERFLOW, "READ > 32 MiB: error {e}"),
        Ok(_) => panic!("a READ over 32 MiB succeeded"),
    }
    // Beyond the end, straddling the end, and wrapping around 2^64.
    for (off, len) in [
        (SIZE, 4096u32),
        (SIZE - 4096, 8192),
        (u64::MAX - 1023, 2048),
    ] {
        match c.read(off, len) {
            Err(e) => assert_eq!(e, EINVAL, "READ {off}+{len}"),
            Ok(_) => panic!("READ {off}+{len} beyond the end succeeded"),
        }
    }
    match c.write(SIZE - 512, &[0x5a; 1024]) {
        Err(e) => assert!(e == ENOSPC || e == EINVAL, "WRITE past the end: error {e}"),
        Ok(_) => panic!("WRITE past the end succeeded"),
    }
    match c.call(0, CMD_WRITE_ZEROES, SIZE - 4096, 8192, &[]) {
        Err(e) => assert!(e == ENOSPC || e == EINVAL, "WRITE_ZEROES past the end: {e}"),
        Ok(_) => panic!("WRITE_ZEROES past the end succeeded"),
    }
    match c.call(0, CMD_TRIM, SIZE, 4096, &[]) {
        Err(e) => assert!(e == ENOSPC || e == EINVAL, "TRIM past the end: {e}"),
        Ok(_) => panic!("TRIM past the end succeeded"),
    }
    // Unknown command: EINVAL.
    match c.call(0, 0x4242, 0, 4096, &[]) {
        Err(e) => assert_eq!(e, EINVAL, "unknown command"),
        Ok(_) => panic!("an unknown command succeeded"),
    }
    // The connection still works, and the last 512 bytes were not written.
    let got = c.read(SIZE - 4096, 4096).expect("READ after errors");
    assert_same_bytes(
        "tail after refused writes",
        &got,
        &expected[(SIZE - 4096) as usize..],
    );
    c.disc();

    // A WRITE over the maximum: an error reply or a hard disconnect, and
    // nothing written.
    let mut c = server.connect();
    c.handshake_go("");
    let len = 32 * MIB as u32 + 65536;
    let handle = c.request(0, CMD_WRITE, 0, len, &[]);
    let payload = vec![0x66u8; len as usize];
    let _ = c.s.write_all(&payload); // may fail if the server hung up
    match c.reply(None) {
        Ok((h, Err(e))) => {
            assert_eq!(h, handle);
            assert!(
                e == EINVAL || e == EOVERFLOW || e == ENOSPC,
                "WRITE > 32 MiB: error {e}"
            );
        }
        Ok((_, Ok(_))) => panic!("a WRITE over 32 MiB succeeded"),
        Err(e) => assert!(is_closed_error(&e), "WRITE > 32 MiB: {e}"),
    }
    drop(c);
    assert_serves(&mut server, &expected);
    server.shutdown();
    assert_same_bytes(
        "after refused writes",
        &qemu_raw(&top, dir.path()),
        &expected,
    );
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let before = file_digest(&top);
    let mut server = Server::start(&top, dir.path(), &read_only());
    let mut c = server.connect();
    let (_, flags) = c.handshake_go("");
    assert!(
        flags & FLAG_READ_ONLY != 0,
        "NBD_FLAG_READ_ONLY missing: {flags:#x}"
    );
    // The spec's SHOULD (qemu-nbd 10.0 answers EINVAL to some of these).
    let eperm = |r: Reply, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e, EPERM, "{what}: error {e}, want EPERM");
    };
    eperm(c.write(0, &[0x99; 4096]), "WRITE");
    eperm(c.call(1, CMD_WRITE, 4096, 512, &[0x99; 512]), "WRITE+FUA");
    eperm(c.call(0, CMD_TRIM, 0, 65536, &[]), "TRIM");
    eperm(c.call(0, CMD_WRITE_ZEROES, 0, 65536, &[]), "WRITE_ZEROES");
    // Still connected; nothing changed.
    let got = c.read(0, 65536).expect("READ");
    assert_same_bytes("read-only export", &got, &expected[..65536]);
    c.call(0, CMD_FLUSH, 0, 0, &[])
        .expect("FLUSH on a read-only export");
    c.disc();
    // QEMU refuses to write too.
    let out = run("qemu-io", &["-f", "raw", "-c", "write 0 4k", &server.uri()]);
    assert!(
        !out.status.success()
            || out_text(&out).contains("ermission")
            || out_text(&out).contains("read-only")
            || out_text(&out).contains("not permitted"),
        "qemu-io wrote to a read-only export:\n{}",
        out_text(&out)
    );
    assert_serves(&mut server, &expected);
    server.shutdown();
    assert!(
        file_digest(&top) == before,
        "read-only export changed the file"
    );
}

#[test]
fn stalled_clients_are_dropped_while_others_are_served() {
    // A 3 s limit (not less) leaves room for the other clients below to be
    // served well within it on a loaded 2-core CI machine.
    const LIMIT: Duration = Duration::from_secs(3);
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let opts = Opts {
        handshake_timeout: Some(LIMIT.as_secs() as u32),
        ..Opts::default()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    let t0 = Instant::now();
    // Says nothing at all.
    let silent = server.connect();
    // Sends its flags, then stalls in option haggling.
    let mut haggler = server.connect();
    haggler.greeting();
    haggler.send_client_flags(1);
    // Finished its handshake and then idles: must NOT be dropped.
    let mut idle = server.connect();
    idle.handshake_go("");

    // Meanwhile, other clients are served, before the limit expires.
    assert_serves(&mut server, &expected);
    qemu_io_nbd(&server.uri(), true, &["read -P 0x11 2M 1M"]);
    let served = t0.elapsed();
    assert!(
        served < LIMIT - Duration::from_millis(300),
        "serving others took {served:?}: blocked behind the stalled clients?"
    );

    silent.expect_closed(Duration::from_secs(15));
    let closed = t0.elapsed();
    assert!(
        closed >= LIMIT - Duration::from_millis(300),
        "the silent client was dropped after {closed:?}, before the {LIMIT:?} limit"
    );
    haggler.expect_closed(Duration::from_secs(15));
    // The idle, negotiated connection still works after the limit.
    std::thread::sleep(Duration::from_millis(300));
    let got = idle.read(0, 4096).expect("READ on the idle connection");
    assert_same_bytes("idle connection", &got, &expected[..4096]);
    idle.disc();
    assert_serves(&mut server, &expected);
    server.shutdown();
}

#[test]
fn max_connections_holds_further_clients_until_a_slot_frees() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let opts = Opts {
        max_connections: Some(2),
        ..Opts::default()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    let mut first = server.connect();
    first.handshake_go("");
    let mut second = server.connect();
    second.handshake_go("");
    // The server is full: a third client is not accepted (it waits in the
    // listen queue), so it gets no greeting.
    let mut third = server.connect();
    third.s.set_read_timeout(Some(Duration::from_millis(1500)));
    let mut byte = [0u8; 1];
    let waited = third.s.read(&mut byte);
    assert!(
        matches!(&waited, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "a third client got {waited:?} from a server limited to 2 connections"
    );
    // Both admitted clients are served meanwhile.
    let got = first.read(0, 4096).expect("READ on the first connection");
    assert_same_bytes("first connection", &got, &expected[..4096]);
    // When one leaves, the waiting client is served, in order.
    second.disc();
    third.s.set_read_timeout(Some(Duration::from_secs(30)));
    let (size, _) = {
        let mut c = third;
        let r = c.handshake_go("");
        let got = c.read(2 << 20, 4096).expect("READ on the third connection");
        assert_same_bytes(
            "third connection",
            &got,
            &expected[2 << 20..(2 << 20) + 4096],
        );
        c.disc();
        r
    };
    assert_eq!(size, expected.len() as u64);
    first.disc();
    server.shutdown();
}

/// A stop sent the moment the readiness line is read ends the server
/// cleanly (exit 0): its signal handlers are in place before it prints
/// the line. Ten times, since the window they once left open was small.
#[test]
fn sigterm_right_after_the_readiness_line_exits_0() {
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    for _ in 0..10 {
        let mut server = Server::start(&top, dir.path(), &Opts::default());
        server.shutdown();
    }
}

#[test]
fn sigterm_while_writing_exits_0_and_keeps_acknowledged_writes() {
    let dir = tmp();
    let (top, _) = make_chain(dir.path());
    let fresh = at(&dir, "fresh.qcow2");
    strata_ok(&["img", "snapshot", &p(&top), &p(&fresh)]);
    let mut server = Server::start(&fresh, dir.path(), &Opts::default());

    const SLOT: u64 = 65536;
    const SLOTS: u64 = SIZE / SLOT;
    const QD: usize = 8;
    let acked = Arc::new(AtomicUsize::new(0));
    // (slot, pattern) of every write sent, and whether it was acknowledged.
    let log: Arc<Mutex<Vec<(u64, u8, bool)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut c = server.connect();
    c.handshake_go("");
    let client = {
        let acked = acked.clone();
        let log = log.clone();
        std::thread::spawn(move || {
            let mut inflight = std::collections::HashMap::new();
            let mut i: u64 = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                while inflight.len() < QD {
                    // Slots visited in a scattered order; pattern never 0.
                    let slot = (i * 389) % SLOTS;
                    let pattern = (1 + i % 251) as u8;
                    let data = vec![pattern; SLOT as usize];
                    let idx = log.lock().unwrap().len();
                    log.lock().unwrap().push((slot, pattern, false));
                    let h = c.handle_peek();
                    let mut m = Vec::with_capacity(28 + data.len());
                    m.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
                    m.extend_from_slice(&0u16.to_be_bytes());
                    m.extend_from_slice(&CMD_WRITE.to_be_bytes());
                    m.extend_from_slice(&h.to_be_bytes());
                    m.extend_from_slice(&(slot * SLOT).to_be_bytes());
                    m.extend_from_slice(&(SLOT as u32).to_be_bytes());
                    m.extend_from_slice(&data);
                    c.next_handle += 1;
                    if c.s.write_all(&m).is_err() {
                        return;
                    }
                    inflight.insert(h, idx);
                    i += 1;
                }
                match c.reply(None) {
                    Ok((h, r)) => {
                        let idx = inflight.remove(&h).expect("reply to an unknown handle");
                        if r.is_ok() {
                            log.lock().unwrap()[idx].2 = true;
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(_) => return, // the server closed the connection
                }
                if Instant::now() > deadline {
                    panic!("the server never closed the connection");
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.load(Ordering::SeqCst) < 300 {
        assert!(Instant::now() < deadline, "writes too slow");
        std::thread::sleep(Duration::from_millis(5));
    }
    server.shutdown(); // SIGTERM, exit status 0
    client.join().expect("client thread");

    // Every acknowledged write is in the file; a slot may also hold a
    // later write that was sent but whose reply never came.
    let log = log.lock().unwrap().clone();
    assert!(log.iter().filter(|w| w.2).count() >= 300);
    let raw = qemu_raw(&fresh, dir.path());
    for slot in 0..SLOTS {
        let writes: Vec<_> = log.iter().filter(|w| w.0 == slot).collect();
        let Some(last_acked) = writes.iter().rposition(|w| w.2) else {
            continue;
        };
        let ok: Vec<u8> = writes[last_acked..].iter().map(|w| w.1).collect();
        let data = &raw[(slot * SLOT) as usize..((slot + 1) * SLOT) as usize];
        assert!(
            data.iter().all(|&b| b == data[0]) && ok.contains(&data[0]),
            "slot {slot}: file holds {:#x}.., acknowledged {:#x} (later: {:?})",
            data[0],
            writes[last_acked].1,
            &ok[1..]
        );
    }
    assert_eq!(qemu_check(&fresh), 0, "image not clean after SIGTERM");
}

/// A field of /proc/PID/status, in KiB (VmHWM, VmRSS).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Clients each sending one 32 MiB write, all at once, into an image of
/// `clients` * 32 MiB; every write is read back. Returns the server's peak
/// RSS and its RSS before the writes, in MiB.
fn concurrent_large_writes(budget: &str, clients: usize) -> (u64, u64) {
    const WRITE: usize = 32 << 20;
    const SHIFT: usize = 4096;
    let dir = tmp();
    let image = dir.path().join("big.qcow2");
    qemu_create(&image, "cluster_size=64k", &(clients * WRITE).to_string());
    let opts = Opts {
        buffer_budget: Some(budget.into()),
        max_connections: Some(clients as u32),
        ..Opts::default()
    };
    let server = Server::start(&image, dir.path(), &opts);
    let pid = server.pid();
    // Client i writes the window of this buffer starting at i * 4 KiB:
    // distinct data per client, without 64 copies of it in the test.
    let source = Arc::new(pattern(WRITE + clients * SHIFT, 7));
    let mut conns: Vec<Conn> = (0..clients)
        .map(|_| {
            let mut c = server.connect();
            c.handshake_go("");
            c
        })
        .collect();
    let before = status_kib(pid, "VmRSS") / 1024;
    let start = Arc::new(std::sync::Barrier::new(clients));
    let threads: Vec<_> = conns
        .drain(..)
        .enumerate()
        .map(|(i, mut c)| {
            let (source, start) = (source.clone(), start.clone());
            std::thread::spawn(move || {
                let data = &source[i * SHIFT..i * SHIFT + WRITE];
                start.wait();
                let offset = (i * WRITE) as u64;
                c.write_large(offset, data)
                    .unwrap_or_else(|e| panic!("client {i}: WRITE failed with error {e}"));
                // Read back in 4 MiB pieces.
                for piece in (0..WRITE).step_by(4 << 20) {
                    let got = c
                        .read(offset + piece as u64, 4 << 20)
                        .unwrap_or_else(|e| panic!("client {i}: READ failed with error {e}"));
                    let want = &data[piece..piece + (4 << 20)];
                    // (memcmp first: a byte loop is slow in a debug build)
                    if got != want {
                        assert_same_bytes(&format!("client {i} at {piece}"), &got, want);
                    }
                }
                c.disc();
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client failed");
    }
    let peak = status_kib(pid, "VmHWM") / 1024;
    drop(server);
    (peak, before)
}

#[test]
fn buffer_budget_bounds_memory_of_64_clients_writing_32_mib() {
    // Without the budget this took the server to over 2 GiB (64 x 32 MiB
    // buffered at once); with a 64 MiB budget the clients wait their turn.
    const BUDGET: u64 = 64;
    let (peak, before) = concurrent_large_writes("64M", 64);
    // Bound: RSS before the writes, the budget, buffers kept by idle
    // threads (a quarter of the budget), and 48 MiB for what else 64
    // busy connections hold (128 KiB read buffers, thread stacks, the
    // engine's caches growing with 2 GiB written, allocator slack).
    let bound = before + BUDGET + BUDGET / 4 + 48;
    eprintln!("peak RSS {peak} MiB (before the writes {before} MiB, bound {bound} MiB)");
    assert!(
        peak <= bound,
        "the server's peak RSS was {peak} MiB, over the {bound} MiB that a {BUDGET} MiB \
         budget allows (RSS before the writes: {before} MiB)"
    );
}

/// Polls the server's log for `needle` for up to `within`.
fn wait_for_log(server: &Server, needle: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if server.log_text().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn idle_timeout_closes_silent_and_deaf_clients_only_when_asked() {
    const IDLE: Duration = Duration::from_secs(1);
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let opts = Opts {
        idle_timeout: Some(IDLE.as_secs_f64()),
        log_filter: Some("strata_nbd=debug".into()),
        ..Opts::default()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    // Negotiates, then sends nothing.
    let mut silent = server.connect();
    silent.handshake_go("");
    let t0 = Instant::now();
    // Sends a request every 300 ms for 3 s: never idle for a whole second.
    let mut busy = server.connect();
    busy.handshake_go("");
    let want = expected[..4096].to_vec();
    let busy = std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            let got = busy.read(0, 4096).expect("READ on the busy connection");
            assert_same_bytes("busy connection", &got, &want);
            std::thread::sleep(Duration::from_millis(300));
        }
        busy.disc();
    });
    // Asks for 64 MiB and reads none of it: once the socket is full, the
    // server's replies cannot go out for a whole second either.
    let mut deaf = server.connect();
    deaf.handshake_go("");
    deaf.request(0, CMD_READ, 0, 32 << 20, &[]);
    deaf.request(0, CMD_READ, 32 << 20, 32 << 20, &[]);

    silent.expect_closed(Duration::from_secs(5));
    let closed = t0.elapsed();
    assert!(
        closed >= IDLE - Duration::from_millis(100),
        "the silent client was closed after {closed:?}, before the {IDLE:?} timeout"
    );
    assert!(
        closed < IDLE * 3,
        "the silent client was closed only after {closed:?} (timeout {IDLE:?})"
    );
    busy.join().expect("the busy client was served throughout");
    // Read nothing until the server has had time to give up on the deaf
    // client (reading would let its replies through).
    assert!(
        wait_for_log(&server, "it read no reply for 1s", Duration::from_secs(5)),
        "the client that read no reply was not dropped"
    );
    deaf.expect_closed(Duration::from_secs(5));
    assert!(server.log_text().contains("closing a client idle for 1s"));
    assert_serves(&mut server, &expected);
    server.shutdown();

    // Without --idle-timeout a silent client stays connected.
    let mut server = Server::start(&top, dir.path(), &Opts::default());
    let mut silent = server.connect();
    silent.handshake_go("");
    std::thread::sleep(Duration::from_secs(3));
    let got = silent
        .read(0, 4096)
        .expect("READ after 3 s of silence without --idle-timeout");
    assert_same_bytes("silent connection", &got, &expected[..4096]);
    silent.disc();
    server.shutdown();
}

#[test]
fn out_of_file_descriptors_the_server_waits_and_accepts_again() {
    let dir = tmp();
    let (top, expected) = make_chain(dir.path());
    let opts = Opts {
        open_files: Some(OPEN_FILES),
        max_connections: Some(100),
        ..Opts::default()
    };
    let mut server = Server::start(&top, dir.path(), &opts);
    // More clients than the server has descriptors: accepting fails with
    // EMFILE, and the rest wait in the listen queue.
    let crowd: Vec<Conn> = (0..2 * OPEN_FILES).map(|_| server.connect()).collect();
    assert!(
        wait_for_log(&server, "out of file descriptors", Duration::from_secs(10)),
        "the server never ran out of descriptors with {OPEN_FILES} allowed"
    );
    std::thread::sleep(Duration::from_secs(1));
    server.assert_running();
    // The clients leave; their descriptors come back and the server
    // serves new clients again.
    drop(crowd);
    assert_serves(&mut server, &expected);
    // One report per 10 s, not one per failed attempt (every 100 ms).
    let reports = server
        .log_text()
        .matches("accepting a client failed")
        .count();
    assert!(
        reports <= 2,
        "{reports} log lines about failed accepts: not rate-limited"
    );
    server.shutdown();
}

/// Open file limit of the server in the descriptor test.
const OPEN_FILES: u64 = 40;
