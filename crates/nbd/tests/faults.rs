//! The server on devices that fail and stall, spoken to by real clients
//! (libnbd's Python binding and qemu-io): a failed request gets its error
//! reply (EIO, or ENOSPC for a full device) and nothing else breaks: the
//! connection goes on, other requests succeed, the server takes new
//! connections. Requests to a slow device all complete, run in parallel,
//! and do not hold up another export.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use strata_block::{BlockDevice, ErrorKind, Fault, FaultyDevice, Operation, SlowDevice};
use strata_disk::{create, CreateOptions, Disk, OpenOptions};
use strata_nbd::{Export, Server, ServerConfig, ShutdownHandle};

const SIZE: u64 = 4 << 20;
const MIB: u64 = 1 << 20;

/// The byte every 4 KiB block of a test image starts with and is filled
/// with: the scripts compute the same.
fn block_byte(offset: u64) -> u8 {
    ((offset / 4096) % 250 + 1) as u8
}

/// A new image in `dir`, filled block by block with [`block_byte`].
fn image(dir: &std::path::Path, name: &str) -> Disk {
    let path = dir.join(name);
    let options = CreateOptions {
        size: Some(SIZE),
        ..CreateOptions::default()
    };
    create(&path, &options).unwrap();
    let disk = Disk::open(&path, &OpenOptions::read_write()).unwrap();
    let content: Vec<u8> = (0..SIZE).map(block_byte).collect();
    disk.write_at(&content, 0).unwrap();
    disk
}

struct Running {
    addr: SocketAddr,
    handle: ShutdownHandle,
    done: std::sync::mpsc::Receiver<Result<(), String>>,
    _runtime: tokio::runtime::Runtime,
}

impl Running {
    fn start(exports: Vec<(&str, Arc<dyn BlockDevice>)>) -> Running {
        let exports = exports
            .into_iter()
            .map(|(name, device)| Export::new(name, device, false).unwrap())
            .collect();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = ServerConfig {
            tcp: Some(("127.0.0.1".into(), 0)),
            ..ServerConfig::default()
        };
        let server = runtime.block_on(Server::bind(exports, config)).unwrap();
        let addr = server.tcp_addr().unwrap();
        let handle = server.shutdown_handle();
        let (tx, done) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let _ = tx.send(server.run().await.map_err(|e| e.to_string()));
        });
        Running {
            addr,
            handle,
            done,
            _runtime: runtime,
        }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.addr)
    }

    /// Stops the server; it must stop cleanly (every export flushed).
    fn stop(self) {
        self.handle.shutdown();
        let result = self
            .done
            .recv_timeout(Duration::from_secs(20))
            .expect("the server did not stop");
        result.expect("the server stopped with an error");
    }
}

