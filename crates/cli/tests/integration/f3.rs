//! F3, the serverless file tier, as real processes on loopback: one
//! object store (`strata store up`), the metadata and locality service
//! (`strata f3 serve`) and two node agents (`strata node`) with two FUSE
//! mounts, read and written through the kernel with plain file calls.
//! Every mount is lazily unmounted when a test ends, even by panic, and
//! every wait is bounded.

use crate::common::store::{wait_until, wait_until_long, Store};
use crate::common::{p, pattern, strata, Launch, Proc};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The service's lease in these tests: a killed node's readers get EIO
/// after it.
pub(crate) const LEASE_MS: u64 = 1500;

/// Longest any reader in these tests may take.
pub(crate) const READ_LIMIT: Duration = Duration::from_secs(20);

/// A FUSE mount point, lazily unmounted when dropped.
struct MountPoint(PathBuf);

impl Drop for MountPoint {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// The store, the service and two agents `a` and `b` (also the harness
/// of [`crate::f3_run`]).
pub(crate) struct F3 {
    /// The agents (killed first on drop), by name.
    pub(crate) agents: Vec<(String, Option<Proc>)>,
    service: Proc,
    pub(crate) store: Store,
    /// The service's address.
    pub(crate) meta: String,
    /// Each agent's mount point and transfer address.
    points: Vec<(PathBuf, String)>,
    _mounts: Vec<MountPoint>,
    pub(crate) dir: tempfile::TempDir,
}

impl F3 {
    pub(crate) fn up() -> F3 {
        F3::up_with(&[])
    }

    /// [`F3::up`], agent `b` started with `b_args` too.
    fn up_with(b_args: &[&str]) -> F3 {
        F3::up_each(&[], b_args)
    }

    /// [`F3::up`], agent `a` started with `a_args` too, `b` with `b_args`.
    pub(crate) fn up_each(a_args: &[&str], b_args: &[&str]) -> F3 {
        let mut f3 = F3::serve("127.0.0.1");
        f3.start_agent("a", a_args);
        f3.start_agent("b", b_args);
        f3
    }

    /// The store and the service listening on `host`, no agent yet.
    pub(crate) fn serve(host: &str) -> F3 {
        let dir = crate::common::tmp();
        let listen = format!("{host}:0");
        let store = Store::up_on(&dir.path().join("store"), &listen, None, &[]);
        let meta_dir = p(&dir.path().join("meta"));
        let lease = LEASE_MS.to_string();
        let service = Proc::start(&[
            "f3",
            "serve",
            "--dir",
            &meta_dir,
            "--listen",
            &listen,
            "--lease-ms",
            &lease,
        ]);
        let meta = service.word_after("serving on ");
        F3 {
            agents: Vec::new(),
            service,
            store,
            meta,
            points: Vec::new(),
            _mounts: Vec::new(),
            dir,
        }
    }

    /// Starts agent `name`: `a` as `strata node --dir DIR --mount MNT`,
    /// `b` as `strata f3 mount MNT` in the test's directory with no
    /// `--dir`, so that every test runs both forms and `b`'s files land
    /// in the default directory ([`F3::node_dir`]).
    fn start_agent(&mut self, name: &str, extra: &[&str]) {
        self.start_agent_in(name, None, extra);
    }

    /// Starts agent `name` with `extra` arguments, in network namespace
    /// `netns` (its mount visible to the test) if given.
    pub(crate) fn start_agent_in(&mut self, name: &str, netns: Option<&str>, extra: &[&str]) {
        let point = self.dir.path().join(format!("mount-{name}"));
        std::fs::create_dir_all(&point).unwrap();
        // Registered before the mount exists, so teardown unmounts it
        // whatever happens next.
        self._mounts.push(MountPoint(point.clone()));
        let node_dir = p(&self.node_dir(name));
        let on = self.store.on.to_string();
        let credential = p(&self.store.dir.join("admin.credential"));
        let point_text = p(&point);
        let mut args = if name == "b" {
            vec!["f3", "mount", &point_text]
        } else {
            vec!["node", "--dir", &node_dir, "--mount", &point_text]
        };
        args.extend([
            "--meta",
            &self.meta,
            "--name",
            name,
            "--store",
            &on,
            "--credential",
            &credential,
        ]);
        args.extend_from_slice(extra);
        let mut launch = Launch::strata(&args).cwd(self.dir.path());
        if let Some(netns) = netns {
            launch = launch.netns_keeping_mounts(netns);
        }
        let process = launch.start();
        let transfer = process.word_after("transfer on ");
        self.points.push((point, transfer));
        self.agents.push((name.to_string(), Some(process)));
    }