/// A Python that has libnbd's binding (Debian installs it for the
/// system Python, which may not be first on PATH).
fn nbd_python() -> String {
    for python in ["/usr/bin/python3", "python3"] {
        let found = Command::new(python)
            .args(["-c", "import nbd"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            return python.to_string();
        }
    }
    panic!("no Python with libnbd's binding (apt-get install python3-libnbd)");
}

/// Runs a libnbd script with `args`; returns its output lines.
fn libnbd(script: &str, args: &[&str]) -> Vec<String> {
    let output = Command::new(nbd_python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "libnbd script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

/// Each step on one connection, printing its name and `ok` or the errno
/// the server answered with. Reads also say whether the data was right.
const STEPS_PY: &str = r#"
import errno, nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
M = 1 << 20
def expected(offset, length):
    return b"".join(bytes([(o // 4096) % 250 + 1]) for o in range(offset, offset + length))
def step(name, request, check=None):
    try:
        result = request()
    except nbd.Error as e:
        print(name, errno.errorcode.get(e.errno, e.errno), flush=True)
        return
    if check is not None and not check(result):
        print(name, "wrong data", flush=True)
        return
    print(name, "ok", flush=True)
new = b"\x5a" * 65536
step("read-faulty", lambda: h.pread(4096, M))
step("read-before", lambda: h.pread(4096, M - 4096), lambda r: r == expected(M - 4096, 4096))
step("read-across", lambda: h.pread(4096, M - 2048))
step("write-once", lambda: h.pwrite(new, 2 * M))
step("write-again", lambda: h.pwrite(new, 2 * M))
step("read-written", lambda: h.pread(65536, 2 * M), lambda r: r == new)
step("write-full", lambda: h.pwrite(new[:4096], 3 * M))
step("flush-once", lambda: h.flush())
step("flush-again", lambda: h.flush())
step("trim-once", lambda: h.trim(65536, 0))
step("trim-again", lambda: h.trim(65536, 0))
step("read-faulty-again", lambda: h.pread(4096, M))
step("read-last", lambda: h.pread(4096, 4 * M - 4096), lambda r: r == expected(4 * M - 4096, 4096))
h.shutdown()
"#;

#[test]
fn failed_requests_get_their_errno_and_the_connection_and_server_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyDevice::new(image(dir.path(), "disk.qcow2")));
    faulty.inject(Fault::on(Operation::Read).within(MIB..MIB + 4096));
    faulty.inject(
        Fault::on(Operation::Write)
            .within(2 * MIB..2 * MIB + 1)
            .times(1),
    );
    faulty.inject(
        Fault::on(Operation::Write)
            .within(3 * MIB..3 * MIB + 4096)
            .error(ErrorKind::NoSpace),
    );
    faulty.inject(Fault::on(Operation::Flush).times(1));
    faulty.inject(Fault::on(Operation::Discard).times(1));
    let server = Running::start(vec![("disk", faulty.clone())]);

    let steps = libnbd(STEPS_PY, &[&server.uri("disk")]);
    let expected = [
        "read-faulty EIO",
        "read-before ok",
        "read-across EIO",
        "write-once EIO",
        "write-again ok",
        "read-written ok",
        "write-full ENOSPC",
        "flush-once EIO",
        "flush-again ok",
        "trim-once EIO",
        "trim-again ok",
        "read-faulty-again EIO",
        "read-last ok",
    ];
    assert_eq!(steps, expected);
    assert_eq!(faulty.failures(), 7);

    // Another client, on a new connection: the server is still up, and
    // qemu-io is told of the failure too.
    let output = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 1M 4k", "-c", "read -P 1 0 4k"])
        .arg(server.uri("disk"))
        .output()
        .expect("run qemu-io");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("Input/output error"), "qemu-io: {text}");
    assert!(
        text.contains("read 4096/4096 bytes at offset 0"),
        "qemu-io: {text}"
    );

    // Without the faults every request succeeds, the data as it was.
    faulty.clear();
    let output = Command::new("qemu-io")
        .args(["-f", "raw"])
        .args(["-c", &format!("read -P {} 1M 4k", block_byte(MIB))])
        .args(["-c", "read -P 0x5a 2M 64k"])
        .arg(server.uri("disk"))
        .output()
        .expect("run qemu-io");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "qemu-io: {text}");
    assert!(
        !text.contains("error") && !text.contains("Pattern verification failed"),
        "{text}"
    );
    assert!(
        text.contains("read 65536/65536 bytes at offset 2097152"),
        "{text}"
    );
    server.stop();
}

/// Eight reads of the slow export in flight at once, and a read of the
/// fast export while they are: it must complete first. Then every slow
/// read must complete with the right data.
const SLOW_PY: &str = r#"
import nbd, sys
def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    return h
slow, fast = connect(sys.argv[1]), connect(sys.argv[2])
M = 1 << 20
def expected(offset, length):
    return b"".join(bytes([(o // 4096) % 250 + 1]) for o in range(offset, offset + length))
reads = []
for i in range(8):
    buf = nbd.Buffer(65536)
    offset = i * 5 * 65536
    reads.append((offset, buf, slow.aio_pread(buf, offset)))
assert fast.pread(4096, M) == expected(M, 4096), "fast export: wrong data"
print("fast read done with", slow.aio_in_flight(), "slow reads in flight", flush=True)
while slow.aio_in_flight() > 0:
    slow.poll(-1)
for offset, buf, cookie in reads:
    assert slow.aio_command_completed(cookie), "read at %d did not complete" % offset
    assert buf.to_bytearray() == expected(offset, 65536), "wrong data at %d" % offset
slow.flush()
print("slow reads done", flush=True)
"#;

#[test]
fn requests_to_a_slow_device_complete_in_parallel_and_hold_up_no_other_export() {
    let dir = tempfile::tempdir().unwrap();
    let slow = Arc::new(
        SlowDevice::new(image(dir.path(), "slow.qcow2"))
            .delay(Operation::Read, Duration::from_secs(1))
            .delay(Operation::Flush, Duration::from_millis(100)),
    );
    let fast: Arc<dyn BlockDevice> = Arc::new(image(dir.path(), "fast.qcow2"));
    let server = Running::start(vec![("slow", slow.clone()), ("fast", fast)]);

    let lines = libnbd(SLOW_PY, &[&server.uri("slow"), &server.uri("fast")]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("fast read done with") && !lines[0].contains(" 0 slow"),
        "the fast export's read waited for the slow one's: {lines:?}"
    );
    assert_eq!(lines[1], "slow reads done");
    assert!(
        slow.delayed() >= 9,
        "only {} requests were delayed",
        slow.delayed()
    );
    assert!(
        slow.peak_in_flight() >= 2,
        "the server ran the slow reads one at a time (peak {})",
        slow.peak_in_flight()
    );
    server.stop();
}