    /// Agent `name`'s directory (`b`'s is `strata f3 mount`'s default).
    pub(crate) fn node_dir(&self, name: &str) -> PathBuf {
        if name == "b" {
            self.dir.path().join("strata-f3").join(name)
        } else {
            self.dir.path().join(format!("node-{name}"))
        }
    }

    /// Agent `index`'s mount point.
    pub(crate) fn mount(&self, index: usize) -> &Path {
        &self.points[index].0
    }

    /// Agent `index`'s transfer address.
    pub(crate) fn transfer(&self, index: usize) -> &str {
        &self.points[index].1
    }

    /// `strata f3 ARGS --meta META`.
    pub(crate) fn f3(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["f3"];
        all.extend_from_slice(args);
        all.extend(["--meta", &self.meta]);
        strata(&all)
    }

    /// `strata f3 ARGS --output json`, which must succeed.
    pub(crate) fn f3_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.f3(&all);
        assert!(
            out.status.success(),
            "strata f3 {args:?}: {}",
            crate::common::output_text(&out)
        );
        serde_json::from_slice(&out.stdout).expect("json output")
    }

    /// POST `body` to the service; the status and the JSON answer.
    pub(crate) fn post(&self, route: &str, body: &str) -> (u16, serde_json::Value) {
        http_post(&format!("http://{}{route}", self.meta), body)
    }

    pub(crate) fn assert_all_running(&mut self) {
        self.service.assert_running();
        for (_, agent) in &mut self.agents {
            if let Some(agent) = agent {
                agent.assert_running();
            }
        }
    }
}

impl Drop for F3 {
    fn drop(&mut self) {
        // Unmount first, so nothing in the test blocks on a mount whose
        // agent is going away.
        for (point, _) in &self.points {
            let _ = Command::new("umount").arg("-l").arg(point).output();
        }
        // SIGTERM first, so that each agent removes its cgroups.
        let pids: Vec<u32> = self
            .agents
            .iter()
            .filter_map(|(_, a)| a.as_ref()?.child_pid())
            .collect();
        for &pid in &pids {
            // SAFETY: signalling a child we own and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && pids.iter().any(|&pid| running(pid)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.agents.clear();
    }
}

/// Whether child `pid` still runs (neither gone nor a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

pub(crate) fn http_post(url: &str, body: &str) -> (u16, serde_json::Value) {
    let result = ureq::post(url)
        .timeout(Duration::from_secs(10))
        .set("content-type", "application/json")
        .send_string(body);
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

pub(crate) fn http_get(url: &str, range: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut request = ureq::get(url).timeout(Duration::from_secs(10));
    if let Some(range) = range {
        request = request.set("Range", range);
    }
    let response = match request.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    let status = response.status();
    let size = response.header("x-f3-size").unwrap_or_default().to_string();
    let mut bytes = Vec::new();
    response
        .into_reader()
        .take(1 << 24)
        .read_to_end(&mut bytes)
        .unwrap();
    (status, size, bytes)
}

/// What a reader thread sends: the bytes, when the first came and when
/// the end came, or the error.
pub(crate) type ReadOutcome = Result<(Vec<u8>, Instant, Instant), std::io::Error>;

/// Checks what `readers` ([`spawn_reader`]) saw of a file written while
/// they read, then silent for 700 ms and closed at `closed`: every byte
/// in order, the first before the close (they read while it was
/// written), and the end at the close (not before: they waited while the
/// writer was open; not 3 s after).
pub(crate) fn assert_streamed(
    readers: impl IntoIterator<Item = mpsc::Receiver<ReadOutcome>>,
    data: &[u8],
    closed: Instant,
) {
    for reader in readers {
        let (bytes, first, end) = reader
            .recv_timeout(READ_LIMIT)
            .expect("the reader ended within the limit")
            .expect("the reader read without error");
        assert_eq!(bytes.len(), data.len());
        assert!(
            bytes == *data,
            "the reader saw other bytes than were written"
        );
        assert!(
            first + Duration::from_millis(700) < closed,
            "the reader got nothing before the close"
        );
        assert!(end >= closed, "the reader ended before the writer closed");
        assert!(
            end < closed + Duration::from_secs(3),
            "the end came {:?} after the close",
            end - closed
        );
    }
}

/// Checks that every one of `readers` ([`spawn_reader`]), waiting on a
/// holder lost at `lost`, failed with EIO, not before half the lease and
/// within the lease and 3 s (a fetch in flight gives up after its long
/// poll and its patience, never 10 s later). Returns how long they took.
pub(crate) fn assert_eio_within_the_lease(
    readers: impl IntoIterator<Item = mpsc::Receiver<ReadOutcome>>,
    lost: Instant,
) -> Duration {
    for reader in readers {
        let error = reader
            .recv_timeout(READ_LIMIT)
            .expect("the reader ended within the limit")
            .expect_err("the reader must fail");
        assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    }
    let took = lost.elapsed();
    assert!(
        took < Duration::from_millis(LEASE_MS) + Duration::from_secs(3),
        "EIO {took:?} after the holder was lost"
    );
    assert!(
        took >= Duration::from_millis(LEASE_MS) / 2,
        "EIO {took:?} after the holder was lost, before the lease"
    );
    took
}

/// Reads `path` to its end on a thread, each chunk timed; the result
/// comes on the channel: the bytes, when the first came and when the end
/// came, or the error.
pub(crate) fn spawn_reader(path: PathBuf) -> mpsc::Receiver<ReadOutcome> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = (|| {
            let mut file = std::fs::File::open(&path)?;
            let mut all = Vec::new();
            let mut first = None;
            let mut buffer = vec![0; 64 * 1024];
            loop {
                let n = file.read(&mut buffer)?;
                if n == 0 {
                    break;
                }
                first.get_or_insert_with(Instant::now);
                all.extend_from_slice(&buffer[..n]);
            }
            let now = Instant::now();
            Ok((all, first.unwrap_or(now), now))
        })();
        let _ = tx.send(result);
    });
    rx
}

pub(crate) fn xattr(path: &Path, name: &str) -> Option<String> {
    let c_path = std::ffi::CString::new(p(path)).unwrap();
    let c_name = std::ffi::CString::new(name).unwrap();
    let mut buffer = vec![0u8; 256];
    // SAFETY: the buffers outlive the call, which writes at most 256 bytes.
    let n = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    (n >= 0).then(|| String::from_utf8_lossy(&buffer[..n as usize]).into_owned())
}

pub(crate) fn set_xattr(path: &Path, name: &str, value: &str) -> std::io::Result<()> {
    let c_path = std::ffi::CString::new(p(path)).unwrap();
    let c_name = std::ffi::CString::new(name).unwrap();
    // SAFETY: the buffers outlive the call.
    let rc = unsafe {
        libc::setxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(crate) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Ephemeral files (by suffix, by a directory's xattr) and durable files
/// written on either node read the same, with the same sizes, listings
/// and xattrs, from both mounts; the durable one is an object in the store.
#[test]
fn ephemeral_and_durable_files_agree_from_both_mounts() {
    let f3 = F3::up();
    let (a, b) = (f3.mount(0), f3.mount(1));
    let eph = pattern(3 * 1024 * 1024 + 17, 1);
    let durable = pattern(200_000, 2);
    std::fs::write(a.join("big.eph"), &eph).unwrap();
    std::fs::write(a.join("report.bin"), &durable).unwrap();
    std::fs::create_dir(b.join("scratch")).unwrap();
    set_xattr(&b.join("scratch"), "user.strata.ephemeral", "1").unwrap();
    std::fs::create_dir(b.join("scratch/sub")).unwrap();
    std::fs::write(b.join("scratch/sub/part"), b"inherited marking").unwrap();

    for mount in [a, b] {
        assert_eq!(std::fs::read(mount.join("big.eph")).unwrap(), eph);
        assert_eq!(std::fs::read(mount.join("report.bin")).unwrap(), durable);
        assert_eq!(
            std::fs::read(mount.join("scratch/sub/part")).unwrap(),
            b"inherited marking"
        );
        assert_eq!(
            std::fs::metadata(mount.join("big.eph")).unwrap().len(),
            eph.len() as u64
        );
        assert_eq!(
            std::fs::metadata(mount.join("report.bin")).unwrap().len(),
            durable.len() as u64
        );
        assert_eq!(names(mount), ["big.eph", "report.bin", "scratch"]);
        assert_eq!(
            xattr(&mount.join("big.eph"), "user.strata.holder").as_deref(),
            Some("a")
        );
        assert_eq!(
            xattr(&mount.join("scratch/sub/part"), "user.strata.holder").as_deref(),
            Some("b")
        );
        assert_eq!(
            xattr(&mount.join("scratch/sub"), "user.strata.ephemeral").as_deref(),
            Some("1")
        );
        assert_eq!(
            xattr(&mount.join("report.bin"), "user.strata.ephemeral").as_deref(),
            Some("0")
        );
    }
    let listing = f3.f3_json(&["ls", "/"]);
    let tiers: Vec<(String, bool)> = listing
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["ephemeral"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tiers,
        [
            ("/big.eph".into(), true),
            ("/report.bin".into(), false),
            ("/scratch".into(), true)
        ]
    );
    // The durable file is an object; the ephemeral one is not.
    let stat = f3.store.json(&["obj", "stat", "f3/report.bin"]);
    assert_eq!(stat["size"].as_u64(), Some(durable.len() as u64), "{stat}");
    assert!(!f3
        .store
        .run(&["obj", "stat", "f3/big.eph"])
        .status
        .success());
    // A file's tier is not an xattr to set.
    let refused = set_xattr(&a.join("big.eph"), "user.strata.ephemeral", "0").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EPERM));
}

/// A reader on node b of a file node a is writing gets every byte in
/// order while the writer writes, waits at the end of the file while it
/// is open, and ends when it closes; two readers alike, and a reader on
/// the writer's own node.
#[test]
fn read_while_write_across_nodes_with_two_readers() {
    let f3 = F3::up();
    let data = pattern(24 * 64 * 1024, 3);
    let mut writer = std::fs::File::create(f3.mount(0).join("stream.eph")).unwrap();
    writer.write_all(&data[..64 * 1024]).unwrap();
    // Two readers on node b, and one on the writer's own node.
    let readers = [
        spawn_reader(f3.mount(1).join("stream.eph")),
        spawn_reader(f3.mount(1).join("stream.eph")),
        spawn_reader(f3.mount(0).join("stream.eph")),
    ];
    for chunk in data[64 * 1024..].chunks(64 * 1024) {
        std::thread::sleep(Duration::from_millis(40));
        writer.write_all(chunk).unwrap();
    }
    // Open and silent for a while: the readers must wait, not end.
    std::thread::sleep(Duration::from_millis(700));
    let closed = Instant::now();
    drop(writer);
    assert_streamed(readers, &data, closed);
    assert_eq!(
        std::fs::metadata(f3.mount(1).join("stream.eph"))
            .unwrap()
            .len(),
        data.len() as u64
    );
}

/// The writer's agent killed: readers on the other node waiting at the
/// end of its file get EIO within the lease and some slack, never a hang.
#[test]
fn killed_writer_agent_gives_waiting_readers_eio_within_the_lease() {
    let mut f3 = F3::up();
    let mut writer = std::fs::File::create(f3.mount(0).join("doomed.eph")).unwrap();
    writer.write_all(&pattern(100_000, 4)).unwrap();
    let readers = [
        spawn_reader(f3.mount(1).join("doomed.eph")),
        spawn_reader(f3.mount(1).join("doomed.eph")),
    ];
    std::thread::sleep(Duration::from_millis(500));
    let pid = f3.agents[0].1.as_ref().unwrap().pid();
    // SAFETY: signalling the agent this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let killed = Instant::now();
    assert_eio_within_the_lease(readers, killed);
    drop(writer);
    f3.agents[1].1.as_mut().unwrap().assert_running();
}

/// The locality query ranks nodes by the bytes they hold; the scheduler
/// extender answers Kubernetes' filter and prioritize requests.
#[test]
fn locality_query_and_scheduler_extender_verbs() {
    let f3 = F3::up();
    std::fs::write(f3.mount(0).join("input-a.eph"), pattern(300_000, 5)).unwrap();
    std::fs::write(f3.mount(1).join("input-b.eph"), pattern(100_000, 6)).unwrap();
    // FUSE sends a file's release after `close` returns, so the service
    // may learn of the last file's bytes a moment later: ask until it
    // has, within a bound.
    let expected: [(String, u64); 2] = [("a".into(), 300_000), ("b".into(), 100_000)];
    let ranking = || -> Vec<(String, u64)> {
        let ranked = f3.f3_json(&["where", "/input-a.eph", "/input-b.eph"]);
        ranked["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["node"].as_str().unwrap().into(),
                    n["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let mut nodes = Vec::new();
    wait_until_long("both nodes in the ranking", Duration::from_secs(5), || {
        nodes = ranking();
        nodes == expected
    });
    assert_eq!(nodes, expected);
    // Node b pulls a whole copy of input-a: it holds 400,000 bytes now.
    assert_eq!(
        std::fs::read(f3.mount(1).join("input-a.eph"))
            .unwrap()
            .len(),
        300_000
    );
    wait_until("node b's copy to be reported", || {
        f3.f3_json(&["where", "/input-a.eph", "/input-b.eph"])["nodes"][0]["node"] == "b"
    });

    let pod =
        r#"{"metadata":{"name":"consumer","annotations":{"f3.strata.io/inputs":"/input-a.eph"}}}"#;
    let (status, filtered) = f3.post(
        "/scheduler/filter",
        &format!(r#"{{"Pod":{pod},"NodeNames":["a","b","gpu-7"]}}"#),
    );
    assert_eq!(status, 200, "{filtered}");
    assert_eq!(filtered["NodeNames"], serde_json::json!(["a", "b"]));
    assert!(filtered["FailedNodes"]["gpu-7"]
        .as_str()
        .unwrap()
        .contains("no F3 agent"));
    let (status, filtered) = f3.post(
        "/scheduler/filter",
        &format!(
            r#"{{"Pod":{pod},"Nodes":{{"items":[{{"metadata":{{"name":"b","labels":{{"zone":"z1"}}}}}},{{"metadata":{{"name":"x"}}}}]}}}}"#
        ),
    );
    assert_eq!(status, 200, "{filtered}");
    assert_eq!(
        filtered["Nodes"]["items"][0]["metadata"]["labels"]["zone"],
        "z1"
    );
    assert_eq!(filtered["Nodes"]["items"].as_array().unwrap().len(), 1);
    let (status, scores) = f3.post(
        "/scheduler/prioritize",
        &format!(r#"{{"Pod":{pod},"NodeNames":["a","b","gpu-7"]}}"#),
    );
    assert_eq!(status, 200, "{scores}");
    assert_eq!(
        scores,
        serde_json::json!([{"Host":"a","Score":10},{"Host":"b","Score":10},{"Host":"gpu-7","Score":0}])
    );
    let (status, scores) = f3.post(
        "/scheduler/prioritize",
        r#"{"Pod":{"metadata":{"name":"p","annotations":{"f3.strata.io/inputs":"/input-b.eph"}}},"NodeNames":["a","b"]}"#,
    );
    assert_eq!(status, 200, "{scores}");
    assert_eq!(
        scores,
        serde_json::json!([{"Host":"a","Score":0},{"Host":"b","Score":10}])
    );
}

/// `strata f3 persist` makes an ephemeral file durable (an object in the
/// store, readable everywhere); `evict` drops other nodes' copies and
/// refuses to drop an ephemeral file's only copy.
#[test]
fn persist_promotes_an_ephemeral_file_and_evict_drops_copies() {
    let f3 = F3::up();
    let data = pattern(500_000, 7);
    std::fs::write(f3.mount(0).join("result.eph"), &data).unwrap();
    let out = f3.f3(&["evict", "/result.eph"]);
    assert!(!out.status.success());
    assert!(
        crate::common::output_text(&out).contains("only copy"),
        "{}",
        crate::common::output_text(&out)
    );

    assert_eq!(std::fs::read(f3.mount(1).join("result.eph")).unwrap(), data);
    let entry = f3.f3_json(&["persist", "/result.eph"]);
    assert_eq!(entry["ephemeral"], false, "{entry}");
    assert!(entry["holder"].is_null(), "{entry}");
    let stat = f3.store.json(&["obj", "stat", "f3/result.eph"]);
    assert_eq!(stat["size"].as_u64(), Some(data.len() as u64), "{stat}");
    for index in [0, 1] {
        assert_eq!(
            std::fs::read(f3.mount(index).join("result.eph")).unwrap(),
            data
        );
    }
    let evicted = f3.f3_json(&["evict", "/result.eph"]);
    assert!(
        evicted
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["evicted"] == true),
        "{evicted}"
    );
    // Read again from the store after the eviction.
    assert_eq!(std::fs::read(f3.mount(1).join("result.eph")).unwrap(), data);
    let out = f3.f3(&["persist", "/result.eph"]);
    assert!(!out.status.success(), "a durable file persisted again");
}

/// Bad input gets a clear error and no process dies: an unknown node, a
/// transfer of a missing file, malformed locality reports, paths that
/// escape the mount, a write to another node's ephemeral file.
#[test]
fn bad_input_gets_clear_errors_and_no_agent_crashes() {
    let mut f3 = F3::up();
    std::fs::write(f3.mount(0).join("x.eph"), b"x").unwrap();

    let (status, answer) = f3.post(
        "/v1/report",
        r#"{"node":"ghost","files":[{"path":"/x.eph","bytes":1}]}"#,
    );
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("unknown node \"ghost\""),
        "{answer}"
    );
    for (body, says) in [
        ("{not json", "malformed request"),
        (r#"{"node":"a"}"#, "malformed request"),
        (r#"{"node":"a","files":[]}"#, "1 to 4096 files"),
        (
            r#"{"node":"a","files":[{"path":"relative","bytes":1}]}"#,
            "not absolute",
        ),
        (
            r#"{"node":"a","files":[{"path":"/x.eph","bytes":-1}]}"#,
            "malformed request",
        ),
        (
            r#"{"node":"a b","files":[{"path":"/x.eph","bytes":1}]}"#,
            "node name",
        ),
    ] {
        let (status, answer) = f3.post("/v1/report", body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(says),
            "{body}: {answer}"
        );
    }
    let (status, answer) = f3.post("/scheduler/prioritize", r#"{"Pod":{}}"#);
    assert_eq!(status, 400, "{answer}");

    let transfer = f3.transfer(0).to_string();
    let (status, _, body) = http_get(
        &format!("http://{transfer}/v1/data?path=/missing.eph"),
        None,
    );
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("holds no ephemeral file /missing.eph"));
    let (status, _, body) = http_get(
        &format!("http://{transfer}/v1/data?path=/../../etc/passwd"),
        None,
    );
    assert_eq!(status, 400);
    assert!(
        String::from_utf8_lossy(&body).contains("'..' component"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, body) = http_get(
        &format!("http://{transfer}/v1/data?path=/x.eph"),
        Some("bytes=9-2"),
    );
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, size, body) = http_get(
        &format!("http://{transfer}/v1/data?path=/x.eph"),
        Some("bytes=0-"),
    );
    assert_eq!(
        (status, size.as_str(), body.as_slice()),
        (206, "1", b"x".as_slice())
    );

    let out = f3.f3(&["where", "/../etc/passwd"]);
    assert!(!out.status.success());
    assert!(crate::common::output_text(&out).contains("'..' component"));
    let out = f3.f3(&["ls", "/nowhere"]);
    assert!(crate::common::output_text(&out).contains("/nowhere: no such file or directory"));

    // Node b may read node a's ephemeral file, not write it.
    let refused = std::fs::OpenOptions::new()
        .append(true)
        .open(f3.mount(1).join("x.eph"))
        .unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EPERM));
    f3.assert_all_running();
}

/// `--all-ephemeral` makes every new file on that node ephemeral; a file
/// removed on one node is gone from both mounts, and its holder drops its
/// content.
#[test]
fn all_ephemeral_mounts_and_removal_from_another_node() {
    let f3 = F3::up_with(&["--all-ephemeral"]);
    std::fs::write(f3.mount(1).join("notes.txt"), b"kept on b").unwrap();
    std::fs::write(f3.mount(0).join("notes-a.txt"), b"in the store").unwrap();
    assert_eq!(
        xattr(&f3.mount(0).join("notes.txt"), "user.strata.holder").as_deref(),
        Some("b")
    );
    assert_eq!(
        xattr(&f3.mount(1).join("notes-a.txt"), "user.strata.ephemeral").as_deref(),
        Some("0")
    );

    let contents = |node: &str| {
        std::fs::read_dir(f3.node_dir(node).join("files"))
            .unwrap()
            .count()
    };
    assert_eq!(contents("b"), 1);
    assert_eq!(
        std::fs::read(f3.mount(0).join("notes.txt")).unwrap(),
        b"kept on b"
    );
    std::fs::remove_file(f3.mount(0).join("notes.txt")).unwrap();
    for index in [0, 1] {
        assert_eq!(names(f3.mount(index)), ["notes-a.txt"]);
    }
    assert_eq!(
        contents("b"),
        0,
        "node b kept the content of a removed file"
    );
    std::fs::remove_file(f3.mount(1).join("notes-a.txt")).unwrap();
    assert!(!f3
        .store
        .run(&["obj", "stat", "f3/notes-a.txt"])
        .status
        .success());
    let (status, answer) = http_post(
        &format!("http://{}/v1/forget", f3.transfer(1)),
        r#"{"path":"/notes-a.txt"}"#,
    );
    assert_eq!(status, 200, "{answer}");
    std::fs::write(f3.mount(1).join("again.txt"), b"x").unwrap();
    let (status, answer) = http_post(
        &format!("http://{}/v1/forget", f3.transfer(1)),
        r#"{"path":"/again.txt"}"#,
    );
    assert_eq!(status, 409, "{answer}");
    assert_eq!(std::fs::read(f3.mount(0).join("again.txt")).unwrap(), b"x");
}

/// The agent's `/metrics`: the value of `strata_f3_NAME` (a counter's
/// `_total`, or a gauge with its `kind` label).
pub(crate) fn agent_metric(f3: &F3, index: usize, series: &str) -> u64 {
    let (status, _, body) = http_get(&format!("http://{}/metrics", f3.transfer(index)), None);
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    text.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// Agent `b` under a quota of 4 MiB: copies and local copies go first
/// (least recently used), then idle ephemeral files are spilled to the
/// durable tier, and a write that cannot fit gets ENOSPC; nothing is
/// lost, and `/metrics` counts each step.
#[test]
fn a_quota_evicts_copies_then_spills_idle_files_then_refuses() {
    let f3 = F3::up_with(&["--quota", "4M"]);
    let (a, b) = (f3.mount(0), f3.mount(1));
    let mib = 1024 * 1024;
    let from_a = pattern(mib, 1);
    std::fs::write(a.join("from-a.eph"), &from_a).unwrap();
    assert_eq!(std::fs::read(b.join("from-a.eph")).unwrap(), from_a);
    assert_eq!(
        agent_metric(&f3, 0, "strata_f3_served_bytes_total"),
        mib as u64
    );
    let durable = pattern(mib / 2, 2);
    std::fs::write(b.join("d.bin"), &durable).unwrap();
    let first = pattern(2 * mib, 3);
    std::fs::write(b.join("x1.eph"), &first).unwrap();
    let series = "strata_f3_local_bytes{node=\"b\",kind=";
    assert_eq!(
        agent_metric(&f3, 1, &format!("{series}\"copies\"}}")),
        mib as u64
    );
    assert_eq!(agent_metric(&f3, 1, "strata_f3_evictions_total"), 0);
    assert_eq!(
        agent_metric(&f3, 1, "strata_f3_quota_bytes"),
        4 * mib as u64
    );

    // 3.5 MiB held; 2 MiB more: the copy and the local copy go.
    let second = pattern(2 * mib, 4);
    std::fs::write(b.join("x2.eph"), &second).unwrap();
    assert_eq!(agent_metric(&f3, 1, "strata_f3_evictions_total"), 2);
    assert_eq!(agent_metric(&f3, 1, &format!("{series}\"copies\"}}")), 0);
    assert_eq!(agent_metric(&f3, 1, &format!("{series}\"cache\"}}")), 0);
    assert_eq!(agent_metric(&f3, 1, "strata_f3_spills_total"), 0);
    // Nothing lost: both come back, from a and from the store.
    assert_eq!(std::fs::read(b.join("d.bin")).unwrap(), durable);
    // (That local copy counts again; the next write evicts it first.)

    // 2 MiB more again: x1, the least recently used idle file, is spilled.
    let third = pattern(2 * mib, 5);
    std::fs::write(b.join("x3.eph"), &third).unwrap();
    assert_eq!(agent_metric(&f3, 1, "strata_f3_spills_total"), 1);
    let listed = f3.f3_json(&["ls", "/"]);
    let tier = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == format!("/{name}"))
            .map(|e| e["ephemeral"].clone())
            .unwrap_or_else(|| panic!("no {name} in {listed}"))
    };
    assert_eq!(tier("x1.eph"), false, "x1 spilled: {listed}");
    assert_eq!(tier("x2.eph"), true, "x2 stays: {listed}");
    assert_eq!(tier("x3.eph"), true, "x3 stays: {listed}");
    let stat = f3.store.json(&["obj", "stat", "f3/x1.eph"]);
    assert_eq!(stat["size"].as_u64(), Some(2 * mib as u64), "{stat}");
    assert_eq!(std::fs::read(a.join("x1.eph")).unwrap(), first);
    assert_eq!(std::fs::read(b.join("x2.eph")).unwrap(), second);

    // A file larger than the quota: every idle file is spilled, then
    // ENOSPC; what was written before stays readable.
    let error = std::fs::write(b.join("huge.eph"), pattern(5 * mib, 6)).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    assert!(agent_metric(&f3, 1, "strata_f3_nospace_total") >= 1);
    assert_eq!(std::fs::read(a.join("x2.eph")).unwrap(), second);
    assert_eq!(std::fs::read(a.join("x3.eph")).unwrap(), third);
    assert_eq!(std::fs::read(b.join("from-a.eph")).unwrap(), from_a);
}

/// A holder killed: once its lease lapses, the service records a `lost`
/// event for each ephemeral file it held, naming the step that wrote it
/// (`user.strata.producer`), and reads elsewhere get EIO; when the node
/// comes back with its directory, a `recovered` event follows and the
/// file reads again. Durable files are never reported.
#[test]
fn a_lost_holder_s_files_are_reported_with_their_producer_then_recovered() {
    let mut f3 = F3::up();
    let data = pattern(300_000, 9);
    let lost = f3.mount(0).join("stage1.eph");
    std::fs::write(&lost, &data).unwrap();
    set_xattr(&lost, "user.strata.producer", "wordcount/split").unwrap();
    assert_eq!(
        xattr(&lost, "user.strata.producer").as_deref(),
        Some("wordcount/split")
    );
    std::fs::write(f3.mount(0).join("plain.eph"), b"no producer").unwrap();
    std::fs::write(f3.mount(0).join("kept.bin"), b"durable").unwrap();
    let too_long = "x".repeat(300);
    assert!(set_xattr(&lost, "user.strata.producer", &too_long).is_err());
    let none = f3.f3_json(&["events"]);
    assert_eq!(none["events"], serde_json::json!([]), "{none}");

    let killed = f3.agents[0].1.take().unwrap();
    // SAFETY: signalling the agent this test started.
    unsafe { libc::kill(killed.pid() as i32, libc::SIGKILL) };
    let mut page = serde_json::Value::Null;
    wait_until_long(
        "the loss reported",
        Duration::from_millis(LEASE_MS * 4),
        || {
            page = f3.f3_json(&["events"]);
            page["events"].as_array().is_some_and(|e| e.len() == 2)
        },
    );
    let events = page["events"].as_array().unwrap();
    let by_path = |path: &str| {
        events
            .iter()
            .find(|e| e["path"] == path)
            .unwrap_or_else(|| panic!("no event for {path}: {page}"))
            .clone()
    };
    let first = by_path("/stage1.eph");
    assert_eq!(first["kind"], "lost", "{first}");
    assert_eq!(first["holder"], "a", "{first}");
    assert_eq!(first["producer"], "wordcount/split", "{first}");
    assert_eq!(first["size"].as_u64(), Some(data.len() as u64), "{first}");
    assert!(by_path("/plain.eph")["producer"].is_null());
    let error = std::fs::read(f3.mount(1).join("stage1.eph")).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    // The service's /metrics shows the loss.
    let (status, _, body) = http_get(&format!("http://{}/metrics", f3.meta), None);
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    for line in [
        "strata_f3_nodes{state=\"silent\"} 1",
        "strata_f3_lapsed_nodes 1",
        "strata_f3_files{tier=\"ephemeral\"} 2",
        "strata_f3_files{tier=\"durable\"} 1",
        "strata_f3_events_total 2",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    assert_eq!(
        std::fs::read(f3.mount(1).join("kept.bin")).unwrap(),
        b"durable"
    );
    // The human listing names the producer too.
    let text = crate::common::output_text(&f3.f3(&["events"]));
    assert!(
        text.contains("lost") && text.contains("wordcount/split"),
        "{text}"
    );

    // The node comes back on its directory: recovered, and readable.
    let _ = Command::new("umount").arg("-l").arg(f3.mount(0)).output();
    let last = page["last"].as_u64().unwrap();
    f3.start_agent("a", &[]);
    let after = last.to_string();
    wait_until_long("the recovery reported", Duration::from_secs(10), || {
        page = f3.f3_json(&["events", "--after", &after]);
        page["events"].as_array().is_some_and(|e| e.len() == 2)
    });
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] == "recovered" && e["seq"].as_u64().unwrap() > last),
        "{page}"
    );
    assert_eq!(std::fs::read(f3.mount(1).join("stage1.eph")).unwrap(), data);
    f3.assert_all_running();
    drop(killed);
}

/// fsync through the mount: a durable file's content reaches the store
/// at the fsync, before any close (another node reads it then), and an
/// ephemeral file's fsync succeeds with its bytes whole on its holder.
#[test]
fn fsync_uploads_a_durable_file_before_its_close() {
    let f3 = F3::up();
    let data = pattern(200_000, 11);
    let mut durable = std::fs::File::create(f3.mount(0).join("synced.bin")).unwrap();
    durable.write_all(&data).unwrap();
    durable.sync_all().unwrap();
    // Still open on node a: node b reads what the fsync uploaded.
    let stat = f3.store.json(&["obj", "stat", "f3/synced.bin"]);
    assert_eq!(stat["size"].as_u64(), Some(data.len() as u64), "{stat}");
    assert_eq!(std::fs::read(f3.mount(1).join("synced.bin")).unwrap(), data);
    let mut ephemeral = std::fs::File::create(f3.mount(0).join("synced.eph")).unwrap();
    ephemeral.write_all(&data).unwrap();
    ephemeral.sync_data().unwrap();
    drop((durable, ephemeral));
    assert_eq!(std::fs::read(f3.mount(1).join("synced.eph")).unwrap(), data);
}
